//! A seeded, deterministic simulation of berth's owner-core layers: one to three engines (cores) with their fronts,
//! wired by a simulated mesh (`net`), on the simulated disk (`storage::sim`) and a manual clock, all on one executor.
//! A seeded random workload produces, consumes (parking with long-polls), acks, nacks with and without delays,
//! extends, lets leases expire, dead-letters, changes delivery policies, deletes and recreates a topic, flips bits
//! in segments, redrives dead letters, presents stale receipt handles, fails writes and syncs (a failed sync drops
//! its pages, as Linux does), and kills the process or cuts the power — after a step has settled, while syncs are
//! in flight, or right after a failed sync; after every step it checks, against an oracle of what clients were
//! told:
//!
//! * nothing acknowledged is lost (at the end, after draining, every acknowledged produce was acknowledged by a
//!   client in every group of its topic, or its dead-letter copy was, or that copy's redriven copy was; every
//!   frontier reached its log's end);
//! * nothing unproduced is delivered, and a record is always the same bytes at the same place;
//! * no live lease is held twice, a live lease is never refused, and a settled offset is not handed out again by
//!   the same process;
//! * no frontier moves backwards, in memory or on disk;
//! * no parked consumer sleeps while a message is deliverable to it.
//!
//! A failing seed prints itself; `BERTH_SIM_SEED=N cargo test --release --lib sim::` replays it exactly, and
//! `BERTH_SIM_SEEDS=20000` runs that many seeds (the default run covers a thousand, in a few seconds);
//! `BERTH_SIM_TRACE=1` (with `-- --nocapture`) prints every event, each start's files and journal replay, and the
//! small-file calls on the simulated disk as they happen.

mod net;

use crate::clock::{Clock, ManualClock};
use crate::config::{Config, FsyncPolicy};
use crate::engine::topic::{BackoffKind, TopicConfig};
use crate::engine::{Engine, Shared};
use crate::front::Front;
use crate::ops::consume::ConsumeParams;
use crate::ops::produce::{ClientRecord, ProduceParams, Target};
use crate::ops::settle::SettleParams;
use crate::ops::topics::Settings;
use crate::ops::OpError;
use crate::partition::{Delivery, PartitionError, SettleOp, DEFAULT_GROUP};
use crate::storage::backend::Storage;
use crate::storage::sim::{Sim, SimStorage};
use crate::transport::{Router, RouterPeers};
use bytes::Bytes;
use net::SimNet;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A small deterministic generator (splitmix64 seeding, xorshift64*), so a seed replays exactly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The source topic (dead-letters to `DLQ` after `MAX_DELIVERIES`), the dead-letter topic, a plain topic that
/// gets deleted and recreated, and the topic the dead letters are redriven to.
const SOURCE: &str = "a";
const DLQ: &str = "a.dlq";
const PLAIN: &str = "b";
const REDRIVEN: &str = "a.redriven";
const MAX_DELIVERIES: u32 = 3;
/// Groups every topic has besides `default` (created with the topic, before any produce).
const GROUPS: [&str; 2] = [DEFAULT_GROUP, "g2"];

/// What a seed runs with.
#[derive(Debug, Clone)]
struct Plan {
    cores: usize,
    fsync: FsyncPolicy,
    steps: usize,
    /// Depth of each simulated core-to-core queue (small depths exercise refusals and retries).
    net_depth: usize,
    partitions: [u32; 4],
    /// Power cuts (not just process crashes); only when every acknowledged produce was synced.
    power_cuts: bool,
}

impl Plan {
    fn for_seed(seed: u64) -> Plan {
        let mut rng = Rng::new(seed ^ 0x706c_616e);
        let fsync = match rng.below(6) {
            0 => FsyncPolicy::Never,
            1 => FsyncPolicy::IntervalMs(20),
            _ => FsyncPolicy::Always,
        };
        Plan {
            cores: 1 + rng.below(3) as usize,
            fsync,
            steps: 150 + rng.below(150) as usize,
            net_depth: if rng.chance(30) { 2 } else { 64 },
            partitions: [
                1 + rng.below(4) as u32,
                1 + rng.below(2) as u32,
                1 + rng.below(3) as u32,
                1 + rng.below(2) as u32,
            ],
            power_cuts: fsync == FsyncPolicy::Always,
        }
    }
}

/// What the oracle knows of one produced body.
#[derive(Debug, Clone)]
struct Produced {
    topic: String,
    topic_id: u64,
    /// Where the server said it is (acknowledged), or where it was first seen (indeterminate).
    place: Option<(u32, u64)>,
    acked: bool,
}

/// Everything clients were told, and the checks against it.
#[derive(Default)]
struct Oracle {
    seed: u64,
    produced: BTreeMap<String, Produced>,
    /// (body, group) → deliveries.
    delivered: BTreeMap<(String, String), u32>,
    /// (topic, body, group) a client's ack of was answered `200`, in any process.
    client_acked: BTreeSet<(String, String, String)>,
    /// (topic, body) delivered to a client of that topic (a dead-letter or redriven copy is seen in its topic).
    seen_in: BTreeSet<(String, String)>,
    /// Where copies were seen in the copy topics: (topic id, partition, offset) → body (a bit flip there excuses it).
    copy_places: BTreeMap<(u64, u32, u64), String>,
    /// Handles clients were given, newest last (at most 64): presented again later as stale handles.
    old_handles: std::collections::VecDeque<OldHandle>,
    /// Until when leases the server took for itself (a redrive's) may hold messages back.
    internal_leases_until: u64,
    /// Bodies whose record was damaged on purpose: their loss is excused (not that of a record written at the same
    /// offset later).
    excused: BTreeSet<String>,
    /// Live leases as clients hold them: (topic id, group, partition, offset) → (nonce, expiry).
    leases: BTreeMap<(u64, String, u32, u64), (u64, u64)>,
    /// Nacks sent and not answered yet: the server may already have released the lease (and leased the offset
    /// again) before the client hears back.
    nacking: BTreeSet<((u64, String, u32, u64), u64)>,
    /// Settled (acked) in this process: never handed out again by it.
    settled: BTreeSet<(u64, String, u32, u64)>,
    /// Highest committed frontier seen in this process.
    frontier_mem: BTreeMap<(u64, String, u32), u64>,
    /// Highest frontier seen on disk, ever.
    frontier_disk: BTreeMap<(u64, String, u32), u64>,
    /// Highest frontier a process held durable (in its file or its journal): after a restart's replay, the file
    /// holds at least that much.
    frontier_durable: BTreeMap<(u64, String, u32), u64>,
    /// Topic ids deleted (their records need no delivery).
    deleted: BTreeSet<u64>,
    /// Current id per topic name.
    ids: BTreeMap<String, u64>,
    next_body: u64,
    log: Vec<String>,
}

/// A handle a client was once given.
#[derive(Debug, Clone)]
struct OldHandle {
    topic: &'static str,
    topic_id: u64,
    group: &'static str,
    delivery: Delivery,
}

