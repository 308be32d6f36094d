//! End-to-end tests of version 2's batches (design/api.md, "Version 2 additions → Batches", with the delivery count
//! of "Delivery policies"): batch produce in `application/x-ndjson` and `application/vnd.berth.frames`, the batch
//! limits, batch consume in both media types and its long-poll, batch settle (ack, nack, extend), version 1's
//! requests unchanged, and the command line's batch paths. Every test runs the real binary (tests/common).

mod common;

use base64::Engine as _;
use berth::client::{Answer, Client};
use common::{assert_error, Server};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

const NDJSON: &str = "application/x-ndjson";
const FRAMES: &str = "application/vnd.berth.frames";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Encodes bodies as frames: a 4-byte little-endian length, then the bytes.
fn frames(bodies: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in bodies {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }
    out
}

/// Splits a frames body, asserting it is made of whole frames.
fn split_frames(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        assert!(
            pos + 4 <= bytes.len(),
            "frames reply ends inside a length at byte {pos} of {}",
            bytes.len()
        );
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        assert!(
            pos + 4 + len <= bytes.len(),
            "frame at byte {pos} (length {len}) runs past the reply's {} bytes",
            bytes.len()
        );
        out.push(bytes[pos + 4..pos + 4 + len].to_vec());
        pos += 4 + len;
    }
    out
}

