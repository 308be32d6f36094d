//! Settle: `POST /ack`, `/nack`, `/extend`. The client's request (one `receipt_handle` in the query, or a
//! `text/plain` body of handles, one per line); the owner-side request that settles one partition's handles in one
//! pass over its lease shard (an ack batch advances the frontier once); and the per-handle results.
//!
//! Read in order: `parse` (handles as `ops::receipt::ReceiptHandle`), then `front/settle.rs` (handles split by
//! partition, one `Settle` per owner), `apply` here on the owner, and `render` (a single settle's empty `200`, a
//! batch's per-handle results). Route: `http/routes.rs`.

use super::error::{OpError, OpResult};
use super::params::{BatchLimits, Query};
use super::receipt::ReceiptHandle;
use super::response::{json_reply, Response};
use super::status::status_of;
use crate::engine::topic::{MAX_DELAY_MS, MAX_VISIBILITY_MS, MIN_VISIBILITY_MS};
use crate::engine::Engine;
use crate::partition::{PartitionError, SettleOp};
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Which settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Ack,
    Nack,
    Extend,
}

/// A receipt handle as sent, and its (partition, offset, nonce), or why it is not one.
pub type ParsedHandle = (String, Result<ReceiptHandle, OpError>);

/// A settle as the client sent it.
#[derive(Debug, Clone)]
pub struct SettleParams {
    pub topic: String,
    pub group: String,
    pub op: SettleOp,
    /// Each handle as sent, parsed.
    pub handles: Vec<ParsedHandle>,
    /// Sent as a batch (reply `{"results": [...]}`), else a version 1 single settle.
    pub batch: bool,
}

/// Parses `POST /{ack,nack,extend}?topic=T[&receipt_handle=H][&visibility=D][&delay=D][&group=G]` and, without
/// `receipt_handle`, the `text/plain` body of handles.
pub fn parse(
    verb: Verb,
    query: &Query,
    body: &[u8],
    limits: &BatchLimits,
) -> OpResult<SettleParams> {
    let topic = query.topic()?;
    let group = query.group()?;
    let single = query.get("receipt_handle");
    let single = single.as_deref();
    let handles: Vec<ParsedHandle> = match single {
        // A single handle's text is not kept: only a batch's answer names its handles (`http::routes::settle`).
        Some(text) => vec![(String::new(), handle(text))],
        None => {
            let too_many = || {
                OpError::BatchTooLarge(format!(
                    "the batch holds more than {} receipt handles (max_batch_records)",
                    limits.max_batch_records
                ))
            };
            // Counted as they are cut, before anything else is done with them: a body of a million handles is
            // refused after max_batch_records + 1 lines, not after all of them were copied and parsed.
            let mut lines: Vec<&[u8]> = Vec::new();
            for line in body.split(|&b| b == b'\n') {
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                if lines.len() == limits.max_batch_records {
                    return Err(too_many());
                }
                lines.push(line);
            }
            if lines.is_empty() {
                // No handle at all: version 1's answer for a missing receipt_handle.
                return Err(OpError::InvalidReceiptHandle(String::new()));
            }
            let mut handles = Vec::with_capacity(lines.len());
            for line in lines {
                let text = std::str::from_utf8(line).map_err(|_| {
                    OpError::InvalidRecord("the body of receipt handles is not UTF-8 text".into())
                })?;
                handles.push((text.to_string(), handle(text)));
            }
            handles
        }
    };
    if let (Some(_), Some((_, Err(e)))) = (single, handles.first()) {
        return Err(e.clone());
    }
    let op = match verb {
        Verb::Ack => SettleOp::Ack,
        Verb::Nack => SettleOp::Nack(query.duration("delay", 0, MAX_DELAY_MS)?),
        Verb::Extend => {
            SettleOp::Extend(query.duration("visibility", MIN_VISIBILITY_MS, MAX_VISIBILITY_MS)?)
        }
    };
    Ok(SettleParams {
        topic,
        group,
        op,
        handles,
        batch: single.is_none(),
    })
}

