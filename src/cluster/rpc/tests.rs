//! Node RPC end to end: every request and reply through the codec, then a real server and client on loopback
//! sockets of one glommio executor (ports from 0). Nothing waits a fixed time for something to happen: tests wait on
//! conditions with a deadline (`eventually`), or poll a call once to show it did not wait at all.

use super::frame::{self, Hello, Kind, ReplyBody, RequestBody, Welcome};
use super::*;
use crate::cluster::within;
use crate::engine::metrics::{CoreStats, Counts, Latency};
use crate::engine::placement::Location;
use crate::engine::topic::{BackoffKind, TopicConfig};
use crate::engine::{AdminStep, Signal};
use crate::ops::consume::{Probe, Probed};
use crate::ops::produce::{Produce, Produced};
use crate::ops::replay::{Replay, Replayed};
use crate::ops::settle::{Settle, Settled};
use crate::ops::topics::Settings;
use crate::partition::{Delivery, GroupInfo, PartitionError, PartitionInfo, SettleOp};
use crate::storage::journal::JournalStats;
use crate::storage::log::Record;
use bytes::Bytes;
use futures_lite::future::poll_once;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::{Shutdown, SocketAddr};
use std::time::Instant;

/// A tiny deterministic generator (xorshift64*), so failures reproduce.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

// ---- the codec ----

fn config_value() -> TopicConfig {
    let mut c = TopicConfig::with_defaults("orders");
    c.id = 77;
    c.partitions = 6;
    c.redelivery_backoff = BackoffKind::Exponential;
    c.dead_letter = Some("orders.dlq".into());
    c.max_deliveries = 5;
    c.groups = vec!["billing".into(), "audit".into()];
    c.delay_ms = 5_000;
    c.receive_wait_ms = 20_000;
    c.max_message_bytes = 262_144;
    c.created_ms = 1_700_000_000_000;
    c.modified_ms = 1_700_000_100_000;
    c.tags = [("team".to_string(), "payments".to_string())].into();
    c.sqs_policy = r#"{"Version":"2012-10-17"}"#.into();
    c
}

fn info_value() -> PartitionInfo {
    PartitionInfo {
        partition: 2,
        core: 1,
        start_offset: 10,
        end_offset: 99,
        committed: 50,
        durable: 48,
        in_flight: 3,
        acked_ahead: 1,
        corrupt_skipped: 0,
        groups: vec![GroupInfo {
            group: "billing".into(),
            committed: 40,
            durable: 30,
            in_flight: 2,
            delayed: 1,
            acked_ahead: 0,
            corrupt_skipped: 7,
            counters: [1, 2, 3, 4, 5, 6, 7, 8, 9],
            oldest_unsettled_ms: Some(1_700_000_000_000),
        }],
        counters: [11, 12],
        io_counts: (13, 14),
        followers: vec![crate::partition::FollowerInfo {
            learner: false,
            node: 2,
            end: 15,
            lagging: true,
            poisoned: true,
        }],
        commit_offset: Some(97),
        round: Some(12),
    }
}

fn every_request() -> Vec<Request> {
    let topic = || "orders".to_string();
    vec![
        Request::Produce(Produce {
            meta: Vec::new(),
            topic: topic(),
            topic_id: 77,
            partition: 3,
            records: vec![Bytes::from_static(b"\x00\xffbinary"), Bytes::new()],
        }),
        Request::Probe(Probe {
            topic: topic(),
            topic_id: 77,
            group: "billing".into(),
            max: 100,
            visibility_ms: Some(30_000),
            waker: Some(crate::engine::placement::Location { node: 2, core: 1 }),
            max_bytes: usize::MAX,
            taken_any: false,
        }),
        Request::Settle(Settle {
            topic: topic(),
            topic_id: 77,
            group: "billing".into(),
            partition: 1,
            items: vec![(5, 6), (u64::MAX, 0)],
            op: SettleOp::Nack(Some(250)),
            dead_lettered: true,
        }),
        Request::Replay(Replay {
            topic: topic(),
            topic_id: 77,
            partition: 0,
            offset: 123,
            wait_ms: 5000,
        }),
        Request::CreateTopic(Box::new(config_value())),
        Request::ChangeTopic(
            topic(),
            Box::new(Settings {
                partitions: None,
                visibility_ms: Some(10_000),
                max_in_flight: Some(64),
                max_acked_ahead: Some(65),
                retention_ms: Some(3_600_000),
                redelivery_delay_ms: Some(100),
                redelivery_backoff: Some(BackoffKind::Fixed),
                redelivery_delay_max_ms: Some(60_000),
                max_deliveries: Some(3),
                dead_letter: Some(None),
                max_groups: Some(8),
                replicas: None,
                dedup_window_ms: Some(60_000),
                fifo: None,
                content_dedup: Some(true),
                delay_ms: Some(2_000),
                receive_wait_ms: Some(20_000),
                max_message_bytes: Some(4096),
                tags: Some(crate::ops::topics::TagChange::Set(
                    [("team".to_string(), "payments".to_string())].into(),
                )),
                sqs_policy: Some("{}".into()),
                sqs_redrive_allow_policy: None,
            }),
        ),
        Request::DeleteTopic(topic()),
        Request::CreateGroup(topic(), "audit".into(), true),
        Request::DeleteGroup(topic(), "audit".into()),
        Request::Describe(topic()),
        Request::Stats,
        Request::Admin(Box::new(AdminStep::Apply(
            config_value(),
            vec![Location { node: 1, core: 0 }, Location { node: 2, core: 3 }],
            vec![
                crate::engine::placement::PartitionState {
                    placed: Vec::new(),
                    learners: Vec::new(),
                    replicas: vec![1, 2],
                    leader: 1,
                    epoch: 91,
                },
                crate::engine::placement::PartitionState {
                    placed: Vec::new(),
                    learners: Vec::new(),
                    replicas: vec![2, 1],
                    leader: 2,
                    epoch: 92,
                },
            ],
        ))),
        Request::Admin(Box::new(AdminStep::Drop(topic()))),
        Request::Admin(Box::new(AdminStep::Update(config_value()))),
        Request::Admin(Box::new(AdminStep::PrepareGroup {
            topic: topic(),
            topic_id: 77,
            group: "audit".into(),
            latest: false,
        })),
        Request::Signal(Signal::Interest {
            topic: topic(),
            group: "billing".into(),
            from: crate::engine::placement::Location { node: 1, core: 1 },
        }),
        Request::Signal(Signal::NoInterest {
            topic: topic(),
            group: "billing".into(),
            from: crate::engine::placement::Location { node: 1, core: 1 },
        }),
        Request::Signal(Signal::Wake {
            topic: topic(),
            group: "billing".into(),
            n: 4,
        }),
        Request::LookupTopic(topic(), true),
        Request::GiveBack(crate::ops::consume::GiveBack {
            topic: topic(),
            group: "billing".into(),
            leases: vec![(1, 2, 3), (4, 5, 6)],
        }),
        Request::Partitions(topic()),
        Request::Replicate(crate::ops::replicate::Replicate {
            topic: topic(),
            topic_id: 77,
            partition: 1,
            leader: 2,
            epoch: 91,
            segment_base: 4096,
            position: 300,
            first_offset: 4100,
            count: 2,
            frames: Bytes::from_static(&[0xff, 0, 7, 0x80]),
            epochs: vec![
                crate::storage::epoch_history::EpochStart {
                    epoch: 80,
                    start: 4000,
                },
                crate::storage::epoch_history::EpochStart {
                    epoch: 91,
                    start: 4101,
                },
            ],
            hold: 4100,
            promote: true,
            nonces: 0,
            restart: false,
        }),
        Request::ReplicateFrontiers(crate::ops::replicate::ReplicateFrontiers {
            topic: topic(),
            topic_id: 77,
            partition: 1,
            leader: 2,
            epoch: 91,
            marks: vec![
                crate::ops::replicate::FrontierMark {
                    group: "billing".into(),
                    committed: 4100,
                    start: false,
                    group_id: 0,
                    acked: vec![(4102, 4110), (4200, 4201)],
                },
                crate::ops::replicate::FrontierMark {
                    group: "audit".into(),
                    committed: 0,
                    start: true,
                    group_id: 0,
                    acked: Vec::new(),
                },
            ],
        }),
        Request::BeginEpoch(crate::ops::replicate::BeginEpoch {
            topic: topic(),
            topic_id: 77,
            partition: 1,
            leader: 2,
            epoch: 93,
            nonces: 0,
        }),
        Request::MoveLeader(crate::ops::replicate::MoveLeader {
            topic: topic(),
            topic_id: 77,
            partition: 1,
            epoch: 95,
            leader: 3,
            replicas: vec![3, 1, 4],
            learners: vec![4],
        }),
        Request::DrainNode("n3".into(), crate::engine::cluster::DrainAction::Remove),
        Request::Purge(topic(), "audit".into()),
    ]
}

