//! `berth-bench`: berth's load generator, a crate and binary of its own (the server binary holds the server). One pinned glommio executor per client CPU, each driving its connections in a
//! closed loop (or paced, open loop, at `--rate`), recording per-core HDR histograms per operation and the messages
//! they carried; then a table, JSON, `.hgrm` percentile files and an SVG plot, plus the server's own per-core
//! histograms from `/metrics`. The same loop drives berth (HTTP, single messages or `--batch N`), beanstalkd,
//! Redis Streams and NATS JetStream (`--protocol`), so the baselines are measured by the same client in the same
//! way. Against several berth nodes (`--server URL1,URL2,...`) each core's connections go round robin over them,
//! and the results are also kept per node.

mod beanstalk;
mod http;
mod nats;
mod redis;
pub mod report;
mod resp;
mod server;
mod sqs;
mod wire;

use berth::duration::parse_duration_ms;
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use report::{CoreResult, CpuTime, Op, RunReport, ServerHistograms};
use server::{parse_servers, processes_cpu_us, topic_cap, Embedded};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
    /// Redis Streams (XADD / XREADGROUP / XACK in a consumer group), as a baseline in the same run; needs
    /// `--server HOST:PORT` of a running redis-server (and `--server-pid` for its CPU).
    Redis,
    /// NATS JetStream (publish with acks / pull consumer fetch / double-acked `+ACK`) on a file-backed work-queue
    /// stream of `--nats-replicas` replicas, as a baseline in the same run; needs `--server HOST:PORT` of a running
    /// nats-server with JetStream (one server of a cluster will do; and `--server-pid` for its CPU, or the
    /// cluster's).
    Nats,
    /// berth's SQS face (SendMessage / ReceiveMessage / DeleteMessage in the JSON protocol), against the same
    /// server as `berth`: what the SQS face costs over the native API (`benches/sqs_cost.sh`). `--batch` up to 10.
    Sqs,
}

impl Protocol {
    /// berth, natively or through its SQS face: the same server, topics and metrics.
    fn is_berth(self) -> bool {
        matches!(self, Protocol::Berth | Protocol::Sqs)
    }

    fn name(self) -> &'static str {
        match self {
            Protocol::Berth => "berth",
            Protocol::Sqs => "sqs",
            Protocol::Beanstalkd => "beanstalkd",
            Protocol::Redis => "redis",
            Protocol::Nats => "nats",
        }
    }
}

/// The server's default `max_batch_records` (docs/api.md, "Produce": a batch): the largest `--batch`.
pub const MAX_BATCH_RECORDS: usize = 1000;
/// The server's default `max_batch_bytes`: a produce batch's frames must fit.
pub const MAX_BATCH_BYTES: usize = 16 << 20;
/// berth's default per-partition `max_in_flight` (and `max_acked_ahead`) for a topic.
const DEFAULT_TOPIC_CAP: usize = 1024;
/// berth's upper bound on those caps.
const MAX_TOPIC_CAP: usize = 1 << 20;

/// The command line: where the server is, then the run's options.
#[derive(clap::Parser, Debug)]
#[command(
    name = "berth-bench",
    version,
    about = "berth's load generator: per-core HDR histograms of produce, consume and ack against berth, beanstalkd, Redis Streams or NATS JetStream"
)]
struct Cli {
    /// Server(s) to load [default: an embedded `berth serve` on --server-cpus, with a temp data dir]. berth only:
    /// several, comma separated, and each client core spreads its connections over them round robin. beanstalkd,
    /// redis and nats: HOST:PORT of a running server.
    #[arg(long, env = "BERTH_SERVER")]
    server: Option<String>,
    /// HTTPS: trust only the CA certificate(s) in this PEM file (as curl's --cacert), for a server started with
    /// --tls-cert-file.
    #[arg(long, env = "BERTH_CACERT")]
    cacert: Option<PathBuf>,
    /// The bearer token an external server requires (one started with --auth-token-file), sent with every request.
    #[arg(long, env = "BERTH_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    #[command(flatten)]
    args: BenchArgs,
}

