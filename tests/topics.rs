//! End-to-end tests of the topic lifecycle (api.md, "Topics"), the routing errors every path shares, and the
//! `berth topic ...` / `berth produce ...` command line, against the real binary.

mod common;

use common::{assert_error, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `GET /topics` as a sorted set of names.
fn topic_names(server: &Server) -> BTreeSet<String> {
    let a = server.get("/topics");
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()
        .as_array()
        .unwrap_or_else(|| panic!("GET /topics is not a JSON array: {}", a.text()))
        .iter()
        .map(|v| v.as_str().expect("topic names are strings").to_string())
        .collect()
}

/// The names of the entries in `{data}/topics`.
fn topic_dirs(server: &Server) -> BTreeSet<String> {
    std::fs::read_dir(server.data_dir.join("topics"))
        .expect("topics dir")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Sends one raw request with `Connection: close` and returns (status, body): for paths a URL library would
/// normalise (`/topics/..`).
fn raw_request(port: u16, head_line: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "{head_line}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).expect("read reply");
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Runs the berth command line against `server`, optionally feeding stdin.
fn cli(server: &Server, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .env_remove("BERTH_SERVER")
        .arg("--server")
        .arg(server.url())
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn berth cli");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input).unwrap();
        // Dropping the pipe closes stdin: the CLI reads to EOF.
    }
    child.wait_with_output().expect("berth cli output")
}

fn stdout_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {text:?}"))
}

/// api.md's defaults, as `config` shows them.
/// Version 2's settings of a topic created with no parameters: version 1's, then the delivery policies.
fn default_config() -> Value {
    with_v2_defaults(json!({
        "partitions": 1,
        "visibility": "30s",
        "visibility_ms": 30_000,
        "max_in_flight": 1024,
        "max_acked_ahead": 1024,
        "retention": "7d",
        "retention_ms": 604_800_000u64,
    }))
}

/// A `config` without its times (`created_ms`, `modified_ms`: clock readings, checked set and in order).
fn settings(config: &Value) -> Value {
    let mut c = config.clone();
    let map = c.as_object_mut().expect("config is an object");
    let created = map.remove("created_ms").and_then(|v| v.as_u64());
    let modified = map.remove("modified_ms").and_then(|v| v.as_u64());
    assert!(
        created.is_some_and(|c| c > 0) && modified >= created,
        "times in {config}"
    );
    c
}

/// Adds the version 2 and 3 settings at their defaults to a version 1 `config` object.
fn with_v2_defaults(mut v1: Value) -> Value {
    let v2 = json!({
        "redelivery_delay": "0ms",
        "redelivery_delay_ms": 0,
        "redelivery_backoff": "fixed",
        "redelivery_delay_max": "15m",
        "redelivery_delay_max_ms": 900_000,
        "max_deliveries": 0,
        "dead_letter": null,
        "max_groups": 32,
        "replicas": 1,
        "dedup_window": "5m",
        "dedup_window_ms": 300_000,
        "fifo": false,
        "content_dedup": false,
        "delay": "0ms",
        "delay_ms": 0,
        "receive_wait": "0ms",
        "receive_wait_ms": 0,
        "max_message_bytes": 0,
        "tags": {},
    });
    for (k, v) in v2.as_object().unwrap() {
        v1[k] = v.clone();
    }
    v1
}

#[test]
fn put_creates_201_then_same_partitions_is_200_and_other_partitions_is_409() {
    let server = Server::start(2, &[]);
    let a = server.put("/topics/orders?partitions=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let j = a.json();
    assert_eq!(j["name"], "orders");
    assert_eq!(j["config"]["partitions"], 3);

    let again = server.put("/topics/orders?partitions=3");
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["name"], "orders");
    assert_eq!(again.json()["config"], j["config"]);

    for other in ["partitions=4", "partitions=1", ""] {
        let a = server.put(&format!("/topics/orders?{other}"));
        assert_error(&a, 409, "topic_exists");
    }
    // The refused PUTs changed nothing.
    assert_eq!(server.partitions("orders").len(), 3);
    assert_eq!(topic_names(&server), names(&["orders"]));
}

#[test]
fn defaults_are_shown_under_config() {
    let server = Server::start(1, &[]);
    let created = server.put("/topics/plain");
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(settings(&created.json()["config"]), default_config());

    let a = server.get("/topics/plain");
    assert_eq!(a.status, 200, "{}", a.text());
    let j = a.json();
    assert_eq!(j["name"], "plain");
    assert_eq!(settings(&j["config"]), default_config());
    assert_eq!(j["partitions"].as_array().unwrap().len(), 1);
}

#[test]
fn custom_config_round_trips_through_describe() {
    let server = Server::start(1, &[]);
    let a = server.put(
        "/topics/tuned?partitions=5&visibility=90s&max_in_flight=7&max_acked_ahead=9&retention=2h",
    );
    assert_eq!(a.status, 201, "{}", a.text());
    let expected = with_v2_defaults(json!({
        "partitions": 5,
        "visibility": "90s",
        "visibility_ms": 90_000,
        "max_in_flight": 7,
        "max_acked_ahead": 9,
        "retention": "2h",
        "retention_ms": 7_200_000,
    }));
    assert_eq!(settings(&a.json()["config"]), expected);
    let described = server.get("/topics/tuned").json();
    assert_eq!(settings(&described["config"]), expected);
    assert_eq!(described["partitions"].as_array().unwrap().len(), 5);
    // A single node is each partition's one replica and its leader, in its one epoch.
    for p in described["partitions"].as_array().unwrap() {
        assert_eq!(
            (&p["replicas"], &p["leader"], &p["epoch"]),
            (&json!(["local"]), &json!("local"), &json!(1)),
            "{p}"
        );
    }
    // Replicas are set at creation: 1 on a single node; a change of them is refused.
    let a = server.put("/topics/copies?replicas=1");
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(a.json()["config"]["replicas"], 1);
    for bad in ["replicas=2", "replicas=0", "replicas=8", "replicas=x"] {
        let a = server.put(&format!("/topics/more?{bad}"));
        assert_error(&a, 400, "invalid_parameter");
    }
    assert_error(&server.get("/topics/more"), 404, "topic_not_found");
    assert_error(
        &server
            .client
            .call("PATCH", "/topics/copies?replicas=1", &[])
            .expect("PATCH"),
        400,
        "invalid_parameter",
    );

    // Edge values of the documented ranges are accepted; a bare integer is seconds.
    let a = server.put("/topics/low?visibility=1s&retention=1");
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(a.json()["config"]["visibility_ms"], 1000);
    assert_eq!(a.json()["config"]["retention_ms"], 1000);
    let a = server.put("/topics/high?visibility=12h&max_in_flight=1");
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(a.json()["config"]["visibility"], "12h");
    assert_eq!(a.json()["config"]["max_in_flight"], 1);
}

#[test]
fn invalid_topic_names_are_400_invalid_topic_and_create_nothing() {
    let server = Server::start(1, &[]);
    server.create_topic("keep", "");
    let long = "x".repeat(129);
    for bad in [
        "a%20b",
        long.as_str(),
        "%C3%BC",
        "caf%C3%A9",
        "a%2Fb",
        "a*b",
    ] {
        let a = server.put(&format!("/topics/{bad}"));
        assert_error(&a, 400, "invalid_topic");
        assert_error(&server.get(&format!("/topics/{bad}")), 400, "invalid_topic");
        assert_error(
            &server.delete(&format!("/topics/{bad}")),
            400,
            "invalid_topic",
        );
    }
    // `..` would be normalised away by a URL library: send it raw, plain and percent-encoded.
    for raw in [
        "PUT /topics/.. HTTP/1.1",
        "PUT /topics/%2E%2E HTTP/1.1",
        "PUT /topics/. HTTP/1.1",
        "GET /topics/.. HTTP/1.1",
        "DELETE /topics/.. HTTP/1.1",
    ] {
        let (status, body) = raw_request(server.port, raw);
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_topic")),
            "{raw}: {body}"
        );
    }
    // 128 characters is the longest valid name.
    server.create_topic(&"y".repeat(128), "");

    assert_eq!(topic_names(&server), names(&["keep", &"y".repeat(128)]));
    assert_eq!(topic_dirs(&server), names(&["keep", &"y".repeat(128)]));
}

