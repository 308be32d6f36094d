//! The simulation extended to nodes (`docs/replication.md`, step 6): three simulated nodes, each a one-core
//! engine with its front and shipper on its own simulated disk, joined by a simulated network (`net.rs`: delays,
//! reordering, lost messages, cut links, paused nodes) and a simulated etcd (`meta.rs`: the metastore's own keys,
//! encoders and snapshots; sessions that lapse a TTL after their last refresh), all on one executor and one manual
//! clock. What runs is the replication code the real nodes run: the leader's shipper, majority commit, the follower's
//! apply, the fencing round, truncation by epoch, CheckQuorum, the mover, and elections from
//! `cluster::election::candidacies`; only the etcd client, the node RPC transport and the process around them are
//! simulated.
//!
//! A seeded workload produces to a replicated topic (R = 3), reads it back, and consumes it in the default group
//! (leases acked, nacked, or left to expire: `groups.rs`), through random nodes, while faults
//! strike: a node killed (its page cache kept, as a kill -9 does), its power cut (a torn tail), a journal pass of
//! a node refused (its write fails: seeds whose leaders ship after their sync), its disk lost (replaced by an
//! empty one, once per seed: the guarantee is about one lost disk), a node paused (its messages held, its session
//! lapsing) and resumed, links between nodes cut and healed, a node cut from etcd, and each node's watch of etcd
//! lagging. After every answer the oracle checks that a record served or acknowledged at an offset is always the
//! same one, and that no record is at two offsets; at the end, with every node running and every link healed, that
//! every acknowledged record is served at the offset its produce was told, with nothing unproduced in between,
//! within two minutes of simulated time. So a commit on a minority, a missing truncation or a missing fence shows as
//! an acknowledged record lost, replaced, or never served again (`tests.rs` plants each, through `crate::planted`,
//! and checks it is found: a finding of the oracle, not a harness failure). After every step the oracle also reads
//! each replica's durable frontier of the default group from its disk: what a majority holds never moves backwards
//! (but where the lost disk took it), the leader serves from it, and no lease is answered below it after a leader
//! change; at the end the group is drained and every acknowledged record must have been delivered or acked
//! (`groups.rs`). Not modelled: etcd's grace (a node fences itself when etcd expires its session, not
//! `etcd_grace_s` later), a paused node's own tasks (they run on; only its messages and its session stop), groups
//! other than the default one, drains (the mover runs but nothing asks it to move).
//!
//! A failing seed prints itself: `BERTH_SIM_SEED=N cargo test --release --lib sim::nodes` replays it,
//! `BERTH_SIM_NODE_SEEDS=N` runs that many, `BERTH_SIM_TRACE=1` (with `-- --nocapture`) prints every event.

mod groups;
mod meta;
mod net;
mod node;
#[cfg(test)]
mod tests;

use super::world::Tasks;
use super::Rng;
use crate::clock::{Clock, ManualClock};
use crate::cluster::election::candidacies;
use crate::engine::placement::NodeIndex;
use crate::engine::topic::TopicConfig;
use crate::ops::params::BatchLimits;
use crate::ops::produce::{ClientRecord, ProduceParams, Target};
use crate::ops::replay::ReplayParams;
use crate::storage::sim::Sim;
use bytes::Bytes;
use meta::SimEtcd;
use net::NodeNet;
use node::SimNode;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

/// Session TTL of the simulated nodes, ms.
pub(super) const TTL_MS: u64 = 2000;
/// The nodes, indexed 1 to 3.
const NODES: NodeIndex = 3;
const TOPIC: &str = "r";
const PARTITIONS: u32 = 2;
/// Simulated time the end of a seed allows the healed cluster to serve everything acknowledged.
const HEAL_MS: u64 = 120_000;
/// Yields per round of a settle, and rounds before the world counts as livelocked.
const SETTLE_YIELDS: usize = 40;
const SETTLE_ROUNDS: usize = 1_000;

/// What clients were told, and the checks against it.
#[derive(Default)]
struct Oracle {
    seed: u64,
    next_body: u64,
    /// Body → the partition it was produced to.
    attempted: BTreeMap<String, u32>,
    /// (partition, offset) → body, as produces were acknowledged.
    acked: BTreeMap<(u32, u64), String>,
    /// (partition, offset) → body, as reads served them.
    served: BTreeMap<(u32, u64), String>,
    /// Body → where an answer placed it (a record written twice shows at two places).
    placed: BTreeMap<String, (u32, u64)>,
    /// The default group's consumers and its frontier (`groups.rs`).
    groups: groups::GroupOracle,
    log: Vec<String>,
}

