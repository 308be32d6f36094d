//! Produce: `POST /produce`. The client's request (one raw message, or a batch in `application/x-ndjson` or
//! `application/vnd.berth.frames`) parsed into plain records; the owner-side request that appends one partition's
//! records in one write and one sync; and its reply.
//!
//! Read in order: `parse` (HTTP to `ProduceParams`), then `front/produce.rs` (records split by owning partition and
//! core, sent as `Produce` requests), `apply` here on the owner (the log append), and `render` (the reply). Route:
//! `http/routes.rs`.

use super::attributes;
use super::error::{OpError, OpResult};
use super::params::{BatchLimits, Media, Query};
use super::response::{json_reply, Response};
use super::status::status_of;
use crate::duration::parse_duration_in;
use crate::engine::Engine;
use crate::partition::dedup::DedupRecords;
use crate::storage::meta::{Attribute, RecordMeta};
use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Where a record goes: a partition, a key's partition, or any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    Partition(u64),
    Key(String),
    Any,
}

/// One record of a produce request.
#[derive(Debug, Clone)]
pub struct ClientRecord {
    pub body: Bytes,
    pub target: Target,
    /// Attributes and a delivery deadline (`not_before_ms`, Unix ms), if any: stored in the record's meta block.
    pub meta: Option<Box<RecordMeta>>,
    /// The record gave no delay of its own (nor its request one): the topic's `delay` applies
    /// (`apply_topic_rules`). An explicit `delay=0` is a delay of its own.
    pub topic_delay: bool,
}

impl ClientRecord {
    /// A delivered message produced again elsewhere (to a dead-letter topic, by a redrive): its body, its
    /// attributes and its message group; not its delay (it was delivered) nor its deduplication id.
    pub fn moved(payload: &Bytes, meta: &Option<Box<RecordMeta>>) -> ClientRecord {
        let meta = meta.as_ref().and_then(|m| {
            let moved = RecordMeta {
                attributes: m.attributes.clone(),
                group_key: m.group_key.clone(),
                ..RecordMeta::default()
            };
            (!moved.is_empty()).then(|| Box::new(moved))
        });
        // A message group places its records on its partition (FIFO: one partition holds a group's order).
        let target = meta
            .as_ref()
            .and_then(|m| m.group_key.as_ref())
            .and_then(|g| std::str::from_utf8(g).ok())
            .map_or(Target::Any, |g| Target::Key(g.to_string()));
        ClientRecord {
            body: payload.clone(),
            target,
            meta,
            topic_delay: false,
        }
    }

    /// The payload the log stores (the meta block, then the body; or the body alone) and whether it has a block.
    pub fn into_payload(self) -> (Bytes, bool) {
        match self.meta {
            None => (self.body, false),
            Some(meta) => (Bytes::from(meta.encode(&self.body)), true),
        }
    }
}

/// The longest `delay` of a produce: 15 minutes (SQS's `DelaySeconds` bound).
pub const MAX_DELAY_MS: u64 = crate::storage::meta::MAX_DELAY_MS;

/// Longest `dedup_id` and `group_key`.
pub const MAX_DEDUP_ID_BYTES: usize = 128;

/// Checks a deduplication id: 1 to 128 printable ASCII characters (no space), as SQS's MessageDeduplicationId.
pub fn check_dedup_id(id: &str) -> Result<(), String> {
    check_token("dedup_id", id)
}

/// Checks a `dedup_id` or `group_key` (parameter `name`): 1 to 128 printable ASCII characters (no space), as SQS's
/// MessageDeduplicationId and MessageGroupId.
pub fn check_token(name: &str, token: &str) -> Result<(), String> {
    if token.is_empty()
        || token.len() > MAX_DEDUP_ID_BYTES
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(format!(
            "{name} must be 1 to {MAX_DEDUP_ID_BYTES} printable ASCII characters without spaces"
        ));
    }
    Ok(())
}

