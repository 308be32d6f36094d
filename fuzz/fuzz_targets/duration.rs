//! `berth::duration::parse_duration_ms` on arbitrary text: no panic; accepted values are at most 100 years,
//! format back (`format_ms`) to text that parses to the same value, and agree with `parse_duration_in`.
//! `tests/fuzz_corpus_replay.rs` holds a copy of `check` for stable CI.
#![no_main]

use berth::duration::{format_ms, parse_duration_in, parse_duration_ms};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check(data));

/// 100 years in milliseconds: the parser's documented ceiling.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match parse_duration_ms(&text) {
        Ok(ms) => {
            assert!(ms <= MAX_MS, "{text:?} -> {ms} ms, over 100 years");
            let formatted = format_ms(ms);
            assert_eq!(
                parse_duration_ms(&formatted),
                Ok(ms),
                "{text:?} -> {ms} -> {formatted:?}"
            );
            assert_eq!(parse_duration_ms(&format!("{ms}ms")), Ok(ms));
            assert_eq!(parse_duration_in(&text, ms, ms), Ok(ms));
            assert_eq!(parse_duration_in(&text, 0, MAX_MS), Ok(ms));
        }
        Err(_) => assert!(parse_duration_in(&text, 0, u64::MAX).is_err()),
    }
}
