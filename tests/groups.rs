//! End-to-end tests of version 2's consumer groups and delivery policies (design/api.md, "Version 2 additions →
//! Consumer groups" and "→ Delivery policies"), one or more tests per line of the contract: groups created at the
//! first consume or by `PUT /topics/T/groups/G[?start=earliest|latest]`, listed, described and deleted, capped by
//! `max_groups`, independent of each other (delivery, receipt handles, wake-ups, frontier files across kill -9),
//! retention that does not wait for a group; delivery counts, nack delays, the redelivery policy, dead letters,
//! `PATCH /topics/T` and redrive. Every test runs the real binary (tests/common) and holds `common::serial()`: the
//! timing checks measure the server from outside, on a machine of two shared cores.

mod common;

use base64::Engine as _;
use berth::client::{Answer, Client};
use common::{assert_error, decode_frontier, Server};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------

const NDJSON: &str = "application/x-ndjson";
const FRAMES: &str = "application/vnd.berth.frames";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The server's clock counts whole milliseconds (a deadline `now_ms + D` may come up to 1 ms early in real time):
/// lower bounds on delays measured from outside allow this much.
const CLOCK_GRAIN: Duration = Duration::from_millis(2);

/// `D` less the clock grain: the earliest a delay of D may be seen to end from outside.
fn at_least(d: u64) -> Duration {
    ms(d) - CLOCK_GRAIN
}

/// A server started with a TOML config (kept on disk for restarts: `Server::restart` reads it again).
struct Configured {
    server: Server,
    _config_dir: tempfile::TempDir,
}

impl std::ops::Deref for Configured {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for Configured {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

/// Starts a server with `cores` cores and the TOML settings `toml`.
fn start_with(cores: usize, toml: &str) -> Configured {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("berth.toml");
    std::fs::write(&path, toml).expect("write config");
    let server = Server::start(cores, &["--config", path.to_str().unwrap()]);
    Configured {
        server,
        _config_dir: dir,
    }
}

/// Frontier files flushed every 20 ms (instead of 100): the tests wait for them, bounded.
const FAST_FLUSH: &str = "frontier_flush_interval_ms = 20\n";

fn call(s: &Server, method: &str, path: &str) -> Answer {
    s.client
        .call(method, path, &[])
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// A leased message.
#[derive(Debug, Clone)]
struct Msg {
    partition: u64,
    offset: u64,
    handle: String,
    delivery_count: u64,
    body: Vec<u8>,
}

/// A version 1 single-message consume reply (200) as a Msg, checking its headers agree with each other.
fn msg_of(a: &Answer) -> Msg {
    assert_eq!(a.status, 200, "consume: {}", a.text());
    let header = |name: &str| -> u64 {
        a.header(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", a.headers))
            .parse()
            .unwrap_or_else(|_| panic!("{name} header is not a number: {:?}", a.headers))
    };
    let handle = a
        .header("receipt-handle")
        .expect("a Receipt-Handle header")
        .to_string();
    let m = Msg {
        partition: header("partition"),
        offset: header("offset"),
        delivery_count: header("delivery-count"),
        handle,
        body: a.body.clone(),
    };
    assert!(
        m.handle
            .starts_with(&format!("{}:{}:", m.partition, m.offset)),
        "handle {} does not name {}:{}",
        m.handle,
        m.partition,
        m.offset
    );
    m
}

/// `GET /consume?topic=T{extra}` (single message): None on 204, else the message.
fn consume(s: &Server, topic: &str, extra: &str) -> Option<Msg> {
    consume_on(&s.client, topic, extra)
}

fn consume_on(client: &Client, topic: &str, extra: &str) -> Option<Msg> {
    let path = format!("/consume?topic={topic}{extra}");
    let a = client
        .call("GET", &path, &[])
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    match a.status {
        204 => {
            assert!(a.body.is_empty(), "204 with a body: {}", a.text());
            None
        }
        200 => Some(msg_of(&a)),
        s => panic!("GET {path} answered {s}: {}", a.text()),
    }
}

/// A consume that must deliver.
fn must_consume(s: &Server, topic: &str, extra: &str) -> Msg {
    consume(s, topic, extra)
        .unwrap_or_else(|| panic!("consume ?topic={topic}{extra} answered 204, expected a message"))
}

/// A consume that must answer 204.
fn assert_nothing(s: &Server, topic: &str, extra: &str, why: &str) {
    if let Some(m) = consume(s, topic, extra) {
        panic!("consume ?topic={topic}{extra} delivered {m:?}; expected 204: {why}");
    }
}

/// Parses an ndjson batch consume reply.
fn parse_ndjson(a: &Answer) -> Vec<Msg> {
    assert_eq!(a.status, 200, "batch consume: {}", a.text());
    assert_eq!(
        a.header("content-type")
            .map(|c| c.split(';').next().unwrap().trim()),
        Some(NDJSON),
        "reply media type"
    );
    a.text()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let j: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("line {line}: {e}"));
            let body = match (j.get("body"), j.get("body_base64")) {
                (Some(Value::String(t)), None) => t.as_bytes().to_vec(),
                (None, Some(Value::String(b))) => base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .unwrap_or_else(|e| panic!("body_base64 of {line}: {e}")),
                _ => panic!("line without exactly one of body / body_base64: {line}"),
            };
            Msg {
                partition: j["partition"].as_u64().expect("partition"),
                offset: j["offset"].as_u64().expect("offset"),
                handle: j["receipt_handle"]
                    .as_str()
                    .expect("receipt_handle")
                    .to_string(),
                delivery_count: j["delivery_count"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no delivery_count in {line}")),
                body,
            }
        })
        .collect()
}

/// `GET /consume?topic=T&max=N{extra}` with `Accept: application/x-ndjson`: the messages (empty on 204).
fn consume_ndjson(s: &Server, topic: &str, max: usize, extra: &str) -> Vec<Msg> {
    let path = format!("/consume?topic={topic}&max={max}{extra}");
    let a = s
        .client
        .call_with("GET", &path, &[("accept", NDJSON)], &[])
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    if a.status == 204 {
        return Vec::new();
    }
    parse_ndjson(&a)
}

/// Settles one handle: `POST /{op}?topic=T&receipt_handle=H{extra}`.
fn settle(s: &Server, op: &str, topic: &str, handle: &str, extra: &str) -> Answer {
    call(
        s,
        "POST",
        &format!("/{op}?topic={topic}&receipt_handle={handle}{extra}"),
    )
}

/// Settles one handle, asserting 200.
fn settle_ok(s: &Server, op: &str, topic: &str, handle: &str, extra: &str) {
    let a = settle(s, op, topic, handle, extra);
    assert_eq!(
        a.status,
        200,
        "{op} {handle} {extra}: {}",
        String::from_utf8_lossy(&a.body)
    );
}

/// A batch settle (text/plain body of handles): the per-handle statuses.
fn settle_batch(s: &Server, op: &str, topic: &str, handles: &[String], extra: &str) -> Vec<u16> {
    let body = handles.join("\n");
    let path = format!("/{op}?topic={topic}{extra}");
    let a = s
        .client
        .call_with(
            "POST",
            &path,
            &[("content-type", "text/plain")],
            body.as_bytes(),
        )
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    assert_eq!(a.status, 200, "batch {op}: {}", a.text());
    let results = a.json()["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {}", a.text()))
        .clone();
    assert_eq!(results.len(), handles.len(), "{}", a.text());
    results
        .iter()
        .zip(handles)
        .map(|(r, h)| {
            assert_eq!(r["receipt_handle"].as_str(), Some(h.as_str()), "{r}");
            r["status"].as_u64().expect("status") as u16
        })
        .collect()
}

/// Produces bodies as one ndjson batch to `partition`; returns their offsets.
fn produce_batch(s: &Server, topic: &str, partition: u64, bodies: &[Vec<u8>]) -> Vec<u64> {
    let mut payload = Vec::new();
    for b in bodies {
        let line = match std::str::from_utf8(b) {
            Ok(text) => json!({"body": text, "partition": partition}),
            Err(_) => json!({
                "body_base64": base64::engine::general_purpose::STANDARD.encode(b),
                "partition": partition
            }),
        };
        payload.extend_from_slice(line.to_string().as_bytes());
        payload.push(b'\n');
    }
    let a = s
        .client
        .call_with(
            "POST",
            &format!("/produce?topic={topic}"),
            &[("content-type", NDJSON)],
            &payload,
        )
        .expect("batch produce");
    assert_eq!(a.status, 200, "batch produce: {}", a.text());
    let j = a.json();
    assert_eq!(j["failed"], 0, "{}", a.text());
    j["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["partition"].as_u64(), Some(partition), "{r}");
            r["offset"].as_u64().unwrap()
        })
        .collect()
}

/// (committed, in_flight, acked_ahead) of one partition of one group.
type GroupPart = (u64, u64, u64);

