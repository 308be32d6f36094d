//! A version 1 data directory opens unchanged under the current release (api.md, "Consumer groups": "the `default`
//! group keeps `consumer.offset`"). `tests/fixtures/v1-data` was written by commit 4066fae, version 1 (its README
//! says how): topic `legacy`, 2 partitions, 21 records over 5 segments, partition 0's frontier flushed at 7. The
//! test copies it to a temp dir, starts the current binary on it and checks the topic, every record at its offset,
//! the `default` group's frontier and file, a new group, new produces, and a kill -9 and restart.

mod common;

use common::{consume, decode_frontier, settle, Delivered, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1-data");
const TOPIC: &str = "legacy";

/// Partition 0's records are offsets 0..P0_END, partition 1's 0..P1_END (as the old release left them).
const P0_END: u64 = 13;
const P1_END: u64 = 8;
/// The frontier the old release flushed to partition 0's `consumer.offset`; partition 1 has no file (frontier 0).
const P0_COMMITTED: u64 = 7;

/// Every record of the fixture: (partition, offset, body).
fn v1_records() -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    for o in 0..12 {
        out.push((0, o, format!("p0-m{o:02}").into_bytes()));
    }
    out.push((0, 12, Vec::new()));
    for o in 0..6 {
        out.push((1, o, format!("p1-m{o:02}").into_bytes()));
    }
    out.push((1, 6, b"keyed-a".to_vec()));
    out.push((1, 7, b"keyed-b".to_vec()));
    out
}

/// Copies the fixture's data (everything but its README) into `to`.
fn copy_fixture(to: &Path) {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    copy_dir(&Path::new(FIXTURE).join("topics"), &to.join("topics"));
}

fn partition_dir(data: &Path, partition: u64) -> PathBuf {
    data.join("topics").join(TOPIC).join(partition.to_string())
}

/// The frontier in a partition's file for `file` (None: missing or damaged).
fn frontier_file(data: &Path, partition: u64, file: &str) -> Option<u64> {
    let bytes = std::fs::read(partition_dir(data, partition).join(file)).ok()?;
    decode_frontier(&bytes)
}

