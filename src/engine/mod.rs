//! The engine: one core's state. As an owner, the topics it knows and the partitions it owns, with their logs,
//! lease shards and frontier files; as a front, the consumers parked on it. One `Rc<Engine>` lives on each executor
//! and nothing in it is shared with another core: requests reach it through `ops::apply` (directly on this core,
//! over the mesh from another), and it reaches other cores only through the `Peers` it is given (admin steps and
//! wake-up signals), so it does not depend on the transport above it.

pub mod admin;
pub mod cluster;
pub mod error;
pub mod metrics;
pub mod names;
pub mod placement;
pub mod timers;
pub mod topic;
pub mod waiters;

use crate::clock::Clock;
use crate::config::Config;
use crate::partition::Partition;
use crate::storage::backend::Storage;
pub use error::{EngineError, EngineResult};
use event_listener::Event;
use metrics::CoreMetrics;
use names::NamePair;
use placement::{Location, NodeIndex};
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use topic::{Topic, TopicConfig};
use waiters::WaitQueue;

/// A one-way message between cores about parked consumers of a (topic, group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Signal {
    /// Core `from` (of this node or, in a cluster, another) has consumers parked on this (topic, group): wake it
    /// when something becomes deliverable here.
    Interest {
        topic: String,
        group: String,
        from: Location,
    },
    /// Core `from` has no consumer parked on this (topic, group) any more.
    NoInterest {
        topic: String,
        group: String,
        from: Location,
    },
    /// `n` messages of (topic, group) became deliverable on the sending core.
    Wake {
        topic: String,
        group: String,
        n: usize,
    },
}

/// A step of a topic change that every core applies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AdminStep {
    /// Learn a topic and open the partitions this core owns, and its follower replicas here. The states name each
    /// partition's replicas, leader and epoch (empty: no metastore, every partition on its location alone at its
    /// first epoch, the topic's id).
    Apply(TopicConfig, Vec<Location>, Vec<placement::PartitionState>),
    /// Forget a topic and close its partitions here.
    Drop(String),
    /// New settings (or groups) for a known topic.
    Update(TopicConfig),
    /// Cluster mode: the node table, this node's index and fencing.
    Cluster(cluster::ClusterView),
    /// Before a group is announced: each core writes the group's frontier file for the partitions it owns, at the
    /// oldest retained offset (`earliest`) or at the end (`latest`), overwriting a file a crashed creation left.
    PrepareGroup {
        topic: String,
        topic_id: u64,
        group: String,
        latest: bool,
    },
}

