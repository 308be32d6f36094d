//! A partition whose records fail to read (I/O errors on the simulated disk): the failure stays with that record and
//! that partition. A take answers `Unavailable` and releases the lease, so the record is delivered once it reads
//! again; after `MAX_READ_FAILURES` failures it is skipped as corrupt and the frontier moves past it; and a consume
//! over a topic still gets the messages of its other partitions.

use super::inflight::{Limits, Redelivery};
use super::{
    ByteBudget, Partition, PartitionSetup, SettleOp, Stop, Taken, DEFAULT_GROUP, MAX_READ_FAILURES,
};
use crate::clock::{Clock, ManualClock};
use crate::config::{Config, FsyncPolicy};
use crate::engine::topic::TopicConfig;
use crate::engine::{Engine, EngineError, Shared};
use crate::front::Front;
use crate::ops::consume::ConsumeParams;
use crate::ops::produce::{ClientRecord, ProduceParams, Target};
use crate::ops::OpError;
use crate::partition::PartitionError;
use crate::storage::backend::Storage;
use crate::storage::log::LogOptions;
use crate::storage::sim::{Sim, SimStorage};
use crate::transport::{CoreLink, Envelope, Router, RouterPeers};
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Long enough that no lease ends by itself during a test (the manual clock barely moves).
const VISIBILITY_MS: u64 = 30_000;

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(f)
}

fn dir() -> PathBuf {
    PathBuf::from("/sim/topics/t/0")
}

/// A partition of one group on the simulated disk, with a manual clock.
async fn open(sim: &Rc<Sim>, clock: &Rc<ManualClock>) -> Rc<Partition> {
    open_waking(sim, clock, Rc::new(|_, _| {})).await
}

/// The same, telling `wake` of what becomes deliverable.
async fn open_waking(sim: &Rc<Sim>, clock: &Rc<ManualClock>, wake: super::Wake) -> Rc<Partition> {
    open_with(sim, clock, wake, false).await
}

/// The same, a FIFO topic's partition when `fifo`.
async fn open_with(
    sim: &Rc<Sim>,
    clock: &Rc<ManualClock>,
    wake: super::Wake,
    fifo: bool,
) -> Rc<Partition> {
    Partition::open(PartitionSetup {
        storage: Rc::new(SimStorage(sim.clone())),
        clock: clock.clone(),
        dir: dir(),
        id: 0,
        core: 0,
        journal: None,
        log_options: LogOptions {
            segment_bytes: 1 << 20,
            max_payload: 1 << 16,
            fsync: FsyncPolicy::Always,
            // Reads reach the simulated disk, whose read faults these tests inject (the tail cache has its own tests).
            tail_cache_bytes: 0,
            write_behind_bytes: 0,
        },
        limits: Limits {
            max_in_flight: 16,
            max_acked_ahead: 16,
        },
        redelivery: Redelivery::default(),
        groups: vec![DEFAULT_GROUP.to_string()],
        wake,
        learner_if_new: None,
        fifo,
    })
    .await
    .expect("open the partition")
}

fn bodies(items: &[&'static str]) -> Vec<Bytes> {
    items
        .iter()
        .map(|s| Bytes::from_static(s.as_bytes()))
        .collect()
}

fn offsets(taken: &Taken) -> Vec<u64> {
    taken.deliveries.iter().map(|d| d.offset).collect()
}

/// `read_errors` of the partition.
async fn read_errors(p: &Partition) -> u64 {
    p.info().await.counters[1]
}

#[test]
fn a_record_that_fails_to_read_is_released_counted_and_delivered_once_it_reads_again() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        assert_eq!(p.append(bodies(&["first", "second"])).await.unwrap(), 0);

        sim.fail_reads(libc::EIO, 1);
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(sim.reads_to_fail(), 0, "the take read the record");
        assert_eq!(taken.stop, Some(Stop::Unavailable));
        assert!(
            taken.deliveries.is_empty(),
            "nothing is delivered: {:?}",
            offsets(&taken)
        );
        let info = p.info().await;
        assert_eq!(info.counters[1], 1, "the read error is counted");
        assert_eq!(
            info.in_flight,
            0,
            "the lease is released: {}",
            p.debug_shard(DEFAULT_GROUP)
        );
        assert_eq!((info.committed, info.corrupt_skipped), (0, 0));
        assert!(p.has_deliverable(DEFAULT_GROUP));

        // The fault is over and no time passed: the record is deliverable at once, not after a visibility.
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![0], "{}", p.debug_shard(DEFAULT_GROUP));
        assert_eq!(&taken.deliveries[0].payload[..], b"first");
        assert_eq!(taken.stop, Some(Stop::Max));
        assert_eq!(read_errors(&p).await, 1);
    });
}

#[test]
fn a_record_failing_max_read_failures_times_is_skipped_as_corrupt_and_the_frontier_moves_past_it() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        assert_eq!(p.append(bodies(&["bad", "good"])).await.unwrap(), 0);
        let mut delivered = Vec::new();

        for failures in 1..MAX_READ_FAILURES as u64 {
            sim.fail_reads(libc::EIO, 1);
            clock.advance(1);
            let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
            delivered.extend(offsets(&taken));
            assert_eq!(taken.stop, Some(Stop::Unavailable), "failure {failures}");
            assert!(taken.deliveries.is_empty(), "failure {failures}");
            let info = p.info().await;
            assert_eq!(info.counters[1], failures);
            assert_eq!(
                (info.committed, info.in_flight, info.corrupt_skipped),
                (0, 0, 0),
                "failure {failures}: released for a retry, not skipped yet"
            );
        }

        // The last allowed failure: the record is given up as corrupt and the take goes on to the next one.
        sim.fail_reads(libc::EIO, 1);
        clock.advance(1);
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        delivered.extend(offsets(&taken));
        assert_eq!(sim.reads_to_fail(), 0);
        assert_eq!(offsets(&taken), vec![1], "{}", p.debug_shard(DEFAULT_GROUP));
        assert_eq!(&taken.deliveries[0].payload[..], b"good");
        let info = p.info().await;
        assert_eq!(info.counters[1], MAX_READ_FAILURES as u64);
        assert_eq!(info.corrupt_skipped, 1, "counted as corrupt-skipped");
        assert_eq!(
            info.committed, 1,
            "the frontier moved past the skipped record"
        );

        let d = &taken.deliveries[0];
        let acked = p
            .settle(DEFAULT_GROUP, &[(d.offset, d.nonce)], SettleOp::Ack)
            .await
            .unwrap();
        assert_eq!(acked, vec![Ok(())]);
        assert_eq!(p.committed(DEFAULT_GROUP), Some(2));

        // It reads fine now, and is still never delivered.
        let taken = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        delivered.extend(offsets(&taken));
        assert_eq!(taken.stop, Some(Stop::Empty));
        assert!(!p.has_deliverable(DEFAULT_GROUP));
        assert!(
            !delivered.contains(&0),
            "the skipped record was delivered: {delivered:?}"
        );
        assert_eq!(p.info().await.corrupt_skipped, 1);
    });
}

