//! Replicate: a partition's leader ships each batch it made durable to the partition's followers (node RPC only,
//! no HTTP route; `docs/replication.md`, step 2). The follower core that holds the replica writes it at the very
//! place the leader did, through its own journal (`Log::apply_shipped`), and answers its log's end: the leader
//! counts the batch as on that replica, or resends from that end.
//!
//! Read in order: `front/replicate.rs` (the leader's shipper: what it sends, to whom, and what it does with the
//! answer), `validate::admit` (a peer may only ship as the leader it is), then `apply` here on the follower.
//!
//! The consumer groups' frontiers travel beside the batches: each frontier the leader made durable (a moved
//! frontier the core's flush journaled, or a group's start) goes to the followers as a [`ReplicateFrontiers`]
//! request, which the follower records in its own journal and frontier files (`apply_frontiers`,
//! `Partition::follow_frontiers`), so that a replica that becomes leader knows what its groups settled.

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

/// The frontiers of consumer groups on a partition, as its leader made them durable (`docs/replication.md`, step
/// 3): the follower records each in its journal and frontier file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicateFrontiers {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    /// The node that leads the partition (the sender: `validate::admit` holds a peer to it).
    pub leader: NodeIndex,
    /// At most [`MAX_FRONTIER_MARKS`], one per group, in ascending order of group name.
    pub marks: Vec<FrontierMark>,
}

/// One group's frontier: every offset below `committed` is settled; with `start`, the group was (re)created there
/// and the value replaces whatever a group of that name had before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontierMark {
    pub group: String,
    pub committed: u64,
    pub start: bool,
}

/// Most marks in one `ReplicateFrontiers` (a topic has at most `MAX_GROUPS_LIMIT` groups; a leader sends more in
/// several requests).
pub const MAX_FRONTIER_MARKS: usize = crate::engine::topic::MAX_GROUPS_LIMIT;

/// Records a leader's frontiers on the core holding this node's follower replica of their partition. Records of a
/// group this replica does not know are passed over, unless they start it.
pub async fn apply_frontiers(engine: &Rc<Engine>, r: ReplicateFrontiers) -> OpResult<()> {
    let partition = followed(engine, &r.topic, r.topic_id, r.partition, r.leader)?;
    let max_groups = engine.topic(&r.topic)?.config().max_groups;
    partition
        .follow_frontiers(&r.marks, max_groups)
        .await
        .map_err(OpError::from)
}

/// This core's follower replica of a partition led by `leader`, or why there is none.
fn followed(
    engine: &Rc<Engine>,
    topic_name: &str,
    topic_id: u64,
    p: u32,
    leader: NodeIndex,
) -> OpResult<Rc<crate::partition::Partition>> {
    let topic = engine.topic(topic_name)?;
    if topic.id() != topic_id {
        return Err(OpError::Engine(crate::engine::EngineError::TopicNotFound(
            topic_name.to_string(),
        )));
    }
    if p >= topic.partition_count() || topic.location(p).node != leader {
        return Err(OpError::PartitionUnavailable(format!(
            "node {leader} does not lead partition {p} of '{topic_name}' as this node knows it"
        )));
    }
    topic.followed_partition(p).ok_or_else(|| {
        OpError::PartitionUnavailable(format!(
            "core {} holds no replica of partition {p} of '{topic_name}'",
            engine.id()
        ))
    })
}

/// Applies a shipped batch on the core holding this node's follower replica of its partition.
pub async fn apply(engine: &Rc<Engine>, r: Replicate) -> OpResult<Replicated> {
    let partition = followed(engine, &r.topic, r.topic_id, r.partition, r.leader)?;
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
