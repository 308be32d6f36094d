//! Per-core counters and the request latency histogram, and their Prometheus rendering. Each core keeps its own
//! `CoreMetrics`; `/metrics` gathers a `CoreStats` snapshot from every core over the mesh and renders them together.

use crate::partition::PartitionInfo;
use hdrhistogram::Histogram;
use std::cell::{Cell, RefCell};
use std::fmt::Write;

/// Latency histogram range: 1 µs to 60 s, 3 significant digits.
pub fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds")
}

/// One core's live counters.
pub struct CoreMetrics {
    /// Request latency in µs, from the end of parsing to the response being queued.
    pub latency_us: RefCell<Histogram<u64>>,
    /// Requests answered.
    pub requests: Cell<u64>,
    /// Connections open on this core now.
    pub connections_open: Cell<u64>,
    /// Connections refused by a connection cap.
    pub connections_refused: Cell<u64>,
    /// Connections closed for a slow or oversized header.
    pub connections_timed_out: Cell<u64>,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        CoreMetrics {
            latency_us: RefCell::new(new_latency_histogram()),
            requests: Cell::new(0),
            connections_open: Cell::new(0),
            connections_refused: Cell::new(0),
            connections_timed_out: Cell::new(0),
        }
    }
}

impl CoreMetrics {
    /// Records one answered request.
    pub fn record(&self, latency_us: u64) {
        self.requests.set(self.requests.get() + 1);
        self.latency_us
            .borrow_mut()
            .saturating_record(latency_us.max(1));
    }
}

/// A snapshot of one core, sent to the core rendering `/metrics`.
pub struct CoreStats {
    pub core: usize,
    pub requests: u64,
    pub latency_us: Histogram<u64>,
    pub connections_open: u64,
    pub connections_refused: u64,
    pub connections_timed_out: u64,
    pub mesh_full: u64,
    /// (topic, partition) for every partition this core owns.
    pub partitions: Vec<(String, PartitionInfo)>,
}

const PARTITION_COUNTERS: [(&str, &str); 8] = [
    ("produced", "records made durable"),
    ("delivered", "leases handed to consumers"),
    ("acked", "leases acked"),
    ("nacked", "leases nacked"),
    ("extended", "leases extended"),
    ("expired", "leases expired (the offset redelivers)"),
    ("lease_gone", "settle attempts answered 410"),
    (
        "read_errors",
        "records that failed to read (I/O errors; released for a retry)",
    ),
];

/// A per-partition gauge: name, Prometheus type, help, and how to read it.
type Gauge = (
    &'static str,
    &'static str,
    &'static str,
    fn(&PartitionInfo) -> u64,
);

/// Renders every core's snapshot as Prometheus text exposition.
pub fn render(stats: &[CoreStats]) -> String {
    let mut out = String::with_capacity(4096);
    let core_counter =
        |out: &mut String, name: &str, help: &str, kind: &str, f: &dyn Fn(&CoreStats) -> u64| {
            let _ = writeln!(
                out,
                "# HELP berth_{name} {help}\n# TYPE berth_{name} {kind}"
            );
            for s in stats {
                let _ = writeln!(out, "berth_{name}{{core=\"{}\"}} {}", s.core, f(s));
            }
        };
    core_counter(
        &mut out,
        "requests_total",
        "HTTP requests answered",
        "counter",
        &|s| s.requests,
    );
    core_counter(
        &mut out,
        "connections_open",
        "client connections open",
        "gauge",
        &|s| s.connections_open,
    );
    core_counter(
        &mut out,
        "connections_refused_total",
        "connections refused by a connection cap",
        "counter",
        &|s| s.connections_refused,
    );
    core_counter(
        &mut out,
        "connections_timed_out_total",
        "connections closed for slow or oversized headers",
        "counter",
        &|s| s.connections_timed_out,
    );
    core_counter(
        &mut out,
        "mesh_full_total",
        "cross-core sends refused because the channel was full",
        "counter",
        &|s| s.mesh_full,
    );

    let _ = writeln!(out, "# HELP berth_request_latency_us request latency per core (µs)\n# TYPE berth_request_latency_us summary");
    for s in stats {
        let h = &s.latency_us;
        for q in [0.5, 0.9, 0.99, 0.999, 0.9999] {
            let _ = writeln!(
                out,
                "berth_request_latency_us{{core=\"{}\",quantile=\"{q}\"}} {}",
                s.core,
                h.value_at_quantile(q)
            );
        }
        let _ = writeln!(
            out,
            "berth_request_latency_us{{core=\"{}\",quantile=\"1\"}} {}",
            s.core,
            h.max()
        );
        let sum = (h.mean() * h.len() as f64) as u64;
        let _ = writeln!(
            out,
            "berth_request_latency_us_sum{{core=\"{}\"}} {sum}",
            s.core
        );
        let _ = writeln!(
            out,
            "berth_request_latency_us_count{{core=\"{}\"}} {}",
            s.core,
            h.len()
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
    let io: [Gauge; 2] = [
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
    ];
    let gauges: [Gauge; 6] = [
        (
            "corrupt_skipped_total",
            "counter",
            "corrupt records skipped",
            |p| p.corrupt_skipped,
        ),
        ("in_flight", "gauge", "live leases", |p| p.in_flight as u64),
        (
            "acked_ahead",
            "gauge",
            "out-of-order acks waiting for the gap to close",
            |p| p.acked_ahead as u64,
        ),
        (
            "committed",
            "gauge",
            "committed frontier: every offset below is settled",
            |p| p.committed,
        ),
        ("start_offset", "gauge", "oldest retained offset", |p| {
            p.start_offset
        }),
        ("end_offset", "gauge", "next offset to be written", |p| {
            p.end_offset
        }),
    ];
    for (name, kind, help, f) in io.into_iter().chain(gauges) {
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
