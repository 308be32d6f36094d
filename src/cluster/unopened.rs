//! The topics of the cluster this node could not open (over its caps, or some core failed to open its share), kept
//! by core 0's `follow` (`node.rs`) to retry them: at every metastore change, and on a timer with backoff, until
//! one opens or the metastore no longer has it. Pure: it takes `now` and says what is due.

use crate::engine::cluster::Unopened;
use std::collections::BTreeMap;

/// First wait before a failed topic is tried again on the timer...
pub const RETRY_MIN_MS: u64 = 1_000;
/// ...doubling after each failure up to this.
pub const RETRY_MAX_MS: u64 = 60_000;

/// One topic that failed to open.
#[derive(Debug, Clone)]
struct Entry {
    /// The incarnation that failed (a topic created again is another one: its failures start over).
    id: u64,
    reason: String,
    attempts: u32,
    /// When the timer tries it again (ms, the caller's clock).
    retry_at_ms: u64,
}

/// Failed topics by name, with their backoff.
#[derive(Debug, Default)]
pub struct Retries {
    failed: BTreeMap<String, Entry>,
    /// Failures since start, retries included.
    failures: u64,
}

impl Retries {
    /// Topic `name` (incarnation `id`) failed to open at `now_ms`: tried again after a wait that doubles with each
    /// failure of the same incarnation.
    pub fn failed(&mut self, name: &str, id: u64, reason: String, now_ms: u64) {
        self.failures += 1;
        let attempts = match self.failed.get(name) {
            Some(e) if e.id == id => e.attempts + 1,
            _ => 1,
        };
        let wait_ms = RETRY_MIN_MS
            .saturating_mul(1u64 << (attempts - 1).min(16))
            .min(RETRY_MAX_MS);
        self.failed.insert(
            name.to_string(),
            Entry {
                id,
                reason,
                attempts,
                retry_at_ms: now_ms + wait_ms,
            },
        );
    }

    /// Topic `name` opened, or is gone from the metastore: nothing left to retry. True if it was listed.
    pub fn clear(&mut self, name: &str) -> bool {
        self.failed.remove(name).is_some()
    }

    /// Every listed topic (a metastore change retries them all).
    pub fn names(&self) -> Vec<String> {
        self.failed.keys().cloned().collect()
    }

    /// The topics whose wait is over at `now_ms`.
    pub fn due(&self, now_ms: u64) -> Vec<String> {
        self.failed
            .iter()
            .filter(|(_, e)| e.retry_at_ms <= now_ms)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// When the next wait ends, if anything is listed.
    pub fn next_at_ms(&self) -> Option<u64> {
        self.failed.values().map(|e| e.retry_at_ms).min()
    }

    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// The list as every core shows it (`GET /cluster`).
    pub fn listed(&self) -> Vec<Unopened> {
        self.failed
            .iter()
            .map(|(topic, e)| Unopened {
                topic: topic.clone(),
                reason: e.reason.clone(),
                attempts: e.attempts,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_topic_is_retried_with_a_doubling_wait_until_it_opens() {
        let mut r = Retries::default();
        r.failed("t", 7, "over max_topics".into(), 0);
        assert_eq!(r.next_at_ms(), Some(RETRY_MIN_MS));
        assert!(r.due(RETRY_MIN_MS - 1).is_empty());
        assert_eq!(r.due(RETRY_MIN_MS), vec!["t".to_string()]);
        r.failed("t", 7, "over max_topics".into(), 1_000);
        assert_eq!(r.next_at_ms(), Some(1_000 + 2 * RETRY_MIN_MS));
        for _ in 0..20 {
            r.failed("t", 7, "again".into(), 0);
        }
        assert_eq!(r.next_at_ms(), Some(RETRY_MAX_MS), "the wait is capped");
        assert_eq!(r.listed()[0].attempts, 22);
        assert_eq!(r.failures(), 22);
        assert!(r.clear("t"));
        assert_eq!(r.next_at_ms(), None);
        assert!(r.listed().is_empty());
        assert_eq!(r.failures(), 22, "the counter only grows");
    }

    #[test]
    fn a_topic_created_again_starts_its_backoff_over() {
        let mut r = Retries::default();
        r.failed("t", 7, "x".into(), 0);
        r.failed("t", 7, "x".into(), 0);
        r.failed("t", 9, "y".into(), 0);
        assert_eq!(r.listed()[0].attempts, 1);
        assert_eq!(r.next_at_ms(), Some(RETRY_MIN_MS));
        assert_eq!(r.names(), vec!["t".to_string()]);
    }
}
