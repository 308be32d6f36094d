mod common;

// End-to-end tests of message attributes and delayed produce (design/api.md "Version 3 additions", docs/api.md
// "Attributes and delay"): stored in the log with the record, returned unchanged with every delivery and replay in
// every framing, refused whole when bad, and a delay that holds across a kill -9. Every test runs the real binary.

use berth::client::Answer;
use common::Server;
use std::time::{Duration, Instant};

const ATTRS: &str = r#"{"color":{"type":"String","value":"r\u00e9d ; \"quoted\" \ud83d\ude00"},"n":{"type":"Number.int","value":"-12.5e3"},"raw":{"type":"Binary.gz","value_base64":"AP8H"}}"#;

fn produce_with(s: &Server, query: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    berth::client::Client::new(&s.url())
        .call_with("POST", &format!("/produce?{query}"), headers, body)
        .expect("produce")
}

fn consume_with(s: &Server, query: &str, headers: &[(&str, &str)]) -> Answer {
    berth::client::Client::new(&s.url())
        .call_with("GET", &format!("/consume?{query}"), headers, b"")
        .expect("consume")
}

fn parsed(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn attributes_come_back_unchanged_in_every_framing_and_in_a_replay() {
    let _serial = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("t", "partitions=1");
    let want = parsed(ATTRS);
    // One message: the `attributes` header.
    let a = produce_with(&s, "topic=t", &[("attributes", ATTRS)], b"one");
    assert_eq!(a.status, 200, "{}", a.text());
    // A batch: each ndjson record's own, or the header's for a record naming none.
    let lines = concat!(
        r#"{"body":"two","attributes":{"only":{"type":"String","value":"x"}}}"#,
        "\n",
        r#"{"body":"three"}"#,
        "\n",
        r#"{"body":"four","attributes":{}}"#,
        "\n"
    );
    let a = produce_with(
        &s,
        "topic=t",
        &[
            ("content-type", "application/x-ndjson"),
            ("attributes", ATTRS),
        ],
        lines.as_bytes(),
    );
    assert_eq!(a.status, 200, "{}", a.text());
    // Frames: the header's for every record.
    let mut frames = Vec::new();
    for body in [&b"five"[..], b"\xffsix"] {
        frames.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frames.extend_from_slice(body);
    }
    let a = produce_with(
        &s,
        "topic=t",
        &[
            ("content-type", "application/vnd.berth.frames"),
            ("attributes", ATTRS),
        ],
        &frames,
    );
    assert_eq!(a.status, 200, "{}", a.text());
    // A plain one: no attributes anywhere in its delivery.
    s.produce("t", "", b"seven");

    // One message at a time: the header, ASCII, parses to what was sent.
    let one = consume_with(&s, "topic=t", &[]);
    assert_eq!(one.status, 200);
    assert_eq!(one.body, b"one");
    let header = one.header("attributes").expect("an attributes header");
    assert!(header.is_ascii(), "{header}");
    assert_eq!(parsed(header), want);
    // A batch as ndjson.
    let batch = consume_with(&s, "topic=t&max=4", &[("accept", "application/x-ndjson")]);
    assert_eq!(batch.status, 200, "{}", batch.text());
    let got: Vec<serde_json::Value> = batch.text().lines().map(parsed).collect();
    assert_eq!(got.len(), 4, "{}", batch.text());
    assert_eq!(got[0]["body"], "two");
    assert_eq!(
        got[0]["attributes"],
        parsed(r#"{"only":{"type":"String","value":"x"}}"#)
    );
    assert_eq!(got[1]["body"], "three");
    assert_eq!(
        got[1]["attributes"], want,
        "the header's, for a record naming none"
    );
    assert_eq!(got[2]["body"], "four");
    assert!(got[2].get("attributes").is_none(), "its own: none");
    assert_eq!(got[3]["body"], "five");
    assert_eq!(got[3]["attributes"], want);
    // Frames: the JSON header frame carries them.
    let framed = consume_with(
        &s,
        "topic=t&max=2",
        &[("accept", "application/vnd.berth.frames")],
    );
    assert_eq!(framed.status, 200);
    let mut at = 0;
    let mut next = || {
        let len = u32::from_le_bytes(framed.body[at..at + 4].try_into().unwrap()) as usize;
        let frame = framed.body[at + 4..at + 4 + len].to_vec();
        at += 4 + len;
        frame
    };
    let head = parsed(std::str::from_utf8(&next()).unwrap());
    assert_eq!(next(), b"\xffsix");
    assert_eq!(head["attributes"], want);
    let head = parsed(std::str::from_utf8(&next()).unwrap());
    assert_eq!(next(), b"seven");
    assert!(head.get("attributes").is_none());
    // A replay reads them too.
    let replay = consume_with(&s, "topic=t&partition=0&offset=0", &[]);
    assert_eq!(replay.status, 200);
    assert_eq!(replay.body, b"one");
    assert_eq!(parsed(replay.header("attributes").unwrap()), want);
}

#[test]
fn bad_attributes_or_delay_are_refused_whole_and_attributes_count_against_the_message_size() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("small.toml");
    std::fs::write(&config, "max_message_bytes = 64\n").unwrap();
    let s = Server::start(1, &["--config", config.to_str().unwrap()]);
    s.create_topic("t", "partitions=1");
    for (query, headers, body, code) in [
        ("topic=t", vec![("attributes", "{\"a b\":{\"type\":\"String\",\"value\":\"v\"}}")], &b"x"[..], "invalid_parameter"),
        ("topic=t", vec![("attributes", "not json")], b"x", "invalid_parameter"),
        ("topic=t&delay=16m", vec![], b"x", "invalid_duration"),
        ("topic=t&delay=-1s", vec![], b"x", "invalid_duration"),
        (
            "topic=t",
            vec![("content-type", "application/x-ndjson")],
            b"{\"body\":\"a\"}\n{\"body\":\"b\",\"delay\":\"20m\"}\n",
            "invalid_record",
        ),
        (
            "topic=t",
            vec![("content-type", "application/x-ndjson")],
            b"{\"body\":\"a\"}\n{\"body\":\"b\",\"attributes\":{\"aws.x\":{\"type\":\"String\",\"value\":\"v\"}}}\n",
            "invalid_record",
        ),
        // 40 bytes of body and 30 of attribute: past 64 together.
        (
            "topic=t",
            vec![("attributes", "{\"k\":{\"type\":\"String\",\"value\":\"0123456789012345678901234\"}}")],
            &[b'x'; 40][..],
            "message_too_large",
        ),
    ] {
        let a = produce_with(&s, query, &headers, body);
        assert!(
            a.status == 400 || a.status == 413,
            "{query} {headers:?}: {} {}",
            a.status,
            a.text()
        );
        assert_eq!(a.json()["error"], code, "{query} {headers:?}: {}", a.text());
    }
    assert_eq!(s.partitions("t")[0]["end_offset"], 0, "nothing written");
}

/// A delayed message is not delivered before its time, does not hold up the messages after it, wakes a parked
/// consumer when its time comes, and keeps its time across a kill -9 (the deadline is in the record).
#[test]
fn a_delayed_message_waits_its_time_even_across_a_kill_9() {
    let _serial = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("t", "partitions=1");
    let sent = Instant::now();
    let a = produce_with(&s, "topic=t&delay=2s", &[], b"later");
    assert_eq!(a.status, 200, "{}", a.text());
    s.produce("t", "", b"now");
    let first = consume_with(&s, "topic=t&max=10", &[("accept", "application/x-ndjson")]);
    assert_eq!(first.status, 200);
    let lines: Vec<serde_json::Value> = first.text().lines().map(parsed).collect();
    assert_eq!(
        lines.len(),
        1,
        "only the message not delayed: {}",
        first.text()
    );
    assert_eq!(lines[0]["body"], "now");
    let ack = s.post(
        &format!(
            "/ack?topic=t&receipt_handle={}",
            lines[0]["receipt_handle"].as_str().unwrap()
        ),
        b"",
    );
    assert_eq!(ack.status, 200);
    let groups = s.get("/topics/t/groups/default").json();
    assert_eq!(groups["partitions"][0]["delayed"], 1, "{groups}");
    // A consumer parked for it is woken when its time comes, not before.
    let later = consume_with(&s, "topic=t&wait=10s", &[]);
    assert_eq!(later.status, 200);
    assert_eq!(later.body, b"later");
    assert_eq!(later.header("delivery-count"), Some("1"));
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "delivered after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(8),
        "a parked consumer was woken late: {waited:?}"
    );

    let ack = s.post(
        &format!(
            "/ack?topic=t&receipt_handle={}",
            later.header("receipt-handle").unwrap()
        ),
        b"",
    );
    assert_eq!(ack.status, 200);

    // Both acks durable (the frontier is flushed every 50 ms), so nothing but the delayed one is left after a crash.
    let start = Instant::now();
    while s.get("/topics/t/groups/default").json()["partitions"][0]["durable"] != 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the frontier never became durable"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Across a kill -9: the time is kept.
    let sent = Instant::now();
    let a = produce_with(&s, "topic=t&delay=4s", &[], b"after the crash");
    assert_eq!(a.status, 200, "{}", a.text());
    s.restart();
    let early = consume_with(&s, "topic=t", &[]);
    if sent.elapsed() < Duration::from_millis(3_900) {
        assert_eq!(
            early.status,
            204,
            "delivered early after a restart ({:?}): {}",
            sent.elapsed(),
            early.text()
        );
    }
    let due = consume_with(&s, "topic=t&wait=15s", &[]);
    assert_eq!(due.status, 200);
    assert_eq!(due.body, b"after the crash");
    assert!(
        sent.elapsed() >= Duration::from_secs(4),
        "{:?}",
        sent.elapsed()
    );
}

