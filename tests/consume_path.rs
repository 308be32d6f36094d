mod common;

// End-to-end tests of the consume path (seed/consume-path.md, design/api.md): leases, receipt handles, settle
// validation, long-poll wake-ups, caps, the durable frontier across crashes and shutdowns, corrupt-record skipping,
// replay, metrics and the command line. Every test runs the real binary (tests/common).

use berth::client::{Answer, Client};
use common::{consume, settle, Delivered, Server};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Asserts an error answer: exact status and `{"error": code}`.
fn assert_error(a: &Answer, status: u16, code: &str, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.text());
    assert_eq!(
        a.json()["error"].as_str(),
        Some(code),
        "{what}: body {}",
        a.text()
    );
}

/// A settle request (ack, nack, extend) with its full answer.
fn settle_answer(s: &Server, op: &str, topic: &str, handle: &str, extra: &str) -> Answer {
    s.post(
        &format!("/{op}?topic={topic}&receipt_handle={handle}{extra}"),
        b"",
    )
}

/// One numeric field of one partition in `GET /topics/{topic}`.
fn field(s: &Server, topic: &str, partition: usize, name: &str) -> u64 {
    let parts = s.partitions(topic);
    parts[partition][name]
        .as_u64()
        .unwrap_or_else(|| panic!("partition {partition} has no numeric '{name}': {parts:?}"))
}

/// Polls a partition field until it equals `want`, within `limit`.
fn wait_for_field(
    s: &Server,
    topic: &str,
    partition: usize,
    name: &str,
    want: u64,
    limit: Duration,
) {
    let start = Instant::now();
    loop {
        let got = field(s, topic, partition, name);
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{topic}/{partition} {name} is {got}, expected {want} within {limit:?}"
        );
        thread::sleep(ms(10));
    }
}

fn read_frontier(partition_dir: &Path) -> Option<u64> {
    common::decode_frontier(&std::fs::read(partition_dir.join("consumer.offset")).ok()?)
}

/// Values of the Prometheus series `name` whose labels include every pair of `want`.
fn metric_values(text: &str, name: &str, want: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let matches = want
                .iter()
                .all(|(k, v)| labels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            if matches {
                value.parse().ok()
            } else {
                None
            }
        })
        .collect()
}

fn metric_sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    metric_values(text, name, want).iter().sum()
}

fn metrics(s: &Server) -> String {
    let a = s.get("/metrics");
    assert_eq!(a.status, 200, "{}", a.text());
    a.text()
}

/// `p:o:n` → (p, o, n).
fn parse_handle(h: &str) -> (u64, u64, u64) {
    let v: Vec<u64> = h
        .split(':')
        .map(|x| x.parse().unwrap_or_else(|_| panic!("bad handle {h}")))
        .collect();
    assert_eq!(v.len(), 3, "handle {h}");
    (v[0], v[1], v[2])
}

/// Open client connections per core, from /metrics.
fn connections_per_core(s: &Server, cores: usize) -> Vec<u64> {
    let text = metrics(s);
    (0..cores)
        .map(|c| {
            let v = metric_values(&text, "berth_connections_open", &[("core", &c.to_string())]);
            assert_eq!(v.len(), 1, "connections_open for core {c}:\n{text}");
            v[0] as u64
        })
        .collect()
}

/// A client whose kept-alive connection is served by `core` (found through the per-core connection gauge). Clients
/// whose connection landed on another core are kept open in `spare` so the gauge stays easy to read.
fn client_on_core(s: &Server, cores: usize, core: usize, spare: &mut Vec<Client>) -> Client {
    for _ in 0..100 {
        let before = connections_per_core(s, cores);
        let c = Client::new(&s.url());
        assert_eq!(c.call("GET", "/health", &[]).unwrap().status, 200);
        let after = connections_per_core(s, cores);
        let grew: Vec<usize> = (0..cores).filter(|&i| after[i] > before[i]).collect();
        let total_before: u64 = before.iter().sum();
        let total_after: u64 = after.iter().sum();
        if grew == [core] && total_after == total_before + 1 {
            return c;
        }
        spare.push(c);
    }
    panic!("could not get a connection on core {core}");
}

/// What a consumer thread reports: (its index, when its reply arrived, what it got).
type Reply = (usize, Instant, Option<Delivered>);

/// Starts a consumer thread doing one `GET /consume` with `extra` on its own client.
fn spawn_consumer(
    client: Client,
    topic: &str,
    extra: &str,
    idx: usize,
    tx: mpsc::Sender<Reply>,
) -> thread::JoinHandle<()> {
    let topic = topic.to_string();
    let extra = extra.to_string();
    thread::spawn(move || {
        let got = consume(&client, &topic, &extra);
        let at = Instant::now();
        let _ = tx.send((idx, at, got));
    })
}

/// The core owning each partition, from `GET /topics/{topic}`.
fn owners(s: &Server, topic: &str) -> Vec<usize> {
    s.partitions(topic)
        .iter()
        .map(|p| p["core"].as_u64().unwrap() as usize)
        .collect()
}

// ---------------------------------------------------------------------------------------------------------------
// 1. Validation and the simple refusals
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn consume_on_empty_topic_without_wait_answers_204_at_once() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("empty", "");
    for extra in ["", "&wait=0", "&wait=0s"] {
        let start = Instant::now();
        let a = s.get(&format!("/consume?topic=empty{extra}"));
        let took = start.elapsed();
        assert_eq!(a.status, 204, "consume{extra}: {}", a.text());
        assert!(a.body.is_empty(), "204 carries no body");
        assert!(a.header("receipt-handle").is_none());
        assert!(took < ms(250), "wait=0 must not park: took {took:?}");
    }
}

#[test]
fn consume_and_settle_on_unknown_topic_is_404_topic_not_found() {
    let s = Server::start(1, &[]);
    assert_error(
        &s.get("/consume?topic=nope&wait=0"),
        404,
        "topic_not_found",
        "consume",
    );
    assert_error(
        &s.get("/consume?topic=nope&partition=0&offset=0"),
        404,
        "topic_not_found",
        "replay",
    );
    for op in ["ack", "nack", "extend"] {
        assert_error(
            &settle_answer(&s, op, "nope", "0:0:1", ""),
            404,
            "topic_not_found",
            op,
        );
    }
}

#[test]
fn bad_wait_is_400_invalid_duration() {
    let s = Server::start(1, &[]);
    s.create_topic("w", "");
    s.produce("w", "", b"x");
    for wait in ["61s", "-1", "abc", "10x", "1.5s", ""] {
        assert_error(
            &s.get(&format!("/consume?topic=w&wait={wait}")),
            400,
            "invalid_duration",
            &format!("wait={wait}"),
        );
    }
    // Nothing was leased by the refused requests.
    assert_eq!(field(&s, "w", 0, "in_flight"), 0);
    // The edges are accepted.
    assert!(consume(&s.client, "w", "&wait=60s").is_some());
}

