//! The transport between cores: a probe whose asker went away before its reply came has its leases released on the
//! owner at once (over a real two-executor glommio mesh), and consumes rotate over the other owning cores (three
//! engines on one executor, wired by a queue link).

use super::mesh::{self, Mesh};
use super::{serve_envelope, CoreLink, Envelope, Router, RouterPeers};
use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::engine::placement::{self, core_of};
use crate::engine::topic::TopicConfig;
use crate::engine::{Engine, Shared};
use crate::front::Front;
use crate::ops::consume::{ConsumeParams, Probe};
use crate::ops::produce::{ClientRecord, ProduceParams, Target};
use crate::ops::settle::Settle;
use crate::ops::{Reply, Request};
use crate::partition::{SettleOp, DEFAULT_GROUP};
use crate::storage::backend::Storage;
use crate::storage::sim::{Sim, SimStorage};
use bytes::Bytes;
use event_listener::Event;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WALL_MS: u64 = 1_700_000_000_000;

/// A topic name whose partition 0 lands on `core` of `cores` (partition p then on `core + p`, modulo `cores`).
fn name_on(core: usize, cores: usize) -> String {
    (0..)
        .map(|i| format!("t{i}"))
        .find(|name| core_of(name, 0, cores) == core)
        .expect("some name lands on every core")
}

/// Core `id` of `cores`: its engine on a simulated disk of its own (`sim`) and a manual clock, reaching the other
/// cores through `link`.
fn boot_core(
    id: usize,
    cores: usize,
    sim: &Rc<Sim>,
    clock: &Rc<ManualClock>,
    link: Rc<dyn CoreLink>,
) -> Rc<Router> {
    let config = Rc::new(Config {
        data_dir: PathBuf::from("/sim"),
        segment_bytes: 1 << 20,
        max_message_bytes: 1 << 16,
        ..Config::default()
    });
    let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
    for d in ["topics", "trash"] {
        storage.create_dir_all(&config.data_dir.join(d)).unwrap();
    }
    let engine = Engine::new(
        id,
        cores,
        config,
        clock.clone() as Rc<dyn Clock>,
        storage,
        Arc::new(Shared::default()),
    );
    let router = Router::new(engine.clone(), link);
    engine.set_peers(Rc::new(RouterPeers(Rc::downgrade(&router))));
    router
}

// ---- a probe whose asker went away ----

/// Steps of the two-executor test, in order.
const OWNER_READY: usize = 1;
const ASKER_GONE: usize = 2;
const PROBE_SERVED: usize = 3;
const DONE: usize = 4;

/// Waits (on the executor's timer, so its other tasks run) until `phase` reaches `step`; panics after 5 s.
async fn wait_for(phase: &AtomicUsize, step: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while phase.load(Ordering::SeqCst) < step {
        assert!(
            Instant::now() < deadline,
            "waited 5 s for step {step} (at {})",
            phase.load(Ordering::SeqCst)
        );
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
}

/// Moves `phase` to `DONE` when dropped, so a failing executor never leaves the other one waiting.
struct DoneOnDrop(Arc<AtomicUsize>);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.store(DONE, Ordering::SeqCst);
    }
}

/// What the owner core saw: (delivered, redelivered, acked) of the default group, leases in flight, and how far
/// its clock moved.
type OwnerView = ([u64; 3], usize, u64);

/// What the asker got at last: (partition, offset, delivery count, payload, the ack's result is Ok).
type AskerView = (u32, u64, u32, Vec<u8>, bool);

fn probe(topic: &str, topic_id: u64) -> Request {
    Request::Probe(Probe {
        topic: topic.to_string(),
        topic_id,
        group: DEFAULT_GROUP.to_string(),
        max: 1,
        // Far longer than the test: only a release can make the message deliverable again.
        visibility_ms: Some(60_000),
        waker: None,
        max_bytes: usize::MAX,
        taken_any: false,
    })
}