/// An ndjson request body from JSON values, one per line.
fn ndjson(lines: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// `POST /produce?{query}` with a Content-Type.
fn produce_with(s: &Server, query: &str, content_type: &str, body: &[u8]) -> Answer {
    s.client
        .call_with(
            "POST",
            &format!("/produce?{query}"),
            &[("content-type", content_type)],
            body,
        )
        .expect("POST /produce")
}

/// A batch produce that must fully succeed: asserts `200 {"results": [...], "failed": 0}` with one
/// `{"partition", "offset"}` result per record (and nothing else in it); returns them in order.
fn produce_batch(
    s: &Server,
    query: &str,
    content_type: &str,
    body: &[u8],
    records: usize,
) -> Vec<(u64, u64)> {
    let a = produce_with(s, query, content_type, body);
    assert_eq!(a.status, 200, "batch produce ?{query}: {}", a.text());
    let j = a.json();
    assert_eq!(j["failed"], 0, "batch produce ?{query}: {}", a.text());
    let results = j["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results array: {}", a.text()));
    assert_eq!(
        results.len(),
        records,
        "one result per record: {}",
        a.text()
    );
    results
        .iter()
        .map(|r| {
            let keys: BTreeSet<&str> = r.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            assert_eq!(
                keys,
                BTreeSet::from(["partition", "offset"]),
                "result {r} in {}",
                a.text()
            );
            (
                r["partition"].as_u64().unwrap(),
                r["offset"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The end_offset of every partition, in partition order.
fn end_offsets(s: &Server, topic: &str) -> Vec<u64> {
    s.partitions(topic)
        .iter()
        .map(|p| p["end_offset"].as_u64().expect("end_offset"))
        .collect()
}

/// One numeric field of every partition.
fn fields(s: &Server, topic: &str, name: &str) -> Vec<u64> {
    s.partitions(topic)
        .iter()
        .map(|p| {
            p[name]
                .as_u64()
                .unwrap_or_else(|| panic!("no {name} in {p}"))
        })
        .collect()
}

/// Polls a field of every partition until it equals `want`, within `limit`.
fn wait_for_fields(s: &Server, topic: &str, name: &str, want: &[u64], limit: Duration) {
    let start = Instant::now();
    loop {
        let got = fields(s, topic, name);
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{topic} {name} is {got:?}, expected {want:?} within {limit:?}"
        );
        thread::sleep(ms(10));
    }
}

/// Replays (partition, offset) and asserts 200 with exactly `body`.
fn assert_replay(s: &Server, topic: &str, partition: u64, offset: u64, body: &[u8]) {
    let a = s.get(&format!(
        "/consume?topic={topic}&partition={partition}&offset={offset}"
    ));
    assert_eq!(a.status, 200, "replay {partition}:{offset}: {}", a.text());
    assert_eq!(
        a.body,
        body,
        "replay {partition}:{offset}: got {:?}, want {:?}",
        String::from_utf8_lossy(&a.body),
        String::from_utf8_lossy(body)
    );
    assert_eq!(a.header("partition"), Some(partition.to_string().as_str()));
    assert_eq!(a.header("offset"), Some(offset.to_string().as_str()));
}

/// `crc32c(key) % partitions` (README: key → partition).
fn key_partition(key: &str, partitions: u32) -> u64 {
    (crc32c::crc32c(key.as_bytes()) % partitions) as u64
}

/// A message of a batch consume reply.
#[derive(Debug, Clone)]
struct Msg {
    partition: u64,
    offset: u64,
    handle: String,
    delivery_count: u64,
    body: Vec<u8>,
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

/// The lease fields of a reply header object, checked: the handle names the same partition and offset.
fn lease_fields(v: &Value) -> (u64, u64, String, u64) {
    let p = v["partition"].as_u64().unwrap_or_else(|| panic!("{v}"));
    let o = v["offset"].as_u64().unwrap_or_else(|| panic!("{v}"));
    let h = v["receipt_handle"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let (hp, ho, _) = parse_handle(&h);
    assert_eq!((hp, ho), (p, o), "the handle names its message: {v}");
    let n = v["delivery_count"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    (p, o, h, n)
}

/// The messages of an ndjson consume reply, each line checked: exactly the five fields, `body` when the bytes are
/// UTF-8 and `body_base64` when not.
fn ndjson_messages(a: &Answer) -> Vec<Msg> {
    assert_eq!(a.status, 200, "{}", a.text());
    let ct = a.header("content-type").unwrap_or("");
    assert!(
        ct.to_ascii_lowercase().starts_with(NDJSON),
        "content-type {ct:?}"
    );
    assert!(a.body.ends_with(b"\n"), "every line ends with a newline");
    let text = std::str::from_utf8(&a.body).expect("an ndjson reply is UTF-8");
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("line {line:?} is not JSON: {e}"));
            let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            let (partition, offset, handle, delivery_count) = lease_fields(&v);
            let body = if keys.contains("body") {
                assert_eq!(
                    keys,
                    BTreeSet::from([
                        "partition",
                        "offset",
                        "receipt_handle",
                        "delivery_count",
                        "body"
                    ]),
                    "line {line}"
                );
                v["body"].as_str().unwrap().as_bytes().to_vec()
            } else {
                assert_eq!(
                    keys,
                    BTreeSet::from([
                        "partition",
                        "offset",
                        "receipt_handle",
                        "delivery_count",
                        "body_base64"
                    ]),
                    "line {line}"
                );
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(v["body_base64"].as_str().unwrap())
                    .unwrap_or_else(|e| panic!("body_base64 of {line}: {e}"));
                assert!(
                    std::str::from_utf8(&bytes).is_err(),
                    "body_base64 for UTF-8 bytes (should be body): {line}"
                );
                bytes
            };
            Msg {
                partition,
                offset,
                handle,
                delivery_count,
                body,
            }
        })
        .collect()
}

/// The messages of a frames consume reply: a JSON header frame then a raw body frame per message.
fn frames_messages(a: &Answer) -> Vec<Msg> {
    assert_eq!(a.status, 200, "{}", a.text());
    let ct = a.header("content-type").unwrap_or("");
    assert!(
        ct.to_ascii_lowercase().starts_with(FRAMES),
        "content-type {ct:?}"
    );
    let all = split_frames(&a.body);
    assert_eq!(
        all.len() % 2,
        0,
        "two frames per message, got {}",
        all.len()
    );
    all.chunks(2)
        .map(|pair| {
            let v: Value = serde_json::from_slice(&pair[0]).unwrap_or_else(|e| {
                panic!(
                    "header frame {:?} is not JSON: {e}",
                    String::from_utf8_lossy(&pair[0])
                )
            });
            let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            assert_eq!(
                keys,
                BTreeSet::from(["partition", "offset", "receipt_handle", "delivery_count"]),
                "header frame {v}"
            );
            let (partition, offset, handle, delivery_count) = lease_fields(&v);
            Msg {
                partition,
                offset,
                handle,
                delivery_count,
                body: pair[1].clone(),
            }
        })
        .collect()
}

/// `GET /consume?topic=T{extra}` with an `Accept` header.
fn consume_accept(client: &Client, topic: &str, extra: &str, accept: &str) -> Answer {
    client
        .call_with(
            "GET",
            &format!("/consume?topic={topic}{extra}"),
            &[("accept", accept)],
            &[],
        )
        .expect("GET /consume")
}

/// A batch settle: `POST /{op}?topic=T{extra}` with a text/plain body of handles, one per line.
fn settle_batch(s: &Server, op: &str, topic: &str, extra: &str, lines: &[&str]) -> Answer {
    let mut body = lines.join("\n");
    body.push('\n');
    s.client
        .call_with(
            "POST",
            &format!("/{op}?topic={topic}{extra}"),
            &[("content-type", "text/plain")],
            body.as_bytes(),
        )
        .expect("POST settle")
}

/// The per-handle results of a batch settle, checked against `want` = (handle, status, error code) in request
/// order; an error entry also carries a non-empty `message`, a 200 entry no error.
fn assert_settled(a: &Answer, want: &[(&str, u64, Option<&str>)]) {
    assert_eq!(a.status, 200, "batch settle: {}", a.text());
    let results = a.json()["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results array: {}", a.text()))
        .clone();
    let got: Vec<(String, u64, Option<String>)> = results
        .iter()
        .map(|r| {
            (
                r["receipt_handle"].as_str().unwrap_or("?").to_string(),
                r["status"].as_u64().unwrap_or(0),
                r["error"].as_str().map(str::to_string),
            )
        })
        .collect();
    let want: Vec<(String, u64, Option<String>)> = want
        .iter()
        .map(|(h, s, e)| (h.to_string(), *s, e.map(str::to_string)))
        .collect();
    assert_eq!(got, want, "batch settle results: {}", a.text());
    for r in &results {
        if r["status"] != 200 {
            assert!(
                r["message"].as_str().is_some_and(|m| !m.is_empty()),
                "an error entry without a message: {r}"
            );
        }
    }
}

/// A response read off a raw socket (for requests without the headers ureq always adds).
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request (its head lines given without Host/Content-Length/Connection) and reads the reply.
fn raw_request(port: u16, head: &str, body: &[u8]) -> Raw {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "{head}\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut chunk).expect("reading a reply");
        assert!(n > 0, "closed before a reply head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let text = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    while buf.len() < head_end + 4 + len {
        let n = s.read(&mut chunk).expect("reading a reply body");
        assert!(n > 0, "closed inside a reply body");
        buf.extend_from_slice(&chunk[..n]);
    }
    Raw {
        status,
        headers,
        body: buf[head_end + 4..head_end + 4 + len].to_vec(),
    }
}

/// Writes a config file in `dir`; returns its path.
fn config_file(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("berth.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Runs `berth --server URL ARGS` with `stdin`, bounded (15 s); returns (exit code, stdout, stderr).
fn run_cli(s: &Server, args: &[&str], stdin: &[u8]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--server")
        .arg(s.url())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn berth");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("berth {args:?} did not exit within 15 s");
        }
        thread::sleep(ms(10));
    };
    writer.join().unwrap();
    (
        status.code(),
        reader.join().unwrap(),
        err_reader.join().unwrap(),
    )
}

// ---------------------------------------------------------------------------------------------------------------
// Batch produce
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn ndjson_batch_takes_text_base64_per_record_targets_and_query_defaults() {
    let s = Server::start(2, &[]);
    s.create_topic("nd", "partitions=4");
    let binary: &[u8] = &[0, 1, 0xff, 0, 0xfe];
    let keyed = "user-7";
    let lines = [
        serde_json::json!({"body": "plain text"}),
        serde_json::json!({"body_base64": b64(binary), "partition": 1}),
        serde_json::json!({"body": "keyed", "key": keyed}),
        serde_json::json!({"body": "", "partition": 3}),
        serde_json::json!({"body": "h\u{e9}llo \u{2713}\nwith a newline\ttab"}),
        serde_json::json!({"body_base64": "", "key": "k2"}),
        serde_json::json!({"body": "both", "partition": 0, "key": "ignored-by-partition"}),
    ];
    let bodies: Vec<Vec<u8>> = vec![
        b"plain text".to_vec(),
        binary.to_vec(),
        b"keyed".to_vec(),
        vec![],
        "h\u{e9}llo \u{2713}\nwith a newline\ttab"
            .as_bytes()
            .to_vec(),
        vec![],
        b"both".to_vec(),
    ];
    // Records naming neither key nor partition take the query's partition.
    let got = produce_batch(&s, "topic=nd&partition=2", NDJSON, &ndjson(&lines), 7);
    let want_partitions = [
        2,
        1,
        key_partition(keyed, 4),
        3,
        2,
        key_partition("k2", 4),
        0,
    ];
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        want_partitions,
        "partitions in request order"
    );
    // Offsets: per partition from 0, consecutive in request order.
    let mut next: BTreeMap<u64, u64> = BTreeMap::new();
    for (i, &(p, o)) in got.iter().enumerate() {
        let n = next.entry(p).or_insert(0);
        assert_eq!(o, *n, "record {i} on partition {p}: {got:?}");
        *n += 1;
    }
    for (i, &(p, o)) in got.iter().enumerate() {
        assert_replay(&s, "nd", p, o, &bodies[i]);
    }
    let mut want_ends = vec![0u64; 4];
    for &(p, _) in &got {
        want_ends[p as usize] += 1;
    }
    assert_eq!(end_offsets(&s, "nd"), want_ends);

    // Query `key` as the default, with a charset parameter on the media type; a record's own partition wins.
    let body = ndjson(&[
        serde_json::json!({"body": "a"}),
        serde_json::json!({"body": "b", "partition": 0}),
        serde_json::json!({"body": "c"}),
    ]);
    let got = produce_batch(
        &s,
        "topic=nd&key=abc",
        "application/x-ndjson; charset=utf-8",
        &body,
        3,
    );
    let kp = key_partition("abc", 4);
    assert_eq!(got[0].0, kp);
    assert_eq!(got[1].0, 0);
    assert_eq!(got[2].0, kp);
    if kp != 0 {
        assert_eq!(got[2].1, got[0].1 + 1, "{got:?}");
    }
    for (i, body) in [b"a", b"b", b"c"].iter().enumerate() {
        assert_replay(&s, "nd", got[i].0, got[i].1, *body);
    }
}

#[test]
fn frames_batch_is_binary_safe_with_empty_bodies_and_consecutive_offsets() {
    let s = Server::start(1, &[]);
    s.create_topic("fr", "partitions=2");
    assert_eq!(s.produce("fr", "&partition=1", b"first"), (1, 0));
    let all_bytes: Vec<u8> = (0..=255u8).cycle().take(700).collect();
    let bodies: Vec<&[u8]> = vec![
        &[0, 0, 0],
        b"",
        b"abc\n\x00def\r\n",
        &all_bytes,
        b"",
        b"{\"body\":\"not json-parsed\"}",
    ];
    let got = produce_batch(&s, "topic=fr&partition=1", FRAMES, &frames(&bodies), 6);
    assert_eq!(
        got,
        (1..=6).map(|o| (1, o)).collect::<Vec<_>>(),
        "one partition: consecutive offsets after the single produce"
    );
    for (i, b) in bodies.iter().enumerate() {
        assert_replay(&s, "fr", 1, 1 + i as u64, b);
    }
    assert_eq!(end_offsets(&s, "fr"), vec![0, 7]);

    // Query key as the default for frames.
    let kp = key_partition("frame-key", 2);
    let got = produce_batch(
        &s,
        "topic=fr&key=frame-key",
        FRAMES,
        &frames(&[b"x", b"\x00"]),
        2,
    );
    let base = if kp == 1 { 7 } else { 0 };
    assert_eq!(got, vec![(kp, base), (kp, base + 1)]);
    assert_replay(&s, "fr", kp, base, b"x");
    assert_replay(&s, "fr", kp, base + 1, b"\x00");

    // A single frame holding only an empty body is one empty message.
    let got = produce_batch(&s, "topic=fr&partition=0", FRAMES, &frames(&[b""]), 1);
    let end0 = end_offsets(&s, "fr")[0];
    assert_eq!(got, vec![(0, end0 - 1)]);
    assert_replay(&s, "fr", 0, end0 - 1, b"");
}

#[test]
fn an_acknowledged_batch_survives_kill_9() {
    let mut s = Server::start(2, &[]);
    s.create_topic("dur", "partitions=3");
    let bodies: Vec<Vec<u8>> = (0..60u32)
        .map(|i| {
            let mut b = format!("rec-{i}-").into_bytes();
            b.extend((0..(i % 7)).map(|k| k as u8));
            b
        })
        .collect();
    let lines: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| serde_json::json!({"body_base64": b64(b), "partition": i % 3}))
        .collect();
    let got = produce_batch(&s, "topic=dur", NDJSON, &ndjson(&lines), 60);
    s.restart();
    assert_eq!(end_offsets(&s, "dur"), vec![20, 20, 20]);
    for (i, &(p, o)) in got.iter().enumerate() {
        assert_eq!((p, o), ((i % 3) as u64, (i / 3) as u64), "record {i}");
        assert_replay(&s, "dur", p, o, &bodies[i]);
    }
}

#[test]
fn mixed_keys_and_partitions_land_where_single_produces_would() {
    let s = Server::start(2, &[]);
    s.create_topic("single", "partitions=5");
    s.create_topic("batched", "partitions=5");
    let keys: Vec<String> = (0..24).map(|i| format!("key-{i}")).collect();
    let mut lines = Vec::new();
    let mut want = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let (p, _) = s.produce("single", &format!("&key={k}"), k.as_bytes());
        assert_eq!(p, key_partition(k, 5), "single produce with key {k}");
        lines.push(serde_json::json!({"body": k, "key": k}));
        want.push(p);
        if i % 4 == 0 {
            let explicit = (i % 5) as u64;
            let (p, _) = s.produce("single", &format!("&partition={explicit}"), b"p");
            assert_eq!(p, explicit);
            lines.push(serde_json::json!({"body": "p", "partition": explicit}));
            want.push(explicit);
        }
    }
    let got = produce_batch(&s, "topic=batched", NDJSON, &ndjson(&lines), lines.len());
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        want,
        "batch partitions = single-produce partitions"
    );
    // Same records in the same order per partition: the two topics hold the same logs.
    assert_eq!(end_offsets(&s, "batched"), end_offsets(&s, "single"));
    for (i, &(p, o)) in got.iter().enumerate() {
        let body = lines[i]["body"].as_str().unwrap().as_bytes().to_vec();
        assert_replay(&s, "batched", p, o, &body);
        assert_replay(&s, "single", p, o, &body);
    }
}

