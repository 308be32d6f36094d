//! Integrity defects found in review, each pinned by an end-to-end test of the CORRECT behaviour against the real
//! binary: relative data directories, a damaged last frame below the durable frontier, an unreadable frontier file,
//! lost wake-ups, topic names that look like internal files, file-descriptor exhaustion and caps, quarantine at
//! boot, unbounded pipelined output, preallocated idle segments, extend without a visibility, 204 headers, Host and
//! Origin checks, file modes, runs of corrupt records and a delete/recreate race on the frontier flush.

mod common;

use berth::client::{Answer, Client};
use common::{consume, settle, Server};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

use common::free_port;

/// Asserts a JSON error answer: exact status, exact `error` code, non-empty `message`.
fn assert_error(a: &Answer, status: u16, code: &str, what: &str) {
    let j = a.json();
    assert_eq!(
        (a.status, j["error"].as_str()),
        (status, Some(code)),
        "{what}: body {}",
        a.text()
    );
    assert!(
        j["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: error without a message: {}",
        a.text()
    );
}

/// One numeric field of one partition in `GET /topics/{topic}`.
fn field(s: &Server, topic: &str, partition: usize, name: &str) -> u64 {
    let parts = s.partitions(topic);
    parts[partition][name]
        .as_u64()
        .unwrap_or_else(|| panic!("partition {partition} has no numeric '{name}': {parts:?}"))
}

fn read_frontier(partition_dir: &Path) -> Option<u64> {
    common::decode_frontier(&std::fs::read(partition_dir.join("consumer.offset")).ok()?)
}

/// Polls (bounded) until the server reports partition 0's default-group frontier durable at `want` (in the
/// core's journal or `consumer.offset`: a kill -9 from then on keeps it, the journal's replay writes the file).
fn wait_durable(s: &Server, topic: &str, want: u64, limit: Duration) {
    let start = Instant::now();
    loop {
        let got = field(s, topic, 0, "durable");
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{topic}/0 durable frontier is {got}, expected {want} within {limit:?}"
        );
        thread::sleep(ms(10));
    }
}

/// The frames of a segment file as (position, payload_len), found by walking the headers from byte 0 (a zero-filled
/// preallocated tail ends the walk).
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 32 <= bytes.len() && &bytes[pos..pos + 4] == b"FRTB" {
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
        if pos + 32 + len > bytes.len() {
            break;
        }
        out.push((pos, len));
        pos += 32 + len;
    }
    out
}

fn frame_offset(bytes: &[u8], pos: usize) -> u64 {
    u64::from_le_bytes(bytes[pos + 8..pos + 16].try_into().unwrap())
}

const SEGMENT0: &str = "00000000000000000000.log";

/// Produces `n` bodies `{prefix}{i}` to partition 0 of `topic`, consumes and acks them all in order, and waits until
/// the durable frontier is `n`.
fn produce_settle_all(s: &Server, topic: &str, prefix: &str, n: u64) {
    for i in 0..n {
        assert_eq!(
            s.produce(topic, "&partition=0", format!("{prefix}{i}").as_bytes()),
            (0, i)
        );
    }
    for want in 0..n {
        let (p, o, h, _) = consume(&s.client, topic, "").expect("a message");
        assert_eq!((p, o), (0, want));
        assert_eq!(settle(&s.client, "ack", topic, &h, ""), 200);
    }
    wait_durable(s, topic, n, ms(5000));
}

/// Consumes (and acks) until 204; returns what was delivered, asserting no (partition, offset) twice.
fn drain(s: &Server, topic: &str, limit: usize) -> BTreeMap<(u64, u64), Vec<u8>> {
    let mut seen = BTreeMap::new();
    while let Some((p, o, h, body)) = consume(&s.client, topic, "&wait=0") {
        assert_eq!(settle(&s.client, "ack", topic, &h, ""), 200);
        assert!(
            seen.insert((p, o), body).is_none(),
            "{topic} {p}:{o} delivered twice"
        );
        assert!(seen.len() <= limit, "runaway delivery on {topic}");
    }
    seen
}

/// A berth process started with a caller-chosen command line, working directory and wrapper (the harness always
/// passes `--data-dir` and cannot wrap the binary). Its log goes to a temp dir of its own.
struct Proc {
    child: Option<Child>,
    /// The program and its arguments, `serve ...` included.
    cmd: Vec<String>,
    cwd: PathBuf,
    port: u16,
    client: Client,
    log: PathBuf,
    _logdir: tempfile::TempDir,
}