fn handle(text: &str) -> Result<ReceiptHandle, OpError> {
    ReceiptHandle::parse(text)
        .ok_or_else(|| OpError::InvalidReceiptHandle(text.chars().take(100).collect()))
}

/// The owner-side request: settle these (offset, nonce) leases of one partition.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settle {
    pub topic: String,
    pub topic_id: u64,
    pub group: String,
    pub partition: u32,
    pub items: Vec<(u64, u64)>,
    pub op: SettleOp,
    /// The records are already in the dead-letter topic: ack and count them as dead-lettered.
    pub dead_lettered: bool,
}

/// One result per item, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settled {
    pub results: Vec<Result<(), PartitionError>>,
}

/// Settles on the owning core.
pub async fn apply(engine: &Rc<Engine>, req: Settle) -> OpResult<Settled> {
    let topic = engine.topic_of(&req.topic, req.topic_id)?;
    let partition = engine.partition(&topic, req.partition as u64)?;
    if !topic.config().has_group(&req.group) {
        // A handle names a group's lease: in a group that does not exist, no lease matches.
        return Ok(Settled {
            results: vec![Err(PartitionError::LeaseGone); req.items.len()],
        });
    }
    let results = if req.dead_lettered {
        let mut results = Vec::with_capacity(req.items.len());
        for &(offset, nonce) in &req.items {
            results.push(partition.dead_lettered(&req.group, offset, nonce).await);
        }
        results
    } else {
        partition.settle(&req.group, &req.items, req.op).await?
    };
    if let Some(at) = partition.next_wakeup_ms() {
        engine.note_deadline(at);
    }
    Ok(Settled { results })
}

// ---- The reply ----

/// The answer to a settle: a single one's empty `200` (or its error); a batch's `{"results":[...]}`, one entry per
/// handle in request order with its status and, if it failed, its error code and message. `handles` are the
/// handles' text as sent (a batch's only).
pub fn render(batch: bool, handles: &[String], results: Vec<OpResult<()>>) -> OpResult<Response> {
    if !batch {
        results
            .into_iter()
            .next()
            .expect("a single settle has one result")?;
        return Ok(Response::empty(200));
    }
    let results: Vec<SettleResult> = handles
        .iter()
        .zip(results.iter())
        .map(|(h, r)| match r {
            Ok(()) => SettleResult {
                error: None,
                message: None,
                receipt_handle: h,
                status: 200,
            },
            Err(e) => {
                let (status, code) = status_of(e);
                SettleResult {
                    error: Some(code),
                    message: Some(e.to_string()),
                    receipt_handle: h,
                    status,
                }
            }
        })
        .collect();
    Ok(json_reply(&SettleResults { results }))
}

/// One handle's result in a batch settle's answer. Fields in the order a `serde_json` map would give them (sorted):
/// the answer's bytes are what they were when it was built as a map per handle, at a fraction of the cost.
#[derive(serde::Serialize)]
struct SettleResult<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    receipt_handle: &'a str,
    status: u16,
}