/// A topic's rules for a client's records, before anything is written (a record that breaks one fails the whole
/// request):
/// - its `max_message_bytes` (when set: the server's limit was checked at parsing), body and attributes counted:
///   `413 message_too_large`;
/// - its `delay` for records that gave none of their own, counted from `now_wall_ms`;
/// - FIFO: each record names a message group (`group_key`), and with `content_dedup` one without a `dedup_id` is
///   deduplicated by the SHA-256 of its body (64 hex digits). A topic that is not FIFO takes no `group_key`.
pub fn apply_topic_rules(
    config: &crate::engine::topic::TopicConfig,
    records: &mut [ClientRecord],
    now_wall_ms: impl FnOnce() -> u64,
) -> OpResult<()> {
    if config.max_message_bytes > 0 {
        let limit = config.max_message_bytes as usize;
        for r in records.iter() {
            let attrs = r
                .meta
                .as_ref()
                .map_or(0, |m| attributes::size(&m.attributes));
            if r.body.len() + attrs > limit {
                return Err(OpError::MessageTooLarge { limit });
            }
        }
    }
    if config.delay_ms > 0 && records.iter().any(|r| r.topic_delay) {
        // As a produce's own delay: rounded up to the next millisecond.
        let not_before = now_wall_ms()
            .saturating_add(config.delay_ms)
            .saturating_add(1);
        for r in records.iter_mut().filter(|r| r.topic_delay) {
            r.meta.get_or_insert_with(Default::default).not_before_ms = not_before;
        }
    }
    let grouped = |r: &ClientRecord| r.meta.as_ref().is_some_and(|m| m.group_key.is_some());
    if !config.fifo {
        if records.iter().any(grouped) {
            return Err(OpError::InvalidParameter(format!(
                "group_key is for FIFO topics, and topic '{}' is not one (created with fifo=true)",
                config.name
            )));
        }
        return Ok(());
    }
    if !records.iter().all(grouped) {
        return Err(OpError::InvalidParameter(format!(
            "topic '{}' is FIFO: every message names its message group (group_key=K)",
            config.name
        )));
    }
    if config.content_dedup {
        use sha2::{Digest, Sha256};
        for r in records.iter_mut() {
            let meta = r.meta.as_mut().expect("grouped above");
            if meta.dedup_id.is_none() {
                let digest = Sha256::digest(&r.body);
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                meta.dedup_id = Some(Bytes::from(hex));
            }
        }
    }
    Ok(())
}

/// What a produce's query and headers give every record that does not say otherwise.
struct Defaults<'a> {
    target: Target,
    /// The query's `group_key` (FIFO topics).
    group_key: Option<String>,
    /// The query's `delay` (None: not given).
    delay_ms: Option<u64>,
    attributes: Vec<Attribute>,
    /// Now, Unix ms: read once, and only for a record with a delay (most have none).
    now_wall_ms: &'a dyn Fn() -> u64,
    now: std::cell::Cell<Option<u64>>,
}

impl Defaults<'_> {
    /// The meta of a record with these (or its own) attributes and delay, and its deduplication id; None when it
    /// carries none of them.
    fn meta(
        &self,
        own: Option<Vec<Attribute>>,
        own_delay: Option<u64>,
        dedup_id: Option<String>,
        group_key: Option<String>,
    ) -> Option<Box<RecordMeta>> {
        let attributes = own.unwrap_or_else(|| self.attributes.clone());
        let delay_ms = own_delay.or(self.delay_ms).unwrap_or(0);
        let meta = RecordMeta {
            // The produce's time is somewhere in the millisecond `now_wall_ms` names: rounded up, so the
            // message is never delivered before its time plus the delay.
            not_before_ms: if delay_ms > 0 {
                let now = *self.now.get().get_or_insert_with(|| (self.now_wall_ms)());
                self.now.set(Some(now));
                now.saturating_add(delay_ms).saturating_add(1)
            } else {
                0
            },
            attributes,
            dedup_id: dedup_id.map(Bytes::from),
            group_key: group_key.map(Bytes::from),
        };
        (!meta.is_empty()).then(|| Box::new(meta))
    }

    /// Whether a record with this delay of its own gets its topic's (neither it nor the request gave one).
    fn topic_delay(&self, own_delay: Option<u64>) -> bool {
        own_delay.is_none() && self.delay_ms.is_none()
    }

    /// Where a record goes: its message group's partition; else its own target, else the query's; a record with a
    /// deduplication id and no target goes to its id's partition (so a retry meets the first produce wherever it
    /// was sent). A message group places its records alone: a `key` or `partition` beside it is refused.
    fn target(
        &self,
        own: Option<Target>,
        dedup_id: Option<&str>,
        group_key: Option<&str>,
    ) -> Result<Target, String> {
        if let Some(group) = group_key {
            if own.is_some() || self.target != Target::Any {
                return Err(
                    "group_key places the record (on its group's partition): key and partition cannot be given with it"
                        .into(),
                );
            }
            return Ok(Target::Key(group.to_string()));
        }
        Ok(match (own, &self.target, dedup_id) {
            (Some(t), _, _) => t,
            (None, Target::Any, Some(id)) => Target::Key(id.to_string()),
            (None, t, _) => t.clone(),
        })
    }
}

