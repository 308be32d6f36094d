//! The narrow interface between a partition and its files, so tests can plug in a backend that fails writes and
//! syncs on demand or loses unsynced data at a simulated power cut (`storage::sim`). `Disk` is the real one:
//! page-cache writes with pwrite(2) from the owning core, syncs and misses through glommio's io_uring.

use glommio::io::{BufferedFile, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;

/// A boxed local I/O future (one allocation per sync or miss: negligible next to the I/O).
pub type IoFuture<'a, T> = Pin<Box<dyn Future<Output = io::Result<T>> + 'a>>;

/// One open segment file.
pub trait SegmentFile {
    /// Writes the whole buffer at `pos` (into the page cache: not yet durable).
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// Makes everything written so far durable (fdatasync).
    fn sync(&self) -> IoFuture<'_, ()>;
    /// Reads `len` bytes at `pos` if that costs no waiting (cached); None sends the caller to `read_at`.
    fn read_cached(&self, pos: u64, len: usize) -> Option<Vec<u8>>;
    /// Reads `len` bytes at `pos` (fewer at the end of the file).
    fn read_at(&self, pos: u64, len: usize) -> IoFuture<'_, Vec<u8>>;
    /// Cuts the file to `len` bytes.
    fn truncate(&self, len: u64) -> IoFuture<'_, ()>;
}

/// Where a partition's files live.
pub trait Storage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// File names in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// A whole file (NotFound when missing). Used at boot and for the 12-byte frontier.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Cuts a file to `len` durably (recovery of a torn tail, before the file is opened).
    fn truncate_file(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Opens a segment file for reading and writing, creating it if asked.
    fn open<'a>(&'a self, path: &'a Path, create: bool) -> IoFuture<'a, Rc<dyn SegmentFile>>;
    /// Makes the directory's entries durable.
    fn sync_dir<'a>(&'a self, dir: &'a Path) -> IoFuture<'a, ()>;
    /// Removes a file.
    fn remove<'a>(&'a self, path: &'a Path) -> IoFuture<'a, ()>;
    /// Replaces a small file atomically and durably (temp + sync + rename + directory sync).
    fn replace<'a>(&'a self, path: &'a Path, bytes: Vec<u8>) -> IoFuture<'a, ()>;
    /// Like `replace`, for a file of at most 512 bytes whose every version has the same length and carries its own
    /// checksum (a frontier): an existing file may be overwritten in place, since a write within one sector is not
    /// torn by a power loss and the checksum catches a device for which it is.
    fn overwrite_small<'a>(&'a self, path: &'a Path, bytes: Vec<u8>) -> IoFuture<'a, ()> {
        self.replace(path, bytes)
    }
    /// Names of the subdirectories of `dir` (NotFound when `dir` is missing).
    fn list_dirs(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Renames a file or directory (same file system); durable once the directories are synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a directory and everything under it, in the background where that matters (it is no longer
    /// reachable by any core).
    fn remove_tree(&self, dir: &Path);

    /// Whether writing over bytes that files under `dir` already hold never needs new space on their file system.
    /// False where it allocates on overwrite (copy-on-write file systems: btrfs, ZFS, bcachefs), or when that cannot
    /// be told. The journal reserves room below the zeros it wrote only where this holds (`Journal::reserve`).
    fn overwrites_in_place(&self, _dir: &Path) -> bool {
        true
    }
}

/// How the real disk makes data durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncVia {
    /// fdatasync(2) called by the core itself: the core waits for the device, but requests that arrive meanwhile are
    /// served in one batch afterwards. The three ways measured against each other: docs/benchmark-history.md, "Design measurements".
    Inline,
    /// IORING_OP_FSYNC: the core keeps serving while an io-wq kernel worker syncs. The worker shares the core, and
    /// the hand-off costs context switches and interrupts.
    IoUring,
    /// fdatasync(2) on a thread of glommio's blocking pool (bound to this core's CPU): the core keeps serving while
    /// the thread sleeps on the device, and is told by an eventfd when it returns.
    Thread,
}

/// The real disk.
pub struct Disk {
    pub sync_via: SyncVia,
    /// Small-file replacements waiting for the next batch (see `Disk::replace`).
    replacements: Rc<Replacements>,
}

impl Disk {
    pub fn new(sync_via: SyncVia) -> Disk {
        Disk {
            sync_via,
            replacements: Rc::default(),
        }
    }

    fn queue_replacement<'a>(
        &'a self,
        path: &'a Path,
        bytes: Vec<u8>,
        in_place: bool,
    ) -> IoFuture<'a, ()> {
        Box::pin(async move {
            let (tx, rx) = futures_channel::oneshot::channel();
            self.replacements
                .queue
                .borrow_mut()
                .push((path.to_path_buf(), bytes, in_place, tx));
            if !self.replacements.running.replace(true) {
                glommio::spawn_local(self.replacements.clone().run()).detach();
            }
            rx.await
                .unwrap_or_else(|_| Err(io::Error::other("the replacement batch was dropped")))
        })
    }
}

