//! A partition: its log, its in-flight lease shard and its frontier file, owned by exactly one core.
//! The broker on that core calls in; other cores reach it only through that broker over the mesh.

pub mod frontier;
pub mod inflight;

use crate::broker::error::{BrokerError, BrokerResult};
use crate::storage::backend::Storage;
use crate::storage::log::{AppendError, Log, ReadError, Record};
use bytes::Bytes;
use inflight::{InFlight, Limits, Reserve, SettleError};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tracing::{error, warn};

/// Wakes the topic's parked consumers (on every core) with the number of newly deliverable offsets.
pub type Wake = Rc<dyn Fn(usize)>;

/// A leased message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub partition: u32,
    pub offset: u64,
    pub nonce: u64,
    pub payload: Bytes,
}

/// How a lease is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOp {
    Ack,
    Nack,
    /// Re-arm the expiry to now + this many ms (None: the lease's own length).
    Extend(Option<u64>),
}

/// Result of trying to lease from one partition (or from all of a core's partitions of a topic).
#[derive(Debug)]
pub enum Take {
    Leased(Delivery),
    /// Nothing deliverable (on at least one partition below its cap).
    Empty,
    /// Something is deliverable, but every partition tried is at its in-flight cap.
    AtCap,
    /// The core owns no partition of the topic.
    NoPartitions,
    /// A partition could not be served now (its frontier or a record could not be read); counted and logged,
    /// and tried again at the next touch.
    Unavailable,
}

/// Per-partition counters (monotonic) for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub produced: Cell<u64>,
    pub delivered: Cell<u64>,
    pub acked: Cell<u64>,
    pub nacked: Cell<u64>,
    pub extended: Cell<u64>,
    pub expired: Cell<u64>,
    pub lease_gone: Cell<u64>,
    pub read_errors: Cell<u64>,
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

/// What `GET /topics/{topic}` shows per partition, and what `/metrics` exports.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionInfo {
    pub partition: u32,
    pub core: usize,
    pub start_offset: u64,
    pub end_offset: u64,
    pub committed: u64,
    pub in_flight: usize,
    pub acked_ahead: usize,
    pub corrupt_skipped: u64,
    #[serde(skip)]
    pub counters: [u64; 8],
    /// (append batches, fdatasyncs) of its log.
    #[serde(skip)]
    pub io_counts: (u64, u64),
}

/// How many times a record may fail to read (an I/O error, not a failed check) before it is treated as corrupt.
pub const MAX_READ_FAILURES: u32 = 3;

/// Where the lease shard stands: loaded lazily at the first touch, from the frontier file on disk.
enum ShardSlot {
    /// Not touched yet (or the last load failed and will be retried).
    Unloaded,
    /// A touch is reading the frontier; others wait for `loaded_event`.
    Loading,
    Loaded(InFlight),
}

/// One partition on its owning core.
pub struct Partition {
    /// Partition number within its topic.
    pub id: u32,
    /// The core that owns it (this one).
    pub core: usize,
    /// The glommio executor that owns it: every touch asserts it runs there.
    executor: usize,
    /// Its directory: segments and consumer.offset.
    dir: PathBuf,
    /// Where its files live (the disk, or a simulator in tests).
    storage: Rc<dyn Storage>,
    /// The durable log.
    pub log: Rc<Log>,
    /// The lease shard, loaded at the first touch.
    shard: RefCell<ShardSlot>,
    /// Notified when a load ends (successfully or not).
    loaded_event: event_listener::Event,
    /// Caps from the topic config.
    limits: Limits,
    /// Frontier value known durable in consumer.offset (what was read at the first touch, then each flush).
    flushed: Cell<u64>,
    /// A flush is running (the flush task and shutdown must not overlap on one file).
    flushing: Cell<bool>,
    /// Notified when a running flush ends.
    flushed_event: event_listener::Event,
    /// Set when the partition is closed (topic deleted or shutdown): no file of it is written after this, since its
    /// directory may already belong to a new topic of the same name.
    closed: Cell<bool>,
    /// Offsets lost below the durable frontier at recovery (the log ended before it): counted as corrupt-skipped.
    lost_below_frontier: Cell<u64>,
    /// Read failures per offset (I/O errors), for the offsets that failed recently.
    read_failures: RefCell<std::collections::BTreeMap<u64, u32>>,
    /// Wakes parked consumers of the topic.
    wake: Wake,
    /// Monotonic counters.
    pub counters: Counters,
}

/// Milliseconds on the process's monotonic clock (leases never outlive the process).
pub fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

fn map_settle(e: SettleError) -> BrokerError {
    match e {
        SettleError::Gone => BrokerError::LeaseGone,
        SettleError::AckedAheadFull => BrokerError::AckedAheadFull,
    }
}

