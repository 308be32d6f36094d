//! A simulated disk for tests: files live in memory with a page-cache view and a durable view; writes, syncs and
//! segment reads can be made to fail with a chosen errno (everywhere or under one directory), syncs can lie (report
//! success and make nothing durable) or be held in flight; `power_cut` returns the disk a power loss would leave
//! (durable data, plus any prefix of what was written but not synced); `limit_space_under` gives a directory a
//! file system of its own with a capacity (a write that grows a file past it fails with ENOSPC, a write into a
//! file's existing length never does). Plugged into a partition through `storage::backend`.
//!
//! What a failed sync does is modelled on Linux: the pages it should have written are dropped (marked clean), so
//! they never reach the medium, though reads still see them until they are written again; a later sync that succeeds
//! does not bring them back. A rename is durable only once its directory (or the whole file system) is synced: a
//! power cut before that leaves the old file or the renamed one, with whatever of the renamed one's data was
//! synced. Small-file replacements run the real disk's algorithm (`backend::replace_batch`) over these calls, so a
//! cut can land between its steps.

use super::backend::{IoFuture, SegmentFile, Storage};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// One simulated file.
#[derive(Clone, Debug, Default)]
struct SimFile {
    /// What reads see (the page cache).
    data: Vec<u8>,
    /// What survives a power cut.
    durable: Vec<u8>,
    /// The directory entry survives a power cut (its directory was synced after creation or rename).
    entry_durable: bool,
    /// Bytes a failed sync dropped: they never reach the medium (the durable view keeps the old byte, or 0 past the
    /// old end) unless written again.
    dropped: BTreeMap<usize, Option<u8>>,
    /// A failed sync of the whole file system dropped some of this file's pages: its next own sync reports the error
    /// (once), as Linux reports a write-back error to every descriptor open before it.
    unreported_error: bool,
    /// For a file renamed over another whose rename is not durable yet: what a power cut leaves at this path if the
    /// rename is lost (the old file's durable content; None: no file).
    prior: Option<Option<Vec<u8>>>,
    /// Changes of the page cache so far (writes and truncations), and how many of them the durable view holds: a
    /// sync makes durable what was written before it was called, not what is written while it runs, and a sync
    /// that was called earlier and returns later does not take back what a later one made durable.
    changes: u64,
    durable_through: u64,
    /// Which file this is (an inode number): a sync called on a file that was removed, and whose path holds
    /// another file when it returns, makes nothing of that other file durable.
    id: u64,
}