/// A queued replacement: path, content, whether it may be overwritten in place, and who waits for it.
type Replacement = (
    std::path::PathBuf,
    Vec<u8>,
    bool,
    futures_channel::oneshot::Sender<io::Result<()>>,
);

/// The queue of small-file replacements of one core, and whether a batch is running.
#[derive(Default)]
struct Replacements {
    queue: std::cell::RefCell<Vec<Replacement>>,
    running: std::cell::Cell<bool>,
}

impl Replacements {
    /// Runs batches until the queue is empty (one task per core at a time).
    async fn run(self: Rc<Self>) {
        loop {
            // Let the other flushes of this pass queue up first: they share the batch.
            futures_lite::future::yield_now().await;
            let batch = std::mem::take(&mut *self.queue.borrow_mut());
            if batch.is_empty() {
                self.running.set(false);
                return;
            }
            let (items, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|(p, b, i, r)| ((p, b, i), r)).unzip();
            let results = glommio::executor()
                .spawn_blocking(move || {
                    pool_priority(PoolJob::Other);
                    futures_lite::future::block_on(replace_batch(&mut RealFs::default(), &items))
                })
                .await;
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }
}

/// The file-system calls a batch of small-file replacements makes ([`replace_batch`]): the real disk's (`RealFs`, on
/// a blocking thread) and the simulator's (`storage::sim`), so tests cut power between the very steps the real disk
/// takes.
pub(crate) trait ReplaceFs {
    /// Overwrites `path` from offset 0 when it exists with exactly `bytes.len()` bytes; false (nothing written) when
    /// it does not exist or has another length.
    async fn overwrite_same_len(&mut self, path: &Path, bytes: &[u8]) -> io::Result<bool>;
    /// Creates or truncates `path` and writes `bytes` to it (the page cache only).
    async fn write_new(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Makes every write and rename made so far durable (syncfs(2) on each file system touched).
    async fn sync_all(&mut self) -> io::Result<()>;
    /// Renames `from` over `to` (durable at the next `sync_all`).
    async fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()>;
}

/// `NAME.tmp` beside `path`.
fn tmp_of(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces many small files with two file-system syncs in all: every new content goes to `NAME.tmp` (no sync), one
/// sync makes them durable, each is renamed over its file, and a second sync makes the renames durable. A crash
/// leaves each file with its old or its new content, never a mix (the same promise as `atomic_file::replace`, at a
/// cost that does not grow with the number of files). The first sync must come before any rename: a rename that
/// reaches the disk before its file's data leaves an empty or torn file behind a power cut
/// (`fault_tests::a_small_file_replacement_is_old_or_new_at_every_step_of_a_cut`).
///
/// A small file marked for it (`overwrite_small`) that exists with the same length is overwritten in place instead:
/// no new inode per write (creating and deleting thousands of temp files a second costs ext4 more than the syncs).
pub(crate) async fn replace_batch(
    fs: &mut impl ReplaceFs,
    items: &[(std::path::PathBuf, Vec<u8>, bool)],
) -> Vec<io::Result<()>> {
    let mut results: Vec<io::Result<()>> = Vec::with_capacity(items.len());
    // Which items went through a temp file (and need their rename).
    let mut renames: Vec<bool> = Vec::with_capacity(items.len());
    for (path, bytes, in_place) in items {
        let written = if *in_place && bytes.len() <= 512 {
            fs.overwrite_same_len(path, bytes).await
        } else {
            Ok(false)
        };
        let (written, renamed) = match written {
            Ok(true) => (Ok(()), false),
            Ok(false) => (fs.write_new(&tmp_of(path), bytes).await, true),
            Err(e) => (Err(e), false),
        };
        results.push(written);
        renames.push(renamed);
    }
    let all_failed = |e: io::Error| {
        items
            .iter()
            .map(|_| Err(io::Error::new(e.kind(), e.to_string())))
            .collect()
    };
    if let Err(e) = fs.sync_all().await {
        return all_failed(e);
    }
    let mut renamed_any = false;
    for (((path, _, _), result), renamed) in items.iter().zip(results.iter_mut()).zip(&renames) {
        if result.is_ok() && *renamed {
            *result = fs.rename(&tmp_of(path), path).await;
            renamed_any = true;
        }
    }
    if renamed_any {
        if let Err(e) = fs.sync_all().await {
            return all_failed(e);
        }
    }
    results
}

/// The real file system under [`replace_batch`], on a blocking thread (the calls do not wait on anything async).
#[derive(Default)]
struct RealFs {
    /// One open file per file system touched, for syncfs.
    devices: Vec<(u64, std::fs::File)>,
}

impl RealFs {
    fn touched(&mut self, f: std::fs::File) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let dev = f.metadata()?.dev();
        if !self.devices.iter().any(|(d, _)| *d == dev) {
            self.devices.push((dev, f));
        }
        Ok(())
    }
}

impl ReplaceFs for RealFs {
    async fn overwrite_same_len(&mut self, path: &Path, bytes: &[u8]) -> io::Result<bool> {
        use std::os::unix::fs::FileExt;
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(path) else {
            return Ok(false);
        };
        if f.metadata()?.len() != bytes.len() as u64 {
            return Ok(false);
        }
        f.write_all_at(bytes, 0)?;
        self.touched(f)?;
        Ok(true)
    }

