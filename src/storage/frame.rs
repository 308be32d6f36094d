//! On-disk frame codec and segment recovery scanner.
//!
//! A segment file is a sequence of frames, one per record, with consecutive
//! offsets starting at the segment's base offset. Each frame is a 32-byte
//! little-endian header followed by the payload:
//!
//! ```text
//! 0   u32 magic          MAGIC
//! 4   u32 payload_len    bits 0..30; bit 31 (META_FLAG) set: the payload
//!                        starts with a record meta block (`storage::meta`)
//! 8   u64 offset         the record's offset in its partition
//! 16  u64 timestamp_ms   append time, Unix ms
//! 24  u32 payload_crc32c crc32c of the payload bytes
//! 28  u32 header_crc32c  crc32c of bytes 0..28
//! 32  payload
//! ```
//!
//! Nothing in this module panics on any input bytes: every length read from
//! the buffer is bounds-checked before use. `docs/format.md` describes the
//! format and the recovery rules of [`scan`] for people.

/// Length of the frame header in bytes.
pub const HEADER_LEN: usize = 32;

/// First four bytes of every frame (on disk, little-endian: `46 52 54 42`,
/// i.e. ASCII `FRTB`).
pub const MAGIC: u32 = 0x4254_5246;

/// Bit 31 of the `payload_len` field: the payload starts with a record meta block (attributes, a delay, a
/// deduplication id, a message group: `storage::meta`). Frames written before version 3 never set it (their
/// payloads are bounded far below 2^31), so old segments read unchanged.
pub const META_FLAG: u32 = 1 << 31;

/// Index entry meaning "no readable frame is known for this offset".
pub const NO_POSITION: u32 = u32::MAX;

const MAGIC_BYTES: [u8; 4] = MAGIC.to_le_bytes();
/// Bytes covered by the header CRC.
const HEADER_CRC_SPAN: usize = 28;

/// A decoded, header-CRC-verified frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The payload's length (without the meta flag).
    pub payload_len: u32,
    /// Whether the payload starts with a record meta block (`META_FLAG`).
    pub meta: bool,
    pub offset: u64,
    pub timestamp_ms: u64,
    pub payload_crc: u32,
}

impl Header {
    /// Length of the whole frame: `HEADER_LEN + payload_len`.
    pub fn frame_len(&self) -> usize {
        encoded_len(u32_to_usize(self.payload_len))
    }
}

/// Appends one encoded frame to `out`.
///
/// # Panics
///
/// If `payload` is longer than `u32::MAX` bytes (the caller bounds message
/// sizes far below that).
pub fn encode(offset: u64, timestamp_ms: u64, payload: &[u8], out: &mut Vec<u8>) {
    encode_record(offset, timestamp_ms, payload, false, out);
}

/// Appends one encoded frame to `out`, its payload starting with a record meta block when `meta`.
///
/// # Panics
///
/// If `payload` is 2^31 bytes or longer (the caller bounds message sizes far below that).
pub fn encode_record(
    offset: u64,
    timestamp_ms: u64,
    payload: &[u8],
    meta: bool,
    out: &mut Vec<u8>,
) {
    let payload_len = u32::try_from(payload.len())
        .ok()
        .filter(|len| len & META_FLAG == 0)
        .expect("frame payload of 2^31 bytes or more");
    let payload_len = if meta {
        payload_len | META_FLAG
    } else {
        payload_len
    };
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&MAGIC_BYTES);
    header[4..8].copy_from_slice(&payload_len.to_le_bytes());
    header[8..16].copy_from_slice(&offset.to_le_bytes());
    header[16..24].copy_from_slice(&timestamp_ms.to_le_bytes());
    header[24..28].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let header_crc = crc32c::crc32c(&header[..HEADER_CRC_SPAN]);
    header[28..32].copy_from_slice(&header_crc.to_le_bytes());
    out.reserve(encoded_len(payload.len()));
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
}

/// Length of the encoded frame for a payload of `payload_len` bytes.
pub fn encoded_len(payload_len: usize) -> usize {
    HEADER_LEN.saturating_add(payload_len)
}

