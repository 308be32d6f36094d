//! Fuzz target `receipt_handle`: the checks live in `tests/fuzz_checks/receipt_handle.rs`, shared with the stable corpus replay.
#![no_main]

#[path = "../../tests/fuzz_checks/receipt_handle.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
