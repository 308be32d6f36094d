//! A partition: its log and, per consumer group, a lease shard (`InFlight`) and a frontier file. Owned by exactly one
//! core (every touch asserts it); the engine on that core calls in, other cores reach it only through requests the
//! engine applies. Time comes from the core's `Clock`.

mod commit;
pub mod dedup;
pub mod error;
mod fence;
pub use fence::FollowEpochsError;
pub mod frontier;
pub mod inflight;
mod info;
pub mod lease;
pub mod nonces;
mod turn;

use crate::clock::Clock;
use crate::storage::backend::Storage;
use crate::storage::log::{Log, ReadAhead, ReadError, Record};
use crate::storage::meta::RecordMeta;
use bytes::Bytes;
pub use error::PartitionError;
use inflight::{InFlight, Lease, Limits, Redelivery, ReserveStop};
pub use info::{whole_infos, FollowerInfo, GroupInfo, PartitionInfo};
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tracing::{error, warn};

pub use frontier::DEFAULT_GROUP;

/// How many times a record may fail to read (an I/O error, not a failed check) before it is treated as corrupt.
pub const MAX_READ_FAILURES: u32 = 3;

/// Tells the engine that `n` offsets became deliverable, for one group (`Some`) or for every group (`None`: new
/// records).
pub type Wake = Rc<dyn Fn(Option<&str>, usize)>;

/// A leased message handed to a consumer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Delivery {
    pub partition: u32,
    pub offset: u64,
    pub nonce: u64,
    /// 1 at the first delivery (memory only: restarts at 1 after a crash).
    pub delivery_count: u32,
    /// When the lease ends, on the owner's monotonic clock (not sent to clients; the simulation checks by it).
    pub expires_at_ms: u64,
    /// When the record was appended: Unix ms, by its owner's clock (SQS's SentTimestamp).
    pub sent_ms: u64,
    /// The body (without the record's meta block).
    pub payload: Bytes,
    /// Attributes and the rest of what the record carries besides its body, if anything.
    pub meta: Option<Box<RecordMeta>>,
}

/// How a lease is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SettleOp {
    Ack,
    /// Release the lease: deliverable again after this many ms (None: the topic's redelivery policy).
    Nack(Option<u64>),
    /// Re-arm the expiry to now + this many ms (None: the lease's own length).
    Extend(Option<u64>),
}

/// Why a take stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stop {
    /// It leased as many as asked.
    Max,
    /// It handed out as many payload bytes as its `ByteBudget` allowed.
    Budget,
    /// Nothing more is deliverable.
    Empty,
    /// Something is deliverable, but the in-flight cap is reached.
    AtCap,
    /// The partition could not be served now (its frontier or a record could not be read); counted, logged, and
    /// tried again at the next touch.
    Unavailable,
}

/// What a take leased, and why it stopped.
#[derive(Debug, Default)]
pub struct Taken {
    pub deliveries: Vec<Delivery>,
    pub stop: Option<Stop>,
    /// With `Stop::Unavailable`: why, for the consumer's `503` (a fencing round, a leadership gone, nonces not
    /// promised yet, a failed read).
    pub why: Option<String>,
    /// Some record found was a delayed produce not yet due: it waits as delayed (its time is among the partition's
    /// wake-ups, `next_wakeup_ms`).
    pub deferred: bool,
    /// With `Stop::Unavailable`: the partition may be served in this many ms (a new leader waiting out its
    /// predecessor's lease, `lease.rs`), so a consumer with time left to wait waits rather than being answered `503`.
    pub retry_in_ms: Option<u64>,
}

/// Per-partition counters (monotonic) for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub produced: Cell<u64>,
    pub read_errors: Cell<u64>,
}

/// Per-group counters (monotonic) for `/metrics` and describe.
#[derive(Debug, Default)]
pub struct GroupCounters {
    pub delivered: Cell<u64>,
    pub redelivered: Cell<u64>,
    pub acked: Cell<u64>,
    pub nacked: Cell<u64>,
    pub extended: Cell<u64>,
    pub expired: Cell<u64>,
    pub lease_gone: Cell<u64>,
    pub dead_lettered: Cell<u64>,
    pub retention_skipped: Cell<u64>,
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

/// Where the lease shards stand: loaded lazily at the first touch, from the frontier files on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    /// No load running: every group whose shard is missing is loaded at the next touch.
    Idle,
    /// A touch is reading frontiers; others wait for `loaded_event`.
    Loading,
}

/// One consumer group on one partition.
pub struct Group {
    name: String,
    /// Where its frontier is durable (`frontier.rs`).
    frontier: frontier::FrontierState,
    /// The lease shard: None until the partition is loaded.
    shard: RefCell<Option<InFlight>>,
    pub counters: GroupCounters,
    /// FIFO topics: the group's takes admit offsets one take at a time, in lease order (`InFlight::admit`).
    fifo_turn: turn::Turn,
    /// (offset, append time in Unix ms, or None if it could not be read) of the record at its frontier when the
    /// stats last read it: the oldest unsettled record's age costs one log read per frontier position, not one per
    /// `/status` or `/metrics` (and an unreadable record is not read, nor logged, again).
    oldest: Cell<Option<(u64, Option<u64>)>>,
}

