//! Fuzz target `http_request`: the checks live in `tests/fuzz_checks/http_request.rs`, shared with the stable corpus replay.
#![no_main]

#[path = "../../tests/fuzz_checks/http_request.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