#[test]
fn bad_partition_counts_are_400_invalid_parameter_and_create_nothing() {
    let server = Server::start(1, &[]);
    for bad in [
        "0",
        "4097",
        "-1",
        "abc",
        "1.5",
        "",
        "+3",
        "99999999999999999999999",
    ] {
        let a = server.put(&format!("/topics/t?partitions={bad}"));
        assert_error(&a, 400, "invalid_parameter");
    }
    for bad in ["max_in_flight=0", "max_acked_ahead=-5", "max_in_flight=x"] {
        let a = server.put(&format!("/topics/t?{bad}"));
        assert_error(&a, 400, "invalid_parameter");
    }
    assert_eq!(topic_names(&server), BTreeSet::new());
    assert_eq!(topic_dirs(&server), BTreeSet::new());
    assert_error(&server.get("/topics/t"), 404, "topic_not_found");
}

#[test]
fn bad_durations_are_400_invalid_duration_and_create_nothing() {
    let server = Server::start(1, &[]);
    for bad in [
        "visibility=500ms",
        "visibility=13h",
        "visibility=-1",
        "visibility=0",
        "visibility=10x",
        "visibility=1.5s",
        "retention=garbage",
        "retention=-7d",
        "retention=",
        "retention=99999999999999999999d",
    ] {
        let a = server.put(&format!("/topics/t?{bad}"));
        assert_error(&a, 400, "invalid_duration");
    }
    assert_eq!(topic_names(&server), BTreeSet::new());
    assert_eq!(topic_dirs(&server), BTreeSet::new());
}