/// Failures of a record are counted as consecutive: a record that failed, then was read and delivered, starts over
/// (a transient error now and then must not add up to "corrupt" over the record's life).
#[test]
fn read_failures_that_are_not_consecutive_do_not_skip_a_readable_record() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        p.append(bodies(&["flaky"])).await.unwrap();
        for round in 0..MAX_READ_FAILURES {
            // MAX_READ_FAILURES - 1 failures, then a good read.
            for _ in 1..MAX_READ_FAILURES {
                sim.fail_reads(libc::EIO, 1);
                let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
                assert_eq!(taken.stop, Some(Stop::Unavailable), "round {round}");
            }
            let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
            assert_eq!(
                offsets(&taken),
                vec![0],
                "round {round}: the record reads again and must be delivered (corrupt_skipped {})",
                p.info().await.corrupt_skipped
            );
            // The consumer gives it back: it must stay deliverable.
            let d = &taken.deliveries[0];
            let nacked = p
                .settle(
                    DEFAULT_GROUP,
                    &[(d.offset, d.nonce)],
                    SettleOp::Nack(Some(0)),
                )
                .await
                .unwrap();
            assert_eq!(nacked, vec![Ok(())]);
        }
        assert_eq!(p.info().await.corrupt_skipped, 0);
    });
}

/// A lease given back because its record could not be read never reached a consumer: the first delivery that does
/// is delivery 1 (else a topic with `max_deliveries` dead-letters a message nobody ever saw).
#[test]
fn a_failed_read_does_not_count_as_a_delivery() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        p.append(bodies(&["late"])).await.unwrap();
        sim.fail_reads(libc::EIO, 1);
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(taken.stop, Some(Stop::Unavailable));
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![0]);
        assert_eq!(taken.deliveries[0].delivery_count, 1);
        assert_eq!(p.info().await.groups[0].counters[1], 0, "not a redelivery");
    });
}

/// A core link to no other core (one engine).
struct Alone;

impl CoreLink for Alone {
    fn send(&self, _core: usize, _envelope: Envelope) -> bool {
        false
    }
}

/// One engine and its front on the simulated disk, wired as `sim::World::boot` does.
async fn one_core(sim: &Rc<Sim>, clock: &Rc<ManualClock>) -> Rc<Front> {
    let config = Rc::new(Config {
        data_dir: PathBuf::from("/sim"),
        segment_bytes: 1 << 20,
        max_message_bytes: 1 << 16,
        // Reads reach the simulated disk, whose read faults these tests inject.
        tail_cache_bytes: 0,
        write_behind_bytes: 0,
        ..Config::default()
    });
    let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
    for d in ["topics", "trash"] {
        storage.create_dir_all(&config.data_dir.join(d)).unwrap();
    }
    let engine = Engine::new(
        0,
        1,
        config,
        clock.clone() as Rc<dyn Clock>,
        storage,
        std::sync::Arc::new(Shared::default()),
    );
    let router = Router::new(engine.clone(), Rc::new(Alone));
    engine.set_peers(Rc::new(RouterPeers(Rc::downgrade(&router))));
    assert!(engine.load_topics().await.unwrap().is_empty());
    Front::new(router)
}

fn record(body: &'static str, partition: u64) -> ClientRecord {
    ClientRecord {
        meta: None,
        topic_delay: false,
        body: Bytes::from_static(body.as_bytes()),
        target: Target::Partition(partition),
    }
}

fn consume(max: usize) -> ConsumeParams {
    ConsumeParams {
        topic: "t".to_string(),
        group: DEFAULT_GROUP.to_string(),
        wait_ms: Some(0),
        visibility_ms: Some(VISIBILITY_MS),
        max,
        media: None,
    }
}

#[test]
fn a_consume_gets_the_other_partitions_messages_while_one_partition_cannot_be_read() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let front = one_core(&sim, &clock).await;
        let mut config = TopicConfig::with_defaults("t");
        config.partitions = 2;
        front.create_topic(config).await.unwrap();
        let produced = front
            .produce(ProduceParams {
                topic: "t".to_string(),
                records: vec![record("p0", 0), record("p1-a", 1), record("p1-b", 1)],
                batch: true,
            })
            .await
            .unwrap();
        assert!(produced.iter().all(|r| r.is_ok()), "{produced:?}");
        let topic = front.engine().topic("t").unwrap();
        let broken = topic.owned_partition(0).unwrap();
        let healthy = topic.owned_partition(1).unwrap();

        // Every read of partition 0 fails; partition 1 reads fine.
        sim.fail_reads_under(Path::new("/sim/topics/t/0"), libc::EIO, 100);
        // Two consumes of one message: the owner starts from each partition in turn, so one of them tries the
        // broken partition first.
        let mut got = Vec::new();
        for i in 0..2 {
            let deliveries = front.consume(consume(1)).await.unwrap_or_else(|e| {
                panic!("consume {i} failed although partition 1 has messages: {e}")
            });
            assert_eq!(deliveries.len(), 1, "consume {i}");
            assert_eq!(deliveries[0].partition, 1, "consume {i}");
            got.push(String::from_utf8_lossy(&deliveries[0].payload).to_string());
        }
        got.sort();
        assert_eq!(got, ["p1-a", "p1-b"]);
        let errors_before = read_errors(&broken).await;
        assert!(errors_before >= 1, "the broken partition was tried");

        // Only the broken partition has something left: the consume says so (503) rather than "empty".
        match front.consume(consume(10)).await {
            Err(OpError::Engine(EngineError::Partition(PartitionError::Unavailable(_)))) => {}
            other => panic!("expected 503 unavailable, got {other:?}"),
        }
        assert_eq!(read_errors(&broken).await, errors_before + 1);
        assert_eq!(read_errors(&healthy).await, 0);
        let info = broken.info().await;
        assert_eq!((info.in_flight, info.corrupt_skipped), (0, 0));

        // The disk recovers: the broken partition's message is delivered.
        sim.fail_reads(libc::EIO, 0);
        let deliveries = front.consume(consume(10)).await.unwrap();
        assert_eq!(deliveries.len(), 1);
        assert_eq!(
            (deliveries[0].partition, &deliveries[0].payload[..]),
            (0, &b"p0"[..])
        );
    });
}

/// Issue 23, finding 7: a consume's reply is bounded in payload bytes (`max_batch_bytes`), not only in messages.
/// A take stops at its budget; the leases it reserved past it go back at once (deliverable again, no delivery
/// counted), and one message always goes when nothing was taken yet, whatever its size.
#[test]
fn a_take_stops_at_its_byte_budget_and_gives_back_what_it_reserved_past_it() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        let big = Bytes::from(vec![b'x'; 100]);
        p.append(vec![big; 5]).await.unwrap();

        let mut budget = ByteBudget {
            left: 250,
            taken_any: false,
        };
        let taken = p
            .take_within(DEFAULT_GROUP, 5, &mut budget, VISIBILITY_MS)
            .await
            .unwrap();
        assert_eq!(
            offsets(&taken),
            vec![0, 1],
            "{}",
            p.debug_shard(DEFAULT_GROUP)
        );
        assert_eq!(taken.stop, Some(Stop::Budget));
        assert_eq!(budget.left, 50);
        assert_eq!(
            p.info().await.in_flight,
            2,
            "{}",
            p.debug_shard(DEFAULT_GROUP)
        );
        assert!(p.has_deliverable(DEFAULT_GROUP));

        // A budget already spent on another partition's message takes nothing more here…
        let mut spent = ByteBudget {
            left: 99,
            taken_any: true,
        };
        let taken = p
            .take_within(DEFAULT_GROUP, 5, &mut spent, VISIBILITY_MS)
            .await
            .unwrap();
        assert!(taken.deliveries.is_empty());
        assert_eq!(taken.stop, Some(Stop::Budget));
        // …while a first message goes whatever its size.
        let mut tiny = ByteBudget {
            left: 1,
            taken_any: false,
        };
        let taken = p
            .take_within(DEFAULT_GROUP, 5, &mut tiny, VISIBILITY_MS)
            .await
            .unwrap();
        assert_eq!(offsets(&taken), vec![2]);
        assert_eq!(
            taken.deliveries[0].delivery_count, 1,
            "a lease given back for the budget is not a delivery"
        );
        // The rest, unbounded: offsets 3 and 4, each delivered for the first time.
        let taken = p.take(DEFAULT_GROUP, 5, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![3, 4]);
        assert!(taken.deliveries.iter().all(|d| d.delivery_count == 1));
    });
}