/// What a core ships to the followers of a replicated partition it leads.
pub enum Ship<'a> {
    /// A durable batch: its journal entry head and frames (no records and no frames: a probe for the followers'
    /// ends).
    Batch(&'a crate::storage::journal::EntryHead, &'a [u8]),
    /// Frontiers of its consumer groups made durable here (all of one partition), in the order they were made.
    Frontiers(&'a [crate::storage::journal::FrontierRecord]),
    /// A partition this core is to lead at `epoch` needs its fencing round (`front/round.rs`): it serves once
    /// [`Engine::finish_round`] ran.
    Round(&'a RoundOf),
    /// A partition led here at the round's epoch ran its nonce window low (`partition/nonces.rs`): a higher ceiling
    /// is to be promised by a majority of its replicas.
    RaiseNonces(&'a RoundOf),
    /// A replicated partition this node led at the round's epoch before it restarted: it serves nothing until its
    /// metadata names it leader at a newer epoch, which it asks for (`front/round.rs`, `renew`); the fencing round
    /// of that epoch follows. (A leader ships batches before its own sync: what it lost in a crash, its followers
    /// may hold at this epoch, and a leader that went on at the same epoch would write other records at those
    /// offsets, which truncation by epoch cannot tell apart.)
    Renew(&'a RoundOf),
}

/// A partition whose leadership at `epoch` begins with a fencing round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundOf {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub epoch: u64,
}

/// Takes what the replicated partitions a core leads ship to their followers (`front::replicate`). Called on the
/// core, in log order per partition; never waits.
pub type ShipSink = Rc<dyn Fn(Ship<'_>)>;

/// What the engine needs of the other cores, provided by the transport layer above it.
pub trait Peers {
    /// Applies an admin step on every other core; one result per core.
    fn broadcast(
        &self,
        step: AdminStep,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<EngineResult<()>>> + '_>>;
    /// Sends a signal to another core without waiting; false when it cannot be sent now (a full channel).
    fn signal(&self, to: Location, signal: Signal) -> bool;
}

/// The little state every core shares: readiness for /health, the server-wide connection count, and the boot-time
/// agreement on quarantined topics (never on the data path).
#[derive(Default)]
pub struct Shared {
    /// Cores serving (listening) now.
    pub ready: std::sync::atomic::AtomicUsize,
    /// Client connections open across all cores.
    pub connections: std::sync::atomic::AtomicUsize,
    /// Topics some core could not open at boot (name → why), gathered before any core serves.
    pub boot_failures: std::sync::Mutex<Vec<(String, String)>>,
    /// Cores done loading their topics (a barrier with `loaded_event`).
    pub loaded: std::sync::atomic::AtomicUsize,
    /// Cluster mode: 0 while core 0 joins, 1 once joined (other cores wait on `loaded_event`), else it failed.
    pub cluster_joined: std::sync::atomic::AtomicUsize,
    pub loaded_event: Event,
    /// SQS message move tasks (`sqs::tasks`): started, listed and cancelled by the SQS face on any core.
    pub move_tasks: std::sync::Mutex<crate::sqs::tasks::MoveTasks>,
}

/// Reads extra `/metrics` series (see `Engine::set_extra_stats`).
pub type ExtraStats = Rc<dyn Fn() -> Vec<metrics::ExtraSeries>>;

/// One core's engine.
pub struct Engine {
    /// This core's index (0-based); equals its mesh peer id.
    id: usize,
    /// Number of cores on this node.
    cores: usize,
    /// This node's index in the node table.
    node: Cell<NodeIndex>,
    /// Cluster mode: the node table and fencing (see `cluster`).
    view: RefCell<Rc<cluster::ClusterView>>,
    /// Cluster mode, core 0: where topic changes are decided.
    metadata: RefCell<Option<Rc<dyn cluster::Metadata>>>,
    /// Cluster mode: where the durable batches of the replicated partitions this core leads go (the shipper).
    ship_sink: RefCell<Option<ShipSink>>,
    /// Fencing rounds (false) and renewals (true: `Ship::Renew`) asked for before the shipper existed.
    pending_rounds: RefCell<Vec<(RoundOf, bool)>>,
    /// Cluster mode, core 0: topic names the metastore did not have, until when (ms): a negative cache.
    missing: RefCell<std::collections::HashMap<String, u64>>,
    config: Rc<Config>,
    clock: Rc<dyn Clock>,
    storage: Rc<dyn Storage>,
    topics: RefCell<BTreeMap<String, Rc<Topic>>>,
    /// Topics that could not be opened at start (name → why): they answer 503 topic_unavailable.
    quarantined: RefCell<BTreeMap<String, String>>,
    /// Front side: consumers parked on this core, per (topic, group).
    waiters: RefCell<BTreeMap<(String, String), Rc<WaitQueue>>>,
    /// Front side: owner cores told that this core has consumers parked on (topic, group).
    registered: RefCell<BTreeMap<(String, String), BTreeSet<Location>>>,
    /// Owner side: cores with consumers parked on (topic, group), to wake when something becomes deliverable here.
    interest: RefCell<BTreeMap<(String, String), BTreeSet<Location>>>,
    /// Owner side: wake units that could not be sent (full channel), per (core, topic, group); retried by the timer.
    pending_wakes: RefCell<BTreeMap<(Location, String, String), usize>>,
    peers: RefCell<Option<Rc<dyn Peers>>>,
    /// Serialises topic creation, changes and deletion (core 0).
    admin_lock: glommio::sync::Semaphore,
    metrics: CoreMetrics,
    /// Wakes the timer task when a deadline earlier than the one it sleeps to appears.
    timer_rearm: Event,
    /// The deadline the timer task currently sleeps to (ms, monotonic).
    timer_deadline: Cell<u64>,
    /// Set at shutdown: new long-polls return at once, connections close after their current response.
    stopping: Cell<bool>,
    /// Parked consumers that could not register with some owner (a full channel) and poll instead.
    polling: Cell<usize>,
    /// Notified when `stopping` is set (idle connections and parked consumers listen).
    stop_event: Event,
    shared: std::sync::Arc<Shared>,
    /// Series from layers above (node RPC), read at each `/metrics`.
    extra_stats: RefCell<Option<ExtraStats>>,
    /// This core's journal (fsync `always` and `interval:MS`), started by `load_topics`.
    journal: RefCell<Option<Rc<crate::storage::journal::Journal>>>,
}

impl Engine {
    pub fn new(
        id: usize,
        cores: usize,
        config: Rc<Config>,
        clock: Rc<dyn Clock>,
        storage: Rc<dyn Storage>,
        shared: std::sync::Arc<Shared>,
    ) -> Rc<Engine> {
        Rc::new(Engine {
            id,
            cores,
            node: Cell::new(0),
            view: RefCell::new(Rc::default()),
            metadata: RefCell::new(None),
            ship_sink: RefCell::new(None),
            pending_rounds: RefCell::new(Vec::new()),
            missing: RefCell::new(Default::default()),
            config,
            clock,
            storage,
            topics: RefCell::new(BTreeMap::new()),
            quarantined: RefCell::new(BTreeMap::new()),
            waiters: RefCell::new(BTreeMap::new()),
            registered: RefCell::new(BTreeMap::new()),
            interest: RefCell::new(BTreeMap::new()),
            pending_wakes: RefCell::new(BTreeMap::new()),
            peers: RefCell::new(None),
            admin_lock: glommio::sync::Semaphore::new(1),
            metrics: CoreMetrics::default(),
            timer_rearm: Event::new(),
            timer_deadline: Cell::new(u64::MAX),
            stopping: Cell::new(false),
            polling: Cell::new(0),
            stop_event: Event::new(),
            shared,
            journal: RefCell::new(None),
            extra_stats: RefCell::new(None),
        })
    }

    /// Adds series from a layer above the engine to this core's `/metrics` (node RPC counters); set once.
    pub fn set_extra_stats(&self, f: ExtraStats) {
        *self.extra_stats.borrow_mut() = Some(f);
    }

    /// Wires the other cores (set once, before serving).
    pub fn set_peers(&self, peers: Rc<dyn Peers>) {
        *self.peers.borrow_mut() = Some(peers);
    }

    pub fn id(&self) -> usize {
        self.id
    }

    pub fn cores(&self) -> usize {
        self.cores
    }

    pub fn node(&self) -> NodeIndex {
        self.node.get()
    }

    pub fn config(&self) -> &Rc<Config> {
        &self.config
    }

    /// How long a produce to a replicated partition waits for a majority (`[cluster] replica_timeout_ms`).
    pub fn replica_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.config
                .cluster
                .as_ref()
                .map_or(2000, |c| c.replica_timeout_ms),
        )
    }

    /// How long a replicated leader's lease on its takes lasts, ms (`[cluster] replica_lease_ms`).
    pub fn replica_lease_ms(&self) -> u64 {
        self.config
            .cluster
            .as_ref()
            .map_or(crate::partition::lease::DEFAULT_LEASE_MS, |c| {
                c.replica_lease_ms
            })
    }

    pub fn clock(&self) -> &Rc<dyn Clock> {
        &self.clock
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Sleeps `d` on this core's clock (the simulation's manual clock under it), to the millisecond.
    pub fn sleep(&self, d: std::time::Duration) -> crate::clock::Sleep {
        self.clock
            .sleep_until(self.clock.now_ms() + d.as_millis() as u64)
    }

    pub fn metrics(&self) -> &CoreMetrics {
        &self.metrics
    }

    pub fn shared(&self) -> &std::sync::Arc<Shared> {
        &self.shared
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// A listener that fires when shutdown begins (register before checking `is_stopping`).
    pub fn listen_stop(&self) -> event_listener::EventListener {
        self.stop_event.listen()
    }

    /// The topic as this core knows it.
    pub fn topic(&self, name: &str) -> EngineResult<Rc<Topic>> {
        if let Some(topic) = self.topics.borrow().get(name) {
            return Ok(topic.clone());
        }
        if self.quarantined.borrow().contains_key(name) {
            return Err(EngineError::TopicUnavailable(name.to_string()));
        }
        Err(EngineError::TopicNotFound(name.to_string()))
    }

    /// The topic, if it is still the incarnation `id` (a request crossing a delete and re-create is refused).
    pub fn topic_of(&self, name: &str, id: u64) -> EngineResult<Rc<Topic>> {
        let topic = self.topic(name)?;
        if id != 0 && topic.id() != id {
            return Err(EngineError::TopicNotFound(name.to_string()));
        }
        Ok(topic)
    }

    /// Every topic name (quarantined ones included), sorted.
    pub fn topic_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.topics.borrow().keys().cloned().collect();
        names.extend(self.quarantined.borrow().keys().cloned());
        names.sort();
        names
    }

    /// The owned partition `p` of a topic: 404 if out of range, `Stale` if another core owns it.
    pub fn partition(&self, topic: &Topic, p: u64) -> EngineResult<Rc<Partition>> {
        if p >= topic.partition_count() as u64 {
            return Err(EngineError::PartitionNotFound {
                topic: topic.name(),
                partition: p,
            });
        }
        topic.owned_partition(p as u32).ok_or_else(|| {
            EngineError::Stale(format!(
                "partition {p} of '{}' is not owned by core {}",
                topic.name(),
                self.id
            ))
        })
    }

    /// Every owned partition with its topic (for the timers). A snapshot: partitions of topics deleted meanwhile
    /// are closed and ignore the timers' calls.
    pub fn owned_partitions(&self) -> Vec<(Rc<Topic>, Rc<Partition>)> {
        let topics = self.topics.borrow();
        let mut out = Vec::new();
        for topic in topics.values() {
            for p in topic.owned_partitions() {
                out.push((topic.clone(), p.clone()));
            }
        }
        out
    }

    /// Cluster mode: sets where the durable batches of the replicated partitions this core leads go (once, before
    /// serving).
    pub fn set_ship_sink(&self, sink: ShipSink) {
        *self.ship_sink.borrow_mut() = Some(sink.clone());
        // The topics opened at the join, before there was a sink: their followers are probed now.
        let topics: Vec<_> = self.topics.borrow().values().cloned().collect();
        for topic in topics {
            self.probe_followers(&topic);
        }
        // And the fencing rounds asked for then run.
        let pending = std::mem::take(&mut *self.pending_rounds.borrow_mut());
        for (round, renew) in &pending {
            sink(if *renew {
                Ship::Renew(round)
            } else {
                Ship::Round(round)
            });
        }
    }

    /// What a replicated partition led here calls for a raise of its nonce ceiling: the shipper promises one on a
    /// majority of its replicas (`front/round.rs`, `raise_nonces`), as it runs rounds. The sink is the one set when
    /// the hook is made; until a shipper exists, a raise is asked for again at the next take.
    fn nonce_hook(self: &Rc<Self>, round: RoundOf) -> crate::partition::nonces::NonceHook {
        let engine = Rc::downgrade(self);
        Rc::new(move || {
            let sink = engine.upgrade().and_then(|e| e.ship_sink.borrow().clone());
            match sink {
                Some(sink) => sink(Ship::RaiseNonces(&round)),
                None => {
                    if let Some(p) = engine.upgrade().and_then(|e| {
                        e.topic(&round.topic)
                            .ok()
                            .and_then(|t| t.owned_partition(round.partition))
                    }) {
                        p.nonce_raise_failed();
                    }
                }
            }
        })
    }

    /// A replicated partition opened here as its leader, serving without a fencing round (its topic's creation
    /// epoch, or an epoch it began before a restart): its first take asks a majority to promise its nonces.
    pub(crate) fn open_nonces_later(
        self: &Rc<Self>,
        topic: &str,
        topic_id: u64,
        partition: u32,
        epoch: u64,
        p: &crate::partition::Partition,
    ) {
        p.open_nonces_later(self.nonce_hook(RoundOf {
            topic: topic.to_string(),
            topic_id,
            partition,
            epoch,
        }));
    }

    /// A replicated partition this core is to lead at `epoch` runs its fencing round (through the shipper, which
    /// reaches the other replicas; kept until the shipper exists).
    pub(crate) fn begin_round(&self, topic: &str, topic_id: u64, partition: u32, epoch: u64) {
        self.ask_shipper(topic, topic_id, partition, epoch, false);
    }

    /// A replicated partition this core led at `epoch` before a restart asks for a newer epoch naming it leader
    /// (`Ship::Renew`; kept until the shipper exists). It serves nothing meanwhile.
    pub(crate) fn renew_leadership(&self, topic: &str, topic_id: u64, partition: u32, epoch: u64) {
        self.ask_shipper(topic, topic_id, partition, epoch, true);
    }

    /// `Ship::Round` (or with `renew` `Ship::Renew`) for the partition at `epoch`, now or once the shipper exists.
    fn ask_shipper(&self, topic: &str, topic_id: u64, partition: u32, epoch: u64, renew: bool) {
        let round = RoundOf {
            topic: topic.to_string(),
            topic_id,
            partition,
            epoch,
        };
        let sink = self.ship_sink.borrow().clone();
        match sink {
            Some(sink) if renew => sink(Ship::Renew(&round)),
            Some(sink) => sink(Ship::Round(&round)),
            None => self.pending_rounds.borrow_mut().push((round, renew)),
        }
    }

    /// The fencing round of a partition this core is to lead was won by this replica: it serves (its nonces from
    /// above `nonces.0` and below `nonces.1`, a ceiling a majority promised), and its followers are probed (and sent what they lack, its groups' frontiers included). Err: the partition is no longer led
    /// here at that epoch, or its history could not be written.
    pub async fn finish_round(
        self: &Rc<Self>,
        round: &RoundOf,
        nonces: (u64, u64),
    ) -> EngineResult<()> {
        let topic = self.topic(&round.topic)?;
        let partition = topic
            .owned_partition(round.partition)
            .filter(|_| topic.id() == round.topic_id)
            .ok_or_else(|| EngineError::TopicNotFound(round.topic.clone()))?;
        // Its window of nonces (promised by a majority in the round) opens before it serves.
        partition.open_nonces(nonces.0, nonces.1, self.nonce_hook(round.clone()));
        partition
            .start_serving(round.epoch)
            .await
            .map_err(|e| EngineError::Storage(e.to_string()))?;
        self.ship_probe(
            &round.topic,
            round.topic_id,
            round.partition,
            partition.log.end_offset(),
        );
        self.ship_frontiers(&partition.durable_frontiers());
        Ok(())
    }

    /// Asks the followers of the replicated partitions of `topic` led here where they stand, so that what a
    /// majority has is served without waiting for the next produce; and sends them its groups' durable frontiers.
    pub(crate) fn probe_followers(&self, topic: &topic::Topic) {
        for &p in topic.owned().iter() {
            // (One still in its fencing round is probed once it is won: `finish_round`.)
            if let Some(partition) = topic
                .owned_partition(p)
                .filter(|p| p.replicated() && p.deposed().is_none())
            {
                self.ship_probe(&topic.name(), topic.id(), p, partition.log.end_offset());
                // And its groups' durable frontiers, for a follower that missed some before this open.
                self.ship_frontiers(&partition.durable_frontiers());
                // Serving without a fencing round (its creation epoch, or one begun before a restart): a majority
                // promises its nonces now, not at its first consume.
                partition.ask_for_nonces();
            }
        }
    }

    /// A durable batch of a replicated partition this core leads, for its followers.
    pub(crate) fn ship(&self, head: &crate::storage::journal::EntryHead, frames: &[u8]) {
        let sink = self.ship_sink.borrow().clone();
        if let Some(sink) = sink {
            // A leader in its fencing round, or deposed, ships nothing, not even a probe: its log may lack what a
            // majority holds, and the epoch history its stream sends would cut that from its followers. (Found by
            // the node simulation: a batch of an older leadership, durable only once a stalled disk answered, was
            // shipped at the epoch of a round not yet won.) Its stream starts once the round is won
            // (`finish_round`), and catches its followers up from its log.
            let serving = self.topic(&head.topic).ok().is_none_or(|t| {
                t.owned_partition(head.partition)
                    .is_none_or(|p| p.round_under_way().is_none() && p.deposed().is_none())
            });
            if !serving {
                return;
            }
            sink(Ship::Batch(head, frames));
        }
    }

    /// Frontiers of a replicated partition this core leads, durable here, for its followers. A deposed leader ships
    /// none (a review of seed 22771's fix: frontiers whose journal write landed after this replica answered a newer
    /// round, which ranked its answer without them, would reach a follower that round had not fenced yet, and be
    /// on a majority the new leader serves below). One in its fencing round still does: a group it starts then
    /// must reach its followers.
    pub(crate) fn ship_frontiers(&self, records: &[crate::storage::journal::FrontierRecord]) {
        let sink = self.ship_sink.borrow().clone();
        let Some((sink, first)) = sink.zip(records.first()) else {
            return;
        };
        let deposed = self.topic(&first.topic).ok().is_some_and(|t| {
            t.owned_partition(first.partition)
                .is_some_and(|p| p.deposed().is_some())
        });
        if !deposed {
            sink(Ship::Frontiers(records));
        }
    }

    /// A replicated partition this core leads opened with its log ending at `end`: its followers are asked for
    /// their ends (a "batch" of no records: `front/replicate.rs`).
    pub(crate) fn ship_probe(&self, topic: &str, topic_id: u64, partition: u32, end: u64) {
        let head = crate::storage::journal::EntryHead {
            topic: topic.to_string(),
            topic_id,
            partition,
            segment_base: 0,
            position: 0,
            first_offset: end,
            count: 0,
        };
        self.ship(&head, &[]);
    }

    /// Every follower replica this core holds (replicated topics), with its topic.
    pub fn followed_partitions(&self) -> Vec<(Rc<Topic>, Rc<Partition>)> {
        let topics = self.topics.borrow();
        topics
            .values()
            .flat_map(|t| t.followed_partitions().map(move |p| (t.clone(), p.clone())))
            .collect()
    }

    // ---- long-poll wiring ----

    /// The queue of consumers parked on this core for (topic, group).
    pub fn wait_queue(self: &Rc<Self>, topic: &str, group: &str) -> Rc<WaitQueue> {
        if let Some(q) = self.waiters.borrow().get(&(topic, group) as &dyn NamePair) {
            return q.clone();
        }
        let key = (topic.to_string(), group.to_string());
        let q = WaitQueue::new();
        let engine = Rc::downgrade(self);
        let (t, g) = key.clone();
        q.set_spill(Box::new(move |n| {
            if let Some(engine) = engine.upgrade() {
                engine.deliverable(&t, Some(&g), n);
            }
        }));
        self.waiters.borrow_mut().insert(key, q.clone());
        q
    }

    /// A consume on this core is done with (topic, group): when no consumer is parked any more, the owners that
    /// were told otherwise are told so.
    pub fn release_wait_queue(&self, topic: &str, group: &str) {
        let names = (topic, group);
        let names = &names as &dyn NamePair;
        let empty = self
            .waiters
            .borrow()
            .get(names)
            .is_some_and(|q| q.is_empty());
        if !empty {
            return;
        }
        // The empty queue of a live (topic, group) that no other core was told about stays for the next consume
        // (building one costs half a dozen allocations, per consume before): at most one per pair that exists,
        // and it goes with its topic or group (`drop_topic`, `update_topic`).
        let told = self.registered.borrow().contains_key(names);
        let live = self
            .topics
            .borrow()
            .get(topic)
            .is_some_and(|t| !t.is_deleted() && t.config().has_group(group));
        if live && !told {
            return;
        }
        let key = (topic.to_string(), group.to_string());
        self.waiters.borrow_mut().remove(&key);
        let cores = self
            .registered
            .borrow_mut()
            .remove(&key)
            .unwrap_or_default();
        let Some(peers) = self.peers.borrow().clone() else {
            return;
        };
        let mut kept = BTreeSet::new();
        for core in cores {
            let signal = Signal::NoInterest {
                topic: topic.to_string(),
                group: group.to_string(),
                from: self.here(),
            };
            if !peers.signal(core, signal) {
                // Still registered there: it keeps waking us (harmless); tell it next time.
                kept.insert(core);
            }
        }
        if !kept.is_empty() {
            self.registered.borrow_mut().insert(key, kept);
        }
    }

    /// Makes sure core `owner` will wake this core for (topic, group). Sent before probing that core, on the same
    /// FIFO channel, so nothing becoming deliverable there after the probe can be missed. False if it could not be
    /// sent (a full channel): the caller must not sleep on it unboundedly.
    pub fn register_interest(&self, topic: &str, group: &str, owner: Location) -> bool {
        if owner == self.here() {
            return true;
        }
        if self
            .registered
            .borrow()
            .get(&(topic, group) as &dyn NamePair)
            .is_some_and(|s| s.contains(&owner))
        {
            return true;
        }
        let key = (topic.to_string(), group.to_string());
        let Some(peers) = self.peers.borrow().clone() else {
            return false;
        };
        let signal = Signal::Interest {
            topic: topic.to_string(),
            group: group.to_string(),
            from: self.here(),
        };
        if !peers.signal(owner, signal) {
            return false;
        }
        self.registered
            .borrow_mut()
            .entry(key)
            .or_default()
            .insert(owner);
        true
    }

    /// A signal from another core.
    pub fn on_signal(&self, signal: Signal) {
        match signal {
            Signal::Interest { topic, group, from } => {
                self.interest
                    .borrow_mut()
                    .entry((topic, group))
                    .or_default()
                    .insert(from);
            }
            Signal::NoInterest { topic, group, from } => {
                let key = (topic, group);
                let mut interest = self.interest.borrow_mut();
                if let Some(set) = interest.get_mut(&key) {
                    set.remove(&from);
                    if set.is_empty() {
                        interest.remove(&key);
                    }
                }
            }
            Signal::Wake { topic, group, n } => {
                if let Some(q) = self.waiters.borrow().get(&(topic, group)) {
                    q.wake(n);
                }
            }
        }
    }

    /// `n` messages became deliverable on a partition this core owns, for `group` or (None) for every group of
    /// the topic: wakes up to `n` consumers parked here, and if fewer were here, tells every core with parked
    /// consumers of that (topic, group) how many remain.
    pub fn deliverable(&self, topic: &str, group: Option<&str>, n: usize) {
        if n == 0 {
            return;
        }
        match group {
            Some(g) => self.deliverable_to(topic, g, n),
            None => {
                let Some(t) = self.topics.borrow().get(topic).cloned() else {
                    return;
                };
                let config = t.config();
                self.deliverable_to(topic, crate::partition::DEFAULT_GROUP, n);
                for g in &config.groups {
                    self.deliverable_to(topic, g, n);
                }
            }
        }
    }

    fn deliverable_to(&self, topic: &str, group: &str, n: usize) {
        let key = (topic, group);
        let key = &key as &dyn NamePair;
        let local = self.waiters.borrow().get(key).map_or(0, |q| q.wake(n));
        if local >= n {
            return;
        }
        let cores: Vec<Location> = self
            .interest
            .borrow()
            .get(key)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for core in cores {
            self.send_wake(core, topic, group, n - local);
        }
    }

    fn send_wake(&self, core: Location, topic: &str, group: &str, n: usize) {
        let Some(peers) = self.peers.borrow().clone() else {
            return;
        };
        let signal = Signal::Wake {
            topic: topic.to_string(),
            group: group.to_string(),
            n,
        };
        if !peers.signal(core, signal) {
            *self
                .pending_wakes
                .borrow_mut()
                .entry((core, topic.to_string(), group.to_string()))
                .or_insert(0) += n;
            self.note_deadline(self.clock.now_ms() + WAKE_RETRY_MS);
        }
    }

    /// Retries wake-ups that could not be sent; true if some are still pending.
    pub fn retry_pending_wakes(&self) -> bool {
        let pending = std::mem::take(&mut *self.pending_wakes.borrow_mut());
        for ((core, topic, group), n) in pending {
            self.send_wake(core, &topic, &group, n);
        }
        !self.pending_wakes.borrow().is_empty()
    }

    /// Wait queues this core holds, empty ones kept for the next consume included.
    #[cfg(test)]
    pub fn wait_queues(&self) -> usize {
        self.waiters.borrow().len()
    }

    /// Consumers parked on this core for (topic, group) that hold no wake unit (for the simulation's checks).
    pub fn sleeping_consumers(&self, topic: &str, group: &str) -> usize {
        self.waiters
            .borrow()
            .get(&(topic.to_string(), group.to_string()))
            .map_or(0, |q| q.sleeping())
    }

    /// Cores registered as interested in (topic, group) here (for tests).
    pub fn interested_cores(&self, topic: &str, group: &str) -> Vec<usize> {
        let node = self.node();
        self.interest
            .borrow()
            .get(&(topic.to_string(), group.to_string()))
            .map(|s| {
                s.iter()
                    .filter(|l| l.node == node)
                    .map(|l| l.core as usize)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// This core's address: (this node, this core).
    pub fn here(&self) -> Location {
        Location {
            node: self.node(),
            core: self.id as u32,
        }
    }

    /// Cluster mode: the owner `owner` on another node was told (inside a probe) that consumers are parked here for
    /// (topic, group); it is told when none are any more.
    pub fn note_remote_interest(&self, topic: &str, group: &str, owner: Location) {
        self.registered
            .borrow_mut()
            .entry((topic.to_string(), group.to_string()))
            .or_default()
            .insert(owner);
    }

    /// Parked consumers polling because some owner could not be told to wake them.
    pub fn polling(&self) -> usize {
        self.polling.get()
    }

    /// A parked consumer starts (+1) or stops (-1) polling.
    pub fn note_polling(&self, start: bool) {
        let n = self.polling.get();
        self.polling.set(if start { n + 1 } else { n - 1 });
    }

    /// Wake-ups waiting to be sent again.
    pub fn pending_wake_count(&self) -> usize {
        self.pending_wakes.borrow().len()
    }

    /// Tells the timer task about a deadline if it is earlier than the one it sleeps to.
    pub fn note_deadline(&self, at_ms: u64) {
        if at_ms < self.timer_deadline.get() {
            self.timer_deadline.set(at_ms);
            self.timer_rearm.notify(1);
        }
    }

    /// This core's counters, histogram and partitions, for `/metrics`.
    pub async fn stats(&self) -> metrics::CoreStats {
        let mut partitions = Vec::new();
        for (topic, p) in self.owned_partitions() {
            partitions.push((topic.name(), p.info_with_ages().await));
        }
        let m = &self.metrics;
        metrics::CoreStats {
            core: self.id,
            latency: m.latency.borrow().clone(),
            frontier_lag: m.frontier_lag.borrow().clone(),
            connections_open: m.connections_open.get(),
            connections_refused: m.connections_refused.get(),
            connections_timed_out: m.connections_timed_out.get(),
            tls_handshakes_failed: m.tls_handshakes_failed.get(),
            tls_handshakes_evicted: m.tls_handshakes_evicted.get(),
            mesh_full: m.mesh_full.get(),
            journal_wait: m.journal_wait.borrow().clone(),
            journal_records: m.journal_records.borrow().clone(),
            stages: m.stages.borrow().clone(),
            journal: self.journal.borrow().as_ref().map(|j| j.stats()),
            partitions,
            extra: self
                .extra_stats
                .borrow()
                .as_ref()
                .map(|f| f())
                .unwrap_or_default(),
        }
    }

    /// Enters shutdown: parked consumers and idle connections let go.
    pub fn begin_stop(&self) {
        self.stopping.set(true);
        self.stop_event.notify(usize::MAX);
        for q in self.waiters.borrow().values() {
            q.wake(usize::MAX);
        }
    }

    /// Flushes every frontier and closes every log this core owns (shutdown).
    pub async fn close_all(&self) {
        let mut frontiers_written = true;
        for (_, p) in self.owned_partitions() {
            frontiers_written &= p.close().await;
        }
        for (_, p) in self.followed_partitions() {
            frontiers_written &= p.close().await;
        }
        let journal = self.journal.borrow().clone();
        if let Some(journal) = journal {
            if !frontiers_written {
                tracing::warn!(core = self.id, "a frontier file could not be written at the stop: the journal stays for the replay at the next start");
                journal.keep_on_close();
            }
            journal.close().await;
        }
    }

    /// Starts this core's journal (before any partition opens), unless fsync is `never`.
    pub async fn start_journal(self: &Rc<Self>) -> Result<(), String> {
        use crate::storage::journal::{Journal, JournalOptions};
        if self.config.fsync == crate::storage::FsyncPolicy::Never
            || self.journal.borrow().is_some()
        {
            return Ok(());
        }
        let dir = self.config.data_dir.join("journal");
        let journal = Journal::open(
            self.storage.clone(),
            self.clock.clone(),
            &dir,
            self.id,
            JournalOptions {
                fsync: self.config.fsync,
                file_bytes: self.config.journal_file_bytes,
                commit_delay_us: self.config.journal_commit_delay_us,
            },
            Rc::downgrade(self) as std::rc::Weak<dyn crate::storage::journal::Checkpoint>,
        )
        .await
        .map_err(|e| format!("cannot start the journal in {}: {e}", dir.display()))?;
        let engine = Rc::downgrade(self);
        journal.set_observer(Box::new(move |pass| {
            use metrics::Stage;
            if let Some(engine) = engine.upgrade() {
                let m = &engine.metrics;
                m.journal_records.borrow_mut().record(pass.records);
                let mut wait = m.journal_wait.borrow_mut();
                for &us in pass.waits {
                    wait.record(us);
                }
                let mut stages = m.stages.borrow_mut();
                for &us in pass.waits {
                    stages[Stage::JournalQueue as usize].record(us.saturating_sub(pass.pass_us));
                }
                stages[Stage::JournalWrite as usize].record(pass.write_us);
                if let Some(us) = pass.sync_us {
                    stages[Stage::JournalSync as usize].record(us);
                }
            }
        }));
        *self.journal.borrow_mut() = Some(journal);
        Ok(())
    }

    /// This core's journal, if it has one.
    pub fn journal(&self) -> Option<Rc<crate::storage::journal::Journal>> {
        self.journal.borrow().clone()
    }
}

/// How soon a wake-up refused by a full channel is retried. 1 ms.
pub const WAKE_RETRY_MS: u64 = 1;

/// A journal checkpoint writes this core's frontier files through its engine, the one that knows the newest values.
impl crate::storage::journal::Checkpoint for Engine {
    fn write_frontier_files(
        self: Rc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>> {
        Box::pin(timers::write_frontier_files(self))
    }
}