impl Oracle {
    fn note(&mut self, event: String) {
        if std::env::var_os("BERTH_SIM_TRACE").is_some() {
            eprintln!("  {event}");
        }
        if self.log.len() > 4000 {
            self.log.drain(..2000);
        }
        self.log.push(event);
    }

    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(30).collect();
        panic!(
            "node simulation seed {} found: {what}\nlast events, newest first:\n  {}\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::nodes -- --nocapture",
            self.seed,
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  "),
            self.seed
        );
    }

    /// A record at (p, offset) was acknowledged (`acked`) or served as `body`: it must be the one every earlier
    /// answer named there.
    fn at(&mut self, p: u32, offset: u64, body: &str, acked: bool) {
        match self.attempted.get(body) {
            Some(&q) if q == p => {}
            Some(&q) => self.fail(format!(
                "{body}, produced to partition {q}, found in partition {p} at {offset}"
            )),
            None => self.fail(format!("an unproduced record {body:?} at {p}:{offset}")),
        }
        for (what, map) in [("acknowledged", &self.acked), ("served", &self.served)] {
            if let Some(other) = map.get(&(p, offset)).filter(|b| *b != body) {
                self.fail(format!(
                    "{p}:{offset} holds {body} ({}), but {other} was {what} there (an acknowledged or served record replaced)",
                    if acked { "acknowledged" } else { "served" }
                ));
            }
        }
        match self.placed.get(body) {
            Some(&(q, o)) if (q, o) != (p, offset) => self.fail(format!(
                "{body} at {p}:{offset}, and an earlier answer placed it at {q}:{o} (a record written twice)"
            )),
            _ => {
                self.placed.insert(body.to_string(), (p, offset));
            }
        }
        if acked {
            self.acked.insert((p, offset), body.to_string());
        } else {
            self.served.insert((p, offset), body.to_string());
        }
    }

    /// The highest offset any answer named in partition `p`, plus one.
    fn end(&self, p: u32) -> u64 {
        self.acked
            .keys()
            .chain(self.served.keys())
            .filter(|(q, _)| *q == p)
            .map(|(_, o)| o + 1)
            .max()
            .unwrap_or(0)
    }
}

/// One node's place in the cluster: its disk, its process while it runs, its session.
struct Slot {
    index: NodeIndex,
    disk: Rc<Sim>,
    incarnation: String,
    node: Option<SimNode>,
    /// Its session lease in etcd (None: expired or never registered).
    session: Option<i64>,
    last_refresh: u64,
    /// The disk is new to the cluster: its next start writes `joined`.
    new_disk: bool,
    /// Steps since the driver last gave its watch a snapshot.
    lag: u32,
    /// Its watch brings nothing until then (a stalled watch stream), ms.
    watch_stalled_until: u64,
}

struct Cluster {
    seed: u64,
    clock: Rc<ManualClock>,
    etcd: Rc<SimEtcd>,
    net: Rc<NodeNet>,
    slots: RefCell<Vec<Slot>>,
    oracle: Rc<RefCell<Oracle>>,
    /// The driver's own tasks (the network's pump, waits).
    tasks: Tasks,
    processes: Cell<u64>,
    /// A disk was lost in this seed.
    disk_lost: Cell<bool>,
    /// Chance in percent that a running node's watch gets the newest snapshot at a tick.
    watch_percent: u64,
    /// Chance in percent that a step's fault roll strikes (calm seeds see one fault at a time, stormy ones many).
    fault_percent: u64,
    /// What the oracle last read of each node's disk (`groups::durable_frontiers`).
    disk_reads: RefCell<Vec<groups::DiskRead>>,
}

thread_local! {
    /// The simulated time of the seed this thread runs, for the log lines' timestamps.
    static NOW_MS: Cell<u64> = const { Cell::new(0) };
}

/// Log timestamps in simulated milliseconds.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "t={}", NOW_MS.with(|n| n.get()))
    }
}

/// Runs one seed, on an executor of its own.
pub fn run_node_seed(seed: u64) {
    // `BERTH_SIM_LOG=warn` (a tracing filter): berth's own log lines, as the nodes write them.
    let _log = std::env::var("BERTH_SIM_LOG").ok().map(|filter| {
        tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .with_timer(SimTime)
                .finish(),
        )
    });
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(run_node_seed_here(seed));
}

