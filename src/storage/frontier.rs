//! Frontier files: where one consumer group stands on one partition, replaced atomically. The committed frontier
//! (every offset below it is settled), and the offsets acknowledged above it as ranges when there are any
//! ([`FrontierValue`]): 12 bytes (u64 LE + crc32c LE of those 8 bytes) without ranges, as version 1 wrote them;
//! `16 + 16 × ranges` bytes with them (`docs/format.md`, "consumer.offset"). The `default` group's is
//! `consumer.offset` (version 1's file), another group's `consumer.{group}.offset`. Read lazily at the partition's
//! first touch; written by its core's flush task (without a journal), at journal checkpoints and clean stops (with
//! one), and by the journal's replay.

use crate::storage::backend::Storage;
use std::path::Path;
use tracing::error;

/// The consumer group every topic has (version 1's only one).
pub const DEFAULT_GROUP: &str = "default";

/// The default group's file name inside the partition directory.
pub const FILE_NAME: &str = "consumer.offset";

/// Most acked-ahead ranges a frontier file or journal record carries (a file of at most 1 MiB); a topic's
/// `max_acked_ahead` bounds them far below this in practice. Ranges above it are left out: those acks redeliver.
pub const MAX_RANGES: usize = 1 << 16;

/// Where a group stands: every offset below `committed` is settled, and so is every offset of `acked`, half-open
/// ranges `[start, end)` above it, sorted, disjoint and not touching one another (the acked-ahead set of the seed's
/// in-flight state, persisted so that a restart or a failover does not deliver them again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontierValue {
    pub committed: u64,
    pub acked: Vec<(u64, u64)>,
}

impl FrontierValue {
    /// A frontier without acked-ahead ranges.
    pub fn at(committed: u64) -> FrontierValue {
        FrontierValue {
            committed,
            acked: Vec::new(),
        }
    }

    /// Offsets in `acked`.
    pub fn acked_count(&self) -> u64 {
        self.acked.iter().map(|(s, e)| e - s).sum()
    }

    /// One past the highest settled offset.
    pub fn settled_end(&self) -> u64 {
        self.acked.last().map_or(self.committed, |&(_, e)| e)
    }

    /// What both values say is settled (each a true account of the same group: two values of one group, or a file
    /// and its journal's records): the higher committed frontier and the union of the ranges above it.
    pub fn merge(&mut self, other: &FrontierValue) {
        self.committed = self.committed.max(other.committed);
        self.acked.extend_from_slice(&other.acked);
        self.normalise();
    }

    /// Puts the ranges in their canonical form: sorted, empty ones dropped, overlapping or touching ones joined,
    /// nothing at or below `committed` (a range that starts at it moves it up), at most [`MAX_RANGES`] (the highest
    /// dropped).
    pub fn normalise(&mut self) {
        let mut ranges = std::mem::take(&mut self.acked);
        ranges.retain(|&(s, e)| s < e);
        ranges.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        let mut committed = self.committed;
        out.retain_mut(|r| {
            if r.1 <= committed {
                return false;
            }
            if r.0 <= committed {
                committed = r.1;
                return false;
            }
            true
        });
        out.truncate(MAX_RANGES);
        self.committed = committed;
        self.acked = out;
    }

    /// Whether `acked` is in canonical form for `committed` (what [`FrontierValue::normalise`] makes).
    pub fn is_normal(&self) -> bool {
        let mut floor = self.committed;
        self.acked.len() <= MAX_RANGES
            && self.acked.iter().all(|&(s, e)| {
                let ok = floor < s && s < e;
                floor = e;
                ok
            })
    }
}

/// The frontier file name of `group` (group names follow the topic-name rule, so they are safe in a file name).
pub fn file_name(group: &str) -> String {
    if group == DEFAULT_GROUP {
        FILE_NAME.to_string()
    } else {
        format!("consumer.{group}.offset")
    }
}

/// Encodes a frontier value without ranges (12 bytes).
pub fn encode(committed: u64) -> Vec<u8> {
    encode_value(&FrontierValue::at(committed))
}

