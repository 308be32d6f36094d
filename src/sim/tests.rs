//! The simulation's seeds in the test suite, and targeted scenarios on a quiet world.

use super::*;
use crate::planted::{plant, Bug};

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The default run: a thousand seeds on two threads (a few seconds); `BERTH_SIM_SEEDS` sets the count,
/// `BERTH_SIM_SEED` replays one.
#[test]
fn simulated_crashes_power_cuts_and_faults_lose_nothing_acknowledged() {
    if let Some(seed) = env("BERTH_SIM_SEED") {
        run_seed(seed);
        return;
    }
    let seeds = env("BERTH_SIM_SEEDS").unwrap_or(1000);
    let first = env("BERTH_SIM_FIRST").unwrap_or(1);
    let threads = 2u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                    .make()
                    .expect("executor")
                    .run(async move {
                        let mut s = first + t;
                        while s < first + seeds {
                            run_seed_here(s).await;
                            s += threads;
                        }
                    })
            })
        })
        .collect();
    for h in handles {
        if let Err(panic) = h.join() {
            std::panic::resume_unwind(panic);
        }
    }
    // The journal's commit delay was exercised: passes of several partitions, logs waiting in `next_pass`, and
    // power cuts inside a delay.
    let covered = [
        (
            "journal passes of several partitions",
            &COVERAGE.shared_passes,
        ),
        ("waits in Journal::next_pass", &COVERAGE.next_pass_waits),
        ("power cuts inside a commit delay", &COVERAGE.cuts_in_delay),
    ];
    for (what, n) in covered {
        let n = n.load(Ordering::Relaxed);
        eprintln!("simulation: {n} {what} over {seeds} seeds");
        assert!(seeds < 200 || n > 0, "{seeds} seeds ran no {what}");
    }
}

thread_local! {
    /// This thread's panics are expected (a planted bug's search): not printed.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `seed` of a simulation (`run`: one seed, on an executor of its own) on a thread of its own with `bug`
/// planted (None: none); the panic's message if it failed.
fn failure(run: fn(u64), bug: Option<Bug>, seed: u64) -> Option<String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info);
            }
        }));
    });
    // A thread per seed: a failed seed's executor goes with its thread (glommio keeps descriptors per thread).
    std::thread::spawn(move || {
        QUIET.with(|q| q.set(true));
        plant(bug);
        run(seed);
    })
    .join()
    .err()
    .map(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// Runs seeds from 1 with `bug` planted until one fails that passes without it (a seed that fails either way finds
/// something else); returns that seed and its message.
fn first_failing_seed(run: fn(u64), bug: Bug, limit: u64) -> Option<(u64, String)> {
    (1..=limit).find_map(|seed| {
        let message = failure(run, Some(bug), seed)?;
        if let Some(without) = failure(run, None, seed) {
            eprintln!(
                "{bug:?}: seed {seed} fails without it too, passed over: {}",
                without.lines().next().unwrap_or_default()
            );
            return None;
        }
        Some((seed, message))
    })
}

/// A simulation (`run`: one seed; its oracle's findings start with `{which} seed N found: `) finds `bug` within
/// `BERTH_SIM_PLANTED_SEEDS` seeds (default 2000), as a finding of its oracle.
pub(super) fn finds_in(run: fn(u64), which: &str, bug: Bug) {
    let limit = env("BERTH_SIM_PLANTED_SEEDS").unwrap_or(2000);
    match first_failing_seed(run, bug, limit) {
        Some((seed, message)) => {
            let first = message.lines().next().unwrap_or_default().to_string();
            eprintln!("{bug:?}: found by seed {seed}: {first}");
            assert!(
                message.contains(&format!("{which} seed {seed} found: ")),
                "{bug:?}: seed {seed} failed, but not with a finding of the oracle: {message}"
            );
        }
        None => panic!("{bug:?} planted: {limit} seeds found nothing"),
    }
}

/// The single-node simulation finds `bug`.
fn finds(bug: Bug) {
    finds_in(run_seed, "simulation", bug);
}

/// Acks above the frontier left out of the journal's frontier records: a restart's files lack what the process
/// held durable.
#[test]
fn acks_above_the_frontier_not_journaled_are_found() {
    finds(Bug::AcksNotJournaled);
}

/// Acks above the frontier journaled but not taken back at a restart: settled offsets are delivered again.
#[test]
fn acks_above_the_frontier_not_seeded_at_a_restart_are_found() {
    finds(Bug::AcksNotSeeded);
}

fn quiet_plan() -> Plan {
    Plan {
        cores: 1,
        fsync: FsyncPolicy::Always,
        steps: 0,
        net_depth: 64,
        partitions: [1, 1, 1, 1],
        power_cuts: false,
    }
}

/// Runs a targeted scenario on an executor of its own.
fn on_executor(f: impl std::future::Future<Output = ()>) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(f)
}

