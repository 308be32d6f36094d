//! Hostile input against the real binary: malformed receipt handles, durations and topic names, lying
//! Content-Lengths, oversized heads and bodies, garbage bytes, slowloris, connection caps, authentication and the
//! refusal of unauthenticated non-loopback listeners.
//!
//! Every case checks the exact status (and error code where the body is JSON), that nothing was written (the end
//! offsets in `GET /topics/T` are unchanged), and that the server is still alive and answers `GET /health` on fresh
//! connections afterwards (so no core is wedged). Malformed bytes go over raw `std::net::TcpStream`s; only
//! 127.0.0.1 is ever spoken to.

mod common;

use berth::client::{enc, Answer, Client};
use common::Server;
use serde_json::Value;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------

/// Asserts a JSON error answer: exact status, exact `error` code and a non-empty `message`.
fn assert_error_body(status: u16, body: &[u8], want: u16, code: &str, what: &str) {
    let j: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    assert_eq!(
        (status, j["error"].as_str()),
        (want, Some(code)),
        "{what}: body {:?}",
        String::from_utf8_lossy(body)
    );
    assert!(
        j["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: error without a message: {:?}",
        String::from_utf8_lossy(body)
    );
}

fn assert_error(a: &Answer, want: u16, code: &str, what: &str) {
    assert_error_body(a.status, &a.body, want, code, what);
}

/// The end offset of every partition of `topic`.
fn end_offsets(server: &Server, topic: &str) -> Vec<u64> {
    server
        .partitions(topic)
        .iter()
        .map(|p| p["end_offset"].as_u64().expect("end_offset"))
        .collect()
}

/// Percent-encodes a receipt handle but leaves its colons (valid in a query) as they are, so a 10 KB handle of
/// colons stays a 10 KB request line.
fn enc_handle(h: &str) -> String {
    enc(h).replace("%3A", ":")
}

/// A TOML config file in `dir`.
fn config_file(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("berth.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// A response read off a raw connection.
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

    fn assert_error(&self, want: u16, code: &str, what: &str) {
        assert_error_body(self.status, &self.body, want, code, what);
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// What a raw connection did while we listened.
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    Nothing,
    Bytes,
    Closed,
}

/// A raw client connection; bytes read past one response stay buffered for the next.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends bytes; errors are ignored (the server may close before it has read them all).
    fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
    }

    fn fill(&mut self, what: &str) -> Result<(), String> {
        let mut chunk = [0u8; 16 << 10];
        match self.stream.read(&mut chunk) {
            Ok(0) => Err(format!(
                "connection closed while reading {what}; have {:?}",
                String::from_utf8_lossy(&self.buf)
            )),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) => Err(format!(
                "reading {what}: {e}; have {:?}",
                String::from_utf8_lossy(&self.buf)
            )),
        }
    }

    /// Reads one whole response (head + Content-Length body).
    fn try_response(&mut self) -> Result<RawResponse, String> {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            self.fill("a response head")?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        if !status_line.starts_with("HTTP/1.1 ") || status_line.len() < 12 {
            return Err(format!("bad status line {status_line:?}"));
        }
        let status = status_line[9..12]
            .parse()
            .map_err(|_| format!("bad status line {status_line:?}"))?;
        let mut headers = Vec::new();
        for line in lines {
            let (k, v) = line
                .split_once(':')
                .ok_or_else(|| format!("bad header line {line:?}"))?;
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.parse().expect("content-length"))
            .unwrap_or(0);
        let total = head_end + 4 + len;
        while self.buf.len() < total {
            self.fill("a response body")?;
        }
        let body = self.buf[head_end + 4..total].to_vec();
        self.buf.drain(..total);
        Ok(RawResponse {
            status,
            headers,
            body,
        })
    }

    fn response(&mut self) -> RawResponse {
        self.try_response().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Listens for `d`: did the server send something, close, or stay silent?
    fn listen(&mut self, d: Duration) -> Heard {
        if !self.buf.is_empty() {
            return Heard::Bytes;
        }
        self.stream
            .set_read_timeout(Some(d.max(Duration::from_millis(1))))
            .unwrap();
        let mut chunk = [0u8; 4096];
        let heard = match self.stream.read(&mut chunk) {
            Ok(0) => Heard::Closed,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Heard::Bytes
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Heard::Nothing
            }
            Err(_) => Heard::Closed,
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        heard
    }

    /// Asserts the server closed the connection with nothing more to say (EOF, or a reset).
    fn assert_closed(&mut self, what: &str) {
        assert!(
            self.buf.is_empty(),
            "{what}: unexpected bytes after the answer: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => {}
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Ok(_) => panic!("{what}: the connection stayed open and sent more bytes"),
            Err(e) => panic!("{what}: the connection was not closed within 5 s ({e})"),
        }
    }
}

/// Sends `request` on a fresh connection, reads the one answer and asserts the server then closes.
fn refused(port: u16, request: &[u8], what: &str) -> RawResponse {
    let mut c = Conn::open(port);
    c.send(request);
    let r = c
        .try_response()
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"));
    assert!(r.closes(), "{what}: no `connection: close` on {r:?}");
    c.assert_closed(what);
    r
}

/// Sends `request` on a fresh connection and reads the one answer (the connection may stay open).
fn answer(port: u16, request: &[u8], what: &str) -> RawResponse {
    let mut c = Conn::open(port);
    c.send(request);
    c.try_response()
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"))
}

/// The pids of live (not zombie) `berth serve` children of this test process listening on `port`.
fn server_pids(port: u16) -> Vec<u32> {
    let needle = format!(":{port}");
    let me = std::process::id();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.iter().any(|a| a == "serve") || !args.iter().any(|a| a.ends_with(&needle)) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) S ppid ..."; comm may hold spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("?");
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == me && state != "Z" && state != "X" {
            pids.push(pid);
        }
    }
    pids
}