/// Waits (bounded: 5 s, the flush runs every 50 ms) until the server reports `group`'s frontier on `partition`
/// durable at `want` (in the core's journal, which a restart replays into the group's file, or in the file).
fn wait_durable(s: &Server, partition: u64, group: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let parts = s.partitions(TOPIC);
        let seen = parts[partition as usize]["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|g| g["group"] == group))
            .and_then(|g| g["durable"].as_u64());
        if seen == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "partition {partition}'s group {group} durable at {seen:?}, expected {want} (5 s after the acks)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// No frontier file of the default group other than `consumer.offset` in either partition.
fn assert_no_default_named_file(data: &Path) {
    for p in 0..2 {
        let path = partition_dir(data, p).join("consumer.default.offset");
        assert!(!path.exists(), "{} exists", path.display());
    }
}

/// Consumes (wait 0, visibility 1 h) in `group` until 204; returns the deliveries, sorted by (partition, offset).
fn drain(s: &Server, group: &str) -> Vec<Delivered> {
    let extra = format!("&group={group}&visibility=1h");
    let mut out = Vec::new();
    while let Some(d) = consume(&s.client, TOPIC, &extra) {
        out.push(d);
        assert!(out.len() <= 100, "group {group} keeps delivering");
    }
    out.sort_by_key(|d| (d.0, d.1));
    out
}

/// (partition, offset, body) of deliveries, for comparison with the records.
fn keys(ds: &[Delivered]) -> Vec<(u64, u64, Vec<u8>)> {
    ds.iter().map(|d| (d.0, d.1, d.3.clone())).collect()
}

/// The expected records of `records` in partition p from offset `from`.
fn from_offsets(records: &[(u64, u64, Vec<u8>)], from: [u64; 2]) -> Vec<(u64, u64, Vec<u8>)> {
    records
        .iter()
        .filter(|r| r.1 >= from[r.0 as usize])
        .cloned()
        .collect()
}

/// Replays every record (read-only, no lease) and checks its body and headers.
fn assert_replay(s: &Server, records: &[(u64, u64, Vec<u8>)]) {
    for (p, o, body) in records {
        let a = s.get(&format!("/consume?topic={TOPIC}&partition={p}&offset={o}"));
        assert_eq!(a.status, 200, "replay {p}:{o}: {}", a.text());
        assert_eq!(&a.body, body, "replay {p}:{o}");
        assert_eq!(a.header("partition"), Some(p.to_string().as_str()));
        assert_eq!(a.header("offset"), Some(o.to_string().as_str()));
        assert_eq!(a.header("receipt-handle"), None, "replay {p}:{o} leased");
    }
}

/// GET /topics/legacy: (end_offset, committed of `default`, committed of `group` if listed) per partition.
fn partition_state(s: &Server, group: &str) -> Vec<(u64, u64, Option<u64>)> {
    s.partitions(TOPIC)
        .iter()
        .map(|p| {
            let groups = p["groups"].as_array().expect("groups per partition");
            let committed_of = |g: &str| {
                groups
                    .iter()
                    .find(|x| x["group"] == g)
                    .map(|x| x["committed"].as_u64().unwrap())
            };
            assert_eq!(
                committed_of("default"),
                p["committed"].as_u64(),
                "top-level committed is the default group's: {p}"
            );
            (
                p["end_offset"].as_u64().unwrap(),
                p["committed"].as_u64().unwrap(),
                committed_of(group),
            )
        })
        .collect()
}

/// The topic's settings: version 1's as created, every later one at its default.
fn assert_config(s: &Server, groups: &[&str]) {
    let a = s.get(&format!("/topics/{TOPIC}"));
    assert_eq!(a.status, 200, "{}", a.text());
    let j = a.json();
    assert_eq!(j["name"], TOPIC);
    let c = &j["config"];
    let want = json!({
        // version 1 settings, from topic.json
        "partitions": 2,
        "visibility_ms": 30000,
        "max_in_flight": 1024,
        "max_acked_ahead": 1024,
        "retention_ms": 315_360_000_000u64,
        // version 2 settings, absent from the file: their defaults
        "max_groups": 32,
        "redelivery_delay_ms": 0,
        "redelivery_backoff": "fixed",
        "redelivery_delay_max_ms": 900_000,
        "max_deliveries": 0,
        "dead_letter": Value::Null,
        // version 3, absent too
        "dedup_window_ms": 300_000,
        "fifo": false,
        "content_dedup": false,
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&c[k], v, "config.{k} in {c}");
    }
    assert_eq!(j["groups"], json!(groups), "{j}");
    let parts = j["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{j}");
    for p in parts {
        assert_eq!(p["start_offset"], 0, "{p}");
        assert_eq!(p["corrupt_skipped"], 0, "{p}");
    }
}

#[test]
fn v1_data_directory_opens_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    copy_fixture(&data);
    let records = v1_records();
    assert_eq!(
        frontier_file(&data, 0, "consumer.offset"),
        Some(P0_COMMITTED),
        "the fixture's frontier"
    );
    assert!(!partition_dir(&data, 1).join("consumer.offset").exists());

    let mut s = Server::start_in(&data, 1, &[]);

    // The topic, its settings, its offsets and the frontier the old release flushed.
    let a = s.get("/topics");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json(), json!([TOPIC]));
    assert_config(&s, &["default"]);
    assert_eq!(
        partition_state(&s, "default"),
        vec![
            (P0_END, P0_COMMITTED, Some(P0_COMMITTED)),
            (P1_END, 0, Some(0))
        ]
    );

    // Every record at its offset; nothing past the end.
    assert_replay(&s, &records);
    for (p, end) in [(0, P0_END), (1, P1_END)] {
        let a = s.get(&format!(
            "/consume?topic={TOPIC}&partition={p}&offset={end}"
        ));
        assert_eq!(a.status, 204, "replay {p}:{end}: {}", a.text());
    }

    // The default group (a v1 consume: no group parameter) delivers exactly what was not acked, each once.
    let mut delivered = Vec::new();
    while let Some(d) = consume(&s.client, TOPIC, "&visibility=1h") {
        delivered.push(d);
        assert!(delivered.len() <= 100, "the default group keeps delivering");
    }
    delivered.sort_by_key(|d| (d.0, d.1));
    assert_eq!(
        keys(&delivered),
        from_offsets(&records, [P0_COMMITTED, 0]),
        "default group after the upgrade"
    );
    for d in &delivered {
        assert!(
            d.2.starts_with(&format!("{}:{}:", d.0, d.1)),
            "handle {}",
            d.2
        );
    }

    // Acks move the default group's frontier, and it is flushed to consumer.offset, not to a file of its own.
    // Partition 0: all of 7..=12 (frontier 13); partition 1: 0..=2 (frontier 3, a file the old release never wrote).
    for d in &delivered {
        if d.0 == 0 || d.1 < 3 {
            assert_eq!(
                settle(&s.client, "ack", TOPIC, &d.2, ""),
                200,
                "ack {}",
                d.2
            );
        }
    }
    wait_durable(&s, 0, "default", P0_END);
    wait_durable(&s, 1, "default", 3);
    assert_no_default_named_file(&data);
    assert_eq!(
        partition_state(&s, "default"),
        vec![(P0_END, P0_END, Some(P0_END)), (P1_END, 3, Some(3))]
    );

    // A new group starts at the oldest offset, independent of the default group, with its own file.
    let g2 = drain(&s, "g2");
    assert_eq!(keys(&g2), records, "group g2 from the oldest offset");
    for d in g2.iter().filter(|d| d.0 == 0 && d.1 < 4) {
        assert_eq!(
            settle(&s.client, "ack", TOPIC, &d.2, "&group=g2"),
            200,
            "ack {}",
            d.2
        );
    }
    wait_durable(&s, 0, "g2", 4);
    // Written when the group was created: its start, the oldest offset.
    assert_eq!(frontier_file(&data, 1, "consumer.g2.offset"), Some(0));
    assert_no_default_named_file(&data);
    assert_config(&s, &["default", "g2"]);
    assert_eq!(
        partition_state(&s, "g2"),
        vec![(P0_END, P0_END, Some(4)), (P1_END, 3, Some(0))]
    );

    // Produces continue each partition's offsets; the key still maps to the partition it did in version 1.
    let mut all = records.clone();
    for (extra, body, want) in [
        ("&partition=0", &b"v2-p0"[..], (0, P0_END)),
        ("&partition=1", &b"v2-p1"[..], (1, P1_END)),
        ("&key=customer-7", &b"keyed-c"[..], (1, P1_END + 1)),
    ] {
        assert_eq!(s.produce(TOPIC, extra, body), want, "produce {extra}");
        all.push((want.0, want.1, body.to_vec()));
    }
    all.sort();
    assert_replay(&s, &all);

    // kill -9 and the current binary again on the same directory: the frontiers it made durable load (its journal's
    // replay writes them to the files first), nothing else moved.
    s.restart();
    assert_config(&s, &["default", "g2"]);
    assert_eq!(
        partition_state(&s, "g2"),
        vec![(P0_END + 1, P0_END, Some(4)), (P1_END + 2, 3, Some(0))]
    );
    assert_replay(&s, &all);
    // Leases died with the process: each group delivers everything above its frontier, each once.
    assert_eq!(keys(&drain(&s, "default")), from_offsets(&all, [P0_END, 3]));
    assert_eq!(keys(&drain(&s, "g2")), from_offsets(&all, [4, 0]));
    assert_eq!(frontier_file(&data, 0, "consumer.offset"), Some(P0_END));
    assert_eq!(frontier_file(&data, 1, "consumer.offset"), Some(3));
    assert_eq!(frontier_file(&data, 0, "consumer.g2.offset"), Some(4));
    assert_eq!(frontier_file(&data, 1, "consumer.g2.offset"), Some(0));
    assert_no_default_named_file(&data);
}
