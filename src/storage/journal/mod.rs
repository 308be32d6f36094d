//! The per-core journal: one group commit per core, whatever the number of partitions.
//!
//! Lives on one core (`Rc`, no locks); every partition log of that core holds an `Rc<Journal>`. A log hands its
//! batch's frames, wrapped in a journal entry, to [`Journal::commit`], and writes the same bytes to its own segment
//! file (page cache, no sync) behind it: at once, or gathered in its write-behind buffer (`storage::behind`). The core's committer task takes every entry queued since its last pass, writes them to the
//! journal file with one `pwrite` and makes them durable with one `fdatasync` (fsync `always`), then answers them all:
//! sixteen or a thousand partitions pay for one sync per pass, as one partition does. Requests that arrive while a
//! sync runs are served in the next pass (group commit), as ScyllaDB's per-shard commitlog and Cassandra's
//! `commitlog_sync: batch` do. When several partitions are appended to at once (the last pass carried more than one
//! entry), the committer waits `commit_delay_us` after that pass before taking the next one, entries queued during
//! its sync included, so one sync serves more entries (PostgreSQL's `commit_delay`). A single partition's log gathers its own appenders into
//! one entry while the previous one syncs; when that entry carried several, and the journal's last pass carried one
//! partition's entry only, the log waits the same delay before writing its next one (one wait per commit path,
//! never two stacked). When the last pass carried several partitions' entries, a log whose entry rode it builds its
//! next one as the committer's delay ends ([`Journal::next_pass`]), so the appends made during the delay ride the
//! next pass instead of the one after. A lone appender never waits. With `interval:MS` the committer writes
//! without syncing and a timer syncs the journal.
//!
//! Segment files are made durable behind the journal: when a journal file has grown past `file_bytes`, the committer
//! starts a new one and a checkpoint writes the frames its entries' logs still hold behind, syncs every segment file
//! written during the old one, then deletes it. At start,
//! before any partition opens, [`replay`] rewrites into the segments whatever a crash kept out of them (an entry whose
//! bytes the segment does not hold at that position), syncs them, and deletes the journal files; every core then
//! starts a fresh journal. The format is in `docs/format.md` ("Journal").
//!
//! A journal write or sync that fails poisons the journal: every later commit is refused until a restart replays
//! from disk (a failed fdatasync may have dropped pages; retrying it could report a false success).

//!
//! Three rooms: the entry format and its scanner ([`entry`]), the committer (this file), and the replay at start
//! ([`replay`]).

mod entry;
mod replay;

pub use entry::*;
pub use replay::*;

use super::backend::{SegmentFile, Storage};
use super::behind::Behind;
use super::error::AppendError;
use super::FsyncPolicy;
use crate::clock::Clock;
use event_listener::Event;
use futures_channel::oneshot;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tracing::{error, info, warn};

/// Zeros kept written ahead of the journal's write position, so most syncs flush data blocks only (no file-size
/// change for the file system to commit): 1 MiB, or a quarter of the file size if that is less.
const ZERO_AHEAD_BYTES: u64 = 1 << 20;

pub(super) fn zero_ahead(file_bytes: u64) -> u64 {
    ZERO_AHEAD_BYTES.min(file_bytes / 4).max(512)
}
/// Largest number of entry bytes one pass writes (further entries wait for the next pass). 8 MiB.
const MAX_PASS_BYTES: usize = 8 << 20;

/// The commit delay's wait: `delay_us` on `clock`, cut short when `done()` holds (the journal or log is closing),
/// checked each time `event` fires. Returns at once when `delay_us` is 0.
pub(super) async fn wait_for_company(
    event: &Event,
    clock: &dyn Clock,
    delay_us: u64,
    done: impl Fn() -> bool,
) {
    if delay_us == 0 {
        return;
    }
    let mut timer = clock.sleep_until_us(clock.now_us() + delay_us);
    loop {
        let listener = event.listen();
        if done() {
            return;
        }
        let woken = futures_lite::future::or(
            async {
                listener.await;
                true
            },
            async {
                timer.as_mut().await;
                false
            },
        )
        .await;
        if !woken {
            return;
        }
    }
}

/// How a core's journal behaves.
#[derive(Debug, Clone, Copy)]
pub struct JournalOptions {
    /// `Always`: one fdatasync per pass before the answers; `IntervalMs`: answers after the write, a timer syncs.
    pub fsync: FsyncPolicy,
    /// A journal file past this many bytes is replaced by a new one and checkpointed.
    pub file_bytes: u64,
    /// `Always`: after a pass that carried entries of more than one partition log (several partitions are being
    /// appended to at once), wait this long before taking the next pass, whether or not entries are queued already,
    /// so one sync serves more of them (PostgreSQL's `commit_delay` with `commit_siblings`; MySQL's
    /// `binlog_group_commit_sync_delay`). A lone appender never waits. 0 turns it off.
    pub commit_delay_us: u64,
}