impl Oracle {
    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self
            .log
            .iter()
            .rev()
            .take(
                std::env::var("BERTH_SIM_TAIL")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(25),
            )
            .collect();
        panic!(
            "simulation seed {} found: {what}\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::\nlast events (newest first):\n{}",
            self.seed,
            self.seed,
            tail.iter().map(|s| format!("  {s}")).collect::<Vec<_>>().join("\n")
        );
    }

    fn note(&mut self, event: String) {
        if std::env::var_os("BERTH_SIM_TRACE").is_some() {
            eprintln!("  {event}");
        }
        if self.log.len() > 4000 {
            self.log.drain(..2000);
        }
        self.log.push(event);
    }

    fn new_body(&mut self, topic: &str, topic_id: u64) -> String {
        self.next_body += 1;
        let body = format!("{topic}#{topic_id}#{}", self.next_body);
        self.produced.insert(
            body.clone(),
            Produced {
                topic: topic.to_string(),
                topic_id,
                place: None,
                acked: false,
            },
        );
        body
    }

    fn acked(&mut self, body: &str, partition: u32, offset: u64) {
        let Some(p) = self.produced.get_mut(body) else {
            self.fail(format!("an acknowledgement for an unknown body {body}"));
        };
        if let Some(seen) = p.place {
            if seen != (partition, offset) {
                let what = format!(
                    "body {body} acknowledged at {partition}:{offset} but delivered at {}:{}",
                    seen.0, seen.1
                );
                self.fail(what);
            }
        }
        p.place = Some((partition, offset));
        p.acked = true;
    }

    /// A delivery, as a client got it at `now` (its lease ends at the owner's `expires_at_ms`).
    fn delivery(&mut self, topic: &str, topic_id: u64, group: &str, d: &Delivery, now: u64) {
        let body = String::from_utf8_lossy(&d.payload).to_string();
        self.note(format!(
            "t={now} delivered {topic}/{group} {}:{}:{} count {} body {body}",
            d.partition, d.offset, d.nonce, d.delivery_count
        ));
        let Some(p) = self.produced.get(&body).cloned() else {
            self.fail(format!(
                "{topic}/{group} delivered {}:{} with a body nobody produced: {body:?}",
                d.partition, d.offset
            ));
        };
        if topic == DLQ || topic == REDRIVEN {
            if p.topic != SOURCE {
                self.fail(format!("{topic} delivered {body}, produced to {}", p.topic));
            }
            self.copy_places
                .insert((topic_id, d.partition, d.offset), body.clone());
        } else {
            if p.topic != topic || p.topic_id != topic_id {
                self.fail(format!(
                    "{topic} (id {topic_id}) delivered {body}, produced to {} (id {})",
                    p.topic, p.topic_id
                ));
            }
            match p.place {
                Some(place) if place != (d.partition, d.offset) => self.fail(format!(
                    "{body} was at {}:{} and is now delivered at {}:{}",
                    place.0, place.1, d.partition, d.offset
                )),
                Some(_) => {}
                None => {
                    self.produced.get_mut(&body).expect("known").place =
                        Some((d.partition, d.offset))
                }
            }
        }
        let key = (topic_id, group.to_string(), d.partition, d.offset);
        if self.settled.contains(&key) {
            self.fail(format!(
                "{topic}/{group} {}:{} was acknowledged as settled in this process and is delivered again",
                d.partition, d.offset
            ));
        }
        if let Some(&(nonce, expiry)) = self.leases.get(&key) {
            if expiry > now && !self.nacking.contains(&(key.clone(), nonce)) {
                self.fail(format!(
                    "{topic}/{group} {}:{} leased twice: nonce {nonce} lives until {expiry}, nonce {} granted at {now}",
                    d.partition, d.offset, d.nonce
                ));
            }
        }
        if d.expires_at_ms <= now {
            self.fail(format!(
                "{key:?} handed out with a lease already over ({} at {now})",
                d.expires_at_ms
            ));
        }
        self.leases.insert(key, (d.nonce, d.expires_at_ms));
        self.seen_in.insert((topic.to_string(), body.clone()));
        *self.delivered.entry((body, group.to_string())).or_insert(0) += 1;
    }

    /// A nack is on its way: if its lease lives now, the server may release the lease (and lease the offset again)
    /// before the client hears back.
    fn sending_nack(&mut self, key: (u64, String, u32, u64), nonce: u64, now: u64) {
        if self
            .leases
            .get(&key)
            .is_some_and(|&(n, expiry)| n == nonce && expiry > now)
        {
            self.nacking.insert((key, nonce));
        }
    }

    /// Remembers a handle a client was given, to present it again later (stale, or still live).
    fn remember(&mut self, topic: &'static str, topic_id: u64, group: &'static str, d: &Delivery) {
        if self.old_handles.len() >= 64 {
            self.old_handles.pop_front();
        }
        self.old_handles.push_back(OldHandle {
            topic,
            topic_id,
            group,
            delivery: d.clone(),
        });
    }

    /// The answer to a settle of a lease the client held.
    #[allow(clippy::too_many_arguments)]
    fn settled_answer(
        &mut self,
        topic: &str,
        body: &str,
        key: (u64, String, u32, u64),
        nonce: u64,
        op: SettleOp,
        result: &Result<(), OpError>,
        now: u64,
        extend_ms: u64,
    ) {
        let was_nacking = self.nacking.remove(&(key.clone(), nonce));
        let current = self.leases.get(&key).is_some_and(|&(n, _)| n == nonce);
        let live = self
            .leases
            .get(&key)
            .is_some_and(|&(n, expiry)| n == nonce && expiry > now)
            // A nack sent while its lease lived and answered after the offset was leased again was applied while its
            // lease lived.
            || (matches!(op, SettleOp::Nack(_)) && !current && result.is_ok() && was_nacking);
        self.note(format!(
            "t={now} {op:?} {key:?} nonce {nonce} live {live} → {result:?}"
        ));
        match result {
            Ok(()) => {
                if !live {
                    // The server may accept a lease the client thinks expired only if it had not purged it yet,
                    // which cannot happen: both purge at the deadline.
                    let what =
                        format!("{op:?} of {key:?} nonce {nonce} accepted after its lease ended");
                    self.fail(what);
                }
                match op {
                    SettleOp::Ack => {
                        self.client_acked.insert((
                            topic.to_string(),
                            body.to_string(),
                            key.1.clone(),
                        ));
                        self.leases.remove(&key);
                        self.settled.insert(key);
                    }
                    // The offset may have been leased again meanwhile: only this nack's lease ends.
                    SettleOp::Nack(_) if current => {
                        self.leases.remove(&key);
                    }
                    SettleOp::Nack(_) => {}
                    SettleOp::Extend(_) => {
                        self.leases.insert(key, (nonce, now + extend_ms));
                    }
                }
            }
            Err(OpError::Engine(crate::engine::EngineError::Partition(
                PartitionError::LeaseGone,
            ))) => {
                if live {
                    self.fail(format!(
                        "{op:?} of a live lease {key:?} nonce {nonce} answered 410"
                    ));
                }
            }
            Err(_) => {}
        }
    }
}

/// One process: the engines and fronts of its cores, on a disk image, with its own monotonic clock.
struct World {
    /// The seed this world runs (for the report of a stuck operation).
    seed: u64,
    engines: Vec<Rc<Engine>>,
    fronts: Vec<Rc<Front>>,
    net: Rc<SimNet>,
    clock: Rc<ManualClock>,
    sim: Rc<Sim>,
    /// Operations spawned and not finished (their outcome is unknown if the process dies).
    in_flight: Rc<Cell<usize>>,
    /// Every task the simulation spawned (pumps, timers, clients): cancelled when the process ends, so nothing of
    /// it lingers (glommio leaks tasks still pending when an executor is dropped).
    tasks: Tasks,
    /// A write, sync or read fault was injected in this process (an administrative step may then fail).
    faults_injected: Cell<bool>,
    /// Failed reads this process may still be given.
    read_faults_left: Cell<u32>,
}

/// Handles of spawned tasks; dropping one cancels its task.
#[derive(Clone, Default)]
struct Tasks(Rc<RefCell<Vec<glommio::Task<()>>>>);

impl Tasks {
    fn spawn(&self, future: impl std::future::Future<Output = ()> + 'static) {
        // A world spawns at most a few hundred tasks: their handles are kept until it ends. (glommio runs a new
        // task at once, and it may spawn in turn: no borrow is held across the spawn.)
        let task = glommio::spawn_local(future);
        self.0.borrow_mut().push(task);
    }
}

fn sim_config(plan: &Plan) -> Config {
    Config {
        data_dir: PathBuf::from("/sim"),
        fsync: plan.fsync,
        segment_bytes: 2048,
        // Journal files rotate (and checkpoint) every few passes.
        journal_file_bytes: 4096,
        // The journal's commit delay is the default (it sleeps on the simulation's clock): passes gather several
        // partitions' entries, logs wait in `Journal::next_pass`, and power cuts land inside a delay.
        max_message_bytes: 512,
        // Small, so reads go to the tail and to the disk (and its read faults) alike.
        tail_cache_bytes: 1024,
        // Smaller than a segment and larger than the tail, so frames wait behind (and are read from there), reach
        // the file at flushes, rolls and checkpoints, and are lost behind by power cuts and crashes (the journal's
        // replay restores them).
        write_behind_bytes: 1500,
        frontier_flush_interval_ms: 100,
        purge_interval_ms: 1000,
        ..Config::default()
    }
}

fn topic_config(name: &str, partitions: u32) -> TopicConfig {
    let mut c = TopicConfig::with_defaults(name);
    c.partitions = partitions;
    c.max_in_flight = 6;
    c.max_acked_ahead = 4;
    c.groups = vec!["g2".to_string()];
    if name == SOURCE {
        c.max_deliveries = MAX_DELIVERIES;
        c.dead_letter = Some(DLQ.to_string());
    }
    c
}

