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

use super::backend::{SegmentFile, Storage};
use super::behind::Behind;
use super::log::AppendError;
use super::FsyncPolicy;
use crate::clock::Clock;
use event_listener::Event;
use futures_channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tracing::{error, info, warn};

/// First four bytes of every entry of frames (on disk, little-endian: `4A 52 4E 4C`, ASCII `JRNL`).
pub const MAGIC: u32 = 0x4C4E_524A;
const MAGIC_BYTES: [u8; 4] = MAGIC.to_le_bytes();
/// First four bytes of every entry of frontiers (on disk `4A 52 4E 46`, ASCII `JRNF`).
pub const FRONTIER_MAGIC: u32 = 0x464E_524A;
const FRONTIER_MAGIC_BYTES: [u8; 4] = FRONTIER_MAGIC.to_le_bytes();
/// Length of the fixed part of a frontier record (before the topic and group names).
pub const FRONTIER_FIXED_LEN: usize = 25;
/// Length of an entry header.
pub const HEADER_LEN: usize = 24;
/// Bytes of the header covered by its CRC.
const HEADER_CRC_SPAN: usize = 20;
/// Length of the fixed part of an entry body (before the topic name).
pub const BODY_FIXED_LEN: usize = 42;
/// Longest topic name an entry carries (names are far shorter: see the topic-name rule).
const MAX_NAME_LEN: usize = u16::MAX as usize;
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

/// Where an entry's frames belong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryHead {
    /// The topic's name (its directory) and id (a recreated topic has another id).
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    /// The segment file (its base offset) and the byte position of the first frame in it.
    pub segment_base: u64,
    pub position: u64,
    /// Offsets of the frames.
    pub first_offset: u64,
    pub count: u32,
}

/// One entry found by [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub head: EntryHead,
    /// The frames, exactly as written to the segment.
    pub frames: Vec<u8>,
}

/// Where a consumer group's frontier stands, as a frontier entry records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontierRecord {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub group: String,
    /// The group's committed frontier (every offset below it is settled).
    pub committed: u64,
    /// The group was created here, starting at `committed`: records of the same group before it belong to a group
    /// of the same name that was deleted, and no longer count.
    pub start: bool,
}

/// What [`scan`] found in one journal file.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    pub entries: Vec<Entry>,
    /// The records of its frontier entries, in the order they were written.
    pub frontiers: Vec<FrontierRecord>,
    /// Entries (or runs of bytes) that failed a check and were passed over.
    pub damaged: usize,
}

/// Starts an entry for `head`: the header and body prefix, with room for the frames the caller appends next
/// (`Journal::commit` fills in the lengths, sequence number and CRCs).
pub fn begin_entry(head: &EntryHead, frames_len: usize) -> Vec<u8> {
    let name = head.topic.as_bytes();
    assert!(
        name.len() <= MAX_NAME_LEN,
        "topic name too long for the journal"
    );
    let mut out = Vec::with_capacity(HEADER_LEN + BODY_FIXED_LEN + name.len() + frames_len);
    out.extend_from_slice(&MAGIC_BYTES);
    out.extend_from_slice(&[0u8; HEADER_LEN - 4]);
    out.extend_from_slice(&head.topic_id.to_le_bytes());
    out.extend_from_slice(&head.partition.to_le_bytes());
    out.extend_from_slice(&head.segment_base.to_le_bytes());
    out.extend_from_slice(&head.position.to_le_bytes());
    out.extend_from_slice(&head.first_offset.to_le_bytes());
    out.extend_from_slice(&head.count.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name);
    out
}

/// An entry of frontier records (`Journal::commit_frontiers` seals it).
pub fn frontier_entry(records: &[FrontierRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        HEADER_LEN
            + 4
            + records
                .iter()
                .map(|r| FRONTIER_FIXED_LEN + r.topic.len() + r.group.len())
                .sum::<usize>(),
    );
    out.extend_from_slice(&FRONTIER_MAGIC_BYTES);
    out.extend_from_slice(&[0u8; HEADER_LEN - 4]);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        let (topic, group) = (r.topic.as_bytes(), r.group.as_bytes());
        assert!(
            topic.len() <= MAX_NAME_LEN && group.len() <= MAX_NAME_LEN,
            "name too long for the journal"
        );
        out.extend_from_slice(&r.topic_id.to_le_bytes());
        out.extend_from_slice(&r.partition.to_le_bytes());
        out.extend_from_slice(&r.committed.to_le_bytes());
        out.push(if r.start { 2 } else { 1 });
        out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
        out.extend_from_slice(&(group.len() as u16).to_le_bytes());
        out.extend_from_slice(topic);
        out.extend_from_slice(group);
    }
    out
}

/// Where the frames start in an entry made by [`begin_entry`].
pub fn frames_start(entry: &[u8]) -> usize {
    let name_len = u16::from_le_bytes([entry[HEADER_LEN + 40], entry[HEADER_LEN + 41]]) as usize;
    HEADER_LEN + BODY_FIXED_LEN + name_len
}

