//! Consume: `GET /consume`. The client's request (queue style with `wait`, `visibility`, `max`, `group`; or a replay
//! with `partition` and `offset`, see `ops::replay`), and the owner-side probe: lease up to `max` messages from the
//! partitions of a topic this core owns, in one pass per partition's lease shard.
//!
//! Read in order: `parse`, then `front/consume.rs` (a probe of each owning core, parking in `engine/waiters.rs` when
//! nothing is deliverable, dead letters diverted), `apply` here on the owner (`Probe`: leases taken), and `render`
//! (one delivery with its receipt handle in headers, or a batch as ndjson or frames). Leases whose reply never
//! reached the consumer come back through `GiveBack`. Route: `http/routes.rs`.

use super::attributes;
use super::error::{OpError, OpResult};
use super::params::{BatchLimits, Media, Query};
use super::params::{FRAMES, NDJSON};
use super::receipt::ReceiptHandle;
use super::response::Response;
use crate::engine::topic::{MAX_VISIBILITY_MS, MIN_VISIBILITY_MS};
use crate::engine::{Engine, EngineError};
use crate::partition::{ByteBudget, Delivery, Stop};
use crate::storage::meta::RecordMeta;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Longest long-poll a consume may ask for (docs/api.md: 0 to 60 s).
pub const MAX_WAIT_MS: u64 = 60_000;

/// A queue-style consume as the client sent it.
#[derive(Debug, Clone)]
pub struct ConsumeParams {
    pub topic: String,
    pub group: String,
    /// How long to park for a message when none is deliverable (None: the topic's `receive_wait`).
    pub wait_ms: Option<u64>,
    pub visibility_ms: Option<u64>,
    pub max: usize,
    /// The reply's framing: None is version 1's single raw message (only with `max=1`).
    pub media: Option<Media>,
}

/// What `GET /consume` asks for.
#[derive(Debug, Clone)]
pub enum ConsumeRequest {
    Queue(ConsumeParams),
    Replay(super::replay::ReplayParams),
}

/// Parses `GET /consume?topic=T[&wait=D][&visibility=D][&max=N][&group=G]` or a replay
/// (`&partition=P&offset=O`).
pub fn parse(
    query: &Query,
    accept: Option<&str>,
    limits: &BatchLimits,
) -> OpResult<ConsumeRequest> {
    let topic = query.topic()?;
    let wait_ms = query.duration("wait", 0, MAX_WAIT_MS)?;
    let visibility_ms = query.duration("visibility", MIN_VISIBILITY_MS, MAX_VISIBILITY_MS)?;
    let partition = query.partition()?;
    let offset = query.number("offset", 0, u64::MAX)?;
    match (partition, offset) {
        (Some(partition), Some(offset)) => {
            Ok(ConsumeRequest::Replay(super::replay::ReplayParams {
                topic,
                partition,
                offset,
                wait_ms: wait_ms.unwrap_or(0),
            }))
        }
        (None, None) => {
            let group = query.group()?;
            let max = query
                .number("max", 1, limits.max_batch_records as u64)?
                .unwrap_or(1) as usize;
            let accepted = Media::accepted(accept);
            let media = match (max, accepted) {
                (1, None) => None,
                (_, Some(m)) => Some(m),
                (_, None) => Some(Media::Ndjson),
            };
            Ok(ConsumeRequest::Queue(ConsumeParams {
                topic,
                group,
                wait_ms,
                visibility_ms,
                max,
                media,
            }))
        }
        _ => Err(OpError::InvalidParameter(
            "replay needs both partition and offset".into(),
        )),
    }
}

/// The owner-side probe: lease up to `max` messages of (topic, group) from the partitions this core owns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Probe {
    pub topic: String,
    pub topic_id: u64,
    pub group: String,
    pub max: usize,
    /// Lease length (None: the topic's `visibility`).
    pub visibility_ms: Option<u64>,
    /// Cluster mode: the asking core (on another node) has consumers parked on (topic, group): the owner registers
    /// it for wake-ups before it looks, so nothing that becomes deliverable after the look is missed.
    #[serde(default)]
    pub waker: Option<crate::engine::placement::Location>,
    /// Payload bytes the reply may carry (what is left of the consume's `max_batch_bytes`), and whether the
    /// consume already has a message (if not, one message goes whatever its size): `partition::ByteBudget`.
    pub max_bytes: usize,
    pub taken_any: bool,
}