/// A frontier file beyond the recovered log end (the log's tail was lost, its frontier was not): the log continues at
/// the frontier (no offset a consumer may have settled is reused) and exactly the offsets it lacks count as
/// corrupt-skipped. (`tests/storage_faults.rs` shows the same through the real binary; this one runs in `--lib`, where
/// mutation testing looks.)
#[test]
fn a_frontier_beyond_the_log_end_counts_exactly_the_offsets_the_log_lacks() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        p.append(bodies(&["a", "b", "c"])).await.unwrap();
        p.close().await;
        drop(p);
        let storage = SimStorage(sim.clone());
        super::frontier::write(
            &storage,
            &dir().join(super::frontier::file_name(DEFAULT_GROUP)),
            1_000,
        )
        .await
        .unwrap();
        let p = open(&sim, &clock).await;
        let info = p.info().await;
        assert_eq!(info.end_offset, 1_000, "the log continues at the frontier");
        let g = &info.groups[0];
        assert_eq!((g.committed, g.corrupt_skipped), (1_000, 1_000 - 3));
        assert_eq!(info.corrupt_skipped, 1_000 - 3);
    });
}

/// Leases given back (their probe's reply never reached the consumer) are deliverable again at once, and the group's
/// parked consumers are told how many; leases not given back (a stale nonce) wake nobody.
#[test]
fn leases_given_back_wake_the_group_with_their_count() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        type Woken = Vec<(Option<String>, usize)>;
        let woken: Rc<std::cell::RefCell<Woken>> = Rc::default();
        let w = woken.clone();
        let wake: super::Wake =
            Rc::new(move |group, n| w.borrow_mut().push((group.map(str::to_string), n)));
        let p = open_waking(&sim, &clock, wake).await;
        p.append(bodies(&["a", "b", "c"])).await.unwrap();
        let taken = p.take(DEFAULT_GROUP, 2, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![0, 1]);
        woken.borrow_mut().clear();
        let stale: Vec<(u64, u64)> = taken
            .deliveries
            .iter()
            .map(|d| (d.offset, d.nonce + 1))
            .collect();
        p.give_back(DEFAULT_GROUP, &stale);
        assert_eq!(*woken.borrow(), vec![], "nothing was given back");
        let items: Vec<(u64, u64)> = taken
            .deliveries
            .iter()
            .map(|d| (d.offset, d.nonce))
            .collect();
        p.give_back(DEFAULT_GROUP, &items);
        assert_eq!(*woken.borrow(), vec![(Some(DEFAULT_GROUP.to_string()), 2)]);
        let again = p.take(DEFAULT_GROUP, 3, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&again), vec![0, 1, 2], "deliverable again at once");
    });
}

/// A settle that frees room under `max_in_flight` wakes one parked consumer for the room, and a nack without a
/// delay one more for the record it makes deliverable again: the wake-up counts are exact (too few leave a
/// consumer parked beside a deliverable record until its wait ends; a count that wraps wakes nobody).
#[test]
fn settles_that_free_room_at_the_cap_wake_the_group_with_the_exact_count() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        type Woken = Vec<(Option<String>, usize)>;
        let woken: Rc<std::cell::RefCell<Woken>> = Rc::default();
        let w = woken.clone();
        let wake: super::Wake =
            Rc::new(move |group, n| w.borrow_mut().push((group.map(str::to_string), n)));
        let p = open_waking(&sim, &clock, wake).await;
        let limits = Limits {
            max_in_flight: 2,
            max_acked_ahead: 16,
        };
        p.set_policy(limits, Redelivery::default());
        p.append(bodies(&["a", "b", "c", "d"])).await.unwrap();
        let taken = p.take(DEFAULT_GROUP, 4, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![0, 1], "two at the cap");
        let item = |i: usize| [(taken.deliveries[i].offset, taken.deliveries[i].nonce)];
        let group = Some(DEFAULT_GROUP.to_string());

        // An ack at the cap: room for one (c).
        woken.borrow_mut().clear();
        let acked = p
            .settle(DEFAULT_GROUP, &item(0), SettleOp::Ack)
            .await
            .unwrap();
        assert_eq!(acked, vec![Ok(())]);
        assert_eq!(*woken.borrow(), vec![(group.clone(), 1)], "the ack");

        // At the cap again (b and c leased); a nack of b without a delay: b is deliverable again, and there is
        // room for it or d.
        let c = p.take(DEFAULT_GROUP, 4, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&c), vec![2]);
        woken.borrow_mut().clear();
        let nacked = p
            .settle(DEFAULT_GROUP, &item(1), SettleOp::Nack(Some(0)))
            .await
            .unwrap();
        assert_eq!(nacked, vec![Ok(())]);
        assert_eq!(*woken.borrow(), vec![(group.clone(), 2)], "the nack");
    });
}

/// A dead-lettered lease wakes one parked consumer when it frees room under `max_in_flight` for a deliverable
/// record, and nobody otherwise (no consumer is parked for want of room then).
#[test]
fn a_dead_lettered_lease_wakes_only_when_it_frees_room_at_the_cap() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        type Woken = Vec<(Option<String>, usize)>;
        let woken: Rc<std::cell::RefCell<Woken>> = Rc::default();
        let w = woken.clone();
        let wake: super::Wake =
            Rc::new(move |group, n| w.borrow_mut().push((group.map(str::to_string), n)));
        let p = open_waking(&sim, &clock, wake).await;
        p.append(bodies(&["a", "b", "c", "d"])).await.unwrap();
        // Below the cap (16): a dead letter wakes nobody, though b, c and d are deliverable.
        let a = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        woken.borrow_mut().clear();
        let d = &a.deliveries[0];
        p.dead_lettered(DEFAULT_GROUP, d.offset, d.nonce)
            .await
            .unwrap();
        assert_eq!(*woken.borrow(), vec![], "below the cap");
        // At the cap (2): one freed place, one wake.
        p.set_policy(
            Limits {
                max_in_flight: 2,
                max_acked_ahead: 16,
            },
            Redelivery::default(),
        );
        let bc = p.take(DEFAULT_GROUP, 4, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&bc), vec![1, 2]);
        woken.borrow_mut().clear();
        let d = &bc.deliveries[0];
        p.dead_lettered(DEFAULT_GROUP, d.offset, d.nonce)
            .await
            .unwrap();
        assert_eq!(
            *woken.borrow(),
            vec![(Some(DEFAULT_GROUP.to_string()), 1)],
            "at the cap"
        );
    });
}

