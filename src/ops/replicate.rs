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
use crate::storage::epoch_history::EpochStart;
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
    /// The epoch of its leadership, as the leader's metadata has it: a follower whose metadata names a higher one
    /// refuses the request (`stale_epoch`), one whose metadata is behind answers `partition_unavailable` until it
    /// catches up.
    pub epoch: u64,
    /// The segment (its base offset) and the byte position of the first frame in it.
    pub segment_base: u64,
    pub position: u64,
    /// Offsets of the frames.
    pub first_offset: u64,
    pub count: u32,
    /// The frames, exactly as the leader's segment holds them.
    pub frames: Bytes,
    /// The leader's epoch history entries for these records (`EpochHistory::covering` up to and including the
    /// batch's end: the one covering `first_offset` and each starting inside the batch or right after it; empty for
    /// records from before the history): the follower adds those it lacks before it writes the batch. A probe
    /// carries the leader's entry for its own epoch (none before it has one). At most [`MAX_EPOCH_ENTRIES`].
    pub epochs: Vec<EpochStart>,
    /// Every record the leader could have acknowledged lies below it (the greater of its log's end when its stream
    /// began and its commit offset): a learner whose log reaches it holds them all.
    pub hold: u64,
    /// The leader has sent this replica its groups' frontiers since it learned the replica is a learner: a learner
    /// that holds `hold` promotes itself.
    pub promote: bool,
    /// The leader's nonce ceiling (`partition/nonces.rs`; 0: none yet), promised durably by the replica before it
    /// answers, so that a replica added since the leader's round holds it before it counts in the next one.
    pub nonces: u64,
    /// A probe at the leader's log start (`first_offset`), sent to a follower whose log ends below it (retention
    /// removed the records between on the leader): the follower's log starts anew there, empty
    /// (`Partition::start_anew_at`), with the leader's history up to it, and the leader's sealed segments then its
    /// stream fill it (`docs/replication.md`, step 5). Only with a probe.
    pub restart: bool,
}

/// Most epoch entries one shipped batch carries (a history holds no more).
pub const MAX_EPOCH_ENTRIES: usize = crate::storage::epoch_history::MAX_ENTRIES;

/// The follower's answer: its log's end after the request, and whether the batch was applied (`false`: it did not
/// start at that end, and the leader resends from there, unless `refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicated {
    pub end: u64,
    pub applied: bool,
    /// The batch itself was refused (it does not continue this replica's log where it claims to, or its frames do
    /// not verify under this node's limits): sending it again cannot help.
    pub refused: bool,
    /// This replica is a learner (`storage::learner`), after the request: its leader sends it its groups'
    /// frontiers, then asks it to promote itself.
    pub learner: bool,
    /// This replica's log refuses appends until its node restarts (a refused sync there): it counts in no fencing
    /// round, and its leader hands it no leadership (`front/quorum.rs`).
    pub poisoned: bool,
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
    /// The epoch of its leadership, checked as a [`Replicate`]'s.
    pub epoch: u64,
    /// At most [`MAX_FRONTIER_MARKS`], one per group, in ascending order of group name.
    pub marks: Vec<FrontierMark>,
}

/// One group's frontier: every offset below `committed` is settled; with `start`, the group was (re)created there
/// and the value replaces whatever a group of that name had before, unless the replica holds the same incarnation
/// of the group (`group_id`): then it only raises the value, as any other mark does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontierMark {
    pub group: String,
    pub committed: u64,
    pub start: bool,
    /// The group's id in the sender's topic settings (`TopicConfig::group_ids`; 0: none). A leader sends every
    /// group's durable frontier as a start when it begins to lead (a replica may have missed the group's start, or
    /// hold a deleted group's value); one that holds this very group keeps a higher value it has (from an older
    /// leadership), so the frontier a majority holds never moves back (found by the node simulation, seeds 1471
    /// and 4395).
    pub group_id: u64,
    /// Offsets settled above `committed` (acknowledged ahead of the frontier), as ranges in canonical form
    /// (`storage::frontier::FrontierValue`): a replica that comes to lead does not deliver them again.
    pub acked: Vec<(u64, u64)>,
}

impl FrontierMark {
    /// The value it carries.
    pub fn value(&self) -> crate::storage::frontier::FrontierValue {
        crate::storage::frontier::FrontierValue {
            committed: self.committed,
            acked: self.acked.clone(),
        }
    }
}

/// Most marks in one `ReplicateFrontiers` (a topic has at most `MAX_GROUPS_LIMIT` groups; a leader sends more in
/// several requests).
pub const MAX_FRONTIER_MARKS: usize = crate::engine::topic::MAX_GROUPS_LIMIT;

/// Most bytes of marks in one `ReplicateFrontiers` or `Began` (an eighth of a node RPC frame's 64 MiB): a mark's
/// acked ranges take 16 bytes each (up to `MAX_RANGES` per group), so many groups each with many may not all fit.
pub const MAX_FRONTIER_BYTES: usize = 8 << 20;

impl FrontierMark {
    /// Bytes it takes in a message, about (its name, fixed fields and ranges).
    pub fn size(&self) -> usize {
        48 + self.group.len() + 16 * self.acked.len()
    }
}

/// Keeps `marks` within [`MAX_FRONTIER_BYTES`]: the marks past the budget go without their acked ranges (their
/// frontiers still go; what those acks settled is delivered again after a failover, duplicates only).
pub fn fit_marks(marks: &mut [FrontierMark]) {
    let mut used = 0usize;
    for m in marks {
        if used + m.size() > MAX_FRONTIER_BYTES {
            m.acked.clear();
        }
        used += m.size();
    }
}

/// A new leader's fencing round (`docs/replication.md` §4, step 2; step 4): sent by the node that became the
/// partition's leader at `epoch` to each replica, before it serves. The replica raises its durable epoch floor to
/// `epoch` (from then on it answers no request of an older leadership: `stale_epoch`), and, if it is the old leader
/// itself, is deposed; it answers where its log stands, so that the new leader can take the greatest log among a
/// majority.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BeginEpoch {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    /// The new leader (the sender: `validate::admit` holds a peer to it).
    pub leader: NodeIndex,
    pub epoch: u64,
    /// The nonce ceiling the replica promises this leadership (`storage/epoch_floor.rs`): durable before it
    /// answers. The leader issues receipt-handle nonces only below a ceiling a majority promised (0: none asked).
    pub nonces: u64,
}

/// A replica's answer to [`BeginEpoch`]: its log's end and the newest epoch its history places at or below that end
/// (`Partition::rank`; 0 when it has none), by which a fencing round ranks replicas (a later epoch first, then a
/// longer log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Began {
    pub end: u64,
    pub last_epoch: u64,
    /// Each consumer group's durable frontier on this replica (at most [`MAX_FRONTIER_MARKS`], never starts): the
    /// round's winner raises its own groups to the highest of a majority before it serves, so what was settled
    /// on a majority is not delivered again after a failover.
    pub frontiers: Vec<FrontierMark>,
    /// It is a learner (`storage::learner`): the round neither counts nor ranks it.
    pub learner: bool,
    /// The highest nonce ceiling it promised to older leaderships (`epoch_floor::Fence::promised_below`): the new
    /// leader's nonces start above the highest a majority answered.
    pub nonces: u64,
    /// Its epoch floor before this round's request raised it: a round whose winner led the epoch before and finds
    /// every floor of its answers at or below it knows no other leadership served in between, and need not wait out
    /// a predecessor's lease (`partition/lease.rs`).
    pub floor: u64,
}

