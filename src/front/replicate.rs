//! The leader's shipper (`docs/replication.md`, step 2): each durable batch of a replicated partition this core
//! leads goes to each of the partition's followers as a `Replicate` request (`ops/replicate.rs`), in log order,
//! several in flight per follower. What a follower answers is its log's end: the leader records it
//! (`Partition::set_follower`, shown by `GET /topics/T`) and resends from there when the follower missed a batch
//! (a lost connection, a reordered arrival, a follower restarted).
//!
//! The leader keeps the batches not yet on every follower in memory, up to `Windows::partition_bytes` per partition. A
//! follower further behind than that (down for long, or behind a leader that restarted) is caught up from the
//! leader's log (`Log::read_for_follower`: runs of whole frames, at most `CATCH_UP_BYTES` each, up to where the
//! kept batches start, sent like batches and counted the same way). One that cannot be (it needs what retention
//! removed, a damaged frame, or an offset the log skipped), or whose log does not line up with the leader's, is
//! marked lagging and gets nothing more (a whole-segment copy for it: step 5, not built yet). Nothing here waits on
//! the data path: the sink only queues, and each follower has its own task. A follower whose node registers again
//! (a new metastore session: a crash, a restart, a new disk) is probed again.
//!
//! A follower on a wiped or replaced disk answers as a learner (`storage::learner`): it is sent every group's
//! frontier, then asked (`promote`, with `hold`: everything this leader could have acknowledged lies below it) to
//! promote itself once its log reaches `hold`.
//!
//! The consumer groups' frontiers go the same way: each frontier the leader made durable (`Ship::Frontiers`: a
//! moved frontier its core's flush journaled, a group's start) waits in each follower's `frontiers` (the newest
//! value per group; a start is never merged away) and goes as one `ReplicateFrontiers` request at a time per
//! follower, so a group's start and its later values arrive in order. A failed call puts them back for the retry.
//!
//! Each answer moves the partition's commit offset (`partition/commit.rs`): what a majority of the replicas has
//! durable is served, and the produces waiting for it are answered. Each stream probes each follower (a `Replicate`
//! of no records, carrying the leader's epoch history) before it sends it any batch: the follower cuts a log that
//! diverges from the leader's (truncation by epoch, `Partition::truncate_diverged`) and answers its end.
//!
//! Every request carries the stream's epoch; a follower on a newer one refuses it (`stale_epoch`) and is retried,
//! counting for nothing (the election and the fencing round are in `cluster/election.rs` and `round.rs`, stepping
//! down without a majority in `quorum.rs`). Not built yet: replacement of a replica that cannot be caught up from
//! the log.

use crate::engine::placement::{replica_core, Location, NodeIndex};
use crate::engine::{Engine, Ship, ShipSink};
use crate::ops::replicate::{
    FrontierMark, Replicate, ReplicateFrontiers, Replicated, MAX_FRONTIER_BYTES, MAX_FRONTIER_MARKS,
};
use crate::ops::{OpError, Reply, Request};
use crate::partition::FollowerInfo;
use crate::storage::journal::EntryHead;
use crate::transport::Router;
use bytes::Bytes;
use event_listener::Event;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;
use tracing::{debug, warn};

/// The shipper's bounds (`[cluster] replica_window_bytes`, `replica_core_window_bytes`, `replica_max_in_flight`;
/// `config.rs` checks their ranges).
#[derive(Debug, Clone, Copy)]
pub struct Windows {
    /// Bytes of batches a leader keeps per partition for followers that have not acknowledged them...
    pub partition_bytes: usize,
    /// ...and per core, all partitions together (a follower down for long must not hold a window of every
    /// partition the core leads).
    pub core_bytes: usize,
    /// `Replicate` requests in flight per follower and partition (at most what a follower queues:
    /// `storage::log::follow::MAX_QUEUED_SHIPS`).
    pub in_flight: usize,
}

impl Windows {
    /// From the cluster settings (the defaults without any).
    pub fn of(config: &crate::config::Config) -> Windows {
        let c = config.cluster.as_ref();
        Windows {
            partition_bytes: c.map_or(64 << 20, |c| c.replica_window_bytes as usize),
            core_bytes: c.map_or(256 << 20, |c| c.replica_core_window_bytes as usize),
            in_flight: c.map_or(8, |c| c.replica_max_in_flight as usize),
        }
    }
}
/// After a failed call, a follower is tried again after this long, doubling up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);
/// Bytes of the leader's log read at a time to catch a follower up (whole frames; one larger frame alone). 1 MiB.
const CATCH_UP_BYTES: u64 = 1 << 20;
/// A learner with nothing else to send is asked to promote itself at most this often.
const PROMOTE_EVERY: Duration = Duration::from_secs(1);
/// A follower's task with nothing to do looks this often whether its topic is still there.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// One core's shipper.
pub struct Shipper {
    pub(super) router: Rc<Router>,
    windows: Windows,
    streams: RefCell<HashMap<(String, u32), Rc<Stream>>>,
    /// Bytes kept by all streams.
    kept: Rc<Cell<usize>>,
    /// Bytes of catch-up runs read from the logs and in flight (at most `Windows::core_bytes`).
    catching: Cell<usize>,
    /// Set by `drain`: batches made durable after it (a log's last queued appends, written at its close) are not
    /// shipped: no task would wait for them.
    stopped: Cell<bool>,
}

/// A batch kept for the followers.
struct Batch {
    head: EntryHead,
    frames: Bytes,
    end: u64,
    /// A probe that asks the follower to start its log anew at `head.first_offset` (the leader's log start).
    restart: bool,
}

/// One replicated partition this core leads.
struct Stream {
    topic: String,
    topic_id: u64,
    partition: u32,
    /// The epoch of this leadership, as the topic had it when the stream opened (sent with every request).
    epoch: u64,
    batches: RefCell<VecDeque<Rc<Batch>>>,
    /// The end of the last batch pushed (at first, the log's end when the stream opened): an offset below it that
    /// is not kept is no longer kept.
    end: Cell<u64>,
    bytes: Cell<usize>,
    /// The shipper's count of bytes kept by every stream of the core.
    kept: Rc<Cell<usize>>,
    followers: Vec<Rc<Follower>>,
    closed: Cell<bool>,
    /// The leader's log end when the stream opened: every record acknowledged before it lies below (what a learner
    /// must hold, with the commit offset, to be promoted).
    opened_at: u64,
}

