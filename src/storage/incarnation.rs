//! The disk incarnation: a random 128-bit id written once into a data directory (`DATA/incarnation`, format in
//! `docs/format.md`, "incarnation") and read at every start. A data directory that lost its contents (a replaced
//! disk, a wiped directory) comes back with a new id, so the cluster can tell a node that kept its data from one that
//! did not: with replication, a replica on a new incarnation counts for neither commits nor elections until it has
//! caught up (`docs/replication.md`, "Disk loss"). Start-up code, before any executor runs: plain blocking file
//! calls.

use std::io::{Read, Write};
use std::path::Path;

/// The file's name under the data directory.
pub const FILE: &str = "incarnation";
/// Its length: the id (16 bytes) and its CRC-32C (4).
pub const LEN: usize = 20;

/// One data directory's incarnation id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incarnation(pub u128);

impl std::fmt::Display for Incarnation {
    /// 32 lower-case hex digits, as `nodes/<id>` carries it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What start-up found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The directory's own id, as written before.
    Kept(Incarnation),
    /// No file (a new data directory, or one from a build before incarnations): a new id was written.
    New(Incarnation),
    /// A file that failed its check: a new id was written (the node counts as a new disk, the safe side).
    Replaced(Incarnation),
}

impl Found {
    pub fn id(self) -> Incarnation {
        match self {
            Found::Kept(i) | Found::New(i) | Found::Replaced(i) => i,
        }
    }
}

pub fn encode(id: Incarnation) -> [u8; LEN] {
    let mut out = [0u8; LEN];
    out[..16].copy_from_slice(&id.0.to_le_bytes());
    let crc = crc32c::crc32c(&out[..16]);
    out[16..].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The id, if `bytes` are exactly a file this module wrote.
pub fn decode(bytes: &[u8]) -> Option<Incarnation> {
    if bytes.len() != LEN {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[16..].try_into().expect("4 bytes"));
    (crc32c::crc32c(&bytes[..16]) == crc).then(|| {
        Incarnation(u128::from_le_bytes(
            bytes[..16].try_into().expect("16 bytes"),
        ))
    })
}

/// Reads `dir`'s incarnation, or writes a new one (temp file, fsync, rename, directory fsync) when it has none or a
/// damaged one.
pub fn load_or_create(dir: &Path) -> std::io::Result<Found> {
    let path = dir.join(FILE);
    let damaged = match std::fs::read(&path) {
        Ok(bytes) => match decode(&bytes) {
            Some(id) => return Ok(Found::Kept(id)),
            None => true,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    };
    let id = Incarnation(random_u128()?);
    let tmp = dir.join(format!("{FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&encode(id))?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(if damaged {
        Found::Replaced(id)
    } else {
        Found::New(id)
    })
}

/// 128 bits from the kernel's random source.
fn random_u128() -> std::io::Result<u128> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u128::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_survives_restarts_and_a_lost_or_damaged_file_gets_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let Found::New(id) = first else {
            panic!("a new directory gets a new id: {first:?}")
        };
        assert_eq!(load_or_create(dir.path()).unwrap(), Found::Kept(id));
        assert!(!dir.path().join("incarnation.tmp").exists());
        // A wiped directory is a new disk.
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        let again = load_or_create(dir.path()).unwrap();
        assert!(
            matches!(again, Found::New(other) if other != id),
            "{again:?}"
        );
        // A flipped bit fails the check: a new id, never a guess.
        let mut bytes = std::fs::read(dir.path().join(FILE)).unwrap();
        bytes[3] ^= 0x04;
        std::fs::write(dir.path().join(FILE), &bytes).unwrap();
        let replaced = load_or_create(dir.path()).unwrap();
        assert!(
            matches!(replaced, Found::Replaced(other) if other != again.id()),
            "{replaced:?}"
        );
        assert_eq!(
            load_or_create(dir.path()).unwrap(),
            Found::Kept(replaced.id())
        );
    }

    #[test]
    fn garbage_never_decodes() {
        for bad in [&[][..], &[0u8; 19], &[0u8; 21], &[0xffu8; 20]] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
        let id = Incarnation(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(decode(&encode(id)), Some(id));
        assert_eq!(id.to_string(), "0123456789abcdeffedcba9876543210");
    }

    #[test]
    fn the_documented_example_matches_the_code() {
        let id = Incarnation(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(crate::format_doc::example("incarnation", 0), encode(id));
    }
}