/// An entry waiting for the committer.
/// How many of the queued entries (their lengths, in queue order) the next pass takes: as many as fit in `max`
/// bytes, and always the first (an entry larger than `max` goes alone), so a pass is never empty while entries
/// wait and never larger than `max` unless one entry is.
fn pass_len(lens: impl Iterator<Item = usize>, max: usize) -> usize {
    let mut bytes = 0usize;
    let mut take = 0usize;
    for len in lens {
        if take > 0 && bytes + len > max {
            break;
        }
        bytes += len;
        take += 1;
    }
    take
}

struct Queued {
    entry: Vec<u8>,
    records: u32,
    /// The segment file its frames were written to (synced at the checkpoint of the journal file it lands in);
    /// None for an entry of frontiers.
    segment: Option<Rc<dyn SegmentFile>>,
    /// The log's write-behind buffer, when its frames may still be there (flushed before that checkpoint).
    behind: Option<Rc<Behind>>,
    /// It holds room below the zeros already written ([`Journal::reserve`]): its pass writes it even when the zeros
    /// ahead cannot be extended.
    reserved: bool,
    queued_at_us: u64,
    reply: oneshot::Sender<Result<(), AppendError>>,
}

/// Files (or buffers) a journal file's entries touched, each once, in the order first touched: written back in that
/// order, which does not depend on where they sit in memory (a simulated seed replays exactly).
struct Touched<T: ?Sized> {
    seen: std::collections::HashSet<usize>,
    items: Vec<Rc<T>>,
}

impl<T: ?Sized> Default for Touched<T> {
    fn default() -> Self {
        Touched {
            seen: Default::default(),
            items: Vec::new(),
        }
    }
}

impl<T: ?Sized> Clone for Touched<T> {
    fn clone(&self) -> Self {
        Touched {
            seen: self.seen.clone(),
            items: self.items.clone(),
        }
    }
}

impl<T: ?Sized> Touched<T> {
    fn add(&mut self, item: &Rc<T>) {
        if self.seen.insert(Rc::as_ptr(item) as *const u8 as usize) {
            self.items.push(item.clone());
        }
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn iter(&self) -> impl Iterator<Item = &Rc<T>> {
        self.items.iter()
    }
}

/// The journal file being written.
struct Current {
    file: Rc<dyn SegmentFile>,
    path: PathBuf,
    index: u64,
    pos: u64,
    zeroed_to: u64,
    /// Segment files written while this journal file is current.
    segments: Touched<dyn SegmentFile>,
    /// Write-behind buffers of the logs whose entries this journal file holds.
    behinds: Touched<Behind>,
    /// Written since the last sync (interval mode).
    dirty: bool,
}

/// Counters for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JournalStats {
    pub syncs: u64,
    pub passes: u64,
    pub entries: u64,
    pub records: u64,
    pub bytes: u64,
    pub checkpoints: u64,
    /// Passes that carried entries of several partitions' logs.
    pub shared_passes: u64,
    /// Times a log waited in `next_pass` for the commit delay to end before building its next entry.
    pub next_pass_waits: u64,
}

/// What one pass took (µs), for the observer.
pub struct PassTimes<'a> {
    /// Records made durable.
    pub records: u64,
    /// Each entry's whole wait: queue, write and sync.
    pub waits: &'a [u64],
    /// The pass itself, from its start to now: an entry waited `wait - pass_us` for it to start.
    pub pass_us: u64,
    /// The pass's write (the zeros ahead included).
    pub write_us: u64,
    /// Its fdatasync (fsync `always`), else None.
    pub sync_us: Option<u64>,
}