/// One follower of a stream.
struct Follower {
    node: NodeIndex,
    /// Its log's end as it last answered.
    acked: Cell<u64>,
    /// The first offset not sent yet.
    next: Cell<u64>,
    lagging: Cell<bool>,
    /// It has answered since the stream opened.
    answered: Cell<bool>,
    /// What the commit may count it for (`Partition::follower_acked`): only ends it answered that hold this
    /// leader's batches (never the leader's assumption in `acked`, nor an end past what was shipped to it).
    credit: Cell<u64>,
    /// The end of the furthest batch sent to it in this stream: a batch below it is a resend.
    sent: Cell<u64>,
    /// It has shown, since the stream opened, that its log continues this leader's: it applied a batch, or a probe
    /// found it at or below the leader's end. Until then an end it reports is not credited, unless it applied.
    verified: Cell<bool>,
    /// The frontiers waiting for it (kept by the next stream of the partition when this one is replaced).
    frontiers: RefCell<Rc<FrontierQueue>>,
    in_flight: Cell<usize>,
    /// It last answered as a learner (`storage::learner`).
    learner: Cell<bool>,
    /// Its last answer said its log refuses appends until its node restarts (`Replicated::poisoned`, or a batch
    /// answered `log_unavailable`: a refused sync there): it counts in no round and must not be given the leadership
    /// (`front/quorum.rs`). Every answer says it again; a new session of its node clears it (at once, or by the
    /// answer to the probe that a new session brings).
    poisoned: Cell<bool>,
    /// CheckQuorum asked where it stands (`Shipper::ask_status`): a probe goes once nothing is in flight to it.
    status_asked: Cell<bool>,
    /// The leader's lease asked for a renewal (`partition/lease.rs`): an empty `ReplicateFrontiers` goes, lagging or
    /// not, whatever else is in flight.
    lease_asked: Cell<bool>,
    /// A renewal of the leader's lease (`partition/lease.rs`: an empty `ReplicateFrontiers`) is in flight to it.
    pinging: Cell<bool>,
    /// When it last answered (the engine's clock, ms): an answer, or a batch refused `log_unavailable`.
    answered_ms: Cell<u64>,
    /// When the newest request it answered at this stream's epoch was sent (the engine's clock, ms; 0: none): what
    /// it grants the leader's lease (`partition/lease.rs`).
    granted_ms: Cell<u64>,
    /// Its node's metastore session when it last answered: another one means the node restarted (its disk may be
    /// a new one), and it is probed again.
    session: Cell<i64>,
    /// Since it answered as a learner in this stream: the groups whose frontiers were queued for it and have not
    /// been delivered yet (None: not queued). Empty: it has them all, and each request asks it to promote itself.
    owed: RefCell<Option<std::collections::BTreeSet<String>>>,
    /// When a probe last asked this learner to promote itself (at most one a second).
    promote_asked: Cell<Option<u64>>,
    /// Set after a failed call: no send before the retry.
    backoff: Cell<Option<Duration>>,
    /// The next retry's wait: doubled by each failure, back to `FIRST_RETRY` after an answer.
    delay: Cell<Duration>,
    wake: Event,
}

/// The frontiers waiting to go to one follower of a partition, and the one request of them in flight.
struct FrontierQueue {
    /// Per group, the newest value and whether a start is among them.
    waiting: RefCell<BTreeMap<String, Pending>>,
    /// A `ReplicateFrontiers` is in flight (one at a time: a group's start must not pass its older values).
    in_flight: Cell<bool>,
    /// The wait before a retry after a failed call (its own: a follower that refuses frontiers does not slow its
    /// batches).
    delay: Cell<Duration>,
}

impl FrontierQueue {
    fn new() -> Rc<FrontierQueue> {
        Rc::new(FrontierQueue {
            waiting: RefCell::new(BTreeMap::new()),
            in_flight: Cell::new(false),
            delay: Cell::new(FIRST_RETRY),
        })
    }

    /// Something to send, and nothing in flight.
    fn ready(&self) -> bool {
        !self.in_flight.get() && !self.waiting.borrow().is_empty()
    }

    fn idle(&self) -> bool {
        !self.in_flight.get() && self.waiting.borrow().is_empty()
    }
}

/// What the log gives to catch a follower up.
enum CatchUp {
    Batch(Rc<Batch>),
    /// The read failed: try again later.
    Retry(String),
    /// It needs records below the log's start (retention removed them) and holds nothing at or past it: its log
    /// starts anew there (a restart probe), and is filled from there.
    Restart(u64),
    /// It cannot be caught up from the log.
    Never,
}

/// A group's frontier waiting to go to a follower.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Pending {
    committed: u64,
    /// The group started (was created) at or before this value since the last send: the follower replaces the
    /// group with one starting at `committed`.
    start: bool,
    /// Acked-ahead ranges above `committed` (`FrontierMark::acked`).
    acked: Vec<(u64, u64)>,
}

impl Pending {
    fn value(&self) -> crate::storage::frontier::FrontierValue {
        crate::storage::frontier::FrontierValue {
            committed: self.committed,
            acked: self.acked.clone(),
        }
    }

    /// `self`, then `later`: a later start replaces everything before it; a later value after a start is that
    /// start moved on; otherwise what both settled (the higher value, the acked ranges of both above it).
    fn then(self, later: Pending) -> Pending {
        if later.start {
            later
        } else if self.start {
            Pending {
                start: true,
                ..later
            }
        } else {
            let mut value = self.value();
            value.merge(&later.value());
            Pending {
                committed: value.committed,
                start: false,
                acked: value.acked,
            }
        }
    }
}

/// Adds `value` for `group` to what waits, after what waits.
fn queue_frontier(waiting: &mut BTreeMap<String, Pending>, group: &str, value: Pending) {
    match waiting.get_mut(group) {
        Some(p) => *p = std::mem::take(p).then(value),
        None => {
            waiting.insert(group.to_string(), value);
        }
    }
}

impl Shipper {
    pub fn new(router: Rc<Router>) -> Rc<Shipper> {
        let windows = Windows::of(router.engine().config());
        Rc::new(Shipper {
            router,
            windows,
            streams: RefCell::new(HashMap::new()),
            kept: Rc::new(Cell::new(0)),
            catching: Cell::new(0),
            stopped: Cell::new(false),
        })
    }