/// A journal checkpoint and a close wait out a frontier write already running, then report every file written: a
/// checkpoint that did not wait would find the write still running and keep the journal file for nothing, and a
/// close that did not wait would report a file behind (so the journal stays for the replay) or let the write land
/// after the partition closed, when its directory may belong to a new topic of the same name.
#[test]
fn a_checkpoint_and_a_close_wait_out_a_running_frontier_write() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        p.append(bodies(&["a", "b"])).await.unwrap();
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        let d = &taken.deliveries[0];
        let acked = p
            .settle(DEFAULT_GROUP, &[(d.offset, d.nonce)], SettleOp::Ack)
            .await
            .unwrap();
        assert!(acked.iter().all(|r| r.is_ok()));
        sim.hold_syncs();
        let flushing = p.clone();
        let flush = glommio::spawn_local(async move { flushing.flush_frontiers().await });
        while sim.held_syncs() == 0 {
            futures_lite::future::yield_now().await;
        }
        let done = Rc::new(std::cell::Cell::new(0));
        let (checkpointing, counter) = (p.clone(), done.clone());
        let checkpoint = glommio::spawn_local(async move {
            let written = checkpointing.write_frontier_files().await;
            counter.set(counter.get() + 1);
            written
        });
        let (closing, counter) = (p.clone(), done.clone());
        let close = glommio::spawn_local(async move {
            let written = closing.close().await;
            counter.set(counter.get() + 1);
            written
        });
        for _ in 0..100 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(
            done.get(),
            0,
            "a checkpoint or a close returned while a frontier write was still running"
        );
        sim.release_syncs();
        assert!(checkpoint.await, "the checkpoint reports a file behind");
        assert!(close.await, "the close reports a file behind");
        assert_eq!(flush.await.len(), 1, "the running write completed");
        assert_eq!(p.durable_frontier(DEFAULT_GROUP), Some(1));
    });
}

/// Acks the `i`th delivery of `taken` in the default group.
/// A partition on a simulated disk holding "a", "b" and "c", all three leased to the default group.
async fn three_taken() -> (Rc<Sim>, Rc<Partition>, Taken) {
    let sim = Sim::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let p = open(&sim, &clock).await;
    p.append(bodies(&["a", "b", "c"])).await.unwrap();
    let taken = p.take(DEFAULT_GROUP, 3, VISIBILITY_MS).await.unwrap();
    (sim, p, taken)
}

async fn ack_one(p: &Partition, taken: &Taken, i: usize) {
    let d = &taken.deliveries[i];
    let acked = p
        .settle(DEFAULT_GROUP, &[(d.offset, d.nonce)], SettleOp::Ack)
        .await
        .unwrap();
    assert!(acked.iter().all(|r| r.is_ok()));
}

/// A journal checkpoint's frontier pass reports exactly whether every file now holds its group's frontier: true
/// after it wrote the files behind, false when a write failed (the journal file must then stay: it holds the only
/// durable copy of the newer frontier), and true again once a retry wrote it.
#[test]
fn a_checkpoint_reports_whether_every_frontier_file_was_written() {
    run(async {
        let (sim, p, taken) = three_taken().await;
        let ack = |i: usize| ack_one(&p, &taken, i);
        ack(0).await;
        assert!(
            p.write_frontier_files().await,
            "the file behind was written"
        );
        assert_eq!(p.durable_frontier(DEFAULT_GROUP), Some(1));
        ack(1).await;
        sim.fail_writes(libc::EIO, 1);
        assert!(
            !p.write_frontier_files().await,
            "a failed frontier write reported as written"
        );
        assert_eq!(p.durable_frontier(DEFAULT_GROUP), Some(1));
        assert!(p.write_frontier_files().await, "the retry wrote it");
        assert_eq!(p.durable_frontier(DEFAULT_GROUP), Some(2));
    });
}

/// One write of a group's frontier file at a time: a flush that finds one running leaves the file to it (and to the
/// next tick), so two writes of the same file never race (the older one's rename landing last would put a lower
/// frontier on disk).
#[test]
fn a_flush_never_starts_a_second_write_of_a_frontier_file() {
    run(async {
        let (sim, p, taken) = three_taken().await;
        let ack = |i: usize| ack_one(&p, &taken, i);
        ack(0).await;
        sim.hold_syncs();
        let first = p.clone();
        let first = glommio::spawn_local(async move { first.flush_frontiers().await });
        while sim.held_syncs() == 0 {
            futures_lite::future::yield_now().await;
        }
        ack(1).await;
        let second = p.clone();
        let second = glommio::spawn_local(async move { second.flush_frontiers().await });
        for _ in 0..100 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(
            sim.held_syncs(),
            1,
            "a second write of the frontier file started"
        );
        sim.release_syncs();
        assert_eq!(first.await.len(), 1);
        assert_eq!(
            second.await.len(),
            0,
            "the second flush left the file to the running one"
        );
        assert_eq!(p.durable_frontier(DEFAULT_GROUP), Some(1));
        assert_eq!(
            p.flush_frontiers().await.len(),
            1,
            "the next tick writes the newer frontier"
        );
        assert_eq!(p.durable_frontier(DEFAULT_GROUP), Some(2));
    });
}

/// A partition led here over 3 replicas (no follower has answered yet) holding "a", "b", "c" at offsets 0 to 2,
/// and the count of consumers its wake-ups asked for.
async fn replicated_over_three_with_abc(
    sim: &Rc<Sim>,
    clock: &Rc<ManualClock>,
) -> (Rc<Partition>, Rc<std::cell::Cell<usize>>) {
    let woken = Rc::new(std::cell::Cell::new(0usize));
    let w = woken.clone();
    let p = open_waking(sim, clock, Rc::new(move |_, n| w.set(w.get() + n))).await;
    p.set_replicas(3);
    // As its followers' answers would: a lease on its takes (`lease.rs`).
    p.lease_granted(u64::MAX);
    // As its fencing round would: a window of nonces a majority promised.
    p.open_nonces(p.nonce_floor(), p.nonce_ask(), Rc::new(|| {}));
    assert_eq!(p.append(bodies(&["a", "b", "c"])).await.unwrap(), 0);
    (p, woken)
}

/// A replicated leader's groups draw their nonces from one window, in order: never at or past its ceiling (a take
/// that would pass it asks for a raise and leases nothing, `Stop::Unavailable`, once no raise is under way), never
/// twice whatever the group; a take waits for a raise under way and leases once it lands; a deposed leader's window
/// is closed, and a new one starts above the old ceiling.
#[test]
fn a_replicated_leader_leases_only_inside_its_nonce_window_and_asks_for_a_raise() {
    use crate::partition::nonces::NONCE_LOW;
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let (p, _) = replicated_over_three_with_abc(&sim, &clock).await;
        p.add_group("other");
        p.follower_acked(7, 3);
        // The raise asked for fails at once while `fail` is set (no majority answered), else stays under way.
        let asked = Rc::new(std::cell::Cell::new(0u32));
        let fail = Rc::new(std::cell::Cell::new(true));
        let (a, f, weak) = (asked.clone(), fail.clone(), Rc::downgrade(&p));
        // Room for exactly four more leases: low from the start.
        let start = p.nonce_floor();
        let ceiling = start + 5;
        p.open_nonces(
            start,
            ceiling,
            Rc::new(move || {
                a.set(a.get() + 1);
                if f.get() {
                    weak.upgrade().unwrap().nonce_raise_failed();
                }
            }),
        );
        let one = p.take(DEFAULT_GROUP, 2, VISIBILITY_MS).await.unwrap();
        let two = p.take("other", 2, VISIBILITY_MS).await.unwrap();
        let nonces: Vec<u64> = one
            .deliveries
            .iter()
            .chain(&two.deliveries)
            .map(|d| d.nonce)
            .collect();
        assert_eq!(
            nonces,
            vec![start + 1, start + 2, start + 3, start + 4],
            "one sequence across the groups"
        );
        assert_eq!(asked.get(), 2, "each take asked while the window was low");
        let none = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert!(none.deliveries.is_empty());
        assert_eq!(none.stop, Some(Stop::Unavailable));
        assert_eq!(p.nonce_window().issued, start + 4);
        // A raise under way: the take waits for it, and leases from where the window was once it lands.
        fail.set(false);
        let waiting = {
            let p = p.clone();
            glommio::spawn_local(async move { p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await })
        };
        futures_lite::future::yield_now().await;
        assert_eq!(asked.get(), 4);
        p.nonces_promised(0, start + 4 + 2 * NONCE_LOW);
        let more = waiting.await.unwrap();
        assert_eq!(more.deliveries[0].nonce, start + 5);
        let more = p.take("other", 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(more.deliveries[0].nonce, start + 6);
        assert_eq!(asked.get(), 4, "no ask with room above the low mark");
        // Deposed: closed; its next window starts above everything it may have issued.
        p.depose(99);
        assert_eq!(p.nonce_window().ceiling, 0);
        assert!(p.nonce_floor() >= start + 4 + 2 * NONCE_LOW);
        let none = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert!(none.deliveries.is_empty());
    });
}

