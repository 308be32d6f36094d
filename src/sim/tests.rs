//! The simulation's seeds in the test suite, and targeted scenarios on a quiet world.

use super::*;

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

/// One core, the simulation's topics, nothing else going on: for the two-step operations' own tests.
async fn quiet_world(sim: Rc<Sim>) -> World {
    let plan = Plan {
        cores: 1,
        fsync: FsyncPolicy::Always,
        steps: 0,
        net_depth: 64,
        partitions: [1, 1, 1, 1],
        power_cuts: false,
    };
    let world = World::boot(&plan, sim, 1_700_000_000_000, 1).await;
    create_topics(&world, &plan, &Rc::new(RefCell::new(Oracle::default()))).await;
    world
}

async fn produce_one(world: &World, topic: &'static str, body: &'static str) {
    let front = world.fronts[0].clone();
    let produced = world
        .complete(async move {
            front
                .produce(ProduceParams {
                    topic: topic.to_string(),
                    records: vec![ClientRecord {
                        body: Bytes::from_static(body.as_bytes()),
                        target: Target::Partition(0),
                    }],
                    batch: false,
                })
                .await
        })
        .await;
    assert!(produced.is_ok_and(|r| r.iter().all(|r| r.is_ok())));
}

async fn consume_some(world: &World, topic: &'static str) -> Vec<Delivery> {
    let front = world.fronts[0].clone();
    world
        .complete(async move {
            front
                .consume(ConsumeParams {
                    topic: topic.to_string(),
                    group: DEFAULT_GROUP.to_string(),
                    wait_ms: 0,
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
    let front = world.fronts[0].clone();
    let handle = crate::ops::receipt::ReceiptHandle::of(d);
    let result = world
        .complete(async move {
            front
                .settle(SettleParams {
                    topic: topic.to_string(),
                    group: DEFAULT_GROUP.to_string(),
                    op: SettleOp::Nack(None),
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
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async {
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
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async {
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