fn every_reply() -> Vec<ReplyBody> {
    let mut latency = Latency::default();
    for us in [3, 120, 2_000_000, 500_000_000] {
        latency.record(us);
    }
    let mut records = Counts::default();
    records.record(17);
    let stats = CoreStats {
        core: 1,
        latency: [
            latency.clone(),
            Latency::default(),
            latency.clone(),
            Latency::default(),
        ],
        frontier_lag: Latency::default(),
        connections_open: 2,
        connections_refused: 3,
        connections_timed_out: 4,
        tls_handshakes_failed: 6,
        tls_handshakes_evicted: 7,
        mesh_full: 5,
        journal_wait: latency.clone(),
        journal_records: records,
        stages: [
            Latency::default(),
            latency.clone(),
            Latency::default(),
            Latency::default(),
            latency.clone(),
            latency,
        ],
        journal: Some(JournalStats {
            syncs: 1,
            passes: 2,
            entries: 3,
            records: 4,
            bytes: 5,
            checkpoints: 6,
            ..JournalStats::default()
        }),
        partitions: vec![("orders".into(), info_value())],
        extra: vec![],
    };
    vec![
        Ok(Reply::Produced(Produced {
            first_offset: 42,
            offsets: vec![42, 7],
        })),
        Ok(Reply::Probed(Probed {
            deliveries: vec![Delivery {
                meta: None,
                partition: 2,
                offset: 9,
                nonce: 1234,
                delivery_count: 2,
                expires_at_ms: 1_700_000_000_000,
                sent_ms: 1_699_999_999_000,
                payload: Bytes::from_static(b"payload"),
            }],
            at_cap: true,
            unavailable: false,
            why: Some("partition 2: its fencing round is under way".into()),
            none_owned: true,
            budget_spent: true,
            retry_in_ms: Some(1125),
        })),
        Ok(Reply::Settled(Settled {
            results: vec![
                Ok(()),
                Err(PartitionError::LeaseGone),
                Err(PartitionError::OutOfRetention { start: 3 }),
                Err(PartitionError::Unavailable("disk".into())),
            ],
        })),
        Ok(Reply::Replayed(Replayed {
            record: Some(Record {
                meta: None,
                offset: 5,
                timestamp_ms: 1_700_000_000_000,
                payload: Bytes::from_static(b"hi"),
            }),
        })),
        Ok(Reply::Replayed(Replayed { record: None })),
        Ok(Reply::Created(true, Box::new(config_value()))),
        Ok(Reply::Changed(Box::new(config_value()))),
        Ok(Reply::GroupCreated(false)),
        Ok(Reply::Described(vec![info_value(), info_value()])),
        Ok(Reply::Stats(Box::new(stats))),
        Ok(Reply::Done),
        Ok(Reply::Partitions(Some((
            77,
            vec![crate::engine::placement::PartitionState {
                placed: Vec::new(),
                learners: Vec::new(),
                replicas: vec![2, 0, 1],
                leader: 0,
                epoch: 91,
            }],
        )))),
        Ok(Reply::Partitions(None)),
        Ok(Reply::Replicated(crate::ops::replicate::Replicated {
            end: 4102,
            applied: false,
            refused: true,
            learner: true,
            poisoned: true,
        })),
        Ok(Reply::Began(crate::ops::replicate::Began {
            end: 4102,
            last_epoch: 91,
            frontiers: vec![crate::ops::replicate::FrontierMark {
                group: "billing".into(),
                committed: 4000,
                start: false,
                group_id: 0,
                acked: vec![(4001, 4002)],
            }],
            learner: true,
            nonces: 0,
            floor: 89,
        })),
        Ok(Reply::Purged(12)),
        Err(OpError::MessageTooLarge { limit: 1 << 20 }),
        Err(OpError::PartitionUnavailable("node 3".into())),
        Err(OpError::Engine(EngineError::TopicExists {
            topic: "orders".into(),
            partitions: 4,
        })),
        Err(OpError::Engine(EngineError::Partition(
            PartitionError::Corrupt {
                partition: 1,
                offset: 2,
            },
        ))),
    ]
}