#[test]
fn a_replicated_partition_serves_and_answers_only_what_a_majority_of_its_replicas_has() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let (p, woken) = replicated_over_three_with_abc(&sim, &clock).await;
        assert!(p.replicated());
        // On the leader's disk alone: nothing is served, nobody is woken.
        assert_eq!((p.log.end_offset(), p.readable_end()), (3, 0));
        assert_eq!(woken.get(), 0);
        assert!(!p.has_deliverable(DEFAULT_GROUP));
        let taken = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert!(taken.deliveries.is_empty(), "{:?}", offsets(&taken));
        assert!(p.replay(0).await.unwrap().is_none());

        // A produce waits for its commit: here one follower reaches 2 (a majority of 3 for a and b), then 3.
        let waiter = {
            let p = p.clone();
            glommio::spawn_local(async move {
                p.wait_committed(3, std::time::Duration::from_millis(100))
                    .await
            })
        };
        futures_lite::future::yield_now().await;
        p.follower_acked(7, 2);
        assert_eq!(p.readable_end(), 2);
        assert_eq!(woken.get(), 2, "the two committed records wake consumers");
        let taken = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![0, 1]);
        assert!(p.replay(2).await.unwrap().is_none());
        p.follower_acked(8, 3);
        assert_eq!(p.readable_end(), 3);
        waiter.await.expect("committed within the timeout");
        assert_eq!(&p.replay(2).await.unwrap().unwrap().payload[..], b"c");
        // An end a follower answered earlier never moves the commit back.
        p.follower_acked(7, 1);
        assert_eq!(p.readable_end(), 3);

        // No majority within the timeout: NotEnoughReplicas, and the record stays unserved.
        assert_eq!(p.append(bodies(&["d"])).await.unwrap(), 3);
        p.follower_acked(7, 4);
        assert_eq!(p.readable_end(), 4);
        assert_eq!(p.append(bodies(&["e"])).await.unwrap(), 4);
        let waiter = {
            let p = p.clone();
            glommio::spawn_local(async move {
                p.wait_committed(5, std::time::Duration::from_millis(100))
                    .await
            })
        };
        futures_lite::future::yield_now().await;
        clock.advance(100);
        match waiter.await {
            Err(PartitionError::NotEnoughReplicas(why)) => {
                assert!(why.contains("of 3 replicas"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.readable_end(), 4);
    });
}

/// A replica the partition key names a learner (added by a move, being caught up) is recorded but holds no commit
/// back: R = 4 with one learner commits at a majority of the three voters, and the learner's answers alone commit
/// nothing.
#[test]
fn a_learner_of_the_partition_key_counts_for_no_majority() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let woken = Rc::new(std::cell::Cell::new(0usize));
        let w = woken.clone();
        let p = open_waking(&sim, &clock, Rc::new(move |_, n| w.set(w.get() + n))).await;
        p.set_learners(&[9]);
        p.set_replicas(4);
        assert_eq!(p.append(bodies(&["a", "b", "c"])).await.unwrap(), 0);
        // One voter besides the leader, the learner silent: two of the three voters, committed (counting the
        // learner it would take three of four).
        p.follower_acked(7, 2);
        assert_eq!(p.readable_end(), 2);
        // The learner has everything: nothing more is committed on its word.
        p.follower_acked(9, 3);
        assert_eq!(p.readable_end(), 2);
        assert_eq!(p.follower_counted(9), 3, "its answers are still recorded");
        p.set_learners(&[]);
        p.set_replicas(4);
        p.follower_acked(7, 3);
        assert_eq!(
            p.readable_end(),
            0,
            "four voters: the leader and one follower are not a majority"
        );
    });
}

/// Each append counts its records once, in the partition's `produced` counter and in the wake-up of parked
/// consumers (exactly as many as became deliverable), whatever offset the batch starts at.
#[test]
fn appends_count_and_wake_for_exactly_their_records() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let woken = Rc::new(std::cell::Cell::new(0usize));
        let w = woken.clone();
        let p = open_waking(&sim, &clock, Rc::new(move |_, n| w.set(w.get() + n))).await;
        assert_eq!(p.append(bodies(&["a", "b", "c"])).await.unwrap(), 0);
        assert_eq!((p.counters.produced.get(), woken.get()), (3, 3));
        assert_eq!(p.append(bodies(&["d", "e"])).await.unwrap(), 3);
        assert_eq!((p.counters.produced.get(), woken.get()), (5, 5));
        assert_eq!(p.append(bodies(&["f"])).await.unwrap(), 5);
        assert_eq!((p.counters.produced.get(), woken.get()), (6, 6));
    });
}

/// A replicated leader hands out leases only under its own (`lease.rs`): none before a majority of its replicas
/// answered (a take asks for a renewal and waits half a lease for it, then, for a lease after, answers at once),
/// then until a lease after the newest request they answered, asking for a renewal past half of it.
#[test]
fn a_replicated_leader_takes_only_under_the_lease_a_majority_of_its_replicas_granted() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        p.set_replicas(3);
        p.open_nonces(p.nonce_floor(), p.nonce_ask(), Rc::new(|| {}));
        assert_eq!(p.append(bodies(&["a", "b", "c"])).await.unwrap(), 0);
        p.follower_acked(7, 3);
        let asked = Rc::new(std::cell::Cell::new(0u32));
        let a = asked.clone();
        p.set_lease_renewer(Some(Rc::new(move || a.set(a.get() + 1))));
        let lease = p.lease_ms();
        let unavailable =
            |t: &super::Taken| t.deliveries.is_empty() && t.stop == Some(super::Stop::Unavailable);
        let spawn_take = || {
            let p = p.clone();
            glommio::spawn_local(async move { p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await })
        };
        // No lease yet: the take asks for one and waits, half a lease at most.
        let take = spawn_take();
        for _ in 0..10 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(asked.get(), 1, "a renewal asked");
        clock.advance(lease / 2);
        let taken = take.await.unwrap();
        assert!(unavailable(&taken), "no majority answered: {taken:?}");
        assert_eq!(
            taken.retry_in_ms,
            Some(lease / 4),
            "a long poll looks again"
        );
        // Right after a wait in vain: unavailable at once, and asked again.
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert!(unavailable(&taken));
        assert_eq!(asked.get(), 2);
        // A majority answered a request sent now: served for a lease.
        p.lease_granted(clock.now_ms() + lease);
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![0]);
        assert_eq!(asked.get(), 2, "a fresh lease asks for nothing");
        // Past half of it: served, and a renewal asked.
        clock.advance(lease / 2 + 1);
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![1]);
        assert_eq!(asked.get(), 3);
        // Run out: the take waits, and an answer that comes meanwhile lets it go on.
        clock.advance(lease);
        let take = spawn_take();
        for _ in 0..10 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(asked.get(), 4);
        p.lease_granted(clock.now_ms() + lease);
        assert_eq!(offsets(&take.await.unwrap()), vec![2]);
        // An old answer (a request sent before the lease it holds) does not shorten it.
        p.lease_granted(clock.now_ms());
        assert_eq!(p.lease_until(), clock.now_ms() + lease);
    });
}