    /// The sink the engine calls with each durable batch of a replicated partition led here.
    pub fn sink(self: &Rc<Self>) -> ShipSink {
        let shipper = Rc::downgrade(self);
        Rc::new(move |ship: Ship<'_>| {
            if let Some(shipper) = shipper.upgrade() {
                match ship {
                    Ship::Batch(head, frames) => shipper.ship(head, frames),
                    Ship::Frontiers(records) => shipper.ship_frontiers(records),
                    Ship::Round(round) => shipper.round(round.clone()),
                    Ship::RaiseNonces(round) => shipper.raise_nonces(round.clone()),
                    Ship::Renew(round) => shipper.renew(round.clone()),
                }
            }
        })
    }

    pub(super) fn engine(&self) -> &Rc<Engine> {
        self.router.engine()
    }

    /// The partitions this core ships (leads, replicated), as (topic, partition).
    pub(super) fn streamed(&self) -> Vec<(String, u32)> {
        let mut led: Vec<(String, u32)> = self.streams.borrow().keys().cloned().collect();
        led.sort_unstable();
        led
    }

    /// Asks each follower of a partition this core ships where it stands (a probe, once nothing is in flight to it and
    /// its backoff is over; one that lags is not asked), so that its answer says afresh whether its log refuses
    /// appends (`Replicated::poisoned`): CheckQuorum asks before it hands a poisoned leader's partition on, since a
    /// leader that ships nothing hears nothing.
    pub(super) fn ask_status(&self, key: &(String, u32)) {
        let Some(stream) = self.streams.borrow().get(key).cloned() else {
            return;
        };
        for f in &stream.followers {
            f.status_asked.set(true);
            f.wake.notify(1);
        }
    }

    /// The followers of a partition this core ships that answered at or after `since` (engine ms), or that lag (a
    /// lagging follower is sent nothing, so it keeps what it last said); none when the partition has no stream here.
    pub(super) fn answered_since(&self, key: &(String, u32), since: u64) -> Vec<u32> {
        let Some(stream) = self.streams.borrow().get(key).cloned() else {
            return Vec::new();
        };
        stream
            .followers
            .iter()
            .filter(|f| f.lagging.get() || f.answered_ms.get() >= since)
            .map(|f| f.node)
            .collect()
    }

    /// Whether `drain` stopped it (the core is stopping).
    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.get()
    }

    fn ship(self: &Rc<Self>, head: &EntryHead, frames: &[u8]) {
        if self.stopped.get() {
            return;
        }
        let key = (head.topic.clone(), head.partition);
        let existing = self.streams.borrow().get(&key).cloned();
        // A stream serves one leadership: one this core held before at another epoch (it led, followed, and leads
        // again) is replaced.
        let current = |s: &Stream| {
            s.topic_id == head.topic_id
                && !s.closed.get()
                && self
                    .engine()
                    .topic(&head.topic)
                    .is_ok_and(|t| t.epoch(head.partition) == s.epoch)
        };
        let stream = match existing {
            // A probe (no records) only opens a stream.
            Some(s) if head.count == 0 && current(&s) => return,
            // A batch that does not continue the stream (the log moved its end up to a frontier, say) starts a new
            // one, whose followers are asked where they stand.
            Some(s) if s.end.get() == head.first_offset && current(&s) => s,
            old => {
                let Some(stream) = self.open_stream(head) else {
                    if let Some(old) = old {
                        old.close();
                    }
                    return;
                };
                if let Some(old) = old {
                    // The frontiers the old stream had not sent go on with the new one (the same queue: its
                    // request in flight, if any, still goes first).
                    if old.topic_id == stream.topic_id {
                        for (f, new) in old.followers.iter().zip(&stream.followers) {
                            if f.node == new.node {
                                let queue = f.frontiers.borrow().clone();
                                *new.frontiers.borrow_mut() = queue;
                            }
                        }
                    }
                    old.close();
                }
                self.streams.borrow_mut().insert(key, stream.clone());
                stream
            }
        };
        if head.count == 0 {
            // A probe: the followers' tasks ask each follower where it stands.
            return;
        }
        let batch = Rc::new(Batch {
            head: head.clone(),
            frames: Bytes::copy_from_slice(frames),
            end: head.first_offset + u64::from(head.count),
            restart: false,
        });
        stream.push(batch);
        // What every follower has goes (all of it when every follower lags: nobody will take it).
        stream.trim();
        // Over the window (the partition's, or the core's): the oldest batches go. A follower that still needed
        // one finds it gone when it asks for it (`batch_at`), and lags; one that has it in flight is not harmed.
        while stream.bytes.get() > self.windows.partition_bytes && stream.batches.borrow().len() > 1
        {
            stream.pop_front();
        }
        // Over the core's: from whichever partition keeps the most.
        while self.kept.get() > self.windows.core_bytes {
            let largest = self
                .streams
                .borrow()
                .values()
                .max_by_key(|s| s.bytes.get())
                .cloned();
            match largest {
                Some(s) if s.batches.borrow().len() > 1 => s.pop_front(),
                _ => break,
            }
        }
        for f in &stream.followers {
            f.wake.notify(1);
        }
    }

    /// Frontiers of one partition made durable here: queued for each of its followers (dropped when it has no
    /// stream: the partition is not replicated, or no longer led here).
    fn ship_frontiers(&self, records: &[crate::storage::journal::FrontierRecord]) {
        let Some(first) = records.first() else {
            return;
        };
        if self.stopped.get() {
            return;
        }
        let stream = self
            .streams
            .borrow()
            .get(&(first.topic.clone(), first.partition))
            .cloned();
        let Some(stream) = stream.filter(|s| s.topic_id == first.topic_id && !s.closed.get())
        else {
            debug!(topic = %first.topic, partition = first.partition, "frontiers of a partition with no stream: not shipped");
            return;
        };
        for f in &stream.followers {
            let queue = f.frontiers.borrow().clone();
            let mut waiting = queue.waiting.borrow_mut();
            for r in records {
                debug_assert_eq!((&r.topic, r.partition), (&first.topic, first.partition));
                let value = Pending {
                    committed: r.committed,
                    start: r.start,
                    acked: r.acked.clone(),
                };
                queue_frontier(&mut waiting, &r.group, value);
            }
            drop(waiting);
            f.wake.notify(1);
        }
    }

    /// A stream for a partition whose first batch this is: its followers as the topic has them, each with a task.
    fn open_stream(self: &Rc<Self>, head: &EntryHead) -> Option<Rc<Stream>> {
        let topic = self.engine().topic(&head.topic).ok()?;
        if topic.id() != head.topic_id {
            return None;
        }
        let followers = topic.followers(head.partition);
        if followers.is_empty() {
            return None;
        }
        let stream = Rc::new(Stream {
            topic: head.topic.clone(),
            topic_id: head.topic_id,
            partition: head.partition,
            epoch: topic.epoch(head.partition),
            batches: RefCell::new(VecDeque::new()),
            end: Cell::new(head.first_offset),
            bytes: Cell::new(0),
            kept: self.kept.clone(),
            followers: followers
                .iter()
                .map(|&node| {
                    Rc::new(Follower {
                        node,
                        // Assumed to have what came before the first batch shipped here: a follower that does
                        // not says so in its first answer (its end), and is resent from there or found lagging.
                        acked: Cell::new(head.first_offset),
                        next: Cell::new(head.first_offset),
                        lagging: Cell::new(false),
                        answered: Cell::new(false),
                        credit: Cell::new(0),
                        sent: Cell::new(0),
                        verified: Cell::new(false),
                        frontiers: RefCell::new(FrontierQueue::new()),
                        learner: Cell::new(false),
                        poisoned: Cell::new(false),
                        status_asked: Cell::new(false),
                        lease_asked: Cell::new(false),
                        pinging: Cell::new(false),
                        answered_ms: Cell::new(0),
                        granted_ms: Cell::new(0),
                        session: Cell::new(0),
                        owed: RefCell::new(None),
                        promote_asked: Cell::new(None),
                        in_flight: Cell::new(0),
                        backoff: Cell::new(None),
                        delay: Cell::new(FIRST_RETRY),
                        wake: Event::new(),
                    })
                })
                .collect(),
            closed: Cell::new(false),
            opened_at: head.first_offset,
        });
        for f in &stream.followers {
            glommio::spawn_local(run_follower(self.clone(), stream.clone(), f.clone())).detach();
        }
        // A take that finds the lease old asks every follower where it stands: their answers renew it.
        if let Some(partition) = topic.owned_partition(head.partition) {
            let weak = Rc::downgrade(&stream);
            partition.set_lease_renewer(Some(Rc::new(move || {
                let Some(stream) = weak.upgrade().filter(|s| !s.closed.get()) else {
                    return;
                };
                for f in &stream.followers {
                    f.lease_asked.set(true);
                    f.wake.notify(usize::MAX);
                }
            })));
        }
        Some(stream)
    }

    /// At a stop, after the last produce was answered: waits (at most `within`) until every follower that is not
    /// lagging has every batch, so that a leader stopped and started again finds its followers at its end, not
    /// behind what it will keep; then ends every stream.
    pub async fn drain(&self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let streams: Vec<Rc<Stream>> = self.streams.borrow().values().cloned().collect();
            let engine = self.engine();
            let behind = streams
                .iter()
                .filter(|s| !s.drained(|node| engine.node_alive(node)))
                .count();
            if behind == 0 {
                break;
            }
            if std::time::Instant::now() >= deadline {
                warn!(
                    partitions = behind,
                    "stopping with followers that lack the last batches: they lag until caught up"
                );
                break;
            }
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        self.stopped.set(true);
        let streams: Vec<Rc<Stream>> = self.streams.borrow_mut().drain().map(|(_, s)| s).collect();
        for s in streams {
            s.close();
        }
    }

    /// Records a follower's progress on the partition (`GET /topics/T`).
    fn report(&self, stream: &Stream, f: &Follower) {
        // Only answers to this leadership's stream, from a node that is still one of the partition's replicas: an
        // answer to a stream of an older epoch (its replica set perhaps larger: a member removed since) counts for
        // nothing, or records only the old set had could be committed and served.
        let current = self.engine().topic(&stream.topic).ok().is_some_and(|t| {
            t.id() == stream.topic_id
                && t.epoch(stream.partition) == stream.epoch
                && t.replicas_of(stream.partition).contains(&f.node)
        });
        if stream.closed.get() || !current {
            return;
        }
        let partition = self.led_partition(stream);
        if let Some(p) = partition {
            p.set_follower(FollowerInfo {
                node: f.node,
                end: f.acked.get(),
                lagging: f.lagging.get(),
                learner: f.learner.get(),
                poisoned: f.poisoned.get(),
            });
            if f.answered.get() {
                p.follower_acked(f.node, f.credit.get());
            }
        }
    }

    /// Follower `f` answered a request of this stream sent at `sent_at`: the leader's lease runs until a lease after
    /// the newest time a majority of the voters (this leader counted) answered (`partition/lease.rs`). Only
    /// answers at the epoch its partition is led at now, from voters that answered as such (a learner on a new
    /// disk counts in no round).
    fn lease_answered(&self, stream: &Stream, f: &Follower, sent_at: u64) {
        if f.learner.get() {
            return;
        }
        f.granted_ms.set(f.granted_ms.get().max(sent_at));
        let Ok(topic) = self.engine().topic(&stream.topic) else {
            return;
        };
        if stream.closed.get()
            || topic.id() != stream.topic_id
            || topic.epoch(stream.partition) != stream.epoch
        {
            return;
        }
        let Some(partition) = topic.owned_partition(stream.partition) else {
            return;
        };
        // The voters as the partition has them (its replica count and the learners its key names; a topic at its
        // creation epoch may have no partition key to read them from).
        let need = partition.lease_voters() / 2;
        if need == 0 {
            partition.lease_granted(u64::MAX);
            return;
        }
        let voter = |n: NodeIndex| !partition.names_learner(n);
        let mut grants = [0u64; 8];
        let mut n = 0;
        for g in &stream.followers {
            if n < grants.len() && voter(g.node) && !g.learner.get() && g.granted_ms.get() > 0 {
                grants[n] = g.granted_ms.get();
                n += 1;
            }
        }
        if n < need {
            return;
        }
        let grants = &mut grants[..n];
        grants.sort_unstable_by(|a, b| b.cmp(a));
        partition.lease_granted(grants[need - 1].saturating_add(partition.lease_ms()));
    }

    /// Follower `f` answered, as a learner or not. A learner is owed every group's frontier, once per stream (queued
    /// like any frontier move; each request asks it to promote itself once they are all delivered).
    fn learner_answered(&self, stream: &Stream, f: &Follower, learner: bool) {
        let was = f.learner.replace(learner);
        if !learner {
            if was {
                debug!(topic = %stream.topic, partition = stream.partition, follower = f.node, "a learner was promoted");
            }
            return;
        }
        if !was {
            // A learner again (its disk wiped again after a promotion): owed every frontier again.
            f.owed.replace(None);
        }
        if f.owed.borrow().is_some() {
            return;
        }
        let Some(partition) = self.led_partition(stream) else {
            return;
        };
        let queue = f.frontiers.borrow().clone();
        if queue.in_flight.get() {
            // Marks taken before this are older than the ones about to be queued: they must not count as paying
            // the debt. Queued at a later answer (a learner is asked again while it stays one: `run_follower`).
            return;
        }
        let mut waiting = queue.waiting.borrow_mut();
        let mut owed = std::collections::BTreeSet::new();
        for r in partition.durable_frontiers() {
            queue_frontier(
                &mut waiting,
                &r.group,
                Pending {
                    committed: r.committed,
                    start: false,
                    acked: r.acked,
                },
            );
            owed.insert(r.group);
        }
        drop(waiting);
        debug!(topic = %stream.topic, partition = stream.partition, follower = f.node, groups = owed.len(), "a follower is a learner: its groups' frontiers are sent before it is asked to promote itself");
        *f.owed.borrow_mut() = Some(owed);
        f.wake.notify(1);
    }

    /// A batch of the leader's log from `from` for a follower behind what the stream keeps (at most
    /// `CATCH_UP_BYTES`, ending where the kept batches start), or None when the log cannot give one.
    async fn catch_up_batch(&self, stream: &Stream, from: u64) -> CatchUp {
        let Some(partition) = self.led_partition(stream) else {
            return CatchUp::Never;
        };
        let until = stream
            .batches
            .borrow()
            .front()
            .map_or(stream.end.get(), |b| b.head.first_offset);
        if from >= partition.log.end_offset() {
            // A batch shipped before its sync (`Log::ship_before_sync`), on every follower that answered and so no
            // longer kept, and not yet durable here: its log has it once the journal's pass returns.
            return CatchUp::Retry(
                "the leader's own write of these records is not durable yet".into(),
            );
        }
        match partition
            .log
            .read_for_follower(from, until, CATCH_UP_BYTES)
            .await
        {
            Ok(Some((head, frames))) => {
                let end = head.first_offset + u64::from(head.count);
                debug!(topic = %stream.topic, partition = stream.partition, from, end, "catching a follower up from the log");
                CatchUp::Batch(Rc::new(Batch {
                    head,
                    frames: Bytes::from(frames),
                    end,
                    restart: false,
                }))
            }
            Ok(None) => CatchUp::Never,
            Err(crate::storage::log::ReadError::OutOfRetention { start }) if start > from => {
                CatchUp::Restart(start)
            }
            // A failed read is tried again (after the follower's backoff); what the log cannot hold is not.
            Err(crate::storage::log::ReadError::Io(e)) => CatchUp::Retry(e.to_string()),
            Err(e) => {
                warn!(topic = %stream.topic, partition = stream.partition, from, error = ?e, "cannot read the log to catch a follower up");
                CatchUp::Never
            }
        }
    }

    /// A follower answered `stale_epoch` with a newer epoch than the stream's: a newer leadership began, so this
    /// leader's partition stops serving (`Partition::depose`); the stream keeps retrying, and counts that follower
    /// for nothing, until the metadata ends it.
    fn deposed_by(&self, stream: &Stream, e: &OpError) {
        if stream.closed.get() {
            // An older stream's answer (this core led, followed, and leads again, or its epoch moved on).
            return;
        }
        if let Some(known) = stale_epoch_known(e).filter(|&k| k > stream.epoch) {
            if let Some(p) = self
                .engine()
                .topic(&stream.topic)
                .ok()
                .filter(|t| t.id() == stream.topic_id && t.epoch(stream.partition) == stream.epoch)
                .and_then(|t| t.owned_partition(stream.partition))
            {
                p.depose(known);
            }
        }
    }

    /// The stream's partition, while its topic still exists with this id and this core leads it.
    fn led_partition(&self, stream: &Stream) -> Option<Rc<crate::partition::Partition>> {
        self.engine()
            .topic(&stream.topic)
            .ok()
            .filter(|t| t.id() == stream.topic_id)
            .and_then(|t| t.owned_partition(stream.partition))
    }

    /// The topic still exists with this id, and this core still leads the partition.
    fn still_leads(&self, stream: &Stream) -> bool {
        self.led_partition(stream).is_some()
    }

    /// Where follower `node` holds its replica of the stream's partition.
    fn follower_location(&self, stream: &Stream, node: NodeIndex) -> Option<Location> {
        let engine = self.engine();
        let topic = engine.topic(&stream.topic).ok()?;
        let cores = engine.node_cores(node) as usize;
        if cores == 0 {
            return None;
        }
        let core = replica_core(
            &stream.topic,
            &topic.states(),
            node,
            stream.partition,
            cores,
        )?;
        Some(Location { node, core })
    }
}