/// Which variant a request is: no wildcard, so a new variant fails to compile here until the test covers it.
fn request_variant(r: &Request) -> usize {
    match r {
        Request::Produce(_) => 0,
        Request::Probe(_) => 1,
        Request::Settle(_) => 2,
        Request::Replay(_) => 3,
        Request::CreateTopic(_) => 4,
        Request::ChangeTopic(..) => 5,
        Request::DeleteTopic(_) => 6,
        Request::CreateGroup(..) => 7,
        Request::DeleteGroup(..) => 8,
        Request::Describe(_) => 9,
        Request::Stats => 10,
        Request::Admin(_) => 11,
        Request::Signal(_) => 12,
        Request::LookupTopic(..) => 13,
        Request::GiveBack(_) => 14,
        Request::Partitions(_) => 15,
        Request::Replicate(_) => 16,
        Request::ReplicateFrontiers(_) => 17,
        Request::BeginEpoch(_) => 18,
        Request::MoveLeader(_) => 19,
        Request::DrainNode(..) => 20,
        Request::Purge(..) => 21,
    }
}

fn reply_variant(r: &Reply) -> usize {
    match r {
        Reply::Produced(_) => 0,
        Reply::Probed(_) => 1,
        Reply::Settled(_) => 2,
        Reply::Replayed(_) => 3,
        Reply::Created(..) => 4,
        Reply::Changed(_) => 5,
        Reply::GroupCreated(_) => 6,
        Reply::Described(_) => 7,
        Reply::Stats(_) => 8,
        Reply::Done => 9,
        Reply::Partitions(_) => 10,
        Reply::Replicated(_) => 11,
        Reply::Began(_) => 12,
        Reply::Purged(_) => 13,
    }
}

#[test]
fn every_request_and_reply_variant_round_trips_through_frames() {
    let requests = every_request();
    let mut seen: Vec<usize> = requests.iter().map(request_variant).collect();
    seen.dedup();
    assert_eq!(seen, (0..22).collect::<Vec<_>>(), "every request variant");
    let replies = every_reply();
    let mut seen: Vec<usize> = replies
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(reply_variant)
        .collect();
    seen.dedup();
    assert_eq!(seen, (0..14).collect::<Vec<_>>(), "every reply variant");

    let mut wire = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        frame::encode(
            Kind::Request,
            i as u64,
            &(i as u32, request),
            1 << 20,
            &mut wire,
        )
        .unwrap();
    }
    for (i, reply) in replies.iter().enumerate() {
        frame::encode(Kind::Reply, i as u64, reply, 1 << 20, &mut wire).unwrap();
    }
    let mut reader = frame::FrameReader::new(1 << 20);
    let mut stream = futures_lite::io::Cursor::new(wire);
    futures_lite::future::block_on(async {
        for (i, request) in requests.iter().enumerate() {
            let f = reader.next(&mut stream).await.unwrap().unwrap();
            assert_eq!((f.kind, f.id), (Kind::Request, i as u64));
            let (core, back): RequestBody = frame::decode(&f.body).unwrap();
            assert_eq!(core, i as u32);
            assert_eq!(format!("{back:?}"), format!("{request:?}"));
        }
        for (i, reply) in replies.iter().enumerate() {
            let f = reader.next(&mut stream).await.unwrap().unwrap();
            assert_eq!((f.kind, f.id), (Kind::Reply, i as u64));
            let back: ReplyBody = frame::decode(&f.body).unwrap();
            // Debug shows every field, the ones describe's JSON leaves out included.
            assert_eq!(format!("{back:?}"), format!("{reply:?}"));
        }
        assert!(reader.next(&mut stream).await.unwrap().is_none());
    });
}

// ---- over sockets ----

const TOKEN: &str = "s3cret";

fn on_executor(test: impl Future<Output = ()>) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("an executor")
        .run(test);
}

/// Waits until `cond` holds, checking every millisecond; fails the test after 10 s.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
}

fn config(node: u32) -> RpcConfig {
    RpcConfig {
        node,
        token: Some(TOKEN.into()),
        call_timeout: Duration::from_secs(10),
        reconnect_backoff_min: Duration::from_millis(5),
        reconnect_backoff_max: Duration::from_millis(50),
        ..RpcConfig::default()
    }
}

/// A latch the handlers of a test wait on.
#[derive(Default)]
struct Gate {
    open: Cell<bool>,
    event: event_listener::Event,
}

impl Gate {
    fn open(&self) {
        self.open.set(true);
        self.event.notify(usize::MAX);
    }

    async fn passed(&self) {
        until_set(&self.open, &self.event).await;
    }
}

/// A handler for tests: `Replay` is answered with a record naming the offset and the core it was sent to (after
/// `gate` opens), `Probe` with one delivery (after `gate` opens), `Stats` never, `DeleteTopic` with an error, a
/// signal by logging its `n`, the rest with `Done`.
fn test_handler(gate: Rc<Gate>, signals: Rc<RefCell<Vec<usize>>>) -> Handler {
    Rc::new(move |_peer, core, request| {
        let gate = gate.clone();
        let signals = signals.clone();
        Box::pin(async move {
            Ok(match request {
                Request::Replay(r) => {
                    gate.passed().await;
                    Reply::Replayed(Replayed {
                        record: Some(Record {
                            meta: None,
                            offset: r.offset,
                            timestamp_ms: core as u64,
                            payload: Bytes::from(r.topic),
                        }),
                    })
                }
                Request::Probe(_) => {
                    gate.passed().await;
                    Reply::Probed(Probed {
                        deliveries: vec![Delivery {
                            meta: None,
                            partition: 0,
                            offset: 5,
                            nonce: 1,
                            delivery_count: 1,
                            expires_at_ms: 0,
                            sent_ms: 0,
                            payload: Bytes::from_static(b"leased"),
                        }],
                        ..Probed::default()
                    })
                }
                Request::Stats => futures_lite::future::pending().await,
                Request::DeleteTopic(t) => return Err(EngineError::TopicNotFound(t).into()),
                Request::Signal(Signal::Wake { n, .. }) => {
                    signals.borrow_mut().push(n);
                    Reply::Done
                }
                _ => Reply::Done,
            })
        })
    })
}

