//! Replay: `GET /consume?topic=T&partition=P&offset=O[&wait=D]`. A read at the partition's owner that touches no
//! lease, nonce or frontier; waits up to `wait` for an offset not written yet.
//!
//! Read in order: `ops::consume::parse` (a consume with `offset`), `front/consume.rs` (`Front::replay`: one owner),
//! `apply` here, `render`. Route: `http/routes.rs`.

use super::error::OpResult;
use super::response::Response;
use crate::engine::Engine;
use crate::storage::log::Record;
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// A replay as the client sent it.
#[derive(Debug, Clone)]
pub struct ReplayParams {
    pub topic: String,
    pub partition: u64,
    pub offset: u64,
    pub wait_ms: u64,
}

/// The owner-side request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Replay {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub offset: u64,
    pub wait_ms: u64,
}

/// The record (None: not written within `wait`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Replayed {
    pub record: Option<Record>,
}

/// Reads on the owning core, long-polling up to `wait_ms` for an offset at the end.
pub async fn apply(engine: &Rc<Engine>, req: Replay) -> OpResult<Replayed> {
    let topic = engine.topic_of(&req.topic, req.topic_id)?;
    let partition = engine.partition(&topic, req.partition as u64)?;
    let clock = engine.clock().clone();
    // Rounded up from the microsecond clock: an empty long poll never answers before its full wait.
    let deadline = (clock.now_us() + req.wait_ms * 1000).div_ceil(1000);
    loop {
        // (A replicated partition's records become readable when committed, not when appended.)
        let appended = partition.listen_readable();
        if let Some(record) = partition.replay(req.offset).await? {
            return Ok(Replayed {
                record: Some(record),
            });
        }
        let stop = engine.listen_stop();
        if clock.now_ms() >= deadline || engine.is_stopping() || topic.is_deleted() {
            return Ok(Replayed { record: None });
        }
        futures_lite::future::or(
            futures_lite::future::or(appended, stop),
            clock.sleep_until(deadline),
        )
        .await;
    }
}

// ---- The reply ----

/// The answer to a replay: the record's bytes with its partition and offset in headers, or `204` past the end.
pub fn render(partition: u64, record: Option<Record>) -> Response {
    let Some(record) = record else {
        return Response::empty(204);
    };
    let reply = Response::bytes(200, "application/octet-stream", record.payload)
        .with_header("partition", partition)
        .with_header("offset", record.offset);
    super::consume::with_meta(reply, &record.meta)
}
