//! A core's background tasks, on its `Clock`: the lease timer (armed at the earliest lease deadline or delayed
//! redelivery of any owned partition, and at least every `purge_interval_ms`), retention (once per purge interval),
//! retries of wake-ups a full channel refused, and the frontier flush (every `frontier_flush_interval_ms`, only
//! where a frontier moved): with a journal, one entry of every moved frontier of the core, carried by the journal's
//! next group commit (the files are written at its checkpoints); without one, many files at once.

use super::{Engine, WAKE_RETRY_MS};
use futures_lite::future;
use std::rc::Rc;
use std::time::Instant;

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
    // The start of the slice of work running now (housekeeping stage: from each wake to the next wait).
    let mut slice = Instant::now();
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
            engine.metrics().record_housekeeping(slice);
            future::or(clock.sleep_until(deadline), async {
                rearm.await;
            })
            .await;
            slice = Instant::now();
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
            // Follower replicas too: retention goes by the records' own times, so each replica drops the same
            // whole segments.
            for (topic, p) in partitions.iter().chain(&engine.followed_partitions()) {
                engine.metrics().record_housekeeping(slice);
                p.apply_retention(topic.config().retention_ms).await;
                slice = Instant::now();
            }
        }
    }
}

/// Makes each moved frontier durable, one pass every `frontier_flush_interval_ms` from the start of the last (so a
/// long pass does not add to the lag): in the journal when the core has one, else in the files.
pub async fn run_frontier_flush(engine: Rc<Engine>) {
    let clock = engine.clock().clone();
    let interval_ms = engine.config().frontier_flush_interval_ms;
    let mut next = clock.now_ms() + interval_ms;
    while !engine.is_stopping() {
        clock.sleep_until(next).await;
        next = clock.now_ms() + interval_ms;
        if !journal_moved(&engine).await {
            flush_moved(&engine).await;
        }
    }
}

/// Records every moved frontier of the core in one journal entry and waits for it to be durable. False when the
/// core has no journal or the journal refused the entry (a failed write stops it until a restart): the caller
/// writes the files instead.
pub async fn journal_moved(engine: &Rc<Engine>) -> bool {
    let Some(journal) = engine.journal() else {
        return false;
    };
    if journal.is_poisoned() {
        return false;
    }
    let slice = Instant::now();
    let started = engine.clock().now_ms();
    let mut records = Vec::new();
    let mut marks = Vec::new();
    // Each partition's records, for its followers when it is replicated: `records[from..to]`.
    let mut spans = Vec::new();
    for (_, p) in engine.owned_partitions() {
        let from = records.len();
        let moved = p.moved_frontiers(&mut records);
        if !moved.is_empty() {
            if p.replicated() {
                spans.push(from..records.len());
            }
            marks.push((p, moved));
        }
    }
    if records.is_empty() {
        engine.metrics().record_housekeeping(slice);
        return true;
    }
    let entry = crate::storage::journal::frontier_entry(&records);
    engine.metrics().record_housekeeping(slice);
    if let Err(e) = journal.commit_frontiers(entry).await {
        tracing::warn!(core = engine.id, error = ?e, "the journal refused the frontiers: writing their files instead");
        return false;
    }
    let slice = Instant::now();
    {
        let mut lag = engine.metrics().frontier_lag.borrow_mut();
        for (p, moved) in &marks {
            for lag_ms in p.frontiers_journaled(moved, started) {
                lag.record(lag_ms * 1000);
            }
        }
    }
    // Durable here: now to the followers (`front/replicate.rs`), so that a replica that comes to lead knows them.
    for span in spans {
        engine.ship_frontiers(&records[span]);
    }
    engine.metrics().record_housekeeping(slice);
    true
}

/// The core's partitions with a frontier file behind its frontier (follower replicas too: behind what their
/// leaders shipped).
fn files_behind(engine: &Engine) -> Vec<Rc<crate::partition::Partition>> {
    engine
        .owned_partitions()
        .into_iter()
        .chain(engine.followed_partitions())
        .filter(|(_, p)| p.frontier_file_behind())
        .map(|(_, p)| p)
        .collect()
}

/// Writes every frontier file that is behind its frontier (the journal's checkpoint, before it removes a journal
/// file whose records they may be): true when all of them were written.
pub async fn write_frontier_files(engine: Rc<Engine>) -> bool {
    let behind = files_behind(&engine);
    let mut ok = true;
    for chunk in behind.chunks(FLUSH_PARALLELISM) {
        let writes = chunk.iter().map(|p| p.write_frontier_files()).collect();
        ok &= crate::join::join_all(writes).await.into_iter().all(|w| w);
    }
    ok
}

/// One flush pass over the partitions whose frontier files are behind their frontiers, writing them (without a
/// journal; or when the journal refused, so that what it may have lost since its last sync gets to the files too).
pub async fn flush_moved(engine: &Rc<Engine>) {
    let slice = Instant::now();
    let behind = files_behind(engine);
    engine.metrics().record_housekeeping(slice);
    for chunk in behind.chunks(FLUSH_PARALLELISM) {
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