/// A started server of node 1 with `test_handler`, its gate (open unless `gated`), and its signal log.
fn server_with(
    config: RpcConfig,
    addr: &str,
    gated: bool,
) -> (RpcServer, Rc<Gate>, Rc<RefCell<Vec<usize>>>) {
    let gate = Rc::new(Gate::default());
    if !gated {
        gate.open();
    }
    let signals = Rc::new(RefCell::new(Vec::new()));
    let server = RpcServer::bind(addr, config, test_handler(gate.clone(), signals.clone()))
        .expect("bind a loopback port");
    server.start();
    (server, gate, signals)
}

fn replay(offset: u64) -> Request {
    Request::Replay(Replay {
        topic: "t".into(),
        topic_id: 1,
        partition: 0,
        offset,
        wait_ms: 0,
    })
}

fn probe() -> Request {
    Request::Probe(Probe {
        topic: "t".into(),
        topic_id: 1,
        group: "g".into(),
        max: 1,
        visibility_ms: None,
        waker: None,
        max_bytes: usize::MAX,
        taken_any: false,
    })
}

fn replayed_offset(reply: OpResult<Reply>) -> (u64, u64) {
    match reply {
        Ok(Reply::Replayed(Replayed {
            record: Some(record),
        })) => (record.offset, record.timestamp_ms),
        other => panic!("not a replayed record: {other:?}"),
    }
}

fn is_overloaded(r: &OpResult<Reply>) -> bool {
    matches!(r, Err(OpError::Engine(EngineError::Overloaded)))
}

fn is_unavailable(r: &OpResult<Reply>, text: &str) -> bool {
    matches!(r, Err(OpError::PartitionUnavailable(why)) if why.contains(text))
}

#[test]
fn calls_reach_the_named_core_and_errors_come_back_as_they_were() {
    on_executor(async {
        let (server, _, _) = server_with(config(1), "127.0.0.1:0", false);
        let client = RpcClient::new(server.local_addr().to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(3, replay(9)).await), (9, 3));
        assert_eq!(replayed_offset(client.call(0, replay(10)).await), (10, 0));
        assert_eq!(
            client
                .call(0, Request::DeleteTopic("gone".into()))
                .await
                .unwrap_err(),
            OpError::Engine(EngineError::TopicNotFound("gone".into()))
        );
        assert!(client.is_connected());
        let s = client.stats();
        assert_eq!((s.sent, s.refused, s.timeouts, s.reconnects), (3, 0, 0, 0));
        assert_eq!(server.stats().requests, 3);
    });
}

#[test]
fn a_hundred_pipelined_calls_share_one_connection_and_are_answered_out_of_order() {
    on_executor(async {
        // The handler holds every request until all 100 are running at once, then answers them last to first.
        let arrived = Rc::new(Cell::new(0u64));
        let turn = Rc::new(Cell::new(99i64));
        let moved = Rc::new(event_listener::Event::new());
        let answered = Rc::new(RefCell::new(Vec::new()));
        let handler: Handler = {
            let (arrived, turn, moved, answered) = (
                arrived.clone(),
                turn.clone(),
                moved.clone(),
                answered.clone(),
            );
            Rc::new(move |_peer, core, request| {
                let (arrived, turn, moved, answered) = (
                    arrived.clone(),
                    turn.clone(),
                    moved.clone(),
                    answered.clone(),
                );
                Box::pin(async move {
                    let Request::Replay(r) = request else {
                        return Ok(Reply::Done);
                    };
                    arrived.set(arrived.get() + 1);
                    moved.notify(usize::MAX);
                    while arrived.get() < 100 || turn.get() != r.offset as i64 {
                        let l = moved.listen();
                        if arrived.get() >= 100 && turn.get() == r.offset as i64 {
                            break;
                        }
                        l.await;
                    }
                    answered.borrow_mut().push(r.offset);
                    turn.set(turn.get() - 1);
                    moved.notify(usize::MAX);
                    Ok(Reply::Replayed(Replayed {
                        record: Some(Record {
                            meta: None,
                            offset: r.offset,
                            timestamp_ms: core as u64,
                            payload: Bytes::new(),
                        }),
                    }))
                })
            })
        };
        let server = RpcServer::bind("127.0.0.1:0", config(1), handler).unwrap();
        server.start();
        let client = Rc::new(RpcClient::new(
            server.local_addr().to_string(),
            1,
            config(2),
        ));
        let calls: Vec<_> = (0..100u64)
            .map(|i| {
                let client = client.clone();
                glommio::spawn_local(async move { client.call(i as u32 % 4, replay(i)).await })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(replayed_offset(call.await), (i as u64, i as u64 % 4));
        }
        assert_eq!(*answered.borrow(), (0..100).rev().collect::<Vec<u64>>());
        assert_eq!(server.stats().connections_accepted, 1);
        assert_eq!(client.stats().sent, 100);
    });
}

#[test]
fn a_full_outstanding_queue_refuses_at_once_and_recovers() {
    on_executor(async {
        let (server, gate, _) = server_with(config(1), "127.0.0.1:0", true);
        let client = Rc::new(RpcClient::new(
            server.local_addr().to_string(),
            1,
            RpcConfig {
                max_outstanding: 4,
                ..config(2)
            },
        ));
        let calls: Vec<_> = (0..4u64)
            .map(|i| {
                let client = client.clone();
                glommio::spawn_local(async move { client.call(0, replay(i)).await })
            })
            .collect();
        eventually("the server runs all four", || server.stats().requests == 4).await;
        let refused = poll_once(client.call(0, replay(4))).await;
        assert!(
            matches!(&refused, Some(r) if is_overloaded(r)),
            "the fifth call is refused without waiting: {refused:?}"
        );
        assert_eq!(client.stats().refused, 1);
        gate.open();
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(replayed_offset(call.await).0, i as u64);
        }
        assert_eq!(replayed_offset(client.call(0, replay(5)).await).0, 5);
    });
}