impl Stream {
    fn push(&self, batch: Rc<Batch>) {
        self.end.set(batch.end);
        self.bytes.set(self.bytes.get() + batch.frames.len());
        self.kept.set(self.kept.get() + batch.frames.len());
        self.batches.borrow_mut().push_back(batch);
    }

    fn pop_front(&self) {
        if let Some(b) = self.batches.borrow_mut().pop_front() {
            self.bytes.set(self.bytes.get() - b.frames.len());
            self.kept.set(self.kept.get() - b.frames.len());
        }
    }

    fn close(&self) {
        self.closed.set(true);
        while !self.batches.borrow().is_empty() {
            self.pop_front();
        }
        for f in &self.followers {
            f.wake.notify(usize::MAX);
        }
    }

    /// The kept batch that starts at `offset`, or why there is none: `Err(true)` when `offset` is below what is
    /// kept (the follower needs a catch-up), `Err(false)` when it has not been written yet.
    fn batch_at(&self, offset: u64) -> Result<Rc<Batch>, bool> {
        let batches = self.batches.borrow();
        let Some(first) = batches.front() else {
            // Nothing kept: what is below the stream's end is gone.
            return Err(offset < self.end.get());
        };
        if offset < first.head.first_offset {
            return Err(true);
        }
        // Batches are contiguous: a binary search by first offset.
        let i = batches.partition_point(|b| b.head.first_offset < offset);
        match batches.get(i) {
            Some(b) if b.head.first_offset == offset => Ok(b.clone()),
            Some(_) => Err(true),
            None if batches.back().is_some_and(|b| b.end > offset) => Err(true),
            None => Err(false),
        }
    }