/// `GET /topics/T/groups`: each group's state per partition, checking the reply's shape (every group once, every
/// partition once in order, each with numeric `committed`, `in_flight`, `acked_ahead`).
fn group_states(s: &Server, topic: &str) -> BTreeMap<String, Vec<GroupPart>> {
    let a = call(s, "GET", &format!("/topics/{topic}/groups"));
    assert_eq!(a.status, 200, "GET /topics/{topic}/groups: {}", a.text());
    let list = a.json();
    let list = list
        .as_array()
        .unwrap_or_else(|| panic!("not a JSON array: {}", a.text()));
    let mut out = BTreeMap::new();
    for g in list {
        let name = g["group"]
            .as_str()
            .unwrap_or_else(|| panic!("no group name in {g}"))
            .to_string();
        let parts = g["partitions"]
            .as_array()
            .unwrap_or_else(|| panic!("no partitions in {g}"));
        let mut states = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(p["partition"].as_u64(), Some(i as u64), "order in {g}");
            let n = |k: &str| {
                p[k].as_u64()
                    .unwrap_or_else(|| panic!("no numeric {k} in {p}"))
            };
            states.push((n("committed"), n("in_flight"), n("acked_ahead")));
        }
        assert!(
            out.insert(name.clone(), states).is_none(),
            "group {name} listed twice: {}",
            a.text()
        );
    }
    out
}

/// One group's state per partition (panics when it is not listed).
fn group_state(s: &Server, topic: &str, group: &str) -> Vec<GroupPart> {
    let all = group_states(s, topic);
    all.get(group)
        .unwrap_or_else(|| panic!("group {group} not listed: {all:?}"))
        .clone()
}

/// Polls (bounded) until `check` holds; `what` describes the last value seen on failure.
fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return,
            Err(seen) => assert!(
                start.elapsed() < limit,
                "{what} not reached within {limit:?}; last seen: {seen}"
            ),
        }
        thread::sleep(ms(10));
    }
}

fn read_frontier(path: &Path) -> Option<u64> {
    decode_frontier(&std::fs::read(path).ok()?)
}

/// Polls (bounded) until the server reports `group`'s frontier on partition 0 of `topic` durable at `want` (in the
/// core's journal or its file: a kill -9 from then on keeps it, and the restart's replay writes the file).
fn wait_durable(s: &Server, topic: &str, group: &str, want: u64) {
    wait_until(
        ms(5000),
        &format!("{topic}/0 group {group} durable == {want}"),
        || {
            let a = call(s, "GET", &format!("/topics/{topic}/groups"));
            let list = a.json();
            let got = list
                .as_array()
                .and_then(|l| l.iter().find(|g| g["group"] == group))
                .and_then(|g| g["partitions"][0]["durable"].as_u64());
            match got {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
}

/// Every record of partition 0 of `topic` (start_offset..end_offset), by replay.
fn replay_all(s: &Server, topic: &str) -> Vec<Vec<u8>> {
    let p = &s.partitions(topic)[0];
    let (start, end) = (
        p["start_offset"].as_u64().unwrap(),
        p["end_offset"].as_u64().unwrap(),
    );
    (start..end)
        .map(|o| {
            let a = call(
                s,
                "GET",
                &format!("/consume?topic={topic}&partition=0&offset={o}"),
            );
            assert_eq!(a.status, 200, "replay {topic} 0:{o}: {}", a.text());
            a.body
        })
        .collect()
}

/// The sum of a counter's series for one topic (and group, if given) in `GET /metrics`.
fn metric(s: &Server, name: &str, topic: &str, group: Option<&str>) -> u64 {
    let a = call(s, "GET", "/metrics");
    assert_eq!(a.status, 200);
    let topic_label = format!("topic=\"{topic}\"");
    let group_label = group.map(|g| format!("group=\"{g}\""));
    a.text()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(&topic_label))
        .filter(|l| group_label.as_ref().is_none_or(|g| l.contains(g.as_str())))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .unwrap()
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("metric line {l}")) as u64
        })
        .sum()
}

/// Asserts a 400 with some error code and a message (the contract names no code for this case).
fn assert_400(a: &Answer, what: &str) {
    let j = a.json();
    assert_eq!(a.status, 400, "{what}: {}", a.text());
    assert!(
        j["error"].as_str().is_some_and(|c| !c.is_empty())
            && j["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: 400 without an error code and message: {}",
        a.text()
    );
}

/// The `config` of `GET /topics/T`.
fn topic_config(s: &Server, topic: &str) -> Value {
    let a = call(s, "GET", &format!("/topics/{topic}"));
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()["config"].clone()
}

// ---------------------------------------------------------------------------------------------------------------
// Consumer groups
// ---------------------------------------------------------------------------------------------------------------

/// Two groups each receive all 1,000 messages exactly once (bodies intact, delivery count 1), consuming in
/// alternation; `fwd` acks every batch at once, `rev` acks everything in reverse order (an acked-ahead set of
/// n-1 per partition, then the frontier jumps); at the end both are drained and `default` never moved.
#[test]
fn two_groups_each_receive_1000_messages_exactly_once_while_one_acks_in_reverse_order() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("orders", "partitions=2");
    let mut produced: BTreeMap<(u64, u64), Vec<u8>> = BTreeMap::new();
    for chunk in 0..4u64 {
        let partition = chunk % 2;
        let bodies: Vec<Vec<u8>> = (0..250)
            .map(|i| format!("order-{chunk}-{i}").into_bytes())
            .collect();
        let offsets = produce_batch(&s, "orders", partition, &bodies);
        for (o, b) in offsets.into_iter().zip(bodies) {
            assert!(produced.insert((partition, o), b).is_none());
        }
    }
    assert_eq!(produced.len(), 1000);
    // `fwd` explicitly, `rev` at its first consume.
    let a = call(&s, "PUT", "/topics/orders/groups/fwd");
    assert_eq!(a.status, 201, "{}", a.text());

    let mut got: BTreeMap<&str, BTreeMap<(u64, u64), Msg>> = BTreeMap::new();
    let mut done = BTreeSet::new();
    let mut rounds = 0;
    while done.len() < 2 {
        rounds += 1;
        assert!(rounds < 100, "runaway consumption: {got:?}");
        for group in ["rev", "fwd"] {
            if done.contains(group) {
                continue;
            }
            let batch = consume_ndjson(&s, "orders", 100, &format!("&group={group}"));
            if batch.is_empty() {
                done.insert(group);
                continue;
            }
            for m in &batch {
                assert_eq!(m.delivery_count, 1, "{group}: {m:?}");
                assert_eq!(
                    Some(&m.body),
                    produced.get(&(m.partition, m.offset)),
                    "{group}: body of {}:{}",
                    m.partition,
                    m.offset
                );
                let prior = got
                    .entry(group)
                    .or_default()
                    .insert((m.partition, m.offset), m.clone());
                assert!(
                    prior.is_none(),
                    "{group}: {}:{} delivered twice",
                    m.partition,
                    m.offset
                );
            }
            if group == "fwd" {
                let handles: Vec<String> = batch.iter().map(|m| m.handle.clone()).collect();
                let statuses = settle_batch(&s, "ack", "orders", &handles, "&group=fwd");
                assert!(statuses.iter().all(|&st| st == 200), "{statuses:?}");
            }
        }
    }
    for group in ["rev", "fwd"] {
        let keys: BTreeSet<(u64, u64)> = got[group].keys().copied().collect();
        let want: BTreeSet<(u64, u64)> = produced.keys().copied().collect();
        assert_eq!(keys, want, "{group} did not receive every message");
    }
    let per_partition = [500u64, 500];
    let states = group_states(&s, "orders");
    assert_eq!(
        states["fwd"],
        vec![(500, 0, 0), (500, 0, 0)],
        "fwd acked everything"
    );
    assert_eq!(
        states["rev"],
        vec![(0, 500, 0), (0, 500, 0)],
        "rev holds every lease"
    );
    assert_eq!(
        states["default"],
        vec![(0, 0, 0), (0, 0, 0)],
        "default untouched"
    );

    // Reverse order: everything but each partition's offset 0 first.
    let rev: Vec<Msg> = got["rev"].values().rev().cloned().collect();
    let (firsts, rest): (Vec<Msg>, Vec<Msg>) = rev.into_iter().partition(|m| m.offset == 0);
    for m in &rest {
        settle_ok(&s, "ack", "orders", &m.handle, "&group=rev");
    }
    assert_eq!(
        group_state(&s, "orders", "rev"),
        per_partition
            .iter()
            .map(|&n| (0, 1, n - 1))
            .collect::<Vec<_>>(),
        "rev: every ack but offset 0's is acked ahead"
    );
    for m in &firsts {
        settle_ok(&s, "ack", "orders", &m.handle, "&group=rev");
    }
    assert_eq!(
        group_state(&s, "orders", "rev"),
        vec![(500, 0, 0), (500, 0, 0)]
    );
    for group in ["rev", "fwd"] {
        assert_nothing(&s, "orders", &format!("&group={group}"), "group drained");
    }
    assert_eq!(
        group_state(&s, "orders", "default"),
        vec![(0, 0, 0), (0, 0, 0)]
    );
    // A handle settled once is gone.
    let a = settle(&s, "ack", "orders", &firsts[0].handle, "&group=rev");
    assert_error(&a, 410, "lease_gone");
}