#[test]
fn a_call_to_a_handler_that_never_answers_times_out_and_the_connection_goes_on() {
    on_executor(async {
        let (server, _, _) = server_with(config(1), "127.0.0.1:0", false);
        let client = RpcClient::new(server.local_addr().to_string(), 1, config(2));
        let r = client
            .call_within(0, Request::Stats, Duration::from_millis(30))
            .await;
        assert!(is_unavailable(&r, "did not answer within 30 ms"), "{r:?}");
        assert_eq!(client.stats().timeouts, 1);
        assert_eq!(replayed_offset(client.call(1, replay(1)).await), (1, 1));
        assert_eq!(server.stats().connections_accepted, 1);
    });
}

#[test]
fn a_late_reply_with_leases_goes_to_the_clients_undeliverable_hook() {
    on_executor(async {
        let (server, gate, _) = server_with(config(1), "127.0.0.1:0", true);
        let client = RpcClient::new(server.local_addr().to_string(), 1, config(2));
        let given_back = Rc::new(RefCell::new(Vec::new()));
        let log = given_back.clone();
        client.on_undeliverable(Rc::new(move |u: Undelivered| log.borrow_mut().push(u)));
        let r = client
            .call_within(2, probe(), Duration::from_millis(20))
            .await;
        assert!(is_unavailable(&r, "did not answer"), "{r:?}");
        gate.open();
        eventually("the late reply is handed to the hook", || {
            given_back.borrow().len() == 1
        })
        .await;
        let u = given_back.borrow_mut().remove(0);
        assert_eq!(u.core, 2);
        assert_eq!(u.probe, Some(("t".to_string(), "g".to_string())));
        assert!(
            matches!(u.reply, Reply::Probed(p) if p.deliveries.len() == 1 && p.deliveries[0].offset == 5)
        );
        assert_eq!(client.stats().late_replies, 1);
    });
}

#[test]
fn the_server_answers_overloaded_beyond_its_in_flight_bound() {
    on_executor(async {
        let server_config = RpcConfig {
            max_in_flight_per_connection: 2,
            ..config(1)
        };
        let (server, gate, _) = server_with(server_config, "127.0.0.1:0", true);
        let client = Rc::new(RpcClient::new(
            server.local_addr().to_string(),
            1,
            config(2),
        ));
        let calls: Vec<_> = (0..3u64)
            .map(|i| {
                let client = client.clone();
                glommio::spawn_local(async move { client.call(0, replay(i)).await })
            })
            .collect();
        eventually("the third request is refused", || {
            server.stats().overloaded == 1
        })
        .await;
        gate.open();
        let mut results = Vec::new();
        for call in calls {
            results.push(call.await);
        }
        assert_eq!(results.iter().filter(|r| is_overloaded(r)).count(), 1);
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 2);
        assert_eq!(server.stats().requests, 2);
    });
}

#[test]
fn a_restarted_server_is_reconnected_and_calls_fail_fast_meanwhile() {
    on_executor(async {
        let (server, _, _) = server_with(config(1), "127.0.0.1:0", false);
        let addr: SocketAddr = server.local_addr();
        let client = RpcClient::new(addr.to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(0, replay(1)).await).0, 1);

        server.stop().await;
        eventually("the client sees the connection go", || {
            !client.is_connected()
        })
        .await;
        let meanwhile = poll_once(client.call(0, replay(2))).await;
        assert!(
            matches!(&meanwhile, Some(r) if is_unavailable(r, "unreachable")),
            "a call during the outage fails without waiting: {meanwhile:?}"
        );

        let (_again, _, _) = server_with(config(1), &addr.to_string(), false);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match client.call(0, replay(3)).await {
                Ok(reply) => {
                    assert_eq!(replayed_offset(Ok(reply)).0, 3);
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "never reconnected: {e}"),
            }
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        let s = client.stats();
        assert_eq!(s.reconnects, 1);
        assert!(s.unreachable >= 1);
    });
}

/// A raw connection that sends `bytes` (then, if `half_close`, ends its side) and reads until the server closes;
/// what it read. Fails the test if the server keeps the connection open for 10 s.
async fn send_raw(addr: SocketAddr, bytes: &[u8], half_close: bool) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // A server that refuses the connection may have reset it already.
    let _ = stream.write_all(bytes).await;
    if half_close {
        let _ = stream.shutdown(Shutdown::Write).await;
    }
    let mut got = Vec::new();
    let read = within(Duration::from_secs(10), stream.read_to_end(&mut got)).await;
    assert!(read.is_some(), "the server did not close the connection");
    got
}

/// A raw connection that sends `bytes` and reads until `n` frames came back; those frames.
async fn exchange(addr: SocketAddr, bytes: &[u8], n: usize) -> Vec<frame::Frame> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    let mut reader = frame::FrameReader::new(1 << 20);
    let mut frames = Vec::new();
    while frames.len() < n {
        let next = within(Duration::from_secs(10), reader.next(&mut stream)).await;
        frames.push(
            next.expect("an answer in time")
                .expect("a frame")
                .expect("open"),
        );
    }
    frames
}

fn hello_frame(token: &str, version: u8) -> Vec<u8> {
    let mut out = Vec::new();
    let hello = Hello {
        version: version as u32,
        node: 2,
        token: token.into(),
    };
    frame::encode(Kind::Handshake, 0, &hello, 1 << 20, &mut out).unwrap();
    out[4] = version;
    out
}

/// The frames in `bytes` (which must hold whole frames only).
fn frames_in(bytes: Vec<u8>) -> Vec<frame::Frame> {
    futures_lite::future::block_on(async {
        let mut stream = futures_lite::io::Cursor::new(bytes);
        let mut reader = frame::FrameReader::new(1 << 20);
        let mut frames = Vec::new();
        while let Some(f) = reader.next(&mut stream).await.expect("whole frames") {
            frames.push(f);
        }
        frames
    })
}

