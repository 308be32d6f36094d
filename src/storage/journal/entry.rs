//! The journal's entries, byte by byte (`docs/format.md`, "Journal"): building and sealing them, and [`scan`],
//! which reads them back from any bytes.

/// First four bytes of every entry of frames (on disk, little-endian: `4A 52 4E 4C`, ASCII `JRNL`).
pub const MAGIC: u32 = 0x4C4E_524A;
pub(super) const MAGIC_BYTES: [u8; 4] = MAGIC.to_le_bytes();
/// First four bytes of every entry of frontiers (on disk `4A 52 4E 46`, ASCII `JRNF`).
pub const FRONTIER_MAGIC: u32 = 0x464E_524A;
pub(super) const FRONTIER_MAGIC_BYTES: [u8; 4] = FRONTIER_MAGIC.to_le_bytes();
/// Length of the fixed part of a frontier record (before the topic and group names).
pub const FRONTIER_FIXED_LEN: usize = 25;
/// Length of an entry header.
pub const HEADER_LEN: usize = 24;
/// Bytes of the header covered by its CRC.
const HEADER_CRC_SPAN: usize = 20;
/// Length of the fixed part of an entry body (before the topic name).
pub const BODY_FIXED_LEN: usize = 42;
/// Longest topic name an entry carries (names are far shorter: see the topic-name rule).
const MAX_NAME_LEN: usize = u16::MAX as usize;

/// Where an entry's frames belong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryHead {
    /// The topic's name (its directory) and id (a recreated topic has another id).
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    /// The segment file (its base offset) and the byte position of the first frame in it.
    pub segment_base: u64,
    pub position: u64,
    /// Offsets of the frames.
    pub first_offset: u64,
    pub count: u32,
}

/// One entry found by [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub head: EntryHead,
    /// The frames, exactly as written to the segment.
    pub frames: Vec<u8>,
}

/// Where a consumer group's frontier stands, as a frontier entry records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontierRecord {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub group: String,
    /// The group's committed frontier (every offset below it is settled).
    pub committed: u64,
    /// The group was created here, starting at `committed`: records of the same group before it belong to a group
    /// of the same name that was deleted, and no longer count.
    pub start: bool,
    /// Offsets acknowledged above `committed`, as ranges in canonical form (`FrontierValue`): settled too, so a
    /// restart does not deliver them again. Empty in records of version 2 and before.
    pub acked: Vec<(u64, u64)>,
}

impl FrontierRecord {
    /// The value it records (committed frontier and acked-ahead ranges).
    pub fn value(&self) -> crate::storage::frontier::FrontierValue {
        crate::storage::frontier::FrontierValue {
            committed: self.committed,
            acked: self.acked.clone(),
        }
    }
}

/// What [`scan`] found in one journal file.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    pub entries: Vec<Entry>,
    /// The records of its frontier entries, in the order they were written.
    pub frontiers: Vec<FrontierRecord>,
    /// Entries (or runs of bytes) that failed a check and were passed over.
    pub damaged: usize,
}

/// Starts an entry for `head`: the header and body prefix, with room for the frames the caller appends next
/// (`Journal::commit` fills in the lengths, sequence number and CRCs).
pub fn begin_entry(head: &EntryHead, frames_len: usize) -> Vec<u8> {
    let name = head.topic.as_bytes();
    assert!(
        name.len() <= MAX_NAME_LEN,
        "topic name too long for the journal"
    );
    let mut out = Vec::with_capacity(HEADER_LEN + BODY_FIXED_LEN + name.len() + frames_len);
    out.extend_from_slice(&MAGIC_BYTES);
    out.extend_from_slice(&[0u8; HEADER_LEN - 4]);
    out.extend_from_slice(&head.topic_id.to_le_bytes());
    out.extend_from_slice(&head.partition.to_le_bytes());
    out.extend_from_slice(&head.segment_base.to_le_bytes());
    out.extend_from_slice(&head.position.to_le_bytes());
    out.extend_from_slice(&head.first_offset.to_le_bytes());
    out.extend_from_slice(&head.count.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name);
    out
}