/// A produce request as the client sent it.
#[derive(Debug, Clone)]
pub struct ProduceParams {
    pub topic: String,
    pub records: Vec<ClientRecord>,
    /// Sent as a batch (reply `{"results": [...]}`), else a version 1 single message.
    pub batch: bool,
}

/// The parts of a produce request besides its query and body.
pub struct ProduceHeaders<'a> {
    pub content_type: Option<&'a str>,
    /// The `attributes` header: the attributes of every record that names none (`ops::attributes`).
    pub attributes: Option<&'a str>,
    /// Now, Unix ms: a `delay` counts from here (called only when a record has one).
    pub now_wall_ms: &'a dyn Fn() -> u64,
}

/// Parses `POST /produce?topic=T[&partition=P][&key=K][&delay=D]` and its body. Query `partition`/`key`, `delay`
/// and the `attributes` header apply to records that name none of their own. A malformed record fails the whole
/// request (400), an oversized one too (413): nothing is written.
pub fn parse(
    query: &Query,
    headers: ProduceHeaders<'_>,
    body: Bytes,
    limits: &BatchLimits,
) -> OpResult<ProduceParams> {
    let topic = query.topic()?;
    let target = match (query.partition()?, query.get("key").as_deref()) {
        (Some(p), _) => Target::Partition(p),
        (None, Some(key)) => Target::Key(key.to_string()),
        (None, None) => Target::Any,
    };
    let group_key = query.get("group_key").map(|g| g.into_owned());
    if let Some(g) = &group_key {
        check_token("group_key", g).map_err(OpError::InvalidParameter)?;
    }
    let default = Defaults {
        target,
        group_key,
        delay_ms: query.duration("delay", 0, MAX_DELAY_MS)?,
        attributes: headers
            .attributes
            .map(attributes::parse_text)
            .transpose()?
            .unwrap_or_default(),
        now_wall_ms: headers.now_wall_ms,
        now: std::cell::Cell::new(None),
    };
    let media = Media::of(headers.content_type);
    let dedup_id = query.get("dedup_id").map(|id| id.into_owned());
    if let Some(id) = &dedup_id {
        check_dedup_id(id).map_err(OpError::InvalidParameter)?;
        if !matches!(media, Media::Raw | Media::Text) {
            return Err(OpError::InvalidParameter(
                "dedup_id in the query is for one message; a batch's records carry their own (\"dedup_id\")"
                    .into(),
            ));
        }
    }
    let records = match media {
        Media::Ndjson => parse_ndjson(&body, &default, limits)?,
        Media::Frames => parse_frames(&body, &default, limits)?,
        Media::Raw | Media::Text => {
            check_size(body.len() + attributes::size(&default.attributes), limits)?;
            vec![ClientRecord {
                body,
                target: default
                    .target(None, dedup_id.as_deref(), default.group_key.as_deref())
                    .map_err(OpError::InvalidParameter)?,
                meta: default.meta(None, None, dedup_id, default.group_key.clone()),
                topic_delay: default.topic_delay(None),
            }]
        }
    };
    // What the log stores: a meta block (an `attributes` header copied to every record of a batch, say) counts.
    let stored: usize = records
        .iter()
        .map(|r| r.body.len() + r.meta.as_ref().map_or(0, |m| m.encoded_len()))
        .sum();
    if stored > limits.max_batch_bytes {
        return Err(OpError::BatchTooLarge(format!(
            "the records hold {stored} bytes with their attributes: more than {} (max_batch_bytes)",
            limits.max_batch_bytes
        )));
    }
    Ok(ProduceParams {
        topic,
        records,
        batch: matches!(media, Media::Ndjson | Media::Frames),
    })
}

