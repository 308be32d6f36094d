//! `berth bench`: the load generator. One pinned glommio executor per client CPU, each driving its connections in a
//! closed loop (or paced, open loop, at `--rate`), recording per-core HDR histograms per operation; then a table,
//! JSON, `.hgrm` percentile files and an SVG plot, plus the server's own per-core histograms from `/metrics`.

mod beanstalk;
mod http;
pub mod report;

use berth::duration::parse_duration_ms;
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use http::Conn;
use report::{CoreResult, Op, RunReport};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What each connection does in a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// POST /produce.
    Produce,
    /// Drain a pre-filled topic: consume then ack.
    Consume,
    /// produce → consume → ack.
    Cycle,
}

/// Which broker the load generator talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// berth's HTTP API.
    Berth,
    /// beanstalkd's text protocol (put / reserve-with-timeout / delete), as a baseline in the same run; needs
    /// `--server HOST:PORT` of a running beanstalkd (and `--server-pid` for its CPU).
    Beanstalkd,
}

/// `berth bench` options.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct BenchArgs {
    /// produce | consume | cycle.
    #[arg(long, value_enum, default_value = "cycle")]
    pub workload: Workload,
    /// berth, or beanstalkd as a baseline.
    #[arg(long, value_enum, default_value = "berth")]
    pub protocol: Protocol,
    /// Connections per client core.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// CPUs for the load generator, one pinned executor each [default: the last CPU].
    #[arg(long, value_delimiter = ',')]
    pub client_cpus: Option<Vec<usize>>,
    /// CPUs for the embedded server [default: every CPU not used by the client].
    #[arg(long, value_delimiter = ',')]
    pub server_cpus: Option<Vec<usize>>,
    /// Message size in bytes.
    #[arg(long, default_value_t = 100)]
    pub message_bytes: usize,
    /// Partitions of the bench topic.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// Lease visibility for consumes.
    #[arg(long, default_value = "30s")]
    pub visibility: String,
    /// How long to run (ignored for consume, which runs until drained).
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// Messages to pre-fill for the consume workload.
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// Open loop: total requests (or cycles) per second across all connections, latency measured from the
    /// intended send time (coordinated-omission corrected). Default: closed loop.
    #[arg(long)]
    pub rate: Option<u64>,
    /// A `berth serve` config file for the embedded server (engine knobs for tuning experiments).
    #[arg(long)]
    pub server_config: Option<PathBuf>,
    /// cycle: pipeline each cycle's requests on the connection (the previous message's ack, this produce and
    /// this consume in one write), as a batching client would. Default: one request at a time.
    #[arg(long)]
    pub pipeline: bool,
    /// fsync policy of the embedded server.
    #[arg(long, default_value = "always")]
    pub fsync: String,
    /// Write the full results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write HdrHistogram percentile-distribution files (one per core and operation) into this directory.
    #[arg(long)]
    pub hgrm_dir: Option<PathBuf>,
    /// Write an SVG latency-percentile plot (one line per core) here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Client executors busy-poll this long before sleeping. A sleeping client makes every server send pay for
    /// waking it (an inter-processor interrupt, costly in VMs); spinning keeps that cost off the server's CPU, as
    /// a busy remote client would. 0 lets the client sleep.
    #[arg(long, default_value_t = 0)]
    pub client_spin_us: u64,
    /// Server process id, to report server CPU per operation against an external server.
    #[arg(long)]
    pub server_pid: Option<u32>,
}

/// Validated, resolved settings.
struct Plan {
    args: BenchArgs,
    duration: Duration,
    visibility: String,
    client_cpus: Vec<usize>,
    server_cpus: Vec<usize>,
}

