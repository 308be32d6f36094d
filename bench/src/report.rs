//! Bench results: per-core histograms per operation, their merge, and the outputs (table, JSON, `.hgrm`, SVG).

use super::BenchArgs;
use hdrhistogram::Histogram;
use serde_json::json;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// An operation the load generator times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Produce,
    Consume,
    Ack,
    Cycle,
}

pub const OPS: [Op; 4] = [Op::Produce, Op::Consume, Op::Ack, Op::Cycle];

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Produce => "produce",
            Op::Consume => "consume",
            Op::Ack => "ack",
            Op::Cycle => "cycle",
        }
    }
}

/// Percentiles every output reports.
pub const PERCENTILES: [(f64, &str); 6] = [
    (50.0, "p50"),
    (90.0, "p90"),
    (99.0, "p99"),
    (99.9, "p99.9"),
    (99.99, "p99.99"),
    (100.0, "max"),
];

/// One client core's (or the merged) results.
#[derive(Debug, Clone)]
pub struct CoreResult {
    pub cpu: usize,
    /// Latency in µs per operation, indexed like OPS.
    pub latency_us: Vec<Histogram<u64>>,
    /// Answers that were not the expected success, per operation.
    pub errors: [u64; 4],
    /// Messages carried by the successful part of each operation (produced, delivered intact, acked; for a cycle,
    /// acked, or delivered when pipelined): the request count times the batch when all goes well.
    pub messages: [u64; 4],
}

impl CoreResult {
    pub fn new(cpu: usize) -> CoreResult {
        CoreResult {
            cpu,
            latency_us: OPS.iter().map(|_| super::new_histogram()).collect(),
            errors: [0; 4],
            messages: [0; 4],
        }
    }

    /// Records one request (or cycle) that started at `started` and ends now, carrying `messages` messages.
    pub fn record(&mut self, op: Op, started: Instant, ok: bool, messages: usize) {
        self.record_span(op, started, Instant::now(), ok, messages);
    }

    /// Records a latency measured between two instants (pipelined replies arrive at different times).
    pub fn record_span(
        &mut self,
        op: Op,
        started: Instant,
        ended: Instant,
        ok: bool,
        messages: usize,
    ) {
        let i = op as usize;
        let us = ended.saturating_duration_since(started).as_micros() as u64;
        self.latency_us[i].saturating_record(us.max(1));
        self.messages[i] += messages as u64;
        if !ok {
            self.errors[i] += 1;
        }
    }

    /// Adds another result's counts (histograms merge exactly: same bounds).
    pub fn merge(&mut self, other: &CoreResult) {
        for i in 0..OPS.len() {
            self.latency_us[i]
                .add(&other.latency_us[i])
                .expect("same histogram bounds");
            self.errors[i] += other.errors[i];
            self.messages[i] += other.messages[i];
        }
    }
}

/// A whole run.
pub struct RunReport {
    pub args: BenchArgs,
    pub elapsed: Duration,
    pub cores: Vec<CoreResult>,
    pub merged: CoreResult,
    /// Server CPU time spent during the run, µs (embedded server or --server-pid).
    pub server_cpu_us: Option<CpuTime>,
    /// The server's own histograms from `/metrics` (berth only), per core.
    pub server: ServerHistograms,
    pub client_cpus: Vec<usize>,
    pub server_cpus: Vec<usize>,
    /// With several `--server` URLs: each node's results (its connections, over every client core), keyed by the
    /// URL as given; empty with one server.
    pub nodes: Vec<(String, CoreResult)>,
    /// Why server CPU is not reported, when that needs saying (several nodes without a pid for each).
    pub server_cpu_note: Option<String>,
}