/// Why a header did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer than `HEADER_LEN` bytes.
    Incomplete,
    /// The first four bytes are not `MAGIC`.
    BadMagic,
    /// The header CRC does not match bytes 0..28.
    BadHeaderCrc,
    /// `payload_len` is above the caller's `max_payload`.
    TooLarge,
}

/// Parses and checks the header at `buf[0..32]`; `max_payload` bounds
/// `payload_len` (`TooLarge` above it). Checks in order: length, magic,
/// header CRC, payload length.
pub fn decode_header(buf: &[u8], max_payload: u32) -> Result<Header, HeaderError> {
    let h: &[u8; HEADER_LEN] = buf
        .get(..HEADER_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(HeaderError::Incomplete)?;
    if read_u32(h, 0) != MAGIC {
        return Err(HeaderError::BadMagic);
    }
    if crc32c::crc32c(&h[..HEADER_CRC_SPAN]) != read_u32(h, 28) {
        return Err(HeaderError::BadHeaderCrc);
    }
    let field = read_u32(h, 4);
    let payload_len = field & !META_FLAG;
    if payload_len > max_payload {
        return Err(HeaderError::TooLarge);
    }
    Ok(Header {
        payload_len,
        meta: field & META_FLAG != 0,
        offset: read_u64(h, 8),
        timestamp_ms: read_u64(h, 16),
        payload_crc: read_u32(h, 24),
    })
}

/// Why a frame did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The header did not verify.
    Header(HeaderError),
    /// The header verifies but the buffer ends before the payload does.
    Incomplete,
    /// The payload does not match its CRC.
    BadPayloadCrc,
    /// The frame verifies but holds another offset than the expected one.
    WrongOffset { expected: u64, found: u64 },
}

/// Decodes and fully verifies a single frame at the start of `buf` expected
/// to hold `expected_offset`; returns the header and the payload slice.
/// Bytes after the frame are ignored.
///
/// Checks in order: header (as [`decode_header`]), payload present
/// (`Incomplete`), payload CRC, offset.
pub fn decode_frame(
    buf: &[u8],
    expected_offset: u64,
    max_payload: u32,
) -> Result<(Header, &[u8]), FrameError> {
    let header = decode_header(buf, max_payload).map_err(FrameError::Header)?;
    let payload = buf
        .get(HEADER_LEN..header.frame_len())
        .ok_or(FrameError::Incomplete)?;
    if crc32c::crc32c(payload) != header.payload_crc {
        return Err(FrameError::BadPayloadCrc);
    }
    if header.offset != expected_offset {
        return Err(FrameError::WrongOffset {
            expected: expected_offset,
            found: header.offset,
        });
    }
    Ok((header, payload))
}

/// Result of [`scan`]ning a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// `positions[i]` = byte position of the frame holding offset
    /// `base_offset + i`, or `NO_POSITION` if that offset's frame was lost
    /// (inside a resynchronised gap). Covers `base_offset .. next_offset`.
    pub positions: Vec<u32>,
    /// Offsets (ascending) whose frame is present but fails its payload
    /// check, or whose frame is missing inside a gap between two valid
    /// frames: never to be delivered.
    pub corrupt: Vec<u64>,
    /// Bytes of the buffer that hold the log: everything from here on is a
    /// torn or garbage tail to truncate.
    pub valid_len: u64,
    /// One past the last offset in the segment (`== base_offset` when empty).
    pub next_offset: u64,
    /// Timestamp of the last valid frame, if any (retention uses it).
    pub last_timestamp_ms: Option<u64>,
}

