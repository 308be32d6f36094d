//! Per-core counters and latency histograms, and their Prometheus rendering. Each core keeps its own `CoreMetrics`;
//! `/metrics` gathers a `CoreStats` snapshot from every core and renders them together. Latencies are Prometheus
//! histograms in seconds (cumulative `_bucket` series with `le`, plus `_sum` and `_count`), so they can be summed
//! across cores and nodes.

use crate::partition::{GroupInfo, PartitionInfo};
use crate::storage::journal::JournalStats;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cell::Cell;
use std::fmt::Write;

/// Histogram bucket upper bounds, in microseconds (the rendering says seconds). Fine enough below a millisecond
/// for the per-request path, coarse up to a minute for long-polls.
pub const BUCKETS_US: [u64; 33] = [
    5,
    10,
    25,
    50,
    75,
    100,
    150,
    200,
    300,
    500,
    750,
    1_000,
    1_500,
    2_000,
    3_000,
    5_000,
    7_500,
    10_000,
    25_000,
    50_000,
    100_000,
    125_000,
    150_000,
    200_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
];

/// A latency histogram with the buckets above (and +Inf), cheap to record into on the hot path.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Latency {
    /// Per bucket (not cumulative); the last slot is +Inf.
    #[serde(with = "bucket_counts")]
    counts: [u64; BUCKETS_US.len() + 1],
    sum_us: u64,
    count: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            counts: [0; BUCKETS_US.len() + 1],
            sum_us: 0,
            count: 0,
        }
    }
}

impl Latency {
    pub fn record(&mut self, us: u64) {
        let i = BUCKETS_US.partition_point(|&b| b < us);
        self.counts[i] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum_us(&self) -> u64 {
        self.sum_us
    }

    /// Counts per bucket (not cumulative), one per `BUCKETS_US` bound and the last past them all.
    pub fn bucket_counts(&self) -> &[u64] {
        &self.counts
    }

    /// The upper bound, in µs, of the bucket that holds quantile `q` (0 to 1) of what was recorded: None when
    /// nothing was, `u64::MAX` when it lies past the last bound.
    pub fn quantile_bound_us(&self, q: f64) -> Option<u64> {
        quantile_bound(&self.counts, &BUCKETS_US, q)
    }

    /// Adds another histogram's counts (cores, nodes).
    pub fn merge(&mut self, other: &Latency) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        self.count += other.count;
    }

    /// Renders `{name}_bucket`, `_sum` and `_count` series with the given extra labels (`core="0"`...).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, &bound) in BUCKETS_US.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
                seconds(bound)
            );
        }
        cumulative += self.counts[BUCKETS_US.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", seconds(self.sum_us));
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// The upper bound of the bucket holding quantile `q` of `counts` (per bucket, one more than `bounds`, the last
/// unbounded: `u64::MAX`). The rank is rounded up, so p99 of 100 values is the 99th; None for no values.
pub fn quantile_bound(counts: &[u64], bounds: &[u64], q: f64) -> Option<u64> {
    debug_assert_eq!(counts.len(), bounds.len() + 1);
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(bounds.get(i).copied().unwrap_or(u64::MAX));
        }
    }
    Some(u64::MAX)
}

/// Microseconds as a decimal number of seconds.
fn seconds(us: u64) -> String {
    let text = format!("{}.{:06}", us / 1_000_000, us % 1_000_000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Bucket upper bounds of the records-per-sync histogram.
pub const RECORD_BUCKETS: [u64; 13] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];

/// A histogram of counts (records per journal sync), rendered with `RECORD_BUCKETS`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    counts: [u64; RECORD_BUCKETS.len() + 1],
    sum: u64,
    count: u64,
}

impl Counts {
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Counts per bucket (not cumulative), one per `RECORD_BUCKETS` bound and the last past them all.
    pub fn bucket_counts(&self) -> &[u64] {
        &self.counts
    }

    pub fn record(&mut self, n: u64) {
        let i = RECORD_BUCKETS.partition_point(|&b| b < n);
        self.counts[i] += 1;
        self.sum = self.sum.saturating_add(n);
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, &bound) in RECORD_BUCKETS.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.counts[RECORD_BUCKETS.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// The kinds of request whose latencies are kept apart (the `op` label of `berth_request_duration_seconds`, the
/// status page's plots): the data path's three, and everything else (administration, metrics, the page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Produce,
    Consume,
    Settle,
    Other,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Produce, Op::Consume, Op::Settle, Op::Other];