fn main() {
    use clap::Parser as _;
    let cli = Cli::parse();
    if let Some(token) = &cli.auth_token {
        if let Err(e) = http::set_auth_token(token) {
            eprintln!("berth-bench: {e}");
            std::process::exit(2);
        }
    }
    if let Err(e) = run(&cli.args, cli.server.as_deref(), cli.cacert.as_deref()) {
        eprintln!("berth-bench: {e}");
        std::process::exit(1);
    }
}

/// mimalloc, as in the server: the client's request loop allocates small buffers on every core.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The `berth` binary an embedded server runs: `--berth-bin`, else the `berth` beside this binary (both are built
/// into the same target directory).
fn berth_binary(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = given {
        return Ok(path.to_path_buf());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let beside = me.with_file_name("berth");
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "no berth binary beside {} for the embedded server: build it (cargo build --release), pass --berth-bin PATH, or load a running one with --server URL",
            me.display()
        ))
    }
}

/// The run's options.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct BenchArgs {
    /// The `berth` binary the embedded server runs [default: the one beside berth-bench].
    #[arg(long, env = "BERTH_BIN")]
    #[serde(skip)]
    pub berth_bin: Option<PathBuf>,
    /// produce | consume | cycle.
    #[arg(long, value_enum, default_value = "cycle")]
    pub workload: Workload,
    /// berth, or beanstalkd, redis or nats (JetStream) as a baseline.
    #[arg(long, value_enum, default_value = "berth")]
    pub protocol: Protocol,
    /// Messages per request: produce sends N records in one request (berth: `application/vnd.berth.frames`;
    /// redis: N pipelined XADDs; nats: N pipelined publishes), consume asks for up to N (`max=N`; redis `COUNT N`;
    /// nats a fetch of `batch` N) and acks them in one request (nats: N pipelined acks).
    /// 1 is version 1's single-message requests. At most the server's default `max_batch_records` (1000).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// berth: `max_in_flight` and `max_acked_ahead` of the bench topic [default: berth's 1024, raised with
    /// --batch to cover twice every connection's batch].
    #[arg(long)]
    pub max_in_flight: Option<usize>,
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
    /// How long to run (consume: at most this long; it stops sooner once the topic is drained).
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
    /// Server process id(s), comma separated, to report server CPU per operation against an external server: the
    /// CPU of all of them is added up. With several `--server` URLs, give one per node (or none: not measured).
    #[arg(long, value_delimiter = ',')]
    #[serde(serialize_with = "serialize_pids")]
    pub server_pid: Option<Vec<u32>>,
    /// berth: use this existing topic instead of creating (and deleting) one; it must exist on every `--server`.
    /// Its settings are its own: --partitions and --max-in-flight do not apply (--visibility does, per consume).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// nats: the `num_replicas` of the bench's JetStream stream (and its consumer) [default: 1]; up to 5, and at most
    /// the cluster's servers.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_replicas: Option<usize>,
}

/// `--server-pid` in the JSON settings: a number when one pid was given (as before lists were accepted), else a list.
fn serialize_pids<S: serde::Serializer>(pids: &Option<Vec<u32>>, s: S) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    match pids.as_deref() {
        Some([one]) => one.serialize(s),
        other => other.serialize(s),
    }
}