/// Scans a whole segment file's bytes (the segment starts at offset
/// `base_offset`) and tells which frames it holds and where the log ends.
///
/// Rules (`expected` starts at `base_offset`; the walk starts at position 0):
/// - A frame whose header and payload verify and whose offset is `expected`
///   is recorded; the walk goes on after it.
/// - A frame whose header verifies (magic, header CRC, length at most
///   `max_payload`, fits in the buffer, offset `== expected`) but whose
///   payload CRC fails is mid-log corruption if a *resync point* (below)
///   exists after it for offset `expected + 1`: it is recorded and listed in
///   `corrupt`, and the walk goes on after it. Otherwise it is a torn tail:
///   the walk stops at its position.
/// - Anything else at the walk position (bad magic, bad header CRC,
///   `TooLarge`, a frame running past the end of the buffer, fewer than 32
///   bytes left, a verified frame with another offset than `expected`) is a
///   bad header: the walk searches forward byte by byte, from the next byte,
///   for the first resync point. If found, the offsets from `expected` up to
///   (not including) the found frame's offset are lost (`NO_POSITION`, listed
///   in `corrupt`) and the walk goes on at the found frame. If not, the walk
///   stops at the bad header's position (torn tail).
/// - A *resync point* for offset `e`, searched for from gap start `g`, is a
///   position `q` holding a fully valid frame (header and payload CRC, fits
///   in the buffer) whose offset `o` satisfies `e <= o` and
///   `o - e <= (q - g) / HEADER_LEN`: lower offsets (old duplicates) are not
///   resync points, nor are frames whose offset is too far ahead to be
///   explained by the skipped bytes (each lost frame takes at least
///   `HEADER_LEN` bytes). This bounds `positions` to `buf.len() / 32 + 1`
///   entries whatever the bytes are.
/// - The walk also stops (as at a torn tail) at a position that does not fit
///   below `NO_POSITION`, or at a frame of offset `u64::MAX` (whose
///   `next_offset` would overflow); neither occurs within the caller's limits.
///
/// `valid_len` is where the walk stopped (the buffer's length if it reached
/// the end cleanly). Time is linear in the buffer when it is clean; damage
/// costs a forward search over the damaged bytes.
pub fn scan(buf: &[u8], base_offset: u64, max_payload: u32) -> Scan {
    let mut positions: Vec<u32> = Vec::new();
    let mut corrupt: Vec<u64> = Vec::new();
    let mut last_timestamp_ms = None;
    let mut expected = base_offset;
    let mut pos = 0usize;
    // The last resync point found by a payload-corruption lookahead, so that a
    // run of consecutive payload-corrupt frames costs one search, not one each.
    let mut lookahead: Option<(usize, Header)> = None;

    let valid_len = loop {
        if pos >= buf.len() {
            break buf.len();
        }
        let Some(pos32) = recordable(pos) else {
            break pos;
        };
        let Some(next_expected) = expected.checked_add(1) else {
            break pos;
        };
        match frame_at(buf, pos, max_payload) {
            Some((h, payload_ok)) if h.offset == expected => {
                let Some(end) = pos.checked_add(h.frame_len()) else {
                    break pos;
                };
                if !payload_ok {
                    let cached =
                        lookahead.is_some_and(|(q, f)| is_resync_point(q, &f, end, next_expected));
                    if !cached {
                        lookahead = find_resync(buf, end, end, next_expected, max_payload);
                        if lookahead.is_none() {
                            break pos;
                        }
                    }
                    corrupt.push(expected);
                } else {
                    last_timestamp_ms = Some(h.timestamp_ms);
                }
                positions.push(pos32);
                expected = next_expected;
                pos = end;
            }
            _ => {
                let Some(from) = pos.checked_add(1) else {
                    break pos;
                };
                let Some((q, h)) = find_resync(buf, from, pos, expected, max_payload) else {
                    break pos;
                };
                for lost in expected..h.offset {
                    positions.push(NO_POSITION);
                    corrupt.push(lost);
                }
                expected = h.offset;
                pos = q;
            }
        }
    };

    // Damaged frames with nothing valid after them where the walk stopped are a torn tail too: keeping them would
    // make the result depend on bytes that truncation to valid_len then removes (a rescan must agree).
    let mut valid_len = valid_len;
    while let Some(&last) = corrupt.last() {
        let Some(slot) = last.checked_sub(base_offset).map(|s| s as usize) else {
            break;
        };
        if last + 1 != expected || positions.get(slot).is_none_or(|&p| p == NO_POSITION) {
            break;
        }
        valid_len = positions[slot] as usize;
        positions.truncate(slot);
        corrupt.pop();
        expected = last;
    }

    Scan {
        positions,
        corrupt,
        valid_len: usize_to_u64(valid_len),
        next_offset: expected,
        last_timestamp_ms,
    }
}

