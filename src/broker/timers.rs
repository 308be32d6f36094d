//! A core's background tasks: the expiry purger (armed at the earliest lease deadline, and at least every
//! `purge_interval_ms`), retention, and the frontier flush (every `frontier_flush_interval_ms`, only when moved).

use super::core::Core;
use crate::partition::now_ms;
use futures_lite::future;
use std::rc::Rc;
use std::time::Duration;

/// Releases expired leases as their deadlines pass, so redelivery after a consumer's death takes the visibility
/// timeout and not "until someone polls". Also runs retention once per purge interval.
pub async fn run_expiry(core: Rc<Core>) {
    let interval_ms = core.config.purge_interval_ms;
    let mut next_sweep = now_ms() + interval_ms;
    while !core.stopping.get() {
        let partitions = core.owned_partitions();
        let now = now_ms();
        let earliest = partitions
            .iter()
            .filter_map(|(_, p)| p.next_expiry_ms())
            .min()
            .unwrap_or(u64::MAX);
        let deadline = earliest.min(next_sweep).max(now);
        core.expiry_deadline.set(deadline);
        let rearm = core.expiry_rearm.listen();
        if deadline > now {
            future::or(
                async {
                    glommio::timer::sleep(Duration::from_millis(deadline - now)).await;
                },
                async {
                    rearm.await;
                },
            )
            .await;
        }
        let now = now_ms();
        for (_, p) in &partitions {
            p.purge(now);
        }
        if now >= next_sweep {
            next_sweep = now + interval_ms;
            for (topic, p) in &partitions {
                p.apply_retention(topic.config.retention_ms).await;
            }
        }
    }
}

/// Writes each moved frontier to its consumer.offset file.
pub async fn run_frontier_flush(core: Rc<Core>) {
    let interval = Duration::from_millis(core.config.frontier_flush_interval_ms);
    while !core.stopping.get() {
        glommio::timer::sleep(interval).await;
        for (_, p) in core.owned_partitions() {
            p.flush_frontier().await;
        }
    }
}