/// Validated, resolved settings.
struct Plan {
    args: BenchArgs,
    duration: Duration,
    visibility: String,
    client_cpus: Vec<usize>,
    server_cpus: Vec<usize>,
    /// HTTPS (`--cacert`): how every berth connection checks the server.
    tls: Option<Arc<rustls::ClientConfig>>,
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
        if self.batch == 0 || self.batch > MAX_BATCH_RECORDS {
            return Err(format!(
                "--batch must be 1..={MAX_BATCH_RECORDS} (the server's default max_batch_records)"
            ));
        }
        if self.batch > 1 && self.batch * (self.message_bytes + 4) > MAX_BATCH_BYTES {
            return Err(format!(
                "--batch {} of {}-byte messages is over the server's default max_batch_bytes ({MAX_BATCH_BYTES})",
                self.batch, self.message_bytes
            ));
        }
        if self.batch > 1 && self.protocol == Protocol::Beanstalkd {
            return Err("--batch: beanstalkd has no batches; use --batch 1 with it".into());
        }
        if self.batch > sqs::MAX_SQS_BATCH && self.protocol == Protocol::Sqs {
            return Err("--batch: SQS batches hold at most 10 messages".into());
        }
        if self.server_pid.as_ref().is_some_and(|p| p.is_empty()) {
            return Err("--server-pid: no pid given".into());
        }
        if let Some(topic) = &self.topic {
            if !self.protocol.is_berth() {
                return Err("--topic: berth only".into());
            }
            let valid = !topic.is_empty()
                && topic.len() <= 128
                && topic
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !valid {
                return Err(format!(
                    "--topic {topic:?}: not a topic name ([A-Za-z0-9._-]{{1,128}})"
                ));
            }
        }
        if let Some(r) = self.nats_replicas {
            if self.protocol != Protocol::Nats {
                return Err("--nats-replicas: --protocol nats only".into());
            }
            if !(1..=5).contains(&r) {
                return Err("--nats-replicas must be 1..=5 (JetStream's limit)".into());
            }
        }
        if let Some(cap) = self.max_in_flight {
            if cap == 0 || cap > MAX_TOPIC_CAP {
                return Err(format!("--max-in-flight must be 1..={MAX_TOPIC_CAP}"));
            }
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
            tls: None,
        })
    }
}