/// The verified header at `buf[pos..]` whose whole frame fits in `buf`, and
/// whether its payload CRC matches; `None` if the header does not verify or
/// the frame runs past the end of `buf`.
fn frame_at(buf: &[u8], pos: usize, max_payload: u32) -> Option<(Header, bool)> {
    let rest = buf.get(pos..)?;
    let h = decode_header(rest, max_payload).ok()?;
    let payload = rest.get(HEADER_LEN..h.frame_len())?;
    Some((h, crc32c::crc32c(payload) == h.payload_crc))
}

/// First resync point at or after `from` for offset `expected` with gap start
/// `gap_start` (see [`scan`]).
fn find_resync(
    buf: &[u8],
    from: usize,
    gap_start: usize,
    expected: u64,
    max_payload: u32,
) -> Option<(usize, Header)> {
    let last = buf.len().checked_sub(HEADER_LEN)?;
    for q in from..=last {
        if buf.get(q..q + MAGIC_BYTES.len()) != Some(&MAGIC_BYTES[..]) {
            continue;
        }
        recordable(q)?;
        if let Some((h, true)) = frame_at(buf, q, max_payload) {
            if is_resync_point(q, &h, gap_start, expected) {
                return Some((q, h));
            }
        }
    }
    None
}

/// Whether the valid frame `h` at `q` may resume the log at offset `expected`
/// after a gap starting at `gap_start`.
fn is_resync_point(q: usize, h: &Header, gap_start: usize, expected: u64) -> bool {
    let Some(skipped) = q.checked_sub(gap_start) else {
        return false;
    };
    let max_lost = usize_to_u64(skipped / HEADER_LEN);
    h.offset >= expected && h.offset - expected <= max_lost
}

/// `pos` as an index entry, if it fits below `NO_POSITION`.
fn recordable(pos: usize) -> Option<u32> {
    u32::try_from(pos).ok().filter(|&p| p != NO_POSITION)
}

fn read_u32(h: &[u8; HEADER_LEN], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&h[at..at + 4]);
    u32::from_le_bytes(b)
}

