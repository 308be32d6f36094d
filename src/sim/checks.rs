//! The checks run after every step (frontiers never backwards in memory or on disk, no parked consumer asleep while
//! a message is deliverable to it) and at the end (the drain: everything acknowledged reaches every group).

use super::*;

/// The frontier files, per (topic id, group, partition): on the medium (what a power cut would leave), or as a
/// process reads them (the page cache, which may still hold pages a failed sync dropped).
pub(super) fn disk_frontiers(
    world: &World,
    oracle: &Oracle,
    medium: bool,
) -> Vec<(
    (u64, String, u32),
    crate::partition::frontier::FrontierValue,
)> {
    let mut out = Vec::new();
    for (name, &id) in &oracle.ids {
        let Ok(t) = world.fronts[0].engine().topic(name) else {
            continue;
        };
        if t.id() != id {
            continue;
        }
        for p in 0..t.partition_count() {
            for g in GROUPS {
                let path = Path::new("/sim/topics")
                    .join(name)
                    .join(p.to_string())
                    .join(crate::partition::frontier::file_name(g));
                let bytes = if medium {
                    world.sim.durable_contents(&path)
                } else {
                    world.sim.contents(&path)
                };
                if let Some(bytes) = bytes {
                    if let Some(v) = crate::partition::frontier::decode_value(&bytes) {
                        out.push(((id, g.to_string(), p), v));
                    }
                }
            }
        }
    }
    out
}

/// After a restart (the journal replayed, no partition touched yet): every frontier file holds at least the
/// frontier the last process held durable, in the file or in its journal, and every offset acknowledged above it
/// that was durable with it.
pub(super) fn check_durable_frontiers(world: &World, o: &mut Oracle) {
    // Acks of records a crash took (a damaged tail, or an unsynced one under fsync `interval` and `never`) are
    // dropped at the restart (`Partition::load_shards`): their offsets take new records.
    for e in &world.engines {
        for (topic, partition) in e.owned_partitions() {
            let end = partition.log.end_offset();
            for g in GROUPS {
                if let Some(v) =
                    o.settled_durable
                        .get_mut(&(topic.id(), g.to_string(), partition.id))
                {
                    v.acked.retain_mut(|r| {
                        r.1 = r.1.min(end);
                        r.0 < r.1
                    });
                }
            }
        }
    }
    let o = &*o;
    let on_disk: BTreeMap<_, _> = disk_frontiers(world, o, false).into_iter().collect();
    let current: BTreeSet<u64> = o.ids.values().copied().collect();
    for (key, &durable) in &o.frontier_durable {
        if !current.contains(&key.0) || o.deleted.contains(&key.0) {
            continue;
        }
        let held = on_disk.get(key).map_or(0, |v| v.committed);
        if held < durable {
            o.fail(format!(
                "{key:?} frontier file holds {held} after the restart; the last process held {durable} durable"
            ));
        }
    }
    for (key, durable) in &o.settled_durable {
        if !current.contains(&key.0) || o.deleted.contains(&key.0) {
            continue;
        }
        let held = on_disk.get(key).cloned().unwrap_or_default();
        // As much of it as a restart takes back (`inflight::seedable`): what a process holds durable above that is
        // allowed to go.
        let durable = crate::partition::frontier::FrontierValue {
            committed: durable.committed,
            acked: crate::partition::inflight::seedable(
                durable.committed,
                &durable.acked,
                u64::MAX,
                SIM_LIMITS,
            ),
        };
        let mut both = held.clone();
        both.merge(&durable);
        if both != held {
            o.fail(format!(
                "{key:?} frontier file holds {held:?} after the restart; the last processes held {durable:?} durable"
            ));
        }
    }
}