    pub fn name(self) -> &'static str {
        match self {
            Op::Produce => "produce",
            Op::Consume => "consume",
            Op::Settle => "settle",
            Op::Other => "other",
        }
    }

    /// The kind of a request, from its method and path.
    pub fn of(method: &str, path: &str) -> Op {
        match (method, path) {
            ("POST", "/produce") => Op::Produce,
            ("GET", "/consume") => Op::Consume,
            ("POST", "/ack" | "/nack" | "/extend") => Op::Settle,
            _ => Op::Other,
        }
    }
}

/// One latency histogram per [`Op`], in `Op::ALL`'s order.
pub type OpLatencies = [Latency; 4];

/// The stages a request's time is split into beside its service time (`berth_request_duration_seconds`), each a
/// histogram per core (`berth_stage_NAME_seconds`), so that a tail can be traced to where it is spent: `berth bench`
/// prints them per core (docs/api.md, "Metrics").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// From the read that completed a request's bytes to its handling starting (requests pipelined behind others,
    /// and a connection's task waiting for its turn on the core).
    Queue,
    /// From an append (or frontier record) being queued for the journal to the start of the pass that writes it.
    JournalQueue,
    /// A journal pass's write (once per pass).
    JournalWrite,
    /// A journal pass's fdatasync (once per pass, fsync `always`).
    JournalSync,
    /// From an answer being queued to its connection's buffered answers being written to the socket.
    Reply,
    /// One slice of a core's own background work, from its wake to its next wait: the lease timer's pass (expired
    /// leases, due redeliveries, the next deadline), retention's and the frontier flush's scans over the core's
    /// partitions, the connection sweeper's pass. While a slice runs no request is served on the core, so a request
    /// stage's tail longer than this stage's cannot have been set by housekeeping.
    Housekeeping,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Queue,
        Stage::JournalQueue,
        Stage::JournalWrite,
        Stage::JournalSync,
        Stage::Reply,
        Stage::Housekeeping,
    ];

    /// The metric's name, `berth_stage_{name}_seconds`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::JournalQueue => "journal_queue",
            Stage::JournalWrite => "journal_write",
            Stage::JournalSync => "journal_sync",
            Stage::Reply => "reply",
            Stage::Housekeeping => "housekeeping",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Stage::Queue => "time from the read that completed a request to its handling starting (pipelined requests ahead of it, the connection's task waiting for the core)",
            Stage::JournalQueue => "time from an entry being queued for the core's journal to the start of the pass that writes it",
            Stage::JournalWrite => "time a journal pass took to write its entries (one per pass)",
            Stage::JournalSync => "time a journal pass's fdatasync took (one per pass; fsync always)",
            Stage::Reply => "time from an answer being queued to its connection's answers being written to the socket",
            Stage::Housekeeping => "time one slice of the core's background work (lease timer, retention scan, frontier flush, connection sweep) held the core, from its wake to its next wait",
        }
    }
}

/// One latency histogram per [`Stage`], in `Stage::ALL`'s order.
pub type StageLatencies = [Latency; 6];

/// One core's live counters.
#[derive(Default)]
pub struct CoreMetrics {
    /// Request latency per kind of request, from the end of parsing to the response being queued, less the time a
    /// long-poll spent parked waiting for messages (a consume's service time, whatever its `wait`).
    pub latency: std::cell::RefCell<OpLatencies>,
    /// Connections open on this core now.
    pub connections_open: Cell<u64>,
    /// Connections refused by a connection cap.
    pub connections_refused: Cell<u64>,
    /// Connections closed for a slow or oversized header, or a client that did not read its answers.
    pub connections_timed_out: Cell<u64>,
    /// TLS listener: connections closed because their handshake failed or did not finish in time.
    pub tls_handshakes_failed: Cell<u64>,
    /// TLS listener: connections closed in their handshake to make room for a newer one.
    pub tls_handshakes_evicted: Cell<u64>,
    /// Cross-core sends refused because the channel was full.
    pub mesh_full: Cell<u64>,
    /// Time from a frontier's first move to its file being durable.
    pub frontier_lag: std::cell::RefCell<Latency>,
    /// Time an append waited for the journal pass that made it durable (queue, write, sync).
    pub journal_wait: std::cell::RefCell<Latency>,
    /// Records made durable by each journal pass (one sync in fsync `always`).
    pub journal_records: std::cell::RefCell<Counts>,
    /// Per [`Stage`], in `Stage::ALL`'s order.
    pub stages: std::cell::RefCell<StageLatencies>,
}