#[test]
fn bad_visibility_is_400_invalid_duration_on_consume_and_extend() {
    let s = Server::start(1, &[]);
    s.create_topic("v", "");
    s.produce("v", "", b"x");
    for vis in ["500ms", "999ms", "13h", "-1", "abc"] {
        assert_error(
            &s.get(&format!("/consume?topic=v&visibility={vis}")),
            400,
            "invalid_duration",
            &format!("consume visibility={vis}"),
        );
    }
    assert_eq!(field(&s, "v", 0, "in_flight"), 0);
    let (_, _, handle, _) = consume(&s.client, "v", "&visibility=1s").expect("1s is the minimum");
    for vis in ["500ms", "13h"] {
        assert_error(
            &settle_answer(&s, "extend", "v", &handle, &format!("&visibility={vis}")),
            400,
            "invalid_duration",
            &format!("extend visibility={vis}"),
        );
    }
    assert_eq!(
        settle(&s.client, "extend", "v", &handle, "&visibility=12h"),
        200
    );
    assert_eq!(settle(&s.client, "ack", "v", &handle, ""), 200);
}

#[test]
fn malformed_receipt_handles_are_400_on_ack_nack_and_extend() {
    let s = Server::start(1, &[]);
    s.create_topic("h", "");
    s.produce("h", "", b"x");
    let (_, _, live, _) = consume(&s.client, "h", "").unwrap();
    let bad = [
        "1:2",
        "a:b:c",
        "1:2:3:4",
        "-1:0:0",
        "",
        "99999999999999999999999:0:0",
        "18446744073709551616:0:0",
        "1::3",
        "%201:2:3",
        "+1:2:3",
    ];
    for op in ["ack", "nack", "extend"] {
        for handle in bad {
            assert_error(
                &settle_answer(&s, op, "h", handle, ""),
                400,
                "invalid_receipt_handle",
                &format!("{op} '{handle}'"),
            );
        }
        // No receipt_handle parameter at all.
        assert_error(
            &s.post(&format!("/{op}?topic=h"), b""),
            400,
            "invalid_receipt_handle",
            &format!("{op} without a handle"),
        );
    }
    // None of it touched the live lease.
    assert_eq!(field(&s, "h", 0, "in_flight"), 1);
    assert_eq!(settle(&s.client, "ack", "h", &live, ""), 200);
}

#[test]
fn never_issued_handle_is_410_lease_gone() {
    let s = Server::start(1, &[]);
    s.create_topic("n", "");
    s.produce("n", "", b"a");
    s.produce("n", "", b"b");
    let (_, _, live, _) = consume(&s.client, "n", "").unwrap();
    let (p, o, nonce) = parse_handle(&live);
    let wrong_nonce = format!("{p}:{o}:{}", nonce.wrapping_add(1));
    // Offset 1 exists but is not leased; offset 99 does not exist; offset 0 is leased under another nonce.
    for handle in ["0:1:1", "0:99:1", "0:0:0", wrong_nonce.as_str()] {
        for op in ["ack", "nack", "extend"] {
            assert_error(
                &settle_answer(&s, op, "n", handle, ""),
                410,
                "lease_gone",
                &format!("{op} {handle}"),
            );
        }
    }
    // A 410 changes nothing: the real lease is intact and offset 1 is still deliverable.
    assert_eq!(field(&s, "n", 0, "in_flight"), 1);
    assert_eq!(field(&s, "n", 0, "committed"), 0);
    assert_eq!(settle(&s.client, "ack", "n", &live, ""), 200);
    let (_, o1, _, body) = consume(&s.client, "n", "").unwrap();
    assert_eq!((o1, body.as_slice()), (1, &b"b"[..]));
}

#[test]
fn handle_with_partition_out_of_range_is_404_partition_not_found() {
    let s = Server::start(1, &[]);
    s.create_topic("pr", "partitions=2");
    for handle in ["2:0:1", "7:0:1", "18446744073709551615:0:1"] {
        for op in ["ack", "nack", "extend"] {
            assert_error(
                &settle_answer(&s, op, "pr", handle, ""),
                404,
                "partition_not_found",
                &format!("{op} {handle}"),
            );
        }
    }
    assert_error(
        &s.get("/consume?topic=pr&partition=2&offset=0"),
        404,
        "partition_not_found",
        "replay",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 2. The happy path
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn produce_consume_ack_delivers_once_and_advances_committed() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("happy", "");
    let body: &[u8] = b"hello\x00\xffworld\r\n";
    assert_eq!(s.produce("happy", "", body), (0, 0));

    let a = s.get("/consume?topic=happy&visibility=1s");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.body, body);
    assert_eq!(a.header("partition"), Some("0"));
    assert_eq!(a.header("offset"), Some("0"));
    let handle = a
        .header("receipt-handle")
        .expect("Receipt-Handle")
        .to_string();
    let (p, o, _) = parse_handle(&handle);
    assert_eq!((p, o), (0, 0), "handle {handle} names partition:offset");
    assert_eq!(field(&s, "happy", 0, "in_flight"), 1);

    assert_eq!(settle(&s.client, "ack", "happy", &handle, ""), 200);
    assert_error(
        &settle_answer(&s, "ack", "happy", &handle, ""),
        410,
        "lease_gone",
        "second ack",
    );
    wait_for_field(&s, "happy", 0, "committed", 1, ms(2000));
    assert_eq!(field(&s, "happy", 0, "in_flight"), 0);

    // Had the ack not settled, the 1 s lease would expire and redeliver within this wait.
    let start = Instant::now();
    assert_eq!(consume(&s.client, "happy", "&wait=1500ms"), None);
    assert!(
        start.elapsed() >= ms(1400),
        "204 came early: {:?}",
        start.elapsed()
    );
    assert_eq!(field(&s, "happy", 0, "committed"), 1);
}

// ---------------------------------------------------------------------------------------------------------------
// 3. Stale handles after expiry + re-reservation
// ---------------------------------------------------------------------------------------------------------------

/// Consumes with a 1 s lease, lets it expire into a second consumer's hands, then tries `op` with the first handle.
fn late_settle_after_redelivery_gets_410(op: &str) {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    let topic = format!("late-{op}");
    s.create_topic(&topic, "");
    s.produce(&topic, "", b"payload");

    let before_first = Instant::now();
    let (_, o1, h1, _) = consume(&s.client, &topic, "&visibility=1s").unwrap();
    let first_replied = Instant::now();
    assert_eq!(o1, 0);

    let (_, o2, h2, body) = consume(&s.client, &topic, "&wait=5s&visibility=30s")
        .expect("the expired lease must redeliver within wait=5s");
    let redelivered = Instant::now();
    assert_eq!((o2, body.as_slice()), (0, &b"payload"[..]));
    assert_ne!(h1, h2, "a re-reservation carries a new nonce");
    let since_lease = redelivered - before_first;
    let since_reply = redelivered - first_replied;
    eprintln!("{op}: redelivered {since_lease:?} after the 1 s lease was asked for");
    assert!(
        since_lease >= ms(990),
        "redelivered before the 1 s visibility ran out: {since_lease:?}"
    );
    assert!(
        since_reply < ms(2500),
        "redelivery lagged the 1 s visibility: {since_reply:?}"
    );

    let extra = if op == "extend" {
        "&visibility=30s"
    } else {
        ""
    };
    assert_error(
        &settle_answer(&s, op, &topic, &h1, extra),
        410,
        "lease_gone",
        &format!("late {op}"),
    );
    // The 410 changed nothing: the second lease is live and still the only one.
    assert_eq!(field(&s, &topic, 0, "in_flight"), 1);
    assert_eq!(field(&s, &topic, 0, "committed"), 0);
    assert_eq!(
        consume(&s.client, &topic, ""),
        None,
        "offset 0 is still leased"
    );
    assert_eq!(settle(&s.client, "ack", &topic, &h2, ""), 200);
    wait_for_field(&s, &topic, 0, "committed", 1, ms(2000));
    let m = metrics(&s);
    assert_eq!(
        metric_sum(&m, "berth_lease_gone_total", &[("topic", &topic)]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "berth_expired_total", &[("topic", &topic)]),
        1.0
    );
}