#[test]
fn records_of_one_batch_bound_for_one_partition_get_consecutive_offsets_under_concurrent_produces()
{
    let s = Server::start(2, &[]);
    s.create_topic("cons", "partitions=3");
    let stop = Arc::new(AtomicBool::new(false));
    // Single produces racing on every partition from other connections.
    let racers: Vec<_> = (0..3)
        .map(|p| {
            let client = Client::new(&s.url());
            let stop = stop.clone();
            thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let a = client
                        .call("POST", &format!("/produce?topic=cons&partition={p}"), b"r")
                        .unwrap();
                    assert_eq!(a.status, 200, "{}", a.text());
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut batch_records = 0u64;
    for round in 0..15 {
        // Interleaved: partition 0, 1, key, default (query partition 2), ...
        let mut lines = Vec::new();
        for i in 0..12 {
            lines.push(match i % 4 {
                0 => serde_json::json!({"body": format!("b{round}-{i}"), "partition": 0}),
                1 => serde_json::json!({"body": format!("b{round}-{i}"), "partition": 1}),
                2 => serde_json::json!({"body": format!("b{round}-{i}"), "key": "kk"}),
                _ => serde_json::json!({"body": format!("b{round}-{i}")}),
            });
        }
        let got = produce_batch(&s, "topic=cons&partition=2", NDJSON, &ndjson(&lines), 12);
        batch_records += 12;
        let mut by_partition: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for &(p, o) in &got {
            by_partition.entry(p).or_default().push(o);
        }
        for (p, offsets) in &by_partition {
            for w in offsets.windows(2) {
                assert_eq!(
                    w[1],
                    w[0] + 1,
                    "round {round}: partition {p} offsets {offsets:?} are not consecutive"
                );
            }
        }
        for (i, &(p, o)) in got.iter().enumerate() {
            if i % 5 == 0 {
                assert_replay(&s, "cons", p, o, format!("b{round}-{i}").as_bytes());
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let raced: u64 = racers.into_iter().map(|t| t.join().unwrap()).sum();
    let total: u64 = end_offsets(&s, "cons").iter().sum();
    assert_eq!(total, raced + batch_records, "no gaps, nothing lost");
}

#[test]
fn a_malformed_record_anywhere_fails_the_whole_request_and_writes_nothing() {
    let s = Server::start(2, &[]);
    s.create_topic("bad", "partitions=3");
    for p in 0..3 {
        s.produce("bad", &format!("&partition={p}"), b"before");
    }
    let before = end_offsets(&s, "bad");
    let good = |p: u64| format!("{{\"body\":\"ok\",\"partition\":{p}}}\n");
    let ndjson_cases: Vec<(&str, String)> = vec![
        (
            "a line that is not JSON, last",
            format!("{}{}{{\"body\": \"unterminated\n", good(0), good(1)),
        ),
        (
            "a line that is not JSON, first",
            format!("not json at all\n{}{}", good(0), good(2)),
        ),
        (
            "both body and body_base64",
            format!(
                "{}{{\"body\":\"a\",\"body_base64\":\"YQ==\"}}\n{}",
                good(0),
                good(1)
            ),
        ),
        (
            "neither body nor body_base64",
            format!("{}{{\"key\":\"k\"}}\n", good(2)),
        ),
        (
            "bad base64",
            format!(
                "{}{}{{\"body_base64\":\"!!not*base64\"}}\n",
                good(0),
                good(1)
            ),
        ),
        (
            "body that is not a string",
            format!("{}{{\"body\":42}}\n", good(1)),
        ),
        (
            "a JSON array instead of an object",
            format!("{}[\"body\",\"x\"]\n", good(0)),
        ),
    ];
    for (what, body) in &ndjson_cases {
        let a = produce_with(&s, "topic=bad", NDJSON, body.as_bytes());
        assert_eq!(a.status, 400, "{what}: {}", a.text());
        assert_error(&a, 400, "invalid_record");
        assert_eq!(
            end_offsets(&s, "bad"),
            before,
            "{what}: something was written"
        );
    }
    let mut truncated_length = frames(&[b"one", b"two"]);
    truncated_length.extend_from_slice(&[5, 0]);
    let mut past_the_end = frames(&[b"one", b"two"]);
    past_the_end.extend_from_slice(&10u32.to_le_bytes());
    past_the_end.extend_from_slice(b"short");
    let mut huge_length = frames(&[b"one"]);
    huge_length.extend_from_slice(&u32::MAX.to_le_bytes());
    huge_length.extend_from_slice(b"x");
    let frame_cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "a truncated frame length",
            "topic=bad&partition=1",
            truncated_length,
        ),
        (
            "a frame running past the body",
            "topic=bad&partition=2",
            past_the_end,
        ),
        ("a length of 4 GiB", "topic=bad", huge_length),
        ("three bytes only", "topic=bad", vec![1, 0, 0]),
    ];
    for (what, query, body) in &frame_cases {
        let a = produce_with(&s, query, FRAMES, body);
        if *what == "a length of 4 GiB" && a.status == 413 {
            // Over max_message_bytes as well as past the body: either answer is right.
            assert_error(&a, 413, "message_too_large");
        } else {
            assert_error(&a, 400, "invalid_record");
        }
        assert_eq!(
            end_offsets(&s, "bad"),
            before,
            "{what}: something was written"
        );
    }
    // Still healthy and writable afterwards.
    let got = produce_batch(&s, "topic=bad&partition=0", FRAMES, &frames(&[b"after"]), 1);
    assert_eq!(got, vec![(0, before[0])]);
}

#[test]
fn batch_produce_to_an_unknown_topic_or_partition_is_404_and_writes_nothing() {
    let s = Server::start(1, &[]);
    s.create_topic("known", "partitions=2");
    let a = produce_with(&s, "topic=nope", NDJSON, b"{\"body\":\"x\"}\n");
    assert_error(&a, 404, "topic_not_found");
    let a = produce_with(&s, "topic=nope", FRAMES, &frames(&[b"x"]));
    assert_error(&a, 404, "topic_not_found");
    let a = produce_with(
        &s,
        "topic=known&partition=2",
        FRAMES,
        &frames(&[b"x", b"y"]),
    );
    assert_error(&a, 404, "partition_not_found");
    let a = produce_with(&s, "topic=b@d", NDJSON, b"{\"body\":\"x\"}\n");
    assert_error(&a, 400, "invalid_topic");
    assert_eq!(end_offsets(&s, "known"), vec![0, 0]);
}

#[test]
fn batch_limits_are_413_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "max_batch_records = 5\nmax_batch_bytes = 200\nmax_message_bytes = 64\n",
    );
    let s = Server::start(1, &["--config", &config]);
    s.create_topic("lim", "partitions=2");
    s.produce("lim", "&partition=0", b"seed");
    let before = end_offsets(&s, "lim");
    let check = |what: &str, a: Answer, code: &str| {
        assert_error(&a, 413, code);
        assert_eq!(
            end_offsets(&s, "lim"),
            before,
            "{what}: something was written"
        );
    };
    let tiny = |n: usize| ndjson(&vec![serde_json::json!({"body": "t"}); n]);
    // Records: six is over five.
    check(
        "6 ndjson records",
        produce_with(&s, "topic=lim", NDJSON, &tiny(6)),
        "batch_too_large",
    );
    check(
        "6 frames",
        produce_with(&s, "topic=lim", FRAMES, &frames(&[&b"t"[..]; 6])),
        "batch_too_large",
    );
    // Bytes: a 201-byte frames body of four records under the message limit.
    let b46 = [b'a'; 46];
    let b47 = [b'a'; 47];
    let over = frames(&[&b46, &b46, &b46, &b47]);
    assert_eq!(over.len(), 201);
    check(
        "a 201-byte frames body",
        produce_with(&s, "topic=lim", FRAMES, &over),
        "batch_too_large",
    );
    let long = "x".repeat(60);
    let over = ndjson(&vec![serde_json::json!({"body": long}); 3]);
    assert!(over.len() > 200);
    check(
        "a 200+-byte ndjson body",
        produce_with(&s, "topic=lim", NDJSON, &over),
        "batch_too_large",
    );
    // One record over max_message_bytes, after a good one.
    let b65 = [b'z'; 65];
    check(
        "a 65-byte frame",
        produce_with(&s, "topic=lim", FRAMES, &frames(&[b"ok", &b65])),
        "message_too_large",
    );
    let text65 = "z".repeat(65);
    check(
        "a 65-byte ndjson body",
        produce_with(
            &s,
            "topic=lim",
            NDJSON,
            &ndjson(&[
                serde_json::json!({"body": "ok"}),
                serde_json::json!({"body": text65}),
            ]),
        ),
        "message_too_large",
    );
    check(
        "a 65-byte base64 body",
        produce_with(
            &s,
            "topic=lim",
            NDJSON,
            &ndjson(&[serde_json::json!({"body_base64": b64(&b65)})]),
        ),
        "message_too_large",
    );
    check(
        "a 65-byte single produce",
        s.post("/produce?topic=lim", &b65),
        "message_too_large",
    );
    // At the limits exactly: five records, 200 bytes, 64-byte bodies.
    let at = frames(&[&b46, &b46, &b46, &b46]);
    assert_eq!(at.len(), 200);
    let got = produce_batch(&s, "topic=lim&partition=1", FRAMES, &at, 4);
    assert_eq!(got, (0..4).map(|o| (1, o)).collect::<Vec<_>>());
    let got = produce_batch(&s, "topic=lim&partition=1", NDJSON, &tiny(5), 5);
    assert_eq!(got, (4..9).map(|o| (1, o)).collect::<Vec<_>>());
    let b64_bytes = [b'y'; 64];
    let got = produce_batch(
        &s,
        "topic=lim&partition=1",
        FRAMES,
        &frames(&[&b64_bytes]),
        1,
    );
    assert_eq!(got, vec![(1, 9)]);
    assert_replay(&s, "lim", 1, 9, &b64_bytes);

    // Consume: max is 1 to max_batch_records.
    let a = consume_accept(&s.client, "lim", "&max=6", NDJSON);
    assert_error(&a, 400, "invalid_parameter");
    let a = consume_accept(&s.client, "lim", "&max=0", NDJSON);
    assert_error(&a, 400, "invalid_parameter");
    let msgs = ndjson_messages(&consume_accept(&s.client, "lim", "&max=5", NDJSON));
    assert_eq!(msgs.len(), 5);
    // Settle: more handles than max_batch_records is 413 batch_too_large, and nothing is settled.
    let mut handles: Vec<&str> = msgs.iter().map(|m| m.handle.as_str()).collect();
    handles.push("0:0:1");
    let a = settle_batch(&s, "ack", "lim", "", &handles);
    assert_error(&a, 413, "batch_too_large");
    assert_eq!(fields(&s, "lim", "in_flight").iter().sum::<u64>(), 5);
    handles.pop();
    let want: Vec<(&str, u64, Option<&str>)> = handles.iter().map(|h| (*h, 200, None)).collect();
    assert_settled(&settle_batch(&s, "ack", "lim", "", &handles), &want);
}

// ---------------------------------------------------------------------------------------------------------------
// Batch consume
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn ndjson_consume_lines_carry_the_lease_and_the_body_or_its_base64() {
    let s = Server::start(1, &[]);
    s.create_topic("cn", "");
    let bodies: Vec<&[u8]> = vec![
        b"alpha",
        &[0xff, 0x00, 0xfe],
        b"",
        b"line\nbreak \"quoted\" \\ back",
        "\u{fc}n\u{ef}code \u{1f600}".as_bytes(),
        &[0x00, 0x00],
    ];
    produce_batch(&s, "topic=cn", FRAMES, &frames(&bodies), bodies.len());
    let msgs = ndjson_messages(&consume_accept(&s.client, "cn", "&max=10", NDJSON));
    assert_eq!(
        msgs.iter()
            .map(|m| (m.partition, m.offset, m.delivery_count, m.body.clone()))
            .collect::<Vec<_>>(),
        bodies
            .iter()
            .enumerate()
            .map(|(i, b)| (0, i as u64, 1, b.to_vec()))
            .collect::<Vec<_>>(),
        "all six, in offset order, delivery_count 1, exact bytes"
    );
    let nonces: BTreeSet<u64> = msgs.iter().map(|m| parse_handle(&m.handle).2).collect();
    assert_eq!(nonces.len(), 6, "a fresh nonce per lease");
    assert_eq!(fields(&s, "cn", "in_flight"), vec![6]);
    // Nothing left: 204, empty body.
    let a = consume_accept(&s.client, "cn", "&max=10", NDJSON);
    assert_eq!(a.status, 204, "{}", a.text());
    assert!(a.body.is_empty());

    // Every handle is a live lease: nack two singly, ack the rest singly.
    for m in &msgs {
        let op = if m.offset == 1 || m.offset == 4 {
            "nack"
        } else {
            "ack"
        };
        let a = s.post(&format!("/{op}?topic=cn&receipt_handle={}", m.handle), b"");
        assert_eq!(a.status, 200, "{op} {}: {}", m.handle, a.text());
    }
    // Redelivered: delivery_count 2, new handles; without any Accept header max>1 is ndjson too.
    let raw = raw_request(s.port, "GET /consume?topic=cn&max=10 HTTP/1.1", b"");
    let a = Answer {
        status: raw.status,
        headers: raw.headers.clone(),
        body: raw.body.clone(),
    };
    assert!(raw.header("content-type").is_some());
    let again = ndjson_messages(&a);
    assert_eq!(
        again
            .iter()
            .map(|m| (m.offset, m.delivery_count, m.body.clone()))
            .collect::<Vec<_>>(),
        vec![
            (1, 2, vec![0xff, 0x00, 0xfe]),
            (4, 2, "\u{fc}n\u{ef}code \u{1f600}".as_bytes().to_vec())
        ]
    );
    for m in &again {
        assert!(
            msgs.iter().all(|old| old.handle != m.handle),
            "a redelivery has a new handle"
        );
    }
    // With ureq's default `Accept: */*` (no batch type named), max>1 is ndjson as well.
    for m in &again {
        s.post(&format!("/nack?topic=cn&receipt_handle={}", m.handle), b"");
    }
    let third = ndjson_messages(&s.get("/consume?topic=cn&max=2"));
    assert_eq!(
        third
            .iter()
            .map(|m| (m.offset, m.delivery_count))
            .collect::<Vec<_>>(),
        vec![(1, 3), (4, 3)]
    );
}

#[test]
fn frames_consume_sends_a_json_header_then_the_raw_body() {
    let s = Server::start(1, &[]);
    s.create_topic("cf", "partitions=1");
    let big: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let bodies: Vec<&[u8]> = vec![&[0, 0, 0, 0], b"", b"text", &big, b"", &[0xff]];
    produce_batch(&s, "topic=cf", FRAMES, &frames(&bodies), bodies.len());
    let msgs = frames_messages(&consume_accept(&s.client, "cf", "&max=4", FRAMES));
    assert_eq!(
        msgs.iter()
            .map(|m| (m.partition, m.offset, m.delivery_count, m.body.clone()))
            .collect::<Vec<_>>(),
        (0..4)
            .map(|i| (0, i as u64, 1, bodies[i].to_vec()))
            .collect::<Vec<_>>(),
        "max=4 gives the first four"
    );
    // `Accept` may list other types first and carry parameters.
    let rest = frames_messages(&consume_accept(
        &s.client,
        "cf",
        "&max=10",
        "text/html, application/vnd.berth.frames;q=0.9",
    ));
    assert_eq!(
        rest.iter()
            .map(|m| (m.offset, m.body.clone()))
            .collect::<Vec<_>>(),
        vec![(4, vec![]), (5, vec![0xff])]
    );
    // The handles are live leases.
    let handles: Vec<&str> = msgs
        .iter()
        .chain(&rest)
        .map(|m| m.handle.as_str())
        .collect();
    let want: Vec<(&str, u64, Option<&str>)> = handles.iter().map(|h| (*h, 200, None)).collect();
    assert_settled(&settle_batch(&s, "ack", "cf", "", &handles), &want);
    wait_for_fields(&s, "cf", "committed", &[6], Duration::from_secs(2));
    // max=1 with a batch Accept is a batch of one.
    s.produce("cf", "", b"\x00one");
    let one = frames_messages(&consume_accept(&s.client, "cf", "&max=1", FRAMES));
    assert_eq!(one.len(), 1);
    assert_eq!(
        (one[0].offset, one[0].body.as_slice()),
        (6, &b"\x00one"[..])
    );
}

#[test]
fn max_1_without_a_batch_accept_is_version_1s_single_reply() {
    let s = Server::start(1, &[]);
    s.create_topic("v1", "");
    s.produce("v1", "", b"one\ntwo");
    s.produce("v1", "", b"three");
    for extra in ["&max=1", ""] {
        let a = s.get(&format!("/consume?topic=v1{extra}"));
        assert_eq!(a.status, 200, "{}", a.text());
        let offset: u64 = a.header("offset").unwrap().parse().unwrap();
        let want: &[u8] = if offset == 0 { b"one\ntwo" } else { b"three" };
        assert_eq!(a.body, want, "raw body, not ndjson ({extra})");
        assert_eq!(a.header("partition"), Some("0"));
        assert_eq!(a.header("delivery-count"), Some("1"));
        let h = a
            .header("receipt-handle")
            .expect("Receipt-Handle")
            .to_string();
        assert_eq!(parse_handle(&h).1, offset);
        let ct = a.header("content-type").unwrap_or("");
        assert!(
            !ct.contains("ndjson") && !ct.contains("berth.frames"),
            "{ct}"
        );
    }
    // With max=1 and ndjson Accept: one ndjson line.
    s.produce("v1", "", b"four");
    let msgs = ndjson_messages(&consume_accept(&s.client, "v1", "&max=1", NDJSON));
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].body, b"four");
    // max: 1 to max_batch_records (default 1000).
    for bad in ["0", "1001", "-1", "abc", "", "2.5"] {
        let a = s.get(&format!("/consume?topic=v1&max={bad}"));
        assert_error(&a, 400, "invalid_parameter");
    }
    let a = consume_accept(&s.client, "v1", "&max=1000", NDJSON);
    assert_eq!(a.status, 204, "{}", a.text());
}

