//! Crash-loop test in the style of Jepsen's total-queue workload: producers and consumers run against a 2-core
//! server that is kill -9'd and restarted on the same data directory, round after round; afterwards everything
//! still deliverable is drained and the history is checked:
//!
//! * lost: an acknowledged produce (200) that was never delivered: must be 0;
//! * unexpected: a delivered body that was never sent (neither acknowledged nor indeterminate): must be 0;
//! * duplicates: bodies delivered more than once: reported, allowed (at-least-once);
//! * resurrected: a delivery, requested after crash k, of an offset below the durable frontier the server reported
//!   (`durable` in `GET /topics/T`) before crash k (or before any earlier crash) on that partition: must be 0;
//! * plus: acknowledged produces have distinct (partition, offset); a (partition, offset) always carries the same
//!   body; the durable frontier never moves backwards and lags contiguous acks by well under 500 ms, and after
//!   each restart `consumer.offset` on disk holds at least what was reported durable before the crash (the
//!   journal's replay writes it); an offset
//!   acked (200) is not handed out again by the same server instance; a handle issued before a crash, or acked
//!   well after its 1s lease, is never accepted; every answer is one the contract allows (also while a restarted
//!   server is still starting); after the drain every offset below each partition's end was delivered and is
//!   committed.
//!
//! `BERTH_CRASH_ROUNDS` sets the number of crashes (default 10); `BERTH_CRASH_SEED` fixes the RNG seed (printed).
mod common;

use berth::client::Client;
use common::{consume, settle, Server};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const TOPIC: &str = "crashloop";
const PARTITIONS: u64 = 4;
const PRODUCERS: usize = 2;
const CONSUMERS: usize = 3;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------------------------------------------
// A tiny deterministic RNG (xorshift64*), no dependency.
// ---------------------------------------------------------------------------------------------------------------

#[derive(Clone)]
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        // splitmix64 scramble so that nearby seeds give unrelated streams; never 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        XorShift(z | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// History records
// ---------------------------------------------------------------------------------------------------------------

/// One queue delivery. `epoch_lo`/`epoch_hi` are the number of completed crashes read just before sending the
/// consume and just after its answer: the instance that served it is one of `epoch_lo..=epoch_hi` (instance `e`
/// is the one started after crash `e`; it only starts once the epoch counter reads `e`).
#[derive(Clone, Debug)]
struct Delivery {
    body: String,
    partition: u64,
    offset: u64,
    epoch_lo: u64,
    epoch_hi: u64,
    sent: Instant,
}

/// An ack that got 200.
#[derive(Clone, Debug)]
struct Ack {
    partition: u64,
    offset: u64,
    epoch_lo: u64,
    epoch_hi: u64,
    done: Instant,
}

#[derive(Default)]
struct ProducerLog {
    /// (body, partition, offset) of every produce answered 200.
    acked: Vec<(String, u64, u64)>,
    /// Bodies whose produce failed at the transport level: may or may not exist.
    indeterminate: Vec<String>,
    /// (body, status, text) of produces answered with an error status: nothing was written, per the contract.
    refused: Vec<(String, u16, String)>,
    transport_errors: u64,
}

/// An ack that did not get 200: what came back, and how long after the consume was sent / answered.
#[derive(Clone, Debug)]
struct AckFailure {
    partition: u64,
    offset: u64,
    answer: String,
    after_consume_sent: Duration,
    after_consume_answered: Duration,
}

#[derive(Default)]
struct ConsumerLog {
    deliveries: Vec<Delivery>,
    acks: Vec<Ack>,
    nacks_ok: u64,
    dropped: u64,
    /// Acks refused, by status and error code.
    ack_refused: BTreeMap<String, u64>,
    /// Acks retried after a 503.
    ack_retries: u64,
    /// Every ack that did not get 200 in the end.
    ack_failures: Vec<AckFailure>,
    consume_503: u64,
    transport_errors: u64,
    /// Answers the contract does not allow here.
    odd: Vec<String>,
}

impl ConsumerLog {
    fn merge(&mut self, other: ConsumerLog) {
        self.deliveries.extend(other.deliveries);
        self.acks.extend(other.acks);
        self.nacks_ok += other.nacks_ok;
        self.dropped += other.dropped;
        for (k, n) in other.ack_refused {
            *self.ack_refused.entry(k).or_default() += n;
        }
        self.ack_failures.extend(other.ack_failures);
        self.ack_retries += other.ack_retries;
        self.consume_503 += other.consume_503;
        self.transport_errors += other.transport_errors;
        self.odd.extend(other.odd);
    }
}

/// Crashes so far, and the last instance that answered /health 200 (instance `e` starts after crash `e`).
#[derive(Default)]
struct Epochs {
    crashes: AtomicU64,
    healthy: AtomicU64,
}