/// One core, the simulation's topics, nothing else going on: for the two-step operations' own tests.
async fn quiet_world(sim: Rc<Sim>) -> World {
    let plan = quiet_plan();
    let world = World::boot(&plan, sim, 1_700_000_000_000, 1).await;
    create_topics(&world, &plan, &Rc::new(RefCell::new(Oracle::default()))).await;
    world
}

async fn produce_one(world: &World, topic: &'static str, body: &'static str) {
    produce_many(world, topic, vec![Bytes::from_static(body.as_bytes())]).await;
}

/// Produces `bodies` to partition 0 of `topic` in one batch, asserting every one is appended.
async fn produce_many(world: &World, topic: &'static str, bodies: Vec<Bytes>) {
    let front = world.fronts[0].clone();
    let count = bodies.len();
    let produced = world
        .complete(async move {
            front
                .produce(ProduceParams {
                    topic: topic.to_string(),
                    records: bodies
                        .into_iter()
                        .map(|body| ClientRecord {
                            meta: None,
                            topic_delay: false,
                            body,
                            target: Target::Partition(0),
                        })
                        .collect(),
                    batch: count > 1,
                })
                .await
        })
        .await;
    assert!(produced.is_ok_and(|r| r.len() == count && r.iter().all(|r| r.is_ok())));
}

async fn consume_some(world: &World, topic: &'static str) -> Vec<Delivery> {
    consume_in(world, topic, DEFAULT_GROUP).await
}

async fn consume_in(world: &World, topic: &'static str, group: &'static str) -> Vec<Delivery> {
    let front = world.fronts[0].clone();
    world
        .complete(async move {
            front
                .consume(ConsumeParams {
                    topic: topic.to_string(),
                    group: group.to_string(),
                    wait_ms: Some(0),
                    visibility_ms: Some(1000),
                    max: 10,
                    media: None,
                })
                .await
        })
        .await
        .expect("consume")
}

async fn nack(world: &World, topic: &'static str, d: &Delivery) {
    settle_in(world, topic, DEFAULT_GROUP, d, SettleOp::Nack(None)).await;
}

async fn settle_in(
    world: &World,
    topic: &'static str,
    group: &'static str,
    d: &Delivery,
    op: SettleOp,
) {
    let front = world.fronts[0].clone();
    let handle = crate::ops::receipt::ReceiptHandle::of(d);
    let result = world
        .complete(async move {
            front
                .settle(SettleParams {
                    topic: topic.to_string(),
                    group: group.to_string(),
                    op,
                    handles: vec![(String::new(), Ok(handle))],
                    batch: false,
                })
                .await
        })
        .await;
    assert!(result.is_ok_and(|r| r.iter().all(|r| r.is_ok())));
}

fn committed(world: &World, topic: &str) -> Option<u64> {
    let t = world.engines[0].topic(topic).expect("topic");
    let p = t.owned_partitions().next().expect("partition 0");
    p.committed(DEFAULT_GROUP)
}

/// A dead letter is two steps: the copy appended to the dead-letter topic (durably), then the original settled.
/// A copy that cannot be appended settles nothing: the message stays in its topic, and goes to the dead-letter
/// topic once appends work again.
#[test]
fn a_dead_letter_copy_that_cannot_be_appended_settles_nothing() {
    on_executor(async {
        let sim = Sim::new();
        let world = quiet_world(sim.clone()).await;
        produce_one(&world, SOURCE, "m").await;
        for _ in 0..MAX_DELIVERIES {
            let got = consume_some(&world, SOURCE).await;
            assert_eq!(got.len(), 1);
            nack(&world, SOURCE, &got[0]).await;
        }
        sim.fail_writes(libc::EIO, 1);
        assert!(consume_some(&world, SOURCE).await.is_empty());
        assert_eq!(
            committed(&world, SOURCE),
            Some(0),
            "settled in its topic although its dead-letter copy failed"
        );
        sim.fail_writes(libc::EIO, 0);
        world
            .clock
            .advance(crate::front::consume::DEAD_LETTER_RETRY_MS + 1);
        world.settle().await;
        assert!(consume_some(&world, SOURCE).await.is_empty());
        assert_eq!(committed(&world, SOURCE), Some(1));
        let copies = consume_some(&world, DLQ).await;
        assert_eq!(copies.len(), 1);
        assert_eq!(&copies[0].payload[..], b"m");
        world.shut_down().await;
    });
}