impl CoreMetrics {
    /// Records one answered request.
    pub fn record(&self, op: Op, latency_us: u64) {
        self.latency.borrow_mut()[op as usize].record(latency_us);
    }

    /// Records the time one request (or journal pass) spent in `stage`.
    pub fn record_stage(&self, stage: Stage, us: u64) {
        self.stages.borrow_mut()[stage as usize].record(us);
    }

    /// Records one housekeeping slice that began at `since` and ends now ([`Stage::Housekeeping`]).
    pub fn record_housekeeping(&self, since: std::time::Instant) {
        self.record_stage(Stage::Housekeeping, since.elapsed().as_micros() as u64);
    }

    pub fn bump(c: &Cell<u64>) {
        c.set(c.get() + 1);
    }
}

/// Bucket counts as a sequence (serde derives arrays only up to 32 elements); a wrong length fails to decode.
mod bucket_counts {
    use super::*;

    pub fn serialize<S: Serializer, const N: usize>(a: &[u64; N], s: S) -> Result<S::Ok, S::Error> {
        a.as_slice().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        d: D,
    ) -> Result<[u64; N], D::Error> {
        let counts = Vec::<u64>::deserialize(d)?;
        let len = counts.len();
        counts
            .try_into()
            .map_err(|_| serde::de::Error::invalid_length(len, &"one count per bucket"))
    }
}

/// `JournalStats` (a storage type without serde) as a plain tuple.
mod journal_stats {
    use super::*;

    type Tuple = (u64, u64, u64, u64, u64, u64);

    pub fn serialize<S: Serializer>(j: &Option<JournalStats>, s: S) -> Result<S::Ok, S::Error> {
        j.map(|j| {
            (
                j.syncs,
                j.passes,
                j.entries,
                j.records,
                j.bytes,
                j.checkpoints,
            )
        })
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<JournalStats>, D::Error> {
        let t = Option::<Tuple>::deserialize(d)?;
        Ok(t.map(
            |(syncs, passes, entries, records, bytes, checkpoints)| JournalStats {
                syncs,
                passes,
                entries,
                records,
                bytes,
                checkpoints,
                // Not on the wire (the simulation's coverage counters, not exported).
                ..JournalStats::default()
            },
        ))
    }
}

/// A snapshot of one core, sent to the core rendering `/metrics` (and serialised by node RPC).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CoreStats {
    pub core: usize,
    /// Per [`Op`], in `Op::ALL`'s order.
    pub latency: OpLatencies,
    pub frontier_lag: Latency,
    pub connections_open: u64,
    pub connections_refused: u64,
    pub connections_timed_out: u64,
    pub tls_handshakes_failed: u64,
    pub tls_handshakes_evicted: u64,
    pub mesh_full: u64,
    pub journal_wait: Latency,
    pub journal_records: Counts,
    /// Per [`Stage`], in `Stage::ALL`'s order.
    pub stages: StageLatencies,
    /// The journal's counters (none with fsync `never`).
    #[serde(with = "journal_stats")]
    pub journal: Option<JournalStats>,
    /// (topic, partition) for every partition this core owns.
    #[serde(with = "crate::partition::whole_infos::named")]
    pub partitions: Vec<(String, PartitionInfo)>,
    /// Series from layers above the engine (node RPC in cluster mode).
    #[serde(default)]
    pub extra: Vec<ExtraSeries>,
}