/// File ids, unique in the process (`SimFile::id`).
static NEXT_FILE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn new_file_id() -> u64 {
    NEXT_FILE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// What a sync must make durable of one file, taken when the sync is called: the bytes a write-back would write
/// then (the page cache less what a failed sync dropped), how many changes they hold, and which file they are.
struct Seen {
    medium: Vec<u8>,
    changes: u64,
    id: u64,
}

impl SimFile {
    /// A file just created (entry not durable yet).
    fn created(data: Vec<u8>) -> SimFile {
        SimFile {
            data,
            id: new_file_id(),
            ..SimFile::default()
        }
    }

    /// A file as a restart finds it: what it holds is all there is.
    fn settled(content: Vec<u8>) -> SimFile {
        SimFile {
            data: content.clone(),
            durable: content,
            entry_durable: true,
            id: new_file_id(),
            ..SimFile::default()
        }
    }

    /// Writes `buf` at `pos` into the page cache; rewritten bytes are no longer dropped.
    fn write(&mut self, pos: usize, buf: &[u8]) {
        let end = pos + buf.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[pos..end].copy_from_slice(buf);
        self.changes += 1;
        if !self.dropped.is_empty() {
            let rewritten: Vec<usize> = self.dropped.range(pos..end).map(|(&p, _)| p).collect();
            for p in rewritten {
                self.dropped.remove(&p);
            }
        }
    }

    /// What a sync that works puts on the medium: the page cache, less the dropped bytes.
    fn medium(&self) -> Vec<u8> {
        self.medium_of(self.data.clone())
    }

    /// `data` (the page cache as a sync saw it when called), less the bytes dropped since.
    fn medium_of(&self, mut out: Vec<u8>) -> Vec<u8> {
        for (&pos, &old) in &self.dropped {
            if let Some(b) = out.get_mut(pos) {
                *b = old.unwrap_or(0);
            }
        }
        out
    }

    /// What a sync called now must make durable.
    fn seen(&self) -> Seen {
        Seen {
            medium: self.medium(),
            changes: self.changes,
            id: self.id,
        }
    }

    /// A sync that works, called when the file was as `seen` says: that is durable now (less what a failed sync
    /// dropped since), unless a sync called later already made more durable, or the path holds another file now.
    fn sync_as_seen(&mut self, seen: &Seen) {
        if seen.id == self.id && seen.changes >= self.durable_through {
            self.durable = self.medium_of(seen.medium.clone());
            self.durable_through = seen.changes;
        }
    }

    /// A sync that fails: every byte it should have written is dropped. True if there was any.
    fn drop_unsynced(&mut self) -> bool {
        let mut any = false;
        for (pos, &b) in self.data.iter().enumerate() {
            let old = self.durable.get(pos).copied();
            if old != Some(b) && !self.dropped.contains_key(&pos) {
                self.dropped.insert(pos, old);
                any = true;
            }
        }
        any
    }

    /// The content a power cut leaves, with `kept` of the unsynced bytes on the medium (a prefix, for an append).
    fn after_cut(&self, kept: usize) -> (Vec<u8>, usize) {
        let target = self.medium();
        let appended = target.starts_with(&self.durable);
        let unsynced = if appended {
            target.len() - self.durable.len()
        } else {
            target.len()
        };
        let kept = kept.min(unsynced);
        let content = if appended {
            target[..self.durable.len() + kept].to_vec()
        } else if kept > 0 {
            target
        } else {
            self.durable.clone()
        };
        (content, unsynced)
    }
}

#[derive(Default)]
struct State {
    files: BTreeMap<PathBuf, SimFile>,
    dirs: BTreeSet<PathBuf>,
    /// Writes still to fail.
    fail_writes: Option<Fault>,
    /// Syncs still to fail (a file's, a directory's, or the whole file system's).
    fail_syncs: Option<Fault>,
    /// Syncs still to report success without making anything durable.
    lie_syncs: u32,
    /// Segment reads still to fail.
    fail_reads: Option<Fault>,
    /// Opens of existing files (`Storage::open`) still to fail.
    fail_opens: Option<Fault>,
    /// Reads of open files so far (`read_cached` hits and `read_at` calls).
    reads: u64,
    /// Syncs wait until `release_syncs` (see `hold_syncs`).
    hold_syncs: bool,
    /// Syncs waiting for `release_syncs` now.
    held_syncs: usize,
    /// Syncs that met the hold so far (each is numbered from 0 in that order), and those let go one by one
    /// (`release_held_sync`) while the hold stays.
    syncs_met_hold: u64,
    let_go: BTreeSet<u64>,
    /// A file system of its own under this directory, holding at most this many bytes (see `limit_space_under`).
    quota: Option<(PathBuf, u64)>,
    /// Reported as a file system that allocates on overwrite (`set_copy_on_write`).
    copy_on_write: bool,
}

/// Calls that fail: `left` more, with `errno`, of the files under `under` (every file if None).
#[derive(Clone, Debug)]
struct Fault {
    errno: i32,
    left: u32,
    under: Option<PathBuf>,
}

impl Fault {
    fn armed(errno: i32, count: u32, under: Option<PathBuf>) -> Option<Fault> {
        (count > 0).then_some(Fault {
            errno,
            left: count,
            under,
        })
    }

    /// Whether a call on `path` fails now (without using up the fault).
    fn applies(slot: &Option<Fault>, path: &Path) -> bool {
        slot.as_ref()
            .is_some_and(|f| f.under.as_ref().is_none_or(|dir| path.starts_with(dir)))
    }

    /// Uses up one failing call on `path`, if one is armed for it.
    fn take(slot: &mut Option<Fault>, path: &Path) -> Option<io::Error> {
        if !Fault::applies(slot, path) {
            return None;
        }
        let f = slot.as_mut()?;
        let errno = f.errno;
        f.left -= 1;
        if f.left == 0 {
            *slot = None;
        }
        Some(io::Error::from_raw_os_error(errno))
    }
}

/// What a sync does: work, fail (dropping what it should have written), or lie.
enum SyncOutcome {
    Works,
    Fails(io::Error),
    Lies,
}

impl State {
    /// Whether a read of `path` fails now (without using up the fault).
    fn read_fails(&self, path: &Path) -> bool {
        Fault::applies(&self.fail_reads, path)
    }

    /// Uses up one failing read of `path`, if one is armed for it.
    fn take_read_fault(&mut self, path: &Path) -> Option<io::Error> {
        Fault::take(&mut self.fail_reads, path)
    }

    /// Uses up one failing write of `path`, if one is armed for it.
    fn take_write_fault(&mut self, path: &Path) -> Option<io::Error> {
        Fault::take(&mut self.fail_writes, path)
    }

    /// Bytes the files under `dir` hold (their page-cache length: what the file system has allocated).
    fn used_under(&self, dir: &Path) -> u64 {
        self.files
            .iter()
            .filter(|(p, _)| p.starts_with(dir))
            .map(|(_, f)| f.data.len() as u64)
            .sum()
    }

    /// ENOSPC if `path` growing to `new_len` bytes would overfill its quota; writes inside the blocks a file has
    /// (`new_len` no more than its length) always fit.
    fn space_for(&self, path: &Path, new_len: usize) -> Option<io::Error> {
        let (dir, limit) = self.quota.as_ref()?;
        let old_len = self.files.get(path).map_or(0, |f| f.data.len());
        if !path.starts_with(dir) || new_len <= old_len {
            return None;
        }
        let used = self.used_under(dir);
        (used - old_len as u64 + new_len as u64 > *limit)
            .then(|| io::Error::from_raw_os_error(libc::ENOSPC))
    }

    /// What the next sync of `path` does (a sync of the whole file system passes `None` and meets only faults armed
    /// everywhere).
    fn sync_outcome(&mut self, path: Option<&Path>) -> SyncOutcome {
        let fault = match path {
            Some(path) => Fault::take(&mut self.fail_syncs, path),
            None if self.fail_syncs.as_ref().is_some_and(|f| f.under.is_none()) => {
                Fault::take(&mut self.fail_syncs, Path::new("/"))
            }
            None => None,
        };
        if let Some(e) = fault {
            return SyncOutcome::Fails(e);
        }
        if self.lie_syncs > 0 {
            self.lie_syncs -= 1;
            return SyncOutcome::Lies;
        }
        SyncOutcome::Works
    }
}

/// The simulated disk.
#[derive(Default)]
pub struct Sim {
    state: RefCell<State>,
    /// Fired by `release_syncs`.
    released: event_listener::Event,
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

impl Sim {
    pub fn new() -> Rc<Sim> {
        Rc::new(Sim::default())
    }

    /// The next `count` writes fail with `errno` (e.g. libc::EIO, libc::ENOSPC) and change nothing.
    pub fn fail_writes(&self, errno: i32, count: u32) {
        self.state.borrow_mut().fail_writes = Fault::armed(errno, count, None);
    }

    /// Like `fail_writes`, for the files under `dir` only.
    pub fn fail_writes_under(&self, dir: &Path, errno: i32, count: u32) {
        self.state.borrow_mut().fail_writes = Fault::armed(errno, count, Some(dir.to_path_buf()));
    }

    /// The next `count` syncs fail with `errno`; what they should have made durable never will be (Linux drops the
    /// pages of a failed fsync: a later sync that succeeds does not write them).
    pub fn fail_syncs(&self, errno: i32, count: u32) {
        self.state.borrow_mut().fail_syncs = Fault::armed(errno, count, None);
    }

    /// Like `fail_syncs`, for the files under `dir` only (a sync of the whole file system is not affected).
    pub fn fail_syncs_under(&self, dir: &Path, errno: i32, count: u32) {
        self.state.borrow_mut().fail_syncs = Fault::armed(errno, count, Some(dir.to_path_buf()));
    }

    /// The next `count` syncs report success and make nothing durable (a device that lies about its cache).
    pub fn lie_syncs(&self, count: u32) {
        self.state.borrow_mut().lie_syncs = count;
    }

    /// Makes the files under `dir` a file system of its own holding at most `bytes` (None: no limit): a write that
    /// would grow a file past that fails with ENOSPC and changes nothing, a write into a file's existing length
    /// always succeeds (its blocks are allocated), and truncating or removing files frees space.
    pub fn limit_space_under(&self, dir: &Path, bytes: Option<u64>) {
        self.state.borrow_mut().quota = bytes.map(|b| (dir.to_path_buf(), b));
    }

    /// Makes the disk report itself a copy-on-write file system (`Storage::overwrites_in_place` false), as btrfs or
    /// ZFS would; its writes behave as before.
    pub fn set_copy_on_write(&self, on: bool) {
        self.state.borrow_mut().copy_on_write = on;
    }

    /// Bytes the files under `dir` hold now.
    pub fn used_under(&self, dir: &Path) -> u64 {
        self.state.borrow().used_under(dir)
    }

    /// Whether a write or sync fault is still armed.
    pub fn faults_armed(&self) -> bool {
        let st = self.state.borrow();
        st.fail_writes.is_some() || st.fail_syncs.is_some() || st.lie_syncs > 0
    }

    /// The next `count` opens of existing files under `dir` (`Storage::open`: a segment) fail with `errno` (e.g.
    /// libc::EIO, EMFILE).
    pub fn fail_opens_under(&self, dir: &Path, errno: i32, count: u32) {
        self.state.borrow_mut().fail_opens = Fault::armed(errno, count, Some(dir.to_path_buf()));
    }

    /// The next `count` reads of open files (a segment's `read_at`) fail with `errno` (e.g. libc::EIO); while such a
    /// fault is armed, `read_cached` misses, so every read goes to `read_at`. Whole-file reads (`Storage::read`:
    /// recovery, frontier files) are not affected.
    pub fn fail_reads(&self, errno: i32, count: u32) {
        self.arm_read_fault(errno, count, None);
    }

    /// Like `fail_reads`, for the files under `dir` only (one partition's directory, say).
    pub fn fail_reads_under(&self, dir: &Path, errno: i32, count: u32) {
        self.arm_read_fault(errno, count, Some(dir.to_path_buf()));
    }

    fn arm_read_fault(&self, errno: i32, count: u32, under: Option<PathBuf>) {
        self.state.borrow_mut().fail_reads = Fault::armed(errno, count, under);
    }

    /// Waits while syncs are held (`hold_syncs`).
    async fn wait_for_release(&self) {
        let number = {
            let mut st = self.state.borrow_mut();
            if !st.hold_syncs {
                return;
            }
            st.syncs_met_hold += 1;
            st.syncs_met_hold - 1
        };
        loop {
            let listener = self.released.listen();
            if !self.state.borrow().hold_syncs || self.state.borrow_mut().let_go.remove(&number) {
                return;
            }
            self.state.borrow_mut().held_syncs += 1;
            listener.await;
            self.state.borrow_mut().held_syncs -= 1;
        }
    }

    /// Reads of open files so far: `read_cached` hits and `read_at` calls (a miss followed by its `read_at` counts
    /// once).
    pub fn reads(&self) -> u64 {
        self.state.borrow().reads
    }

    /// From now on a sync waits, before it makes anything durable, until `release_syncs`: a test can queue work while
    /// a sync is in flight, whatever the scheduling.
    pub fn hold_syncs(&self) {
        self.state.borrow_mut().hold_syncs = true;
    }

    /// Lets the held syncs (and every later one) go on.
    pub fn release_syncs(&self) {
        self.state.borrow_mut().hold_syncs = false;
        self.released.notify(usize::MAX);
    }

    /// Lets held sync number `number` go on (syncs are numbered from 0 as they meet a hold), the others still held.
    pub fn release_held_sync(&self, number: u64) {
        self.state.borrow_mut().let_go.insert(number);
        self.released.notify(usize::MAX);
    }

    /// Syncs waiting for `release_syncs` now.
    pub fn held_syncs(&self) -> usize {
        self.state.borrow().held_syncs
    }

    /// Failing reads still armed (0 when none).
    pub fn reads_to_fail(&self) -> u32 {
        self.state
            .borrow()
            .fail_reads
            .as_ref()
            .map_or(0, |f| f.left)
    }

    /// The page-cache content of a file.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        self.state.borrow().files.get(path).map(|f| f.data.clone())
    }

    /// Overwrites a byte of a file in both views (bit rot on the medium).
    pub fn corrupt(&self, path: &Path, pos: usize, xor: u8) {
        if let Some(f) = self.state.borrow_mut().files.get_mut(path) {
            if let Some(b) = f.data.get_mut(pos) {
                *b ^= xor;
            }
            if let Some(b) = f.durable.get_mut(pos) {
                *b ^= xor;
            }
        }
    }

    /// The disk a process crash (kill -9) leaves: the page cache survives, so everything written is there, and
    /// every file, synced or not.
    pub fn process_crash(&self) -> Rc<Sim> {
        let st = self.state.borrow();
        let files = st
            .files
            .iter()
            .map(|(path, f)| {
                // The page cache is written back in time, except what a failed sync dropped (the new process still
                // reads it from the cache; a power cut later loses it unless it is written again).
                let mut file = SimFile {
                    data: f.data.clone(),
                    dropped: f.dropped.clone(),
                    entry_durable: true,
                    ..SimFile::default()
                };
                file.durable = file.medium();
                (path.clone(), file)
            })
            .collect();
        Rc::new(Sim {
            state: RefCell::new(State {
                files,
                dirs: st.dirs.clone(),
                ..State::default()
            }),
            released: event_listener::Event::new(),
        })
    }

    /// What a power cut now would leave of a file if nothing unsynced reached the medium (None: no file).
    pub fn durable_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.borrow();
        let f = st.files.get(path)?;
        if f.entry_durable {
            Some(f.durable.clone())
        } else {
            f.prior.clone().flatten()
        }
    }

    /// Every file's path.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.state.borrow().files.keys().cloned().collect()
    }

    /// The disk a power cut would leave now. For each file, `keep(path, unsynced_bytes)` chooses how many of the
    /// written-but-unsynced bytes happened to reach the medium (0 = none, a torn prefix, or all; for an overwrite
    /// anything but 0 keeps it whole, as a sector is written whole). A file whose entry was never made durable
    /// survives only if `keep` keeps some of it; a rename that was not made durable is kept or lost on
    /// `keep(path, 1)`.
    pub fn power_cut(&self, mut keep: impl FnMut(&Path, usize) -> usize) -> Rc<Sim> {
        let st = self.state.borrow();
        let mut files = BTreeMap::new();
        for (path, f) in &st.files {
            let unsynced = f.after_cut(usize::MAX).1;
            let (content, kept) = {
                let kept = keep(path, unsynced).min(unsynced);
                (f.after_cut(kept).0, kept)
            };
            let survivor = if f.entry_durable {
                Some(content)
            } else if let Some(prior) = &f.prior {
                if keep(path, 1) > 0 {
                    Some(content)
                } else {
                    prior.clone()
                }
            } else {
                (kept > 0).then_some(content)
            };
            if let Some(content) = survivor {
                files.insert(path.clone(), SimFile::settled(content));
            }
        }
        Rc::new(Sim {
            state: RefCell::new(State {
                files,
                dirs: st.dirs.clone(),
                ..State::default()
            }),
            released: event_listener::Event::new(),
        })
    }

    /// Syncs `path`: works, fails (dropping its unsynced bytes) or lies, as armed.
    /// What a sync of `path` called now must make durable.
    fn seen(&self, path: &Path) -> Option<Seen> {
        self.state.borrow().files.get(path).map(SimFile::seen)
    }

    fn sync_file(&self, path: &Path, seen: Option<Seen>) -> io::Result<()> {
        let mut st = self.state.borrow_mut();
        let outcome = st.sync_outcome(Some(path));
        let f = st.files.get_mut(path).ok_or_else(|| not_found(path))?;
        let outcome = match outcome {
            SyncOutcome::Works if f.unreported_error => {
                SyncOutcome::Fails(io::Error::from_raw_os_error(libc::EIO))
            }
            outcome => outcome,
        };
        f.unreported_error = false;
        match outcome {
            SyncOutcome::Works => {
                if let Some(seen) = &seen {
                    f.sync_as_seen(seen);
                }
            }
            SyncOutcome::Lies => {}
            SyncOutcome::Fails(e) => {
                f.drop_unsynced();
                return Err(e);
            }
        }
        Ok(())
    }
}