/// What a probe found.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Probed {
    pub deliveries: Vec<Delivery>,
    /// Every owned partition that had nothing to give was at its in-flight cap (and there was one).
    pub at_cap: bool,
    /// Some partition could not be served (its frontier or a record could not be read).
    pub unavailable: bool,
    /// Why, for the first such partition.
    pub why: Option<String>,
    /// This core owns no partition of the topic.
    pub none_owned: bool,
    /// The probe's byte budget ran out here: the asker asks no other owner this round.
    pub budget_spent: bool,
    /// Some partition that could not be served may be in this many ms (the soonest: a new leader waiting out its
    /// predecessor's lease): a consumer with time left waits for it rather than answering `503`.
    pub retry_in_ms: Option<u64>,
}

/// Leases on the owning core: the owned partitions in turn from a rotating start, until `max` are leased.
pub async fn apply(engine: &Rc<Engine>, req: Probe) -> OpResult<Probed> {
    let topic = engine.topic_of(&req.topic, req.topic_id)?;
    let config = topic.config();
    if !config.has_group(&req.group) {
        return Err(EngineError::GroupNotFound {
            topic: req.topic,
            group: req.group,
        }
        .into());
    }
    if let Some(from) = req.waker {
        engine.on_signal(crate::engine::Signal::Interest {
            topic: req.topic.clone(),
            group: req.group.clone(),
            from,
        });
    }
    let visibility_ms = req.visibility_ms.unwrap_or(config.visibility_ms);
    let owned = topic.owned();
    let mut probed = Probed {
        at_cap: !owned.is_empty(),
        none_owned: owned.is_empty(),
        ..Probed::default()
    };
    let now = engine.now_ms();
    // The partitions that may have something (kept by wake-ups), or all of them now and then.
    let (order, full) = topic.probe_order(&req.group, now);
    if !full && order.len() < owned.len() {
        // Those left out have nothing to deliver: not at their cap.
        probed.at_cap = false;
    }
    let mut budget = ByteBudget {
        left: req.max_bytes,
        taken_any: req.taken_any,
    };
    for p in order {
        if probed.deliveries.len() >= req.max || (budget.taken_any && budget.left == 0) {
            break;
        }
        let Some(partition) = topic.owned_partition(p) else {
            continue;
        };
        // Idle partitions are skipped without a take (a consume over many partitions touches the few with messages).
        match partition.idle(&req.group, now) {
            Some(false) => {
                probed.at_cap = false;
                topic.not_ready(&req.group, p);
                continue;
            }
            Some(true) => continue,
            None => {}
        }
        let want = req.max - probed.deliveries.len();
        let taken = partition
            .take_within(&req.group, want, &mut budget, visibility_ms)
            .await?;
        let spent = taken.stop == Some(Stop::Budget);
        if taken.deferred {
            // A delayed produce's time: the lease timer wakes parked consumers then.
            if let Some(at) = partition.next_wakeup_ms() {
                engine.note_deadline(at);
            }
        }
        match taken.stop {
            Some(Stop::AtCap) => {}
            Some(Stop::Unavailable) => {
                probed.unavailable = true;
                if probed.why.is_none() {
                    probed.why = taken.why.clone();
                }
                if let Some(ms) = taken.retry_in_ms {
                    probed.retry_in_ms = Some(probed.retry_in_ms.map_or(ms, |r| r.min(ms)));
                }
            }
            _ => probed.at_cap = false,
        }
        if probed.deliveries.is_empty() {
            // The first partition's deliveries are taken as they are (no second vector and copy).
            probed.deliveries = taken.deliveries;
        } else {
            probed.deliveries.extend(taken.deliveries);
        }
        if spent {
            probed.budget_spent = true;
            break;
        }
    }
    if !probed.deliveries.is_empty() {
        engine.note_deadline(engine.now_ms() + visibility_ms);
    }
    Ok(probed)
}

/// A probe's reply could not reach the consumer that asked (it went away): its leases are released at once rather
/// than staying invisible for their whole visibility.
pub async fn release(engine: &Rc<Engine>, topic: &str, group: &str, deliveries: Vec<Delivery>) {
    let leases = deliveries
        .iter()
        .map(|d| (d.partition, d.offset, d.nonce))
        .collect();
    give_back(
        engine,
        GiveBack {
            topic: topic.to_string(),
            group: group.to_string(),
            leases,
        },
    );
}