/// Called after each pass with what it took.
pub type PassObserver = Box<dyn Fn(&PassTimes<'_>)>;

/// What a checkpoint asks of the journal's owner (the core's engine) before it removes a journal file that may hold
/// frontier records: every frontier the journal recorded written to its frontier file, since only the owner knows
/// the newest values. Given to [`Journal::open`] and held weakly (the owner holds the journal); an owner that is
/// gone wrote its files as its partitions closed. Storage never names the engine: the arrow points down.
pub trait Checkpoint {
    /// Writes every frontier file that is behind its frontier; true when all of them are durable there.
    fn write_frontier_files(
        self: Rc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>>;
}

/// An owner with no frontiers to write (tests of the journal alone).
pub struct NoFrontiers;

impl Checkpoint for NoFrontiers {
    fn write_frontier_files(
        self: Rc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>> {
        Box::pin(async { true })
    }
}

/// No owner: checkpoints write no frontier file.
pub fn no_frontiers() -> std::rc::Weak<dyn Checkpoint> {
    std::rc::Weak::<NoFrontiers>::new()
}

/// One core's journal and its committer.
pub struct Journal {
    storage: Rc<dyn Storage>,
    clock: Rc<dyn Clock>,
    dir: PathBuf,
    core: usize,
    opts: JournalOptions,
    current: RefCell<Current>,
    queue: RefCell<Vec<Queued>>,
    queue_event: Event,
    next_seq: Cell<u64>,
    poisoned: Cell<bool>,
    closed: Cell<bool>,
    done: Cell<bool>,
    done_event: Event,
    stats: Cell<JournalStats>,
    /// Told after each pass: records made durable, and how long each entry waited for it (µs).
    observer: RefCell<Option<PassObserver>>,
    /// Journal files replaced by a newer one and not checkpointed yet, oldest first. They are checkpointed in this
    /// order, one at a time, and one that cannot be (a frontier file that cannot be written) stops the others, so a
    /// journal file never outlives a newer one: the replay sees a group's start record whenever it sees the records
    /// before it.
    pending: RefCell<std::collections::VecDeque<Current>>,
    /// The checkpoint task runs (checkpoints still running: 0 or 1).
    checkpoints_running: Cell<usize>,
    /// Entries of frames the last pass carried (the commit delay applies only after a pass of more than one).
    last_pass_entries: Cell<usize>,
    /// The committer is in its commit delay; `gather_event` fires when the delay ends, just before the next pass is
    /// taken (see [`Journal::next_pass`]).
    delaying: Cell<bool>,
    gather_event: Event,
    /// Writes the frontier files before a checkpoint removes a journal file that may hold frontier records.
    owner: std::rc::Weak<dyn Checkpoint>,
    /// `close` keeps the current file (`keep_on_close`).
    keep_on_close: Cell<bool>,
    /// A rotation is asked for at the committer's next turn ([`Journal::checkpoint_now`]).
    rotate_asked: Cell<bool>,
    /// The index of the newest journal file checkpointed and removed (files go in order).
    checkpointed_through: Cell<Option<u64>>,
    /// Checkpoints (or rotations) that failed since open; `checkpoint_event` fires at each checkpoint's end, at a
    /// failure, and when the journal is poisoned or closes.
    checkpoint_failures: Cell<u64>,
    checkpoint_event: Event,
    /// Bytes of entries that reserved room ([`Journal::reserve`]) and are not written yet. Always
    /// `current.pos + reserved <= current.zeroed_to` and `reserved <= zero_ahead(file_bytes)` (so a new file's zeros
    /// hold them too).
    reserved: Cell<u64>,
    /// Overwriting the zeros ahead needs no new space on this file system (`Storage::overwrites_in_place`):
    /// reservations are refused otherwise.
    in_place: bool,
}

fn file_name(core: usize, index: u64) -> String {
    format!("{core:04}-{index:020}.jnl")
}

impl Journal {
    /// Starts core `core`'s journal in `dir` (created if missing) with a new file, and its committer task; `owner`
    /// writes the frontier files at checkpoints. Files
    /// of earlier runs must have been replayed and removed first ([`replay`]).
    pub async fn open(
        storage: Rc<dyn Storage>,
        clock: Rc<dyn Clock>,
        dir: &Path,
        core: usize,
        opts: JournalOptions,
        owner: std::rc::Weak<dyn Checkpoint>,
    ) -> std::io::Result<Rc<Journal>> {
        assert!(
            !matches!(opts.fsync, FsyncPolicy::Never),
            "fsync never runs without a journal"
        );
        storage.create_dir_all(dir)?;
        let current =
            Self::create_file(&*storage, dir, core, 0, zero_ahead(opts.file_bytes)).await?;
        // Reserved room is only room where an overwrite of the zeros needs no new blocks.
        let in_place = storage.overwrites_in_place(dir);
        if !in_place {
            warn!(core, dir = %dir.display(), "the journal's file system allocates on overwrite (copy-on-write: btrfs, ZFS, bcachefs) or cannot be told: no journal room is reserved, so a replicated leader ships each batch once durable (replica_ship_early has no effect)");
        }
        let journal = Rc::new(Journal {
            in_place,
            storage,
            clock,
            dir: dir.to_path_buf(),
            core,
            opts,
            current: RefCell::new(current),
            queue: RefCell::new(Vec::new()),
            queue_event: Event::new(),
            next_seq: Cell::new(1),
            poisoned: Cell::new(false),
            closed: Cell::new(false),
            done: Cell::new(false),
            done_event: Event::new(),
            stats: Cell::new(JournalStats::default()),
            observer: RefCell::new(None),
            pending: RefCell::new(Default::default()),
            checkpoints_running: Cell::new(0),
            last_pass_entries: Cell::new(0),
            delaying: Cell::new(false),
            gather_event: Event::new(),
            owner,
            keep_on_close: Cell::new(false),
            rotate_asked: Cell::new(false),
            checkpointed_through: Cell::new(None),
            checkpoint_failures: Cell::new(0),
            checkpoint_event: Event::new(),
            reserved: Cell::new(0),
        });
        glommio::spawn_local(journal.clone().run_committer()).detach();
        if let FsyncPolicy::IntervalMs(ms) = opts.fsync {
            glommio::spawn_local(journal.clone().run_interval_sync(ms)).detach();
        }
        Ok(journal)
    }

    async fn create_file(
        storage: &dyn Storage,
        dir: &Path,
        core: usize,
        index: u64,
        zero_ahead: u64,
    ) -> std::io::Result<Current> {
        let path = dir.join(file_name(core, index));
        let file = storage.open(&path, true).await?;
        file.truncate(0).await?;
        file.write_at(&vec![0u8; zero_ahead as usize], 0)?;
        file.sync().await?;
        storage.sync_dir(dir).await?;
        Ok(Current {
            file,
            path,
            index,
            pos: 0,
            zeroed_to: zero_ahead,
            segments: Touched::default(),
            behinds: Touched::default(),
            dirty: false,
        })
    }

    /// Makes an entry built with [`begin_entry`] (its frames already written to `segment` at the head's position,
    /// or held in `behind` until a flush writes them there) durable under the fsync policy. An error means the entry may or may not be on disk: the caller must not
    /// acknowledge it (and the journal refuses everything after it until a restart).
    /// `reserved`: the entry's room was reserved with [`Journal::reserve`] just before (its length, no await in
    /// between), and is its own until its pass is written or refused.
    pub async fn commit(
        &self,
        entry: Vec<u8>,
        records: u32,
        segment: Rc<dyn SegmentFile>,
        behind: Option<Rc<Behind>>,
        reserved: bool,
    ) -> Result<(), AppendError> {
        self.enqueue(entry, records, Some(segment), behind, reserved)
            .await
    }

    /// Reserves room for an entry of `bytes` below the zeros already written in the journal file, so that its pass
    /// writes it whatever the disk's free space (a full disk refuses only an extension of the zeros, and then the
    /// pass writes its reserved entries and refuses the others): a leader ships a batch before its own sync only
    /// with room reserved (`Log::ship_before_sync`), so a full disk refuses it before anything is shipped. False
    /// when the room left (the zeros ahead, less what is reserved) is too small, or the journal refuses entries;
    /// the entry is then committed without a reservation; always false on a file system that allocates on overwrite
    /// (copy-on-write), where zeros written hold no room. A reservation must be followed by [`Journal::commit`]
    /// with `reserved` before any await.
    pub fn reserve(&self, bytes: u64) -> bool {
        if !self.in_place || self.poisoned.get() || self.closed.get() {
            return false;
        }
        let c = self.current.borrow();
        let reserved = self.reserved.get() + bytes;
        let fits = c.pos + reserved <= c.zeroed_to && reserved <= zero_ahead(self.opts.file_bytes);
        if fits {
            self.reserved.set(reserved);
        }
        fits
    }

    /// Bytes reserved and not written yet.
    pub fn reserved(&self) -> u64 {
        self.reserved.get()
    }

    /// The reservations' invariant: what is reserved fits below the zeros written, and in a new file's.
    fn assert_room(&self, c: &Current) {
        let reserved = self.reserved.get();
        assert!(
            c.pos + reserved <= c.zeroed_to && reserved <= zero_ahead(self.opts.file_bytes),
            "{reserved} bytes reserved, {} left below the zeros written",
            c.zeroed_to.saturating_sub(c.pos)
        );
    }

    /// Gives back the room `entries` reserved (written now, or refused).
    fn release(&self, entries: &[Queued]) {
        self.give_back(
            entries
                .iter()
                .filter(|q| q.reserved)
                .map(|q| q.entry.len() as u64)
                .sum(),
        );
    }

    /// Returns reserved room (callers give each reservation back once; this checks only that no more than is
    /// reserved comes back).
    fn give_back(&self, bytes: u64) {
        assert!(
            bytes <= self.reserved.get(),
            "released {bytes} bytes of {} reserved",
            self.reserved.get()
        );
        self.reserved.set(self.reserved.get() - bytes);
    }

    /// Makes an entry built with [`frontier_entry`] durable under the fsync policy, in the pass that takes it with
    /// whatever frames are queued. Entries are queued in the order of the calls (the call queues at once, before it
    /// awaits), so the records of one group are in the journal in the order its frontier moved.
    pub async fn commit_frontiers(&self, entry: Vec<u8>) -> Result<(), AppendError> {
        self.enqueue(entry, 0, None, None, false).await
    }

    async fn enqueue(
        &self,
        mut entry: Vec<u8>,
        records: u32,
        segment: Option<Rc<dyn SegmentFile>>,
        behind: Option<Rc<Behind>>,
        reserved: bool,
    ) -> Result<(), AppendError> {
        if self.poisoned.get() || self.closed.get() {
            if reserved {
                self.give_back(entry.len() as u64);
            }
            return Err(if self.poisoned.get() {
                AppendError::Poisoned
            } else {
                AppendError::Closed
            });
        }
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        seal_entry(&mut entry, seq);
        let (tx, rx) = oneshot::channel();
        self.queue.borrow_mut().push(Queued {
            entry,
            records,
            segment,
            behind,
            reserved,
            queued_at_us: self.clock.now_us(),
            reply: tx,
        });
        self.queue_event.notify(1);
        rx.await.unwrap_or(Err(AppendError::Closed))
    }

    /// Makes every entry written so far durable now, whatever the fsync policy (with `interval:MS` a group's start
    /// record must be on disk before the group is announced, or a power cut could leave a deleted group's records
    /// to count for it).
    pub async fn sync_now(&self) -> Result<(), AppendError> {
        // Whether or not the file looks dirty: the interval timer's sync may be under way and not done. (A file
        // replaced since the entry was written was synced by the rotation.)
        if self.opts.fsync != FsyncPolicy::Always && !self.poisoned.get() {
            self.sync_current().await;
        }
        if self.poisoned.get() {
            return Err(AppendError::Poisoned);
        }
        Ok(())
    }

    /// Makes every entry written so far durable in its segment file and removes every journal file that holds one:
    /// the committer starts a new file at its next turn, and this returns once that rotation's checkpoint (and any
    /// older one pending) is done. Rare and not cheap (a sync of every segment the files touched): for a log about
    /// to cut its own tail (`Log::truncate_diverged`), whose cut batches a replay must never write back. Err when
    /// the journal is poisoned or closing, or a rotation or checkpoint failed meanwhile (the files stay, in order).
    pub async fn checkpoint_now(&self) -> Result<(), AppendError> {
        let target = self.current.borrow().index;
        let failures = self.checkpoint_failures.get();
        self.rotate_asked.set(true);
        self.queue_event.notify(1);
        loop {
            let listener = self.checkpoint_event.listen();
            if self.checkpointed_through.get().is_some_and(|i| i >= target) {
                return Ok(());
            }
            if self.poisoned.get() {
                return Err(AppendError::Poisoned);
            }
            if self.closed.get() {
                return Err(AppendError::Closed);
            }
            if self.checkpoint_failures.get() != failures {
                return Err(AppendError::Io(
                    "a journal checkpoint failed (see the log)".into(),
                ));
            }
            listener.await;
        }
    }

    /// Makes `close` keep the journal file (its segments still written back): the core could not write a frontier
    /// file, and the replay at the next start brings it up to date from the journal.
    pub fn keep_on_close(&self) {
        self.keep_on_close.set(true);
    }

    /// Counters since open.
    /// How long an append that has company waits for more before it is written (`commit_delay_us` under fsync
    /// `always`; 0 otherwise, where no append waits for a sync).
    pub fn commit_delay_us(&self) -> u64 {
        match self.opts.fsync {
            FsyncPolicy::Always => self.opts.commit_delay_us,
            _ => 0,
        }
    }

    /// Waits, if the committer is in its commit delay, until that delay ends and the next pass is about to be
    /// taken. A log whose entry rode a pass of several partitions' entries builds its next one then, rather than
    /// queue it at once and leave the appends that arrive during the delay to the pass after.
    pub async fn next_pass(&self) {
        if self.delaying.get() && !self.closed.get() {
            self.bump(|s| s.next_pass_waits += 1);
        }
        while self.delaying.get() && !self.closed.get() {
            let listener = self.gather_event.listen();
            if !self.delaying.get() || self.closed.get() {
                return;
            }
            listener.await;
        }
    }

    /// Whether the committer is in its commit delay now (waiting for company before its next pass).
    pub fn is_delaying(&self) -> bool {
        self.delaying.get()
    }

    /// Entries the last pass carried (several: appends of several partitions share the journal's commit delay).
    pub fn last_pass_entries(&self) -> usize {
        self.last_pass_entries.get()
    }

    pub fn stats(&self) -> JournalStats {
        self.stats.get()
    }

    /// Registers the pass observer (metrics).
    pub fn set_observer(&self, observer: PassObserver) {
        *self.observer.borrow_mut() = Some(observer);
    }

    /// Whether a failed write or sync has stopped the journal.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.get()
    }

    /// Stops taking entries, answers the queued ones, syncs, and (call it after the core's logs are closed) leaves
    /// no journal file behind: the segments written since the last checkpoint are synced and the file removed, so a
    /// clean stop starts without a replay. Idempotent.
    pub async fn close(&self) {
        self.closed.set(true);
        self.queue_event.notify(usize::MAX);
        self.checkpoint_event.notify(usize::MAX);
        while !self.done.get() {
            let listener = self.done_event.listen();
            if self.done.get() {
                break;
            }
            listener.await;
        }
        while self.checkpoints_running.get() > 0 {
            self.clock.sleep_until(self.clock.now_ms() + 1).await;
        }
        // Files a checkpoint could not finish get one more try; any left keep the current one too (the replay at
        // the next start takes them in order).
        self.run_checkpoints().await;
        if self.poisoned.get() || !self.pending.borrow().is_empty() {
            return;
        }
        let keep = self.keep_on_close.get();
        let (segments, behinds, path) = {
            let mut c = self.current.borrow_mut();
            (
                std::mem::take(&mut c.segments),
                std::mem::take(&mut c.behinds),
                c.path.clone(),
            )
        };
        if !self.write_back(segments, &behinds, &path, "closing").await || keep {
            return;
        }
        if self.storage.remove(&path).await.is_ok() {
            let _ = self.storage.sync_dir(&self.dir).await;
        }
    }

    fn bump(&self, f: impl FnOnce(&mut JournalStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    fn take_pass(&self) -> Vec<Queued> {
        let mut queue = self.queue.borrow_mut();
        let take = pass_len(queue.iter().map(|q| q.entry.len()), MAX_PASS_BYTES);
        let rest = queue.split_off(take);
        std::mem::replace(&mut *queue, rest)
    }

    async fn run_committer(self: Rc<Self>) {
        loop {
            let listener = self.queue_event.listen();
            if self.rotate_asked.take() && !self.poisoned.get() && !self.closed.get() {
                self.rotate().await;
                continue;
            }
            let pass = self.take_pass();
            if pass.is_empty() {
                if self.closed.get() {
                    if !self.poisoned.get() && self.current.borrow().dirty {
                        self.sync_current().await;
                    }
                    self.done.set(true);
                    self.done_event.notify(usize::MAX);
                    return;
                }
                listener.await;
                continue;
            }
            drop(listener);
            self.write_pass(pass).await;
            if self.last_pass_entries.get() > 1 && !self.closed.get() {
                self.delaying.set(true);
                wait_for_company(
                    &self.queue_event,
                    &*self.clock,
                    self.commit_delay_us(),
                    || self.closed.get(),
                )
                .await;
                self.delaying.set(false);
                // Logs that held their next entry back for this moment (`next_pass`) build it now: one turn of the
                // executor lets them queue it, so it rides this pass with every append that arrived meanwhile.
                if self.gather_event.notify(usize::MAX) > 0 {
                    futures_lite::future::yield_now().await;
                }
            }
            if !self.poisoned.get() && self.current.borrow().pos >= self.opts.file_bytes {
                self.rotate().await;
            }
        }
    }

    fn poison(&self, what: &str, e: &std::io::Error) {
        error!(core = self.core, error = %e, "journal {what} failed: refusing appends until restart");
        self.poisoned.set(true);
        self.checkpoint_event.notify(usize::MAX);
    }

    async fn write_pass(&self, mut pass: Vec<Queued>) {
        if self.poisoned.get() {
            self.release(&pass);
            for q in pass {
                let _ = q.reply.send(Err(AppendError::Poisoned));
            }
            return;
        }
        let started_us = self.clock.now_us();
        let mut bytes: usize = pass.iter().map(|q| q.entry.len()).sum();
        let (file, pos, zeroed_to) = {
            let c = self.current.borrow();
            (c.file.clone(), c.pos, c.zeroed_to)
        };
        let mut end = pos + bytes as u64;
        // The zeros ahead are written first, so the entries land in blocks the file already has: a full disk
        // refuses the zeros (nothing of the pass is in the journal), never an entry half-way.
        let ahead = zero_ahead(self.opts.file_bytes);
        let mut new_zeroed_to = zeroed_to;
        // Room the queued entries that are not in this pass reserved stays theirs: the pass extends the zeros when
        // it would write into it (after the extension, `end + ahead` covers it: no more than `ahead` is reserved).
        let in_pass: u64 = pass
            .iter()
            .filter(|q| q.reserved)
            .map(|q| q.entry.len() as u64)
            .sum();
        let others = self.reserved.get() - in_pass;
        if end + others > zeroed_to || end + ahead / 2 > zeroed_to {
            let to = end + ahead;
            if let Err(e) = file.write_at(&vec![0u8; (to - zeroed_to) as usize], zeroed_to) {
                let _ = file.truncate(zeroed_to).await;
                // The entries that reserved room (shipped before their sync) still fit below the zeros written:
                // they are written; the others are refused.
                let (kept, refused): (Vec<Queued>, Vec<Queued>) =
                    pass.into_iter().partition(|q| q.reserved);
                warn!(core = self.core, error = %e, written = kept.len(), refused = refused.len(), "cannot extend the journal: the entries without reserved room are refused");
                Self::refuse(refused, &e);
                if kept.is_empty() {
                    return;
                }
                pass = kept;
                bytes = pass.iter().map(|q| q.entry.len()).sum();
                end = pos + bytes as u64;
                assert!(
                    end <= zeroed_to,
                    "reserved entries fit below the zeros written: {end} > {zeroed_to}"
                );
            } else {
                new_zeroed_to = to;
            }
        }
        let written = if pass.len() == 1 {
            file.write_at(&pass[0].entry, pos)
        } else {
            let mut buf = Vec::with_capacity(bytes);
            for q in &pass {
                buf.extend_from_slice(&q.entry);
            }
            file.write_at(&buf, pos)
        };
        if let Err(e) = written {
            // Whatever part of the pass reached the file is zeroed again, so no entry of it (never acknowledged, its
            // segment write rolled back) can be replayed; if even that fails, nothing more is written until a restart.
            error!(core = self.core, error = %e, "a journal write failed: the pass is refused");
            if let Err(scrub) = file.write_at(&vec![0u8; bytes], pos) {
                self.poison("scrub after a failed write", &scrub);
            }
            self.current.borrow_mut().zeroed_to = new_zeroed_to;
            self.release(&pass);
            return Self::refuse(pass, &e);
        }
        self.release(&pass);
        {
            let mut c = self.current.borrow_mut();
            c.pos = end;
            c.zeroed_to = new_zeroed_to;
            self.assert_room(&c);
            c.dirty = true;
            for q in &pass {
                if let Some(segment) = &q.segment {
                    c.segments.add(segment);
                }
                if let Some(behind) = &q.behind {
                    c.behinds.add(behind);
                }
            }
        }
        let written_us = self.clock.now_us();
        let mut synced = false;
        if self.opts.fsync == FsyncPolicy::Always {
            synced = true;
            self.current.borrow_mut().dirty = false;
            if let Err(e) = file.sync().await {
                self.poison("sync", &e);
                for q in pass {
                    let _ = q.reply.send(Err(AppendError::Io(e.to_string())));
                }
                return;
            }
            self.bump(|s| s.syncs += 1);
        }
        let now_us = self.clock.now_us();
        let records: u64 = pass.iter().map(|q| u64::from(q.records)).sum();
        let logs = pass.iter().filter(|q| q.segment.is_some()).count();
        self.last_pass_entries.set(logs);
        self.bump(|s| {
            s.shared_passes += u64::from(logs > 1);
            s.passes += 1;
            s.entries += pass.len() as u64;
            s.records += records;
            s.bytes += bytes as u64;
        });
        if let Some(observe) = self.observer.borrow().as_ref() {
            let waits: Vec<u64> = pass
                .iter()
                .map(|q| now_us.saturating_sub(q.queued_at_us))
                .collect();
            observe(&PassTimes {
                records,
                waits: &waits,
                pass_us: now_us.saturating_sub(started_us),
                write_us: written_us.saturating_sub(started_us),
                sync_us: synced.then(|| now_us.saturating_sub(written_us)),
            });
        }
        for q in pass {
            let _ = q.reply.send(Ok(()));
        }
    }

    /// Answers a pass that was not written: `NoSpace` for a full disk, else the error's text.
    fn refuse(pass: Vec<Queued>, e: &std::io::Error) {
        let error = if e.raw_os_error() == Some(libc::ENOSPC) {
            AppendError::NoSpace
        } else {
            AppendError::Io(e.to_string())
        };
        for q in pass {
            let _ = q.reply.send(Err(error.clone()));
        }
    }

    async fn sync_current(&self) {
        let file = {
            let mut c = self.current.borrow_mut();
            c.dirty = false;
            c.file.clone()
        };
        match file.sync().await {
            Ok(()) => self.bump(|s| s.syncs += 1),
            Err(e) => self.poison("sync", &e),
        }
    }

    async fn run_interval_sync(self: Rc<Self>, interval_ms: u64) {
        while !self.done.get() {
            self.clock
                .sleep_until(self.clock.now_ms() + interval_ms)
                .await;
            if !self.poisoned.get() && self.current.borrow().dirty {
                self.sync_current().await;
            }
        }
    }

    /// Starts a new journal file and checkpoints the old one in the background (after any older one still
    /// pending): sync every segment written while it was current, write the frontier files, then delete it. A
    /// failed segment sync keeps the old file (replayed at the next start); a frontier file that cannot be written
    /// keeps it and every newer one until a later rotation retries.
    async fn rotate(self: &Rc<Self>) {
        let index = self.current.borrow().index + 1;
        if self.opts.fsync != FsyncPolicy::Always {
            // The old file's entries must be durable before its segments' syncs can stand for them. Whether or not
            // it looks dirty: the interval timer's sync may be under way and not done.
            self.sync_current().await;
        }
        let fresh = match Self::create_file(
            &*self.storage,
            &self.dir,
            self.core,
            index,
            zero_ahead(self.opts.file_bytes),
        )
        .await
        {
            Ok(fresh) => fresh,
            Err(e) => {
                // Keep writing the current file; try again after the next pass.
                warn!(core = self.core, error = %e, "cannot start a new journal file");
                self.checkpoint_failures
                    .set(self.checkpoint_failures.get() + 1);
                self.checkpoint_event.notify(usize::MAX);
                return;
            }
        };
        let old = std::mem::replace(&mut *self.current.borrow_mut(), fresh);
        self.assert_room(&self.current.borrow());
        self.pending.borrow_mut().push_back(old);
        if self.checkpoints_running.get() == 0 {
            self.checkpoints_running.set(1);
            let this = self.clone();
            glommio::spawn_local(async move {
                this.run_checkpoints().await;
                this.checkpoints_running.set(0);
            })
            .detach();
        }
    }

    /// Checkpoints the pending journal files, oldest first, until one cannot be (it stays first in line).
    async fn run_checkpoints(&self) {
        loop {
            let Some(old) = self.pending.borrow_mut().pop_front() else {
                return;
            };
            if !self.checkpoint(&old).await {
                self.pending.borrow_mut().push_front(old);
                self.checkpoint_failures
                    .set(self.checkpoint_failures.get() + 1);
                self.checkpoint_event.notify(usize::MAX);
                return;
            }
            self.checkpointed_through.set(Some(old.index));
            self.checkpoint_event.notify(usize::MAX);
        }
    }

    /// Checkpoints one journal file: true when it is gone.
    async fn checkpoint(&self, old: &Current) -> bool {
        let segments = old.segments.len();
        if self.poisoned.get()
            || !self
                .write_back(old.segments.clone(), &old.behinds, &old.path, "checkpoint")
                .await
        {
            return false;
        }
        if let Some(owner) = self.owner.upgrade() {
            if !owner.write_frontier_files().await {
                warn!(core = self.core, journal = %old.path.display(), "checkpoint: a frontier file could not be written; this journal file and the newer ones stay until a later checkpoint or the replay at the next start");
                return false;
            }
        }
        match self.storage.remove(&old.path).await {
            // (Gone already: a checkpoint before this one removed it, and its directory sync failed.)
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                warn!(core = self.core, journal = %old.path.display(), error = %e, "checkpoint: cannot remove a checkpointed journal file; it and the newer ones stay");
                return false;
            }
            _ => {}
        }
        // Until the removal is durable the file may come back at a crash (and its replay with it): not done yet.
        if let Err(e) = self.storage.sync_dir(&self.dir).await {
            warn!(core = self.core, journal = %old.path.display(), error = %e, "checkpoint: the journal directory's sync failed; the checkpoint runs again later");
            return false;
        }
        self.bump(|s| s.checkpoints += 1);
        info!(core = self.core, segments, journal = %old.path.display(), "checkpointed a journal file");
        true
    }

    /// Makes a journal file's entries durable in their segments, so the file can go (a checkpoint, a clean close):
    /// the frames its logs still hold behind are written first, then every segment it covers is synced. False, with
    /// the journal poisoned and the file left for replay at the next start, when a write or a sync fails.
    async fn write_back(
        &self,
        segments: Touched<dyn SegmentFile>,
        behinds: &Touched<Behind>,
        journal: &Path,
        what: &str,
    ) -> bool {
        for behind in behinds.iter() {
            if let Err(e) = behind.flush() {
                error!(core = self.core, journal = %journal.display(), error = %e, "{what}: cannot write frames still behind; the journal file stays for replay at the next start");
                self.poisoned.set(true);
                return false;
            }
        }
        for segment in segments.iter() {
            if let Err(e) = segment.sync().await {
                error!(core = self.core, journal = %journal.display(), error = %e, "{what}: a segment sync failed; the journal file stays for replay at the next start");
                self.poisoned.set(true);
                return false;
            }
            // Many segments must not hold the core.
            futures_lite::future::yield_now().await;
        }
        true
    }

    /// Entries queued for the next pass (tests wait for them).
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Checkpoints in progress (tests wait for them).
    pub fn checkpoints_running(&self) -> usize {
        self.checkpoints_running.get()
    }
}

#[cfg(test)]
mod tests;
