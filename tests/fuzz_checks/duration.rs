//! The checks of the `duration` fuzz target, shared by `fuzz/fuzz_targets/duration.rs` (libFuzzer, nightly) and
//! `tests/fuzz_corpus_replay.rs` (the corpus replayed on stable in CI).

use berth::duration::{format_ms, parse_duration_in, parse_duration_ms};

/// 100 years in milliseconds: the parser's documented ceiling.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

pub fn check(data: &[u8]) {
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