/// Completes an entry made by [`begin_entry`] (frames appended) or [`frontier_entry`] with its sequence number.
pub fn seal_entry(entry: &mut [u8], seq: u64) {
    assert!(
        entry[0..4] == MAGIC_BYTES || entry[0..4] == FRONTIER_MAGIC_BYTES,
        "an entry starts with its kind's magic"
    );
    let body_len = u32::try_from(entry.len() - HEADER_LEN).expect("journal entry under 4 GiB");
    let body_crc = crc32c::crc32c(&entry[HEADER_LEN..]);
    entry[4..8].copy_from_slice(&body_len.to_le_bytes());
    entry[8..16].copy_from_slice(&seq.to_le_bytes());
    entry[16..20].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&entry[..HEADER_CRC_SPAN]);
    entry[20..24].copy_from_slice(&header_crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether `b` starts with either kind's magic.
fn is_magic(b: &[u8]) -> bool {
    b.get(0..4)
        .is_some_and(|m| m == MAGIC_BYTES || m == FRONTIER_MAGIC_BYTES)
}

/// A header at `at` that passes its check: (frontier entry?, body_len, seq, body_crc).
fn header_at(bytes: &[u8], at: usize) -> Option<(bool, usize, u64, u32)> {
    let h = bytes.get(at..at + HEADER_LEN)?;
    if !is_magic(h) || crc32c::crc32c(&h[..HEADER_CRC_SPAN]) != u32_at(h, 20) {
        return None;
    }
    Some((
        h[0..4] == FRONTIER_MAGIC_BYTES,
        u32_at(h, 4) as usize,
        u64_at(h, 8),
        u32_at(h, 16),
    ))
}

/// Decodes a frontier entry body that passed its CRC; None if its fields do not hang together (every byte of the
/// body must belong to a record).
fn parse_frontiers(body: &[u8]) -> Option<Vec<FrontierRecord>> {
    let count = u32_at(body.get(0..4)?, 0) as usize;
    let mut at = 4;
    let mut out = Vec::with_capacity(count.min(body.len() / FRONTIER_FIXED_LEN));
    for _ in 0..count {
        let fixed = body.get(at..at + FRONTIER_FIXED_LEN)?;
        let start = match fixed[20] {
            1 => false,
            2 => true,
            _ => return None,
        };
        let topic_len = u16::from_le_bytes([fixed[21], fixed[22]]) as usize;
        let group_len = u16::from_le_bytes([fixed[23], fixed[24]]) as usize;
        let names_at = at + FRONTIER_FIXED_LEN;
        let topic = std::str::from_utf8(body.get(names_at..names_at + topic_len)?).ok()?;
        let group_at = names_at + topic_len;
        let group = std::str::from_utf8(body.get(group_at..group_at + group_len)?).ok()?;
        out.push(FrontierRecord {
            topic: topic.to_string(),
            topic_id: u64_at(fixed, 0),
            partition: u32_at(fixed, 8),
            group: group.to_string(),
            committed: u64_at(fixed, 12),
            start,
        });
        at = group_at + group_len;
    }
    (at == body.len()).then_some(out)
}

/// Decodes an entry body that passed its CRC; None if its fields do not hang together.
fn parse_body(seq: u64, body: &[u8]) -> Option<Entry> {
    if body.len() < BODY_FIXED_LEN {
        return None;
    }
    let name_len = u16::from_le_bytes([body[40], body[41]]) as usize;
    let name = body.get(BODY_FIXED_LEN..BODY_FIXED_LEN + name_len)?;
    let topic = std::str::from_utf8(name).ok()?.to_string();
    Some(Entry {
        seq,
        head: EntryHead {
            topic,
            topic_id: u64_at(body, 0),
            partition: u32_at(body, 8),
            segment_base: u64_at(body, 12),
            position: u64_at(body, 20),
            first_offset: u64_at(body, 28),
            count: u32_at(body, 36),
        },
        frames: body[BODY_FIXED_LEN + name_len..].to_vec(),
    })
}

/// Reads the entries of one journal file. Never panics on any bytes. Entries follow one another; zeros after the
/// last one are the unused reserve. A header that fails its check is passed over by searching forward for the next
/// header that passes (with a higher sequence number), so one damaged entry costs that entry, not the rest of the
/// file; an entry whose header passes and whose body fails is passed over whole; a torn last entry ends the scan.
pub fn scan(bytes: &[u8]) -> Scan {
    let mut out = Scan::default();
    let mut at = 0usize;
    let mut last_seq: Option<u64> = None;
    while at + HEADER_LEN <= bytes.len() {
        match header_at(bytes, at) {
            Some((frontiers, body_len, seq, body_crc)) if last_seq.is_none_or(|l| seq > l) => {
                let Some(body) = bytes.get(at + HEADER_LEN..at + HEADER_LEN + body_len) else {
                    // Torn: the file ends inside this entry (it was never acknowledged).
                    break;
                };
                let intact = crc32c::crc32c(body) == body_crc;
                let taken = match (intact, frontiers) {
                    (false, _) => false,
                    (true, false) => parse_body(seq, body)
                        .map(|entry| out.entries.push(entry))
                        .is_some(),
                    (true, true) => parse_frontiers(body)
                        .map(|records| out.frontiers.extend(records))
                        .is_some(),
                };
                if taken {
                    last_seq = Some(seq);
                } else {
                    out.damaged += 1;
                }
                at += HEADER_LEN + body_len;
            }
            _ => {
                if bytes[at..].iter().all(|&b| b == 0) {
                    break;
                }
                out.damaged += 1;
                // Resynchronise on the next header that passes its check.
                let next = (at + 1..bytes.len().saturating_sub(HEADER_LEN - 1)).find(|&i| {
                    is_magic(&bytes[i..])
                        && header_at(bytes, i)
                            .is_some_and(|(_, _, s, _)| last_seq.is_none_or(|l| s > l))
                });
                match next {
                    Some(i) => at = i,
                    None => break,
                }
            }
        }
    }
    out
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
struct Queued {
    entry: Vec<u8>,
    records: u32,
    /// The segment file its frames were written to (synced at the checkpoint of the journal file it lands in);
    /// None for an entry of frontiers.
    segment: Option<Rc<dyn SegmentFile>>,
    /// The log's write-behind buffer, when its frames may still be there (flushed before that checkpoint).
    behind: Option<Rc<Behind>>,
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

/// Called after each pass with its record count and each entry's wait (queue + write + sync) in µs.
pub type PassObserver = Box<dyn Fn(u64, &[u64])>;

/// Run by a checkpoint before it removes a journal file: writes every frontier the journal recorded to its frontier
/// file (the owner knows the newest ones) and tells whether all of them are durable there.
pub type FrontierWriter =
    Rc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>>>;

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
    frontier_writer: RefCell<Option<FrontierWriter>>,
    /// `close` keeps the current file (`keep_on_close`).
    keep_on_close: Cell<bool>,
}

fn file_name(core: usize, index: u64) -> String {
    format!("{core:04}-{index:020}.jnl")
}

impl Journal {
    /// Starts core `core`'s journal in `dir` (created if missing) with a new file, and its committer task. Files
    /// of earlier runs must have been replayed and removed first ([`replay`]).
    pub async fn open(
        storage: Rc<dyn Storage>,
        clock: Rc<dyn Clock>,
        dir: &Path,
        core: usize,
        opts: JournalOptions,
    ) -> std::io::Result<Rc<Journal>> {
        assert!(
            !matches!(opts.fsync, FsyncPolicy::Never),
            "fsync never runs without a journal"
        );
        storage.create_dir_all(dir)?;
        let current =
            Self::create_file(&*storage, dir, core, 0, zero_ahead(opts.file_bytes)).await?;
        let journal = Rc::new(Journal {
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
            frontier_writer: RefCell::new(None),
            keep_on_close: Cell::new(false),
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
    pub async fn commit(
        &self,
        entry: Vec<u8>,
        records: u32,
        segment: Rc<dyn SegmentFile>,
        behind: Option<Rc<Behind>>,
    ) -> Result<(), AppendError> {
        self.enqueue(entry, records, Some(segment), behind).await
    }

    /// Makes an entry built with [`frontier_entry`] durable under the fsync policy, in the pass that takes it with
    /// whatever frames are queued. Entries are queued in the order of the calls (the call queues at once, before it
    /// awaits), so the records of one group are in the journal in the order its frontier moved.
    pub async fn commit_frontiers(&self, entry: Vec<u8>) -> Result<(), AppendError> {
        self.enqueue(entry, 0, None, None).await
    }

    async fn enqueue(
        &self,
        mut entry: Vec<u8>,
        records: u32,
        segment: Option<Rc<dyn SegmentFile>>,
        behind: Option<Rc<Behind>>,
    ) -> Result<(), AppendError> {
        if self.poisoned.get() {
            return Err(AppendError::Poisoned);
        }
        if self.closed.get() {
            return Err(AppendError::Closed);
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

    /// Makes `close` keep the journal file (its segments still written back): the core could not write a frontier
    /// file, and the replay at the next start brings it up to date from the journal.
    pub fn keep_on_close(&self) {
        self.keep_on_close.set(true);
    }

    /// Registers what writes the frontier files before a checkpoint removes a journal file (the engine's).
    pub fn set_frontier_writer(&self, writer: FrontierWriter) {
        *self.frontier_writer.borrow_mut() = Some(writer);
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
        let mut bytes = 0usize;
        let mut take = 0usize;
        for q in queue.iter() {
            if take > 0 && bytes + q.entry.len() > MAX_PASS_BYTES {
                break;
            }
            bytes += q.entry.len();
            take += 1;
        }
        let rest = queue.split_off(take);
        std::mem::replace(&mut *queue, rest)
    }

    async fn run_committer(self: Rc<Self>) {
        loop {
            let listener = self.queue_event.listen();
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
    }

    async fn write_pass(&self, pass: Vec<Queued>) {
        if self.poisoned.get() {
            for q in pass {
                let _ = q.reply.send(Err(AppendError::Poisoned));
            }
            return;
        }
        let bytes: usize = pass.iter().map(|q| q.entry.len()).sum();
        let (file, pos, zeroed_to) = {
            let c = self.current.borrow();
            (c.file.clone(), c.pos, c.zeroed_to)
        };
        let end = pos + bytes as u64;
        // The zeros ahead are written first, so the entries land in blocks the file already has: a full disk
        // refuses the zeros (nothing of the pass is in the journal), never an entry half-way.
        let ahead = zero_ahead(self.opts.file_bytes);
        let mut new_zeroed_to = zeroed_to;
        if end + ahead / 2 > zeroed_to {
            let to = end + ahead;
            if let Err(e) = file.write_at(&vec![0u8; (to - zeroed_to) as usize], zeroed_to) {
                warn!(core = self.core, error = %e, "cannot extend the journal: the pass is refused");
                let _ = file.truncate(zeroed_to).await;
                return Self::refuse(pass, &e);
            }
            new_zeroed_to = to;
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
            return Self::refuse(pass, &e);
        }
        {
            let mut c = self.current.borrow_mut();
            c.pos = end;
            c.zeroed_to = new_zeroed_to;
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
        if self.opts.fsync == FsyncPolicy::Always {
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
            observe(records, &waits);
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
                return;
            }
        };
        let old = std::mem::replace(&mut *self.current.borrow_mut(), fresh);
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
                return;
            }
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
        let writer = self.frontier_writer.borrow().clone();
        if let Some(write_frontiers) = writer {
            if !write_frontiers().await {
                warn!(core = self.core, journal = %old.path.display(), "checkpoint: a frontier file could not be written; this journal file and the newer ones stay until a later checkpoint or the replay at the next start");
                return false;
            }
        }
        if let Err(e) = self.storage.remove(&old.path).await {
            warn!(core = self.core, journal = %old.path.display(), error = %e, "checkpoint: cannot remove a checkpointed journal file; it and the newer ones stay");
            return false;
        }
        let _ = self.storage.sync_dir(&self.dir).await;
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

    /// Checkpoints in progress (tests wait for them).
    pub fn checkpoints_running(&self) -> usize {
        self.checkpoints_running.get()
    }
}

/// What [`replay`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    pub files: usize,
    pub entries: usize,
    /// Entries whose frames the segment did not hold and were written back.
    pub rewritten: usize,
    /// Entries of topics or segments that no longer exist.
    pub skipped: usize,
    pub damaged: usize,
    /// Entries that could not be read back or rewritten, and frontier files that could not be read or written
    /// (I/O errors).
    pub failed: usize,
    /// Frontier records read, frontier files they moved forward, and files left as they were because their core's
    /// journal held a damaged entry.
    pub frontier_records: usize,
    pub frontiers_written: usize,
    pub frontiers_dropped: usize,
}

/// Finds a partition's directory for a journal entry: Some only if topic `name` still exists with id `topic_id`.
pub type Locate<'a> = &'a dyn Fn(&str, u64, u32) -> Option<PathBuf>;

/// Whether topic `name` with id `topic_id` has consumer group `group` now.
pub type HasGroup<'a> = &'a dyn Fn(&str, u64, &str) -> bool;

/// Replays every journal file in `dir` into the segments (see the module header) and the frontier files, syncs
/// what it wrote, and removes the journal files. Run once at start, before any partition opens. Idempotent: a crash
/// during replay replays again at the next start.
///
/// A frontier file gets the highest value its group's records carry since the group's last start record (records
/// before a start record belong to a deleted group of the same name), when that is above the file's own value; the
/// records of topics or groups that no longer exist are passed over.
pub async fn replay(
    storage: &dyn Storage,
    dir: &Path,
    locate: Locate<'_>,
    has_group: HasGroup<'_>,
) -> std::io::Result<ReplayReport> {
    let mut report = ReplayReport::default();
    let names = match storage.list(dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(e),
    };
    let mut files: Vec<String> = names.into_iter().filter(|n| n.ends_with(".jnl")).collect();
    // By core, then by index within a core (names are zero-padded).
    files.sort();
    let mut open: HashMap<PathBuf, Option<Rc<dyn SegmentFile>>> = HashMap::new();
    let mut touched: Vec<Rc<dyn SegmentFile>> = Vec::new();
    // Per frontier file, the highest value since its group's last start record; gathered per core (a partition's
    // records are all in its core's files), and dropped for a core whose files hold a damaged entry.
    let mut frontiers: std::collections::BTreeMap<PathBuf, u64> = Default::default();
    let mut core_frontiers: std::collections::BTreeMap<PathBuf, u64> = Default::default();
    let mut core_damaged = false;
    // Entries that could not be written to their (open) segment: the journal must then stay.
    let mut unrestored = 0usize;
    let core_of = |name: &str| name.split('-').next().unwrap_or_default().to_string();
    for (i, name) in files.iter().enumerate() {
        let path = dir.join(name);
        let bytes = storage.read(&path)?;
        let found = scan(&bytes);
        report.files += 1;
        report.damaged += found.damaged;
        if found.damaged > 0 {
            error!(journal = %path.display(), damaged = found.damaged, "journal entries failed their check at replay: passed over (their segment frames are checked on their own)");
        }
        core_damaged |= found.damaged > 0;
        for record in found.frontiers {
            report.frontier_records += 1;
            let Some(partition_dir) = locate(&record.topic, record.topic_id, record.partition)
            else {
                continue;
            };
            if !has_group(&record.topic, record.topic_id, &record.group) {
                continue;
            }
            let file = partition_dir.join(super::frontier::file_name(&record.group));
            match core_frontiers.entry(file) {
                std::collections::btree_map::Entry::Occupied(mut e) if !record.start => {
                    *e.get_mut() = (*e.get()).max(record.committed);
                }
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    *e.get_mut() = record.committed;
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(record.committed);
                }
            }
        }
        if files
            .get(i + 1)
            .is_none_or(|next| core_of(next) != core_of(name))
        {
            // The core's last file: a damaged entry may have been a group's start record, and without it the
            // records of a deleted group of the same name would count; so its files' frontiers are left as they
            // are (what is above them redelivers: duplicates, never a skipped message).
            if core_damaged {
                error!(core = %core_of(name), frontiers = core_frontiers.len(), "a journal entry failed its check: this core's frontier records are not replayed (settled messages above the frontier files redeliver)");
                report.frontiers_dropped += core_frontiers.len();
                core_frontiers.clear();
            }
            frontiers.append(&mut core_frontiers);
            core_damaged = false;
        }
        for entry in found.entries {
            report.entries += 1;
            let Some(partition_dir) =
                locate(&entry.head.topic, entry.head.topic_id, entry.head.partition)
            else {
                report.skipped += 1;
                continue;
            };
            let seg_path = partition_dir.join(format!("{:020}.log", entry.head.segment_base));
            if !open.contains_key(&seg_path) {
                // A segment that is gone was removed by retention or with its topic: nothing to restore. One that
                // cannot be opened is reported; its partition meets the same error when it opens (quarantine).
                let file = match storage.open(&seg_path, false).await {
                    Ok(f) => Some(f),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => {
                        error!(segment = %seg_path.display(), error = %e, "journal replay cannot open a segment: its entries are not replayed");
                        None
                    }
                };
                open.insert(seg_path.clone(), file);
            }
            let Some(file) = open.get(&seg_path).cloned().flatten() else {
                report.skipped += 1;
                continue;
            };
            // Written back even when the segment seems to hold it already: what a read returns may be pages a failed
            // sync dropped (Linux keeps them in the cache, clean, and never writes them), so only a write and a sync
            // make the frames durable before the journal file goes.
            let held = file
                .read_at(entry.head.position, entry.frames.len())
                .await
                .ok();
            match file.write_at(&entry.frames, entry.head.position) {
                Ok(()) => {
                    if held.as_deref() != Some(&entry.frames[..]) {
                        report.rewritten += 1;
                    }
                    if !touched.iter().any(|t| Rc::ptr_eq(t, &file)) {
                        touched.push(file.clone());
                    }
                }
                Err(e) => {
                    error!(segment = %seg_path.display(), error = %e, "journal replay cannot restore an entry");
                    report.failed += 1;
                    unrestored += 1;
                }
            }
        }
    }
    for file in &touched {
        file.sync().await?;
    }
    if unrestored > 0 {
        // Removing the journal now would lose acknowledged records: it stays, and the start fails until they can be
        // written back.
        return Err(std::io::Error::other(format!(
            "{unrestored} journal entries could not be written back to their segments (see the log); the journal is kept"
        )));
    }
    drop(open);
    let mut writes = Vec::new();
    for (file, value) in &frontiers {
        match super::frontier::read(storage, file) {
            // Written even when the file seems to hold as much: it may be a page a failed sync dropped (see above).
            Ok(held) => {
                let value = held.max(*value);
                writes
                    .push(async move { (file, super::frontier::write(storage, file, value).await) })
            }
            Err(e) => {
                error!(file = %file.display(), error = %e, "journal replay cannot read a frontier file: its records are not replayed");
                report.failed += 1;
            }
        }
    }
    for (file, written) in crate::join::join_all(writes).await {
        match written {
            Ok(()) => report.frontiers_written += 1,
            Err(e) => {
                error!(file = %file.display(), error = %e, "journal replay cannot write a frontier file: its group redelivers from the older value");
                report.failed += 1;
            }
        }
    }
    for name in &files {
        storage.remove(&dir.join(name)).await?;
    }
    if !files.is_empty() {
        storage.sync_dir(dir).await?;
        info!(
            files = report.files,
            entries = report.entries,
            rewritten = report.rewritten,
            skipped = report.skipped,
            damaged = report.damaged,
            frontier_records = report.frontier_records,
            frontiers_written = report.frontiers_written,
            frontiers_dropped = report.frontiers_dropped,
            "journal replayed"
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(topic: &str) -> EntryHead {
        EntryHead {
            topic: topic.to_string(),
            topic_id: 7,
            partition: 3,
            segment_base: 100,
            position: 4096,
            first_offset: 120,
            count: 2,
        }
    }

    fn record(topic: &str, group: &str, committed: u64, start: bool) -> FrontierRecord {
        FrontierRecord {
            topic: topic.into(),
            topic_id: 7,
            partition: 0,
            group: group.into(),
            committed,
            start,
        }
    }

    fn frontiers(records: &[FrontierRecord], seq: u64) -> Vec<u8> {
        let mut e = frontier_entry(records);
        seal_entry(&mut e, seq);
        e
    }

    /// Replay moves each frontier file up to the highest value its group's records carry since the group's last
    /// start record, passes over groups and topics that are gone, and never lowers a file.
    #[test]
    fn replay_restores_frontiers_and_forgets_a_deleted_group_of_the_same_name() {
        on_sim_disk(|storage| async move {
            let dir = Path::new("/data/journal");
            let part = Path::new("/data/topics/t/0");
            storage.create_dir_all(dir).unwrap();
            storage.create_dir_all(part).unwrap();
            let file = |g: &str| part.join(super::super::frontier::file_name(g));
            let held = |g: &str| super::super::frontier::read(&*storage, &file(g)).unwrap();
            // "g" was acked to 500, deleted, created again at 2 (its file written before its start record), then
            // acked to 4 (a later record of 3 checks that the highest counts); "default" has a newer value in its
            // file than in the journal; "gone" was deleted; topic "old" with id 6 no longer exists.
            super::super::frontier::write(&*storage, &file("g"), 2)
                .await
                .unwrap();
            super::super::frontier::write(&*storage, &file("default"), 10)
                .await
                .unwrap();
            let mut other = record("old", "default", 50, false);
            other.topic_id = 6;
            let first = [
                record("t", "g", 300, false),
                record("t", "default", 8, false),
                record("t", "gone", 7, false),
                other,
            ];
            let second = [
                record("t", "g", 500, false),
                record("t", "g", 2, true),
                record("t", "g", 4, false),
            ];
            let mut bytes = frontiers(&first, 1);
            bytes.extend(frontiers(&second, 2));
            bytes.extend(frontiers(&[record("t", "g", 3, false)], 3));
            storage
                .replace(&dir.join("0000-00000000000000000001.jnl"), bytes)
                .await
                .unwrap();
            let locate = |name: &str, id: u64, p: u32| {
                (name == "t" && id == 7)
                    .then(|| Path::new("/data/topics").join(name).join(p.to_string()))
            };
            let has_group = |_: &str, _: u64, g: &str| g != "gone";
            let report = replay(&*storage, dir, &locate, &has_group).await.unwrap();
            assert_eq!(
                held("g"),
                4,
                "the deleted group's 500 must not count for the new one"
            );
            assert_eq!(held("default"), 10, "a file is never lowered");
            assert!(
                storage.read(&file("gone")).is_err(),
                "no file for a deleted group"
            );
            // Every frontier file with records is written again (a read may show pages a failed sync dropped).
            assert_eq!((report.frontier_records, report.frontiers_written), (8, 2));
            assert!(storage.list(dir).unwrap().is_empty());
        });
    }

    /// A checkpoint whose frontier writer fails keeps its journal file, and no newer file may go before it: else
    /// the file holding a recreated group's start record could go, and the replay would credit the deleted group's
    /// frontier to the new one (found in review: the replay gave 375 instead of 4).
    #[test]
    fn a_journal_file_a_checkpoint_could_not_finish_outlives_no_newer_one() {
        on_sim_disk(|storage| async move {
            let part = Path::new("/data/topics/t/0");
            storage.create_dir_all(part).unwrap();
            let dir = Path::new("/data/journal");
            let journal = Journal::open(
                storage.clone(),
                Rc::new(crate::clock::RealClock),
                dir,
                0,
                JournalOptions {
                    fsync: FsyncPolicy::Always,
                    file_bytes: 4096,
                    commit_delay_us: 0,
                },
            )
            .await
            .unwrap();
            let fail = Rc::new(Cell::new(true));
            let f2 = fail.clone();
            journal.set_frontier_writer(Rc::new(move || {
                let ok = !f2.get();
                Box::pin(async move { ok })
            }));
            let wait = |j: Rc<Journal>| async move {
                while j.checkpoints_running() > 0 {
                    glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                }
            };
            // Old incarnation of "g" acked up to 500: file 0 fills and rotates; its checkpoint's frontier write fails.
            for v in 1..=100u64 {
                journal
                    .commit_frontiers(frontier_entry(&[record("t", "g", v * 5, false)]))
                    .await
                    .unwrap();
            }
            wait(journal.clone()).await;
            assert!(
                storage.list(dir).unwrap().len() >= 2,
                "the unfinished checkpoint's file stays"
            );
            fail.set(false);
            // "g" deleted and created again at 2 (file written, then start record), acked to 4.
            let file = part.join(super::super::frontier::file_name("g"));
            super::super::frontier::write(&*storage, &file, 2)
                .await
                .unwrap();
            journal
                .commit_frontiers(frontier_entry(&[record("t", "g", 2, true)]))
                .await
                .unwrap();
            super::super::frontier::write(&*storage, &file, 4)
                .await
                .unwrap();
            for _ in 0..100u64 {
                journal
                    .commit_frontiers(frontier_entry(&[record("t", "g", 4, false)]))
                    .await
                    .unwrap();
            }
            wait(journal.clone()).await;
            // kill -9: no close. Restart's replay:
            let locate = |name: &str, id: u64, p: u32| {
                (name == "t" && id == 7)
                    .then(|| Path::new("/data/topics").join(name).join(p.to_string()))
            };
            let has_group = |_: &str, _: u64, _: &str| true;
            replay(&*storage, dir, &locate, &has_group).await.unwrap();
            let held = super::super::frontier::read(&*storage, &file).unwrap();
            assert_eq!(
                held, 4,
                "the deleted group's frontier was credited to the new one"
            );
        });
    }

    /// A core that could not write a frontier file at its stop keeps its journal, and the next start's replay
    /// writes the file from it.
    #[test]
    fn a_stop_that_could_not_write_a_frontier_file_keeps_the_journal_for_the_replay() {
        on_sim_disk(|storage| async move {
            let part = Path::new("/data/topics/t/0");
            storage.create_dir_all(part).unwrap();
            let dir = Path::new("/sim/journal");
            let journal = journal_with_delay(&storage, 0).await;
            journal
                .commit_frontiers(frontier_entry(&[record("t", "g", 6, false)]))
                .await
                .unwrap();
            journal.keep_on_close();
            journal.close().await;
            assert_eq!(storage.list(dir).unwrap().len(), 1, "the journal stays");
            let locate =
                |_: &str, _: u64, p: u32| Some(Path::new("/data/topics/t").join(p.to_string()));
            replay(&*storage, dir, &locate, &|_, _, _| true)
                .await
                .unwrap();
            let file = part.join(super::super::frontier::file_name("g"));
            assert_eq!(super::super::frontier::read(&*storage, &file).unwrap(), 6);
        });
    }

    /// A damaged entry in a core's journal may have been a group's start record: that core's frontier records are
    /// not replayed (the files stay; what is above them redelivers), another core's are.
    #[test]
    fn a_damaged_entry_leaves_its_cores_frontier_files_as_they_are() {
        on_sim_disk(|storage| async move {
            let dir = Path::new("/data/journal");
            storage.create_dir_all(dir).unwrap();
            for p in ["0", "1"] {
                storage
                    .create_dir_all(&Path::new("/data/topics/t").join(p))
                    .unwrap();
            }
            let file = |p: &str| {
                Path::new("/data/topics/t")
                    .join(p)
                    .join("consumer.g.offset")
            };
            let held = |p: &str| super::super::frontier::read(&*storage, &file(p)).unwrap();
            // Core 0, partition 0: "g" at 500, deleted and created again at 2, whose start record is damaged,
            // then acked to 3. Core 1, partition 1: "g" at 9.
            super::super::frontier::write(&*storage, &file("0"), 2)
                .await
                .unwrap();
            let mut start = frontiers(&[record("t", "g", 2, true)], 2);
            let last = start.len() - 1;
            start[last] ^= 0x10;
            let mut core0 = frontiers(&[record("t", "g", 500, false)], 1);
            core0.extend(start);
            core0.extend(frontiers(&[record("t", "g", 3, false)], 3));
            storage
                .replace(&dir.join("0000-00000000000000000001.jnl"), core0)
                .await
                .unwrap();
            let mut one = record("t", "g", 9, false);
            one.partition = 1;
            storage
                .replace(
                    &dir.join("0001-00000000000000000001.jnl"),
                    frontiers(&[one], 1),
                )
                .await
                .unwrap();
            let locate =
                |_: &str, _: u64, p: u32| Some(Path::new("/data/topics/t").join(p.to_string()));
            let report = replay(&*storage, dir, &locate, &|_, _, _| true)
                .await
                .unwrap();
            assert_eq!(
                held("0"),
                2,
                "the deleted group's 500 must not count, nor anything of core 0"
            );
            assert_eq!(held("1"), 9);
            assert_eq!(
                (
                    report.damaged,
                    report.frontiers_dropped,
                    report.frontiers_written
                ),
                (1, 1, 1)
            );
        });
    }

    fn entry(topic: &str, seq: u64, frames: &[u8]) -> Vec<u8> {
        let mut e = begin_entry(&head(topic), frames.len());
        e.extend_from_slice(frames);
        seal_entry(&mut e, seq);
        e
    }

    #[test]
    fn entries_round_trip_and_zeros_end_the_scan() {
        let mut file = entry("orders", 1, b"frames-one");
        file.extend(entry("t", 2, b""));
        file.extend(vec![0u8; 1000]);
        let s = scan(&file);
        assert_eq!(s.damaged, 0);
        assert_eq!(s.entries.len(), 2);
        assert_eq!(s.entries[0].head, head("orders"));
        assert_eq!(s.entries[0].frames, b"frames-one");
        assert_eq!((s.entries[1].seq, s.entries[1].frames.len()), (2, 0));
        assert_eq!(
            frames_start(&entry("orders", 1, b"x")),
            HEADER_LEN + BODY_FIXED_LEN + 6
        );
    }

    #[test]
    fn a_torn_last_entry_ends_the_scan() {
        let mut file = entry("a", 1, b"first");
        let second = entry("a", 2, b"second-entry");
        for cut in 0..second.len() {
            let mut torn = file.clone();
            torn.extend_from_slice(&second[..cut]);
            let s = scan(&torn);
            assert_eq!(s.entries.len(), 1, "cut {cut}");
        }
        file.extend(second);
        assert_eq!(scan(&file).entries.len(), 2);
    }

    /// Any single flipped bit costs at most the entry it lands in: the others are found, none is damaged.
    #[test]
    fn a_bit_flip_anywhere_costs_at_most_its_entry() {
        let records = [record("b", "g", 9, false), record("b", "default", 4, true)];
        let parts = [
            entry("a", 1, b"one"),
            frontiers(&records, 2),
            entry("c", 3, b"three"),
        ];
        let file: Vec<u8> = parts.concat();
        let bounds: Vec<usize> = parts
            .iter()
            .scan(0, |at, p| {
                *at += p.len();
                Some(*at)
            })
            .collect();
        for byte in 0..file.len() {
            for bit in 0..8 {
                let mut damaged = file.clone();
                damaged[byte] ^= 1 << bit;
                let s = scan(&damaged);
                let hit = bounds.iter().position(|&b| byte < b).expect("inside");
                let mut seqs: Vec<u64> = s.entries.iter().map(|e| e.seq).collect();
                if !s.frontiers.is_empty() {
                    assert_eq!(s.frontiers, records, "flip at byte {byte} bit {bit}");
                    seqs.push(2);
                    seqs.sort();
                }
                let want: Vec<u64> = (1..=3).filter(|&q| q != hit as u64 + 1).collect();
                assert_eq!(seqs, want, "flip at byte {byte} bit {bit}");
                for e in &s.entries {
                    assert_eq!(
                        entry(&e.head.topic, e.seq, &e.frames),
                        parts[e.seq as usize - 1]
                    );
                }
            }
        }
    }

    /// docs/format.md's journal example is what `begin_entry` + `seal_entry` write, and `scan` reads it back.
    #[test]
    fn the_documented_example_matches_the_code() {
        let bytes = crate::format_doc::example("Journal", 0);
        let doc = include_str!("../../docs/format.md");
        let section = &doc[doc.find("## Journal").expect("a Journal section")..];
        let mut frame = Vec::new();
        crate::storage::frame::encode(5, 1_700_000_000_000, b"hi", &mut frame);
        let head = EntryHead {
            topic: "t".into(),
            topic_id: 1,
            partition: 0,
            segment_base: 0,
            position: 0,
            first_offset: 5,
            count: 1,
        };
        let mut entry = begin_entry(&head, frame.len());
        assert_eq!(frames_start(&entry), entry.len());
        entry.extend_from_slice(&frame);
        seal_entry(&mut entry, 1);
        assert_eq!(bytes, entry, "docs/format.md's example");
        let found = scan(&bytes);
        assert_eq!(found.entries.len(), 1);
        assert_eq!(found.entries[0].head, head);
        assert!(section.contains(&format!("`0x{MAGIC:08X}`")));
        assert!(section.contains(&format!("| 0..{HEADER_LEN} |")) || HEADER_LEN == 24);
        assert!(section.contains(&format!("| 40..{BODY_FIXED_LEN} | u16 | name_len")));
    }

    /// docs/format.md's frontier entry example is what `frontier_entry` + `seal_entry` write, and `scan` reads it.
    #[test]
    fn the_documented_frontier_example_matches_the_code() {
        let bytes = crate::format_doc::example("Journal", 1);
        let doc = include_str!("../../docs/format.md");
        let section = &doc[doc.find("## Journal").expect("a Journal section")..];
        let mut r = record("t", "g", 6, false);
        r.topic_id = 1;
        assert_eq!(
            bytes,
            frontiers(std::slice::from_ref(&r), 2),
            "docs/format.md's example"
        );
        let found = scan(&bytes);
        assert_eq!((found.frontiers, found.entries.len()), (vec![r], 0));
        assert!(section.contains(&format!("`0x{FRONTIER_MAGIC:08X}`")));
        assert!(section.contains(&format!("| 23..{FRONTIER_FIXED_LEN} | u16 | group_len")));
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect();
            let _ = scan(&bytes);
            for magic in [MAGIC_BYTES, FRONTIER_MAGIC_BYTES] {
                let mut with_magic = magic.to_vec();
                with_magic.extend(&bytes);
                let _ = scan(&with_magic);
            }
        }
    }

    /// Runs `test` on a fresh executor with a fresh simulated disk.
    fn on_sim_disk<F: std::future::Future<Output = ()>>(test: impl FnOnce(Rc<dyn Storage>) -> F) {
        on_sim(|_, storage| test(storage));
    }

    /// Like `on_sim_disk`, with the simulated disk itself too (to hold its syncs, say).
    fn on_sim<F: std::future::Future<Output = ()>>(
        test: impl FnOnce(Rc<super::super::sim::Sim>, Rc<dyn Storage>) -> F,
    ) {
        use super::super::sim::{Sim, SimStorage};
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(async move {
                let sim = Sim::new();
                test(sim.clone(), Rc::new(SimStorage(sim))).await
            });
    }

    /// A journal under fsync `always` on `storage` (real clock) with a commit delay of `delay_us`.
    async fn journal_with_delay(storage: &Rc<dyn Storage>, delay_us: u64) -> Rc<Journal> {
        Journal::open(
            storage.clone(),
            Rc::new(crate::clock::RealClock),
            Path::new("/sim/journal"),
            0,
            JournalOptions {
                fsync: FsyncPolicy::Always,
                file_bytes: 1 << 20,
                commit_delay_us: delay_us,
            },
        )
        .await
        .expect("journal opens")
    }

    /// A function that commits an entry of `records` records (of a segment `/sim/seg`) to `journal` in a task of its
    /// own, so several can be queued before any is written.
    async fn committer(
        storage: &Rc<dyn Storage>,
        journal: &Rc<Journal>,
    ) -> impl Fn(u32) -> glommio::Task<Result<(), AppendError>> {
        let segment = storage
            .open(Path::new("/sim/seg"), true)
            .await
            .expect("segment");
        let journal = journal.clone();
        move |records| {
            let (journal, segment) = (journal.clone(), segment.clone());
            glommio::spawn_local(async move {
                journal
                    .commit(begin_entry(&head("t"), 0), records, segment, None)
                    .await
            })
        }
    }

    /// The commit delay: a lone appender is synced at once, pass after pass; once a pass carried more than one
    /// entry, the committer waits for company before its next pass, and entries queued meanwhile share it.
    #[test]
    fn the_commit_delay_gathers_concurrent_appenders_and_never_holds_a_lone_one() {
        on_sim_disk(|storage| async move {
            // Long enough that the second entry below is queued well inside it, whatever the machine's load.
            let delay_us = 200_000;
            let journal = journal_with_delay(&storage, delay_us).await;
            let commit = committer(&storage, &journal).await;
            // A lone appender, one record at a time: no pass waits.
            let started = std::time::Instant::now();
            for _ in 0..3 {
                commit(1).await.expect("committed");
            }
            assert!(
                started.elapsed() < std::time::Duration::from_micros(delay_us),
                "a lone appender waited for the commit delay"
            );
            assert_eq!(journal.stats().passes, 3);
            // Two entries queued together share a pass (no delay: the last pass had one entry); appenders are
            // concurrent from now on.
            let (a, b) = (commit(1), commit(1));
            a.await.expect("committed");
            b.await.expect("committed");
            assert_eq!(journal.stats().passes, 4);
            let company = std::time::Instant::now();
            let first = commit(1);
            futures_lite::future::yield_now().await;
            let second = commit(1);
            first.await.expect("committed");
            second.await.expect("committed");
            let stats = journal.stats();
            assert_eq!(stats.passes, 5, "the two entries share one pass: {stats:?}");
            assert_eq!(stats.records, 7);
            assert!(company.elapsed() >= std::time::Duration::from_micros(delay_us));
            journal.close().await;
        });
    }

    /// After a pass that carried several entries the committer waits for company even when entries are queued
    /// already (they came while its sync ran): those and the ones that follow share the next pass. (Taking the
    /// queued ones at once gave 16 partitions 40 % more syncs per record than one partition, whose log waits so.)
    #[test]
    fn entries_queued_during_a_sync_still_wait_for_company_after_a_pass_with_several() {
        on_sim(|sim, storage| async move {
            let delay_us = 200_000;
            let journal = journal_with_delay(&storage, delay_us).await;
            let one = committer(&storage, &journal).await;
            let commit = || one(1);
            sim.hold_syncs();
            let (a, b) = (commit(), commit());
            for _ in 0..1000 {
                if sim.held_syncs() > 0 {
                    break;
                }
                futures_lite::future::yield_now().await;
            }
            assert_eq!(sim.held_syncs(), 1, "a and b's pass is syncing");
            // c is queued while that sync runs; d comes once its pass is answered.
            let c = commit();
            futures_lite::future::yield_now().await;
            sim.release_syncs();
            for _ in 0..1000 {
                if journal.stats().passes > 0 {
                    break;
                }
                futures_lite::future::yield_now().await;
            }
            assert_eq!(journal.stats().passes, 1);
            let d = commit();
            for task in [a, b, c, d] {
                task.await.expect("committed");
            }
            let stats = journal.stats();
            assert_eq!(stats.passes, 2, "c waited for d: {stats:?}");
            assert_eq!(stats.records, 4);
            journal.close().await;
        });
    }

    /// The journal's counters count what it did: each pass, entry, record and byte, and under fsync `always` one
    /// sync per pass; under `interval:MS`, `sync_now` syncs (and counts) once.
    #[test]
    fn the_counters_count_each_pass_entry_record_byte_and_sync() {
        on_sim_disk(|storage| async move {
            let journal = journal_with_delay(&storage, 0).await;
            let commit = committer(&storage, &journal).await;
            let start = journal.stats();
            assert_eq!(start, JournalStats::default(), "nothing counted at open");
            commit(3).await.expect("committed");
            let one = journal.stats();
            let entry_bytes = one.bytes;
            assert!((HEADER_LEN as u64..4096).contains(&entry_bytes), "{one:?}");
            assert_eq!(
                (one.passes, one.entries, one.records, one.syncs),
                (1, 1, 3, 1)
            );
            for _ in 0..4 {
                commit(2).await.expect("committed");
            }
            let five = journal.stats();
            assert_eq!(
                (five.passes, five.entries, five.records, five.syncs),
                (5, 5, 11, 5),
                "{five:?}"
            );
            assert_eq!(five.bytes, 5 * entry_bytes, "{five:?}");
            journal.close().await;

            let interval = Journal::open(
                storage.clone(),
                Rc::new(crate::clock::RealClock),
                Path::new("/sim/journal-interval"),
                0,
                JournalOptions {
                    fsync: FsyncPolicy::IntervalMs(3_600_000),
                    file_bytes: 1 << 20,
                    commit_delay_us: 0,
                },
            )
            .await
            .expect("journal opens");
            let commit = committer(&storage, &interval).await;
            commit(1).await.expect("committed");
            assert_eq!(interval.stats().syncs, 0, "interval: no sync per pass");
            interval.sync_now().await.expect("synced");
            assert_eq!(interval.stats().syncs, 1);
            interval.close().await;
        });
    }

    /// Partition `partition` of topic `t`, its appends made durable by `journal`, its frames written to the segment
    /// in pieces of `write_behind_bytes` (0: batch by batch).
    async fn log_on(
        storage: &Rc<dyn Storage>,
        journal: &Rc<Journal>,
        partition: u32,
        write_behind_bytes: u32,
    ) -> Rc<super::super::log::Log> {
        use super::super::log::{JournalLink, Log, LogOptions};
        Log::open_with(
            storage.clone(),
            Rc::new(crate::clock::RealClock),
            &Path::new("/sim/topics/t").join(partition.to_string()),
            LogOptions {
                segment_bytes: 1 << 20,
                max_payload: 1 << 16,
                fsync: FsyncPolicy::Always,
                tail_cache_bytes: 0,
                write_behind_bytes,
            },
            Some(JournalLink {
                journal: journal.clone(),
                topic: "t".into(),
                topic_id: 1,
                partition,
            }),
        )
        .await
        .expect("log opens")
    }

    /// A batch the journal refuses is taken back from the log's write-behind buffer: no flush (the journal's close
    /// here) ever writes it to the segment, so a reopened log ends where the acknowledged records end.
    #[test]
    fn a_batch_the_journal_refuses_never_reaches_the_segment_from_behind() {
        on_sim(|sim, storage| async move {
            let journal = journal_with_delay(&storage, 0).await;
            let log = log_on(&storage, &journal, 0, 4096).await;
            assert_eq!(spawn_append(&log, b"kept").await.expect("appended"), 0);
            // The next write is the journal's pass (the segment's frames wait behind).
            sim.fail_writes(libc::EIO, 1);
            assert!(spawn_append(&log, b"refused").await.is_err());
            assert!(!journal.is_poisoned());
            log.close().await;
            journal.close().await;
            assert_eq!(journal.stats().records, 1, "{:?}", journal.stats());
            let journal = journal_with_delay(&storage, 0).await;
            let reopened = log_on(&storage, &journal, 0, 4096).await;
            assert_eq!(
                reopened.end_offset(),
                1,
                "the refused record reached the segment"
            );
            assert_eq!(
                reopened.read(0).await.expect("kept").payload,
                bytes::Bytes::from_static(b"kept")
            );
            // And the next append takes its place.
            assert_eq!(spawn_append(&reopened, b"next").await.expect("appended"), 1);
            reopened.close().await;
            journal.close().await;
        });
    }

    /// Appends `body` to `log` in a task of its own (so several appends can be queued before any is written).
    fn spawn_append(
        log: &Rc<super::super::log::Log>,
        body: &'static [u8],
    ) -> glommio::Task<Result<u64, AppendError>> {
        let log = log.clone();
        glommio::spawn_local(async move { log.append(bytes::Bytes::from_static(body)).await })
    }

    /// The commit delay in a partition's log: a lone appender is written at once, batch after batch; after a batch
    /// that gathered several appends, the log waits for company, and appends made meanwhile share one batch.
    #[test]
    fn a_log_whose_batch_gathered_several_appends_waits_for_company_and_a_lone_one_never_does() {
        on_sim_disk(|storage| async move {
            let delay_us = 200_000;
            let journal = journal_with_delay(&storage, delay_us).await;
            let log = log_on(&storage, &journal, 0, 0).await;
            let append = |body: &'static [u8]| spawn_append(&log, body);
            let started = std::time::Instant::now();
            for _ in 0..3 {
                append(b"lone").await.expect("appended");
            }
            assert!(
                started.elapsed() < std::time::Duration::from_micros(delay_us),
                "a lone appender waited for the commit delay"
            );
            assert_eq!(log.io_counts().0, 3);
            // Two appends queued together share a batch; from then on appenders are concurrent.
            let (a, b) = (append(b"a"), append(b"b"));
            a.await.expect("appended");
            b.await.expect("appended");
            assert_eq!(log.io_counts().0, 4);
            // The writer now waits: appends made one after the other meanwhile share one batch.
            let company = std::time::Instant::now();
            let c = append(b"c");
            futures_lite::future::yield_now().await;
            let d = append(b"d");
            assert_eq!(c.await.expect("appended"), 5);
            assert_eq!(d.await.expect("appended"), 6);
            assert_eq!(log.io_counts().0, 5, "c and d share one batch");
            assert!(company.elapsed() >= std::time::Duration::from_micros(delay_us));
            log.close().await;
            journal.close().await;
        });
    }

    /// One wait per commit path: when the journal's last pass carried several partitions' entries, the journal's own
    /// delay gathers them, and a log whose batch gathered several appends does not add a delay of its own. It
    /// builds its next batch when the journal's delay ends, so the appends made during that delay ride the very
    /// next pass together. (Queuing the next batch at once left the appends that came during the delay to the pass
    /// after: with wrk at 64 connections on 16 partitions, 31 records per sync against 45 on one partition.)
    #[test]
    fn a_log_builds_its_next_batch_when_the_journals_delay_for_several_partitions_ends() {
        on_sim_disk(|storage| async move {
            let journal = journal_with_delay(&storage, 200_000).await;
            let (one, two) = (
                log_on(&storage, &journal, 0, 0).await,
                log_on(&storage, &journal, 1, 0).await,
            );
            // Partition 0 gathers two appends in one batch, and partition 1's entry shares the journal's pass.
            let (a, b, c) = (
                spawn_append(&one, b"a"),
                spawn_append(&one, b"b"),
                spawn_append(&two, b"c"),
            );
            a.await.expect("appended");
            b.await.expect("appended");
            c.await.expect("appended");
            assert_eq!(journal.stats().passes, 1, "{:?}", journal.stats());
            assert_eq!(journal.last_pass_entries(), 2);
            assert_eq!(one.io_counts().0, 1);
            // The journal is in its delay: appends made one after the other meanwhile form one batch, built when the
            // delay ends, and that batch is the next pass.
            let started = std::time::Instant::now();
            let d = spawn_append(&one, b"d");
            futures_lite::future::yield_now().await;
            let e = spawn_append(&one, b"e");
            assert_eq!(d.await.expect("appended"), 2);
            assert_eq!(e.await.expect("appended"), 3);
            assert_eq!(one.io_counts().0, 2, "d and e share one batch");
            let stats = journal.stats();
            assert_eq!(
                stats.passes, 2,
                "d and e ride the pass after the delay: {stats:?}"
            );
            assert_eq!(stats.records, 5);
            // They waited for the delay (begun just before `started`, so the bound has room).
            assert!(started.elapsed() >= std::time::Duration::from_millis(100));
            one.close().await;
            two.close().await;
            journal.close().await;
        });
    }
}