pub async fn run_node_seed_here(seed: u64) {
    let trace = std::env::var_os("BERTH_SIM_TRACE").is_some();
    if trace {
        eprintln!("node seed {seed} starts");
    }
    let mut rng = Rng::new(seed);
    let clock = ManualClock::new(1_700_000_000_000);
    let config = node::node_config(1, "");
    let net = NodeNet::new(
        clock.clone(),
        seed,
        BatchLimits {
            max_batch_records: config.max_batch_records,
            max_batch_bytes: config.max_batch_bytes,
            max_message_bytes: config.max_message_bytes,
        },
    );
    net.max_delay_ms.set([1, 5, 30][rng.below(3) as usize]);
    let cluster = Cluster {
        seed,
        clock: clock.clone(),
        etcd: SimEtcd::new(),
        net: net.clone(),
        slots: RefCell::new(
            (1..=NODES)
                .map(|index| Slot {
                    index,
                    disk: Sim::new(),
                    incarnation: format!("{index:032x}"),
                    node: None,
                    session: None,
                    last_refresh: 0,
                    new_disk: false,
                    lag: 0,
                    watch_stalled_until: 0,
                })
                .collect(),
        ),
        oracle: Rc::new(RefCell::new(Oracle {
            seed,
            ..Oracle::default()
        })),
        tasks: Tasks::default(),
        processes: Cell::new(0),
        disk_lost: Cell::new(false),
        watch_percent: [100, 60, 25][rng.below(3) as usize],
        fault_percent: [100, 40, 15][rng.below(3) as usize],
        disk_reads: RefCell::new((1..=NODES).map(|_| groups::DiskRead::default()).collect()),
    };
    cluster.tasks.spawn(net.clone().pump());
    // The nodes register, then the topic is created (each partition led by a different node), then they start.
    for i in 1..=NODES {
        cluster.register(i);
    }
    let mut config = TopicConfig::with_defaults(TOPIC);
    config.partitions = PARTITIONS;
    config.replicas = 3;
    let replicas: Vec<Vec<NodeIndex>> = (0..PARTITIONS)
        .map(|p| (0..NODES).map(|k| (p + k) % NODES + 1).collect())
        .collect();
    cluster.etcd.create_topic(&config, &replicas);
    for i in 1..=NODES {
        cluster.start(i).await;
    }
    let steps = 200 + rng.below(300) as usize;
    for step in 0..steps {
        cluster.step(&mut rng, step).await;
        let dt = rng.below(50);
        cluster.clock.advance(dt);
        cluster.tick(&mut rng).await;
        cluster.settle().await;
        cluster.check_frontiers();
    }
    cluster.heal_and_check(&mut rng).await;
    cluster.drain(&mut rng).await;
    if trace {
        eprintln!(
            "node seed {seed}: {} acknowledged, {} served, {} consumes, {} leases, {} acks answered 200, frontiers held by a majority {:?}, {} partition key writes, {} messages delivered, {} lost",
            cluster.oracle.borrow().acked.len(),
            cluster.oracle.borrow().served.len(),
            cluster.oracle.borrow().groups.consumes,
            cluster.oracle.borrow().groups.deliveries,
            cluster.oracle.borrow().groups.settled.len(),
            cluster.oracle.borrow().groups.held,
            cluster.etcd.moves.get(),
            net.delivered.get(),
            net.lost.get()
        );
    }
    cluster.end().await;
}

impl Cluster {
    fn note(&self, event: String) {
        self.oracle
            .borrow_mut()
            .note(format!("t={} {event}", self.clock.now_ms()));
    }

    fn register(&self, i: NodeIndex) {
        let now = self.clock.now_ms();
        let mut slots = self.slots.borrow_mut();
        let slot = &mut slots[i as usize - 1];
        let lease = self.etcd.register(i, 1, &slot.incarnation, now);
        slot.session = Some(lease);
        slot.last_refresh = now;
        drop(slots);
        self.note(format!("node {i} registers (session {lease:x})"));
    }

    /// Starts node `i`'s process on its disk (registered already).
    async fn start(&self, i: NodeIndex) {
        let process = self.processes.get() + 1;
        self.processes.set(process);
        let (disk, incarnation, joined) = {
            let mut slots = self.slots.borrow_mut();
            let slot = &mut slots[i as usize - 1];
            let joined = std::mem::take(&mut slot.new_disk).then(|| self.etcd.revision() as u64);
            (slot.disk.clone(), slot.incarnation.clone(), joined)
        };
        self.note(format!(
            "node {i} starts (process {process}, new disk: {joined:?})"
        ));
        let node = self
            .complete(SimNode::boot(
                node::Start {
                    index: i,
                    process,
                    sim: disk,
                    incarnation,
                    joined,
                    // Half the seeds with the leaders' gather on (2000 µs; the default is 1000), half with it off.
                    gather_us: if self.seed.is_multiple_of(2) { 2000 } else { 0 },
                    // Half the seeds with the leaders shipping before their own sync (the default), half after
                    // it, each with the gather on and off.
                    ship_early: self.ship_early(),
                },
                self.clock.clone(),
                self.etcd.clone(),
                self.net.clone(),
            ))
            .await;
        self.slots.borrow_mut()[i as usize - 1].node = Some(node);
    }

