//! A replica's fencing state: its epoch floor, the lowest leadership epoch whose requests this replica of a partition
//! still takes, and the receipt-handle nonces it has promised to leaderships (`docs/replication.md`, step 1: the
//! nonce rule), kept in `replica.epoch` in the partition's directory (format in `docs/format.md`, "replica.epoch").
//! The floor is raised, durably, before the replica answers anything at a higher epoch, and never lowered; a
//! leader's request below it is refused `stale_epoch` whatever this node's metadata says (`ops/replicate.rs`), so a
//! promise made to a new leader ("no entries below epoch E": its fencing round, `docs/replication.md` step 4) holds
//! across a crash of the replica even when its metadata is behind.
//!
//! Nonces: a leader issues lease nonces only below a ceiling it has made durable on a majority of its replicas
//! (each stores it here, `BeginEpoch`), and a new leader starts above the highest ceiling a majority of them
//! promised to older leaderships. Any two majorities share a replica, so no nonce is ever issued twice for a
//! partition whatever the nodes' clocks say, and a receipt handle of an old leader is `410 lease_gone` on the new
//! one.

use crate::storage::backend::Storage;
use std::path::Path;
use tracing::error;

/// The file's name inside the partition directory.
pub const FILE_NAME: &str = "replica.epoch";

/// Length of the current layout: floor, nonces below, nonces at, CRC-32C.
const LEN: usize = 28;
/// Length of the first layout (still read): the floor and its CRC-32C, a frontier file's layout.
const LEN_V1: usize = 12;

/// What `replica.epoch` holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fence {
    /// The epoch floor: requests of older leaderships are refused `stale_epoch`.
    pub floor: u64,
    /// The highest nonce ceiling promised to a leadership older than `floor` (0: none).
    pub nonces_below: u64,
    /// The highest nonce ceiling promised to the leadership at `floor` (0: none).
    pub nonces_at: u64,
}

impl Fence {
    /// A floor with no nonce promised.
    pub fn at(floor: u64) -> Fence {
        Fence {
            floor,
            ..Fence::default()
        }
    }

    /// The state once raised to `epoch` (if above the floor: what was promised at the old floor is now promised
    /// below) with `nonces` promised at it (if `epoch` is the floor then, never lowered).
    pub fn raised(self, epoch: u64, nonces: u64) -> Fence {
        let mut f = self;
        if epoch > f.floor {
            f.nonces_below = f.nonces_below.max(f.nonces_at);
            f.nonces_at = 0;
            f.floor = epoch;
        }
        if epoch == f.floor {
            f.nonces_at = f.nonces_at.max(nonces);
        }
        f
    }

    /// The highest ceiling promised to leaderships older than `epoch` (`epoch` at or above the floor).
    pub fn promised_below(self, epoch: u64) -> u64 {
        if epoch > self.floor {
            self.nonces_below.max(self.nonces_at)
        } else {
            self.nonces_below
        }
    }

    /// The highest ceiling promised to any leadership.
    pub fn promised(self) -> u64 {
        self.nonces_below.max(self.nonces_at)
    }
}

/// Encodes a fence state (28 bytes: floor, nonces below, nonces at, each u64 LE, then the CRC-32C of bytes 0..24).
pub fn encode(fence: Fence) -> Vec<u8> {
    let mut out = Vec::with_capacity(LEN);
    out.extend_from_slice(&fence.floor.to_le_bytes());
    out.extend_from_slice(&fence.nonces_below.to_le_bytes());
    out.extend_from_slice(&fence.nonces_at.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Encodes a floor in the first layout (12 bytes: the floor and its CRC-32C), as older versions wrote it.
pub fn encode_v1(epoch: u64) -> Vec<u8> {
    crate::storage::frontier::encode(epoch)
}

/// Decodes the file's bytes, either layout; None when the length or the check is wrong.
pub fn decode(bytes: &[u8]) -> Option<Fence> {
    match bytes.len() {
        LEN_V1 => crate::storage::frontier::decode(bytes).map(|floor| Fence {
            floor,
            ..Fence::default()
        }),
        LEN => {
            let crc = u32::from_le_bytes(bytes[24..28].try_into().ok()?);
            if crc32c::crc32c(&bytes[..24]) != crc {
                return None;
            }
            let word = |i: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&bytes[8 * i..8 * i + 8]);
                u64::from_le_bytes(w)
            };
            Some(Fence {
                floor: word(0),
                nonces_below: word(1),
                nonces_at: word(2),
            })
        }
        _ => None,
    }
}

