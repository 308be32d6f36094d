//! The status page (`GET /`) in a real browser: headless Chromium (Debian's `chromium-headless-shell`, installed by
//! `.ci/run`) loads it from the real binary while the test produces and consumes, and the test reads what a person
//! would see in the DOM the page built: the topic's counts, the latency plots drawn and changing, a killed node
//! shown dead, the token prompt. Screenshots go to `target/status-page/` (the README's is `docs/status-page.png`).

mod common;

use berth::client::Client;
use common::cluster::{Cluster, Opts};
use common::{consume, serial, settle, Server};
use std::path::PathBuf;
use std::process::Command;

fn browser() -> &'static str {
    "chromium-headless-shell"
}

/// Loads `url` in a fresh headless browser and returns the DOM once the page's scripts have run for `budget_ms`
/// of virtual time (virtual time stands still while a fetch is outstanding, so each refresh's answer is in).
/// With `shot`, a screenshot of the same load is saved there too.
fn load(url: &str, budget_ms: u64, shot: Option<&str>) -> String {
    let profile = tempfile::tempdir().expect("tempdir");
    let mut args = vec![
        "--no-sandbox".to_string(),
        "--disable-gpu".into(),
        format!("--user-data-dir={}", profile.path().display()),
        format!("--virtual-time-budget={budget_ms}"),
        "--window-size=1280,1000".into(),
        "--dump-dom".into(),
    ];
    if let Some(name) = shot {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../status-page");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        args.push(format!("--screenshot={}", dir.join(name).display()));
    }
    args.push(url.to_string());
    let out = Command::new("timeout")
        .arg("60")
        .arg(browser())
        .args(&args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): .ci/run installs it (apt-get install chromium-headless-shell)",
                browser()
            )
        });
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && dom.contains("</html>"),
        "{} failed ({}): {}",
        browser(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

/// The text of the cell `field` in the row of `topic` and `group`.
fn cell(dom: &str, topic: &str, group: &str, field: &str) -> Option<String> {
    let row = dom.find(&format!("data-topic=\"{topic}\" data-group=\"{group}\""))?;
    let rest = &dom[row..];
    let end = rest.find("</tr>")?;
    let rest = &rest[..end];
    let marker = format!("data-field=\"{field}\">");
    let at = rest.find(&marker)? + marker.len();
    Some(rest[at..].split('<').next()?.to_string())
}

/// The `points` of each plotted line: (core, op, points).
fn plotted(dom: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for svg in dom.split("<svg class=\"plot\" data-core=\"").skip(1) {
        let core = svg.split('"').next().unwrap_or("").to_string();
        let svg = svg.split("</svg>").next().unwrap_or("");
        for line in svg.split("<polyline data-op=\"").skip(1) {
            let op = line.split('"').next().unwrap_or("").to_string();
            let points = line
                .split("points=\"")
                .nth(1)
                .and_then(|p| p.split('"').next())
                .unwrap_or("")
                .to_string();
            out.push((core.clone(), op, points));
        }
    }
    out
}

fn refreshes(dom: &str) -> u64 {
    dom.split("data-refreshes=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// A person opening the page sees the topic with the counts the API gives, per-core percentile plots of the data
/// path drawn from the traffic, and those plots change as the traffic does; the page refreshes on its own.
#[test]
fn the_page_shows_the_topics_counts_and_latency_plots_that_follow_the_traffic() {
    let _serial = serial();
    let s = Server::start(2, &[]);
    s.create_topic("orders", "partitions=4");
    for i in 0..10 {
        s.produce("orders", "", format!("order {i}").as_bytes());
    }
    // Three leased, two of them acked: 8 unsettled (lag), 1 leased, 7 ready.
    let leased: Vec<_> = (0..3)
        .map(|_| consume(&s.client, "orders", "").expect("a message"))
        .collect();
    for d in &leased[..2] {
        assert_eq!(settle(&s.client, "ack", "orders", &d.2, ""), 200);
    }
    let dom = load(&s.url(), 4_000, Some("single-node.png"));
    assert!(
        refreshes(&dom) >= 2,
        "the page refreshed on its own: {}",
        refreshes(&dom)
    );
    for (field, want) in [
        ("lag", "8"),
        ("leased", "1"),
        ("ready", "7"),
        ("delayed", "0"),
        ("dead_lettered", "0"),
    ] {
        assert_eq!(
            cell(&dom, "orders", "default", field).as_deref(),
            Some(want),
            "{field} of orders/default in the page"
        );
    }
    // The oldest unsettled message was produced seconds ago (the page shows its age, not a dash).
    let oldest = cell(&dom, "orders", "default", "oldest").unwrap_or_default();
    assert!(
        oldest
            .strip_suffix(" s")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n < 60),
        "the oldest unsettled message's age in seconds: {oldest:?}"
    );
    assert!(
        dom.contains("id=\"fsync\">always<"),
        "the node's fsync policy shown"
    );
    let before = plotted(&dom);
    for op in ["produce", "consume", "settle"] {
        assert!(
            before
                .iter()
                .any(|(_, o, p)| o == op && p.split(' ').count() >= 2),
            "a {op} line is plotted: {before:?}"
        );
    }
    // More traffic, some of it slow (long messages, batches): the lines move.
    let client = Client::new(&s.url());
    for i in 0..200 {
        let body = vec![b'x'; 1 + (i % 7) * 9000];
        let a = client
            .call("POST", "/produce?topic=orders", &body)
            .expect("produce");
        assert_eq!(a.status, 200, "{}", a.text());
    }
    for _ in 0..50 {
        let d = consume(&client, "orders", "").expect("a message");
        assert_eq!(settle(&client, "nack", "orders", &d.2, ""), 200);
    }
    let after = plotted(&load(&s.url(), 4_000, None));
    assert_ne!(before, after, "the plots follow the traffic");
    let dom = load(&s.url(), 2_000, None);
    assert_eq!(
        cell(&dom, "orders", "default", "lag").as_deref(),
        Some("208")
    );
    // While traffic runs, the plots show the last second, not the lifetime.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = std::thread::spawn({
        let (url, stop) = (s.url(), stop.clone());
        move || {
            let client = Client::new(&url);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let a = client
                    .call("POST", "/produce?topic=orders", b"more")
                    .expect("produce");
                assert_eq!(a.status, 200, "{}", a.text());
            }
        }
    });
    let during = load(&s.url(), 4_000, None);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.join().expect("traffic");
    assert!(
        during.contains("data-window=\"interval\""),
        "no plot of the last interval while traffic ran"
    );
}