/// A redrive is two steps too: the batch appended to the target, then acked in the source. An append that fails
/// acks nothing in the source; the messages move once appends work again (after the redrive's lease).
#[test]
fn a_redrive_whose_append_fails_acks_nothing_in_the_source() {
    on_executor(async {
        let sim = Sim::new();
        let world = quiet_world(sim.clone()).await;
        produce_one(&world, DLQ, "d1").await;
        produce_one(&world, DLQ, "d2").await;
        async fn redrive(world: &World) -> crate::ops::OpResult<u64> {
            let front = world.fronts[0].clone();
            world
                .complete(async move {
                    front
                        .redrive(crate::ops::redrive::RedriveParams {
                            from: DLQ.to_string(),
                            to: REDRIVEN.to_string(),
                            group: DEFAULT_GROUP.to_string(),
                            max: None,
                        })
                        .await
                })
                .await
        }
        sim.fail_writes(libc::EIO, 1);
        assert!(redrive(&world).await.is_err());
        assert_eq!(
            committed(&world, DLQ),
            Some(0),
            "acked in the source without a copy"
        );
        sim.fail_writes(libc::EIO, 0);
        world
            .clock
            .advance(crate::front::redrive::REDRIVE_VISIBILITY_MS + 1);
        world.settle().await;
        assert_eq!(redrive(&world).await.ok(), Some(2));
        assert_eq!(committed(&world, DLQ), Some(2));
        let moved: Vec<Vec<u8>> = consume_some(&world, REDRIVEN)
            .await
            .iter()
            .map(|d| d.payload.to_vec())
            .collect();
        assert_eq!(moved, vec![b"d1".to_vec(), b"d2".to_vec()]);
        world.shut_down().await;
    });
}

/// A redrive with a `max` above one batch moves exactly `max` messages, the last batch asking only for what is left,
/// and acks exactly those in the source.
#[test]
fn a_redrive_with_a_max_above_one_batch_moves_exactly_max() {
    use crate::front::redrive::REDRIVE_BATCH;
    on_executor(async {
        let sim = Sim::new();
        let world = quiet_world(sim.clone()).await;
        let total = REDRIVE_BATCH + 10;
        let max = REDRIVE_BATCH as u64 + 1;
        produce_many(
            &world,
            DLQ,
            (0..total).map(|i| Bytes::from(format!("d{i}"))).collect(),
        )
        .await;
        let front = world.fronts[0].clone();
        let moved = world
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
        assert_eq!(moved.ok(), Some(max));
        assert_eq!(committed(&world, DLQ), Some(max), "acked in the source");
        let target = world.engines.iter().filter_map(|e| e.topic(REDRIVEN).ok());
        let copied: u64 = target
            .flat_map(|t| {
                t.owned_partitions()
                    .map(|p| p.log.end_offset())
                    .collect::<Vec<_>>()
            })
            .sum();
        assert_eq!(copied, max, "copied to the target");
        world.shut_down().await;
    });
}

/// A redrive without `max` moves what its own group has not settled, whatever another group of the source has
/// settled: a group that settled everything in the dead-letter topic holds nothing back in another.
#[test]
fn a_redrive_without_max_counts_its_own_groups_backlog_only() {
    on_executor(async {
        let sim = Sim::new();
        let world = quiet_world(sim.clone()).await;
        for body in ["d1", "d2", "d3"] {
            produce_one(&world, DLQ, body).await;
        }
        for d in consume_some(&world, DLQ).await {
            settle_in(&world, DLQ, DEFAULT_GROUP, &d, SettleOp::Ack).await;
        }
        assert_eq!(
            committed(&world, DLQ),
            Some(3),
            "settled in the default group"
        );
        let front = world.fronts[0].clone();
        let moved = world
            .complete(async move {
                front
                    .redrive(crate::ops::redrive::RedriveParams {
                        from: DLQ.to_string(),
                        to: REDRIVEN.to_string(),
                        group: "g2".to_string(),
                        max: None,
                    })
                    .await
            })
            .await;
        assert_eq!(moved.ok(), Some(3), "moved g2's backlog");
        let t = world.engines[0].topic(DLQ).expect("topic");
        let p = t.owned_partitions().next().expect("partition 0");
        assert_eq!(p.committed("g2"), Some(3), "acked in the source's g2");
        world.shut_down().await;
    });
}

/// Crashes the world's process (kill -9: what it wrote stays, in the page cache) and boots the next one on its disk.
async fn crash_and_reboot(world: World) -> World {
    let image = world.sim.process_crash();
    world.shut_down().await;
    World::boot(&quiet_plan(), image, 1_700_000_100_000, 1).await
}