impl Epochs {
    fn now(&self) -> u64 {
        self.crashes.load(SeqCst)
    }

    /// Whether the current instance is down, starting, or answered /health 200, for failure reports.
    fn phase(&self) -> String {
        let crashes = self.now();
        if self.healthy.load(SeqCst) == crashes {
            format!("instance {crashes}, after /health 200")
        } else {
            format!("instance {crashes} down or starting, before /health 200")
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------------------------------

fn producer(
    client: Client,
    id: usize,
    round: u64,
    stop: Arc<AtomicBool>,
    epoch: Arc<Epochs>,
    mut rng: XorShift,
) -> ProducerLog {
    let mut log = ProducerLog::default();
    let mut seq = 0u64;
    while !stop.load(SeqCst) {
        seq += 1;
        let body = format!("p{id}-r{round}-{seq}");
        let phase = epoch.phase();
        match client.call("POST", &format!("/produce?topic={TOPIC}"), body.as_bytes()) {
            Ok(a) if a.status == 200 => {
                let j = a.json();
                match (j["partition"].as_u64(), j["offset"].as_u64()) {
                    (Some(p), Some(o)) => log.acked.push((body, p, o)),
                    _ => log
                        .refused
                        .push((body, 200, format!("unparsable: {}", a.text()))),
                }
            }
            Ok(a) => {
                let text = format!("{} (sent to {phase})", a.text());
                log.refused.push((body, a.status, text));
                thread::sleep(ms(10));
            }
            Err(_) => {
                // Connection refused/reset during the outage: the record may or may not exist.
                log.indeterminate.push(body);
                log.transport_errors += 1;
                thread::sleep(ms(15));
            }
        }
        // Pace the producers a little so that consumers keep up and the drain stays short.
        thread::sleep(Duration::from_micros(rng.range(0, 2000)));
    }
    log
}

enum Mode {
    /// Ack most, nack some, drop some (lease expires); stop when `stop` is set.
    Chaos(Arc<AtomicBool>),
    /// Ack everything; stop after `quiet` consecutive 204s that each waited their whole 1s, or at the deadline.
    Drain { quiet: u32, deadline: Instant },
}

/// A lease as a consumer holds it; `issued_by` is the last instance that can have issued it.
struct Lease {
    handle: String,
    partition: u64,
    offset: u64,
    issued_by: u64,
    /// When its consume was sent and answered (the lease was reserved in between).
    asked: Instant,
    received: Instant,
    /// When a deferred ack is due.
    due: Instant,
}

/// Acks a lease and records the outcome. An instance never accepts a handle issued by an earlier one, nor one
/// whose lease (visibility 1s) has certainly expired. A `503` (out-of-order ack cap reached) is retried every 10 ms
/// while the lease is young (up to 700 ms after it was handed out), as a client that wants its ack to count would:
/// the gap beneath usually closes within milliseconds, while the `Retry-After: 1` the server sends outlives the
/// lease.
fn ack(client: &Client, epoch: &Epochs, log: &mut ConsumerLog, lease: &Lease) {
    loop {
        let epoch_lo = epoch.now();
        let phase = epoch.phase();
        let sent = Instant::now();
        let r = client.call(
            "POST",
            &format!("/ack?topic={TOPIC}&receipt_handle={}", lease.handle),
            &[],
        );
        let epoch_hi = epoch.now();
        let r = match r {
            Ok(r) if r.status == 200 => {
                if epoch_lo > lease.issued_by {
                    log.odd.push(format!(
                        "ack {} answered 200 by instance >= {epoch_lo}, but the lease came from instance <= {}",
                        lease.handle, lease.issued_by
                    ));
                }
                let age = sent - lease.received;
                if age > ms(1250) {
                    log.odd.push(format!(
                        "ack {} answered 200 though sent {age:?} after its 1s lease was handed out",
                        lease.handle
                    ));
                }
                log.acks.push(Ack {
                    partition: lease.partition,
                    offset: lease.offset,
                    epoch_lo,
                    epoch_hi,
                    done: Instant::now(),
                });
                return;
            }
            Ok(r) if r.status == 503 && lease.received.elapsed() < ms(700) => {
                log.ack_retries += 1;
                thread::sleep(ms(10));
                continue;
            }
            other => other,
        };
        let answer = match &r {
            Ok(r) => format!("{} {}", r.status, r.json()["error"].as_str().unwrap_or("?")),
            Err(_) => "transport error".to_string(),
        };
        log.ack_failures.push(AckFailure {
            partition: lease.partition,
            offset: lease.offset,
            answer: answer.clone(),
            after_consume_sent: sent - lease.asked,
            after_consume_answered: sent - lease.received,
        });
        match r {
            Ok(r) if r.status == 410 || r.status == 503 => {
                *log.ack_refused.entry(answer).or_default() += 1
            }
            Ok(r) => log.odd.push(format!(
                "ack {} answered {}: {} (sent to {phase})",
                lease.handle,
                r.status,
                r.text()
            )),
            Err(_) => log.transport_errors += 1,
        }
        return;
    }
}

fn consumer(client: Client, epoch: Arc<Epochs>, mode: Mode, mut rng: XorShift) -> ConsumerLog {
    let mut log = ConsumerLog::default();
    let mut quiet = 0u32;
    let mut pending: Vec<Lease> = Vec::new();
    loop {
        let wait = match &mode {
            Mode::Chaos(stop) => {
                if stop.load(SeqCst) {
                    break;
                }
                format!("{}ms", rng.range(0, 150))
            }
            Mode::Drain {
                quiet: needed,
                deadline,
            } => {
                if quiet >= *needed {
                    break;
                }
                if Instant::now() > *deadline {
                    log.odd.push("drain deadline reached".into());
                    break;
                }
                "1s".to_string()
            }
        };
        let epoch_lo = epoch.now();
        let phase = epoch.phase();
        let sent = Instant::now();
        let a = match client.call("GET", &format!("/consume?topic={TOPIC}&wait={wait}"), &[]) {
            Ok(a) => a,
            Err(e) => {
                log.transport_errors += 1;
                if matches!(mode, Mode::Drain { .. }) {
                    log.odd.push(format!("drain consume: {e}"));
                }
                thread::sleep(ms(15));
                continue;
            }
        };
        let epoch_hi = epoch.now();
        match a.status {
            204 => {
                let waited = sent.elapsed();
                if matches!(mode, Mode::Drain { .. }) {
                    // Only a 204 that spent its whole wait counts as quiet: at the in-flight cap, 204 comes at
                    // once (leases held by the rounds' consumers still have to expire).
                    if waited >= ms(900) {
                        quiet += 1;
                    } else {
                        quiet = 0;
                        thread::sleep(ms(50));
                    }
                } else if waited < ms(5) {
                    thread::sleep(ms(5));
                }
                continue;
            }
            200 => quiet = 0,
            503 => {
                log.consume_503 += 1;
                thread::sleep(ms(10));
                continue;
            }
            s => {
                log.odd.push(format!(
                    "consume answered {s}: {} (sent to {phase})",
                    a.text()
                ));
                thread::sleep(ms(10));
                continue;
            }
        }
        let parsed = (
            a.header("partition").and_then(|v| v.parse::<u64>().ok()),
            a.header("offset").and_then(|v| v.parse::<u64>().ok()),
            a.header("receipt-handle").map(str::to_string),
        );
        let (partition, offset, handle) = match parsed {
            (Some(p), Some(o), Some(h)) => (p, o, h),
            _ => {
                log.odd
                    .push(format!("200 consume without headers: {:?}", a.headers));
                continue;
            }
        };
        log.deliveries.push(Delivery {
            body: String::from_utf8_lossy(&a.body).into_owned(),
            partition,
            offset,
            epoch_lo,
            epoch_hi,
            sent,
        });
        let roll = match mode {
            Mode::Chaos(_) => rng.range(0, 99),
            Mode::Drain { .. } => 0,
        };
        let lease = Lease {
            handle,
            partition,
            offset,
            issued_by: epoch_hi,
            asked: sent,
            received: Instant::now(),
            due: Instant::now() + ms(rng.range(100, 1600)),
        };
        if roll < 84 {
            ack(&client, &epoch, &mut log, &lease);
        } else if roll < 88 {
            // Hold the handle and ack it later: maybe after its lease expired, or across a crash (410 then).
            pending.push(lease);
        } else if roll < 94 {
            match client.call(
                "POST",
                &format!("/nack?topic={TOPIC}&receipt_handle={}", lease.handle),
                &[],
            ) {
                Ok(r) if r.status == 200 => log.nacks_ok += 1,
                Ok(r) if r.status == 410 || r.status == 503 => {}
                Ok(r) => log.odd.push(format!(
                    "nack {} answered {}: {} (sent to {})",
                    lease.handle,
                    r.status,
                    r.text(),
                    epoch.phase()
                )),
                Err(_) => log.transport_errors += 1,
            }
        } else {
            // Walk away: the lease expires after the topic's visibility (1s).
            log.dropped += 1;
        }
        let now = Instant::now();
        for late in pending.iter().filter(|l| l.due <= now) {
            ack(&client, &epoch, &mut log, late);
        }
        pending.retain(|l| l.due > now);
    }
    // The round ends after the restart: what is still held goes to the new instance.
    for late in &pending {
        ack(&client, &epoch, &mut log, late);
    }
    log
}

// ---------------------------------------------------------------------------------------------------------------
// Server handling
// ---------------------------------------------------------------------------------------------------------------

/// The frontier on disk: missing = 0; an unreadable file is an error (it is only ever replaced atomically).
fn read_frontier(partition_dir: &Path) -> Result<u64, String> {
    let path = partition_dir.join("consumer.offset");
    match std::fs::read(&path) {
        Ok(bytes) => common::decode_frontier(&bytes)
            .ok_or_else(|| format!("{} does not decode: {bytes:02x?}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Restarts the server on the same data dir and port, retrying (up to ~5 s) a start that fails, e.g. with
/// EADDRINUSE right after a kill.
fn restart_with_retry(server: &mut Server) {
    common::wait_port_free(server.port);
    let start = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match catch_unwind(AssertUnwindSafe(|| server.restart())) {
            Ok(()) => return,
            Err(e) => {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                assert!(
                    start.elapsed() < ms(5000),
                    "restart still failing after {attempts} attempts: {why}"
                );
                thread::sleep(ms(20));
            }
        }
    }
}

fn topic_partitions(server: &Server) -> Vec<serde_json::Value> {
    server.partitions(TOPIC)
}

/// Diagnostics for a partition whose frontier does not advance after the drain: for a few seconds, consume; when
/// the frontier offset of a stuck partition comes back, ack it and print what the server answered, with the
/// partition's state before and after.
fn probe_wedge(server: &Server) {
    let state = |part: u64| {
        topic_partitions(server)
            .into_iter()
            .find(|p| p["partition"].as_u64() == Some(part))
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probed = HashSet::new();
    while Instant::now() < deadline && probed.len() < PARTITIONS as usize {
        let Ok(a) = server
            .client
            .call("GET", &format!("/consume?topic={TOPIC}&wait=1s"), &[])
        else {
            continue;
        };
        if a.status != 200 {
            thread::sleep(ms(20));
            continue;
        }
        let (Some(part), Some(offset), Some(handle)) = (
            a.header("partition").and_then(|v| v.parse::<u64>().ok()),
            a.header("offset").and_then(|v| v.parse::<u64>().ok()),
            a.header("receipt-handle").map(str::to_string),
        ) else {
            continue;
        };
        let before = state(part);
        if before["committed"].as_u64() != Some(offset) || !probed.insert(part) {
            continue; // not the frontier offset: leave the lease to expire
        }
        let answer = server.client.call(
            "POST",
            &format!("/ack?topic={TOPIC}&receipt_handle={handle}"),
            &[],
        );
        println!(
            "crash_loop wedge probe: partition {part} before {before}; ack {handle} of the frontier offset -> {:?}; \
             after {}",
            answer.map(|a| format!("{} {}", a.status, a.text())),
            state(part)
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The crash loop
// ---------------------------------------------------------------------------------------------------------------

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Up to `n` examples, for failure messages.
fn some<T: std::fmt::Debug>(items: &[T], n: usize) -> String {
    format!("{:?}", &items[..items.len().min(n)])
}

#[test]
fn crash_loop_loses_nothing_and_resurrects_nothing() {
    let _g = common::serial();
    let started = Instant::now();
    let rounds = env_u64("BERTH_CRASH_ROUNDS").unwrap_or(10);
    let seed = env_u64("BERTH_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    println!(
        "crash_loop: rounds={rounds} seed={seed} (BERTH_CRASH_SEED={seed} to replay the schedule)"
    );
    let mut rng = XorShift::new(seed);

    let mut server = Server::start(2, &[]);
    server.create_topic(TOPIC, &format!("partitions={PARTITIONS}&visibility=1s"));
    let dirs: Vec<_> = (0..PARTITIONS)
        .map(|p| server.partition_dir(TOPIC, p))
        .collect();

    let epoch = Arc::new(Epochs::default());
    let mut produced = ProducerLog::default();
    let mut consumed = ConsumerLog::default();
    // frontier_before[k - 1][p]: the durable frontier of partition p reported just before crash k.
    let mut frontier_before: Vec<Vec<u64>> = Vec::new();
    // When each of those reads started.
    let mut read_at: Vec<Instant> = Vec::new();
    let mut frontier_problems: Vec<String> = Vec::new();

    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let mut producers: Vec<JoinHandle<ProducerLog>> = Vec::new();
        let mut consumers: Vec<JoinHandle<ConsumerLog>> = Vec::new();
        for id in 0..PRODUCERS {
            let (client, stop, epoch) = (Client::new(&server.url()), stop.clone(), epoch.clone());
            let r = XorShift::new(seed ^ (round << 8) ^ id as u64);
            producers.push(thread::spawn(move || {
                producer(client, id, round, stop, epoch, r)
            }));
        }
        let n_consumers = 2 + (rng.next() % (CONSUMERS as u64 - 1)) as usize;
        for id in 0..n_consumers {
            let (client, epoch) = (Client::new(&server.url()), epoch.clone());
            let mode = Mode::Chaos(stop.clone());
            let r = XorShift::new(seed ^ (round << 8) ^ (0x80 + id as u64));
            consumers.push(thread::spawn(move || consumer(client, epoch, mode, r)));
        }

        // The killer: run for a while, note the durable frontiers, kill -9, restart on the same data dir.
        thread::sleep(ms(rng.range(200, 900)));
        let mut before = Vec::new();
        read_at.push(Instant::now());
        let reported = server.partitions(TOPIC);
        for p in 0..dirs.len() {
            let value = reported[p]["durable"].as_u64().expect("durable");
            if let Some(prev) = frontier_before.last() {
                if value < prev[p] {
                    frontier_problems.push(format!(
                        "round {round}: partition {p} durable frontier moved backwards {} -> {value}",
                        prev[p]
                    ));
                }
            }
            before.push(value);
        }
        server.kill9();
        epoch.crashes.fetch_add(1, SeqCst);
        restart_with_retry(&mut server);
        // The restart replayed the journal: each file holds at least what was durable before the crash.
        for (p, dir) in dirs.iter().enumerate() {
            match read_frontier(dir) {
                Ok(v) if v < before[p] => frontier_problems.push(format!(
                    "round {round}: partition {p} consumer.offset holds {v} after the restart, {} was reported durable before the crash",
                    before[p]
                )),
                Ok(_) => {}
                Err(e) => frontier_problems.push(format!("round {round}: {e}")),
            }
        }
        frontier_before.push(before);
        epoch.healthy.store(round + 1, SeqCst);
        // Let the clients, which retried through the outage, reach the new instance before the round ends.
        thread::sleep(ms(rng.range(50, 200)));

        stop.store(true, SeqCst);
        for h in producers {
            let log = h.join().expect("producer thread panicked");
            produced.acked.extend(log.acked);
            produced.indeterminate.extend(log.indeterminate);
            produced.refused.extend(log.refused);
            produced.transport_errors += log.transport_errors;
        }
        for h in consumers {
            consumed.merge(h.join().expect("consumer thread panicked"));
        }
    }

    // Drain: no more producers or crashes; ack everything until each drainer sees 3 consecutive 204s that waited 1s,
    // which also outlasts every lease (visibility 1s) handed out and dropped during the rounds.
    let backlog = produced.acked.len() + produced.indeterminate.len();
    let drain_deadline = Instant::now() + Duration::from_secs(30) + ms(backlog as u64 / 2);
    let drainers: Vec<JoinHandle<ConsumerLog>> = (0..2u64)
        .map(|id| {
            let (client, epoch) = (Client::new(&server.url()), epoch.clone());
            let mode = Mode::Drain {
                quiet: 3,
                deadline: drain_deadline,
            };
            thread::spawn(move || consumer(client, epoch, mode, XorShift::new(id)))
        })
        .collect();
    // Sample the frontiers while the drain runs (diagnostics for a drain that does not finish).
    let drain_started = Instant::now();
    let mut drain_samples: Vec<(Duration, Vec<u64>)> = Vec::new();
    while drainers.iter().any(|h| !h.is_finished()) {
        let committed = topic_partitions(&server)
            .iter()
            .map(|p| p["committed"].as_u64().unwrap_or(0))
            .collect();
        drain_samples.push((drain_started.elapsed(), committed));
        thread::sleep(ms(250));
    }
    for h in drainers {
        consumed.merge(h.join().expect("drain thread panicked"));
    }
    let partitions_after = topic_partitions(&server);

    // ---------------------------------------------------------------------------------------------------------
    // The checker
    // ---------------------------------------------------------------------------------------------------------
    let acked_bodies: HashMap<&str, (u64, u64)> = produced
        .acked
        .iter()
        .map(|(b, p, o)| (b.as_str(), (*p, *o)))
        .collect();
    let indeterminate: HashSet<&str> = produced.indeterminate.iter().map(String::as_str).collect();
    let refused: HashSet<&str> = produced.refused.iter().map(|r| r.0.as_str()).collect();

    // Acknowledged produces have distinct (partition, offset).
    let mut acked_at: HashMap<(u64, u64), &str> = HashMap::new();
    let mut offset_clashes = Vec::new();
    for (b, p, o) in &produced.acked {
        if let Some(other) = acked_at.insert((*p, *o), b) {
            offset_clashes.push(format!("{p}:{o} acknowledged for both {other} and {b}"));
        }
    }

    // Delivered multiset, per body and per (partition, offset).
    let mut times: HashMap<&str, u64> = HashMap::new();
    let mut content: HashMap<(u64, u64), &str> = HashMap::new();
    let mut content_changes = Vec::new();
    let mut misplaced = Vec::new();
    for d in &consumed.deliveries {
        *times.entry(d.body.as_str()).or_default() += 1;
        let key = (d.partition, d.offset);
        match content.get(&key) {
            Some(b) if *b != d.body => content_changes.push(format!(
                "{}:{} delivered as {b} and as {}",
                d.partition, d.offset, d.body
            )),
            Some(_) => {}
            None => {
                content.insert(key, d.body.as_str());
            }
        }
        if let Some(&(p, o)) = acked_bodies.get(d.body.as_str()) {
            if (p, o) != key {
                misplaced.push(format!(
                    "{} acknowledged at {p}:{o}, delivered at {}:{}",
                    d.body, d.partition, d.offset
                ));
            }
        }
    }

    let lost: Vec<&str> = produced
        .acked
        .iter()
        .map(|(b, _, _)| b.as_str())
        .filter(|b| !times.contains_key(b))
        .collect();
    let unexpected: Vec<String> = times
        .keys()
        .filter(|b| !acked_bodies.contains_key(*b) && !indeterminate.contains(*b))
        .map(|b| {
            if refused.contains(b) {
                format!("{b} (its produce was answered with an error status)")
            } else {
                b.to_string()
            }
        })
        .collect();
    let duplicates: Vec<(&str, u64)> = times
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(b, n)| (*b, *n))
        .collect();
    let delivered_indeterminate = indeterminate
        .iter()
        .filter(|b| times.contains_key(*b))
        .count();

    // Resurrection: a delivery requested after crash k must not be below the frontier read before crash k (nor
    // before any earlier crash) on its partition.
    let mut bound_after: Vec<Vec<u64>> = vec![vec![0; PARTITIONS as usize]];
    for f in &frontier_before {
        let prev = bound_after.last().unwrap().clone();
        bound_after.push(prev.iter().zip(f).map(|(a, b)| *a.max(b)).collect());
    }
    let mut resurrected = Vec::new();
    for d in &consumed.deliveries {
        let bound = bound_after[d.epoch_lo as usize]
            .get(d.partition as usize)
            .copied()
            .unwrap_or(0);
        if d.offset < bound {
            resurrected.push(format!(
                "{}:{} ({}) requested after crash {}, durable frontier before it was {bound}",
                d.partition, d.offset, d.body, d.epoch_lo
            ));
        }
    }

    // An offset acked (200) is never handed out again by the same server instance. Key: (partition, offset,
    // instance), value: when the first such ack was answered.
    let mut acked_in: HashMap<(u64, u64, u64), Instant> = HashMap::new();
    for a in consumed.acks.iter().filter(|a| a.epoch_lo == a.epoch_hi) {
        let e = acked_in
            .entry((a.partition, a.offset, a.epoch_lo))
            .or_insert(a.done);
        *e = (*e).min(a.done);
    }
    let mut redelivered_after_ack = Vec::new();
    for d in consumed
        .deliveries
        .iter()
        .filter(|d| d.epoch_lo == d.epoch_hi)
    {
        if let Some(done) = acked_in.get(&(d.partition, d.offset, d.epoch_lo)) {
            if d.sent > *done {
                redelivered_after_ack.push(format!(
                    "{}:{} ({}) acked by instance {} and then delivered again by it",
                    d.partition, d.offset, d.body, d.epoch_lo
                ));
            }
        }
    }

    // Acks are durable with the frontier, those above it (the acked-ahead ranges) too: an offset acked (200) by
    // instance e more than LAG before it was killed is never delivered again by a later instance. Only what was
    // leased and unsettled at a crash (and acks of its last frontier interval) comes back.
    const LAG: Duration = Duration::from_millis(500);
    let mut settled_redelivered = Vec::new();
    let mut durably_acked: HashMap<(u64, u64), u64> = HashMap::new();
    for a in consumed.acks.iter().filter(|a| a.epoch_lo == a.epoch_hi) {
        let e = a.epoch_lo as usize;
        if read_at.get(e).is_some_and(|killed| *killed > a.done + LAG) {
            let first = durably_acked
                .entry((a.partition, a.offset))
                .or_insert(a.epoch_lo);
            *first = (*first).min(a.epoch_lo);
        }
    }
    for d in &consumed.deliveries {
        if let Some(&e) = durably_acked.get(&(d.partition, d.offset)) {
            if d.epoch_lo > e {
                settled_redelivered.push(format!(
                    "{}:{} ({}) acked by instance {e} well before it was killed, delivered again by instance {}",
                    d.partition, d.offset, d.body, d.epoch_lo
                ));
            }
        }
    }

    // The durable frontier lags acks by ~50 ms: if instance e had every offset of a partition below o settled (below
    // its starting frontier, or acked 200 by it) more than LAG before the frontier was read ahead of crash e + 1,
    // then that read shows at least o. Acks whose answer was lost, or acked before the start frontier read by us,
    // only make this bound weaker.
    let mut lagging = Vec::new();
    let mut lag_checked = 0u64;
    for (e, (read, at)) in frontier_before.iter().zip(&read_at).enumerate() {
        for p in 0..PARTITIONS {
            let mut covered = bound_after[e][p as usize];
            while acked_in
                .get(&(p, covered, e as u64))
                .is_some_and(|t| *t + LAG <= *at)
            {
                covered += 1;
                lag_checked += 1;
            }
            if read[p as usize] < covered {
                lagging.push(format!(
                    "partition {p}: offsets below {covered} settled by instance {e} more than {LAG:?} before crash {}, but the durable frontier read {}",
                    e + 1,
                    read[p as usize]
                ));
            }
        }
    }

    // After the drain every offset below each partition's end was delivered at least once, and is committed.
    let mut gaps = Vec::new();
    let mut settle_state = Vec::new();
    let mut delivered_offsets: BTreeMap<u64, HashSet<u64>> = BTreeMap::new();
    for d in &consumed.deliveries {
        delivered_offsets
            .entry(d.partition)
            .or_default()
            .insert(d.offset);
    }
    for p in &partitions_after {
        let get = |k: &str| p[k].as_u64().unwrap_or(u64::MAX);
        let (part, end) = (get("partition"), get("end_offset"));
        let seen = delivered_offsets.get(&part).cloned().unwrap_or_default();
        let missing: Vec<u64> = (0..end).filter(|o| !seen.contains(o)).collect();
        if !missing.is_empty() {
            gaps.push(format!(
                "partition {part}: {} of 0..{end} never delivered, e.g. {}",
                missing.len(),
                some(&missing, 10)
            ));
        }
        if let Some(beyond) = seen.iter().find(|o| **o >= end) {
            gaps.push(format!(
                "partition {part}: offset {beyond} delivered but end_offset is {end}"
            ));
        }
        let committed = get("committed");
        if committed != end || get("in_flight") != 0 || get("corrupt_skipped") != 0 {
            // What happened to the offset at the frontier, to tell a wedge from a slow drain.
            let at = |d: &Delivery| d.partition == part && d.offset == committed;
            let delivered = consumed.deliveries.iter().filter(|d| at(d)).count();
            let delivered_last = consumed
                .deliveries
                .iter()
                .filter(|d| at(d) && d.epoch_lo == rounds)
                .count();
            let acked = consumed
                .acks
                .iter()
                .filter(|a| a.partition == part && a.offset == committed)
                .count();
            let replay = server
                .client
                .call(
                    "GET",
                    &format!("/consume?topic={TOPIC}&partition={part}&offset={committed}"),
                    &[],
                )
                .map(|a| format!("{} {:?}", a.status, a.text()));
            let mut outcomes: BTreeMap<&str, (u64, Duration, Duration)> = BTreeMap::new();
            for f in consumed
                .ack_failures
                .iter()
                .filter(|f| f.partition == part && f.offset == committed)
            {
                let e = outcomes.entry(f.answer.as_str()).or_default();
                e.0 += 1;
                e.1 = e.1.max(f.after_consume_sent);
                e.2 = e.2.max(f.after_consume_answered);
            }
            let mut around = Vec::new();
            for o in committed.saturating_sub(3)..=committed + 3 {
                let last =
                    |d: &&Delivery| d.partition == part && d.offset == o && d.epoch_lo == rounds;
                let n = consumed.deliveries.iter().filter(last).count();
                let ok = consumed
                    .acks
                    .iter()
                    .filter(|a| a.partition == part && a.offset == o && a.epoch_lo == rounds)
                    .count();
                let refused = consumed
                    .ack_failures
                    .iter()
                    .filter(|f| f.partition == part && f.offset == o)
                    .count();
                around.push(format!("{o}: delivered {n}, acked {ok}, refused {refused}"));
            }
            let samples: Vec<String> = drain_samples
                .iter()
                .map(|(t, c)| format!("{:.1}s:{}", t.as_secs_f64(), c[part as usize]))
                .collect();
            println!(
                "crash_loop stuck partition {part}: by the last instance {around:?}; frontier during the drain {samples:?}"
            );
            settle_state.push(format!(
                "{p}: offset {committed} delivered {delivered} times ({delivered_last} by the last instance), \
                 acked (200) {acked} times, refused acks of it (count, max time since consume sent, since \
                 answered): {outcomes:?}; replay of it: {replay:?}"
            ));
        }
    }

    if !settle_state.is_empty() {
        probe_wedge(&server);
    }

    let unique_delivered = times.len();
    println!(
        "crash_loop summary: rounds={rounds} produced(acked)={} indeterminate={} (delivered {delivered_indeterminate}) \
         refused={} delivered={} unique_delivered={unique_delivered} duplicates={} lost={} unexpected={} \
         resurrected={} settled_redelivered={} duplicates_per_crash={:.1} acks={} nacks={} dropped={} elapsed={:.1?}",
        produced.acked.len(),
        produced.indeterminate.len(),
        produced.refused.len(),
        consumed.deliveries.len(),
        duplicates.len(),
        lost.len(),
        unexpected.len(),
        resurrected.len(),
        settled_redelivered.len(),
        (consumed.deliveries.len() - unique_delivered) as f64 / rounds.max(1) as f64,
        consumed.acks.len(),
        consumed.nacks_ok,
        consumed.dropped,
        started.elapsed(),
    );
    println!(
        "crash_loop details: frontiers before each crash={frontier_before:?} final partitions={} \
         acks_refused={:?} ack_retries={} consume_503={} transport_errors={} lag_checked_offsets={lag_checked}",
        serde_json::Value::Array(partitions_after.clone()),
        consumed.ack_refused,
        consumed.ack_retries,
        consumed.consume_503,
        consumed.transport_errors + produced.transport_errors,
    );
    if !duplicates.is_empty() {
        println!(
            "crash_loop duplicates (allowed), e.g. {}",
            some(&duplicates, 10)
        );
    }

    for odd in consumed.odd.iter().take(100) {
        println!("crash_loop odd answer: {odd}");
    }
    for (b, st, t) in produced.refused.iter().take(100) {
        println!("crash_loop refused produce {b}: {st} {t}");
    }

    let mut failures = Vec::new();
    let mut check = |name: &str, items: Vec<String>| {
        if !items.is_empty() {
            failures.push(format!("{name}: {} — {}", items.len(), some(&items, 10)));
        }
    };
    check("lost", lost.iter().map(|b| b.to_string()).collect());
    check("unexpected", unexpected);
    check("resurrected", resurrected);
    check("acknowledged offset clashes", offset_clashes);
    check("replayed offset changed content", content_changes);
    check("delivered at another offset than acknowledged", misplaced);
    check(
        "acked offset redelivered without a crash",
        redelivered_after_ack,
    );
    check(
        "offsets acked well before a crash delivered again after it",
        settled_redelivered,
    );
    check("frontier file problems", frontier_problems);
    check("durable frontier lagging acks", lagging);
    check("offsets never delivered after the drain", gaps);
    check("partitions not fully settled after the drain", settle_state);
    // 503 (overloaded, not ready) is a legitimate refusal; anything else is not, on a healthy disk.
    check(
        "produces refused with an error status other than 503",
        produced
            .refused
            .iter()
            .filter(|(_, s, _)| *s != 503)
            .map(|(b, s, t)| format!("{b}: {s} {t}"))
            .collect(),
    );
    check("answers outside the contract", consumed.odd.clone());
    if !failures.is_empty() {
        let log = server.log_text();
        let noteworthy: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .collect();
        println!(
            "crash_loop server log: {} ERROR/WARN lines, the first 30:",
            noteworthy.len()
        );
        for line in noteworthy.iter().take(30) {
            println!("  {line}");
        }
    }
    assert!(
        failures.is_empty(),
        "crash loop (seed {seed}, {rounds} rounds) found:\n{}",
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Graceful restart
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn graceful_restart_redelivers_nothing_settled() {
    let _g = common::serial();
    let topic = "graceful";
    let mut s = Server::start(2, &[]);
    s.create_topic(topic, "partitions=4");
    let mut sent = HashSet::new();
    for i in 0..200 {
        let body = format!("g{i}");
        s.produce(topic, "", body.as_bytes());
        sent.insert(body.into_bytes());
    }
    let mut got = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 200 {
        assert!(
            Instant::now() < deadline,
            "only {} of 200 delivered",
            got.len()
        );
        if let Some((p, o, h, body)) = consume(&s.client, topic, "&wait=1s") {
            assert!(got.insert(body.clone()), "{p}:{o} delivered twice");
            assert!(sent.contains(&body), "{p}:{o} was never sent");
            assert_eq!(settle(&s.client, "ack", topic, &h, ""), 200, "ack {h}");
        }
    }
    assert_eq!(s.terminate(), Some(0), "SIGTERM exits 0");
    let total: u64 = (0..4)
        .map(|p| read_frontier(&s.partition_dir(topic, p)).expect("consumer.offset"))
        .sum();
    assert_eq!(total, 200, "frontiers on disk after a graceful shutdown");

    restart_with_retry(&mut s);
    let a = s
        .client
        .call("GET", &format!("/consume?topic={topic}&wait=1s"), &[])
        .expect("consume");
    assert_eq!(
        a.status,
        204,
        "a settled message came back after a graceful restart: {:?} {}",
        a.headers,
        a.text()
    );
    for p in s.partitions(topic) {
        assert_eq!(p["committed"], p["end_offset"], "{p}");
        assert_eq!(p["in_flight"], 0, "{p}");
    }
}