/// Core 1 owns the topic's partition and holds one message; core 0 sends a probe for it over the mesh and goes away
/// before the reply comes (its call is dropped). Core 1 serves the probe (leasing the message), cannot deliver the
/// reply, and must release the lease: the next probe gets the message again with delivery count 2, and its handle
/// acks, while core 1's clock never moved (the 60 s lease did not end by itself).
#[test]
fn a_probe_whose_asker_went_away_has_its_lease_released_at_once() {
    let mesh = glommio::channels::channel_mesh::MeshBuilder::<Envelope, _>::full(2, 16);
    let phase = Arc::new(AtomicUsize::new(0));
    let topic = name_on(1, 2);
    let mut config = TopicConfig::with_defaults(&topic);
    config.id = 42;
    let locations = placement::on_node(&topic, 1, 0, 2);
    assert_eq!(locations[0].core, 1);

    let executors: Vec<_> = (0..2)
        .map(|_| {
            let (mesh, phase, topic, config, locations) = (
                mesh.clone(),
                phase.clone(),
                topic.clone(),
                config.clone(),
                locations.clone(),
            );
            glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                .spawn(move || async move {
                    let _done = DoneOnDrop(phase.clone());
                    let (senders, receivers) = mesh.join().await.unwrap();
                    let id = senders.peer_id();
                    let sim = Sim::new();
                    let clock = ManualClock::new(WALL_MS);
                    let router = boot_core(id, 2, &sim, &clock, Rc::new(Mesh::new(senders)));
                    let engine = router.engine().clone();
                    engine
                        .apply_topic(config.clone(), locations, Vec::new())
                        .await
                        .unwrap();
                    if id == 1 {
                        // The owner.
                        let p = engine.topic(&topic).unwrap().owned_partition(0).unwrap();
                        p.append(vec![Bytes::from_static(b"only")]).await.unwrap();
                        phase.store(OWNER_READY, Ordering::SeqCst);
                        // The probe waits in the channel until its asker is gone.
                        wait_for(&phase, ASKER_GONE).await;
                        mesh::serve(&engine, receivers);
                        let deadline = Instant::now() + Duration::from_secs(5);
                        while p.info().await.groups[0].counters[0] == 0 {
                            assert!(Instant::now() < deadline, "the probe was never served");
                            glommio::timer::sleep(Duration::from_millis(1)).await;
                        }
                        phase.store(PROBE_SERVED, Ordering::SeqCst);
                        wait_for(&phase, DONE).await;
                        let info = p.info().await;
                        let c = info.groups[0].counters;
                        Err(([c[0], c[1], c[2]], info.in_flight, clock.now_ms() - 1))
                    } else {
                        // The asker.
                        mesh::serve(&engine, receivers);
                        wait_for(&phase, OWNER_READY).await;
                        {
                            let mut call = Box::pin(router.call(router.core(1), probe(&topic, 42)));
                            assert!(
                                futures_lite::future::poll_once(&mut call).await.is_none(),
                                "no reply can come before the owner serves"
                            );
                        }
                        phase.store(ASKER_GONE, Ordering::SeqCst);
                        wait_for(&phase, PROBE_SERVED).await;
                        let mut found = None;
                        for _ in 0..500 {
                            match router.call(router.core(1), probe(&topic, 42)).await {
                                Ok(Reply::Probed(mut probed)) if !probed.deliveries.is_empty() => {
                                    found = Some(probed.deliveries.remove(0));
                                    break;
                                }
                                Ok(Reply::Probed(_)) => {
                                    glommio::timer::sleep(Duration::from_millis(1)).await
                                }
                                other => panic!("a probe answered {other:?}"),
                            }
                        }
                        let d = found.expect(
                            "the message was never deliverable again: the lease of the probe whose asker went away \
                             was not released",
                        );
                        let ack = Request::Settle(Settle {
                            topic: topic.clone(),
                            topic_id: 42,
                            group: DEFAULT_GROUP.to_string(),
                            partition: d.partition,
                            items: vec![(d.offset, d.nonce)],
                            op: SettleOp::Ack,
                            dead_lettered: false,
                        });
                        let acked = match router.call(router.core(1), ack).await {
                            Ok(Reply::Settled(s)) => s.results == vec![Ok(())],
                            other => panic!("an ack answered {other:?}"),
                        };
                        Ok((
                            d.partition,
                            d.offset,
                            d.delivery_count,
                            d.payload.to_vec(),
                            acked,
                        ))
                    }
                })
                .unwrap()
        })
        .collect();
    let results: Vec<Result<AskerView, OwnerView>> = executors
        .into_iter()
        .map(|e| e.join().expect("an executor panicked"))
        .collect();
    let asker = results.iter().find_map(|r| r.clone().ok()).unwrap();
    let owner = results.iter().find_map(|r| r.clone().err()).unwrap();
    let (partition, offset, delivery_count, payload, acked) = asker;
    assert_eq!((partition, offset, &payload[..]), (0, 0, &b"only"[..]));
    assert_eq!(
        delivery_count, 1,
        "the lease that never reached a consumer is given back uncounted: the first real delivery is delivery 1"
    );
    assert!(acked, "the new lease's handle acks");
    let (counters, in_flight, clock_moved) = owner;
    assert_eq!(
        counters,
        [2, 0, 1],
        "(leases taken, redelivered, acked) on the owner"
    );
    assert_eq!(in_flight, 0);
    assert_eq!(
        clock_moved, 0,
        "released at once, not by the end of the lease"
    );
}

