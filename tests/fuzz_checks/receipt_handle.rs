//! The checks of the `receipt_handle` fuzz target, shared by `fuzz/fuzz_targets/receipt_handle.rs` (libFuzzer, nightly) and
//! `tests/fuzz_corpus_replay.rs` (the corpus replayed on stable in CI).

use berth::ops::receipt::ReceiptHandle;

fn parse_receipt_handle(text: &str) -> Option<(u64, u64, u64)> {
    ReceiptHandle::parse(text).map(|h| (h.partition, h.offset, h.nonce))
}

pub fn check(data: &[u8]) {
    check_text(&String::from_utf8_lossy(data));
    // Any three u64s round-trip.
    if let Some(b) = data.get(..24) {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let (p, o, n) = (word(0), word(1), word(2));
        assert_eq!(
            parse_receipt_handle(&format!("{p}:{o}:{n}")),
            Some((p, o, n))
        );
    }
}

fn check_text(text: &str) {
    let Some((p, o, n)) = parse_receipt_handle(text) else {
        return;
    };
    let again = ReceiptHandle {
        partition: p,
        offset: o,
        nonce: n,
    }
    .to_string();
    assert_eq!(again, format!("{p}:{o}:{n}"));
    assert_eq!(
        parse_receipt_handle(&again),
        Some((p, o, n)),
        "{text:?} -> {again:?}"
    );
    let parts: Vec<&str> = text.split(':').collect();
    assert_eq!(parts.len(), 3, "{text:?} accepted");
    for (part, value) in parts.iter().zip([p, o, n]) {
        assert!(
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()),
            "{text:?} accepted"
        );
        assert_eq!(
            part.parse::<u128>().ok(),
            Some(u128::from(value)),
            "{text:?} read as {value}"
        );
    }
}