fn welcome(f: &frame::Frame) -> Welcome {
    assert_eq!(f.kind, Kind::Handshake);
    frame::decode(&f.body).expect("a welcome")
}

#[test]
fn a_bad_token_a_foreign_version_or_the_wrong_node_is_refused() {
    on_executor(async {
        let (server, _, _) = server_with(config(1), "127.0.0.1:0", false);
        let addr = server.local_addr();

        let intruder = RpcClient::new(
            addr.to_string(),
            1,
            RpcConfig {
                token: Some("guess".into()),
                ..config(2)
            },
        );
        let r = intruder.call(0, replay(1)).await;
        assert!(is_unavailable(&r, "bad cluster token"), "{r:?}");
        assert!(intruder.stats().connect_failures >= 1);
        drop(intruder);

        let lost = RpcClient::new(addr.to_string(), 9, config(2));
        let r = lost.call(0, replay(1)).await;
        assert!(is_unavailable(&r, "not node 9"), "{r:?}");
        drop(lost);

        // A raw hello of a later version, or of version 1 (whose topic settings had no `group_ids`): a refusal
        // naming the versions, then the connection closes.
        for foreign in [frame::VERSION + 1, 1] {
            let got = frames_in(send_raw(addr, &hello_frame(TOKEN, foreign), false).await);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].version, frame::VERSION);
            let named = format!("version {foreign}");
            assert!(
                matches!(welcome(&got[0]), Welcome::Refused { reason } if reason.contains(&named)),
                "{:?}",
                welcome(&got[0])
            );
        }
        // And the right token on a raw connection is welcomed by node 1.
        let got = frames_in(send_raw(addr, &hello_frame(TOKEN, frame::VERSION), true).await);
        assert_eq!(welcome(&got[0]), Welcome::Accepted { node: 1 });

        eventually("every refused handshake is counted", || {
            server.stats().handshakes_failed >= 3
        })
        .await;
    });
}

#[test]
fn garbage_closes_its_connection_and_the_server_keeps_serving() {
    on_executor(async {
        let server_config = RpcConfig {
            handshake_timeout: Duration::from_millis(100),
            ..config(1)
        };
        let (server, _, _) = server_with(server_config, "127.0.0.1:0", false);
        let addr = server.local_addr();
        let mut rng = Rng(0x5EED);
        let hello = hello_frame(TOKEN, frame::VERSION);
        let mut request = Vec::new();
        frame::encode(Kind::Request, 1, &(0u32, &replay(1)), 1 << 20, &mut request).unwrap();

        // Random bytes instead of a hello.
        assert!(send_raw(addr, &rng.bytes(300), true).await.is_empty());
        // Silence: closed once the handshake timeout passes.
        assert!(send_raw(addr, &[], false).await.is_empty());
        // After a good hello: random bytes, a bad CRC, a frame cut short, a reply where a request belongs.
        let mut bad_crc = request.clone();
        *bad_crc.last_mut().unwrap() ^= 1;
        let mut reply = Vec::new();
        frame::encode(
            Kind::Reply,
            1,
            &Ok::<Reply, OpError>(Reply::Done),
            1 << 20,
            &mut reply,
        )
        .unwrap();
        for garbage in [
            rng.bytes(300),
            bad_crc,
            request[..request.len() - 3].to_vec(),
            reply,
        ] {
            let mut bytes = hello.clone();
            bytes.extend_from_slice(&garbage);
            let got = frames_in(send_raw(addr, &bytes, true).await);
            assert_eq!(got.len(), 1, "the welcome only");
            assert_eq!(welcome(&got[0]), Welcome::Accepted { node: 1 });
        }
        // A well-framed request whose body does not decode is answered with an error; the connection stays.
        let mut undecodable = hello.clone();
        frame::encode(Kind::Request, 7, &(0u32, 99u8), 1 << 20, &mut undecodable).unwrap();
        undecodable.extend_from_slice(&request);
        let got = exchange(addr, &undecodable, 3).await;
        assert_eq!(got.len(), 3, "welcome, error, answer");
        let error: ReplyBody = frame::decode(&got[1].body).unwrap();
        assert_eq!(got[1].id, 7);
        assert!(
            matches!(error, Err(OpError::InvalidParameter(_))),
            "{error:?}"
        );
        let answer: ReplyBody = frame::decode(&got[2].body).unwrap();
        assert_eq!((got[2].id, replayed_offset(answer).0), (1, 1));

        let s = server.stats();
        assert_eq!(s.bad_frames, 4);
        assert_eq!(s.handshakes_failed, 2);
        let client = RpcClient::new(addr.to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(0, replay(8)).await).0, 8);
    });
}

#[test]
fn one_way_requests_are_applied_in_arrival_order() {
    on_executor(async {
        let (server, _, signals) = server_with(config(1), "127.0.0.1:0", false);
        let client = RpcClient::new(server.local_addr().to_string(), 1, config(2));
        for n in 0..50 {
            let wake = Signal::Wake {
                topic: "t".into(),
                group: "g".into(),
                n,
            };
            client.send_one_way(1, Request::Signal(wake)).unwrap();
        }
        eventually("every signal is applied", || signals.borrow().len() == 50).await;
        assert_eq!(*signals.borrow(), (0..50).collect::<Vec<_>>());
    });
}

#[test]
fn connections_beyond_the_cap_are_closed_at_once() {
    on_executor(async {
        let server_config = RpcConfig {
            max_connections: 1,
            ..config(1)
        };
        let (server, _, _) = server_with(server_config, "127.0.0.1:0", false);
        let client = RpcClient::new(server.local_addr().to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(0, replay(1)).await).0, 1);
        let got = send_raw(
            server.local_addr(),
            &hello_frame(TOKEN, frame::VERSION),
            false,
        )
        .await;
        assert!(got.is_empty(), "not even a welcome");
        assert_eq!(server.stats().connections_refused, 1);
        assert_eq!(replayed_offset(client.call(0, replay(2)).await).0, 2);
    });
}

/// A server whose handshakes never time out during a test, so only the caps can close a silent connection.
fn patient_config() -> RpcConfig {
    RpcConfig {
        handshake_timeout: Duration::from_secs(600),
        ..config(1)
    }
}