impl Proc {
    /// Runs `[wrapper..] berth serve --listen 127.0.0.1:PORT [extra..]` in `cwd`, waiting until healthy.
    fn start(cwd: &Path, wrapper: &[&str], extra: &[&str]) -> Proc {
        let port = free_port();
        let mut cmd: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
        cmd.push(env!("CARGO_BIN_EXE_berth").to_string());
        cmd.extend(["serve", "--listen"].map(String::from));
        cmd.push(format!("127.0.0.1:{port}"));
        cmd.extend(extra.iter().map(|s| s.to_string()));
        let logdir = tempfile::tempdir().expect("tempdir");
        let mut p = Proc {
            child: None,
            cmd,
            cwd: cwd.to_path_buf(),
            port,
            client: Client::new(&format!("http://127.0.0.1:{port}")),
            log: logdir.path().join("berth.log"),
            _logdir: logdir,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(&self.cmd[0])
            .args(&self.cmd[1..])
            .current_dir(&self.cwd)
            .env("BERTH_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn berth");
        self.child = Some(child);
        common::await_healthy(
            &self.client,
            &mut self.child,
            Duration::from_secs(20),
            "berth",
            &self.log,
        );
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// kill -9, then the same command line again in the same directory.
    fn restart(&mut self) {
        self.kill9();
        common::wait_port_free(self.port);
        self.spawn();
    }

    fn call(&self, method: &str, path: &str, body: &[u8]) -> Answer {
        self.client
            .call(method, path, body)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.log_text()))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A response read off a raw connection: status, lower-cased headers, body.
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

    fn error_code(&self) -> Option<String> {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()?
            .get("error")?
            .as_str()
            .map(String::from)
    }
}

/// A raw client connection; bytes read past one response stay buffered for the next (pipelining).
struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    fn open(port: u16) -> RawConn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(ms(5000))).unwrap();
        stream.set_write_timeout(Some(ms(5000))).unwrap();
        RawConn {
            stream,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    fn fill(&mut self, what: &str) {
        let mut chunk = [0u8; 16 << 10];
        match self.stream.read(&mut chunk) {
            Ok(0) => panic!(
                "{what}: connection closed; have {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("{what}: reading: {e}"),
        }
    }

    /// Reads exactly one response (head, then a Content-Length body).
    fn response(&mut self, what: &str) -> Raw {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            self.fill(what);
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{what}: bad status line {status_line:?}"));
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.parse().expect("content-length"))
            .unwrap_or(0);
        let total = head_end + 4 + len;
        while self.buf.len() < total {
            self.fill(what);
        }
        let body = self.buf[head_end + 4..total].to_vec();
        self.buf.drain(..total);
        Raw {
            status,
            headers,
            body,
        }
    }

    /// Asserts the server closed the connection with nothing more to say (EOF or a reset within 3 s).
    fn assert_closed(&mut self, what: &str) {
        assert!(
            self.buf.is_empty(),
            "{what}: more bytes after the answer: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        self.stream.set_read_timeout(Some(ms(3000))).unwrap();
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => {}
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Ok(_) => panic!("{what}: more bytes after the answer"),
            Err(e) => panic!("{what}: the connection stayed open ({e})"),
        }
    }
}

/// Sends `request` on a fresh connection and reads one response.
fn raw(port: u16, request: &str, what: &str) -> Raw {
    let mut c = RawConn::open(port);
    c.send(request.as_bytes());
    c.response(what)
}

/// True once the peer closed: a read returns EOF or an error other than a timeout (reads what it must to get there,
/// up to `cap` bytes).
fn closed_by_peer(stream: &mut TcpStream, cap: usize) -> Result<(), String> {
    let mut chunk = vec![0u8; 256 << 10];
    let mut total = 0usize;
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                total += n;
                if total > cap {
                    return Err(format!(
                        "still open: read {total} bytes and the server keeps sending"
                    ));
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!("still open: silent after {total} bytes"))
            }
            Err(_) => return Ok(()),
        }
    }
}

