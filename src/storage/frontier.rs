//! Frontier files: the committed frontier of one consumer group on one partition, 12 bytes (u64 LE + crc32c LE of
//! those 8 bytes), replaced atomically. The `default` group's is `consumer.offset` (version 1's file), another
//! group's `consumer.{group}.offset`. Read lazily at the partition's first touch; written by its core's flush task
//! (without a journal), at journal checkpoints and clean stops (with one), and by the journal's replay.

use crate::storage::backend::Storage;
use std::path::Path;
use tracing::error;

/// The consumer group every topic has (version 1's only one).
pub const DEFAULT_GROUP: &str = "default";

/// The default group's file name inside the partition directory.
pub const FILE_NAME: &str = "consumer.offset";

/// The frontier file name of `group` (group names follow the topic-name rule, so they are safe in a file name).
pub fn file_name(group: &str) -> String {
    if group == DEFAULT_GROUP {
        FILE_NAME.to_string()
    } else {
        format!("consumer.{group}.offset")
    }
}

/// Encodes a frontier value.
pub fn encode(committed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&committed.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&committed.to_le_bytes()).to_le_bytes());
    out
}

/// Decodes a frontier file's bytes; None when the length or the check is wrong.
pub fn decode(bytes: &[u8]) -> Option<u64> {
    let bytes: &[u8; 12] = bytes.try_into().ok()?;
    let value: [u8; 8] = bytes[..8].try_into().ok()?;
    let crc = u32::from_le_bytes(bytes[8..].try_into().ok()?);
    (crc32c::crc32c(&value) == crc).then(|| u64::from_le_bytes(value))
}

/// Reads the frontier of the partition in `dir`: missing → 0; damaged → 0 with a loud log (everything above the
/// log start redelivers: duplicates, never loss). Any other read error (EIO, EMFILE, EACCES, a directory in its
/// place) is returned: the caller must not guess, since a guessed 0 would be written back over the good file.
/// Blocking read of 12 bytes, once per partition lifetime.
pub fn read(storage: &dyn Storage, path: &Path) -> std::io::Result<u64> {
    match storage.read(path) {
        Ok(bytes) => Ok(decode(&bytes).unwrap_or_else(|| {
            error!(file = %path.display(), len = bytes.len(), "consumer.offset fails its check: treating the frontier as 0, everything retained redelivers");
            0
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Durably replaces the frontier file: the first time through a temp file and a rename, then overwritten in place
/// (12 bytes in one sector, with their own CRC), each flush pass of a core with one syncfs (`Disk::replace`).
pub async fn write(storage: &dyn Storage, path: &Path, committed: u64) -> std::io::Result<()> {
    storage.overwrite_small(path, encode(committed)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_every_flipped_bit() {
        let bytes = encode(123_456_789);
        assert_eq!(decode(&bytes), Some(123_456_789));
        for bit in 0..96 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode(&damaged), None, "bit {bit}");
        }
    }

    /// Missing reads as 0 and damaged as 0, but any other read error is returned, never taken for 0 (a guessed 0
    /// would be written back over the good file at the next flush, and everything settled would redeliver).
    #[test]
    fn a_missing_or_damaged_file_reads_as_0_and_any_other_error_is_returned() {
        use crate::storage::backend::{Disk, SyncVia};
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = Disk::new(SyncVia::Inline);
        let path = dir.path().join(FILE_NAME);
        assert_eq!(read(&disk, &path).expect("missing"), 0);
        std::fs::write(&path, encode(42)).expect("write");
        assert_eq!(read(&disk, &path).expect("intact"), 42);
        std::fs::write(&path, b"damaged").expect("write");
        assert_eq!(read(&disk, &path).expect("damaged"), 0);
        std::fs::remove_file(&path).expect("remove");
        std::fs::create_dir(&path).expect("a directory in its place");
        let e = read(&disk, &path).expect_err("a directory in the file's place is an error, not 0");
        assert_ne!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn wrong_lengths_are_rejected() {
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&encode(5)[..8]), None);
        let mut long = encode(5);
        long.push(0);
        assert_eq!(decode(&long), None);
    }
}
