//! The client commands of version 2 end to end, through the `berth` binary against a real server: `--group` on
//! consume/ack/nack/extend (single and batch settles), `nack --delay`, every topic setting on `topic create` and
//! `topic update`, `group list|create|describe|delete`, `redrive`, and the delivery count in consume's output.
//! Every command's failure is checked too: exit status 1 and the server's own error line on stderr.

mod common;

use common::Server;
use serde_json::{json, Value};
use std::process::{Command, Stdio};

/// What one run of the command line did.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts exit 0 and returns stdout parsed as one JSON value.
    fn json(&self) -> Value {
        assert_eq!(self.code, Some(0), "failed: {}", self.stderr);
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {:?}", self.stdout))
    }

    /// Asserts exit 0 and returns every stdout line parsed as JSON.
    fn lines(&self) -> Vec<Value> {
        assert_eq!(self.code, Some(0), "failed: {}", self.stderr);
        self.stdout
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}"))
            })
            .collect()
    }

    /// Asserts exit 0 with nothing on stdout.
    fn quiet(&self) {
        assert_eq!(
            (self.code, self.stdout.as_str()),
            (Some(0), ""),
            "stderr: {}",
            self.stderr
        );
    }
}

/// Runs `berth --server URL ARGS`.
fn berth(server: &Server, args: &[&str]) -> Run {
    berth_fed(server, args, None)
}

/// Runs `berth --server URL ARGS` with `stdin` as its standard input (none: /dev/null).
fn berth_fed(server: &Server, args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_AUTH_TOKEN")
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
        .expect("run berth");
    if let Some(input) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write stdin");
    }
    let out = child.wait_with_output().expect("run berth");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `args`, expecting the failure the server gives to `method path` (asked directly): exit 1, nothing on
/// stdout, and exactly `berth: STATUS CODE: MESSAGE` on stderr. Returns the error code.
fn fails_like(server: &Server, args: &[&str], method: &str, path: &str) -> String {
    let direct = server.client.call(method, path, &[]).expect("direct call");
    assert!(direct.status >= 400, "{method} {path}: {}", direct.text());
    let j = direct.json();
    let (code, message) = (j["error"].as_str().unwrap(), j["message"].as_str().unwrap());
    let run = berth(server, args);
    assert_eq!(run.code, Some(1), "{args:?}: stderr {}", run.stderr);
    assert_eq!(run.stdout, "", "{args:?} printed a result");
    assert_eq!(
        run.stderr,
        format!("berth: {} {code}: {message}\n", direct.status),
        "{args:?}"
    );
    code.to_string()
}

/// A group's state from `GET /topics/T/groups/G`, partition 0.
fn group_state(server: &Server, topic: &str, group: &str) -> Value {
    let a = server.get(&format!("/topics/{topic}/groups/{group}"));
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()["partitions"][0].clone()
}

fn handle(message: &Value) -> &str {
    message["receipt_handle"]
        .as_str()
        .expect("a receipt handle")
}

/// A topic's settings without its times (checked set: `created_ms` and `modified_ms` are clock readings).
fn settings(config: &Value) -> Value {
    let mut c = config.clone();
    let map = c.as_object_mut().expect("config is an object");
    for k in ["created_ms", "modified_ms"] {
        let t = map.remove(k).and_then(|v| v.as_u64());
        assert!(t.is_some_and(|t| t > 0), "{k} missing from {config}");
    }
    c
}

