//! Storage: segment files of CRC-checked frames and small atomically replaced files.
//! Owned by the partition layer on its core; nothing here is shared between cores.

pub mod atomic_file;
pub mod backend;
pub mod behind;
pub mod epoch_floor;
pub mod epoch_history;
pub mod error;
pub mod frame;
pub mod frontier;
pub mod incarnation;
pub mod journal;
pub mod learner;
pub mod log;
pub mod meta;
pub mod runs;
pub mod sim;

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod journal_fault_tests;

use serde::{Deserialize, Serialize};

/// When a produce is made durable before its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// fdatasync before every reply; concurrent appends to one partition share one sync. Loses nothing acked.
    Always,
    /// Reply after the write; a timer fdatasyncs every N ms. A power loss can drop up to N ms of acked produces.
    IntervalMs(u64),
    /// Reply after the write; never sync explicitly (the kernel writes back). A power loss can drop any unsynced data;
    /// a process crash (kill -9) loses nothing, since the page cache survives it.
    Never,
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            _ => match text.strip_prefix("interval:") {
                Some(ms) => match ms.parse::<u64>() {
                    Ok(ms) if ms > 0 && ms <= 60_000 => Ok(Self::IntervalMs(ms)),
                    _ => Err(format!("fsync interval '{ms}' must be 1..=60000 ms")),
                },
                None => Err(format!(
                    "fsync policy '{text}' is not always|interval:MS|never"
                )),
            },
        }
    }
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Always => write!(f, "always"),
            Self::IntervalMs(ms) => write!(f, "interval:{ms}"),
            Self::Never => write!(f, "never"),
        }
    }
}

impl Serialize for FsyncPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for FsyncPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