    /// Kills node `i`'s process; its disk as `survive` leaves it.
    fn kill(&self, i: NodeIndex, how: &str, survive: impl FnOnce(&Sim) -> Rc<Sim>) {
        let node = {
            let mut slots = self.slots.borrow_mut();
            let slot = &mut slots[i as usize - 1];
            let Some(node) = slot.node.take() else {
                return;
            };
            slot.disk = survive(&node.sim);
            node
        };
        self.note(format!("node {i}: {how}"));
        self.net.set_paused(i, false);
        node.sim.release_syncs();
        node.kill(&self.net);
    }

    /// Whether node `i`'s replica of partition `p` is a learner on its own disk (a new disk not caught up yet).
    fn learner_of(&self, i: NodeIndex, p: u32) -> bool {
        self.slots.borrow()[i as usize - 1]
            .node
            .as_ref()
            .is_some_and(|n| {
                n.engine.topic(TOPIC).is_ok_and(|t| {
                    t.owned_partition(p)
                        .or_else(|| t.followed_partition(p))
                        .is_some_and(|part| part.is_learner())
                })
            })
    }

    /// Running nodes with a log, led or followed, that refuses appends until a restart.
    fn poisoned(&self) -> Vec<NodeIndex> {
        self.slots
            .borrow()
            .iter()
            .filter(|s| {
                s.node.as_ref().is_some_and(|n| {
                    n.engine.topic(TOPIC).is_ok_and(|t| {
                        t.owned_partitions()
                            .chain(t.followed_partitions())
                            .any(|p| p.log.is_poisoned())
                    })
                })
            })
            .map(|s| s.index)
            .collect()
    }

    fn running(&self) -> Vec<NodeIndex> {
        self.slots
            .borrow()
            .iter()
            .filter(|s| s.node.is_some())
            .map(|s| s.index)
            .collect()
    }

    /// A node for a fault: most often the leader of a partition as etcd names it (where faults matter most), else
    /// any of `from`.
    fn victim(&self, rng: &mut Rng, from: &[NodeIndex]) -> Option<NodeIndex> {
        if rng.chance(70) {
            let snapshot = self.etcd.snapshot();
            let leader = snapshot
                .topic(TOPIC)
                .map(|t| t.partitions[rng.below(PARTITIONS as u64) as usize].leader);
            if let Some(l) = leader.filter(|l| from.contains(l)) {
                return Some(l);
            }
        }
        Self::pick(rng, from)
    }

    fn pick(rng: &mut Rng, from: &[NodeIndex]) -> Option<NodeIndex> {
        (!from.is_empty()).then(|| from[rng.below(from.len() as u64) as usize])
    }

    fn front(&self, i: NodeIndex) -> Option<(Rc<crate::front::Front>, Tasks)> {
        let slots = self.slots.borrow();
        let node = slots[i as usize - 1].node.as_ref()?;
        Some((node.front.clone(), node.tasks.clone()))
    }

    /// Whether this seed's leaders ship before their own sync (`[cluster] replica_ship_early`).
    fn ship_early(&self) -> bool {
        self.seed % 4 >= 2
    }

