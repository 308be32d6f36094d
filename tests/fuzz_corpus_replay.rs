//! Replays the libFuzzer corpora in `fuzz/corpus/<target>/` through the same checks as the fuzz targets in
//! `fuzz/fuzz_targets/` (copied below: the fuzz crate is a separate workspace that needs nightly), so stable CI
//! keeps every seed and every input the fuzzer once found passing. Fails if a corpus directory is missing or
//! empty, so it can never pass vacuously.
//!
//! Inputs named `bug-*` reproduce open server bugs and fail until those are fixed:
//! `fuzz/corpus/frame_scan/bug-rescan-after-truncation-*` (rescanning a segment that recovery truncated to
//! `valid_len` gives another result than the scan that chose `valid_len`).

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

/// Copy of `fuzz/fuzz_targets/http_request.rs`.
mod http_request {
    use berth::http::request::{parse, query_pairs, Limits, Parsed, Request};

    /// The server's default limits, and tiny ones so the limit paths are reached by short inputs.
    const LIMITS: [Limits; 2] = [
        Limits {
            max_header_bytes: 16 << 10,
            max_headers: 64,
            max_body_bytes: 1 << 20,
        },
        Limits {
            max_header_bytes: 64,
            max_headers: 2,
            max_body_bytes: 8,
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
                    req.body.len() <= limits.max_body_bytes,
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
                    let _ = berth::http::routes::parse_receipt_handle(&v);
                    let _ = berth::duration::parse_duration_ms(&v);
                    let _ = berth::broker::topic::validate_name(&k);
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
                &a.query,
                &a.body,
                a.close,
                &a.authorization
            ),
            (
                &b.method,
                &b.path,
                &b.query,
                &b.body,
                b.close,
                &b.authorization
            ),
            "the same bytes parse to another request"
        );
    }
}

/// Copy of `fuzz/fuzz_targets/receipt_handle.rs`.
mod receipt_handle {
    use berth::http::routes::parse_receipt_handle;

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
        let again = format!("{p}:{o}:{n}");
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
}

/// Copy of `fuzz/fuzz_targets/frame_scan.rs`.
mod frame_scan {
    use berth::storage::frame::{decode_frame, encode, scan, FrameError, HEADER_LEN, NO_POSITION};

    /// The server's default largest payload, and a tiny one so `TooLarge` is reached.
    const MAX_PAYLOADS: [u32; 2] = [1 << 20, 40];

    pub fn check(data: &[u8]) {
        let Some(head) = data.get(..8) else {
            return;
        };
        let base = u64::from_le_bytes(head.try_into().unwrap());
        let buf = &data[8..];
        for max in MAX_PAYLOADS {
            check_scan(buf, base, max);
        }
        // A real frame appended to the bytes still scans consistently, and a frame holding them decodes.
        let mut framed = buf.to_vec();
        encode(base, 7, &buf[..buf.len().min(64)], &mut framed);
        check_scan(&framed, base, 1 << 20);
        let mut alone = Vec::new();
        encode(base, 7, buf, &mut alone);
        let (h, payload) = decode_frame(&alone, base, u32::MAX).expect("a fresh frame decodes");
        assert_eq!((h.offset, payload), (base, buf));
    }

    fn check_scan(buf: &[u8], base: u64, max: u32) {
        let s = scan(buf, base, max);
        let len = buf.len() as u64;
        assert!(s.valid_len <= len, "valid_len {} > {len}", s.valid_len);
        assert_eq!(
            s.next_offset.wrapping_sub(base),
            s.positions.len() as u64,
            "next_offset vs positions"
        );
        assert!(s.positions.len() <= buf.len() / HEADER_LEN + 1);
        assert!(
            s.corrupt.windows(2).all(|w| w[0] < w[1]),
            "corrupt not strictly ascending: {:?}",
            s.corrupt
        );
        if let (Some(&first), Some(&last)) = (s.corrupt.first(), s.corrupt.last()) {
            assert!(
                first >= base && last < s.next_offset,
                "corrupt {:?} outside {base}..{}",
                s.corrupt,
                s.next_offset
            );
        }
        let mut frame_end = 0u64;
        let mut last_good_ts = None;
        for (i, &p) in s.positions.iter().enumerate() {
            let offset = base + i as u64;
            let listed = s.corrupt.binary_search(&offset).is_ok();
            if p == NO_POSITION {
                assert!(listed, "lost offset {offset} not listed corrupt");
                continue;
            }
            let at = u64::from(p);
            assert!(
                at >= frame_end,
                "frame of {offset} at {at} overlaps the previous one (ends {frame_end})"
            );
            match decode_frame(&buf[p as usize..], offset, max) {
                Ok((h, _)) => {
                    assert!(!listed, "valid offset {offset} listed corrupt");
                    frame_end = at + h.frame_len() as u64;
                    last_good_ts = Some(h.timestamp_ms);
                }
                Err(FrameError::BadPayloadCrc) => {
                    assert!(listed, "payload-corrupt offset {offset} not listed");
                    let len_field =
                        u32::from_le_bytes(buf[p as usize + 4..p as usize + 8].try_into().unwrap());
                    frame_end = at + HEADER_LEN as u64 + u64::from(len_field);
                }
                Err(e) => panic!("offset {offset} at {p}: {e:?}"),
            }
            assert!(
                frame_end <= s.valid_len,
                "frame of {offset} ends past valid_len"
            );
        }
        assert_eq!(s.last_timestamp_ms, last_good_ts, "last_timestamp_ms");
        // Not when the walk stopped at a frame holding offset u64::MAX (documented as outside the caller's
        // limits): the offsets lost before that frame are recorded, the frame itself is cut off.
        if s.valid_len < len && s.next_offset != u64::MAX {
            let again = scan(&buf[..s.valid_len as usize], base, max);
            assert_eq!(
                again, s,
                "rescanning the segment truncated to valid_len {} changes the result",
                s.valid_len
            );
        }
    }
}

/// Copy of `fuzz/fuzz_targets/duration.rs`.
mod duration {
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
}