/// Core 0 (internal, never from a peer): a replica that ran a fencing round found another replica's log greater than
/// its own, and hands it the leadership: the partition key names `leader` at a new epoch, if the partition is still
/// at `epoch` (`Metastore::set_partition`). A leader moving a drained node's replica (`front::mover`) sends it too,
/// with the partition's new replica set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MoveLeader {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub epoch: u64,
    pub leader: NodeIndex,
    /// The new replica set, `leader` among them (empty: the replica set and its learners stay as they are).
    pub replicas: Vec<NodeIndex>,
    /// With a new replica set: those of them that do not vote yet.
    pub learners: Vec<NodeIndex>,
}

/// Fences this node's replica of a partition at a new leader's epoch (`BeginEpoch`), on the core holding it: its
/// follower replica, or the partition it leads (then deposed). Below the replica's floor or its metadata's epoch:
/// `stale_epoch`. Above it: `partition_unavailable` until this node's metadata has the epoch (its metastore watch
/// brings it), and only from the leader the metadata names at it.
pub async fn begin_epoch(engine: &Rc<Engine>, r: BeginEpoch) -> OpResult<Began> {
    let topic = engine.topic(&r.topic)?;
    if topic.id() != r.topic_id {
        return Err(OpError::Engine(crate::engine::EngineError::TopicNotFound(
            r.topic.clone(),
        )));
    }
    let p = r.partition;
    // Only a replica of the partition may begin an epoch on it (a peer that is not one cannot fence it). A replica
    // is trusted with the epoch it names: checking it against etcd comes with the round's sender.
    if !topic.replicas_of(p).contains(&r.leader) {
        return Err(OpError::InvalidParameter(format!(
            "node {} holds no replica of partition {p} of '{}'",
            r.leader, r.topic
        )));
    }
    let (partition, led) = match (topic.followed_partition(p), topic.owned_partition(p)) {
        (Some(f), _) => (f, false),
        (None, Some(o)) if !topic.followers(p).is_empty() => (o, true),
        _ => {
            return Err(OpError::PartitionUnavailable(format!(
                "core {} holds no replica of partition {p} of '{}'",
                engine.id(),
                r.topic
            )))
        }
    };
    let known = topic.epoch(p).max(partition.epoch_floor());
    if r.epoch < known || (led && r.epoch == topic.epoch(p)) {
        return Err(crate::partition::PartitionError::StaleEpoch {
            epoch: r.epoch,
            known,
        }
        .into());
    }
    // Only at an epoch the metastore made, naming the sender: a replica cannot fence the partition at an epoch of
    // its choosing (one far ahead would leave every later leader `stale_epoch` for good). Until this node's view
    // has it (the metastore watch brings the partition key the election wrote, in milliseconds), the round is
    // answered `partition_unavailable` and runs again.
    if r.epoch > topic.epoch(p) {
        return Err(OpError::PartitionUnavailable(format!(
            "partition {p} of '{}' is at epoch {} here, not yet {}",
            r.topic,
            topic.epoch(p),
            r.epoch
        )));
    }
    if topic.location(p).node != r.leader {
        return Err(OpError::InvalidParameter(format!(
            "node {} does not lead partition {p} of '{}' at epoch {}",
            r.leader, r.topic, r.epoch
        )));
    }
    if led {
        // Deposed first: nothing it appends, leases or commits from here on.
        partition.depose(r.epoch);
    }
    let floor = partition.epoch_floor();
    partition.raise_fence(r.epoch, r.nonces).await?;
    if partition.epoch_floor() > r.epoch {
        // A newer leadership's round took the write first: this one's promise was not made, and it is over.
        return Err(crate::partition::PartitionError::StaleEpoch {
            epoch: r.epoch,
            known: partition.epoch_floor(),
        }
        .into());
    }
    // A history write of an older leadership under way lands first (none starts from here on: its floor is
    // checked at its turn), so the rank answered is the one this replica keeps.
    partition.wait_history_written().await;
    // As a recording of an older leadership's frontiers under way: its marks are in the answer.
    partition.wait_frontiers_followed().await;
    // The newest epoch its history places at or below its log's end (entries past the end, taken for a batch still
    // queued or whose write a power cut took, claim nothing): `Partition::rank`.
    let (last_epoch, end) = partition.rank();
    let frontiers = partition
        .durable_frontiers()
        .into_iter()
        .take(MAX_FRONTIER_MARKS)
        .map(|r| FrontierMark {
            group: r.group,
            committed: r.committed,
            start: false,
            group_id: 0,
            acked: r.acked,
        })
        .collect::<Vec<_>>();
    let mut frontiers = frontiers;
    fit_marks(&mut frontiers);
    Ok(Began {
        end,
        last_epoch,
        frontiers,
        // A replica whose log refuses appends until a restart answers as a learner would: fenced, but neither
        // counted nor ranked (a round that chose its log would hand the leadership to a replica that cannot append;
        // leaving it out is as safe as its being down).
        learner: partition.is_learner() || partition.log.is_poisoned(),
        nonces: partition.fence_state().promised_below(r.epoch),
        floor,
    })
}

/// Records a leader's frontiers on the core holding this node's follower replica of their partition. Records of a
/// group this replica does not know are passed over, unless they start it. None: the leader renews its lease
/// (`partition/lease.rs`), answered at an epoch this replica has not fenced past.
pub async fn apply_frontiers(engine: &Rc<Engine>, r: ReplicateFrontiers) -> OpResult<()> {
    let partition = fenced(
        engine,
        &r.topic,
        r.topic_id,
        r.partition,
        r.leader,
        r.epoch,
        0,
    )
    .await?;
    if r.marks.is_empty() {
        // A leader renewing its lease (`partition/lease.rs`): answered at this epoch, nothing to record.
        return Ok(());
    }
    let topic = engine.topic(&r.topic)?;
    let config = topic.config();
    // A start of the incarnation of the group this replica holds raises its value and lowers nothing.
    let mut marks = r.marks;
    // (Groups without an id on both sides, the default group among them, are the same: `TopicConfig::same_group`.)
    for m in marks.iter_mut().filter(|m| m.start) {
        let here = config.group_ids.get(&m.group).copied().unwrap_or(0);
        if here == m.group_id && partition.has_group(&m.group) {
            m.start = false;
        }
    }
    partition
        .follow_frontiers(&marks, config.max_groups, r.epoch)
        .await
        .map_err(OpError::from)
}