    async fn step(&self, rng: &mut Rng, step: usize) {
        let running = self.running();
        let mut roll = rng.below(1000);
        // Faults (630 and up, but restarts and heals) strike at the seed's rate.
        if roll >= 630
            && !(657..=759).contains(&roll)
            && !(815..=834).contains(&roll)
            && !rng.chance(self.fault_percent)
        {
            roll = 999;
        }
        match roll {
            0..=399 => {
                // Often several at once, so that a fault finds records in flight.
                for _ in 0..1 + rng.below(4) {
                    if let Some(i) = Self::pick(rng, &running) {
                        self.produce(i, rng.below(PARTITIONS as u64) as u32);
                    }
                }
            }
            400..=519 => {
                // Not through a paused node: its process would answer no client (what it leased before the pause
                // is still acked from there, as a client whose request was on its way).
                let awake: Vec<NodeIndex> = running
                    .iter()
                    .copied()
                    .filter(|&i| !self.net.paused(i))
                    .collect();
                if let Some(i) = Self::pick(rng, &awake) {
                    self.consume(rng, i);
                }
            }
            520..=599 => {
                if let Some(i) = Self::pick(rng, &running) {
                    let p = rng.below(PARTITIONS as u64) as u32;
                    let end = self.oracle.borrow().end(p);
                    self.read(i, p, rng.below(end + 2));
                }
            }
            600..=629 => self.clock.advance(rng.below(1500)),
            630..=644 => {
                if let Some(i) = self.victim(rng, &running) {
                    self.kill(i, &format!("step {step}: killed"), Sim::process_crash);
                }
            }
            645..=654 => {
                if let Some(i) = self.victim(rng, &running) {
                    let torn = rng.next();
                    self.kill(i, &format!("step {step}: power cut"), |sim| {
                        let mut t = Rng::new(torn);
                        sim.power_cut(|_, unsynced| t.below(unsynced as u64 + 1) as usize)
                    });
                }
            }
            655..=656 if !self.disk_lost.get() => {
                let i = 1 + rng.below(NODES as u64) as NodeIndex;
                self.disk_lost.set(true);
                self.oracle.borrow_mut().groups.disk_lost = true;
                self.kill(i, &format!("step {step}: disk lost"), |_| Sim::new());
                let mut slots = self.slots.borrow_mut();
                let slot = &mut slots[i as usize - 1];
                slot.disk = Sim::new();
                slot.incarnation = format!("{:032x}", rng.next());
                slot.new_disk = true;
            }
            657..=759 => {
                let down: Vec<NodeIndex> = self
                    .slots
                    .borrow()
                    .iter()
                    .filter(|s| s.node.is_none())
                    .map(|s| s.index)
                    .collect();
                if let Some(i) = Self::pick(rng, &down) {
                    self.restart_if_possible(i).await;
                }
            }
            760..=789 => {
                let a = 1 + rng.below(NODES as u64) as NodeIndex;
                let b = 1 + rng.below(NODES as u64) as NodeIndex;
                if a != b {
                    let cut = rng.chance(60);
                    self.note(format!(
                        "step {step}: link {a}-{b} {}",
                        if cut { "cut" } else { "healed" }
                    ));
                    self.net.set_cut(a, b, cut);
                }
            }
            790..=799 => {
                let all: Vec<NodeIndex> = (1..=NODES).collect();
                let i = self.victim(rng, &all).expect("a node");
                let cut = rng.chance(50);
                self.note(format!(
                    "step {step}: node {i} {} etcd",
                    if cut { "cut from" } else { "reaches" }
                ));
                if cut {
                    self.etcd.cut.borrow_mut().insert(i);
                } else {
                    self.etcd.cut.borrow_mut().remove(&i);
                }
            }
            800..=814 => {
                if let Some(i) = self.victim(rng, &running) {
                    let pause = !self.net.paused(i);
                    self.note(format!(
                        "step {step}: node {i} {}",
                        if pause { "paused" } else { "resumed" }
                    ));
                    self.net.set_paused(i, pause);
                }
            }
            870..=884 => {
                if let Some(i) = self.victim(rng, &running) {
                    let slots = self.slots.borrow();
                    let node = slots[i as usize - 1].node.as_ref().expect("running");
                    if node.sim.held_syncs() > 0 || rng.chance(40) {
                        self.note(format!("step {step}: node {i}'s disk answers again"));
                        node.sim.release_syncs();
                    } else {
                        self.note(format!(
                            "step {step}: node {i}'s disk stalls (its syncs wait)"
                        ));
                        node.sim.hold_syncs();
                    }
                }
            }
            850..=869 => {
                let a = 1 + rng.below(NODES as u64) as NodeIndex;
                let b = 1 + rng.below(NODES as u64) as NodeIndex;
                if a != b {
                    let ms = if rng.chance(60) {
                        100 + rng.below(1500)
                    } else {
                        0
                    };
                    self.note(format!(
                        "step {step}: link {a}-{b} delays up to {ms} ms more"
                    ));
                    self.net.set_slow(a, b, ms);
                }
            }
            // A journal pass refused (its write fails, as on a full disk): its appends answer an error and roll
            // back, a follower refuses the batches. With early ship, a leader that shipped a batch of the refused
            // pass refuses appends until a restart (its log is poisoned) and hands the partition to a follower
            // (`front/quorum.rs`); the end restarts poisoned nodes only when some partition has no healthy majority.
            885..=894 => {
                if let Some(i) = self.victim(rng, &running) {
                    let slots = self.slots.borrow();
                    let node = slots[i as usize - 1].node.as_ref().expect("running");
                    let errno = if rng.chance(50) {
                        libc::ENOSPC
                    } else {
                        libc::EIO
                    };
                    self.note(format!(
                        "step {step}: node {i}'s next journal write fails ({errno})"
                    ));
                    node.sim.fail_writes_under(
                        &std::path::PathBuf::from(format!("/sim/n{i}/journal")),
                        errno,
                        1,
                    );
                }
            }
            835..=849 => {
                let i = 1 + rng.below(NODES as u64) as NodeIndex;
                let ms = rng.below(10_000);
                self.note(format!("step {step}: node {i}'s watch stalls for {ms} ms"));
                self.slots.borrow_mut()[i as usize - 1].watch_stalled_until =
                    self.clock.now_ms() + ms;
            }
            815..=834 => {
                self.note(format!("step {step}: every link and etcd healed"));
                self.net.heal();
                self.etcd.cut.borrow_mut().clear();
            }
            _ => {}
        }
    }