fn trace(what: impl FnOnce() -> String) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("BERTH_SIM_TRACE").is_some()) {
        eprintln!("  disk: {}", what());
    }
}

/// The simulator under `backend::replace_batch`: each call first lets other tasks run (so a simulated power cut can
/// land between the steps of a batch), and `sync_all` waits while syncs are held. A file this batch wrote whose
/// pages an earlier failed sync dropped makes its `sync_all` fail (as Linux reports a write-back error through
/// every descriptor open when it happened).
struct SimFs<'a> {
    sim: &'a Sim,
    touched: Vec<PathBuf>,
}

impl super::backend::ReplaceFs for SimFs<'_> {
    async fn overwrite_same_len(&mut self, path: &Path, bytes: &[u8]) -> io::Result<bool> {
        futures_lite::future::yield_now().await;
        let mut st = self.sim.state.borrow_mut();
        if st
            .files
            .get(path)
            .is_none_or(|f| f.data.len() != bytes.len())
        {
            return Ok(false);
        }
        if let Some(e) = st.take_write_fault(path) {
            return Err(e);
        }
        st.files.get_mut(path).expect("checked").write(0, bytes);
        self.touched.push(path.to_path_buf());
        trace(|| {
            format!(
                "overwrite {} {:?}",
                path.display(),
                &bytes[..bytes.len().min(8)]
            )
        });
        Ok(true)
    }

    async fn write_new(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        let mut st = self.sim.state.borrow_mut();
        if let Some(e) = st.take_write_fault(path) {
            return Err(e);
        }
        if let Some(e) = st.space_for(path, bytes.len()) {
            return Err(e);
        }
        self.touched.push(path.to_path_buf());
        match st.files.get_mut(path) {
            Some(f) => {
                f.data.clear();
                f.write(0, bytes);
            }
            None => {
                st.files
                    .insert(path.to_path_buf(), SimFile::created(bytes.to_vec()));
            }
        }
        Ok(())
    }

    async fn sync_all(&mut self) -> io::Result<()> {
        // As syncfs(2): what was written before the call, not what is written while it runs.
        let seen: BTreeMap<PathBuf, Seen> = {
            let st = self.sim.state.borrow();
            st.files
                .iter()
                .map(|(p, f)| (p.clone(), f.seen()))
                .collect()
        };
        futures_lite::future::yield_now().await;
        self.sim.wait_for_release().await;
        let mut st = self.sim.state.borrow_mut();
        trace(|| format!("sync_all after {:?}", self.touched));
        let mut unreported = false;
        for path in &self.touched {
            if let Some(f) = st.files.get_mut(path) {
                unreported |= std::mem::take(&mut f.unreported_error);
            }
        }
        let outcome = match st.sync_outcome(None) {
            SyncOutcome::Works if unreported => {
                SyncOutcome::Fails(io::Error::from_raw_os_error(libc::EIO))
            }
            outcome => outcome,
        };
        match outcome {
            SyncOutcome::Works => {
                for (path, f) in st.files.iter_mut() {
                    // A file created after the call (or another one at a path seen then) is not covered.
                    if let Some(seen) = seen.get(path).filter(|s| s.id == f.id) {
                        f.sync_as_seen(seen);
                        f.entry_durable = true;
                        f.prior = None;
                    }
                }
                Ok(())
            }
            SyncOutcome::Lies => Ok(()),
            SyncOutcome::Fails(e) => {
                // Reported now to this batch's files; every other file with dropped pages reports it at its next
                // own sync.
                for (path, f) in st.files.iter_mut() {
                    if f.drop_unsynced() && !self.touched.contains(path) {
                        f.unreported_error = true;
                    }
                }
                Err(e)
            }
        }
    }

    async fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        let mut st = self.sim.state.borrow_mut();
        let mut moved = st.files.remove(from).ok_or_else(|| not_found(from))?;
        let prior = match st.files.get(to) {
            Some(old) if old.entry_durable => Some(old.durable.clone()),
            Some(old) => old.prior.clone().flatten(),
            None => None,
        };
        moved.entry_durable = false;
        moved.prior = Some(prior);
        st.files.insert(to.to_path_buf(), moved);
        self.touched.push(to.to_path_buf());
        Ok(())
    }
}