#[test]
fn stale_ack_after_redelivery_gets_410() {
    late_settle_after_redelivery_gets_410("ack");
}

#[test]
fn stale_extend_after_redelivery_gets_410() {
    late_settle_after_redelivery_gets_410("extend");
}

#[test]
fn stale_nack_after_redelivery_gets_410() {
    late_settle_after_redelivery_gets_410("nack");
}

// ---------------------------------------------------------------------------------------------------------------
// 4. Extend
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn extended_lease_outlives_its_first_deadline() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("ext", "");
    s.produce("ext", "", b"x");
    let leased_at = Instant::now();
    let (_, _, handle, _) = consume(&s.client, "ext", "&visibility=1s").unwrap();
    thread::sleep((leased_at + ms(500)).saturating_duration_since(Instant::now()));
    assert_eq!(
        settle(&s.client, "extend", "ext", &handle, "&visibility=3s"),
        200
    );
    let extended_at = Instant::now();
    assert!(
        extended_at - leased_at < ms(900),
        "the extend came too late to prove anything: {:?}",
        extended_at - leased_at
    );

    // Spans the original 1 s deadline by ~1 s, ends well before the new one (~3.5 s).
    let start = Instant::now();
    let got = consume(&s.client, "ext", "&wait=1500ms");
    let took = start.elapsed();
    assert_eq!(
        got, None,
        "the extended lease expired at its first deadline"
    );
    assert!(
        took >= ms(1400),
        "204 came before the wait ran out: {took:?}"
    );
    assert_eq!(field(&s, "ext", 0, "in_flight"), 1);
    assert_eq!(settle(&s.client, "ack", "ext", &handle, ""), 200);
    wait_for_field(&s, "ext", 0, "committed", 1, ms(2000));
    let m = metrics(&s);
    assert_eq!(
        metric_sum(&m, "berth_extended_total", &[("topic", "ext")]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "berth_expired_total", &[("topic", "ext")]),
        0.0
    );
}

#[test]
fn extend_can_shorten_a_lease_even_from_the_other_core() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("shrink", "partitions=2");
    let own = owners(&s, "shrink");
    s.produce("shrink", "&partition=0", b"x");
    let (_, _, h1, _) = consume(&s.client, "shrink", "&visibility=30s").unwrap();
    // The extend arrives on the core that does not own partition 0 and goes to the owner over the mesh.
    let mut spare = Vec::new();
    let other = client_on_core(&s, 2, 1 - own[0], &mut spare);
    assert_eq!(
        settle(&other, "extend", "shrink", &h1, "&visibility=1s"),
        200
    );
    let extended_at = Instant::now();
    let (_, o, h2, _) = consume(&s.client, "shrink", "&wait=5s")
        .expect("the shortened lease must expire after ~1 s, not 30 s");
    let after = extended_at.elapsed();
    eprintln!("shortened lease redelivered {after:?} after the extend");
    assert_eq!(o, 0);
    assert_ne!(h1, h2);
    assert!(
        after >= ms(900),
        "expired before its new deadline: {after:?}"
    );
    assert!(
        after < ms(2000),
        "the shortened lease expired only after {after:?}"
    );
    assert_error(
        &settle_answer(&s, "ack", "shrink", &h1, ""),
        410,
        "lease_gone",
        "ack of the expired handle",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 5. Nack
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn nacked_offset_is_redelivered_at_once_with_a_new_handle() {
    let s = Server::start(1, &[]);
    s.create_topic("nack", "");
    s.produce("nack", "", b"zero");
    s.produce("nack", "", b"one");
    let (_, o, h1, _) = consume(&s.client, "nack", "").unwrap();
    assert_eq!(o, 0);
    assert_eq!(settle(&s.client, "nack", "nack", &h1, ""), 200);
    assert_eq!(field(&s, "nack", 0, "in_flight"), 0);
    // Lowest offset first: the nacked 0 comes back before 1.
    let (_, o, h2, body) = consume(&s.client, "nack", "").expect("deliverable again at once");
    assert_eq!((o, body.as_slice()), (0, &b"zero"[..]));
    assert_ne!(h1, h2);
    for op in ["ack", "nack", "extend"] {
        assert_error(
            &settle_answer(&s, op, "nack", &h1, ""),
            410,
            "lease_gone",
            &format!("{op} of the nacked handle"),
        );
    }
    assert_eq!(settle(&s.client, "ack", "nack", &h2, ""), 200);
    let (_, o, h3, _) = consume(&s.client, "nack", "").unwrap();
    assert_eq!(o, 1);
    assert_eq!(settle(&s.client, "ack", "nack", &h3, ""), 200);
    wait_for_field(&s, "nack", 0, "committed", 2, ms(2000));
}

#[test]
fn nack_wakes_a_parked_consumer_within_100ms() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("nackwake", "");
    s.produce("nackwake", "", b"only");
    let (_, _, h1, _) = consume(&s.client, "nackwake", "").unwrap();

    let (tx, rx) = mpsc::channel();
    let parked = spawn_consumer(Client::new(&s.url()), "nackwake", "&wait=10s", 0, tx);
    thread::sleep(ms(300));
    assert!(rx.try_recv().is_err(), "the consumer should be parked");

    assert_eq!(settle(&s.client, "nack", "nackwake", &h1, ""), 200);
    let nacked = Instant::now();
    let (_, at, got) = rx
        .recv_timeout(ms(5000))
        .expect("parked consumer never woke");
    let lag = at.saturating_duration_since(nacked);
    eprintln!("nack → parked consumer: {lag:?}");
    let (_, o, h2, _) = got.expect("the woken consumer gets the nacked offset");
    assert_eq!(o, 0);
    assert_ne!(h1, h2);
    assert!(
        lag <= ms(100),
        "nack woke the parked consumer after {lag:?}"
    );
    parked.join().unwrap();
    assert_eq!(settle(&s.client, "ack", "nackwake", &h2, ""), 200);
}

