//! The workload: the seeded plan of a run (topics, partitions, policies) and the client operations a step starts:
//! produce, consume (parking with long-polls) and settle, topic recreation, policy changes, redrive, and stale
//! receipt handles.

use super::*;

/// The source topic (dead-letters to `DLQ` after `MAX_DELIVERIES`), the dead-letter topic, a plain topic that
/// gets deleted and recreated, and the topic the dead letters are redriven to.
pub(super) const SOURCE: &str = "a";

pub(super) const DLQ: &str = "a.dlq";

pub(super) const PLAIN: &str = "b";

pub(super) const REDRIVEN: &str = "a.redriven";

pub(super) const MAX_DELIVERIES: u32 = 3;

/// Groups every topic has besides `default` (created with the topic, before any produce).
pub(super) const GROUPS: [&str; 2] = [DEFAULT_GROUP, "g2"];

/// What a seed runs with.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) cores: usize,
    pub(super) fsync: FsyncPolicy,
    pub(super) steps: usize,
    /// Depth of each simulated core-to-core queue (small depths exercise refusals and retries).
    pub(super) net_depth: usize,
    pub(super) partitions: [u32; 4],
    /// Power cuts (not just process crashes); only when every acknowledged produce was synced.
    pub(super) power_cuts: bool,
}

impl Plan {
    pub(super) fn for_seed(seed: u64) -> Plan {
        let mut rng = Rng::new(seed ^ 0x706c_616e);
        let fsync = match rng.below(6) {
            0 => FsyncPolicy::Never,
            1 => FsyncPolicy::IntervalMs(20),
            _ => FsyncPolicy::Always,
        };
        Plan {
            cores: 1 + rng.below(3) as usize,
            fsync,
            steps: 150 + rng.below(150) as usize,
            net_depth: if rng.chance(30) { 2 } else { 64 },
            partitions: [
                1 + rng.below(4) as u32,
                1 + rng.below(2) as u32,
                1 + rng.below(3) as u32,
                1 + rng.below(2) as u32,
            ],
            power_cuts: fsync == FsyncPolicy::Always,
        }
    }
}

pub(super) fn spawn_produce(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let topic = if rng.chance(60) { SOURCE } else { PLAIN };
    let front = world.front(rng);
    let Ok(t) = front.engine().topic(topic) else {
        return;
    };
    let topic_id = t.id();
    let count = 1 + rng.below(3) as usize;
    let partitions = t.partition_count() as u64;
    let mut records = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..count {
        let body = oracle.borrow_mut().new_body(topic, topic_id);
        let target = match rng.below(3) {
            0 => Target::Partition(rng.below(partitions)),
            1 => Target::Key(format!("k{}", rng.below(5))),
            _ => Target::Any,
        };
        records.push(ClientRecord {
            meta: None,
            topic_delay: false,
            body: Bytes::from(body.clone()),
            target,
        });
        bodies.push(body);
    }
    let oracle = oracle.clone();
    let in_flight = world.in_flight.clone();
    in_flight.set(in_flight.get() + 1);
    world.tasks.spawn(async move {
        let result = front
            .produce(ProduceParams {
                topic: topic.to_string(),
                records,
                batch: count > 1,
            })
            .await;
        in_flight.set(in_flight.get() - 1);
        let mut o = oracle.borrow_mut();
        match result {
            Ok(results) => {
                for (body, r) in bodies.iter().zip(results) {
                    match r {
                        Ok((p, offset)) => {
                            o.note(format!("produced {body} at {p}:{offset}"));
                            o.acked(body, p, offset);
                        }
                        Err(e) => o.note(format!("produce of {body} failed: {e}")),
                    }
                }
            }
            Err(e) => o.note(format!("produce of {bodies:?} failed: {e}")),
        }
    });
}

