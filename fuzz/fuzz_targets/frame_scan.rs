//! Fuzz target `frame_scan`: the checks live in `tests/fuzz_checks/frame_scan.rs`, shared with the stable corpus replay.
#![no_main]

#[path = "../../tests/fuzz_checks/frame_scan.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