fn check_count(n: usize, limits: &BatchLimits) -> OpResult<()> {
    if n > limits.max_batch_records {
        return Err(OpError::BatchTooLarge(format!(
            "the batch holds more than {} records (max_batch_records)",
            limits.max_batch_records
        )));
    }
    Ok(())
}

fn check_size(len: usize, limits: &BatchLimits) -> OpResult<()> {
    if len > limits.max_message_bytes {
        return Err(OpError::MessageTooLarge {
            limit: limits.max_message_bytes,
        });
    }
    Ok(())
}

/// One JSON object per line: `{"body": "text"}` or `{"body_base64": "..."}`, optional `"key"`, `"partition"`,
/// `"delay"` (a duration string) and `"attributes"` (`ops::attributes`). Blank lines are ignored.
fn parse_ndjson(
    body: &[u8],
    default: &Defaults,
    limits: &BatchLimits,
) -> OpResult<Vec<ClientRecord>> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line {
        body: Option<String>,
        body_base64: Option<String>,
        key: Option<String>,
        partition: Option<u64>,
        delay: Option<String>,
        attributes: Option<serde_json::Value>,
        dedup_id: Option<String>,
        group_key: Option<String>,
    }
    let mut records = Vec::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        check_count(records.len() + 1, limits)?;
        let bad = |why: String| OpError::InvalidRecord(format!("record on line {}: {why}", i + 1));
        let parsed: Line = serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
        let bytes = match (parsed.body, parsed.body_base64) {
            (Some(text), None) => Bytes::from(text),
            (None, Some(b64)) => Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|e| bad(format!("body_base64 is not base64: {e}")))?,
            ),
            _ => return Err(bad("needs exactly one of body and body_base64".into())),
        };
        let own = parsed
            .attributes
            .as_ref()
            .map(attributes::parse_value)
            .transpose()
            .map_err(|e| bad(e.to_string()))?;
        let delay = parsed
            .delay
            .as_deref()
            .map(|d| parse_duration_in(d, 0, MAX_DELAY_MS))
            .transpose()
            .map_err(|e| bad(format!("delay: {}", e.0)))?;
        if let Some(id) = &parsed.dedup_id {
            check_dedup_id(id).map_err(bad)?;
        }
        if let Some(g) = &parsed.group_key {
            check_token("group_key", g).map_err(bad)?;
        }
        let group_key = parsed.group_key.or_else(|| default.group_key.clone());
        let attrs = own.as_deref().unwrap_or(&default.attributes);
        check_size(bytes.len() + attributes::size(attrs), limits)?;
        let target = match (parsed.partition, parsed.key) {
            (Some(p), _) => Some(Target::Partition(p)),
            (None, Some(k)) => Some(Target::Key(k)),
            (None, None) => None,
        };
        records.push(ClientRecord {
            body: bytes,
            target: default
                .target(target, parsed.dedup_id.as_deref(), group_key.as_deref())
                .map_err(bad)?,
            meta: default.meta(own, delay, parsed.dedup_id, group_key),
            topic_delay: default.topic_delay(delay),
        });
    }
    if records.is_empty() {
        return Err(OpError::InvalidRecord("the batch holds no record".into()));
    }
    Ok(records)
}