impl World {
    async fn boot(plan: &Plan, sim: Rc<Sim>, wall_ms: u64, seed: u64) -> World {
        let clock = ManualClock::new(wall_ms);
        let config = Rc::new(sim_config(plan));
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        storage
            .create_dir_all(&config.data_dir.join("topics"))
            .expect("sim dir");
        storage
            .create_dir_all(&config.data_dir.join("trash"))
            .expect("sim dir");
        if std::env::var_os("BERTH_SIM_TRACE").is_some() {
            for path in sim.paths() {
                eprintln!(
                    "  boot: {} {:?}",
                    path.display(),
                    sim.contents(&path).map(|c| c.len())
                );
            }
        }
        let report = crate::engine::admin::replay_journal(&*storage, &config.data_dir)
            .await
            .expect("journal replay");
        if std::env::var_os("BERTH_SIM_TRACE").is_some() {
            eprintln!("  boot: replay {report:?}");
        }
        let net = SimNet::new(plan.cores, plan.net_depth, seed);
        let shared = std::sync::Arc::new(Shared::default());
        let mut engines = Vec::new();
        let mut fronts = Vec::new();
        for id in 0..plan.cores {
            let engine = Engine::new(
                id,
                plan.cores,
                config.clone(),
                clock.clone(),
                storage.clone(),
                shared.clone(),
            );
            let router = Router::new(engine.clone(), net.link(id));
            engine.set_peers(Rc::new(RouterPeers(Rc::downgrade(&router))));
            fronts.push(Front::new(router));
            engines.push(engine);
        }
        let mut failed = Vec::new();
        for e in &engines {
            failed.extend(e.load_topics().await.expect("load topics"));
        }
        if !failed.is_empty() {
            panic!("topics failed to load in the simulation: {failed:?}");
        }
        let tasks = Tasks::default();
        for (id, e) in engines.iter().enumerate() {
            tasks.spawn(net.clone().pump(id, e.clone()));
            tasks.spawn(crate::engine::timers::run_lease_timer(e.clone()));
            tasks.spawn(crate::engine::timers::run_frontier_flush(e.clone()));
        }
        World {
            engines,
            fronts,
            net,
            clock,
            sim,
            in_flight: Rc::new(Cell::new(0)),
            tasks,
            faults_injected: Cell::new(false),
            seed,
            read_faults_left: Cell::new(crate::partition::MAX_READ_FAILURES - 1),
        }
    }

    /// Ends the process's tasks so nothing of it outlives its executor: clients and pumps are cancelled, the
    /// engines stop and close their partitions (writing to this process's disk, which is no longer looked at), and
    /// the clock runs on so every timer sees the stop.
    async fn shut_down(self) {
        for e in &self.engines {
            e.begin_stop();
        }
        // Until nothing is left: cancelling a task can make another spawn one.
        loop {
            let tasks = std::mem::take(&mut *self.tasks.0.borrow_mut());
            if tasks.is_empty() {
                break;
            }
            drop(tasks);
            futures_lite::future::yield_now().await;
        }
        // Closing waits on the clock (a journal's checkpoint still running, a commit delay): time goes on, 1 ms at a
        // time, until the engines are closed (not `complete`: the net's pumps are cancelled, so it never empties).
        let engines = self.engines.clone();
        let closing = glommio::spawn_local(async move {
            for e in &engines {
                e.close_all().await;
            }
        });
        let closed = Rc::new(Cell::new(false));
        let flag = closed.clone();
        glommio::spawn_local(async move {
            closing.await;
            flag.set(true);
        })
        .detach();
        let started = self.clock.now_ms();
        while !closed.get() {
            for _ in 0..40 {
                futures_lite::future::yield_now().await;
            }
            if !closed.get() {
                self.check_not_stuck(started, "the engines not closed");
                self.clock.advance(1);
            }
        }
        self.clock.advance(24 * 3600 * 1000);
        for _ in 0..50 {
            futures_lite::future::yield_now().await;
        }
    }

    /// Fails the seed when what the driver waits for (`what`) is still pending `STUCK_MS` of simulated time after
    /// `started`.
    fn check_not_stuck(&self, started: u64, what: &str) {
        assert!(
            self.clock.now_ms() - started < STUCK_MS,
            "simulation seed {} found: {what} after {STUCK_MS} ms of simulated time (a stuck writer or waiter)\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::",
            self.seed,
            self.seed
        );
    }

    /// Whether a core's journal is in its commit delay now.
    fn journals_delaying(&self) -> bool {
        self.engines
            .iter()
            .any(|e| e.journal().is_some_and(|j| j.is_delaying()))
    }

    /// Adds this process's journal passes of several partitions and waits in `next_pass` to `COVERAGE`.
    fn count_journal_coverage(&self) {
        for e in &self.engines {
            if let Some(j) = e.journal() {
                let s = j.stats();
                COVERAGE
                    .shared_passes
                    .fetch_add(s.shared_passes, Ordering::Relaxed);
                COVERAGE
                    .next_pass_waits
                    .fetch_add(s.next_pass_waits, Ordering::Relaxed);
            }
        }
    }

    fn front(&self, rng: &mut Rng) -> Rc<Front> {
        self.fronts[rng.below(self.fronts.len() as u64) as usize].clone()
    }

    /// Runs `future` as a task of the world while time goes on (1 ms at a time once nothing else moves), so a step
    /// of the driver that waits for the broker never waits for time the driver itself would have to advance.
    async fn complete<T: 'static>(
        &self,
        future: impl std::future::Future<Output = T> + 'static,
    ) -> T {
        let out: Rc<RefCell<Option<T>>> = Rc::default();
        let slot = out.clone();
        self.tasks.spawn(async move {
            let value = future.await;
            *slot.borrow_mut() = Some(value);
        });
        let started = self.clock.now_ms();
        loop {
            if let Some(value) = out.borrow_mut().take() {
                return value;
            }
            self.settle().await;
            if out.borrow().is_some() {
                continue;
            }
            // Every wait the broker has (leases, long-polls, retries, delays) is far shorter: a step still waiting
            // after this much simulated time is stuck.
            self.check_not_stuck(started, "an operation not answered");
            self.clock.advance(1);
        }
    }

    /// Lets every runnable task run until nothing moves: the net is empty and a round of yields changed nothing.
    async fn settle(&self) {
        let mut last = u64::MAX;
        loop {
            for _ in 0..40 {
                futures_lite::future::yield_now().await;
            }
            let activity = self.net.delivered.get();
            if self.net.queued() == 0 && activity == last {
                return;
            }
            last = activity;
        }
    }
}

/// Runs one seed to the end (panics with the seed and the recent events on a violation), on an executor of its
/// own.
pub fn run_seed(seed: u64) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(run_seed_here(seed));
}

/// Runs one seed on the current executor. Each simulated process ("world") ends with all its tasks cancelled, so
/// many seeds can share one executor (glommio keeps a descriptor per executor until the thread ends).
pub async fn run_seed_here(seed: u64) {
    if std::env::var_os("BERTH_SIM_TRACE").is_some() {
        eprintln!("seed {seed} starts");
    }
    let plan = Plan::for_seed(seed);
    let oracle = Rc::new(RefCell::new(Oracle {
        seed,
        ..Oracle::default()
    }));
    let mut rng = Rng::new(seed);
    let mut image = Sim::new();
    let mut wall_ms = 1_700_000_000_000u64;
    let mut step = 0usize;
    let mut first = true;
    loop {
        let world = World::boot(&plan, image.clone(), wall_ms, seed).await;
        if first {
            create_topics(&world, &plan, &oracle).await;
        } else {
            check_durable_frontiers(&world, &oracle.borrow());
        }
        let outcome = run_world(&world, &plan, &oracle, &mut rng, &mut step).await;
        // The disk as the process leaves it, taken before the shutdown below writes anything; then the process's
        // held syncs go on, so its tasks can end.
        if matches!(outcome, Outcome::PowerCut(_)) && world.journals_delaying() {
            COVERAGE.cuts_in_delay.fetch_add(1, Ordering::Relaxed);
        }
        world.count_journal_coverage();
        let next = match outcome {
            Outcome::Crash => Some(world.sim.process_crash()),
            Outcome::PowerCut(torn) => {
                let mut t = Rng::new(torn);
                Some(
                    world
                        .sim
                        .power_cut(|_, unsynced| t.below(unsynced as u64 + 1) as usize),
                )
            }
            Outcome::Done => None,
        };
        world.sim.release_syncs();
        wall_ms = world.clock.wall_ms() + 1000;
        world.shut_down().await;
        first = false;
        {
            let mut o = oracle.borrow_mut();
            // The process is gone: its leases and in-memory frontiers with it.
            o.leases.clear();
            o.nacking.clear();
            o.settled.clear();
            o.frontier_mem.clear();
        }
        match next {
            Some(next) => image = next,
            None => return,
        }
    }
}

