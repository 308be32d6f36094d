//! Fuzz target `duration`: the checks live in `tests/fuzz_checks/duration.rs`, shared with the stable corpus replay.
#![no_main]

#[path = "../../tests/fuzz_checks/duration.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