/// Runs the benchmark; `server` is the global --server when given explicitly: one URL, or several comma separated
/// (berth only), over which every client core spreads its connections round robin.
/// `cacert` (the global --cacert): the berth servers speak HTTPS, with a certificate signed by this CA.
pub fn run(args: &BenchArgs, server: Option<&str>, cacert: Option<&Path>) -> Result<(), String> {
    let mut plan = args.plan()?;
    let protocol = plan.args.protocol;
    if let Some(ca) = cacert {
        if protocol != Protocol::Berth || server.is_none() {
            return Err(
                "--cacert: --protocol berth against a running --server https://... only".into(),
            );
        }
        plan.tls = Some(berth::tls::client_config(
            ca,
            Some(berth::tls::ALPN_HTTP),
            None,
        )?);
    }
    if !protocol.is_berth() && server.is_none() {
        return Err(format!(
            "--protocol {} needs --server HOST:PORT of a running {}",
            protocol.name(),
            match protocol {
                Protocol::Redis => "redis-server",
                Protocol::Nats => "nats-server with JetStream",
                _ => "beanstalkd",
            }
        ));
    }
    let (embedded, targets) = match server {
        Some(list) => (None, parse_servers(list)?),
        None => {
            let (e, addr) = Embedded::start(&plan)?;
            (Some(e), vec![(format!("http://{addr}"), addr)])
        }
    };
    let several = targets.len() > 1;
    if several && protocol != Protocol::Berth {
        return Err(format!(
            "several --server URLs: --protocol berth only, not {}",
            protocol.name()
        ));
    }
    let addrs: Vec<SocketAddr> = targets.iter().map(|(_, a)| *a).collect();
    let addr = addrs[0];
    let mut server_pids: Vec<u32> = match (&args.server_pid, &embedded) {
        (Some(pids), _) => pids.clone(),
        (None, Some(e)) => vec![e.child.id()],
        (None, None) => Vec::new(),
    };
    let mut server_cpu_note = None;
    if several && server_pids.len() < targets.len() {
        server_cpu_note = Some(format!(
            "not measured: {} nodes but {} --server-pid (give one per node, comma separated, to add up their CPU)",
            targets.len(),
            server_pids.len()
        ));
        server_pids.clear();
    }
    let clients: Vec<berth::client::Client> = match cacert {
        None => addrs
            .iter()
            .map(|a| {
                berth::client::Client::new(&format!("http://{a}")).with_token(http::auth_token())
            })
            .collect(),
        Some(ca) => addrs
            .iter()
            .map(|a| {
                berth::client::Client::new(&format!("https://{a}"))
                    .with_token(http::auth_token())
                    .with_ca_file(ca)
            })
            .collect::<Result<_, _>>()?,
    };
    let client = &clients[0];
    let owned_topic = args.topic.is_none();
    let topic = args
        .topic
        .clone()
        .unwrap_or_else(|| format!("bench-{}", berth::clock::wall_clock_ms()));
    match protocol {
        Protocol::Beanstalkd => {}
        Protocol::Redis => redis::create_group(addr, &topic)?,
        Protocol::Nats => nats::create_stream(
            addr,
            &nats::Setup {
                stream: &topic,
                replicas: plan.args.nats_replicas.unwrap_or(1),
                ack_wait: Duration::from_millis(
                    parse_duration_ms(&plan.visibility)
                        .map_err(|e| format!("--visibility: {}", e.0))?,
                ),
                max_waiting: (2 * plan.args.connections * plan.client_cpus.len()).max(512),
            },
        )?,
        Protocol::Berth | Protocol::Sqs if owned_topic => {
            let cap = topic_cap(&plan);
            let mut path = format!(
                "/topics/{topic}?partitions={}&visibility={}",
                plan.args.partitions, plan.visibility
            );
            if cap != DEFAULT_TOPIC_CAP {
                path.push_str(&format!("&max_in_flight={cap}&max_acked_ahead={cap}"));
            }
            let created = client.call("PUT", &path, &[])?;
            if created.status != 201 {
                return Err(format!(
                    "cannot create the bench topic: {} {}",
                    created.status,
                    created.text()
                ));
            }
        }
        Protocol::Berth | Protocol::Sqs => {
            for ((url, _), c) in targets.iter().zip(&clients) {
                let a = c.call("GET", &format!("/topics/{topic}"), &[])?;
                if a.status != 200 {
                    return Err(format!(
                        "--topic {topic}: {url} answers {} {}",
                        a.status,
                        a.text()
                    ));
                }
            }
        }
    }
    if plan.args.workload == Workload::Consume {
        eprintln!("pre-filling {} messages...", plan.args.messages);
        prefill(&plan, &addrs, &topic)?;
    }
    let metrics = |c: &berth::client::Client| {
        c.call("GET", "/metrics", &[])
            .ok()
            .filter(|a| a.status == 200)
            .map(|a| a.text())
    };
    let metrics_before: Vec<Option<String>> = if protocol.is_berth() {
        clients.iter().map(metrics).collect()
    } else {
        Vec::new()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone());
    let progress = Arc::new(AtomicU64::new(0));
    let cpu_before = processes_cpu_us(&server_pids);
    let started = Instant::now();
    let ticker = spawn_progress(progress.clone(), stop.clone());
    let results = run_clients(&plan, &addrs, &topic, stop.clone(), progress.clone());
    let elapsed = started.elapsed();
    let cpu_after = processes_cpu_us(&server_pids);
    stop.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    eprintln!();
    let results = results?;
    let server_histograms = match protocol {
        Protocol::Berth | Protocol::Sqs => ServerHistograms::of_nodes(
            targets
                .iter()
                .zip(&clients)
                .zip(&metrics_before)
                .map(|(((url, _), c), before)| {
                    let after = metrics(c).unwrap_or_default();
                    (
                        url.clone(),
                        ServerHistograms::from_metrics(before.as_deref(), &after),
                    )
                })
                .collect(),
        ),
        _ => ServerHistograms::default(),
    };
    let mut per_node: Vec<CoreResult> = targets
        .iter()
        .map(|_| CoreResult::new(usize::MAX))
        .collect();
    let mut cores = Vec::with_capacity(results.len());
    for run in results {
        for (merged, node) in per_node.iter_mut().zip(&run.nodes) {
            merged.merge(node);
        }
        cores.push(run.core);
    }
    let mut report = RunReport::new(
        &plan.args,
        elapsed,
        cores,
        cpu_before.zip(cpu_after).map(|(b, a)| CpuTime {
            user_us: a.user_us.saturating_sub(b.user_us),
            system_us: a.system_us.saturating_sub(b.system_us),
        }),
        server_histograms,
        plan.client_cpus.clone(),
        if embedded.is_some() {
            plan.server_cpus.clone()
        } else {
            Vec::new()
        },
    );
    if several {
        report.nodes = targets
            .iter()
            .map(|(url, _)| url.clone())
            .zip(per_node)
            .collect();
    }
    report.server_cpu_note = server_cpu_note;
    // A reader that closed the pipe early is not a failure of the run: no panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), report.table().as_bytes());
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
    match protocol {
        Protocol::Berth | Protocol::Sqs if owned_topic => {
            let _ = client.call("DELETE", &format!("/topics/{topic}"), &[]);
        }
        Protocol::Berth | Protocol::Sqs => {}
        Protocol::Redis => {
            let _ = redis::command(addr, &[b"DEL", topic.as_bytes()]);
        }
        Protocol::Nats => {
            if let Err(e) = nats::delete_stream(addr, &topic) {
                eprintln!("berth-bench: cannot delete the bench stream: {e}");
            }
        }
        Protocol::Beanstalkd => {}
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

/// Fills the topic for the consume workload with produces (of `--batch` messages) from the client cores.
fn prefill(plan: &Plan, addrs: &[SocketAddr], topic: &str) -> Result<(), String> {
    let mut fill = plan.args.clone();
    fill.workload = Workload::Produce;
    fill.rate = None;
    let fill_plan = Plan {
        args: fill,
        duration: Duration::from_secs(3600),
        visibility: plan.visibility.clone(),
        client_cpus: plan.client_cpus.clone(),
        server_cpus: plan.server_cpus.clone(),
        tls: plan.tls.clone(),
    };
    let progress = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicU64::new(plan.args.messages));
    let results = run_clients_with(&fill_plan, addrs, topic, stop, progress, Some(budget))?;
    let errors: u64 = results
        .iter()
        .map(|r| r.core.errors[Op::Produce as usize])
        .sum();
    if errors > 0 {
        return Err(format!("pre-filling: {errors} produce requests failed"));
    }
    Ok(())
}

fn run_clients(
    plan: &Plan,
    addrs: &[SocketAddr],
    topic: &str,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
) -> Result<Vec<CoreRun>, String> {
    run_clients_with(plan, addrs, topic, stop, progress, None)
}

fn run_clients_with(
    plan: &Plan,
    addrs: &[SocketAddr],
    topic: &str,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    budget: Option<Arc<AtomicU64>>,
) -> Result<Vec<CoreRun>, String> {
    let deadline = Instant::now() + plan.duration;
    let mut handles = Vec::new();
    let per_conn_interval = plan.args.rate.map(|rate| {
        let total_conns = (plan.args.connections * plan.client_cpus.len()) as f64;
        Duration::from_secs_f64(total_conns / rate as f64)
    });
    let message = Arc::new(vec![b'x'; plan.args.message_bytes]);
    for (index, &cpu) in plan.client_cpus.iter().enumerate() {
        let job = Job {
            protocol: plan.args.protocol,
            workload: plan.args.workload,
            pipeline: plan.args.pipeline,
            batch: plan.args.batch,
            connections: plan.args.connections,
            message: message.clone(),
            topic: topic.to_string(),
            visibility: plan.visibility.clone(),
            deadline,
            interval: per_conn_interval,
            stop: stop.clone(),
            progress: progress.clone(),
            budget: budget.clone(),
            tls: plan.tls.clone(),
        };
        let handle = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("bench-client-{index}"))
            .spin_before_park(Duration::from_micros(plan.args.client_spin_us))
            .spawn({
                let addrs = addrs.to_vec();
                move || async move { client_core(index, cpu, addrs, job).await }
            })
            .map_err(|e| format!("cannot start a client executor on cpu {cpu}: {e}"))?;
        handles.push(handle);
    }
    let mut results = Vec::new();
    let mut first_error = None;
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => results.push(r),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(format!("client executor failed: {e}"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

/// What one client core runs.
struct Job {
    protocol: Protocol,
    workload: Workload,
    pipeline: bool,
    batch: usize,
    connections: usize,
    message: Arc<Vec<u8>>,
    topic: String,
    visibility: String,
    deadline: Instant,
    interval: Option<Duration>,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    /// Remaining messages allowed across all cores (pre-fill); None = until the deadline.
    budget: Option<Arc<AtomicU64>>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// One client core's results: all its connections, and its connections to each node (indexed like `--server`).
struct CoreRun {
    core: CoreResult,
    nodes: Vec<CoreResult>,
}

/// The node (index into `--server`) of connection `conn` of client core `core`: round robin over the nodes,
/// counting every core's connections in turn, so each core's connections are spread evenly and so are the cores'.
fn node_of(core: usize, conn: usize, connections: usize, nodes: usize) -> usize {
    (core * connections + conn) % nodes
}

async fn client_core(
    index: usize,
    cpu: usize,
    addrs: Vec<SocketAddr>,
    job: Job,
) -> Result<CoreRun, String> {
    let job = std::rc::Rc::new(job);
    let mut tasks = Vec::new();
    for conn in 0..job.connections {
        let job = job.clone();
        let node = node_of(index, conn, job.connections, addrs.len());
        let addr = addrs[node];
        tasks.push(glommio::spawn_local(async move {
            (node, connection(index, conn, addr, &job).await)
        }));
    }
    let mut result = CoreResult::new(cpu);
    let mut nodes: Vec<CoreResult> = addrs.iter().map(|_| CoreResult::new(usize::MAX)).collect();
    let mut first_error = None;
    // Every connection is awaited (none is left running) before an error is returned.
    for t in tasks {
        match t.await {
            (node, Ok(r)) => {
                result.merge(&r);
                nodes[node].merge(&r);
            }
            (_, Err(e)) => {
                job.stop.store(true, Ordering::Relaxed);
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(CoreRun {
            core: result,
            nodes,
        }),
    }
}

/// Connects one connection of the job's protocol and runs the loop on it.
async fn connection(
    core: usize,
    index: usize,
    addr: SocketAddr,
    job: &Job,
) -> Result<CoreResult, String> {
    let connect = |e: io::Error| format!("connect {addr}: {e}");
    // Cycles wait up to 1 s for their message; draining (consume) must not wait once the topic is empty.
    let waits = job.workload == Workload::Cycle;
    let message = job.message.clone();
    match job.protocol {
        Protocol::Berth => {
            let wait = if waits { "1s" } else { "0" };
            let d = http::Berth::connect(
                addr,
                job.tls.as_ref(),
                &job.topic,
                &job.visibility,
                wait,
                job.batch,
                message,
            )
            .await
            .map_err(connect)?;
            drive(d, job).await
        }
        Protocol::Beanstalkd => {
            let d = beanstalk::Beanstalk::connect(addr, message, u32::from(waits))
                .await
                .map_err(connect)?;
            drive(d, job).await
        }
        Protocol::Redis => {
            let consumer = format!("c{core}-{index}");
            let block = waits.then_some(1000);
            let d = redis::Redis::connect(addr, &job.topic, &consumer, job.batch, message, block)
                .await
                .map_err(connect)?;
            drive(d, job).await
        }
        Protocol::Sqs => {
            let visibility_s =
                parse_duration_ms(&job.visibility).map_or(30, |ms| (ms / 1000).max(1));
            let d = sqs::Sqs::connect(
                addr,
                &job.topic,
                visibility_s,
                u64::from(waits),
                job.batch,
                message,
            )
            .await
            .map_err(connect)?;
            drive(d, job).await
        }
        Protocol::Nats => {
            // A fetch waits up to 1 s for a first message (`expires`), as berth's wait=1s and redis's BLOCK 1000.
            let wait = waits.then_some(Duration::from_secs(1));
            let d = nats::Nats::connect(addr, &job.topic, job.batch, message, wait)
                .await
                .map_err(connect)?;
            drive(d, job).await
        }
    }
}

/// Takes up to `want` messages from the pre-fill budget (all of them without one); 0 when it is spent.
fn take_budget(budget: &Option<Arc<AtomicU64>>, want: usize) -> usize {
    match budget {
        None => want,
        Some(b) => b
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                v.checked_sub(1).map(|_| v.saturating_sub(want as u64))
            })
            .map_or(0, |v| v.min(want as u64) as usize),
    }
}

/// What a consume got.
pub struct Consumed<H> {
    /// The leases taken, to be acked.
    pub handles: Vec<H>,
    /// Of those, the messages whose body had the expected length.
    pub intact: usize,
    /// The request succeeded (berth 200 with well-formed frames; beanstalkd RESERVED; redis a reply of entries;
    /// nats a full batch, or a 404/408 status after what there was).
    pub ok: bool,
    /// Nothing was deliverable (berth 204, beanstalkd TIMED_OUT, redis nil, nats a 404/408 status alone).
    pub empty: bool,
}

impl<H> Consumed<H> {
    /// Succeeded with every message intact.
    fn delivered(&self) -> bool {
        self.ok && !self.handles.is_empty() && self.intact == self.handles.len()
    }
}

/// A pipelined cycle's answers (ack of the previous batch, produce, consume), each with the time it arrived.
pub struct Pipelined<H> {
    pub acked: Option<(usize, Instant)>,
    pub produced: (usize, Instant),
    pub consumed: (Consumed<H>, Instant),
}

/// One connection of a protocol, in the load generator's terms. Each call is one request (berth), or one write of
/// pipelined commands (beanstalkd, redis, nats), and returns when every answer is in.
pub(crate) trait Driver {
    /// What acks a delivered message.
    type Handle;
    /// Produces `n` messages (at most the batch): how many the server accepted.
    async fn produce(&mut self, n: usize) -> io::Result<usize>;
    /// Leases up to a batch of messages.
    async fn consume(&mut self) -> io::Result<Consumed<Self::Handle>>;
    /// Acks these: how many the server acked.
    async fn ack(&mut self, handles: &[Self::Handle]) -> io::Result<usize>;
    /// In one write: the ack of `previous` (if any), a batch produce, a batch consume.
    async fn pipelined_cycle(
        &mut self,
        previous: &[Self::Handle],
    ) -> io::Result<Pipelined<Self::Handle>>;
}

/// The loop every connection runs, whatever the protocol.
async fn drive<D: Driver>(mut d: D, job: &Job) -> Result<CoreResult, String> {
    let protocol = job.protocol.name();
    let io = |e: io::Error| format!("{protocol} request failed: {e}");
    let mut result = CoreResult::new(0);
    let mut intended = Instant::now();
    // Pipelined cycles ack the previous batch together with the next produce.
    let mut pending: Vec<D::Handle> = Vec::new();
    loop {
        if job.stop.load(Ordering::Relaxed) || Instant::now() >= job.deadline {
            break;
        }
        let n = take_budget(&job.budget, job.batch);
        if n == 0 {
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
                let accepted = d.produce(n).await.map_err(io)?;
                result.record(Op::Produce, start, accepted == n, accepted);
            }
            Workload::Consume => {
                let t0 = Instant::now();
                let consumed = d.consume().await.map_err(io)?;
                if consumed.empty {
                    break;
                }
                result.record(Op::Consume, t0, consumed.delivered(), consumed.intact);
                if consumed.handles.is_empty() {
                    continue;
                }
                let t1 = Instant::now();
                let acked = d.ack(&consumed.handles).await.map_err(io)?;
                let ok = acked == consumed.handles.len();
                result.record(Op::Ack, t1, ok, acked);
                result.record(Op::Cycle, start, ok, acked);
            }
            Workload::Cycle if job.pipeline => {
                let previous = std::mem::take(&mut pending);
                let p = d.pipelined_cycle(&previous).await.map_err(io)?;
                if let Some((acked, at)) = p.acked {
                    result.record_span(Op::Ack, start, at, acked == previous.len(), acked);
                }
                let (produced, at) = p.produced;
                result.record_span(Op::Produce, start, at, produced == job.batch, produced);
                let (consumed, at) = p.consumed;
                let ok = consumed.delivered();
                result.record_span(Op::Consume, start, at, ok, consumed.intact);
                result.record_span(Op::Cycle, start, at, ok, consumed.intact);
                pending = consumed.handles;
            }
            Workload::Cycle => {
                let produced = d.produce(n).await.map_err(io)?;
                result.record(Op::Produce, start, produced == n, produced);
                let t1 = Instant::now();
                let consumed = d.consume().await.map_err(io)?;
                result.record(Op::Consume, t1, consumed.delivered(), consumed.intact);
                if !consumed.handles.is_empty() {
                    let t2 = Instant::now();
                    let acked = d.ack(&consumed.handles).await.map_err(io)?;
                    let ok = acked == consumed.handles.len();
                    result.record(Op::Ack, t2, ok, acked);
                    result.record(Op::Cycle, start, ok, acked);
                }
            }
        }
        job.progress.fetch_add(1, Ordering::Relaxed);
    }
    if !pending.is_empty() {
        let _ = d.ack(&pending).await;
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
            (vec!["--topic", "a/b"], "--topic"),
            (vec!["--topic", "t", "--protocol", "redis"], "--topic"),
            (vec!["--nats-replicas", "3"], "--nats-replicas"),
            (
                vec!["--protocol", "nats", "--nats-replicas", "7"],
                "--nats-replicas",
            ),
        ] {
            let err = plan(&args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn several_servers_are_parsed_and_connections_spread_round_robin() {
        let s = parse_servers("http://127.0.0.1:1, 127.0.0.1:2/,").unwrap();
        assert_eq!(
            s.iter()
                .map(|(u, a)| (u.as_str(), a.port()))
                .collect::<Vec<_>>(),
            vec![("http://127.0.0.1:1", 1), ("127.0.0.1:2/", 2)]
        );
        assert!(parse_servers(" , ").unwrap_err().contains("no URL"));
        assert!(parse_servers("127.0.0.1:1,127.0.0.1:1")
            .unwrap_err()
            .contains("twice"));
        // One node: everything on it. Two cores of 3 connections over 2 nodes: 0 1 0 | 1 0 1.
        assert!((0..4).all(|c| node_of(c, 1, 8, 1) == 0));
        let spread: Vec<usize> = (0..2)
            .flat_map(|core| (0..3).map(move |conn| node_of(core, conn, 3, 2)))
            .collect();
        assert_eq!(spread, vec![0, 1, 0, 1, 0, 1]);
        // One connection per core: the cores take the nodes in turn.
        assert_eq!(
            (0..3).map(|c| node_of(c, 0, 1, 3)).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }
}