/// An acked frontier is journaled at the next flush tick, once: a crash after it redelivers nothing acked (the
/// frontier file itself is written only at the journal's next checkpoint, which these few records never reach),
/// and a frontier that did not move is not journaled again.
#[test]
fn an_acked_frontier_is_journaled_once_at_the_flush_tick_and_survives_a_crash() {
    on_executor(async {
        let sim = Sim::new();
        let world = quiet_world(sim.clone()).await;
        for body in ["m1", "m2", "m3"] {
            produce_one(&world, PLAIN, body).await;
        }
        let got = consume_some(&world, PLAIN).await;
        assert_eq!(got.len(), 3);
        for d in &got {
            settle_in(&world, PLAIN, DEFAULT_GROUP, d, SettleOp::Ack).await;
        }
        let partition = || {
            let t = world.engines[0].topic(PLAIN).expect("topic");
            t.owned_partitions().next().expect("partition 0")
        };
        let moved = |p: &crate::partition::Partition| {
            let mut records = Vec::new();
            p.moved_frontiers(&mut records);
            records
                .iter()
                .map(|r| (r.group.clone(), r.committed))
                .collect::<Vec<_>>()
        };
        assert_eq!(moved(&partition()), vec![(DEFAULT_GROUP.to_string(), 3)]);
        world
            .clock
            .advance(world.engines[0].config().frontier_flush_interval_ms + 1);
        world.settle().await;
        assert_eq!(partition().durable_frontier(DEFAULT_GROUP), Some(3));
        assert_eq!(
            moved(&partition()),
            vec![],
            "a journaled frontier that did not move is journaled again"
        );
        let world = crash_and_reboot(world).await;
        assert_eq!(
            consume_some(&world, PLAIN).await.len(),
            0,
            "messages acked and journaled before the crash delivered again"
        );
        world.shut_down().await;
    });
}

/// A group's start is durable before its creation is answered: created at `latest`, it sees none of the older
/// messages; deleted and created again (from the oldest), it starts over even across a crash, though the journal
/// still holds the frontier of the group of the same name that was deleted (the start record tells the replay to
/// leave those out).
#[test]
fn a_group_starts_where_its_creation_said_even_when_recreated_and_crashed() {
    on_executor(async {
        let sim = Sim::new();
        let world = quiet_world(sim.clone()).await;
        for body in ["m1", "m2", "m3"] {
            produce_one(&world, PLAIN, body).await;
        }
        async fn admin(world: &World, create: bool, group: &'static str, latest: bool) {
            let front = world.fronts[0].clone();
            let done = world
                .complete(async move {
                    if create {
                        front
                            .create_group(PLAIN.to_string(), group.to_string(), latest)
                            .await
                            .map(|created| assert!(created))
                    } else {
                        front
                            .delete_group(PLAIN.to_string(), group.to_string())
                            .await
                    }
                })
                .await;
            assert!(done.is_ok(), "{done:?}");
        }
        admin(&world, true, "late", true).await;
        assert_eq!(
            consume_in(&world, PLAIN, "late").await.len(),
            0,
            "a group created at the end got older messages"
        );
        produce_one(&world, PLAIN, "m4").await;
        let got = consume_in(&world, PLAIN, "late").await;
        assert_eq!(got.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![3]);

        admin(&world, true, "again", false).await;
        let got = consume_in(&world, PLAIN, "again").await;
        assert_eq!(got.len(), 4);
        for d in &got {
            settle_in(&world, PLAIN, "again", d, SettleOp::Ack).await;
        }
        world
            .clock
            .advance(world.engines[0].config().frontier_flush_interval_ms + 1);
        world.settle().await;
        admin(&world, false, "again", false).await;
        admin(&world, true, "again", false).await;
        let world = crash_and_reboot(world).await;
        assert_eq!(
            consume_in(&world, PLAIN, "again").await.len(),
            4,
            "a recreated group was credited with the deleted one's frontier"
        );
        world.shut_down().await;
    });
}

/// A simulated process that ends leaves nothing behind: no task, no descriptor (so seeds can run by the
/// thousand on one executor).
#[test]
fn simulated_processes_leave_no_descriptor_behind() {
    let count = || {
        std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async move {
            run_seed_here(1).await;
            let before = count();
            for seed in 2..30 {
                run_seed_here(seed).await;
            }
            // Other tests of this process open and close descriptors meanwhile: a leak shows as growth with
            // the number of simulated processes (28 here), not as a small difference.
            let after = count();
            assert!(
                after <= before + 8,
                "descriptors leaked by simulated processes: {before} before, {after} after"
            );
        });
}