/// Simulated time after which an operation the driver waits for (`World::complete`) counts as stuck: ten
/// minutes, far beyond any lease, long-poll, retry or delay of the simulation's configuration.
const STUCK_MS: u64 = 600_000;

/// What the seeds run so far exercised of the journal's commit delay (the default run checks each is not 0).
struct Coverage {
    /// Journal passes that carried several partitions' entries.
    shared_passes: AtomicU64,
    /// Times a log waited in `Journal::next_pass`.
    next_pass_waits: AtomicU64,
    /// Power cuts while a journal was in its commit delay.
    cuts_in_delay: AtomicU64,
}

static COVERAGE: Coverage = Coverage {
    shared_passes: AtomicU64::new(0),
    next_pass_waits: AtomicU64::new(0),
    cuts_in_delay: AtomicU64::new(0),
};

enum Outcome {
    Crash,
    PowerCut(u64),
    Done,
}

async fn create_topics(world: &World, plan: &Plan, oracle: &Rc<RefCell<Oracle>>) {
    let front = world.fronts[0].clone();
    for (name, partitions) in [
        (DLQ, plan.partitions[2]),
        (SOURCE, plan.partitions[0]),
        (PLAIN, plan.partitions[1]),
        (REDRIVEN, plan.partitions[3]),
    ] {
        let f = front.clone();
        let (_, config) = world
            .complete(async move { f.create_topic(topic_config(name, partitions)).await })
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        oracle.borrow_mut().ids.insert(name.to_string(), config.id);
    }
    world.settle().await;
}

/// The steps of one process's life; returns how it ended.
async fn run_world(
    world: &World,
    plan: &Plan,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
    step: &mut usize,
) -> Outcome {
    while *step < plan.steps {
        *step += 1;
        let roll = rng.below(1000);
        match roll {
            0..=279 => spawn_produce(world, oracle, rng),
            280..=629 => spawn_consume(world, oracle, rng),
            630..=639 => {
                let dt = rng.below(300);
                world.clock.advance(dt);
            }
            640..=649 => recreate_plain(world, plan, oracle).await,
            650..=659 => change_policy(world, oracle, rng).await,
            660..=669 => {
                corrupt(world, oracle, rng);
                // Bit rot found at the next start: often that start comes before anything else is written.
                if rng.chance(40) {
                    oracle
                        .borrow_mut()
                        .note(format!("step {step}: process crash right after the flip"));
                    return Outcome::Crash;
                }
            }
            670..=681 => {
                // Often in the middle of two-step operations (a dead letter's copy and settle, a redrive's append and
                // ack, a frontier file's temp write and rename), held at their syncs.
                let how = if rng.chance(40) {
                    in_flight_at_held_syncs(world, oracle, rng, 50).await;
                    " with syncs in flight"
                } else {
                    ""
                };
                oracle
                    .borrow_mut()
                    .note(format!("step {step}: process crash (kill -9){how}"));
                return Outcome::Crash;
            }
            682..=689 if plan.power_cuts => {
                let how = match rng.below(3) {
                    0 => "after the step settled",
                    1 => {
                        // Replies sent before their sync are acknowledged losses now.
                        in_flight_at_held_syncs(world, oracle, rng, 60).await;
                        "with syncs in flight"
                    }
                    _ => {
                        // A failed sync dropped its pages: whatever it answered as durable is lost now.
                        world.sim.fail_syncs(libc::EIO, 1);
                        world.faults_injected.set(true);
                        for _ in 0..1 + rng.below(2) {
                            spawn_produce(world, oracle, rng);
                        }
                        world.clock.advance(rng.below(60));
                        world.settle().await;
                        "right after a failed sync"
                    }
                };
                oracle
                    .borrow_mut()
                    .note(format!("step {step}: power cut {how}"));
                return Outcome::PowerCut(rng.next());
            }
            690..=699 => redrive_dead_letters(world, oracle, rng).await,
            700..=714 => spawn_stale_settle(world, oracle, rng),
            715..=719 => {
                let what = match rng.below(3) {
                    0 => {
                        let errno = if rng.chance(50) {
                            libc::EIO
                        } else {
                            libc::ENOSPC
                        };
                        let count = 1 + rng.below(3) as u32;
                        world.sim.fail_writes(errno, count);
                        format!("the next {count} writes fail with errno {errno}")
                    }
                    1 => {
                        world.sim.fail_syncs(libc::EIO, 1);
                        "the next sync fails".to_string()
                    }
                    _ => {
                        // Fewer failed reads in a process than make a record count as corrupt (it would be skipped:
                        // a loss by design, `partition::MAX_READ_FAILURES`).
                        let left = world.read_faults_left.get();
                        let count = (1 + rng.below(2) as u32).min(left);
                        world.read_faults_left.set(left - count);
                        world.sim.fail_reads(libc::EIO, count);
                        format!("the next {count} reads fail")
                    }
                };
                world.faults_injected.set(true);
                oracle.borrow_mut().note(format!("step {step}: {what}"));
            }
            _ => {}
        }
        let dt = rng.below(60);
        world.clock.advance(dt);
        world.settle().await;
        check(world, oracle).await;
    }
    // A log that refused appends after a failed sync stays that way until a restart (what the error tells the
    // operator to do): restart before the drain, so a dead-letter topic can take its copies again.
    if any_poisoned(world) {
        oracle
            .borrow_mut()
            .note("before the drain: restart (a log refuses appends after a failed sync)".into());
        return Outcome::Crash;
    }
    if !drain(world, oracle, rng).await {
        oracle
            .borrow_mut()
            .note("during the drain: restart (a log refuses appends after a failed sync)".into());
        return Outcome::Crash;
    }
    Outcome::Done
}

/// Holds every sync, then starts one to three produces (`produce_percent` of them) and consumes and lets them run
/// until they wait for a sync: the process is then cut or killed in the middle of their steps.
async fn in_flight_at_held_syncs(
    world: &World,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
    produce_percent: u64,
) {
    world.sim.hold_syncs();
    for _ in 0..1 + rng.below(3) {
        if rng.chance(produce_percent) {
            spawn_produce(world, oracle, rng);
        } else {
            spawn_consume(world, oracle, rng);
        }
    }
    world.clock.advance(rng.below(60));
    world.settle().await;
}

/// Some log refuses appends after a failed sync (until a restart).
fn any_poisoned(world: &World) -> bool {
    world.engines.iter().any(|e| {
        e.owned_partitions()
            .iter()
            .any(|(_, p)| p.log.is_poisoned())
    })
}

fn topics_now() -> [&'static str; 4] {
    [SOURCE, PLAIN, DLQ, REDRIVEN]
}

fn spawn_produce(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let topic = if rng.chance(60) { SOURCE } else { PLAIN };
    let front = world.front(rng);
    let Ok(t) = front.engine().topic(topic) else {
        return;
    };
    let topic_id = t.id();
    let count = 1 + rng.below(3) as usize;
    let partitions = t.partition_count() as u64;
    let mut records = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..count {
        let body = oracle.borrow_mut().new_body(topic, topic_id);
        let target = match rng.below(3) {
            0 => Target::Partition(rng.below(partitions)),
            1 => Target::Key(format!("k{}", rng.below(5))),
            _ => Target::Any,
        };
        records.push(ClientRecord {
            body: Bytes::from(body.clone()),
            target,
        });
        bodies.push(body);
    }
    let oracle = oracle.clone();
    let in_flight = world.in_flight.clone();
    in_flight.set(in_flight.get() + 1);
    world.tasks.spawn(async move {
        let result = front
            .produce(ProduceParams {
                topic: topic.to_string(),
                records,
                batch: count > 1,
            })
            .await;
        in_flight.set(in_flight.get() - 1);
        let mut o = oracle.borrow_mut();
        match result {
            Ok(results) => {
                for (body, r) in bodies.iter().zip(results) {
                    match r {
                        Ok((p, offset)) => {
                            o.note(format!("produced {body} at {p}:{offset}"));
                            o.acked(body, p, offset);
                        }
                        Err(e) => o.note(format!("produce of {body} failed: {e}")),
                    }
                }
            }
            Err(e) => o.note(format!("produce of {bodies:?} failed: {e}")),
        }
    });
}