pub(super) fn spawn_consume(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let topic = match rng.below(20) {
        0..=11 => SOURCE,
        12..=16 => PLAIN,
        17..=18 => DLQ,
        _ => REDRIVEN,
    };
    let group = GROUPS[rng.below(GROUPS.len() as u64) as usize];
    let front = world.front(rng);
    let Ok(t) = front.engine().topic(topic) else {
        return;
    };
    let topic_id = t.id();
    let max = 1 + rng.below(3) as usize;
    // Long-polls often outlast leases, and leases often end together (a few visibilities only), so several
    // messages tend to become deliverable at once while several consumers are parked.
    let wait_ms = match rng.below(4) {
        0 => 0,
        1 => 1 + rng.below(400),
        _ => 1000 + rng.below(2500),
    };
    let visibility_ms = [1000, 1500, 2000][rng.below(3) as usize];
    // What the client will do with each message: ack, nack (maybe delayed), extend then ack, or nothing.
    let plans: Vec<(u64, u64, u64)> = (0..max)
        .map(|_| (rng.below(6), rng.below(200), rng.below(40)))
        .collect();
    let clock = world.clock.clone();
    let oracle = oracle.clone();
    let in_flight = world.in_flight.clone();
    in_flight.set(in_flight.get() + 1);
    oracle.borrow_mut().note(format!(
        "t={} consume {topic}/{group} max {max} wait {wait_ms} on core {}",
        clock.now_ms(),
        front.engine().id()
    ));
    let tasks = world.tasks.clone();
    world.tasks.spawn(async move {
        let result = front
            .consume(ConsumeParams {
                topic: topic.to_string(),
                group: group.to_string(),
                wait_ms: Some(wait_ms),
                visibility_ms: Some(visibility_ms),
                max,
                media: None,
            })
            .await;
        in_flight.set(in_flight.get() - 1);
        let deliveries = match result {
            Ok(d) => d,
            Err(e) => {
                oracle
                    .borrow_mut()
                    .note(format!("consume {topic}/{group} failed: {e}"));
                return;
            }
        };
        let now = clock.now_ms();
        oracle.borrow_mut().note(format!(
            "t={now} consume {topic}/{group} on core {} → {} messages",
            front.engine().id(),
            deliveries.len()
        ));
        for d in &deliveries {
            let mut o = oracle.borrow_mut();
            o.delivery(topic, topic_id, group, d, now);
            o.remember(topic, topic_id, group, d);
        }
        for (d, (what, after_ms, delay)) in deliveries.into_iter().zip(plans) {
            let front = front.clone();
            let clock = clock.clone();
            let oracle = oracle.clone();
            tasks.spawn(async move {
                clock.sleep_until(clock.now_ms() + after_ms).await;
                let op = match what {
                    0..=2 => SettleOp::Ack,
                    3 => SettleOp::Nack(Some(delay)),
                    4 => SettleOp::Nack(None),
                    _ => SettleOp::Extend(Some(1000)),
                };
                let handle = crate::ops::receipt::ReceiptHandle::of(&d).to_string();
                if matches!(op, SettleOp::Nack(_)) {
                    let key = (topic_id, group.to_string(), d.partition, d.offset);
                    oracle
                        .borrow_mut()
                        .sending_nack(key, d.nonce, clock.now_ms());
                }
                let result = front
                    .settle(SettleParams {
                        topic: topic.to_string(),
                        group: group.to_string(),
                        op,
                        handles: vec![(handle, Ok(crate::ops::receipt::ReceiptHandle::of(&d)))],
                        batch: false,
                    })
                    .await
                    .map(|mut r| r.remove(0))
                    .and_then(|r| r);
                let key = (topic_id, group.to_string(), d.partition, d.offset);
                let body = String::from_utf8_lossy(&d.payload).to_string();
                oracle.borrow_mut().settled_answer(
                    topic,
                    &body,
                    key,
                    d.nonce,
                    op,
                    &result,
                    clock.now_ms(),
                    1000,
                );
            });
        }
    });
}

/// Deletes and recreates the plain topic: its records need no delivery any more, and the new one starts empty.
pub(super) async fn recreate_plain(world: &World, plan: &Plan, oracle: &Rc<RefCell<Oracle>>) {
    let front = &world.fronts[0];
    // (Missing when its creation failed under an injected storage fault: created again now.)
    if let Ok(old) = front.engine().topic(PLAIN) {
        let old_id = old.id();
        let f = front.clone();
        if world
            .complete(async move { f.delete_topic(PLAIN.to_string()).await })
            .await
            .is_err()
        {
            return;
        }
        let mut o = oracle.borrow_mut();
        o.deleted.insert(old_id);
        // Its leases went with it: a late settle of one is 410, as for any lease that is gone.
        o.leases.retain(|(id, ..), _| *id != old_id);
        o.note(format!("deleted {PLAIN} (id {old_id})"));
    }
    let partitions = plan.partitions[1];
    let f = front.clone();
    match world
        .complete(async move { f.create_topic(topic_config(PLAIN, partitions)).await })
        .await
    {
        Ok((_, config)) => {
            let mut o = oracle.borrow_mut();
            o.ids.insert(PLAIN.to_string(), config.id);
            o.note(format!("recreated {PLAIN} (id {})", config.id));
        }
        Err(e) if world.faults_injected.get() => oracle.borrow_mut().note(format!(
            "recreating {PLAIN} failed under injected faults: {e}"
        )),
        Err(e) => oracle
            .borrow_mut()
            .fail(format!("recreating {PLAIN} failed: {e}")),
    }
}

