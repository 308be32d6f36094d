mod common;

// The SQS face driven by real SQS clients (design/api.md "SQS-compatible face", docs/sqs.md): a current boto3 over
// the JSON 1.0 protocol, and boto3/botocore 1.34.89 over the query protocol (form requests, XML replies), each
// through `tests/sqs/clients.py` against the real binary. The clients come from `scripts/sqs-clients.sh` (run by
// `.ci/run`).

use common::Server;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python of one of `scripts/sqs-clients.sh`'s virtualenvs.
fn python(env: &str) -> PathBuf {
    let python = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/sqs-clients")
        .join(env)
        .join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/sqs-clients.sh (it makes the SQS clients these tests drive)",
        python.display()
    );
    python
}

/// Runs `tests/sqs/{script}` with the Python of `env` against `s`, asserting it printed `ok: {mode}`.
fn run_script(s: &Server, env: &str, script: &str, mode: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sqs")
        .join(script);
    let out = Command::new(python(env))
        .arg(&path)
        .arg(s.url())
        .arg(mode)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("ok: {mode}")),
        "{script} with {env} ({mode}) failed: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- server log\n{}",
        out.status,
        s.log_text()
    );
}

fn run_clients(env: &str, protocol: &str) {
    let _serial = common::serial();
    let s = Server::start(2, &[]);
    run_script(&s, env, "clients.py", protocol);
}

/// With `sqs_credentials` set, every request must be signed: both clients run their whole script signed (so the
/// signature is verified over every action, both protocols), and `auth.py` sees each refusal AWS makes (unsigned,
/// unknown key, wrong secret, a request time 6 minutes off either way, a body changed after signing, a malformed
/// signature), none of which changes anything.
#[test]
fn with_credentials_every_request_is_signed_and_checked() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("berth.toml");
    std::fs::write(&config, "[sqs_credentials]\nAKIDEXAMPLE = \"secret\"\n").unwrap();
    let s = Server::start(2, &["--config", config.to_str().unwrap()]);
    run_script(&s, "json", "clients.py", "json");
    run_script(&s, "query", "clients.py", "query");
    run_script(&s, "json", "auth.py", "auth");
}

/// A current boto3, JSON 1.0 protocol: queues, attributes, sends and batches with their MD5s (checked by boto3),
/// receives with long polling and visibility, deletes, dead letters by maxReceiveCount, FIFO queues, typed errors.
#[test]
fn boto3_speaks_the_json_protocol() {
    run_clients("json", "json");
}

/// boto3/botocore 1.34.89, the query protocol: the same script.
#[test]
fn an_older_botocore_speaks_the_query_protocol() {
    run_clients("query", "query");
}