/// With a token configured, the page itself opens without one (it holds no data) and asks for it; `/status` is
/// refused without it.
#[test]
fn with_a_token_the_page_asks_for_it_and_status_needs_it() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "page-token-0123456789abcdef\n").unwrap();
    let s = Server::start(1, &["--auth-token-file", token_file.to_str().unwrap()]);
    let anonymous = Client::new(&s.url());
    assert_eq!(anonymous.call("GET", "/status", &[]).unwrap().status, 401);
    let authed = Client::new(&s.url()).with_token(Some("page-token-0123456789abcdef".into()));
    let a = authed.call("GET", "/status", &[]).unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["node"]["cores"], 1);
    let dom = load(&s.url(), 2_000, Some("token-prompt.png"));
    let form = dom
        .split("<form id=\"token-form\"")
        .nth(1)
        .and_then(|f| f.split('>').next())
        .expect("the token form");
    assert!(
        !form.contains("hidden"),
        "the token prompt is shown: {form}"
    );
    assert!(dom.contains("needs a token"), "the state says why");
    assert!(
        dom.contains("<div id=\"content\" hidden"),
        "nothing else is shown without the token"
    );
}

/// In cluster mode the page lists every node with its liveness: a node killed with SIGKILL is shown dead once its
/// session lapses, the others alive.
#[test]
fn a_killed_node_is_shown_dead() {
    let _serial = serial();
    let Some(mut c) = Cluster::start_with("status_page_killed_node", 3, Opts::short_ttl()) else {
        return;
    };
    // `GET /cluster` (which the page shows) lists the nodes in the order of their ids.
    let listed: Vec<String> = c.node(1).get("/cluster").json()["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["id"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(listed, ["n1", "n2", "n3"]);
    let dom = load(&c.node(0).url(), 2_000, None);
    for id in ["n1", "n2", "n3"] {
        assert!(
            dom.contains(&format!("data-node=\"{id}\" data-alive=\"true\"")),
            "{id} alive in the page"
        );
    }
    // A topic with a partition on each node (placement is round-robin over the live nodes).
    let a = c.node(0).put("/topics/spread?partitions=3");
    assert_eq!(a.status, 201, "{}", a.text());
    c.kill9(2);
    c.wait_alive(0, "n3", false);
    // Described while n3 is down: 200, n3's partition listed as unavailable, where it lives, the others as usual.
    let described = c.node(0).get("/topics/spread");
    assert_eq!(described.status, 200, "{}", described.text());
    let parts = described.json()["partitions"].clone();
    let parts = parts.as_array().expect("partitions");
    assert_eq!(parts.len(), 3, "{parts:?}");
    let down: Vec<&serde_json::Value> = parts.iter().filter(|p| p["available"] == false).collect();
    assert_eq!(down.len(), 1, "{parts:?}");
    assert_eq!(down[0]["node"], "n3", "{parts:?}");
    assert!(
        parts
            .iter()
            .filter(|p| p["available"] != false)
            .all(|p| p["end_offset"].is_u64()),
        "{parts:?}"
    );
    let dom = load(&c.node(0).url(), 2_000, Some("cluster-node-dead.png"));
    assert!(
        dom.contains("data-node=\"n3\" data-alive=\"false\""),
        "n3 shown dead"
    );
    for id in ["n1", "n2"] {
        assert!(dom.contains(&format!("data-node=\"{id}\" data-alive=\"true\"")));
    }
}