/// A receipt handle is valid only in the group that leased it: ack, nack and extend with another group's name
/// (another existing group, `default`, a group that does not exist; single and batch) are 410 and change nothing.
#[test]
fn a_receipt_handle_settled_with_another_groups_name_is_410() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("rh", "");
    for i in 0..3 {
        s.produce("rh", "", format!("rh-{i}").as_bytes());
    }
    // `a` leased first, then `b` created and leasing.
    let ma = must_consume(&s, "rh", "&group=a");
    let mb = must_consume(&s, "rh", "&group=b");
    assert_eq!((ma.offset, mb.offset), (0, 0));
    // The default group is version 1's state: no `group` and `group=default` are the same.
    let md = must_consume(&s, "rh", "");
    assert_eq!(md.offset, 0);
    settle_ok(&s, "extend", "rh", &md.handle, "&group=default");
    for (handle, wrong) in [
        (&ma.handle, "&group=b"),
        (&ma.handle, ""),
        (&ma.handle, "&group=default"),
        (&ma.handle, "&group=nosuchgroup"),
        (&mb.handle, "&group=a"),
        (&md.handle, "&group=a"),
    ] {
        for op in ["extend", "nack", "ack"] {
            assert_error(&settle(&s, op, "rh", handle, wrong), 410, "lease_gone");
        }
        let statuses = settle_batch(&s, "ack", "rh", std::slice::from_ref(handle), wrong);
        assert_eq!(statuses, vec![410], "batch ack of {handle} with {wrong:?}");
    }
    // Nothing changed: every lease is still live in its own group.
    for g in ["a", "b", "default"] {
        assert_eq!(group_state(&s, "rh", g), vec![(0, 1, 0)], "group {g}");
    }
    settle_ok(&s, "ack", "rh", &ma.handle, "&group=a");
    settle_ok(&s, "ack", "rh", &mb.handle, "&group=b");
    settle_ok(&s, "ack", "rh", &md.handle, "");
    for g in ["a", "b", "default"] {
        assert_eq!(group_state(&s, "rh", g), vec![(1, 0, 0)], "group {g}");
    }
}

/// The same after a restart, when every group's lease state is loaded at once (and with groups created together
/// before any consume): handles of one group still do not settle another's leases.
#[test]

fn receipt_handles_stay_per_group_when_groups_load_together() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("rh2", "");
    for i in 0..2 {
        s.produce("rh2", "", format!("rh2-{i}").as_bytes());
    }
    for g in ["a", "b"] {
        let a = call(&s, "PUT", &format!("/topics/rh2/groups/{g}"));
        assert_eq!(a.status, 201, "{}", a.text());
    }
    for round in 0..2 {
        if round == 1 {
            s.restart();
        }
        let ma = must_consume(&s, "rh2", "&group=a");
        let mb = must_consume(&s, "rh2", "&group=b");
        let md = must_consume(&s, "rh2", "");
        assert_eq!(
            (ma.offset, mb.offset, md.offset),
            (0, 0, 0),
            "round {round}"
        );
        for (handle, wrong) in [
            (&ma.handle, "&group=b"),
            (&ma.handle, ""),
            (&mb.handle, "&group=a"),
            (&md.handle, "&group=b"),
        ] {
            let a = settle(&s, "ack", "rh2", handle, wrong);
            assert_eq!(
                a.status,
                410,
                "round {round}: {handle} (of another group) acked with {wrong:?}: {} (handles a {} b {} default {})",
                a.text(),
                ma.handle,
                mb.handle,
                md.handle
            );
        }
        for g in ["a", "b", "default"] {
            assert_eq!(
                group_state(&s, "rh2", g)[0].1,
                1,
                "round {round}: group {g}'s lease was settled by another group's handle"
            );
        }
        // Give them back for the next round.
        settle_ok(&s, "nack", "rh2", &ma.handle, "&group=a");
        settle_ok(&s, "nack", "rh2", &mb.handle, "&group=b");
        settle_ok(&s, "nack", "rh2", &md.handle, "");
    }
}

/// Creation at the first consume (from the oldest retained offset) and by PUT (201, then 200; `start=earliest`
/// and `start=latest`), the list with per-partition state, GET and DELETE of one group (204; unknown: 404
/// group_not_found), a deleted group's name created again starts over, and names that break the topic-name rule
/// (400) on every request that takes one.
#[test]
fn groups_are_created_at_first_consume_or_by_put_listed_described_and_deleted() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("life", "partitions=2");
    for i in 0..3 {
        assert_eq!(
            s.produce("life", "&partition=0", format!("p0-{i}").as_bytes()),
            (0, i)
        );
    }
    for i in 0..2 {
        assert_eq!(
            s.produce("life", "&partition=1", format!("p1-{i}").as_bytes()),
            (1, i)
        );
    }
    let states = group_states(&s, "life");
    assert_eq!(
        states,
        BTreeMap::from([("default".to_string(), vec![(0, 0, 0), (0, 0, 0)])]),
        "a new topic has the default group only"
    );

    // First consume creates the group, at the oldest retained offset.
    let first = must_consume(&s, "life", "&group=first");
    assert_eq!(first.offset, 0, "{first:?}");
    assert_eq!(first.delivery_count, 1);
    let states = group_states(&s, "life");
    let mut want = vec![(0, 0, 0), (0, 0, 0)];
    want[first.partition as usize].1 = 1;
    assert_eq!(states.get("first"), Some(&want), "{states:?}");
    let a = call(&s, "GET", "/topics/life/groups/first");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["group"], "first", "{}", a.text());

    // Explicit creation.
    let a = call(&s, "PUT", "/topics/life/groups/early?start=earliest");
    assert_eq!(a.status, 201, "{}", a.text());
    let a = call(&s, "PUT", "/topics/life/groups/early");
    assert_eq!(a.status, 200, "PUT of an existing group: {}", a.text());
    let a = call(&s, "PUT", "/topics/life/groups/late?start=latest");
    assert_eq!(a.status, 201, "{}", a.text());
    let a = call(&s, "PUT", "/topics/life/groups/late?start=earliest");
    assert_eq!(a.status, 200, "{}", a.text());
    let states = group_states(&s, "life");
    assert_eq!(states["early"], vec![(0, 0, 0), (0, 0, 0)]);
    assert_eq!(
        states["late"],
        vec![(3, 0, 0), (2, 0, 0)],
        "latest starts at the end (and a second PUT moves nothing)"
    );
    assert_eq!(
        states.keys().collect::<Vec<_>>(),
        vec!["default", "early", "first", "late"]
    );
    assert_400(
        &call(&s, "PUT", "/topics/life/groups/bogus?start=middle"),
        "start=middle",
    );

    // `late` sees only what comes after it.
    assert_nothing(&s, "life", "&group=late", "latest group, nothing new");
    assert_eq!(s.produce("life", "&partition=0", b"p0-3"), (0, 3));
    let m = must_consume(&s, "life", "&group=late");
    assert_eq!(
        (m.partition, m.offset, m.body.as_slice()),
        (0, 3, &b"p0-3"[..])
    );
    settle_ok(&s, "ack", "life", &m.handle, "&group=late");

    // `early` gets everything, from offset 0.
    let mut early = BTreeSet::new();
    while let Some(m) = consume(&s, "life", "&group=early") {
        assert!(early.insert((m.partition, m.offset)), "{m:?} twice");
        settle_ok(&s, "ack", "life", &m.handle, "&group=early");
        assert!(early.len() <= 6);
    }
    assert_eq!(
        early,
        BTreeSet::from([(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)])
    );
    assert_eq!(group_state(&s, "life", "early"), vec![(4, 0, 0), (2, 0, 0)]);

    // Unknown group: 404 group_not_found.
    assert_error(
        &call(&s, "GET", "/topics/life/groups/nope"),
        404,
        "group_not_found",
    );
    assert_error(
        &call(&s, "DELETE", "/topics/life/groups/nope"),
        404,
        "group_not_found",
    );
    // Unknown topic: 404 topic_not_found.
    for (method, path) in [
        ("GET", "/topics/nosuch/groups"),
        ("GET", "/topics/nosuch/groups/g"),
        ("PUT", "/topics/nosuch/groups/g"),
        ("DELETE", "/topics/nosuch/groups/g"),
    ] {
        assert_error(&call(&s, method, path), 404, "topic_not_found");
    }

    // DELETE: 204, then gone everywhere.
    let a = call(&s, "DELETE", "/topics/life/groups/early");
    assert_eq!(a.status, 204, "{}", a.text());
    assert!(a.body.is_empty());
    assert_error(
        &call(&s, "GET", "/topics/life/groups/early"),
        404,
        "group_not_found",
    );
    assert_error(
        &call(&s, "DELETE", "/topics/life/groups/early"),
        404,
        "group_not_found",
    );
    assert!(!group_states(&s, "life").contains_key("early"));
    // The name again is a new group: it starts over.
    let a = call(&s, "PUT", "/topics/life/groups/early");
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(group_state(&s, "life", "early"), vec![(0, 0, 0), (0, 0, 0)]);
    let m = must_consume(&s, "life", "&group=early");
    assert_eq!((m.offset, m.delivery_count), (0, 1), "{m:?}");

    // Group names follow the topic-name rule.
    let long_ok = "g".repeat(128);
    let a = call(&s, "PUT", &format!("/topics/life/groups/{long_ok}"));
    assert_eq!(a.status, 201, "a 128-character name: {}", a.text());
    let too_long = "g".repeat(129);
    for bad in ["bad%21name", "sp%20ace", too_long.as_str(), "a%2Fb"] {
        for method in ["PUT", "GET", "DELETE"] {
            assert_400(
                &call(&s, method, &format!("/topics/life/groups/{bad}")),
                &format!("{method} group {bad}"),
            );
        }
        assert_400(
            &call(&s, "GET", &format!("/consume?topic=life&group={bad}")),
            &format!("consume group={bad}"),
        );
        for op in ["ack", "nack", "extend"] {
            assert_400(
                &settle(&s, op, "life", &m.handle, &format!("&group={bad}")),
                &format!("{op} group={bad}"),
            );
        }
    }
    assert_400(
        &call(&s, "GET", "/consume?topic=life&group="),
        "consume with an empty group name",
    );
    assert!(
        !group_states(&s, "life").keys().any(|g| g.contains("bad")),
        "a refused name was created"
    );
}