impl Group {
    fn new(name: &str, dir: &Path) -> Rc<Group> {
        Rc::new(Group {
            name: name.to_string(),
            frontier: frontier::FrontierState::new(dir.join(frontier::file_name(name))),
            shard: RefCell::new(None),
            counters: GroupCounters::default(),
            fifo_turn: turn::Turn::default(),
            oldest: Cell::new(None),
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut InFlight) -> R) -> R {
        f(self
            .shard
            .borrow_mut()
            .as_mut()
            .expect("the group's shard is loaded before it is used"))
    }

    fn with_loaded<R>(&self, f: impl FnOnce(&mut InFlight) -> R) -> Option<R> {
        self.shard.borrow_mut().as_mut().map(f)
    }

    /// The frontier its file should hold: the loaded shard's committed frontier, or on a follower replica the one
    /// its leader shipped (None: neither, nothing to write).
    fn frontier_value(&self) -> Option<u64> {
        self.with_loaded(|s| s.committed())
            .or(self.frontier.replica.get())
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One partition on its owning core.
pub struct Partition {
    /// Partition number within its topic.
    pub id: u32,
    /// The core that owns it (this one).
    pub core: usize,
    /// The glommio executor that owns it: every touch asserts it runs there.
    executor: usize,
    /// Its directory: segments and frontier files.
    dir: PathBuf,
    /// Where its files live (the disk, or a simulator in tests).
    storage: Rc<dyn Storage>,
    clock: Rc<dyn Clock>,
    /// The durable log.
    pub log: Rc<Log>,
    load: Cell<Load>,
    /// Notified when a load ends (successfully or not).
    loaded_event: event_listener::Event,
    /// This leadership's deduplication ids (None until its first deduplicated produce reads them from the log).
    dedup: RefCell<Option<dedup::DedupTable>>,
    /// Deduplicated produces are checked and appended one at a time.
    dedup_turn: turn::Turn,
    /// A FIFO topic's partition (fixed at creation): takes admit offsets to their message groups
    /// (`InFlight::admit`).
    fifo: bool,
    /// Bumped whenever the table is forgotten: a read of the log, or an append, that spans a change installs
    /// nothing.
    dedup_generation: Cell<u64>,
    /// Consumer groups by name.
    groups: RefCell<BTreeMap<String, Rc<Group>>>,
    /// Caps from the topic config.
    limits: Cell<Limits>,
    /// Redelivery policy from the topic config.
    redelivery: Cell<Redelivery>,
    /// Set when the partition is closed (topic deleted or shutdown): no file of it is written after this, since its
    /// directory may already belong to a new topic of the same name.
    closed: Cell<bool>,
    /// A follower replica is recording shipped frontiers (`frontier.rs`, `FollowTurn`); `followed` wakes the next.
    following: Cell<bool>,
    followed: event_listener::Event,
    /// Offsets lost below the durable frontier at recovery (the log ended before it): counted as corrupt-skipped.
    lost_below_frontier: Cell<u64>,
    /// Read failures per offset (I/O errors), for the offsets that failed recently.
    read_failures: RefCell<BTreeMap<u64, u32>>,
    /// The lowest nonce seed the next group shard may take (see `install_shard`).
    next_nonce_seed: Cell<u64>,
    /// A replicated partition's leader: the nonces it may issue (`nonces.rs`).
    nonce_window: Cell<nonces::NonceWindow>,
    /// Asks for a raise of its nonce ceiling; `raising_nonces` is set while one is under way.
    nonce_hook: RefCell<Option<nonces::NonceHook>>,
    raising_nonces: Cell<bool>,
    /// Notified when a raise ends, or the window opens or closes.
    nonces_moved: event_listener::Event,
    /// Tells the engine about newly deliverable offsets.
    wake: RefCell<Wake>,
    /// Monotonic counters.
    pub counters: Counters,
    /// A replicated partition's leader: how far each follower has it (kept by the shipper, `front/replicate.rs`).
    followers: RefCell<Vec<FollowerInfo>>,
    /// A replicated partition's leader: the commit offset and what it is computed from (`commit.rs`).
    commit: commit::Commit,
    /// The replica's durable epoch floor and nonce promises (`fence.rs`, `replica.epoch`): what its file holds.
    fence: Cell<crate::storage::epoch_floor::Fence>,
    /// A replica on a new disk, until a leader promotes it (`storage::learner`): a fencing round neither counts nor
    /// ranks it.
    learner: Cell<bool>,
    /// A raise of the floor is being written; `floor_raised` wakes the next.
    raising_floor: Cell<bool>,
    floor_raised: event_listener::Event,
    /// The replica's epoch history (`fence.rs`, `replica.epochs`): what its file holds.
    epochs: RefCell<crate::storage::epoch_history::EpochHistory>,
    /// A change of the history is being written; `epochs_written` wakes the next.
    writing_epochs: Cell<bool>,
    epochs_written: event_listener::Event,
}

/// Everything a partition needs to open.
pub struct PartitionSetup {
    pub storage: Rc<dyn Storage>,
    pub clock: Rc<dyn Clock>,
    pub dir: PathBuf,
    pub id: u32,
    pub core: usize,
    pub log_options: crate::storage::log::LogOptions,
    /// The core's journal link (None: the log syncs its own segments, or fsync never).
    pub journal: Option<crate::storage::log::JournalLink>,
    pub limits: Limits,
    pub redelivery: Redelivery,
    pub groups: Vec<String>,
    pub wake: Wake,
    /// Some(revision): if the partition's directory does not exist yet, it starts as a learner (`storage::learner`:
    /// this node's disk is not the one the cluster knew when the revision was read, and the topic is older).
    pub learner_if_new: Option<u64>,
    /// A FIFO topic's partition: at most one message of a message group is leased at a time.
    pub fifo: bool,
}

/// Bytes a delivery hands out: its body and its attributes (what a consume's byte budget counts).
fn delivered_bytes(payload: &Bytes, meta: &Option<Box<RecordMeta>>) -> usize {
    payload.len()
        + meta
            .as_ref()
            .map_or(0, |m| m.attributes.iter().map(|a| a.size()).sum())
}

/// Nonces a group's shard may issue before they could reach the next shard's range. 2^32.
const NONCE_RANGE_PER_SHARD: u64 = 1 << 32;

/// Leases reserved by a take that are not yet in the consumer's hands: if the take is dropped (its client went
/// away), they are released at once instead of staying invisible for their whole visibility.
/// Payload bytes a consume may still hand out (`max_batch_bytes` for one request, spent across its partitions,
/// cores and nodes): a record that would pass `left` is left for the next request, unless nothing was taken yet
/// (one record always goes, whatever its size: it is within `max_message_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteBudget {
    pub left: usize,
    pub taken_any: bool,
}

impl ByteBudget {
    pub fn unlimited() -> ByteBudget {
        ByteBudget {
            left: usize::MAX,
            taken_any: false,
        }
    }

    pub fn admits(&self, len: usize) -> bool {
        !self.taken_any || len <= self.left
    }

    pub fn spend(&mut self, len: usize) {
        self.left = self.left.saturating_sub(len);
        self.taken_any = true;
    }
}

struct Reserved<'a> {
    group: &'a Group,
    wake: Wake,
    now_ms: u64,
    handles: Vec<(u64, u64)>,
}

impl Reserved<'_> {
    fn forget(&mut self, offset: u64) {
        self.handles.retain(|&(o, _)| o != offset);
    }

    /// The leases reached the consumer (or its reply): keep them.
    fn keep(mut self) {
        self.handles.clear();
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if self.handles.is_empty() {
            return;
        }
        let handles = std::mem::take(&mut self.handles);
        let given = self
            .group
            .with_loaded(|s| s.give_back_batch(&handles, self.now_ms))
            .map_or(0, |r| r.iter().filter(|r| r.is_ok()).count());
        if given > 0 {
            (self.wake)(Some(&self.group.name), given);
        }
    }
}

