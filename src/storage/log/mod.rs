//! One partition's durable log: segment files of frames, an offset → position index (4 bytes per record), group
//! commit, recovery at open, retention. Lives on the partition's owning core alone (`Rc`, no locks).
//!
//! Appends queue up while the writer task is busy; the writer takes the whole queue as one batch, writes it with one
//! `write_at` and makes it durable with one `fdatasync`, so concurrent producers share a sync (group commit). Offsets
//! are assigned, and become readable, only once their batch is durable under the fsync policy.

pub use super::error::AppendError;
use crate::storage::backend::{SegmentFile, Storage};
use crate::storage::behind::Behind;
use crate::storage::frame::{self, NO_POSITION};
use crate::storage::journal::{self, EntryHead, Journal};
use crate::storage::runs::Runs;
use crate::storage::FsyncPolicy;
pub use read::{ReadAhead, ReadError, Record, READ_AHEAD_BYTES};

mod follow;
mod read;
use crate::clock::Clock;
use bytes::Bytes;
use event_listener::Event;
pub use follow::{FollowError, ShipHook, MAX_QUEUED_SHIPS};
use futures_channel::oneshot;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tracing::{error, info, warn};

/// The active segment is kept zero-filled ahead of its last frame, so most batches overwrite blocks that are
/// already allocated and sized and their fdatasync flushes data without a journal commit for the file size (a
/// cheaper sync: docs/benchmark-history.md, "Design measurements"). The zeros are a torn tail to recovery and are cut at
/// restart and when the segment is sealed. The reserve grows with what the segment holds, from `PREZERO_MIN_BYTES`
/// (a partition that received one record costs 4 KiB, not a megabyte) to `PREZERO_MAX_BYTES` for a hot one, and is
/// trimmed back to at most `PREZERO_IDLE_BYTES` once the partition has been idle (see `Log::trim_idle_reserve`).
const PREZERO_MIN_BYTES: u64 = 4 << 10;
const PREZERO_MAX_BYTES: u64 = 1 << 20;
/// Most zero-filled bytes an idle partition keeps beyond its records. 64 KiB.
pub const PREZERO_IDLE_BYTES: u64 = 64 << 10;

/// No log reaches this offset (2^62: a billion records a second for 146 years): a peer's offset past it is refused
/// (`ops::validate`), so offset sums never wrap.
pub const MAX_OFFSET: u64 = 1 << 62;

/// A partition with no append for this long gives back its reserve beyond `PREZERO_IDLE_BYTES`. 2 s.
const IDLE_TRIM_MS: u64 = 2000;

/// Largest number of frame bytes one batch writes (further appends wait for the next batch). 4 MiB.
const MAX_BATCH_BYTES: u64 = 4 << 20;

/// How a log is shaped; fixed for its lifetime.
#[derive(Debug, Clone, Copy)]
pub struct LogOptions {
    /// A segment rolls before a batch would push it past this many bytes.
    pub segment_bytes: u64,
    /// Largest payload a frame may carry (the server's max_message_bytes, plus a meta block's
    /// `storage::meta::MAX_OVERHEAD`).
    pub max_payload: u32,
    /// When appends are synced.
    pub fsync: FsyncPolicy,
    /// The newest frames of the active segment kept in memory, so a consumer keeping up with its producers reads
    /// them without a system call (see `Tail`); 0 keeps none.
    pub tail_cache_bytes: u32,
    /// With a journal: the active segment's frames are written to its file in pieces of about this many bytes
    /// (see `storage::behind`); 0 writes each batch at once.
    pub write_behind_bytes: u32,
}

/// How the gather's wait (`Log::wait_for_commit`) ended.
#[derive(Debug, PartialEq, Eq)]
enum Held {
    /// Not held: the batch was committed already, or the log does not gather.
    No,
    /// Held until the commit reached the log's end.
    Committed,
    /// Held for the whole gather without that, or until the log closed or stopped gathering.
    Released,
}

/// Called after each durable batch with the number of new records.
pub type AppendHook = Box<dyn Fn(usize)>;

/// A log's place in its core's journal: with one, a batch is made durable by the core's group commit (the journal's
/// sync) instead of a sync of the segment file, and the segment is synced behind it at checkpoints.
#[derive(Clone)]
pub struct JournalLink {
    pub journal: Rc<Journal>,
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
}

impl JournalLink {
    /// The journal entry head of a batch of this partition: `count` records from offset `first`, at `position` of
    /// the segment based at `segment_base`.
    fn head(&self, segment_base: u64, position: u64, first: u64, count: u32) -> EntryHead {
        EntryHead {
            topic: self.topic.clone(),
            topic_id: self.topic_id,
            partition: self.partition,
            segment_base,
            position,
            first_offset: first,
            count,
        }
    }
}

/// The newest frames of the active segment, copied from each batch (at most `tail_cache_bytes`; when it would grow
/// past that, the older half is dropped). Lives on the partition's core. A batch's frames enter it as they are
/// written, before they are durable, but readers look up only positions of durable frames; a batch that fails is
/// followed by one written at the same position, which does not continue the tail, so the tail starts afresh (as it
/// does in a new segment).
#[derive(Default)]
struct Tail {
    segment_base: u64,
    start: u64,
    bytes: Vec<u8>,
}