impl BenchArgs {
    fn plan(&self) -> Result<Plan, String> {
        if self.connections == 0 || self.connections > 4096 {
            return Err("--connections must be 1..=4096".into());
        }
        if self.message_bytes > (1 << 20) {
            return Err("--message-bytes must be at most 1 MiB (the server default limit)".into());
        }
        if self.partitions == 0 || self.partitions > 4096 {
            return Err("--partitions must be 1..=4096".into());
        }
        if self.rate == Some(0) {
            return Err("--rate must be positive".into());
        }
        let duration_ms =
            parse_duration_ms(&self.duration).map_err(|e| format!("--duration: {}", e.0))?;
        if duration_ms == 0 {
            return Err("--duration must be positive".into());
        }
        let visibility_ms =
            parse_duration_ms(&self.visibility).map_err(|e| format!("--visibility: {}", e.0))?;
        self.fsync.parse::<berth::config::FsyncPolicy>()?;
        let available: Vec<usize> = core_affinity::get_core_ids()
            .ok_or("cannot list CPUs")?
            .into_iter()
            .map(|c| c.id)
            .collect();
        let last = *available.last().ok_or("no CPUs")?;
        let client_cpus = self.client_cpus.clone().unwrap_or_else(|| vec![last]);
        let server_cpus = self.server_cpus.clone().unwrap_or_else(|| {
            let rest: Vec<usize> = available
                .iter()
                .copied()
                .filter(|c| !client_cpus.contains(c))
                .collect();
            if rest.is_empty() {
                available.clone()
            } else {
                rest
            }
        });
        for cpu in client_cpus.iter().chain(&server_cpus) {
            if !available.contains(cpu) {
                return Err(format!(
                    "cpu {cpu} is not available (available: {available:?})"
                ));
            }
        }
        if client_cpus.is_empty() || server_cpus.is_empty() {
            return Err("client and server need at least one CPU each".into());
        }
        Ok(Plan {
            args: self.clone(),
            duration: Duration::from_millis(duration_ms),
            visibility: berth::duration::format_ms(visibility_ms),
            client_cpus,
            server_cpus,
        })
    }
}

/// An embedded server: this binary's `serve`, as a child process on the server CPUs, with a temp data dir.
struct Embedded {
    child: std::process::Child,
    dir: PathBuf,
}

impl Embedded {
    fn start(plan: &Plan) -> Result<(Embedded, SocketAddr), String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let dir = std::env::temp_dir().join(format!("berth-bench-{}-{port}", std::process::id()));
        let cpus: Vec<String> = plan.server_cpus.iter().map(|c| c.to_string()).collect();
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = std::process::Command::new(exe)
            .args(["serve", "--listen", &addr.to_string(), "--data-dir"])
            .arg(&dir)
            .args(["--cpus", &cpus.join(","), "--fsync", &plan.args.fsync])
            .args(
                plan.args
                    .server_config
                    .iter()
                    .flat_map(|c| [std::ffi::OsStr::new("--config"), c.as_os_str()]),
            )
            .env("BERTH_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the embedded server: {e}"))?;
        let embedded = Embedded { child, dir };
        let client = berth::client::Client::new(&format!("http://{addr}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.call("GET", "/health", &[]).map(|a| a.status) != Ok(200) {
            if Instant::now() > deadline {
                return Err("the embedded server did not become healthy".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((embedded, addr))
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// CPU time (user + system) of a process, in µs, from /proc.
fn process_cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some((utime + stime) * 1_000_000 / ticks)
}

/// Runs the benchmark; `server` is the global --server when given explicitly.
pub fn run(args: &BenchArgs, server: Option<&str>) -> Result<(), String> {
    let plan = args.plan()?;
    let (embedded, addr) = match server {
        Some(url) => {
            let hostport = url.trim_start_matches("http://").trim_end_matches('/');
            let addr = std::net::ToSocketAddrs::to_socket_addrs(hostport)
                .map_err(|e| format!("--server {url}: {e}"))?
                .next()
                .ok_or_else(|| format!("--server {url}: no address"))?;
            (None, addr)
        }
        None => {
            let (e, addr) = Embedded::start(&plan)?;
            (Some(e), addr)
        }
    };
    let server_pid = args.server_pid.or(embedded.as_ref().map(|e| e.child.id()));
    let client = berth::client::Client::new(&format!("http://{addr}"));
    let topic = format!("bench-{}", berth::clock::wall_clock_ms());
    if plan.args.protocol == Protocol::Beanstalkd {
        if embedded.is_some() {
            return Err(
                "--protocol beanstalkd needs --server HOST:PORT of a running beanstalkd".into(),
            );
        }
        if plan.args.workload == Workload::Consume || plan.args.rate.is_some() {
            return Err(
                "--protocol beanstalkd supports the produce and cycle workloads, closed loop"
                    .into(),
            );
        }
    } else {
        let path = format!(
            "/topics/{topic}?partitions={}&visibility={}",
            plan.args.partitions, plan.visibility
        );
        let created = client.call("PUT", &path, &[])?;
        if created.status != 201 {
            return Err(format!(
                "cannot create the bench topic: {} {}",
                created.status,
                created.text()
            ));
        }
    }
    if plan.args.workload == Workload::Consume {
        eprintln!("pre-filling {} messages...", plan.args.messages);
        prefill(&plan, addr, &topic)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone());
    let progress = Arc::new(AtomicU64::new(0));
    let cpu_before = server_pid.and_then(process_cpu_us);
    let started = Instant::now();
    let ticker = spawn_progress(progress.clone(), stop.clone());
    let results = run_clients(&plan, addr, &topic, stop.clone(), progress.clone())?;
    let elapsed = started.elapsed();
    let cpu_after = server_pid.and_then(process_cpu_us);
    stop.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    eprintln!();
    let server_metrics = if plan.args.protocol == Protocol::Berth {
        client
            .call("GET", "/metrics", &[])
            .map(|a| a.text())
            .unwrap_or_default()
    } else {
        String::new()
    };
    let report = RunReport::new(
        &plan.args,
        elapsed,
        results,
        cpu_before.zip(cpu_after).map(|(b, a)| a.saturating_sub(b)),
        report::server_latency(&server_metrics),
        plan.client_cpus.clone(),
        if embedded.is_some() {
            plan.server_cpus.clone()
        } else {
            Vec::new()
        },
    );
    print!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&report.json()).expect("json"),
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(dir) = &args.hgrm_dir {
        report.write_hgrm(dir)?;
        eprintln!("wrote .hgrm files to {}", dir.display());
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, report.svg()).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if plan.args.protocol == Protocol::Berth {
        let _ = client.call("DELETE", &format!("/topics/{topic}"), &[]);
    }
    drop(embedded);
    Ok(())
}

fn spawn_progress(progress: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut last = 0;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(250));
            let now = progress.load(Ordering::Relaxed);
            if started.elapsed().as_millis() % 1000 < 250 {
                eprint!(
                    "\r{:>6.1}s  {:>10} ops  {:>9.0} ops/s   ",
                    started.elapsed().as_secs_f64(),
                    now,
                    (now - last) as f64
                );
                last = now;
            }
        }
    })
}

