//! Storage faults on the real binary: a full disk (a small tmpfs), a write failing with EIO and an fdatasync failing
//! with EIO (strace's syscall fault injection). An fdatasync is injectable when the server syncs with the system call
//! (`sync_via` `inline` or `thread`); with `io_uring` the sync is an io_uring operation, which strace does not see.
//! Every kind of failure, and power cuts, are covered on the simulated disk too (`src/storage/fault_tests.rs` for a
//! log without a journal, `src/storage/journal_fault_tests.rs` for the journal path).

mod common;

use common::Server;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs mounted for one test, unmounted on drop.
struct Tmpfs {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let tmp = tempfile::tempdir().ok()?;
        let dir = tmp.path().join("mnt");
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then_some(Tmpfs { dir, _tmp: tmp })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

fn fill(path: &Path, bytes: usize) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut written = 0;
    while written < bytes {
        match f.write(&chunk[..chunk.len().min(bytes - written)]) {
            Ok(n) if n > 0 => written += n,
            _ => break,
        }
    }
    let _ = f.sync_all();
}

#[test]
fn a_full_disk_answers_507_quickly_keeps_consume_working_and_recovers_without_restart() {
    let Some(fs) = Tmpfs::mount("8m") else {
        panic!("cannot mount a tmpfs (this test needs root, as CI has)");
    };
    let server = Server::start_in(&fs.dir.join("data"), 1, &[]);
    server.create_topic("full", "");
    // Leave little room: a ballast file takes most of the space.
    let ballast = fs.dir.join("ballast");
    fill(&ballast, 5 << 20);
    let body = vec![b'f'; 16 << 10];
    let mut produced = 0u64;
    let mut first_refusal = None;
    for _ in 0..1000 {
        let started = Instant::now();
        let a = server.post("/produce?topic=full", &body);
        match a.status {
            200 => {
                assert_eq!(
                    a.json()["offset"].as_u64(),
                    Some(produced),
                    "offsets stay contiguous"
                );
                produced += 1;
            }
            507 => {
                assert_eq!(a.json()["error"], "insufficient_storage");
                assert!(
                    started.elapsed() < Duration::from_secs(1),
                    "507 took {:?}",
                    started.elapsed()
                );
                first_refusal = Some(produced);
                break;
            }
            s => panic!("produce on a full disk answered {s}: {}", a.text()),
        }
    }
    assert!(first_refusal.is_some(), "the disk never filled");
    assert!(produced > 0, "nothing fit before the disk filled");
    // Another refused produce changes nothing.
    assert_eq!(server.post("/produce?topic=full", &body).status, 507);
    // Consume and ack keep working on a full disk.
    let (p, o, handle, got) = common::consume(&server.client, "full", "").expect("a message");
    assert_eq!((p, o), (0, 0));
    assert_eq!(got, body);
    assert_eq!(
        common::settle(&server.client, "ack", "full", &handle, ""),
        200
    );
    // Space returns: produce works again without a restart and continues at the next offset.
    std::fs::remove_file(&ballast).unwrap();
    let a = server.post("/produce?topic=full", b"after");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["offset"].as_u64(), Some(produced));
    let replay = server.get(&format!(
        "/consume?topic=full&partition=0&offset={produced}"
    ));
    assert_eq!(replay.body, b"after");
}