impl Tail {
    /// Adds the frames written at `pos` of segment `base`.
    fn push(&mut self, base: u64, pos: u64, frames: &[u8], cap: usize) {
        if cap == 0 || frames.len() > cap {
            self.bytes = Vec::new();
            return;
        }
        if self.segment_base != base || self.start + self.bytes.len() as u64 != pos {
            self.segment_base = base;
            self.start = pos;
            self.bytes.clear();
        }
        if self.bytes.len() + frames.len() > cap {
            let keep = (cap / 2).min(self.bytes.len());
            let drop = self.bytes.len() - keep;
            self.bytes.drain(..drop);
            self.start += drop as u64;
            if self.bytes.len() + frames.len() > cap {
                self.start += self.bytes.len() as u64;
                self.bytes.clear();
            }
        }
        if self.bytes.capacity() == 0 {
            self.bytes.reserve_exact(cap);
        }
        self.bytes.extend_from_slice(frames);
    }

    /// The bytes at `pos..pos + len` of segment `base`, if held.
    fn get(&self, base: u64, pos: u64, len: u64) -> Option<&[u8]> {
        if self.segment_base != base || pos < self.start {
            return None;
        }
        let from = (pos - self.start) as usize;
        self.bytes.get(from..from.checked_add(len as usize)?)
    }
}

/// One segment file.
struct Segment {
    /// Offset of its first frame.
    base: u64,
    /// The open file of the active segment (reads share it; only the writer task writes). None for a sealed
    /// segment: it is opened when read (see `Log::sealed_file`), so a partition holds at most two descriptors
    /// however many segments it has.
    file: Option<Rc<dyn SegmentFile>>,
    /// Byte position of each frame, by offset - base; NO_POSITION for a frame lost to damage.
    positions: Vec<u32>,
    /// Bytes of the file holding frames (the next write position).
    len: u64,
    /// The file's size: frames, then zeros up to here (see PREZERO_BYTES).
    zeroed_to: u64,
    /// Timestamp of its newest frame, for retention.
    last_timestamp_ms: u64,
    /// Where it lives, for removal.
    path: PathBuf,
}

/// Mutable state, borrowed only between awaits.
struct LogState {
    segments: Vec<Segment>,
    /// The next offset a batch will assign; also the readable end (offsets are assigned once durable).
    next_offset: u64,
    /// Offsets found damaged at recovery, or lost below a durable frontier: never delivered.
    corrupt: Runs,
    /// Data written to the active segment since its last sync (the stop's final sync looks at it).
    dirty: bool,
}

/// A batch's frames, built for the end of the active segment and not yet written (see `Log::write_built`).
struct Built {
    /// With a journal, a whole journal entry whose frames start at `frames_at`; without, the frames alone.
    buf: Vec<u8>,
    frames_at: usize,
    /// The active segment, its base offset, and where the frames go in it.
    file: Rc<dyn SegmentFile>,
    base: u64,
    start_pos: u64,
    /// The segment's frame count and zero-filled size before the batch (for the checks and the rollback).
    old_positions: usize,
    zeroed_to: u64,
    /// The batch's first offset, the position of each frame, and their timestamp.
    first: u64,
    positions: Vec<u32>,
    timestamp_ms: u64,
}

/// An append of one or more records (one request's batch, for one partition) waiting for the writer. Its records
/// are written together, so they get consecutive offsets.
struct Pending {
    payloads: Vec<Bytes>,
    /// Which payloads start with a record meta block (`frame::META_FLAG`); empty when none does.
    meta: Vec<bool>,
    /// Encoded size of its frames.
    bytes: u64,
    reply: oneshot::Sender<Result<u64, AppendError>>,
}

/// The log of one partition.
pub struct Log {
    dir: PathBuf,
    storage: Rc<dyn Storage>,
    clock: Rc<dyn Clock>,
    opts: LogOptions,
    state: RefCell<LogState>,
    queue: RefCell<Vec<Pending>>,
    /// Wakes the writer when the queue fills or the log closes.
    queue_event: Event,
    /// Notified with every newly readable batch (replay long-polls listen here).
    appended: Event,
    /// A replicated leader's gather (`Log::gather_behind_commit`): how long its writer holds its next batch for
    /// the last one's commit (0: never), ...
    gather_us: Cell<u64>,
    /// ...the partition's commit offset as it last told (`u64::MAX`: nothing to wait for, as unreplicated)...
    commit_end: Cell<u64>,
    /// ...and its notice that it moved.
    commit_moved: Event,
    /// Called with the number of newly readable records after each durable batch (long-poll wake-ups).
    on_append: RefCell<Option<AppendHook>>,
    closed: Cell<bool>,
    poisoned: Cell<bool>,
    /// The sealed segment opened last for a read (base, file).
    sealed_cache: RefCell<Option<(u64, Rc<dyn SegmentFile>)>>,
    /// The newest frames of the active segment (see `Tail`).
    tail: RefCell<Tail>,
    /// Frames in the journal and not yet in the active segment's file (see `storage::behind`).
    behind: Rc<Behind>,
    /// Batches written (records per batch = group-commit effectiveness).
    batches: Cell<u64>,
    /// fdatasyncs issued on segments.
    syncs: Cell<u64>,
    writer_done: Cell<bool>,
    writer_done_event: Event,
    /// Leader side: told of every durable batch (`follow.rs`).
    on_ship: RefCell<Option<follow::ShipHook>>,
    /// Ship each batch once written, before the journal's sync (`ship_before_sync`).
    ship_early: Cell<bool>,
    /// Follower side: shipped batches waiting for the writer task (`follow.rs`), which alone writes.
    ships: RefCell<std::collections::VecDeque<follow::ShipJob>>,
    /// Follower side: a shipped batch is being written (`run_ship`); `ship_done` tells when it ends.
    shipping: Cell<bool>,
    /// A batch of this replica's own appends is being written (`write_batch`): a replica deposed meanwhile (its
    /// queued appends refused) still lands it, and a follower's decisions on its end wait for it
    /// (`Log::own_writes_settled`).
    own_writing: Cell<bool>,
    own_written: Event,
    ship_done: Event,
    /// Shipped batches are refused: the replica leads the partition now (`Log::stop_following`).
    ships_refused: Cell<bool>,
    /// Shipped batches of a leadership older than this are refused at their turn to be written (`fence_ships`).
    ship_fence: Cell<u64>,
    /// A cut of a diverged tail runs (`follow.rs`): retention leaves the segments alone meanwhile.
    cutting: Cell<bool>,
    /// The core's journal, when appends are made durable through it.
    journal: Option<JournalLink>,
}