/// The checks after every step.
pub(super) async fn check(world: &World, oracle: &Rc<RefCell<Oracle>>) {
    {
        let mut o = oracle.borrow_mut();
        // Frontiers never move backwards: in memory within a process, on disk ever.
        for e in &world.engines {
            for (topic, partition) in e.owned_partitions() {
                for g in GROUPS {
                    let Some(c) = partition.committed(g) else {
                        continue;
                    };
                    let key = (topic.id(), g.to_string(), partition.id);
                    let end = partition.log.end_offset();
                    if c > end {
                        o.fail(format!("{key:?} committed {c} beyond the log end {end}"));
                    }
                    if let Some(d) = partition.durable_frontier(g) {
                        if d > c {
                            o.fail(format!(
                                "{key:?} durable frontier {d} above the committed {c}"
                            ));
                        }
                        let held = o.frontier_durable.entry(key.clone()).or_insert(0);
                        *held = (*held).max(d);
                    }
                    if let Some(v) = partition.durable_acked(g) {
                        if v.committed > c
                            || v.acked.iter().any(|&(_, e)| e > partition.log.end_offset())
                        {
                            o.fail(format!(
                                "{key:?} durable {v:?} beyond the committed {c} or the log end"
                            ));
                        }
                        o.settled_durable.entry(key.clone()).or_default().merge(&v);
                    }
                    let seen = o.frontier_mem.entry(key.clone()).or_insert(0);
                    if c < *seen {
                        let was = *seen;
                        o.fail(format!("{key:?} committed moved back from {was} to {c}"));
                    }
                    *seen = c;
                }
            }
        }
        for (key, value) in disk_frontiers(world, &o, true) {
            let value = value.committed;
            let seen = o.frontier_disk.entry(key.clone()).or_insert(0);
            if value < *seen {
                let was = *seen;
                o.fail(format!(
                    "{key:?} frontier file moved back from {was} to {value}"
                ));
            }
            *seen = value;
        }
    }
    // No parked consumer sleeps while a message is deliverable to it (once pending retries have had their chance).
    for attempt in 0..50 {
        let Some(problem) = sleeping_with_work(world) else {
            return;
        };
        let retrying = world.net.queued() > 0
            || world
                .engines
                .iter()
                .any(|e| e.pending_wake_count() > 0 || e.polling() > 0);
        if !retrying || attempt == 49 {
            oracle.borrow().fail(problem);
        }
        world.clock.advance(1);
        world.settle().await;
    }
}

/// A parked consumer that holds no wake unit while a partition of its topic has a deliverable message for its
/// group, if there is one.
pub(super) fn sleeping_with_work(world: &World) -> Option<String> {
    for (core, e) in world.engines.iter().enumerate() {
        for topic in topics_now() {
            for g in GROUPS {
                if e.sleeping_consumers(topic, g) == 0 {
                    continue;
                }
                for (owner, f) in world.engines.iter().enumerate() {
                    let Ok(t) = f.topic(topic) else {
                        continue;
                    };
                    for p in t.owned_partitions() {
                        if p.has_deliverable(g) {
                            return Some(format!(
                                "a consumer of {topic}/{g} sleeps on core {core} while partition {} on core {owner} has a deliverable message (end {}, committed {:?}, next wake-up {:?}, now {})",
                                p.id,
                                p.log.end_offset(),
                                p.committed(g),
                                p.next_wakeup_ms(),
                                f.now_ms()
                            ) + &format!("\nshard: {}", p.debug_shard(g)));
                        }
                    }
                }
            }
        }
    }
    None
}