#[derive(serde::Serialize)]
struct SettleResults<'a> {
    results: Vec<SettleResult<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BatchLimits = BatchLimits {
        max_batch_records: 2,
        max_batch_bytes: 1 << 20,
        max_message_bytes: 1 << 20,
    };

    fn query(q: &str) -> Query {
        Query::new(q)
    }

    #[test]
    fn a_batch_keeps_bad_lines_as_per_handle_errors_and_a_single_bad_handle_is_400() {
        let p = parse(Verb::Ack, &query("topic=t"), b"0:1:2\n\nnope\n", &LIMITS).unwrap();
        assert!(p.batch);
        assert_eq!(
            p.handles[0].1,
            Ok(ReceiptHandle {
                partition: 0,
                offset: 1,
                nonce: 2
            })
        );
        assert!(matches!(
            p.handles[1].1,
            Err(OpError::InvalidReceiptHandle(_))
        ));
        assert!(matches!(
            parse(Verb::Ack, &query("topic=t&receipt_handle=x"), b"", &LIMITS),
            Err(OpError::InvalidReceiptHandle(_))
        ));
        assert!(matches!(
            parse(
                Verb::Ack,
                &query("topic=t"),
                b"1:1:1\n2:2:2\n3:3:3",
                &LIMITS
            ),
            Err(OpError::BatchTooLarge(_))
        ));
        assert!(matches!(
            parse(Verb::Ack, &query("topic=t"), b"", &LIMITS),
            Err(OpError::InvalidReceiptHandle(_))
        ));
    }

    /// A body of more handles than max_batch_records is refused as soon as the line past the limit is cut: what
    /// follows (here bytes that are not even text) is never looked at, so a 16 MiB body costs no more than a full one.
    #[test]
    fn a_batch_over_the_limit_is_refused_before_the_rest_of_its_body_is_read() {
        let mut body = b"1:1:1\r\n2:2:2\n3:3:3\n".to_vec();
        body.extend(std::iter::repeat_n(0xffu8, 1 << 20));
        assert!(matches!(
            parse(Verb::Ack, &query("topic=t"), &body, &LIMITS),
            Err(OpError::BatchTooLarge(_))
        ));
        // Within the limit, a line that is not text still fails the whole request, and CRLF lines are trimmed.
        assert!(matches!(
            parse(Verb::Ack, &query("topic=t"), b"1:1:1\n\xff\n", &LIMITS),
            Err(OpError::InvalidRecord(_))
        ));
        let p = parse(
            Verb::Ack,
            &query("topic=t"),
            b" 1:1:1\r\n\r\n2:2:2\r\n",
            &LIMITS,
        )
        .unwrap();
        assert_eq!(
            p.handles[0].1,
            Ok(ReceiptHandle {
                partition: 1,
                offset: 1,
                nonce: 1
            })
        );
        assert_eq!(
            p.handles[1].1,
            Ok(ReceiptHandle {
                partition: 2,
                offset: 2,
                nonce: 2
            })
        );
    }

    #[test]
    fn nack_takes_a_delay_and_extend_a_visibility() {
        let p = parse(
            Verb::Nack,
            &query("topic=t&receipt_handle=0:0:1&delay=5s"),
            b"",
            &LIMITS,
        )
        .unwrap();
        assert_eq!(p.op, SettleOp::Nack(Some(5000)));
        let p = parse(
            Verb::Extend,
            &query("topic=t&receipt_handle=0:0:1"),
            b"",
            &LIMITS,
        )
        .unwrap();
        assert_eq!(p.op, SettleOp::Extend(None));
        assert!(matches!(
            parse(
                Verb::Nack,
                &query("topic=t&receipt_handle=0:0:1&delay=13h"),
                b"",
                &LIMITS
            ),
            Err(OpError::InvalidDuration(_))
        ));
    }
}

#[cfg(test)]
mod reply_tests {
    use super::*;
    use serde_json::json;

    /// A batch settle's answer is byte for byte what the map-per-handle `json!` form gave.
    #[test]
    fn settle_results_match_serde_json_maps() {
        let results = vec![
            SettleResult {
                error: None,
                message: None,
                receipt_handle: "0:1:2",
                status: 200,
            },
            SettleResult {
                error: Some("invalid_receipt_handle"),
                message: Some("bad \"handle\"".into()),
                receipt_handle: "x\\y",
                status: 400,
            },
        ];
        let want = json!({"results": [
            {"receipt_handle": "0:1:2", "status": 200},
            {"receipt_handle": "x\\y", "status": 400, "error": "invalid_receipt_handle", "message": "bad \"handle\""},
        ]});
        assert_eq!(
            serde_json::to_string(&SettleResults { results }).unwrap(),
            want.to_string()
        );
    }
}