/// This core's follower replica of a partition led by `leader` at `epoch`, or why there is none. For a replica
/// held here, a request from an older epoch than this node's metadata knows, or than the replica's durable floor,
/// is `stale_epoch` (its sender no longer leads); from a newer one than the metadata knows,
/// `partition_unavailable` (this node has not heard of that leadership yet: the sender retries). The caller raises
/// the floor to `epoch` ([`fenced`]) before it answers.
fn followed(
    engine: &Rc<Engine>,
    topic_name: &str,
    topic_id: u64,
    p: u32,
    leader: NodeIndex,
    epoch: u64,
) -> OpResult<Rc<crate::partition::Partition>> {
    let topic = engine.topic(topic_name)?;
    if topic.id() != topic_id {
        return Err(OpError::Engine(crate::engine::EngineError::TopicNotFound(
            topic_name.to_string(),
        )));
    }
    let partition = topic.followed_partition(p).ok_or_else(|| {
        OpError::PartitionUnavailable(format!(
            "core {} holds no replica of partition {p} of '{topic_name}'",
            engine.id()
        ))
    })?;
    // A replica here: the epoch first, so that a leader that was replaced learns it (`stale_epoch`). Below what
    // the metadata names, or below the replica's durable floor (a promise to a newer leader that this node's
    // metadata may not show yet).
    let known = topic.epoch(p).max(partition.epoch_floor());
    if epoch < known {
        return Err(crate::partition::PartitionError::StaleEpoch { epoch, known }.into());
    }
    if epoch > topic.epoch(p) {
        return Err(OpError::PartitionUnavailable(format!(
            "partition {p} of '{topic_name}' is at epoch {} here, not yet {epoch}",
            topic.epoch(p)
        )));
    }
    if topic.location(p).node != leader {
        return Err(OpError::PartitionUnavailable(format!(
            "node {leader} does not lead partition {p} of '{topic_name}' at epoch {epoch} as this node knows it"
        )));
    }
    Ok(partition)
}

/// [`followed`], with the replica's durable epoch floor raised to `epoch` (a write only when the epoch moved):
/// once this replica answered a leader at an epoch, it never takes an older one's requests again, crash or not.
async fn fenced(
    engine: &Rc<Engine>,
    topic_name: &str,
    topic_id: u64,
    p: u32,
    leader: NodeIndex,
    epoch: u64,
    nonces: u64,
) -> OpResult<Rc<crate::partition::Partition>> {
    let partition = followed(engine, topic_name, topic_id, p, leader, epoch)?;
    partition.raise_fence(epoch, nonces).await?;
    // Looked at again: a newer leader's request, or the metadata, may have moved on while the floor was written.
    followed(engine, topic_name, topic_id, p, leader, epoch)
}

/// Applies a shipped batch on the core holding this node's follower replica of its partition. A learner that the
/// request promotes (`promote`, and its log, applied or probed, ends at or past `hold`) is promoted before the answer,
/// which says whether it still is one.
pub async fn apply(engine: &Rc<Engine>, r: Replicate) -> OpResult<Replicated> {
    // With its leader's nonce ceiling: a learner holds the promise before it is promoted and counts in a round.
    let partition = fenced(
        engine,
        &r.topic,
        r.topic_id,
        r.partition,
        r.leader,
        r.epoch,
        r.nonces,
    )
    .await?;
    let (promote, hold) = (r.promote, r.hold);
    let (topic, partition_id) = (r.topic.clone(), r.partition);
    let mut answer = apply_to(engine, &partition, r).await?;
    // Applied, or a probe not refused: its log continues this leader's up to its end.
    if promote && partition.is_learner() && !answer.refused && answer.end >= hold {
        if let Err(e) = partition.promote().await {
            tracing::warn!(topic = %topic, partition = partition_id, error = %e, "a learner could not be promoted; its leader asks again");
        }
    }
    answer.learner = partition.is_learner();
    answer.poisoned = partition.log.is_poisoned();
    Ok(answer)
}

async fn apply_to(
    engine: &Rc<Engine>,
    partition: &Rc<crate::partition::Partition>,
    r: Replicate,
) -> OpResult<Replicated> {
    let log = &partition.log;
    if r.count == 0 {
        // A probe (the leader opened the partition, or began leading): where this replica's log ends. It carries
        // the leader's entry for its epoch, taken durably first, so that this replica's end counts for the
        // leader's commit only with the entry (`Partition::rank`); refused when it contradicts this replica's
        // history (this log holds records past where that leadership began: they are not its leader's). Records
        // of another leadership that its leader does not hold are cut first (truncation by epoch): the leader
        // catches this replica up from the cut. A restart probe (this log ends below the leader's start) first
        // starts the log anew there, with the leader's history up to it: the probe's checks then find them alike.
        if r.restart {
            let end = partition
                .start_anew_at(r.first_offset, &r.epochs, r.epoch)
                .await?;
            tracing::info!(topic = %r.topic, partition = r.partition, leader = r.leader, end, start = r.first_offset, "a restart probe: this replica's log starts at its leader's start");
            followed(engine, &r.topic, r.topic_id, r.partition, r.leader, r.epoch)?;
        }
        if let Some(at) = partition.truncate_diverged(&r.epochs, r.epoch).await? {
            tracing::warn!(topic = %r.topic, partition = r.partition, leader = r.leader, at, "cut this replica's diverged log where its leader's history says");
            followed(engine, &r.topic, r.topic_id, r.partition, r.leader, r.epoch)?;
        }
        let end = log.end_offset();
        return match partition.follow_epochs(&r.epochs, end, r.epoch).await {
            Ok(()) => {
                // Looked at again: a newer leadership's round, or the metadata, may have moved on meanwhile.
                followed(engine, &r.topic, r.topic_id, r.partition, r.leader, r.epoch)?;
                Ok(Replicated {
                    end,
                    applied: false,
                    refused: false,
                    learner: false,
                    poisoned: false,
                })
            }
            Err(crate::partition::FollowEpochsError::Mismatch(why)) => {
                tracing::warn!(topic = %r.topic, partition = r.partition, leader = r.leader, why, "a probe's epoch contradicts this replica's history: refused");
                Ok(Replicated {
                    end,
                    applied: false,
                    refused: true,
                    learner: false,
                    poisoned: false,
                })
            }
            Err(crate::partition::FollowEpochsError::Partition(e)) => Err(e.into()),
        };
    }
    // The batch's epochs first, durably: a replica never holds records its history places in an older epoch. Only
    // for a batch at or past the log's end (pipelined ones wait their turn): one below it is not written anyway, and
    // its entries must not relabel records this replica holds. A batch of its own from a leadership it lost lands
    // first: the end looked at is then the one its records follow (`Log::own_writes_settled`).
    log.own_writes_settled().await;
    let epochs = if r.first_offset >= log.end_offset() {
        &r.epochs[..]
    } else {
        &[]
    };
    match partition
        .follow_epochs(epochs, log.end_offset(), r.epoch)
        .await
    {
        Ok(()) => {}
        Err(crate::partition::FollowEpochsError::Mismatch(why)) => {
            tracing::warn!(topic = %r.topic, partition = r.partition, leader = r.leader, why, "a shipped batch's epochs contradict this replica's history: refused");
            return Ok(Replicated {
                end: log.end_offset(),
                applied: false,
                refused: true,
                learner: false,
                poisoned: false,
            });
        }
        Err(crate::partition::FollowEpochsError::Partition(e)) => return Err(e.into()),
    }
    let applied = log.apply_shipped_of(r.epoch, &r.head(), &r.frames).await;
    if partition.epoch_floor() > r.epoch {
        // A newer leader's fencing round reached this replica while the batch was written: its old leader must not
        // count it (the new leader took this replica's end before it), so it is not acknowledged.
        return Err(crate::partition::PartitionError::StaleEpoch {
            epoch: r.epoch,
            known: partition.epoch_floor(),
        }
        .into());
    }
    match applied {
        Ok(()) => Ok(Replicated {
            end: log.end_offset(),
            applied: true,
            refused: false,
            learner: false,
            poisoned: false,
        }),
        Err(FollowError::Gap { end }) => Ok(Replicated {
            end,
            applied: false,
            refused: false,
            learner: false,
            poisoned: false,
        }),
        Err(FollowError::Mismatch(why)) => {
            tracing::warn!(topic = %r.topic, partition = r.partition, leader = r.leader, why, "a shipped batch does not continue this replica: refused");
            Ok(Replicated {
                end: log.end_offset(),
                applied: false,
                refused: true,
                learner: false,
                poisoned: false,
            })
        }
        Err(FollowError::Append(e)) => Err(crate::partition::PartitionError::from(e).into()),
        Err(FollowError::Busy) => Err(OpError::Engine(crate::engine::EngineError::Overloaded)),
    }
}

