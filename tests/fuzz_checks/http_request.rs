//! The checks of the `http_request` fuzz target, shared by `fuzz/fuzz_targets/http_request.rs` (libFuzzer, nightly) and
//! `tests/fuzz_corpus_replay.rs` (the corpus replayed on stable in CI).

use berth::http::request::{parse, query_pairs, Limits, Parsed, Request};

/// The server's default limits, and tiny ones so the limit paths are reached by short inputs.
const LIMITS: [Limits; 2] = [
    Limits {
        max_header_bytes: 16 << 10,
        max_headers: 64,
        max_body_bytes: 1 << 20,
        max_batch_bytes: 16 << 20,
    },
    Limits {
        max_header_bytes: 64,
        max_headers: 2,
        max_body_bytes: 8,
        max_batch_bytes: 16,
    },
];

pub fn check(data: &[u8]) {
    for limits in &LIMITS {
        let mut rest = data;
        while let Some(used) = check_one(rest, limits) {
            rest = &rest[used..];
        }
    }
}

/// Checks the parse of the front of `buf`; returns the bytes used by a complete request.
fn check_one(buf: &[u8], limits: &Limits) -> Option<usize> {
    match parse(buf, limits) {
        Ok(Parsed::Complete(req, used)) => {
            assert!(
                used > 0 && used <= buf.len(),
                "used {used} of {}",
                buf.len()
            );
            assert!(req.body.len() <= used, "body longer than the request");
            let body_start = used - req.body.len();
            assert!(
                req.body.len() <= limits.max_body_bytes.max(limits.max_batch_bytes),
                "body over the limit"
            );
            assert!(body_start <= limits.max_header_bytes, "head over the limit");
            assert_eq!(&req.body[..], &buf[body_start..used], "body bytes");
            assert!(
                !req.path.contains('?'),
                "path {:?} holds the query",
                req.path
            );
            for (k, v) in query_pairs(&req.query) {
                let _ = berth::ops::receipt::ReceiptHandle::parse(&v);
                let _ = berth::duration::parse_duration_ms(&v);
                let _ = berth::engine::topic::validate_name(&k);
            }
            match parse(&buf[..used], limits) {
                Ok(Parsed::Complete(again, n)) => {
                    assert_eq!(n, used, "its own bytes parse to another length");
                    assert_same(&req, &again);
                }
                other => panic!("its own {used} bytes do not parse alone: {other:?}"),
            }
            for cut in cuts(used) {
                match parse(&buf[..cut], limits) {
                    Ok(Parsed::Partial { .. }) => {}
                    other => panic!("prefix {cut} of a {used}-byte request: {other:?}"),
                }
            }
            Some(used)
        }
        Ok(Parsed::Partial {
            head_done,
            expect_continue,
        }) => {
            if !head_done {
                assert!(
                    buf.len() <= limits.max_header_bytes,
                    "an incomplete head of {} bytes is still waited for",
                    buf.len()
                );
                assert!(!expect_continue, "100-continue before the head is complete");
            }
            None
        }
        Err(_) => None,
    }
}

/// Prefix lengths to try: all of them for short requests, the ends and a spread for long ones.
fn cuts(used: usize) -> Vec<usize> {
    if used <= 256 {
        return (0..used).collect();
    }
    let mut v: Vec<usize> = (0..64).chain(used - 64..used).collect();
    v.extend((1..32).map(|i| used * i / 32));
    v.retain(|&c| c < used);
    v
}

fn assert_same(a: &Request, b: &Request) {
    assert_eq!(
        (
            &a.method,
            &a.path,
            a.query.raw(),
            &a.body,
            a.close,
            &a.authorization
        ),
        (
            &b.method,
            &b.path,
            b.query.raw(),
            &b.body,
            b.close,
            &b.authorization
        ),
        "the same bytes parse to another request"
    );
}
