mod common;

// End-to-end tests of FIFO topics (design/api.md "FIFO topics", docs/api.md "FIFO topics"): the produce rules, and
// per-group order with at most one message of a group leased at a time, with many groups and concurrent consumers,
// across a kill -9. Every test runs the real binary.

use berth::client::Client;
use common::{assert_error, Server};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn a_fifo_topic_needs_a_group_key_and_only_it_takes_one() {
    let _serial = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("q.fifo", "partitions=2&fifo=true&content_dedup=true");
    s.create_topic("plain", "partitions=1");
    let config = s.get("/topics/q.fifo").json()["config"].clone();
    assert_eq!(
        (config["fifo"].clone(), config["content_dedup"].clone()),
        (true.into(), true.into())
    );
    assert_eq!(s.get("/topics/plain").json()["config"]["fifo"], false);

    assert_error(
        &s.post("/produce?topic=q.fifo", b"x"),
        400,
        "invalid_parameter",
    );
    assert_error(
        &s.post("/produce?topic=q.fifo&group_key=a&key=k", b"x"),
        400,
        "invalid_parameter",
    );
    assert_error(
        &s.post("/produce?topic=q.fifo&group_key=a&partition=0", b"x"),
        400,
        "invalid_parameter",
    );
    assert_error(
        &s.post("/produce?topic=q.fifo&group_key=has%20space", b"x"),
        400,
        "invalid_parameter",
    );
    assert_error(
        &s.post("/produce?topic=plain&group_key=a", b"x"),
        400,
        "invalid_parameter",
    );
    // A batch with one record lacking a group: refused whole.
    let lines = "{\"body\":\"a\",\"group_key\":\"g\"}\n{\"body\":\"b\"}\n";
    let a = Client::new(&s.url())
        .call_with(
            "POST",
            "/produce?topic=q.fifo",
            &[("content-type", "application/x-ndjson")],
            lines.as_bytes(),
        )
        .unwrap();
    assert_error(&a, 400, "invalid_parameter");
    let patch = Client::new(&s.url())
        .call("PATCH", "/topics/q.fifo?fifo=false", &[])
        .unwrap();
    assert_error(&patch, 400, "invalid_parameter");
    // Nothing of the above was written.
    let ends: u64 = s
        .partitions("q.fifo")
        .iter()
        .map(|p| p["end_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(ends, 0);

    // content_dedup: the same body in the same group is one message; another body is another.
    let first = s.produce("q.fifo", "&group_key=g1", b"same");
    assert_eq!(s.produce("q.fifo", "&group_key=g1", b"same"), first);
    assert_ne!(s.produce("q.fifo", "&group_key=g1", b"other"), first);
    // An explicit dedup_id beats the body's digest.
    let a = s.produce("q.fifo", "&group_key=g1&dedup_id=one", b"same");
    assert_ne!(a, first);
    assert_eq!(
        s.produce("q.fifo", "&group_key=g1&dedup_id=one", b"changed"),
        a
    );
}

/// One delivery as a consumer saw it.
struct Seen {
    group: usize,
    seq: usize,
    received: Instant,
    /// When its ack was sent, answered or not (the server may have settled it and died before answering).
    ack_sent: Option<Instant>,
    /// The ack was answered 200.
    acked: bool,
}

/// Many message groups, concurrent consumers, a kill -9 in the middle: within each group, a message is delivered
/// only after every message before it was acked, and the last delivery of each of them was acked before it (so at
/// most one message of a group is leased at a time); every message is acked in the end.
#[test]
fn many_groups_and_consumers_keep_each_groups_order_one_at_a_time_across_a_kill_9() {
    const GROUPS: usize = 24;
    const PER_GROUP: usize = 20;
    const CONSUMERS: usize = 4;
    let _serial = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("jobs.fifo", "partitions=3&fifo=true&visibility=60s");
    let url = s.url();
    let produce = |from: usize, to: usize| {
        let client = Client::new(&url);
        for seq in from..to {
            // One request per message (produce order is request order), groups interleaved.
            for group in 0..GROUPS {
                let a = client
                    .call(
                        "POST",
                        &format!("/produce?topic=jobs.fifo&group_key=g{group}"),
                        format!("{group}:{seq}").as_bytes(),
                    )
                    .expect("produce");
                assert_eq!(a.status, 200, "{}", a.text());
            }
        }
    };
    produce(0, PER_GROUP / 2);

    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|c| {
            let (seen, done, url) = (seen.clone(), done.clone(), url.clone());
            std::thread::spawn(move || {
                let client = Client::new(&url);
                while !done.load(Ordering::Relaxed) {
                    let Ok(a) = client.call_with(
                        "GET",
                        "/consume?topic=jobs.fifo&max=4&wait=200ms",
                        &[("accept", "application/x-ndjson")],
                        b"",
                    ) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let received = Instant::now();
                    if a.status != 200 {
                        continue;
                    }
                    for line in a.text().lines() {
                        let d: serde_json::Value = serde_json::from_str(line).unwrap();
                        let body = d["body"].as_str().unwrap();
                        let (group, seq) = body.split_once(':').unwrap();
                        let index = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(Seen {
                                group: group.parse().unwrap(),
                                seq: seq.parse().unwrap(),
                                received,
                                ack_sent: None,
                                acked: false,
                            });
                            seen.len() - 1
                        };
                        // Some work, unevenly spread.
                        std::thread::sleep(Duration::from_micros(300 * (c as u64 + 1)));
                        let handle = d["receipt_handle"].as_str().unwrap();
                        let sent = Instant::now();
                        let acked = client.call(
                            "POST",
                            &format!("/ack?topic=jobs.fifo&receipt_handle={handle}"),
                            b"",
                        );
                        let mut seen = seen.lock().unwrap();
                        seen[index].ack_sent = Some(sent);
                        seen[index].acked = matches!(&acked, Ok(a) if a.status == 200);
                    }
                }
            })
        })
        .collect();

    // Half-way through what was produced, a kill -9; then the rest is produced.
    let half = GROUPS * PER_GROUP / 4;
    let start = Instant::now();
    while seen.lock().unwrap().iter().filter(|d| d.acked).count() < half {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "consumers made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    s.restart();
    produce(PER_GROUP / 2, PER_GROUP);
    let all = GROUPS * PER_GROUP;
    loop {
        let acked: std::collections::HashSet<(usize, usize)> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.acked)
            .map(|d| (d.group, d.seq))
            .collect();
        if acked.len() == all {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "only {} of {all} messages acked",
            acked.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    done.store(true, Ordering::Relaxed);
    for c in consumers {
        c.join().unwrap();
    }

    let seen = seen.lock().unwrap();
    // Per group and message: its deliveries, by receive time.
    let mut by_message: HashMap<(usize, usize), Vec<&Seen>> = HashMap::new();
    for d in seen.iter() {
        assert!(
            d.group < GROUPS && d.seq < PER_GROUP,
            "unexpected {}:{}",
            d.group,
            d.seq
        );
        by_message.entry((d.group, d.seq)).or_default().push(d);
    }
    let mut checked = 0;
    for d in seen.iter() {
        for earlier in 0..d.seq {
            let before: Vec<&&Seen> = by_message
                .get(&(d.group, earlier))
                .map(|v| v.iter().filter(|e| e.received <= d.received).collect())
                .unwrap_or_default();
            let last = before.iter().max_by_key(|e| e.received).unwrap_or_else(|| {
                panic!(
                    "{}:{} delivered before {}:{earlier} ever was",
                    d.group, d.seq, d.group
                )
            });
            assert!(
                last.ack_sent.is_some_and(|sent| sent < d.received),
                "{}:{} delivered while {}:{earlier} was still leased (not acked)",
                d.group,
                d.seq,
                d.group
            );
            checked += 1;
        }
    }
    let redelivered = seen.len() - all;
    let per_group: BTreeMap<usize, usize> = seen.iter().fold(BTreeMap::new(), |mut m, d| {
        *m.entry(d.group).or_default() += 1;
        m
    });
    assert_eq!(per_group.len(), GROUPS);
    eprintln!(
        "{} deliveries of {all} messages ({redelivered} again after the kill -9), {checked} order checks",
        seen.len()
    );
}
