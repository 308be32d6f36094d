//! `berth bench` end to end: a short run against its embedded server prints a row per client core and operation,
//! writes JSON, .hgrm files and an SVG, and the JSON agrees with the table.

use std::process::Command;

#[test]
fn a_short_cycle_bench_writes_table_json_hgrm_and_svg_that_agree() {
    let _g = {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LOCK.lock().unwrap_or_else(|e| e.into_inner())
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let hgrm = dir.path().join("hgrm");
    let svg = dir.path().join("plot.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "bench",
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
        .expect("run berth bench");
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
    assert!(doc["server_cpu_us_per_unit"].as_f64().unwrap() > 0.0);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("polyline"));
    assert!(
        stdout.contains("server core"),
        "server-side histograms missing:\n{stdout}"
    );
}
