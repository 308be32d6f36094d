//! The record meta block: what a record carries besides its body (message attributes, a delivery deadline, a
//! deduplication id, a message group key). It is stored at the start of a frame's payload, and only in frames
//! whose `payload_len` has `frame::META_FLAG` set; a record without any of these is written as before (no block),
//! so old segments read unchanged and a plain record costs nothing more.
//!
//! ```text
//! 0   u32 meta_len       bytes of the fields that follow; the body starts at 4 + meta_len
//! 4   fields, each:  u8 tag, u32 len, then len bytes of value
//!       tag 1  not_before_ms   u64: the record is not deliverable before this Unix ms (a delayed produce)
//!       tag 2  attribute       u16 name_len, name, u16 type_len, data type, then the value (the rest)
//!       tag 3  dedup_id        the produce's deduplication id
//!       tag 4  group_key       the message group (FIFO topics)
//! ```
//!
//! All integers little-endian. Attributes are written sorted by name, each name once. A field with another tag is
//! passed over (a newer writer's); a block whose lengths run past the payload, or an attribute field that does not
//! parse, makes the record corrupt (its frame verified, so only a bug or a peer could have written it).
//! `docs/format.md` ("Record meta block") shows an example byte by byte; a test checks it against this code.

use bytes::Bytes;

/// The most a meta block adds to a record beyond what counts against `max_message_bytes` (attribute names, types
/// and values): the block's length, the field heads, the deadline, the ids and the attribute length fields. A
/// frame's payload bound is `max_message_bytes` plus this.
pub const MAX_OVERHEAD: usize = 4 + 13 + 10 * 9 + 2 * (5 + 128) + 64;

/// The longest delay a record may carry: 15 minutes (SQS's `DelaySeconds` bound). A record found with a later
/// time (another node's clock ahead, this one's stepped back) waits at most this long per take.
pub const MAX_DELAY_MS: u64 = 15 * 60 * 1000;

const TAG_NOT_BEFORE: u8 = 1;
const TAG_ATTRIBUTE: u8 = 2;
const TAG_DEDUP_ID: u8 = 3;
const TAG_GROUP_KEY: u8 = 4;

/// One message attribute, as SQS has them: a name, a data type (`String`, `Number` or `Binary`, optionally
/// followed by `.` and a custom label) and a value (text for String and Number, any bytes for Binary).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attribute {
    pub name: String,
    pub data_type: String,
    pub value: Bytes,
}

impl Attribute {
    /// Whether the value is bytes (`Binary...`) rather than text.
    pub fn is_binary(&self) -> bool {
        self.data_type.starts_with("Binary")
    }

    /// Bytes it counts against `max_message_bytes`: name, data type and value.
    pub fn size(&self) -> usize {
        self.name.len() + self.data_type.len() + self.value.len()
    }
}

/// What a record carries besides its body. `RecordMeta::default()` is a plain record (no block written).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordMeta {
    /// Not deliverable before this Unix ms (0: at once).
    pub not_before_ms: u64,
    /// Sorted by name, each name once.
    pub attributes: Vec<Attribute>,
    pub dedup_id: Option<Bytes>,
    pub group_key: Option<Bytes>,
}

/// Why a meta block does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaError {
    /// A length runs past the payload.
    Truncated,
    /// A field's value has the wrong size or shape (a not_before that is not 8 bytes, an attribute name or type
    /// that is not UTF-8, attributes out of order).
    BadField(u8),
}

impl RecordMeta {
    /// Whether there is nothing to write (the record is stored without a block).
    pub fn is_empty(&self) -> bool {
        self.not_before_ms == 0
            && self.attributes.is_empty()
            && self.dedup_id.is_none()
            && self.group_key.is_none()
    }

    /// Bytes of the block (the meta_len field included).
    pub fn encoded_len(&self) -> usize {
        let field = |len: usize| 5 + len;
        let mut n = 4;
        if self.not_before_ms != 0 {
            n += field(8);
        }
        for a in &self.attributes {
            n += field(4 + a.name.len() + a.data_type.len() + a.value.len());
        }
        if let Some(d) = &self.dedup_id {
            n += field(d.len());
        }
        if let Some(g) = &self.group_key {
            n += field(g.len());
        }
        n
    }