/// The server histograms the report shows: (Prometheus name, what the table calls it, JSON key).
pub const SERVER_HISTOGRAMS: [(&str, &str, &str); 8] = [
    (
        "berth_request_duration_seconds",
        "request latency",
        "server_latency_us",
    ),
    (
        "berth_frontier_lag_seconds",
        "frontier lag",
        "server_frontier_lag_us",
    ),
    // The per-stage breakdown (a berth server's `berth_stage_*_seconds`, docs/api.md "Metrics"), printed as one
    // table per core with the request latency as its `service` row.
    (
        "berth_stage_queue_seconds",
        "queue",
        "server_stage_queue_us",
    ),
    (
        "berth_stage_journal_queue_seconds",
        "journal queue",
        "server_stage_journal_queue_us",
    ),
    (
        "berth_stage_journal_write_seconds",
        "journal write",
        "server_stage_journal_write_us",
    ),
    (
        "berth_stage_journal_sync_seconds",
        "journal sync",
        "server_stage_journal_sync_us",
    ),
    (
        "berth_stage_reply_seconds",
        "reply",
        "server_stage_reply_us",
    ),
    (
        "berth_stage_housekeeping_seconds",
        "housekeeping",
        "server_stage_housekeeping_us",
    ),
];

/// Where the stages start in `SERVER_HISTOGRAMS`.
const FIRST_STAGE: usize = 2;

/// What each stage row of the breakdown measures, in `SERVER_HISTOGRAMS`' order from `FIRST_STAGE`, the request
/// latency (`service`) between `queue` and the journal's.
const STAGE_NOTES: [&str; 6] = [
    "last read -> handling starts",
    "append queued -> its journal pass starts (per entry)",
    "a journal pass's write (per pass)",
    "a journal pass's fdatasync (per pass)",
    "answer queued -> written to the socket (per write)",
    "one slice of timers, scans, sweeps (core busy, no request served)",
];

/// Quantiles reported for the server's histograms.
pub const SERVER_QUANTILES: [&str; 4] = ["0.5", "0.9", "0.99", "0.999"];

/// One core's quantiles of one server histogram: each the upper bound (µs) of the bucket that holds it, so at the
/// histogram's bucket resolution; `u64::MAX` when it is in the +Inf bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreQuantiles {
    pub core: String,
    pub count: u64,
    pub quantiles: Vec<(String, u64)>,
}

/// Every server histogram of `SERVER_HISTOGRAMS`, in that order.
#[derive(Debug, Clone, Default)]
pub struct ServerHistograms {
    pub histograms: Vec<Vec<CoreQuantiles>>,
    /// Counted over the run only (a /metrics taken before it was subtracted), else over the server's lifetime.
    pub run_only: bool,
}

impl ServerHistograms {
    /// From `/metrics` texts taken before (None: not available) and after the run.
    pub fn from_metrics(before: Option<&str>, after: &str) -> ServerHistograms {
        ServerHistograms {
            histograms: SERVER_HISTOGRAMS
                .iter()
                .map(|(name, _, _)| {
                    let mut buckets = histogram_buckets(after, name);
                    if let Some(before) = before {
                        buckets = buckets_since(buckets, &histogram_buckets(before, name));
                    }
                    quantiles(&buckets)
                })
                .collect(),
            run_only: before.is_some(),
        }
    }
}

impl ServerHistograms {
    /// Several nodes' histograms as one: with one node, its own; with several, every core of every node, the core
    /// named `URL/CORE`.
    pub fn of_nodes(mut nodes: Vec<(String, ServerHistograms)>) -> ServerHistograms {
        if nodes.len() == 1 {
            return nodes.pop().map(|(_, h)| h).unwrap_or_default();
        }
        let mut all = ServerHistograms {
            histograms: SERVER_HISTOGRAMS.iter().map(|_| Vec::new()).collect(),
            run_only: !nodes.is_empty(),
        };
        for (url, node) in nodes {
            all.run_only &= node.run_only;
            for (into, cores) in all.histograms.iter_mut().zip(node.histograms) {
                into.extend(cores.into_iter().map(|c| CoreQuantiles {
                    core: format!("{url}/{}", c.core),
                    ..c
                }));
            }
        }
        all
    }
}