/// An open simulated file.
struct SimSegment {
    sim: Rc<Sim>,
    path: PathBuf,
}

impl SegmentFile for SimSegment {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        let mut st = self.sim.state.borrow_mut();
        if let Some(e) = st.take_write_fault(&self.path) {
            return Err(e);
        }
        let len = st.files.get(&self.path).map_or(0, |f| f.data.len());
        if let Some(e) = st.space_for(&self.path, len.max(pos as usize + buf.len())) {
            return Err(e);
        }
        let f = st
            .files
            .get_mut(&self.path)
            .ok_or_else(|| not_found(&self.path))?;
        f.write(pos as usize, buf);
        Ok(())
    }

    fn sync(&self) -> IoFuture<'_, ()> {
        Box::pin(async move {
            let seen = self.sim.seen(&self.path);
            futures_lite::future::yield_now().await;
            self.sim.wait_for_release().await;
            self.sim.sync_file(&self.path, seen)
        })
    }

    fn read_cached(&self, pos: u64, len: usize) -> Option<Vec<u8>> {
        let mut st = self.sim.state.borrow_mut();
        if st.read_fails(&self.path) {
            return None;
        }
        let f = st.files.get(&self.path)?;
        let start = (pos as usize).min(f.data.len());
        let end = (start + len).min(f.data.len());
        let bytes = (end - start == len).then(|| f.data[start..end].to_vec());
        st.reads += bytes.is_some() as u64;
        bytes
    }

    fn read_at(&self, pos: u64, len: usize) -> IoFuture<'_, Vec<u8>> {
        Box::pin(async move {
            let mut st = self.sim.state.borrow_mut();
            st.reads += 1;
            if let Some(e) = st.take_read_fault(&self.path) {
                return Err(e);
            }
            let f = st
                .files
                .get(&self.path)
                .ok_or_else(|| not_found(&self.path))?;
            let start = (pos as usize).min(f.data.len());
            let end = (start + len).min(f.data.len());
            Ok(f.data[start..end].to_vec())
        })
    }

    fn truncate(&self, len: u64) -> IoFuture<'_, ()> {
        Box::pin(async move {
            let mut st = self.sim.state.borrow_mut();
            let f = st
                .files
                .get_mut(&self.path)
                .ok_or_else(|| not_found(&self.path))?;
            f.data.truncate(len as usize);
            f.changes += 1;
            f.dropped.retain(|&pos, _| pos < len as usize);
            Ok(())
        })
    }
}