// ---- consumes rotate over the other cores ----

/// One FIFO queue per receiving core, drained by a pump task per core (like `sim::net`, without the choice).
struct Net {
    queues: RefCell<Vec<VecDeque<Envelope>>>,
    arrived: Vec<Event>,
}

struct NetLink(Rc<Net>);

impl CoreLink for NetLink {
    fn send(&self, core: usize, envelope: Envelope) -> bool {
        self.0.queues.borrow_mut()[core].push_back(envelope);
        self.0.arrived[core].notify(1);
        true
    }
}

impl Net {
    /// Empty queues for `cores` cores.
    fn new(cores: usize) -> Rc<Net> {
        Rc::new(Net {
            queues: RefCell::new((0..cores).map(|_| VecDeque::new()).collect()),
            arrived: (0..cores).map(|_| Event::new()).collect(),
        })
    }
}

/// One pump task per core (dropping them stops the pumps).
fn pumps(net: &Rc<Net>, fronts: &[Rc<Front>]) -> Vec<glommio::Task<()>> {
    fronts
        .iter()
        .enumerate()
        .map(|(id, f)| glommio::spawn_local(pump(net.clone(), id, f.engine().clone())))
        .collect()
}

async fn pump(net: Rc<Net>, me: usize, engine: Rc<Engine>) {
    loop {
        let listener = net.arrived[me].listen();
        let next = net.queues.borrow_mut()[me].pop_front();
        match next {
            Some(envelope) => serve_envelope(&engine, envelope),
            None => listener.await,
        }
    }
}

/// Three cores; the topic's two partitions are on cores 1 and 2, each with messages. Consumes of one message from
/// core 0 start from each of them in turn, so both cores' messages come out (a fixed order would drain core 1
/// first).
#[test]
fn consumes_from_a_core_owning_nothing_rotate_over_the_owning_cores() {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async {
            let net = Net::new(3);
            let sim = Sim::new();
            let clock = ManualClock::new(WALL_MS);
            let fronts: Vec<Rc<Front>> = (0..3)
                .map(|id| {
                    Front::new(boot_core(
                        id,
                        3,
                        &sim,
                        &clock,
                        Rc::new(NetLink(net.clone())),
                    ))
                })
                .collect();
            let pumps = pumps(&net, &fronts);
            let topic = name_on(1, 3);
            let mut config = TopicConfig::with_defaults(&topic);
            config.partitions = 2;
            fronts[0].create_topic(config).await.unwrap();
            let t = fronts[0].engine().topic(&topic).unwrap();
            assert_eq!(
                (t.location(0).core, t.location(1).core),
                (1, 2),
                "partition 0 on core 1, partition 1 on core 2"
            );
            let records = (0..12)
                .map(|i| ClientRecord {
                    meta: None,
                    topic_delay: false,
                    body: Bytes::from(format!("m{i}")),
                    target: Target::Partition(i % 2),
                })
                .collect();
            let produced = fronts[0]
                .produce(ProduceParams {
                    topic: topic.clone(),
                    records,
                    batch: true,
                })
                .await
                .unwrap();
            assert!(produced.iter().all(|r| r.is_ok()), "{produced:?}");

            let mut partitions = Vec::new();
            for i in 0..6 {
                let deliveries = fronts[0]
                    .consume(ConsumeParams {
                        topic: topic.clone(),
                        group: DEFAULT_GROUP.to_string(),
                        wait_ms: Some(0),
                        visibility_ms: Some(30_000),
                        max: 1,
                        media: None,
                    })
                    .await
                    .unwrap();
                assert_eq!(deliveries.len(), 1, "consume {i}");
                partitions.push(deliveries[0].partition);
            }
            assert!(
                partitions.contains(&0) && partitions.contains(&1),
                "every consume was served by the same core first: partitions {partitions:?}"
            );
            assert!(
                partitions.windows(2).all(|w| w[0] != w[1]),
                "consecutive consumes start from the other core in turn: partitions {partitions:?}"
            );
            drop(pumps);
        });
}