// ---------------------------------------------------------------------------------------------------------------
// 6. Long-poll wake-ups across cores
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn produce_to_either_partition_wakes_a_parked_consumer_within_100ms() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("lp", "partitions=2");
    let own = owners(&s, "lp");
    let mut cores: Vec<usize> = own.clone();
    cores.sort();
    assert_eq!(cores, [0, 1], "2 partitions on 2 cores use both: {own:?}");

    // Two parked consumers on each core.
    let mut spare = Vec::new();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for idx in 0..4 {
        let c = client_on_core(&s, 2, idx % 2, &mut spare);
        threads.push(spawn_consumer(c, "lp", "&wait=10s", idx, tx.clone()));
    }
    thread::sleep(ms(300));
    assert!(
        rx.try_recv().is_err(),
        "all four consumers should be parked"
    );

    for p in 0..2u64 {
        let (pp, _) = s.produce(
            "lp",
            &format!("&partition={p}"),
            format!("to-{p}").as_bytes(),
        );
        assert_eq!(pp, p);
        let produced = Instant::now();
        let (idx, at, got) = rx
            .recv_timeout(ms(5000))
            .unwrap_or_else(|_| panic!("produce to partition {p} woke nobody"));
        let lag = at.saturating_duration_since(produced);
        eprintln!("produce to partition {p} → consumer {idx}: {lag:?}");
        let (gp, go, _, body) = got.unwrap_or_else(|| panic!("consumer {idx} got 204"));
        assert_eq!((gp, go, body), (p, 0, format!("to-{p}").into_bytes()));
        assert!(
            lag <= ms(100),
            "produce to partition {p} (core {}) woke consumer {idx} (core {}) after {lag:?}",
            own[p as usize],
            idx % 2
        );
    }
    // Release the other two.
    s.produce("lp", "&partition=0", b"more");
    s.produce("lp", "&partition=1", b"more");
    for _ in 0..2 {
        let (idx, _, got) = rx.recv_timeout(ms(5000)).expect("released consumer");
        assert!(got.is_some(), "consumer {idx} got 204");
    }
    for t in threads {
        t.join().unwrap();
    }
    for p in 0..2 {
        assert_eq!(field(&s, "lp", p, "in_flight"), 2);
    }
}

#[test]
fn consumer_parked_on_one_core_is_woken_by_produce_on_the_other() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("xc", "partitions=2");
    let own = owners(&s, "xc");
    let mut spare = Vec::new();
    for consumer_core in 0..2usize {
        // The partition owned by the other core.
        let p = own
            .iter()
            .position(|&c| c != consumer_core)
            .expect("a partition on the other core");
        let (tx, rx) = mpsc::channel();
        let c = client_on_core(&s, 2, consumer_core, &mut spare);
        let t = spawn_consumer(c, "xc", "&wait=10s", 0, tx);
        thread::sleep(ms(300));
        assert!(rx.try_recv().is_err(), "the consumer should be parked");
        let body = format!("for-core-{consumer_core}");
        s.produce("xc", &format!("&partition={p}"), body.as_bytes());
        let produced = Instant::now();
        let (_, at, got) = rx.recv_timeout(ms(5000)).expect("no wake across cores");
        let lag = at.saturating_duration_since(produced);
        eprintln!(
            "produce on core {} → consumer on core {consumer_core}: {lag:?}",
            own[p]
        );
        let (gp, _, _, gb) = got.expect("204 instead of the produced message");
        assert_eq!((gp, gb), (p as u64, body.into_bytes()));
        assert!(
            lag <= ms(100),
            "produce on core {} woke a consumer on core {consumer_core} after {lag:?}",
            own[p]
        );
        t.join().unwrap();
    }
}

#[test]
fn empty_long_poll_returns_204_when_its_wait_runs_out() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("lp204", "partitions=2");
    let start = Instant::now();
    let got = consume(&s.client, "lp204", "&wait=1s");
    let took = start.elapsed();
    eprintln!("wait=1s on an empty topic: 204 after {took:?}");
    assert_eq!(got, None);
    assert!(took >= ms(950), "wait=1s returned after only {took:?}");
    assert!(took < ms(1500), "wait=1s returned after {took:?}");
}

#[test]
fn nack_wakes_a_consumer_parked_on_the_other_core() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("xnack", "partitions=2");
    let own = owners(&s, "xnack");
    let mut spare = Vec::new();
    for p in 0..2u64 {
        s.produce("xnack", &format!("&partition={p}"), b"x");
        let (gp, _, h1, _) = consume(&s.client, "xnack", "").unwrap();
        assert_eq!(gp, p, "the only deliverable message is on partition {p}");
        let other_core = 1 - own[p as usize];
        let (tx, rx) = mpsc::channel();
        let c = client_on_core(&s, 2, other_core, &mut spare);
        let t = spawn_consumer(c, "xnack", "&wait=10s", 0, tx);
        thread::sleep(ms(300));
        assert!(rx.try_recv().is_err(), "the consumer should be parked");
        assert_eq!(settle(&s.client, "nack", "xnack", &h1, ""), 200);
        let nacked = Instant::now();
        let (_, at, got) = rx.recv_timeout(ms(5000)).expect("no wake across cores");
        let lag = at.saturating_duration_since(nacked);
        eprintln!(
            "nack on core {} → consumer on core {other_core}: {lag:?}",
            own[p as usize]
        );
        let (gp, _, h2, _) = got.expect("204 instead of the nacked message");
        assert_eq!(gp, p);
        assert!(
            lag <= ms(100),
            "nack on core {} woke a consumer on core {other_core} after {lag:?}",
            own[p as usize]
        );
        t.join().unwrap();
        assert_eq!(settle(&s.client, "ack", "xnack", &h2, ""), 200);
    }
}

#[test]
fn lease_expiry_wakes_a_consumer_parked_on_the_other_core() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("xexp", "partitions=2");
    let own = owners(&s, "xexp");
    let mut spare = Vec::new();
    // The message lives on partition 0; the consumer is parked on the core that does not own it.
    s.produce("xexp", "&partition=0", b"x");
    let leased_at = Instant::now();
    let (_, _, h1, _) = consume(&s.client, "xexp", "&visibility=1s").unwrap();
    let (tx, rx) = mpsc::channel();
    let c = client_on_core(&s, 2, 1 - own[0], &mut spare);
    let t = spawn_consumer(c, "xexp", "&wait=5s", 0, tx);
    let (_, at, got) = rx.recv_timeout(ms(6000)).expect("consumer thread");
    t.join().unwrap();
    let (_, o, h2, _) =
        got.expect("the expired lease must wake the parked consumer within wait=5s");
    let after = at - leased_at;
    eprintln!(
        "expiry on core {} → consumer on core {}: {after:?} after the lease",
        own[0],
        1 - own[0]
    );
    assert_eq!(o, 0);
    assert_ne!(h1, h2);
    assert!(
        after >= ms(990),
        "redelivered before the lease ran out: {after:?}"
    );
    assert!(
        after < ms(2000),
        "expiry woke the other core's consumer only after {after:?}"
    );
}