#[test]
fn a_hello_announcing_60_mib_is_refused_from_its_header_without_reading_the_body() {
    on_executor(async {
        let (server, _, _) = server_with(patient_config(), "127.0.0.1:0", false);
        let announced = 60usize << 20;
        let mut header = hello_frame(TOKEN, frame::VERSION)[..frame::HEADER_LEN].to_vec();
        header[16..20].copy_from_slice(&(announced as u32).to_le_bytes());
        let mut stream = TcpStream::connect(server.local_addr())
            .await
            .expect("connect");
        let chunk = vec![0u8; 64 << 10];
        let mut sent = 0;
        let streamed = within(Duration::from_secs(10), async {
            stream.write_all(&header).await?;
            while sent < announced {
                stream.write_all(&chunk).await?;
                sent += chunk.len();
            }
            Ok::<(), std::io::Error>(())
        })
        .await;
        assert!(
            matches!(streamed, Some(Err(_))),
            "the server took {sent} bytes of the announced {announced} without closing: {streamed:?}"
        );
        let mut byte = [0u8; 1];
        let read = within(Duration::from_secs(10), stream.read(&mut byte)).await;
        assert!(
            matches!(read, Some(Ok(0)) | Some(Err(_))),
            "the connection is closed, nothing answered: {read:?}"
        );
        eventually("the refused hello is counted", || {
            server.stats().handshakes_failed == 1
        })
        .await;
        let most = (frame::HEADER_LEN + RpcConfig::default().max_hello_bytes) as u64;
        let read_bytes = server.stats().handshake_read_bytes;
        assert!(
            read_bytes <= most,
            "the server read {read_bytes} bytes of the hello ({sent} were sent)"
        );
        let client = RpcClient::new(server.local_addr().to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(0, replay(1)).await).0, 1);
    });
}

#[test]
fn three_hundred_silent_connections_do_not_keep_a_peer_out() {
    on_executor(async {
        let (server, _, _) = server_with(patient_config(), "127.0.0.1:0", false);
        let addr = server.local_addr();
        let mut silent = Vec::new();
        for _ in 0..300 {
            silent.push(TcpStream::connect(addr).await.expect("connect"));
        }
        eventually("the server has taken all 300", || {
            let s = server.stats();
            s.connections_accepted + s.connections_refused == 300
        })
        .await;

        let client = RpcClient::new(addr.to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(0, replay(1)).await).0, 1);
        let s = server.stats();
        let cap = RpcConfig::default().max_handshaking as u64;
        assert_eq!(s.connections_refused, 0);
        // The peer was the 301st: every arrival beyond the cap evicted the oldest silent one.
        assert_eq!(s.handshakes_evicted, 301 - cap);
        // The oldest are closed by the server; the newest still wait (open, not evicted).
        let mut byte = [0u8; 1];
        let oldest = within(Duration::from_secs(10), silent[0].read(&mut byte)).await;
        assert!(matches!(oldest, Some(Ok(0)) | Some(Err(_))), "{oldest:?}");
        let newest = poll_once(silent[299].read(&mut byte)).await;
        assert!(newest.is_none(), "{newest:?}");
        eventually(
            "the evicted are closed: the peer and the newest silent ones are left",
            || server.stats().connections_open == cap,
        )
        .await;
    });
}

#[test]
fn a_request_sent_with_the_hello_is_served_and_a_wrong_token_is_still_refused() {
    on_executor(async {
        let (server, _, _) = server_with(patient_config(), "127.0.0.1:0", false);
        let addr = server.local_addr();

        let got = frames_in(send_raw(addr, &hello_frame("guess", frame::VERSION), false).await);
        assert_eq!(got.len(), 1);
        assert!(
            matches!(welcome(&got[0]), Welcome::Refused { reason } if reason.contains("bad cluster token")),
            "{:?}",
            welcome(&got[0])
        );
        eventually("the refusal is counted", || {
            server.stats().handshakes_failed == 1
        })
        .await;

        // A good hello and, in the same write, a request larger than any hello (10 KiB): the hello is read under
        // its own limit, the request after it under the full one, none of its bytes lost in between.
        let before = server.stats().handshake_read_bytes;
        let topic = "t".repeat(10 << 10);
        let request = Request::Replay(Replay {
            topic: topic.clone(),
            topic_id: 1,
            partition: 0,
            offset: 42,
            wait_ms: 0,
        });
        let mut bytes = hello_frame(TOKEN, frame::VERSION);
        frame::encode(Kind::Request, 5, &(3u32, &request), 1 << 20, &mut bytes).unwrap();
        let got = exchange(addr, &bytes, 2).await;
        assert_eq!(welcome(&got[0]), Welcome::Accepted { node: 1 });
        assert_eq!((got[1].kind, got[1].id), (Kind::Reply, 5));
        match frame::decode::<ReplyBody>(&got[1].body).unwrap() {
            Ok(Reply::Replayed(Replayed {
                record: Some(record),
            })) => {
                assert_eq!((record.offset, record.timestamp_ms), (42, 3));
                assert_eq!(record.payload, Bytes::from(topic));
            }
            other => panic!("not the replayed record: {other:?}"),
        }
        let read_bytes = server.stats().handshake_read_bytes - before;
        let most = (frame::HEADER_LEN + RpcConfig::default().max_hello_bytes) as u64;
        assert!(
            read_bytes <= most,
            "{read_bytes} bytes read before the hello was accepted"
        );

        let client = RpcClient::new(addr.to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(0, replay(7)).await).0, 7);
        let s = server.stats();
        assert_eq!((s.handshakes_failed, s.requests), (1, 2));
    });
}

