//! The cluster as a trust boundary, tried from outside as an attacker or an unlucky peer would (issue 23): real etcd
//! and real `berth serve --cluster` nodes (tests/common/cluster.rs), with raw node RPC clients and raw sockets that
//! send what no well-behaved node or client would.
//!
//! * node RPC carries only what a peer has a reason to send, checked like any untrusted input: an admin request for
//!   the wrong core, an admin step, or a group named `../x/y` gets an error answer, and every core keeps serving;
//! * node RPC opens to the cluster secret (`--peer-token-file`) only, never to a client's bearer token;
//! * a batch consume's reply is bounded in bytes, so large messages drain through a node that does not own them;
//!
//! Every test prints `SKIP <test>: ...` and passes when etcd is not installed. Tests hold `common::serial()`.

mod common;

use berth::cluster::rpc::frame::{self, Hello, Kind, ReplyBody, Welcome, HEADER_LEN, VERSION};
use berth::engine::AdminStep;
use berth::ops::consume::Probe;
use berth::ops::produce::Produce;
use berth::ops::{OpError, Reply, Request};
use common::cluster::{Cluster, Node, Opts};
use common::serial;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A node RPC client written from docs/format.md ("Node RPC"), not berth's `RpcClient`: it sends whatever it is
/// told to, to whichever core.
struct RawPeer {
    stream: TcpStream,
    next_id: u64,
}

impl RawPeer {
    /// Connects to `node`'s peer port and says hello as node `me` with `token`; the welcome, as sent.
    fn connect(node: &Node, me: u32, token: &str) -> (RawPeer, Welcome) {
        let stream = TcpStream::connect((node.ip.as_str(), node.peer_port)).expect("peer port");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut peer = RawPeer { stream, next_id: 1 };
        let hello = Hello {
            version: VERSION as u32,
            node: me,
            token: token.into(),
        };
        peer.send(Kind::Handshake, &hello);
        let (kind, body) = peer.read_frame().expect("a welcome");
        assert_eq!(kind, Kind::Handshake as u8);
        let welcome: Welcome = frame::decode(&body).expect("a welcome that decodes");
        (peer, welcome)
    }

    fn send<T: serde::Serialize>(&mut self, kind: Kind, body: &T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        frame::encode(kind, id, body, usize::MAX, &mut out).expect("encodes");
        self.stream
            .write_all(&out)
            .expect("the peer takes the frame");
        id
    }

    /// The next frame's kind and body; None when the connection ended.
    fn read_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut header = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut header).ok()?;
        let len = u32::from_le_bytes(header[16..20].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).ok()?;
        Some((header[5], body))
    }

    /// Sends `request` for `core` and waits for its answer.
    fn call(&mut self, core: u32, request: Request) -> ReplyBody {
        self.send(Kind::Request, &(core, request));
        let (kind, body) = self.read_frame().expect("a reply");
        assert_eq!(kind, Kind::Reply as u8);
        frame::decode(&body).expect("a reply that decodes")
    }
}

fn refused(answer: ReplyBody, what: &str) -> OpError {
    match answer {
        Err(e) => e,
        Ok(reply) => panic!("{what}: applied ({reply:?}), should have been refused"),
    }
}