/// Frames: a 4-byte little-endian length, then that many bytes, repeated to the end of the body.
fn parse_frames(
    body: &Bytes,
    default: &Defaults,
    limits: &BatchLimits,
) -> OpResult<Vec<ClientRecord>> {
    let attrs_size = attributes::size(&default.attributes);
    let mut records = Vec::new();
    let mut pos = 0usize;
    while pos < body.len() {
        check_count(records.len() + 1, limits)?;
        let Some(len_bytes) = body.get(pos..pos + 4) else {
            return Err(OpError::InvalidRecord(format!(
                "frame {} has a truncated length",
                records.len() + 1
            )));
        };
        let len = u32::from_le_bytes(len_bytes.try_into().expect("4 bytes")) as usize;
        check_size(len.saturating_add(attrs_size), limits)?;
        let start = pos + 4;
        let Some(end) = start.checked_add(len).filter(|&e| e <= body.len()) else {
            return Err(OpError::InvalidRecord(format!(
                "frame {} runs past the end of the body",
                records.len() + 1
            )));
        };
        records.push(ClientRecord {
            body: body.slice(start..end),
            target: default
                .target(None, None, default.group_key.as_deref())
                .map_err(OpError::InvalidParameter)?,
            meta: default.meta(None, None, None, default.group_key.clone()),
            topic_delay: default.topic_delay(None),
        });
        pos = end;
    }
    if records.is_empty() {
        return Err(OpError::InvalidRecord("the batch holds no record".into()));
    }
    Ok(records)
}

/// The owner-side request: records for one partition, appended with consecutive offsets in one write and one sync.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Produce {
    pub topic: String,
    /// The topic's id: a produce that crossed a delete and re-create is refused.
    pub topic_id: u64,
    pub partition: u32,
    /// The payloads: a record's meta block (`storage::meta`) and its body, or the body alone.
    pub records: Vec<Bytes>,
    /// Which records start with a meta block (empty: none does).
    pub meta: Vec<bool>,
}

/// The first offset (the records got `first..first + n`), or each record's offset when some were duplicates.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Produced {
    pub first_offset: u64,
    /// Empty: the records got `first_offset..`; else one offset per record (a duplicate's is the first one's).
    pub offsets: Vec<u64>,
}

impl Produced {
    /// Record `k`'s offset, or None when a peer's answer has no offset for it.
    pub fn offset_of(&self, k: usize) -> Option<u64> {
        if self.offsets.is_empty() {
            self.first_offset.checked_add(k as u64)
        } else {
            self.offsets.get(k).copied()
        }
    }
}

/// Appends on the owning core; resolves once durable under the fsync policy.
pub async fn apply(engine: &Rc<Engine>, req: Produce) -> OpResult<Produced> {
    let topic = engine.topic_of(&req.topic, req.topic_id)?;
    let partition = engine.partition(&topic, req.partition as u64)?;
    let count = req.records.len() as u64;
    let window_ms = topic.config().dedup_window_ms;
    if window_ms == 0 {
        partition.dedup_off();
    }
    let ids = if req.meta.iter().any(|m| *m) {
        let metas = metas(&req.records, &req.meta);
        if window_ms > 0 {
            metas
                .into_iter()
                .map(|m| m.and_then(|m| m.dedup_id))
                .collect()
        } else {
            Vec::new()
        }
    } else {
        Vec::new()
    };
    let (first_offset, offsets) = if ids.iter().any(Option::is_some) {
        let records = DedupRecords {
            payloads: req.records,
            meta: req.meta,
            ids,
        };
        // Boxed: the data path's future stays as small as a plain produce needs.
        let offsets = Box::pin(partition.append_deduplicated(
            records,
            window_ms,
            engine.config().max_dedup_ids,
        ))
        .await?;
        (offsets[0], offsets)
    } else {
        let first = partition.append_records(req.records, req.meta).await?;
        (first, Vec::new())
    };
    if partition.replicated() {
        // Answered once a majority of the replicas has the records durable (`partition/commit.rs`); a duplicate's
        // too (the first produce may not have been answered).
        let end = offsets.iter().max().map_or(first_offset + count, |o| o + 1);
        partition
            .wait_committed(end, engine.replica_timeout())
            .await?;
    }
    Ok(Produced {
        first_offset,
        offsets,
    })
}