/// A replicated leader of "a" whose lease holds and whose take waits for its leadership's first nonces (`raises`
/// counts the asks), the lease run out meanwhile (after `lapse`); the take's task and the renewals asked.
async fn a_take_waiting_for_nonces(
    sim: &Rc<Sim>,
    clock: &Rc<ManualClock>,
    lapse: bool,
) -> (
    Rc<Partition>,
    glommio::Task<Result<Taken, PartitionError>>,
    Rc<std::cell::Cell<u32>>,
) {
    let p = open(sim, clock).await;
    p.set_replicas(3);
    p.open_nonces_later(Rc::new(|| {}));
    assert_eq!(p.append(bodies(&["a"])).await.unwrap(), 0);
    p.follower_acked(7, 1);
    let asked = Rc::new(std::cell::Cell::new(0u32));
    let a = asked.clone();
    p.set_lease_renewer(Some(Rc::new(move || a.set(a.get() + 1))));
    let lease = p.lease_ms();
    p.lease_granted(clock.now_ms() + lease);
    let take = {
        let p = p.clone();
        glommio::spawn_local(async move { p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await })
    };
    for _ in 0..10 {
        futures_lite::future::yield_now().await;
    }
    if lapse {
        clock.advance(lease + 1);
    }
    (p, take, asked)
}

/// The nonces [`a_take_waiting_for_nonces`]'s take waits for come, and it runs on.
async fn nonces_come(p: &Partition) {
    p.nonces_promised(p.nonce_floor(), p.nonce_ask());
    for _ in 0..10 {
        futures_lite::future::yield_now().await;
    }
}

/// A lease that runs out while a take waits under way (for its leadership's first nonces, whose round waits out a
/// replica that does not answer) is asked for again, once, outside the take: a replica that starts following
/// meanwhile does not wait for it, and the take goes on once a majority answers, or answers 503 (a long poll looks
/// again) when none does within half a lease.
#[test]
fn a_take_whose_lease_ran_out_while_it_waited_for_nonces_asks_again_and_goes_on() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let (p, take, asked) = a_take_waiting_for_nonces(&sim, &clock, true).await;
        assert_eq!(asked.get(), 0, "waiting for its first nonces");
        nonces_come(&p).await;
        assert_eq!(asked.get(), 1, "the lease asked for again");
        p.lease_granted(clock.now_ms() + p.lease_ms());
        assert_eq!(offsets(&take.await.unwrap()), vec![0]);

        // No answer within half a lease: 503.
        let sim = Sim::new();
        let (p, take, asked) = a_take_waiting_for_nonces(&sim, &clock, true).await;
        nonces_come(&p).await;
        assert_eq!(asked.get(), 1);
        clock.advance(p.lease_ms() / 2);
        let taken = take.await.unwrap();
        assert!(taken.deliveries.is_empty() && taken.stop == Some(super::Stop::Unavailable));
        assert_eq!(taken.retry_in_ms, Some(p.lease_ms() / 4));

        // Deposed while it waits for the renewal: it stops waiting, and a replica starting to follow is not held
        // up by it; a late answer of the old leadership hands out nothing.
        let sim = Sim::new();
        let (p, take, asked) = a_take_waiting_for_nonces(&sim, &clock, true).await;
        nonces_come(&p).await;
        assert_eq!(asked.get(), 1);
        let followed = Rc::new(std::cell::Cell::new(false));
        let f = followed.clone();
        let q = p.clone();
        glommio::spawn_local(async move {
            q.follow(5).await;
            f.set(true);
        })
        .detach();
        for _ in 0..20 {
            futures_lite::future::yield_now().await;
        }
        assert!(followed.get(), "following waits for no lease");
        p.lease_granted(clock.now_ms() + p.lease_ms());
        let taken = take.await.unwrap();
        assert!(taken.deliveries.is_empty(), "{taken:?}");
    });
}

/// A group deleted while a take waits for its leadership's nonces ends that take (`group_not_found`), not the core.
#[test]
fn a_group_deleted_while_a_take_waits_for_nonces_ends_the_take() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let (p, take, _) = a_take_waiting_for_nonces(&sim, &clock, false).await;
        p.remove_group(DEFAULT_GROUP).await;
        p.nonces_promised(p.nonce_floor(), p.nonce_ask());
        let r = take.await;
        assert!(matches!(r, Err(PartitionError::GroupNotFound(_))), "{r:?}");
    });
}

/// A deposed leader (a newer leadership began) appends, leases and settles nothing more, and a produce waiting for
/// its commit is answered at once; what it holds stays in its log. An older or equal epoch changes nothing more.
#[test]
fn a_deposed_leader_serves_nothing_more_and_its_commit_waiters_are_answered_at_once() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let (p, woken) = replicated_over_three_with_abc(&sim, &clock).await;
        p.follower_acked(7, 2);
        let taken = p.take(DEFAULT_GROUP, 1, VISIBILITY_MS).await.unwrap();
        assert_eq!(offsets(&taken), vec![0]);
        let lease = (taken.deliveries[0].offset, taken.deliveries[0].nonce);
        let waiter = {
            let p = p.clone();
            glommio::spawn_local(async move {
                p.wait_committed(3, std::time::Duration::from_secs(3600))
                    .await
            })
        };
        futures_lite::future::yield_now().await;
        let before = woken.get();
        assert_eq!(p.deposed(), None);
        p.depose(12);
        assert_eq!(p.deposed(), Some(12));
        assert!(woken.get() > before, "parked consumers look again");
        fn unavailable<T>(r: &Result<T, PartitionError>) -> bool {
            matches!(r, Err(PartitionError::Unavailable(why)) if why.contains("epoch 12"))
        }
        let r = waiter.await;
        assert!(unavailable(&r), "{r:?}");
        assert!(unavailable(&p.append(bodies(&["d"])).await));
        let taken = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(
            (offsets(&taken), taken.stop),
            (vec![], Some(Stop::Unavailable))
        );
        assert!(unavailable(
            &p.settle(DEFAULT_GROUP, &[lease], SettleOp::Ack).await
        ));
        assert!(unavailable(
            &p.dead_lettered(DEFAULT_GROUP, lease.0, lease.1).await
        ));
        assert_eq!(p.log.end_offset(), 3, "its log stays as it was");
        p.depose(11);
        assert_eq!(p.deposed(), Some(12), "an older epoch changes nothing");
    });
}