fn spawn_consume(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let topic = match rng.below(20) {
        0..=11 => SOURCE,
        12..=16 => PLAIN,
        17..=18 => DLQ,
        _ => REDRIVEN,
    };
    let group = GROUPS[rng.below(GROUPS.len() as u64) as usize];
    let front = world.front(rng);
    let Ok(t) = front.engine().topic(topic) else {
        return;
    };
    let topic_id = t.id();
    let max = 1 + rng.below(3) as usize;
    // Long-polls often outlast leases, and leases often end together (a few visibilities only), so several
    // messages tend to become deliverable at once while several consumers are parked.
    let wait_ms = match rng.below(4) {
        0 => 0,
        1 => 1 + rng.below(400),
        _ => 1000 + rng.below(2500),
    };
    let visibility_ms = [1000, 1500, 2000][rng.below(3) as usize];
    // What the client will do with each message: ack, nack (maybe delayed), extend then ack, or nothing.
    let plans: Vec<(u64, u64, u64)> = (0..max)
        .map(|_| (rng.below(6), rng.below(200), rng.below(40)))
        .collect();
    let clock = world.clock.clone();
    let oracle = oracle.clone();
    let in_flight = world.in_flight.clone();
    in_flight.set(in_flight.get() + 1);
    oracle.borrow_mut().note(format!(
        "t={} consume {topic}/{group} max {max} wait {wait_ms} on core {}",
        clock.now_ms(),
        front.engine().id()
    ));
    let tasks = world.tasks.clone();
    world.tasks.spawn(async move {
        let result = front
            .consume(ConsumeParams {
                topic: topic.to_string(),
                group: group.to_string(),
                wait_ms,
                visibility_ms: Some(visibility_ms),
                max,
                media: None,
            })
            .await;
        in_flight.set(in_flight.get() - 1);
        let deliveries = match result {
            Ok(d) => d,
            Err(e) => {
                oracle
                    .borrow_mut()
                    .note(format!("consume {topic}/{group} failed: {e}"));
                return;
            }
        };
        let now = clock.now_ms();
        oracle.borrow_mut().note(format!(
            "t={now} consume {topic}/{group} on core {} → {} messages",
            front.engine().id(),
            deliveries.len()
        ));
        for d in &deliveries {
            let mut o = oracle.borrow_mut();
            o.delivery(topic, topic_id, group, d, now);
            o.remember(topic, topic_id, group, d);
        }
        for (d, (what, after_ms, delay)) in deliveries.into_iter().zip(plans) {
            let front = front.clone();
            let clock = clock.clone();
            let oracle = oracle.clone();
            tasks.spawn(async move {
                clock.sleep_until(clock.now_ms() + after_ms).await;
                let op = match what {
                    0..=2 => SettleOp::Ack,
                    3 => SettleOp::Nack(Some(delay)),
                    4 => SettleOp::Nack(None),
                    _ => SettleOp::Extend(Some(1000)),
                };
                let handle = format!("{}:{}:{}", d.partition, d.offset, d.nonce);
                if matches!(op, SettleOp::Nack(_)) {
                    let key = (topic_id, group.to_string(), d.partition, d.offset);
                    oracle
                        .borrow_mut()
                        .sending_nack(key, d.nonce, clock.now_ms());
                }
                let result = front
                    .settle(SettleParams {
                        topic: topic.to_string(),
                        group: group.to_string(),
                        op,
                        handles: vec![(handle, Ok((d.partition as u64, d.offset, d.nonce)))],
                        batch: false,
                    })
                    .await
                    .map(|mut r| r.remove(0))
                    .and_then(|r| r);
                let key = (topic_id, group.to_string(), d.partition, d.offset);
                let body = String::from_utf8_lossy(&d.payload).to_string();
                oracle.borrow_mut().settled_answer(
                    topic,
                    &body,
                    key,
                    d.nonce,
                    op,
                    &result,
                    clock.now_ms(),
                    1000,
                );
            });
        }
    });
}

/// Deletes and recreates the plain topic: its records need no delivery any more, and the new one starts empty.
async fn recreate_plain(world: &World, plan: &Plan, oracle: &Rc<RefCell<Oracle>>) {
    let front = &world.fronts[0];
    // (Missing when its creation failed under an injected storage fault: created again now.)
    if let Ok(old) = front.engine().topic(PLAIN) {
        let old_id = old.id();
        let f = front.clone();
        if world
            .complete(async move { f.delete_topic(PLAIN.to_string()).await })
            .await
            .is_err()
        {
            return;
        }
        let mut o = oracle.borrow_mut();
        o.deleted.insert(old_id);
        // Its leases went with it: a late settle of one is 410, as for any lease that is gone.
        o.leases.retain(|(id, ..), _| *id != old_id);
        o.note(format!("deleted {PLAIN} (id {old_id})"));
    }
    let partitions = plan.partitions[1];
    let f = front.clone();
    match world
        .complete(async move { f.create_topic(topic_config(PLAIN, partitions)).await })
        .await
    {
        Ok((_, config)) => {
            let mut o = oracle.borrow_mut();
            o.ids.insert(PLAIN.to_string(), config.id);
            o.note(format!("recreated {PLAIN} (id {})", config.id));
        }
        Err(e) if world.faults_injected.get() => oracle.borrow_mut().note(format!(
            "recreating {PLAIN} failed under injected faults: {e}"
        )),
        Err(e) => oracle
            .borrow_mut()
            .fail(format!("recreating {PLAIN} failed: {e}")),
    }
}

/// Changes the source topic's redelivery policy (delays and backoff).
async fn change_policy(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let settings = Settings {
        redelivery_delay_ms: Some([0, 10, 50][rng.below(3) as usize]),
        redelivery_backoff: Some(if rng.chance(50) {
            BackoffKind::Fixed
        } else {
            BackoffKind::Exponential
        }),
        redelivery_delay_max_ms: Some(100 + rng.below(200)),
        ..Settings::default()
    };
    let front = world.front(rng);
    let change = settings.clone();
    let result = world
        .complete(async move { front.change_topic(SOURCE.to_string(), change).await })
        .await;
    oracle.borrow_mut().note(format!(
        "changed {SOURCE}: {settings:?} → {:?}",
        result.map(|c| c.redelivery_delay_ms)
    ));
}

/// Redrives a few dead letters to the redriven topic (each appended there, then acked in the dead-letter topic).
async fn redrive_dead_letters(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let front = world.front(rng);
    let max = 1 + rng.below(4);
    let result = world
        .complete(async move {
            front
                .redrive(crate::ops::redrive::RedriveParams {
                    from: DLQ.to_string(),
                    to: REDRIVEN.to_string(),
                    group: DEFAULT_GROUP.to_string(),
                    max: Some(max),
                })
                .await
        })
        .await;
    let now = world.clock.now_ms();
    let mut o = oracle.borrow_mut();
    // A round whose append failed leaves its messages leased (by the redrive) for its visibility.
    o.internal_leases_until = o
        .internal_leases_until
        .max(now + crate::front::redrive::REDRIVE_VISIBILITY_MS);
    o.note(format!(
        "t={now} redrive {DLQ} → {REDRIVEN} max {max}: {result:?}"
    ));
}

