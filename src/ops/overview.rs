//! `GET /status`: the whole node in one JSON document, for the status page (`GET /`, `http/page.html`) and for any
//! script. Built from every core's `CoreStats` (`front::Front::stats`, as `/metrics` is), the configuration, the
//! data directory's file system and the cluster view; nothing is gathered until someone asks. Rendered here, pure,
//! so its shape is tested without a server (docs/api.md, "Status page").

use crate::config::Config;
use crate::engine::metrics::{quantile_bound, CoreStats, Latency, Op, BUCKETS_US, RECORD_BUCKETS};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Instant;

static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks the server's start (uptime counts from here); the first call wins.
pub fn mark_start() {
    STARTED.get_or_init(Instant::now);
}

fn uptime_ms() -> u64 {
    STARTED.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The file system holding `dir`: (total bytes, bytes available to the server), or None if it cannot be read.
pub fn disk_of(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `st` a writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// What `/status` shows besides the cores' snapshots.
pub struct Node<'a> {
    pub config: &'a Config,
    /// `Front::cluster`'s view (a single node lists itself as `local`).
    pub cluster: Value,
    pub clustered: bool,
    /// (total, available) bytes of the data directory's file system.
    pub disk: Option<(u64, u64)>,
    pub uptime_ms: u64,
    /// Wall time (Unix ms) the oldest unsettled records' ages are counted to.
    pub now_ms: u64,
}

impl<'a> Node<'a> {
    pub fn new(config: &'a Config, cluster: Value, clustered: bool) -> Node<'a> {
        Node {
            config,
            cluster,
            clustered,
            disk: disk_of(&config.data_dir),
            uptime_ms: uptime_ms(),
            now_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }
}

/// A latency histogram as the page draws it: count, sum, p50/p99/p99.9 (bucket upper bounds in µs; null when
/// nothing was recorded, `-1` past the last bound) and the per-bucket counts (bounds in `latency_bounds_us`).
fn latency(l: &Latency) -> Value {
    let q = |q: f64| bound(l.quantile_bound_us(q));
    json!({
        "count": l.count(),
        "sum_us": l.sum_us(),
        "p50_us": q(0.5),
        "p99_us": q(0.99),
        "p999_us": q(0.999),
        "buckets": l.bucket_counts(),
    })
}

/// A quantile's bound as JSON: null for none, `-1` past the last bound (`u64::MAX`, which JSON numbers cannot carry).
fn bound(b: Option<u64>) -> Value {
    match b {
        None => Value::Null,
        Some(u64::MAX) => json!(-1),
        Some(b) => json!(b),
    }
}

#[derive(Default)]
struct GroupSum {
    unsettled: u64,
    leased: u64,
    delayed: u64,
    acked_ahead: u64,
    counters: [u64; 9],
    /// Append time of the oldest unsettled record over the topic's partitions.
    oldest_ms: Option<u64>,
}

#[derive(Default)]
struct TopicSum<'a> {
    partitions: u64,
    messages: u64,
    end: u64,
    produced: u64,
    groups: BTreeMap<&'a str, GroupSum>,
}

/// The `/status` document.
pub fn render(node: &Node, stats: &[CoreStats]) -> Value {
    let config = node.config;
    let cores: Vec<Value> = stats
        .iter()
        .map(|s| {
            let ops: serde_json::Map<String, Value> = Op::ALL
                .iter()
                .zip(&s.latency)
                .map(|(op, l)| (op.name().to_string(), latency(l)))
                .collect();
            let records = &s.journal_records;
            json!({
                "core": s.core,
                "partitions": s.partitions.len(),
                "connections_open": s.connections_open,
                "latency": ops,
                "frontier_lag": latency(&s.frontier_lag),
                "journal_wait": latency(&s.journal_wait),
                "journal": s.journal.map(|j| json!({
                    "syncs": j.syncs,
                    "records": j.records,
                    "bytes": j.bytes,
                    "records_per_sync": {
                        "count": records.count(),
                        "sum": records.sum(),
                        "p50": bound(quantile_bound(records.bucket_counts(), &RECORD_BUCKETS, 0.5)),
                        "buckets": records.bucket_counts(),
                    },
                })),
            })
        })
        .collect();
    let mut topics: BTreeMap<&str, TopicSum> = BTreeMap::new();
    for s in stats {
        for (name, p) in &s.partitions {
            let t = topics.entry(name.as_str()).or_default();
            t.partitions += 1;
            t.messages += p.end_offset.saturating_sub(p.start_offset);
            t.end += p.end_offset;
            t.produced += p.counters[0];
            for g in &p.groups {
                let sum = t.groups.entry(g.group.as_str()).or_default();
                sum.unsettled += crate::ops::groups::end_and_lag(p, g).1;
                sum.leased += g.in_flight as u64;
                sum.delayed += g.delayed as u64;
                sum.acked_ahead += g.acked_ahead as u64;
                sum.oldest_ms = match (sum.oldest_ms, g.oldest_unsettled_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                for (a, b) in sum.counters.iter_mut().zip(g.counters) {
                    *a += b;
                }
            }
        }
    }
    let topics: Vec<Value> = topics
        .into_iter()
        .map(|(name, t)| {
            let groups: Vec<Value> = t
                .groups
                .into_iter()
                .map(|(group, g)| {
                    json!({
                        "name": group,
                        "lag": g.unsettled,
                        "ready": g.unsettled.saturating_sub(g.leased + g.delayed),
                        "leased": g.leased,
                        "delayed": g.delayed,
                        "acked_ahead": g.acked_ahead,
                        "delivered": g.counters[0],
                        "acked": g.counters[2],
                        "nacked": g.counters[3],
                        "expired": g.counters[5],
                        "dead_lettered": g.counters[7],
                        "oldest_unsettled_age_ms": g.oldest_ms.map(|ms| node.now_ms.saturating_sub(ms)),
                    })
                })
                .collect();
            json!({
                "name": name,
                "partitions": t.partitions,
                "messages": t.messages,
                "end_offsets": t.end,
                "produced": t.produced,
                "groups": groups,
            })
        })
        .collect();
    json!({
        "node": {
            "id": config.cluster.as_ref().map_or("local", |c| c.node_id.as_str()),
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_ms": node.uptime_ms,
            "cores": stats.len(),
            "fsync": config.fsync.to_string(),
            "data_dir": config.data_dir.display().to_string(),
            "disk": node.disk.map(|(total, available)| json!({
                "total_bytes": total,
                "available_bytes": available,
            })),
            "clustered": node.clustered,
        },
        "latency_bounds_us": BUCKETS_US.as_slice(),
        "records_bounds": RECORD_BUCKETS.as_slice(),
        "cores": cores,
        "topics": topics,
        "cluster": node.cluster,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{GroupInfo, PartitionInfo};

    fn partition(partition: u32, start: u64, end: u64, groups: Vec<GroupInfo>) -> PartitionInfo {
        PartitionInfo {
            partition,
            core: 0,
            start_offset: start,
            end_offset: end,
            committed: 0,
            durable: 0,
            in_flight: 0,
            acked_ahead: 0,
            corrupt_skipped: 0,
            groups,
            counters: [end - start, 0],
            io_counts: (0, 0),
            followers: Vec::new(),
            commit_offset: None,
            round: None,
        }
    }

    fn group(committed: u64, in_flight: usize, delayed: usize, acked_ahead: usize) -> GroupInfo {
        let mut counters = [0; 9];
        counters[7] = 2;
        GroupInfo {
            group: "g".into(),
            committed,
            durable: committed,
            in_flight,
            delayed,
            acked_ahead,
            corrupt_skipped: 0,
            counters,
            oldest_unsettled_ms: (committed < 10).then_some(1_000 + committed),
        }
    }

    fn core(core: usize, partitions: Vec<(String, PartitionInfo)>) -> CoreStats {
        let mut produce = Latency::default();
        for us in [20, 40, 40, 900] {
            produce.record(us);
        }
        CoreStats {
            latency: [
                produce,
                Latency::default(),
                Latency::default(),
                Latency::default(),
            ],
            connections_open: 1,
            partitions,
            ..CoreStats::empty(core)
        }
    }

    /// A topic's partitions on two cores add up: its messages, and per group what is unsettled (lag), leased,
    /// delayed, ready (the rest) and dead-lettered; each core's latency per kind of request has its quantiles.
    #[test]
    fn a_topic_on_several_cores_adds_up_per_group() {
        let config = Config::default();
        let node = Node {
            config: &config,
            cluster: json!({"nodes": []}),
            clustered: false,
            disk: Some((1000, 400)),
            uptime_ms: 5,
            now_ms: 10_000,
        };
        let stats = [
            // Partition 0: offsets 0..10, settled below 4, 2 acked above it, 3 leased, 1 delayed: 4 unsettled.
            core(
                0,
                vec![("t".into(), partition(0, 0, 10, vec![group(4, 3, 1, 2)]))],
            ),
            // Partition 1: offsets 5..8 retained of 8, settled below 6: 2 unsettled, none leased.
            core(
                1,
                vec![("t".into(), partition(1, 5, 8, vec![group(6, 0, 0, 0)]))],
            ),
            // Partition 2: offsets 90..100 retained, a group not loaded whose file says 3: 10 unsettled, not 97.
            core(
                2,
                vec![("t".into(), partition(2, 90, 100, vec![group(3, 0, 0, 0)]))],
            ),
        ];
        let v = render(&node, &stats);
        let t = &v["topics"][0];
        assert_eq!(t["name"], "t");
        assert_eq!(t["partitions"], 3);
        assert_eq!(t["messages"], 23);
        let g = &t["groups"][0];
        assert_eq!(
            (
                &g["lag"],
                &g["leased"],
                &g["delayed"],
                &g["ready"],
                &g["dead_lettered"]
            ),
            (&json!(16), &json!(3), &json!(1), &json!(12), &json!(6))
        );
        // The oldest unsettled record over the partitions: partition 2's (appended at 1,003), 8,997 ms ago.
        assert_eq!(g["oldest_unsettled_age_ms"], 8_997);
        let produce = &v["cores"][1]["latency"]["produce"];
        assert_eq!(
            (&produce["count"], &produce["p50_us"], &produce["p99_us"]),
            (&json!(4), &json!(50), &json!(1000))
        );
        assert_eq!(v["cores"][0]["latency"]["consume"]["p50_us"], Value::Null);
        assert_eq!(v["node"]["disk"]["available_bytes"], 400);
        assert_eq!(v["node"]["id"], "local");
        assert_eq!(v["node"]["cores"], 3);
        assert_eq!(
            v["latency_bounds_us"].as_array().unwrap().len() + 1,
            produce["buckets"].as_array().unwrap().len()
        );
    }

    #[test]
    fn the_disk_of_an_existing_directory_is_read() {
        let (total, available) = disk_of(std::path::Path::new("/")).expect("statvfs /");
        assert!(total > 0 && available <= total);
        assert_eq!(disk_of(std::path::Path::new("/no/such/dir")), None);
    }
}