/// The stats show each group's oldest unsettled record by its append time: the record at the frontier, the next one
/// once it is acked, none when all are settled; acking above the frontier does not move it. Each frontier position
/// is read from the log once (a second describe while it stands still costs no read).
#[test]
fn the_stats_show_the_append_time_of_the_oldest_unsettled_record() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        let oldest = |info: &super::PartitionInfo| info.groups[0].oldest_unsettled_ms;
        let first = clock.wall_ms();
        p.append(bodies(&["a"])).await.unwrap();
        clock.advance(1_000);
        let second = clock.wall_ms();
        assert_eq!(second, first + 1_000);
        p.append(bodies(&["b", "c"])).await.unwrap();
        let taken = p.take(DEFAULT_GROUP, 3, VISIBILITY_MS).await.unwrap();
        assert_eq!(oldest(&p.info_with_ages().await), Some(first));
        assert_eq!(
            oldest(&p.info().await),
            None,
            "describe reads nothing for it"
        );
        let items: Vec<[(u64, u64); 1]> = taken
            .deliveries
            .iter()
            .map(|d| [(d.offset, d.nonce)])
            .collect();
        let ack = |i: usize| p.settle(DEFAULT_GROUP, &items[i], SettleOp::Ack);
        // Acked ahead of the frontier: the oldest is still record 0.
        assert_eq!(ack(2).await.unwrap(), vec![Ok(())]);
        assert_eq!(oldest(&p.info_with_ages().await), Some(first));
        assert_eq!(ack(0).await.unwrap(), vec![Ok(())]);
        assert_eq!(oldest(&p.info_with_ages().await), Some(second));
        let reads = sim.reads();
        assert_eq!(oldest(&p.info_with_ages().await), Some(second));
        assert_eq!(sim.reads(), reads, "a standing frontier is not read again");
        assert_eq!(ack(1).await.unwrap(), vec![Ok(())]);
        assert_eq!(
            oldest(&p.info_with_ages().await),
            None,
            "everything settled"
        );
    });
}

/// Retention on a replicated leader removes a segment only once a majority holds every record in it: before its
/// followers answer, a segment past its time stays (a later commit would count a record no replica had); once they
/// do, it goes. A deposed leader's retention goes by time alone, as a follower's does.
#[test]
fn a_replicated_leader_keeps_past_retention_what_a_majority_does_not_hold() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let (p, _) = replicated_over_three_with_abc(&sim, &clock).await;
        // Past the 1 MiB segment: the first segment is sealed.
        let big = Bytes::from(vec![b'x'; 60_000]);
        for _ in 0..20 {
            p.append(vec![big.clone()]).await.unwrap();
        }
        let end = p.log.end_offset();
        clock.advance(10_000);
        p.apply_retention(1_000).await;
        assert_eq!(
            p.log.start_offset(),
            0,
            "nothing committed: the segment stays"
        );
        p.follower_acked(7, 5);
        p.apply_retention(1_000).await;
        assert_eq!(
            p.log.start_offset(),
            0,
            "committed up to 5, inside the first segment: it stays"
        );
        p.follower_acked(7, end);
        p.apply_retention(1_000).await;
        assert!(p.log.start_offset() > 0, "a majority holds it all: it goes");
    });
}

/// A delayed produce (a record whose meta block names a time to come) is not delivered before that time, does not
/// hold up the records after it, costs no delivery, and is delivered once due with a delivery count of 1 and its
/// attributes; the take that found it early leaves it counted as delayed, and the next wake-up is its time.
#[test]
fn a_delayed_record_is_delivered_once_its_time_comes_and_does_not_hold_up_the_rest() {
    use crate::storage::meta::{Attribute, RecordMeta};
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        let meta = RecordMeta {
            not_before_ms: clock.wall_ms() + 5_000,
            attributes: vec![Attribute {
                name: "k".into(),
                data_type: "String".into(),
                value: Bytes::from_static(b"v"),
            }],
            ..RecordMeta::default()
        };
        let delayed = Bytes::from(meta.encode(b"later"));
        p.append_records(vec![delayed, Bytes::from_static(b"now")], vec![true, false])
            .await
            .unwrap();
        let first = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(first.deliveries.len(), 1, "only the record not delayed");
        assert_eq!(first.deliveries[0].offset, 1);
        assert_eq!(&first.deliveries[0].payload[..], b"now");
        assert!(first.deliveries[0].meta.is_none());
        let (delayed_count, wake) = p
            .group(DEFAULT_GROUP)
            .unwrap()
            .with(|s| (s.delayed(), s.next_wakeup_ms()));
        assert_eq!(delayed_count, 1);
        assert_eq!(wake, Some(clock.now_ms() + 5_000));
        clock.advance(4_999);
        assert!(p
            .take(DEFAULT_GROUP, 10, VISIBILITY_MS)
            .await
            .unwrap()
            .deliveries
            .is_empty());
        clock.advance(1);
        let due = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(due.deliveries.len(), 1);
        let d = &due.deliveries[0];
        assert_eq!((d.offset, d.delivery_count), (0, 1));
        assert_eq!(&d.payload[..], b"later");
        assert_eq!(d.meta.as_deref(), Some(&meta));
    });
}

/// Deduplicated produces: a record whose id the partition took within the window gets the first one's offset and
/// is not appended, within one call and across calls; past the window the id is new again; a partition opened again
/// (a restart) reads the window's ids from its log, so a retry after a crash is still a duplicate.
#[test]
fn a_deduplicated_produce_is_appended_once_within_its_window_even_across_a_reopen() {
    use crate::partition::dedup::DedupRecords;
    use crate::storage::meta::RecordMeta;
    fn records(items: &[(&'static str, Option<&'static str>)]) -> DedupRecords {
        let mut out = DedupRecords {
            payloads: Vec::new(),
            meta: Vec::new(),
            ids: Vec::new(),
        };
        for (body, id) in items {
            let id = id.map(|i| Bytes::from_static(i.as_bytes()));
            let meta = RecordMeta {
                dedup_id: id.clone(),
                ..RecordMeta::default()
            };
            if meta.is_empty() {
                out.payloads.push(Bytes::from_static(body.as_bytes()));
                out.meta.push(false);
            } else {
                out.payloads.push(Bytes::from(meta.encode(body.as_bytes())));
                out.meta.push(true);
            }
            out.ids.push(id);
        }
        out
    }
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open(&sim, &clock).await;
        let got = p
            .append_deduplicated(
                records(&[
                    ("a", Some("x")),
                    ("b", None),
                    ("c", Some("x")),
                    ("d", Some("y")),
                ]),
                60_000,
                100,
            )
            .await
            .unwrap();
        assert_eq!(
            got,
            vec![0, 1, 0, 2],
            "a repeat within the call is the first one"
        );
        assert_eq!(p.log.end_offset(), 3);
        clock.advance(30_000);
        let got = p
            .append_deduplicated(records(&[("e", Some("y")), ("f", Some("z"))]), 60_000, 100)
            .await
            .unwrap();
        assert_eq!(got, vec![2, 3]);
        assert_eq!(p.log.end_offset(), 4);
        // A restart: the ids come back from the log.
        p.close().await;
        let p = open(&sim, &clock).await;
        let got = p
            .append_deduplicated(records(&[("g", Some("x")), ("h", Some("z"))]), 60_000, 100)
            .await
            .unwrap();
        assert_eq!(got, vec![0, 3], "read back from the log");
        assert_eq!(p.log.end_offset(), 4);
        // Past the window, "x" (60 s ago) is new; "z" (30 s ago) is not.
        clock.advance(30_001);
        let got = p
            .append_deduplicated(records(&[("i", Some("x")), ("j", Some("z"))]), 60_000, 100)
            .await
            .unwrap();
        assert_eq!(got, vec![4, 3]);
        assert_eq!(p.log.end_offset(), 5);
        let record = p.replay(4).await.unwrap().unwrap();
        assert_eq!(&record.payload[..], b"i");
        assert_eq!(
            record.meta.and_then(|m| m.dedup_id),
            Some(Bytes::from_static(b"x"))
        );
    });
}