    /// Every follower whose node is alive has every batch kept, unless it lags, and every frontier (or the stream
    /// ended).
    fn drained(&self, alive: impl Fn(NodeIndex) -> bool) -> bool {
        let end = self.batches.borrow().back().map(|b| b.end);
        self.closed.get()
            || self.followers.iter().all(|f| {
                !alive(f.node)
                    || ((f.lagging.get() || end.is_none_or(|end| f.acked.get() >= end))
                        && f.frontiers.borrow().idle())
            })
    }

    /// Drops the batches every follower that is not lagging has.
    fn trim(&self) {
        let low = self
            .followers
            .iter()
            .filter(|f| !f.lagging.get())
            .map(|f| f.acked.get())
            .min();
        loop {
            let drop = self
                .batches
                .borrow()
                .front()
                .is_some_and(|b| low.is_none_or(|low| b.end <= low));
            if !drop {
                break;
            }
            self.pop_front();
        }
    }
}

/// One follower's task: sends the kept batches from its `next` offset, up to `Windows::in_flight` at once.
async fn run_follower(shipper: Rc<Shipper>, stream: Rc<Stream>, f: Rc<Follower>) {
    loop {
        if stream.closed.get() {
            break;
        }
        let listener = f.wake.listen();
        if let Some(wait) = f.backoff.get() {
            shipper.engine().sleep(wait).await;
            f.backoff.set(None);
            if !shipper.still_leads(&stream) {
                break;
            }
            continue;
        }
        if f.lease_asked.get() && !f.pinging.get() {
            // The leader's lease asked for a renewal: a request of no frontiers, lagging or not (it says only that
            // the follower has not fenced this leadership past, and touches nothing of its log).
            f.lease_asked.set(false);
            let Some(to) = shipper.follower_location(&stream, f.node) else {
                if !shipper.still_leads(&stream) {
                    break;
                }
                continue;
            };
            f.pinging.set(true);
            glommio::spawn_local(renew_lease(shipper.clone(), stream.clone(), f.clone(), to))
                .detach();
            continue;
        }
        // Frontiers first, whether or not it lags (they do not depend on its log), one request at a time.
        let queue = f.frontiers.borrow().clone();
        if queue.ready() {
            let Some(to) = shipper.follower_location(&stream, f.node) else {
                if !shipper.still_leads(&stream) {
                    break;
                }
                fail(&f, "its core count is not known");
                continue;
            };
            let marks = take_frontiers(&queue);
            queue.in_flight.set(true);
            glommio::spawn_local(send_frontiers(
                shipper.clone(),
                stream.clone(),
                f.clone(),
                queue,
                to,
                marks,
            ))
            .detach();
            continue;
        }
        let session = shipper.engine().node_session(f.node);
        if f.answered.get() && session != 0 && session != f.session.get() && f.in_flight.get() == 0
        {
            // Its node restarted since it last answered (a crash, or a new disk): where it stands is asked again,
            // whatever it lacks is sent from there (a learner then gets its frontiers and is promoted), and a
            // follower found lagging before gets its chance again.
            debug!(topic = %stream.topic, partition = stream.partition, follower = f.node, "a follower's node registered again: asking where it stands");
            f.answered.set(false);
            f.lagging.set(false);
            f.owed.replace(None);
            f.session.set(session);
        }
        if f.poisoned.get() && session != 0 && session != f.session.get() {
            // A restart recovers a log that refused appends (its answers say so again if not).
            f.session.set(session);
            f.poisoned.set(false);
            shipper.report(&stream, &f);
        }
        if f.learner.get()
            && !f.lagging.get()
            && f.in_flight.get() == 0
            && f.acked.get() >= stream.end.get()
            && f.owed.borrow().as_ref().is_none_or(|owed| owed.is_empty())
            && f.promote_asked
                .get()
                .is_none_or(|at| shipper.engine().now_ms() >= at + PROMOTE_EVERY.as_millis() as u64)
        {
            // A learner with nothing else to send: asked (a probe) to promote itself once it has every group's
            // frontier, or asked where it stands so that its answer queues them.
            f.promote_asked.set(Some(shipper.engine().now_ms()));
            if let Dispatch::Gone = probe(&shipper, &stream, &f) {
                break;
            }
            continue;
        }
        if f.status_asked.get() && f.in_flight.get() == 0 && !f.lagging.get() && f.answered.get() {
            // CheckQuorum asked where it stands (whether its log refuses appends) before it hands the leadership on:
            // once nothing is in flight to it, whatever is left to send it (a poisoned leader's followers may wait
            // for a catch-up past its log's end that never comes: each needs an answer all the same). A probe carries
            // the leader's whole history, so one below what the follower holds of this leadership cuts none of it.
            // (A follower not asked yet in this stream is probed below anyway; a lagging one keeps what it last
            // said.)
            f.status_asked.set(false);
            if let Dispatch::Gone = probe(&shipper, &stream, &f) {
                break;
            }
            continue;
        }
        if !f.lagging.get() && !f.answered.get() {
            // Its end is not known yet in this stream: asked first, before any batch, so that a log that
            // diverges from this leader's (an old leader's unacknowledged tail) is cut before it is sent anything.
            if f.in_flight.get() == 0 {
                if let Dispatch::Gone = probe(&shipper, &stream, &f) {
                    break;
                }
            } else {
                idle(shipper.engine(), listener).await;
                if !shipper.still_leads(&stream) {
                    break;
                }
            }
            continue;
        }
        if f.lagging.get() || f.in_flight.get() >= shipper.windows.in_flight {
            idle(shipper.engine(), listener).await;
            if !shipper.still_leads(&stream) {
                break;
            }
            continue;
        }
        match stream.batch_at(f.next.get()) {
            Ok(batch) => {
                if let Dispatch::Gone = dispatch(&shipper, &stream, &f, batch, false) {
                    break;
                }
            }
            Err(true) => {
                // Behind what is kept: caught up from the leader's log, a run of frames at a time, up to where the
                // kept batches start (they follow on as usual).
                // (Runs in flight on the core are bounded like kept batches.)
                if shipper.catching.get() >= shipper.windows.core_bytes {
                    idle(shipper.engine(), listener).await;
                    if !shipper.still_leads(&stream) {
                        break;
                    }
                    continue;
                }
                let from = f.next.get();
                match shipper.catch_up_batch(&stream, from).await {
                    CatchUp::Batch(batch) => {
                        // Things may have moved during the read: the next round decides afresh.
                        if stream.closed.get()
                            || f.lagging.get()
                            || f.backoff.get().is_some()
                            || f.next.get() != from
                        {
                            continue;
                        }
                        if let Dispatch::Gone = dispatch(&shipper, &stream, &f, batch, true) {
                            break;
                        }
                    }
                    CatchUp::Retry(why) => {
                        if !shipper.still_leads(&stream) {
                            break;
                        }
                        fail(&f, &why);
                    }
                    CatchUp::Restart(start) => {
                        if stream.closed.get() || !shipper.still_leads(&stream) {
                            break;
                        }
                        if f.lagging.get() || f.backoff.get().is_some() || f.next.get() != from {
                            continue;
                        }
                        if f.in_flight.get() > 0 {
                            // Its answers to what is in flight come first: the restart goes alone.
                            idle(shipper.engine(), listener).await;
                            continue;
                        }
                        // Whole segments from the log's start: a restart probe first (its answer is its new end, as
                        // a first probe's is), then runs of frames from there, as for any catch-up.
                        debug!(topic = %stream.topic, partition = stream.partition, follower = f.node, from, start, "a follower is behind the log's start: its log starts anew there");
                        f.answered.set(false);
                        f.next.set(start);
                        if let Dispatch::Gone = send_probe(&shipper, &stream, &f, true) {
                            break;
                        }
                    }
                    CatchUp::Never if stream.closed.get() || !shipper.still_leads(&stream) => break,
                    CatchUp::Never => {
                        warn!(topic = %stream.topic, partition = stream.partition, follower = f.node, offset = f.next.get(), "a follower needs what the leader cannot ship from its log (below retention, damaged, or skipped): it gets nothing until it is replaced");
                        f.lagging.set(true);
                        stream.trim();
                        shipper.report(&stream, &f);
                    }
                }
            }
            Err(false) => {
                idle(shipper.engine(), listener).await;
                if !shipper.still_leads(&stream) {
                    break;
                }
            }
        }
    }
    // The partition is gone from this core (or the topic, or the server): so is its stream.
    let mut streams = shipper.streams.borrow_mut();
    let key = (stream.topic.clone(), stream.partition);
    if streams.get(&key).is_some_and(|s| Rc::ptr_eq(s, &stream)) {
        streams.remove(&key);
    }
    stream.close();
}