impl Partition {
    /// Opens the partition's log (recovery runs here) and wires the wake-up for parked consumers.
    pub async fn open(setup: PartitionSetup) -> std::io::Result<Rc<Partition>> {
        // Before the log opens, so that a failed read leaves nothing running.
        if let Some(revision) = setup.learner_if_new {
            // No log there yet: no directory, or one a crash left before the log's first segment (with or without
            // a learner file, or its temp file): a replica that ever opened has a segment.
            let fresh = match setup.storage.list(&setup.dir) {
                Ok(names) => !names.iter().any(|n| n.ends_with(".log")),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => return Err(e),
            };
            if fresh {
                setup.storage.create_dir_all(&setup.dir)?;
                crate::storage::learner::write(&*setup.storage, &setup.dir, revision).await?;
                tracing::warn!(dir = %setup.dir.display(), "a replica on a new disk: a learner until its leader has caught it up");
            }
        }
        let learner = crate::storage::learner::read(&*setup.storage, &setup.dir)?;
        let fence = crate::storage::epoch_floor::read(&*setup.storage, &setup.dir)?;
        let epochs = crate::storage::epoch_history::read(&*setup.storage, &setup.dir)?;
        let log = Log::open_with(
            setup.storage.clone(),
            setup.clock.clone(),
            &setup.dir,
            setup.log_options,
            setup.journal.clone(),
        )
        .await?;
        log.fence_ships(fence.floor);
        let groups = setup
            .groups
            .iter()
            .map(|g| (g.clone(), Group::new(g, &setup.dir)))
            .collect();
        let partition = Rc::new(Partition {
            id: setup.id,
            core: setup.core,
            executor: glommio::executor().id(),
            dir: setup.dir,
            storage: setup.storage,
            clock: setup.clock,
            log,
            load: Cell::new(Load::Idle),
            loaded_event: event_listener::Event::new(),
            dedup: RefCell::new(None),
            dedup_turn: turn::Turn::default(),
            fifo: setup.fifo,
            dedup_generation: Cell::new(0),
            groups: RefCell::new(groups),
            limits: Cell::new(setup.limits),
            redelivery: Cell::new(setup.redelivery),
            closed: Cell::new(false),
            following: Cell::new(false),
            followed: event_listener::Event::new(),
            lost_below_frontier: Cell::new(0),
            read_failures: RefCell::new(BTreeMap::new()),
            next_nonce_seed: Cell::new(0),
            nonce_window: Cell::new(nonces::NonceWindow::default()),
            nonce_hook: RefCell::new(None),
            raising_nonces: Cell::new(false),
            nonces_moved: event_listener::Event::new(),
            wake: RefCell::new(setup.wake),
            counters: Counters::default(),
            followers: RefCell::new(Vec::new()),
            commit: commit::Commit::new(),
            fence: Cell::new(fence),
            learner: Cell::new(learner),
            raising_floor: Cell::new(false),
            floor_raised: event_listener::Event::new(),
            epochs: RefCell::new(epochs),
            writing_epochs: Cell::new(false),
            epochs_written: event_listener::Event::new(),
        });
        let weak = Rc::downgrade(&partition);
        partition.log.set_on_append(Box::new(move |n| {
            if let Some(p) = weak.upgrade() {
                p.leader_appended(n);
            }
        }));
        Ok(partition)
    }

    /// Every touch runs on the owning core's executor: the shards and the log are not shared.
    fn assert_owner(&self) {
        assert_eq!(
            glommio::executor().id(),
            self.executor,
            "partition {} of core {} touched from another executor",
            self.id,
            self.core
        );
    }

    /// Tells the engine that `n` offsets became deliverable for `group` (None: for every group).
    fn wake_consumers(&self, group: Option<&str>, n: usize) {
        let wake = self.wake.borrow().clone();
        wake(group, n);
    }

    /// Replaces the wake-up (a follower replica wakes no consumer; one that becomes the leader does).
    pub fn set_wake(&self, wake: Wake) {
        *self.wake.borrow_mut() = wake;
    }

    /// The group named `name`.
    pub fn group(&self, name: &str) -> Result<Rc<Group>, PartitionError> {
        self.groups
            .borrow()
            .get(name)
            .cloned()
            .ok_or_else(|| PartitionError::GroupNotFound(name.to_string()))
    }

    /// Loads the lease shards at the first touch: reads every group's frontier file from disk (a read error other
    /// than "not found" fails this touch with `Unavailable` and the next touch retries; a frontier is never
    /// guessed as 0), and if a durable frontier is beyond what recovery found in the log, moves the log's end up to
    /// it, so no offset a consumer may have settled is ever handed out again.
    pub async fn ensure_loaded(&self) -> Result<(), PartitionError> {
        self.assert_owner();
        // A deposed leader (a follower now, perhaps) loads nothing: its shards would stand in for the frontiers its
        // new leader ships.
        self.check_leading()?;
        loop {
            if self.is_loaded() {
                return Ok(());
            }
            match self.load.get() {
                Load::Idle => break,
                Load::Loading => {
                    let listener = self.loaded_event.listen();
                    if self.load.get() == Load::Loading {
                        listener.await;
                    }
                }
            }
        }
        if self.closed.get() {
            return Err(PartitionError::Closed);
        }
        self.load.set(Load::Loading);
        let result = self.load_shards().await;
        self.load.set(Load::Idle);
        self.loaded_event.notify(usize::MAX);
        result
    }

    /// Every group's shard is loaded.
    fn is_loaded(&self) -> bool {
        self.groups
            .borrow()
            .values()
            .all(|g| g.shard.borrow().is_some())
    }

    /// Adds a consumer group (created on the topic meanwhile). Its shard loads at the next touch, from its frontier
    /// file (written before the group is announced when it starts at the latest offset), else from the oldest
    /// retained offset.
    pub fn add_group(&self, name: &str) {
        self.groups
            .borrow_mut()
            .entry(name.to_string())
            .or_insert_with(|| Group::new(name, &self.dir));
    }