/// Reads the fence of the partition in `dir`: missing → all 0 (a replica that never took a replicated request, or
/// an R = 1 partition). Damaged → all 0 with a loud log: the floor only adds to what this node's metadata knows
/// (every epoch a replica can have promised is an etcd revision that the metadata read at start already holds), so
/// a lost floor weakens the fence only while that metadata is behind; a lost nonce promise is covered by the other
/// replicas of the majority that holds it. Any other read error is returned.
pub fn read(storage: &dyn Storage, dir: &Path) -> std::io::Result<Fence> {
    let path = dir.join(FILE_NAME);
    match storage.read(&path) {
        Ok(bytes) => Ok(decode(&bytes).unwrap_or_else(|| {
            error!(file = %path.display(), len = bytes.len(), "replica.epoch fails its check: taking the epoch floor as 0 (this node's metadata still fences older leaders)");
            Fence::default()
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Fence::default()),
        Err(e) => Err(e),
    }
}

/// Durably replaces the fence (as a frontier file is written: `Storage::overwrite_small`, durable when it returns).
pub async fn write(storage: &dyn Storage, dir: &Path, fence: Fence) -> std::io::Result<()> {
    storage
        .overwrite_small(&dir.join(FILE_NAME), encode(fence))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document's examples are what the code writes and reads, the older layout included.
    #[test]
    fn the_documented_examples_round_trip() {
        let fence = Fence {
            floor: 1_234_567,
            nonces_below: 0x0660_0000_0000_0000,
            nonces_at: 0x0660_1000_0000_0000,
        };
        let doc = crate::format_doc::example("replica.epoch", 0);
        assert_eq!(doc, encode(fence));
        assert_eq!(decode(&doc), Some(fence));
        let v1 = crate::format_doc::example("replica.epoch", 1);
        assert_eq!(v1, encode_v1(1_234_567));
        assert_eq!(
            decode(&v1),
            Some(Fence {
                floor: 1_234_567,
                ..Fence::default()
            })
        );
    }

    /// Raising folds what was promised at the old floor into "below"; promises at the floor only grow.
    #[test]
    fn a_raise_moves_the_floors_promise_below_it_and_never_lowers_one() {
        let f = Fence::default().raised(5, 100);
        assert_eq!((f.floor, f.nonces_below, f.nonces_at), (5, 0, 100));
        assert_eq!(
            f.promised_below(5),
            0,
            "its own promise is not an older one"
        );
        assert_eq!(f.promised_below(6), 100);
        let f = f.raised(5, 50);
        assert_eq!(f.nonces_at, 100, "never lowered");
        let f = f.raised(5, 300);
        assert_eq!(f.nonces_at, 300);
        let f = f.raised(4, 900);
        assert_eq!(
            f,
            Fence::default().raised(5, 300),
            "an older epoch changes nothing"
        );
        let f = f.raised(8, 0);
        assert_eq!((f.floor, f.nonces_below, f.nonces_at), (8, 300, 0));
        let f = f.raised(9, 200);
        assert_eq!((f.floor, f.nonces_below, f.nonces_at), (9, 300, 200));
        assert_eq!(f.promised_below(9), 300);
        assert_eq!(f.promised(), 300);
    }

    /// Missing reads as 0, damaged as 0, any other error is returned.
    #[test]
    fn a_missing_or_damaged_file_reads_as_0_and_any_other_error_is_returned() {
        use crate::storage::backend::{Disk, SyncVia};
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = Disk::new(SyncVia::Inline);
        assert_eq!(read(&disk, dir.path()).expect("missing"), Fence::default());
        std::fs::write(dir.path().join(FILE_NAME), encode_v1(9)).expect("write");
        assert_eq!(read(&disk, dir.path()).expect("intact").floor, 9);
        let f = Fence::default().raised(11, 77);
        std::fs::write(dir.path().join(FILE_NAME), encode(f)).expect("write");
        assert_eq!(read(&disk, dir.path()).expect("intact"), f);
        let mut bad = encode(f);
        bad[9] ^= 1;
        std::fs::write(dir.path().join(FILE_NAME), bad).expect("write");
        assert_eq!(read(&disk, dir.path()).expect("damaged"), Fence::default());
        std::fs::write(dir.path().join(FILE_NAME), b"damaged").expect("write");
        assert_eq!(read(&disk, dir.path()).expect("damaged"), Fence::default());
        std::fs::remove_file(dir.path().join(FILE_NAME)).expect("remove");
        std::fs::create_dir(dir.path().join(FILE_NAME)).expect("a directory in its place");
        read(&disk, dir.path()).expect_err("a directory in the file's place is an error");
    }
}
