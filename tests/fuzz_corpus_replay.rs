//! Replays the libFuzzer corpora in `fuzz/corpus/<target>/` through the checks of the fuzz targets (they live in
//! `tests/fuzz_checks/` and the targets in `fuzz/fuzz_targets/` include them; the fuzz crate is a separate
//! workspace that needs nightly), so stable CI keeps every seed and every input the fuzzer once found passing.
//! Fails if a corpus directory is missing or empty, so it can never pass vacuously. Inputs named `fixed-*`
//! reproduce bugs the fuzzer found (now fixed) and guard against their return.

use std::path::{Path, PathBuf};

/// The corpus files of one target, sorted; panics if the directory is missing or empty.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus directory {} is missing: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "corpus directory {} is empty",
        dir.display()
    );
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// Runs `check` on every input of `target`'s corpus, reporting every failing file (not just the first).
fn replay(target: &str, check: fn(&[u8])) {
    let inputs = corpus(target);
    let mut failures = Vec::new();
    for (path, bytes) in &inputs {
        if let Err(panic) = std::panic::catch_unwind(|| check(bytes)) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {why}", path.display()));
        }
    }
    println!("{target}: {} inputs replayed", inputs.len());
    assert!(
        failures.is_empty(),
        "{} of {} {target} corpus inputs fail:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}

#[test]
fn http_request_corpus() {
    replay("http_request", http_request::check);
}

#[test]
fn receipt_handle_corpus() {
    replay("receipt_handle", receipt_handle::check);
}

#[test]
fn frame_scan_corpus() {
    replay("frame_scan", frame_scan::check);
}

#[test]
fn duration_corpus() {
    replay("duration", duration::check);
}

#[path = "fuzz_checks/http_request.rs"]
mod http_request;

#[path = "fuzz_checks/receipt_handle.rs"]
mod receipt_handle;

#[path = "fuzz_checks/frame_scan.rs"]
mod frame_scan;

#[path = "fuzz_checks/duration.rs"]
mod duration;