/// Asks follower `f` where its log ends (a batch of no records at its `next` offset, with the leader's whole
/// history: a follower whose log diverges cuts it there first). `Failed` when its place is not known (asked
/// again after its backoff), `Gone` when this core no longer leads the partition.
fn probe(shipper: &Rc<Shipper>, stream: &Rc<Stream>, f: &Rc<Follower>) -> Dispatch {
    // Never below this leader's log start: a follower that ended there (or that a lost answer, or a crash, left
    // believed there after a restart) is asked to start anew at it, which also completes an interrupted restart.
    let start = shipper
        .led_partition(stream)
        .map_or(0, |p| p.log.start_offset());
    if f.next.get() < start {
        f.answered.set(false);
        f.next.set(start);
        return send_probe(shipper, stream, f, true);
    }
    send_probe(shipper, stream, f, false)
}

/// [`probe`], or with `restart` a restart probe at `f.next` (the log's start: `CatchUp::Restart`).
fn send_probe(
    shipper: &Rc<Shipper>,
    stream: &Rc<Stream>,
    f: &Rc<Follower>,
    restart: bool,
) -> Dispatch {
    let Some(to) = shipper.follower_location(stream, f.node) else {
        if !shipper.still_leads(stream) {
            return Dispatch::Gone;
        }
        fail(f, "its core count is not known");
        return Dispatch::Failed;
    };
    let probe = Rc::new(Batch {
        head: EntryHead {
            topic: stream.topic.clone(),
            topic_id: stream.topic_id,
            partition: stream.partition,
            segment_base: 0,
            position: 0,
            first_offset: f.next.get(),
            count: 0,
        },
        frames: Bytes::new(),
        end: f.next.get(),
        restart,
    });
    f.in_flight.set(f.in_flight.get() + 1);
    glommio::spawn_local(send(
        shipper.clone(),
        stream.clone(),
        f.clone(),
        to,
        probe,
        false,
    ))
    .detach();
    Dispatch::Sent
}

/// What became of a batch handed to [`dispatch`].
enum Dispatch {
    Sent,
    /// The follower's place is not known: retried after its backoff.
    Failed,
    /// This core no longer leads the partition: the follower's task ends.
    Gone,
}

/// Sends `batch` (a kept one, or with `catch_up` a run read from the log) to follower `f`, from its `next` on.
fn dispatch(
    shipper: &Rc<Shipper>,
    stream: &Rc<Stream>,
    f: &Rc<Follower>,
    batch: Rc<Batch>,
    catch_up: bool,
) -> Dispatch {
    let Some(to) = shipper.follower_location(stream, f.node) else {
        if !shipper.still_leads(stream) {
            return Dispatch::Gone;
        }
        fail(f, "its core count is not known");
        return Dispatch::Failed;
    };
    f.next.set(batch.end);
    f.in_flight.set(f.in_flight.get() + 1);
    let resend = batch.end <= f.sent.get();
    f.sent.set(f.sent.get().max(batch.end));
    // A catch-up run's bytes count against the core's budget until it is answered.
    let budget = if catch_up { batch.frames.len() } else { 0 };
    shipper.catching.set(shipper.catching.get() + budget);
    let (shipper, stream, f) = (shipper.clone(), stream.clone(), f.clone());
    glommio::spawn_local(async move {
        send(shipper.clone(), stream, f, to, batch, resend).await;
        shipper.catching.set(shipper.catching.get() - budget);
    })
    .detach();
    Dispatch::Sent
}

/// Waits for a wake-up, at most `IDLE_CHECK`.
async fn idle(engine: &Engine, listener: event_listener::EventListener) {
    futures_lite::future::or(listener, engine.sleep(IDLE_CHECK)).await;
}

/// A call failed: everything not acknowledged is sent again after a backoff. The calls in flight with it fail
/// too (a lost connection fails them all): only the first failure while no retry is pending grows the backoff.
fn fail(f: &Follower, why: &str) {
    if f.backoff.get().is_none() {
        let wait = f.delay.get();
        debug!(follower = f.node, why, "replicate: retrying after {wait:?}");
        f.backoff.set(Some(wait));
        f.delay.set((wait * 2).min(MAX_RETRY));
    }
    f.next.set(f.acked.get());
    f.wake.notify(1);
}

/// The epoch a follower knows, when it refused a request as `stale_epoch`.
fn stale_epoch_known(e: &OpError) -> Option<u64> {
    match e {
        OpError::Engine(crate::engine::EngineError::Partition(
            crate::partition::PartitionError::StaleEpoch { known, .. },
        )) => Some(*known),
        _ => None,
    }
}