/// The pid of the live `berth serve` child of this test process listening on `port`.
fn server_pid(port: u16) -> u32 {
    let needle = format!("127.0.0.1:{port}");
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if !cmdline.split(|&b| b == 0).any(|a| a == needle.as_bytes()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("?");
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == me && state != "Z" && state != "X" {
            return pid;
        }
    }
    panic!("no berth process listening on {needle}");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// `berth_connections_open` summed over the cores.
fn connections_open(client: &Client) -> u64 {
    let a = client.call("GET", "/metrics", &[]).expect("metrics");
    assert_eq!(a.status, 200);
    a.text()
        .lines()
        .filter(|l| l.starts_with("berth_connections_open"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Every path under `dir`, `dir` first.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() {
            let mut children: Vec<PathBuf> = std::fs::read_dir(&out[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            children.sort();
            out.extend(children);
        }
        i += 1;
    }
    out
}

fn config_file(dir: &Path, text: &str) -> String {
    let path = dir.join("berth.toml");
    std::fs::write(&path, text).expect("write config");
    path.display().to_string()
}

// ---------------------------------------------------------------------------------------------------------------
// 1. Relative data directories
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn a_server_without_data_dir_serves_the_readme_walkthrough_from_berth_data_in_its_working_directory(
) {
    let cwd = tempfile::tempdir().unwrap();
    let s = Proc::start(cwd.path(), &[], &["--cores", "1"]);

    let a = s.call("PUT", "/topics/orders?partitions=4&visibility=30s", b"");
    assert_eq!(a.status, 201, "create orders: {}", a.text());
    assert!(
        cwd.path().join("berth-data/topics/orders").is_dir(),
        "the topic is not under <cwd>/berth-data"
    );
    let a = s.call("POST", "/produce?topic=orders", b"hello");
    assert_eq!(a.status, 200, "produce: {}", a.text());
    let (hello_p, hello_o) = (
        a.json()["partition"].as_u64().unwrap(),
        a.json()["offset"].as_u64().unwrap(),
    );
    let a = s.call("POST", "/produce?topic=orders&key=customer-7", b"hi");
    assert_eq!(a.status, 200, "produce with a key: {}", a.text());

    let a = s.call("GET", "/consume?topic=orders&wait=10s", b"");
    assert_eq!(a.status, 200, "consume: {}", a.text());
    let handle = a
        .header("receipt-handle")
        .expect("Receipt-Handle")
        .to_string();
    let ack = format!("/ack?topic=orders&receipt_handle={handle}");
    assert_eq!(s.call("POST", &ack, b"").status, 200, "ack");
    assert_error(&s.call("POST", &ack, b""), 410, "lease_gone", "second ack");

    let a = s.call("POST", "/produce?topic=orders", b"third");
    assert_eq!(a.status, 200, "produce: {}", a.text());
    let a = s.call("GET", "/consume?topic=orders&wait=10s", b"");
    assert_eq!(a.status, 200, "consume: {}", a.text());
    let handle = a
        .header("receipt-handle")
        .expect("Receipt-Handle")
        .to_string();
    let a = s.call(
        "POST",
        &format!("/nack?topic=orders&receipt_handle={handle}"),
        b"",
    );
    assert_eq!(a.status, 200, "nack: {}", a.text());

    let a = s.call("GET", "/consume?topic=orders&wait=10s", b"");
    assert_eq!(a.status, 200, "consume: {}", a.text());
    let handle = a
        .header("receipt-handle")
        .expect("Receipt-Handle")
        .to_string();
    let a = s.call(
        "POST",
        &format!("/extend?topic=orders&receipt_handle={handle}&visibility=1m"),
        b"",
    );
    assert_eq!(a.status, 200, "extend: {}", a.text());

    let a = s.call(
        "GET",
        &format!("/consume?topic=orders&partition={hello_p}&offset={hello_o}"),
        b"",
    );
    assert_eq!(a.status, 200, "replay: {}", a.text());
    assert_eq!(a.body, b"hello");
    assert_eq!(s.call("GET", "/topics/orders", b"").status, 200, "describe");
    assert_eq!(s.call("GET", "/metrics", b"").status, 200, "metrics");
    let a = s.call("DELETE", "/topics/orders", b"");
    assert_eq!(a.status, 204, "delete: {}", a.text());
}

#[test]
fn relative_symlinked_and_config_file_data_dirs_keep_their_data_across_kill_9() {
    // "symlink": an absolute path to a symlink; "relative symlink": `link`, relative to the working directory.
    for case in ["relative", "symlink", "relative symlink", "config"] {
        let cwd = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let (extra, data): (Vec<String>, PathBuf) = match case {
            "relative" => (
                vec!["--data-dir".into(), "rel/sub".into()],
                cwd.path().join("rel/sub"),
            ),
            "symlink" | "relative symlink" => {
                let real = elsewhere.path().join("real");
                std::fs::create_dir_all(&real).unwrap();
                let link = cwd.path().join("link");
                std::os::unix::fs::symlink(&real, &link).unwrap();
                let arg = if case == "symlink" {
                    link.display().to_string()
                } else {
                    "link".to_string()
                };
                (vec!["--data-dir".into(), arg], real)
            }
            _ => {
                std::fs::write(cwd.path().join("f.toml"), "data_dir = \"reldir\"\n").unwrap();
                (
                    vec!["--config".into(), "f.toml".into()],
                    cwd.path().join("reldir"),
                )
            }
        };
        let mut args: Vec<&str> = vec!["--cores", "1"];
        args.extend(extra.iter().map(String::as_str));
        let mut s = Proc::start(cwd.path(), &[], &args);
        let a = s.call("PUT", "/topics/t", b"");
        assert_eq!(a.status, 201, "{case}: create: {}", a.text());
        let a = s.call("POST", "/produce?topic=t", b"kept");
        assert_eq!(a.status, 200, "{case}: produce: {}", a.text());
        assert!(
            data.join("topics/t/0").is_dir(),
            "{case}: the partition is not under {}",
            data.display()
        );
        s.restart();
        let a = s.call("GET", "/consume?topic=t&partition=0&offset=0", b"");
        assert_eq!(a.status, 200, "{case}: replay after kill -9: {}", a.text());
        assert_eq!(a.body, b"kept", "{case}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 2. A damaged last frame below the durable frontier
// ---------------------------------------------------------------------------------------------------------------

/// Produces 5, settles 5 (frontier 5 on disk), kill -9, flips one byte of the last frame (payload or header), and
/// restarts.
fn settled_log_with_a_damaged_last_frame(header: bool) -> Server {
    damaged_last_frame(header, false)
}

/// Five records produced and settled, kill -9, one byte of the last frame flipped; without `keep_journal` the
/// journal is gone too (the damage came after a checkpoint), so the segment's own recovery has to cope. With it,
/// the server writes each batch to its segment at once (`write_behind_bytes = 0`), so the segment holds the frame
/// the journal then repairs.
fn damaged_last_frame(header: bool, keep_journal: bool) -> Server {
    let config_dir = tempfile::tempdir().expect("tempdir");
    let config = config_file(config_dir.path(), "write_behind_bytes = 0\n");
    let mut s = if keep_journal {
        Server::start(1, &["--config", &config])
    } else {
        Server::start(1, &[])
    };
    s.create_topic("t", "");
    produce_settle_all(&s, "t", "m", 5);
    s.kill9();
    if !keep_journal {
        s.drop_journal();
    }
    let seg = s.partition_dir("t", 0).join(SEGMENT0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let f = frames(&bytes);
    assert_eq!(f.len(), 5, "5 frames in the segment");
    let (pos, len) = f[4];
    assert_eq!(
        frame_offset(&bytes, pos),
        4,
        "the last frame holds offset 4"
    );
    let at = if header { pos + 8 } else { pos + 32 + len - 1 };
    bytes[at] ^= 0x5a;
    std::fs::write(&seg, &bytes).unwrap();
    s.restart();
    s
}

/// The same damage while the journal still holds the record (no checkpoint since): replay repairs the segment,
/// nothing is corrupt, and the next produce still gets offset 5.
#[test]
fn a_damaged_last_frame_is_repaired_from_the_journal() {
    let _g = common::serial();
    for header in [false, true] {
        let s = damaged_last_frame(header, true);
        assert_frontier_kept(&s, "repaired");
        let p = &s.partitions("t")[0];
        assert_eq!(p["corrupt_skipped"].as_u64(), Some(0), "{p}");
        let replayed = s.get("/consume?topic=t&partition=0&offset=4");
        assert_eq!(replayed.status, 200, "{}", replayed.text());
        assert_eq!(replayed.body, b"m4", "the repaired record");
        let a = s.post("/produce?topic=t", b"after");
        assert_eq!(a.json()["offset"].as_u64(), Some(5), "{}", a.text());
    }
}

fn assert_frontier_kept(s: &Server, what: &str) {
    let committed = field(s, "t", 0, "committed");
    assert!(committed >= 5, "{what}: committed fell to {committed}");
}

#[test]
fn a_damaged_last_frame_never_reuses_an_offset_below_the_durable_frontier_when_produce_comes_first()
{
    let _g = common::serial();
    for header in [false, true] {
        let what = if header {
            "header byte"
        } else {
            "payload byte"
        };
        let s = settled_log_with_a_damaged_last_frame(header);
        assert_frontier_kept(&s, what);
        let a = s.post("/produce?topic=t", b"after");
        assert_eq!(a.status, 200, "{what}: produce: {}", a.text());
        assert_eq!(
            a.json()["offset"].as_u64(),
            Some(5),
            "{what}: the produce reused an offset the frontier already covers"
        );
        assert_frontier_kept(&s, what);
        let got = consume(&s.client, "t", "").expect("the new record");
        assert_eq!((got.0, got.1, &got.3[..]), (0, 5, &b"after"[..]), "{what}");
        let p = &s.partitions("t")[0];
        assert!(p["end_offset"].as_u64() >= Some(6), "{what}: {p}");
        assert!(p["committed"].as_u64() >= Some(5), "{what}: {p}");
        assert!(p["corrupt_skipped"].as_u64() >= Some(1), "{what}: {p}");
    }
}

#[test]
fn a_damaged_last_frame_never_reuses_an_offset_below_the_durable_frontier_when_consume_comes_first()
{
    let _g = common::serial();
    for header in [false, true] {
        let what = if header {
            "header byte"
        } else {
            "payload byte"
        };
        let s = settled_log_with_a_damaged_last_frame(header);
        assert_frontier_kept(&s, what);
        assert_eq!(
            consume(&s.client, "t", ""),
            None,
            "{what}: nothing is deliverable at frontier 5"
        );
        assert_frontier_kept(&s, what);
        let a = s.post("/produce?topic=t", b"after");
        assert_eq!(a.status, 200, "{what}: produce: {}", a.text());
        assert_eq!(
            a.json()["offset"].as_u64(),
            Some(5),
            "{what}: the produce reused an offset the frontier already covers"
        );
        let got = consume(&s.client, "t", "").expect("the new record");
        assert_eq!((got.0, got.1, &got.3[..]), (0, 5, &b"after"[..]), "{what}");
        let p = &s.partitions("t")[0];
        assert!(p["end_offset"].as_u64() >= Some(6), "{what}: {p}");
        assert!(p["committed"].as_u64() >= Some(5), "{what}: {p}");
        assert!(p["corrupt_skipped"].as_u64() >= Some(1), "{what}: {p}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 3. An unreadable frontier
// ---------------------------------------------------------------------------------------------------------------

/// Replaces `consumer.offset` with a directory (reads fail with EISDIR, even as root); returns where the file went.
fn break_frontier(s: &Server, partition: u64) -> PathBuf {
    let file = s.partition_dir("t", partition).join("consumer.offset");
    let aside = s.data_dir.with_extension(format!("frontier-{partition}"));
    std::fs::rename(&file, &aside).unwrap();
    std::fs::create_dir(&file).unwrap();
    aside
}

/// No file in the partition dir decodes as a frontier below `floor`, and `consumer.offset` is still a directory.
fn assert_nothing_lower_written(s: &Server, partition: u64, floor: u64) {
    let dir = s.partition_dir("t", partition);
    assert!(
        dir.join("consumer.offset").is_dir(),
        "the unreadable consumer.offset was replaced"
    );
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        if let Some(v) = std::fs::read(entry.path())
            .ok()
            .and_then(|b| common::decode_frontier(&b))
        {
            assert!(
                v >= floor,
                "{} holds frontier {v}, below the durable {floor}",
                entry.path().display()
            );
        }
    }
}

#[test]
fn an_unreadable_frontier_makes_the_partition_unavailable_instead_of_redelivering_from_zero() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("t", "");
    produce_settle_all(&s, "t", "m", 5);
    s.kill9();
    // At rest: consumer.offset holds 5 (the journal's replay writes it), and the journal is gone.
    s.drop_journal();
    let aside = break_frontier(&s, 0);
    s.restart();

    let a = s.get("/consume?topic=t");
    assert_ne!(
        a.status,
        200,
        "delivered offset {:?} below the durable frontier 5",
        a.header("offset")
    );
    assert_error(
        &a,
        503,
        "partition_unavailable",
        "consume, frontier unreadable",
    );
    assert!(a.header("retry-after").is_some(), "503 without Retry-After");
    thread::sleep(ms(300));
    assert_nothing_lower_written(&s, 0, 5);

    // The file comes back while the server runs: the partition serves again from frontier 5.
    let file = s.partition_dir("t", 0).join("consumer.offset");
    std::fs::remove_dir(&file).unwrap();
    std::fs::rename(&aside, &file).unwrap();
    let deadline = Instant::now() + ms(5000);
    let a = loop {
        let a = s.get("/consume?topic=t");
        if a.status != 503 || Instant::now() > deadline {
            break a;
        }
        thread::sleep(ms(50));
    };
    assert_eq!(
        a.status,
        204,
        "consume once the frontier is readable again (offset {:?}): {}",
        a.header("offset"),
        a.text()
    );
    assert_eq!(s.produce("t", "", b"next"), (0, 5));
    let got = consume(&s.client, "t", "").expect("offset 5");
    assert_eq!((got.0, got.1, &got.3[..]), (0, 5, &b"next"[..]));
}

#[test]
fn an_unreadable_frontier_on_one_partition_leaves_the_other_partitions_deliverable() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("t", "partitions=2");
    produce_settle_all(&s, "t", "m", 5);
    assert_eq!(s.produce("t", "&partition=1", b"p1"), (1, 0));
    s.kill9();
    s.drop_journal();
    let _aside = break_frontier(&s, 0);
    s.restart();

    let a = s.get("/consume?topic=t");
    assert_eq!(
        (a.status, a.header("partition"), a.header("offset")),
        (200, Some("1"), Some("0")),
        "partition 1's message is delivered despite partition 0: {}",
        a.text()
    );
    for _ in 0..5 {
        let a = s.get("/consume?topic=t");
        assert!(
            a.status == 204 || a.status == 503,
            "partition 0 delivered below its frontier: {} partition {:?} offset {:?}",
            a.status,
            a.header("partition"),
            a.header("offset")
        );
    }
    thread::sleep(ms(300));
    assert_nothing_lower_written(&s, 0, 5);
}

// ---------------------------------------------------------------------------------------------------------------
// 4. Lost wake-ups
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn two_leases_expiring_in_one_sweep_wake_two_parked_consumers() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("w", "partitions=2&visibility=1s");
    for round in 0..3 {
        s.produce("w", "&partition=0", format!("a{round}").as_bytes());
        s.produce("w", "&partition=1", format!("b{round}").as_bytes());
        let first = consume(&s.client, "w", "").expect("first lease");
        let second = consume(&s.client, "w", "").expect("second lease");
        assert_ne!(first.0, second.0, "round {round}: two partitions leased");

        let (tx, rx) = mpsc::channel();
        let started = Instant::now();
        for _ in 0..2 {
            let client = Client::new(&s.url());
            let tx = tx.clone();
            thread::spawn(move || {
                let got = consume(&client, "w", "&wait=8s");
                let _ = tx.send((started.elapsed(), got));
            });
        }
        let mut partitions = BTreeSet::new();
        for _ in 0..2 {
            let (took, got) = rx.recv_timeout(ms(15_000)).expect("consumer thread");
            let (p, _, h, _) = got.unwrap_or_else(|| {
                panic!("round {round}: a parked consumer got 204 after {took:?}")
            });
            assert!(
                took < ms(5000),
                "round {round}: a parked consumer was woken only after {took:?}"
            );
            partitions.insert(p);
            assert_eq!(settle(&s.client, "ack", "w", &h, ""), 200);
        }
        assert_eq!(partitions.len(), 2, "round {round}: one message each");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 5. Topic names that look like internal files
// ---------------------------------------------------------------------------------------------------------------

fn assert_dot_topic_intact(s: &Server, what: &str) {
    let a = s.get("/topics");
    assert_eq!(a.status, 200);
    let names: Vec<String> = a
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    assert!(
        names.contains(&".deleted-orders".to_string()),
        "{what}: .deleted-orders is gone from {names:?}"
    );
    assert!(
        !names.contains(&"x".to_string()),
        "{what}: deleted x is back"
    );
    for o in 0..3 {
        let a = s.get(&format!(
            "/consume?topic=.deleted-orders&partition=0&offset={o}"
        ));
        assert_eq!(a.status, 200, "{what}: replay {o}: {}", a.text());
        assert_eq!(a.body, format!("order-{o}").into_bytes(), "{what}");
    }
    assert_error(&s.get("/topics/x"), 404, "topic_not_found", what);
}

#[test]
fn a_topic_named_like_a_deleted_one_survives_kill_9_and_graceful_restarts() {
    let mut s = Server::start(1, &[]);
    s.create_topic(".deleted-orders", "");
    for i in 0..3 {
        s.produce(".deleted-orders", "", format!("order-{i}").as_bytes());
    }
    s.create_topic("x", "");
    s.produce("x", "", b"gone");
    assert_eq!(s.delete("/topics/x").status, 204);

    s.restart();
    assert_dot_topic_intact(&s, "after kill -9");
    assert_eq!(s.terminate(), Some(0), "SIGTERM exits 0");
    s.restart();
    assert_dot_topic_intact(&s, "after a graceful restart");
}

// ---------------------------------------------------------------------------------------------------------------
// 6. File descriptors and caps
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn a_topic_too_big_for_the_fd_limit_is_refused_cleanly_and_the_server_keeps_serving() {
    let _g = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let data_arg = data.display().to_string();
    let mut s = Proc::start(
        tmp.path(),
        &["prlimit", "--nofile=1024:1024"],
        &["--data-dir", &data_arg, "--cores", "2"],
    );
    let client = s.client.clone();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(client.call("PUT", "/topics/x?partitions=4096", &[]));
    });
    let a = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("PUT of 4096 partitions under 1024 fds hung for 30 s")
        .expect("PUT answered");
    assert!(
        (400..500).contains(&a.status) || a.status == 503,
        "PUT of 4096 partitions under 1024 fds answered {}: {}",
        a.status,
        a.text()
    );
    assert!(
        a.json()["error"].as_str().is_some(),
        "not a JSON error: {}",
        a.text()
    );
    let a = s.call("GET", "/topics/x", b"");
    assert_eq!(a.status, 404, "the refused topic exists: {}", a.text());
    assert!(
        !data.join("topics/x").exists(),
        "the refused topic left its directory behind"
    );
    assert_eq!(s.call("GET", "/health", b"").status, 200);

    let a = s.call("PUT", "/topics/y?partitions=4", b"");
    assert_eq!(a.status, 201, "create y: {}", a.text());
    for p in 0..4 {
        let a = s.call("POST", &format!("/produce?topic=y&partition={p}"), b"y");
        assert_eq!(a.status, 200, "produce y/{p}: {}", a.text());
    }
    let a = s.call("GET", "/consume?topic=y", b"");
    assert_eq!(a.status, 200, "consume y: {}", a.text());

    s.restart();
    for p in 0..4 {
        let a = s.call(
            "GET",
            &format!("/consume?topic=y&partition={p}&offset=0"),
            b"",
        );
        assert_eq!(a.status, 200, "replay y/{p} after kill -9: {}", a.text());
    }
}

#[test]
fn topic_and_partition_caps_refuse_with_409_and_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "max_topics = 3\nmax_partitions = 10\n");
    let s = Server::start(1, &["--config", &cfg]);
    s.create_topic("a", "partitions=4");
    s.create_topic("b", "partitions=3");
    assert_error(
        &s.put("/topics/c?partitions=4"),
        409,
        "partition_limit",
        "11 partitions on a node capped at 10",
    );
    assert_eq!(s.get("/topics/c").status, 404);
    assert!(
        !s.data_dir.join("topics/c").exists(),
        "refused c left a directory"
    );
    s.create_topic("c", "partitions=1");
    assert_error(
        &s.put("/topics/d?partitions=1"),
        409,
        "topic_limit",
        "a 4th topic with max_topics = 3",
    );
    assert_eq!(s.get("/topics/d").status, 404);
    assert!(
        !s.data_dir.join("topics/d").exists(),
        "refused d left a directory"
    );
    assert_eq!(s.produce("a", "&partition=3", b"ok"), (3, 0));
}

#[test]
fn a_topic_whose_segment_cannot_be_opened_is_quarantined_at_boot_and_the_rest_serves() {
    let mut s = Server::start(1, &[]);
    s.create_topic("good", "");
    s.create_topic("bad", "");
    s.produce("good", "", b"g0");
    s.produce("bad", "", b"b0");
    s.kill9();
    let seg = s.partition_dir("bad", 0).join(SEGMENT0);
    std::fs::remove_file(&seg).unwrap();
    std::fs::create_dir(&seg).unwrap();
    s.restart();

    assert_eq!(s.get("/health").status, 200);
    let a = s.get("/consume?topic=good&partition=0&offset=0");
    assert_eq!(a.status, 200, "replay good: {}", a.text());
    assert_eq!(a.body, b"g0");
    assert_eq!(s.produce("good", "", b"g1"), (0, 1));
    assert_error(
        &s.post("/produce?topic=bad", b"b1"),
        503,
        "topic_unavailable",
        "produce to a quarantined topic",
    );
    assert_error(
        &s.get("/consume?topic=bad"),
        503,
        "topic_unavailable",
        "consume from a quarantined topic",
    );
    let log = s.log_text();
    let loud: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("quarantin") && l.contains("bad"))
        .collect();
    assert!(
        !loud.is_empty(),
        "no log line says `bad` was quarantined; log:\n{log}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 7. Pipelined output is bounded per connection
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn pipelined_replies_to_a_client_that_never_reads_are_bounded_and_the_connection_is_closed() {
    let _g = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "write_timeout_ms = 2000\n");
    let s = Server::start(1, &["--config", &cfg]);
    s.create_topic("wide", "partitions=512");
    let metrics_len = s.get("/metrics").body.len();
    assert!(
        metrics_len * 600 > 64 << 20,
        "/metrics is only {metrics_len} bytes: 600 of them are no test"
    );
    let pid = server_pid(s.port);
    let probe = Client::new(&s.url());
    let open_before = connections_open(&probe);
    let base = rss_kib(pid);

    let request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(600);
    let mut conns: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut c = RawConn::open(s.port).stream;
            let _ = c.write_all(request.as_bytes());
            c
        })
        .collect();
    let start = Instant::now();

    let mut peak = base;
    while start.elapsed() < ms(4000) {
        let t = Instant::now();
        let a = probe.call("GET", "/health", &[]).expect("health");
        assert_eq!(a.status, 200);
        assert!(
            t.elapsed() < ms(1000),
            "/health took {:?} while 4 clients do not read",
            t.elapsed()
        );
        peak = peak.max(rss_kib(pid));
        thread::sleep(ms(100));
    }
    let grew_mib = peak.saturating_sub(base) / 1024;
    assert!(
        grew_mib < 64,
        "RSS grew by {grew_mib} MiB for 4 connections that never read"
    );

    // The server gives up on them: its open connections fall back to the probe's own.
    loop {
        let open = connections_open(&probe);
        if open <= open_before {
            break;
        }
        assert!(
            start.elapsed() < ms(10_000),
            "{open} connections still open 10 s after 4 clients stopped reading (before: {open_before})"
        );
        thread::sleep(ms(200));
    }
    for (i, c) in conns.iter_mut().enumerate() {
        c.set_read_timeout(Some(ms(2000))).unwrap();
        if let Err(e) = closed_by_peer(c, 32 << 20) {
            panic!("connection {i}: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 8. Idle partitions on disk
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn partitions_holding_one_small_record_take_little_disk() {
    let s = Server::start(1, &[]);
    s.create_topic("idle", "partitions=256");
    for p in 0..256u64 {
        assert_eq!(s.produce("idle", &format!("&partition={p}"), b"x"), (p, 0));
    }
    for p in 0..256u64 {
        let seg = s.partition_dir("idle", p).join(SEGMENT0);
        let meta = std::fs::metadata(&seg).unwrap();
        assert!(
            meta.len().saturating_sub(33) <= 64 << 10,
            "partition {p}: segment is {} bytes for one 33-byte frame",
            meta.len()
        );
        assert!(
            meta.blocks() * 512 <= (64 << 10) + (4 << 10),
            "partition {p}: segment allocates {} bytes for one 33-byte frame",
            meta.blocks() * 512
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 9. extend without visibility
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn extend_without_visibility_keeps_the_leases_own_visibility() {
    let _g = common::serial();
    let s = Server::start(1, &[]);
    s.create_topic("ext", "visibility=2s");
    s.produce("ext", "", b"long");
    let (_, _, h, _) = consume(&s.client, "ext", "&visibility=10s").expect("a lease");
    assert_eq!(settle(&s.client, "extend", "ext", &h, ""), 200);
    thread::sleep(ms(3500));
    let again = consume(&s.client, "ext", "");
    assert!(
        again.is_none(),
        "a 10 s lease extended without a visibility was redelivered after 3.5 s: {again:?}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 10. 204 headers
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn a_204_carries_no_content_length() {
    let s = Server::start(1, &[]);
    s.create_topic("empty", "");
    for (what, request) in [
        (
            "consume of an empty topic",
            "GET /consume?topic=empty HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        ),
        (
            "delete",
            "DELETE /topics/empty HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        ),
    ] {
        let r = raw(s.port, request, what);
        assert_eq!(r.status, 204, "{what}");
        assert_eq!(
            r.header("content-length"),
            None,
            "{what}: a 204 with a Content-Length header"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 11. Host and Origin checks, auth failures
// ---------------------------------------------------------------------------------------------------------------

fn get_with(port: u16, headers: &str) -> Raw {
    raw(
        port,
        &format!("GET /topics HTTP/1.1\r\n{headers}\r\n"),
        headers,
    )
}

#[test]
fn without_a_token_only_loopback_hosts_and_origins_are_served() {
    let s = Server::start(1, &[]);
    let port = s.port;
    let r = get_with(port, "Host: evil.example\r\n");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (403, Some("host_not_allowed")),
        "Host: evil.example"
    );
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = get_with(port, &format!("Host: {host}\r\n"));
        assert_eq!(r.status, 200, "Host: {host}");
    }
    let r = raw(
        port,
        "GET /topics HTTP/1.0\r\n\r\n",
        "HTTP/1.0 without Host",
    );
    assert_eq!(r.status, 200, "HTTP/1.0 without Host");
    let r = get_with(
        port,
        &format!("Host: 127.0.0.1:{port}\r\nOrigin: http://evil.example\r\n"),
    );
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (403, Some("cross_origin_refused")),
        "Origin: http://evil.example"
    );
    let r = get_with(
        port,
        &format!("Host: 127.0.0.1:{port}\r\nOrigin: http://localhost:{port}\r\n"),
    );
    assert_eq!(r.status, 200, "Origin: http://localhost:{port}");
}

#[test]
fn allowed_hosts_admits_a_configured_host_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), "allowed_hosts = [\"broker.internal\"]\n");
    let s = Server::start(1, &["--config", &cfg]);
    let r = get_with(s.port, &format!("Host: broker.internal:{}\r\n", s.port));
    assert_eq!(r.status, 200, "Host: broker.internal");
    let r = get_with(s.port, "Host: evil.example\r\n");
    assert_eq!(r.status, 403, "Host: evil.example still refused");
}

#[test]
fn a_wrong_token_is_401_and_the_connection_is_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "0123456789abcdef-secret\n").unwrap();
    let s = Server::start(1, &["--auth-token-file", &token_file.display().to_string()]);
    let mut c = RawConn::open(s.port);
    c.send(
        format!(
            "GET /topics HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer wrong-token-0123456789\r\n\r\n",
            s.port
        )
        .as_bytes(),
    );
    let r = c.response("wrong token");
    assert_eq!(
        (r.status, r.error_code().is_some()),
        (401, true),
        "wrong token"
    );
    c.assert_closed("after a 401");
}

// ---------------------------------------------------------------------------------------------------------------
// 12. File modes
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn data_files_and_directories_are_owner_only() {
    let mut s = Server::start(1, &[]);
    s.create_topic("priv", "");
    s.produce("priv", "", b"secret");
    let (_, _, h, _) = consume(&s.client, "priv", "").expect("a message");
    assert_eq!(settle(&s.client, "ack", "priv", &h, ""), 200);
    wait_durable(&s, "priv", 1, ms(5000));
    // A clean stop writes the frontier file (with a journal, files are written at checkpoints and stops).
    assert_eq!(s.terminate(), Some(0));
    assert_eq!(read_frontier(&s.partition_dir("priv", 0)), Some(1));
    let loose: Vec<String> = walk(&s.data_dir)
        .iter()
        .skip(1)
        .filter_map(|p| {
            let mode = std::fs::symlink_metadata(p).ok()?.permissions().mode();
            (mode & 0o077 != 0).then(|| format!("{:o} {}", mode & 0o7777, p.display()))
        })
        .collect();
    assert!(
        loose.is_empty(),
        "group/other can access:\n{}",
        loose.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 13. A run of corrupt records
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn a_run_of_corrupt_records_is_skipped_at_once_with_one_log_line_per_run() {
    let _g = common::serial();
    let mut s = Server::start(1, &[]);
    s.create_topic("run", "");
    for i in 0..300u64 {
        assert_eq!(s.produce("run", "", format!("body-{i}").as_bytes()), (0, i));
    }
    s.kill9();
    s.drop_journal();
    let seg = s.partition_dir("run", 0).join(SEGMENT0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let f = frames(&bytes);
    assert_eq!(f.len(), 300);
    let from = f[50].0;
    let to = f[249].0 + 32 + f[249].1;
    bytes[from..to].fill(0xAA);
    std::fs::write(&seg, &bytes).unwrap();
    let log_before = s.log_text().lines().count();
    s.restart();

    let seen = drain(&s, "run", 300);
    let want: BTreeMap<(u64, u64), Vec<u8>> = (0..50u64)
        .chain(250..300)
        .map(|i| ((0, i), format!("body-{i}").into_bytes()))
        .collect();
    assert_eq!(seen, want, "exactly offsets 0..50 and 250..300");
    assert_eq!(field(&s, "run", 0, "corrupt_skipped"), 200);
    let log = s.log_text();
    let corrupt_lines = log
        .lines()
        .skip(log_before)
        .filter(|l| l.to_lowercase().contains("corrupt"))
        .count();
    assert!(
        corrupt_lines <= 4,
        "{corrupt_lines} log lines about corrupt records for one run of 200"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 14. Delete and recreate against the frontier flush
// ---------------------------------------------------------------------------------------------------------------

/// Sends every request (`METHOD path`, no body) pipelined in one write on one connection; returns the answers.
fn pipelined(port: u16, requests: &[String]) -> Vec<Raw> {
    let mut c = RawConn::open(port);
    let bytes: String = requests
        .iter()
        .map(|r| format!("{r} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"))
        .collect();
    c.send(bytes.as_bytes());
    requests.iter().map(|r| c.response(r)).collect()
}

/// Leases every deliverable message of `topic` (pipelined consumes until a 204); returns (partition, handle) pairs.
fn lease_all(port: u16, topic: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for _ in 0..100 {
        let answers = pipelined(port, &vec![format!("GET /consume?topic={topic}"); 500]);
        let mut empty = false;
        for a in answers {
            match a.status {
                200 => out.push((
                    a.header("partition").unwrap().parse().unwrap(),
                    a.header("receipt-handle").unwrap().to_string(),
                )),
                204 => empty = true,
                s => panic!("consume on {topic} answered {s}: {:?}", a.error_code()),
            }
        }
        if empty {
            return out;
        }
    }
    panic!("runaway delivery on {topic}");
}

/// One empty message to every partition `0..n` of `topic` (pipelined); asserts each lands at `offset` if given.
fn produce_each(port: u16, topic: &str, n: u64, offset: Option<u64>) {
    let requests: Vec<String> = (0..n)
        .map(|p| format!("POST /produce?topic={topic}&partition={p}"))
        .collect();
    for (r, a) in requests.iter().zip(pipelined(port, &requests)) {
        assert_eq!(a.status, 200, "{r}: {:?}", a.error_code());
        if let Some(o) = offset {
            let j: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
            assert_eq!(j["offset"].as_u64(), Some(o), "{r}");
        }
    }
}

/// Each partition's `consumer.offset` as (inode, decoded value), None when missing: a frontier write shows as a new
/// inode (temp file + rename) and a new value.
fn frontier_files(s: &Server, topic: &str, n: u64) -> Vec<Option<(u64, Option<u64>)>> {
    (0..n)
        .map(|p| {
            let path = s.partition_dir(topic, p).join("consumer.offset");
            let ino = std::fs::metadata(&path).ok()?.ino();
            Some((ino, read_frontier(&s.partition_dir(topic, p))))
        })
        .collect()
}

#[test]
fn a_deleted_then_recreated_topic_never_gets_the_old_topics_frontier() {
    let _g = common::serial();
    // The race: a frontier flush pass that started before the delete still holds the old partitions and writes
    // their frontiers by path, into the recreated topic's directories. To make it likely, a helper topic `h` with
    // 400 moved frontiers keeps the flush pass busy while `t` is deleted and recreated; a round is "aimed" when the
    // pass is seen flushing `h` before `t` (the pass order is the server's map order, random per process: an
    // unaimed round is still a valid round, and the kill -9 + restart between rounds reshuffles it).
    const N: u64 = 200;
    const H: u64 = 400;
    let mut s = Server::start(1, &["--fsync", "never"]);
    s.create_topic("t", &format!("partitions={N}"));
    s.create_topic("h", &format!("partitions={H}"));
    produce_each(s.port, "t", N, Some(0));
    let (mut rounds, mut aimed) = (0, 0);
    while aimed < 2 && rounds < 6 {
        rounds += 1;
        produce_each(s.port, "h", H, None);
        let h_leases = lease_all(s.port, "h");
        let t_leases = lease_all(s.port, "t");
        let t_partitions: BTreeSet<u64> = t_leases.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            t_partitions.len(),
            N as usize,
            "round {rounds}: partitions of t without their message: {:?}",
            (0..N)
                .filter(|p| !t_partitions.contains(p))
                .collect::<Vec<_>>()
        );
        let (h_before, t_before) = (frontier_files(&s, "h", H), frontier_files(&s, "t", N));
        let acks: Vec<String> = h_leases
            .iter()
            .map(|(_, handle)| format!("POST /ack?topic=h&receipt_handle={handle}"))
            .chain(
                t_leases
                    .iter()
                    .map(|(_, handle)| format!("POST /ack?topic=t&receipt_handle={handle}")),
            )
            .collect();
        for (r, a) in acks.iter().zip(pipelined(s.port, &acks)) {
            assert_eq!(a.status, 200, "{r}: {:?}", a.error_code());
        }
        // The next flush pass starts within ~100 ms: delete and recreate as soon as it is seen.
        let start = Instant::now();
        let h_first = loop {
            let h_moved = frontier_files(&s, "h", H) != h_before;
            let t_moved = frontier_files(&s, "t", N) != t_before;
            if h_moved || t_moved {
                break h_moved && !t_moved;
            }
            assert!(
                start.elapsed() < ms(3000),
                "round {rounds}: no frontier flushed 3 s after {} acks",
                acks.len()
            );
        };
        assert_eq!(s.delete("/topics/t").status, 204);
        s.create_topic("t", &format!("partitions={N}"));
        produce_each(s.port, "t", N, Some(0));
        thread::sleep(ms(500));
        s.kill9();
        for p in 0..N {
            let v = read_frontier(&s.partition_dir("t", p));
            assert!(
                v.unwrap_or(0) == 0,
                "round {rounds} (flush pass seen on h first: {h_first}): the recreated t/{p} has the old \
                 topic's frontier {v:?} on disk, so its message at offset 0 is lost"
            );
        }
        s.restart();
        aimed += usize::from(h_first);
    }
    let t_partitions: BTreeSet<u64> = lease_all(s.port, "t").iter().map(|(p, _)| *p).collect();
    assert_eq!(
        t_partitions.len(),
        N as usize,
        "after the last restart, partitions of t without their message: {:?}",
        (0..N)
            .filter(|p| !t_partitions.contains(p))
            .collect::<Vec<_>>()
    );
}
