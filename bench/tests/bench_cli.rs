//! `berth-bench` (the load generator, `bench/`) end to end: a short run against its embedded server prints a row per client core and operation,
//! writes JSON, .hgrm files and an SVG, and the JSON agrees with the table; against two servers it reports each
//! node too.

use berth::client::{Answer, Client};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn berth_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_berth-bench"))
}

/// The `berth` binary beside berth-bench: the embedded server of the first test runs it, the second starts two.
/// `cargo test --release` at the root builds it before any test runs (the server crate's own integration tests need
/// it).
fn berth() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_berth-bench")).with_file_name("berth");
    assert!(
        path.is_file(),
        "{} is missing: cargo build --release (the workspace builds both)",
        path.display()
    );
    path
}

/// One test at a time: both start servers and measure.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `berth serve` on a free loopback port with a temp data directory, stopped when dropped.
struct Server {
    child: Child,
    port: u16,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(cores: usize, extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::tempdir().expect("temp dir");
        let child = Command::new(berth())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--cores"])
            .arg(cores.to_string())
            .arg("--data-dir")
            .arg(dir.path())
            .args(extra)
            .env("BERTH_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn berth");
        let client = Client::new(&format!("http://127.0.0.1:{port}"));
        let mut server = Server {
            child,
            port,
            client,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.get("/health").status != 200 {
            assert!(
                server.child.try_wait().ok().flatten().is_none(),
                "berth exited during start"
            );
            assert!(Instant::now() < deadline, "berth not healthy after 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn get(&self, path: &str) -> Answer {
        self.client.call("GET", path, &[]).unwrap_or(Answer {
            status: 0,
            headers: Vec::new(),
            body: Vec::new(),
        })
    }

    fn create_topic(&self, name: &str, query: &str) {
        let a = self
            .client
            .call("PUT", &format!("/topics/{name}?{query}"), &[])
            .expect("PUT");
        assert_eq!(a.status, 201, "create {name}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_short_cycle_bench_writes_table_json_hgrm_and_svg_that_agree() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let hgrm = dir.path().join("hgrm");
    let svg = dir.path().join("plot.svg");
    let out = berth_bench()
        .args([
            "--workload",
            "cycle",
            "--connections",
            "4",
            "--duration",
            "2s",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--hgrm-dir")
        .arg(&hgrm)
        .arg("--svg")
        .arg(&svg)
        .output()
        .expect("run berth-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let clients = doc["clients"].as_object().unwrap();
    assert!(clients.contains_key("all"));
    let cores: Vec<&String> = clients.keys().filter(|k| k.as_str() != "all").collect();
    assert!(!cores.is_empty());
    for op in ["produce", "consume", "ack", "cycle"] {
        // Every row of the table is in the JSON with the same count and p99.
        for label in clients.keys() {
            let row = stdout
                .lines()
                .find(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 2 && f[0] == label.as_str() && f[1] == op
                })
                .unwrap_or_else(|| panic!("no table row for {label} {op}:\n{stdout}"));
            let f: Vec<&str> = row.split_whitespace().collect();
            let m = &clients[label][op];
            assert_eq!(
                f[2].parse::<u64>().unwrap(),
                m["count"].as_u64().unwrap(),
                "{label} {op} count"
            );
            assert_eq!(
                f[6].parse::<u64>().unwrap(),
                m["p99_us"].as_u64().unwrap(),
                "{label} {op} p99"
            );
            assert!(
                hgrm.join(format!("{label}-{op}.hgrm")).exists(),
                "{label}-{op}.hgrm"
            );
        }
        // Merged counts are the sum of the cores'.
        let sum: u64 = cores
            .iter()
            .map(|c| clients[c.as_str()][op]["count"].as_u64().unwrap())
            .sum();
        assert_eq!(
            sum,
            clients["all"][op]["count"].as_u64().unwrap(),
            "{op} merged count"
        );
    }
    assert!(clients["all"]["cycle"]["count"].as_u64().unwrap() > 0);
    assert_eq!(clients["all"]["cycle"]["errors"].as_u64().unwrap(), 0);
    let per_unit = doc["server_cpu_us_per_unit"].as_f64().unwrap();
    assert!(per_unit > 0.0);
    // The user/kernel split adds up to the total (each rounded down to a clock tick before the division).
    let user = doc["server_cpu_user_us_per_unit"].as_f64().unwrap();
    let kernel = doc["server_cpu_kernel_us_per_unit"].as_f64().unwrap();
    assert!(
        (user + kernel - per_unit).abs() < 1e-6 * per_unit.max(1.0),
        "{doc}"
    );
    assert!(
        stdout.contains(" µs per cycle (user "),
        "no user/kernel split in:\n{stdout}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("polyline"));
    assert!(
        stdout.contains("server core"),
        "server-side histograms missing:\n{stdout}"
    );
    // The per-stage breakdown: a table per server core, each row's count the JSON's (the embedded server syncs
    // its journal: fsync always).
    assert!(
        stdout.contains("stages µs (this run"),
        "no stage table:\n{stdout}"
    );
    for (row, key) in [
        ("queue", "server_stage_queue_us"),
        ("service", "server_latency_us"),
        ("journal queue", "server_stage_journal_queue_us"),
        ("journal write", "server_stage_journal_write_us"),
        ("journal sync", "server_stage_journal_sync_us"),
        ("reply", "server_stage_reply_us"),
        // The core's frontier flush alone runs every 50 ms through the 2 s.
        ("housekeeping", "server_stage_housekeeping_us"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{row} ")))
            .unwrap_or_else(|| panic!("no {row} row:\n{stdout}"));
        let count: u64 = line[2 + row.len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line}"));
        let json: u64 = doc[key]
            .as_object()
            .unwrap_or_else(|| panic!("no {key} in {doc}"))
            .values()
            .map(|c| c["count"].as_u64().unwrap())
            .sum();
        assert!(count > 0, "{line}");
        assert_eq!(count, json, "{row}: {line} / {key}");
    }
}

/// `--server URL1,URL2`: connections spread over two plain single-node servers (the topic made on both, named with
/// `--topic`); the JSON has a `nodes` section with both URLs, each with traffic, whose counts add up to the
/// merged ones; server CPU is the sum over `--server-pid P1,P2`, and is not measured without a pid per node.
#[test]
fn several_servers_get_per_node_results() {
    let _g = serial();
    let a = Server::start(1, &["--fsync", "never"]);
    let b = Server::start(1, &["--fsync", "never"]);
    for s in [&a, &b] {
        s.create_topic("spread", "partitions=2");
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let servers = format!("{},{}", a.url(), b.url());
    let pids = format!("{},{}", a.pid().unwrap(), b.pid().unwrap());
    let run = |workload: &str, extra: &[&str]| {
        let out = berth_bench()
            .args(["--server", &servers, "--topic", "spread"])
            .args(["--workload", workload, "--connections", "4"])
            .args(["--duration", "1500ms", "--json"])
            .arg(&json)
            .args(extra)
            .output()
            .expect("run berth-bench");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "bench failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        (stdout, doc)
    };

    let (stdout, doc) = run("cycle", &["--server-pid", &pids]);
    let nodes = doc["nodes"].as_object().expect("a nodes section");
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for op in ["produce", "consume", "ack", "cycle"] {
        let mut sum = 0;
        for url in [a.url(), b.url()] {
            let m = &nodes[&url][op];
            let count = m["count"].as_u64().unwrap_or(0);
            assert!(count > 0, "{url} {op}: {m}");
            assert_eq!(m["errors"].as_u64(), Some(0), "{url} {op}: {m}");
            sum += count;
            // The table has the node's row too.
            assert!(
                stdout.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 2 && f[0] == url && f[1] == op && f[2] == count.to_string()
                }),
                "no table row for {url} {op}:\n{stdout}"
            );
        }
        assert_eq!(
            sum,
            doc["clients"]["all"][op]["count"].as_u64().unwrap(),
            "{op}: nodes add up to all"
        );
    }
    assert_eq!(doc["servers"], serde_json::json!([a.url(), b.url()]));
    assert!(doc["server_cpu_us_per_unit"].as_f64().unwrap() > 0.0);
    // The topic was not ours: still there on both.
    assert_eq!(a.get("/topics/spread").status, 200);
    assert_eq!(b.get("/topics/spread").status, 200);

    let (stdout, doc) = run("produce", &[]);
    assert!(doc["server_cpu_us_total"].is_null(), "{doc}");
    assert!(
        doc["server_cpu_note"]
            .as_str()
            .is_some_and(|n| n.contains("not measured")),
        "{doc}"
    );
    assert!(
        stdout.contains("server CPU: not measured"),
        "no note:\n{stdout}"
    );
    for url in [a.url(), b.url()] {
        assert!(doc["nodes"][&url]["produce"]["count"].as_u64().unwrap() > 0);
    }
}

/// Against a server that requires a token, `--auth-token` (or `BERTH_AUTH_TOKEN`) is sent with the control requests
/// and every request of the load: the cycle runs with no errors. Without it the run stops at once, naming the 401.
#[test]
fn a_token_protected_server_is_loaded_with_auth_token() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "bench-token-0123456789\n").unwrap();
    let s = Server::start(
        1,
        &[
            "--fsync",
            "never",
            "--auth-token-file",
            token_file.to_str().unwrap(),
        ],
    );
    let json = dir.path().join("out.json");
    let out = berth_bench()
        .args(["--server", &s.url(), "--connections", "2"])
        .args(["--duration", "1s", "--json"])
        .arg(&json)
        .env("BERTH_AUTH_TOKEN", "bench-token-0123456789")
        .output()
        .expect("run berth-bench");
    assert!(
        out.status.success(),
        "bench failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // A server this run did not start: its CPUs are said to be external, not an empty list.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(" server_cpus=external "), "{stdout}");
    assert!(!stdout.contains("server_cpus=[]"), "{stdout}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for op in ["produce", "consume", "ack"] {
        let m = &doc["clients"]["all"][op];
        assert!(m["count"].as_u64().unwrap_or(0) > 0, "{op}: {m}");
        assert_eq!(m["errors"].as_u64(), Some(0), "{op}: {m}");
    }
    let out = berth_bench()
        .args(["--server", &s.url(), "--duration", "1s"])
        .env_remove("BERTH_AUTH_TOKEN")
        .output()
        .expect("run berth-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ran without the token: {stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    let out = berth_bench()
        .args(["--server", &s.url(), "--auth-token", "two words"])
        .output()
        .expect("run berth-bench");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