/// An entry of frontier records (`Journal::commit_frontiers` seals it).
pub fn frontier_entry(records: &[FrontierRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        HEADER_LEN
            + 4
            + records
                .iter()
                .map(|r| {
                    let ranges = if r.acked.is_empty() {
                        0
                    } else {
                        4 + 16 * r.acked.len()
                    };
                    FRONTIER_FIXED_LEN + r.topic.len() + r.group.len() + ranges
                })
                .sum::<usize>(),
    );
    out.extend_from_slice(&FRONTIER_MAGIC_BYTES);
    out.extend_from_slice(&[0u8; HEADER_LEN - 4]);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        let (topic, group) = (r.topic.as_bytes(), r.group.as_bytes());
        assert!(
            topic.len() <= MAX_NAME_LEN && group.len() <= MAX_NAME_LEN,
            "name too long for the journal"
        );
        out.extend_from_slice(&r.topic_id.to_le_bytes());
        out.extend_from_slice(&r.partition.to_le_bytes());
        out.extend_from_slice(&r.committed.to_le_bytes());
        assert!(
            r.acked.len() <= crate::storage::frontier::MAX_RANGES && r.value().is_normal(),
            "acked-ahead ranges in canonical form"
        );
        let kind = if r.start { 2 } else { 1 } + if r.acked.is_empty() { 0 } else { 2 };
        out.push(kind);
        out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
        out.extend_from_slice(&(group.len() as u16).to_le_bytes());
        out.extend_from_slice(topic);
        out.extend_from_slice(group);
        if !r.acked.is_empty() {
            out.extend_from_slice(&(r.acked.len() as u32).to_le_bytes());
            for &(s, e) in &r.acked {
                out.extend_from_slice(&s.to_le_bytes());
                out.extend_from_slice(&e.to_le_bytes());
            }
        }
    }
    out
}

/// Where the frames start in an entry made by [`begin_entry`].
pub fn frames_start(entry: &[u8]) -> usize {
    let name_len = u16::from_le_bytes([entry[HEADER_LEN + 40], entry[HEADER_LEN + 41]]) as usize;
    HEADER_LEN + BODY_FIXED_LEN + name_len
}