impl CoreStats {
    /// A core with nothing counted and no partitions (tests build theirs on it).
    #[cfg(test)]
    pub fn empty(core: usize) -> CoreStats {
        CoreStats {
            core,
            latency: Default::default(),
            frontier_lag: Latency::default(),
            connections_open: 0,
            connections_refused: 0,
            connections_timed_out: 0,
            tls_handshakes_failed: 0,
            tls_handshakes_evicted: 0,
            mesh_full: 0,
            journal_wait: Latency::default(),
            journal_records: Counts::default(),
            stages: Default::default(),
            journal: None,
            partitions: Vec::new(),
            extra: Vec::new(),
        }
    }
}

/// A counter or gauge a layer above the engine reports through a core (`Engine::set_extra_stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExtraSeries {
    /// Metric name without the `berth_` prefix.
    pub name: String,
    pub help: String,
    /// `counter` or `gauge`.
    pub kind: String,
    /// More labels after `core`, rendered as is (`peer="n2"`), or empty.
    pub labels: String,
    pub value: u64,
}

const PARTITION_COUNTERS: [(&str, &str); 2] = [
    ("produced", "records made durable"),
    (
        "read_errors",
        "records that failed to read (I/O errors; released for a retry)",
    ),
];

const GROUP_COUNTERS: [(&str, &str); 9] = [
    ("delivered", "leases handed to consumers"),
    (
        "redelivered",
        "leases of messages delivered before (delivery count above 1)",
    ),
    ("acked", "leases acked"),
    ("nacked", "leases nacked"),
    ("extended", "leases extended"),
    (
        "expired",
        "leases expired and delayed redeliveries come due",
    ),
    ("lease_gone", "settle attempts answered 410"),
    ("dead_lettered", "messages moved to the dead-letter topic"),
    (
        "retention_skipped",
        "messages a group lost to retention before settling them",
    ),
];

/// A per-partition gauge: name, Prometheus type, help, and how to read it.
type Gauge = (
    &'static str,
    &'static str,
    &'static str,
    fn(&PartitionInfo) -> u64,
);

/// A per-group gauge.
type GroupGauge = (
    &'static str,
    &'static str,
    &'static str,
    fn(&GroupInfo) -> u64,
);

/// A per-core series: name, help, Prometheus type, and how to read it.
type CoreSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&CoreStats) -> u64,
);