    /// Starts a node that is down, once its old session has lapsed and etcd is in reach (as `join` waits out a
    /// crashed predecessor's lease).
    async fn restart_if_possible(&self, i: NodeIndex) {
        let ready = {
            let slots = self.slots.borrow();
            let s = &slots[i as usize - 1];
            s.node.is_none() && s.session.is_none() && !self.etcd.cut.borrow().contains(&i)
        };
        if ready {
            self.register(i);
            self.start(i).await;
        }
    }

    /// What etcd and the nodes' own session tasks do as time passes: refreshes, expiries, fencing, the watches,
    /// and elections.
    async fn tick(&self, rng: &mut Rng) {
        let now = self.clock.now_ms();
        let written = std::mem::take(&mut *self.etcd.notes.borrow_mut());
        for n in written {
            self.note(n);
        }
        let mut fencing = Vec::new();
        let mut watches = Vec::new();
        let snapshot_revision = self.etcd.revision();
        for i in 1..=NODES {
            let (running, connected) = {
                let slots = self.slots.borrow();
                let s = &slots[i as usize - 1];
                (
                    s.node.is_some() && !self.net.paused(i),
                    !self.etcd.cut.borrow().contains(&i),
                )
            };
            let mut slots = self.slots.borrow_mut();
            let s = &mut slots[i as usize - 1];
            if running && connected && s.session.is_some() {
                s.last_refresh = now;
            }
            if s.session.is_some() && now.saturating_sub(s.last_refresh) >= TTL_MS {
                s.session = None;
                self.etcd.expire(i);
                drop(slots);
                self.note(format!("node {i}'s session lapsed"));
                slots = self.slots.borrow_mut();
            }
            let s = &mut slots[i as usize - 1];
            if !running {
                continue;
            }
            let node = s.node.as_ref().expect("running");
            // Its own view of its session: lapsed a TTL after its last refresh, as etcd sees it.
            let lapsed = s.session.is_none();
            if lapsed != node.fenced.get() {
                fencing.push((i, lapsed));
            }
            if connected
                && node.seen.borrow().revision < snapshot_revision
                && now >= s.watch_stalled_until
            {
                s.lag += 1;
                if rng.chance(self.watch_percent) || s.lag > 20 {
                    s.lag = 0;
                    watches.push(i);
                }
            }
        }
        for (i, lapsed) in fencing {
            self.note(format!(
                "node {i} {}",
                if lapsed {
                    "fences itself"
                } else {
                    "serves again"
                }
            ));
            let node_fenced = {
                let slots = self.slots.borrow();
                slots[i as usize - 1]
                    .node
                    .as_ref()
                    .map(|n| (n.fenced.clone(), n.engine.clone(), n.seen.clone()))
            };
            if let Some((fenced, engine, seen)) = node_fenced {
                fenced.set(lapsed);
                let snapshot = seen.borrow().clone();
                let view = crate::cluster::node::view_of(
                    &snapshot,
                    i,
                    lapsed,
                    &crate::cluster::unopened::Retries::default(),
                );
                let _ = self
                    .complete(async move { engine.publish_cluster_view(view).await })
                    .await;
            }
        }
        // A node that runs, reaches etcd and has no session registers again (its session task does).
        for i in 1..=NODES {
            let again = {
                let slots = self.slots.borrow();
                let s = &slots[i as usize - 1];
                s.node.is_some()
                    && !self.net.paused(i)
                    && s.session.is_none()
                    && !self.etcd.cut.borrow().contains(&i)
            };
            if again {
                self.register(i);
                watches.push(i);
            }
        }
        let snapshot = self.etcd.snapshot();
        for i in watches {
            if let Some(node) = self.slots.borrow()[i as usize - 1].node.as_ref() {
                node.watch(snapshot.clone());
            }
        }
        // Elections: each running node with etcd in reach stands from its own snapshot (turn 0 at once, the
        // others sometimes: as the stagger lets them).
        for i in 1..=NODES {
            let seen = {
                let slots = self.slots.borrow();
                let s = &slots[i as usize - 1];
                match &s.node {
                    Some(n)
                        if !self.net.paused(i)
                            && !self.etcd.cut.borrow().contains(&i)
                            && s.session.is_some() =>
                    {
                        n.seen.borrow().clone()
                    }
                    _ => continue,
                }
            };
            for c in candidacies(&seen, i) {
                if c.turn > 0 && !rng.chance(20) {
                    continue;
                }
                let Some(record) = seen.topic(&c.topic) else {
                    continue;
                };
                let state = &record.partitions[c.partition as usize];
                if self.etcd.set_partition(
                    record,
                    c.partition,
                    c.epoch,
                    &state.replicas,
                    i,
                    &state.learners,
                ) {
                    self.note(format!(
                        "node {i} elected for partition {} (was {} at epoch {})",
                        c.partition, state.leader, c.epoch
                    ));
                }
            }
        }
    }