/// Changes the source topic's redelivery policy (delays and backoff).
pub(super) async fn change_policy(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let settings = Settings {
        redelivery_delay_ms: Some([0, 10, 50][rng.below(3) as usize]),
        redelivery_backoff: Some(if rng.chance(50) {
            BackoffKind::Fixed
        } else {
            BackoffKind::Exponential
        }),
        redelivery_delay_max_ms: Some(100 + rng.below(200)),
        ..Settings::default()
    };
    let front = world.front(rng);
    let change = settings.clone();
    let result = world
        .complete(async move { front.change_topic(SOURCE.to_string(), change).await })
        .await;
    oracle.borrow_mut().note(format!(
        "changed {SOURCE}: {settings:?} → {:?}",
        result.map(|c| c.redelivery_delay_ms)
    ));
}

/// Redrives a few dead letters to the redriven topic (each appended there, then acked in the dead-letter topic).
pub(super) async fn redrive_dead_letters(
    world: &World,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
) {
    let front = world.front(rng);
    let max = 1 + rng.below(4);
    let result = world
        .complete(async move {
            front
                .redrive(crate::ops::redrive::RedriveParams {
                    from: DLQ.to_string(),
                    to: REDRIVEN.to_string(),
                    group: DEFAULT_GROUP.to_string(),
                    max: Some(max),
                })
                .await
        })
        .await;
    let now = world.clock.now_ms();
    let mut o = oracle.borrow_mut();
    // A round whose append failed leaves its messages leased (by the redrive) for its visibility.
    o.internal_leases_until = o
        .internal_leases_until
        .max(now + crate::front::redrive::REDRIVE_VISIBILITY_MS);
    o.note(format!(
        "t={now} redrive {DLQ} → {REDRIVEN} max {max}: {result:?}"
    ));
}

/// Presents a handle a client was given earlier (usually stale by now: settled, expired, leased again) or a live
/// one with a wrong nonce: the oracle checks that only a live lease's exact handle is honoured.
pub(super) fn spawn_stale_settle(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let handle = {
        let o = oracle.borrow();
        if o.old_handles.is_empty() {
            return;
        }
        o.old_handles[rng.below(o.old_handles.len() as u64) as usize].clone()
    };
    let front = world.front(rng);
    match front.engine().topic(handle.topic) {
        Ok(t) if t.id() == handle.topic_id => {}
        _ => return,
    }
    let d = handle.delivery;
    let nonce = if rng.chance(30) {
        d.nonce.wrapping_add(1 + rng.below(1000))
    } else {
        d.nonce
    };
    let op = match rng.below(4) {
        0 | 1 => SettleOp::Ack,
        2 => SettleOp::Nack(None),
        _ => SettleOp::Extend(Some(1000)),
    };
    let clock = world.clock.clone();
    let key = (
        handle.topic_id,
        handle.group.to_string(),
        d.partition,
        d.offset,
    );
    {
        let mut o = oracle.borrow_mut();
        let now = clock.now_ms();
        // The exact handle of a lease that still lives is its client's to settle (two settles of one lease may be
        // answered in either order): only dead handles and wrong nonces are presented.
        if o.leases
            .get(&key)
            .is_some_and(|&(n, expiry)| n == nonce && expiry > now)
        {
            return;
        }
        o.note(format!(
            "t={now} presenting an old handle {key:?} nonce {nonce} ({op:?})"
        ));
    }
    let oracle = oracle.clone();
    world.tasks.spawn(async move {
        let result = front
            .settle(SettleParams {
                topic: handle.topic.to_string(),
                group: handle.group.to_string(),
                op,
                handles: vec![(
                    format!("{}:{}:{nonce}", d.partition, d.offset),
                    Ok(crate::ops::receipt::ReceiptHandle {
                        partition: d.partition.into(),
                        offset: d.offset,
                        nonce,
                    }),
                )],
                batch: false,
            })
            .await
            .map(|mut r| r.remove(0))
            .and_then(|r| r);
        let body = String::from_utf8_lossy(&d.payload).to_string();
        oracle.borrow_mut().settled_answer(
            handle.topic,
            &body,
            key,
            nonce,
            op,
            &result,
            clock.now_ms(),
            1000,
        );
    });
}