#[cfg(test)]
mod tests {
    /// A message of marks stays within its byte budget: the marks past it go without their acked ranges, and
    /// every frontier still goes.
    #[test]
    fn marks_past_the_byte_budget_go_without_their_ranges() {
        let big = |g: String| FrontierMark {
            group: g,
            committed: 1,
            start: false,
            group_id: 0,
            acked: (0..40_000u64).map(|i| (2 + 2 * i, 3 + 2 * i)).collect(),
        };
        let mut marks: Vec<FrontierMark> = (0..20).map(|i| big(format!("g{i:02}"))).collect();
        fit_marks(&mut marks);
        let total: usize = marks.iter().map(FrontierMark::size).sum();
        assert!(total <= MAX_FRONTIER_BYTES, "{total}");
        assert_eq!(marks[0].acked.len(), 40_000);
        assert!(marks[19].acked.is_empty());
        assert!(marks.iter().all(|m| m.committed == 1));
    }

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::config::Config;
    use crate::engine::placement::{Location, PartitionState};
    use crate::engine::topic::TopicConfig;
    use crate::engine::Shared;
    use crate::partition::PartitionError;
    use crate::storage::backend::Storage;
    use crate::storage::sim::{Sim, SimStorage};
    use std::path::PathBuf;

    fn run(f: impl std::future::Future<Output = ()>) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(f)
    }

    thread_local! {
        /// The manual clock of the last engine `follower_on` made on this thread.
        static CLOCK: std::cell::RefCell<Option<Rc<ManualClock>>> = const { std::cell::RefCell::new(None) };
    }

    /// Moves the clock of the last engine `follower_on` made on this thread.
    fn advance(ms: u64) {
        CLOCK.with(|c| c.borrow().as_ref().expect("an engine").advance(ms));
    }

    /// One core of node 0 on a simulated disk, holding the follower replica of a topic's one partition, which node
    /// 1 leads at `epoch`.
    async fn follower_at(epoch: u64) -> (Rc<Engine>, TopicConfig, Vec<Location>) {
        follower_on(Sim::new(), epoch).await
    }

    /// [`follower_at`] on a given simulated disk (a restart: the disk a crash or a power cut left).
    async fn follower_on(sim: Rc<Sim>, epoch: u64) -> (Rc<Engine>, TopicConfig, Vec<Location>) {
        let config = Rc::new(Config {
            data_dir: PathBuf::from("/sim"),
            ..Config::default()
        });
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim));
        for d in ["topics", "trash"] {
            storage.create_dir_all(&config.data_dir.join(d)).unwrap();
        }
        let clock = ManualClock::new(1_700_000_000_000);
        CLOCK.with(|c| *c.borrow_mut() = Some(clock.clone()));
        let engine = Engine::new(
            0,
            1,
            config,
            clock as Rc<dyn Clock>,
            storage,
            std::sync::Arc::new(Shared::default()),
        );
        // Starts the core's journal (a follower records frontiers through it); there is no topic yet.
        assert!(engine.load_topics().await.unwrap().is_empty());
        let mut topic = TopicConfig::with_defaults("t");
        topic.partitions = 1;
        topic.id = 5;
        let locations = vec![Location { node: 1, core: 0 }];
        engine
            .apply_topic(topic.clone(), locations.clone(), states(epoch))
            .await
            .unwrap();
        (engine, topic, locations)
    }

    fn states(epoch: u64) -> Vec<PartitionState> {
        vec![PartitionState {
            placed: Vec::new(),
            learners: Vec::new(),
            replicas: vec![1, 0],
            leader: 1,
            epoch,
        }]
    }

    /// Applies the view of topic "led" (id 6, one partition on node 0 core 0, replicas [0, 1]) led by `leader` at
    /// `epoch`, on the engine of [`follower_on`] (node 0); the partition as this core holds it.
    async fn led_view(
        engine: &Rc<Engine>,
        topic: &TopicConfig,
        leader: NodeIndex,
        epoch: u64,
    ) -> Option<Rc<crate::partition::Partition>> {
        apply_led(engine, topic, leader, epoch, Location { node: 0, core: 0 }).await;
        engine.topic("led").unwrap().owned_partition(0)
    }

    /// Applies the view of topic "led" (replicas [0, 1]) led by `leader` at `epoch`, served from `location`.
    async fn apply_led(
        engine: &Rc<Engine>,
        topic: &TopicConfig,
        leader: NodeIndex,
        epoch: u64,
        location: Location,
    ) {
        let mut topic = topic.clone();
        topic.name = "led".into();
        topic.id = 6;
        let state = vec![PartitionState {
            placed: Vec::new(),
            learners: Vec::new(),
            replicas: vec![0, 1],
            leader,
            epoch,
        }];
        engine
            .apply_topic(topic, vec![location], state)
            .await
            .unwrap();
        win_round(engine, epoch).await;
    }

    /// The fencing round of "led" at `epoch`, if one is under way here, won (as `front/round.rs` ends it when this
    /// replica's log is the greatest of a majority).
    async fn win_round(engine: &Rc<Engine>, epoch: u64) {
        let p = engine.topic("led").unwrap().owned_partition(0);
        if p.is_some_and(|p| p.round_under_way() == Some(epoch)) {
            let round = crate::engine::RoundOf {
                topic: "led".into(),
                topic_id: 6,
                partition: 0,
                epoch,
            };
            let p = engine.topic("led").unwrap().owned_partition(0).unwrap();
            engine
                .finish_round(&round, (p.nonce_floor(), p.nonce_ask()))
                .await
                .unwrap();
        } else if let Some(p) = engine
            .topic("led")
            .unwrap()
            .owned_partition(0)
            .filter(|p| p.deposed().is_none() && p.nonce_window().ceiling == 0)
        {
            // Led without a round (no shipper here to ask a majority): its nonces as a promise would open them.
            p.nonces_promised(p.nonce_floor(), p.nonce_ask());
        }
    }

    fn probe(epoch: u64) -> Replicate {
        Replicate {
            topic: "t".into(),
            topic_id: 5,
            partition: 0,
            leader: 1,
            epoch,
            segment_base: 0,
            position: 0,
            first_offset: 0,
            count: 0,
            frames: Bytes::new(),
            epochs: Vec::new(),
            hold: 0,
            promote: false,
            nonces: 0,
            restart: false,
        }
    }

    fn frontiers(epoch: u64) -> ReplicateFrontiers {
        ReplicateFrontiers {
            topic: "t".into(),
            topic_id: 5,
            partition: 0,
            leader: 1,
            epoch,
            marks: Vec::new(),
        }
    }

    /// A follower takes a leader's requests only at the epoch its metadata names: an older one is `stale_epoch`
    /// (another leadership began since), a newer one `partition_unavailable` (its metadata has not caught up: the
    /// leader retries); once the metadata moves to a new epoch, the old one is refused.
    #[test]
    fn a_follower_takes_its_leaders_requests_only_at_the_epoch_it_knows() {
        run(async {
            let (engine, topic, locations) = follower_at(8).await;
            assert_eq!(engine.topic("t").unwrap().epoch(0), 8);
            fn stale<T>(r: &OpResult<T>) -> bool {
                matches!(
                    r,
                    Err(OpError::Engine(crate::engine::EngineError::Partition(
                        PartitionError::StaleEpoch { epoch: _, known: _ }
                    )))
                )
            }
            fn ahead<T>(r: &OpResult<T>) -> bool {
                matches!(r, Err(OpError::PartitionUnavailable(_)))
            }
            let r = apply(&engine, probe(7)).await;
            assert!(stale(&r), "{r:?}");
            let r = apply(&engine, probe(9)).await;
            assert!(ahead(&r), "{r:?}");
            assert_eq!(
                apply(&engine, probe(8)).await.unwrap(),
                Replicated {
                    end: 0,
                    applied: false,
                    refused: false,
                    learner: false,
                    poisoned: false,
                }
            );
            let r = apply_frontiers(&engine, frontiers(7)).await;
            assert!(stale(&r), "{r:?}");
            let r = apply_frontiers(&engine, frontiers(9)).await;
            assert!(ahead(&r), "{r:?}");
            let r = apply_frontiers(&engine, frontiers(8)).await;
            assert!(r.is_ok(), "{r:?}");

            // The metastore moves the partition to epoch 9 (the same topic, the same leader).
            engine
                .apply_topic(topic, locations, states(9))
                .await
                .unwrap();
            assert_eq!(engine.topic("t").unwrap().epoch(0), 9);
            let r = apply(&engine, probe(8)).await;
            assert!(stale(&r), "{r:?}");
            let r = apply_frontiers(&engine, frontiers(8)).await;
            assert!(stale(&r), "{r:?}");
            assert!(apply(&engine, probe(9)).await.is_ok());
            assert!(apply_frontiers(&engine, frontiers(9)).await.is_ok());
            engine.close_all().await;
        });
    }

    /// A replica on a new disk (`replica.learner`) answers every request as a learner, and promotes itself only when
    /// its leader asks (`promote`) and its log, applied or probed, reaches `hold`: durably, so a power cut right
    /// after does not make it a learner again, and a learner answers a fencing round as one.
    #[test]
    fn a_learner_promotes_itself_only_when_asked_and_holding_what_its_leader_could_have_acknowledged(
    ) {
        use crate::storage::epoch_history::EpochStart;
        run(async {
            let sim = Sim::new();
            let (engine, _, _) = follower_on(sim.clone(), 8).await;
            let dir = PathBuf::from("/sim/topics/t/0");
            crate::storage::learner::write(&SimStorage(sim.clone()), &dir, 99)
                .await
                .unwrap();
            engine.close_all().await;
            let sim = sim.power_cut(|_, _| 0);
            let (engine, _, _) = follower_on(sim.clone(), 8).await;
            let f = engine.topic("t").unwrap().followed_partition(0).unwrap();
            assert!(f.is_learner(), "its file makes it a learner at open");
            let r = apply(&engine, probe(8)).await.unwrap();
            assert!(r.learner && !r.refused, "{r:?}");
            // Asked, but its log (empty) does not reach what its leader could have acknowledged.
            let asked = |hold| Replicate {
                promote: true,
                hold,
                ..probe(8)
            };
            let r = apply(&engine, asked(2)).await.unwrap();
            assert!(r.learner && f.is_learner(), "{r:?}");
            // Holding it, but not asked (its frontiers are not all there yet).
            let frames = {
                let mut out = Vec::new();
                for (offset, body) in [(0u64, b"x"), (1, b"y")] {
                    crate::storage::frame::encode(offset, 1, body, &mut out);
                }
                Bytes::from(out)
            };
            let batch = |promote| Replicate {
                count: 2,
                frames: frames.clone(),
                epochs: vec![EpochStart { epoch: 8, start: 0 }],
                hold: 2,
                promote,
                ..probe(8)
            };
            let r = apply(&engine, batch(false)).await.unwrap();
            assert!(r.applied && r.learner, "{r:?}");
            // A fencing round neither counts nor ranks it: it says so.
            engine.topic("t").unwrap().set_states(vec![PartitionState {
                placed: Vec::new(),
                learners: Vec::new(),
                replicas: vec![1, 0],
                leader: 1,
                epoch: 9,
            }]);
            let began = begin_epoch(
                &engine,
                BeginEpoch {
                    topic: "t".into(),
                    topic_id: 5,
                    partition: 0,
                    leader: 1,
                    epoch: 9,
                    nonces: 0,
                },
            )
            .await
            .unwrap();
            assert!(began.learner && began.end == 2, "{began:?}");
            // Asked, holding it: promoted before the answer, durably.
            let r = apply(
                &engine,
                Replicate {
                    epoch: 9,
                    ..asked(2)
                },
            )
            .await
            .unwrap();
            assert!(!r.learner && !f.is_learner(), "{r:?}");
            engine.close_all().await;
            let (engine, _, _) = follower_on(sim.power_cut(|_, _| 0), 8).await;
            let f = engine.topic("t").unwrap().followed_partition(0).unwrap();
            assert!(!f.is_learner(), "promoted for good");
            engine.close_all().await;
        });
    }

    /// A leader's epoch history: its first epoch from offset 0 when it opens the replicated partition, and each newer
    /// epoch its metadata moves it to from its log's end then (an epoch that wrote nothing replaced); durable on the
    /// simulated disk each time.
    #[test]
    fn a_leader_records_each_epoch_it_leads_at_from_its_logs_end() {
        use crate::storage::epoch_history::{self, EpochStart};
        run(async {
            let sim = Sim::new();
            let (engine, topic, _) = follower_on(sim.clone(), 8).await;
            // The same node leads a second topic, followed by node 1.
            let p = led_view(&engine, &topic, 0, 6).await.unwrap();
            let e = |epoch, start| EpochStart { epoch, start };
            let durable = || {
                let after = SimStorage(sim.power_cut(|_, _| 0));
                epoch_history::read(&after, &PathBuf::from("/sim/topics/led/0"))
                    .unwrap()
                    .entries()
                    .to_vec()
            };
            assert_eq!(durable(), vec![e(6, 0)]);
            led_view(&engine, &topic, 0, 7).await;
            assert_eq!(durable(), vec![e(7, 0)], "epoch 6 wrote nothing");
            p.log
                .append_batch(vec![Bytes::from_static(b"a"); 3])
                .await
                .unwrap();
            led_view(&engine, &topic, 0, 11).await;
            assert_eq!(durable(), vec![e(7, 0), e(11, 3)]);
            assert_eq!(p.epochs_covering(2, 4), vec![e(7, 0), e(11, 3)]);
            led_view(&engine, &topic, 0, 11).await;
            assert_eq!(durable(), vec![e(7, 0), e(11, 3)], "the same epoch");
            engine.close_all().await;
        });
    }

    /// A probe of follower "t" (of [`follower_at`]) from its leader at `epoch`, the metadata moved to that epoch
    /// first: its end `first_offset`, carrying `epochs`.
    async fn probe_at(
        engine: &Rc<Engine>,
        epoch: u64,
        first_offset: u64,
        epochs: Vec<crate::storage::epoch_history::EpochStart>,
    ) -> Replicated {
        engine.topic("t").unwrap().set_states(vec![PartitionState {
            placed: Vec::new(),
            learners: Vec::new(),
            replicas: vec![1, 0],
            leader: 1,
            epoch,
        }]);
        let probe = Replicate {
            first_offset,
            epochs,
            ..probe(epoch)
        };
        apply(engine, probe).await.unwrap()
    }

    /// Raft's figure 8, closed two ways. A follower that takes a leader's entry for its epoch with every record
    /// below its start ranks at that epoch (a probe carries the entry: durable before the answer; one that
    /// contradicts the replica's log is refused, and one past its end claims nothing). And a leader commits nothing
    /// of an older epoch until a majority holds everything below where its own epoch starts.
    #[test]
    fn a_new_leadership_commits_nothing_until_a_majority_holds_its_start_and_ranks_replicas_by_it()
    {
        use crate::partition::DEFAULT_GROUP;
        use crate::storage::epoch_history::EpochStart;
        run(async {
            let (engine, topic, _) = follower_at(8).await;
            let e = |epoch, start| EpochStart { epoch, start };
            let shipped = |first_offset, epochs: Vec<EpochStart>| Replicate {
                first_offset,
                epochs,
                ..probe(8)
            };
            // The follower of "t" (led by node 1 at epoch 8) holds 2 records of epoch 8.
            let f = engine.topic("t").unwrap().followed_partition(0).unwrap();
            f.follow_epochs(&[e(8, 0)], 0, 8).await.unwrap();
            let frames = {
                let mut out = Vec::new();
                for (offset, body) in [(0u64, b"x"), (1, b"y")] {
                    crate::storage::frame::encode(offset, 1, body, &mut out);
                }
                Bytes::from(out)
            };
            let batch = Replicate {
                count: 2,
                frames,
                ..shipped(0, vec![e(8, 0)])
            };
            assert!(apply(&engine, batch).await.unwrap().applied);
            assert_eq!(f.rank(), (8, 2));
            // A probe whose entry starts past its end claims nothing; one at its end ranks it at that epoch,
            // durably before the answer.
            let r = apply(&engine, shipped(5, vec![e(8, 0)])).await.unwrap();
            assert!(!r.refused, "{r:?}");
            assert_eq!(f.rank(), (8, 2));
            let r = probe_at(&engine, 9, 2, vec![e(9, 2)]).await;
            assert_eq!((r.end, r.refused), (2, false));
            assert_eq!(f.rank(), (9, 2), "it holds epoch 9's log as it began");
            assert_eq!(f.epoch_history().entries(), &[e(8, 0), e(9, 2)]);
            // One that starts below its end: this log holds a record (1) past where that leadership began, which
            // its leader does not hold: cut there (truncation by epoch) before the answer, and ranked by what is
            // left.
            let r = probe_at(&engine, 10, 1, vec![e(10, 1)]).await;
            assert_eq!((r.end, r.refused), (1, false), "{r:?}");
            assert_eq!(f.log.end_offset(), 1);
            assert_eq!(f.epoch_history().entries(), &[e(8, 0), e(10, 1)]);
            assert_eq!(f.rank(), (10, 1));
            // Entries of a leadership below the floor never land (a round read its rank without them).
            f.raise_epoch_floor(13).await.unwrap();
            let r = f.follow_epochs(&[e(8, 0), e(12, 1)], 1, 12).await;
            assert!(
                matches!(
                    r,
                    Err(crate::partition::FollowEpochsError::Partition(
                        PartitionError::StaleEpoch { .. }
                    ))
                ),
                "{r:?}"
            );
            assert_eq!(f.rank(), (10, 1));

            // The leader's side: "led" (replicas [0, 1]) at epoch 6 commits as its follower answers...
            let p = led_view(&engine, &topic, 0, 6).await.unwrap();
            p.log
                .append_batch(vec![Bytes::from_static(b"r"); 3])
                .await
                .unwrap();
            p.follower_acked(1, 1);
            assert_eq!(p.readable_end(), 1);
            // ...and at epoch 7, which starts at 3, nothing below 3 until its follower has all of it.
            led_view(&engine, &topic, 0, 7).await;
            assert_eq!(p.epoch_history().last(), Some(e(7, 3)));
            p.follower_acked(1, 2);
            assert_eq!(
                p.readable_end(),
                0,
                "records 0..2 are on a majority, but not epoch 7's start"
            );
            let none = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
            assert!(none.deliveries.is_empty(), "{none:?}");
            p.follower_acked(1, 3);
            assert_eq!(p.readable_end(), 3);
            engine.close_all().await;
        });
    }

    /// A partition led here whose metadata names another leader at a newer epoch is deposed: a produce to it is
    /// answered `503 partition_unavailable`, and it stays so; a newer epoch naming this node again only records it.
    #[test]
    fn a_leader_whose_metadata_names_another_leader_is_deposed() {
        run(async {
            let (engine, topic, _) = follower_at(8).await;
            let p = led_view(&engine, &topic, 0, 6).await.unwrap();
            led_view(&engine, &topic, 0, 7).await;
            assert_eq!(p.deposed(), None, "a newer epoch of its own");
            led_view(&engine, &topic, 1, 9).await;
            assert_eq!(p.deposed(), Some(9));
            let produce = crate::ops::produce::Produce {
                topic: "led".into(),
                topic_id: 6,
                partition: 0,
                records: vec![Bytes::from_static(b"x")],
                meta: Vec::new(),
            };
            let r = crate::ops::produce::apply(&engine, produce).await;
            assert!(
                matches!(&r, Err(e) if crate::ops::status::status_of(e) == (503, "partition_unavailable")),
                "{r:?}"
            );
            assert_eq!(p.log.end_offset(), 0, "nothing appended");
            assert_eq!(
                p.epoch_history().entries(),
                &[crate::storage::epoch_history::EpochStart { epoch: 7, start: 0 }],
                "the other leader's epoch is not this replica's"
            );
            engine.close_all().await;
        });
    }

    /// A new leader's fencing round: a follower replica raises its floor durably and answers its end and last
    /// epoch, after which the old leader's requests are `stale_epoch` even before the metadata moves; the old leader
    /// itself, reached by the round, is deposed. An epoch below what the replica knows is refused.
    /// A replica promises each leadership the nonce ceiling it asks for (`BeginEpoch`, or a batch or probe of its
    /// stream), durably before it answers, never lowering one; and answers a newer leadership's round the highest
    /// ceiling promised to older ones, which that leader's nonces start above (`partition/nonces.rs`).
    #[test]
    fn a_replica_promises_nonce_ceilings_durably_and_answers_a_newer_round_what_older_ones_had() {
        use crate::storage::epoch_floor::{encode, Fence, FILE_NAME};
        run(async {
            let sim = Sim::new();
            let (engine, _, _) = follower_on(sim.clone(), 9).await;
            let file = PathBuf::from("/sim/topics/t/0").join(FILE_NAME);
            let begin = |epoch: u64, nonces: u64| BeginEpoch {
                topic: "t".into(),
                topic_id: 5,
                partition: 0,
                leader: 1,
                epoch,
                nonces,
            };
            let began = begin_epoch(&engine, begin(9, 1_000)).await.unwrap();
            assert_eq!(began.nonces, 0, "nothing promised to an older leadership");
            let at_9 = |at| Fence {
                floor: 9,
                nonces_below: 0,
                nonces_at: at,
            };
            assert_eq!(sim.durable_contents(&file), Some(encode(at_9(1_000))));
            // The same leadership again (its raise): higher only.
            let began = begin_epoch(&engine, begin(9, 1_500)).await.unwrap();
            assert_eq!(began.nonces, 0, "its own promise is not an older one");
            begin_epoch(&engine, begin(9, 1_200)).await.unwrap();
            assert_eq!(sim.durable_contents(&file), Some(encode(at_9(1_500))));
            // Its stream's batches and probes carry the ceiling too.
            let probe = Replicate {
                nonces: 2_000,
                ..probe(9)
            };
            apply(&engine, probe).await.unwrap();
            assert_eq!(sim.durable_contents(&file), Some(encode(at_9(2_000))));
            // A newer leadership's round: answered what the older one was promised.
            engine.topic("t").unwrap().set_states(vec![PartitionState {
                placed: Vec::new(),
                learners: Vec::new(),
                replicas: vec![1, 0],
                leader: 1,
                epoch: 12,
            }]);
            let began = begin_epoch(&engine, begin(12, 900)).await.unwrap();
            assert_eq!(began.nonces, 2_000);
            assert_eq!(
                sim.durable_contents(&file),
                Some(encode(Fence {
                    floor: 12,
                    nonces_below: 2_000,
                    nonces_at: 900
                }))
            );
            engine.close_all().await;
        });
    }

    #[test]
    fn begin_epoch_fences_a_follower_and_deposes_the_old_leader() {
        run(async {
            let sim = Sim::new();
            let (engine, topic, _) = follower_on(sim.clone(), 8).await;
            // Node 1 (the other replica) begins the epochs; node 2 holds no replica and is refused.
            let begin = |name: &str, id: u64, epoch: u64| BeginEpoch {
                topic: name.into(),
                topic_id: id,
                partition: 0,
                leader: 1,
                epoch,
                nonces: 0,
            };
            let stranger = BeginEpoch {
                leader: 2,
                ..begin("t", 5, 20)
            };
            let r = begin_epoch(&engine, stranger).await;
            assert!(matches!(r, Err(OpError::InvalidParameter(_))), "{r:?}");
            let r = begin_epoch(&engine, begin("t", 5, 7)).await;
            assert!(stale(&r, 8), "{r:?}");
            // An epoch the metadata does not have yet (the node RPC handler reads the metastore first): not yet.
            let r = begin_epoch(&engine, begin("t", 5, 9)).await;
            assert!(matches!(r, Err(OpError::PartitionUnavailable(_))), "{r:?}");
            engine.topic("t").unwrap().set_states(vec![PartitionState {
                placed: Vec::new(),
                learners: Vec::new(),
                replicas: vec![1, 0],
                leader: 1,
                epoch: 9,
            }]);
            let began = begin_epoch(&engine, begin("t", 5, 9)).await.unwrap();
            assert_eq!((began.end, began.last_epoch), (0, 0));
            // With each group's durable frontier (the round's winner raises its own to the highest).
            assert_eq!(
                began.frontiers,
                vec![FrontierMark {
                    group: crate::partition::DEFAULT_GROUP.into(),
                    committed: 0,
                    start: false,
                    group_id: 0,
                    acked: Vec::new(),
                }]
            );
            let file =
                PathBuf::from("/sim/topics/t/0").join(crate::storage::epoch_floor::FILE_NAME);
            assert_eq!(
                sim.durable_contents(&file),
                Some(crate::storage::epoch_floor::encode(
                    crate::storage::epoch_floor::Fence::at(9)
                )),
                "durable before the answer"
            );
            // Its history may run ahead of its log (entries taken for a batch not written): the answer is the
            // newest epoch starting at or below its end, none here.
            let f = engine.topic("t").unwrap().followed_partition(0).unwrap();
            f.follow_epochs(
                &[crate::storage::epoch_history::EpochStart { epoch: 8, start: 2 }],
                0,
                9,
            )
            .await
            .unwrap();
            let began = begin_epoch(&engine, begin("t", 5, 9)).await.unwrap();
            assert_eq!((began.end, began.last_epoch), (0, 0));
            // The old leader's requests (epoch 8) are refused from now on.
            let r = apply(&engine, probe(8)).await;
            assert!(stale(&r, 9), "{r:?}");
            let r = apply_frontiers(&engine, frontiers(8)).await;
            assert!(stale(&r, 9), "{r:?}");

            // This node leads "led" at epoch 6; a round of epoch 9 from another node deposes it.
            let p = led_view(&engine, &topic, 0, 6).await.unwrap();
            p.log
                .append_batch(vec![Bytes::from_static(b"a"); 2])
                .await
                .unwrap();
            let r = begin_epoch(&engine, begin("led", 6, 6)).await;
            assert!(stale(&r, 6), "its own epoch: {r:?}");
            assert_eq!(p.deposed(), None);
            moved_view(&engine, &topic, 1, 9).await;
            // Only from the leader the metadata names at that epoch.
            let usurper = BeginEpoch {
                leader: 0,
                ..begin("led", 6, 9)
            };
            let r = begin_epoch(&engine, usurper).await;
            assert!(matches!(r, Err(OpError::InvalidParameter(_))), "{r:?}");
            let began = begin_epoch(&engine, begin("led", 6, 9)).await.unwrap();
            assert_eq!((began.end, began.last_epoch), (2, 6));
            assert_eq!((p.deposed(), p.epoch_floor()), (Some(9), 9));
            // An older view (a metastore read of the topic key alone carries the creation's states) never moves a
            // partition back: still epoch 9, led by node 1, this replica deposed.
            led_view(&engine, &topic, 0, 6).await;
            let t = engine.topic("led").unwrap();
            assert_eq!((t.epoch(0), t.location(0).node), (9, 1));
            assert_eq!(p.deposed(), Some(9));
            let r = begin_epoch(&engine, begin("led", 7, 10)).await;
            assert!(
                matches!(
                    r,
                    Err(OpError::Engine(crate::engine::EngineError::TopicNotFound(
                        _
                    )))
                ),
                "another topic id: {r:?}"
            );
            engine.close_all().await;
        });
    }

    /// Applies the view of topic "led" (as [`led_view`]) served from its leader `leader` (node 0 or 1, core 0 of
    /// each) at `epoch`: a move of leadership, as an election writes it.
    async fn moved_view(engine: &Rc<Engine>, topic: &TopicConfig, leader: NodeIndex, epoch: u64) {
        let location = Location {
            node: leader,
            core: 0,
        };
        apply_led(engine, topic, leader, epoch, location).await;
    }

    /// A leadership that moves away from this node and back: the leader's replica follows on the same core (deposed,
    /// its leases gone, its log and files kept, shipped requests of the new leader taken), then leads again at a
    /// newer epoch where it followed: it refuses the old leader's requests, serves from the higher of its files and
    /// the frontiers it was shipped, appends, and records where its epoch starts.
    #[test]
    fn a_replica_changes_role_on_its_core_when_its_leadership_moves() {
        use crate::partition::{SettleOp, DEFAULT_GROUP};
        use crate::storage::epoch_history::EpochStart;
        run(async {
            let (engine, topic, _) = follower_at(8).await;
            moved_view(&engine, &topic, 0, 6).await;
            let t = engine.topic("led").unwrap();
            let p = t.owned_partition(0).expect("led here");
            p.log
                .append_batch(vec![Bytes::from_static(b"r"); 4])
                .await
                .unwrap();
            p.follower_acked(1, 4);
            // As its followers' answers would: a lease on its takes (`partition/lease.rs`).
            p.lease_granted(u64::MAX);
            let taken = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
            let lease = &taken.deliveries[0];
            assert_eq!(lease.offset, 0);
            p.settle(DEFAULT_GROUP, &[(lease.offset, lease.nonce)], SettleOp::Ack)
                .await
                .unwrap();
            let leased = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
            assert_eq!(leased.deliveries[0].offset, 1);
            p.flush_frontiers().await;

            // Node 1 leads at epoch 9: the same partition follows on this core.
            moved_view(&engine, &topic, 1, 9).await;
            assert!(t.owned_partition(0).is_none(), "it leads no more");
            let f = t.followed_partition(0).expect("it follows where it led");
            assert!(Rc::ptr_eq(&f, &p));
            assert_eq!(p.deposed(), Some(9));
            // Still counted over its replicas: a produce that was waiting for its majority is answered `503`, never
            // acknowledged on this replica alone.
            assert!(p.replicated());
            assert_eq!(t.location(0), Location { node: 1, core: 0 });
            let r = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
            assert!(
                r.deliveries.is_empty() && r.stop == Some(crate::partition::Stop::Unavailable),
                "a follower leases nothing: {r:?}"
            );
            // The new leader's requests are taken: a probe finds its end, its frontiers raise the group's.
            let led = |epoch| Replicate {
                topic: "led".into(),
                topic_id: 6,
                epoch,
                ..probe(epoch)
            };
            let answer = apply(&engine, led(9)).await.unwrap();
            assert_eq!(answer.end, 4);
            let marks = |epoch, committed| ReplicateFrontiers {
                topic: "led".into(),
                topic_id: 6,
                marks: vec![FrontierMark {
                    group: DEFAULT_GROUP.into(),
                    committed,
                    start: false,
                    group_id: 0,
                    acked: Vec::new(),
                }],
                ..frontiers(epoch)
            };
            apply_frontiers(&engine, marks(9, 3)).await.unwrap();

            // And back: this node leads at epoch 12, on the core it followed on; it serves nothing until its
            // fencing round is won.
            let mut view = topic.clone();
            view.name = "led".into();
            view.id = 6;
            let state = vec![PartitionState {
                placed: Vec::new(),
                learners: Vec::new(),
                replicas: vec![0, 1],
                leader: 0,
                epoch: 12,
            }];
            let here = Location { node: 0, core: 0 };
            engine.apply_topic(view, vec![here], state).await.unwrap();
            let q = t.owned_partition(0).expect("it leads again");
            assert!(Rc::ptr_eq(&q, &p));
            assert!(t.followed_partition(0).is_none());
            assert_eq!((p.deposed(), p.round_under_way()), (Some(12), Some(12)));
            let r = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
            assert_eq!(r.stop, Some(crate::partition::Stop::Unavailable), "{r:?}");
            assert_eq!(
                p.rank(),
                (6, 4),
                "its records are epoch 6's (epoch 9 shipped it no entry)"
            );
            win_round(&engine, 12).await;
            assert_eq!((p.deposed(), p.round_under_way()), (None, None));
            // Node 1 led at epoch 9 meanwhile: its lease is waited out before anything is leased here
            // (`partition/lease.rs`), and a majority answers this leadership.
            advance(p.lease_ms() * 9 / 8);
            p.lease_granted(u64::MAX);
            let r = apply(&engine, led(9)).await;
            assert!(r.is_err(), "the old leader's request: {r:?}");
            // A late answer to a stream of its own older leadership deposes nothing.
            p.depose(12);
            p.depose(9);
            assert_eq!(p.deposed(), None);
            // What its followers are sent as its durable frontiers (the probe at the promotion) is the frontier its
            // old leader shipped, not the older one its file holds.
            let shipped: Vec<u64> = p.durable_frontiers().iter().map(|r| r.committed).collect();
            assert_eq!(shipped, vec![3]);
            // Nothing is served before a majority has it; then the group starts where its leader had it (3), not
            // where its own file stood (1).
            let none = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
            assert!(none.deliveries.is_empty(), "{:?}", none.deliveries);
            p.follower_acked(1, 4);
            let next = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
            assert_eq!(next.deliveries[0].offset, 3);
            assert_eq!(p.append(vec![Bytes::from_static(b"s")]).await.unwrap(), 4);
            assert_eq!(
                p.epoch_history().entries(),
                &[
                    EpochStart { epoch: 6, start: 0 },
                    EpochStart {
                        epoch: 12,
                        start: 4
                    }
                ]
            );
            engine.close_all().await;
        });
    }

    fn stale<T: std::fmt::Debug>(r: &OpResult<T>, floor: u64) -> bool {
        matches!(
            r,
            Err(OpError::Engine(crate::engine::EngineError::Partition(
                PartitionError::StaleEpoch { epoch: _, known }
            ))) if *known == floor
        )
    }

    /// Once a replica answered a leader at an epoch, its floor is on disk before the answer: after a power cut,
    /// with its metadata still at the older epoch (the new leadership not yet seen), the old leader's requests are
    /// refused `stale_epoch`, and the new leader's wait (`partition_unavailable`) until the metadata catches up.
    #[test]
    fn a_replicas_epoch_floor_is_durable_before_it_answers_and_fences_older_leaders_after_a_power_cut(
    ) {
        run(async {
            let sim = Sim::new();
            let (engine, topic, locations) = follower_on(sim.clone(), 8).await;
            let file =
                PathBuf::from("/sim/topics/t/0").join(crate::storage::epoch_floor::FILE_NAME);
            assert!(apply(&engine, probe(8)).await.is_ok());
            assert_eq!(
                sim.durable_contents(&file),
                Some(crate::storage::epoch_floor::encode(
                    crate::storage::epoch_floor::Fence::at(8)
                )),
                "the floor is durable when the first request at an epoch is answered"
            );
            engine
                .apply_topic(topic.clone(), locations.clone(), states(12))
                .await
                .unwrap();
            assert!(apply_frontiers(&engine, frontiers(12)).await.is_ok());
            assert_eq!(
                sim.durable_contents(&file),
                Some(crate::storage::epoch_floor::encode(
                    crate::storage::epoch_floor::Fence::at(12)
                ))
            );
            // Nothing but the power cut: what was not synced is gone.
            let after = sim.power_cut(|_, _| 0);
            let (engine, _, _) = follower_on(after, 8).await;
            assert_eq!(
                engine.topic("t").unwrap().epoch(0),
                8,
                "the metadata is behind"
            );
            let r = apply(&engine, probe(8)).await;
            assert!(stale(&r, 12), "{r:?}");
            let r = apply_frontiers(&engine, frontiers(8)).await;
            assert!(stale(&r, 12), "{r:?}");
            let r = apply(&engine, probe(12)).await;
            assert!(matches!(r, Err(OpError::PartitionUnavailable(_))), "{r:?}");
            engine.close_all().await;
        });
    }
}