/// A Prometheus histogram per core: (core, [(upper bound µs, cumulative count)]), `+Inf` as `u64::MAX`.
pub type Buckets = Vec<(String, Vec<(u64, u64)>)>;

/// The `{name}_bucket{core="N",le="..."}` series of a `/metrics` text (bounds in seconds, turned into µs). Series
/// split by kind of request (`core="N",op="..."`, request latency) are summed per core over the data path's kinds
/// (produce, consume, settle): `op="other"` (administration, and the scrapes of `/metrics` themselves) is left out.
pub fn histogram_buckets(metrics: &str, name: &str) -> Buckets {
    let prefix = format!("{name}_bucket{{core=\"");
    let mut cores: Buckets = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let Some((core, rest)) = rest.split_once("\",le=\"") else {
            continue;
        };
        let core = match core.split_once("\",op=\"") {
            Some((_, "other")) => continue,
            Some((core, _)) => core,
            None => core,
        };
        let Some((le, value)) = rest.split_once("\"} ") else {
            continue;
        };
        let Ok(count) = value.trim().parse::<u64>() else {
            continue;
        };
        let bound_us = match le {
            "+Inf" => u64::MAX,
            secs => match secs.parse::<f64>() {
                Ok(s) if s.is_finite() && s >= 0.0 => (s * 1e6).round() as u64,
                _ => continue,
            },
        };
        match cores.iter_mut().find(|(c, _)| c == core) {
            Some((_, buckets)) => match buckets.iter_mut().find(|(b, _)| *b == bound_us) {
                Some((_, total)) => *total += count,
                None => buckets.push((bound_us, count)),
            },
            None => cores.push((core.to_string(), vec![(bound_us, count)])),
        }
    }
    cores
}

/// `after` minus `before`, bucket by bucket (the counts of what happened in between).
pub fn buckets_since(mut after: Buckets, before: &Buckets) -> Buckets {
    for (core, buckets) in after.iter_mut() {
        let Some((_, earlier)) = before.iter().find(|(c, _)| c == core) else {
            continue;
        };
        for (bound, count) in buckets.iter_mut() {
            if let Some((_, was)) = earlier.iter().find(|(b, _)| b == bound) {
                *count = count.saturating_sub(*was);
            }
        }
    }
    after
}

/// Per core, the count and the quantiles of `SERVER_QUANTILES`.
pub fn quantiles(cores: &Buckets) -> Vec<CoreQuantiles> {
    cores
        .iter()
        .map(|(core, buckets)| {
            let total = buckets.iter().map(|b| b.1).max().unwrap_or(0);
            let quantiles = SERVER_QUANTILES
                .iter()
                .filter(|_| total > 0)
                .map(|q| {
                    let want = (q.parse::<f64>().unwrap_or(1.0) * total as f64).ceil() as u64;
                    let bound = buckets
                        .iter()
                        .find(|(_, c)| *c >= want)
                        .map_or(u64::MAX, |(b, _)| *b);
                    (q.to_string(), bound)
                })
                .collect();
            CoreQuantiles {
                core: core.clone(),
                count: total,
                quantiles,
            }
        })
        .collect()
}

/// The server's per-core request latency over its lifetime (`berth_request_duration_seconds`): per core, the
/// quantiles of `SERVER_QUANTILES` in µs (the tests' view of the parser).
#[cfg(test)]
fn server_latency(metrics: &str) -> Vec<(String, Vec<(String, u64)>)> {
    quantiles(&histogram_buckets(metrics, SERVER_HISTOGRAMS[0].0))
        .into_iter()
        .map(|c| (c.core, c.quantiles))
        .collect()
}

fn bound_text(us: u64) -> String {
    if us == u64::MAX {
        "inf".into()
    } else {
        us.to_string()
    }
}