// ---- wait queues ----

#[test]
fn an_empty_wait_queue_stays_for_the_next_consume_and_goes_with_its_topic() {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async {
            let net = Net::new(1);
            let sim = Sim::new();
            let clock = ManualClock::new(WALL_MS);
            let front = Front::new(boot_core(0, 1, &sim, &clock, Rc::new(NetLink(net))));
            let engine = front.engine().clone();
            front
                .create_topic(TopicConfig::with_defaults("t"))
                .await
                .unwrap();
            // A consumer parks and leaves, as `Parked` does.
            let first = engine.wait_queue("t", "default");
            drop(first.register());
            engine.release_wait_queue("t", "default");
            assert_eq!(engine.wait_queues(), 1, "kept for the next consume");
            assert!(
                Rc::ptr_eq(&first, &engine.wait_queue("t", "default")),
                "the next consume finds the same queue"
            );
            // Of a topic that does not exist: released as before.
            drop(engine.wait_queue("gone", "default").register());
            engine.release_wait_queue("gone", "default");
            assert_eq!(engine.wait_queues(), 1);
            // A queue still holding a consumer is never released.
            let waiter = engine.wait_queue("t", "default").register();
            engine.release_wait_queue("t", "default");
            assert_eq!(engine.wait_queues(), 1);
            drop(waiter);
            front.delete_topic("t".to_string()).await.unwrap();
            assert_eq!(engine.wait_queues(), 0, "gone with its topic");
        });
}

// ---- a dead letter's settle refused by a full channel ----

/// `NetLink`, but it refuses (as a full mesh channel does) the next `refusals` settles, and logs every settle it
/// sees: (the clock's ms, refused).
struct RefusingLink {
    net: Rc<Net>,
    clock: Rc<ManualClock>,
    refusals: std::cell::Cell<u32>,
    settles: RefCell<Vec<(u64, bool)>>,
}

impl CoreLink for RefusingLink {
    fn send(&self, core: usize, envelope: Envelope) -> bool {
        if matches!(envelope.request, Request::Settle(_)) {
            let refused = self.refusals.get() > 0;
            self.settles
                .borrow_mut()
                .push((self.clock.now_ms(), refused));
            if refused {
                self.refusals.set(self.refusals.get() - 1);
                return false;
            }
        }
        NetLink(self.net.clone()).send(core, envelope)
    }
}

