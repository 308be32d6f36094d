//! A core's background tasks, on its `Clock`: the lease timer (armed at the earliest lease deadline or delayed
//! redelivery of any owned partition, and at least every `purge_interval_ms`), retention (once per purge interval),
//! retries of wake-ups a full channel refused, and the frontier flush (every `frontier_flush_interval_ms`, only
//! where a frontier moved, many files at once).

use super::{Engine, WAKE_RETRY_MS};
use futures_lite::future;
use std::rc::Rc;

/// Most frontier files written at once by one core's flush: their fsyncs overlap in the device queue, so the
/// flush of many partitions takes about as long as one. 256.
pub const FLUSH_PARALLELISM: usize = 256;

/// Releases expired leases and due delayed redeliveries as their time comes, so redelivery after a consumer's death
/// takes the visibility timeout and not "until someone polls"; wakes parked consumers for them; applies retention
/// once per purge interval; retries refused wake-ups.
pub async fn run_lease_timer(engine: Rc<Engine>) {
    let clock = engine.clock().clone();
    let interval_ms = engine.config().purge_interval_ms;
    let mut next_sweep = clock.now_ms() + interval_ms;
    let mut retry_at = u64::MAX;
    while !engine.is_stopping() {
        let partitions = engine.owned_partitions();
        let now = clock.now_ms();
        let earliest = partitions
            .iter()
            .filter_map(|(_, p)| p.next_wakeup_ms())
            .min()
            .unwrap_or(u64::MAX);
        let deadline = earliest.min(next_sweep).min(retry_at).max(now);
        engine.timer_deadline.set(deadline);
        let rearm = engine.timer_rearm.listen();
        if deadline > now {
            future::or(clock.sleep_until(deadline), async {
                rearm.await;
            })
            .await;
        }
        engine.timer_deadline.set(u64::MAX);
        let now = clock.now_ms();
        for (_, p) in &partitions {
            p.purge(now);
        }
        retry_at = if engine.retry_pending_wakes() {
            now + WAKE_RETRY_MS
        } else {
            u64::MAX
        };
        if now >= next_sweep {
            next_sweep = now + interval_ms;
            for (topic, p) in &partitions {
                p.apply_retention(topic.config().retention_ms).await;
            }
        }
    }
}

/// Writes each moved frontier to its file, up to `FLUSH_PARALLELISM` files at once, one pass every
/// `frontier_flush_interval_ms` from the start of the last (so a long pass does not add to the lag).
pub async fn run_frontier_flush(engine: Rc<Engine>) {
    let clock = engine.clock().clone();
    let interval_ms = engine.config().frontier_flush_interval_ms;
    let mut next = clock.now_ms() + interval_ms;
    while !engine.is_stopping() {
        clock.sleep_until(next).await;
        next = clock.now_ms() + interval_ms;
        flush_moved(&engine).await;
    }
}

/// One flush pass over the partitions whose frontier moved.
pub async fn flush_moved(engine: &Rc<Engine>) {
    let moved: Vec<_> = engine
        .owned_partitions()
        .into_iter()
        .filter(|(_, p)| p.frontier_moved())
        .map(|(_, p)| p)
        .collect();
    for chunk in moved.chunks(FLUSH_PARALLELISM) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|p| {
                let p = p.clone();
                glommio::spawn_local(async move { p.flush_frontiers().await })
            })
            .collect();
        for task in tasks {
            for lag_ms in task.await {
                engine
                    .metrics()
                    .frontier_lag
                    .borrow_mut()
                    .record(lag_ms * 1000);
            }
        }
    }
}