/// Issue 23, findings 1 and 8: node RPC handed any request to any core (an admin request addressed to core 1 hit
/// core 0's assertion and took that core's executor down for good), and skipped the HTTP layer's checks (a group
/// named `../x/y` was stored in etcd and jammed the topic on every node). Now a peer's request is admitted only if a
/// peer has a reason to send it, with valid names and counts, and core-0 requests run on core 0 only.
#[test]
fn a_peer_cannot_crash_a_core_or_store_what_http_refuses() {
    let _g = serial();
    let opts = Opts {
        cores: Some(2),
        ..Opts::default()
    };
    let Some(c) = Cluster::start_with(
        "a_peer_cannot_crash_a_core_or_store_what_http_refuses",
        1,
        opts,
    ) else {
        return;
    };
    let node = c.node(0);
    assert_eq!(node.put("/topics/t?partitions=4").status, 201);
    let (mut peer, welcome) = RawPeer::connect(node, 7, "");
    assert!(matches!(welcome, Welcome::Accepted { .. }), "{welcome:?}");

    for core in [0, 1] {
        for request in [
            Request::DeleteTopic("t".into()),
            Request::CreateGroup("t".into(), "g2".into(), false),
            Request::DeleteGroup("t".into(), "default".into()),
            Request::Admin(Box::new(AdminStep::Drop("t".into()))),
            Request::LookupTopic("t".into(), true),
            Request::Stats,
        ] {
            let what = format!("{request:?} for core {core}");
            let e = refused(peer.call(core, request), &what);
            assert!(
                matches!(e, OpError::InvalidParameter(ref m) if m.contains("not accepted over node RPC")),
                "{what}: {e:?}"
            );
        }
    }
    let bad_group = Request::Probe(Probe {
        topic: "t".into(),
        topic_id: 0,
        group: "../x/y".into(),
        max: 1,
        visibility_ms: None,
        waker: None,
        max_bytes: 1 << 20,
        taken_any: false,
    });
    assert!(matches!(
        refused(peer.call(0, bad_group), "a probe of group ../x/y"),
        OpError::InvalidTopic(_)
    ));
    assert!(matches!(
        refused(
            peer.call(9, Request::Describe("t".into())),
            "a request for core 9"
        ),
        OpError::InvalidParameter(_)
    ));
    // A produce of no records (the log asserts it never gets one) to every partition, under every topic id a peer
    // could guess (ids are etcd revisions: small numbers).
    for topic_id in 0..200 {
        for partition in 0..4u32 {
            let empty = Request::Produce(Produce {
                topic: "t".into(),
                topic_id,
                partition,
                records: Vec::new(),
                meta: Vec::new(),
            });
            assert!(matches!(
                refused(peer.call(partition % 2, empty), "an empty produce"),
                OpError::InvalidRecord(_)
            ));
        }
    }
    // Meta flags that do not match the records (the log asserts one per record, or none), and a record flagged as
    // starting with a meta block that does not parse (it would be a corrupt record for good).
    for (records, meta) in [
        (
            vec![
                bytes::Bytes::from_static(b"a"),
                bytes::Bytes::from_static(b"b"),
            ],
            vec![true],
        ),
        (
            vec![bytes::Bytes::from_static(b"\xff\xff\xff\x7fbody")],
            vec![true],
        ),
        // An id HTTP refuses (a space).
        (
            vec![bytes::Bytes::from(
                berth::storage::meta::RecordMeta {
                    dedup_id: Some(bytes::Bytes::from_static(b"has space")),
                    ..Default::default()
                }
                .encode(b"x"),
            )],
            vec![true],
        ),
        // A delivery time no delay reaches (it would hold the group's frontier for good).
        (
            vec![bytes::Bytes::from(
                berth::storage::meta::RecordMeta {
                    not_before_ms: u64::MAX,
                    ..Default::default()
                }
                .encode(b"never"),
            )],
            vec![true],
        ),
    ] {
        for (topic_id, partition) in (0..200).flat_map(|t| (0..4u32).map(move |p| (t, p))) {
            let bad = Request::Produce(Produce {
                topic: "t".into(),
                topic_id,
                partition,
                records: records.clone(),
                meta: meta.clone(),
            });
            assert!(matches!(
                refused(peer.call(partition % 2, bad), "a produce with bad meta"),
                OpError::InvalidRecord(_)
            ));
        }
    }
    // A wake-up registered on behalf of another node than the sender (7).
    let elsewhere = Request::Probe(Probe {
        topic: "t".into(),
        topic_id: 0,
        group: "default".into(),
        max: 1,
        visibility_ms: None,
        waker: Some(berth::engine::placement::Location { node: 3, core: 0 }),
        max_bytes: 1 << 20,
        taken_any: false,
    });
    assert!(matches!(
        refused(peer.call(0, elsewhere), "a probe with another node's waker"),
        OpError::InvalidParameter(_)
    ));
    // A shipped batch (replication): as another node than the sender, empty, or for a partition this node holds no
    // follower replica of (the topic is not replicated; ids a peer could guess), with garbage for frames.
    let ship = |leader: u32, topic_id: u64, partition: u32, frames: &'static [u8]| {
        Request::Replicate(berth::ops::replicate::Replicate {
            topic: "t".into(),
            topic_id,
            partition,
            leader,
            epoch: 0,
            segment_base: 0,
            position: 0,
            first_offset: 0,
            count: 1,
            frames: bytes::Bytes::from_static(frames),
            epochs: Vec::new(),
            hold: 0,
            promote: false,
            nonces: 0,
            restart: false,
        })
    };
    assert!(matches!(
        refused(peer.call(0, ship(3, 0, 0, b"xx")), "a batch shipped as node 3"),
        OpError::InvalidParameter(ref m) if m.contains("as node 3")
    ));
    assert!(matches!(
        refused(peer.call(0, ship(7, 0, 0, b"")), "an empty shipped batch"),
        OpError::InvalidRecord(_)
    ));
    // Epoch entries that do not describe the batch (out of order, or starting past it), or too many of them.
    let with_epochs = |epochs: Vec<(u64, u64)>| match ship(7, 0, 0, b"xx") {
        Request::Replicate(mut r) => {
            r.epochs = epochs
                .into_iter()
                .map(|(epoch, start)| berth::storage::epoch_history::EpochStart { epoch, start })
                .collect();
            Request::Replicate(r)
        }
        _ => unreachable!(),
    };
    assert!(matches!(
        refused(
            peer.call(0, with_epochs(vec![(2, 0), (1, 0)])),
            "epochs out of order"
        ),
        OpError::InvalidParameter(_)
    ));
    assert!(matches!(
        refused(
            peer.call(0, with_epochs(vec![(2, 5)])),
            "an epoch starting past the batch"
        ),
        OpError::InvalidParameter(_)
    ));
    assert!(matches!(
        refused(
            peer.call(0, with_epochs((0..10_000).map(|i| (i + 1, 0)).collect())),
            "ten thousand epochs"
        ),
        OpError::BatchTooLarge(_)
    ));
    for topic_id in 0..200 {
        for partition in [0, 1, 2, 3, 4, u32::MAX] {
            let e = refused(
                peer.call(partition % 2, ship(7, topic_id, partition, &[0xff; 64])),
                "a garbage batch for a partition this node leads",
            );
            assert!(
                matches!(
                    e,
                    OpError::PartitionUnavailable(_)
                        | OpError::Engine(berth::engine::EngineError::TopicNotFound(_))
                ),
                "{e:?}"
            );
        }
    }
    // A probe (no records, no frames: a leader asking a follower for its end) is admitted in that shape only, and
    // answered only for a partition this node follows of that leader: here, none.
    let probe = |leader: u32, topic_id: u64, partition: u32, frames: &'static [u8]| match ship(
        leader, topic_id, partition, frames,
    ) {
        Request::Replicate(mut r) => {
            r.count = 0;
            Request::Replicate(r)
        }
        _ => unreachable!(),
    };
    assert!(matches!(
        refused(peer.call(0, probe(7, 0, 0, b"xx")), "a probe with frames"),
        OpError::InvalidRecord(_)
    ));
    assert!(matches!(
        refused(peer.call(0, probe(3, 0, 0, b"")), "a probe as node 3"),
        OpError::InvalidParameter(ref m) if m.contains("as node 3")
    ));
    for topic_id in 0..50 {
        for partition in [0, 1, 3, u32::MAX] {
            let e = refused(
                peer.call(partition % 2, probe(7, topic_id, partition, b"")),
                "a probe for a partition this node does not follow",
            );
            assert!(
                matches!(
                    e,
                    OpError::PartitionUnavailable(_)
                        | OpError::Engine(berth::engine::EngineError::TopicNotFound(_))
                ),
                "{e:?}"
            );
        }
    }
    // A well-formed request from the same peer is still served: the connection was not dropped.
    assert!(matches!(
        peer.call(1, Request::Describe("t".into())),
        Ok(Reply::Described(_))
    ));

    // Every core still serves: a produce to each of the four partitions (two per core), and the topic and its one
    // group are as they were.
    for p in 0..4 {
        let a = node.post(&format!("/produce?topic=t&partition={p}"), b"x");
        assert_eq!(a.status, 200, "partition {p}: {}", a.text());
    }
    let groups = node.get("/topics/t/groups");
    assert_eq!(groups.status, 200);
    let text = groups.text();
    assert!(
        text.contains("default") && !text.contains("x/y") && !text.contains("g2"),
        "{text}"
    );
    let keys = c.etcd.list("/berth/").expect("etcd lists its keys");
    assert!(
        keys.iter()
            .all(|(k, v)| !k.contains("x/y") && !v.contains("x/y")),
        "{keys:?}"
    );
}