/// Core 0 consumes a topic on core 1 whose message is past `max_deliveries`: it copies the message to the
/// dead-letter topic, then settles it on core 1. Settles refused by a full channel are retried once per
/// millisecond, `DEAD_LETTER_SETTLE_RETRIES` times: three refusals, then the fourth try settles it (and it is never
/// delivered again); a channel that stays full gets exactly 1 + 100 tries, and the consume then returns.
#[test]
fn a_dead_letter_settle_refused_by_a_full_channel_is_retried_each_millisecond_up_to_its_limit() {
    use crate::front::consume::DEAD_LETTER_SETTLE_RETRIES;
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async {
            let net = Net::new(2);
            let sim = Sim::new();
            let clock = ManualClock::new(WALL_MS);
            let link = Rc::new(RefusingLink {
                net: net.clone(),
                clock: clock.clone(),
                refusals: std::cell::Cell::new(0),
                settles: RefCell::new(Vec::new()),
            });
            let fronts: Vec<Rc<Front>> = (0..2)
                .map(|id| Front::new(boot_core(id, 2, &sim, &clock, link.clone())))
                .collect();
            let pumps = pumps(&net, &fronts);
            let dlq = format!("dlq-{}", name_on(0, 2));
            fronts[0]
                .create_topic(TopicConfig::with_defaults(&dlq))
                .await
                .unwrap();
            let topic = name_on(1, 2);
            let mut config = TopicConfig::with_defaults(&topic);
            config.max_deliveries = 1;
            config.dead_letter = Some(dlq.clone());
            fronts[0].create_topic(config).await.unwrap();
            assert_eq!(
                fronts[0].engine().topic(&topic).unwrap().location(0).core,
                1
            );

            let consume = |front: Rc<Front>, topic: String| async move {
                front
                    .consume(ConsumeParams {
                        topic,
                        group: DEFAULT_GROUP.to_string(),
                        wait_ms: Some(0),
                        visibility_ms: Some(1_000),
                        max: 1,
                        media: None,
                    })
                    .await
                    .unwrap()
            };
            // Runs a consume of `topic` from core 0 to its end, moving the clock 1 ms whenever it waits.
            let run = |topic: String| {
                let front = fronts[0].clone();
                let clock = clock.clone();
                async move {
                    let task = glommio::spawn_local(consume(front, topic));
                    let done = Rc::new(std::cell::Cell::new(None));
                    let d = done.clone();
                    glommio::spawn_local(async move { d.set(Some(task.await.len())) }).detach();
                    for _ in 0..1_000 {
                        for _ in 0..20 {
                            futures_lite::future::yield_now().await;
                        }
                        if let Some(n) = done.get() {
                            return n;
                        }
                        clock.advance(1);
                    }
                    panic!("the consume did not end within 1,000 ms of retries");
                }
            };
            for (i, refusals) in [(0, 3), (1, u32::MAX)] {
                let produced = fronts[0]
                    .produce(ProduceParams {
                        topic: topic.clone(),
                        records: vec![ClientRecord {
                            meta: None,
                            topic_delay: false,
                            body: Bytes::from(format!("m{i}")),
                            target: Target::Partition(0),
                        }],
                        batch: true,
                    })
                    .await
                    .unwrap();
                assert!(produced.iter().all(|r| r.is_ok()), "{produced:?}");
                assert_eq!(run(topic.clone()).await, 1, "m{i}: first delivery");
                clock.advance(1_001);
                // The second delivery is past max_deliveries: copied to the dead-letter topic, then settled.
                link.refusals.set(refusals);
                link.settles.borrow_mut().clear();
                let t0 = clock.now_ms();
                assert_eq!(
                    run(topic.clone()).await,
                    0,
                    "m{i}: dead-lettered, not delivered"
                );
                link.refusals.set(0);
                let settles = link.settles.borrow().clone();
                if i == 0 {
                    assert_eq!(
                        settles,
                        vec![(t0, true), (t0 + 1, true), (t0 + 2, true), (t0 + 3, false)],
                        "three refusals, retried 1 ms apart, then settled"
                    );
                    clock.advance(2_000);
                    assert_eq!(
                        run(topic.clone()).await,
                        0,
                        "settled: never delivered again"
                    );
                } else {
                    let tries = 1 + DEAD_LETTER_SETTLE_RETRIES as usize;
                    assert_eq!(settles.len(), tries, "{settles:?}");
                    assert!(settles.iter().all(|&(_, refused)| refused));
                    assert_eq!(settles[tries - 1].0, t0 + tries as u64 - 1, "1 ms apart");
                }
            }
            // Both copies reached the dead-letter topic, once each.
            clock.advance(1);
            let mut copied = Vec::new();
            for _ in 0..3 {
                for d in consume(fronts[0].clone(), dlq.clone()).await {
                    copied.push(d.payload);
                }
            }
            assert_eq!(copied, vec![Bytes::from("m0"), Bytes::from("m1")]);
            drop(pumps);
        });
}