/// Completes an entry made by [`begin_entry`] (frames appended) or [`frontier_entry`] with its sequence number.
pub fn seal_entry(entry: &mut [u8], seq: u64) {
    assert!(
        entry[0..4] == MAGIC_BYTES || entry[0..4] == FRONTIER_MAGIC_BYTES,
        "an entry starts with its kind's magic"
    );
    let body_len = u32::try_from(entry.len() - HEADER_LEN).expect("journal entry under 4 GiB");
    let body_crc = crc32c::crc32c(&entry[HEADER_LEN..]);
    entry[4..8].copy_from_slice(&body_len.to_le_bytes());
    entry[8..16].copy_from_slice(&seq.to_le_bytes());
    entry[16..20].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&entry[..HEADER_CRC_SPAN]);
    entry[20..24].copy_from_slice(&header_crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether `b` starts with either kind's magic.
fn is_magic(b: &[u8]) -> bool {
    b.get(0..4)
        .is_some_and(|m| m == MAGIC_BYTES || m == FRONTIER_MAGIC_BYTES)
}

/// A header at `at` that passes its check: (frontier entry?, body_len, seq, body_crc).
fn header_at(bytes: &[u8], at: usize) -> Option<(bool, usize, u64, u32)> {
    let h = bytes.get(at..at + HEADER_LEN)?;
    if !is_magic(h) || crc32c::crc32c(&h[..HEADER_CRC_SPAN]) != u32_at(h, 20) {
        return None;
    }
    Some((
        h[0..4] == FRONTIER_MAGIC_BYTES,
        u32_at(h, 4) as usize,
        u64_at(h, 8),
        u32_at(h, 16),
    ))
}

/// Decodes a frontier entry body that passed its CRC; None if its fields do not hang together (every byte of the
/// body must belong to a record).
fn parse_frontiers(body: &[u8]) -> Option<Vec<FrontierRecord>> {
    let count = u32_at(body.get(0..4)?, 0) as usize;
    let mut at = 4;
    let mut out = Vec::with_capacity(count.min(body.len() / FRONTIER_FIXED_LEN));
    for _ in 0..count {
        let fixed = body.get(at..at + FRONTIER_FIXED_LEN)?;
        // 1 moved, 2 start; 3 and 4 the same with acked-ahead ranges after the names.
        let (start, ranges) = match fixed[20] {
            1 => (false, false),
            2 => (true, false),
            3 => (false, true),
            4 => (true, true),
            _ => return None,
        };
        let topic_len = u16::from_le_bytes([fixed[21], fixed[22]]) as usize;
        let group_len = u16::from_le_bytes([fixed[23], fixed[24]]) as usize;
        let names_at = at + FRONTIER_FIXED_LEN;
        let topic = std::str::from_utf8(body.get(names_at..names_at + topic_len)?).ok()?;
        let group_at = names_at + topic_len;
        let group = std::str::from_utf8(body.get(group_at..group_at + group_len)?).ok()?;
        at = group_at + group_len;
        let mut acked = Vec::new();
        if ranges {
            let n = u32_at(body.get(at..at + 4)?, 0) as usize;
            let bytes = body.get(at + 4..at + 4 + n.checked_mul(16)?)?;
            acked = bytes
                .chunks_exact(16)
                .map(|r| (u64_at(r, 0), u64_at(r, 8)))
                .collect();
            at += 4 + bytes.len();
            if n == 0 || n > crate::storage::frontier::MAX_RANGES {
                return None;
            }
        }
        let record = FrontierRecord {
            topic: topic.to_string(),
            topic_id: u64_at(fixed, 0),
            partition: u32_at(fixed, 8),
            group: group.to_string(),
            committed: u64_at(fixed, 12),
            start,
            acked,
        };
        if !record.value().is_normal() {
            return None;
        }
        out.push(record);
    }
    (at == body.len()).then_some(out)
}

/// Decodes an entry body that passed its CRC; None if its fields do not hang together.
fn parse_body(seq: u64, body: &[u8]) -> Option<Entry> {
    if body.len() < BODY_FIXED_LEN {
        return None;
    }
    let name_len = u16::from_le_bytes([body[40], body[41]]) as usize;
    let name = body.get(BODY_FIXED_LEN..BODY_FIXED_LEN + name_len)?;
    let topic = std::str::from_utf8(name).ok()?.to_string();
    Some(Entry {
        seq,
        head: EntryHead {
            topic,
            topic_id: u64_at(body, 0),
            partition: u32_at(body, 8),
            segment_base: u64_at(body, 12),
            position: u64_at(body, 20),
            first_offset: u64_at(body, 28),
            count: u32_at(body, 36),
        },
        frames: body[BODY_FIXED_LEN + name_len..].to_vec(),
    })
}

/// Reads the entries of one journal file. Never panics on any bytes. Entries follow one another; zeros after the
/// last one are the unused reserve. A header that fails its check is passed over by searching forward for the next
/// header that passes (with a higher sequence number), so one damaged entry costs that entry, not the rest of the
/// file; an entry whose header passes and whose body fails is passed over whole; a torn last entry ends the scan.
pub fn scan(bytes: &[u8]) -> Scan {
    let mut out = Scan::default();
    let mut at = 0usize;
    let mut last_seq: Option<u64> = None;
    while at + HEADER_LEN <= bytes.len() {
        match header_at(bytes, at) {
            Some((frontiers, body_len, seq, body_crc)) if last_seq.is_none_or(|l| seq > l) => {
                let Some(body) = bytes.get(at + HEADER_LEN..at + HEADER_LEN + body_len) else {
                    // Torn: the file ends inside this entry (it was never acknowledged).
                    break;
                };
                let intact = crc32c::crc32c(body) == body_crc;
                let taken = match (intact, frontiers) {
                    (false, _) => false,
                    (true, false) => parse_body(seq, body)
                        .map(|entry| out.entries.push(entry))
                        .is_some(),
                    (true, true) => parse_frontiers(body)
                        .map(|records| out.frontiers.extend(records))
                        .is_some(),
                };
                if taken {
                    last_seq = Some(seq);
                } else {
                    out.damaged += 1;
                }
                at += HEADER_LEN + body_len;
            }
            _ => {
                if bytes[at..].iter().all(|&b| b == 0) {
                    break;
                }
                out.damaged += 1;
                // Resynchronise on the next header that passes its check.
                let next = (at + 1..bytes.len().saturating_sub(HEADER_LEN - 1)).find(|&i| {
                    is_magic(&bytes[i..])
                        && header_at(bytes, i)
                            .is_some_and(|(_, _, s, _)| last_seq.is_none_or(|l| s > l))
                });
                match next {
                    Some(i) => at = i,
                    None => break,
                }
            }
        }
    }
    out
}