impl Partition {
    /// Opens the partition's log (recovery runs here) and wires the wake-up for parked consumers.
    pub async fn open(
        storage: Rc<dyn Storage>,
        dir: &Path,
        id: u32,
        core: usize,
        log_options: crate::storage::log::LogOptions,
        limits: Limits,
        wake: Wake,
    ) -> std::io::Result<Rc<Partition>> {
        let log = Log::open(storage.clone(), dir, log_options).await?;
        let partition = Rc::new(Partition {
            id,
            core,
            executor: glommio::executor().id(),
            dir: dir.to_path_buf(),
            storage,
            log,
            shard: RefCell::new(ShardSlot::Unloaded),
            loaded_event: event_listener::Event::new(),
            limits,
            flushed: Cell::new(0),
            flushing: Cell::new(false),
            flushed_event: event_listener::Event::new(),
            closed: Cell::new(false),
            lost_below_frontier: Cell::new(0),
            read_failures: RefCell::new(std::collections::BTreeMap::new()),
            wake,
            counters: Counters::default(),
        });
        let weak = Rc::downgrade(&partition);
        partition.log.set_on_append(Box::new(move |n| {
            if let Some(p) = weak.upgrade() {
                bump(&p.counters.produced, n as u64);
                (p.wake)(n);
            }
        }));
        Ok(partition)
    }

    /// Every touch runs on the owning core's executor: the shard and the log are not shared.
    fn assert_owner(&self) {
        assert_eq!(
            glommio::executor().id(),
            self.executor,
            "partition {} of core {} touched from another executor",
            self.id,
            self.core
        );
    }

    /// Loads the lease shard at the first touch: reads consumer.offset from disk (a read error other than "not
    /// found" fails this touch with 503 and the next touch retries; the frontier is never guessed as 0), and if the
    /// durable frontier is beyond what recovery found in the log, moves the log's end up to it so no offset a
    /// consumer may have settled is ever handed out again.
    pub async fn ensure_loaded(&self) -> BrokerResult<()> {
        self.assert_owner();
        loop {
            let listener = match &*self.shard.borrow() {
                ShardSlot::Loaded(_) => return Ok(()),
                ShardSlot::Loading => Some(self.loaded_event.listen()),
                ShardSlot::Unloaded => None,
            };
            match listener {
                Some(listener) => listener.await,
                None => break,
            }
        }
        if self.closed.get() {
            return Err(BrokerError::ShuttingDown);
        }
        *self.shard.borrow_mut() = ShardSlot::Loading;
        let result = self.load_shard().await;
        let outcome = match result {
            Ok(shard) => {
                *self.shard.borrow_mut() = ShardSlot::Loaded(shard);
                Ok(())
            }
            Err(e) => {
                *self.shard.borrow_mut() = ShardSlot::Unloaded;
                Err(e)
            }
        };
        self.loaded_event.notify(usize::MAX);
        outcome
    }