/// Presents a handle a client was given earlier (usually stale by now: settled, expired, leased again) or a live
/// one with a wrong nonce: the oracle checks that only a live lease's exact handle is honoured.
fn spawn_stale_settle(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let handle = {
        let o = oracle.borrow();
        if o.old_handles.is_empty() {
            return;
        }
        o.old_handles[rng.below(o.old_handles.len() as u64) as usize].clone()
    };
    let front = world.front(rng);
    match front.engine().topic(handle.topic) {
        Ok(t) if t.id() == handle.topic_id => {}
        _ => return,
    }
    let d = handle.delivery;
    let nonce = if rng.chance(30) {
        d.nonce.wrapping_add(1 + rng.below(1000))
    } else {
        d.nonce
    };
    let op = match rng.below(4) {
        0 | 1 => SettleOp::Ack,
        2 => SettleOp::Nack(None),
        _ => SettleOp::Extend(Some(1000)),
    };
    let clock = world.clock.clone();
    let key = (
        handle.topic_id,
        handle.group.to_string(),
        d.partition,
        d.offset,
    );
    {
        let mut o = oracle.borrow_mut();
        let now = clock.now_ms();
        // The exact handle of a lease that still lives is its client's to settle (two settles of one lease may be
        // answered in either order): only dead handles and wrong nonces are presented.
        if o.leases
            .get(&key)
            .is_some_and(|&(n, expiry)| n == nonce && expiry > now)
        {
            return;
        }
        o.note(format!(
            "t={now} presenting an old handle {key:?} nonce {nonce} ({op:?})"
        ));
    }
    let oracle = oracle.clone();
    world.tasks.spawn(async move {
        let result = front
            .settle(SettleParams {
                topic: handle.topic.to_string(),
                group: handle.group.to_string(),
                op,
                handles: vec![(
                    format!("{}:{}:{nonce}", d.partition, d.offset),
                    Ok((d.partition as u64, d.offset, nonce)),
                )],
                batch: false,
            })
            .await
            .map(|mut r| r.remove(0))
            .and_then(|r| r);
        let body = String::from_utf8_lossy(&d.payload).to_string();
        oracle.borrow_mut().settled_answer(
            handle.topic,
            &body,
            key,
            nonce,
            op,
            &result,
            clock.now_ms(),
            1000,
        );
    });
}

/// Flips a byte in a frame of some segment (often the last frame of the newest one), excusing that record.
fn corrupt(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let topic = topics_now()[rng.below(4) as usize];
    let Some(&topic_id) = oracle.borrow().ids.get(topic) else {
        return;
    };
    let Ok(t) = world.fronts[0].engine().topic(topic) else {
        return;
    };
    let mut p = rng.below(t.partition_count() as u64) as u32;
    // Often, the dangerous case on purpose: a partition whose every record is settled and whose frontiers are on
    // disk, so losing its last frame leaves the durable frontier beyond what recovery finds.
    let settled: Vec<u32> = world
        .engines
        .iter()
        .filter_map(|e| e.topic(topic).ok())
        .flat_map(|t| {
            t.owned_partitions()
                .filter(|p| {
                    let end = p.log.end_offset();
                    end > 0 && GROUPS.iter().all(|g| p.committed(g) == Some(end))
                })
                .map(|p| p.id)
                .collect::<Vec<_>>()
        })
        .collect();
    if !settled.is_empty() && rng.chance(50) {
        p = settled[rng.below(settled.len() as u64) as usize];
    }
    let dir = PathBuf::from(format!("/sim/topics/{topic}/{p}"));
    let mut segments: Vec<PathBuf> = world
        .sim
        .paths()
        .into_iter()
        .filter(|path| {
            path.parent() == Some(dir.as_path()) && path.extension().is_some_and(|e| e == "log")
        })
        .collect();
    segments.sort();
    let Some(path) = (if rng.chance(70) {
        segments.last().cloned()
    } else {
        segments
            .get(rng.below(segments.len() as u64) as usize)
            .cloned()
    }) else {
        return;
    };
    let Some(bytes) = world.sim.contents(&path) else {
        return;
    };
    let base: u64 = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let scan = crate::storage::frame::scan(&bytes, base, 512);
    let frames: Vec<(usize, u64)> = scan
        .positions
        .iter()
        .enumerate()
        .filter(|(_, &pos)| pos != crate::storage::frame::NO_POSITION)
        .map(|(i, &pos)| (pos as usize, base + i as u64))
        .collect();
    let Some(&(pos, offset)) = (if rng.chance(60) {
        frames.last()
    } else {
        frames.get(rng.below(frames.len() as u64) as usize)
    }) else {
        return;
    };
    let end = frames
        .iter()
        .find(|(q, _)| *q > pos)
        .map_or(scan.valid_len as usize, |(q, _)| *q);
    let at = pos + rng.below((end - pos).max(1) as u64) as usize;
    // The body the flip damages (a copy in the dead-letter or redriven topic may not have been seen yet).
    let damaged = crate::storage::frame::decode_frame(&bytes[pos..], offset, 512)
        .ok()
        .map(|(_, payload)| String::from_utf8_lossy(payload).to_string());
    world.sim.corrupt(&path, at, 1 << rng.below(8));
    let mut o = oracle.borrow_mut();
    if let Some(body) = damaged {
        if o.produced.contains_key(&body) {
            o.excused.insert(body);
        }
    }
    let hit: Vec<String> = o
        .produced
        .iter()
        .filter(|(_, r)| r.topic_id == topic_id && r.place == Some((p, offset)))
        .map(|(body, _)| body.clone())
        .collect();
    o.excused.extend(hit);
    if let Some(body) = o.copy_places.get(&(topic_id, p, offset)).cloned() {
        o.excused.insert(body);
    }
    o.note(format!(
        "flipped a bit of {topic} {p}:{offset} at byte {at} of {}",
        path.display()
    ));
}

/// The frontier files, per (topic id, group, partition): on the medium (what a power cut would leave), or as a
/// process reads them (the page cache, which may still hold pages a failed sync dropped).
fn disk_frontiers(world: &World, oracle: &Oracle, medium: bool) -> Vec<((u64, String, u32), u64)> {
    let mut out = Vec::new();
    for (name, &id) in &oracle.ids {
        let Ok(t) = world.fronts[0].engine().topic(name) else {
            continue;
        };
        if t.id() != id {
            continue;
        }
        for p in 0..t.partition_count() {
            for g in GROUPS {
                let path = Path::new("/sim/topics")
                    .join(name)
                    .join(p.to_string())
                    .join(crate::partition::frontier::file_name(g));
                let bytes = if medium {
                    world.sim.durable_contents(&path)
                } else {
                    world.sim.contents(&path)
                };
                if let Some(bytes) = bytes {
                    if let Some(v) = crate::partition::frontier::decode(&bytes) {
                        out.push(((id, g.to_string(), p), v));
                    }
                }
            }
        }
    }
    out
}

/// After a restart (the journal replayed, no partition touched yet): every frontier file holds at least the
/// frontier the last process held durable, in the file or in its journal.
fn check_durable_frontiers(world: &World, o: &Oracle) {
    let on_disk: BTreeMap<_, _> = disk_frontiers(world, o, false).into_iter().collect();
    let current: BTreeSet<u64> = o.ids.values().copied().collect();
    for (key, &durable) in &o.frontier_durable {
        if !current.contains(&key.0) || o.deleted.contains(&key.0) {
            continue;
        }
        let held = on_disk.get(key).copied().unwrap_or(0);
        if held < durable {
            o.fail(format!(
                "{key:?} frontier file holds {held} after the restart; the last process held {durable} durable"
            ));
        }
    }
}

/// The checks after every step.
async fn check(world: &World, oracle: &Rc<RefCell<Oracle>>) {
    {
        let mut o = oracle.borrow_mut();
        // Frontiers never move backwards: in memory within a process, on disk ever.
        for e in &world.engines {
            for (topic, partition) in e.owned_partitions() {
                for g in GROUPS {
                    let Some(c) = partition.committed(g) else {
                        continue;
                    };
                    let key = (topic.id(), g.to_string(), partition.id);
                    let end = partition.log.end_offset();
                    if c > end {
                        o.fail(format!("{key:?} committed {c} beyond the log end {end}"));
                    }
                    if let Some(d) = partition.durable_frontier(g) {
                        if d > c {
                            o.fail(format!(
                                "{key:?} durable frontier {d} above the committed {c}"
                            ));
                        }
                        let held = o.frontier_durable.entry(key.clone()).or_insert(0);
                        *held = (*held).max(d);
                    }
                    let seen = o.frontier_mem.entry(key.clone()).or_insert(0);
                    if c < *seen {
                        let was = *seen;
                        o.fail(format!("{key:?} committed moved back from {was} to {c}"));
                    }
                    *seen = c;
                }
            }
        }
        for (key, value) in disk_frontiers(world, &o, true) {
            let seen = o.frontier_disk.entry(key.clone()).or_insert(0);
            if value < *seen {
                let was = *seen;
                o.fail(format!(
                    "{key:?} frontier file moved back from {was} to {value}"
                ));
            }
            *seen = value;
        }
    }
    // No parked consumer sleeps while a message is deliverable to it (once pending retries have had their chance).
    for attempt in 0..50 {
        let Some(problem) = sleeping_with_work(world) else {
            return;
        };
        let retrying = world.net.queued() > 0
            || world
                .engines
                .iter()
                .any(|e| e.pending_wake_count() > 0 || e.polling() > 0);
        if !retrying || attempt == 49 {
            oracle.borrow().fail(problem);
        }
        world.clock.advance(1);
        world.settle().await;
    }
}