/// The simulator as a partition's storage (shared: clone the Rc to keep a handle for the test).
pub struct SimStorage(pub Rc<Sim>);

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.0.state.borrow_mut();
        for d in dir.ancestors() {
            if d.as_os_str().is_empty() {
                break;
            }
            st.dirs.insert(d.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.0.state.borrow();
        Ok(st
            .files
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.0.contents(path).ok_or_else(|| not_found(path))
    }

    fn truncate_file(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut st = self.0.state.borrow_mut();
        let f = st.files.get_mut(path).ok_or_else(|| not_found(path))?;
        f.data.truncate(len as usize);
        f.durable.truncate(len as usize);
        f.dropped.retain(|&pos, _| pos < len as usize);
        // Durable at once: no sync called before it may bring the cut bytes back.
        f.changes += 1;
        f.durable_through = f.changes;
        Ok(())
    }

    fn open<'a>(&'a self, path: &'a Path, create: bool) -> IoFuture<'a, Rc<dyn SegmentFile>> {
        Box::pin(async move {
            let mut st = self.0.state.borrow_mut();
            if st.files.contains_key(path) {
                if let Some(e) = Fault::take(&mut st.fail_opens, path) {
                    return Err(e);
                }
            } else {
                if !create {
                    return Err(not_found(path));
                }
                st.files
                    .insert(path.to_path_buf(), SimFile::created(Vec::new()));
            }
            Ok(Rc::new(SimSegment {
                sim: self.0.clone(),
                path: path.to_path_buf(),
            }) as Rc<dyn SegmentFile>)
        })
    }

    fn sync_dir<'a>(&'a self, dir: &'a Path) -> IoFuture<'a, ()> {
        Box::pin(async move {
            let mut st = self.0.state.borrow_mut();
            match st.sync_outcome(Some(dir)) {
                SyncOutcome::Fails(e) => return Err(e),
                SyncOutcome::Lies => return Ok(()),
                SyncOutcome::Works => {}
            }
            for (path, f) in st.files.iter_mut() {
                if path.parent() == Some(dir) {
                    f.entry_durable = true;
                    f.prior = None;
                }
            }
            Ok(())
        })
    }

    fn remove<'a>(&'a self, path: &'a Path) -> IoFuture<'a, ()> {
        Box::pin(async move {
            self.0.state.borrow_mut().files.remove(path);
            Ok(())
        })
    }

    fn list_dirs(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.0.state.borrow();
        if !st.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let mut names: Vec<String> = st
            .dirs
            .iter()
            .filter(|d| d.parent() == Some(dir))
            .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        names.dedup();
        Ok(names)
    }

    /// Moves a file or a directory tree (durable at once: the simulator does not cut power mid-rename).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.0.state.borrow_mut();
        let found = st.dirs.contains(from) || st.files.keys().any(|p| p.starts_with(from));
        let moved =
            |p: &Path| -> Option<PathBuf> { p.strip_prefix(from).ok().map(|rest| to.join(rest)) };
        let files: Vec<(PathBuf, SimFile)> = std::mem::take(&mut st.files)
            .into_iter()
            .map(|(p, f)| (moved(&p).unwrap_or(p), f))
            .collect();
        st.files = files.into_iter().collect();
        let dirs: BTreeSet<PathBuf> = std::mem::take(&mut st.dirs)
            .into_iter()
            .map(|d| moved(&d).unwrap_or(d))
            .collect();
        st.dirs = dirs;
        if found {
            Ok(())
        } else {
            Err(not_found(from))
        }
    }

    fn overwrites_in_place(&self, _dir: &Path) -> bool {
        !self.0.state.borrow().copy_on_write
    }

    fn remove_tree(&self, dir: &Path) {
        let mut st = self.0.state.borrow_mut();
        st.files.retain(|p, _| !p.starts_with(dir));
        st.dirs.retain(|d| !d.starts_with(dir));
    }

    /// The real disk's batch (`backend::replace_batch`: temp file, sync, rename, sync) over the simulated calls, one
    /// file per batch.
    fn replace<'a>(&'a self, path: &'a Path, bytes: Vec<u8>) -> IoFuture<'a, ()> {
        self.replace_one(path, bytes, false)
    }

    fn overwrite_small<'a>(&'a self, path: &'a Path, bytes: Vec<u8>) -> IoFuture<'a, ()> {
        self.replace_one(path, bytes, true)
    }
}

