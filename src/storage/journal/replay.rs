//! The replay at start: every journal file written back into the segments and frontier files, then removed.

use super::entry::scan;
use crate::storage::backend::{SegmentFile, Storage};
use crate::storage::frontier::FrontierValue;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tracing::{error, info};

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

/// A segment an entry names, as the replay found it.
#[derive(Clone)]
enum Segment {
    Open(Rc<dyn SegmentFile>),
    /// Removed by retention or with its topic: nothing to restore.
    Gone,
    /// It exists but could not be opened: its entries are not restored, and the journal stays.
    Failed,
}

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
    let mut open: HashMap<PathBuf, Segment> = HashMap::new();
    let mut touched: Vec<Rc<dyn SegmentFile>> = Vec::new();
    // Per frontier file, the highest value since its group's last start record; gathered per core (a partition's
    // records are all in its core's files), and dropped for a core whose files hold a damaged entry.
    let mut frontiers: std::collections::BTreeMap<PathBuf, FrontierValue> = Default::default();
    let mut core_frontiers: std::collections::BTreeMap<PathBuf, FrontierValue> = Default::default();
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
            let file = partition_dir.join(crate::storage::frontier::file_name(&record.group));
            match core_frontiers.entry(file) {
                std::collections::btree_map::Entry::Occupied(mut e) if !record.start => {
                    e.get_mut().merge(&record.value());
                }
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    *e.get_mut() = record.value();
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(record.value());
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
                    Ok(f) => Segment::Open(f),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Segment::Gone,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::IsADirectory | std::io::ErrorKind::NotADirectory
                        ) || matches!(
                            e.raw_os_error(),
                            Some(libc::EISDIR) | Some(libc::ENOTDIR)
                        ) =>
                    {
                        // Something else stands where the segment was (its data is gone whatever the replay does):
                        // its partition meets the same error when it opens and its topic is quarantined, while the
                        // rest of the node starts.
                        error!(segment = %seg_path.display(), error = %e, "journal replay finds no segment file where one should be: its entries are passed over and its topic will be quarantined");
                        Segment::Gone
                    }
                    Err(e) => {
                        // It exists but cannot be opened now (EIO, EMFILE, EACCES, ...): its entries may be the only
                        // durable copy of acknowledged records, so they count as not restored and the journal stays
                        // (the start fails, and succeeds once the cause is gone).
                        error!(segment = %seg_path.display(), error = %e, "journal replay cannot open a segment: its entries are not replayed, and the journal is kept");
                        Segment::Failed
                    }
                };
                open.insert(seg_path.clone(), file);
            }
            let file = match open.get(&seg_path).cloned() {
                Some(Segment::Open(file)) => file,
                Some(Segment::Gone) => {
                    report.skipped += 1;
                    continue;
                }
                None | Some(Segment::Failed) => {
                    report.failed += 1;
                    unrestored += 1;
                    continue;
                }
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
        match crate::storage::frontier::read_value(storage, file) {
            // Written even when the file seems to hold as much: it may be a page a failed sync dropped (see above).
            Ok(mut held) => {
                held.merge(value);
                writes.push(async move {
                    (
                        file,
                        crate::storage::frontier::write_value(storage, file, &held).await,
                    )
                })
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