/// Asks follower `f` to renew the leader's lease: a `ReplicateFrontiers` of no marks, which a replica answers only at
/// an epoch it has not fenced past (`ops::replicate::apply_frontiers`), granting the lease from when it was sent.
async fn renew_lease(shipper: Rc<Shipper>, stream: Rc<Stream>, f: Rc<Follower>, to: Location) {
    let sent_at = shipper.engine().now_ms();
    let request = Request::ReplicateFrontiers(ReplicateFrontiers {
        topic: stream.topic.clone(),
        topic_id: stream.topic_id,
        partition: stream.partition,
        leader: shipper.engine().node(),
        epoch: stream.epoch,
        marks: Vec::new(),
    });
    let result = shipper.router.call(to, request).await;
    f.pinging.set(false);
    match result {
        Ok(Reply::Done) => shipper.lease_answered(&stream, &f, sent_at),
        Ok(_) => {}
        Err(e) => {
            debug!(topic = %stream.topic, partition = stream.partition, follower = f.node, error = %e, "a follower did not renew the lease");
            shipper.deposed_by(&stream, &e);
        }
    }
    f.wake.notify(1);
}

/// Takes up to `MAX_FRONTIER_MARKS` of the frontiers waiting in `queue` (in group order, as the follower admits
/// them), at most `MAX_FRONTIER_BYTES` of them (at least one): the rest wait for the next send.
fn take_frontiers(queue: &FrontierQueue) -> Vec<FrontierMark> {
    let mut waiting = queue.waiting.borrow_mut();
    let mut marks = Vec::with_capacity(waiting.len().min(MAX_FRONTIER_MARKS));
    let mut bytes = 0;
    while marks.len() < MAX_FRONTIER_MARKS {
        let Some(first) = waiting.first_key_value() else {
            break;
        };
        let size = 48 + first.0.len() + 16 * first.1.acked.len();
        if !marks.is_empty() && bytes + size > MAX_FRONTIER_BYTES {
            break;
        }
        bytes += size;
        let (group, p) = waiting.pop_first().expect("a first entry");
        marks.push(FrontierMark {
            group,
            committed: p.committed,
            start: p.start,
            group_id: 0,
            acked: p.acked,
        });
    }
    marks
}

/// Sends frontiers to a follower; on a failure they wait again (before anything queued since) for the retry, which
/// comes after the queue's own backoff (the batches' is not touched).
async fn send_frontiers(
    shipper: Rc<Shipper>,
    stream: Rc<Stream>,
    f: Rc<Follower>,
    queue: Rc<FrontierQueue>,
    to: Location,
    mut marks: Vec<FrontierMark>,
) {
    // A start goes with the group's durable value as it is now (`Partition::durable_frontier_to_ship`): one queued long
    // ago (the follower was down) may be below what the other followers hold since.
    if let Some(partition) = shipper.led_partition(&stream) {
        for m in marks.iter_mut().filter(|m| m.start) {
            if let Some(now) = partition.durable_frontier_to_ship(&m.group) {
                let mut value = m.value();
                value.merge(&now);
                (m.committed, m.acked) = (value.committed, value.acked);
            }
        }
    }
    // Starts took their groups' durable ranges: still within the message's budget.
    crate::ops::replicate::fit_marks(&mut marks);
    // With each group's id, so that a start for the incarnation a follower holds raises its value only.
    if let Ok(topic) = shipper.engine().topic(&stream.topic) {
        let config = topic.config();
        for m in marks.iter_mut() {
            m.group_id = config.group_ids.get(&m.group).copied().unwrap_or(0);
        }
    }
    let request = Request::ReplicateFrontiers(ReplicateFrontiers {
        topic: stream.topic.clone(),
        topic_id: stream.topic_id,
        partition: stream.partition,
        leader: shipper.engine().node(),
        epoch: stream.epoch,
        marks: marks.clone(),
    });
    let result = shipper.router.call(to, request).await;
    match result {
        Ok(Reply::Done) => {
            queue.delay.set(FIRST_RETRY);
            if let Some(owed) = f.owed.borrow_mut().as_mut() {
                for m in &marks {
                    owed.remove(&m.group);
                }
            }
        }
        other => {
            let why = match &other {
                Ok(_) => "an answer out of protocol".to_string(),
                Err(e) => {
                    shipper.deposed_by(&stream, e);
                    e.to_string()
                }
            };
            {
                let mut waiting = queue.waiting.borrow_mut();
                for m in marks {
                    let sent = Pending {
                        committed: m.committed,
                        start: m.start,
                        acked: m.acked,
                    };
                    let merged = match waiting.remove(&m.group) {
                        Some(later) => sent.then(later),
                        None => sent,
                    };
                    waiting.insert(m.group, merged);
                }
            }
            let wait = queue.delay.get();
            debug!(
                follower = f.node,
                why, "replicate frontiers: retrying after {wait:?}"
            );
            queue.delay.set((wait * 2).min(MAX_RETRY));
            shipper.engine().sleep(wait).await;
        }
    }
    queue.in_flight.set(false);
    f.wake.notify(1);
}