/// Leases of a probe whose reply never reached its consumer (a node RPC reply that came too late, or whose
/// connection closed), given back to the owner: deliverable again at once, not counted as a delivery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GiveBack {
    pub topic: String,
    pub group: String,
    /// (partition, offset, nonce) of each lease.
    pub leases: Vec<(u32, u64, u64)>,
}

impl GiveBack {
    /// The give-back for the leases in an undelivered probe reply, if it carries any.
    pub fn of(topic: String, group: String, deliveries: &[Delivery]) -> Option<GiveBack> {
        (!deliveries.is_empty()).then(|| GiveBack {
            topic,
            group,
            leases: deliveries
                .iter()
                .map(|d| (d.partition, d.offset, d.nonce))
                .collect(),
        })
    }
}

/// Gives leases back on their owner core (a lease already settled or re-leased is left alone: the nonce differs).
pub fn give_back(engine: &Rc<Engine>, req: GiveBack) {
    let Ok(t) = engine.topic(&req.topic) else {
        return;
    };
    for (partition, offset, nonce) in req.leases {
        if let Some(p) = t.owned_partition(partition) {
            p.give_back(&req.group, &[(offset, nonce)]);
        }
    }
}

// ---- The reply ----

/// The answer to a queue consume: `204` when nothing came; one delivery as its raw bytes with its receipt handle in
/// headers (no `Accept`, version 1); a batch as ndjson or length-prefixed frames (`Accept`).
pub fn render(media: Option<Media>, deliveries: Vec<Delivery>) -> Response {
    if deliveries.is_empty() {
        return Response::empty(204);
    }
    match media {
        None => single_delivery(deliveries),
        Some(Media::Frames) => frames_reply(&deliveries),
        Some(_) => ndjson_reply(&deliveries),
    }
}

fn single_delivery(deliveries: Vec<Delivery>) -> Response {
    let d = deliveries
        .into_iter()
        .next()
        .expect("a non-empty delivery list");
    let handle = ReceiptHandle::of(&d);
    let Delivery {
        partition,
        offset,
        delivery_count,
        payload,
        meta,
        ..
    } = d;
    let reply = Response::bytes(200, "application/octet-stream", payload)
        .with_header_decimals("receipt-handle", &handle.parts(), b':')
        .with_header_decimals("partition", &[u64::from(partition)], b':')
        .with_header_decimals("offset", &[offset], b':')
        .with_header_decimals("delivery-count", &[u64::from(delivery_count)], b':');
    with_meta(reply, &meta)
}

/// A single message's reply with its attributes, if it has any, in the `attributes` header (`ops::attributes`), and
/// its message group (FIFO topics) in the `group-key` header.
pub fn with_meta(reply: Response, meta: &Option<Box<RecordMeta>>) -> Response {
    let Some(m) = meta else {
        return reply;
    };
    let mut reply = reply;
    if !m.attributes.is_empty() {
        reply = reply.with_header("attributes", attributes::to_header(&m.attributes));
    }
    if let Some(group) = m
        .group_key
        .as_ref()
        .and_then(|g| std::str::from_utf8(g).ok())
    {
        reply = reply.with_header("group-key", group.to_string());
    }
    reply
}

/// `"attributes":{...},` when the delivery has attributes (the first of its JSON fields, in sorted order).
fn push_attributes(out: &mut Vec<u8>, d: &Delivery) {
    if let Some(m) = d.meta.as_ref().filter(|m| !m.attributes.is_empty()) {
        out.extend_from_slice(b"\"attributes\":");
        serde_json::to_writer(&mut *out, &attributes::to_value(&m.attributes))
            .expect("a JSON value serialises");
        out.push(b',');
    }
}

/// A delivery's JSON fields after the body's, written by hand (a `serde_json::Map` per delivery, a BTreeMap of four
/// owned keys, showed in the batched cycle's profile: docs/benchmark-history.md, "Design measurements"). The keys come in the order serde_json's map gives them
/// (sorted), so the bytes are those of the map; `delivery_fields_match_serde_json` checks that.
fn push_delivery_fields(out: &mut Vec<u8>, d: &Delivery) {
    use std::io::Write;
    let group = d.meta.as_ref().and_then(|m| m.group_key.as_ref());
    if let Some(group) = group.and_then(|g| std::str::from_utf8(g).ok()) {
        let _ = write!(
            out,
            "\"delivery_count\":{},\"group_key\":",
            d.delivery_count
        );
        serde_json::to_writer(&mut *out, group).expect("a string serialises");
        out.push(b',');
    } else {
        let _ = write!(out, "\"delivery_count\":{},", d.delivery_count);
    }
    let _ = write!(
        out,
        "\"offset\":{},\"partition\":{},\"receipt_handle\":\"{}\"}}",
        d.offset,
        d.partition,
        ReceiptHandle::of(d)
    );
}

