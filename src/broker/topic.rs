//! Topic metadata: names, settings, validation, and the `topic.json` file that makes them survive restarts.
//! Every core holds a copy of every topic's settings; core 0 alone creates and deletes (see `broker::admin`).

use super::error::{BrokerError, BrokerResult};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Most partitions a topic may have.
pub const MAX_PARTITIONS: u32 = 4096;
/// Visibility bounds of api.md.
pub const MIN_VISIBILITY_MS: u64 = 1000;
pub const MAX_VISIBILITY_MS: u64 = 12 * 3600 * 1000;
/// Bounds on the per-partition caps (a cap of 0 would wedge the topic; above 1M defeats the memory bound).
pub const MAX_CAP: usize = 1 << 20;
/// Retention bounds: 1 s to 10 years.
pub const MAX_RETENTION_MS: u64 = 3650 * 24 * 3600 * 1000;

/// A topic's settings, as stored in `topic.json` and shown under `config` by `GET /topics/{topic}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    /// The topic's name.
    pub name: String,
    /// Number of partitions, fixed at creation.
    pub partitions: u32,
    /// Default lease length for consumes that give no `visibility`.
    pub visibility_ms: u64,
    /// Live leases per partition before consume answers 204.
    pub max_in_flight: usize,
    /// Out-of-order acks parked per partition before ack answers 503.
    pub max_acked_ahead: usize,
    /// Sealed segments whose newest record is older than this are deleted.
    pub retention_ms: u64,
}

impl TopicConfig {
    /// api.md's defaults.
    pub fn with_defaults(name: &str) -> TopicConfig {
        TopicConfig {
            name: name.to_string(),
            partitions: 1,
            visibility_ms: 30_000,
            max_in_flight: 1024,
            max_acked_ahead: 1024,
            retention_ms: 7 * 24 * 3600 * 1000,
        }
    }

    /// The topic directory under the data dir.
    pub fn dir(data_dir: &Path, name: &str) -> PathBuf {
        data_dir.join("topics").join(name)
    }

    /// Reads a stored topic.json.
    pub fn load(path: &Path) -> Result<TopicConfig, String> {
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: TopicConfig =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        validate_name(&config.name).map_err(|e| e.to_string())?;
        Ok(config)
    }
}

/// `[A-Za-z0-9._-]{1,128}`; `.` and `..` are refused too since they would escape the topics directory.
pub fn validate_name(name: &str) -> BrokerResult<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(BrokerError::InvalidTopic(name.chars().take(200).collect()))
    }
}

/// The owning core of a partition: a pure function every core computes alike. Consecutive partitions land on
/// consecutive cores, so a topic with at least as many partitions as cores uses every core.
pub fn owner(topic: &str, partition: u32, cores: usize) -> usize {
    ((crc32c::crc32c(topic.as_bytes()) as usize) + partition as usize) % cores
}

/// The partition a key maps to: crc32c of the key, modulo the partition count (stable across restarts).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    crc32c::crc32c(key) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_pattern() {
        for good in ["a", "orders", "a.b_c-D9", &"x".repeat(128)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", &"x".repeat(129), "a%2Fb"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn partitions_spread_over_every_core() {
        for cores in 1..8 {
            let mut seen = vec![false; cores];
            for p in 0..cores as u32 {
                seen[owner("t", p, cores)] = true;
            }
            assert!(seen.iter().all(|&s| s));
        }
    }
}