/// Issue 23, finding 1 (its second half) and deliverable 3: node RPC's token was the API token, so every API client
/// could speak node RPC. Now the cluster secret (`--peer-token-file`) is a separate one; the client token, no token
/// or a wrong one get a refusal, and the nodes still reach each other with the secret.
#[test]
fn the_client_token_does_not_open_node_rpc() {
    let _g = serial();
    const TOKEN: &str = "client-t0ken-0123456789abcdef";
    const SECRET: &str = "peer-secret-0123456789abcdef";
    let opts = Opts {
        token: Some(TOKEN.into()),
        peer_token: Some(SECRET.into()),
        ..Opts::default()
    };
    let Some(c) = Cluster::start_with("the_client_token_does_not_open_node_rpc", 2, opts) else {
        return;
    };
    for presented in [TOKEN, "", "peer-secret-0123456789abcdeX"] {
        let (mut peer, welcome) = RawPeer::connect(c.node(0), 7, presented);
        assert!(
            matches!(welcome, Welcome::Refused { ref reason } if reason.contains("token")),
            "hello with {presented:?}: {welcome:?}"
        );
        assert!(
            peer.read_frame().is_none(),
            "the connection stays open after a refusal"
        );
    }
    let (mut peer, welcome) = RawPeer::connect(c.node(0), 7, SECRET);
    assert!(matches!(welcome, Welcome::Accepted { .. }), "{welcome:?}");
    assert!(matches!(
        peer.call(0, Request::Describe("nothing-here".into())),
        Err(OpError::Engine(_)) | Ok(Reply::Described(_))
    ));
    // The nodes themselves speak node RPC with the secret: a partition of node 1 is served through node 0.
    assert_eq!(c.node(0).put("/topics/t?partitions=2").status, 201);
    for p in 0..2 {
        let a = c
            .node(0)
            .post(&format!("/produce?topic=t&partition={p}"), b"x");
        assert_eq!(a.status, 200, "partition {p}: {}", a.text());
    }
}