impl SimStorage {
    fn replace_one<'a>(
        &'a self,
        path: &'a Path,
        bytes: Vec<u8>,
        in_place: bool,
    ) -> IoFuture<'a, ()> {
        Box::pin(async move {
            let items = [(path.to_path_buf(), bytes, in_place)];
            let mut fs = SimFs {
                sim: &self.0,
                touched: Vec::new(),
            };
            let mut results = super::backend::replace_batch(&mut fs, &items).await;
            results.pop().expect("one result per item")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::backend::Storage;

    /// A sync makes durable what was written before it was called, not what is written while it runs; and a sync
    /// called earlier that returns later takes back nothing a later one made durable. (A model that made everything
    /// durable at the sync's return would let a caller that answers a write with a sync begun before it pass.)
    #[test]
    fn a_sync_makes_durable_what_was_written_before_it_was_called() {
        with_file(|sim, _storage, file| async move {
            let path = Path::new("/d/f");
            sim.hold_syncs();
            file.write_at(b"bb", 2).expect("write");
            let first = sync_task(&file);
            settle().await;
            assert_eq!(sim.held_syncs(), 1);
            // Written while the first sync runs; a second sync, called after it, returns first.
            file.write_at(b"cc", 4).expect("write");
            let second = sync_task(&file);
            settle().await;
            assert_eq!(sim.held_syncs(), 2);
            sim.release_held_sync(1);
            second.await.expect("the second sync");
            assert_eq!(sim.durable_contents(path).as_deref(), Some(&b"aabbcc"[..]));
            sim.release_syncs();
            first.await.expect("the first sync");
            assert_eq!(
                sim.durable_contents(path).as_deref(),
                Some(&b"aabbcc"[..]),
                "the first sync, returning last, takes nothing back"
            );
            // Held alone: only what was written before it is durable when it returns.
            sim.hold_syncs();
            file.write_at(b"dd", 6).expect("write");
            let third = sync_task(&file);
            settle().await;
            file.write_at(b"ee", 8).expect("write");
            sim.release_syncs();
            third.await.expect("the third sync");
            assert_eq!(
                sim.durable_contents(path).as_deref(),
                Some(&b"aabbccdd"[..]),
                "ee was written while the sync ran"
            );
            let cut = sim.power_cut(|_, _| 0);
            assert_eq!(cut.contents(path).as_deref(), Some(&b"aabbccdd"[..]));
        });
    }

    /// Runs `test` on a fresh simulated disk with a file `/d/f` holding `aa`, durable.
    fn with_file<F: std::future::Future<Output = ()>>(
        test: impl FnOnce(Rc<Sim>, SimStorage, Rc<dyn SegmentFile>) -> F,
    ) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(async {
                let sim = Sim::new();
                let storage = SimStorage(sim.clone());
                storage.create_dir_all(Path::new("/d")).expect("dir");
                let file = storage.open(Path::new("/d/f"), true).await.expect("open");
                file.write_at(b"aa", 0).expect("write");
                file.sync().await.expect("sync");
                storage.sync_dir(Path::new("/d")).await.expect("dir sync");
                test(sim, storage, file).await
            });
    }

    /// A sync of `file` in a task of its own (to be held, released, awaited).
    fn sync_task(file: &Rc<dyn SegmentFile>) -> glommio::Task<io::Result<()>> {
        let file = file.clone();
        glommio::spawn_local(async move { file.sync().await })
    }

    async fn settle() {
        for _ in 0..100 {
            futures_lite::future::yield_now().await;
        }
    }

    /// A write that retries bytes a failed sync dropped is not made durable by a sync called before it.
    #[test]
    fn a_retry_after_a_failed_sync_is_not_covered_by_a_sync_called_before_it() {
        with_file(|sim, _storage, file| async move {
            let path = Path::new("/d/f");
            file.write_at(b"bb", 2).expect("write");
            sim.fail_syncs(libc::EIO, 1);
            assert!(file.sync().await.is_err());
            sim.hold_syncs();
            let held = sync_task(&file);
            settle().await;
            file.write_at(b"bb", 2).expect("the retry");
            sim.release_syncs();
            held.await.expect("the held sync");
            assert_eq!(sim.durable_contents(path).as_deref(), Some(&b"aa\0\0"[..]));
        });
    }

    /// A sync held across a removal and a new file at the same path makes nothing of the new file durable.
    #[test]
    fn a_sync_of_a_removed_file_makes_nothing_of_its_successor_durable() {
        with_file(|sim, storage, file| async move {
            let path = Path::new("/d/f");
            file.write_at(b"old", 2).expect("write");
            sim.hold_syncs();
            let held = sync_task(&file);
            settle().await;
            storage.remove(path).await.expect("remove");
            let new = storage.open(path, true).await.expect("create");
            new.write_at(b"n", 0).expect("write");
            sim.release_syncs();
            let _ = held.await;
            assert_ne!(
                sim.state
                    .borrow()
                    .files
                    .get(path)
                    .map(|f| f.durable.clone()),
                Some(b"aaold".to_vec()),
                "the removed file's bytes"
            );
        });
    }

    /// A cut made durable by `truncate_file` is not undone by a sync called before it.
    #[test]
    fn a_sync_called_before_a_durable_truncation_does_not_bring_the_cut_back() {
        with_file(|sim, storage, file| async move {
            let path = Path::new("/d/f");
            file.write_at(b"aa", 2).expect("write");
            sim.hold_syncs();
            let held = sync_task(&file);
            settle().await;
            storage.truncate_file(path, 2).expect("truncate");
            sim.release_syncs();
            held.await.expect("the held sync");
            assert_eq!(sim.durable_contents(path).as_deref(), Some(&b"aa"[..]));
        });
    }

    /// syncfs makes durable what was written before it was called, not what is written while it runs.
    #[test]
    fn a_file_system_sync_does_not_cover_writes_made_while_it_runs() {
        with_file(|sim, storage, file| async move {
            let path = Path::new("/d/f");
            sim.hold_syncs();
            let replaced = glommio::spawn_local({
                let storage = SimStorage(sim.clone());
                async move { storage.replace(Path::new("/d/meta"), b"m".to_vec()).await }
            });
            settle().await;
            assert_eq!(
                sim.held_syncs(),
                1,
                "the replacement's first syncfs is held"
            );
            file.write_at(b"bb", 2).expect("write");
            // The first syncfs returns; the replacement's second (after its rename) is held.
            let first = sim.state.borrow().syncs_met_hold - 1;
            sim.release_held_sync(first);
            settle().await;
            assert_eq!(sim.held_syncs(), 1, "the second syncfs is held");
            assert_eq!(sim.durable_contents(path).as_deref(), Some(&b"aa"[..]));
            sim.release_syncs();
            replaced.await.expect("replaced");
            let _ = storage;
        });
    }
}