    async fn write_new(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(path)?;
        f.write_all(bytes)?;
        self.touched(f)
    }

    async fn sync_all(&mut self) -> io::Result<()> {
        for (_, f) in &self.devices {
            // SAFETY: syncfs on a descriptor this value owns.
            if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    async fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
}

/// What a thread of the core's blocking pool is about to run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PoolJob {
    /// A group commit's fdatasync: the thread sleeps on the device, and when it returns it must run at once (the
    /// core waits for its answer), not after the scheduler's slice of the busy core.
    Sync,
    /// Anything else (small-file batches): ordinary priority, so it never starves the core.
    Other,
}

thread_local! {
    /// The policy this pool thread runs under now (`None`: never changed).
    static POOL_POLICY: std::cell::Cell<Option<PoolJob>> = const { std::cell::Cell::new(None) };
}

/// Puts this blocking-pool thread under the policy its next job needs: `SCHED_FIFO` (priority 1) for syncs, where
/// the process may (root or CAP_SYS_NICE; else nice -20, else unchanged, logged once), `SCHED_OTHER` for the rest.
fn pool_priority(job: PoolJob) {
    if POOL_POLICY.with(|p| p.get()) == Some(job) {
        return;
    }
    POOL_POLICY.with(|p| p.set(Some(job)));
    let (policy, priority, nice) = match job {
        PoolJob::Sync => (libc::SCHED_FIFO, 1, -20),
        PoolJob::Other => (libc::SCHED_OTHER, 0, 0),
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: changes the calling thread's own scheduling policy; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        return;
    }
    // SAFETY: setpriority on the calling thread (tid 0 = self).
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 && job == PoolJob::Sync {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!("cannot raise the sync thread's priority (needs CAP_SYS_NICE): group commits may wait for the scheduler")
        });
    }
}

/// fdatasync(2), retried when interrupted.
fn fdatasync(fd: std::os::unix::io::RawFd) -> io::Result<()> {
    loop {
        // SAFETY: fdatasync on an open descriptor the caller keeps open across the call.
        if unsafe { libc::fdatasync(fd) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A segment on the real disk.
struct DiskFile(BufferedFile, SyncVia);

impl SegmentFile for DiskFile {
    /// pwrite from the owning core: a page-cache write of one batch takes microseconds, while an io_uring
    /// buffered write is punted to an io-wq worker that inherits this core's affinity and competes with it (far
    /// slower: docs/benchmark-history.md, "Design measurements").
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        let fd = self.0.as_raw_fd();
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &buf[done..];
            // SAFETY: pointer and length describe `rest`, a live slice; fd is an open file.
            let n = unsafe {
                libc::pwrite(
                    fd,
                    rest.as_ptr().cast(),
                    rest.len(),
                    (pos + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
            }
            done += n as usize;
        }
        Ok(())
    }

    fn sync(&self) -> IoFuture<'_, ()> {
        Box::pin(async move {
            match self.1 {
                SyncVia::IoUring => self.0.fdatasync().await.map_err(io::Error::from),
                SyncVia::Inline => fdatasync(self.0.as_raw_fd()),
                SyncVia::Thread => {
                    let fd = self.0.as_raw_fd();
                    // The descriptor stays open: `self` outlives this future, which waits for the thread.
                    glommio::executor()
                        .spawn_blocking(move || {
                            pool_priority(PoolJob::Sync);
                            fdatasync(fd)
                        })
                        .await
                }
            }
        })
    }

    /// preadv2 with RWF_NOWAIT: served from the page cache or not at all. Consumers mostly read what was just
    /// written, so this saves an io_uring round trip per delivery.
    fn read_cached(&self, pos: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        // SAFETY: one iovec describing `buf`, alive across the call; fd is an open file.
        let n = unsafe {
            libc::preadv2(
                self.0.as_raw_fd(),
                &iov,
                1,
                pos as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        (n >= 0 && n as usize == len).then_some(buf)
    }

    fn read_at(&self, pos: u64, len: usize) -> IoFuture<'_, Vec<u8>> {
        Box::pin(async move {
            let r = self.0.read_at(pos, len).await.map_err(io::Error::from)?;
            Ok(r.to_vec())
        })
    }

    fn truncate(&self, len: u64) -> IoFuture<'_, ()> {
        Box::pin(async move { self.0.truncate(len).await.map_err(io::Error::from) })
    }
}

/// statfs(2) `f_type`s of file systems that allocate new blocks when a file's bytes are overwritten: btrfs, ZFS,
/// bcachefs.
const COPY_ON_WRITE: [i64; 3] = [0x9123_683E, 0x2FC1_2FC1, 0xCA45_1A4E];

/// Whether the file system holding `dir` overwrites a file's bytes in place (not copy-on-write); false when statfs
/// fails.
pub fn overwrites_in_place(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct it is given from a NUL-terminated path that outlives the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)]
    let kind = st.f_type as i64;
    !COPY_ON_WRITE.contains(&kind)
}

impl Storage for Disk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn truncate_file(&self, path: &Path, len: u64) -> io::Result<()> {
        let f = std::fs::OpenOptions::new().write(true).open(path)?;
        f.set_len(len)?;
        f.sync_all()
    }