/// Fills the topic for the consume workload with produces from the client cores.
fn prefill(plan: &Plan, addr: SocketAddr, topic: &str) -> Result<(), String> {
    let mut fill = plan.args.clone();
    fill.workload = Workload::Produce;
    fill.rate = None;
    let fill_plan = Plan {
        args: fill,
        duration: Duration::from_secs(3600),
        visibility: plan.visibility.clone(),
        client_cpus: plan.client_cpus.clone(),
        server_cpus: plan.server_cpus.clone(),
    };
    let progress = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicU64::new(plan.args.messages));
    run_clients_with(&fill_plan, addr, topic, stop, progress, Some(budget)).map(|_| ())
}

fn run_clients(
    plan: &Plan,
    addr: SocketAddr,
    topic: &str,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
) -> Result<Vec<CoreResult>, String> {
    run_clients_with(plan, addr, topic, stop, progress, None)
}

fn run_clients_with(
    plan: &Plan,
    addr: SocketAddr,
    topic: &str,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    budget: Option<Arc<AtomicU64>>,
) -> Result<Vec<CoreResult>, String> {
    let deadline = Instant::now() + plan.duration;
    let mut handles = Vec::new();
    let per_conn_interval = plan.args.rate.map(|rate| {
        let total_conns = (plan.args.connections * plan.client_cpus.len()) as f64;
        Duration::from_secs_f64(total_conns / rate as f64)
    });
    for (index, &cpu) in plan.client_cpus.iter().enumerate() {
        let job = Job {
            protocol: plan.args.protocol,
            workload: plan.args.workload,
            pipeline: plan.args.pipeline,
            connections: plan.args.connections,
            message: Arc::new(vec![b'x'; plan.args.message_bytes]),
            topic: topic.to_string(),
            visibility: plan.visibility.clone(),
            deadline,
            interval: per_conn_interval,
            stop: stop.clone(),
            progress: progress.clone(),
            budget: budget.clone(),
        };
        let handle = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("bench-client-{index}"))
            .spin_before_park(Duration::from_micros(plan.args.client_spin_us))
            .spawn(move || async move { client_core(cpu, addr, job).await })
            .map_err(|e| format!("cannot start a client executor on cpu {cpu}: {e}"))?;
        handles.push(handle);
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(
            h.join()
                .map_err(|e| format!("client executor failed: {e}"))??,
        );
    }
    Ok(results)
}