/// Sends one batch to a follower and takes its answer (`resend`: the batch was sent to it before in this stream,
/// so an answer past it may mean it was applied then).
async fn send(
    shipper: Rc<Shipper>,
    stream: Rc<Stream>,
    f: Rc<Follower>,
    to: Location,
    batch: Rc<Batch>,
    resend: bool,
) {
    let partition = shipper.led_partition(&stream);
    let request = Request::Replicate(Replicate {
        topic: stream.topic.clone(),
        topic_id: stream.topic_id,
        partition: stream.partition,
        leader: shipper.engine().node(),
        epoch: stream.epoch,
        segment_base: batch.head.segment_base,
        position: batch.head.position,
        first_offset: batch.head.first_offset,
        count: batch.head.count,
        frames: batch.frames.clone(),
        // In which epochs its records (and the one before them) were written, from the leader's history, with an
        // epoch that starts right after them (a follower that has them all holds that leader's log as it began:
        // `Partition::rank`); a probe carries the leader's whole history, whatever its offset.
        epochs: partition
            .as_ref()
            .map(|p| {
                if batch.head.count == 0 {
                    // Whatever offset it asks at: a follower whose log ends past it (an answer lost, or a restart
                    // probe's log that had more) is checked against all of it, as by a probe at its end.
                    p.epoch_history().up_to_epoch(stream.epoch)
                } else {
                    // From the entry of the record before the batch: the follower checks its own says the same.
                    p.epochs_covering(batch.head.first_offset.saturating_sub(1), batch.end + 1)
                }
            })
            .unwrap_or_default(),
        // Anything this leader acknowledged is below its end when the stream opened (before it: in its log when it
        // began leading, or when it started again) or below its commit offset (since); and anything the commit
        // counted this follower for (its disk may have held more than the commit needed it for, R = 5) below what
        // it was credited with.
        hold: partition.as_ref().map_or(u64::MAX, |p| {
            stream
                .opened_at
                .max(p.readable_end())
                .max(p.follower_counted(f.node))
                .max(f.credit.get())
        }),
        promote: f.owed.borrow().as_ref().is_some_and(|owed| owed.is_empty()),
        // Its nonce ceiling, which a majority promised already: a replica added since its round promises it too
        // before it can count in the next one (`partition/nonces.rs`).
        nonces: partition.as_ref().map_or(0, |p| p.nonce_window().ceiling),
        restart: batch.restart,
    });
    // Before the call: an answer grants the lease from when its request left (`lease_answered`).
    let sent_at = shipper.engine().now_ms();
    let result = shipper.router.call(to, request).await;
    f.in_flight.set(f.in_flight.get() - 1);
    match result {
        Ok(Reply::Replicated(Replicated {
            end,
            applied,
            refused,
            learner,
            poisoned,
        })) => {
            if f.session.get() == 0 {
                // Its first answer in this stream: the session it answered under (a later one is a restart).
                f.session.set(shipper.engine().node_session(f.node));
            }
            shipper.learner_answered(&stream, &f, learner);
            f.poisoned.set(poisoned);
            f.answered_ms.set(shipper.engine().now_ms());
            // Answered at this stream's epoch (a replica fenced past it answers `stale_epoch`).
            shipper.lease_answered(&stream, &f, sent_at);
            if end > f.acked.get() || !f.answered.get() {
                // Progress: the next failure starts a new incident.
                f.delay.set(FIRST_RETRY);
            }
            if !refused && batch.restart {
                // A restart probe's answer: the follower's end, at the start it was sent (a log started anew, with
                // this leader's history up to there) or past it (a log that had more than this leader believed,
                // checked against this leader's whole history). Counted for the commit only past the start: a log
                // started anew holds nothing below it.
                let leader_end = stream.end.get().max(f.sent.get());
                if end > leader_end {
                    warn!(topic = %stream.topic, partition = stream.partition, follower = f.node, end, leader_end, "a follower's log is ahead of its leader's: it gets nothing and counts for nothing");
                    f.lagging.set(true);
                } else {
                    f.acked.set(end);
                    f.next.set(end);
                    if end > batch.head.first_offset {
                        f.credit.set(f.credit.get().max(end));
                    }
                    f.verified.set(true);
                }
            } else if !refused
                && batch.head.count == 0
                && end > batch.head.first_offset
                && end <= f.sent.get()
            {
                // A probe answered after batches were sent to it (they went while the probe was in flight): its
                // end may be theirs. Their own answers tell where it stands; this one is not counted. (An end past
                // anything shipped is a log ahead of this leader's: below.)
            } else if !refused && batch.head.count == 0 && end > batch.head.first_offset {
                // A probe's answer past the leader's end: its log holds what this leader never shipped (the
                // leader lost records). Not counted, and nothing more is sent until epochs settle it (step 4).
                warn!(topic = %stream.topic, partition = stream.partition, follower = f.node, end, leader_end = batch.head.first_offset, "a follower's log is ahead of its leader's: it gets nothing and counts for nothing");
                f.lagging.set(true);
            } else if !refused && batch.head.count == 0 {
                // A probe's answer: its end, which the leader's kept batches (or a catch-up) continue. It replaces
                // the leader's assumption only if nothing answered first: an answer to a batch sent after the
                // probe may have come before it, and the probe's end is older.
                if f.answered.get() {
                    f.acked.set(f.acked.get().max(end));
                } else {
                    f.acked.set(end);
                    f.next.set(f.next.get().min(end));
                }
                f.credit.set(f.credit.get().max(end));
                f.verified.set(true);
            } else if refused {
                warn!(topic = %stream.topic, partition = stream.partition, follower = f.node, end, "a follower refused a shipped batch: it gets nothing until it is caught up");
                f.lagging.set(true);
            } else if applied || (resend && end >= batch.end) {
                // Applied now, or earlier (a resend after a lost answer): it holds this batch. Counted up to the
                // batch's end only: anything past it was not shipped by this stream; and, for a resend, only once
                // it showed its log continues this leader's.
                f.acked.set(f.acked.get().max(end));
                if applied || f.verified.get() {
                    f.credit.set(f.credit.get().max(end.min(batch.end)));
                }
                if applied {
                    f.verified.set(true);
                }
            } else if end <= batch.head.first_offset {
                // It missed earlier batches (or lost them): resend from its end.
                f.acked.set(f.acked.get().max(end));
                if f.verified.get() {
                    f.credit.set(f.credit.get().max(end));
                }
                f.next.set(f.next.get().min(end));
            } else if resend && f.verified.get() && end < batch.end {
                // Inside a batch sent before (a catch-up run cut differently the first time, whose first part it
                // took): it holds this leader's records up to there; resend from its end.
                f.acked.set(f.acked.get().max(end));
                f.credit.set(f.credit.get().max(end));
                f.next.set(f.next.get().min(end));
            } else {
                warn!(topic = %stream.topic, partition = stream.partition, follower = f.node, end, first = batch.head.first_offset, "a follower's log ends inside a batch: it gets nothing until it is caught up");
                f.lagging.set(true);
            }
            f.answered.set(true);
            stream.trim();
            shipper.report(&stream, &f);
        }
        Ok(other) => {
            warn!(follower = f.node, reply = ?std::mem::discriminant(&other), "replicate: an answer out of protocol");
            fail(&f, "an answer out of protocol");
        }
        // Retried, whatever the cause (a follower down, restarting, overloaded): it resumes from what is kept for it
        // when it answers again (the windows bound what that costs).
        Err(e) => {
            shipper.deposed_by(&stream, &e);
            let refuses_appends = matches!(
                e,
                OpError::Engine(crate::engine::EngineError::Partition(
                    crate::partition::PartitionError::LogUnavailable
                ))
            );
            if refuses_appends {
                f.answered_ms.set(shipper.engine().now_ms());
                if !f.poisoned.replace(true) {
                    if f.session.get() == 0 {
                        // (Its restart clears the flag: `run_follower`.)
                        f.session.set(shipper.engine().node_session(f.node));
                    }
                    warn!(topic = %stream.topic, partition = stream.partition, follower = f.node, "a follower's log refuses appends until its node restarts: it is not given the leadership");
                }
                shipper.report(&stream, &f);
            }
            fail(&f, &e.to_string())
        }
    }
    f.wake.notify(1);
}

#[cfg(test)]
mod tests {
    use super::{queue_frontier, Pending};
    use std::collections::BTreeMap;

    fn p(committed: u64, start: bool) -> Pending {
        Pending {
            committed,
            start,
            acked: Vec::new(),
        }
    }

    #[test]
    fn waiting_frontiers_keep_the_newest_value_and_never_lose_a_start() {
        let mut w = BTreeMap::new();
        queue_frontier(&mut w, "g", p(5, false));
        queue_frontier(&mut w, "g", p(9, false));
        assert_eq!(w["g"], p(9, false));
        // Values only move up between starts (a lower one is an older flush's).
        queue_frontier(&mut w, "g", p(7, false));
        assert_eq!(w["g"], p(9, false));
        // A start replaces what came before it, lower or not...
        queue_frontier(&mut w, "g", p(2, true));
        assert_eq!(w["g"], p(2, true));
        // ...and the values after it move it on, still a start.
        queue_frontier(&mut w, "g", p(4, false));
        assert_eq!(w["g"], p(4, true));
        // Put back after a failed send (the sent marks, then what queued meanwhile).
        assert_eq!(p(9, false).then(p(4, true)), p(4, true));
        assert_eq!(p(3, true).then(p(6, false)), p(6, true));
        assert_eq!(w.len(), 1);
        // Acked ranges: what both settled, above the higher frontier; a start takes the later value's.
        let acked = |committed: u64, start: bool, acked: &[(u64, u64)]| Pending {
            committed,
            start,
            acked: acked.to_vec(),
        };
        assert_eq!(
            acked(5, false, &[(7, 9)]).then(acked(6, false, &[(9, 10), (12, 13)])),
            acked(6, false, &[(7, 10), (12, 13)])
        );
        assert_eq!(
            acked(5, true, &[(7, 9)]).then(acked(6, false, &[(12, 13)])),
            acked(6, true, &[(12, 13)])
        );
    }
}