    fn open<'a>(&'a self, path: &'a Path, create: bool) -> IoFuture<'a, Rc<dyn SegmentFile>> {
        Box::pin(async move {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .buffered_open(path)
                .await
                .map_err(io::Error::from)?;
            Ok(Rc::new(DiskFile(file, self.sync_via)) as Rc<dyn SegmentFile>)
        })
    }

    fn sync_dir<'a>(&'a self, dir: &'a Path) -> IoFuture<'a, ()> {
        Box::pin(super::atomic_file::sync_dir(dir))
    }

    fn remove<'a>(&'a self, path: &'a Path) -> IoFuture<'a, ()> {
        Box::pin(async move { glommio::io::remove(path).await.map_err(io::Error::from) })
    }

    /// Queued and done in batches: the frontier flush of a core replaces hundreds of files per pass, and one syncfs
    /// pair for all of them costs what one file's fdatasync and directory fsync would (see `replace_batch`).
    fn replace<'a>(&'a self, path: &'a Path, bytes: Vec<u8>) -> IoFuture<'a, ()> {
        self.queue_replacement(path, bytes, false)
    }

    fn overwrite_small<'a>(&'a self, path: &'a Path, bytes: Vec<u8>) -> IoFuture<'a, ()> {
        self.queue_replacement(path, bytes, true)
    }

    fn list_dirs(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    /// On a plain thread: removing many segment files must not stall a core.
    fn overwrites_in_place(&self, dir: &Path) -> bool {
        overwrites_in_place(dir)
    }

    fn remove_tree(&self, dir: &Path) {
        let dir = dir.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("berth-remove".into())
            .spawn(move || {
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot remove deleted data");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the removal thread; deleted data stays until the next start");
        }
    }
}

#[cfg(test)]
mod disk_tests;