    async fn load_shard(&self) -> BrokerResult<InFlight> {
        let stored = frontier::read(&*self.storage, &self.dir).map_err(|e| {
            error!(dir = %self.dir.display(), error = %e, "cannot read consumer.offset: the partition answers 503 until it can");
            BrokerError::PartitionUnavailable(format!("cannot read its frontier: {e}"))
        })?;
        let recovered_end = self.log.end_offset();
        if stored > recovered_end {
            self.log.skip_to(stored).await.map_err(|e| {
                error!(dir = %self.dir.display(), error = %e, "cannot move the log end up to the durable frontier");
                BrokerError::PartitionUnavailable(format!("cannot move the log to its frontier: {e}"))
            })?;
            self.lost_below_frontier.set(stored - recovered_end);
        }
        let (start, end) = (self.log.start_offset(), self.log.end_offset());
        let committed = stored.max(start);
        assert!(
            committed <= end,
            "frontier {committed} beyond the recovered end {end}"
        );
        self.flushed.set(stored);
        let nonce_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1)
            << 8;
        Ok(InFlight::new(committed, nonce_seed, self.limits))
    }

    /// Runs `f` on the loaded shard (None when it is not loaded).
    fn with_loaded<R>(&self, f: impl FnOnce(&mut InFlight) -> R) -> Option<R> {
        self.assert_owner();
        match &mut *self.shard.borrow_mut() {
            ShardSlot::Loaded(shard) => Some(f(shard)),
            _ => None,
        }
    }

    /// Runs `f` on the shard, which the caller has loaded (`ensure_loaded`).
    fn with_shard<R>(&self, f: impl FnOnce(&mut InFlight) -> R) -> R {
        self.with_loaded(f)
            .expect("the shard is loaded before it is used")
    }

    /// Leases the lowest deliverable offset and reads it; corrupt records are skipped, counted and logged (one line
    /// per run); a record that fails to read is released, counted, and after `MAX_READ_FAILURES` treated as corrupt.
    pub async fn take(&self, visibility_ms: u64) -> BrokerResult<Take> {
        if let Err(e) = self.ensure_loaded().await {
            return match e {
                BrokerError::PartitionUnavailable(_) => Ok(Take::Unavailable),
                other => Err(other),
            };
        }
        loop {
            let now = now_ms();
            let end = self.log.end_offset();
            let released_before = self.with_shard(|s| s.purge_expired(now));
            self.note_expired(released_before);
            let lease = match self.with_shard(|s| s.reserve(end, now, visibility_ms)) {
                Reserve::Leased(lease) => lease,
                Reserve::Empty => return Ok(Take::Empty),
                Reserve::AtCap => return Ok(Take::AtCap),
            };
            match self.log.read(lease.offset).await {
                Ok(Record { payload, .. }) => {
                    bump(&self.counters.delivered, 1);
                    return Ok(Take::Leased(Delivery {
                        partition: self.id,
                        offset: lease.offset,
                        nonce: lease.nonce,
                        payload,
                    }));
                }
                Err(ReadError::Corrupt) => {
                    let run_end = self
                        .log
                        .corrupt_run_end(lease.offset)
                        .unwrap_or(lease.offset + 1)
                        .min(end);
                    error!(dir = %self.dir.display(), from = lease.offset, to = run_end, "skipping corrupt records from..to: they will never be delivered");
                    self.with_shard(|s| s.skip_corrupt_run(lease.offset, lease.nonce, run_end));
                    // A long run must not hold the core.
                    futures_lite::future::yield_now().await;
                }
                Err(ReadError::OutOfRetention { start }) => {
                    self.with_shard(|s| s.advance_to(start));
                }
                Err(ReadError::NotYet) => {
                    self.with_shard(|s| s.nack(lease.offset, lease.nonce, now))
                        .ok();
                    return Ok(Take::Empty);
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
                        self.with_shard(|s| s.skip_corrupt(lease.offset, lease.nonce));
                        continue;
                    }
                    warn!(dir = %self.dir.display(), offset = lease.offset, failures, error = %e, "a record failed to read: released for a retry");
                    self.with_shard(|s| s.nack(lease.offset, lease.nonce, now))
                        .ok();
                    return Ok(Take::Unavailable);
                }
            }
        }
    }

    fn note_expired(&self, released: usize) {
        if released > 0 {
            bump(&self.counters.expired, released as u64);
            (self.wake)(released);
        }
    }

    /// Acks, nacks or extends the lease `(offset, nonce)`.
    pub async fn settle(&self, offset: u64, nonce: u64, op: SettleOp) -> BrokerResult<()> {
        self.ensure_loaded().await?;
        let now = now_ms();
        let released = self.with_shard(|s| s.purge_expired(now));
        self.note_expired(released);
        let result = self.with_shard(|s| match op {
            SettleOp::Ack => s.ack(offset, nonce, now).map(|_| ()),
            SettleOp::Nack => s.nack(offset, nonce, now),
            SettleOp::Extend(visibility_ms) => {
                s.extend(offset, nonce, now, visibility_ms).map(|_| ())
            }
        });
        match result {
            Ok(()) => {
                match op {
                    SettleOp::Ack => {
                        bump(&self.counters.acked, 1);
                        // Freeing a slot of a capped partition makes its waiting offsets deliverable again.
                        let was_at_cap =
                            self.with_shard(|s| s.in_flight() + 1 >= self.limits.max_in_flight);
                        if was_at_cap && self.has_deliverable() {
                            (self.wake)(1);
                        }
                    }
                    SettleOp::Nack => {
                        bump(&self.counters.nacked, 1);
                        (self.wake)(1);
                    }
                    SettleOp::Extend(_) => bump(&self.counters.extended, 1),
                }
                Ok(())
            }
            Err(e) => {
                if e == SettleError::Gone {
                    bump(&self.counters.lease_gone, 1);
                }
                Err(map_settle(e))
            }
        }
    }

    /// Releases expired leases (the background purger); returns how many.
    pub fn purge(&self, now: u64) -> usize {
        let released = self.with_loaded(|s| s.purge_expired(now)).unwrap_or(0);
        self.note_expired(released);
        released
    }

    /// Earliest lease deadline, if the shard is loaded and holds leases.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.with_loaded(|s| s.next_expiry_ms()).flatten()
    }

    /// Appends a message; resolves once durable. The first touch loads the frontier first, so an append never
    /// takes an offset below the durable frontier.
    pub async fn append(&self, payload: Bytes) -> BrokerResult<u64> {
        self.ensure_loaded().await?;
        self.log.append(payload).await.map_err(|e| match e {
            AppendError::Io(e) => BrokerError::Storage(e),
            AppendError::NoSpace => BrokerError::NoSpace,
            AppendError::Poisoned => BrokerError::LogUnavailable,
            AppendError::Closed => BrokerError::ShuttingDown,
        })
    }

    /// Reads a record for replay, without touching leases.
    pub async fn replay(&self, offset: u64) -> BrokerResult<Option<Record>> {
        self.assert_owner();
        match self.log.read(offset).await {
            Ok(record) => Ok(Some(record)),
            Err(ReadError::NotYet) => Ok(None),
            Err(ReadError::OutOfRetention { start }) => {
                Err(BrokerError::OffsetOutOfRetention { start })
            }
            Err(ReadError::Corrupt) => Err(BrokerError::CorruptRecord {
                partition: self.id,
                offset,
            }),
            Err(ReadError::Io(e)) => Err(BrokerError::Storage(e.to_string())),
        }
    }

    /// Applies retention and moves the frontier over what it removed.
    pub async fn apply_retention(&self, retention_ms: u64) {
        if self.closed.get() {
            return;
        }
        let start = self
            .log
            .apply_retention(crate::storage::wall_clock_ms(), retention_ms)
            .await;
        self.with_loaded(|s| s.advance_to(start));
    }

    /// Writes consumer.offset if the frontier moved since the last write. A failed write leaves the old value
    /// as the durable one and is retried at the next tick. Never writes a lower value than the one on disk, and
    /// never after the partition closed (its directory may belong to a new topic by then).
    pub async fn flush_frontier(&self) {
        let Some(committed) = self.with_loaded(|s| s.committed()) else {
            return;
        };
        if self.flushed.get() == committed || self.flushing.get() || self.closed.get() {
            return;
        }
        assert!(
            committed > self.flushed.get(),
            "frontier {committed} would replace the durable {} with a lower one",
            self.flushed.get()
        );
        self.flushing.set(true);
        match frontier::write(&*self.storage, &self.dir, committed).await {
            Ok(()) => self.flushed.set(committed),
            Err(e) => {
                warn!(dir = %self.dir.display(), error = %e, "cannot write consumer.offset; will retry")
            }
        }
        self.flushing.set(false);
        self.flushed_event.notify(usize::MAX);
    }

    /// Waits out a running flush.
    async fn wait_flush(&self) {
        while self.flushing.get() {
            let done = self.flushed_event.listen();
            if self.flushing.get() {
                done.await;
            }
        }
    }

    /// Graceful close (shutdown): flushes the frontier (waiting out a running flush), then closes the log.
    pub async fn close(&self) {
        self.wait_flush().await;
        self.flush_frontier().await;
        self.closed.set(true);
        self.log.close().await;
    }

    /// Close for a deleted topic: nothing more is written to its files (a running flush is waited out, no new one
    /// starts), then the log closes.
    pub async fn close_deleted(&self) {
        self.closed.set(true);
        self.wait_flush().await;
        self.log.close().await;
    }

    /// A snapshot for describe and metrics (loads the shard: describe counts as a touch). A partition whose
    /// frontier cannot be read shows the durable frontier it knows of (none) and no leases.
    pub async fn info(&self) -> PartitionInfo {
        let _ = self.ensure_loaded().await;
        let (committed, in_flight, acked_ahead, corrupt_skipped) = self
            .with_loaded(|s| {
                (
                    s.committed(),
                    s.in_flight(),
                    s.acked_ahead(),
                    s.corrupt_skipped_total(),
                )
            })
            .unwrap_or((self.flushed.get(), 0, 0, 0));
        let c = &self.counters;
        PartitionInfo {
            partition: self.id,
            core: self.core,
            start_offset: self.log.start_offset(),
            end_offset: self.log.end_offset(),
            committed,
            in_flight,
            acked_ahead,
            corrupt_skipped: corrupt_skipped + self.lost_below_frontier.get(),
            io_counts: self.log.io_counts(),
            counters: [
                c.produced.get(),
                c.delivered.get(),
                c.acked.get(),
                c.nacked.get(),
                c.extended.get(),
                c.expired.get(),
                c.lease_gone.get(),
                c.read_errors.get(),
            ],
        }
    }

    /// Is anything deliverable right now (cheap; the shard is not loaded by this check)?
    pub fn has_deliverable(&self) -> bool {
        let end = self.log.end_offset();
        self.with_loaded(|s| s.has_deliverable(end))
            .unwrap_or(end > self.log.start_offset())
    }
}
