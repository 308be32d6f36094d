//! A simulated disk for tests: files live in memory with a page-cache view and a durable view; writes, syncs and
//! segment reads can be made to fail with a chosen errno; `power_cut` returns the disk a power loss would leave (durable data,
//! plus any prefix of what was written but not synced). Plugged into a partition through `storage::backend`.

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
    /// The directory entry survives a power cut (its directory was synced after creation).
    entry_durable: bool,
}

#[derive(Default)]
struct State {
    files: BTreeMap<PathBuf, SimFile>,
    dirs: BTreeSet<PathBuf>,
    /// errno and count of writes still to fail.
    fail_writes: Option<(i32, u32)>,
    /// errno and count of syncs still to fail.
    fail_syncs: Option<(i32, u32)>,
    /// Segment reads still to fail.
    fail_reads: Option<ReadFault>,
    /// Reads of open files so far (`read_cached` hits and `read_at` calls).
    reads: u64,
    /// Syncs wait until `release_syncs` (see `hold_syncs`).
    hold_syncs: bool,
    /// Syncs waiting for `release_syncs` now.
    held_syncs: usize,
}

/// Reads of open files that fail: `left` more, with `errno`, of the files under `under` (every file if None).
#[derive(Clone, Debug)]
struct ReadFault {
    errno: i32,
    left: u32,
    under: Option<PathBuf>,
}

impl State {
    /// Whether a read of `path` fails now (without using up the fault).
    fn read_fails(&self, path: &Path) -> bool {
        self.fail_reads
            .as_ref()
            .is_some_and(|f| f.under.as_ref().is_none_or(|dir| path.starts_with(dir)))
    }

    /// Uses up one failing read of `path`, if one is armed for it.
    fn take_read_fault(&mut self, path: &Path) -> Option<io::Error> {
        if !self.read_fails(path) {
            return None;
        }
        let f = self.fail_reads.as_mut()?;
        let errno = f.errno;
        f.left -= 1;
        if f.left == 0 {
            self.fail_reads = None;
        }
        Some(io::Error::from_raw_os_error(errno))
    }
}

/// The simulated disk.
#[derive(Default)]
pub struct Sim {
    state: RefCell<State>,
    /// Fired by `release_syncs`.
    released: event_listener::Event,
}

fn take_fault(slot: &mut Option<(i32, u32)>) -> Option<io::Error> {
    let (errno, left) = (*slot)?;
    *slot = (left > 1).then_some((errno, left - 1));
    Some(io::Error::from_raw_os_error(errno))
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
        self.state.borrow_mut().fail_writes = (count > 0).then_some((errno, count));
    }

    /// The next `count` syncs fail with `errno`; what they should have made durable is not.
    pub fn fail_syncs(&self, errno: i32, count: u32) {
        self.state.borrow_mut().fail_syncs = (count > 0).then_some((errno, count));
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
        self.state.borrow_mut().fail_reads = (count > 0).then_some(ReadFault {
            errno,
            left: count,
            under,
        });
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
                (
                    path.clone(),
                    SimFile {
                        data: f.data.clone(),
                        durable: f.data.clone(),
                        entry_durable: true,
                    },
                )
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

    /// Every file's path.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.state.borrow().files.keys().cloned().collect()
    }

    /// The disk a power cut would leave now. For each file, `keep(path, unsynced_bytes)` chooses how many of the
    /// appended-but-unsynced bytes happened to reach the medium (0 = none, a torn prefix, or all). A file whose
    /// entry was never made durable survives only if `keep` keeps some of it.
    pub fn power_cut(&self, mut keep: impl FnMut(&Path, usize) -> usize) -> Rc<Sim> {
        let st = self.state.borrow();
        let mut files = BTreeMap::new();
        for (path, f) in &st.files {
            let appended = f.data.starts_with(&f.durable);
            let unsynced = if appended {
                f.data.len() - f.durable.len()
            } else {
                f.data.len()
            };
            let kept = keep(path, unsynced).min(unsynced);
            let content = if appended {
                f.data[..f.durable.len() + kept].to_vec()
            } else if kept > 0 {
                f.data.clone()
            } else {
                f.durable.clone()
            };
            if f.entry_durable || kept > 0 {
                files.insert(
                    path.clone(),
                    SimFile {
                        data: content.clone(),
                        durable: content,
                        entry_durable: true,
                    },
                );
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
}

/// An open simulated file.
struct SimSegment {
    sim: Rc<Sim>,
    path: PathBuf,
}

impl SegmentFile for SimSegment {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        let mut st = self.sim.state.borrow_mut();
        if let Some(e) = take_fault(&mut st.fail_writes) {
            return Err(e);
        }
        let f = st
            .files
            .get_mut(&self.path)
            .ok_or_else(|| not_found(&self.path))?;
        let end = pos as usize + buf.len();
        if f.data.len() < end {
            f.data.resize(end, 0);
        }
        f.data[pos as usize..end].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> IoFuture<'_, ()> {
        Box::pin(async move {
            futures_lite::future::yield_now().await;
            loop {
                let listener = self.sim.released.listen();
                if !self.sim.state.borrow().hold_syncs {
                    break;
                }
                self.sim.state.borrow_mut().held_syncs += 1;
                listener.await;
                self.sim.state.borrow_mut().held_syncs -= 1;
            }
            let mut st = self.sim.state.borrow_mut();
            if let Some(e) = take_fault(&mut st.fail_syncs) {
                return Err(e);
            }
            let f = st
                .files
                .get_mut(&self.path)
                .ok_or_else(|| not_found(&self.path))?;
            f.durable = f.data.clone();
            Ok(())
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
        Ok(())
    }

    fn open<'a>(&'a self, path: &'a Path, create: bool) -> IoFuture<'a, Rc<dyn SegmentFile>> {
        Box::pin(async move {
            let mut st = self.0.state.borrow_mut();
            if !st.files.contains_key(path) {
                if !create {
                    return Err(not_found(path));
                }
                st.files.insert(path.to_path_buf(), SimFile::default());
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
            if let Some(e) = take_fault(&mut st.fail_syncs) {
                return Err(e);
            }
            for (path, f) in st.files.iter_mut() {
                if path.parent() == Some(dir) {
                    f.entry_durable = true;
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

    fn remove_tree(&self, dir: &Path) {
        let mut st = self.0.state.borrow_mut();
        st.files.retain(|p, _| !p.starts_with(dir));
        st.dirs.retain(|d| !d.starts_with(dir));
    }

    /// Atomic and durable in one step, unless a sync fault is armed (then nothing changes).
    fn replace<'a>(&'a self, path: &'a Path, bytes: Vec<u8>) -> IoFuture<'a, ()> {
        Box::pin(async move {
            futures_lite::future::yield_now().await;
            let mut st = self.0.state.borrow_mut();
            if let Some(e) = take_fault(&mut st.fail_syncs) {
                return Err(e);
            }
            st.files.insert(
                path.to_path_buf(),
                SimFile {
                    data: bytes.clone(),
                    durable: bytes,
                    entry_durable: true,
                },
            );
            Ok(())
        })
    }
}