#[test]
fn cap_on_one_partition_leaves_the_others_deliverable() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("capx", "partitions=2&max_in_flight=1");
    s.produce("capx", "&partition=0", b"p0-a");
    s.produce("capx", "&partition=0", b"p0-b");
    let (p, _, _, _) = consume(&s.client, "capx", "").unwrap();
    assert_eq!(p, 0, "the only deliverable partition");
    // Partition 0 is at its cap (with p0-b waiting); partition 1 is not: its message is delivered.
    s.produce("capx", "&partition=1", b"p1-a");
    let (gp, _, h, body) = consume(&s.client, "capx", "").expect("partition 1 is below its cap");
    assert_eq!((gp, body.as_slice()), (1, &b"p1-a"[..]));
    assert_eq!(settle(&s.client, "ack", "capx", &h, ""), 200);

    // Partition 0 at its cap, partition 1 empty: not every partition is at its cap, so a long poll waits for
    // partition 1 rather than answering 204 at once.
    let (tx, rx) = mpsc::channel();
    let t = spawn_consumer(Client::new(&s.url()), "capx", "&wait=3s", 0, tx);
    thread::sleep(ms(300));
    if let Ok((_, _, got)) = rx.try_recv() {
        panic!("partition 1 is not at its cap, yet the wait=3s long poll answered at once with {got:?}");
    }
    s.produce("capx", "&partition=1", b"p1-b");
    let produced = Instant::now();
    let (_, at, got) = rx.recv_timeout(ms(5000)).expect("consumer thread");
    t.join().unwrap();
    let lag = at.saturating_duration_since(produced);
    let (gp, _, _, body) = got.expect("the message on partition 1 (not at its cap)");
    assert_eq!((gp, body.as_slice()), (1, &b"p1-b"[..]));
    assert!(lag <= ms(100), "woken after {lag:?}");

    // Now every partition is at its cap: 204 at once, even with a wait.
    s.produce("capx", "&partition=1", b"p1-c");
    let start = Instant::now();
    assert_eq!(consume(&s.client, "capx", "&wait=2s"), None);
    assert!(
        start.elapsed() < ms(300),
        "every partition at its cap: 204 at once"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 7. Ordering and out-of-order acks
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn lowest_offset_first_and_out_of_order_acks_close_the_gap() {
    let s = Server::start(1, &[]);
    s.create_topic("ooo", "");
    for i in 0..3 {
        s.produce("ooo", "", format!("m{i}").as_bytes());
    }
    let mut handles = Vec::new();
    for want in 0..3u64 {
        let (_, o, h, body) = consume(&s.client, "ooo", "").unwrap();
        assert_eq!((o, body), (want, format!("m{want}").into_bytes()));
        handles.push(h);
    }
    assert_eq!(consume(&s.client, "ooo", ""), None);
    assert_eq!(settle(&s.client, "ack", "ooo", &handles[2], ""), 200);
    assert_eq!(settle(&s.client, "ack", "ooo", &handles[1], ""), 200);
    let p = &s.partitions("ooo")[0];
    assert_eq!(p["acked_ahead"], 2, "{p}");
    assert_eq!(p["committed"], 0, "{p}");
    assert_eq!(p["in_flight"], 1, "{p}");
    assert_eq!(settle(&s.client, "ack", "ooo", &handles[0], ""), 200);
    wait_for_field(&s, "ooo", 0, "committed", 3, ms(2000));
    let p = &s.partitions("ooo")[0];
    assert_eq!(p["acked_ahead"], 0, "{p}");
    assert_eq!(p["in_flight"], 0, "{p}");
}

// ---------------------------------------------------------------------------------------------------------------
// 8. Caps
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn max_in_flight_makes_consume_answer_204_without_waiting() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("cap", "max_in_flight=2");
    for i in 0..5 {
        s.produce("cap", "", format!("m{i}").as_bytes());
    }
    let (_, o0, h0, _) = consume(&s.client, "cap", "").unwrap();
    let (_, o1, _, _) = consume(&s.client, "cap", "").unwrap();
    assert_eq!((o0, o1), (0, 1));
    let start = Instant::now();
    assert_eq!(consume(&s.client, "cap", "&wait=2s"), None);
    let took = start.elapsed();
    assert!(
        took < ms(300),
        "at the cap, consume must answer at once: {took:?}"
    );
    assert_eq!(field(&s, "cap", 0, "in_flight"), 2);
    assert_eq!(settle(&s.client, "ack", "cap", &h0, ""), 200);
    let (_, o2, _, body) = consume(&s.client, "cap", "").expect("a slot freed up");
    assert_eq!((o2, body.as_slice()), (2, &b"m2"[..]));
}

#[test]
fn max_acked_ahead_refuses_ack_with_503_and_keeps_the_lease() {
    let s = Server::start(1, &[]);
    s.create_topic("aa", "max_acked_ahead=1");
    for i in 0..3 {
        s.produce("aa", "", format!("m{i}").as_bytes());
    }
    let h: Vec<String> = (0..3)
        .map(|_| consume(&s.client, "aa", "").unwrap().2)
        .collect();
    assert_eq!(settle(&s.client, "ack", "aa", &h[1], ""), 200);
    let a = settle_answer(&s, "ack", "aa", &h[2], "");
    assert_error(&a, 503, "acked_ahead_full", "ack beyond max_acked_ahead");
    let retry = a.header("retry-after").expect("503 carries Retry-After");
    assert!(retry.trim().parse::<u64>().is_ok(), "Retry-After: {retry}");
    let p = &s.partitions("aa")[0];
    assert_eq!(
        p["in_flight"], 2,
        "the refused ack left the lease on 2 live: {p}"
    );
    assert_eq!(p["acked_ahead"], 1, "{p}");
    assert_eq!(settle(&s.client, "ack", "aa", &h[0], ""), 200);
    assert_eq!(settle(&s.client, "ack", "aa", &h[2], ""), 200);
    wait_for_field(&s, "aa", 0, "committed", 3, ms(2000));
    assert_eq!(field(&s, "aa", 0, "in_flight"), 0);
}