/// Each record's meta block, if it has one (one that does not parse is refused before: `validate` for a peer's,
/// and the front builds its own).
fn metas(records: &[Bytes], meta: &[bool]) -> Vec<Option<RecordMeta>> {
    records
        .iter()
        .zip(meta)
        .map(|(r, &m)| {
            m.then(|| RecordMeta::decode(r).ok())
                .flatten()
                .map(|(meta, _)| meta)
        })
        .collect()
}

// ---- The reply ----

/// The answer to a produce: a single one's `200 {"offset":N,"partition":P}` (or its error), a batch's
/// `{"failed":F,"results":[...]}` with each record's offset or error.
pub fn render(batch: bool, results: Vec<OpResult<(u32, u64)>>) -> OpResult<Response> {
    if !batch {
        let (partition, offset) = results
            .into_iter()
            .next()
            .expect("a single produce has one result")?;
        return Ok(written_reply(partition, offset));
    }
    let failed = results.iter().filter(|r| r.is_err()).count();
    let results: Vec<ProduceResult> = results
        .iter()
        .map(|r| match r {
            Ok((partition, offset)) => ProduceResult::Written {
                offset: *offset,
                partition: *partition,
            },
            Err(e) => ProduceResult::Failed {
                error: status_of(e).1,
                message: e.to_string(),
            },
        })
        .collect();
    Ok(json_reply(&ProduceResults { failed, results }))
}

/// A single produce's `200`: `{"offset":N,"partition":P}`, the bytes `serde_json` gives for
/// [`ProduceResult::Written`] (checked by a test), in a body of exactly its length (one allocation, where the
/// serialiser took two and its machinery).
fn written_reply(partition: u32, offset: u64) -> Response {
    use super::response::{decimal_len, push_decimal};
    const HEAD: &[u8] = b"{\"offset\":";
    const MIDDLE: &[u8] = b",\"partition\":";
    let len = HEAD.len() + decimal_len(offset) + MIDDLE.len() + decimal_len(partition.into()) + 1;
    let mut body = Vec::with_capacity(len);
    body.extend_from_slice(HEAD);
    push_decimal(&mut body, offset);
    body.extend_from_slice(MIDDLE);
    push_decimal(&mut body, partition.into());
    body.push(b'}');
    Response::bytes(200, "application/json", body.into())
}

/// One record's result in a produce answer. As for [`SettleResult`], fields come in the sorted order a `serde_json`
/// map gives, so the bytes are those of the `json!` maps this replaced (checked by a test).
#[derive(serde::Serialize)]
#[serde(untagged)]
enum ProduceResult {
    Written {
        offset: u64,
        partition: u32,
    },
    Failed {
        error: &'static str,
        message: String,
    },
}