#[test]
fn a_batch_long_poll_answers_as_soon_as_one_message_arrives() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("lp", "partitions=2");
    // Messages already there: returned at once, without waiting to fill max.
    s.produce("lp", "&partition=0", b"a");
    s.produce("lp", "&partition=1", b"b");
    let start = Instant::now();
    let msgs = ndjson_messages(&consume_accept(&s.client, "lp", "&max=10&wait=5s", NDJSON));
    assert_eq!(msgs.len(), 2);
    assert!(
        start.elapsed() < ms(1000),
        "took {:?} with messages available",
        start.elapsed()
    );
    // None within wait: 204 after the wait.
    let start = Instant::now();
    let a = consume_accept(&s.client, "lp", "&max=10&wait=400ms", NDJSON);
    assert_eq!(a.status, 204, "{}", a.text());
    assert!(
        start.elapsed() >= ms(350),
        "wait not spent: {:?}",
        start.elapsed()
    );

    // Parked with max=10: one produce wakes it with that one message.
    for round in 0..2 {
        let (tx, rx) = mpsc::channel();
        let client = Client::new(&s.url());
        let consumer = thread::spawn(move || {
            let a = consume_accept(&client, "lp", "&max=10&wait=5s", NDJSON);
            let _ = tx.send((Instant::now(), a));
        });
        thread::sleep(ms(300));
        assert!(
            rx.try_recv().is_err(),
            "round {round}: the consume answered before any produce"
        );
        let produced_at = Instant::now();
        let (p, o) = s.produce("lp", &format!("&partition={round}"), b"wake");
        let (answered_at, a) = rx
            .recv_timeout(Duration::from_secs(8))
            .expect("the consume never answered");
        consumer.join().unwrap();
        let took = answered_at.saturating_duration_since(produced_at);
        let msgs = ndjson_messages(&a);
        assert_eq!(
            msgs.iter()
                .map(|m| (m.partition, m.offset, m.body.clone()))
                .collect::<Vec<_>>(),
            vec![(p, o, b"wake".to_vec())],
            "round {round}"
        );
        assert!(
            took < ms(1000),
            "round {round}: answered {took:?} after the produce (max=10 must not wait to fill)"
        );
    }
}