/// A server's CPU time over a run, split as `/proc/PID/stat` splits it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTime {
    /// In user space (utime).
    pub user_us: u64,
    /// In the kernel on its behalf (stime: system calls, and the softirq work they run, such as loopback TCP).
    pub system_us: u64,
}

impl CpuTime {
    pub fn total_us(&self) -> u64 {
        self.user_us + self.system_us
    }
}

impl RunReport {
    pub fn new(
        args: &BenchArgs,
        elapsed: Duration,
        cores: Vec<CoreResult>,
        server_cpu_us: Option<CpuTime>,
        server: ServerHistograms,
        client_cpus: Vec<usize>,
        server_cpus: Vec<usize>,
    ) -> RunReport {
        let mut merged = CoreResult::new(usize::MAX);
        for c in &cores {
            merged.merge(c);
        }
        RunReport {
            args: args.clone(),
            elapsed,
            cores,
            merged,
            server_cpu_us,
            server,
            client_cpus,
            server_cpus,
            nodes: Vec::new(),
            server_cpu_note: None,
        }
    }

    /// The operation that defines "one unit of work" for CPU per op: cycle for cycle/consume, else produce.
    fn unit_op(&self) -> Op {
        match self.args.workload {
            super::Workload::Produce => Op::Produce,
            _ => Op::Cycle,
        }
    }

    fn rows(&self) -> Vec<(String, &CoreResult)> {
        let mut rows: Vec<(String, &CoreResult)> = self
            .cores
            .iter()
            .map(|c| (format!("cpu{}", c.cpu), c))
            .collect();
        rows.push(("all".into(), &self.merged));
        rows
    }

    /// Messages per unit operation (cycle or produce) in the whole run.
    fn unit_messages(&self) -> u64 {
        self.merged.messages[self.unit_op() as usize]
    }

    /// One table row per operation of `core`.
    fn table_rows(out: &mut String, label: &str, core: &CoreResult, secs: f64) {
        for op in OPS {
            let h = &core.latency_us[op as usize];
            if h.is_empty() {
                continue;
            }
            let _ = write!(
                out,
                "{:<6} {:<8} {:>10} {:>10.0}",
                label,
                op.name(),
                h.len(),
                h.len() as f64 / secs
            );
            for (p, _) in PERCENTILES {
                let _ = write!(out, " {:>7}", h.value_at_percentile(p));
            }
            let messages = core.messages[op as usize];
            let _ = writeln!(
                out,
                " {:>7} {:>11} {:>10.0}",
                core.errors[op as usize],
                messages,
                messages as f64 / secs
            );
        }
    }