/// `{"delivery_count":..,"offset":..,"partition":..,"receipt_handle":".."}`: a frame's header.
fn push_delivery_header(out: &mut Vec<u8>, d: &Delivery) {
    out.push(b'{');
    push_attributes(out, d);
    push_delivery_fields(out, d);
}

fn ndjson_reply(deliveries: &[Delivery]) -> Response {
    let mut out = Vec::with_capacity(deliveries.iter().map(|d| d.payload.len() + 128).sum());
    for d in deliveries {
        out.push(b'{');
        push_attributes(&mut out, d);
        match std::str::from_utf8(&d.payload) {
            Ok(text) => {
                out.extend_from_slice(b"\"body\":");
                serde_json::to_writer(&mut out, text).expect("a string serialises");
            }
            Err(_) => {
                out.extend_from_slice(b"\"body_base64\":\"");
                out.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(&d.payload)
                        .as_bytes(),
                );
                out.push(b'"');
            }
        }
        out.push(b',');
        push_delivery_fields(&mut out, d);
        out.push(b'\n');
    }
    Response::bytes(200, NDJSON, out.into())
}

fn frames_reply(deliveries: &[Delivery]) -> Response {
    let mut out = Vec::with_capacity(deliveries.iter().map(|d| d.payload.len() + 128).sum());
    for d in deliveries {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        push_delivery_header(&mut out, d);
        let header_len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&header_len.to_le_bytes());
        out.extend_from_slice(&(d.payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&d.payload);
    }
    Response::bytes(200, FRAMES, out.into())
}

#[cfg(test)]
mod reply_tests {
    use super::*;
    use serde_json::json;

    /// The hand-written delivery JSON is byte for byte what a serde_json map of the same fields gives.
    #[test]
    fn delivery_fields_match_serde_json() {
        use base64::Engine as _;
        let deliveries = [
            (0u32, 0u64, 1u64, 1u32, &b"hello"[..]),
            (
                7,
                u64::MAX,
                u64::MAX,
                u32::MAX,
                b"quote \" backslash \\ newline \n tab \t \x01 \xc3\xa9",
            ),
            (3, 42, 459798116743936001, 2, b"\xff\x00binary"),
            (1, 1, 1, 1, b""),
        ];
        for (partition, offset, nonce, delivery_count, payload) in deliveries {
            // A message group (FIFO topics) on some: graphic ASCII, quotes and backslashes included.
            let group = match partition {
                7 => Some("a\"b\\c"),
                3 => Some("customer-42"),
                _ => None,
            };
            let d = Delivery {
                meta: group.map(|g| {
                    Box::new(crate::storage::meta::RecordMeta {
                        group_key: Some(bytes::Bytes::from(g.to_string())),
                        ..Default::default()
                    })
                }),
                partition,
                offset,
                nonce,
                delivery_count,
                expires_at_ms: 0,
                sent_ms: 0,
                payload: bytes::Bytes::copy_from_slice(payload),
            };
            let mut m = serde_json::Map::new();
            m.insert("partition".into(), json!(partition));
            m.insert("offset".into(), json!(offset));
            m.insert(
                "receipt_handle".into(),
                json!(format!("{partition}:{offset}:{nonce}")),
            );
            m.insert("delivery_count".into(), json!(delivery_count));
            if let Some(g) = group {
                m.insert("group_key".into(), json!(g));
            }
            let mut header = Vec::new();
            push_delivery_header(&mut header, &d);
            assert_eq!(
                String::from_utf8(header).unwrap(),
                serde_json::to_string(&m).unwrap()
            );
            match std::str::from_utf8(payload) {
                Ok(text) => m.insert("body".into(), json!(text)),
                Err(_) => m.insert(
                    "body_base64".into(),
                    json!(base64::engine::general_purpose::STANDARD.encode(payload)),
                ),
            };
            let line = ndjson_reply(std::slice::from_ref(&d)).body;
            assert_eq!(
                String::from_utf8(line.to_vec()).unwrap(),
                serde_json::to_string(&m).unwrap() + "\n"
            );
        }
    }
}
