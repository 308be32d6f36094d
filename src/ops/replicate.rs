//! Replicate: a partition's leader ships each batch it made durable to the partition's followers (node RPC only,
//! no HTTP route; `docs/replication.md`, step 2). The follower core that holds the replica writes it at the very
//! place the leader did, through its own journal (`Log::apply_shipped`), and answers its log's end: the leader
//! counts the batch as on that replica, or resends from that end.
//!
//! Read in order: `front/replicate.rs` (the leader's shipper: what it sends, to whom, and what it does with the
//! answer), `validate::admit` (a peer may only ship as the leader it is), then `apply` here on the follower.

use super::error::{OpError, OpResult};
use crate::engine::placement::NodeIndex;
use crate::engine::Engine;
use crate::storage::journal::EntryHead;
use crate::storage::log::FollowError;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// One durable batch of a partition, as its leader wrote it; or, with no records and no frames, a probe for the
/// follower's end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Replicate {
    pub topic: String,
    /// The topic's id: a batch that crossed a delete and re-create is refused.
    pub topic_id: u64,
    pub partition: u32,
    /// The node that leads the partition (the sender: `validate::admit` holds a peer to it).
    pub leader: NodeIndex,
    /// The segment (its base offset) and the byte position of the first frame in it.
    pub segment_base: u64,
    pub position: u64,
    /// Offsets of the frames.
    pub first_offset: u64,
    pub count: u32,
    /// The frames, exactly as the leader's segment holds them.
    pub frames: Bytes,
}

/// The follower's answer: its log's end after the request, and whether the batch was applied (`false`: it did not
/// start at that end, and the leader resends from there, unless `refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicated {
    pub end: u64,
    pub applied: bool,
    /// The batch itself was refused (it does not continue this replica's log where it claims to, or its frames do
    /// not verify under this node's limits): sending it again cannot help.
    pub refused: bool,
}

impl Replicate {
    pub fn head(&self) -> EntryHead {
        EntryHead {
            topic: self.topic.clone(),
            topic_id: self.topic_id,
            partition: self.partition,
            segment_base: self.segment_base,
            position: self.position,
            first_offset: self.first_offset,
            count: self.count,
        }
    }
}

/// Applies a shipped batch on the core holding this node's follower replica of its partition.
pub async fn apply(engine: &Rc<Engine>, r: Replicate) -> OpResult<Replicated> {
    let topic = engine.topic(&r.topic)?;
    if topic.id() != r.topic_id {
        return Err(OpError::Engine(crate::engine::EngineError::TopicNotFound(
            r.topic.clone(),
        )));
    }
    if r.partition >= topic.partition_count() || topic.location(r.partition).node != r.leader {
        return Err(OpError::PartitionUnavailable(format!(
            "node {} does not lead partition {} of '{}' as this node knows it",
            r.leader, r.partition, r.topic
        )));
    }
    let Some(partition) = topic.followed_partition(r.partition) else {
        return Err(OpError::PartitionUnavailable(format!(
            "core {} holds no replica of partition {} of '{}'",
            engine.id(),
            r.partition,
            r.topic
        )));
    };
    let log = &partition.log;
    if r.count == 0 {
        // A probe (the leader opened the partition): where this replica's log ends.
        return Ok(Replicated {
            end: log.end_offset(),
            applied: false,
            refused: false,
        });
    }
    match log.apply_shipped(&r.head(), &r.frames).await {
        Ok(()) => Ok(Replicated {
            end: log.end_offset(),
            applied: true,
            refused: false,
        }),
        Err(FollowError::Gap { end }) => Ok(Replicated {
            end,
            applied: false,
            refused: false,
        }),
        Err(FollowError::Mismatch(why)) => {
            tracing::warn!(topic = %r.topic, partition = r.partition, leader = r.leader, why, "a shipped batch does not continue this replica: refused");
            Ok(Replicated {
                end: log.end_offset(),
                applied: false,
                refused: true,
            })
        }
        Err(FollowError::Append(e)) => Err(crate::partition::PartitionError::from(e).into()),
        Err(FollowError::Busy) => Err(OpError::Engine(crate::engine::EngineError::Overloaded)),
    }
}