#[derive(serde::Serialize)]
struct ProduceResults {
    failed: usize,
    results: Vec<ProduceResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct(content_type: Option<&str>) -> ProduceHeaders<'_> {
        ProduceHeaders {
            content_type,
            attributes: None,
            now_wall_ms: &|| 1_700_000_000_000,
        }
    }

    const LIMITS: BatchLimits = BatchLimits {
        max_batch_records: 3,
        max_batch_bytes: 1 << 20,
        max_message_bytes: 8,
    };

    fn query(q: &str) -> Query {
        Query::new(q)
    }

    /// A topic's `delay` goes to the records that gave none of their own (an explicit `delay=0` is one), counted
    /// from now and rounded up; its `max_message_bytes` refuses a record whose body and attributes exceed it.
    #[test]
    fn a_topic_delay_applies_to_records_without_their_own_and_its_size_limit_holds() {
        let body = Bytes::from_static(
            b"{\"body\":\"a\"}\n{\"body\":\"b\",\"delay\":\"0s\"}\n{\"body\":\"c\",\"delay\":\"2s\"}\n",
        );
        let p = parse(&query("topic=t"), ct(Some(NDJSON_CT)), body, &LIMITS).unwrap();
        assert_eq!(
            p.records.iter().map(|r| r.topic_delay).collect::<Vec<_>>(),
            [true, false, false]
        );
        let mut config = crate::engine::topic::TopicConfig::with_defaults("t");
        config.delay_ms = 5_000;
        let mut records = p.records.clone();
        apply_topic_rules(&config, &mut records, || 1_700_000_000_000).unwrap();
        let not_before = |r: &ClientRecord| r.meta.as_ref().map_or(0, |m| m.not_before_ms);
        assert_eq!(
            not_before(&records[0]),
            1_700_000_005_001,
            "the topic's delay"
        );
        assert_eq!(not_before(&records[1]), 0, "its own delay of 0");
        assert_eq!(not_before(&records[2]), 1_700_000_002_001, "its own delay");
        // The query's delay is every record's own.
        let q = parse(
            &query("topic=t&delay=0"),
            ct(None),
            Bytes::from_static(b"x"),
            &LIMITS,
        )
        .unwrap();
        assert!(!q.records[0].topic_delay);
        config.max_message_bytes = 1;
        let mut records = p.records.clone();
        assert!(
            apply_topic_rules(&config, &mut records, || 0).is_ok(),
            "1-byte bodies fit"
        );
        config.max_message_bytes = 0;
        let mut big = parse(
            &query("topic=t"),
            ct(None),
            Bytes::from_static(b"eight..."),
            &LIMITS,
        )
        .unwrap()
        .records;
        config.max_message_bytes = 7;
        assert!(matches!(
            apply_topic_rules(&config, &mut big, || 0),
            Err(OpError::MessageTooLarge { limit: 7 })
        ));
    }

    #[test]
    fn ndjson_records_take_text_or_base64_and_their_own_targets() {
        let body = Bytes::from_static(
            b"{\"body\":\"hi\"}\n\n{\"body_base64\":\"AAEC\",\"key\":\"k\"}\r\n{\"body\":\"\",\"partition\":2}\n",
        );
        let p = parse(
            &query("topic=t&partition=1"),
            ct(Some(NDJSON_CT)),
            body,
            &LIMITS,
        )
        .unwrap();
        assert!(p.batch);
        let got: Vec<_> = p
            .records
            .iter()
            .map(|r| (r.body.to_vec(), r.target.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (b"hi".to_vec(), Target::Partition(1)),
                (vec![0, 1, 2], Target::Key("k".into())),
                (vec![], Target::Partition(2)),
            ]
        );
    }

    const NDJSON_CT: &str = "application/x-ndjson";

    #[test]
    fn a_malformed_or_oversized_record_fails_the_whole_batch() {
        for bad in [
            &b"{\"body\":\"ok\"}\nnot json\n"[..],
            b"{\"body\":\"a\",\"body_base64\":\"YQ==\"}",
            b"{\"body_base64\":\"!!\"}",
            b"{\"body\":\"a\",\"extra\":1}",
            b"\n\n",
        ] {
            let e = parse(
                &query("topic=t"),
                ct(Some(NDJSON_CT)),
                Bytes::copy_from_slice(bad),
                &LIMITS,
            );
            assert!(
                matches!(e, Err(OpError::InvalidRecord(_))),
                "{:?}: {e:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let big = Bytes::from_static(b"{\"body\":\"123456789\"}");
        assert_eq!(
            parse(&query("topic=t"), ct(Some(NDJSON_CT)), big, &LIMITS).unwrap_err(),
            OpError::MessageTooLarge { limit: 8 }
        );
        let many = Bytes::from_static(
            b"{\"body\":\"a\"}\n{\"body\":\"a\"}\n{\"body\":\"a\"}\n{\"body\":\"a\"}",
        );
        assert!(matches!(
            parse(&query("topic=t"), ct(Some(NDJSON_CT)), many, &LIMITS),
            Err(OpError::BatchTooLarge(_))
        ));
    }

    #[test]
    fn frames_are_binary_safe_and_truncation_is_refused() {
        let mut body = Vec::new();
        for payload in [&b"\x00\x01"[..], b"", b"abc"] {
            body.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            body.extend_from_slice(payload);
        }
        let p = parse(
            &query("topic=t&key=k"),
            ct(Some("application/vnd.berth.frames")),
            Bytes::from(body.clone()),
            &LIMITS,
        )
        .unwrap();
        let bodies: Vec<_> = p.records.iter().map(|r| r.body.to_vec()).collect();
        assert_eq!(bodies, vec![vec![0, 1], vec![], b"abc".to_vec()]);
        assert!(p
            .records
            .iter()
            .all(|r| r.target == Target::Key("k".into())));
        for cut in 1..body.len() {
            let r = parse(
                &query("topic=t"),
                ct(Some("application/vnd.berth.frames")),
                Bytes::copy_from_slice(&body[..cut]),
                &LIMITS,
            );
            let whole_frames = [0usize, 6, 10, 17].contains(&cut);
            assert_eq!(r.is_ok(), whole_frames && cut > 0, "cut {cut}: {r:?}");
        }
    }

    #[test]
    fn without_a_batch_media_type_the_body_is_one_message() {
        let p = parse(
            &query("topic=t"),
            ct(Some("text/plain")),
            Bytes::from_static(b"a\nb"),
            &LIMITS,
        )
        .unwrap();
        assert!(!p.batch);
        assert_eq!(p.records.len(), 1);
        assert_eq!(&p.records[0].body[..], b"a\nb");
    }

    /// A batch's stored bytes count each record's meta block: an `attributes` header copied to every record of a
    /// frames batch can pass `max_batch_bytes` though the body does not.
    #[test]
    fn attributes_copied_to_every_record_count_against_the_batch_bytes() {
        let limits = BatchLimits {
            max_batch_records: 100,
            max_batch_bytes: 200,
            max_message_bytes: 100,
        };
        let mut frames = Vec::new();
        for _ in 0..10 {
            frames.extend_from_slice(&1u32.to_le_bytes());
            frames.push(b'x');
        }
        let headers = |attributes| ProduceHeaders {
            content_type: Some("application/vnd.berth.frames"),
            attributes,
            now_wall_ms: &|| 1,
        };
        let attrs = r#"{"k":{"type":"String","value":"0123456789"}}"#;
        assert!(parse(
            &query("topic=t"),
            headers(None),
            Bytes::from(frames.clone()),
            &limits
        )
        .is_ok());
        let e = parse(
            &query("topic=t"),
            headers(Some(attrs)),
            Bytes::from(frames),
            &limits,
        )
        .unwrap_err();
        assert!(matches!(e, OpError::BatchTooLarge(_)), "{e:?}");
    }
}

#[cfg(test)]
mod reply_tests {
    use super::*;
    use serde_json::json;

    /// A produce answer is byte for byte what the `json!` maps gave.
    #[test]
    fn produce_results_match_serde_json_maps() {
        let single = serde_json::to_string(&ProduceResult::Written {
            offset: 7,
            partition: 3,
        })
        .unwrap();
        assert_eq!(single, json!({"partition": 3, "offset": 7}).to_string());
        for (partition, offset) in [
            (0, 0),
            (3, 7),
            (9, 10),
            (10, 9),
            (u32::MAX, u64::MAX),
            (1, 99_999),
        ] {
            let want =
                serde_json::to_string(&ProduceResult::Written { offset, partition }).unwrap();
            let reply = written_reply(partition, offset);
            assert_eq!(reply.body, want.as_bytes(), "{partition} {offset}");
            assert_eq!(
                (reply.status, reply.content_type),
                (200, "application/json")
            );
        }
        let batch = ProduceResults {
            failed: 1,
            results: vec![
                ProduceResult::Written {
                    offset: u64::MAX,
                    partition: 0,
                },
                ProduceResult::Failed {
                    error: "message_too_large",
                    message: "record 1 is \"big\"".into(),
                },
            ],
        };
        let want = json!({"results": [
            {"partition": 0, "offset": u64::MAX},
            {"error": "message_too_large", "message": "record 1 is \"big\""},
        ], "failed": 1});
        assert_eq!(serde_json::to_string(&batch).unwrap(), want.to_string());
    }
}