/// A FIFO record of message group `group`.
fn grouped(group: &str, body: &str) -> Bytes {
    let meta = crate::storage::meta::RecordMeta {
        group_key: Some(Bytes::from(group.to_string())),
        ..Default::default()
    };
    Bytes::from(meta.encode(body.as_bytes()))
}

/// Appends a1, b1, a2, b2, a3 (groups `a` and `b`) to a FIFO partition.
async fn append_five_of_two_groups(p: &Partition) {
    let items = [
        ("a", "a1"),
        ("b", "b1"),
        ("a", "a2"),
        ("b", "b2"),
        ("a", "a3"),
    ];
    p.append_records(
        items.iter().map(|(g, b)| grouped(g, b)).collect(),
        vec![true; items.len()],
    )
    .await
    .unwrap();
}

#[test]
fn a_purge_settles_everything_at_once_durably_and_the_group_goes_on() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open_with(&sim, &clock, Rc::new(|_, _| {}), true).await;
        append_five_of_two_groups(&p).await;
        let first = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(first.deliveries.len(), 2, "a1 and b1 leased, three held");
        let b1 = &first.deliveries[1];
        p.settle(DEFAULT_GROUP, &[(b1.offset, b1.nonce)], SettleOp::Ack)
            .await
            .unwrap();
        // b1 was acked above the unsettled a1: four were unsettled.
        assert_eq!(p.purge_group(DEFAULT_GROUP).await.unwrap(), (4, 5));
        let g = p.group(DEFAULT_GROUP).unwrap();
        assert_eq!(
            g.with(|s| (s.committed(), s.in_flight(), s.held(), s.acked_ahead())),
            (5, 0, 0, 0)
        );
        // Made durable as any moved frontier (here, without a journal, its file).
        p.flush_frontiers().await;
        assert_eq!(p.durable_frontier(DEFAULT_GROUP), Some(5));
        let a1 = &first.deliveries[0];
        let stale = p
            .settle(DEFAULT_GROUP, &[(a1.offset, a1.nonce)], SettleOp::Ack)
            .await
            .unwrap();
        assert_eq!(
            stale,
            vec![Err(PartitionError::LeaseGone)],
            "a purged lease is gone"
        );
        assert!(p
            .take(DEFAULT_GROUP, 10, VISIBILITY_MS)
            .await
            .unwrap()
            .deliveries
            .is_empty());
        // The group goes on: the next message of `a` is its head, delivered at once.
        p.append_records(vec![grouped("a", "a4")], vec![true])
            .await
            .unwrap();
        let next = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(next.deliveries.len(), 1);
        assert_eq!(&next.deliveries[0].payload[..], b"a4");
        assert_eq!(
            p.purge_group("nope").await.unwrap_err(),
            PartitionError::GroupNotFound("nope".into())
        );
    });
}

/// FIFO topics: within a message group, one message is leased at a time, in produce order; other groups are not
/// held up; an ack, or a dead-lettering, lets the next message of the group out (waking consumers), a nack or an
/// expiry gives the same message again; held messages count against `max_in_flight`.
#[test]
fn a_fifo_partition_leases_one_message_per_group_at_a_time_in_order() {
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let woken = Rc::new(std::cell::Cell::new(0usize));
        let w = woken.clone();
        let p = open_with(&sim, &clock, Rc::new(move |_, n| w.set(w.get() + n)), true).await;
        append_five_of_two_groups(&p).await;
        let bodies = |t: &Taken| -> Vec<String> {
            t.deliveries
                .iter()
                .map(|d| String::from_utf8(d.payload.to_vec()).unwrap())
                .collect()
        };
        let first = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(
            bodies(&first),
            ["a1", "b1"],
            "one per group, the first of each"
        );
        let g = p.group(DEFAULT_GROUP).unwrap();
        assert_eq!(g.with(|s| (s.in_flight(), s.held())), (2, 3));
        assert!(p
            .take(DEFAULT_GROUP, 10, VISIBILITY_MS)
            .await
            .unwrap()
            .deliveries
            .is_empty());
        // An ack lets the group's next message out, and wakes a consumer.
        let a1 = &first.deliveries[0];
        let before = woken.get();
        p.settle(DEFAULT_GROUP, &[(a1.offset, a1.nonce)], SettleOp::Ack)
            .await
            .unwrap();
        assert!(
            woken.get() > before,
            "the next message of the group wakes a consumer"
        );
        let next = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(bodies(&next), ["a2"]);
        assert_eq!(next.deliveries[0].delivery_count, 1);
        // A nack gives the same message again, not the next.
        let b1 = &first.deliveries[1];
        p.settle(
            DEFAULT_GROUP,
            &[(b1.offset, b1.nonce)],
            SettleOp::Nack(Some(0)),
        )
        .await
        .unwrap();
        let again = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(bodies(&again), ["b1"]);
        assert_eq!(again.deliveries[0].delivery_count, 2);
        // An expiry too.
        clock.advance(VISIBILITY_MS);
        let expired = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(bodies(&expired), ["b1", "a2"]);
        // Dead-lettering lets the next out.
        let a2 = &expired.deliveries[1];
        p.dead_lettered(DEFAULT_GROUP, a2.offset, a2.nonce)
            .await
            .unwrap();
        let b1 = &expired.deliveries[0];
        p.settle(DEFAULT_GROUP, &[(b1.offset, b1.nonce)], SettleOp::Ack)
            .await
            .unwrap();
        let last = p.take(DEFAULT_GROUP, 10, VISIBILITY_MS).await.unwrap();
        assert_eq!(bodies(&last), ["b2", "a3"]);
        assert_eq!(g.with(|s| s.held()), 0);
    });
}

/// A FIFO partition's held messages count against `max_in_flight`: a group that holds many back fills the cap,
/// and the partition answers as full rather than keeping an unbounded list.
#[test]
fn a_fifo_partitions_held_messages_count_against_the_cap() {
    use crate::storage::meta::RecordMeta;
    run(async {
        let sim = Sim::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let p = open_with(&sim, &clock, Rc::new(|_, _| {}), true).await;
        let meta = RecordMeta {
            group_key: Some(Bytes::from_static(b"g")),
            ..RecordMeta::default()
        };
        // The cap is 16 (`open_with`): 40 messages of one group.
        let payloads = (0..40)
            .map(|i| Bytes::from(meta.encode(format!("m{i}").as_bytes())))
            .collect();
        p.append_records(payloads, vec![true; 40]).await.unwrap();
        let taken = p.take(DEFAULT_GROUP, 100, VISIBILITY_MS).await.unwrap();
        assert_eq!(taken.deliveries.len(), 1);
        assert_eq!(taken.stop, Some(Stop::AtCap));
        let g = p.group(DEFAULT_GROUP).unwrap();
        assert_eq!(g.with(|s| s.unsettled_count()), 16);
        let d = &taken.deliveries[0];
        p.settle(DEFAULT_GROUP, &[(d.offset, d.nonce)], SettleOp::Ack)
            .await
            .unwrap();
        let next = p.take(DEFAULT_GROUP, 100, VISIBILITY_MS).await.unwrap();
        assert_eq!(next.deliveries.len(), 1);
        assert_eq!(&next.deliveries[0].payload[..], b"m1");
    });
}