/// `max_groups` (default 32) caps the groups of a topic, `default` included: one more is `409 group_limit`, by
/// PUT and by a first consume; deleting one makes room.
#[test]
fn more_groups_than_max_groups_is_409_group_limit() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("cap", "max_groups=3");
    s.produce("cap", "", b"x");
    assert_eq!(topic_config(&s, "cap")["max_groups"], 3);
    assert_eq!(call(&s, "PUT", "/topics/cap/groups/a").status, 201);
    must_consume(&s, "cap", "&group=b");
    assert_eq!(group_states(&s, "cap").len(), 3);
    assert_error(&call(&s, "PUT", "/topics/cap/groups/c"), 409, "group_limit");
    let a = call(&s, "GET", "/consume?topic=cap&group=d");
    assert_error(&a, 409, "group_limit");
    assert_eq!(
        group_states(&s, "cap").keys().collect::<Vec<_>>(),
        vec!["a", "b", "default"]
    );
    // An existing group is still 200 at the cap.
    assert_eq!(call(&s, "PUT", "/topics/cap/groups/a").status, 200);
    assert_eq!(call(&s, "DELETE", "/topics/cap/groups/a").status, 204);
    assert_eq!(call(&s, "PUT", "/topics/cap/groups/c").status, 201);

    // The default of 32.
    s.create_topic("cap32", "");
    assert_eq!(topic_config(&s, "cap32")["max_groups"], 32);
    for i in 0..31 {
        let a = call(&s, "PUT", &format!("/topics/cap32/groups/g{i}"));
        assert_eq!(a.status, 201, "group {i}: {}", a.text());
    }
    assert_eq!(group_states(&s, "cap32").len(), 32);
    assert_error(
        &call(&s, "PUT", "/topics/cap32/groups/one-more"),
        409,
        "group_limit",
    );
}

/// Caps are per group: `max_in_flight` reached in one group (204 there) does not stop another, and each group
/// has its own acked-ahead set under `max_acked_ahead` (503 acked_ahead_full in one, 200 in the other).
#[test]
fn max_in_flight_and_max_acked_ahead_apply_to_each_group_on_its_own() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("caps", "max_in_flight=3&max_acked_ahead=1");
    for i in 0..4 {
        s.produce("caps", "", format!("c{i}").as_bytes());
    }
    let a: Vec<Msg> = (0..3)
        .map(|_| must_consume(&s, "caps", "&group=a"))
        .collect();
    assert_nothing(
        &s,
        "caps",
        "&group=a",
        "group a holds max_in_flight=3 leases",
    );
    let b: Vec<Msg> = (0..3)
        .map(|_| must_consume(&s, "caps", "&group=b"))
        .collect();
    assert_eq!(
        b.iter().map(|m| m.offset).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "group b is not held back by group a's leases"
    );
    settle_ok(&s, "ack", "caps", &a[1].handle, "&group=a");
    let full = settle(&s, "ack", "caps", &a[2].handle, "&group=a");
    assert_error(&full, 503, "acked_ahead_full");
    assert!(
        full.header("retry-after").is_some(),
        "503 without Retry-After"
    );
    // b's acked-ahead set is its own: empty.
    settle_ok(&s, "ack", "caps", &b[2].handle, "&group=b");
    let states = group_states(&s, "caps");
    assert_eq!(states["a"], vec![(0, 2, 1)]);
    assert_eq!(states["b"], vec![(0, 2, 1)]);
    assert_eq!(states["default"], vec![(0, 0, 0)]);
    // The default group still has every place.
    let d: Vec<u64> = (0..3)
        .map(|_| must_consume(&s, "caps", "").offset)
        .collect();
    assert_eq!(d, vec![0, 1, 2]);
}

/// A nack in group `a` wakes `a`'s parked consumer at once and never `b`'s: `b`'s consumer stays parked through
/// it (and is not handed `a`'s message), then returns promptly when a produce arrives.
#[test]
fn a_nack_in_one_group_never_wakes_another_groups_parked_consumer() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("wake", "");
    assert_eq!(s.produce("wake", "", b"m0"), (0, 0));
    let a = call(&s, "PUT", "/topics/wake/groups/b?start=latest");
    assert_eq!(a.status, 201, "{}", a.text());
    let m0 = must_consume(&s, "wake", "&group=a");
    assert_eq!(m0.offset, 0);

    let park = |group: &str| {
        let (tx, rx) = mpsc::channel();
        let client = s.client.clone();
        let group = group.to_string();
        thread::spawn(move || {
            let a = client
                .call(
                    "GET",
                    &format!("/consume?topic=wake&group={group}&wait=5s"),
                    &[],
                )
                .expect("parked consume");
            let _ = tx.send((Instant::now(), a));
        });
        rx
    };
    let parked_b = park("b");
    let parked_a = park("a");
    // Both must be parked (neither has anything): neither answers within 300 ms.
    assert!(
        parked_b.recv_timeout(ms(300)).is_err(),
        "b's consumer returned without a message to deliver"
    );
    assert!(
        parked_a.recv_timeout(ms(1)).is_err(),
        "a's consumer returned while its only message was leased"
    );

    let nacked = Instant::now();
    settle_ok(&s, "nack", "wake", &m0.handle, "&group=a");
    let (at, a) = parked_a
        .recv_timeout(ms(2000))
        .expect("a's parked consumer was not woken by a's nack");
    let m = msg_of(&a);
    assert_eq!((m.offset, m.delivery_count), (0, 2), "{m:?}");
    assert!(
        at - nacked < ms(1000),
        "a woke {:?} after the nack",
        at - nacked
    );
    // b stays parked through a's nack.
    if let Ok((at, a)) = parked_b.recv_timeout(ms(700)) {
        panic!(
            "b's parked consumer returned {} ({}) {:?} after a's nack",
            a.status,
            a.text(),
            at - nacked
        );
    }
    // A produce wakes b at once.
    let produced = Instant::now();
    assert_eq!(s.produce("wake", "", b"m1"), (0, 1));
    let (at, a) = parked_b
        .recv_timeout(ms(3000))
        .expect("b's parked consumer did not return after a produce");
    let m = msg_of(&a);
    assert_eq!((m.offset, m.body.as_slice()), (1, &b"m1"[..]), "{m:?}");
    assert!(
        at - produced < ms(1000),
        "b returned {:?} after the produce",
        at - produced
    );
}