    fn produce(&self, i: NodeIndex, p: u32) {
        let Some((front, tasks)) = self.front(i) else {
            return;
        };
        let body = {
            let mut o = self.oracle.borrow_mut();
            o.next_body += 1;
            let body = format!("b{}", o.next_body);
            o.attempted.insert(body.clone(), p);
            body
        };
        self.note(format!("produce {body} to {p} through node {i}"));
        let oracle = self.oracle.clone();
        let clock = self.clock.clone();
        tasks.spawn(async move {
            let result = front
                .produce(ProduceParams {
                    topic: TOPIC.to_string(),
                    records: vec![ClientRecord {
                        meta: None,
                        topic_delay: false,
                        body: Bytes::from(body.clone()),
                        target: Target::Partition(p as u64),
                    }],
                    batch: false,
                })
                .await;
            let mut o = oracle.borrow_mut();
            let now = clock.now_ms();
            match result.map(|mut r| r.pop()) {
                Ok(Some(Ok((q, offset)))) => {
                    o.note(format!("t={now} produced {body} at {q}:{offset}"));
                    o.at(q, offset, &body, true);
                }
                Ok(Some(Err(e))) | Err(e) => {
                    o.note(format!("t={now} produce of {body} failed: {e}"))
                }
                Ok(None) => o.fail(format!("a produce of {body} answered nothing")),
            }
        });
    }

    fn read(&self, i: NodeIndex, p: u32, offset: u64) {
        let Some((front, tasks)) = self.front(i) else {
            return;
        };
        let oracle = self.oracle.clone();
        tasks.spawn(async move {
            let result = front
                .replay(ReplayParams {
                    topic: TOPIC.to_string(),
                    partition: p as u64,
                    offset,
                    wait_ms: 0,
                })
                .await;
            if let Ok(Some(record)) = result {
                let body = String::from_utf8_lossy(&record.payload).into_owned();
                let mut o = oracle.borrow_mut();
                o.note(format!(
                    "read {p}:{} = {body} through node {i}",
                    record.offset
                ));
                o.at(p, record.offset, &body, false);
            }
        });
    }

    /// The end of a seed: every node running, every link and etcd healed; then every acknowledged or served
    /// record must be served where it was, within `HEAL_MS` of simulated time.
    async fn heal_and_check(&self, rng: &mut Rng) {
        self.note("the end: everything healed, every node started".into());
        self.net.heal();
        self.etcd.cut.borrow_mut().clear();
        for s in self.slots.borrow_mut().iter_mut() {
            s.watch_stalled_until = 0;
            if let Some(node) = &s.node {
                node.sim.release_syncs();
                // A journal write still armed to fail fails no more (count 0 disarms it).
                node.sim.fail_writes(0, 0);
            }
        }
        let started = self.clock.now_ms();
        let mut last_error = String::new();
        loop {
            // Nodes whose logs refuse appends until a restart are restarted, as an operator would, once some
            // partition's healthy voters (neither poisoned nor learners) are no majority of its voters: no handover
            // can serve it then. With a healthy majority everywhere they stay, and their partitions must be served
            // by the others.
            let poisoned = self.poisoned();
            let snapshot = self.etcd.snapshot();
            let short = snapshot.topic(TOPIC).is_some_and(|t| {
                t.partitions.iter().enumerate().any(|(p, s)| {
                    let voters = s.voters();
                    let healthy = voters
                        .iter()
                        .filter(|&&n| !poisoned.contains(&n) && !self.learner_of(n, p as u32))
                        .count();
                    healthy < voters.len() / 2 + 1
                })
            });
            if !poisoned.is_empty() && short {
                for i in poisoned {
                    self.kill(i, "the end: restarted (its logs refuse appends)", |sim| {
                        sim.process_crash()
                    });
                }
            }
            for i in 1..=NODES {
                if self.slots.borrow()[i as usize - 1].node.is_none() {
                    self.restart_if_possible(i).await;
                }
            }
            self.clock.advance(50);
            self.tick(rng).await;
            self.settle().await;
            self.check_frontiers();
            if self.running().len() == NODES as usize {
                match self.verify().await {
                    Ok(()) => return,
                    Err(e) => last_error = e,
                }
            }
            if (self.clock.now_ms() - started) % 10_000 < 50 {
                self.note(format!("healing: {last_error}"));
            }
            if self.clock.now_ms() - started > HEAL_MS {
                self.oracle.borrow().fail(format!(
                    "{} s after everything healed, not everything acknowledged is served: {last_error}",
                    HEAL_MS / 1000
                ));
            }
        }
    }