impl Segment {
    /// The active segment's file (always open).
    fn open_file(&self) -> Rc<dyn SegmentFile> {
        self.file
            .clone()
            .expect("the active segment's file is open")
    }
}

fn segment_name(base: u64) -> String {
    format!("{base:020}.log")
}

fn io_text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Log {
    /// Opens (or creates) the log in `dir`: scans every segment, truncates a torn tail of the last one, rebuilds the
    /// index and records damaged frames. Reads segments with blocking reads: this runs once per partition at boot.
    pub async fn open(
        storage: Rc<dyn Storage>,
        clock: Rc<dyn Clock>,
        dir: &Path,
        opts: LogOptions,
    ) -> std::io::Result<Rc<Log>> {
        Self::open_with(storage, clock, dir, opts, None).await
    }

    /// `open`, with the core's journal making appends durable (fsync `always` and `interval:MS`).
    pub async fn open_with(
        storage: Rc<dyn Storage>,
        clock: Rc<dyn Clock>,
        dir: &Path,
        opts: LogOptions,
        journal: Option<JournalLink>,
    ) -> std::io::Result<Rc<Log>> {
        // `fsync interval` makes appends durable through the core's journal, which syncs on the interval; a log
        // of its own has no syncer (the engine starts a journal for every policy but `never`).
        assert!(
            journal.is_some() || !matches!(opts.fsync, FsyncPolicy::IntervalMs(_)),
            "fsync interval needs the core's journal"
        );
        storage.create_dir_all(dir)?;
        let mut bases: Vec<u64> = Vec::new();
        for name in storage.list(dir)? {
            if let Some(stem) = name.strip_suffix(".log") {
                match stem.parse::<u64>() {
                    Ok(base) if stem.len() == 20 => bases.push(base),
                    _ => {
                        warn!(dir = %dir.display(), file = %name, "ignoring a file that is not a segment")
                    }
                }
            }
        }
        bases.sort_unstable();
        let mut segments = Vec::with_capacity(bases.len().max(1));
        let mut corrupt = Runs::new();
        let mut next_offset = bases.first().copied().unwrap_or(0);
        let count = bases.len();
        for (i, base) in bases.into_iter().enumerate() {
            let path = dir.join(segment_name(base));
            let bytes = storage.read(&path)?;
            let scan = frame::scan(&bytes, base, opts.max_payload);
            if base > next_offset {
                error!(dir = %dir.display(), from = next_offset, to = base, "offsets missing between segments: recorded as corrupt, never delivered");
                corrupt.insert(next_offset, base);
            } else if base < next_offset {
                error!(dir = %dir.display(), base, next_offset, "segment overlaps its predecessor; later frames win");
            }
            let mut damaged = Runs::new();
            for &offset in &scan.corrupt {
                damaged.insert(offset, offset + 1);
            }
            for (from, to) in damaged.iter() {
                error!(dir = %dir.display(), from, to, "frames failed their check at recovery: offsets from..to will be skipped, never delivered");
                corrupt.insert(from, to);
            }
            let last = i + 1 == count;
            if scan.valid_len < bytes.len() as u64 {
                if last {
                    let tail = &bytes[scan.valid_len as usize..];
                    if tail.iter().all(|&b| b == 0) {
                        info!(dir = %dir.display(), segment = base, bytes = tail.len(), "dropping the zero-filled reserve after the last frame");
                    } else {
                        warn!(dir = %dir.display(), segment = base, kept = scan.valid_len, cut = tail.len(), "truncating a torn tail");
                    }
                    storage.truncate_file(&path, scan.valid_len)?;
                } else {
                    error!(dir = %dir.display(), segment = base, "garbage after the last valid frame of a sealed segment");
                }
            }
            let file = if last {
                Some(storage.open(&path, false).await?)
            } else {
                None
            };
            next_offset = scan.next_offset.max(next_offset);
            segments.push(Segment {
                base,
                file,
                positions: scan.positions,
                len: scan.valid_len,
                zeroed_to: scan.valid_len,
                last_timestamp_ms: scan.last_timestamp_ms.unwrap_or(0),
                path,
            });
        }
        if segments.is_empty() {
            segments.push(Self::create_segment(&*storage, dir, 0).await?);
            storage.sync_dir(dir).await?;
        }
        let log = Rc::new(Log {
            dir: dir.to_path_buf(),
            storage,
            clock,
            opts,
            state: RefCell::new(LogState {
                segments,
                next_offset,
                corrupt,
                dirty: false,
            }),
            queue: RefCell::new(Vec::new()),
            queue_event: Event::new(),
            appended: Event::new(),
            gather_us: Cell::new(0),
            commit_end: Cell::new(u64::MAX),
            commit_moved: Event::new(),
            on_append: RefCell::new(None),
            closed: Cell::new(false),
            poisoned: Cell::new(false),
            sealed_cache: RefCell::new(None),
            tail: RefCell::new(Tail::default()),
            behind: Behind::new(),
            batches: Cell::new(0),
            syncs: Cell::new(0),
            writer_done: Cell::new(false),
            writer_done_event: Event::new(),
            on_ship: RefCell::new(None),
            ship_early: Cell::new(false),
            ships: RefCell::new(std::collections::VecDeque::new()),
            shipping: Cell::new(false),
            own_writing: Cell::new(false),
            own_written: Event::new(),
            ship_done: Event::new(),
            ships_refused: Cell::new(false),
            ship_fence: Cell::new(0),
            cutting: Cell::new(false),
            journal,
        });
        glommio::spawn_local(log.clone().run_writer()).detach();
        Ok(log)
    }

    async fn create_segment(
        storage: &dyn Storage,
        dir: &Path,
        base: u64,
    ) -> std::io::Result<Segment> {
        let path = dir.join(segment_name(base));
        let file = storage.open(&path, true).await?;
        Ok(Segment {
            base,
            file: Some(file),
            positions: Vec::new(),
            len: 0,
            zeroed_to: 0,
            last_timestamp_ms: 0,
            path,
        })
    }

    /// Registers the callback run after each durable batch with the number of new records.
    pub fn set_on_append(&self, f: AppendHook) {
        *self.on_append.borrow_mut() = Some(f);
    }

    /// The first offset of the oldest segment whose newest record is at or after `since_ms` (Unix ms): every record
    /// written at or after `since_ms` is at or above it. The log's end when there is none.
    pub fn first_offset_since(&self, since_ms: u64) -> u64 {
        let st = self.state.borrow();
        st.segments
            .iter()
            .find(|s| s.last_timestamp_ms >= since_ms || s.file.is_some())
            .map_or(st.next_offset, |s| s.base)
    }

    /// Oldest retained offset.
    pub fn start_offset(&self) -> u64 {
        self.state.borrow().segments.first().map_or(0, |s| s.base)
    }

    /// The core's journal and this log's place in it (None: the log syncs its own segments, or fsync never).
    pub fn journal_link(&self) -> Option<&JournalLink> {
        self.journal.as_ref()
    }

    /// One past the newest readable offset (== the next offset to be written once the queue is empty).
    pub fn end_offset(&self) -> u64 {
        self.state.borrow().next_offset
    }

    /// A replicated partition led here (`[cluster] replica_gather_us`): once a batch is durable here, the writer
    /// holds the next one until the partition's commit offset reaches this log's end, at most `us` (0: never), and
    /// then gives it the usual company wait, so the produces answered meanwhile come back and share it. A leader
    /// with one batch in flight and the appends that queue behind it in one more needs one journal pass and one
    /// fdatasync on each replica for what would otherwise take two or three, half full: on a machine where the
    /// replicas share the CPU that is the cost of a replicated produce (`docs/benchmarks.md`, "Replication: the
    /// gather"). The pipeline to the followers is unchanged for catch-up and for the core's other partitions.
    pub fn gather_behind_commit(&self, us: u64) {
        self.gather_us.set(us);
        self.commit_moved.notify(usize::MAX);
    }

    /// A replicated partition led here ships each batch as soon as its frames are written (true), so that its
    /// followers' syncs run beside its own, or once the journal made it durable (false). What it ships early and
    /// then cannot make durable here poisons the log (appends refused until a restart): the offsets it gave those
    /// records must never be given to others at the same epoch, and a restart leads only at a newer one.
    pub fn ship_before_sync(&self, early: bool) {
        self.ship_early.set(early);
    }

    /// The partition's commit offset moved to `end` (`u64::MAX`: it is not replicated, or not led here any more, and
    /// the writer waits for nothing).
    pub fn commit_at(&self, end: u64) {
        self.commit_end.set(end);
        self.commit_moved.notify(usize::MAX);
    }

    /// The gather's wait (see `gather_behind_commit`).
    async fn wait_for_commit(&self) -> Held {
        let us = self.gather_us.get();
        // Only a leader that ships holds anything (a deposed one that follows now does not: `start_following`).
        if us == 0 || self.on_ship.borrow().is_none() || self.commit_end.get() >= self.end_offset()
        {
            return Held::No;
        }
        let mut timer = self.clock.sleep_until_us(self.clock.now_us() + us);
        loop {
            let moved = self.commit_moved.listen();
            if self.closed.get() || self.gather_us.get() == 0 {
                return Held::Released;
            }
            if self.commit_end.get() >= self.end_offset() {
                return Held::Committed;
            }
            let timed_out = futures_lite::future::or(
                async {
                    moved.await;
                    false
                },
                async {
                    timer.as_mut().await;
                    true
                },
            )
            .await;
            if timed_out {
                return Held::Released;
            }
        }
    }

    /// Whether a failed sync (here or in the journal) has stopped appends until a restart.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.get()
            || self
                .journal
                .as_ref()
                .is_some_and(|link| link.journal.is_poisoned())
    }

    /// (batches written, fdatasyncs issued) since open.
    pub fn io_counts(&self) -> (u64, u64) {
        (self.batches.get(), self.syncs.get())
    }

    /// Appends one record; resolves with its offset once durable under the fsync policy.
    pub async fn append(&self, payload: Bytes) -> Result<u64, AppendError> {
        self.append_batch(vec![payload]).await
    }

    /// Appends records with consecutive offsets in one write and one sync; resolves with the first offset once
    /// durable under the fsync policy. Nothing of a failed batch is readable.
    pub async fn append_batch(&self, payloads: Vec<Bytes>) -> Result<u64, AppendError> {
        self.append_records(payloads, Vec::new()).await
    }

    /// `append_batch`, where `meta[i]` says whether `payloads[i]` starts with a record meta block
    /// (`storage::meta`; empty: none does).
    pub async fn append_records(
        &self,
        payloads: Vec<Bytes>,
        meta: Vec<bool>,
    ) -> Result<u64, AppendError> {
        assert!(
            meta.is_empty() || meta.len() == payloads.len(),
            "a meta flag per record, or none"
        );
        if self.closed.get() {
            return Err(AppendError::Closed);
        }
        if self.poisoned.get() {
            return Err(AppendError::Poisoned);
        }
        assert!(!payloads.is_empty(), "an append batch holds a record");
        let bytes = payloads
            .iter()
            .map(|p| frame::encoded_len(p.len()) as u64)
            .sum();
        let (tx, rx) = oneshot::channel();
        self.queue.borrow_mut().push(Pending {
            payloads,
            meta,
            bytes,
            reply: tx,
        });
        self.queue_event.notify(1);
        rx.await.unwrap_or(Err(AppendError::Closed))
    }

    /// A listener that fires when new records become readable (register before checking `end_offset`).
    pub fn listen_appended(&self) -> event_listener::EventListener {
        self.appended.listen()
    }

    async fn run_writer(self: Rc<Self>) {
        loop {
            // Registered only once the writer found nothing to do, and then it looks once more before it waits (a
            // push between its look and the registration would otherwise be missed): a listener is an allocation,
            // paid once per sleep, not once per batch.
            let mut listening = None;
            let batch = loop {
                // A follower's shipped batches, in arrival order, those queued together in one write (`follow.rs`).
                let ships = self.take_ships();
                if !ships.is_empty() {
                    self.run_ships(ships).await;
                    continue;
                }
                if let Some(batch) = self.take_batch() {
                    break batch;
                }
                if self.closed.get() {
                    if let Err(e) = self.behind.flush() {
                        // The journal keeps them: its close flushes the buffer again, or leaves itself for replay.
                        error!(dir = %self.dir.display(), error = %e, "closing: cannot write the frames still behind");
                        self.poisoned.set(true);
                    }
                    self.final_sync().await;
                    self.writer_done.set(true);
                    self.writer_done_event.notify(usize::MAX);
                    return;
                }
                let Some(listener) = listening.take() else {
                    listening = Some(self.queue_event.listen());
                    continue;
                };
                if self.idle_reserve_excess() {
                    // Idle with a large reserve: give the disk back unless appends arrive first.
                    let deadline = self.clock.now_ms() + IDLE_TRIM_MS;
                    let woken = futures_lite::future::or(
                        async {
                            listener.await;
                            true
                        },
                        async {
                            self.clock.sleep_until(deadline).await;
                            false
                        },
                    )
                    .await;
                    if !woken {
                        self.trim_idle_reserve().await;
                    }
                } else {
                    listener.await;
                }
            };
            let company = batch.len();
            self.own_writing.set(true);
            self.write_batch(batch).await;
            self.own_writing.set(false);
            self.own_written.notify(usize::MAX);
            // Held for the batch's commit (the gather), then given the company wait below: those its commit
            // answered come back within it. Held out (no commit within the gather) or closed: no more waiting.
            if self.wait_for_commit().await == Held::Released {
                continue;
            }
            // Appenders are concurrent (this batch gathered several): give the next batch the journal's commit
            // delay to fill, so one sync serves more of them. A lone appender never waits. A log whose journal's
            // last pass carried several partitions' entries adds no delay of its own (two stacked waits leave the core
            // idle): it builds its next batch when the journal's delay ends (`Journal::next_pass`). Ending the wait as
            // soon as as many appends as last time are queued was tried and lost: batches shrink pass after pass.
            // Both measured: docs/benchmark-history.md, "Design measurements".
            if company > 1 && !self.closed.get() {
                if let Some(link) = self.journal.as_ref() {
                    if link.journal.last_pass_entries() <= 1 {
                        journal::wait_for_company(
                            &self.queue_event,
                            &*self.clock,
                            link.journal.commit_delay_us(),
                            || self.closed.get(),
                        )
                        .await;
                    } else {
                        // The journal's own delay gathers the partitions: this log's next entry is built when it
                        // ends, with the appends that arrive meanwhile, instead of queued now without them.
                        link.journal.next_pass().await;
                    }
                }
            }
        }
    }

    /// The write-behind buffer, when this log uses one (a journal makes its frames durable, and
    /// `write_behind_bytes` is not 0).
    fn write_behind(&self) -> Option<&Rc<Behind>> {
        (self.journal.is_some() && self.opts.write_behind_bytes > 0).then_some(&self.behind)
    }

    /// The active segment's zero-filled reserve is above what an idle partition may keep.
    fn idle_reserve_excess(&self) -> bool {
        let st = self.state.borrow();
        let active = st.segments.last().expect("a log always has a segment");
        active.zeroed_to > active.len + PREZERO_IDLE_BYTES
    }

    /// Cuts the active segment's reserve down to `PREZERO_IDLE_BYTES` (runs in the writer task, between batches).
    async fn trim_idle_reserve(&self) {
        let (file, keep) = {
            let st = self.state.borrow();
            let active = st.segments.last().expect("a log always has a segment");
            (active.open_file(), active.len + PREZERO_IDLE_BYTES)
        };
        match file.truncate(keep).await {
            Ok(()) => {
                let mut st = self.state.borrow_mut();
                let active = st.segments.last_mut().expect("a log always has a segment");
                active.zeroed_to = active.zeroed_to.min(keep);
            }
            Err(e) => {
                warn!(dir = %self.dir.display(), error = %e, "cannot trim an idle segment's reserve")
            }
        }
    }

    /// Takes queued appends up to MAX_BATCH_BYTES (at least one).
    fn take_batch(&self) -> Option<Vec<Pending>> {
        let mut queue = self.queue.borrow_mut();
        if queue.is_empty() {
            return None;
        }
        let budget = MAX_BATCH_BYTES.min(self.opts.segment_bytes);
        let mut bytes = 0u64;
        let mut take = 0;
        for p in queue.iter() {
            let len = p.bytes;
            if take > 0 && bytes + len > budget {
                break;
            }
            bytes += len;
            take += 1;
        }
        let rest = queue.split_off(take);
        Some(std::mem::replace(&mut *queue, rest))
    }

    async fn write_batch(&self, batch: Vec<Pending>) {
        if self.poisoned.get() {
            for p in batch {
                let _ = p.reply.send(Err(AppendError::Poisoned));
            }
            return;
        }
        self.batches.set(self.batches.get() + 1);
        match self.write_and_sync(&batch).await {
            Ok(first) => {
                let mut next = first;
                for p in batch {
                    let n = p.payloads.len() as u64;
                    let _ = p.reply.send(Ok(next));
                    next += n;
                }
                let n = {
                    let st = self.state.borrow();
                    (st.next_offset - first) as usize
                };
                self.appended.notify(usize::MAX);
                if let Some(f) = self.on_append.borrow().as_ref() {
                    f(n);
                }
            }
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Writes the batch to the active segment (rolling first if it would overflow) and syncs per policy.
    /// On success assigns the offsets; on failure leaves no trace (positions and file length rolled back).
    async fn write_and_sync(&self, batch: &[Pending]) -> Result<u64, AppendError> {
        let batch_bytes: u64 = batch.iter().map(|p| p.bytes).sum();
        let records: usize = batch.iter().map(|p| p.payloads.len()).sum();
        let (active_len, first) = {
            let st = self.state.borrow();
            let active = st.segments.last().expect("a log always has a segment");
            (active.len, st.next_offset)
        };
        if active_len > 0 && active_len + batch_bytes > self.opts.segment_bytes {
            self.roll(first).await?;
        }
        let timestamp_ms = self.clock.wall_ms();
        let (file, start_pos, old_positions, zeroed_to, base) = {
            let mut st = self.state.borrow_mut();
            let active = st.segments.last_mut().expect("a log always has a segment");
            let start_pos = active.len;
            let old_positions = active.positions.len();
            (
                active.open_file(),
                start_pos,
                old_positions,
                active.zeroed_to,
                active.base,
            )
        };
        // With a journal, the frames are built inside the journal entry and written to the segment from there.
        let mut buf = match &self.journal {
            Some(link) => journal::begin_entry(
                &link.head(base, start_pos, first, records as u32),
                batch_bytes as usize,
            ),
            None => Vec::with_capacity(batch_bytes as usize),
        };
        let frames_at = buf.len();
        let mut positions = Vec::with_capacity(records);
        let records = batch.iter().flat_map(|p| {
            p.payloads
                .iter()
                .enumerate()
                .map(|(i, payload)| (payload, p.meta.get(i).copied().unwrap_or(false)))
        });
        for (i, (payload, meta)) in records.enumerate() {
            positions.push((start_pos + (buf.len() - frames_at) as u64) as u32);
            frame::encode_record(first + i as u64, timestamp_ms, payload, meta, &mut buf);
        }
        self.write_built(Built {
            buf,
            frames_at,
            file,
            start_pos,
            old_positions,
            zeroed_to,
            base,
            first,
            positions,
            timestamp_ms,
        })
        .await
    }

    /// Writes a batch of frames built at the end of the active segment (by an append, or shipped by a leader and
    /// checked: `follow.rs`), makes it durable per policy, and assigns its offsets; on failure leaves no trace.
    async fn write_built(&self, built: Built) -> Result<u64, AppendError> {
        let Built {
            buf,
            frames_at,
            file,
            start_pos,
            old_positions,
            zeroed_to,
            base,
            first,
            positions,
            timestamp_ms,
        } = built;
        let records = positions.len();
        let end = start_pos + (buf.len() - frames_at) as u64;
        // A leader ships the frames once durable (the buffer itself goes to the journal below); only a log with a
        // journal ships (its link names the partition; a follower writes through its own journal).
        let shipped = (self.journal.is_some() && self.on_ship.borrow().is_some())
            .then(|| buf[frames_at..].to_vec());
        // Into the tail now (the entry moves to the journal below): see `Tail` for why this is safe before the
        // batch is durable.
        self.tail.borrow_mut().push(
            base,
            start_pos,
            &buf[frames_at..],
            self.opts.tail_cache_bytes as usize,
        );
        let result = match self.write_behind() {
            Some(behind) => {
                let frames = &buf[frames_at..];
                let cap = self.opts.write_behind_bytes as usize;
                // A batch of a quarter of the buffer or more gains nothing from waiting: it is written at once.
                let direct = frames.len() >= cap / 4;
                let flushed = if direct
                    || !behind.continues(base, start_pos)
                    || behind.len() + frames.len() > cap
                {
                    behind.flush()
                } else {
                    Ok(())
                };
                flushed.and_then(|()| {
                    if direct {
                        file.write_at(frames, start_pos)
                    } else {
                        behind.push(&file, base, start_pos, frames);
                        Ok(())
                    }
                })
            }
            None => file.write_at(&buf[frames_at..], start_pos),
        };
        let mut new_zeroed_to = zeroed_to.max(end);
        // The zero reserve saves the segment's per-batch sync a metadata commit; with a journal there is no such sync.
        if result.is_ok() && end > zeroed_to && self.journal.is_none() {
            // Best effort: on a nearly full disk the reserve may not fit while the batch did.
            let reserve = end.clamp(PREZERO_MIN_BYTES, PREZERO_MAX_BYTES);
            let reserve_to = (end + reserve).min(self.opts.segment_bytes).max(end);
            if file
                .write_at(&vec![0u8; (reserve_to - end) as usize], end)
                .is_ok()
            {
                new_zeroed_to = reserve_to;
            } else if file.truncate(end).await.is_err() {
                self.poisoned.set(true);
            }
        }
        if let Err(e) = result {
            self.state
                .borrow_mut()
                .segments
                .last_mut()
                .expect("a log always has a segment")
                .zeroed_to = start_pos;
            error!(dir = %self.dir.display(), error = %e, "append failed; rolling back");
            // A failed or short write may have left bytes past start_pos: cut them so the next batch lands cleanly.
            if let Err(te) = file.truncate(start_pos).await {
                error!(dir = %self.dir.display(), error = %te, "cannot truncate after a failed write: refusing appends until restart");
                self.poisoned.set(true);
            }
            return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                AppendError::NoSpace
            } else {
                AppendError::Io(io_text(e))
            });
        }
        // (Only for a batch that ships: an unreplicated partition's append builds no head.)
        let head = shipped
            .as_ref()
            .and(self.journal.as_ref())
            .map(|link| link.head(base, start_pos, first, records as u32));
        // Shipped before its sync: its followers write and sync it while the journal does here. The commit offset
        // counts this replica only for what its log holds durably (`Partition::recompute_commit`), so a produce is
        // still answered only once it is durable here too.
        // Only with room reserved in the journal, so that a full disk cannot refuse its pass (an error of the
        // disk itself still can: then the log is poisoned, below); without, it ships once durable.
        let mut shipped = shipped;
        let early = self.ship_early.get()
            && shipped.is_some()
            && self
                .journal
                .as_ref()
                .is_some_and(|link| link.journal.reserve(buf.len() as u64));
        if early {
            if let (Some(frames), Some(ship), Some(head)) =
                (shipped.take(), self.on_ship.borrow().as_ref(), &head)
            {
                ship(head, &frames);
            }
        }
        if let Some(link) = &self.journal {
            let behind = self.write_behind().cloned();
            if let Err(e) = link
                .journal
                .commit(buf, records as u32, file.clone(), behind, early)
                .await
            {
                if early {
                    // Its followers may hold it: no other records may take these offsets in this leadership, so
                    // appends are refused until a restart (which leads only at a newer epoch, `Ship::Renew`). (A
                    // renewal without a restart is not built: the node simulation found a loss in a first version.)
                    error!(dir = %self.dir.display(), error = ?e, "a batch shipped before its sync cannot be made durable here: refusing appends until restart");
                    self.poisoned.set(true);
                    let _ = self.behind.take_back(base, start_pos);
                    return Err(e);
                }
                // Frames still buffered behind are taken back; written ones are cut from the file below.
                let taken_back = self.behind.take_back(base, start_pos);
                if link.journal.is_poisoned() {
                    error!(dir = %self.dir.display(), error = ?e, "the journal failed: refusing appends until restart");
                    self.poisoned.set(true);
                    return Err(e);
                }
                // Not in the journal: roll the segment back as for a failed write, so the next batch lands cleanly.
                warn!(dir = %self.dir.display(), error = ?e, "journal commit refused; rolling back");
                if taken_back {
                    return Err(e);
                }
                if let Err(te) = file.truncate(start_pos).await {
                    error!(dir = %self.dir.display(), error = %te, "cannot truncate after a refused commit: refusing appends until restart");
                    self.poisoned.set(true);
                }
                return Err(e);
            }
        } else if self.opts.fsync == FsyncPolicy::Always {
            if let Err(e) = file
                .sync()
                .await
                .inspect(|_| self.syncs.set(self.syncs.get() + 1))
            {
                error!(dir = %self.dir.display(), error = %e, "fdatasync failed: refusing appends until restart");
                self.poisoned.set(true);
                return Err(AppendError::Io(io_text(e)));
            }
        }
        let mut st = self.state.borrow_mut();
        let active = st.segments.last_mut().expect("a log always has a segment");
        assert_eq!(active.positions.len(), old_positions);
        active.positions.extend_from_slice(&positions);
        active.len = end;
        active.zeroed_to = new_zeroed_to;
        active.last_timestamp_ms = timestamp_ms;
        st.next_offset = first + records as u64;
        st.dirty = true;
        drop(st);
        if let (Some(frames), Some(ship), Some(head)) =
            (shipped, self.on_ship.borrow().as_ref(), &head)
        {
            ship(head, &frames);
        }
        Ok(first)
    }

    /// Seals the active segment (synced) and starts a new one at `base`.
    async fn roll(&self, base: u64) -> Result<(), AppendError> {
        let (old, len) = self
            .state
            .borrow()
            .segments
            .last()
            .map(|s| (s.open_file(), s.len))
            .expect("a log always has a segment");
        // The frames still behind go to the segment before it is sealed.
        if let Err(e) = self.behind.flush() {
            error!(dir = %self.dir.display(), error = %e, "cannot write a segment's last frames before it rolls; refusing appends until restart");
            self.poisoned.set(true);
            return Err(AppendError::Io(io_text(e)));
        }
        // Drop the zero-filled reserve: a sealed segment ends at its last frame.
        let sealed = match old.truncate(len).await {
            Ok(()) => old
                .sync()
                .await
                .inspect(|_| self.syncs.set(self.syncs.get() + 1)),
            Err(e) => Err(e),
        };
        if let Err(e) = sealed {
            self.poisoned.set(true);
            return Err(AppendError::Io(io_text(e)));
        }
        let segment = Self::create_segment(&*self.storage, &self.dir, base)
            .await
            .map_err(|e| AppendError::Io(io_text(e)))?;
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|e| AppendError::Io(io_text(e)))?;
        info!(dir = %self.dir.display(), base, "rolled to a new segment");
        let mut st = self.state.borrow_mut();
        if let Some(sealed) = st.segments.last_mut() {
            sealed.file = None;
        }
        st.segments.push(segment);
        Ok(())
    }

    async fn sync_if_dirty(&self) {
        let file = {
            let mut st = self.state.borrow_mut();
            if !st.dirty {
                return;
            }
            st.dirty = false;
            st.segments.last().map(|s| s.open_file())
        };
        if let Some(file) = file {
            if let Err(e) = file
                .sync()
                .await
                .inspect(|_| self.syncs.set(self.syncs.get() + 1))
            {
                error!(dir = %self.dir.display(), error = %e, "fdatasync failed: refusing appends until restart");
                self.poisoned.set(true);
            }
        }
    }

    async fn final_sync(&self) {
        self.state.borrow_mut().dirty = true;
        self.sync_if_dirty().await;
    }

    /// Stops accepting appends, lets the writer finish the queue, syncs. Idempotent.
    pub async fn close(&self) {
        self.closed.set(true);
        self.queue_event.notify(usize::MAX);
        // A writer holding its next batch for a commit (`wait_for_commit`) stops holding it.
        self.commit_moved.notify(usize::MAX);
        while !self.writer_done.get() {
            let listener = self.writer_done_event.listen();
            if self.writer_done.get() {
                break;
            }
            listener.await;
        }
    }

    /// The end of the run of known-unreadable offsets holding `offset`, if it is in one.
    pub fn corrupt_run_end(&self, offset: u64) -> Option<u64> {
        self.state
            .borrow()
            .corrupt
            .run_at(offset)
            .map(|(_, end)| end)
    }

    /// Moves the log's end up to `offset` when a durable frontier proves that offsets below it existed but recovery
    /// found fewer (a damaged or lost tail): the missing offsets are recorded as lost (never delivered, counted as
    /// corrupt) and the next append gets `offset`, never an offset a consumer may already have settled. The gap is
    /// kept on disk by starting a new segment at `offset` (recovery reads a gap between segments as lost offsets).
    pub async fn skip_to(&self, offset: u64) -> std::io::Result<()> {
        let (end, active_empty, active_path) = {
            let st = self.state.borrow();
            let active = st.segments.last().expect("a log always has a segment");
            (st.next_offset, active.len == 0, active.path.clone())
        };
        if offset <= end {
            return Ok(());
        }
        assert!(
            self.queue.borrow().is_empty(),
            "skip_to must run before the first append"
        );
        let segment = Self::create_segment(&*self.storage, &self.dir, offset).await?;
        if active_empty {
            // An empty active segment holds nothing: it is replaced by the one at the new base.
            self.storage.remove(&active_path).await?;
        } else {
            let old = self
                .state
                .borrow()
                .segments
                .last()
                .map(|s| (s.open_file(), s.len));
            if let Some((file, len)) = old {
                file.truncate(len).await?;
                file.sync().await?;
            }
        }
        self.storage.sync_dir(&self.dir).await?;
        error!(dir = %self.dir.display(), from = end, to = offset, "the durable frontier is beyond the recovered log end: offsets from..to are lost and counted as corrupt; the log continues at the frontier");
        let mut st = self.state.borrow_mut();
        if active_empty {
            st.segments.pop();
        } else if let Some(sealed) = st.segments.last_mut() {
            sealed.file = None;
        }
        st.segments.push(segment);
        st.corrupt.insert(end, offset);
        st.next_offset = offset;
        Ok(())
    }

    /// Deletes sealed segments whose newest record is older than `retention_ms` and that hold nothing at or above
    /// `keep_from` (a replicated leader's commit offset: a record a majority does not hold yet stays, so a later
    /// commit never counts a record no replica has); returns the new start offset.
    pub async fn apply_retention(&self, now_ms: u64, retention_ms: u64, keep_from: u64) -> u64 {
        loop {
            if self.cutting.get() {
                // A cut of a diverged tail holds indices into the segments across its awaits: next time.
                break;
            }
            let victim = {
                let st = self.state.borrow();
                match st.segments.as_slice() {
                    [first, second, ..]
                        if first.last_timestamp_ms.saturating_add(retention_ms) < now_ms
                            && second.base <= keep_from =>
                    {
                        Some(first.path.clone())
                    }
                    _ => None,
                }
            };
            let Some(path) = victim else { break };
            let segment = {
                let mut st = self.state.borrow_mut();
                let seg = st.segments.remove(0);
                let start = st.segments[0].base;
                st.corrupt.drop_below(start);
                seg
            };
            self.sealed_cache
                .borrow_mut()
                .take_if(|(base, _)| *base == segment.base);
            info!(segment = %path.display(), "retention removed a segment");
            if let Err(e) = self.storage.remove(&path).await {
                warn!(segment = %path.display(), error = %e, "cannot remove an expired segment");
            }
            drop(segment);
        }
        self.start_offset()
    }
}
