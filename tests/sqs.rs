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

fn run_clients(env: &str, protocol: &str) {
    let _serial = common::serial();
    let s = Server::start(2, &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/clients.py");
    let out = Command::new(python(env))
        .arg(&script)
        .arg(s.url())
        .arg(protocol)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("ok: {protocol}")),
        "{env} ({protocol}) failed: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- server log\n{}",
        out.status,
        s.log_text()
    );
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