    /// Removes a consumer group: its shard goes (waiting out a running flush) and so does its frontier file.
    pub async fn remove_group(&self, name: &str) {
        let Some(g) = self.groups.borrow_mut().remove(name) else {
            return;
        };
        // Nothing left to write in it (a checkpoint may hold it still): no shard, no shipped value.
        *g.shard.borrow_mut() = None;
        g.frontier.replica.set(None);
        g.frontier.replica_acked.borrow_mut().clear();
        g.frontier.wait_flush().await;
        if !self.closed.get() {
            if let Err(e) = self.storage.remove(&g.frontier.path).await {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(file = %g.frontier.path.display(), error = %e, "cannot remove a deleted group's frontier file");
                }
            }
        }
    }

    async fn load_shards(&self) -> Result<(), PartitionError> {
        // A frontier file write still under way from an earlier leadership lands first: with no shard yet it raises
        // the replica's value (`flush_group`), which the shards load from below. Loaded before it landed, a shard
        // would start below that write, which would then mark the file flushed above it (the next flush's
        // assertion, and its acked offsets delivered again).
        self.wait_flushes().await;
        let groups: Vec<Rc<Group>> = self
            .groups
            .borrow()
            .values()
            .filter(|g| g.shard.borrow().is_none())
            .cloned()
            .collect();
        let mut stored = Vec::with_capacity(groups.len());
        for g in &groups {
            let value = frontier::read_value(&*self.storage, &g.frontier.path).map_err(|e| {
                error!(file = %g.frontier.path.display(), error = %e, "cannot read a frontier file: the partition answers 503 until it can");
                PartitionError::Unavailable(format!("cannot read its frontier: {e}"))
            })?;
            stored.push(value);
        }
        // A replica that followed before it led: the frontiers its leader shipped (durable in its journal) may be
        // ahead of its files.
        let known = |g: &Group, stored: &frontier::FrontierValue| {
            let mut known = stored.clone();
            if let Some(replica) = g.frontier.replica.get() {
                known.merge(&frontier::FrontierValue {
                    committed: replica,
                    acked: g.frontier.replica_acked.borrow().clone(),
                });
            }
            known
        };
        let known: Vec<frontier::FrontierValue> = groups
            .iter()
            .zip(&stored)
            .map(|(g, s)| known(g, s))
            .collect();
        let highest = known.iter().map(|k| k.committed).max().unwrap_or(0);
        // A durable frontier covers only what was served, so committed.
        self.committed_at_least(highest);
        let recovered_end = self.log.end_offset();
        if highest > recovered_end {
            self.log.skip_to(highest).await.map_err(|e| {
                error!(dir = %self.dir.display(), error = %e, "cannot move the log end up to the durable frontier");
                PartitionError::Unavailable(format!("cannot move the log to its frontier: {e}"))
            })?;
            self.lost_below_frontier.set(highest - recovered_end);
        }
        // Acks above a frontier were of served records too, those below the log's end: under `fsync never` a crash
        // may have lost the rest, and offsets there are new records to come. A file that holds acks at or above the
        // end is written without them before anything is appended (this runs before the first append), so that no
        // later restart takes a new record for one settled.
        let end = self.log.end_offset();
        for (i, g) in groups.iter().enumerate() {
            if stored[i].settled_end() <= end {
                continue;
            }
            let mut clipped = stored[i].clone();
            clipped.acked.retain_mut(|r| {
                r.1 = r.1.min(end);
                r.0 < r.1
            });
            frontier::write_value(&*self.storage, &g.frontier.path, &clipped)
                .await
                .map_err(|e| {
                    error!(file = %g.frontier.path.display(), error = %e, "cannot write a frontier file without the acks past the log's end: the partition answers 503 until it can");
                    PartitionError::Unavailable(format!("cannot write its frontier: {e}"))
                })?;
            warn!(file = %g.frontier.path.display(), end, "acks above the frontier past the log's end (records a crash lost) were dropped from the frontier file");
            stored[i] = clipped;
        }
        let known: Vec<frontier::FrontierValue> = known
            .into_iter()
            .map(|mut k| {
                k.acked.retain_mut(|r| {
                    r.1 = r.1.min(end);
                    r.0 < r.1
                });
                k
            })
            .collect();
        let acked_end = known
            .iter()
            .map(|k| k.settled_end().min(end))
            .max()
            .unwrap_or(0);
        self.committed_at_least(acked_end);
        for ((g, stored), known) in groups.iter().zip(stored).zip(known) {
            self.install_shard(g, stored, known);
        }
        Ok(())
    }

    /// Waits out a load of the shards under way.
    pub(super) async fn wait_load(&self) {
        while self.load.get() == Load::Loading {
            let loaded = self.loaded_event.listen();
            if self.load.get() == Load::Loading {
                loaded.await;
            }
        }
    }

    /// Seeds a group's shard at its durable frontier `known`, with the acks above it that `known` holds (its file
    /// holds `stored`; never below the oldest retained offset).
    fn install_shard(
        &self,
        g: &Group,
        stored: frontier::FrontierValue,
        known: frontier::FrontierValue,
    ) {
        let (start, end) = (self.log.start_offset(), self.log.end_offset());
        let mut seeded = known.clone();
        seeded.merge(&frontier::FrontierValue::at(start));
        let committed = seeded.committed;
        // Retention removed what this group had not settled while it was not loaded: counted as it would be live
        // (acked offsets it passed were settled already).
        let acked_below = known
            .acked
            .iter()
            .map(|&(s, e)| e.min(committed).saturating_sub(s))
            .sum::<u64>();
        bump(
            &g.counters.retention_skipped,
            (committed - known.committed).saturating_sub(acked_below),
        );
        assert!(
            committed <= end,
            "frontier {committed} beyond the log end {end}"
        );
        g.frontier.flushed.set(stored.committed);
        g.frontier.acks_journaled.set(0);
        g.frontier.shard_gen.set(g.frontier.shard_gen.get() + 1);
        g.frontier.file_known.set(true);
        // Nonces are seeded from the wall clock (µs « 8) so handles from before a restart never match, and each
        // group's shard starts 2^32 above the previous one's, so groups loaded in the same instant never share a
        // nonce (a handle is valid only in the group that leased it).
        // A replicated partition's groups draw from its leader's window instead (`nonces.rs`): continuing from the
        // last nonce issued, whatever the group.
        let nonce_seed = if self.replicated() {
            self.nonce_window.get().issued
        } else {
            let nonce_seed = self.wall_nonce_seed().max(self.next_nonce_seed.get());
            self.next_nonce_seed
                .set(nonce_seed.saturating_add(NONCE_RANGE_PER_SHARD));
            nonce_seed
        };
        let mut shard = InFlight::new(committed, nonce_seed, self.limits.get());
        if !crate::planted::planted(crate::planted::Bug::AcksNotSeeded) {
            shard.seed_acked(&seeded.acked, end);
        }
        // The file holds the shard's ranges (its version now) unless the seeding took others than it holds.
        let in_file = shard.acked_ranges() == stored.acked;
        g.frontier.acks_flushed.set(if in_file {
            shard.acked_version()
        } else {
            u64::MAX
        });
        *g.frontier.flushed_acked.borrow_mut() = stored.acked;
        shard.set_redelivery(self.redelivery.get());
        *g.shard.borrow_mut() = Some(shard);
    }

    /// Applies new caps and redelivery policy (a topic change) to every group.
    pub fn set_policy(&self, limits: Limits, redelivery: Redelivery) {
        self.limits.set(limits);
        self.redelivery.set(redelivery);
        for g in self.groups.borrow().values() {
            g.with_loaded(|s| {
                s.set_limits(limits);
                s.set_redelivery(redelivery);
            });
        }
    }

    /// Leases up to `max` deliverable messages of `group` in one pass over its shard, then reads them. Corrupt
    /// records are skipped, counted and logged (one line per run); a record that fails to read is released,
    /// counted, and after `MAX_READ_FAILURES` treated as corrupt.
    pub async fn take(
        &self,
        group: &str,
        max: usize,
        visibility_ms: u64,
    ) -> Result<Taken, PartitionError> {
        self.take_within(group, max, &mut ByteBudget::unlimited(), visibility_ms)
            .await
    }

    /// `take`, handing out no more payload bytes than `budget` has left (spent as records are taken): a record that
    /// would pass it is given back at once (deliverable again, not counted as a delivery) with the rest of its
    /// batch, and the take stops (`Stop::Budget`).
    pub async fn take_within(
        &self,
        group: &str,
        max: usize,
        budget: &mut ByteBudget,
        visibility_ms: u64,
    ) -> Result<Taken, PartitionError> {
        let lapsed = Cell::new(false);
        let taken = self
            .take_leased(group, max, budget, visibility_ms, &lapsed)
            .await?;
        if !lapsed.get() || !taken.deliveries.is_empty() {
            return Ok(taken);
        }
        // Its lease ran out while the take was under way (the loads, nonces and reads before its leases may
        // await: a new leadership's first nonces wait for a round that waits out a replica that does not
        // answer): asked for again, once, outside the take (a replica that starts following waits for takes
        // under way, not for this), and the take runs again if it holds.
        if let Err(no) = self.await_lease().await {
            return Ok(self.without_lease(no));
        }
        self.take_leased(group, max, budget, visibility_ms, &Cell::new(false))
            .await
    }

    /// [`Partition::take_within`], once: `lapsed` is set when the lease held at its start and ran out under way.
    async fn take_leased(
        &self,
        group: &str,
        max: usize,
        budget: &mut ByteBudget,
        visibility_ms: u64,
        lapsed: &Cell<bool>,
    ) -> Result<Taken, PartitionError> {
        // A replicated leader takes only under its lease (`lease.rs`): waited for, if need be, before the take
        // counts as under way (a replica that starts following waits for takes under way).
        if self.check_leading().is_ok() {
            if let Err(no) = self.await_lease().await {
                return Ok(self.without_lease(no));
            }
        }
        let _serving = commit::Serving::start(&self.commit);
        match self
            .ensure_loaded()
            .await
            .and_then(|()| self.check_leading())
        {
            Ok(()) => {}
            Err(PartitionError::Unavailable(why)) => {
                return Ok(Taken {
                    deliveries: Vec::new(),
                    stop: Some(Stop::Unavailable),
                    why: Some(why),
                    deferred: false,
                    retry_in_ms: None,
                })
            }
            Err(e) => return Err(e),
        }
        let g = self.group(group)?;
        // FIFO: one take of the group at a time, so that offsets are admitted to their message groups in the order
        // they were leased (a group's first unsettled offset read is its head).
        let _fifo_turn = match self.fifo {
            true => Some(g.fifo_turn.take().await),
            false => None,
        };
        // The group may have been deleted while this take waited (its shard gone).
        let gone = || PartitionError::GroupNotFound(group.to_string());
        if g.with_loaded(|_| ()).is_none() {
            return Err(gone());
        }
        let mut taken = Taken::default();
        let mut leases: Vec<Lease> = Vec::with_capacity(max.min(64));
        let mut ahead = ReadAhead::default();
        let mut now = self.clock.now_ms();
        let mut reserved = Reserved {
            group: &g,
            wake: self.wake.borrow().clone(),
            now_ms: now,
            handles: Vec::new(),
        };
        let released = g.with(|s| s.purge_expired(now));
        self.note_released(&g, released);
        // The wall clock, read once and only when a record carries a delivery time (most carry none).
        let wall = Cell::new(0u64);
        let wall_now = || {
            if wall.get() == 0 {
                wall.set(self.clock.wall_ms());
            }
            wall.get()
        };
        // Leases of delayed produces found at read: (offset, nonce, deliverable at, monotonic ms).
        let mut deferred: Vec<(u64, u64, u64)> = Vec::new();
        // The first round leases at the time read above (nothing awaited since).
        let mut again = false;
        while taken.deliveries.len() < max {
            // A take that goes round again (reads that awaited, held FIFO messages) leases from the time now.
            if std::mem::replace(&mut again, true) {
                now = self.clock.now_ms();
                reserved.now_ms = now;
            }
            let end = self.readable_end();
            let want = max - taken.deliveries.len();
            leases.clear();
            // A replicated partition's nonces come from its window, in order whatever the group (`nonces.rs`).
            let window = match self.replicated() {
                true => Some(self.wait_nonces(want).await),
                false => None,
            };
            if let Some(issued) = window {
                let Some(issued) = issued else {
                    taken.stop = Some(Stop::Unavailable);
                    taken.why = Some(format!(
                        "partition {}: a majority of its replicas has not promised its receipt-handle nonces yet (a new leadership; docs/replication.md)",
                        self.id
                    ));
                    break;
                };
                if g.with_loaded(|_| ()).is_none() {
                    // Deleted while the nonces were waited for.
                    reserved.handles.clear();
                    return Err(gone());
                }
                g.with(|s| s.raise_nonce_floor(issued));
            }
            // Under the lease at the moment the leases are taken (the loads, nonces and reads before may have
            // awaited; one that ran out meanwhile is asked for again by `take_within`, outside the take).
            // (Only a replicated partition reads it, and only it waited for its nonces.)
            let lease_now = match window {
                Some(_) => self.clock.now_ms(),
                None => now,
            };
            if let Err(no) = self.lease_holds(lease_now) {
                lapsed.set(no == lease::NoLease::Lapsed);
                let without = self.without_lease(no);
                (taken.stop, taken.why, taken.retry_in_ms) =
                    (without.stop, without.why, without.retry_in_ms);
                break;
            }
            let stop = g.with(|s| s.reserve_batch(end, now, visibility_ms, want, &mut leases));
            if window.is_some() {
                self.nonces_issued(g.with(|s| s.nonce_high_water()));
            }
            reserved
                .handles
                .extend(leases.iter().map(|l| (l.offset, l.nonce)));
            let mut short = false;
            // Leases past the byte budget: given back once the batch is read.
            let mut over: Vec<(u64, u64)> = Vec::new();
            // FIFO: a lease given back unread; the rest of the batch is given back too (not admitted before it).
            let mut unread = false;
            let until = leases.iter().map(|l| l.offset + 1).max().unwrap_or(0);
            for lease in &leases {
                if !over.is_empty() || unread {
                    over.push((lease.offset, lease.nonce));
                    continue;
                }
                let read = self.read_leased(&g, lease, end, until, &mut ahead).await;
                if g.with_loaded(|_| ()).is_none() {
                    // Deleted during the read: its leases went with its shard.
                    reserved.handles.clear();
                    return Err(gone());
                }
                if let Ok((_, Some(meta), _)) = &read {
                    if let (true, Some(key)) = (self.fifo, meta.group_key.as_deref()) {
                        match g.with(|s| s.admit(lease.offset, lease.nonce, key)) {
                            Ok(true) => {}
                            // Held behind an unsettled message of its group: not delivered.
                            Ok(false) => {
                                reserved.forget(lease.offset);
                                short = true;
                                continue;
                            }
                            // Its lease ended while it was read (expired, or settled by a guessed handle): it
                            // still takes its place in its group, and the rest of the batch is given back, so
                            // that no later message of the group goes before it.
                            Err(_) => {
                                g.with(|s| s.admit_released(lease.offset, key));
                                reserved.forget(lease.offset);
                                short = true;
                                unread = true;
                                continue;
                            }
                        }
                    }
                }
                match read {
                    Ok((_, Some(meta), _))
                        if meta.not_before_ms > 0 && meta.not_before_ms > wall_now() =>
                    {
                        // A delayed produce: not delivered, and deliverable once its time comes.
                        reserved.forget(lease.offset);
                        // Bounded: a clock stepped back (or another node's clock ahead) delays it at most the
                        // longest delay per take.
                        let wait = (meta.not_before_ms - wall_now())
                            .min(crate::storage::meta::MAX_DELAY_MS);
                        let ready = now.saturating_add(wait);
                        deferred.push((lease.offset, lease.nonce, ready));
                        short = true;
                    }
                    Ok((payload, meta, _)) if !budget.admits(delivered_bytes(&payload, &meta)) => {
                        over.push((lease.offset, lease.nonce));
                    }
                    Ok((payload, meta, sent_ms)) => {
                        budget.spend(delivered_bytes(&payload, &meta));
                        bump(&g.counters.delivered, 1);
                        if lease.delivery_count > 1 {
                            bump(&g.counters.redelivered, 1);
                        }
                        taken.deliveries.push(Delivery {
                            partition: self.id,
                            offset: lease.offset,
                            nonce: lease.nonce,
                            delivery_count: lease.delivery_count,
                            expires_at_ms: lease.expires_at_ms,
                            sent_ms,
                            payload,
                            meta,
                        });
                    }
                    Err(settled) => {
                        reserved.forget(lease.offset);
                        short = true;
                        unread = self.fifo;
                        if settled == Stop::Unavailable {
                            taken.stop = Some(Stop::Unavailable);
                            taken.why = Some(format!(
                                "partition {}: a record failed to read (retried; see the server log)",
                                self.id
                            ));
                        }
                    }
                }
            }
            if !deferred.is_empty() {
                // Counted, not asserted, as `over` below: a lease may have been settled while the batch was read.
                g.with(|s| s.defer_batch(&deferred, now));
                deferred.clear();
                taken.deferred = true;
            }
            if !over.is_empty() {
                for &(offset, _) in &over {
                    reserved.forget(offset);
                }
                // Counted, not asserted: while the batch was read (an await), a lease may have been settled with
                // a guessed handle, given back by a peer, or expired and been taken again; that one is not ours
                // to give back any more.
                let given = g
                    .with(|s| s.give_back_batch(&over, now))
                    .iter()
                    .filter(|r| r.is_ok())
                    .count();
                if given > 0 {
                    self.wake_consumers(Some(&g.name), given);
                }
                if taken.stop.is_none() {
                    taken.stop = Some(match unread {
                        true => Stop::Empty,
                        false => Stop::Budget,
                    });
                }
                break;
            }
            if taken.stop == Some(Stop::Unavailable) {
                break;
            }
            match stop {
                ReserveStop::Max if short => continue,
                ReserveStop::Max => taken.stop = Some(Stop::Max),
                ReserveStop::Empty => taken.stop = Some(Stop::Empty),
                ReserveStop::AtCap => taken.stop = Some(Stop::AtCap),
            }
            break;
        }
        reserved.keep();
        self.note_moved(&g);
        Ok(taken)
    }

    /// Reads one leased record. On failure the lease is settled or released here and the reason returned:
    /// `Empty` for a skipped or vanished record (look further), `Unavailable` for a read error.
    /// The batch reads on up to `until` (see `Log::read_ahead`).
    async fn read_leased(
        &self,
        g: &Group,
        lease: &Lease,
        end: u64,
        until: u64,
        ahead: &mut ReadAhead,
    ) -> Result<(Bytes, Option<Box<RecordMeta>>, u64), Stop> {
        let now = self.clock.now_ms();
        match self.log.read_ahead(lease.offset, until, ahead).await {
            Ok(Record {
                payload,
                meta,
                timestamp_ms,
                ..
            }) => {
                // Failures count only while consecutive: a record that reads is forgiven.
                if !self.read_failures.borrow().is_empty() {
                    self.read_failures.borrow_mut().remove(&lease.offset);
                }
                Ok((payload, meta, timestamp_ms))
            }
            Err(ReadError::Corrupt) => {
                let run_end = self
                    .log
                    .corrupt_run_end(lease.offset)
                    .unwrap_or(lease.offset + 1)
                    .min(end);
                error!(dir = %self.dir.display(), from = lease.offset, to = run_end, "skipping corrupt records from..to: they will never be delivered");
                g.with(|s| s.skip_corrupt_run(lease.offset, lease.nonce, run_end));
                self.wake_promoted(g);
                // A long run must not hold the core.
                futures_lite::future::yield_now().await;
                Err(Stop::Empty)
            }
            Err(ReadError::OutOfRetention { start }) => {
                self.retention_skip(g, start);
                Err(Stop::Empty)
            }
            Err(ReadError::NotYet) => {
                g.with(|s| s.give_back_batch(&[(lease.offset, lease.nonce)], now));
                Err(Stop::Empty)
            }
            Err(ReadError::Io(e)) => {
                bump(&self.counters.read_errors, 1);
                let failures = {
                    let mut map = self.read_failures.borrow_mut();
                    let n = map.entry(lease.offset).or_insert(0);
                    *n += 1;
                    *n
                };
                if failures >= MAX_READ_FAILURES {
                    error!(dir = %self.dir.display(), offset = lease.offset, failures, error = %e, "a record failed to read too many times: skipping it as corrupt, it will never be delivered");
                    self.read_failures.borrow_mut().remove(&lease.offset);
                    g.with(|s| s.skip_corrupt(lease.offset, lease.nonce));
                    self.wake_promoted(g);
                    return Err(Stop::Empty);
                }
                warn!(dir = %self.dir.display(), offset = lease.offset, failures, error = %e, "a record failed to read: released for a retry");
                let given = g
                    .with(|s| s.give_back_batch(&[(lease.offset, lease.nonce)], now))
                    .iter()
                    .filter(|r| r.is_ok())
                    .count();
                // Deliverable again: a consumer parked meanwhile takes it (and retries the read) rather than sleeping
                // out its wait.
                if given > 0 {
                    self.wake_consumers(Some(&g.name), given);
                }
                Err(Stop::Unavailable)
            }
        }
    }

    /// Moves a group's frontier over what retention removed, counting what it had not settled.
    fn retention_skip(&self, g: &Group, start: u64) {
        let (skipped, promoted) = g.with(|s| {
            let before = s.committed();
            s.advance_to(start);
            (start.saturating_sub(before), s.take_promoted())
        });
        bump(&g.counters.retention_skipped, skipped);
        self.note_moved(g);
        // FIFO: a group whose head retention removed lets its next message out.
        if promoted > 0 {
            self.wake_consumers(Some(&g.name), promoted);
        }
    }

    /// FIFO: wakes a consumer for each held message that became deliverable (its group's head settled).
    fn wake_promoted(&self, g: &Group) {
        let promoted = g.with(|s| s.take_promoted());
        if promoted > 0 {
            self.wake_consumers(Some(&g.name), promoted);
        }
    }

    fn note_released(&self, g: &Group, released: usize) {
        if released > 0 {
            bump(&g.counters.expired, released as u64);
            self.wake_consumers(Some(&g.name), released);
        }
    }

    /// Acks, nacks or extends the leases `(offset, nonce)` of `group`, each exactly as alone would; an ack batch
    /// advances the frontier once. The outer error fails the whole batch (the partition cannot be served).
    /// Gives back leases that never reached a consumer (the reply to the core that asked was lost): deliverable
    /// again at once, their deliveries not counted; waiters woken.
    pub fn give_back(&self, group: &str, items: &[(u64, u64)]) {
        let Ok(g) = self.group(group) else {
            return;
        };
        let now = self.clock.now_ms();
        let given = g
            .with_loaded(|s| s.give_back_batch(items, now))
            .map_or(0, |r| r.iter().filter(|r| r.is_ok()).count());
        if given > 0 {
            self.wake_consumers(Some(&g.name), given);
        }
    }

    pub async fn settle(
        &self,
        group: &str,
        items: &[(u64, u64)],
        op: SettleOp,
    ) -> Result<Vec<Result<(), PartitionError>>, PartitionError> {
        self.ensure_loaded().await?;
        self.check_leading()?;
        let g = self.group(group)?;
        let now = self.clock.now_ms();
        let released = g.with(|s| s.purge_expired(now));
        self.note_released(&g, released);
        let at_cap_before = g.with(|s| self.at_cap(s));
        let results: Vec<Result<(), PartitionError>> = match op {
            SettleOp::Ack => g.with(|s| s.ack_batch(items, now)),
            SettleOp::Nack(delay) => g.with(|s| s.nack_batch(items, now, delay)),
            SettleOp::Extend(visibility) => g
                .with(|s| s.extend_batch(items, now, visibility))
                .into_iter()
                .map(|r| r.map(|_| ()))
                .collect(),
        }
        .into_iter()
        .map(|r| r.map_err(PartitionError::from))
        .collect();
        self.note_moved(&g);
        let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        let gone = results
            .iter()
            .filter(|r| **r == Err(PartitionError::LeaseGone))
            .count() as u64;
        bump(&g.counters.lease_gone, gone);
        match op {
            SettleOp::Ack => bump(&g.counters.acked, ok),
            SettleOp::Nack(_) => bump(&g.counters.nacked, ok),
            SettleOp::Extend(_) => bump(&g.counters.extended, ok),
        }
        // Released offsets that are deliverable now, or a capped partition with room again, wake consumers.
        let released_now = g.with(|s| s.purge_expired(now));
        let end = self.readable_end();
        let freed = at_cap_before && !g.with(|s| self.at_cap(s)) && self.has_deliverable(group);
        let wake = match op {
            SettleOp::Nack(_) => released_now + usize::from(freed),
            _ => released_now + usize::from(freed && end > 0),
        };
        let nacked_now = match op {
            SettleOp::Nack(Some(0)) => ok as usize,
            SettleOp::Nack(None) if self.redelivery.get().delay_ms == 0 => ok as usize,
            _ => 0,
        };
        // FIFO: a settled message lets the next of its group out.
        let promoted = g.with(|s| s.take_promoted());
        if wake + nacked_now + promoted > 0 {
            self.wake_consumers(Some(group), wake + nacked_now + promoted);
        }
        Ok(results)
    }

    fn at_cap(&self, s: &InFlight) -> bool {
        s.unsettled_count() >= self.limits.get().max_in_flight
    }

    /// Settles a dead-lettered lease (its record is already in the dead-letter topic) and counts it; never refused
    /// for a full acked-ahead set (a poison message above the frontier must not wedge the partition).
    pub async fn dead_lettered(
        &self,
        group: &str,
        offset: u64,
        nonce: u64,
    ) -> Result<(), PartitionError> {
        self.ensure_loaded().await?;
        self.check_leading()?;
        let g = self.group(group)?;
        let now = self.clock.now_ms();
        let released = g.with(|s| s.purge_expired(now));
        self.note_released(&g, released);
        let at_cap_before = g.with(|s| self.at_cap(s));
        g.with(|s| s.ack_dead_letter(offset, nonce, now))?;
        self.note_moved(&g);
        bump(&g.counters.dead_lettered, 1);
        let promoted = g.with(|s| s.take_promoted());
        let freed = at_cap_before && !g.with(|s| self.at_cap(s)) && self.has_deliverable(group);
        if promoted + usize::from(freed) > 0 {
            self.wake_consumers(Some(group), promoted + usize::from(freed));
        }
        Ok(())
    }

    /// Purges a group: everything appended (and served) so far is settled for it at once, leased, delayed and held
    /// messages included: its frontier moves to the end as retention would move it, and the handles of its leases
    /// are gone. Returns how many messages were unsettled (the acked-ahead ones were settled already) and the
    /// frontier it set; the caller makes it durable (`ops::groups::purge`: the core's journal, which also ships it
    /// to a replicated partition's followers, or the file).
    pub async fn purge_group(&self, group: &str) -> Result<(u64, u64), PartitionError> {
        self.ensure_loaded().await?;
        self.check_leading()?;
        let g = self.group(group)?;
        let end = self.readable_end();
        let purged = g.with(|s| {
            let unsettled = end
                .saturating_sub(s.committed())
                .saturating_sub(s.acked_ahead() as u64);
            s.advance_to(end);
            // Nothing of a group is left to promote: its held offsets were below `end`.
            s.take_promoted();
            unsettled
        });
        self.note_moved(&g);
        Ok((purged, end))
    }

    /// Releases expired leases and due delays of every group (the background timer), waking each group's consumers
    /// for what became deliverable.
    pub fn purge(&self, now: u64) {
        self.assert_owner();
        for g in self.groups.borrow().values() {
            let released = g.with_loaded(|s| s.purge_expired(now)).unwrap_or(0);
            self.note_released(g, released);
        }
    }

    /// Earliest lease deadline or delayed release over the loaded groups.
    pub fn next_wakeup_ms(&self) -> Option<u64> {
        self.groups
            .borrow()
            .values()
            .filter_map(|g| g.with_loaded(|s| s.next_wakeup_ms()).flatten())
            .min()
    }

    /// Appends records with consecutive offsets, in one write and one sync; resolves with the first offset once
    /// durable. The first touch loads the frontiers first, so an append never takes an offset below a durable
    /// frontier.
    pub async fn append(&self, payloads: Vec<Bytes>) -> Result<u64, PartitionError> {
        self.append_records(payloads, Vec::new()).await
    }

    /// `append`, where `meta[i]` says whether `payloads[i]` starts with a record meta block (empty: none does).
    pub async fn append_records(
        &self,
        payloads: Vec<Bytes>,
        meta: Vec<bool>,
    ) -> Result<u64, PartitionError> {
        self.check_leading()?;
        self.ensure_loaded().await?;
        self.check_leading()?;
        Ok(self.log.append_records(payloads, meta).await?)
    }

    /// Reads a record for replay, without touching leases.
    pub async fn replay(&self, offset: u64) -> Result<Option<Record>, PartitionError> {
        self.assert_owner();
        if offset >= self.readable_end() && self.replicated() {
            // Not committed yet (or not written): as past the end.
            return Ok(None);
        }
        match self.log.read(offset).await {
            Ok(record) => Ok(Some(record)),
            Err(ReadError::NotYet) => Ok(None),
            Err(ReadError::OutOfRetention { start }) => {
                Err(PartitionError::OutOfRetention { start })
            }
            Err(ReadError::Corrupt) => Err(PartitionError::Corrupt {
                partition: self.id,
                offset,
            }),
            Err(ReadError::Io(e)) => Err(PartitionError::Storage(e.to_string())),
        }
    }

    /// Applies retention and moves every group's frontier over what it removed (counting what a group had not
    /// settled: retention does not wait for groups). A replicated leader keeps every segment holding records at or
    /// above its commit offset (and, before its round's commit settles, everything above its log's start): a
    /// record is removed only once a majority holds it.
    pub async fn apply_retention(&self, retention_ms: u64) {
        if self.closed.get() {
            return;
        }
        let keep_from = if self.replicated() && self.deposed().is_none() {
            self.readable_end()
        } else {
            u64::MAX
        };
        let start = self
            .log
            .apply_retention(self.clock.wall_ms(), retention_ms, keep_from)
            .await;
        for g in self.groups.borrow().values() {
            if g.shard.borrow().is_some() {
                self.retention_skip(g, start);
            }
        }
    }

    /// Graceful close (shutdown): flushes the frontiers (waiting out running flushes), then closes the log.
    /// Returns whether every group's frontier file now holds its frontier (false: a write failed, and the core's
    /// journal must stay for the replay, which holds the newer values).
    pub async fn close(&self) -> bool {
        self.wait_flushes().await;
        self.flush_frontiers().await;
        let written = self.groups.borrow().values().all(|g| {
            g.frontier_value()
                .is_none_or(|c| c == g.frontier.flushed.get())
        });
        self.closed.set(true);
        self.wake_commit_waiters();
        self.wait_fence_writes().await;
        self.log.close().await;
        written
    }

    /// Close for a deleted topic: nothing more is written to its files (running flushes are waited out, no new one
    /// starts), then the log closes.
    pub async fn close_deleted(&self) {
        self.closed.set(true);
        self.wake_commit_waiters();
        self.wait_flushes().await;
        // A floor or history write already under way ends before the directory can be reused.
        self.wait_fence_writes().await;
        self.log.close().await;
    }

    /// Is anything deliverable to `group` right now (cheap; the shard is not loaded by this check)?
    pub fn has_deliverable(&self, group: &str) -> bool {
        let end = self.readable_end();
        let Ok(g) = self.group(group) else {
            return false;
        };
        g.with_loaded(|s| {
            s.has_deliverable(end) && s.unsettled_count() < self.limits.get().max_in_flight
        })
        .unwrap_or(end > self.log.start_offset())
    }

    /// Whether a take in `group` now could lease something, without taking: `Some(false)` = nothing to deliver,
    /// `Some(true)` = at its `max_in_flight`, `None` = maybe (deliverable, not loaded yet, or a lease or delay due:
    /// only a take knows). Lets a consume skip idle partitions at the cost of a map lookup.
    pub fn idle(&self, group: &str, now_ms: u64) -> Option<bool> {
        let end = self.readable_end();
        let g = self.group(group).ok()?;
        let max_in_flight = self.limits.get().max_in_flight;
        g.with_loaded(|s| {
            if s.next_expiry_ms().is_some_and(|at| at <= now_ms) {
                return None;
            }
            if !s.has_deliverable(end) {
                Some(false)
            } else if s.unsettled_count() >= max_in_flight {
                Some(true)
            } else {
                None
            }
        })
        .flatten()
    }

    /// The lease shard of `group`, for a test's failure report.
    #[cfg(test)]
    pub fn debug_shard(&self, group: &str) -> String {
        self.group(group)
            .ok()
            .and_then(|g| g.with_loaded(|s| format!("{s:?}")))
            .unwrap_or_default()
    }

    /// The committed frontier of `group`, if its shard is loaded.
    pub fn committed(&self, group: &str) -> Option<u64> {
        self.group(group).ok()?.with_loaded(|s| s.committed())
    }

    /// The frontier of `group` known durable (in its file or the journal), if its shard is loaded.
    pub fn durable_frontier(&self, group: &str) -> Option<u64> {
        let g = self.group(group).ok()?;
        g.with_loaded(|_| g.frontier.durable())
    }

    /// [`Partition::durable_frontier`] with the acked-ahead ranges known durable beside it (in its file or its
    /// journal): what a restart starts the group from.
    pub fn durable_acked(&self, group: &str) -> Option<frontier::FrontierValue> {
        let g = self.group(group).ok()?;
        g.with_loaded(|_| g.frontier.durable_value())
    }

    /// Whether this partition has group `group` (loaded or not).
    pub fn has_group(&self, group: &str) -> bool {
        self.groups.borrow().contains_key(group)
    }

    /// Group names on this partition.
    pub fn group_names(&self) -> Vec<String> {
        self.groups.borrow().keys().cloned().collect()
    }
}

#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod tests;