    /// Reads every partition from 0 to past the last offset any answer named, through node 1; Err while a read
    /// fails, an answered offset is not served yet (a new leader's round, a follower catching up), or a partition's
    /// leader refuses appends until a restart.
    async fn verify(&self) -> Result<(), String> {
        let Some((front, _)) = self.front(1) else {
            return Err("node 1 is down".into());
        };
        for p in 0..PARTITIONS {
            let end = self.oracle.borrow().end(p);
            let mut offset = 0;
            while offset < end {
                let f = front.clone();
                let result = self
                    .complete(async move {
                        f.replay(ReplayParams {
                            topic: TOPIC.to_string(),
                            partition: p as u64,
                            offset,
                            wait_ms: 0,
                        })
                        .await
                    })
                    .await;
                match result {
                    Ok(Some(record)) => {
                        let body = String::from_utf8_lossy(&record.payload).into_owned();
                        let mut o = self.oracle.borrow_mut();
                        for skipped in offset..record.offset {
                            if let Some(b) =
                                o.acked.get(&(p, skipped)).or(o.served.get(&(p, skipped)))
                            {
                                o.fail(format!(
                                    "{b}, answered at {p}:{skipped}, is gone: a read there gives {body} at {}",
                                    record.offset
                                ));
                            }
                        }
                        o.at(p, record.offset, &body, false);
                        offset = record.offset + 1;
                    }
                    Ok(None) => {
                        return Err(format!(
                            "partition {p} serves nothing at {offset} yet (answered up to {end})"
                        ))
                    }
                    Err(e) => return Err(format!("partition {p} at {offset}: {e}")),
                }
            }
        }
        // And no partition stays led by a replica whose log refuses appends (it reads fine): poisoned nodes left
        // running leave a majority of healthy replicas everywhere (else they were restarted), which can take over.
        let snapshot = self.etcd.snapshot();
        for p in 0..PARTITIONS {
            let Some(leader) = snapshot
                .topic(TOPIC)
                .map(|t| t.partitions[p as usize].leader)
            else {
                continue;
            };
            let poisoned = self.slots.borrow()[leader as usize - 1]
                .node
                .as_ref()
                .is_some_and(|n| {
                    n.engine
                        .topic(TOPIC)
                        .ok()
                        .and_then(|t| t.owned_partition(p))
                        .is_some_and(|part| part.log.is_poisoned())
                });
            if poisoned {
                return Err(format!(
                    "partition {p} is led by node {leader}, whose log refuses appends until a restart"
                ));
            }
        }
        Ok(())
    }

    /// Runs `future` while time goes on (1 ms at a time once nothing else moves).
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
            assert!(
                self.clock.now_ms() - started < 600_000,
                "node simulation seed {}, harness: an operation of the driver is stuck\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::nodes",
                self.seed,
                self.seed
            );
            self.clock.advance(1);
        }
    }

    /// Lets every runnable task run until nothing moves.
    async fn settle(&self) {
        let mut last = u64::MAX;
        for round in 0.. {
            NOW_MS.with(|n| n.set(self.clock.now_ms()));
            assert!(
                round < SETTLE_ROUNDS,
                "node simulation seed {}, harness: the cluster never settles (a task that never stops sending)\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::nodes",
                self.seed,
                self.seed
            );
            for _ in 0..SETTLE_YIELDS {
                futures_lite::future::yield_now().await;
            }
            let activity = self.net.delivered.get() + self.net.lost.get();
            if self.net.ready() == 0 && activity == last {
                return;
            }
            last = activity;
        }
    }

    /// Stops every node and lets what they left behind finish.
    async fn end(self) {
        for i in 1..=NODES {
            self.kill(i, "the end", |sim| sim.process_crash());
        }
        let tasks = std::mem::take(&mut *self.tasks.0.borrow_mut());
        drop(tasks);
        for _ in 0..200 {
            self.clock.advance(1000);
            for _ in 0..20 {
                futures_lite::future::yield_now().await;
            }
        }
    }
}