/// Each group's frontier is its own file (`consumer.offset` for `default`, `consumer.{group}.offset` for another),
/// durable within the flush interval (in the journal, which the restart replays into the files), and survives
/// kill -9, while a group that acked only ahead of its frontier keeps its frontier where it was, and its acks above
/// it (durable with it: after the restart they are acked-ahead again, and only its unacked offset comes back).
#[test]
fn each_groups_frontier_has_its_own_file_and_survives_kill_9() {
    let _g = common::serial();
    let mut s = start_with(1, FAST_FLUSH);
    s.create_topic("dur", "");
    for i in 0..10 {
        s.produce("dur", "", format!("dur-{i}").as_bytes());
    }
    for g in ["g1", "g2"] {
        assert_eq!(
            call(&s, "PUT", &format!("/topics/dur/groups/{g}")).status,
            201
        );
    }
    let dir = s.partition_dir("dur", 0);
    for i in 0..6 {
        let m = must_consume(&s, "dur", "&group=g1");
        assert_eq!(m.offset, i);
        settle_ok(&s, "ack", "dur", &m.handle, "&group=g1");
    }
    for i in 0..2 {
        let m = must_consume(&s, "dur", "");
        assert_eq!(m.offset, i);
        settle_ok(&s, "ack", "dur", &m.handle, "");
    }
    // g2 leases 0..3 and acks 1 and 2 only: acked ahead, its frontier stays at 0.
    let g2: Vec<Msg> = (0..3)
        .map(|_| must_consume(&s, "dur", "&group=g2"))
        .collect();
    settle_ok(&s, "ack", "dur", &g2[1].handle, "&group=g2");
    settle_ok(&s, "ack", "dur", &g2[2].handle, "&group=g2");
    let states = group_states(&s, "dur");
    assert_eq!(states["g1"], vec![(6, 0, 0)]);
    assert_eq!(states["g2"], vec![(0, 1, 2)]);
    assert_eq!(states["default"], vec![(2, 0, 0)]);

    wait_durable(&s, "dur", "g1", 6);
    wait_durable(&s, "dur", "default", 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !common::holds_acked(&s.data_dir, "dur", 0, "g2", 0, &[(1, 3)]) {
        assert!(
            Instant::now() < deadline,
            "g2's acks above its frontier never became durable"
        );
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        read_frontier(&dir.join("consumer.g2.offset")),
        Some(0),
        "g2's file holds the frontier it started at"
    );
    s.restart();
    for (file, want) in [
        ("consumer.g1.offset", 6),
        ("consumer.offset", 2),
        ("consumer.g2.offset", 0),
    ] {
        assert_eq!(
            read_frontier(&dir.join(file)),
            Some(want),
            "{file} after the restart's replay"
        );
    }
    let states = group_states(&s, "dur");
    assert_eq!(
        states,
        BTreeMap::from([
            ("default".to_string(), vec![(2, 0, 0)]),
            ("g1".to_string(), vec![(6, 0, 0)]),
            ("g2".to_string(), vec![(0, 0, 2)]),
        ]),
        "after kill -9"
    );
    for (g, want) in [("g1", 6), ("g2", 0), ("default", 2)] {
        let m = must_consume(&s, "dur", &format!("&group={g}"));
        assert_eq!(m.offset, want, "group {g} after kill -9");
        assert_eq!(m.body, format!("dur-{want}").into_bytes());
        assert_eq!(m.delivery_count, 1, "counts restart at 1 after a crash");
    }
    // v1's view of the partition is the default group's.
    assert_eq!(s.partitions("dur")[0]["committed"], 2);
    // Same recovery rule as consumer.offset: a damaged group file reads as 0 (everything redelivers, logged
    // loudly); the other groups' files are untouched.
    s.kill9();
    let mut damaged = common::encode_frontier(6);
    damaged[3] ^= 0x04;
    std::fs::write(dir.join("consumer.g1.offset"), damaged).unwrap();
    s.restart();
    assert_eq!(
        group_states(&s, "dur"),
        BTreeMap::from([
            ("default".to_string(), vec![(2, 0, 0)]),
            ("g1".to_string(), vec![(0, 0, 0)]),
            ("g2".to_string(), vec![(0, 0, 2)]),
        ]),
        "after restarting on a damaged consumer.g1.offset"
    );
    assert!(
        s.log_text().contains("fails its check"),
        "no loud log line for the damaged group file"
    );
    let m = must_consume(&s, "dur", "&group=g1");
    assert_eq!(
        m.offset, 0,
        "a damaged group frontier redelivers from the start"
    );
    // Deleting a group removes its file; the others stay.
    assert_eq!(call(&s, "DELETE", "/topics/dur/groups/g1").status, 204);
    wait_until(ms(2000), "consumer.g1.offset removed", || {
        if dir.join("consumer.g1.offset").exists() {
            Err("still there".into())
        } else {
            Ok(())
        }
    });
    assert!(dir.join("consumer.g2.offset").exists());
    assert!(dir.join("consumer.offset").exists());
}

/// A group deleted and created again under the same name starts afresh after a kill -9, although the journal still
/// holds the deleted group's frontier records (the new group's start record comes after them); so does a topic
/// deleted and created again (its records carry the old topic's id).
#[test]
fn a_recreated_group_or_topic_never_gets_the_old_frontier_from_the_journal() {
    let _g = common::serial();
    let mut s = start_with(1, FAST_FLUSH);
    for topic in ["rg", "rt"] {
        s.create_topic(topic, "");
        for i in 0..4 {
            s.produce(topic, "", format!("{topic}-{i}").as_bytes());
        }
    }
    assert_eq!(call(&s, "PUT", "/topics/rg/groups/g").status, 201);
    for i in 0..4 {
        let m = must_consume(&s, "rg", "&group=g");
        assert_eq!(m.offset, i);
        settle_ok(&s, "ack", "rg", &m.handle, "&group=g");
        let m = must_consume(&s, "rt", "");
        settle_ok(&s, "ack", "rt", &m.handle, "");
    }
    wait_durable(&s, "rg", "g", 4);
    wait_durable(&s, "rt", "default", 4);
    assert_eq!(call(&s, "DELETE", "/topics/rg/groups/g").status, 204);
    assert_eq!(call(&s, "PUT", "/topics/rg/groups/g").status, 201);
    assert_eq!(call(&s, "DELETE", "/topics/rt").status, 204);
    s.create_topic("rt", "");
    s.produce("rt", "", b"new-0");
    s.restart();
    let dir = s.partition_dir("rg", 0);
    assert_eq!(
        read_frontier(&dir.join("consumer.g.offset")),
        Some(0),
        "the recreated group's file after the replay"
    );
    for i in 0..4 {
        let m = must_consume(&s, "rg", "&group=g");
        assert_eq!(
            (m.offset, m.body),
            (i, format!("rg-{i}").into_bytes()),
            "the recreated group starts at the oldest offset"
        );
    }
    let m = must_consume(&s, "rt", "");
    assert_eq!(
        (m.offset, m.body),
        (0, b"new-0".to_vec()),
        "the recreated topic's first message"
    );
}

/// Retention does not wait for a group: a group whose frontier falls below the oldest retained offset continues
/// from there and counts what it lost in `berth_retention_skipped_total`; a group created at its first consume
/// starts at the oldest retained offset.
#[test]
fn retention_does_not_wait_for_groups_and_counts_what_a_group_lost() {
    let _g = common::serial();
    let s = start_with(
        1,
        "max_message_bytes = 1024\nsegment_bytes = 4096\npurge_interval_ms = 200\n",
    );
    s.create_topic("ret", "retention=1s");
    assert_eq!(call(&s, "PUT", "/topics/ret/groups/slow").status, 201);
    let body = vec![b'r'; 1000];
    for i in 0..12 {
        assert_eq!(s.produce("ret", "", &body), (0, i));
    }
    let dir = s.partition_dir("ret", 0);
    // Wait until only the active segment is left and start_offset is its base offset.
    let mut start = 0;
    wait_until(ms(10_000), "retention down to the active segment", || {
        let logs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        start = s.partitions("ret")[0]["start_offset"].as_u64().unwrap();
        if logs.len() == 1 && start > 0 {
            Ok(())
        } else {
            Err(format!("{} segments, start_offset {start}", logs.len()))
        }
    });
    assert!(start < 12, "the active segment stays");
    let m = must_consume(&s, "ret", "&group=slow");
    assert_eq!(
        m.offset, start,
        "the group continues from the oldest retained"
    );
    assert_eq!(
        metric(&s, "berth_retention_skipped_total", "ret", Some("slow")),
        start,
        "what the group lost"
    );
    let m = must_consume(&s, "ret", "&group=fresh");
    assert_eq!(
        m.offset, start,
        "a group created at its first consume starts at the oldest retained offset"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Delivery policies
// ---------------------------------------------------------------------------------------------------------------

/// `Delivery-Count` is 1 at the first delivery and grows by one per redelivery (nack, expiry), per group; batch
/// replies carry `delivery_count` (ndjson and frames); after kill -9 counts restart at 1.
#[test]
fn delivery_count_grows_by_one_per_redelivery_in_headers_and_batch_replies() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("dc", "");
    s.produce("dc", "", b"zero");
    let mut count = 0;
    for _ in 0..3 {
        let m = must_consume(&s, "dc", "");
        count += 1;
        assert_eq!((m.offset, m.delivery_count), (0, count), "{m:?}");
        settle_ok(&s, "nack", "dc", &m.handle, "");
    }
    // Another group counts on its own.
    let other = must_consume(&s, "dc", "&group=other");
    assert_eq!((other.offset, other.delivery_count), (0, 1));
    // An expiry is a redelivery too.
    let leased = must_consume(&s, "dc", "&visibility=1s");
    count += 1;
    assert_eq!(leased.delivery_count, count);
    let t = Instant::now();
    let m = must_consume(&s, "dc", "&wait=5s");
    count += 1;
    assert!(
        t.elapsed() >= ms(900),
        "redelivered {:?} after a 1 s lease was taken",
        t.elapsed()
    );
    assert_eq!((m.offset, m.delivery_count), (0, count), "after an expiry");
    assert_error(
        &settle(&s, "ack", "dc", &leased.handle, ""),
        410,
        "lease_gone",
    );
    settle_ok(&s, "nack", "dc", &m.handle, "");

    // Batch replies: ndjson.
    s.produce("dc", "", &[0u8, 1, 2, 255]);
    let batch = consume_ndjson(&s, "dc", 10, "");
    count += 1;
    let got: Vec<(u64, u64, Vec<u8>)> = batch
        .iter()
        .map(|m| (m.offset, m.delivery_count, m.body.clone()))
        .collect();
    assert_eq!(
        got,
        vec![(0, count, b"zero".to_vec()), (1, 1, vec![0, 1, 2, 255])]
    );
    let handles: Vec<String> = batch.iter().map(|m| m.handle.clone()).collect();
    assert_eq!(settle_batch(&s, "nack", "dc", &handles, ""), vec![200, 200]);
    // Frames: a JSON header (with delivery_count) and the raw body per message.
    let a = s
        .client
        .call_with(
            "GET",
            "/consume?topic=dc&max=10",
            &[("accept", FRAMES)],
            &[],
        )
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    count += 1;
    let mut frames = Vec::new();
    let mut pos = 0;
    while pos < a.body.len() {
        let len = u32::from_le_bytes(a.body[pos..pos + 4].try_into().unwrap()) as usize;
        frames.push(a.body[pos + 4..pos + 4 + len].to_vec());
        pos += 4 + len;
    }
    assert_eq!(frames.len(), 4, "two frames per message");
    let h0: Value = serde_json::from_slice(&frames[0]).unwrap();
    let h1: Value = serde_json::from_slice(&frames[2]).unwrap();
    assert_eq!(
        (h0["offset"].as_u64(), h0["delivery_count"].as_u64()),
        (Some(0), Some(count))
    );
    assert_eq!(
        (h1["offset"].as_u64(), h1["delivery_count"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(frames[3], vec![0, 1, 2, 255]);

    // Counts live with the leases: after kill -9 they restart at 1.
    s.restart();
    let batch = consume_ndjson(&s, "dc", 10, "");
    let got: Vec<(u64, u64)> = batch.iter().map(|m| (m.offset, m.delivery_count)).collect();
    assert_eq!(got, vec![(0, 1), (1, 1)], "after kill -9");
}

/// `nack ... &delay=D`: not deliverable before D (checked by polling from outside), and a consumer parked with a
/// long `wait` gets it soon after D (woken when it becomes deliverable, not at the end of its `wait`).
#[test]
fn nack_with_delay_is_not_delivered_before_the_delay_and_wakes_a_parked_consumer_after_it() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("delay", "");
    s.produce("delay", "", b"d0");
    const D: u64 = 1200;
    let m0 = must_consume(&s, "delay", "");
    assert_eq!(m0.offset, 0);
    let nacked = Instant::now();
    settle_ok(&s, "nack", "delay", &m0.handle, &format!("&delay={D}ms"));
    let (tx, rx) = mpsc::channel();
    let client = s.client.clone();
    thread::spawn(move || {
        let a = client
            .call("GET", "/consume?topic=delay&wait=20s", &[])
            .expect("parked consume");
        let _ = tx.send((Instant::now(), a));
    });
    // Poll from outside until shortly before D: nothing.
    while nacked.elapsed() < ms(D - 250) {
        assert_nothing(&s, "delay", "", "before the nack delay ran out");
        if let Ok((at, a)) = rx.try_recv() {
            panic!(
                "the parked consumer returned {} {:?} after the nack, before D: {}",
                a.status,
                at - nacked,
                a.text()
            );
        }
        thread::sleep(ms(50));
    }
    let (at, a) = rx
        .recv_timeout(ms(5000))
        .expect("the parked consumer was not woken when the delayed message became deliverable");
    let m = msg_of(&a);
    assert_eq!(
        (m.offset, m.delivery_count, m.body.as_slice()),
        (0, 2, &b"d0"[..])
    );
    let after = at - nacked;
    assert!(
        after >= at_least(D),
        "delivered {after:?} after a nack with delay {D}ms"
    );
    assert!(
        after < ms(D + 800),
        "the parked consumer returned {after:?} after the nack: not woken when the delay ran out"
    );
    settle_ok(&s, "ack", "delay", &m.handle, "");
}

/// While delayed, a nacked message still counts against `max_in_flight` (the next message is not delivered until
/// the delay has run out); `delay` above 12h, negative or malformed is 400 invalid_duration and changes nothing;
/// 12h itself is accepted.
#[test]
fn a_delayed_message_counts_against_max_in_flight_and_delay_over_12h_is_400() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("dcap", "max_in_flight=1");
    s.produce("dcap", "", b"c0");
    s.produce("dcap", "", b"c1");
    const D: u64 = 600;
    let m0 = must_consume(&s, "dcap", "");
    assert_eq!(m0.offset, 0);
    let nacked = Instant::now();
    settle_ok(&s, "nack", "dcap", &m0.handle, &format!("&delay={D}ms"));
    // Poll until something comes: nothing (c1 neither) until the delay ran out, then c0 again.
    let m = loop {
        if let Some(m) = consume(&s, "dcap", "") {
            break m;
        }
        assert!(
            nacked.elapsed() < ms(D + 3000),
            "nothing delivered 3 s after the delay ran out"
        );
        thread::sleep(ms(20));
    };
    let after = nacked.elapsed();
    assert!(
        after >= at_least(D),
        "{m:?} delivered {after:?} after a nack with delay {D}ms: the delayed message did not count against max_in_flight=1"
    );
    assert_eq!((m.offset, m.delivery_count), (0, 2), "{m:?}");
    settle_ok(&s, "ack", "dcap", &m.handle, "");

    // Out of range or malformed: 400 invalid_duration, the lease untouched.
    let m1 = must_consume(&s, "dcap", "");
    assert_eq!(m1.offset, 1);
    for bad in ["13h", "43201s", "43200001ms", "-1s", "soon"] {
        let a = settle(&s, "nack", "dcap", &m1.handle, &format!("&delay={bad}"));
        assert_error(&a, 400, "invalid_duration");
    }
    assert_eq!(group_state(&s, "dcap", "default"), vec![(1, 1, 0)]);
    settle_ok(&s, "extend", "dcap", &m1.handle, "");
    // 12h is the upper bound, accepted: the message is then held back (and holds the in-flight place).
    settle_ok(&s, "nack", "dcap", &m1.handle, "&delay=12h");
    s.produce("dcap", "", b"c2");
    assert_nothing(
        &s,
        "dcap",
        "",
        "c1 delayed by 12h holds the only in-flight place",
    );
    assert_error(
        &settle(&s, "ack", "dcap", &m1.handle, ""),
        410,
        "lease_gone",
    );
}

/// `redelivery_delay` with `redelivery_backoff=exponential` and `redelivery_delay_max`, measured from outside:
/// after the n-th delivery a release by nack (without delay) or by expiry waits delay * 2^(n-1), capped; an
/// explicit `delay=0` overrides the policy; a PATCH to `fixed` applies to the live partition.
#[test]
fn exponential_redelivery_backoff_stays_within_the_configured_bounds() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic(
        "bo",
        "redelivery_delay=150ms&redelivery_backoff=exponential&redelivery_delay_max=600ms",
    );
    let c = topic_config(&s, "bo");
    assert_eq!(
        (
            c["redelivery_delay_ms"].as_u64(),
            c["redelivery_backoff"].as_str(),
            c["redelivery_delay_max_ms"].as_u64()
        ),
        (Some(150), Some("exponential"), Some(600)),
        "{c}"
    );
    s.produce("bo", "", b"bo");
    const SLACK: u64 = 450;
    // Nacks `m` (no delay), checks it is not deliverable at once, then waits parked: the gap from the nack to the
    // redelivery must lie in [want, want + SLACK).
    let redeliver = |m: &Msg, want: u64| -> Msg {
        let from = Instant::now();
        settle_ok(&s, "nack", "bo", &m.handle, "");
        if let Some(early) = consume(&s, "bo", "") {
            panic!("delivered at once after a nack, expected a {want}ms delay: {early:?}");
        }
        let got = must_consume(&s, "bo", "&wait=5s");
        let gap = from.elapsed();
        assert_eq!(got.delivery_count, m.delivery_count + 1);
        assert!(
            gap >= at_least(want) && gap < ms(want + SLACK),
            "delivery {} came {gap:?} after the nack, expected {want}ms (+ up to {SLACK}ms)",
            got.delivery_count
        );
        got
    };
    let d1 = must_consume(&s, "bo", "");
    assert_eq!(d1.delivery_count, 1);
    // After delivery n: 150 * 2^(n-1).
    let d2 = redeliver(&d1, 150);
    let d3 = redeliver(&d2, 300);
    // An explicit delay=0 overrides the policy: deliverable at once.
    settle_ok(&s, "nack", "bo", &d3.handle, "&delay=0");
    let leased_at = Instant::now();
    let d4 = must_consume(&s, "bo", "&visibility=1s");
    let leased_back = Instant::now();
    assert_eq!(d4.delivery_count, 4, "explicit delay=0 redelivers at once");
    // Released by expiry after delivery 4: 150 * 2^3 = 1200, capped at 600, from the end of the 1 s lease.
    let d5 = must_consume(&s, "bo", "&wait=5s");
    let done = Instant::now();
    assert_eq!(d5.delivery_count, 5);
    assert!(
        done - leased_at >= at_least(1000 + 600),
        "redelivered {:?} after the lease was taken; expected at least 1 s + 600 ms",
        done - leased_at
    );
    assert!(
        done - leased_back < ms(1000 + 600 + SLACK),
        "redelivered {:?} after the 1 s lease was taken: the 600 ms cap was not applied",
        done - leased_back
    );
    assert_error(&settle(&s, "ack", "bo", &d4.handle, ""), 410, "lease_gone");
    // A nack after delivery 5: 150 * 2^4 = 2400, capped at 600.
    let d6 = redeliver(&d5, 600);
    // PATCH to fixed 300ms: applies to the live partition at once.
    let a = call(
        &s,
        "PATCH",
        "/topics/bo?redelivery_backoff=fixed&redelivery_delay=300ms",
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let d7 = redeliver(&d6, 300);
    settle_ok(&s, "ack", "bo", &d7.handle, "");
}

/// `max_deliveries=N` with `dead_letter=D`: a poison message (binary, with zero bytes) nacked N times is, instead
/// of its (N+1)th delivery, appended to D with its body unchanged and settled in T for that group only; the
/// partition moves on; counted in `berth_dead_lettered_total`.
#[test]
fn a_message_past_max_deliveries_goes_to_the_dead_letter_topic_unchanged_and_the_partition_moves_on(
) {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("pq.dlq", "");
    s.create_topic("pq", "max_in_flight=1&max_deliveries=3&dead_letter=pq.dlq");
    let c = topic_config(&s, "pq");
    assert_eq!(
        (c["max_deliveries"].as_u64(), c["dead_letter"].as_str()),
        (Some(3), Some("pq.dlq")),
        "{c}"
    );
    assert_eq!(call(&s, "PUT", "/topics/pq/groups/other").status, 201);
    let poison: Vec<u8> = vec![0, b'p', 0, 0, 0xff, 0xfe, b'\n', 0];
    assert_eq!(s.produce("pq", "", &poison), (0, 0));
    assert_eq!(s.produce("pq", "", b"next"), (0, 1));
    for n in 1..=3 {
        let m = must_consume(&s, "pq", "");
        assert_eq!((m.offset, m.delivery_count), (0, n));
        assert_eq!(m.body, poison);
        settle_ok(&s, "nack", "pq", &m.handle, "");
    }
    let m = must_consume(&s, "pq", "");
    assert_eq!(
        (m.offset, m.delivery_count, m.body.as_slice()),
        (1, 1, &b"next"[..]),
        "the partition moves on past the dead-lettered message"
    );
    settle_ok(&s, "ack", "pq", &m.handle, "");
    assert_eq!(group_state(&s, "pq", "default"), vec![(2, 0, 0)]);
    assert_nothing(&s, "pq", "", "both settled");
    // Exactly one copy in the dead-letter topic, body unchanged.
    assert_eq!(replay_all(&s, "pq.dlq"), vec![poison.clone()]);
    let d = must_consume(&s, "pq.dlq", "");
    assert_eq!(d.body, poison);
    assert_eq!(metric(&s, "berth_dead_lettered_total", "pq", None), 1);
    // Settled for that group only.
    let o = must_consume(&s, "pq", "&group=other");
    assert_eq!((o.offset, o.delivery_count, o.body), (0, 1, poison.clone()));

    // The same through batch consumes (ndjson, base64 body).
    s.produce("pq", "", &poison);
    for n in 1..=3 {
        let b = consume_ndjson(&s, "pq", 10, "");
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].offset, b[0].delivery_count), (2, n));
        assert_eq!(b[0].body, poison);
        settle_ok(&s, "nack", "pq", &b[0].handle, "");
    }
    assert!(consume_ndjson(&s, "pq", 10, "").is_empty());
    assert_eq!(group_state(&s, "pq", "default"), vec![(3, 0, 0)]);
    assert_eq!(replay_all(&s, "pq.dlq"), vec![poison.clone(), poison]);
    assert_eq!(metric(&s, "berth_dead_lettered_total", "pq", None), 2);
}