/// Open client connections per core, from /metrics.
fn connections_per_core(s: &Server, cores: usize) -> Vec<u64> {
    let text = s.get("/metrics").text();
    (0..cores)
        .map(|c| {
            let want = format!("berth_connections_open{{core=\"{c}\"}} ");
            let line = text
                .lines()
                .find(|l| l.starts_with(&want))
                .unwrap_or_else(|| panic!("no {want} in /metrics"));
            line[want.len()..].trim().parse::<f64>().unwrap() as u64
        })
        .collect()
}

/// A client whose kept-alive connection is served by `core`; others found on the way are kept in `spare`.
fn client_on_core(s: &Server, cores: usize, core: usize, spare: &mut Vec<Client>) -> Client {
    for _ in 0..100 {
        let before = connections_per_core(s, cores);
        let c = Client::new(&s.url());
        assert_eq!(c.call("GET", "/health", &[]).unwrap().status, 200);
        let after = connections_per_core(s, cores);
        let grew: Vec<usize> = (0..cores).filter(|&i| after[i] > before[i]).collect();
        if grew == [core] && after.iter().sum::<u64>() == before.iter().sum::<u64>() + 1 {
            return c;
        }
        spare.push(c);
    }
    panic!("could not get a connection on core {core}");
}

#[test]
fn a_batch_consume_gathers_every_partition_on_every_core() {
    let _g = common::serial();
    let s = Server::start(2, &[]);
    s.create_topic("g", "partitions=4");
    let cores: BTreeSet<u64> = s
        .partitions("g")
        .iter()
        .map(|p| p["core"].as_u64().unwrap())
        .collect();
    assert_eq!(cores, BTreeSet::from([0, 1]), "partitions on both cores");
    let mut lines = Vec::new();
    for p in 0..4u64 {
        for i in 0..5 {
            lines.push(serde_json::json!({"body": format!("{p}-{i}"), "partition": p}));
        }
    }
    produce_batch(&s, "topic=g", NDJSON, &ndjson(&lines), 20);
    let want: BTreeSet<(u64, u64, Vec<u8>)> = (0..4u64)
        .flat_map(|p| (0..5u64).map(move |i| (p, i, format!("{p}-{i}").into_bytes())))
        .collect();
    let mut spare = Vec::new();
    for (round, core) in [0usize, 1].into_iter().enumerate() {
        let client = client_on_core(&s, 2, core, &mut spare);
        let msgs = ndjson_messages(&consume_accept(&client, "g", "&max=100", NDJSON));
        let got: BTreeSet<(u64, u64, Vec<u8>)> = msgs
            .iter()
            .map(|m| (m.partition, m.offset, m.body.clone()))
            .collect();
        assert_eq!(
            msgs.len(),
            20,
            "request on core {core}: one reply holds all 20"
        );
        assert_eq!(got, want, "request on core {core}");
        assert!(
            msgs.iter().all(|m| m.delivery_count == round as u64 + 1),
            "{msgs:?}"
        );
        // Per partition, in offset order.
        for p in 0..4 {
            let offsets: Vec<u64> = msgs
                .iter()
                .filter(|m| m.partition == p)
                .map(|m| m.offset)
                .collect();
            assert_eq!(offsets, vec![0, 1, 2, 3, 4], "partition {p}");
        }
        let a = consume_accept(&client, "g", "&max=100", NDJSON);
        assert_eq!(a.status, 204, "all leased: {}", a.text());
        // Release them all with one batch nack for the next round.
        let handles: Vec<&str> = msgs.iter().map(|m| m.handle.as_str()).collect();
        let want_settled: Vec<(&str, u64, Option<&str>)> =
            handles.iter().map(|h| (*h, 200, None)).collect();
        assert_settled(&settle_batch(&s, "nack", "g", "", &handles), &want_settled);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Batch settle
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn a_batch_ack_settles_each_handle_as_the_single_request_would_in_request_order() {
    let s = Server::start(2, &[]);
    s.create_topic("ack", "partitions=2");
    let mut lines = Vec::new();
    for p in 0..2u64 {
        for i in 0..3 {
            lines.push(serde_json::json!({"body": format!("{p}/{i}"), "partition": p}));
        }
    }
    produce_batch(&s, "topic=ack", NDJSON, &ndjson(&lines), 6);
    let msgs = ndjson_messages(&consume_accept(&s.client, "ack", "&max=6", NDJSON));
    assert_eq!(msgs.len(), 6);
    let h: BTreeMap<(u64, u64), String> = msgs
        .iter()
        .map(|m| ((m.partition, m.offset), m.handle.clone()))
        .collect();
    assert_eq!(h.len(), 6);
    // (0,0) acked already; (0,1) nacked and re-leased (its old handle is stale).
    let a = s.post(
        &format!("/ack?topic=ack&receipt_handle={}", h[&(0, 0)]),
        b"",
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let a = s.post(
        &format!("/nack?topic=ack&receipt_handle={}", h[&(0, 1)]),
        b"",
    );
    assert_eq!(a.status, 200, "{}", a.text());
    let re = s.get("/consume?topic=ack");
    assert_eq!(re.status, 200, "{}", re.text());
    assert_eq!(
        (
            re.header("partition"),
            re.header("offset"),
            re.header("delivery-count")
        ),
        (Some("0"), Some("1"), Some("2"))
    );
    let releases = re.header("receipt-handle").unwrap().to_string();
    assert_ne!(releases, h[&(0, 1)]);

    let body = [
        h[&(0, 2)].as_str(),
        h[&(0, 0)].as_str(),
        "not-a-handle",
        h[&(0, 1)].as_str(),
        "7:0:1",
        "0:99:5",
        releases.as_str(),
        h[&(1, 0)].as_str(),
        h[&(1, 1)].as_str(),
        h[&(1, 2)].as_str(),
    ];
    let gone = Some("lease_gone");
    let first: Vec<(&str, u64, Option<&str>)> = vec![
        (body[0], 200, None),
        (body[1], 410, gone),
        (body[2], 400, Some("invalid_receipt_handle")),
        (body[3], 410, gone),
        (body[4], 404, Some("partition_not_found")),
        (body[5], 410, gone),
        (body[6], 200, None),
        (body[7], 200, None),
        (body[8], 200, None),
        (body[9], 200, None),
    ];
    assert_settled(&settle_batch(&s, "ack", "ack", "", &body), &first);
    wait_for_fields(&s, "ack", "committed", &[3, 3], Duration::from_secs(2));
    assert_eq!(fields(&s, "ack", "in_flight"), vec![0, 0]);
    assert_eq!(fields(&s, "ack", "end_offset"), vec![3, 3]);

    // The same batch again: every lease is gone now; the malformed and out-of-range lines answer as before.
    let second: Vec<(&str, u64, Option<&str>)> = first
        .iter()
        .map(|&(h, st, e)| match st {
            200 | 410 => (h, 410, gone),
            _ => (h, st, e),
        })
        .collect();
    assert_settled(&settle_batch(&s, "ack", "ack", "", &body), &second);
    assert_eq!(fields(&s, "ack", "committed"), vec![3, 3]);
    // Unknown topic: 404 for the whole request.
    let a = settle_batch(&s, "ack", "nope", "", &["0:0:1"]);
    assert_error(&a, 404, "topic_not_found");
}

#[test]
fn batch_nack_and_extend_apply_delay_and_visibility_to_each_handle() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("ne", "partitions=1");
    produce_batch(&s, "topic=ne", FRAMES, &frames(&[b"0", b"1", b"2"]), 3);
    let first = ndjson_messages(&consume_accept(&s.client, "ne", "&max=3", NDJSON));
    assert_eq!(first.len(), 3);
    let old: Vec<&str> = first.iter().map(|m| m.handle.as_str()).collect();
    let want: Vec<(&str, u64, Option<&str>)> = old.iter().map(|h| (*h, 200, None)).collect();
    assert_settled(&settle_batch(&s, "nack", "ne", "", &old), &want);
    // Deliverable again at once, delivery_count 2, new handles.
    let second = ndjson_messages(&consume_accept(&s.client, "ne", "&max=3", NDJSON));
    assert_eq!(
        second
            .iter()
            .map(|m| (m.offset, m.delivery_count))
            .collect::<Vec<_>>(),
        vec![(0, 2), (1, 2), (2, 2)]
    );
    let new: Vec<&str> = second.iter().map(|m| m.handle.as_str()).collect();
    // Extend the old and the new: old 410, new 200.
    let mixed = [old[0], new[0], old[1], new[1], old[2], new[2]];
    let gone = Some("lease_gone");
    assert_settled(
        &settle_batch(&s, "extend", "ne", "&visibility=20s", &mixed),
        &[
            (old[0], 410, gone),
            (new[0], 200, None),
            (old[1], 410, gone),
            (new[1], 200, None),
            (old[2], 410, gone),
            (new[2], 200, None),
        ],
    );
    // A bad visibility fails the whole request.
    let a = settle_batch(&s, "extend", "ne", "&visibility=0s", &new);
    assert_error(&a, 400, "invalid_duration");
    assert_settled(
        &settle_batch(&s, "ack", "ne", "", &new),
        &[
            (new[0], 200, None),
            (new[1], 200, None),
            (new[2], 200, None),
        ],
    );
    wait_for_fields(&s, "ne", "committed", &[3], Duration::from_secs(2));

    // Extend takes effect: leases of 1s extended to 20s are not redelivered within 2.5s.
    produce_batch(&s, "topic=ne", FRAMES, &frames(&[b"3", b"4"]), 2);
    let short = ndjson_messages(&consume_accept(
        &s.client,
        "ne",
        "&max=2&visibility=1s",
        NDJSON,
    ));
    assert_eq!(short.len(), 2);
    let hs: Vec<&str> = short.iter().map(|m| m.handle.as_str()).collect();
    let start = Instant::now();
    assert_settled(
        &settle_batch(&s, "extend", "ne", "&visibility=20s", &hs),
        &[(hs[0], 200, None), (hs[1], 200, None)],
    );
    assert!(start.elapsed() < ms(800), "the extend itself was slow");
    let a = consume_accept(&s.client, "ne", "&max=2&wait=2500ms", NDJSON);
    assert_eq!(
        a.status,
        204,
        "extended leases were redelivered: {}",
        a.text()
    );
    // Nack with a delay: not deliverable before it; the handles are then settled (stale).
    assert_settled(
        &settle_batch(&s, "nack", "ne", "&delay=30s", &hs),
        &[(hs[0], 200, None), (hs[1], 200, None)],
    );
    let a = consume_accept(&s.client, "ne", "&max=2&wait=300ms", NDJSON);
    assert_eq!(a.status, 204, "delayed nack delivered early: {}", a.text());
    assert_settled(
        &settle_batch(&s, "nack", "ne", "", &hs),
        &[(hs[0], 410, gone), (hs[1], 410, gone)],
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Version 1 unchanged
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn a_produce_without_a_batch_content_type_is_one_message() {
    let s = Server::start(1, &[]);
    s.create_topic("one", "");
    let ndjson_looking = b"{\"body\":\"x\"}\n{\"body\":\"y\"}\n".to_vec();
    let frames_looking = frames(&[b"a", b"b"]);
    let cases: Vec<(Option<&str>, Vec<u8>)> = vec![
        (None, b"a\nb\nc\n".to_vec()),
        (Some("text/plain"), b"line 1\nline 2".to_vec()),
        (Some("text/plain; charset=utf-8"), ndjson_looking.clone()),
        (Some("application/octet-stream"), frames_looking.clone()),
        (None, ndjson_looking),
        (None, frames_looking),
        (
            Some("application/json"),
            b"{\"body\":\"z\"}\n{\"body\":\"w\"}".to_vec(),
        ),
        (None, Vec::new()),
    ];
    for (i, (ct, body)) in cases.iter().enumerate() {
        let head = match ct {
            Some(ct) => format!("POST /produce?topic=one HTTP/1.1\r\nContent-Type: {ct}"),
            None => "POST /produce?topic=one HTTP/1.1".to_string(),
        };
        let r = raw_request(s.port, &head, body);
        assert_eq!(
            r.status,
            200,
            "case {i} ({ct:?}): {}",
            String::from_utf8_lossy(&r.body)
        );
        let j: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            j,
            serde_json::json!({"partition": 0, "offset": i}),
            "case {i} ({ct:?}): version 1's reply"
        );
        assert_eq!(
            end_offsets(&s, "one"),
            vec![i as u64 + 1],
            "case {i}: one message"
        );
        assert_replay(&s, "one", 0, i as u64, body);
    }
    // Version 1's single settle still answers 200 with no per-handle results.
    let a = s.get("/consume?topic=one");
    let h = a.header("receipt-handle").unwrap().to_string();
    let a = s.post(&format!("/ack?topic=one&receipt_handle={h}"), b"");
    assert_eq!(a.status, 200);
    assert!(
        a.json().get("results").is_none(),
        "a single ack is not a batch: {}",
        a.text()
    );
    let a = s.post("/ack?topic=one&receipt_handle=bad", b"");
    assert_error(&a, 400, "invalid_receipt_handle");
    let a = s.post(&format!("/ack?topic=one&receipt_handle={h}"), b"");
    assert_error(&a, 410, "lease_gone");
}

// ---------------------------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn cli_produce_sends_one_message_per_stdin_line_or_frame() {
    let s = Server::start(1, &[]);
    s.create_topic("cli", "");
    let (code, out, err) = run_cli(&s, &["produce", "cli"], b"one\ntwo words\nthree\n");
    assert_eq!(code, Some(0), "stderr: {err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(
        lines,
        (0..3)
            .map(|o| serde_json::json!({"partition": 0, "offset": o}))
            .collect::<Vec<_>>(),
        "stdout: {out}"
    );
    for (o, b) in [&b"one"[..], b"two words", b"three"].iter().enumerate() {
        assert_replay(&s, "cli", 0, o as u64, b);
    }

    let bodies: Vec<&[u8]> = vec![b"\x00bin\x00ary\xff", b"", b"x\ny"];
    let (code, out, err) = run_cli(&s, &["produce", "cli", "--frames"], &frames(&bodies));
    assert_eq!(code, Some(0), "stderr: {err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        (3..6)
            .map(|o| serde_json::json!({"partition": 0, "offset": o}))
            .collect::<Vec<_>>(),
        "stdout: {out}"
    );
    for (i, b) in bodies.iter().enumerate() {
        assert_replay(&s, "cli", 0, 3 + i as u64, b);
    }
    assert_eq!(end_offsets(&s, "cli"), vec![6]);
}

#[test]
fn cli_batch_consume_prints_json_lines_and_acks_in_batches() {
    let s = Server::start(1, &[]);
    s.create_topic("clic", "");
    let bodies: Vec<String> = (0..12).map(|i| format!("m{i}")).collect();
    let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
    produce_batch(&s, "topic=clic", FRAMES, &frames(&refs), 12);
    let before = requests_total(&s);
    let (code, out, err) = run_cli(
        &s,
        &["consume", "clic", "--max", "5", "--count", "10", "--ack"],
        b"",
    );
    assert_eq!(code, Some(0), "stderr: {err}");
    // Batches of at most 5: two batch consumes and two batch acks (one-by-one acks would be 12 requests), plus
    // at most the /metrics request that read `before`.
    let requests = requests_total(&s) - before;
    assert!(
        (4..=5).contains(&requests),
        "the CLI sent {requests} requests for 10 messages with --max 5"
    );
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 10, "stdout: {out}");
    for (i, l) in lines.iter().enumerate() {
        let (p, o, _, n) = lease_fields(l);
        assert_eq!((p, o, n), (0, i as u64, 1), "line {l}");
        assert_eq!(l["body"], bodies[i].as_str(), "line {l}");
    }
    wait_for_fields(&s, "clic", "committed", &[10], Duration::from_secs(2));
    assert_eq!(fields(&s, "clic", "in_flight"), vec![0]);
    let text = s.get("/metrics").text();
    let acked: f64 = text
        .lines()
        .filter(|l| l.starts_with("berth_acked_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(acked, 10.0, "acked counter");
}

/// HTTP requests answered, summed over the cores (`berth_requests_total`).
fn requests_total(s: &Server) -> u64 {
    s.get("/metrics")
        .text()
        .lines()
        .filter(|l| l.starts_with("berth_requests_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}
