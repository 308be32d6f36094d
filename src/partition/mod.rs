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
    /// Re-arm the expiry to now + this many ms.
    Extend(u64),
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
    pub counters: [u64; 7],
    /// (append batches, fdatasyncs) of its log.
    #[serde(skip)]
    pub io_counts: (u64, u64),
}

/// One partition on its owning core.
pub struct Partition {
    /// Partition number within its topic.
    pub id: u32,
    /// The core that owns it (this one).
    pub core: usize,
    /// Its directory: segments and consumer.offset.
    dir: PathBuf,
    /// Where its files live (the disk, or a simulator in tests).
    storage: Rc<dyn Storage>,
    /// The durable log.
    pub log: Rc<Log>,
    /// The lease shard; None until the first touch loads the frontier file.
    shard: RefCell<Option<InFlight>>,
    /// Caps from the topic config.
    limits: Limits,
    /// Frontier value last made durable in consumer.offset (None: never written by this process).
    flushed: Cell<Option<u64>>,
    /// A flush is running (the flush task and shutdown must not overlap on one file).
    flushing: Cell<bool>,
    /// Notified when a running flush ends.
    flushed_event: event_listener::Event,
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
            dir: dir.to_path_buf(),
            storage,
            log,
            shard: RefCell::new(None),
            limits,
            flushed: Cell::new(None),
            flushing: Cell::new(false),
            flushed_event: event_listener::Event::new(),
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

    /// Runs `f` on the shard, loading the frontier from disk at the first touch (clamped to the log).
    fn with_shard<R>(&self, f: impl FnOnce(&mut InFlight) -> R) -> R {
        let mut slot = self.shard.borrow_mut();
        let shard = slot.get_or_insert_with(|| {
            let stored = frontier::read(&*self.storage, &self.dir);
            let (start, end) = (self.log.start_offset(), self.log.end_offset());
            let committed = if stored > end {
                error!(dir = %self.dir.display(), stored, log_end = end, "consumer.offset is beyond the log end: clamping to the log end");
                end
            } else {
                stored.max(start)
            };
            self.flushed.set(Some(stored));
            let nonce_seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(1)
                << 8;
            InFlight::new(committed, nonce_seed, self.limits)
        });
        f(shard)
    }

    /// Leases the lowest deliverable offset and reads it; corrupt records are skipped, counted and logged.
    pub async fn take(&self, visibility_ms: u64) -> BrokerResult<Take> {
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
                    error!(dir = %self.dir.display(), offset = lease.offset, "skipping a corrupt record: it will never be delivered");
                    self.with_shard(|s| s.skip_corrupt(lease.offset, lease.nonce));
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
                    self.with_shard(|s| s.nack(lease.offset, lease.nonce, now))
                        .ok();
                    return Err(BrokerError::Storage(e.to_string()));
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
    pub fn settle(&self, offset: u64, nonce: u64, op: SettleOp) -> BrokerResult<()> {
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
        if self.shard.borrow().is_none() {
            return 0;
        }
        let released = self.with_shard(|s| s.purge_expired(now));
        self.note_expired(released);
        released
    }

    /// Earliest lease deadline, if the shard is loaded and holds leases.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.shard
            .borrow()
            .as_ref()
            .and_then(|s| s.next_expiry_ms())
    }

    /// Appends a message; resolves once durable.
    pub async fn append(&self, payload: Bytes) -> BrokerResult<u64> {
        self.log.append(payload).await.map_err(|e| match e {
            AppendError::Io(e) => BrokerError::Storage(e),
            AppendError::NoSpace => BrokerError::NoSpace,
            AppendError::Poisoned => BrokerError::LogUnavailable,
            AppendError::Closed => BrokerError::ShuttingDown,
        })
    }

    /// Reads a record for replay, without touching leases.
    pub async fn replay(&self, offset: u64) -> BrokerResult<Option<Record>> {
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
        let start = self
            .log
            .apply_retention(crate::storage::wall_clock_ms(), retention_ms)
            .await;
        if self.shard.borrow().is_some() {
            self.with_shard(|s| s.advance_to(start));
        }
    }

    /// Writes consumer.offset if the frontier moved since the last write. A failed write leaves the old value
    /// as the durable one and is retried at the next tick.
    pub async fn flush_frontier(&self) {
        let committed = match self.shard.borrow().as_ref() {
            Some(s) => s.committed(),
            None => return,
        };
        if self.flushed.get() == Some(committed) || self.flushing.get() {
            return;
        }
        self.flushing.set(true);
        match frontier::write(&*self.storage, &self.dir, committed).await {
            Ok(()) => self.flushed.set(Some(committed)),
            Err(e) => {
                warn!(dir = %self.dir.display(), error = %e, "cannot write consumer.offset; will retry")
            }
        }
        self.flushing.set(false);
        self.flushed_event.notify(usize::MAX);
    }

    /// Flushes the frontier (waiting out a running flush) and closes the log.
    pub async fn close(&self) {
        while self.flushing.get() {
            let done = self.flushed_event.listen();
            if self.flushing.get() {
                done.await;
            }
        }
        self.flush_frontier().await;
        self.log.close().await;
    }

    /// A snapshot for describe and metrics (loads the shard: describe counts as a touch).
    pub fn info(&self) -> PartitionInfo {
        let (committed, in_flight, acked_ahead, corrupt_skipped) = self.with_shard(|s| {
            (
                s.committed(),
                s.in_flight(),
                s.acked_ahead(),
                s.corrupt_skipped_total(),
            )
        });
        let c = &self.counters;
        PartitionInfo {
            partition: self.id,
            core: self.core,
            start_offset: self.log.start_offset(),
            end_offset: self.log.end_offset(),
            committed,
            in_flight,
            acked_ahead,
            corrupt_skipped,
            io_counts: self.log.io_counts(),
            counters: [
                c.produced.get(),
                c.delivered.get(),
                c.acked.get(),
                c.nacked.get(),
                c.extended.get(),
                c.expired.get(),
                c.lease_gone.get(),
            ],
        }
    }

    /// Is anything deliverable right now (cheap; the shard is not loaded by this check)?
    pub fn has_deliverable(&self) -> bool {
        let end = self.log.end_offset();
        match self.shard.borrow().as_ref() {
            Some(s) => s.has_deliverable(end),
            None => end > self.log.start_offset(),
        }
    }
}