/// `dedup_id`: a produce repeating an id the topic took within its `dedup_window` is answered with the first one's
/// partition and offset and not appended, within a batch, across requests and across a kill -9; a window of 0
/// turns it off; a bad id is refused.
#[test]
fn a_produce_with_a_dedup_id_is_appended_once_even_across_a_kill_9() {
    let _serial = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("t", "partitions=4");
    let config = s.get("/topics/t").json()["config"].clone();
    assert_eq!(config["dedup_window"], "5m", "{config}");
    let total = |s: &Server| -> u64 {
        s.partitions("t")
            .iter()
            .map(|p| p["end_offset"].as_u64().unwrap())
            .sum()
    };
    let first = produce_with(&s, "topic=t&dedup_id=order-1", &[], b"a");
    assert_eq!(first.status, 200, "{}", first.text());
    let again = produce_with(&s, "topic=t&dedup_id=order-1", &[], b"a again");
    assert_eq!(
        again.json(),
        first.json(),
        "the first one's partition and offset"
    );
    assert_eq!(total(&s), 1);
    let lines = concat!(
        r#"{"body":"b","dedup_id":"order-2"}"#,
        "\n",
        r#"{"body":"b again","dedup_id":"order-2"}"#,
        "\n",
        r#"{"body":"a once more","dedup_id":"order-1"}"#,
        "\n",
        r#"{"body":"plain"}"#,
        "\n"
    );
    let batch = produce_with(
        &s,
        "topic=t",
        &[("content-type", "application/x-ndjson")],
        lines.as_bytes(),
    );
    assert_eq!(batch.status, 200, "{}", batch.text());
    let results = batch.json()["results"].clone();
    assert_eq!(results[0], results[1], "{results}");
    assert_eq!(results[2], first.json(), "{results}");
    assert_eq!(total(&s), 3);
    // The first one's body is what is delivered.
    let replay = consume_with(
        &s,
        &format!(
            "topic=t&partition={}&offset={}",
            first.json()["partition"],
            first.json()["offset"]
        ),
        &[],
    );
    assert_eq!(replay.body, b"a");

    // Across a crash: the ids are in the records.
    s.restart();
    let retry = produce_with(&s, "topic=t&dedup_id=order-1", &[], b"a after the crash");
    assert_eq!(retry.json(), first.json());
    assert_eq!(total(&s), 3);

    // dedup_window=0: every produce is appended.
    s.create_topic("u", "partitions=1&dedup_window=0");
    for _ in 0..2 {
        assert_eq!(
            produce_with(&s, "topic=u&dedup_id=same", &[], b"x").status,
            200
        );
    }
    assert_eq!(s.partitions("u")[0]["end_offset"], 2);

    for (query, headers) in [
        ("topic=t&dedup_id=has%20space", vec![]),
        (&*format!("topic=t&dedup_id={}", "x".repeat(129)), vec![]),
        (
            "topic=t&dedup_id=a",
            vec![("content-type", "application/x-ndjson")],
        ),
    ] {
        let a = produce_with(&s, query, &headers, b"{\"body\":\"x\"}\n");
        assert_eq!(a.status, 400, "{query}: {}", a.text());
        assert_eq!(
            a.json()["error"],
            "invalid_parameter",
            "{query}: {}",
            a.text()
        );
    }
    assert_eq!(total(&s), 3, "nothing written");
}
