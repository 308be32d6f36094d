//! The README's examples, run as they stand: every ```sh block of `README.md` and of `docs/tour.md`, in order, by
//! bash, against a fresh server (on a free port instead of 7070), with the release `berth` binary on `PATH`.
//! ```bash blocks (setup, starting servers, files to make) are for reading and are not run.
//!
//! A block passes when bash runs it to the end under `set -eo pipefail` (so a `berth` command that fails, or a
//! `grep` that finds nothing, fails it), and the HTTP statuses it printed (status lines of `curl -i`/`-D -` and
//! `-w '%{http_code}'` codes) are, in order, the ones its comments show. Nonces, partitions and timings differ from
//! run to run, so bodies are not compared; every JSON object line printed must parse.

mod common;

use common::readme::{expected, fenced_blocks, statuses};
use common::Server;
use std::process::Command;

fn run_blocks(server: &Server, file: &str) {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let blocks = fenced_blocks(&text, "sh");
    assert!(!blocks.is_empty(), "{file} has no sh block");
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_berth"))
        .parent()
        .expect("the binary's directory")
        .to_path_buf();
    // The AWS CLI of the README's SQS example: `scripts/sqs-clients.sh` (run by `.ci/run`) installs it.
    let aws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/sqs-clients/json/bin");
    assert!(
        aws.join("aws").exists(),
        "{} is missing: run scripts/sqs-clients.sh (the README's SQS example uses its AWS CLI)",
        aws.join("aws").display()
    );
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default(),
        aws.display()
    );
    for (i, block) in blocks.iter().enumerate() {
        let script = block
            .replace("localhost:7070", &format!("localhost:{}", server.port))
            .replace("127.0.0.1:7070", &format!("127.0.0.1:{}", server.port));
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -eo pipefail\n{script}"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("PATH", &path)
            .env("BERTH_SERVER", server.url())
            .env_remove("BERTH_AUTH_TOKEN")
            .output()
            .expect("run bash");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{file}, block {}: exited {}\n--- block\n{block}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            i + 1,
            out.status
        );
        assert_eq!(
            statuses(&stdout),
            statuses(&expected(block)),
            "{file}, block {}: the statuses it printed are not the ones its comments show\n--- block\n{block}\n--- stdout\n{stdout}",
            i + 1
        );
        for line in stdout.lines() {
            let line = line.trim();
            if line.starts_with('{') && line.ends_with('}') {
                // Replies without a newline run together: each must parse.
                for value in
                    serde_json::Deserializer::from_str(line).into_iter::<serde_json::Value>()
                {
                    value.unwrap_or_else(|e| {
                        panic!("{file}, block {}: not JSON ({e}): {line}", i + 1)
                    });
                }
            }
        }
    }
}

#[test]
fn the_status_extractor_reads_what_curl_prints() {
    let printed = "{\"offset\":0}HTTP/1.1 200 OK\ncontent-length: 5\n\nhello\n 200\n{\"error\":\"lease_gone\",\"message\":\"x\"} 410\n204\n{\"offset\":0,\"partition\":0}\nberth_delivered_total{core=\"0\"} 1\n";
    assert_eq!(statuses(printed), [200, 200, 410, 204]);
    let commented = "# HTTP/1.1 200 OK\n#  200                                 deliverable again at once\n# {\"error\":\"lease_gone\"} 410      (the lease is audit's)\n# 204\n# {\"moved\":1}                          appended";
    assert_eq!(statuses(&expected(commented)), [200, 200, 410, 204]);
}

/// The README's first session with curl and its command-line block, then the tour, on one fresh server.
#[test]
fn the_readme_and_the_tour_run_as_written() {
    let server = Server::start(2, &[]);
    run_blocks(&server, "README.md");
    run_blocks(&server, "docs/tour.md");
}