fn read_u64(h: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_to_usize(v: u32) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn usize_to_u64(v: usize) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: u32 = 1 << 20;

    /// Encodes frames with offsets `base..` and returns the bytes and each
    /// frame's position.
    fn segment(base: u64, payloads: &[Vec<u8>]) -> (Vec<u8>, Vec<usize>) {
        let mut buf = Vec::new();
        let mut starts = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            starts.push(buf.len());
            encode(base + i as u64, 1_000 + i as u64, p, &mut buf);
        }
        (buf, starts)
    }

    fn payloads(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| (0..(i * 7) % 50).map(|j| (i * 31 + j) as u8).collect())
            .collect()
    }

    fn as_u32(starts: &[usize]) -> Vec<u32> {
        starts.iter().map(|&s| s as u32).collect()
    }

    #[test]
    fn many_frames_round_trip_including_an_empty_payload() {
        let mut ps = payloads(100);
        ps[0] = Vec::new();
        ps[50] = Vec::new();
        ps.push(vec![0xAB; 5000]);
        let (buf, starts) = segment(42, &ps);
        assert_eq!(
            buf.len(),
            ps.iter().map(|p| encoded_len(p.len())).sum::<usize>()
        );
        for (i, p) in ps.iter().enumerate() {
            let (h, payload) = decode_frame(&buf[starts[i]..], 42 + i as u64, MAX).unwrap();
            assert_eq!(payload, &p[..]);
            assert_eq!(h.offset, 42 + i as u64);
            assert_eq!(h.timestamp_ms, 1_000 + i as u64);
            assert_eq!(h.payload_len as usize, p.len());
            assert_eq!(h.frame_len(), encoded_len(p.len()));
            assert_eq!(decode_header(&buf[starts[i]..], MAX), Ok(h));
        }
    }

    #[test]
    fn the_magic_is_on_disk_as_frtb() {
        let mut buf = Vec::new();
        encode(0, 0, b"x", &mut buf);
        assert_eq!(&buf[..4], b"FRTB");
    }

    #[test]
    fn every_single_bit_flip_in_a_header_is_rejected() {
        let mut buf = Vec::new();
        encode(7, 1234, b"hello", &mut buf);
        for bit in 0..HEADER_LEN * 8 {
            let mut damaged = buf.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            let err = decode_header(&damaged, MAX).unwrap_err();
            assert!(
                matches!(err, HeaderError::BadMagic | HeaderError::BadHeaderCrc),
                "bit {bit}: {err:?}"
            );
            assert_eq!(
                decode_frame(&damaged, 7, MAX).unwrap_err(),
                FrameError::Header(err)
            );
        }
    }

    #[test]
    fn every_single_bit_flip_in_a_short_payload_is_detected() {
        let mut buf = Vec::new();
        encode(7, 1234, b"a short payload!", &mut buf);
        for bit in HEADER_LEN * 8..buf.len() * 8 {
            let mut damaged = buf.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_header(&damaged, MAX).is_ok());
            assert_eq!(
                decode_frame(&damaged, 7, MAX).unwrap_err(),
                FrameError::BadPayloadCrc,
                "bit {bit}"
            );
        }
    }

    #[test]
    fn decoding_reports_short_oversized_and_misplaced_frames() {
        let mut buf = Vec::new();
        encode(9, 0, &[1, 2, 3, 4], &mut buf);
        assert_eq!(decode_header(&buf[..31], MAX), Err(HeaderError::Incomplete));
        assert_eq!(decode_header(&[], MAX), Err(HeaderError::Incomplete));
        assert_eq!(decode_header(&buf, 3), Err(HeaderError::TooLarge));
        assert!(decode_header(&buf, 4).is_ok());
        assert_eq!(
            decode_frame(&buf[..35], 9, MAX),
            Err(FrameError::Incomplete)
        );
        assert_eq!(
            decode_frame(&buf, 10, MAX),
            Err(FrameError::WrongOffset {
                expected: 10,
                found: 9
            })
        );
        let mut zeros = [0u8; HEADER_LEN];
        assert_eq!(decode_header(&zeros, MAX), Err(HeaderError::BadMagic));
        zeros[..4].copy_from_slice(&MAGIC.to_le_bytes());
        assert_eq!(decode_header(&zeros, MAX), Err(HeaderError::BadHeaderCrc));
    }

    #[test]
    fn a_clean_segment_scans_to_its_end() {
        let ps = payloads(30);
        let (buf, starts) = segment(500, &ps);
        let s = scan(&buf, 500, MAX);
        assert_eq!(
            s,
            Scan {
                positions: as_u32(&starts),
                corrupt: vec![],
                valid_len: buf.len() as u64,
                next_offset: 530,
                last_timestamp_ms: Some(1_029),
            }
        );
    }

    #[test]
    fn an_empty_segment_is_empty() {
        let s = scan(&[], 77, MAX);
        assert_eq!(
            s,
            Scan {
                positions: vec![],
                corrupt: vec![],
                valid_len: 0,
                next_offset: 77,
                last_timestamp_ms: None,
            }
        );
    }

    #[test]
    fn a_last_frame_torn_at_every_byte_leaves_the_prefix() {
        let ps = payloads(6);
        let (buf, starts) = segment(10, &ps);
        let last = *starts.last().unwrap();
        for cut in last..buf.len() {
            let s = scan(&buf[..cut], 10, MAX);
            assert_eq!(s.positions, as_u32(&starts[..5]), "cut {cut}");
            assert!(s.corrupt.is_empty(), "cut {cut}");
            assert_eq!(s.valid_len, last as u64, "cut {cut}");
            assert_eq!(s.next_offset, 15, "cut {cut}");
            assert_eq!(s.last_timestamp_ms, Some(1_004), "cut {cut}");
        }
        assert_eq!(scan(&buf, 10, MAX).next_offset, 16);
    }

    #[test]
    fn a_flipped_bit_in_a_middle_payload_marks_that_offset_corrupt() {
        let ps = payloads(10);
        let (mut buf, starts) = segment(100, &ps);
        buf[starts[4] + HEADER_LEN + 3] ^= 0x10;
        let s = scan(&buf, 100, MAX);
        assert_eq!(s.positions, as_u32(&starts));
        assert_eq!(s.corrupt, vec![104]);
        assert_eq!(s.valid_len, buf.len() as u64);
        assert_eq!(s.next_offset, 110);
        assert_eq!(s.last_timestamp_ms, Some(1_009));
    }

    #[test]
    fn a_run_of_corrupt_payloads_before_good_frames_is_all_listed() {
        let ps = payloads(12);
        let (mut buf, starts) = segment(0, &ps);
        for &i in &[3usize, 4, 5, 6] {
            buf[starts[i] + HEADER_LEN] ^= 1;
        }
        let s = scan(&buf, 0, MAX);
        assert_eq!(s.positions, as_u32(&starts));
        assert_eq!(s.corrupt, vec![3, 4, 5, 6]);
        assert_eq!(s.next_offset, 12);
    }

    #[test]
    fn a_corrupt_payload_in_the_last_frame_is_a_torn_tail() {
        let ps = payloads(5);
        let (mut buf, starts) = segment(0, &ps);
        buf[starts[4] + HEADER_LEN + 1] ^= 0x80;
        let s = scan(&buf, 0, MAX);
        assert_eq!(s.positions, as_u32(&starts[..4]));
        assert!(s.corrupt.is_empty());
        assert_eq!(s.valid_len, starts[4] as u64);
        assert_eq!(s.next_offset, 4);
    }

    #[test]
    fn a_flipped_bit_in_a_middle_header_resyncs_and_loses_that_offset() {
        let ps = payloads(10);
        let (mut buf, starts) = segment(100, &ps);
        buf[starts[6] + 5] ^= 0x01; // payload_len
        let s = scan(&buf, 100, MAX);
        let mut expected = as_u32(&starts);
        expected[6] = NO_POSITION;
        assert_eq!(s.positions, expected);
        assert_eq!(s.corrupt, vec![106]);
        assert_eq!(s.valid_len, buf.len() as u64);
        assert_eq!(s.next_offset, 110);
    }

    #[test]
    fn several_destroyed_frames_are_a_gap_of_lost_offsets() {
        let ps = payloads(10);
        let (mut buf, starts) = segment(0, &ps);
        for b in &mut buf[starts[2]..starts[5]] {
            *b = 0xEE;
        }
        let s = scan(&buf, 0, MAX);
        let mut expected = as_u32(&starts);
        expected[2..5].fill(NO_POSITION);
        assert_eq!(s.positions, expected);
        assert_eq!(s.corrupt, vec![2, 3, 4]);
        assert_eq!(s.next_offset, 10);
    }

    #[test]
    fn a_zero_filled_tail_is_a_torn_tail() {
        let ps = payloads(8);
        let (mut buf, starts) = segment(3, &ps);
        let end = buf.len();
        buf.resize(end + 64 * 1024, 0);
        let s = scan(&buf, 3, MAX);
        assert_eq!(s.positions, as_u32(&starts));
        assert!(s.corrupt.is_empty());
        assert_eq!(s.valid_len, end as u64);
        assert_eq!(s.next_offset, 11);
    }

    #[test]
    fn an_old_duplicate_is_not_a_resync_point() {
        let (mut buf, starts) = segment(0, &payloads(3));
        // After offsets 0..3 comes a stale copy of offset 1, then nothing.
        let dup = buf[starts[1]..starts[2]].to_vec();
        buf.extend_from_slice(&dup);
        let s = scan(&buf, 0, MAX);
        assert_eq!(s.positions, as_u32(&starts));
        assert_eq!(s.valid_len, (buf.len() - dup.len()) as u64);
        assert_eq!(s.next_offset, 3);
        // A stale copy of offset 1 followed by offset 3: offset 3 resumes.
        let mut more = buf.clone();
        let at = more.len();
        encode(3, 9, b"three", &mut more);
        let s = scan(&more, 0, MAX);
        let mut expected = as_u32(&starts);
        expected.push(at as u32);
        assert_eq!(s.positions, expected);
        assert!(s.corrupt.is_empty());
        assert_eq!(s.next_offset, 4);
    }

    #[test]
    fn garbage_before_the_expected_frame_loses_nothing() {
        let mut buf = vec![0x55; 10];
        let at = buf.len();
        encode(0, 1, b"zero", &mut buf);
        let s = scan(&buf, 0, MAX);
        assert_eq!(s.positions, vec![at as u32]);
        assert!(s.corrupt.is_empty());
        assert_eq!(s.next_offset, 1);
    }

    #[test]
    fn a_far_future_offset_is_not_a_resync_point() {
        // 40 skipped bytes can hide at most one lost frame: offset 2 or 3
        // may resume after them, offset 100 or u64::MAX - 1 may not.
        for (far, resumes) in [(3, true), (4, false), (100, false), (u64::MAX - 1, false)] {
            let (mut buf, starts) = segment(0, &payloads(2));
            let end = buf.len();
            buf.extend_from_slice(&[0xAA; 40]);
            encode(far, 0, b"x", &mut buf);
            let s = scan(&buf, 0, MAX);
            if resumes {
                let mut expected = as_u32(&starts);
                expected.extend([NO_POSITION, end as u32 + 40]);
                assert_eq!(s.positions, expected);
                assert_eq!(s.corrupt, vec![2]);
                assert_eq!(s.next_offset, 4);
                assert_eq!(s.valid_len, buf.len() as u64);
            } else {
                assert_eq!(s.positions, as_u32(&starts), "offset {far}");
                assert_eq!(s.next_offset, 2);
                assert_eq!(s.valid_len, end as u64);
            }
        }
    }

    #[test]
    fn an_oversized_frame_is_treated_as_a_bad_header() {
        let mut buf = Vec::new();
        encode(0, 0, &[1; 10], &mut buf);
        let at = buf.len();
        encode(1, 0, &[2; 100], &mut buf);
        let s = scan(&buf, 0, 50);
        assert_eq!(s.positions, vec![0]);
        assert_eq!(s.valid_len, at as u64);
        assert_eq!(s.next_offset, 1);
    }

    #[test]
    fn a_frame_holding_offset_u64_max_ends_the_walk() {
        let mut buf = Vec::new();
        encode(u64::MAX - 1, 0, b"a", &mut buf);
        let at = buf.len();
        encode(u64::MAX, 0, b"b", &mut buf);
        let s = scan(&buf, u64::MAX - 1, MAX);
        assert_eq!(s.positions, vec![0]);
        assert_eq!(s.valid_len, at as u64);
        assert_eq!(s.next_offset, u64::MAX);
    }

    /// What must hold for any scan of any bytes: every recorded position
    /// decodes to its offset, failing only its payload CRC exactly when the
    /// offset is listed corrupt; every lost offset is listed.
    fn check_consistent(buf: &[u8], base: u64, s: &Scan) -> Result<(), TestCaseError> {
        prop_assert!(s.valid_len <= buf.len() as u64);
        prop_assert_eq!(s.next_offset - base, s.positions.len() as u64);
        prop_assert!(s.positions.len() <= buf.len() / HEADER_LEN + 1);
        prop_assert!(s.corrupt.windows(2).all(|w| w[0] < w[1]));
        for (i, &p) in s.positions.iter().enumerate() {
            let offset = base + i as u64;
            let listed = s.corrupt.binary_search(&offset).is_ok();
            if p == NO_POSITION {
                prop_assert!(listed);
                continue;
            }
            prop_assert!(u64::from(p) < s.valid_len);
            match decode_frame(&buf[p as usize..], offset, MAX) {
                Ok(_) => prop_assert!(!listed),
                Err(e) => {
                    prop_assert_eq!(e, FrameError::BadPayloadCrc);
                    prop_assert!(listed);
                }
            }
        }
        if let Some(&first) = s.corrupt.first() {
            prop_assert!(first >= base);
        }
        if let Some(&last) = s.corrupt.last() {
            prop_assert!(last < s.next_offset);
        }
        Ok(())
    }

    /// A piece of a made-up segment: a frame with some offset, or raw bytes.
    #[derive(Debug, Clone)]
    enum Piece {
        Frame(u64, Vec<u8>, bool),
        Bytes(Vec<u8>),
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            3 => (0u64..12, proptest::collection::vec(any::<u8>(), 0..60), any::<bool>())
                .prop_map(|(o, p, bad)| Piece::Frame(o, p, bad)),
            1 => proptest::collection::vec(any::<u8>(), 0..50).prop_map(Piece::Bytes),
        ]
    }

    #[derive(Debug, Clone)]
    enum Damage {
        Flip(usize),
        Truncate(usize),
        AppendGarbage(Vec<u8>),
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            3 => any::<usize>().prop_map(Damage::Flip),
            1 => any::<usize>().prop_map(Damage::Truncate),
            1 => proptest::collection::vec(any::<u8>(), 0..100).prop_map(Damage::AppendGarbage),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        #[test]
        fn random_damage_never_panics_and_spares_untouched_frames(
            ps in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..150), 0..16),
            base in 0u64..1 << 40,
            damages in proptest::collection::vec(damage(), 0..4),
        ) {
            let (mut buf, starts) = segment(base, &ps);
            let original_len = buf.len();
            let mut touched = vec![false; original_len];
            let mut cut = original_len;
            for d in &damages {
                match d {
                    Damage::Flip(bit) => {
                        if !buf.is_empty() {
                            let bit = bit % (buf.len() * 8);
                            buf[bit / 8] ^= 1 << (bit % 8);
                            if bit / 8 < original_len {
                                touched[bit / 8] = true;
                            }
                        }
                    }
                    Damage::Truncate(at) => {
                        let at = at % (buf.len() + 1);
                        buf.truncate(at);
                        cut = cut.min(at);
                    }
                    Damage::AppendGarbage(g) => buf.extend_from_slice(g),
                }
            }

            let s = scan(&buf, base, MAX);
            check_consistent(&buf, base, &s)?;

            // Every frame untouched by the damage and before the cut is found.
            for (i, &start) in starts.iter().enumerate() {
                let end = start + encoded_len(ps[i].len());
                if end > cut || touched[start..end].iter().any(|&t| t) {
                    continue;
                }
                let offset = base + i as u64;
                prop_assert!(s.positions.len() > i, "frame {} not reached: {:?}", i, s);
                prop_assert_eq!(s.positions[i], start as u32);
                prop_assert!(s.corrupt.binary_search(&offset).is_err());
                let (_, payload) = decode_frame(&buf[start..], offset, MAX).unwrap();
                prop_assert_eq!(payload, &ps[i][..]);
            }
        }

        #[test]
        fn mixed_frames_duplicates_and_garbage_scan_consistently(
            pieces in proptest::collection::vec(piece(), 0..20),
            max in prop_oneof![Just(MAX), 0u32..80],
        ) {
            let mut buf = Vec::new();
            for p in &pieces {
                match p {
                    Piece::Frame(o, payload, bad) => {
                        let at = buf.len();
                        encode(*o, 0, payload, &mut buf);
                        if *bad && !payload.is_empty() {
                            buf[at + HEADER_LEN] ^= 1;
                        }
                    }
                    Piece::Bytes(b) => buf.extend_from_slice(b),
                }
            }
            let s = scan(&buf, 0, max);
            check_consistent(&buf, 0, &s)?;
            let _ = scan(&buf, 3, max);
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            base in any::<u64>(),
            max in any::<u32>(),
        ) {
            let s = scan(&bytes, base, max);
            prop_assert!(s.valid_len <= bytes.len() as u64);
            prop_assert!(s.positions.len() <= bytes.len() / HEADER_LEN + 1);
            prop_assert_eq!(s.next_offset.wrapping_sub(base), s.positions.len() as u64);
            let _ = decode_header(&bytes, max);
            let _ = decode_frame(&bytes, base, max);
        }
    }
}