/// The server process is alive and every core serves: `/health` answers 200 through the harness client and on
/// several fresh connections (SO_REUSEPORT spreads them over the cores, so a wedged core would show).
fn assert_alive(server: &Server) {
    assert_eq!(
        server_pids(server.port).len(),
        1,
        "the berth process on port {} is gone; log:\n{}",
        server.port,
        server.log_text()
    );
    let a = server
        .client
        .call("GET", "/health", &[])
        .unwrap_or_else(|e| panic!("/health: {e}; log:\n{}", server.log_text()));
    assert_eq!(a.status, 200, "/health: {}", a.text());
    for i in 0..8 {
        let mut c = Conn::open(server.port);
        c.send(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
        let r = c.try_response().unwrap_or_else(|e| {
            panic!(
                "/health on fresh connection {i}: {e}; log:\n{}",
                server.log_text()
            )
        });
        assert_eq!(r.status, 200, "/health on fresh connection {i}: {r:?}");
    }
}

/// A small deterministic PRNG (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// p-quantile of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

// ---------------------------------------------------------------------------------------------------------------
// Malformed parameters
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn malformed_receipt_handles_are_400_on_ack_nack_and_extend_and_leave_the_lease_alone() {
    let _serial = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("T", "partitions=2");
    server.produce("T", "&partition=0", b"m0");
    let (p, o, handle, body) =
        common::consume(&server.client, "T", "&visibility=60s").expect("a message");
    assert_eq!((p, o, &body[..]), (0, 0, &b"m0"[..]));
    let nonce: u64 = handle.rsplit(':').next().unwrap().parse().unwrap();
    let before = end_offsets(&server, "T");

    let digits_10k = "7".repeat(10 * 1024);
    let mut bad: Vec<String> = [
        "",
        "99999999999999999999999:0:1",
        "0:99999999999999999999999:1",
        "0:0:99999999999999999999999",
        "18446744073709551616:0:1",
        "0:18446744073709551616:1",
        "0:0:18446744073709551616",
        "-1:0:1",
        "0:-1:1",
        "0:0:-1",
        "1:2:3:4",
        "0:0:1:",
        ":0:0:1",
        "1::3",
        "::",
        ":::",
        "0:0",
        "0",
        " 0:0:1",
        "0:0:1 ",
        "0: 0:1",
        "0 :0:1",
        "0:0:1\t",
        "0:0:1\n",
        "+0:0:1",
        "0x1:0:1",
        "1e3:0:1",
        "1.0:0:1",
        "0;0;1",
        "0,0,1",
        "\u{ff10}:\u{ff10}:\u{ff11}",    // fullwidth digits
        "\u{0660}:\u{0660}:\u{0661}",    // Arabic-Indic digits
        "0:0:1\u{e9}",                   // a trailing é
        "\u{1f980}:\u{1f980}:\u{1f980}", // crabs
        "0\u{0}:0:1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    bad.extend([
        digits_10k.clone(),
        format!("0:0:{digits_10k}"),
        "1:".repeat(5 * 1024),
        ":".repeat(10 * 1024),
        // Near misses of the live handle: none may settle it.
        format!("{handle}:"),
        format!("{handle}:0"),
        format!(" {handle}"),
        format!("{handle} "),
        format!("0{handle}:"),
        format!("{p}:{o}:{nonce}0000000000000000000000"),
    ]);
    for op in ["ack", "nack", "extend"] {
        for h in &bad {
            let a = server.post(
                &format!("/{op}?topic=T&receipt_handle={}", enc_handle(h)),
                b"",
            );
            let shown: String = h.chars().take(40).collect();
            assert_error(
                &a,
                400,
                "invalid_receipt_handle",
                &format!("{op} {shown:?} ({} bytes)", h.len()),
            );
        }
        // No receipt_handle at all, and one given twice with a bad value first.
        let a = server.post(&format!("/{op}?topic=T"), b"");
        assert_error(&a, 400, "invalid_receipt_handle", &format!("{op} without"));
        let a = server.post(
            &format!("/{op}?topic=T&receipt_handle=x&receipt_handle={handle}"),
            b"",
        );
        assert_error(&a, 400, "invalid_receipt_handle", &format!("{op} twice"));
        // Unicode sent raw (not percent-encoded) in the request line.
        let raw = format!(
            "POST /{op}?topic=T&receipt_handle=\u{ff10}:0:{nonce} HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        );
        answer(server.port, raw.as_bytes(), "raw unicode").assert_error(
            400,
            "invalid_receipt_handle",
            &format!("{op} raw unicode"),
        );
        // A raw space splits the request line: not HTTP.
        let raw = format!(
            "POST /{op}?topic=T&receipt_handle=0: 0:{nonce} HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        );
        refused(server.port, raw.as_bytes(), "raw space").assert_error(
            400,
            "bad_request",
            &format!("{op} raw space"),
        );
    }

    // Well-formed but absurd: a partition that truncates to 0 as a u32, offsets and nonces that were never issued.
    for (h, status, code) in [
        (
            format!("4294967296:{o}:{nonce}"),
            404,
            "partition_not_found",
        ),
        (
            format!("18446744073709551615:{o}:{nonce}"),
            404,
            "partition_not_found",
        ),
        (format!("2:{o}:{nonce}"), 404, "partition_not_found"),
        (format!("{p}:{}:{nonce}", o + (1 << 32)), 410, "lease_gone"),
        (
            format!("{p}:18446744073709551615:{nonce}"),
            410,
            "lease_gone",
        ),
        (format!("{p}:{o}:{}", nonce + 1), 410, "lease_gone"),
        (
            format!("{p}:{o}:{}", nonce.wrapping_sub(1)),
            410,
            "lease_gone",
        ),
        (format!("{p}:{o}:18446744073709551615"), 410, "lease_gone"),
        (format!("1:{o}:{nonce}"), 410, "lease_gone"),
    ] {
        for op in ["ack", "nack", "extend"] {
            let a = server.post(&format!("/{op}?topic=T&receipt_handle={h}"), b"");
            assert_error(&a, status, code, &format!("{op} {h}"));
        }
    }

    // Nothing was written, the lease is still out (no nack released it), and the real handle still works.
    assert_eq!(end_offsets(&server, "T"), before);
    assert_eq!(common::consume(&server.client, "T", ""), None);
    assert_eq!(server.partitions("T")[0]["in_flight"], 1);
    assert_eq!(
        common::settle(&server.client, "extend", "T", &handle, ""),
        200
    );
    assert_eq!(common::settle(&server.client, "ack", "T", &handle, ""), 200);
    assert_eq!(common::settle(&server.client, "ack", "T", &handle, ""), 410);
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
}

#[test]
fn bad_durations_are_400_invalid_duration_and_take_no_lease() {
    let _serial = common::serial();
    let server = Server::start(1, &[]);
    server.create_topic("T", "");
    server.produce("T", "", b"only");
    let before = end_offsets(&server, "T");

    let bad = [
        "wait=1e3",
        "wait=99999999999999999999s",
        "wait=99999999999999999999",
        "wait=18446744073709551616ms",
        "wait=%00",
        "wait=1s%00",
        "wait=-1",
        "wait=-0",
        "wait=1.5s",
        "wait=61s",
        "wait=2m",
        "wait=1x",
        "wait=",
        "wait=ms",
        "wait=s1",
        "wait=1%20s",
        "wait=%EF%BC%91s", // fullwidth 1
        "wait=1S",
        "wait=1sec",
        "visibility=0",
        "visibility=0s",
        "visibility=999ms",
        "visibility=13h",
        "visibility=-30s",
        "visibility=1e3",
        "visibility=99999999999999999999",
        "visibility=%00",
        "visibility=",
    ];
    for q in bad {
        let started = Instant::now();
        let a = server.get(&format!("/consume?topic=T&{q}"));
        assert_error(&a, 400, "invalid_duration", q);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{q} was answered only after {:?}",
            started.elapsed()
        );
    }
    // No bad consume reserved the message: the first good one gets offset 0.
    let (p, o, handle, _) = common::consume(&server.client, "T", "").expect("the message");
    assert_eq!((p, o), (0, 0));
    for v in [
        "0",
        "0s",
        "1e3",
        "99999999999999999999s",
        "%00",
        "-1",
        "13h",
        "",
    ] {
        let a = server.post(
            &format!("/extend?topic=T&receipt_handle={handle}&visibility={v}"),
            b"",
        );
        assert_error(&a, 400, "invalid_duration", &format!("extend {v:?}"));
    }
    for q in [
        "visibility=0",
        "visibility=1e3",
        "retention=1e3",
        "retention=99999999999999999999d",
        "retention=%00",
    ] {
        let a = server.put(&format!("/topics/U?{q}"));
        assert_error(&a, 400, "invalid_duration", &format!("PUT {q}"));
        assert_error(
            &server.get("/topics/U"),
            404,
            "topic_not_found",
            &format!("after PUT {q}"),
        );
    }
    // The lease is untouched by the refused extends: still the only one, and ackable.
    assert_eq!(server.partitions("T")[0]["in_flight"], 1);
    assert_eq!(common::settle(&server.client, "ack", "T", &handle, ""), 200);
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
}

#[test]
fn unknown_topics_are_404_and_create_nothing() {
    let _serial = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("T", "partitions=2");
    server.produce("T", "", b"x");
    let before = end_offsets(&server, "T");
    for name in ["nope", "t", "T.", "T-", "_T"] {
        for (method, path) in [
            ("POST", format!("/produce?topic={name}")),
            ("POST", format!("/produce?topic={name}&partition=0")),
            ("POST", format!("/produce?topic={name}&key=k")),
            ("GET", format!("/consume?topic={name}")),
            ("GET", format!("/consume?topic={name}&wait=1s")),
            ("GET", format!("/consume?topic={name}&partition=0&offset=0")),
            ("POST", format!("/ack?topic={name}&receipt_handle=0:0:1")),
            ("POST", format!("/nack?topic={name}&receipt_handle=0:0:1")),
            ("POST", format!("/extend?topic={name}&receipt_handle=0:0:1")),
            ("GET", format!("/topics/{name}")),
            ("DELETE", format!("/topics/{name}")),
        ] {
            let a = server.client.call(method, &path, b"body").expect("call");
            assert_error(&a, 404, "topic_not_found", &format!("{method} {path}"));
        }
    }
    let topics = server.get("/topics").json();
    assert_eq!(topics, serde_json::json!(["T"]));
    let dirs: Vec<String> = std::fs::read_dir(server.data_dir.join("topics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs, vec!["T".to_string()]);
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
}

#[test]
fn invalid_topic_names_are_400_and_never_touch_the_file_system() {
    let _serial = common::serial();
    let server = Server::start(1, &[]);
    server.create_topic("T", "");
    server.produce("T", "", b"x");
    let before = end_offsets(&server, "T");
    let long = "a".repeat(129);
    let names = [
        "a%2Fb",
        "a%2fb",
        "%2F",
        "..",
        ".",
        "%2E%2E",
        "%2e",
        "..%2F..%2Fetc",
        "..%2F..%2F..%2Ftmp%2Fescape",
        "a/b",
        "../T",
        "T/..",
        "a%00b",
        "T%00",
        "a%20b",
        "a+b",
        "%C3%A9",
        "%FF",
        "a%5Cb",
        "a:b",
        "*",
        long.as_str(),
    ];
    // Raw requests: an HTTP library would normalise the dot segments away before sending.
    for name in names {
        for method in ["PUT", "GET", "DELETE"] {
            let req = format!("{method} /topics/{name} HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
            answer(server.port, req.as_bytes(), name).assert_error(
                400,
                "invalid_topic",
                &format!("{method} /topics/{name}"),
            );
        }
        for (method, path) in [
            ("POST", format!("/produce?topic={name}")),
            ("GET", format!("/consume?topic={name}")),
            ("POST", format!("/ack?topic={name}&receipt_handle=0:0:1")),
        ] {
            let req = format!("{method} {path} HTTP/1.1\r\nContent-Length: 1\r\n\r\nz");
            answer(server.port, req.as_bytes(), name).assert_error(
                400,
                "invalid_topic",
                &format!("{method} {path}"),
            );
        }
    }
    let mut entries: Vec<String> = std::fs::read_dir(server.data_dir.join("topics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, vec!["T".to_string()]);
    assert!(!server.data_dir.join("b").exists() && !server.data_dir.join("etc").exists());
    assert!(!server.data_dir.parent().unwrap().join("escape").exists());
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
}

#[test]
fn a_nul_in_the_path_is_400_or_404_never_5xx() {
    let _serial = common::serial();
    let server = Server::start(1, &[]);
    server.create_topic("T", "");
    let before = end_offsets(&server, "T");
    // A raw NUL is not a URI character: httparse refuses the request line.
    for req in [
        &b"GET /he\0alth HTTP/1.1\r\n\r\n"[..],
        b"GET /\0 HTTP/1.1\r\n\r\n",
        b"POST /produce?topic=T\0 HTTP/1.1\r\nContent-Length: 1\r\n\r\nz",
        b"GET /topics/T\0 HTTP/1.1\r\n\r\n",
    ] {
        let r = refused(server.port, req, "raw NUL");
        r.assert_error(400, "bad_request", &String::from_utf8_lossy(req));
    }
    // Percent-encoded NULs reach the router.
    for (req, status, code) in [
        (&b"GET /health%00 HTTP/1.1\r\n\r\n"[..], 404, "not_found"),
        (b"GET /%00 HTTP/1.1\r\n\r\n", 404, "not_found"),
        (b"GET /topics/%00 HTTP/1.1\r\n\r\n", 400, "invalid_topic"),
        (b"GET /topics/T%00 HTTP/1.1\r\n\r\n", 400, "invalid_topic"),
        (
            b"POST /produce?topic=T%00 HTTP/1.1\r\nContent-Length: 1\r\n\r\nz",
            400,
            "invalid_topic",
        ),
        (
            b"POST /produce?topic=T&partition=%00 HTTP/1.1\r\nContent-Length: 1\r\n\r\nz",
            400,
            "invalid_parameter",
        ),
        (
            b"POST /produce?topic=T&key=%00 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            200,
            "",
        ),
    ] {
        let r = answer(server.port, req, "encoded NUL");
        let what = String::from_utf8_lossy(req);
        assert!(r.status < 500, "{what}: {r:?}");
        if status == 200 {
            assert_eq!(r.status, 200, "{what}: {r:?}");
        } else {
            r.assert_error(status, code, &what);
        }
    }
    // Only the keyed produce (a NUL key is a valid key) wrote.
    assert_eq!(end_offsets(&server, "T"), vec![before[0] + 1]);
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------------------------
// Bodies and Content-Length
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn an_oversized_body_is_413_not_a_reset_from_the_client_and_raw() {
    let _serial = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("T", "partitions=2");
    let before = end_offsets(&server, "T");
    let over = vec![b'm'; (1 << 20) + 1];
    for attempt in 0..5 {
        match server.client.call("POST", "/produce?topic=T", &over) {
            Ok(a) => assert_error(&a, 413, "message_too_large", "client 1 MiB + 1"),
            Err(e) => panic!("attempt {attempt}: 1 MiB + 1 produce got no HTTP answer: {e}"),
        }
    }
    // A fresh client each time (a new connection, maybe another core).
    for attempt in 0..5 {
        match Client::new(&server.url()).call("POST", "/produce?topic=T&partition=1", &over) {
            Ok(a) => assert_error(&a, 413, "message_too_large", "fresh client 1 MiB + 1"),
            Err(e) => panic!("attempt {attempt}: 1 MiB + 1 produce got no HTTP answer: {e}"),
        }
    }
    let head = format!(
        "POST /produce?topic=T HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        over.len()
    );
    // Raw, whole body at once.
    let mut c = Conn::open(server.port);
    c.send(head.as_bytes());
    c.send(&over);
    let r = c.response();
    r.assert_error(413, "message_too_large", "raw 1 MiB + 1");
    assert!(r.closes(), "{r:?}");
    c.assert_closed("raw 1 MiB + 1");
    // Raw, head only: refused before a byte of the body is sent.
    let r = refused(server.port, head.as_bytes(), "head only");
    r.assert_error(413, "message_too_large", "head only");
    // Expect: 100-continue gets the 413 instead of 100 Continue.
    let expect = format!(
        "POST /produce?topic=T HTTP/1.1\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        over.len()
    );
    let r = refused(server.port, expect.as_bytes(), "expect");
    r.assert_error(413, "message_too_large", "expect 100-continue");
    // Absurd lengths.
    let r = refused(
        server.port,
        b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 9999999999999999999\r\n\r\nxx",
        "19 digits",
    );
    r.assert_error(413, "message_too_large", "Content-Length 19 digits");
    for cl in [
        "99999999999999999999",
        "18446744073709551616",
        "-1",
        "1e3",
        "0x10",
        " ",
        "1 1",
        "+1",
        "1,1",
    ] {
        let req = format!("POST /produce?topic=T HTTP/1.1\r\nContent-Length: {cl}\r\n\r\nx");
        let r = refused(server.port, req.as_bytes(), cl);
        assert!(
            r.status == 400 || r.status == 413,
            "Content-Length {cl:?}: {r:?}"
        );
    }
    let r = refused(
        server.port,
        b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy",
        "conflicting",
    );
    r.assert_error(400, "bad_request", "conflicting Content-Length");
    let r = refused(
        server.port,
        b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        "CL + TE",
    );
    r.assert_error(411, "length_required", "Content-Length + Transfer-Encoding");
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);

    // The boundary: exactly 1 MiB is accepted.
    let exact = vec![b'e'; 1 << 20];
    let a = server.post("/produce?topic=T&partition=0", &exact);
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(end_offsets(&server, "T"), vec![before[0] + 1, before[1]]);
}

#[test]
fn a_content_length_longer_than_the_body_is_not_answered_and_writes_nothing() {
    let _serial = common::serial();
    let server = Server::start(1, &[]);
    server.create_topic("T", "");
    let before = end_offsets(&server, "T");
    // Says 100, sends 10 and waits: the server must wait too.
    let mut c = Conn::open(server.port);
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 100\r\n\r\n0123456789");
    assert_eq!(
        c.listen(Duration::from_millis(1500)),
        Heard::Nothing,
        "answered a request whose body has not arrived: {:?}",
        String::from_utf8_lossy(&c.buf)
    );
    // Then the client gives up and closes.
    drop(c);
    // Same, but the client half-closes and keeps listening: no 2xx, the server closes.
    let mut c = Conn::open(server.port);
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 100\r\n\r\n0123456789");
    c.stream.shutdown(Shutdown::Write).unwrap();
    match c.listen(Duration::from_secs(5)) {
        Heard::Closed => {}
        Heard::Bytes => {
            let r = c.response();
            assert!(r.status >= 400, "a truncated body was answered {r:?}");
        }
        Heard::Nothing => panic!("the server kept a half-closed, truncated request open for 5 s"),
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(end_offsets(&server, "T"), before);
    assert_eq!(common::consume(&server.client, "T", ""), None);
    assert_alive(&server);
}

#[test]
fn bytes_beyond_the_content_length_are_the_next_request() {
    let _serial = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("T", "");
    let before = end_offsets(&server, "T");
    // Says 10, sends 100: the 90 extra bytes are garbage, parsed as a second request.
    let mut garbage = b"<garbage>\x01\x02\x03 not http \xff\xfe".to_vec();
    garbage.resize(86, b'g');
    garbage.extend_from_slice(b"\r\n\r\n");
    assert_eq!(garbage.len(), 90);
    let mut c = Conn::open(server.port);
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789");
    c.send(&garbage);
    let first = c.response();
    assert_eq!(first.status, 200, "{first:?}");
    let j: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(j["offset"].as_u64(), Some(before[0]));
    let second = c.response();
    second.assert_error(400, "bad_request", "the 90 extra bytes");
    assert!(second.closes(), "{second:?}");
    c.assert_closed("after the garbage");
    // Exactly the 10 bytes were written, once.
    assert_eq!(end_offsets(&server, "T"), vec![before[0] + 1]);
    let (_, o, handle, body) = common::consume(&server.client, "T", "").expect("the message");
    assert_eq!((o, &body[..]), (before[0], &b"0123456789"[..]));
    assert_eq!(common::settle(&server.client, "ack", "T", &handle, ""), 200);

    // Same lie, but the 90 extra bytes happen to be a valid request: it is served on the same connection.
    let mut next = b"GET /health HTTP/1.1\r\nX-Pad: ".to_vec();
    next.resize(86, b'p');
    next.extend_from_slice(b"\r\n\r\n");
    assert_eq!(next.len(), 90);
    let mut c = Conn::open(server.port);
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 10\r\n\r\nabcdefghij");
    c.send(&next);
    assert_eq!(c.response().status, 200);
    let health = c.response();
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&health.body).unwrap()["status"],
        "ok"
    );
    assert_eq!(end_offsets(&server, "T"), vec![before[0] + 2]);

    // A pipeline with garbage in the middle: what precedes it is served, what follows it is not.
    let mut c = Conn::open(server.port);
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\n\r\nA");
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\n\r\nB");
    c.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"); // a TLS ClientHello
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\n\r\nC");
    assert_eq!(c.response().status, 200);
    assert_eq!(c.response().status, 200);
    c.response()
        .assert_error(400, "bad_request", "TLS bytes mid-pipeline");
    c.assert_closed("after the TLS bytes");
    assert_eq!(end_offsets(&server, "T"), vec![before[0] + 4]);
    assert_alive(&server);
}

#[test]
fn pipelined_requests_are_answered_in_order_with_gapless_offsets() {
    let _serial = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("T", "");
    let mut burst = Vec::new();
    for i in 0..200 {
        let body = format!("m{i}");
        burst.extend_from_slice(
            format!(
                "POST /produce?topic=T HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        burst.extend_from_slice(b"GET /health HTTP/1.1\r\n\r\n");
    }
    let mut c = Conn::open(server.port);
    c.send(&burst);
    for i in 0..200u64 {
        let r = c.response();
        assert_eq!(r.status, 200, "produce {i}: {r:?}");
        let j: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(j["offset"].as_u64(), Some(i), "produce {i}: {j}");
        assert_eq!(c.response().status, 200, "health {i}");
    }
    assert_eq!(c.listen(Duration::from_millis(200)), Heard::Nothing);
    assert_eq!(end_offsets(&server, "T"), vec![200]);
    for i in 0..3 {
        let a = server.get(&format!("/consume?topic=T&partition=0&offset={i}"));
        assert_eq!(a.body, format!("m{i}").into_bytes());
    }
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------------------------
// Request heads and garbage
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn too_many_headers_and_huge_heads_are_431() {
    let _serial = common::serial();
    let server = Server::start(1, &[]);
    server.create_topic("T", "");
    let before = end_offsets(&server, "T");
    let with_headers = |n: usize| {
        let mut req = b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\n".to_vec();
        for i in 1..n {
            req.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
        }
        req.extend_from_slice(b"\r\nz");
        req
    };
    for n in [65, 101, 1000] {
        refused(server.port, &with_headers(n), "headers").assert_error(
            431,
            "headers_too_large",
            &format!("{n} headers"),
        );
    }
    // A 64 KiB header, a 100 KB request line, and 20 KB of empty lines.
    let mut big = b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\nX-Big: ".to_vec();
    big.resize(big.len() + (64 << 10), b'a');
    big.extend_from_slice(b"\r\n\r\nz");
    refused(server.port, &big, "64 KiB header").assert_error(
        431,
        "headers_too_large",
        "64 KiB header",
    );
    let mut line = b"GET /".to_vec();
    line.resize(100_000, b'a');
    line.extend_from_slice(b" HTTP/1.1\r\n\r\n");
    refused(server.port, &line, "100 KB line").assert_error(
        431,
        "headers_too_large",
        "100 KB request line",
    );
    let crlfs = b"\r\n".repeat(10_000);
    refused(server.port, &crlfs, "20 KB of CRLF").assert_error(
        431,
        "headers_too_large",
        "20 KB of empty lines",
    );
    let mut no_end = b"GET /health HTTP/1.1\r\n".to_vec();
    for i in 0..2000 {
        no_end.extend_from_slice(format!("X-{i}: {}\r\n", "v".repeat(20)).as_bytes());
    }
    refused(server.port, &no_end, "endless head").assert_error(
        431,
        "headers_too_large",
        "a head that never ends",
    );
    assert_eq!(end_offsets(&server, "T"), before);

    // The boundaries: 64 headers and a head just under 16 KiB are served.
    let a = answer(server.port, &with_headers(64), "64 headers");
    assert_eq!(a.status, 200, "64 headers: {a:?}");
    let mut near = b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\nX-Big: ".to_vec();
    near.resize(16 * 1024 - 5, b'b');
    near.extend_from_slice(b"\r\n\r\nz");
    assert_eq!(near.len(), 16 * 1024);
    let a = answer(server.port, &near, "16 KiB head");
    assert_eq!(a.status, 200, "a 16 KiB head: {a:?}");
    assert_eq!(end_offsets(&server, "T"), vec![before[0] + 2]);
    assert_alive(&server);
}

#[test]
fn garbage_bytes_are_400_or_431_and_the_server_lives_on() {
    let _serial = common::serial();
    let server = Server::start(2, &[]);
    server.create_topic("T", "partitions=2");
    server.produce("T", "", b"x");
    let before = end_offsets(&server, "T");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..40 {
        let len = [1, 7, 64, 1024, 4096, 40_000][i % 6];
        let mut junk = rng.bytes(len);
        // Make sure it is not an accidental request-line prefix waiting for more bytes.
        junk[0] = [0x00, 0x16, 0xff, b'\t', b'{'][i % 5];
        junk.extend_from_slice(b"\r\n\r\n");
        let r = refused(server.port, &junk, "random bytes");
        assert!(
            (r.status == 400 || r.status == 431) && r.closes(),
            "random junk {i} ({len} bytes): {r:?}"
        );
    }
    for (req, status) in [
        (&b"GET /health HTTP/2.0\r\n\r\n"[..], 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
        (b"GET /health\r\n\r\n", 400),
        (b"GET  /health HTTP/1.1\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nNoColon\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nBad Name: v\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\n: empty-name\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nX: a\0b\r\n\r\n", 400),
        (b"G\x80T /health HTTP/1.1\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\r\n\r\n", 400),
        (b"\x00\x00\x00\x00\r\n\r\n", 400),
        (b"SSH-2.0-OpenSSH_9.6\r\n", 400),
        (
            b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            411,
        ),
    ] {
        let r = refused(server.port, req, "malformed head");
        assert_eq!(
            r.status,
            status,
            "{:?}: {r:?}",
            String::from_utf8_lossy(req)
        );
        assert!(r.status >= 400 && r.status < 500);
    }
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
}

#[test]
fn http10_and_connection_close_are_answered_then_closed() {
    let _serial = common::serial();
    let server = Server::start(1, &[]);
    server.create_topic("T", "");
    for (req, what) in [
        (&b"GET /health HTTP/1.0\r\n\r\n"[..], "HTTP/1.0"),
        (
            b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n",
            "Connection: close",
        ),
        (
            b"GET /health HTTP/1.1\r\nConnection: Close\r\n\r\n",
            "Connection: Close",
        ),
        (
            b"GET /health HTTP/1.1\r\nconnection: keep-alive, close\r\n\r\n",
            "keep-alive, close",
        ),
    ] {
        let r = refused(server.port, req, what);
        assert_eq!(r.status, 200, "{what}: {r:?}");
    }
    // A produce over HTTP/1.0 is served and closed.
    let r = refused(
        server.port,
        b"POST /produce?topic=T HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi",
        "HTTP/1.0 produce",
    );
    assert_eq!(r.status, 200, "{r:?}");
    // Requests pipelined after a `Connection: close` are not served.
    let mut c = Conn::open(server.port);
    c.send(b"GET /health HTTP/1.1\r\n\r\n");
    c.send(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 4\r\n\r\nlost");
    let first = c.response();
    assert!(first.status == 200 && !first.closes(), "{first:?}");
    let second = c.response();
    assert!(second.status == 200 && second.closes(), "{second:?}");
    c.assert_closed("after Connection: close");
    // HTTP/1.0 with keep-alive stays open.
    let mut c = Conn::open(server.port);
    c.send(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(c.response().status, 200);
    c.send(b"GET /health HTTP/1.0\r\n\r\n");
    let r = c.response();
    assert!(r.status == 200 && r.closes(), "{r:?}");
    c.assert_closed("HTTP/1.0 without keep-alive");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(end_offsets(&server, "T"), vec![1]);
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------------------------
// Timeouts, slowloris, connection caps
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn incomplete_requests_time_out_with_408_and_write_nothing() {
    let _serial = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "header_read_timeout_ms = 1500\n");
    let server = Server::start(1, &["--config", cfg.to_str().unwrap()]);
    server.create_topic("T", "");
    let before = end_offsets(&server, "T");
    let cases: [&[u8]; 5] = [
        // Empty lines before a request line are ignored (RFC 9112 §2.2), so the server waits for the request.
        b"\r\n\r\n",
        b"\r\n",
        b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 100\r\n\r\n0123456789",
        b"POST /produce?topic=T HTTP/1.1\r\nContent-Le",
        b"POST /prod",
    ];
    let mut conns: Vec<(Conn, Instant)> = cases
        .iter()
        .map(|req| {
            let mut c = Conn::open(server.port);
            c.send(req);
            (c, Instant::now())
        })
        .collect();
    // A second later, none has been answered or closed.
    std::thread::sleep(Duration::from_millis(1000).saturating_sub(conns[0].1.elapsed()));
    for (i, (c, _)) in conns.iter_mut().enumerate() {
        assert_eq!(
            c.listen(Duration::from_millis(1)),
            Heard::Nothing,
            "{:?} was answered before the timeout: {:?}",
            String::from_utf8_lossy(cases[i]),
            String::from_utf8_lossy(&c.buf)
        );
    }
    for (i, (c, sent)) in conns.iter_mut().enumerate() {
        let what = String::from_utf8_lossy(cases[i]).into_owned();
        let r = c
            .try_response()
            .unwrap_or_else(|e| panic!("{what:?}: no 408: {e}"));
        let waited = sent.elapsed();
        r.assert_error(408, "request_timeout", &what);
        assert!(r.closes(), "{r:?}");
        assert!(
            waited >= Duration::from_millis(1400) && waited <= Duration::from_millis(3500),
            "{what:?}: 408 after {waited:?}"
        );
        c.assert_closed(&what);
    }
    // Empty lines followed by a request are served.
    let r = answer(
        server.port,
        b"\r\n\r\nGET /health HTTP/1.1\r\n\r\n",
        "leading CRLFs",
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
}

#[test]
fn slowloris_connections_are_cut_with_408_while_a_normal_client_keeps_working() {
    let _serial = common::serial();
    const SLOW: usize = 50;
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "header_read_timeout_ms = 1500\n");
    let server = Server::start(2, &["--config", cfg.to_str().unwrap()]);
    server.create_topic("T", "partitions=2");

    // The ordinary client: produce, consume, ack in a loop until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let client = Client::new(&server.url());
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut latencies = Vec::new();
            let mut failures = Vec::new();
            let mut timed = |method: &str, path: &str, body: &[u8]| {
                let started = Instant::now();
                let a = client.call(method, path, body);
                latencies.push(started.elapsed());
                match a {
                    Ok(a) if a.status == 200 => Some(a),
                    Ok(a) => {
                        failures.push(format!("{method} {path}: {} {}", a.status, a.text()));
                        None
                    }
                    Err(e) => {
                        failures.push(format!("{method} {path}: {e}"));
                        None
                    }
                }
            };
            let mut cycles = 0u64;
            while !stop.load(Ordering::Relaxed) {
                timed("POST", "/produce?topic=T", b"steady");
                if let Some(a) = timed("GET", "/consume?topic=T", b"") {
                    let handle = a.header("receipt-handle").unwrap_or("").to_string();
                    timed(
                        "POST",
                        &format!("/ack?topic=T&receipt_handle={handle}"),
                        b"",
                    );
                }
                cycles += 1;
            }
            (latencies, failures, cycles)
        })
    };

    // The slow connections: one header byte per second each.
    struct Slow {
        conn: TcpStream,
        sent: usize,
        first_byte: Option<Instant>,
        closed: Option<Instant>,
        heard: Vec<u8>,
        reset: bool,
    }
    let request = b"GET /health HTTP/1.1\r\nX-Slow: abcdefghijklmnopqrstuvwxyz\r\n\r\n";
    let mut slow: Vec<Slow> = (0..SLOW)
        .map(|_| {
            let conn = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
            conn.set_nonblocking(true).unwrap();
            Slow {
                conn,
                sent: 0,
                first_byte: None,
                closed: None,
                heard: Vec::new(),
                reset: false,
            }
        })
        .collect();
    let started = Instant::now();
    let mut next_round = started;
    while slow.iter().any(|s| s.closed.is_none()) && started.elapsed() < Duration::from_secs(8) {
        let now = Instant::now();
        if now >= next_round {
            for s in slow.iter_mut().filter(|s| s.closed.is_none()) {
                match s.conn.write(&request[s.sent..s.sent + 1]) {
                    Ok(1) => {
                        s.sent += 1;
                        s.first_byte.get_or_insert(now);
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => {
                        s.closed = Some(now);
                        s.reset = true;
                    }
                }
            }
            next_round += Duration::from_secs(1);
        }
        for s in slow.iter_mut().filter(|s| s.closed.is_none()) {
            let mut chunk = [0u8; 1024];
            loop {
                match s.conn.read(&mut chunk) {
                    Ok(0) => {
                        s.closed = Some(Instant::now());
                        break;
                    }
                    Ok(n) => s.heard.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        s.closed = Some(Instant::now());
                        s.reset = true;
                        break;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let (mut latencies, failures, cycles) = worker.join().expect("the normal client panicked");

    let mut got_408 = 0;
    let mut spans = Vec::new();
    for (i, s) in slow.iter().enumerate() {
        let closed = s.closed.unwrap_or_else(|| {
            panic!(
                "slow connection {i} still open after 8 s ({} bytes sent)",
                s.sent
            )
        });
        let span = closed - s.first_byte.expect("a first byte");
        spans.push(span);
        assert!(
            span >= Duration::from_millis(1400) && span <= Duration::from_millis(3500),
            "slow connection {i} closed {span:?} after its first byte"
        );
        assert!(
            s.sent < request.len(),
            "slow connection {i} completed its request"
        );
        if !s.heard.is_empty() {
            let text = String::from_utf8_lossy(&s.heard);
            assert!(
                text.starts_with("HTTP/1.1 408 ") && text.contains("\"request_timeout\""),
                "slow connection {i} heard {text:?}"
            );
            got_408 += 1;
        }
    }
    spans.sort();
    latencies.sort();
    let p50 = quantile(&latencies, 0.5);
    let p99 = quantile(&latencies, 0.99);
    let max = latencies.last().copied().unwrap_or_default();
    println!(
        "slowloris: {SLOW} connections closed after {:?}..{:?}, {got_408} with a readable 408; \
         normal client: {cycles} cycles, {} requests, p50 {p50:?}, p99 {p99:?}, max {max:?}",
        spans[0],
        spans[spans.len() - 1],
        latencies.len()
    );
    assert!(
        failures.is_empty(),
        "the normal client failed during the slowloris: {failures:#?}"
    );
    assert!(
        cycles >= 10,
        "the normal client got only {cycles} cycles done"
    );
    assert!(
        got_408 * 10 >= SLOW * 9,
        "only {got_408} of {SLOW} slow connections read their 408"
    );
    assert!(
        p99 < Duration::from_millis(500),
        "normal client p99 {p99:?} during the slowloris"
    );
    let metrics = server.get("/metrics").text();
    let timed_out: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("berth_connections_timed_out_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        timed_out >= SLOW as u64,
        "berth_connections_timed_out_total {timed_out}"
    );
    assert_alive(&server);
}

/// Opens a connection and checks it is served (`GET /health` → 200, kept open).
fn served(port: u16) -> Result<Conn, RawResponse> {
    let mut c = Conn::open(port);
    c.send(b"GET /health HTTP/1.1\r\n\r\n");
    let r = c.response();
    if r.status == 200 && !r.closes() {
        Ok(c)
    } else {
        Err(r)
    }
}

/// Opens a connection without sending and expects the cap's refusal, then the close.
fn assert_refused_by_cap(port: u16, what: &str) {
    let mut c = Conn::open(port);
    let r = c
        .try_response()
        .unwrap_or_else(|e| panic!("{what}: no 503: {e}"));
    r.assert_error(503, "too_many_connections", what);
    assert!(r.closes(), "{what}: {r:?}");
    assert!(r.header("retry-after").is_some(), "{what}: {r:?}");
    c.assert_closed(what);
}

/// Waits (bounded) until the server counts exactly `n` open connections (the probe itself included).
fn wait_connections_open(port: u16, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = Conn::open(port);
        c.send(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
        let text = String::from_utf8_lossy(&c.response().body).into_owned();
        let open: u64 = text
            .lines()
            .filter(|l| l.starts_with("berth_connections_open{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if open == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{open} connections open, not {n}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_per_core_connection_cap_refuses_with_503_and_recovers() {
    let _serial = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "max_connections_per_core = 8\n");
    let mut server = Server::start(1, &["--config", cfg.to_str().unwrap()]);
    server.create_topic("T", "");
    let before = end_offsets(&server, "T");
    // Drop the harness client's pooled connection so the count starts at zero.
    server.client = Client::new(&server.url());
    wait_connections_open(server.port, 1);

    let mut held: Vec<Conn> = (0..8)
        .map(|i| served(server.port).unwrap_or_else(|r| panic!("connection {i}: {r:?}")))
        .collect();
    for attempt in 0..3 {
        assert_refused_by_cap(server.port, &format!("9th connection, attempt {attempt}"));
    }
    // The held connections still work.
    for (i, c) in held.iter_mut().enumerate() {
        c.send(b"GET /health HTTP/1.1\r\n\r\n");
        assert_eq!(c.response().status, 200, "held connection {i}");
    }
    // Three close; exactly three new ones get in (once the server has noticed), the next is refused again.
    held.truncate(5);
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(3);
        let c = loop {
            match served(server.port) {
                Ok(c) => break c,
                Err(r) => {
                    r.assert_error(503, "too_many_connections", "while slots free up");
                    assert!(
                        Instant::now() < deadline,
                        "replacement {i} still refused 3 s after three connections closed"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        held.push(c);
    }
    assert_refused_by_cap(server.port, "9th connection again");
    drop(held);
    wait_connections_open(server.port, 1);
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
}

/// Server bug: the connection-cap refusal writes its 503 and closes at once, without draining what the client sends
/// (unlike the 413/431 paths, which half-close and drain). A client's request bytes then hit a closed socket, the
/// kernel answers with a reset, and the client's next write fails with EPIPE/ECONNRESET, so a client that writes
/// its request before reading (the project's own client, for a POST with a body) reports a transport error instead
/// of the 503.
#[test]
fn a_client_over_the_connection_cap_reads_the_503_not_a_broken_pipe() {
    let _serial = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "max_connections_per_core = 2\n");
    let mut server = Server::start(1, &["--config", cfg.to_str().unwrap()]);
    server.create_topic("T", "");
    let before = end_offsets(&server, "T");
    server.client = Client::new(&server.url());
    wait_connections_open(server.port, 1);
    let held: Vec<Conn> = (0..2)
        .map(|i| served(server.port).unwrap_or_else(|r| panic!("connection {i}: {r:?}")))
        .collect();

    // Raw and deterministic: the head goes out after the refusal was sent, the body 50 ms later.
    let mut raw_failures = Vec::new();
    for attempt in 0..5 {
        let mut c = Conn::open(server.port);
        std::thread::sleep(Duration::from_millis(50));
        let head = c
            .stream
            .write_all(b"POST /produce?topic=T HTTP/1.1\r\nContent-Length: 7\r\n\r\n");
        std::thread::sleep(Duration::from_millis(50));
        let body = c.stream.write_all(b"refused");
        if let Err(e) = head.and(body) {
            raw_failures.push(format!("attempt {attempt}: writing the request: {e}"));
        }
        let r = c.response();
        r.assert_error(503, "too_many_connections", "raw over the cap");
    }
    // The project's client, as an application would use it.
    const ATTEMPTS: usize = 30;
    let mut client_failures = Vec::new();
    for attempt in 0..ATTEMPTS {
        match Client::new(&server.url()).call("POST", "/produce?topic=T", b"refused") {
            Ok(a) => assert_error(&a, 503, "too_many_connections", "client over the cap"),
            Err(e) => client_failures.push(format!("attempt {attempt}: {e}")),
        }
    }
    drop(held);
    wait_connections_open(server.port, 1);
    assert_eq!(end_offsets(&server, "T"), before);
    assert_alive(&server);
    assert!(
        raw_failures.is_empty() && client_failures.is_empty(),
        "the connection-cap refusal resets the connection instead of draining it:\n\
         raw writes after the 503 failed in {} of 5 attempts: {raw_failures:#?}\n\
         {} of {ATTEMPTS} produces with berth::client::Client got no HTTP answer: {client_failures:#?}",
        raw_failures.len(),
        client_failures.len()
    );
}

#[test]
fn the_server_wide_connection_cap_holds_across_cores() {
    let _serial = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "max_connections = 6\n");
    let mut server = Server::start(2, &["--config", cfg.to_str().unwrap()]);
    server.client = Client::new(&server.url());
    wait_connections_open(server.port, 1);
    let held: Vec<Conn> = (0..6)
        .map(|i| served(server.port).unwrap_or_else(|r| panic!("connection {i}: {r:?}")))
        .collect();
    // Whichever core takes them, the next connections are refused.
    for attempt in 0..6 {
        assert_refused_by_cap(server.port, &format!("7th connection, attempt {attempt}"));
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(3);
    while served(server.port).is_err() {
        assert!(Instant::now() < deadline, "still refused after closing");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_alive(&server);
}

/// A long-poll consume whose client has hung up must not lease the next message to that dead request (live
/// consumers would otherwise see `204` for the topic's whole visibility): the server watches a parked
/// long-poll's socket and drops the request when the client closes.
#[test]
fn a_long_poll_whose_client_hung_up_does_not_swallow_a_message() {
    let _serial = common::serial();
    let server = Server::start(1, &[]);
    server.create_topic("T", "");
    let parked: Vec<Conn> = (0..10)
        .map(|_| {
            let mut c = Conn::open(server.port);
            c.send(b"GET /consume?topic=T&wait=30s HTTP/1.1\r\n\r\n");
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    drop(parked);
    std::thread::sleep(Duration::from_millis(300));
    server.produce("T", "", b"for a live consumer");
    let got = common::consume(&server.client, "T", "&wait=1s");
    let in_flight = server.partitions("T")[0]["in_flight"].clone();
    assert!(
        got.is_some(),
        "the message went to a consumer that had hung up (in_flight {in_flight})"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Authentication and listen addresses
// ---------------------------------------------------------------------------------------------------------------

const TOKEN: &str = "s3cr3t-t0ken-0123456789abcdefXYZ";

#[test]
fn a_bearer_token_is_required_everywhere_but_health() {
    let _serial = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let server = Server::start(1, &["--auth-token-file", token_file.to_str().unwrap()]);
    let anonymous = Client::new(&server.url());
    let authed = Client::new(&server.url()).with_token(Some(TOKEN.into()));

    let a = anonymous.call("GET", "/health", &[]).unwrap();
    assert_eq!(a.status, 200, "/health without a token: {}", a.text());
    let a = authed.call("PUT", "/topics/T", &[]).unwrap();
    assert_eq!(a.status, 201, "{}", a.text());
    let ends = |c: &Client| -> Vec<u64> {
        let a = c.call("GET", "/topics/T", &[]).unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["end_offset"].as_u64().unwrap())
            .collect()
    };
    let before = ends(&authed);

    let wrong: Vec<Client> = [
        "wrong-token-0123456789abcdef".to_string(),
        TOKEN[..TOKEN.len() - 1].to_string(),
        format!("{TOKEN}x"),
        TOKEN.to_ascii_lowercase(),
        String::new(),
    ]
    .into_iter()
    .map(|t| Client::new(&server.url()).with_token(Some(t)))
    .collect();
    let requests = [
        ("GET", "/topics"),
        ("GET", "/topics/T"),
        ("PUT", "/topics/U"),
        ("DELETE", "/topics/T"),
        ("POST", "/produce?topic=T"),
        ("GET", "/consume?topic=T"),
        ("POST", "/ack?topic=T&receipt_handle=0:0:1"),
        ("GET", "/metrics"),
    ];
    for (method, path) in requests {
        for (i, c) in std::iter::once(&anonymous).chain(&wrong).enumerate() {
            let a = c.call(method, path, b"sneaky").unwrap();
            assert_error(
                &a,
                401,
                "unauthorized",
                &format!("{method} {path} client {i}"),
            );
            assert!(
                a.header("www-authenticate")
                    .is_some_and(|v| v.starts_with("Bearer")),
                "{method} {path}: no WWW-Authenticate: {:?}",
                a.headers
            );
        }
    }
    // Other schemes and spellings, raw.
    for header in [
        format!("Basic {TOKEN}"),
        format!("Token {TOKEN}"),
        format!("Bearer{TOKEN}"),
        TOKEN.to_string(),
        format!("Bearer {}", &TOKEN[..16]),
        format!("Bearer {TOKEN}\u{0}"),
    ] {
        let req = format!(
            "POST /produce?topic=T HTTP/1.1\r\nAuthorization: {header}\r\nContent-Length: 1\r\n\r\nz"
        );
        let r = answer(server.port, req.as_bytes(), "raw auth");
        assert!(
            r.status == 401 || r.status == 400,
            "Authorization {header:?}: {r:?}"
        );
    }
    // Nothing was written and nothing created or deleted by the refused requests.
    assert_eq!(ends(&authed), before);
    let a = authed.call("GET", "/topics", &[]).unwrap();
    assert_eq!(a.json(), serde_json::json!(["T"]));
    // The right token works.
    let a = authed.call("POST", "/produce?topic=T", b"ok").unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    let a = authed.call("GET", "/consume?topic=T", &[]).unwrap();
    assert_eq!((a.status, &a.body[..]), (200, &b"ok"[..]), "{}", a.text());
    let a = authed.call("GET", "/metrics", &[]).unwrap();
    assert_eq!(a.status, 200);
    assert_alive(&server);
}

fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib >> 10
}

/// Issue 23, finding 3: with `--auth-token-file`, the token was checked only once the whole body was buffered, and
/// `100 Continue` was sent to unauthenticated requests: 6 connections sending 16 MiB bodies without a token took
/// +270 MB and held it for the header timeout. Now the head is checked as soon as it is complete: no `100
/// Continue`, a `401` before any more of the body is read, and memory stays flat under the same attack.
#[test]
fn an_unauthenticated_body_is_refused_after_its_head_before_it_is_buffered() {
    const TOKEN: &str = "pre-auth-t0ken-0123456789abcdef";
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let server = Server::start(1, &["--auth-token-file", token_file.to_str().unwrap()]);
    let authed = Client::new(&server.url()).with_token(Some(TOKEN.into()));
    assert_eq!(authed.call("PUT", "/topics/T", &[]).unwrap().status, 201);
    let big = 16usize << 20;

    // The head alone is answered: 401, never `100 Continue`, without a byte of the announced body sent.
    for (what, extra) in [
        ("expect 100-continue", "Expect: 100-continue\r\n"),
        ("plain", ""),
    ] {
        let mut c = Conn::open(server.port);
        c.send(
            format!(
                "POST /ack?topic=T HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Content-Length: {big}\r\n\r\n"
            )
            .as_bytes(),
        );
        let r = c.response();
        assert_eq!(r.status, 401, "{what}: {r:?}");
        c.assert_closed(what);
    }
    // `/health` is open, but not to a body from a client without the token.
    let mut c = Conn::open(server.port);
    c.send(format!("POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {big}\r\n\r\n").as_bytes());
    assert_eq!(c.response().status, 401);
    assert_eq!(
        answer(
            server.port,
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "health"
        )
        .status,
        200
    );
    // A wrong token is the same; a right one gets `100 Continue`, then its answer.
    let mut c = Conn::open(server.port);
    c.send(b"POST /produce?topic=T HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer nope\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    assert_eq!(c.response().status, 401);
    let mut c = Conn::open(server.port);
    c.send(format!("POST /produce?topic=T HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n").as_bytes());
    assert_eq!(c.response().status, 100);
    c.send(b"hello");
    assert_eq!(c.response().status, 200);

    // The attack as reproduced: 6 connections streaming 16 MiB bodies without a token. Each is answered and cut
    // after its head; the server's memory does not grow by the bodies.
    let pid = server.pid().expect("running");
    let before = rss_mib(pid);
    let attackers: Vec<_> = (0..6)
        .map(|_| {
            let port = server.port;
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
                let head = format!("POST /ack?topic=T HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {big}\r\n\r\n");
                let _ = s.write_all(head.as_bytes());
                let chunk = vec![b'7'; 1 << 20];
                let mut sent = 0usize;
                while sent < big {
                    if s.write_all(&chunk).is_err() {
                        break;
                    }
                    sent += chunk.len();
                }
                sent
            })
        })
        .collect();
    let mut peak = before;
    while attackers.iter().any(|t| !t.is_finished()) {
        peak = peak.max(rss_mib(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
    for t in attackers {
        t.join().unwrap();
    }
    peak = peak.max(rss_mib(pid));
    assert!(
        peak < before + 64,
        "RSS went from {before} MiB to {peak} MiB under unauthenticated 16 MiB bodies"
    );
    assert_eq!(authed.call("GET", "/topics/T", &[]).unwrap().status, 200);
    assert_alive(&server);
}

/// Runs `berth serve` directly and waits (bounded) for its exit; returns (code, stderr).
fn serve_until_exit(args: &[&str]) -> (Option<i32>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut all: Vec<&str> = vec!["serve"];
    all.extend_from_slice(args);
    all.extend(["--data-dir", data.to_str().unwrap(), "--cores", "1"]);
    common::run_until_exit(&all)
}

fn free_port_on_all_interfaces() -> u16 {
    let l = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
    l.local_addr().unwrap().port()
}

#[test]
fn a_non_loopback_listener_needs_a_token_or_insecure() {
    let _serial = common::serial();
    let port = free_port_on_all_interfaces();
    let listen = format!("0.0.0.0:{port}");
    let (code, stderr) = serve_until_exit(&["--listen", &listen]);
    assert!(
        code.is_some_and(|c| c != 0),
        "exit {code:?}; stderr {stderr}"
    );
    assert!(stderr.contains("--insecure"), "stderr: {stderr}");

    // A token shorter than 16 characters is refused too.
    let tmp = tempfile::tempdir().unwrap();
    let short = tmp.path().join("short");
    std::fs::write(&short, "short-token\n").unwrap();
    let (code, stderr) = serve_until_exit(&[
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--auth-token-file",
        short.to_str().unwrap(),
    ]);
    assert!(
        code.is_some_and(|c| c != 0),
        "exit {code:?}; stderr {stderr}"
    );
    assert!(stderr.contains("16"), "stderr: {stderr}");

    // With --insecure it starts; it is only spoken to over loopback, then killed at once.
    let data = tmp.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["serve", "--listen", &listen, "--insecure", "--cores", "1"])
        .arg("--data-dir")
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn berth");
    let loopback = Client::new(&format!("http://127.0.0.1:{port}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let healthy = loop {
        if let Ok(a) = loopback.call("GET", "/health", &[]) {
            if a.status == 200 {
                break true;
            }
        }
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let exited_early = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        healthy,
        "berth serve --listen {listen} --insecure did not come up (exit {exited_early:?})"
    );
}