    /// The payload of a record with this meta and `body`: the block, then the body.
    ///
    /// # Panics
    ///
    /// If the attributes are not sorted by name with each name once, or a name, data type or field is longer than
    /// its length field holds (the produce's validation bounds them far below).
    pub fn encode(&self, body: &[u8]) -> Vec<u8> {
        assert!(
            self.attributes.windows(2).all(|w| w[0].name < w[1].name),
            "attributes sorted by name, each once"
        );
        let len = self.encoded_len();
        let mut out = Vec::with_capacity(len + body.len());
        out.extend_from_slice(
            &u32::try_from(len - 4)
                .expect("meta block size")
                .to_le_bytes(),
        );
        let field = |out: &mut Vec<u8>, tag: u8, len: usize| {
            out.push(tag);
            out.extend_from_slice(&u32::try_from(len).expect("meta field size").to_le_bytes());
        };
        if self.not_before_ms != 0 {
            field(&mut out, TAG_NOT_BEFORE, 8);
            out.extend_from_slice(&self.not_before_ms.to_le_bytes());
        }
        for a in &self.attributes {
            field(
                &mut out,
                TAG_ATTRIBUTE,
                4 + a.name.len() + a.data_type.len() + a.value.len(),
            );
            for s in [&a.name, &a.data_type] {
                out.extend_from_slice(&u16::try_from(s.len()).expect("name size").to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            out.extend_from_slice(&a.value);
        }
        for (tag, v) in [
            (TAG_DEDUP_ID, &self.dedup_id),
            (TAG_GROUP_KEY, &self.group_key),
        ] {
            if let Some(v) = v {
                field(&mut out, tag, v.len());
                out.extend_from_slice(v);
            }
        }
        debug_assert_eq!(out.len(), len);
        out.extend_from_slice(body);
        out
    }

    /// Splits a payload that starts with a meta block into the meta and the body (sharing `payload`'s buffer).
    pub fn decode(payload: &Bytes) -> Result<(RecordMeta, Bytes), MetaError> {
        let take = |at: usize, n: usize| -> Result<&[u8], MetaError> {
            payload
                .get(at..at.checked_add(n).ok_or(MetaError::Truncated)?)
                .ok_or(MetaError::Truncated)
        };
        let meta_len = u32::from_le_bytes(take(0, 4)?.try_into().expect("4 bytes")) as usize;
        let end = 4usize.checked_add(meta_len).ok_or(MetaError::Truncated)?;
        take(0, end)?;
        let mut meta = RecordMeta::default();
        let mut at = 4;
        while at < end {
            let tag = take(at, 1)?[0];
            let len = u32::from_le_bytes(take(at + 1, 4)?.try_into().expect("4 bytes")) as usize;
            let value_at = at + 5;
            if value_at.checked_add(len).is_none_or(|e| e > end) {
                return Err(MetaError::Truncated);
            }
            let value = payload.slice(value_at..value_at + len);
            match tag {
                TAG_NOT_BEFORE => {
                    let v: [u8; 8] = value[..].try_into().map_err(|_| MetaError::BadField(tag))?;
                    meta.not_before_ms = u64::from_le_bytes(v);
                }
                TAG_ATTRIBUTE => {
                    let a = decode_attribute(&value).ok_or(MetaError::BadField(tag))?;
                    if meta.attributes.last().is_some_and(|l| l.name >= a.name) {
                        return Err(MetaError::BadField(tag));
                    }
                    meta.attributes.push(a);
                }
                TAG_DEDUP_ID => meta.dedup_id = Some(value),
                TAG_GROUP_KEY => meta.group_key = Some(value),
                _ => {}
            }
            at = value_at + len;
        }
        Ok((meta, payload.slice(end..)))
    }
}

/// One attribute field's value: u16 name_len, name, u16 type_len, type, value.
fn decode_attribute(v: &Bytes) -> Option<Attribute> {
    let mut at = 0;
    let mut text = || -> Option<String> {
        let len = u16::from_le_bytes(v.get(at..at + 2)?.try_into().ok()?) as usize;
        let s = std::str::from_utf8(v.get(at + 2..at + 2 + len)?).ok()?;
        at += 2 + len;
        Some(s.to_string())
    };
    let name = text()?;
    let data_type = text()?;
    Some(Attribute {
        name,
        data_type,
        value: v.slice(at..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> RecordMeta {
        RecordMeta {
            not_before_ms: 1_700_000_000_000,
            attributes: vec![
                Attribute {
                    name: "color".into(),
                    data_type: "String".into(),
                    value: Bytes::from_static(b"red"),
                },
                Attribute {
                    name: "raw".into(),
                    data_type: "Binary.gz".into(),
                    value: Bytes::from_static(&[0, 255, 7]),
                },
            ],
            dedup_id: Some(Bytes::from_static(b"d-1")),
            group_key: Some(Bytes::from_static(b"g")),
        }
    }

    #[test]
    fn a_meta_block_round_trips_and_leaves_the_body_alone() {
        for m in [
            meta(),
            RecordMeta::default(),
            RecordMeta {
                not_before_ms: 5,
                ..RecordMeta::default()
            },
        ] {
            for body in [&b""[..], b"hello", &[0u8; 300][..]] {
                let payload = Bytes::from(m.encode(body));
                assert_eq!(payload.len(), m.encoded_len() + body.len());
                let (back, b) = RecordMeta::decode(&payload).unwrap();
                assert_eq!(back, m);
                assert_eq!(&b[..], body);
            }
        }
    }

    #[test]
    fn any_cut_or_damaged_block_is_an_error_or_a_meta_never_a_panic() {
        let payload = meta().encode(b"body");
        for cut in 0..payload.len() {
            let short = Bytes::copy_from_slice(&payload[..cut]);
            // Cut inside the block: truncated; cut inside the body: a shorter body.
            match RecordMeta::decode(&short) {
                Ok((m, b)) => {
                    assert_eq!(m, meta());
                    assert!(b.len() < 4);
                }
                Err(e) => assert!(matches!(e, MetaError::Truncated | MetaError::BadField(_))),
            }
        }
        for i in 0..payload.len() {
            for bit in 0..8 {
                let mut p = payload.clone();
                p[i] ^= 1 << bit;
                let _ = RecordMeta::decode(&Bytes::from(p));
            }
        }
    }

    #[test]
    fn an_unknown_field_is_passed_over_and_attributes_out_of_order_are_refused() {
        let mut p = Vec::new();
        p.extend_from_slice(&(5u32 + 2).to_le_bytes());
        p.extend_from_slice(&[9, 2, 0, 0, 0, b'x', b'y']);
        p.extend_from_slice(b"b");
        let (m, body) = RecordMeta::decode(&Bytes::from(p)).unwrap();
        assert!(m.is_empty());
        assert_eq!(&body[..], b"b");
        let mut m = meta();
        m.attributes.reverse();
        let mut sorted = meta();
        sorted.attributes.truncate(0);
        let mut p = sorted.encode(b"");
        // Two attribute fields by hand, in the wrong order.
        let field = |a: &Attribute| {
            let mut f = vec![TAG_ATTRIBUTE];
            f.extend_from_slice(
                &((4 + a.name.len() + a.data_type.len() + a.value.len()) as u32).to_le_bytes(),
            );
            for s in [&a.name, &a.data_type] {
                f.extend_from_slice(&(s.len() as u16).to_le_bytes());
                f.extend_from_slice(s.as_bytes());
            }
            f.extend_from_slice(&a.value);
            f
        };
        let extra: Vec<u8> = m.attributes.iter().flat_map(field).collect();
        let len = u32::from_le_bytes(p[..4].try_into().unwrap()) as usize + extra.len();
        p[..4].copy_from_slice(&(len as u32).to_le_bytes());
        p.extend_from_slice(&extra);
        assert_eq!(
            RecordMeta::decode(&Bytes::from(p)),
            Err(MetaError::BadField(TAG_ATTRIBUTE))
        );
    }

    #[test]
    fn the_documented_example_is_what_the_code_writes() {
        let m = RecordMeta {
            not_before_ms: 1_700_000_000_000,
            attributes: vec![Attribute {
                name: "k".into(),
                data_type: "String".into(),
                value: Bytes::from_static(b"v"),
            }],
            dedup_id: None,
            group_key: None,
        };
        let mut frame = Vec::new();
        crate::storage::frame::encode_record(
            5,
            1_700_000_000_000,
            &m.encode(b"hi"),
            true,
            &mut frame,
        );
        assert_eq!(crate::format_doc::example("Record meta block", 0), frame);
    }
}