/// Renders every core's snapshot as Prometheus text exposition.
pub fn render(stats: &[CoreStats]) -> String {
    let mut out = String::with_capacity(4096);
    // Which build answers (a dashboard joins it to tell versions apart during a rolling upgrade).
    let _ = writeln!(
        out,
        "# HELP berth_build_info the server's version (value 1)\n# TYPE berth_build_info gauge\n\
         berth_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    let core_series: [CoreSeries; 10] = [
        (
            "connections_open",
            "client connections open",
            "gauge",
            |s| s.connections_open,
        ),
        (
            "connections_refused_total",
            "connections refused by a connection cap",
            "counter",
            |s| s.connections_refused,
        ),
        (
            "connections_timed_out_total",
            "connections closed for slow or oversized headers, or unread answers",
            "counter",
            |s| s.connections_timed_out,
        ),
        (
            "tls_handshakes_failed_total",
            "TLS listener: connections closed because their handshake failed or did not finish in time",
            "counter",
            |s| s.tls_handshakes_failed,
        ),
        (
            "tls_handshakes_evicted_total",
            "TLS listener: connections closed in their handshake for a newer one (max_tls_handshakes_per_core)",
            "counter",
            |s| s.tls_handshakes_evicted,
        ),
        (
            "mesh_full_total",
            "cross-core sends refused because the channel was full",
            "counter",
            |s| s.mesh_full,
        ),
        (
            "journal_syncs_total",
            "fdatasyncs of this core's journal (one per group commit with fsync always)",
            "counter",
            |s| s.journal.map_or(0, |j| j.syncs),
        ),
        (
            "journal_records_total",
            "records made durable through this core's journal",
            "counter",
            |s| s.journal.map_or(0, |j| j.records),
        ),
        (
            "journal_bytes_total",
            "bytes written to this core's journal",
            "counter",
            |s| s.journal.map_or(0, |j| j.bytes),
        ),
        (
            "journal_checkpoints_total",
            "journal files checkpointed (their segments synced) and removed",
            "counter",
            |s| s.journal.map_or(0, |j| j.checkpoints),
        ),
    ];
    let _ = writeln!(
        out,
        "# HELP berth_requests_total HTTP requests answered\n# TYPE berth_requests_total counter"
    );
    for s in stats {
        let _ = writeln!(
            out,
            "berth_requests_total{{core=\"{}\"}} {}",
            s.core,
            s.latency.iter().map(Latency::count).sum::<u64>()
        );
    }
    for (name, help, kind, f) in core_series {
        let _ = writeln!(
            out,
            "# HELP berth_{name} {help}\n# TYPE berth_{name} {kind}"
        );
        for s in stats {
            let _ = writeln!(out, "berth_{name}{{core=\"{}\"}} {}", s.core, f(s));
        }
    }
    let mut extra: std::collections::BTreeMap<&str, Vec<(usize, &ExtraSeries)>> =
        Default::default();
    for s in stats {
        for e in &s.extra {
            extra.entry(e.name.as_str()).or_default().push((s.core, e));
        }
    }
    for (name, series) in extra {
        let (_, first) = series[0];
        let _ = writeln!(
            out,
            "# HELP berth_{name} {}\n# TYPE berth_{name} {}",
            first.help, first.kind
        );
        for (core, e) in series {
            let sep = if e.labels.is_empty() { "" } else { "," };
            let _ = writeln!(
                out,
                "berth_{name}{{core=\"{core}\"{sep}{}}} {}",
                e.labels, e.value
            );
        }
    }
    let _ = writeln!(out, "# HELP berth_request_duration_seconds request latency per core and kind of request (produce, consume, settle, other), from the end of parsing to the answer being queued, less the time a long-poll spent parked\n# TYPE berth_request_duration_seconds histogram");
    for s in stats {
        for (op, latency) in Op::ALL.iter().zip(&s.latency) {
            latency.render(
                &mut out,
                "berth_request_duration_seconds",
                &format!("core=\"{}\",op=\"{}\"", s.core, op.name()),
            );
        }
    }
    let _ = writeln!(out, "# HELP berth_frontier_lag_seconds time from a consumer group's frontier moving to its being durable (in the core's journal, or its file)\n# TYPE berth_frontier_lag_seconds histogram");
    for s in stats {
        s.frontier_lag.render(
            &mut out,
            "berth_frontier_lag_seconds",
            &format!("core=\"{}\"", s.core),
        );
    }
    let _ = writeln!(out, "# HELP berth_journal_commit_wait_seconds time an append waited for the journal pass (write and sync) that made it durable\n# TYPE berth_journal_commit_wait_seconds histogram");
    for s in stats {
        s.journal_wait.render(
            &mut out,
            "berth_journal_commit_wait_seconds",
            &format!("core=\"{}\"", s.core),
        );
    }
    for (i, stage) in Stage::ALL.iter().enumerate() {
        let name = format!("berth_stage_{}_seconds", stage.name());
        let _ = writeln!(
            out,
            "# HELP {name} {}\n# TYPE {name} histogram",
            stage.help()
        );
        for s in stats {
            s.stages[i].render(&mut out, &name, &format!("core=\"{}\"", s.core));
        }
    }
    let _ = writeln!(out, "# HELP berth_journal_records_per_sync records made durable by one journal pass (one fdatasync with fsync always)\n# TYPE berth_journal_records_per_sync histogram");
    for s in stats {
        s.journal_records.render(
            &mut out,
            "berth_journal_records_per_sync",
            &format!("core=\"{}\"", s.core),
        );
    }

    for (i, (name, help)) in PARTITION_COUNTERS.iter().enumerate() {
        let _ = writeln!(
            out,
            "# HELP berth_{name}_total {help}\n# TYPE berth_{name}_total counter"
        );
        for s in stats {
            for (topic, p) in &s.partitions {
                let _ = writeln!(
                    out,
                    "berth_{name}_total{{core=\"{}\",topic=\"{topic}\",partition=\"{}\"}} {}",
                    s.core, p.partition, p.counters[i]
                );
            }
        }
    }
    for (i, (name, help)) in GROUP_COUNTERS.iter().enumerate() {
        let _ = writeln!(
            out,
            "# HELP berth_{name}_total {help}\n# TYPE berth_{name}_total counter"
        );
        for s in stats {
            for (topic, p) in &s.partitions {
                for g in &p.groups {
                    let _ = writeln!(
                        out,
                        "berth_{name}_total{{core=\"{}\",topic=\"{topic}\",partition=\"{}\",group=\"{}\"}} {}",
                        s.core, p.partition, g.group, g.counters[i]
                    );
                }
            }
        }
    }
    let group_gauges: [GroupGauge; 5] = [
        (
            "corrupt_skipped_total",
            "counter",
            "corrupt records skipped",
            |g| g.corrupt_skipped,
        ),
        ("in_flight", "gauge", "live leases", |g| g.in_flight as u64),
        (
            "delayed",
            "gauge",
            "released messages waiting for their redelivery delay",
            |g| g.delayed as u64,
        ),
        (
            "acked_ahead",
            "gauge",
            "out-of-order acks waiting for the gap to close",
            |g| g.acked_ahead as u64,
        ),
        (
            "committed",
            "gauge",
            "committed frontier: every offset below is settled",
            |g| g.committed,
        ),
    ];
    for (name, kind, help, f) in group_gauges {
        let _ = writeln!(
            out,
            "# HELP berth_{name} {help}\n# TYPE berth_{name} {kind}"
        );
        for s in stats {
            for (topic, p) in &s.partitions {
                for g in &p.groups {
                    let _ = writeln!(
                        out,
                        "berth_{name}{{core=\"{}\",topic=\"{topic}\",partition=\"{}\",group=\"{}\"}} {}",
                        s.core,
                        p.partition,
                        g.group,
                        f(g)
                    );
                }
            }
        }
    }
    // Only groups with an unsettled record have one (a 0 would read as an age of 56 years).
    let _ = writeln!(
        out,
        "# HELP berth_oldest_unsettled_timestamp_seconds append time (Unix seconds) of the group's oldest unsettled record\n\
         # TYPE berth_oldest_unsettled_timestamp_seconds gauge"
    );
    for s in stats {
        for (topic, p) in &s.partitions {
            for g in &p.groups {
                if let Some(ms) = g.oldest_unsettled_ms {
                    let _ = writeln!(
                        out,
                        "berth_oldest_unsettled_timestamp_seconds{{core=\"{}\",topic=\"{topic}\",partition=\"{}\",group=\"{}\"}} {}.{:03}",
                        s.core, p.partition, g.group, ms / 1000, ms % 1000
                    );
                }
            }
        }
    }
    let gauges: [Gauge; 4] = [
        (
            "log_batches_total",
            "counter",
            "append batches written (records / batches = group commit size)",
            |p| p.io_counts.0,
        ),
        (
            "log_syncs_total",
            "counter",
            "fdatasyncs of segment files",
            |p| p.io_counts.1,
        ),
        ("start_offset", "gauge", "oldest retained offset", |p| {
            p.start_offset
        }),
        ("end_offset", "gauge", "next offset to be written", |p| {
            p.end_offset
        }),
    ];
    for (name, kind, help, f) in gauges {
        let _ = writeln!(
            out,
            "# HELP berth_{name} {help}\n# TYPE berth_{name} {kind}"
        );
        for s in stats {
            for (topic, p) in &s.partitions {
                let _ = writeln!(
                    out,
                    "berth_{name}{{core=\"{}\",topic=\"{topic}\",partition=\"{}\"}} {}",
                    s.core,
                    p.partition,
                    f(p)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_in_seconds_and_sum_across_cores() {
        let mut a = Latency::default();
        for us in [3, 7, 7, 120, 2_000_000] {
            a.record(us);
        }
        let mut b = Latency::default();
        b.record(500_000_000);
        a.merge(&b);
        let mut out = String::new();
        a.render(&mut out, "x", "core=\"0\"");
        assert!(
            out.contains("x_bucket{core=\"0\",le=\"0.000005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{core=\"0\",le=\"0.00001\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{core=\"0\",le=\"0.00015\"} 4\n"),
            "{out}"
        );
        assert!(out.contains("x_bucket{core=\"0\",le=\"2.5\"} 5\n"), "{out}");
        assert!(out.contains("x_bucket{core=\"0\",le=\"120\"} 5\n"), "{out}");
        assert!(
            out.contains("x_bucket{core=\"0\",le=\"+Inf\"} 6\n"),
            "{out}"
        );
        assert!(out.contains("x_count{core=\"0\"} 6\n"), "{out}");
        assert!(out.contains("x_sum{core=\"0\"} 502.000137\n"), "{out}");
    }

    /// A quantile is the upper bound of the bucket its rank falls in (the rank rounded up); past the last bound it
    /// is `u64::MAX`, and nothing recorded has none.
    #[test]
    fn a_quantile_is_the_bound_of_the_bucket_its_rank_falls_in() {
        let mut l = Latency::default();
        assert_eq!(l.quantile_bound_us(0.5), None);
        for _ in 0..98 {
            l.record(7);
        }
        l.record(40);
        l.record(500_000_000);
        assert_eq!(l.quantile_bound_us(0.0), Some(10));
        assert_eq!(l.quantile_bound_us(0.5), Some(10));
        assert_eq!(l.quantile_bound_us(0.98), Some(10));
        assert_eq!(l.quantile_bound_us(0.99), Some(50));
        assert_eq!(l.quantile_bound_us(0.999), Some(u64::MAX));
        assert_eq!(l.quantile_bound_us(1.0), Some(u64::MAX));
        assert_eq!(l.bucket_counts().iter().sum::<u64>(), 100);
        assert_eq!(l.sum_us(), 98 * 7 + 40 + 500_000_000);
    }

    /// Each kind of request has its own series, and `berth_requests_total` counts them all.
    #[test]
    fn request_latency_is_rendered_per_kind_of_request() {
        let metrics = CoreMetrics::default();
        metrics.record(Op::of("POST", "/produce"), 100);
        metrics.record(Op::of("GET", "/consume"), 30);
        metrics.record(Op::of("POST", "/nack"), 30);
        metrics.record(Op::of("GET", "/topics"), 30);
        metrics.record(Op::of("GET", "/produce"), 30);
        let stats = CoreStats {
            latency: metrics.latency.borrow().clone(),
            ..CoreStats::empty(3)
        };
        let out = render(&[stats]);
        assert!(
            out.contains(&format!(
                "\nberth_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{out}"
        );
        assert!(
            out.contains("berth_requests_total{core=\"3\"} 5\n"),
            "{out}"
        );
        for (op, n) in [("produce", 1), ("consume", 1), ("settle", 1), ("other", 2)] {
            let line =
                format!("berth_request_duration_seconds_count{{core=\"3\",op=\"{op}\"}} {n}\n");
            assert!(out.contains(&line), "{line} in {out}");
        }
    }

    /// A group with an unsettled record has its append time in seconds (to the ms); one without has no line.
    #[test]
    fn the_oldest_unsettled_record_is_rendered_only_where_there_is_one() {
        use crate::partition::{GroupInfo, PartitionInfo};
        let group = |name: &str, oldest| GroupInfo {
            group: name.into(),
            committed: 0,
            durable: 0,
            in_flight: 0,
            delayed: 0,
            acked_ahead: 0,
            corrupt_skipped: 0,
            counters: [0; 9],
            oldest_unsettled_ms: oldest,
        };
        let partition = PartitionInfo {
            partition: 2,
            core: 0,
            start_offset: 0,
            end_offset: 1,
            committed: 0,
            durable: 0,
            in_flight: 0,
            acked_ahead: 0,
            corrupt_skipped: 0,
            groups: vec![group("a", Some(1_700_000_000_007)), group("b", None)],
            counters: [0; 2],
            io_counts: (0, 0),
            followers: Vec::new(),
            commit_offset: None,
            round: None,
        };
        let stats = CoreStats {
            partitions: vec![("t".into(), partition)],
            ..CoreStats::empty(1)
        };
        let out = render(&[stats]);
        assert!(
            out.contains("berth_oldest_unsettled_timestamp_seconds{core=\"1\",topic=\"t\",partition=\"2\",group=\"a\"} 1700000000.007\n"),
            "{out}"
        );
        assert!(!out.contains("group=\"b\"} 1700"), "{out}");
        assert_eq!(
            out.matches("berth_oldest_unsettled_timestamp_seconds{")
                .count(),
            1
        );
    }
}