/// Ends the run: lets every lease and delay run out, drains every topic and group (retrying acks refused for a
/// full acked-ahead set, as a client would), and checks that nothing acknowledged was lost and every frontier
/// reached its log's end.
/// Consumes and acks everything, then checks nothing is stuck or lost. False (nothing checked) if a log was
/// poisoned meanwhile: the caller restarts and drains again.
pub(super) async fn drain(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) -> bool {
    world.clock.advance(5_000);
    world.settle().await;
    // (topic, topic id, group, delivery) leased by the drain and not settled yet.
    let mut pending: Vec<(&'static str, u64, &'static str, Delivery)> = Vec::new();
    let mut unsettled_rounds = 0;
    // Every group of every partition has reached its log's end.
    let all_settled = |world: &World| {
        world.engines.iter().all(|e| {
            e.owned_partitions().iter().all(|(_, p)| {
                GROUPS
                    .iter()
                    .all(|g| p.committed(g) == Some(p.log.end_offset()))
            })
        })
    };
    for _round in 0..400 {
        let mut got = 0;
        for topic in topics_now() {
            for g in GROUPS {
                let front = world.front(rng);
                let Ok(t) = front.engine().topic(topic) else {
                    continue;
                };
                let topic_id = t.id();
                let deliveries = world
                    .complete(async move {
                        front
                            .consume(ConsumeParams {
                                topic: topic.to_string(),
                                group: g.to_string(),
                                wait_ms: Some(0),
                                visibility_ms: Some(60_000),
                                max: 10,
                                media: None,
                            })
                            .await
                    })
                    .await;
                let deliveries = match deliveries {
                    Ok(d) => d,
                    Err(e) => {
                        oracle
                            .borrow_mut()
                            .note(format!("drain consume {topic}/{g} failed: {e}"));
                        Vec::new()
                    }
                };
                let now = world.clock.now_ms();
                got += deliveries.len();
                for d in deliveries {
                    oracle.borrow_mut().delivery(topic, topic_id, g, &d, now);
                    pending.push((topic, topic_id, g, d));
                }
            }
        }
        let mut still = Vec::new();
        for (topic, topic_id, g, d) in pending {
            let front = world.front(rng);
            let handle = crate::ops::receipt::ReceiptHandle::of(&d).to_string();
            let params = SettleParams {
                topic: topic.to_string(),
                group: g.to_string(),
                op: SettleOp::Ack,
                handles: vec![(handle, Ok(crate::ops::receipt::ReceiptHandle::of(&d)))],
                batch: false,
            };
            let result = world
                .complete(async move { front.settle(params).await })
                .await
                .map(|mut r| r.remove(0))
                .and_then(|r| r);
            let now = world.clock.now_ms();
            let key = (topic_id, g.to_string(), d.partition, d.offset);
            let body = String::from_utf8_lossy(&d.payload).to_string();
            oracle.borrow_mut().settled_answer(
                topic,
                &body,
                key,
                d.nonce,
                SettleOp::Ack,
                &result,
                now,
                0,
            );
            if matches!(
                result,
                Err(OpError::Engine(crate::engine::EngineError::Partition(
                    PartitionError::AckedAheadFull
                )))
            ) {
                still.push((topic, topic_id, g, d));
            }
        }
        pending = still;
        if got == 0 && pending.is_empty() {
            // Leases other clients still hold (their acks, nacks or extends are on the way) run out first.
            let last_expiry = {
                let o = oracle.borrow();
                o.leases
                    .values()
                    .map(|&(_, e)| e)
                    .max()
                    .unwrap_or(0)
                    .max(o.internal_leases_until)
            };
            let now = world.clock.now_ms();
            if last_expiry <= now {
                // Messages the broker holds back on its own (a dead-letter copy that failed is retried after
                // DEAD_LETTER_RETRY_MS) come due within a bounded time; a partition still behind after that is stuck.
                if unsettled_rounds < 30 && !all_settled(world) {
                    unsettled_rounds += 1;
                    world
                        .clock
                        .advance(crate::front::consume::DEAD_LETTER_RETRY_MS);
                    world.settle().await;
                    continue;
                }
                break;
            }
            world.clock.advance(last_expiry - now + 1);
        } else {
            world.clock.advance(100);
        }
        world.settle().await;
    }
    if any_poisoned(world) {
        return false;
    }
    let o = oracle.borrow();
    // Every produce and consume a client started was answered: no writer or waiter is stuck.
    if world.in_flight.get() > 0 {
        o.fail(format!(
            "after the drain {} produces or consumes are still unanswered",
            world.in_flight.get()
        ));
    }
    // Every frontier reached its log's end: nothing is stuck.
    for e in &world.engines {
        for (topic, p) in e.owned_partitions() {
            for g in GROUPS {
                let committed = p.committed(g);
                let end = p.log.end_offset();
                if committed != Some(end) {
                    o.fail(format!(
                        "after the drain {}/{g} partition {} is committed at {committed:?}, its end is {end}\nshard: {}",
                        topic.name(),
                        p.id,
                        p.debug_shard(g)
                    ));
                }
            }
        }
    }
    // Every acknowledged produce to a topic that still exists was acknowledged by a client in every group of its
    // topic; in the source topic, a message never acked there may instead have been dead-lettered, and then its copy
    // is seen in the dead-letter topic (or, redriven from there, in the redriven topic).
    let acked_in = |topic: &str, body: &str, g: &str| {
        o.client_acked
            .contains(&(topic.to_string(), body.to_string(), g.to_string()))
    };
    let seen = |topic: &str, body: &str| o.seen_in.contains(&(topic.to_string(), body.to_string()));
    for (body, p) in &o.produced {
        if !p.acked || o.deleted.contains(&p.topic_id) {
            continue;
        }
        let (partition, offset) = p.place.expect("acknowledged at a place");
        if o.excused.contains(body) {
            continue;
        }
        for g in GROUPS {
            if !o.delivered.contains_key(&(body.clone(), g.to_string())) {
                o.fail(format!(
                    "acknowledged {body} at {}:{partition}:{offset} was never delivered to group {g}",
                    p.topic
                ));
            }
            let accounted = acked_in(&p.topic, body, g)
                || (p.topic == SOURCE && (seen(DLQ, body) || seen(REDRIVEN, body)));
            if !accounted {
                o.fail(format!(
                    "acknowledged {body} at {}:{partition}:{offset} was settled in group {g} without a client's ack and without a dead-letter copy",
                    p.topic
                ));
            }
        }
    }
    // A copy seen in the dead-letter topic was acked there by a client in every group, or redriven; a redriven copy
    // was acked by a client in every group.
    for (topic, body) in &o.seen_in {
        if o.excused.contains(body) {
            continue;
        }
        for g in GROUPS {
            let accounted = match topic.as_str() {
                DLQ => acked_in(DLQ, body, g) || seen(REDRIVEN, body),
                REDRIVEN => acked_in(REDRIVEN, body, g),
                _ => true,
            };
            if !accounted {
                o.fail(format!(
                    "the copy of {body} in {topic} was settled in group {g} without a client's ack and without a redriven copy"
                ));
            }
        }
    }
    true
}