// ---------------------------------------------------------------------------------------------------------------
// 9. Concurrency: exactly once when nothing expires
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn eight_consumers_receive_a_thousand_messages_exactly_once() {
    let _g = common::serial();
    const N: usize = 1000;
    let s = Server::start(2, &["--fsync", "never"]);
    s.create_topic("many", "partitions=4&visibility=30s");
    let deadline = Instant::now() + Duration::from_secs(30);

    let producers: Vec<_> = (0..2)
        .map(|k| {
            let c = Client::new(&s.url());
            thread::spawn(move || {
                for i in (k..N).step_by(2) {
                    let a = c
                        .call(
                            "POST",
                            &format!("/produce?topic=many&partition={}", i % 4),
                            format!("msg-{i:04}").as_bytes(),
                        )
                        .unwrap();
                    assert_eq!(a.status, 200, "produce {i}: {}", a.text());
                }
            })
        })
        .collect();

    let total = Arc::new(AtomicUsize::new(0));
    // (partition, offset, body) of every delivery.
    let got = Arc::new(Mutex::new(Vec::<(u64, u64, Vec<u8>)>::new()));
    let consumers: Vec<_> = (0..8)
        .map(|_| {
            let c = Client::new(&s.url());
            let total = total.clone();
            let got = got.clone();
            thread::spawn(move || {
                while total.load(Ordering::SeqCst) < N {
                    assert!(Instant::now() < deadline, "gave up collecting");
                    let Some((p, o, h, body)) = consume(&c, "many", "&wait=1s") else {
                        continue;
                    };
                    assert_eq!(settle(&c, "ack", "many", &h, ""), 200, "ack {h}");
                    got.lock().unwrap().push((p, o, body));
                    total.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in producers.into_iter().chain(consumers) {
        t.join().unwrap();
    }

    let got = got.lock().unwrap();
    assert_eq!(got.len(), N, "deliveries");
    let positions: HashSet<(u64, u64)> = got.iter().map(|(p, o, _)| (*p, *o)).collect();
    assert_eq!(
        positions.len(),
        N,
        "duplicate (partition, offset) deliveries"
    );
    let bodies: BTreeSet<Vec<u8>> = got.iter().map(|(_, _, b)| b.clone()).collect();
    let produced: BTreeSet<Vec<u8>> = (0..N).map(|i| format!("msg-{i:04}").into_bytes()).collect();
    assert_eq!(bodies, produced, "every produced body is received");
    for (p, o, body) in got.iter() {
        let i: u64 = std::str::from_utf8(&body[4..]).unwrap().parse().unwrap();
        assert_eq!(i % 4, *p, "message {i} was produced to partition {}", i % 4);
        assert!(*o < (N / 4) as u64);
    }
    for p in 0..4 {
        wait_for_field(&s, "many", p, "committed", (N / 4) as u64, ms(2000));
        assert_eq!(field(&s, "many", p, "in_flight"), 0);
        assert_eq!(field(&s, "many", p, "end_offset"), (N / 4) as u64);
    }
    let m = metrics(&s);
    assert_eq!(
        metric_sum(&m, "berth_delivered_total", &[("topic", "many")]),
        N as f64
    );
    assert_eq!(
        metric_sum(&m, "berth_acked_total", &[("topic", "many")]),
        N as f64
    );
    assert_eq!(
        metric_sum(&m, "berth_expired_total", &[("topic", "many")]),
        0.0
    );
    assert_eq!(
        metric_sum(&m, "berth_lease_gone_total", &[("topic", "many")]),
        0.0
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 10, 11. The durable frontier: crash and graceful shutdown
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn crash_redelivers_exactly_the_unsettled_offsets_above_the_flushed_frontier() {
    let _g = common::serial();
    // The decoder agrees with docs/format.md's example.
    assert_eq!(
        common::decode_frontier(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 0x87, 0x29, 0x6b, 0x51]),
        Some(42)
    );
    let mut s = Server::start(1, &[]);
    s.create_topic("crash", "");
    for i in 0..20 {
        assert_eq!(s.produce("crash", "", format!("c{i}").as_bytes()), (0, i));
    }
    for want in 0..10u64 {
        let (_, o, h, _) = consume(&s.client, "crash", "").unwrap();
        assert_eq!(o, want);
        assert_eq!(settle(&s.client, "ack", "crash", &h, ""), 200);
    }
    let dir = s.partition_dir("crash", 0);
    // Durable (in the core's journal) within the flush interval.
    wait_for_field(&s, "crash", 0, "durable", 10, ms(2000));
    for want in 10..15u64 {
        let (_, o, _, _) = consume(&s.client, "crash", "").unwrap();
        assert_eq!(o, want);
    }

    s.kill9();
    common::wait_port_free(s.port);
    s.restart();

    assert_eq!(
        read_frontier(&dir),
        Some(10),
        "consumer.offset after the restart's journal replay"
    );
    assert_eq!(
        field(&s, "crash", 0, "committed"),
        10,
        "frontier after restart"
    );
    assert_eq!(
        field(&s, "crash", 0, "in_flight"),
        0,
        "leases do not survive a crash"
    );
    let mut offsets = Vec::new();
    while let Some((p, o, _, body)) = consume(&s.client, "crash", "&wait=0") {
        assert_eq!(p, 0);
        assert_eq!(body, format!("c{o}").into_bytes());
        offsets.push(o);
        assert!(offsets.len() <= 20, "runaway redelivery: {offsets:?}");
    }
    assert_eq!(offsets, (10..20).collect::<Vec<u64>>());
    assert_eq!(field(&s, "crash", 0, "committed"), 10);
}

/// Acks above the frontier are durable with it (issue 29): a crash brings back only what was leased and unsettled,
/// not the acks above the lowest unsettled offset.
#[test]
fn a_crash_redelivers_only_the_unsettled_offsets_not_the_acks_above_the_frontier() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("ahead", "");
    for i in 0..20 {
        assert_eq!(s.produce("ahead", "", format!("a{i}").as_bytes()), (0, i));
    }
    // 0 and 5 stay leased; 1..=4 and 6..=9 are acked above the frontier (0).
    for want in 0..10u64 {
        let (_, o, h, _) = consume(&s.client, "ahead", "&visibility=60s").unwrap();
        assert_eq!(o, want);
        if o != 0 && o != 5 {
            assert_eq!(settle(&s.client, "ack", "ahead", &h, ""), 200);
        }
    }
    assert_eq!(field(&s, "ahead", 0, "acked_ahead"), 8);
    // Durable (a frontier record of the core's journal) within the flush interval.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !common::holds_acked(&s.data_dir, "ahead", 0, "default", 0, &[(1, 5), (6, 10)]) {
        assert!(
            Instant::now() < deadline,
            "the acks above the frontier never reached the journal"
        );
        thread::sleep(ms(20));
    }
    s.kill9();
    common::wait_port_free(s.port);
    s.restart();
    assert_eq!(
        field(&s, "ahead", 0, "committed"),
        0,
        "frontier after restart"
    );
    assert_eq!(
        field(&s, "ahead", 0, "acked_ahead"),
        8,
        "the acks above it came back"
    );
    let mut offsets = Vec::new();
    while let Some((_, o, h, body)) = consume(&s.client, "ahead", "&wait=0") {
        assert_eq!(body, format!("a{o}").into_bytes());
        offsets.push(o);
        assert!(offsets.len() <= 20, "runaway redelivery: {offsets:?}");
        assert_eq!(settle(&s.client, "ack", "ahead", &h, ""), 200);
    }
    assert_eq!(
        offsets,
        [0, 5].into_iter().chain(10..20).collect::<Vec<u64>>()
    );
    assert_eq!(field(&s, "ahead", 0, "committed"), 20);
    // The file written at the clean stop holds no ranges (version 1's 12 bytes).
    assert_eq!(s.terminate(), Some(0));
    assert_eq!(read_frontier(&s.partition_dir("ahead", 0)), Some(20));
    let file = std::fs::read(s.partition_dir("ahead", 0).join("consumer.offset")).unwrap();
    assert_eq!(file.len(), 12);
}

#[test]
fn graceful_shutdown_flushes_the_frontier() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("term", "");
    for i in 0..6 {
        s.produce("term", "", format!("t{i}").as_bytes());
    }
    for _ in 0..4 {
        let (_, _, h, _) = consume(&s.client, "term", "").unwrap();
        assert_eq!(settle(&s.client, "ack", "term", &h, ""), 200);
    }
    assert_eq!(s.terminate(), Some(0), "SIGTERM exits 0");
    assert_eq!(read_frontier(&s.partition_dir("term", 0)), Some(4));
}

#[test]
fn sigterm_answers_a_parked_consumer_and_exits_0_promptly() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("bye", "");
    let (tx, rx) = mpsc::channel();
    let client = Client::new(&s.url());
    let t = thread::spawn(move || {
        let a = client.call("GET", "/consume?topic=bye&wait=30s", &[]);
        let _ = tx.send((Instant::now(), a));
    });
    thread::sleep(ms(300));
    assert!(rx.try_recv().is_err(), "the consumer should be parked");
    let start = Instant::now();
    assert_eq!(s.terminate(), Some(0), "SIGTERM exits 0");
    let took = start.elapsed();
    let (_, answer) = rx.recv_timeout(ms(5000)).expect("consumer thread");
    t.join().unwrap();
    let answer = answer.expect("the parked consume is answered, not cut off");
    assert!(
        answer.status == 204 || answer.status == 503,
        "parked consume at shutdown answered {}: {}",
        answer.status,
        answer.text()
    );
    assert!(
        took < ms(3000),
        "a parked long poll held shutdown for {took:?}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 12. Corrupt records
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn corrupt_record_is_skipped_counted_and_refused_on_replay() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("rot", "");
    let bodies: Vec<Vec<u8>> = (0..10)
        .map(|i| format!("record-{i}-{}", "x".repeat(i * 3)).into_bytes())
        .collect();
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(s.produce("rot", "", b), (0, i as u64));
    }
    assert_eq!(s.terminate(), Some(0));

    let seg = s.partition_dir("rot", 0).join("00000000000000000000.log");
    let mut bytes = std::fs::read(&seg).unwrap();
    let pos: usize = bodies[..4].iter().map(|b| 32 + b.len()).sum();
    assert_eq!(&bytes[pos..pos + 4], b"FRTB", "frame 4 starts at {pos}");
    assert_eq!(
        u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize,
        bodies[4].len()
    );
    assert_eq!(
        u64::from_le_bytes(bytes[pos + 8..pos + 16].try_into().unwrap()),
        4
    );
    bytes[pos + 32 + 3] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();

    s.restart();
    let mut seen = BTreeMap::new();
    while let Some((_, o, h, body)) = consume(&s.client, "rot", "&wait=0") {
        assert_eq!(settle(&s.client, "ack", "rot", &h, ""), 200);
        assert!(seen.insert(o, body).is_none(), "offset {o} delivered twice");
        assert!(seen.len() <= 10);
    }
    let want: BTreeMap<u64, Vec<u8>> = bodies
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 4)
        .map(|(i, b)| (i as u64, b.clone()))
        .collect();
    assert_eq!(seen, want, "the 9 good records, never record 4");
    assert_eq!(field(&s, "rot", 0, "corrupt_skipped"), 1);
    wait_for_field(&s, "rot", 0, "committed", 10, ms(2000));

    assert_error(
        &s.get("/consume?topic=rot&partition=0&offset=4"),
        422,
        "corrupt_record",
        "replay of the corrupt offset",
    );
    for o in [3u64, 5] {
        let a = s.get(&format!("/consume?topic=rot&partition=0&offset={o}"));
        assert_eq!(a.status, 200, "replay {o}: {}", a.text());
        assert_eq!(a.body, bodies[o as usize]);
    }
    let m = metrics(&s);
    assert_eq!(
        metric_values(
            &m,
            "berth_corrupt_skipped_total",
            &[("topic", "rot"), ("partition", "0")]
        ),
        vec![1.0],
        "metrics:\n{m}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 13. Replay
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn replay_reads_a_leased_offset_without_touching_the_lease() {
    let s = Server::start(1, &[]);
    s.create_topic("rp", "");
    s.produce("rp", "", b"first");
    let (_, o, h, _) = consume(&s.client, "rp", "").unwrap();
    assert_eq!(o, 0);
    assert_eq!(field(&s, "rp", 0, "in_flight"), 1);
    for _ in 0..2 {
        let a = s.get("/consume?topic=rp&partition=0&offset=0");
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.body, b"first");
        assert_eq!(a.header("offset"), Some("0"));
        assert_eq!(a.header("partition"), Some("0"));
        assert!(
            a.header("receipt-handle").is_none(),
            "replay leases nothing"
        );
        assert_eq!(field(&s, "rp", 0, "in_flight"), 1);
    }
    // Replay past the end: 204 after its wait, still no lease.
    assert_eq!(s.get("/consume?topic=rp&partition=0&offset=1").status, 204);
    assert_eq!(
        consume(&s.client, "rp", ""),
        None,
        "offset 0 is still leased"
    );
    assert_eq!(settle(&s.client, "ack", "rp", &h, ""), 200);
    wait_for_field(&s, "rp", 0, "committed", 1, ms(2000));
    // Settled records stay replayable.
    assert_eq!(
        s.get("/consume?topic=rp&partition=0&offset=0").body,
        b"first"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 14. Background expiry
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn lease_expires_without_any_poller() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("idle", "");
    s.produce("idle", "", b"x");
    let leased_at = Instant::now();
    let (_, _, h1, _) = consume(&s.client, "idle", "&visibility=1s").unwrap();
    assert_eq!(field(&s, "idle", 0, "in_flight"), 1);
    // Nobody touches the partition until well past the deadline.
    thread::sleep((leased_at + ms(1300)).saturating_duration_since(Instant::now()));
    loop {
        if field(&s, "idle", 0, "in_flight") == 0 {
            break;
        }
        assert!(
            leased_at.elapsed() < ms(2500),
            "the expired lease was not released by the background purger"
        );
        thread::sleep(ms(20));
    }
    let m = metrics(&s);
    assert_eq!(
        metric_sum(&m, "berth_expired_total", &[("topic", "idle")]),
        1.0
    );
    let (_, o, h2, _) = consume(&s.client, "idle", "").expect("redeliverable");
    assert_eq!(o, 0);
    assert_ne!(h1, h2);
}

// ---------------------------------------------------------------------------------------------------------------
// 15. Metrics
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn metrics_count_per_partition_and_time_per_core() {
    let s = Server::start(2, &[]);
    s.create_topic("met", "partitions=2");
    for i in 0..3 {
        s.produce("met", "", format!("m{i}").as_bytes());
    }
    let handles: Vec<String> = (0..3)
        .map(|_| consume(&s.client, "met", "").expect("3 messages").2)
        .collect();
    assert_eq!(settle(&s.client, "ack", "met", &handles[0], ""), 200);
    assert_eq!(settle(&s.client, "ack", "met", &handles[1], ""), 200);
    assert_eq!(settle(&s.client, "nack", "met", &handles[2], ""), 200);

    // A long-poll that finds nothing waits its full second: parked, not served, so not in its latency.
    s.create_topic("quiet", "");
    let polled = Instant::now();
    assert!(consume(&s.client, "quiet", "&wait=1s").is_none());
    assert!(polled.elapsed() >= ms(1000));
    let m = metrics(&s);
    // Latency is a Prometheus histogram in seconds per core and kind of request: cumulative buckets ending in
    // +Inf == _count.
    let mut answered = 0.0;
    let mut per_op = std::collections::HashMap::new();
    for core in ["0", "1"] {
        for op in ["produce", "consume", "settle", "other"] {
            let c = [("core", core), ("op", op)];
            let inf = metric_values(
                &m,
                "berth_request_duration_seconds_bucket",
                &[("core", core), ("op", op), ("le", "+Inf")],
            );
            let count = metric_values(&m, "berth_request_duration_seconds_count", &c);
            assert_eq!(
                (inf.len(), count.len()),
                (1, 1),
                "histogram of core {core}, {op}:\n{m}"
            );
            assert_eq!(inf[0], count[0], "+Inf bucket is the count");
            let buckets = metric_values(&m, "berth_request_duration_seconds_bucket", &c);
            assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "cumulative");
            answered += count[0];
            *per_op.entry(op).or_insert(0.0) += count[0];
        }
    }
    assert_eq!(
        metric_sum(&m, "berth_requests_total", &[]),
        answered,
        "every request counted once"
    );
    assert_eq!(per_op["produce"], 3.0, "{m}");
    assert_eq!(per_op["consume"], 4.0, "{m}");
    assert_eq!(per_op["settle"], 3.0, "{m}");
    let slow = metric_sum(
        &m,
        "berth_request_duration_seconds_bucket",
        &[("op", "consume"), ("le", "0.5")],
    );
    assert_eq!(
        slow, 4.0,
        "every consume served in under 0.5 s, the long-poll's parked second left out:\n{m}"
    );
    let t = [("topic", "met")];
    assert_eq!(
        metric_values(&m, "berth_produced_total", &t).len(),
        2,
        "one line per partition"
    );
    assert_eq!(metric_sum(&m, "berth_produced_total", &t), 3.0);
    assert!(metric_sum(&m, "berth_delivered_total", &t) >= 3.0);
    assert_eq!(metric_sum(&m, "berth_acked_total", &t), 2.0);
    assert_eq!(metric_sum(&m, "berth_nacked_total", &t), 1.0);
    assert_eq!(metric_sum(&m, "berth_in_flight", &t), 0.0);

    // The per-stage breakdown (docs/api.md, "Metrics"): a queue wait per request parsed (this scrape's own
    // included: it is recorded when its handling starts), a reply per write of answers (one per request here: the
    // client waits for each answer), and, with fsync always, a write and an fdatasync per journal pass, after each
    // entry's wait for its pass.
    let stage = |name: &str| metric_sum(&m, &format!("berth_stage_{name}_seconds_count"), &[]);
    assert_eq!(stage("queue"), answered + 1.0, "{m}");
    assert_eq!(stage("reply"), answered, "{m}");
    let passes = stage("journal_write");
    assert!(passes >= 3.0, "a pass per produce at least: {m}");
    assert_eq!(stage("journal_sync"), passes, "{m}");
    assert!(stage("journal_queue") >= passes, "{m}");
    // Housekeeping: each core's frontier flush ran every 50 ms through the long-poll's second (a slice per run,
    // whether or not a frontier moved), so each core counts slices of its own.
    for core in ["0", "1"] {
        let slices = metric_sum(
            &m,
            "berth_stage_housekeeping_seconds_count",
            &[("core", core)],
        );
        assert!(slices >= 2.0, "core {core}'s housekeeping: {m}");
    }
    for name in [
        "queue",
        "journal_queue",
        "journal_write",
        "journal_sync",
        "reply",
        "housekeeping",
    ] {
        let name = format!("berth_stage_{name}_seconds");
        let inf = metric_sum(&m, &format!("{name}_bucket"), &[("le", "+Inf")]);
        assert_eq!(
            inf,
            metric_sum(&m, &format!("{name}_count"), &[]),
            "{name}: {m}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 16. The command line
// ---------------------------------------------------------------------------------------------------------------

fn berth_cli(s: &Server, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--server")
        .arg(s.url())
        .args(args)
        .output()
        .expect("run berth")
}

#[test]
fn cli_consume_with_ack_prints_json_lines_and_settles() {
    let s = Server::start(1, &[]);
    s.create_topic("cli", "");
    s.produce("cli", "", b"alpha");
    s.produce("cli", "", b"beta");

    let out = berth_cli(&s, &["consume", "cli", "--count", "2", "--ack"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["body"], "alpha");
    assert_eq!(lines[1]["body"], "beta");
    let handles: Vec<String> = lines
        .iter()
        .map(|l| {
            l["receipt_handle"]
                .as_str()
                .expect("receipt_handle")
                .to_string()
        })
        .collect();
    assert_eq!(parse_handle(&handles[0]).1, 0);
    assert_eq!(parse_handle(&handles[1]).1, 1);
    wait_for_field(&s, "cli", 0, "committed", 2, ms(2000));

    let out = berth_cli(&s, &["consume", "cli"]);
    assert!(
        out.status.success(),
        "consume on empty exits 0: {:?}",
        out.status
    );
    assert!(out.stdout.is_empty(), "nothing printed on empty");

    let out = berth_cli(&s, &["ack", "cli", &handles[0]]);
    assert!(!out.status.success(), "acking a settled handle must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("410"), "stderr: {stderr}");
}

#[test]
fn a_long_poll_outlasting_the_idle_and_header_timeouts_is_still_answered() {
    let _g = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("short.toml");
    std::fs::write(
        &config,
        "idle_timeout_ms = 1000\nheader_read_timeout_ms = 1000\n",
    )
    .unwrap();
    let server = Server::start(1, &["--config", config.to_str().unwrap()]);
    server.create_topic("slow", "");
    // Idle for a while first, so the connection's idle deadline is already half spent when the long-poll starts.
    let client = berth::client::Client::new(&server.url());
    assert_eq!(client.call("GET", "/health", &[]).unwrap().status, 200);
    std::thread::sleep(std::time::Duration::from_millis(600));
    let url = server.url();
    let producer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1800));
        berth::client::Client::new(&url)
            .call("POST", "/produce?topic=slow", b"late")
            .unwrap()
            .status
    });
    let started = std::time::Instant::now();
    let got = common::consume(&client, "slow", "&wait=4s")
        .expect("the long-poll must be answered with the message");
    assert_eq!(got.3, b"late");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1500),
        "answered before the produce"
    );
    assert_eq!(producer.join().unwrap(), 200);
}

#[test]
fn retention_removes_old_segments_replay_below_start_is_410_and_the_queue_moves_past_them() {
    let _g = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("small.toml");
    // Small segments so a few records roll several of them; retention sweeps run every 200 ms.
    std::fs::write(
        &config,
        "max_message_bytes = 1024\nsegment_bytes = 4096\npurge_interval_ms = 200\n",
    )
    .unwrap();
    let server = Server::start(1, &["--config", config.to_str().unwrap()]);
    server.create_topic("old", "retention=1s");
    let body = vec![b'r'; 1000];
    for i in 0..12 {
        assert_eq!(server.produce("old", "", &body), (0, i));
    }
    // Sealed segments whose newest record is older than 1 s go; the active one stays.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let start = loop {
        let start = server.partitions("old")[0]["start_offset"]
            .as_u64()
            .unwrap();
        if start > 0 {
            break start;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "retention never removed a segment"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(start < 12, "the active segment must stay");
    let a = server.get("/consume?topic=old&partition=0&offset=0");
    assert_eq!(
        (a.status, a.json()["error"].as_str()),
        (410, Some("offset_out_of_retention")),
        "{}",
        a.text()
    );
    // A later sweep may remove another sealed segment (each goes once its newest record is 1 s old): the start
    // is read again until the replay there is served. Only the active segment stays for good.
    let mut start = start;
    loop {
        let a = server.get(&format!("/consume?topic=old&partition=0&offset={start}"));
        let now = server.partitions("old")[0]["start_offset"]
            .as_u64()
            .unwrap();
        if a.status == 410 && now > start {
            start = now;
            continue;
        }
        assert_eq!(a.status, 200, "{}", a.text());
        break;
    }
    assert!(start < 12, "the active segment must stay");
    // The queue starts at the oldest retained offset: nothing below it is ever delivered.
    let (_, offset, handle, _) =
        common::consume(&server.client, "old", "").expect("a retained record");
    assert_eq!(offset, start);
    assert_eq!(
        common::settle(&server.client, "ack", "old", &handle, ""),
        200
    );
}