#[test]
fn list_is_a_json_array_of_names_and_missing_topics_are_404() {
    let server = Server::start(2, &[]);
    let a = server.get("/topics");
    assert_eq!(a.status, 200);
    assert_eq!(a.json(), json!([]));
    for t in ["b-topic", "a.topic", "C_topic"] {
        server.create_topic(t, "partitions=2");
    }
    assert_eq!(
        topic_names(&server),
        names(&["a.topic", "b-topic", "C_topic"])
    );
    assert_error(&server.get("/topics/missing"), 404, "topic_not_found");
    assert_error(&server.delete("/topics/missing"), 404, "topic_not_found");
    assert_eq!(
        topic_names(&server),
        names(&["a.topic", "b-topic", "C_topic"])
    );
}

#[test]
fn delete_removes_topic_and_its_data_and_recreating_starts_at_offset_zero() {
    let server = Server::start(2, &[]);
    server.create_topic("gone", "partitions=2");
    server.create_topic("stays", "");
    for p in 0..2 {
        for i in 0..5 {
            assert_eq!(
                server.produce("gone", &format!("&partition={p}"), b"x"),
                (p, i)
            );
        }
    }
    assert!(server.data_dir.join("topics/gone/1").is_dir());

    let a = server.delete("/topics/gone");
    assert_eq!(a.status, 204, "{}", a.text());
    assert!(a.body.is_empty(), "204 with a body: {}", a.text());
    assert_eq!(topic_names(&server), names(&["stays"]));
    assert_error(&server.get("/topics/gone"), 404, "topic_not_found");
    assert_error(&server.delete("/topics/gone"), 404, "topic_not_found");
    let a = server.post("/produce?topic=gone", b"late");
    assert_error(&a, 404, "topic_not_found");
    // Its directory is gone at once; the renamed-away data is removed in the background, shortly.
    assert!(!server.data_dir.join("topics/gone").exists());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while topic_dirs(&server) != names(&["stays"]) {
        assert!(
            std::time::Instant::now() < deadline,
            "leftover entries: {:?}",
            topic_dirs(&server)
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    // Re-creating it with another partition count is a fresh topic: 201, empty, offsets from 0.
    server.create_topic("gone", "partitions=3");
    let parts = server.partitions("gone");
    assert_eq!(parts.len(), 3);
    for p in &parts {
        assert_eq!(
            (p["start_offset"].as_u64(), p["end_offset"].as_u64()),
            (Some(0), Some(0)),
            "{p}"
        );
    }
    assert_eq!(server.produce("gone", "&partition=0", b"new"), (0, 0));
    assert_eq!(server.produce("gone", "&partition=2", b"new2"), (2, 0));
    let replay = server.get("/consume?topic=gone&partition=0&offset=0");
    assert_eq!((replay.status, replay.body.as_slice()), (200, &b"new"[..]));

    // The deletion also survives a restart (nothing resurrects from disk).
    let mut server = server;
    server.restart();
    assert_eq!(topic_names(&server), names(&["gone", "stays"]));
    assert_eq!(server.partitions("gone").len(), 3);
    assert_eq!(server.produce("gone", "&partition=0", b"after"), (0, 1));
}

#[test]
fn topic_metadata_survives_kill9_restart() {
    let mut server = Server::start(2, &[]);
    server.create_topic("one", "");
    server.create_topic(
        "many",
        "partitions=6&visibility=5m&max_in_flight=3&retention=1d",
    );
    server.create_topic("acks", "max_acked_ahead=77&visibility=2500ms");
    let before: Vec<Value> = ["one", "many", "acks"]
        .iter()
        .map(|t| server.get(&format!("/topics/{t}")).json())
        .collect();
    assert_eq!(before[2]["config"]["visibility"], "2500ms");

    server.restart();

    assert_eq!(topic_names(&server), names(&["one", "many", "acks"]));
    for (t, old) in ["one", "many", "acks"].iter().zip(&before) {
        let now = server.get(&format!("/topics/{t}")).json();
        assert_eq!(now["config"], old["config"], "{t}");
        assert_eq!(now["partitions"], old["partitions"], "{t}");
    }
    // Creating again after the restart still sees them: 200 with the same count, 409 with another.
    assert_eq!(server.put("/topics/many?partitions=6").status, 200);
    assert_error(
        &server.put("/topics/many?partitions=2"),
        409,
        "topic_exists",
    );
}

#[test]
fn partitions_are_spread_over_every_core_and_describe_every_field() {
    let server = Server::start(2, &[]);
    server.create_topic("wide", "partitions=8");
    let parts = server.partitions("wide");
    assert_eq!(parts.len(), 8);
    let mut cores = BTreeSet::new();
    for (i, p) in parts.iter().enumerate() {
        let obj = p
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {p}"));
        for key in [
            "partition",
            "core",
            "start_offset",
            "end_offset",
            "committed",
            "in_flight",
            "acked_ahead",
            "corrupt_skipped",
        ] {
            assert!(
                obj.get(key).and_then(Value::as_u64).is_some(),
                "partition {i} lacks {key}: {p}"
            );
        }
        assert_eq!(
            p["partition"].as_u64(),
            Some(i as u64),
            "partitions out of order"
        );
        for zero in [
            "start_offset",
            "end_offset",
            "committed",
            "in_flight",
            "acked_ahead",
            "corrupt_skipped",
        ] {
            assert_eq!(p[zero].as_u64(), Some(0), "fresh partition {i}: {p}");
        }
        cores.insert(p["core"].as_u64().unwrap());
    }
    assert_eq!(cores, BTreeSet::from([0, 1]));

    // Describe reports the same owners whichever core takes the request (fresh connections spread by the kernel).
    for _ in 0..6 {
        let fresh = berth::client::Client::new(&server.url());
        let again = fresh.call("GET", "/topics/wide", &[]).unwrap().json();
        let owners: Vec<_> = again["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["core"].clone())
            .collect();
        let expected: Vec<_> = parts.iter().map(|p| p["core"].clone()).collect();
        assert_eq!(owners, expected);
    }
}

#[test]
fn unknown_path_is_404_not_found_and_wrong_method_is_405() {
    let server = Server::start(1, &[]);
    server.create_topic("x", "");
    // `/` is the status page (tests/status_page.rs).
    for path in [
        "/nope",
        "/topicsx",
        "/produce/extra",
        "/health/",
        "/status/",
    ] {
        assert_error(&server.get(path), 404, "not_found");
    }
    assert_error(&server.post("/nope", b"body"), 404, "not_found");

    let cases: [(&str, &str, &str); 9] = [
        ("GET", "/produce?topic=x", "POST"),
        ("POST", "/topics/x", "GET"),
        ("POST", "/topics", "GET"),
        ("PUT", "/consume?topic=x", "GET"),
        ("GET", "/ack?topic=x", "POST"),
        ("DELETE", "/health", "GET"),
        ("PUT", "/metrics", "GET"),
        ("POST", "/", "GET"),
        ("DELETE", "/status", "GET"),
    ];
    for (method, path, allowed) in cases {
        let a = server.client.call(method, path, b"").unwrap();
        assert_eq!(a.status, 405, "{method} {path}: {}", a.text());
        assert!(
            a.json()["error"].is_string(),
            "405 without a JSON error: {}",
            a.text()
        );
        let allow = a
            .header("allow")
            .unwrap_or_else(|| panic!("{method} {path}: 405 without Allow"));
        assert!(
            allow.split(", ").any(|m| m == allowed),
            "{method} {path}: Allow: {allow}"
        );
    }
    // A wrong-method PUT/POST never created or produced anything.
    assert_eq!(topic_names(&server), names(&["x"]));
    assert_eq!(server.partitions("x")[0]["end_offset"], 0);
}

#[test]
fn cli_creates_lists_describes_and_deletes_a_topic() {
    let server = Server::start(2, &[]);
    let out = cli(
        &server,
        &["topic", "create", "clitopic", "--partitions", "3"],
        None,
    );
    assert!(out.status.success(), "create: {out:?}");
    let created = stdout_json(&out);
    assert_eq!(
        (
            created["name"].as_str(),
            created["config"]["partitions"].as_u64()
        ),
        (Some("clitopic"), Some(3))
    );
    assert_eq!(server.partitions("clitopic").len(), 3);

    // Creating again with the same count succeeds; with another count it fails with the API's reason.
    let out = cli(
        &server,
        &["topic", "create", "clitopic", "--partitions", "3"],
        None,
    );
    assert!(out.status.success(), "re-create: {out:?}");
    let out = cli(
        &server,
        &["topic", "create", "clitopic", "--partitions", "2"],
        None,
    );
    assert!(
        !out.status.success(),
        "conflicting create succeeded: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("topic_exists"),
        "{out:?}"
    );

    let out = cli(&server, &["topic", "list"], None);
    assert!(out.status.success(), "list: {out:?}");
    assert_eq!(stdout_json(&out), json!(["clitopic"]));

    let out = cli(&server, &["topic", "describe", "clitopic"], None);
    assert!(out.status.success(), "describe: {out:?}");
    let described = stdout_json(&out);
    assert_eq!(described["name"], "clitopic");
    assert_eq!(described["partitions"].as_array().map(Vec::len), Some(3));

    let out = cli(&server, &["topic", "delete", "clitopic"], None);
    assert!(out.status.success(), "delete: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("clitopic"),
        "{out:?}"
    );
    assert_eq!(topic_names(&server), BTreeSet::new());

    // Describing or deleting it now fails, naming the reason.
    for args in [
        &["topic", "describe", "clitopic"][..],
        &["topic", "delete", "clitopic"][..],
    ] {
        let out = cli(&server, args, None);
        assert!(!out.status.success(), "{args:?} succeeded: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("topic_not_found"),
            "{out:?}"
        );
    }
}

#[test]
fn cli_produces_from_an_argument_and_from_stdin() {
    let server = Server::start(1, &[]);
    server.create_topic("clip", "");
    let out = cli(&server, &["produce", "clip", "hello"], None);
    assert!(out.status.success(), "produce arg: {out:?}");
    assert_eq!(stdout_json(&out), json!({"partition": 0, "offset": 0}));

    let out = cli(&server, &["produce", "clip"], Some(b"x"));
    assert!(out.status.success(), "produce stdin: {out:?}");
    assert_eq!(stdout_json(&out), json!({"partition": 0, "offset": 1}));

    let out = cli(
        &server,
        &["produce", "clip", "--partition", "0", "--key", "k", "third"],
        None,
    );
    assert!(out.status.success(), "produce with partition: {out:?}");
    assert_eq!(stdout_json(&out), json!({"partition": 0, "offset": 2}));

    for (offset, body) in [(0, &b"hello"[..]), (1, b"x"), (2, b"third")] {
        let a = server.get(&format!("/consume?topic=clip&partition=0&offset={offset}"));
        assert_eq!(
            (a.status, a.body.as_slice()),
            (200, body),
            "offset {offset}"
        );
    }
}

#[test]
fn cli_produce_to_a_missing_topic_or_dead_server_exits_nonzero() {
    let mut server = Server::start(1, &[]);
    let out = cli(&server, &["produce", "nosuch", "hello"], None);
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "printed a result: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("topic_not_found"),
        "{out:?}"
    );

    let out = cli(&server, &["produce", "bad name", "hello"], None);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid_topic"),
        "{out:?}"
    );

    server.kill9();
    let out = cli(&server, &["topic", "list"], None);
    assert!(
        !out.status.success(),
        "list against a dead server succeeded: {out:?}"
    );
}
