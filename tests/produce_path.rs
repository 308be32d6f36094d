//! End-to-end tests of the produce path (api.md, "Produce" and "Replay") and of the log's durability on disk
//! (docs/format.md): crashes, torn tails, flipped bytes, graceful shutdown, and the HTTP edge's framing
//! (pipelining, keep-alive, refused requests), against the real binary.

mod common;

use berth::client::Client;
use common::{assert_error, Server};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------

/// Frame header bytes (docs/format.md).
const HEADER: usize = 32;
/// The frame magic as it lies on disk.
const MAGIC: [u8; 4] = *b"FRTB";

use common::free_port;

/// The end_offset of every partition, in partition order.
fn end_offsets(server: &Server, topic: &str) -> Vec<u64> {
    server
        .partitions(topic)
        .iter()
        .map(|p| p["end_offset"].as_u64().expect("end_offset"))
        .collect()
}

/// Replays (partition, offset) and asserts 200 with exactly `body` and the Partition/Offset headers.
fn assert_replay(server: &Server, topic: &str, partition: u64, offset: u64, body: &[u8]) {
    let a = server.get(&format!(
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
    assert_eq!(a.header("offset"), Some(offset.to_string().as_str()));
    assert_eq!(a.header("partition"), Some(partition.to_string().as_str()));
    assert_eq!(a.header("receipt-handle"), None, "a replay leased a record");
}

/// The first segment of a partition.
fn first_segment(server: &Server, topic: &str, partition: u64) -> PathBuf {
    server
        .partition_dir(topic, partition)
        .join("00000000000000000000.log")
}

/// The server log without ANSI colour codes.
fn plain_log(server: &Server) -> String {
    let raw = server.log_text();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Writes a TOML config file into `dir` and returns its path.
fn config_file(dir: &Path, text: &str) -> String {
    let path = dir.join("berth.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A response read off a raw socket.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

fn raw_connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads one whole response (head + Content-Length body) from `stream`; bytes after it stay in `buf`.
fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> RawResponse {
    let mut chunk = [0u8; 16 << 10];
    let mut fill = |buf: &mut Vec<u8>, what: &str| {
        let n = stream.read(&mut chunk).unwrap_or_else(|e| {
            panic!(
                "reading {what}: {e}; have {:?}",
                String::from_utf8_lossy(buf)
            )
        });
        assert!(
            n > 0,
            "connection closed while reading {what}; have {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        fill(buf, "a response head");
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(
        status_line.starts_with("HTTP/1.1 "),
        "status line {status_line:?}"
    );
    let status = status_line[9..12].parse().expect("status code");
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').expect("header line");
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().expect("content-length"))
        .unwrap_or(0);
    let total = head_end + 4 + len;
    while buf.len() < total {
        fill(buf, "a response body");
    }
    let body = buf[head_end + 4..total].to_vec();
    buf.drain(..total);
    RawResponse {
        status,
        headers,
        body,
    }
}

/// Asserts the server closed the connection (EOF, or a reset once the reply was read).
fn assert_closed(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) | Err(_) => {}
        Ok(_) => panic!("the connection stayed open with more bytes after an error reply"),
    }
}

/// Sends `request` raw (write errors ignored: the server may close before reading all of it) and returns the
/// one reply, asserting that the server then closed the connection.
fn refused_request(port: u16, request: &[u8]) -> RawResponse {
    let mut s = raw_connect(port);
    let _ = s.write_all(request);
    let mut buf = Vec::new();
    let r = read_response(&mut s, &mut buf);
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert_closed(&mut s);
    r
}

fn assert_healthy(server: &Server) {
    let a = server.get("/health");
    assert_eq!(a.status, 200, "{}", a.text());
}

// ---------------------------------------------------------------------------------------------------------------
// Produce errors and limits
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn produce_without_topic_is_400_invalid_topic() {
    let server = Server::start(1, &[]);
    assert_error(&server.post("/produce", b"x"), 400, "invalid_topic");
    assert_error(&server.post("/produce?key=k", b"x"), 400, "invalid_topic");
    assert_error(&server.post("/produce?topic=", b"x"), 400, "invalid_topic");
    assert_error(
        &server.post("/produce?topic=a%20b", b"x"),
        400,
        "invalid_topic",
    );
    assert_error(
        &server.post("/produce?topic=..", b"x"),
        400,
        "invalid_topic",
    );
}

#[test]
fn produce_to_unknown_topic_is_404_topic_not_found() {
    let server = Server::start(2, &[]);
    server.create_topic("real", "");
    assert_error(
        &server.post("/produce?topic=nosuch", b"x"),
        404,
        "topic_not_found",
    );
    assert_error(
        &server.post("/produce?topic=nosuch&partition=0", b"x"),
        404,
        "topic_not_found",
    );
    assert_error(
        &server.post("/produce?topic=REAL", b"x"),
        404,
        "topic_not_found",
    );
    assert_eq!(end_offsets(&server, "real"), vec![0]);
}

#[test]
fn produce_to_partition_out_of_range_is_404_and_malformed_partition_is_400() {
    let server = Server::start(2, &[]);
    server.create_topic("three", "partitions=3");
    for p in ["3", "4", "4096", "18446744073709551615"] {
        let a = server.post(&format!("/produce?topic=three&partition={p}"), b"x");
        assert_error(&a, 404, "partition_not_found");
    }
    for p in ["abc", "-1", "1.0", "", "18446744073709551616", "0x1"] {
        let a = server.post(&format!("/produce?topic=three&partition={p}"), b"x");
        assert_error(&a, 400, "invalid_parameter");
    }
    assert_eq!(end_offsets(&server, "three"), vec![0, 0, 0]);
    assert_eq!(server.produce("three", "&partition=2", b"ok"), (2, 0));
}

#[test]
fn message_size_limit_from_config_file_is_exact_and_empty_bodies_are_records() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config_file(tmp.path(), "max_message_bytes = 1024\n");
    let server = Server::start(1, &["--config", &config]);
    server.create_topic("sized", "");

    let a = server.post("/produce?topic=sized", &vec![b'x'; 1025]);
    assert_error(&a, 413, "message_too_large");
    assert_eq!(
        end_offsets(&server, "sized"),
        vec![0],
        "a refused produce was written"
    );

    let exact: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
    assert_eq!(server.produce("sized", "", &exact), (0, 0));
    assert_eq!(server.produce("sized", "", b""), (0, 1));
    let a = server.post("/produce?topic=sized", &vec![b'y'; 4096]);
    assert_error(&a, 413, "message_too_large");
    assert_eq!(end_offsets(&server, "sized"), vec![2]);

    assert_replay(&server, "sized", 0, 0, &exact);
    assert_replay(&server, "sized", 0, 1, b"");
    // Offsets stayed gapless across the refusals.
    assert_eq!(server.produce("sized", "", b"after"), (0, 2));
}

#[test]
fn a_body_of_exactly_the_default_one_mebibyte_is_accepted() {
    let server = Server::start(1, &[]);
    server.create_topic("mib", "");
    let exact: Vec<u8> = (0..1usize << 20).map(|i| (i % 253) as u8).collect();
    assert_eq!(server.produce("mib", "", &exact), (0, 0));
    assert_replay(&server, "mib", 0, 0, &exact);
}

#[test]
fn a_body_over_the_default_limit_gets_413_not_a_reset_connection() {
    let server = Server::start(1, &[]);
    server.create_topic("mib", "");
    let over = vec![b'm'; (1 << 20) + 1];
    // The project's own client must see the 413, every time.
    for attempt in 0..10 {
        match server.client.call("POST", "/produce?topic=mib", &over) {
            Ok(a) => assert_error(&a, 413, "message_too_large"),
            Err(e) => panic!("attempt {attempt}: 1 MiB + 1 byte produce got no HTTP answer: {e}"),
        }
    }
    assert_eq!(end_offsets(&server, "mib"), vec![0]);
    assert_healthy(&server);
}

// ---------------------------------------------------------------------------------------------------------------
// Partition choice
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn the_same_key_always_lands_on_the_same_partition_even_after_restart() {
    let mut server = Server::start(2, &[]);
    server.create_topic("keyed", "partitions=8");
    let keys: Vec<String> = (0..24).map(|i| format!("customer-{i}")).collect();
    let mut home = BTreeMap::new();
    let mut counts = vec![0u64; 8];
    for round in 0..3 {
        for key in &keys {
            let (p, o) = server.produce("keyed", &format!("&key={key}"), key.as_bytes());
            assert_eq!(
                *home.entry(key.clone()).or_insert(p),
                p,
                "key {key} moved in round {round}"
            );
            assert_eq!(o, counts[p as usize], "gap on partition {p}");
            counts[p as usize] += 1;
        }
    }
    let used: BTreeSet<u64> = home.values().copied().collect();
    assert!(used.len() >= 3, "24 keys hashed onto only {used:?}");
    assert_eq!(end_offsets(&server, "keyed"), counts);

    server.restart();
    for key in &keys {
        let (p, _) = server.produce("keyed", &format!("&key={key}"), b"later");
        assert_eq!(p, home[key], "key {key} maps elsewhere after a restart");
    }
}

#[test]
fn an_explicit_partition_wins_over_key_and_every_partition_is_reachable() {
    let server = Server::start(2, &[]);
    server.create_topic("direct", "partitions=8");
    for round in 0..3u64 {
        for p in 0..8u64 {
            assert_eq!(
                server.produce("direct", &format!("&partition={p}"), b"d"),
                (p, round)
            );
        }
    }
    // partition= beats key=: the same key sent to two partitions lands on each.
    assert_eq!(server.produce("direct", "&partition=0&key=k", b"k"), (0, 3));
    assert_eq!(server.produce("direct", "&key=k&partition=5", b"k"), (5, 3));
    assert_eq!(end_offsets(&server, "direct"), vec![4, 3, 3, 3, 3, 4, 3, 3]);
}

// ---------------------------------------------------------------------------------------------------------------
// Concurrency and durability
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn ten_thousand_concurrent_produces_get_gapless_offsets_per_partition() {
    const THREADS: usize = 16;
    const PER_THREAD: usize = 625;
    let server = Server::start(2, &[]);
    server.create_topic("load", "partitions=8");
    let url = server.url();
    let started = Instant::now();
    let acks: Vec<Vec<(u64, u64, Vec<u8>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let url = url.clone();
                s.spawn(move || {
                    let client = Client::new(&url);
                    let mut acks = Vec::with_capacity(PER_THREAD);
                    for i in 0..PER_THREAD {
                        // Half go to an explicit partition (often owned by the other core), half anywhere.
                        let path = if i % 2 == 0 {
                            format!("/produce?topic=load&partition={}", (t + i) % 8)
                        } else {
                            "/produce?topic=load".to_string()
                        };
                        let body = format!("t{t}-i{i}").into_bytes();
                        let a = client.call("POST", &path, &body).expect("produce");
                        assert_eq!(a.status, 200, "thread {t} produce {i}: {}", a.text());
                        let j = a.json();
                        acks.push((
                            j["partition"].as_u64().unwrap(),
                            j["offset"].as_u64().unwrap(),
                            body,
                        ));
                    }
                    acks
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();

    let mut by_partition: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut stored = BTreeMap::new();
    for (p, o, body) in acks.into_iter().flatten() {
        by_partition.entry(p).or_default().push(o);
        assert!(
            stored.insert((p, o), body).is_none(),
            "offset {p}:{o} given twice"
        );
    }
    assert_eq!(stored.len(), THREADS * PER_THREAD);
    let ends = end_offsets(&server, "load");
    assert_eq!(ends.len(), 8);
    for (p, end) in ends.iter().enumerate() {
        let mut offsets = by_partition.remove(&(p as u64)).unwrap_or_default();
        offsets.sort_unstable();
        let n = offsets.len() as u64;
        assert_eq!(
            offsets,
            (0..n).collect::<Vec<_>>(),
            "partition {p} offsets have gaps"
        );
        assert_eq!(*end, n, "partition {p}: end_offset vs acknowledged");
    }
    assert!(
        by_partition.is_empty(),
        "acks on unknown partitions: {by_partition:?}"
    );
    assert_eq!(ends.iter().sum::<u64>(), (THREADS * PER_THREAD) as u64);
    // Explicit partitions alone put 625 records on every partition.
    assert!(ends.iter().all(|&e| e >= 625), "{ends:?}");

    // Every acknowledged offset holds the body that was acknowledged with it.
    for ((p, o), body) in &stored {
        let a = server.get(&format!("/consume?topic=load&partition={p}&offset={o}"));
        assert_eq!((a.status, &a.body), (200, body), "replay {p}:{o}");
    }
    eprintln!("10,000 concurrent produces took {elapsed:?}");
}

#[test]
fn every_acknowledged_produce_survives_kill9() {
    let mut server = Server::start(2, &[]);
    server.create_topic("durable", "partitions=4");
    let mut produced = BTreeMap::new();
    for i in 0..400u64 {
        let body = format!("durable-{i}-{}", "z".repeat((i % 37) as usize)).into_bytes();
        let extra = if i % 3 == 0 {
            String::new()
        } else {
            format!("&partition={}", i % 4)
        };
        let (p, o) = server.produce("durable", &extra, &body);
        produced.insert((p, o), body);
    }
    let before = end_offsets(&server, "durable");
    assert_eq!(before.iter().sum::<u64>(), 400);

    server.restart();

    assert_eq!(end_offsets(&server, "durable"), before);
    for ((p, o), body) in &produced {
        assert_replay(&server, "durable", *p, *o, body);
    }
    // The next produce continues each partition's sequence.
    for p in 0..4u64 {
        let (_, o) = server.produce("durable", &format!("&partition={p}"), b"next");
        assert_eq!(o, before[p as usize], "partition {p}");
    }
}

#[test]
fn segment_file_frames_match_the_documented_format() {
    let mut server = Server::start(1, &[]);
    server.create_topic("fmt", "");
    let before = now_ms();
    let bodies: Vec<Vec<u8>> = (0..5)
        .map(|i| format!("frame-{i}-{}", "f".repeat(i * 7)).into_bytes())
        .chain([Vec::new()])
        .collect();
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(server.produce("fmt", "", b), (0, i as u64));
    }
    let after = now_ms();
    assert_eq!(server.terminate(), Some(0));

    let bytes = std::fs::read(first_segment(&server, "fmt", 0)).unwrap();
    let mut at = 0;
    for (i, body) in bodies.iter().enumerate() {
        let h = &bytes[at..at + HEADER];
        assert_eq!(h[..4], MAGIC, "frame {i} magic");
        assert_eq!(u32_at(h, 4) as usize, body.len(), "frame {i} payload_len");
        assert_eq!(u64_at(h, 8), i as u64, "frame {i} offset");
        let ts = u64_at(h, 16);
        assert!(
            (before..=after).contains(&ts),
            "frame {i} timestamp {ts} not in {before}..={after}"
        );
        let payload = &bytes[at + HEADER..at + HEADER + body.len()];
        assert_eq!(payload, body.as_slice(), "frame {i} payload");
        assert_eq!(
            u32_at(h, 24),
            crc32c::crc32c(payload),
            "frame {i} payload_crc32c"
        );
        assert_eq!(
            u32_at(h, 28),
            crc32c::crc32c(&h[..28]),
            "frame {i} header_crc32c"
        );
        at += HEADER + body.len();
    }
    // After the last frame the active segment keeps a zero-filled reserve (see src/storage/log/mod.rs, PREZERO_BYTES).
    assert!(
        bytes[at..].iter().all(|&b| b == 0),
        "non-zero bytes after the last frame"
    );
}

#[test]
fn a_torn_tail_is_cut_at_every_cut_point_and_the_log_continues() {
    const N: u64 = 8;
    let mut server = Server::start(2, &[]);
    let body = |i: u64| format!("torn-{i:02}-{}", "p".repeat(20 + i as usize)).into_bytes();
    let frames_len: usize = (0..N).map(|i| HEADER + body(i).len()).sum();
    let last_start = frames_len - (HEADER + body(N - 1).len());
    let last_payload = body(N - 1).len();
    // (topic, the segment's new length; None appends a zero-filled tail as a preallocating writer would leave)
    let cases: [(&str, Option<usize>); 6] = [
        ("cut-header-first-byte", Some(last_start + 1)),
        ("cut-mid-header", Some(last_start + 16)),
        ("cut-after-header", Some(last_start + HEADER)),
        (
            "cut-mid-payload",
            Some(last_start + HEADER + last_payload / 2),
        ),
        ("cut-one-byte-short", Some(frames_len - 1)),
        ("zeroed-tail", None),
    ];
    for (topic, _) in &cases {
        server.create_topic(topic, "");
        for i in 0..N {
            assert_eq!(server.produce(topic, "", &body(i)), (0, i));
        }
    }
    server.kill9();
    // The segments' own recovery is under test: without the journal (as after a checkpoint), which would repair them.
    server.drop_journal();
    for (topic, cut) in &cases {
        let path = first_segment(&server, topic, 0);
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() >= frames_len, "{topic}: segment length");
        assert!(
            bytes[frames_len..].iter().all(|&b| b == 0),
            "{topic}: reserve after the frames is zeros"
        );
        assert_eq!(
            bytes[last_start..last_start + 4],
            MAGIC,
            "{topic}: last frame start"
        );
        assert_eq!(
            u64_at(&bytes, last_start + 8),
            N - 1,
            "{topic}: last frame offset"
        );
        let f = std::fs::OpenOptions::new()
            .write(true)
            .append(cut.is_none())
            .open(&path)
            .unwrap();
        match cut {
            Some(len) => f.set_len(*len as u64).unwrap(),
            None => (&f).write_all(&[0u8; 4096]).unwrap(),
        }
    }
    server.restart();

    for (topic, cut) in &cases {
        // Every cut, even one byte short, loses exactly the last record; zeroes after the last frame lose none.
        let kept = if cut.is_some() { N - 1 } else { N };
        assert_eq!(
            end_offsets(&server, topic),
            vec![kept],
            "{topic}: end_offset"
        );
        let want_len = if cut.is_some() {
            last_start
        } else {
            frames_len
        };
        let len = std::fs::metadata(first_segment(&server, topic, 0))
            .unwrap()
            .len();
        assert_eq!(
            len as usize, want_len,
            "{topic}: the torn tail was not truncated on disk"
        );
        for i in 0..kept {
            assert_replay(&server, topic, 0, i, &body(i));
        }
        let a = server.get(&format!("/consume?topic={topic}&partition=0&offset={kept}"));
        assert_eq!(a.status, 204, "{topic}: replay at the end: {}", a.text());
        let again = format!("{topic}-after").into_bytes();
        assert_eq!(
            server.produce(topic, "", &again),
            (0, kept),
            "{topic}: next offset"
        );
        assert_replay(&server, topic, 0, kept, &again);
    }
    // The repaired logs and the records written after the repair survive another crash.
    server.restart();
    for (topic, cut) in &cases {
        let kept = if cut.is_some() { N - 1 } else { N };
        assert_eq!(end_offsets(&server, topic), vec![kept + 1], "{topic}");
        assert_replay(&server, topic, 0, kept, format!("{topic}-after").as_bytes());
    }
}

#[test]
fn a_flipped_byte_makes_only_that_record_corrupt_and_it_is_never_delivered() {
    let mut server = Server::start(2, &[]);
    let body = |i: u64| format!("record-{i}-{}", "r".repeat(30)).into_bytes();
    let frame = HEADER + body(0).len();
    // payload-flip: a payload byte of record 5 (payload CRC fails); header-flip: a timestamp byte of record 5's
    // header (header CRC fails, the scan resyncs at record 6).
    let cases = [
        ("payload-flip", 5 * frame + HEADER + 10),
        ("header-flip", 5 * frame + 17),
    ];
    for (topic, _) in &cases {
        server.create_topic(topic, "");
        for i in 0..10 {
            assert_eq!(server.produce(topic, "", &body(i)), (0, i));
        }
    }
    server.kill9();
    // Bit rot at rest: the journal no longer holds these records (as after a checkpoint), else replay repairs them.
    server.drop_journal();
    for (topic, at) in &cases {
        let path = first_segment(&server, topic, 0);
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() >= 10 * frame);
        bytes[*at] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
    }
    server.restart();

    for (topic, _) in &cases {
        assert_eq!(end_offsets(&server, topic), vec![10], "{topic}");
        let a = server.get(&format!("/consume?topic={topic}&partition=0&offset=5"));
        assert_error(&a, 422, "corrupt_record");
        for i in (0..10).filter(|&i| i != 5) {
            assert_replay(&server, topic, 0, i, &body(i));
        }
        assert_eq!(server.produce(topic, "", b"eleventh"), (0, 10), "{topic}");

        // Queue-style consumes skip the damaged record: 0..=10 except 5, each once.
        let mut delivered = BTreeSet::new();
        while let Some((p, o, handle, got)) = common::consume(&server.client, topic, "") {
            assert_eq!(p, 0);
            assert!(delivered.insert(o), "{topic}: offset {o} delivered twice");
            let want = if o == 10 {
                b"eleventh".to_vec()
            } else {
                body(o)
            };
            assert_eq!(got, want, "{topic}: offset {o}");
            assert_eq!(
                common::settle(&server.client, "ack", topic, &handle, ""),
                200
            );
        }
        let want: BTreeSet<u64> = (0..=10).filter(|&o| o != 5).collect();
        assert_eq!(delivered, want, "{topic}");
        let p = &server.partitions(topic)[0];
        assert_eq!(p["corrupt_skipped"], 1, "{topic}: {p}");
        assert_eq!(p["committed"], 11, "{topic}: {p}");
    }

    // The server said so in its log: an ERROR line naming offset 5 and the failed check, once per topic.
    let log = plain_log(&server);
    for (topic, _) in &cases {
        let dir = server.partition_dir(topic, 0).display().to_string();
        let hit = log.lines().any(|l| {
            l.contains("ERROR") && l.contains("check") && l.contains("from=5") && l.contains(&dir)
        });
        assert!(
            hit,
            "no ERROR line about {topic} offset 5 in the log:\n{log}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Replay long-polls
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn replay_at_the_end_waits_for_the_budget_then_answers_204() {
    let _g = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("tail", "partitions=2");
    server.produce("tail", "&partition=1", b"only");
    for (p, offset) in [(1, 1), (0, 0), (1, 50)] {
        let started = Instant::now();
        let a = server.get(&format!(
            "/consume?topic=tail&partition={p}&offset={offset}&wait=300ms"
        ));
        let took = started.elapsed();
        assert_eq!(a.status, 204, "{p}:{offset}: {}", a.text());
        assert!(a.body.is_empty());
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_millis(1500),
            "{p}:{offset}: a 300ms wait took {took:?}"
        );
    }
    // wait=0 answers at once.
    let started = Instant::now();
    assert_eq!(
        server
            .get("/consume?topic=tail&partition=1&offset=1")
            .status,
        204
    );
    assert!(started.elapsed() < Duration::from_millis(250));
    // Replay errors: unknown topic, partition out of range, half a replay, a bad wait.
    assert_error(
        &server.get("/consume?topic=nosuch&partition=0&offset=0"),
        404,
        "topic_not_found",
    );
    assert_error(
        &server.get("/consume?topic=tail&partition=2&offset=0"),
        404,
        "partition_not_found",
    );
    assert_error(
        &server.get("/consume?topic=tail&partition=0"),
        400,
        "invalid_parameter",
    );
    assert_error(
        &server.get("/consume?topic=tail&partition=0&offset=0&wait=61s"),
        400,
        "invalid_duration",
    );
}

#[test]
fn a_produce_during_a_replay_wait_answers_it_at_once() {
    let _g = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("wake", "partitions=4");
    // Park a replay on every partition, so whichever core takes each request, some wake crosses cores.
    let url = server.url();
    let waiters: Vec<_> = (0..4u64)
        .map(|p| {
            let url = url.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let a = Client::new(&url)
                    .call(
                        "GET",
                        &format!("/consume?topic=wake&partition={p}&offset=0&wait=5s"),
                        &[],
                    )
                    .expect("replay");
                (a, started.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for p in 0..4u64 {
        assert_eq!(
            server.produce(
                "wake",
                &format!("&partition={p}"),
                format!("woken-{p}").as_bytes()
            ),
            (p, 0)
        );
    }
    for (p, w) in waiters.into_iter().enumerate() {
        let (a, took) = w.join().unwrap();
        assert_eq!(a.status, 200, "partition {p}: {}", a.text());
        assert_eq!(a.body, format!("woken-{p}").into_bytes());
        assert_eq!(a.header("offset"), Some("0"));
        assert!(
            took >= Duration::from_millis(150) && took < Duration::from_millis(2000),
            "partition {p}: woken after {took:?} of a 5 s wait"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Process lifecycle
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn sigterm_exits_zero_and_every_record_is_there_after_restart() {
    let mut server = Server::start(2, &[]);
    server.create_topic("graceful", "partitions=2");
    let mut produced = Vec::new();
    for i in 0..60u64 {
        let body = format!("graceful-{i}").into_bytes();
        let (p, o) = server.produce("graceful", &format!("&partition={}", i % 2), &body);
        produced.push((p, o, body));
    }
    assert_eq!(server.terminate(), Some(0));
    assert!(
        plain_log(&server).contains("stopped cleanly"),
        "{}",
        plain_log(&server)
    );
    server.restart();
    assert_eq!(end_offsets(&server, "graceful"), vec![30, 30]);
    for (p, o, body) in &produced {
        assert_replay(&server, "graceful", *p, *o, body);
    }
}

#[test]
fn sigterm_answers_a_parked_replay_and_exits_promptly() {
    let mut server = Server::start(2, &[]);
    server.create_topic("parked", "");
    let url = server.url();
    let waiter = std::thread::spawn(move || {
        Client::new(&url).call(
            "GET",
            "/consume?topic=parked&partition=0&offset=0&wait=30s",
            &[],
        )
    });
    // Give the replay time to park (a wrong outcome here only makes the test easier to pass).
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(server.terminate(), Some(0));
    let took = started.elapsed();
    let answer = waiter.join().unwrap();
    match answer {
        Ok(a) => assert!(
            a.status == 204 || a.status == 503,
            "parked replay got {}: {}",
            a.status,
            a.text()
        ),
        Err(e) => panic!("the parked replay got no HTTP reply at shutdown: {e}"),
    }
    assert!(
        took < Duration::from_secs(2),
        "shutdown with a parked replay took {took:?}"
    );
}

#[test]
fn a_second_server_on_the_same_data_dir_is_refused() {
    let server = Server::start(1, &[]);
    server.create_topic("mine", "");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let data = server.data_dir.to_str().unwrap();
    let (code, stderr) = common::run_until_exit(&[
        "serve",
        "--listen",
        &listen,
        "--cores",
        "1",
        "--data-dir",
        data,
    ]);
    assert_ne!(
        code,
        Some(0),
        "a second server on the same data dir must not start"
    );
    assert!(
        stderr.contains("data directory") && stderr.contains("in use"),
        "stderr: {stderr}"
    );
    // The first server never noticed.
    assert_healthy(&server);
    assert_eq!(server.produce("mine", "", b"still mine"), (0, 0));
}

#[test]
fn a_server_on_a_taken_port_exits_nonzero_with_a_one_line_reason() {
    let server = Server::start(1, &[]);
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{}", server.port),
            "--cores",
            "1",
            "--data-dir",
        ])
        .arg(tmp.path().join("data"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "not a one-line reason: {stderr}");
    assert!(
        lines[0].contains(&server.port.to_string()),
        "reason does not name the address: {stderr}"
    );
    assert!(
        lines[0].to_lowercase().contains("in use"),
        "reason: {stderr}"
    );
    // It left no trace: not even the data directory it was given.
    assert!(
        !tmp.path().join("data").exists(),
        "a start that failed on its port created its data directory"
    );
    // The running server is unaffected (no SO_REUSEPORT sharing with the newcomer).
    for _ in 0..10 {
        let fresh = Client::new(&server.url());
        assert_eq!(fresh.call("GET", "/health", &[]).unwrap().status, 200);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// HTTP framing
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn pipelined_requests_are_answered_in_order_on_one_kept_alive_connection() {
    let server = Server::start(2, &[]);
    server.create_topic("pipe", "");
    let mut s = raw_connect(server.port);
    s.write_all(
        b"POST /produce?topic=pipe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nfirst\
          POST /produce?topic=pipe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 6\r\n\r\nsecond\
          GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    )
    .unwrap();
    let mut buf = Vec::new();
    let first = read_response(&mut s, &mut buf);
    assert_eq!(
        (first.status, first.json()),
        (200, serde_json::json!({"partition": 0, "offset": 0}))
    );
    let second = read_response(&mut s, &mut buf);
    assert_eq!(
        (second.status, second.json()),
        (200, serde_json::json!({"partition": 0, "offset": 1}))
    );
    let health = read_response(&mut s, &mut buf);
    assert_eq!(health.status, 200, "{health:?}");
    assert!(
        buf.is_empty(),
        "extra bytes: {:?}",
        String::from_utf8_lossy(&buf)
    );
    for r in [&first, &second, &health] {
        assert_eq!(
            r.header("connection"),
            None,
            "keep-alive connection marked close: {r:?}"
        );
    }

    // Still open: a replay and an error on the same connection, then a request split over many writes.
    s.write_all(
        b"GET /consume?topic=pipe&partition=0&offset=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    )
    .unwrap();
    let replay = read_response(&mut s, &mut buf);
    assert_eq!(
        (replay.status, replay.body.as_slice()),
        (200, &b"second"[..])
    );
    assert_eq!(replay.header("offset"), Some("1"));
    s.write_all(b"GET /topics/nosuch HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let missing = read_response(&mut s, &mut buf);
    assert_eq!(
        (missing.status, missing.json()["error"].as_str()),
        (404, Some("topic_not_found"))
    );
    let split =
        b"POST /produce?topic=pipe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nthird";
    for piece in split.chunks(7) {
        s.write_all(piece).unwrap();
        s.flush().unwrap();
    }
    let third = read_response(&mut s, &mut buf);
    assert_eq!(
        (third.status, third.json()),
        (200, serde_json::json!({"partition": 0, "offset": 2}))
    );

    // Connection: close is honoured after the reply.
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let last = read_response(&mut s, &mut buf);
    assert_eq!(
        (last.status, last.header("connection")),
        (200, Some("close"))
    );
    assert_closed(&mut s);
}

#[test]
fn headers_over_16_kib_get_431_and_the_server_stays_up() {
    let server = Server::start(1, &[]);
    for size in [17 << 10, 64 << 10] {
        let mut req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".to_vec();
        req.extend(std::iter::repeat_n(b'a', size));
        req.extend_from_slice(b"\r\n\r\n");
        let r = refused_request(server.port, &req);
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (431, Some("headers_too_large")),
            "{size}"
        );
        assert_healthy(&server);
    }
    // Many small headers add up just the same.
    let mut req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
    for i in 0..40 {
        req.extend(format!("X-H{i}: {}\r\n", "b".repeat(500)).into_bytes());
    }
    req.extend_from_slice(b"\r\n");
    let r = refused_request(server.port, &req);
    assert_eq!(r.status, 431, "{r:?}");
    // Just under the limit is fine.
    let mut req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".to_vec();
    req.extend(std::iter::repeat_n(b'a', 15 << 10));
    req.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    let mut s = raw_connect(server.port);
    s.write_all(&req).unwrap();
    assert_eq!(read_response(&mut s, &mut Vec::new()).status, 200);
    assert_healthy(&server);
}

#[test]
fn chunked_bodies_get_411_and_nothing_is_written() {
    let server = Server::start(1, &[]);
    server.create_topic("chunky", "");
    let r = refused_request(
        server.port,
        b"POST /produce?topic=chunky HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (411, Some("length_required")),
        "{r:?}"
    );
    assert_eq!(end_offsets(&server, "chunky"), vec![0]);
    assert_healthy(&server);
}

#[test]
fn garbage_and_malformed_requests_get_400_and_the_server_stays_up() {
    let server = Server::start(2, &[]);
    server.create_topic("g", "");
    let cases: [&[u8]; 5] = [
        b"\x00\x01\x02\x03 garbage \xff\xfe\r\n\r\n",
        b"HELLO\r\n\r\n",
        b"GET /health HTTP/9.9\r\n\r\n",
        b"POST /produce?topic=g HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        b"POST /produce?topic=g HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy",
    ];
    for req in cases {
        let r = refused_request(server.port, req);
        assert_eq!(r.status, 400, "{:?}: {r:?}", String::from_utf8_lossy(req));
        assert!(r.json()["error"].is_string(), "{r:?}");
        assert_healthy(&server);
    }
    assert_eq!(end_offsets(&server, "g"), vec![0]);
    // A client that connects and leaves without a byte, or mid-request, harms nothing.
    drop(raw_connect(server.port));
    let mut half = raw_connect(server.port);
    half.write_all(b"POST /produce?topic=g HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
        .unwrap();
    drop(half);
    assert_healthy(&server);
    assert_eq!(server.produce("g", "", b"fine"), (0, 0));
}

/// A memlock limit below the io_uring buffers the cores register (a non-root user's usual 8 MiB against 10 MiB per
/// core and ring) gives one log line with the remedy, not glommio's multi-line warning per ring of every executor
/// (vendor/glommio/BERTH.md). Run through `prlimit` (and, as root, `setpriv` dropping CAP_IPC_LOCK, which would lift
/// the limit).
#[test]
fn a_low_memlock_limit_is_explained_in_one_line() {
    let root = unsafe { libc::geteuid() } == 0;
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = tmp.path().join("log");
    // 8 MiB, or the hard limit in force if lower (only root may raise it).
    let mut hard = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut hard) },
        0
    );
    let limit = hard.rlim_max.min(8 << 20);
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--memlock={limit}:{limit}"));
    if root {
        cmd.args([
            "setpriv",
            "--bounding-set=-ipc_lock",
            "--inh-caps=-ipc_lock",
        ]);
    }
    let child = cmd
        .arg(env!("CARGO_BIN_EXE_berth"))
        .args(["serve", "--cores", "2", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .env_remove("BERTH_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("prlimit (util-linux) runs");
    let mut child = Some(child);
    let client = Client::new(&format!("http://127.0.0.1:{port}"));
    common::await_healthy(&client, &mut child, Duration::from_secs(30), "berth", &log);
    // It serves as usual.
    assert_eq!(client.call("PUT", "/topics/t", &[]).unwrap().status, 201);
    assert_eq!(
        client
            .call("POST", "/produce?topic=t", b"m")
            .unwrap()
            .status,
        200
    );
    let mut child = child.unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN glommio"))
        .collect();
    assert_eq!(warned.len(), 1, "one warning from glommio: {text}");
    assert!(
        warned[0].contains("raise the memlock limit (`ulimit -l`"),
        "{text}"
    );
    assert!(!text.contains("Skipping"), "glommio's own warnings: {text}");
}