/// `max_deliveries` needs `dead_letter`, and `dead_letter` must be an existing topic other than T: otherwise 400
/// (server code `invalid_parameter`), on PUT and on PATCH, and nothing is created or changed.
#[test]
fn max_deliveries_without_a_valid_dead_letter_topic_is_400() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("ok.dlq", "");
    for query in [
        "max_deliveries=3",
        "max_deliveries=3&dead_letter=x1",
        "max_deliveries=3&dead_letter=missing",
        "max_deliveries=3&dead_letter=",
    ] {
        let a = call(&s, "PUT", &format!("/topics/x1?{query}"));
        assert_error(&a, 400, "invalid_parameter");
        assert_error(&call(&s, "GET", "/topics/x1"), 404, "topic_not_found");
    }
    assert_error(
        &call(
            &s,
            "PUT",
            "/topics/x1?max_deliveries=3&dead_letter=bad%2Fname",
        ),
        400,
        "invalid_topic",
    );
    s.create_topic("x2", "max_deliveries=2&dead_letter=ok.dlq");
    let before = topic_config(&s, "x2");
    for query in [
        "dead_letter=x2",
        "dead_letter=missing",
        "dead_letter=",
        "max_deliveries=5&dead_letter=x2",
    ] {
        let a = call(&s, "PATCH", &format!("/topics/x2?{query}"));
        assert_error(&a, 400, "invalid_parameter");
    }
    assert_eq!(
        topic_config(&s, "x2"),
        before,
        "a refused PATCH changed nothing"
    );
    // max_deliveries=0 (unlimited) needs no dead-letter topic.
    let a = call(&s, "PATCH", "/topics/x2?max_deliveries=0&dead_letter=");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["config"]["max_deliveries"], 0);
}