#[test]
fn topic_create_takes_every_setting_and_update_patches_all_but_partitions() {
    let server = Server::start(1, &[]);
    berth(&server, &["topic", "create", "orders.dlq"]).json();
    let created = berth(
        &server,
        &[
            "topic",
            "create",
            "orders",
            "--partitions",
            "2",
            "--visibility",
            "10s",
            "--max-in-flight",
            "7",
            "--max-acked-ahead",
            "8",
            "--retention",
            "1d",
            "--max-groups",
            "4",
            "--redelivery-delay",
            "1s",
            "--redelivery-backoff",
            "exponential",
            "--redelivery-delay-max",
            "1m",
            "--max-deliveries",
            "3",
            "--dead-letter",
            "orders.dlq",
            "--replicas",
            "1",
            "--dedup-window",
            "1m",
            "--delay",
            "5s",
            "--receive-wait",
            "2s",
            "--max-message-bytes",
            "4096",
        ],
    )
    .json();
    let want = json!({
        "partitions": 2,
        "visibility": "10s",
        "visibility_ms": 10_000,
        "max_in_flight": 7,
        "max_acked_ahead": 8,
        "retention": "1d",
        "retention_ms": 86_400_000,
        "max_groups": 4,
        "redelivery_delay": "1s",
        "redelivery_delay_ms": 1000,
        "redelivery_backoff": "exponential",
        "redelivery_delay_max": "1m",
        "redelivery_delay_max_ms": 60_000,
        "max_deliveries": 3,
        "dead_letter": "orders.dlq",
        "replicas": 1,
        "dedup_window": "1m",
        "dedup_window_ms": 60_000,
        "fifo": false,
        "content_dedup": false,
        "delay": "5s",
        "delay_ms": 5000,
        "receive_wait": "2s",
        "receive_wait_ms": 2000,
        "max_message_bytes": 4096,
        "tags": {},
    });
    assert_eq!(created["created"], true);
    assert_eq!(settings(&created["config"]), want);
    assert_eq!(
        settings(&server.get("/topics/orders").json()["config"]),
        want
    );

    // Update: every setting but partitions; the reply is the new config, and it is what the server now holds.
    let updated = berth(
        &server,
        &[
            "topic",
            "update",
            "orders",
            "--visibility",
            "20s",
            "--max-in-flight",
            "9",
            "--max-acked-ahead",
            "10",
            "--retention",
            "2d",
            "--max-groups",
            "5",
            "--redelivery-delay",
            "250ms",
            "--redelivery-backoff",
            "fixed",
            "--redelivery-delay-max",
            "2m",
            "--max-deliveries",
            "5",
            "--dead-letter",
            "orders.dlq",
            "--dedup-window",
            "0",
            "--delay",
            "0",
            "--receive-wait",
            "20s",
            "--max-message-bytes",
            "0",
        ],
    )
    .json();
    let want = json!({
        "partitions": 2,
        "visibility": "20s",
        "visibility_ms": 20_000,
        "max_in_flight": 9,
        "max_acked_ahead": 10,
        "retention": "2d",
        "retention_ms": 172_800_000,
        "max_groups": 5,
        "redelivery_delay": "250ms",
        "redelivery_delay_ms": 250,
        "redelivery_backoff": "fixed",
        "redelivery_delay_max": "2m",
        "redelivery_delay_max_ms": 120_000,
        "max_deliveries": 5,
        "dead_letter": "orders.dlq",
        "replicas": 1,
        "dedup_window": "0ms",
        "dedup_window_ms": 0,
        "fifo": false,
        "content_dedup": false,
        "delay": "0ms",
        "delay_ms": 0,
        "receive_wait": "20s",
        "receive_wait_ms": 20_000,
        "max_message_bytes": 0,
        "tags": {},
    });
    assert_eq!(updated["name"], "orders");
    assert_eq!(settings(&updated["config"]), want);
    assert_eq!(
        settings(&server.get("/topics/orders").json()["config"]),
        want
    );

    // Settings not named are left alone; an empty --dead-letter clears it (with max_deliveries back to 0).
    let updated = berth(
        &server,
        &[
            "topic",
            "update",
            "orders",
            "--max-deliveries",
            "0",
            "--dead-letter",
            "",
        ],
    )
    .json();
    assert_eq!(updated["config"]["dead_letter"], Value::Null);
    assert_eq!(updated["config"]["max_deliveries"], 0);
    assert_eq!(updated["config"]["visibility"], "20s");

    // Nothing to change is refused before anything is sent; partitions is not a flag of update (usage error).
    let run = berth(&server, &["topic", "update", "orders"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("at least one setting"),
        "{}",
        run.stderr
    );
    let run = berth(&server, &["topic", "update", "orders", "--partitions", "3"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(server.partitions("orders").len(), 2);

    // The server's refusals come back as they are.
    assert_eq!(
        fails_like(
            &server,
            &["topic", "update", "nosuch", "--max-deliveries", "5"],
            "PATCH",
            "/topics/nosuch?max_deliveries=5",
        ),
        "topic_not_found"
    );
    assert_eq!(
        fails_like(
            &server,
            &["topic", "update", "orders", "--dead-letter", "nosuch"],
            "PATCH",
            "/topics/orders?dead_letter=nosuch",
        ),
        "invalid_parameter"
    );
    assert_eq!(
        fails_like(
            &server,
            &["topic", "create", "other", "--redelivery-delay", "13h"],
            "PUT",
            "/topics/other?partitions=1&redelivery_delay=13h",
        ),
        "invalid_duration"
    );
    assert_eq!(
        server.get("/topics").json(),
        json!(["orders", "orders.dlq"])
    );
}

#[test]
fn consume_ack_nack_and_extend_work_in_the_group_they_name() {
    let server = Server::start(1, &[]);
    server.create_topic("jobs", "");
    for body in ["a", "b", "c"] {
        server.produce("jobs", "", body.as_bytes());
    }
    berth(&server, &["group", "create", "jobs", "g1"]).json();
    berth(
        &server,
        &["group", "create", "jobs", "late", "--start", "latest"],
    )
    .json();

    // g1 starts at the oldest record; every line carries the delivery count.
    let got = berth(
        &server,
        &["consume", "jobs", "--group", "g1", "--count", "2"],
    )
    .lines();
    assert_eq!(got.len(), 2);
    for (m, (offset, body)) in got.iter().zip([(0, "a"), (1, "b")]) {
        assert_eq!(
            (&m["offset"], &m["body"], &m["delivery_count"]),
            (&json!(offset), &json!(body), &json!(1)),
            "{m}"
        );
    }
    assert_eq!(group_state(&server, "jobs", "g1")["in_flight"], 2);
    // A group started at the latest offset has nothing; the default group is untouched by g1's leases.
    let run = berth(&server, &["consume", "jobs", "--group", "late"]);
    run.quiet();
    assert!(
        run.stderr.contains("no message available"),
        "{}",
        run.stderr
    );
    let first_default = berth(&server, &["consume", "jobs"]).json();
    assert_eq!(
        (&first_default["offset"], &first_default["delivery_count"]),
        (&json!(0), &json!(1))
    );

    // A handle is good only in the group that leased it.
    let (h0, h1) = (handle(&got[0]), handle(&got[1]));
    let run = berth(&server, &["ack", "jobs", h0]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.starts_with("berth: 410 lease_gone: "),
        "{}",
        run.stderr
    );
    let run = berth(&server, &["extend", "jobs", h1, "--group", "late"]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.starts_with("berth: 410 lease_gone: "),
        "{}",
        run.stderr
    );
    assert_eq!(
        berth(&server, &["ack", "jobs", h0, "--group", "g1"]).json(),
        json!({ "acked": h0 })
    );
    assert_eq!(group_state(&server, "jobs", "g1")["committed"], 1);
    assert_eq!(group_state(&server, "jobs", "default")["committed"], 0);
    assert_eq!(
        berth(
            &server,
            &["extend", "jobs", h1, "--group", "g1", "--visibility", "1h"],
        )
        .json(),
        json!({ "extended": h1 })
    );

    // A nack without delay: deliverable again at once, with its count up.
    assert_eq!(
        berth(&server, &["nack", "jobs", h1, "--group", "g1"]).json(),
        json!({ "nacked": h1 })
    );
    let again = berth(&server, &["consume", "jobs", "--group", "g1"]).json();
    assert_eq!(
        (&again["offset"], &again["delivery_count"]),
        (&json!(1), &json!(2))
    );
    // With --delay it is held back: the next consumes see only offset 2.
    berth(
        &server,
        &[
            "nack",
            "jobs",
            handle(&again),
            "--group",
            "g1",
            "--delay",
            "1h",
        ],
    )
    .json();
    assert_eq!(group_state(&server, "jobs", "g1")["delayed"], 1);
    let rest = berth(
        &server,
        &[
            "consume", "jobs", "--group", "g1", "--max", "10", "--count", "10",
        ],
    )
    .lines();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(
        (&rest[0]["offset"], &rest[0]["delivery_count"]),
        (&json!(2), &json!(1))
    );
    let bad_delay = berth(
        &server,
        &[
            "nack",
            "jobs",
            handle(&rest[0]),
            "--group",
            "g1",
            "--delay",
            "13h",
        ],
    );
    assert_eq!(bad_delay.code, Some(1));
    assert!(
        bad_delay
            .stderr
            .starts_with("berth: 400 invalid_duration: "),
        "{}",
        bad_delay.stderr
    );

    // Batch consumes settle in their group: a batch nack comes back with count 2, a batch ack commits.
    let batch = berth(
        &server,
        &[
            "consume", "jobs", "--group", "g2", "--max", "3", "--count", "3", "--nack",
        ],
    )
    .lines();
    assert_eq!(batch.len(), 3);
    assert!(batch.iter().all(|m| m["delivery_count"] == 1), "{batch:?}");
    let batch = berth(
        &server,
        &[
            "consume", "jobs", "--group", "g2", "--max", "3", "--count", "3", "--ack",
        ],
    )
    .lines();
    assert_eq!(batch.len(), 3);
    assert!(batch.iter().all(|m| m["delivery_count"] == 2), "{batch:?}");
    assert_eq!(group_state(&server, "jobs", "g2")["committed"], 3);
    // So do single consumes with --ack.
    let acked = berth(&server, &["consume", "jobs", "--group", "g3", "--ack"]).json();
    assert_eq!(acked["offset"], 0);
    assert_eq!(group_state(&server, "jobs", "g3")["committed"], 1);
    assert_eq!(group_state(&server, "jobs", "g3")["in_flight"], 0);

    // An unknown topic: the server's error, exit 1, for each command.
    for (args, path) in [
        (
            &["consume", "nosuch", "--group", "g1"][..],
            "/consume?topic=nosuch&group=g1",
        ),
        (
            &["consume", "nosuch", "--group", "g1", "--max", "5"][..],
            "/consume?topic=nosuch&group=g1&max=5",
        ),
        (
            &["ack", "nosuch", "0:0:1", "--group", "g1"][..],
            "/ack?topic=nosuch&receipt_handle=0:0:1&group=g1",
        ),
        (
            &["nack", "nosuch", "0:0:1", "--group", "g1", "--delay", "5s"][..],
            "/nack?topic=nosuch&receipt_handle=0:0:1&group=g1&delay=5s",
        ),
        (
            &["extend", "nosuch", "0:0:1", "--group", "g1"][..],
            "/extend?topic=nosuch&receipt_handle=0:0:1&group=g1",
        ),
    ] {
        let method = if args[0] == "consume" { "GET" } else { "POST" };
        assert_eq!(fails_like(&server, args, method, path), "topic_not_found");
    }
}

/// Bodies are binary-safe: every byte value goes in through `produce --frames` and comes back unchanged from a
/// single consume, a batch consume and a replay, printed as `body` when the bytes are UTF-8 and as `body_base64`
/// otherwise (a lossy conversion would print U+FFFD). And `--max N` alone takes up to N messages in one request.
#[test]
fn every_byte_value_round_trips_through_the_cli_and_max_alone_takes_up_to_max() {
    use base64::Engine as _;
    let server = Server::start(1, &[]);
    server.create_topic("bin", "partitions=1");
    // One message per byte value, one holding all 256 values in order, and text with a multi-byte character.
    let mut bodies: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    bodies.push((0..=255u8).collect());
    bodies.push("ok \u{2713}".as_bytes().to_vec());
    let mut frames = Vec::new();
    for b in &bodies {
        frames.extend((b.len() as u32).to_le_bytes());
        frames.extend(b);
    }
    let produced = berth_fed(&server, &["produce", "bin", "--frames"], Some(&frames)).lines();
    assert_eq!(produced.len(), bodies.len());
    let body_of = |m: &Value| -> Vec<u8> {
        match (m["body"].as_str(), m["body_base64"].as_str()) {
            (Some(text), None) => text.as_bytes().to_vec(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("standard base64"),
            _ => panic!("exactly one of body and body_base64: {m}"),
        }
    };
    let check = |form: &str, got: &[Value]| {
        assert_eq!(got.len(), bodies.len(), "{form}");
        for (i, (m, want)) in got.iter().zip(&bodies).enumerate() {
            assert_eq!(m["offset"], json!(i), "{form}: {m}");
            assert_eq!(&body_of(m), want, "{form}: offset {i}: {m}");
            let utf8 = std::str::from_utf8(want).is_ok();
            assert_eq!(m["body"].is_string(), utf8, "{form}: offset {i}: {m}");
        }
    };
    let count = bodies.len().to_string();
    let single = berth(&server, &["consume", "bin", "--count", &count]).lines();
    check("single consumes", &single);
    berth(&server, &["group", "create", "bin", "batch"]).json();
    let batch = berth(
        &server,
        &[
            "consume", "bin", "--group", "batch", "--max", "100", "--count", &count,
        ],
    )
    .lines();
    check("batch consumes", &batch);
    let replayed: Vec<Value> = (0..bodies.len())
        .filter(|i| [0, 0x7f, 0x80, 0xff, 256, 257].contains(i))
        .map(|i| {
            let m = berth(
                &server,
                &[
                    "consume",
                    "bin",
                    "--partition",
                    "0",
                    "--offset",
                    &i.to_string(),
                ],
            )
            .json();
            assert_eq!(&body_of(&m), &bodies[i], "replay of offset {i}: {m}");
            m
        })
        .collect();
    assert_eq!(replayed.len(), 6);
    assert!(replayed[2]["body_base64"].is_string(), "{}", replayed[2]);

    // `--max 5` alone: one request for up to five, all three there are.
    server.create_topic("few", "partitions=1");
    for body in ["a", "b", "c"] {
        server.produce("few", "", body.as_bytes());
    }
    let got = berth(&server, &["consume", "few", "--max", "5"]).lines();
    let texts: Vec<&str> = got.iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(texts, ["a", "b", "c"]);
}

#[test]
fn group_list_create_describe_and_delete() {
    let server = Server::start(1, &[]);
    server.create_topic("events", "");
    server.produce("events", "", b"x");
    server.produce("events", "", b"y");

    let created = berth(&server, &["group", "create", "events", "audit"]).json();
    assert_eq!(
        created,
        json!({"topic": "events", "group": "audit", "created": true})
    );
    let again = berth(&server, &["group", "create", "events", "audit"]).json();
    assert_eq!(again["created"], false);
    berth(
        &server,
        &["group", "create", "events", "tail", "--start", "latest"],
    )
    .json();
    let run = berth(
        &server,
        &["group", "create", "events", "x", "--start", "now"],
    );
    assert_eq!(
        run.code,
        Some(2),
        "a bad --start is a usage error: {}",
        run.stderr
    );

    let list = berth(&server, &["group", "list", "events"]).json();
    let mut names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["audit", "default", "tail"]);
    assert_eq!(list, server.get("/topics/events/groups").json());

    let audit = berth(&server, &["group", "describe", "events", "audit"]).json();
    assert_eq!(audit["group"], "audit");
    assert_eq!(audit["partitions"][0]["committed"], 0);
    let tail = berth(&server, &["group", "describe", "events", "tail"]).json();
    assert_eq!(tail["partitions"][0]["committed"], 2);

    let run = berth(&server, &["group", "delete", "events", "audit"]);
    run.quiet();
    assert!(
        run.stderr.contains("deleted group audit of events"),
        "{}",
        run.stderr
    );
    assert_eq!(
        fails_like(
            &server,
            &["group", "describe", "events", "audit"],
            "GET",
            "/topics/events/groups/audit",
        ),
        "group_not_found"
    );
    assert_eq!(
        fails_like(
            &server,
            &["group", "delete", "events", "audit"],
            "DELETE",
            "/topics/events/groups/audit",
        ),
        "group_not_found"
    );
    let left = berth(&server, &["group", "list", "events"]).json();
    assert!(
        left.as_array()
            .unwrap()
            .iter()
            .all(|g| g["group"] != "audit"),
        "{left}"
    );

    for (args, method, path) in [
        (
            &["group", "list", "nosuch"][..],
            "GET",
            "/topics/nosuch/groups",
        ),
        (
            &["group", "create", "nosuch", "g"][..],
            "PUT",
            "/topics/nosuch/groups/g",
        ),
        (
            &["group", "describe", "nosuch", "g"][..],
            "GET",
            "/topics/nosuch/groups/g",
        ),
        (
            &["group", "delete", "nosuch", "g"][..],
            "DELETE",
            "/topics/nosuch/groups/g",
        ),
    ] {
        assert_eq!(fails_like(&server, args, method, path), "topic_not_found");
    }
}

#[test]
fn dead_lettered_messages_are_redriven_back() {
    let server = Server::start(1, &[]);
    berth(&server, &["topic", "create", "pay.dlq"]).json();
    berth(&server, &["topic", "create", "pay"]).json();
    let updated = berth(
        &server,
        &[
            "topic",
            "update",
            "pay",
            "--max-deliveries",
            "1",
            "--dead-letter",
            "pay.dlq",
        ],
    )
    .json();
    assert_eq!(updated["config"]["max_deliveries"], 1);
    // With a delay (0s: at once) and attributes, which go with it to the dead-letter topic and back.
    let attributes =
        r#"{"order":{"type":"Number","value":"17"},"sig":{"type":"Binary","value_base64":"AP8="}}"#;
    berth(
        &server,
        &[
            "produce",
            "pay",
            "poison",
            "--delay",
            "0s",
            "--attributes",
            attributes,
        ],
    )
    .json();
    let attributes: Value = serde_json::from_str(attributes).unwrap();

    // Delivered once, nacked: the second delivery would exceed max_deliveries, so it goes to pay.dlq instead.
    let first = berth(&server, &["consume", "pay"]).json();
    assert_eq!(first["delivery_count"], 1);
    assert_eq!(first["attributes"], attributes);
    berth(&server, &["nack", "pay", handle(&first)]).json();
    let run = berth(&server, &["consume", "pay"]);
    run.quiet();
    let dead = berth(
        &server,
        &[
            "consume",
            "pay.dlq",
            "--partition",
            "0",
            "--offset",
            "0",
            "--wait",
            "5s",
        ],
    )
    .json();
    assert_eq!(dead["body"], "poison");
    assert_eq!(dead["attributes"], attributes);
    assert_eq!(group_state(&server, "pay", "default")["dead_lettered"], 1);

    // Redrive moves it back; it is delivered afresh in pay.
    let moved = berth(&server, &["redrive", "pay.dlq", "--to", "pay"]).json();
    assert_eq!(moved, json!({"moved": 1}));
    let back = berth(&server, &["consume", "pay"]).json();
    assert_eq!(
        (&back["body"], &back["offset"], &back["delivery_count"]),
        (&json!("poison"), &json!(1), &json!(1))
    );
    assert_eq!(back["attributes"], attributes);
    assert_eq!(
        berth(&server, &["redrive", "pay.dlq", "--to", "pay"]).json(),
        json!({"moved": 0})
    );

    // --max and --group: another group reads pay.dlq from its start.
    for body in ["d1", "d2"] {
        server.produce("pay.dlq", "", body.as_bytes());
    }
    assert_eq!(
        berth(
            &server,
            &["redrive", "pay.dlq", "--to", "pay", "--group", "again", "--max", "2"],
        )
        .json(),
        json!({"moved": 2})
    );
    assert_eq!(group_state(&server, "pay.dlq", "again")["committed"], 2);
    assert_eq!(
        berth(
            &server,
            &["redrive", "pay.dlq", "--to", "pay", "--group", "again"],
        )
        .json(),
        json!({"moved": 1})
    );
    assert_eq!(group_state(&server, "pay.dlq", "again")["committed"], 3);
    assert_eq!(server.partitions("pay")[0]["end_offset"], 5);

    assert_eq!(
        fails_like(
            &server,
            &["redrive", "nosuch", "--to", "pay"],
            "POST",
            "/topics/nosuch/redrive?to=pay",
        ),
        "topic_not_found"
    );
    assert_eq!(
        fails_like(
            &server,
            &["redrive", "pay.dlq", "--to", "nosuch", "--max", "1"],
            "POST",
            "/topics/pay.dlq/redrive?to=nosuch&max=1",
        ),
        "topic_not_found"
    );
    assert_eq!(
        fails_like(
            &server,
            &["redrive", "pay.dlq", "--to", "pay.dlq"],
            "POST",
            "/topics/pay.dlq/redrive?to=pay.dlq",
        ),
        "invalid_parameter"
    );
}

/// `berth ... | head` closes the pipe before the answer is printed: the command still did its work, and it must
/// neither panic nor report a failure (it used to panic in `println!`).
#[test]
fn a_reader_that_closes_stdout_early_is_no_failure() {
    let server = Server::start(1, &[]);
    server.create_topic("events", "");
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_AUTH_TOKEN")
        .args([
            "--server",
            &server.url(),
            "group",
            "create",
            "events",
            "audit",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("run berth");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    // The group was created all the same.
    let listed = berth(&server, &["group", "create", "events", "audit"]).json();
    assert_eq!(listed["created"], false);
}

/// No server at the address: exit 1 and one line naming the request and why it failed, the address once (ureq's
/// own message repeated the URL).
#[test]
fn an_unreachable_server_is_one_clear_line() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_AUTH_TOKEN")
        .args([
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "topic",
            "list",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run berth");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let line = stderr.trim();
    let want = format!("berth: GET http://127.0.0.1:{port}/topics: Connection Failed: ");
    assert!(line.starts_with(&want), "{line}");
    assert!(line.contains("Connection refused"), "{line}");
    assert_eq!(line.matches("127.0.0.1").count(), 1, "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
}

/// `--server host:port` (as `serve --listen` takes it) means `http://host:port`.
#[test]
fn a_server_address_without_a_scheme_is_http() {
    let server = Server::start(1, &[]);
    let address = server.url().trim_start_matches("http://").to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_AUTH_TOKEN")
        .args(["--server", &address, "topic", "create", "plain"])
        .stdin(Stdio::null())
        .output()
        .expect("run berth");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(server.get("/topics").json(), json!(["plain"]));
}

/// Something that is not berth answers (another service on the port): the error says so and shows what it
/// answered, never an empty `404 error: `.
#[test]
fn a_server_that_is_not_berth_is_named_as_such() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let answers = [
        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        "HTTP/1.1 404 Not Found\r\ncontent-type: text/html\r\ncontent-length: 22\r\nconnection: close\r\n\r\n<h1>no such page</h1>\n",
    ];
    let serve = std::thread::spawn(move || {
        for answer in answers {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut buf);
            std::io::Write::write_all(&mut conn, answer.as_bytes()).expect("answer");
        }
    });
    for shown in ["(empty body)", "(body: <h1>no such page</h1>)"] {
        let out = Command::new(env!("CARGO_BIN_EXE_berth"))
            .env_remove("BERTH_SERVER")
            .env_remove("BERTH_AUTH_TOKEN")
            .args(["--server", &format!("127.0.0.1:{port}"), "topic", "list"])
            .stdin(Stdio::null())
            .output()
            .expect("run berth");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
        assert_eq!(
            stderr.trim(),
            format!("berth: 404 from a server that is not berth, or not this API {shown}: is --server right?")
        );
    }
    serve.join().expect("the fake server");
}

/// `consume --follow` keeps leasing, printing and acking (here until --count), waiting for what is produced
/// meanwhile; `--no-ack` leaves the leases; a replay reads --count records from --offset and says where the
/// partition ends; `--format table` prints aligned columns, and `group describe` shows each partition's end and lag.
#[test]
fn follow_replay_ranges_and_tables() {
    let server = Server::start(1, &[]);
    berth(&server, &["topic", "create", "feed"]).json();
    server.produce("feed", "", b"first");
    // Produced while the follower waits: it takes it too, then stops at --count.
    let later = {
        let url = server.url();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            let a = berth::client::Client::new(&url)
                .call("POST", "/produce?topic=feed", b"second")
                .expect("produce");
            assert_eq!(a.status, 200);
        })
    };
    let followed = berth(&server, &["consume", "feed", "--follow", "--count", "2"]).lines();
    later.join().unwrap();
    let bodies: Vec<&str> = followed
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["first", "second"]);
    let state = group_state(&server, "feed", "default");
    assert_eq!(
        (&state["committed"], &state["in_flight"]),
        (&json!(2), &json!(0)),
        "both acked"
    );

    server.produce("feed", "", b"third");
    let kept = berth(
        &server,
        &["consume", "feed", "--follow", "--no-ack", "--count", "1"],
    )
    .lines();
    assert_eq!(kept[0]["body"], "third");
    assert_eq!(
        group_state(&server, "feed", "default")["in_flight"],
        1,
        "--no-ack left the lease"
    );

    let replay = berth(
        &server,
        &[
            "consume",
            "feed",
            "--partition",
            "0",
            "--offset",
            "1",
            "--count",
            "5",
        ],
    );
    let records: Vec<String> = replay
        .lines()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(records, ["second", "third"]);
    assert!(
        replay.stderr.contains("no record at partition 0 offset 3"),
        "{}",
        replay.stderr
    );

    let described = berth(&server, &["group", "describe", "feed", "default"]).json();
    assert_eq!(described["lag"], 1, "{described}");
    assert_eq!(described["partitions"][0]["end_offset"], 3);
    let table = berth(
        &server,
        &["--format", "table", "group", "describe", "feed", "default"],
    );
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines[..2], ["group: default", "lag: 1"]);
    let head: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(head[..4], ["PARTITION", "END_OFFSET", "COMMITTED", "LAG"]);
    let row: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(row[..4], ["0", "3", "2", "1"]);
    let topics = berth(&server, &["--format", "table", "topic", "list"]);
    assert_eq!(topics.stdout, "feed\n");
}

/// Every argument and option of every command says what it is, the connection options stand apart under their own
/// heading, and no environment variable is shown with an empty value.
#[test]
fn every_argument_of_every_command_is_described() {
    let commands: &[&[&str]] = &[
        &[],
        &["topic", "create"],
        &["topic", "update"],
        &["topic", "describe"],
        &["topic", "delete"],
        &["group", "create"],
        &["group", "describe"],
        &["group", "delete"],
        &["group", "list"],
        &["redrive"],
        &["produce"],
        &["consume"],
        &["ack"],
        &["nack"],
        &["extend"],
        &["cluster", "status"],
    ];
    for command in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_berth"))
            .env_remove("BERTH_SERVER")
            .args(command.iter())
            .arg("--help")
            .output()
            .expect("run berth");
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{command:?}: {help}");
        assert!(
            !help.contains("=]"),
            "{command:?} shows an empty environment value:\n{help}"
        );
        if !command.is_empty() {
            assert!(help.contains("\nConnection:\n"), "{command:?}:\n{help}");
        }
        let lines: Vec<&str> = help.lines().collect();
        let item = |line: &str| {
            let t = line.trim_start();
            let placeholder = |open: char, close: char| {
                t.strip_prefix(open)
                    .and_then(|r| r.split(close).next())
                    .is_some_and(|name| {
                        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    })
            };
            line.starts_with("  ")
                && (t.starts_with('-') || placeholder('<', '>') || placeholder('[', ']'))
        };
        for (i, line) in lines.iter().enumerate() {
            if !item(line) {
                continue;
            }
            // `--name <VALUE>  what it is`, or the description on the next line (clap's layout for long help).
            let t = line.trim();
            let inline = t.split("  ").filter(|part| !part.trim().is_empty()).count() >= 2;
            let below = lines
                .get(i + 1)
                .is_some_and(|next| !next.trim().is_empty() && !item(next));
            assert!(
                inline || below,
                "{command:?}: `{t}` has no description:\n{help}"
            );
        }
    }
}
