//! A replica's epoch floor: the lowest leadership epoch whose requests this replica of a partition still takes,
//! kept in `replica.epoch` in the partition's directory (format in `docs/format.md`, "replica.epoch": 12 bytes, the
//! epoch as u64 LE and the CRC-32C of those 8 bytes, the layout of a frontier file). It is raised, durably, before
//! the replica answers anything at a higher epoch, and never lowered; a leader's request below it is refused
//! `stale_epoch` whatever this node's metadata says (`ops/replicate.rs`), so a promise made to a new leader ("no
//! entries below epoch E": its fencing round, `docs/replication.md` step 4) holds across a crash of the replica even
//! when its metadata is behind.

use crate::storage::backend::Storage;
use crate::storage::frontier;
use std::path::Path;
use tracing::error;

/// The file's name inside the partition directory.
pub const FILE_NAME: &str = "replica.epoch";

/// Encodes a floor (the frontier file's 12-byte layout: value, CRC-32C of the value).
pub fn encode(epoch: u64) -> Vec<u8> {
    frontier::encode(epoch)
}

/// Decodes the file's bytes; None when the length or the check is wrong.
pub fn decode(bytes: &[u8]) -> Option<u64> {
    frontier::decode(bytes)
}

/// Reads the floor of the partition in `dir`: missing → 0 (a replica that never took a replicated request, or an
/// R = 1 partition). Damaged → 0 with a loud log: the floor only adds to what this node's metadata knows (every epoch
/// a replica can have promised is an etcd revision that the metadata read at start already holds), so a lost floor
/// weakens the fence only while that metadata is behind. Any other read error is returned.
pub fn read(storage: &dyn Storage, dir: &Path) -> std::io::Result<u64> {
    let path = dir.join(FILE_NAME);
    match storage.read(&path) {
        Ok(bytes) => Ok(decode(&bytes).unwrap_or_else(|| {
            error!(file = %path.display(), len = bytes.len(), "replica.epoch fails its check: taking the epoch floor as 0 (this node's metadata still fences older leaders)");
            0
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Durably replaces the floor (as a frontier file is written: `Storage::overwrite_small`, durable when it returns).
pub async fn write(storage: &dyn Storage, dir: &Path, epoch: u64) -> std::io::Result<()> {
    storage
        .overwrite_small(&dir.join(FILE_NAME), encode(epoch))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document's example is what the code writes and reads.
    #[test]
    fn the_documented_example_round_trips() {
        let doc = crate::format_doc::example("replica.epoch", 0);
        assert_eq!(doc, encode(1_234_567));
        assert_eq!(decode(&doc), Some(1_234_567));
    }

    /// Missing reads as 0, damaged as 0, any other error is returned.
    #[test]
    fn a_missing_or_damaged_file_reads_as_0_and_any_other_error_is_returned() {
        use crate::storage::backend::{Disk, SyncVia};
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = Disk::new(SyncVia::Inline);
        assert_eq!(read(&disk, dir.path()).expect("missing"), 0);
        std::fs::write(dir.path().join(FILE_NAME), encode(9)).expect("write");
        assert_eq!(read(&disk, dir.path()).expect("intact"), 9);
        std::fs::write(dir.path().join(FILE_NAME), b"damaged").expect("write");
        assert_eq!(read(&disk, dir.path()).expect("damaged"), 0);
        std::fs::remove_file(dir.path().join(FILE_NAME)).expect("remove");
        std::fs::create_dir(dir.path().join(FILE_NAME)).expect("a directory in its place");
        read(&disk, dir.path()).expect_err("a directory in the file's place is an error");
    }
}
