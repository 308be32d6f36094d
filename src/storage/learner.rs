//! Learners: replicas that lost what they held (`docs/replication.md`, step 5, "Disk loss").
//!
//! A replica's answer to a fencing round is a promise: "every record I ever acknowledged is still in my log". A node
//! whose data directory was wiped or replaced breaks it: it acknowledged records, then lost them, and an empty log in
//! a round's majority could make a replica that lacks acknowledged records the greatest. So a replica on a new disk
//! is a **learner** until its leader has caught it up: it takes shipped batches and frontiers like any follower (and
//! counts for the commit once it holds them), but a round neither counts nor ranks it, so it never leads.
//!
//! Two files say who is one:
//! - `DATA/joined` (node, 12 bytes: the frontier layout holding an etcd revision): written, before the node
//!   registers, by a node whose data directory's incarnation differs from the one its `nodes/<id>` record names
//!   (the disk is not the one the cluster knew). The revision is etcd's when it looked: a topic created at or before
//!   it may have had records on the old disk; one created after it cannot.
//! - `replica.learner` (partition, 12 bytes, the same layout holding that revision): written when the partition's
//!   directory is created on such a node for a replicated topic created at or before the revision, and removed, durably,
//!   when a leader promotes it (`Partition::promote`: its log holds everything that leader could have acknowledged,
//!   and it has that leader's frontiers).
//!
//! A damaged file reads as the cautious answer: `joined` as "every topic is older", `replica.learner` as "a learner".

use crate::storage::backend::{Storage, SyncVia};
use crate::storage::frontier;
use std::io::Write;
use std::path::Path;
use tracing::error;

/// The node's file, under the data directory.
pub const JOINED: &str = "joined";
/// The partition's file, inside its directory.
pub const FILE_NAME: &str = "replica.learner";

/// The revision in `DATA/joined`: None when the node never lost its disk (no file). Start-up code: blocking calls.
pub fn read_joined(data_dir: &Path) -> std::io::Result<Option<u64>> {
    read_joined_in(
        &crate::storage::backend::Disk::new(SyncVia::Inline),
        data_dir,
    )
}

/// [`read_joined`] through the storage backend (the engine's opens; the simulation's disks).
pub fn read_joined_in(storage: &dyn Storage, data_dir: &Path) -> std::io::Result<Option<u64>> {
    let path = data_dir.join(JOINED);
    match storage.read(&path) {
        Ok(bytes) => Ok(Some(frontier::decode(&bytes).unwrap_or_else(|| {
            error!(file = %path.display(), len = bytes.len(), "the data directory's joined file fails its check: every replicated partition opened from nothing here starts as a learner");
            u64::MAX
        }))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `DATA/joined` durably (temp file, fsync, rename, directory fsync). Start-up code: blocking calls.
pub fn write_joined(data_dir: &Path, revision: u64) -> std::io::Result<()> {
    let tmp = data_dir.join(format!("{JOINED}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&frontier::encode(revision))?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, data_dir.join(JOINED))?;
    std::fs::File::open(data_dir)?.sync_all()
}

/// Whether the partition in `dir` is a learner (its file is there; damaged counts).
pub fn read(storage: &dyn Storage, dir: &Path) -> std::io::Result<bool> {
    let path = dir.join(FILE_NAME);
    match storage.read(&path) {
        Ok(bytes) => {
            if frontier::decode(&bytes).is_none() {
                error!(file = %path.display(), len = bytes.len(), "replica.learner fails its check: this replica stays a learner until its leader promotes it");
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes the partition in `dir` (a directory just created) a learner, durably: the file, then the directory's own
/// entry in its parent.
pub async fn write(storage: &dyn Storage, dir: &Path, revision: u64) -> std::io::Result<()> {
    storage
        .overwrite_small(&dir.join(FILE_NAME), frontier::encode(revision))
        .await?;
    match dir.parent() {
        Some(parent) => storage.sync_dir(parent).await,
        None => Ok(()),
    }
}

/// Promotes the partition in `dir`: its file removed, durably.
pub async fn remove(storage: &dyn Storage, dir: &Path) -> std::io::Result<()> {
    match storage.remove(&dir.join(FILE_NAME)).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    storage.sync_dir(dir).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document's examples are what the code writes and reads.
    #[test]
    fn the_documented_examples_round_trip() {
        let doc = crate::format_doc::example("joined", 0);
        assert_eq!(doc, frontier::encode(4_711));
        let doc = crate::format_doc::example("replica.learner", 0);
        assert_eq!(doc, frontier::encode(4_711));
    }

    #[test]
    fn joined_is_missing_written_or_damaged_and_then_cautious() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(read_joined(dir.path()).expect("missing"), None);
        write_joined(dir.path(), 77).expect("write");
        assert_eq!(read_joined(dir.path()).expect("intact"), Some(77));
        assert!(!dir.path().join("joined.tmp").exists());
        std::fs::write(dir.path().join(JOINED), b"damaged").expect("write");
        assert_eq!(read_joined(dir.path()).expect("damaged"), Some(u64::MAX));
    }

    #[test]
    fn a_learner_file_is_written_read_and_removed_and_a_damaged_one_still_counts() {
        use crate::storage::backend::{Disk, SyncVia};
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(async {
                let root = tempfile::tempdir().expect("temp dir");
                let dir = root.path().join("0");
                std::fs::create_dir(&dir).expect("dir");
                let disk = Disk::new(SyncVia::Inline);
                assert!(!read(&disk, &dir).expect("missing"));
                write(&disk, &dir, 5).await.expect("write");
                assert!(read(&disk, &dir).expect("written"));
                std::fs::write(dir.join(FILE_NAME), b"x").expect("damage");
                assert!(read(&disk, &dir).expect("damaged"));
                remove(&disk, &dir).await.expect("remove");
                assert!(!read(&disk, &dir).expect("removed"));
                remove(&disk, &dir)
                    .await
                    .expect("removing twice is no error");
            });
    }
}