/// A parked consumer that holds no wake unit while a partition of its topic has a deliverable message for its
/// group, if there is one.
fn sleeping_with_work(world: &World) -> Option<String> {
    for (core, e) in world.engines.iter().enumerate() {
        for topic in topics_now() {
            for g in GROUPS {
                if e.sleeping_consumers(topic, g) == 0 {
                    continue;
                }
                for (owner, f) in world.engines.iter().enumerate() {
                    let Ok(t) = f.topic(topic) else {
                        continue;
                    };
                    for p in t.owned_partitions() {
                        if p.has_deliverable(g) {
                            return Some(format!(
                                "a consumer of {topic}/{g} sleeps on core {core} while partition {} on core {owner} has a deliverable message (end {}, committed {:?}, next wake-up {:?}, now {})",
                                p.id,
                                p.log.end_offset(),
                                p.committed(g),
                                p.next_wakeup_ms(),
                                f.now_ms()
                            ) + &format!("\nshard: {}", p.debug_shard(g)));
                        }
                    }
                }
            }
        }
    }
    None
}

/// Ends the run: lets every lease and delay run out, drains every topic and group (retrying acks refused for a
/// full acked-ahead set, as a client would), and checks that nothing acknowledged was lost and every frontier
/// reached its log's end.
/// Consumes and acks everything, then checks nothing is stuck or lost. False (nothing checked) if a log was
/// poisoned meanwhile: the caller restarts and drains again.
async fn drain(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) -> bool {
    world.clock.advance(5_000);
    world.settle().await;
    // (topic, topic id, group, delivery) leased by the drain and not settled yet.
    let mut pending: Vec<(&'static str, u64, &'static str, Delivery)> = Vec::new();
    let mut unsettled_rounds = 0;
    // Every group of every partition has reached its log's end.
    let all_settled = |world: &World| {
        world.engines.iter().all(|e| {
            e.owned_partitions().iter().all(|(_, p)| {
                GROUPS
                    .iter()
                    .all(|g| p.committed(g) == Some(p.log.end_offset()))
            })
        })
    };
    for _round in 0..400 {
        let mut got = 0;
        for topic in topics_now() {
            for g in GROUPS {
                let front = world.front(rng);
                let Ok(t) = front.engine().topic(topic) else {
                    continue;
                };
                let topic_id = t.id();
                let deliveries = world
                    .complete(async move {
                        front
                            .consume(ConsumeParams {
                                topic: topic.to_string(),
                                group: g.to_string(),
                                wait_ms: 0,
                                visibility_ms: Some(60_000),
                                max: 10,
                                media: None,
                            })
                            .await
                    })
                    .await;
                let deliveries = match deliveries {
                    Ok(d) => d,
                    Err(e) => {
                        oracle
                            .borrow_mut()
                            .note(format!("drain consume {topic}/{g} failed: {e}"));
                        Vec::new()
                    }
                };
                let now = world.clock.now_ms();
                got += deliveries.len();
                for d in deliveries {
                    oracle.borrow_mut().delivery(topic, topic_id, g, &d, now);
                    pending.push((topic, topic_id, g, d));
                }
            }
        }
        let mut still = Vec::new();
        for (topic, topic_id, g, d) in pending {
            let front = world.front(rng);
            let handle = format!("{}:{}:{}", d.partition, d.offset, d.nonce);
            let params = SettleParams {
                topic: topic.to_string(),
                group: g.to_string(),
                op: SettleOp::Ack,
                handles: vec![(handle, Ok((d.partition as u64, d.offset, d.nonce)))],
                batch: false,
            };
            let result = world
                .complete(async move { front.settle(params).await })
                .await
                .map(|mut r| r.remove(0))
                .and_then(|r| r);
            let now = world.clock.now_ms();
            let key = (topic_id, g.to_string(), d.partition, d.offset);
            let body = String::from_utf8_lossy(&d.payload).to_string();
            oracle.borrow_mut().settled_answer(
                topic,
                &body,
                key,
                d.nonce,
                SettleOp::Ack,
                &result,
                now,
                0,
            );
            if matches!(
                result,
                Err(OpError::Engine(crate::engine::EngineError::Partition(
                    PartitionError::AckedAheadFull
                )))
            ) {
                still.push((topic, topic_id, g, d));
            }
        }
        pending = still;
        if got == 0 && pending.is_empty() {
            // Leases other clients still hold (their acks, nacks or extends are on the way) run out first.
            let last_expiry = {
                let o = oracle.borrow();
                o.leases
                    .values()
                    .map(|&(_, e)| e)
                    .max()
                    .unwrap_or(0)
                    .max(o.internal_leases_until)
            };
            let now = world.clock.now_ms();
            if last_expiry <= now {
                // Messages the broker holds back on its own (a dead-letter copy that failed is retried after
                // DEAD_LETTER_RETRY_MS) come due within a bounded time; a partition still behind after that is stuck.
                if unsettled_rounds < 30 && !all_settled(world) {
                    unsettled_rounds += 1;
                    world
                        .clock
                        .advance(crate::front::consume::DEAD_LETTER_RETRY_MS);
                    world.settle().await;
                    continue;
                }
                break;
            }
            world.clock.advance(last_expiry - now + 1);
        } else {
            world.clock.advance(100);
        }
        world.settle().await;
    }
    if any_poisoned(world) {
        return false;
    }
    let o = oracle.borrow();
    // Every produce and consume a client started was answered: no writer or waiter is stuck.
    if world.in_flight.get() > 0 {
        o.fail(format!(
            "after the drain {} produces or consumes are still unanswered",
            world.in_flight.get()
        ));
    }
    // Every frontier reached its log's end: nothing is stuck.
    for e in &world.engines {
        for (topic, p) in e.owned_partitions() {
            for g in GROUPS {
                let committed = p.committed(g);
                let end = p.log.end_offset();
                if committed != Some(end) {
                    o.fail(format!(
                        "after the drain {}/{g} partition {} is committed at {committed:?}, its end is {end}\nshard: {}",
                        topic.name(),
                        p.id,
                        p.debug_shard(g)
                    ));
                }
            }
        }
    }
    // Every acknowledged produce to a topic that still exists was acknowledged by a client in every group of its
    // topic; in the source topic, a message never acked there may instead have been dead-lettered, and then its copy
    // is seen in the dead-letter topic (or, redriven from there, in the redriven topic).
    let acked_in = |topic: &str, body: &str, g: &str| {
        o.client_acked
            .contains(&(topic.to_string(), body.to_string(), g.to_string()))
    };
    let seen = |topic: &str, body: &str| o.seen_in.contains(&(topic.to_string(), body.to_string()));
    for (body, p) in &o.produced {
        if !p.acked || o.deleted.contains(&p.topic_id) {
            continue;
        }
        let (partition, offset) = p.place.expect("acknowledged at a place");
        if o.excused.contains(body) {
            continue;
        }
        for g in GROUPS {
            if !o.delivered.contains_key(&(body.clone(), g.to_string())) {
                o.fail(format!(
                    "acknowledged {body} at {}:{partition}:{offset} was never delivered to group {g}",
                    p.topic
                ));
            }
            let accounted = acked_in(&p.topic, body, g)
                || (p.topic == SOURCE && (seen(DLQ, body) || seen(REDRIVEN, body)));
            if !accounted {
                o.fail(format!(
                    "acknowledged {body} at {}:{partition}:{offset} was settled in group {g} without a client's ack and without a dead-letter copy",
                    p.topic
                ));
            }
        }
    }
    // A copy seen in the dead-letter topic was acked there by a client in every group, or redriven; a redriven copy
    // was acked by a client in every group.
    for (topic, body) in &o.seen_in {
        if o.excused.contains(body) {
            continue;
        }
        for g in GROUPS {
            let accounted = match topic.as_str() {
                DLQ => acked_in(DLQ, body, g) || seen(REDRIVEN, body),
                REDRIVEN => acked_in(REDRIVEN, body, g),
                _ => true,
            };
            if !accounted {
                o.fail(format!(
                    "the copy of {body} in {topic} was settled in group {g} without a client's ack and without a redriven copy"
                ));
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<u64> {
        std::env::var(name).ok().and_then(|v| v.parse().ok())
    }

    /// The default run: a thousand seeds on two threads (a few seconds); `BERTH_SIM_SEEDS` sets the count,
    /// `BERTH_SIM_SEED` replays one.
    #[test]
    fn simulated_crashes_power_cuts_and_faults_lose_nothing_acknowledged() {
        if let Some(seed) = env("BERTH_SIM_SEED") {
            run_seed(seed);
            return;
        }
        let seeds = env("BERTH_SIM_SEEDS").unwrap_or(1000);
        let first = env("BERTH_SIM_FIRST").unwrap_or(1);
        let threads = 2u64;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                std::thread::spawn(move || {
                    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                        .make()
                        .expect("executor")
                        .run(async move {
                            let mut s = first + t;
                            while s < first + seeds {
                                run_seed_here(s).await;
                                s += threads;
                            }
                        })
                })
            })
            .collect();
        for h in handles {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
        // The journal's commit delay was exercised: passes of several partitions, logs waiting in `next_pass`, and
        // power cuts inside a delay.
        let covered = [
            (
                "journal passes of several partitions",
                &COVERAGE.shared_passes,
            ),
            ("waits in Journal::next_pass", &COVERAGE.next_pass_waits),
            ("power cuts inside a commit delay", &COVERAGE.cuts_in_delay),
        ];
        for (what, n) in covered {
            let n = n.load(Ordering::Relaxed);
            eprintln!("simulation: {n} {what} over {seeds} seeds");
            assert!(seeds < 200 || n > 0, "{seeds} seeds ran no {what}");
        }
    }

    /// One core, the simulation's topics, nothing else going on: for the two-step operations' own tests.
    async fn quiet_world(sim: Rc<Sim>) -> World {
        let plan = Plan {
            cores: 1,
            fsync: FsyncPolicy::Always,
            steps: 0,
            net_depth: 64,
            partitions: [1, 1, 1, 1],
            power_cuts: false,
        };
        let world = World::boot(&plan, sim, 1_700_000_000_000, 1).await;
        create_topics(&world, &plan, &Rc::new(RefCell::new(Oracle::default()))).await;
        world
    }

    async fn produce_one(world: &World, topic: &'static str, body: &'static str) {
        let front = world.fronts[0].clone();
        let produced = world
            .complete(async move {
                front
                    .produce(ProduceParams {
                        topic: topic.to_string(),
                        records: vec![ClientRecord {
                            body: Bytes::from_static(body.as_bytes()),
                            target: Target::Partition(0),
                        }],
                        batch: false,
                    })
                    .await
            })
            .await;
        assert!(produced.is_ok_and(|r| r.iter().all(|r| r.is_ok())));
    }

    async fn consume_some(world: &World, topic: &'static str) -> Vec<Delivery> {
        let front = world.fronts[0].clone();
        world
            .complete(async move {
                front
                    .consume(ConsumeParams {
                        topic: topic.to_string(),
                        group: DEFAULT_GROUP.to_string(),
                        wait_ms: 0,
                        visibility_ms: Some(1000),
                        max: 10,
                        media: None,
                    })
                    .await
            })
            .await
            .expect("consume")
    }

    async fn nack(world: &World, topic: &'static str, d: &Delivery) {
        let front = world.fronts[0].clone();
        let handle = (d.partition as u64, d.offset, d.nonce);
        let result = world
            .complete(async move {
                front
                    .settle(SettleParams {
                        topic: topic.to_string(),
                        group: DEFAULT_GROUP.to_string(),
                        op: SettleOp::Nack(None),
                        handles: vec![(String::new(), Ok(handle))],
                        batch: false,
                    })
                    .await
            })
            .await;
        assert!(result.is_ok_and(|r| r.iter().all(|r| r.is_ok())));
    }

    fn committed(world: &World, topic: &str) -> Option<u64> {
        let t = world.engines[0].topic(topic).expect("topic");
        let p = t.owned_partitions().next().expect("partition 0");
        p.committed(DEFAULT_GROUP)
    }

    /// A dead letter is two steps: the copy appended to the dead-letter topic (durably), then the original settled.
    /// A copy that cannot be appended settles nothing: the message stays in its topic, and goes to the dead-letter
    /// topic once appends work again.
    #[test]
    fn a_dead_letter_copy_that_cannot_be_appended_settles_nothing() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(async {
                let sim = Sim::new();
                let world = quiet_world(sim.clone()).await;
                produce_one(&world, SOURCE, "m").await;
                for _ in 0..MAX_DELIVERIES {
                    let got = consume_some(&world, SOURCE).await;
                    assert_eq!(got.len(), 1);
                    nack(&world, SOURCE, &got[0]).await;
                }
                sim.fail_writes(libc::EIO, 1);
                assert!(consume_some(&world, SOURCE).await.is_empty());
                assert_eq!(
                    committed(&world, SOURCE),
                    Some(0),
                    "settled in its topic although its dead-letter copy failed"
                );
                sim.fail_writes(libc::EIO, 0);
                world
                    .clock
                    .advance(crate::front::consume::DEAD_LETTER_RETRY_MS + 1);
                world.settle().await;
                assert!(consume_some(&world, SOURCE).await.is_empty());
                assert_eq!(committed(&world, SOURCE), Some(1));
                let copies = consume_some(&world, DLQ).await;
                assert_eq!(copies.len(), 1);
                assert_eq!(&copies[0].payload[..], b"m");
                world.shut_down().await;
            });
    }

    /// A redrive is two steps too: the batch appended to the target, then acked in the source. An append that fails
    /// acks nothing in the source; the messages move once appends work again (after the redrive's lease).
    #[test]
    fn a_redrive_whose_append_fails_acks_nothing_in_the_source() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(async {
                let sim = Sim::new();
                let world = quiet_world(sim.clone()).await;
                produce_one(&world, DLQ, "d1").await;
                produce_one(&world, DLQ, "d2").await;
                async fn redrive(world: &World) -> crate::ops::OpResult<u64> {
                    let front = world.fronts[0].clone();
                    world
                        .complete(async move {
                            front
                                .redrive(crate::ops::redrive::RedriveParams {
                                    from: DLQ.to_string(),
                                    to: REDRIVEN.to_string(),
                                    group: DEFAULT_GROUP.to_string(),
                                    max: None,
                                })
                                .await
                        })
                        .await
                }
                sim.fail_writes(libc::EIO, 1);
                assert!(redrive(&world).await.is_err());
                assert_eq!(
                    committed(&world, DLQ),
                    Some(0),
                    "acked in the source without a copy"
                );
                sim.fail_writes(libc::EIO, 0);
                world
                    .clock
                    .advance(crate::front::redrive::REDRIVE_VISIBILITY_MS + 1);
                world.settle().await;
                assert_eq!(redrive(&world).await.ok(), Some(2));
                assert_eq!(committed(&world, DLQ), Some(2));
                let moved: Vec<Vec<u8>> = consume_some(&world, REDRIVEN)
                    .await
                    .iter()
                    .map(|d| d.payload.to_vec())
                    .collect();
                assert_eq!(moved, vec![b"d1".to_vec(), b"d2".to_vec()]);
                world.shut_down().await;
            });
    }

    /// A simulated process that ends leaves nothing behind: no task, no descriptor (so seeds can run by the
    /// thousand on one executor).
    #[test]
    fn simulated_processes_leave_no_descriptor_behind() {
        let count = || {
            std::fs::read_dir("/proc/self/fd")
                .map(|d| d.count())
                .unwrap_or(0)
        };
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(async move {
                run_seed_here(1).await;
                let before = count();
                for seed in 2..30 {
                    run_seed_here(seed).await;
                }
                // Other tests of this process open and close descriptors meanwhile: a leak shows as growth with
                // the number of simulated processes (28 here), not as a small difference.
                let after = count();
                assert!(
                    after <= before + 8,
                    "descriptors leaked by simulated processes: {before} before, {after} after"
                );
            });
    }
}
