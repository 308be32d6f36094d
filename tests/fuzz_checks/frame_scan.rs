//! The checks of the `frame_scan` fuzz target, shared by `fuzz/fuzz_targets/frame_scan.rs` (libFuzzer, nightly) and
//! `tests/fuzz_corpus_replay.rs` (the corpus replayed on stable in CI).

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
