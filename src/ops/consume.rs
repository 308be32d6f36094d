//! Consume: `GET /consume`. The client's request (queue style with `wait`, `visibility`, `max`, `group`; or a replay
//! with `partition` and `offset`, see `ops::replay`), and the owner-side probe: lease up to `max` messages from the
//! partitions of a topic this core owns, in one pass per partition's lease shard.

use super::error::{OpError, OpResult};
use super::params::{BatchLimits, Media, Query};
use crate::engine::topic::{MAX_VISIBILITY_MS, MIN_VISIBILITY_MS};
use crate::engine::{Engine, EngineError};
use crate::partition::{ByteBudget, Delivery, Stop};
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Longest long-poll a consume may ask for (docs/api.md: 0 to 60 s).
pub const MAX_WAIT_MS: u64 = 60_000;

/// A queue-style consume as the client sent it.
#[derive(Debug, Clone)]
pub struct ConsumeParams {
    pub topic: String,
    pub group: String,
    pub wait_ms: u64,
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
    let wait_ms = query.duration("wait", 0, MAX_WAIT_MS)?.unwrap_or(0);
    let visibility_ms = query.duration("visibility", MIN_VISIBILITY_MS, MAX_VISIBILITY_MS)?;
    let partition = query.partition()?;
    let offset = query.number("offset", 0, u64::MAX)?;
    match (partition, offset) {
        (Some(partition), Some(offset)) => {
            Ok(ConsumeRequest::Replay(super::replay::ReplayParams {
                topic,
                partition,
                offset,
                wait_ms,
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
    /// This core owns no partition of the topic.
    pub none_owned: bool,
    /// The probe's byte budget ran out here: the asker asks no other owner this round.
    pub budget_spent: bool,
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
        match taken.stop {
            Some(Stop::AtCap) => {}
            Some(Stop::Unavailable) => probed.unavailable = true,
            _ => probed.at_cap = false,
        }
        probed.deliveries.extend(taken.deliveries);
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
