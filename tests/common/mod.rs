//! Test harness: starts the real `berth` binary on a free port with a temp data dir, and a few helpers around the
//! HTTP client. Shared by every end-to-end test file (`mod common;`). The cluster harness (etcd, N nodes, network
//! namespaces) is `common::cluster`.
#![allow(dead_code)]

pub mod cluster;
pub mod etcd;
pub mod readme;

use berth::client::{Answer, Client};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Serialises timing-sensitive tests within one test binary (two cores run the whole suite).
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running berth server.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub data_dir: PathBuf,
    pub args: Vec<String>,
    pub client: Client,
    _tmp: Option<tempfile::TempDir>,
    log: PathBuf,
}

/// A port nothing listens on, never handed out twice by this test binary: tests run in parallel, the kernel may
/// offer a port it just offered another test, and berth binds with SO_REUSEPORT, so two servers of two tests could
/// share one port and answer each other's clients.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind :0");
        let port = l.local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Waits (bounded by `limit`) until `GET /health` through `client` answers 200. If the process exits first, or the
/// time runs out, panics naming `what` with the last lines of its log.
pub fn await_healthy(
    client: &Client,
    child: &mut Option<Child>,
    limit: Duration,
    what: &str,
    log: &Path,
) {
    let log_tail = || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(200)..].join("\n")
    };
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(a) = client.call("GET", "/health", &[]) {
            if a.status == 200 {
                return;
            }
        }
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            *child = None;
            panic!(
                "{what} exited during start ({status}); log {}:\n{}",
                log.display(),
                log_tail()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{what} not healthy after {limit:?}; log {}:\n{}",
            log.display(),
            log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    /// Starts a server with `cores` cores on a new temp data dir; `extra` are more `serve` flags.
    pub fn start(cores: usize, extra: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data_dir = tmp.path().join("data");
        let mut s = Server::start_in(&data_dir, cores, extra);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a server on an existing data dir.
    pub fn start_in(data_dir: &Path, cores: usize, extra: &[&str]) -> Server {
        Server::start_in_with(data_dir, cores, extra, None)
    }

    /// Starts a server whose listener speaks HTTPS (`extra` holds its --tls-* flags), on a new temp data dir; its
    /// client trusts only the CA in `ca`.
    pub fn start_https(cores: usize, extra: &[&str], ca: &Path) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data_dir = tmp.path().join("data");
        let mut s = Server::start_in_with(&data_dir, cores, extra, Some(ca));
        s._tmp = Some(tmp);
        s
    }

    fn start_in_with(data_dir: &Path, cores: usize, extra: &[&str], ca: Option<&Path>) -> Server {
        let port = free_port();
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--cores".into(),
            cores.to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = data_dir.with_extension(format!("{port}.log"));
        let mut s = Server {
            child: None,
            port,
            data_dir: data_dir.to_path_buf(),
            args,
            client: match ca {
                None => Client::new(&format!("http://127.0.0.1:{port}")),
                Some(ca) => Client::new(&format!("https://127.0.0.1:{port}"))
                    .with_ca_file(ca)
                    .expect("the test CA loads"),
            },
            _tmp: None,
            log,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(self.data_dir.parent().unwrap()).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        // `BERTH_TEST_BIN` runs another build's server under the same test (a before/after measurement).
        let bin = std::env::var_os("BERTH_TEST_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_berth").into());
        let child = Command::new(bin)
            .args(&self.args)
            .env("BERTH_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn berth");
        self.child = Some(child);
        self.wait_healthy();
    }

    /// Waits (bounded) until /health answers 200.
    pub fn wait_healthy(&mut self) {
        await_healthy(
            &self.client,
            &mut self.child,
            Duration::from_secs(20),
            "berth",
            &self.log,
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("berth did not exit after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// kill -9, then the same server again on the same data dir and port (after the port is free again: a killed
    /// server's sockets outlive the reaped process by a few ms while io_uring tears down).
    pub fn restart(&mut self) {
        self.kill9();
        wait_port_free(self.port);
        self.spawn();
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn get(&self, path: &str) -> Answer {
        self.client.call("GET", path, &[]).expect("GET")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> Answer {
        self.client.call("POST", path, body).expect("POST")
    }

    pub fn put(&self, path: &str) -> Answer {
        self.client.call("PUT", path, &[]).expect("PUT")
    }

    pub fn delete(&self, path: &str) -> Answer {
        self.client.call("DELETE", path, &[]).expect("DELETE")
    }

    /// Creates a topic, asserting 201.
    pub fn create_topic(&self, name: &str, query: &str) {
        let a = self.put(&format!("/topics/{name}?{query}"));
        assert_eq!(a.status, 201, "create {name}: {}", a.text());
    }

    /// Produces, asserting 200; returns (partition, offset).
    pub fn produce(&self, topic: &str, extra: &str, body: &[u8]) -> (u64, u64) {
        let a = self.post(&format!("/produce?topic={topic}{extra}"), body);
        assert_eq!(a.status, 200, "produce: {}", a.text());
        let j = a.json();
        (
            j["partition"].as_u64().unwrap(),
            j["offset"].as_u64().unwrap(),
        )
    }

    /// The topic's partitions from GET /topics/{topic}.
    pub fn partitions(&self, topic: &str) -> Vec<serde_json::Value> {
        let a = self.get(&format!("/topics/{topic}"));
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["partitions"].as_array().unwrap().clone()
    }

    /// The data directory of one partition.
    /// Leaves a stopped server's data as a checkpoint would have: its segments hold every frame its journal held,
    /// its frontier files every frontier it recorded, and there is no journal. So damage a test then makes to a segment is damage the journal cannot repair (bit
    /// rot at rest). The server is started once (its start replays the journal into the segments, frames that were
    /// still behind included, and removes it) and killed again before the journal files are removed.
    pub fn drop_journal(&mut self) {
        assert!(self.child.is_none(), "drop_journal needs a stopped server");
        wait_port_free(self.port);
        self.spawn();
        self.kill9();
        let dir = self.data_dir.join("journal");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries {
                std::fs::remove_file(e.unwrap().path()).unwrap();
            }
        }
    }

    pub fn partition_dir(&self, topic: &str, partition: u64) -> PathBuf {
        self.data_dir
            .join("topics")
            .join(topic)
            .join(partition.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits (bounded) until `port` can be bound again.
pub fn wait_port_free(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "port {port} still bound 5 s after the server exited"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Asserts an error answer: exact status, exact `error` code, and a non-empty human `message`.
pub fn assert_error(a: &Answer, status: u16, code: &str) {
    let j = a.json();
    assert_eq!(
        (a.status, j["error"].as_str()),
        (status, Some(code)),
        "body: {}",
        a.text()
    );
    assert!(
        j["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error without a message: {}",
        a.text()
    );
}

/// Runs `berth ARGS` expecting it to exit by itself (bounded: 15 s); returns its exit code and stderr.
pub fn run_until_exit<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn berth");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("berth did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code(), stderr)
}

/// `consumer.offset` as docs/format.md writes it down (12 bytes: u64 LE + CRC-32C LE of those 8 bytes), coded
/// independently of the server so the tests check the format, not the server against itself.
pub fn encode_frontier(value: u64) -> Vec<u8> {
    let mut out = value.to_le_bytes().to_vec();
    out.extend_from_slice(&crc32c::crc32c(&value.to_le_bytes()).to_le_bytes());
    out
}

/// Decodes a `consumer.offset` file's bytes; None when the length or the check is wrong.
pub fn decode_frontier(bytes: &[u8]) -> Option<u64> {
    decode_frontier_ranges(bytes).map(|(committed, _)| committed)
}

/// A frontier file's committed frontier and acked-ahead ranges (docs/format.md, "consumer.offset": 12 bytes
/// without ranges, `16 + 16 × count` with them, the CRC-32C of the rest last); None if it does not decode.
pub fn decode_frontier_ranges(bytes: &[u8]) -> Option<(u64, Vec<(u64, u64)>)> {
    let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let u64_at = |i: usize| Some(u64::from_le_bytes(body.get(i..i + 8)?.try_into().ok()?));
    let committed = u64_at(0)?;
    if body.len() == 8 {
        return Some((committed, Vec::new()));
    }
    let count = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?) as usize;
    if count == 0 || body.len() != 12 + 16 * count {
        return None;
    }
    let ranges = (0..count)
        .map(|i| Some((u64_at(12 + 16 * i)?, u64_at(20 + 16 * i)?)))
        .collect::<Option<Vec<_>>>()?;
    Some((committed, ranges))
}

/// Whether the server whose data directory is `data_dir` holds durably that group `group` of partition `p` of
/// `topic` stands at `committed` with `ranges` acked above it: as a frontier record of its journal (kind 3,
/// docs/format.md "Journal": the partition, the frontier, the kind, the names, then the ranges) or in its frontier
/// file.
pub fn holds_acked(
    data_dir: &std::path::Path,
    topic: &str,
    p: u64,
    group: &str,
    committed: u64,
    ranges: &[(u64, u64)],
) -> bool {
    let name = if group == "default" {
        "consumer.offset".to_string()
    } else {
        format!("consumer.{group}.offset")
    };
    let file = data_dir
        .join("topics")
        .join(topic)
        .join(p.to_string())
        .join(name);
    if std::fs::read(file)
        .ok()
        .and_then(|b| decode_frontier_ranges(&b))
        .is_some_and(|(c, acked)| c == committed && acked == ranges)
    {
        return true;
    }
    let mut record = (p as u32).to_le_bytes().to_vec();
    record.extend_from_slice(&committed.to_le_bytes());
    record.push(3);
    record.extend_from_slice(&(topic.len() as u16).to_le_bytes());
    record.extend_from_slice(&(group.len() as u16).to_le_bytes());
    record.extend_from_slice(topic.as_bytes());
    record.extend_from_slice(group.as_bytes());
    record.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for &(s, e) in ranges {
        record.extend_from_slice(&s.to_le_bytes());
        record.extend_from_slice(&e.to_le_bytes());
    }
    std::fs::read_dir(data_dir.join("journal"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|f| std::fs::read(f.path()).ok())
        .any(|bytes| bytes.windows(record.len()).any(|w| w == record))
}

/// A delivered message: (partition, offset, receipt handle, body).
pub type Delivered = (u64, u64, String, Vec<u8>);

/// One queue-style consume; None on 204.
pub fn consume(client: &Client, topic: &str, extra: &str) -> Option<Delivered> {
    let a = client
        .call("GET", &format!("/consume?topic={topic}{extra}"), &[])
        .expect("consume");
    match a.status {
        204 => None,
        200 => Some((
            a.header("partition").unwrap().parse().unwrap(),
            a.header("offset").unwrap().parse().unwrap(),
            a.header("receipt-handle").unwrap().to_string(),
            a.body.clone(),
        )),
        s => panic!("consume answered {s}: {}", a.text()),
    }
}

/// Settles a handle; returns the status.
pub fn settle(client: &Client, op: &str, topic: &str, handle: &str, extra: &str) -> u16 {
    client
        .call(
            "POST",
            &format!("/{op}?topic={topic}&receipt_handle={handle}{extra}"),
            &[],
        )
        .expect("settle")
        .status
}