    /// The stdout table.
    pub fn table(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "berth bench: protocol={:?} workload={:?}{} batch={} connections/core={} client_cpus={:?} server_cpus={} message={}B partitions={} elapsed={:.2}s{}",
            self.args.protocol, self.args.workload, if self.args.pipeline { " (pipelined)" } else { "" }, self.args.batch,
            self.args.connections, self.client_cpus,
            // A server this run did not start (--server URL) runs wherever it was put.
            if self.server_cpus.is_empty() { "external".to_string() } else { format!("{:?}", self.server_cpus) },
            self.args.message_bytes,
            self.args.partitions, secs,
            self.args.rate.map(|r| format!(" open-loop rate={r}/s")).unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "{:<6} {:<8} {:>10} {:>10} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>11} {:>10}",
            "client",
            "op",
            "count",
            "per_sec",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "p99.99",
            "max",
            "errors",
            "messages",
            "msg_per_sec"
        );
        for (label, core) in self.rows() {
            Self::table_rows(&mut out, &label, core, secs);
        }
        if !self.nodes.is_empty() {
            let _ = writeln!(
                out,
                "per node (each client core's connections round robin over the nodes; same columns):"
            );
            for (url, core) in &self.nodes {
                Self::table_rows(&mut out, url, core, secs);
            }
        }
        let _ = writeln!(
            out,
            "(latencies in µs per request, or per cycle, measured at the client)"
        );
        if let Some(time) = self.server_cpu_us {
            let units = self.merged.latency_us[self.unit_op() as usize].len().max(1) as f64;
            let cpu = time.total_us() as f64;
            let _ = writeln!(
                out,
                "server CPU: {:.1} µs per {} (user {:.1}, kernel {:.1}), {:.2} µs per message ({:.2} cores busy)",
                cpu / units,
                self.unit_op().name(),
                time.user_us as f64 / units,
                time.system_us as f64 / units,
                cpu / self.unit_messages().max(1) as f64,
                cpu / 1e6 / secs
            );
        } else if let Some(note) = &self.server_cpu_note {
            let _ = writeln!(out, "server CPU: {note}");
        }
        let scope = if self.server.run_only {
            "this run"
        } else {
            "whole server lifetime"
        };
        let histograms = &self.server.histograms;
        for ((_, what, _), cores) in SERVER_HISTOGRAMS[..FIRST_STAGE]
            .iter()
            .zip(histograms.iter().take(FIRST_STAGE))
        {
            // A histogram with nothing in it (no frontier moved, a server without the series) says nothing.
            for c in cores.iter().filter(|c| c.count > 0) {
                let parts: Vec<String> = c
                    .quantiles
                    .iter()
                    .map(|(q, v)| format!("q{q}={}", bound_text(*v)))
                    .collect();
                let _ = writeln!(
                    out,
                    "server core {} {what} µs ({scope}, bucket upper bounds, n={}): {}",
                    c.core,
                    c.count,
                    parts.join(" ")
                );
            }
        }
        out.push_str(&self.stage_table(scope));
        out
    }

    /// The per-stage breakdown, one table per server core that recorded any stage: each stage's count and
    /// quantiles (µs, bucket upper bounds), the request latency as `service`.
    fn stage_table(&self, scope: &str) -> String {
        let histograms = &self.server.histograms;
        let mut out = String::new();
        let mut cores: Vec<&String> = histograms
            .iter()
            .skip(FIRST_STAGE)
            .flatten()
            .filter(|c| c.count > 0)
            .map(|c| &c.core)
            .collect();
        cores.sort();
        cores.dedup();
        for core in cores {
            let _ = writeln!(
                out,
                "server core {core} stages µs ({scope}, bucket upper bounds):\n  {:<14} {:>9} {:>7} {:>7} {:>7} {:>7}  what",
                "stage", "n", "p50", "p90", "p99", "p99.9"
            );
            let row = |name: &str, note: &str, h: Option<&Vec<CoreQuantiles>>| {
                let Some(c) = h.and_then(|cores| cores.iter().find(|c| &c.core == core)) else {
                    return String::new();
                };
                let q = |want: &str| {
                    c.quantiles
                        .iter()
                        .find(|(q, _)| q == want)
                        .map_or("-".to_string(), |(_, v)| bound_text(*v))
                };
                format!(
                    "  {name:<14} {:>9} {:>7} {:>7} {:>7} {:>7}  {note}\n",
                    c.count,
                    q("0.5"),
                    q("0.9"),
                    q("0.99"),
                    q("0.999")
                )
            };
            out.push_str(&row(
                SERVER_HISTOGRAMS[FIRST_STAGE].1,
                STAGE_NOTES[0],
                histograms.get(FIRST_STAGE),
            ));
            out.push_str(&row(
                "service",
                "handling starts -> answer queued (journal included)",
                histograms.first(),
            ));
            for (i, note) in STAGE_NOTES.iter().enumerate().skip(1) {
                out.push_str(&row(
                    SERVER_HISTOGRAMS[FIRST_STAGE + i].1,
                    note,
                    histograms.get(FIRST_STAGE + i),
                ));
            }
        }
        out
    }

    fn histogram_json(
        h: &Histogram<u64>,
        secs: f64,
        errors: u64,
        messages: u64,
    ) -> serde_json::Value {
        let mut v = json!({"count": h.len(), "per_sec": h.len() as f64 / secs, "errors": errors, "mean_us": h.mean(),
            "messages": messages, "messages_per_sec": messages as f64 / secs});
        for (p, name) in PERCENTILES {
            v[format!("{name}_us")] = json!(h.value_at_percentile(p));
        }
        v
    }

    /// The JSON document (`--json`): the same figures as the table, plus the settings.
    pub fn json(&self) -> serde_json::Value {
        let secs = self.elapsed.as_secs_f64();
        let ops_json = |core: &CoreResult| {
            let mut ops = serde_json::Map::new();
            for op in OPS {
                let i = op as usize;
                let h = &core.latency_us[i];
                if !h.is_empty() {
                    ops.insert(
                        op.name().into(),
                        Self::histogram_json(h, secs, core.errors[i], core.messages[i]),
                    );
                }
            }
            serde_json::Value::from(ops)
        };
        let mut clients = serde_json::Map::new();
        for (label, core) in self.rows() {
            clients.insert(label, ops_json(core));
        }
        let units = self.merged.latency_us[self.unit_op() as usize].len().max(1);
        let messages = self.unit_messages().max(1);
        let total = self.server_cpu_us.map(|c| c.total_us());
        let mut doc = json!({
            "settings": self.args,
            "client_cpus": self.client_cpus,
            "server_cpus": self.server_cpus,
            "elapsed_s": secs,
            "clients": clients,
            "server_cpu_us_total": total,
            "server_cpu_us_per_unit": total.map(|c| c as f64 / units as f64),
            "server_cpu_us_per_message": total.map(|c| c as f64 / messages as f64),
            "server_cpu_user_us_per_unit": self.server_cpu_us.map(|c| c.user_us as f64 / units as f64),
            "server_cpu_kernel_us_per_unit": self.server_cpu_us.map(|c| c.system_us as f64 / units as f64),
            "server_histograms_scope": if self.server.run_only { "run" } else { "server lifetime" },
        });
        if !self.nodes.is_empty() {
            let nodes: serde_json::Map<String, serde_json::Value> = self
                .nodes
                .iter()
                .map(|(url, core)| (url.clone(), ops_json(core)))
                .collect();
            doc["servers"] = json!(self.nodes.iter().map(|(url, _)| url).collect::<Vec<_>>());
            doc["nodes"] = nodes.into();
        }
        if let Some(note) = &self.server_cpu_note {
            doc["server_cpu_note"] = json!(note);
        }
        for ((_, _, key), cores) in SERVER_HISTOGRAMS.iter().zip(&self.server.histograms) {
            let per_core: serde_json::Map<String, serde_json::Value> = cores
                .iter()
                .map(|c| {
                    let mut q = serde_json::Map::new();
                    q.insert("count".into(), json!(c.count));
                    for (name, v) in &c.quantiles {
                        q.insert(
                            name.clone(),
                            if *v == u64::MAX {
                                json!(null)
                            } else {
                                json!(v)
                            },
                        );
                    }
                    (c.core.clone(), q.into())
                })
                .collect();
            doc[*key] = per_core.into();
        }
        doc
    }

    /// Writes `{label}-{op}.hgrm` percentile distributions (HdrHistogram's text format, values in µs); with
    /// several nodes also `node{i}-{op}.hgrm`, `i` counting the `--server` URLs from 0.
    pub fn write_hgrm(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, (_, core))| (format!("node{i}"), core));
        for (label, core) in self.rows().into_iter().chain(nodes) {
            for op in OPS {
                let h = &core.latency_us[op as usize];
                if h.is_empty() {
                    continue;
                }
                let path = dir.join(format!("{label}-{}.hgrm", op.name()));
                std::fs::write(&path, hgrm(h)).map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        Ok(())
    }

    /// An SVG percentile plot of the unit operation, one line per client core plus the merged line.
    pub fn svg(&self) -> String {
        let op = self.unit_op();
        let series: Vec<(String, &Histogram<u64>)> = self
            .rows()
            .into_iter()
            .map(|(l, c)| (l, &c.latency_us[op as usize]))
            .collect();
        svg_plot(
            &format!("berth bench {} latency by percentile", op.name()),
            &series,
        )
    }
}