#[test]
fn a_peer_cap_that_fills_during_a_handshake_refuses_it_with_the_reason() {
    on_executor(async {
        let server_config = RpcConfig {
            max_connections: 1,
            ..patient_config()
        };
        let (server, _, _) = server_with(server_config, "127.0.0.1:0", false);
        let addr = server.local_addr();
        // Connected while there is room for a peer, then silent while a real peer takes the only place.
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        eventually("the slow connection is accepted", || {
            server.stats().connections_accepted == 1
        })
        .await;
        let client = RpcClient::new(addr.to_string(), 1, config(2));
        assert_eq!(replayed_offset(client.call(0, replay(1)).await).0, 1);

        slow.write_all(&hello_frame(TOKEN, frame::VERSION))
            .await
            .expect("write");
        let mut answer = Vec::new();
        let read = within(Duration::from_secs(10), slow.read_to_end(&mut answer)).await;
        assert!(read.is_some(), "the server did not close the connection");
        let got = frames_in(answer);
        assert!(
            matches!(welcome(&got[0]), Welcome::Refused { reason } if reason.contains("max_connections (1)")),
            "{:?}",
            welcome(&got[0])
        );
        let s = server.stats();
        assert_eq!((s.connections_refused, s.handshakes_failed), (1, 1));
        assert_eq!(replayed_offset(client.call(0, replay(2)).await).0, 2);
    });
}

#[test]
fn a_reply_whose_connection_closed_goes_to_the_servers_undeliverable_hook() {
    on_executor(async {
        let (server, gate, _) = server_with(config(1), "127.0.0.1:0", true);
        let given_back = Rc::new(RefCell::new(Vec::new()));
        let log = given_back.clone();
        server.on_undeliverable(Rc::new(move |u: Undelivered| log.borrow_mut().push(u)));
        let client = Rc::new(RpcClient::new(
            server.local_addr().to_string(),
            1,
            config(2),
        ));
        let asker = client.clone();
        let call = glommio::spawn_local(async move { asker.call(3, probe()).await });
        eventually("the probe runs", || server.stats().requests == 1).await;
        client.close();
        assert!(is_unavailable(&call.await, "closed"));
        eventually("the server sees the connection close", || {
            server.stats().connections_open == 0
        })
        .await;
        gate.open();
        eventually("the probe's reply is given back", || {
            given_back.borrow().len() == 1
        })
        .await;
        let u = given_back.borrow_mut().remove(0);
        assert_eq!(
            (u.core, u.probe),
            (3, Some(("t".to_string(), "g".to_string())))
        );
        assert!(matches!(u.reply, Reply::Probed(_)));
        assert_eq!(server.stats().undelivered, 1);
    });
}

/// Node RPC's TLS from a test PKI (ca, cert, key): the accepting end (requiring a client certificate when
/// `client_auth`), and the connecting end (presenting its certificate when `identity`).
fn peer_tls(
    pki: &(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf),
    client_auth: bool,
    identity: bool,
) -> crate::tls::PeerTls {
    use crate::tls::{client_config, server_config, ALPN_NODE_RPC};
    let (ca, cert, key) = pki;
    crate::tls::PeerTls {
        accept: server_config(
            cert,
            key,
            ALPN_NODE_RPC,
            client_auth.then_some(ca.as_path()),
        )
        .unwrap(),
        connect: client_config(
            ca,
            Some(ALPN_NODE_RPC),
            identity.then_some((cert.as_path(), key.as_path())),
        )
        .unwrap(),
    }
}

#[test]
fn over_tls_calls_go_through_and_a_plain_a_certificate_less_or_a_foreign_ca_peer_is_refused() {
    on_executor(async {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::tls::tests::write_test_pki(dir.path());
        let tls = peer_tls(&pki, true, true);
        let tls_config = |node| RpcConfig {
            tls: Some(tls.clone()),
            ..config(node)
        };
        let (server, _, _) = server_with(tls_config(1), "127.0.0.1:0", false);
        let addr = server.local_addr().to_string();

        // Both ends with the cluster's CA and certificates: calls, many at once, as over plain text.
        let client = RpcClient::new(addr.clone(), 1, tls_config(2));
        assert_eq!(replayed_offset(client.call(3, replay(9)).await), (9, 3));
        let calls: Vec<_> = (0..50).map(|i| client.call(0, replay(i))).collect();
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(replayed_offset(call.await).0, i as u64);
        }
        assert!(client.is_connected());
        drop(client);

        // A peer speaking plain text never gets a welcome.
        let plain = RpcClient::new(addr.clone(), 1, config(2));
        let r = plain.call(0, replay(1)).await;
        assert!(matches!(r, Err(OpError::PartitionUnavailable(_))), "{r:?}");
        drop(plain);

        // A peer without a client certificate is refused in the handshake.
        let other = tempfile::tempdir().unwrap();
        let no_cert = RpcClient::new(
            addr.clone(),
            1,
            RpcConfig {
                tls: Some(crate::tls::PeerTls {
                    connect: peer_tls(&pki, true, false).connect,
                    ..tls.clone()
                }),
                ..config(2)
            },
        );
        let r = no_cert.call(0, replay(1)).await;
        assert!(matches!(r, Err(OpError::PartitionUnavailable(_))), "{r:?}");
        drop(no_cert);

        // A peer whose CA is another one does not trust this server (and would not be trusted by it).
        let foreign = RpcClient::new(
            addr.clone(),
            1,
            RpcConfig {
                tls: Some(peer_tls(
                    &crate::tls::tests::write_test_pki(other.path()),
                    true,
                    true,
                )),
                ..config(2)
            },
        );
        let r = foreign.call(0, replay(1)).await;
        assert!(is_unavailable(&r, "TLS handshake"), "{r:?}");
        drop(foreign);

        eventually("every refused handshake is counted", || {
            server.stats().handshakes_failed >= 3
        })
        .await;
        assert_eq!(server.stats().requests, 51);
    });
}

/// A call to a peer that cannot be reached names the peer by its node id (`node n9`), as `GET /cluster` does, not
/// by its index in the node table.
#[test]
fn an_unreachable_peer_is_named_by_its_id() {
    on_executor(async {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = RpcClient::new(
            format!("127.0.0.1:{port}"),
            4,
            RpcConfig {
                peer_name: "n9".into(),
                ..config(2)
            },
        );
        let r = client.call(0, replay(1)).await;
        assert!(is_unavailable(&r, "node n9 "), "{r:?}");
        let unnamed = RpcClient::new(format!("127.0.0.1:{port}"), 4, config(2));
        let r = unnamed.call(0, replay(1)).await;
        assert!(is_unavailable(&r, "node 4 "), "{r:?}");
    });
}