/// `PATCH /topics/T?...` changes every setting but `partitions`: 200 with the new config, shown by
/// `GET /topics/T`, in effect at once, kept across kill -9; `partitions` is 400; unknown topic 404.
#[test]
fn patch_changes_settings_which_take_effect_and_survive_a_restart() {
    let _g = common::serial();
    let mut s = Server::start(2, &[]);
    s.create_topic("pt", "partitions=2");
    s.create_topic("pt.dlq", "");
    // The defaults of the version 2 settings.
    let defaults = topic_config(&s, "pt");
    for (k, v) in [
        ("redelivery_delay_ms", json!(0)),
        ("redelivery_backoff", json!("fixed")),
        ("redelivery_delay_max_ms", json!(900_000)),
        ("max_deliveries", json!(0)),
        ("dead_letter", Value::Null),
        ("max_groups", json!(32)),
    ] {
        assert_eq!(defaults[k], v, "default config.{k}: {defaults}");
    }
    let a = call(
        &s,
        "PATCH",
        "/topics/pt?visibility=5s&max_in_flight=1&max_acked_ahead=9&retention=1d&redelivery_delay=250ms\
         &redelivery_backoff=exponential&redelivery_delay_max=1m&max_deliveries=4&dead_letter=pt.dlq&max_groups=5",
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let config = a.json()["config"].clone();
    let want = [
        ("partitions", json!(2)),
        ("visibility_ms", json!(5000)),
        ("max_in_flight", json!(1)),
        ("max_acked_ahead", json!(9)),
        ("retention_ms", json!(86_400_000)),
        ("redelivery_delay_ms", json!(250)),
        ("redelivery_backoff", json!("exponential")),
        ("redelivery_delay_max_ms", json!(60_000)),
        ("max_deliveries", json!(4)),
        ("dead_letter", json!("pt.dlq")),
        ("max_groups", json!(5)),
    ];
    for (k, v) in &want {
        assert_eq!(&config[k], v, "PATCH reply config.{k}: {config}");
    }
    assert_eq!(
        topic_config(&s, "pt"),
        config,
        "GET shows the PATCH's config"
    );
    // In effect: max_in_flight=1 per partition.
    s.produce("pt", "&partition=0", b"a");
    s.produce("pt", "&partition=0", b"b");
    let m = must_consume(&s, "pt", "");
    assert_eq!((m.partition, m.offset), (0, 0));
    assert_nothing(&s, "pt", "", "max_in_flight=1 after the PATCH");

    // partitions cannot change; bad values are refused; nothing changes.
    for q in [
        "partitions=3",
        "partitions=2",
        "partitions=1&visibility=10s",
    ] {
        assert_400(&call(&s, "PATCH", &format!("/topics/pt?{q}")), q);
    }
    assert_error(
        &call(&s, "PATCH", "/topics/pt?visibility=13h"),
        400,
        "invalid_duration",
    );
    assert_400(
        &call(&s, "PATCH", "/topics/pt?redelivery_backoff=linear"),
        "redelivery_backoff=linear",
    );
    assert_eq!(
        topic_config(&s, "pt"),
        config,
        "refused PATCHes changed nothing"
    );
    assert_error(
        &call(&s, "PATCH", "/topics/nosuch?visibility=5s"),
        404,
        "topic_not_found",
    );

    s.restart();
    assert_eq!(topic_config(&s, "pt"), config, "after kill -9");
    // A second PATCH changes only what it names.
    let a = call(&s, "PATCH", "/topics/pt?max_in_flight=7");
    assert_eq!(a.status, 200, "{}", a.text());
    let mut want_config = config.clone();
    want_config["max_in_flight"] = json!(7);
    let modified = &a.json()["config"]["modified_ms"];
    assert!(
        modified.as_u64() > config["modified_ms"].as_u64(),
        "a PATCH is a modification: {modified}"
    );
    want_config["modified_ms"] = modified.clone();
    assert_eq!(a.json()["config"], want_config);
    s.restart();
    assert_eq!(
        topic_config(&s, "pt"),
        want_config,
        "after a second kill -9"
    );
}

/// `POST /topics/D/redrive?to=T[&max=N][&group=G]`: `200 {"moved": n}`; the messages (bodies unchanged) are in
/// T and gone from D (in that group); `max` bounds a round; another group moves its own copy; errors.
#[test]
fn redrive_moves_messages_from_the_dead_letter_topic_back() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("rd.src", "partitions=2");
    s.create_topic("rd.dst", "");
    let bodies: Vec<Vec<u8>> = vec![
        b"one".to_vec(),
        vec![0, 0, 1],
        b"three".to_vec(),
        vec![],
        vec![0xff, 0],
    ];
    for (i, b) in bodies.iter().enumerate() {
        s.produce("rd.src", &format!("&partition={}", i % 2), b);
    }
    let redrive = |q: &str| -> Answer { call(&s, "POST", &format!("/topics/rd.src/redrive?{q}")) };
    let a = redrive("to=rd.dst&max=2");
    assert_eq!(
        (a.status, a.json()),
        (200, json!({"moved": 2})),
        "{}",
        a.text()
    );
    assert_eq!(s.partitions("rd.dst")[0]["end_offset"], 2);
    let a = redrive("to=rd.dst");
    assert_eq!(
        (a.status, a.json()),
        (200, json!({"moved": 3})),
        "{}",
        a.text()
    );
    let a = redrive("to=rd.dst");
    assert_eq!(
        (a.status, a.json()),
        (200, json!({"moved": 0})),
        "{}",
        a.text()
    );
    // Gone from the source (default group), all in the target.
    assert_nothing(
        &s,
        "rd.src",
        "",
        "redriven messages are acked in the source",
    );
    assert_eq!(
        group_state(&s, "rd.src", "default"),
        vec![(3, 0, 0), (2, 0, 0)]
    );
    let mut moved = replay_all(&s, "rd.dst");
    moved.sort();
    let mut want = bodies.clone();
    want.sort();
    assert_eq!(
        moved, want,
        "the target holds exactly the source's messages"
    );
    // Another group reads the source on its own.
    let a = redrive("to=rd.dst&group=g2");
    assert_eq!(
        (a.status, a.json()),
        (200, json!({"moved": 5})),
        "{}",
        a.text()
    );
    assert_eq!(s.partitions("rd.dst")[0]["end_offset"], 10);
    assert_eq!(group_state(&s, "rd.src", "g2"), vec![(3, 0, 0), (2, 0, 0)]);
    // A leased message is not available now: it stays.
    s.produce("rd.src", "&partition=0", b"leased");
    s.produce("rd.src", "&partition=0", b"free");
    let m = must_consume(&s, "rd.src", "");
    assert_eq!(m.body, b"leased");
    let a = redrive("to=rd.dst");
    assert_eq!(
        (a.status, a.json()),
        (200, json!({"moved": 1})),
        "{}",
        a.text()
    );
    assert_eq!(replay_all(&s, "rd.dst").last().unwrap(), b"free");
    settle_ok(&s, "ack", "rd.src", &m.handle, "");

    // Errors.
    assert_400(&redrive("to=rd.src"), "redrive to itself");
    assert_400(&redrive(""), "redrive without to");
    assert_400(&redrive("to=rd.dst&max=0"), "max=0");
    assert_error(&redrive("to=missing"), 404, "topic_not_found");
    assert_error(
        &call(&s, "POST", "/topics/missing/redrive?to=rd.dst"),
        404,
        "topic_not_found",
    );
    assert_eq!(call(&s, "GET", "/topics/rd.src/redrive").status, 405);
}