/// Issue 23, finding 7: a batch consume had no byte bound, and through a non-owner it failed forever once its reply
/// passed node RPC's 64 MiB frame (70 × 1 MB → `413` every time). Now a consume's reply carries at most
/// `max_batch_bytes` of payload (one message over at most), spent across owners: 70 × 1 MB drain through the
/// non-owner in a few answers, never a 413, every message once.
#[test]
fn a_batch_of_large_messages_drains_through_a_non_owner_within_the_byte_bound() {
    let _g = serial();
    let Some(c) = Cluster::start_with(
        "a_batch_of_large_messages_drains_through_a_non_owner_within_the_byte_bound",
        2,
        Opts::default(),
    ) else {
        return;
    };
    assert_eq!(c.node(0).put("/topics/big?partitions=2").status, 201);
    let p = c.partitions_of(0, "big", 1)[0];
    const N: usize = 70;
    const SIZE: usize = 1_000_000;
    for i in 0..N {
        let mut body = vec![b'a' + (i % 26) as u8; SIZE];
        body[..8].copy_from_slice(format!("{i:08}").as_bytes());
        let a = c
            .node(1)
            .post(&format!("/produce?topic=big&partition={p}"), &body);
        assert_eq!(a.status, 200, "produce {i}: {}", a.text());
    }
    let bound = 16usize << 20; // max_batch_bytes' default
    let mut seen = std::collections::BTreeSet::new();
    let mut answers = 0;
    while seen.len() < N {
        answers += 1;
        assert!(
            answers <= N,
            "no progress: {} of {N} after {answers} answers",
            seen.len()
        );
        let a = c
            .node(0)
            .client
            .call("GET", "/consume?topic=big&max=1000&wait=1s", &[])
            .expect("consume");
        assert_eq!(a.status, 200, "answer {answers}: {}", a.text());
        let mut payload = 0;
        let mut handles = String::new();
        for line in a.text().lines() {
            let m: serde_json::Value = serde_json::from_str(line).expect("a message line");
            let body = m["body"].as_str().expect("body");
            payload += body.len();
            assert!(
                seen.insert(body[..8].to_string()),
                "{} delivered twice",
                &body[..8]
            );
            handles += m["receipt_handle"].as_str().expect("handle");
            handles.push('\n');
        }
        assert!(
            payload <= bound,
            "answer {answers} carried {payload} payload bytes"
        );
        let a = c.node(0).post("/ack?topic=big", handles.as_bytes());
        assert_eq!(a.status, 200, "ack: {}", a.text());
    }
    assert!(answers >= N * SIZE / bound, "{answers} answers");
}