/// HdrHistogram's percentile-distribution text (as `outputPercentileDistribution` prints it, scaling 1).
pub fn hgrm(h: &Histogram<u64>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        let q = v.quantile_iterated_to();
        total += v.count_since_last_iteration();
        let inverse = if q < 1.0 {
            format!("{:>14.2}", 1.0 / (1.0 - q))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{:>12.3} {:>14.12} {:>10} {}",
            v.value_iterated_to() as f64,
            q,
            total,
            inverse
        );
    }
    let _ = writeln!(
        out,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]\n#[Max     = {:>12.3}, Total count    = {:>12}]\n#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        h.mean(), h.stdev(), h.max() as f64, h.len(), h.buckets(), h.distinct_values()
    );
    out
}

/// A self-contained SVG: x = percentile on HdrHistogram's log "nines" scale (0, 90, 99, 99.9, ...), y = latency
/// (µs, log scale), one polyline per series.
pub fn svg_plot(title: &str, series: &[(String, &Histogram<u64>)]) -> String {
    const W: f64 = 900.0;
    const H: f64 = 520.0;
    const L: f64 = 80.0;
    const R: f64 = 150.0;
    const T: f64 = 40.0;
    const B: f64 = 60.0;
    let max_nines = 5.0f64;
    let max_us = series
        .iter()
        .map(|(_, h)| h.max())
        .max()
        .unwrap_or(1)
        .max(10) as f64;
    let min_us = series
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(_, h)| h.min())
        .min()
        .unwrap_or(1)
        .max(1) as f64;
    let (ylo, yhi) = (
        min_us.log10().floor(),
        max_us.log10().ceil().max(min_us.log10().floor() + 1.0),
    );
    let x_of = |q: f64| L + (W - L - R) * ((-(1.0 - q).max(1e-5).log10()) / max_nines).min(1.0);
    let y_of = |v: f64| T + (H - T - B) * (1.0 - (v.max(1.0).log10() - ylo) / (yhi - ylo));
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
        "#000000",
    ];
    let mut out = String::new();
    let _ = writeln!(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">");
    let _ = writeln!(out, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{title}</text>", W / 2.0);
    for (i, label) in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]
        .iter()
        .enumerate()
    {
        let x = L + (W - L - R) * i as f64 / max_nines;
        let _ = writeln!(out, "<line x1=\"{x}\" y1=\"{T}\" x2=\"{x}\" y2=\"{}\" stroke=\"#ddd\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{label}</text>", H - B, H - B + 18.0);
    }
    let mut decade = ylo;
    while decade <= yhi {
        let y = y_of(10f64.powf(decade));
        let _ = writeln!(out, "<line x1=\"{L}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} µs</text>", W - R, L - 6.0, y + 4.0, 10f64.powf(decade));
        decade += 1.0;
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">percentile</text>",
        L + (W - L - R) / 2.0,
        H - 15.0
    );
    for (i, (label, h)) in series.iter().enumerate() {
        if h.is_empty() {
            continue;
        }
        let color = colors[i % colors.len()];
        let mut points = String::new();
        for v in h.iter_quantiles(5) {
            let _ = write!(
                points,
                "{:.1},{:.1} ",
                x_of(v.quantile_iterated_to()),
                y_of(v.value_iterated_to() as f64)
            );
        }
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{points}\"/>"
        );
        let ly = T + 20.0 * i as f64;
        let _ = writeln!(out, "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{label}</text>", W - R + 10.0, W - R + 30.0, W - R + 36.0, ly + 4.0);
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(cpu: usize, values: &[u64]) -> CoreResult {
        let mut r = CoreResult::new(cpu);
        for &v in values {
            r.latency_us[Op::Produce as usize].record(v).unwrap();
        }
        r
    }

    #[test]
    fn merged_counts_are_the_sum_and_merged_percentiles_lie_between_the_cores() {
        let a = result(0, &(1..=1000).collect::<Vec<_>>());
        let b = result(1, &(500..=5000).step_by(3).collect::<Vec<_>>());
        let mut merged = CoreResult::new(usize::MAX);
        merged.merge(&a);
        merged.merge(&b);
        let (ha, hb, hm) = (&a.latency_us[0], &b.latency_us[0], &merged.latency_us[0]);
        assert_eq!(hm.len(), ha.len() + hb.len());
        for (p, _) in PERCENTILES {
            let (lo, hi) = (
                ha.value_at_percentile(p).min(hb.value_at_percentile(p)),
                ha.value_at_percentile(p).max(hb.value_at_percentile(p)),
            );
            let m = hm.value_at_percentile(p);
            assert!(lo <= m && m <= hi, "p{p}: {m} not within [{lo}, {hi}]");
        }
    }

    #[test]
    fn server_latency_lines_are_parsed_per_core() {
        let text = "berth_request_duration_seconds_bucket{core=\"0\",le=\"0.00001\"} 50\n\
                    berth_request_duration_seconds_bucket{core=\"0\",le=\"0.0001\"} 99\n\
                    berth_request_duration_seconds_bucket{core=\"0\",le=\"0.001\"} 100\n\
                    berth_request_duration_seconds_bucket{core=\"0\",le=\"+Inf\"} 100\n\
                    berth_request_duration_seconds_bucket{core=\"1\",le=\"0.00001\"} 0\n\
                    berth_request_duration_seconds_bucket{core=\"1\",le=\"+Inf\"} 0\nother 1\n";
        let parsed = server_latency(text);
        assert_eq!(
            parsed,
            vec![
                (
                    "0".into(),
                    vec![
                        ("0.5".into(), 10),
                        ("0.9".into(), 100),
                        ("0.99".into(), 100),
                        ("0.999".into(), 1000)
                    ]
                ),
                ("1".into(), vec![])
            ]
        );
    }

    /// A server that splits request latency by kind: the data path's kinds are summed per core, `other` (the
    /// scrapes themselves) left out.
    #[test]
    fn server_latency_split_by_kind_is_summed_over_the_data_path() {
        let text = "berth_request_duration_seconds_bucket{core=\"0\",op=\"produce\",le=\"0.00001\"} 30\n\
                    berth_request_duration_seconds_bucket{core=\"0\",op=\"produce\",le=\"+Inf\"} 50\n\
                    berth_request_duration_seconds_bucket{core=\"0\",op=\"consume\",le=\"0.00001\"} 20\n\
                    berth_request_duration_seconds_bucket{core=\"0\",op=\"consume\",le=\"+Inf\"} 50\n\
                    berth_request_duration_seconds_bucket{core=\"0\",op=\"other\",le=\"0.00001\"} 0\n\
                    berth_request_duration_seconds_bucket{core=\"0\",op=\"other\",le=\"+Inf\"} 900\n";
        assert_eq!(
            histogram_buckets(text, "berth_request_duration_seconds"),
            vec![("0".to_string(), vec![(10, 50), (u64::MAX, 100)])]
        );
    }

    #[test]
    fn hgrm_and_svg_are_well_formed() {
        let r = result(0, &[10, 20, 30, 1000]);
        let text = hgrm(&r.latency_us[0]);
        assert!(text.contains("Total count    =            4"));
        let svg = svg_plot("t", &[("cpu0".into(), &r.latency_us[0])]);
        assert!(
            svg.starts_with("<svg")
                && svg.trim_end().ends_with("</svg>")
                && svg.contains("polyline")
        );
    }
}