/// kill -9 right around the delivery that dead-letters a message (between its append to the dead-letter topic and
/// its settle in the source, with luck): after the restart the message is in the dead-letter topic, or still
/// deliverable in the source, or both; never neither.
#[test]
fn kill_9_while_dead_lettering_leaves_a_copy_in_at_least_one_place() {
    let _g = common::serial();
    let mut s = start_with(1, FAST_FLUSH);
    s.create_topic("cr.dlq", "");
    s.create_topic("cr", "max_deliveries=1&dead_letter=cr.dlq");
    let mut outcomes = Vec::new();
    // Kill delays (µs after the consume is sent): from before the append, through the window, to after the settle
    // had time to reach consumer.offset (20 ms flush).
    let delays = [0u64, 500, 1000, 1500, 2000, 3000, 5000, 40_000];
    for (round, delay_us) in delays.into_iter().enumerate() {
        let body = format!("crash-{round}").into_bytes();
        s.produce("cr", "", &body);
        let m = must_consume(&s, "cr", "");
        assert_eq!(m.body, body);
        settle_ok(&s, "nack", "cr", &m.handle, "");
        // This consume dead-letters it; kill -9 lands somewhere around it.
        let client = s.client.clone();
        let consumer = thread::spawn(move || {
            let _ = client.call("GET", "/consume?topic=cr", &[]);
        });
        thread::sleep(Duration::from_micros(delay_us));
        // Killed first and the consumer joined before the restart, so its request never reaches the new process.
        s.kill9();
        consumer.join().unwrap();
        s.restart();
        let in_dlq = replay_all(&s, "cr.dlq").contains(&body);
        let mut in_source = false;
        while let Some(m) = consume(&s, "cr", "") {
            assert_eq!(m.delivery_count, 1);
            in_source |= m.body == body;
            settle_ok(&s, "ack", "cr", &m.handle, "");
        }
        assert!(
            in_dlq || in_source,
            "round {round}: the message is neither in the dead-letter topic nor in the source"
        );
        outcomes.push((in_dlq, in_source));
    }
    eprintln!("(in dead-letter topic, in source) per round: {outcomes:?}");
}

/// A topic that another names as its dead-letter topic cannot be deleted (its poison messages would have nowhere to
/// go): `409 topic_in_use`, nothing changed; once the other topic stops naming it, it can.
#[test]
fn a_dead_letter_topic_in_use_cannot_be_deleted() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("used.dlq", "");
    s.create_topic("src", "max_deliveries=2&dead_letter=used.dlq");
    assert_error(&call(&s, "DELETE", "/topics/used.dlq"), 409, "topic_in_use");
    assert_eq!(call(&s, "GET", "/topics/used.dlq").status, 200);
    assert_eq!(topic_config(&s, "src")["dead_letter"], "used.dlq");
    let cleared = call(&s, "PATCH", "/topics/src?max_deliveries=0&dead_letter=");
    assert_eq!(cleared.status, 200, "{}", cleared.text());
    assert_eq!(call(&s, "DELETE", "/topics/used.dlq").status, 204);
    assert_error(&call(&s, "GET", "/topics/used.dlq"), 404, "topic_not_found");
}

/// `POST /topics/T/groups/G/purge` settles everything the group has not settled at once (waiting, leased, delayed
/// and acked-ahead alike), on every partition, durably before the answer: a kill -9 right after it brings nothing
/// back. Other groups keep their messages; the group goes on with what is produced after.
#[test]
fn a_purge_settles_everything_at_once_and_survives_kill_9() {
    let _g = common::serial();
    let mut s = start_with(2, "frontier_flush_interval_ms = 60000\n");
    s.create_topic("pg", "partitions=2");
    for i in 0..10 {
        s.produce(
            "pg",
            &format!("&partition={}", i % 2),
            format!("m{i}").as_bytes(),
        );
    }
    s.produce("pg", "&partition=0&delay=10m", b"later");
    // The audit group reads everything; default leases two and acks one above a leased one.
    assert_eq!(s.put("/topics/pg/groups/audit").status, 201);
    let h0 = consume(&s, "pg", "").unwrap().handle;
    let h1 = consume(&s, "pg", "").unwrap().handle;
    assert_eq!(settle(&s, "ack", "pg", &h1, "").status, 200);
    let a = s.post("/topics/pg/groups/default/purge", b"");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        a.json(),
        json!({"group": "default", "purged": 10, "topic": "pg"}),
        "eleven produced, one acked"
    );
    assert_eq!(
        settle(&s, "ack", "pg", &h0, "").status,
        410,
        "a purged lease is gone"
    );
    assert!(consume(&s, "pg", "&wait=200ms").is_none());
    assert_error(
        &s.post("/topics/pg/groups/nope/purge", b""),
        404,
        "group_not_found",
    );
    assert_error(
        &s.post("/topics/nope/groups/default/purge", b""),
        404,
        "topic_not_found",
    );
    assert_eq!(s.get("/topics/pg/groups/default/purge").status, 405);
    // The frontier flush is a minute away: only the purge's own write keeps it across a crash.
    s.kill9();
    s.restart();
    assert!(
        consume(&s, "pg", "&wait=200ms").is_none(),
        "nothing purged comes back after kill -9"
    );
    let mut audit = 0;
    while consume(&s, "pg", "&group=audit").is_some() {
        audit += 1;
    }
    assert_eq!(
        audit, 10,
        "another group keeps its messages (the delayed one is not due)"
    );
    s.produce("pg", "&partition=1", b"after");
    let body = consume(&s, "pg", "&wait=1s").unwrap().body;
    assert_eq!(body, b"after", "the group goes on");
}

/// The topic settings `delay`, `receive_wait` and `max_message_bytes` (SQS's DelaySeconds,
/// ReceiveMessageWaitTimeSeconds, MaximumMessageSize): set by PATCH, applied to produces and consumes that give no
/// value of their own, kept across a restart.
#[test]
fn topic_delay_receive_wait_and_message_size_apply_to_what_gives_none() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("tw", "");
    assert_error(
        &call(&s, "PATCH", "/topics/tw?delay=16m"),
        400,
        "invalid_duration",
    );
    assert_error(
        &call(&s, "PATCH", "/topics/tw?receive_wait=21s"),
        400,
        "invalid_duration",
    );
    assert_error(
        &call(&s, "PATCH", "/topics/tw?max_message_bytes=2000000"),
        400,
        "invalid_parameter",
    );
    let a = call(
        &s,
        "PATCH",
        "/topics/tw?delay=700ms&receive_wait=3s&max_message_bytes=16",
    );
    assert_eq!(a.status, 200, "{}", a.text());
    s.restart();
    let config = topic_config(&s, "tw");
    assert_eq!(
        (
            &config["delay_ms"],
            &config["receive_wait_ms"],
            &config["max_message_bytes"]
        ),
        (&json!(700), &json!(3000), &json!(16)),
        "{config}"
    );
    let (created, modified) = (
        config["created_ms"].as_u64(),
        config["modified_ms"].as_u64(),
    );
    assert!(created.unwrap() > 0 && modified > created, "{config}");
    assert_error(
        &s.post("/produce?topic=tw", b"seventeen bytes.."),
        413,
        "message_too_large",
    );
    // No `wait`: the topic's receive_wait parks the consume until the topic's delay lets the message out.
    let started = Instant::now();
    s.produce("tw", "", b"held");
    let Msg {
        handle: h, body, ..
    } = consume(&s, "tw", "").expect("delivered within receive_wait");
    let waited = started.elapsed();
    assert_eq!(body, b"held");
    assert!(
        waited >= at_least(700) && waited < ms(2900),
        "waited {waited:?}"
    );
    assert_eq!(settle(&s, "ack", "tw", &h, "").status, 200);
    // Its own delay=0 and wait=0 win over the topic's.
    s.produce("tw", "&delay=0", b"now");
    let started = Instant::now();
    let body = consume(&s, "tw", "&wait=0").expect("not delayed").body;
    assert_eq!(body, b"now");
    assert!(consume(&s, "tw", "&wait=0").is_none());
    assert!(started.elapsed() < ms(500), "wait=0 does not park");
}