/// Encodes a frontier value: 12 bytes without ranges; with them the committed frontier, their count, each range's
/// start and end, and the CRC of all that.
pub fn encode_value(value: &FrontierValue) -> Vec<u8> {
    debug_assert!(value.is_normal(), "frontier ranges in canonical form");
    let mut out = Vec::with_capacity(16 + 16 * value.acked.len());
    out.extend_from_slice(&value.committed.to_le_bytes());
    if !value.acked.is_empty() {
        out.extend_from_slice(&(value.acked.len() as u32).to_le_bytes());
        for &(s, e) in &value.acked {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a frontier file's committed frontier (ranges ignored); None when the length or the check is wrong.
pub fn decode(bytes: &[u8]) -> Option<u64> {
    decode_value(bytes).map(|v| v.committed)
}

/// Decodes a frontier file's bytes; None when the length, the check or the ranges are wrong.
pub fn decode_value(bytes: &[u8]) -> Option<FrontierValue> {
    let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let committed = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
    if body.len() == 8 {
        return Some(FrontierValue::at(committed));
    }
    let count = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?) as usize;
    if count == 0 || count > MAX_RANGES || body.len() != 12 + 16 * count {
        return None;
    }
    let at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    let value = FrontierValue {
        committed,
        acked: (0..count)
            .map(|i| (at(12 + 16 * i), at(20 + 16 * i)))
            .collect(),
    };
    value.is_normal().then_some(value)
}

/// Reads the frontier of the partition in `dir`: missing → 0; damaged → 0 with a loud log (everything above the
/// log start redelivers: duplicates, never loss). Any other read error (EIO, EMFILE, EACCES, a directory in its
/// place) is returned: the caller must not guess, since a guessed 0 would be written back over the good file.
/// Blocking read of a few bytes, once per partition lifetime.
pub fn read(storage: &dyn Storage, path: &Path) -> std::io::Result<u64> {
    read_value(storage, path).map(|v| v.committed)
}

/// [`read`], with the acked-ahead ranges.
pub fn read_value(storage: &dyn Storage, path: &Path) -> std::io::Result<FrontierValue> {
    match storage.read(path) {
        Ok(bytes) => Ok(decode_value(&bytes).unwrap_or_else(|| {
            error!(file = %path.display(), len = bytes.len(), "a frontier file fails its check: treating the frontier as 0, everything retained redelivers");
            FrontierValue::default()
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FrontierValue::default()),
        Err(e) => Err(e),
    }
}

/// Durably replaces the frontier file with a value without ranges: the first time (or when its length changes)
/// through a temp file and a rename, else overwritten in place (12 bytes in one sector, with their own CRC), each
/// flush pass of a core with one syncfs (`Disk::replace`).
pub async fn write(storage: &dyn Storage, path: &Path, committed: u64) -> std::io::Result<()> {
    write_value(storage, path, &FrontierValue::at(committed)).await
}

/// [`write`], with the acked-ahead ranges (a file of the same length up to 512 bytes is overwritten in place, any
/// other through a temp file and a rename).
pub async fn write_value(
    storage: &dyn Storage,
    path: &Path,
    value: &FrontierValue,
) -> std::io::Result<()> {
    storage.overwrite_small(path, encode_value(value)).await
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
    fn ranges_round_trip_and_every_flipped_bit_is_rejected() {
        let value = FrontierValue {
            committed: 7,
            acked: vec![(9, 12), (20, 21)],
        };
        let bytes = encode_value(&value);
        assert_eq!(bytes.len(), 16 + 16 * 2);
        assert_eq!(decode_value(&bytes), Some(value.clone()));
        assert_eq!(decode(&bytes), Some(7));
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_value(&damaged), None, "bit {bit}");
        }
        // Without ranges, version 1's 12 bytes.
        assert_eq!(encode_value(&FrontierValue::at(42)), encode(42));
        assert_eq!(decode_value(&encode(42)), Some(FrontierValue::at(42)));
    }

    /// Ranges that pass the CRC but are not canonical (touching, unsorted, at or below the frontier, empty) are
    /// refused: a file is only ever written canonical.
    #[test]
    fn ranges_out_of_canonical_form_are_refused() {
        let sealed = |committed: u64, acked: &[(u64, u64)]| {
            let mut out = committed.to_le_bytes().to_vec();
            out.extend_from_slice(&(acked.len() as u32).to_le_bytes());
            for &(s, e) in acked {
                out.extend_from_slice(&s.to_le_bytes());
                out.extend_from_slice(&e.to_le_bytes());
            }
            let crc = crc32c::crc32c(&out);
            out.extend_from_slice(&crc.to_le_bytes());
            out
        };
        assert!(decode_value(&sealed(5, &[(6, 8)])).is_some());
        for bad in [
            &[(5, 8)][..],
            &[(4, 8)],
            &[(6, 6)],
            &[(6, 8), (8, 9)],
            &[(9, 10), (6, 8)],
            &[],
        ] {
            assert_eq!(decode_value(&sealed(5, bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn merge_keeps_what_either_value_settled() {
        let mut a = FrontierValue {
            committed: 10,
            acked: vec![(12, 15), (30, 31)],
        };
        a.merge(&FrontierValue {
            committed: 12,
            acked: vec![(16, 18), (31, 33)],
        });
        // `a`'s 12..15 starts at the merged frontier 12, which moves to 15; 30..31 and 31..33 touch and join.
        assert_eq!(
            a,
            FrontierValue {
                committed: 15,
                acked: vec![(16, 18), (30, 33)]
            }
        );
        assert!(a.is_normal());
        a.merge(&FrontierValue::at(40));
        assert_eq!(a, FrontierValue::at(40));
        assert_eq!(a.settled_end(), 40);
    }

    /// docs/format.md's two consumer.offset examples are what `encode_value` writes.
    #[test]
    fn the_documented_examples_match_the_code() {
        let plain = crate::format_doc::example("consumer.offset", 0);
        assert_eq!(plain, encode(42));
        let ranged = crate::format_doc::example("consumer.offset", 1);
        let value = FrontierValue {
            committed: 42,
            acked: vec![(44, 46)],
        };
        assert_eq!(ranged, encode_value(&value));
        assert_eq!(decode_value(&ranged), Some(value));
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