fn strace() -> Option<PathBuf> {
    let out = Command::new("which").arg("strace").output().ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The second produce's segment write fails (each batch is written to its segment at once:
/// `write_behind_bytes = 0`).
#[test]
fn a_write_failing_with_eio_answers_500_never_200_and_leaves_no_hole() {
    // pwrite64 calls: 1 = the journal's zeros at start, then per batch its frames to the segment and the journal
    // entry (the zeros are 1 MiB ahead: no more before the second batch). Call 4 = the second batch's segment write.
    eio_on_pwrite(4, "write_behind_bytes = 0\n");
}

/// The second produce's journal write fails: the journal zeroes what it may have written and refuses the pass; the
/// log takes the batch back from its write-behind buffer; the next produce takes the same offset.
#[test]
fn a_journal_write_failing_with_eio_answers_500_never_200_and_leaves_no_hole() {
    // With the default write-behind, a batch's only pwrite64 is its journal entry (its frames wait behind): call 1
    // = the journal's zeros at start, call 2 = the first batch's entry, call 3 = the second's.
    eio_on_pwrite(3, "");
}

/// The traced server (strace and its child): both killed on drop, so a failing assertion never leaves them
/// running (they hold the test harness's output open, and it would wait for them).
struct Traced(std::process::Child);

impl Drop for Traced {
    fn drop(&mut self) {
        // Killing strace would leave the traced server running: kill the server first (strace's child), then strace.
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.0.id()))
            .unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: signalling a process this test started (through strace).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn eio_on_pwrite(when: u32, config: &str) {
    let Some(strace) = strace() else {
        panic!("strace is not installed (.ci/run installs it)");
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config_path = tmp.path().join("berth.toml");
    std::fs::write(&config_path, config).unwrap();
    // Segment and journal appends are the server's only pwrite64 calls (see the callers).
    let child = Command::new(strace)
        .args([
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=pwrite64",
            "-e",
            &format!("inject=pwrite64:error=EIO:when={when}"),
        ])
        .arg(env!("CARGO_BIN_EXE_berth"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--cores",
            "1",
            "--data-dir",
        ])
        .arg(&data)
        .arg("--config")
        .arg(&config_path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let traced = Traced(child);
    let client = berth::client::Client::new(&format!("http://127.0.0.1:{port}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.call("GET", "/health", &[]).map(|a| a.status) != Ok(200) {
        assert!(
            Instant::now() < deadline,
            "server under strace did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(client.call("PUT", "/topics/eio", &[]).unwrap().status, 201);
    let first = client.call("POST", "/produce?topic=eio", b"one").unwrap();
    assert_eq!(
        (first.status, first.json()["offset"].as_u64()),
        (200, Some(0))
    );
    let failed = client.call("POST", "/produce?topic=eio", b"two").unwrap();
    assert_eq!(
        failed.status,
        500,
        "a failed write must not be acknowledged: {}",
        failed.text()
    );
    assert_eq!(failed.json()["error"], "storage_error");
    let third = client.call("POST", "/produce?topic=eio", b"three").unwrap();
    assert_eq!(
        (third.status, third.json()["offset"].as_u64()),
        (200, Some(1)),
        "no hole after a failed write"
    );
    let replay = client
        .call("GET", "/consume?topic=eio&partition=0&offset=1", &[])
        .unwrap();
    assert_eq!(replay.body, b"three");
    drop(traced);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the traced server did not go away"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // After a restart without faults the log holds exactly the two acknowledged records.
    let server = Server::start_in(&data, 1, &[]);
    assert_eq!(server.partitions("eio")[0]["end_offset"], 2);
}

/// The journal's fdatasync fails under `sync_via = "inline"`: the core itself calls fdatasync, so strace counts its
/// calls in order: 1 = the journal file's at start (a fresh data dir: no replay; topic creation uses syncfs), then one
/// per produce (its journal pass). Call 3 = the second produce's.
#[test]
fn a_failed_fdatasync_with_inline_syncs_answers_500_never_200_and_refuses_until_restart() {
    eio_on_fdatasync("inline", "3", Some(1));
}

/// The same with `sync_via = "thread"`: fdatasync runs on a thread of the core's blocking pool (two threads), and
/// strace counts calls per thread, so which produce meets the failure depends on the thread that runs it: the
/// injection fails each thread's second fdatasync (a thread's first may be the journal's at start), and the test takes
/// the first produce not answered 200 as the one that met it. With `sync_via = "io_uring"` the sync is an
/// IORING_OP_FSYNC submitted through io_uring_enter, which strace cannot fail: that path is covered on the simulated
/// disk only (`journal_fault_tests`).
#[test]
fn a_failed_fdatasync_with_thread_syncs_answers_500_never_200_and_refuses_until_restart() {
    eio_on_fdatasync("thread", "2", None);
}

/// Starts the server under strace with `sync_via` and `inject=fdatasync:error=EIO:when=WHEN`, produces to the two
/// partitions of one topic (one core: one journal) until a produce is not answered 200 (`failing`: the index of the
/// produce that must meet the failure, when it is known). That produce must be a 500; every produce after it, on
/// either partition, is refused (503: the journal does not retry a failed fdatasync into a false success) while reads
/// go on; after kill -9 and a restart without strace, every produce answered 200 is there, and produces work again.
fn eio_on_fdatasync(sync_via: &str, when: &str, failing: Option<usize>) {
    let Some(strace) = strace() else {
        panic!("strace is not installed (.ci/run installs it)");
    };
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = common::free_port();
    let config_path = tmp.path().join("berth.toml");
    std::fs::write(
        &config_path,
        format!("sync_via = \"{sync_via}\"\nfsync = \"always\"\n"),
    )
    .unwrap();
    // The trace shows whether the injected failure was met ("(INJECTED)"), to tell a swallowed failure apart.
    let trace = tmp.path().join("strace.out");
    let child = Command::new(strace)
        .args(["-f", "-qq", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=fdatasync",
            "-e",
            &format!("inject=fdatasync:error=EIO:when={when}"),
        ])
        .arg(env!("CARGO_BIN_EXE_berth"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--cores",
            "1",
            "--data-dir",
        ])
        .arg(&data)
        .arg("--config")
        .arg(&config_path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let traced = Traced(child);
    let client = berth::client::Client::new(&format!("http://127.0.0.1:{port}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.call("GET", "/health", &[]).map(|a| a.status) != Ok(200) {
        assert!(
            Instant::now() < deadline,
            "server under strace did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        client
            .call("PUT", "/topics/fsync?partitions=2", &[])
            .unwrap()
            .status,
        201
    );
    let produce = |i: usize| {
        let partition = i % 2;
        let body = format!("m{i}");
        let a = client
            .call(
                "POST",
                &format!("/produce?topic=fsync&partition={partition}"),
                body.as_bytes(),
            )
            .unwrap();
        (partition, body, a)
    };
    // Acknowledged produces: (partition, offset, body).
    let mut acked: Vec<(usize, u64, String)> = Vec::new();
    let mut failed_at = None;
    for i in 0..10 {
        let (partition, body, a) = produce(i);
        if a.status == 200 {
            assert_eq!(a.json()["partition"].as_u64(), Some(partition as u64));
            let offset = a.json()["offset"].as_u64().unwrap();
            let expected = acked.iter().filter(|(p, _, _)| *p == partition).count() as u64;
            assert_eq!(offset, expected, "offsets stay contiguous");
            acked.push((partition, offset, body));
            continue;
        }
        assert_ne!(
            a.status,
            503,
            "the journal was poisoned, yet no produce was refused before: the one whose fdatasync failed was answered \
             200 (acknowledged: {acked:?}): {}",
            a.text()
        );
        assert_eq!(
            a.status,
            500,
            "the produce whose journal fdatasync failed must be a 500: {}",
            a.text()
        );
        assert_eq!(a.json()["error"], "storage_error", "{}", a.text());
        failed_at = Some(i);
        break;
    }
    let injected_now = || {
        std::fs::read_to_string(&trace)
            .unwrap_or_default()
            .matches("(INJECTED)")
            .count()
    };
    // strace writes its lines as the calls return; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    while injected_now() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let injected = injected_now();
    let failed_at = failed_at.unwrap_or_else(|| {
        panic!(
            "{injected} fdatasync calls failed, yet every produce was answered 200: a failed sync was acknowledged"
        )
    });
    assert_eq!(injected, 1, "fdatasync failures injected");
    if let Some(failing) = failing {
        assert_eq!(failed_at, failing, "the failure met another produce");
    }
    // Nothing more is acknowledged on this core until a restart, on either partition, though the next fdatasync
    // would succeed: the pages the failed one should have written may be gone.
    for i in failed_at + 1..failed_at + 5 {
        let (partition, _, a) = produce(i);
        assert_eq!(
            a.status,
            503,
            "a produce to partition {partition} after the failed fdatasync: {}",
            a.text()
        );
        assert_eq!(a.json()["error"], "log_unavailable", "{}", a.text());
    }
    // Reads go on.
    for (partition, offset, body) in &acked {
        let got = client
            .call(
                "GET",
                &format!("/consume?topic=fsync&partition={partition}&offset={offset}"),
                &[],
            )
            .unwrap();
        assert_eq!(got.status, 200, "{}", got.text());
        assert_eq!(got.body, body.as_bytes());
    }
    drop(traced);
    common::wait_port_free(port);
    // After kill -9 and a restart without faults (its replay runs the journal), every acknowledged produce is there.
    // The refused one may be there too (it was written, and only its sync failed): it was never acknowledged.
    let server = common::Server::start_in(&data, 1, &[]);
    for (partition, offset, body) in &acked {
        let got = server.get(&format!(
            "/consume?topic=fsync&partition={partition}&offset={offset}"
        ));
        assert_eq!(
            (got.status, got.body.as_slice()),
            (200, body.as_bytes()),
            "acknowledged partition {partition} offset {offset} after the restart: {}",
            got.text()
        );
    }
    let parts = server.partitions("fsync");
    for (partition, part) in parts.iter().enumerate() {
        let acknowledged = acked.iter().filter(|(p, _, _)| *p == partition).count() as u64;
        let end = part["end_offset"].as_u64().unwrap();
        assert!(
            end == acknowledged || (end == acknowledged + 1 && partition == failed_at % 2),
            "partition {partition} ends at {end} after {acknowledged} acknowledged produces"
        );
    }
    // Produces work again after the restart.
    let (p, o) = server.produce("fsync", "&partition=0", b"after");
    assert_eq!(p, 0);
    let got = server.get(&format!("/consume?topic=fsync&partition=0&offset={o}"));
    assert_eq!(got.body, b"after");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_frontier_beyond_the_log_moves_its_end_up_and_a_damaged_one_reads_as_zero() {
    let mut server = Server::start(1, &[]);
    server.create_topic("front", "partitions=2");
    for p in 0..2 {
        for i in 0..10 {
            server.produce(
                "front",
                &format!("&partition={p}"),
                format!("m{i}").as_bytes(),
            );
        }
    }
    server.kill9();
    // Partition 0: a frontier far beyond the log end (10). Partition 1: a frontier with a flipped bit.
    let mut damaged = common::encode_frontier(4);
    damaged[0] ^= 0x10;
    std::fs::write(
        server.partition_dir("front", 0).join("consumer.offset"),
        common::encode_frontier(1_000_000),
    )
    .unwrap();
    std::fs::write(
        server.partition_dir("front", 1).join("consumer.offset"),
        damaged,
    )
    .unwrap();
    server.restart();
    let parts = server.partitions("front");
    // The durable frontier proves offsets below it existed: the log continues there (never reusing an offset a
    // consumer may have settled), and the missing ones count as corrupt-skipped.
    assert_eq!(parts[0]["committed"], 1_000_000, "{}", parts[0]);
    assert_eq!(parts[0]["end_offset"], 1_000_000, "{}", parts[0]);
    assert_eq!(parts[0]["corrupt_skipped"], 1_000_000 - 10, "{}", parts[0]);
    assert_eq!(
        parts[1]["committed"], 0,
        "a damaged frontier reads as 0: everything redelivers"
    );
    let log = server.log_text();
    assert!(
        log.contains("beyond the recovered log end"),
        "no loud log line for the lost offsets:\n{log}"
    );
    assert!(
        log.contains("fails its check"),
        "no loud log line for the damaged file:\n{log}"
    );
    // Partition 1 redelivers all ten; partition 0 nothing, and new records there are delivered normally.
    let mut seen = Vec::new();
    while let Some((p, o, handle, _)) = common::consume(&server.client, "front", "") {
        seen.push((p, o));
        assert_eq!(
            common::settle(&server.client, "ack", "front", &handle, ""),
            200
        );
    }
    assert_eq!(seen, (0..10).map(|o| (1, o)).collect::<Vec<_>>());
    server.produce("front", "&partition=0", b"new");
    let (p, o, _, body) = common::consume(&server.client, "front", "").expect("the new record");
    assert_eq!((p, o, body.as_slice()), (0, 1_000_000, &b"new"[..]));
}