/// What one client core runs.
struct Job {
    protocol: Protocol,
    workload: Workload,
    pipeline: bool,
    connections: usize,
    message: Arc<Vec<u8>>,
    topic: String,
    visibility: String,
    deadline: Instant,
    interval: Option<Duration>,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    /// Remaining operations allowed across all cores (pre-fill); None = until the deadline.
    budget: Option<Arc<AtomicU64>>,
}

async fn client_core(cpu: usize, addr: SocketAddr, job: Job) -> Result<CoreResult, String> {
    let job = std::rc::Rc::new(job);
    let mut tasks = Vec::new();
    for _ in 0..job.connections {
        let job = job.clone();
        tasks.push(glommio::spawn_local(async move {
            match job.protocol {
                Protocol::Berth => connection_loop(addr, &job).await,
                Protocol::Beanstalkd => beanstalk_loop(addr, &job).await,
            }
        }));
    }
    let mut result = CoreResult::new(cpu);
    for t in tasks {
        let r = t.await?;
        result.merge(&r);
    }
    Ok(result)
}

fn take_budget(budget: &Option<Arc<AtomicU64>>) -> bool {
    match budget {
        None => true,
        Some(b) => b
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
            .is_ok(),
    }
}

async fn connection_loop(addr: SocketAddr, job: &Job) -> Result<CoreResult, String> {
    let mut conn = Conn::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut result = CoreResult::new(0);
    let produce_path = format!("/produce?topic={}", job.topic);
    let consume_path = format!(
        "/consume?topic={}&visibility={}&wait={}",
        job.topic,
        job.visibility,
        if job.workload == Workload::Cycle {
            "1s"
        } else {
            "0"
        }
    );
    let io = |e: std::io::Error| format!("request failed: {e}");
    let mut intended = Instant::now();
    // Pipelined cycles ack the previous message together with the next produce.
    let mut pending_ack: Option<String> = None;
    loop {
        if job.stop.load(Ordering::Relaxed)
            || Instant::now() >= job.deadline
            || !take_budget(&job.budget)
        {
            break;
        }
        // Open loop: wait for this operation's slot, and measure from it (not from when we got to send).
        let start = match job.interval {
            Some(interval) => {
                intended += interval;
                let now = Instant::now();
                if intended > now {
                    glommio::timer::sleep(intended - now).await;
                }
                intended
            }
            None => Instant::now(),
        };
        match job.workload {
            Workload::Produce => {
                let reply = conn
                    .request("POST", &produce_path, &job.message)
                    .await
                    .map_err(io)?;
                result.record(Op::Produce, start, reply.status == 200);
            }
            Workload::Consume => {
                let t0 = Instant::now();
                let reply = conn.request("GET", &consume_path, &[]).await.map_err(io)?;
                if reply.status == 204 {
                    break;
                }
                result.record(Op::Consume, t0, reply.status == 200);
                let Some(handle) = reply.receipt_handle else {
                    continue;
                };
                let t1 = Instant::now();
                let ack = conn
                    .request(
                        "POST",
                        &format!("/ack?topic={}&receipt_handle={handle}", job.topic),
                        &[],
                    )
                    .await
                    .map_err(io)?;
                result.record(Op::Ack, t1, ack.status == 200);
                result.record(Op::Cycle, start, ack.status == 200);
            }
            Workload::Cycle if job.pipeline => {
                let ack_path = pending_ack
                    .take()
                    .map(|h| format!("/ack?topic={}&receipt_handle={h}", job.topic));
                let mut requests: Vec<(&str, &str, &[u8])> = Vec::with_capacity(3);
                if let Some(path) = &ack_path {
                    requests.push(("POST", path, &[]));
                }
                requests.push(("POST", &produce_path, &job.message));
                requests.push(("GET", &consume_path, &[]));
                let mut replies = conn.pipeline(&requests).await.map_err(io)?.into_iter();
                if ack_path.is_some() {
                    let (ack, at) = replies.next().expect("one reply per request");
                    result.record_span(Op::Ack, start, at, ack.status == 200);
                }
                let (produced, at) = replies.next().expect("one reply per request");
                result.record_span(Op::Produce, start, at, produced.status == 200);
                let (consumed, at) = replies.next().expect("one reply per request");
                let delivered = consumed.status == 200 && consumed.body_len == job.message.len();
                result.record_span(Op::Consume, start, at, delivered);
                result.record_span(Op::Cycle, start, at, delivered);
                pending_ack = consumed.receipt_handle;
            }
            Workload::Cycle => {
                let reply = conn
                    .request("POST", &produce_path, &job.message)
                    .await
                    .map_err(io)?;
                result.record(Op::Produce, start, reply.status == 200);
                let t1 = Instant::now();
                let reply = conn.request("GET", &consume_path, &[]).await.map_err(io)?;
                result.record(
                    Op::Consume,
                    t1,
                    reply.status == 200 && reply.body_len == job.message.len(),
                );
                if let Some(handle) = reply.receipt_handle {
                    let t2 = Instant::now();
                    let ack = conn
                        .request(
                            "POST",
                            &format!("/ack?topic={}&receipt_handle={handle}", job.topic),
                            &[],
                        )
                        .await
                        .map_err(io)?;
                    result.record(Op::Ack, t2, ack.status == 200);
                    result.record(Op::Cycle, start, ack.status == 200);
                }
            }
        }
        job.progress.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(handle) = pending_ack {
        let path = format!("/ack?topic={}&receipt_handle={handle}", job.topic);
        let _ = conn.request("POST", &path, &[]).await;
    }
    Ok(result)
}

/// The same loop against beanstalkd: put (produce), reserve-with-timeout (consume), delete (ack).
async fn beanstalk_loop(addr: SocketAddr, job: &Job) -> Result<CoreResult, String> {
    let mut conn = beanstalk::Conn::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut result = CoreResult::new(0);
    let io = |e: std::io::Error| format!("beanstalkd request failed: {e}");
    // Pipelined cycles delete the previous job together with the next put.
    let mut pending: Option<u64> = None;
    loop {
        if job.stop.load(Ordering::Relaxed)
            || Instant::now() >= job.deadline
            || !take_budget(&job.budget)
        {
            break;
        }
        let start = Instant::now();
        if job.pipeline {
            let (deleted, (inserted, put_at), (reserved, reserved_at)) = conn
                .cycle(pending.take(), &job.message, 1)
                .await
                .map_err(io)?;
            if let Some((ok, at)) = deleted {
                result.record_span(Op::Ack, start, at, ok);
            }
            result.record_span(Op::Produce, start, put_at, inserted);
            let delivered = reserved.is_some_and(|(_, len)| len == job.message.len());
            result.record_span(Op::Consume, start, reserved_at, delivered);
            result.record_span(Op::Cycle, start, reserved_at, delivered);
            pending = reserved.map(|(id, _)| id);
            job.progress.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let inserted = conn.put(&job.message).await.map_err(io)?;
        result.record(Op::Produce, start, inserted);
        if job.workload == Workload::Cycle {
            let t1 = Instant::now();
            let reserved = conn.reserve(1).await.map_err(io)?;
            result.record(
                Op::Consume,
                t1,
                reserved.is_some_and(|(_, len)| len == job.message.len()),
            );
            if let Some((id, _)) = reserved {
                let t2 = Instant::now();
                let deleted = conn.delete(id).await.map_err(io)?;
                result.record(Op::Ack, t2, deleted);
                result.record(Op::Cycle, start, deleted);
            }
        }
        job.progress.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(id) = pending {
        let _ = conn.delete(id).await;
    }
    Ok(result)
}

/// Histogram for one operation on one core (µs, 1 µs to 60 s).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn plan(extra: &[&str]) -> Result<Plan, String> {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(extra);
        let wrapper = Wrapper::try_parse_from(argv).map_err(|e| e.to_string())?;
        wrapper.args.plan()
    }

    #[test]
    fn defaults_make_a_valid_plan() {
        let p = plan(&[]).unwrap();
        assert_eq!(p.duration, Duration::from_secs(10));
        assert_eq!(p.args.connections, 16);
        assert!(!p.client_cpus.is_empty() && !p.server_cpus.is_empty());
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        for (args, needle) in [
            (vec!["--connections", "0"], "--connections"),
            (vec!["--connections", "5000"], "--connections"),
            (vec!["--partitions", "0"], "--partitions"),
            (vec!["--rate", "0"], "--rate"),
            (vec!["--duration", "0"], "--duration"),
            (vec!["--duration", "ten"], "--duration"),
            (vec!["--visibility=-1"], "--visibility"),
            (vec!["--fsync", "sometimes"], "fsync"),
            (vec!["--message-bytes", "2000000"], "--message-bytes"),
            (vec!["--client-cpus", "999"], "cpu 999"),
            (vec!["--workload", "dance"], "dance"),
        ] {
            let err = plan(&args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
}
