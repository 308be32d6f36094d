//! Moving replicas off a drained or removed node (`POST /cluster/nodes/ID/drain`, `DELETE /cluster/nodes/ID`;
//! `docs/replication.md`, step 5). The metastore only says which nodes are leaving (`drains/<id>`); each partition's
//! leader moves its own partition, one replica at a time, each step one etcd transaction at a new epoch
//! (`Request::MoveLeader` with the new replica set, through core 0: only if the partition is still at the epoch the
//! leader read), so every change of replica set is fenced like any change of leadership: the leader runs its fencing
//! round with the new set before it serves again.
//!
//! The steps ([`next_step`]), for a partition of R replicas with a replica on a leaving node X:
//! - a leader that is itself leaving hands its leadership to a follower that is in sync (not a learner, and counted
//!   by the commit up to the commit offset); with none, it first adds a replica, as below;
//! - X alive: a replica on another node Y is **added** first (R + 1 replicas: a majority of them always includes a
//!   majority of the R before, and Y, a learner until the leader has caught it up and promoted it, never counts
//!   toward a fencing round's majority), and X is **removed** once every other replica is in sync: the partition
//!   keeps R in-sync replicas throughout;
//! - X without a session (gone, as `DELETE` says): X is removed first (one member less: the new majority overlaps
//!   every old one), then Y is added;
//! - a partition left with fewer than R replicas gains one.
//!
//! One change of one member at a time, so any two consecutive replica sets' majorities overlap. Y is a live node
//! that is not leaving and not a replica yet, the one holding the fewest replicas first.

use super::replicate::Shipper;
use crate::engine::placement::{Location, NodeIndex};
use crate::ops::replicate::MoveLeader;
use crate::ops::{Reply, Request};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How often a core looks at the partitions it leads.
const EVERY: Duration = Duration::from_millis(500);

/// A step asked for and not seen applied (the partition's epoch has not moved) is asked again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The next change to one partition's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The leadership goes to this in-sync replica (the leader is leaving).
    Lead(NodeIndex),
    /// This node becomes a replica (a learner until caught up).
    Add(NodeIndex),
    /// This node is a replica no more.
    Remove(NodeIndex),
}

/// One partition as its leader sees it.
pub struct PartitionView<'a> {
    pub replicas: &'a [NodeIndex],
    pub leader: NodeIndex,
    /// The topic's replica count R.
    pub target: usize,
    pub leaving: &'a dyn Fn(NodeIndex) -> bool,
    pub alive: &'a dyn Fn(NodeIndex) -> bool,
    /// A follower that holds everything committed and may lead or vote (not a learner, not lagging).
    pub in_sync: &'a dyn Fn(NodeIndex) -> bool,
    /// Nodes that could take a replica, best first (live, not leaving, not replicas yet).
    pub candidates: &'a [NodeIndex],
}

/// The next step for a partition, or None (nothing to do, or waiting: for a learner to be caught up, for a node
/// to move to).
pub fn next_step(v: &PartitionView) -> Option<Step> {
    let leaving: Vec<NodeIndex> = v
        .replicas
        .iter()
        .copied()
        .filter(|&n| (v.leaving)(n))
        .collect();
    let others_in_sync = v
        .replicas
        .iter()
        .filter(|&&n| n != v.leader && !(v.leaving)(n))
        .all(|&n| (v.in_sync)(n));
    let add = || v.candidates.first().map(|&n| Step::Add(n));
    if (v.leaving)(v.leader) {
        let heir = v
            .replicas
            .iter()
            .copied()
            .find(|&n| n != v.leader && !(v.leaving)(n) && (v.alive)(n) && (v.in_sync)(n));
        return match heir {
            Some(n) => Some(Step::Lead(n)),
            None if v.replicas.len() <= v.target => add(),
            None => None,
        };
    }
    let Some(&x) = leaving.first() else {
        return if v.replicas.len() < v.target {
            add()
        } else {
            None
        };
    };
    if v.replicas.len() > v.target {
        // A replica was added for X: X goes once the others all hold what is committed.
        return others_in_sync.then_some(Step::Remove(x));
    }
    if !(v.alive)(x) && v.replicas.len() > 1 {
        return Some(Step::Remove(x));
    }
    add()
}

impl Shipper {
    /// Starts this core's mover task (it ends with the shipper).
    pub fn start_mover(self: &Rc<Self>) {
        glommio::spawn_local(run(Rc::downgrade(self))).detach();
    }
}

async fn run(shipper: Weak<Shipper>) {
    // Per partition, the epoch at which a step was asked, and when.
    let mut asked: HashMap<(String, u32), (u64, Instant)> = HashMap::new();
    loop {
        glommio::timer::sleep(EVERY).await;
        let Some(shipper) = shipper.upgrade() else {
            return;
        };
        if shipper.is_stopped() {
            return;
        }
        let engine = shipper.engine().clone();
        let view = engine.cluster_view();
        if !view.nodes.iter().any(|n| n.draining) && asked.is_empty() {
            // Nothing is leaving: no partition lost a replica to a move either.
            continue;
        }
        let me = engine.node();
        let leaving = |n: NodeIndex| view.nodes.iter().any(|e| e.index == n && e.draining);
        let alive = |n: NodeIndex| engine.node_alive(n);
        let now = Instant::now();
        let led: Vec<(String, u32)> = shipper.streamed();
        asked.retain(|key, (_, at)| led.contains(key) && now.duration_since(*at) < RETRY_AFTER);
        let mut steps = Vec::new();
        for key in led {
            let Ok(topic) = engine.topic(&key.0) else {
                continue;
            };
            let p = key.1;
            let Some(partition) = topic.owned_partition(p) else {
                continue;
            };
            let epoch = topic.epoch(p);
            if !partition.replicated()
                || partition.deposed().is_some()
                || partition.round_under_way().is_some()
                || asked.get(&key).is_some_and(|(e, _)| *e == epoch)
            {
                continue;
            }
            let replicas = topic.replicas_of(p);
            let progress = partition.followers_progress();
            let commit = partition.readable_end();
            let in_sync = |n: NodeIndex| {
                alive(n)
                    && progress
                        .iter()
                        .any(|f| f.node == n && !f.learner && !f.lagging)
                    && partition.follower_counted(n) >= commit
            };
            // Live nodes that stay and hold no replica of the partition, the least loaded first (then by a hash of
            // the partition, so that many partitions moving at once spread out).
            let mut candidates: Vec<(u64, u32, NodeIndex)> = view
                .nodes
                .iter()
                .filter(|n| !n.draining && !replicas.contains(&n.index) && alive(n.index))
                .map(|n| {
                    let spread = crc32c::crc32c(format!("{}/{p}/{}", key.0, n.index).as_bytes());
                    (n.leads + n.follows, spread, n.index)
                })
                .collect();
            candidates.sort_unstable();
            let candidates: Vec<NodeIndex> = candidates.into_iter().map(|c| c.2).collect();
            let step = next_step(&PartitionView {
                replicas: &replicas,
                leader: me,
                target: topic.config().replicas.max(1) as usize,
                leaving: &leaving,
                alive: &alive,
                in_sync: &in_sync,
                candidates: &candidates,
            });
            let Some(step) = step else {
                continue;
            };
            let (leader, new) = match step {
                Step::Lead(n) => (n, Vec::new()),
                Step::Add(n) => (me, replicas.iter().copied().chain([n]).collect()),
                Step::Remove(n) => (me, replicas.iter().copied().filter(|&r| r != n).collect()),
            };
            info!(topic = %key.0, partition = p, epoch, ?step, "moving a replica off a leaving node");
            asked.insert(key.clone(), (epoch, now));
            steps.push(MoveLeader {
                topic: key.0.clone(),
                topic_id: topic.id(),
                partition: p,
                epoch,
                leader,
                replicas: new,
            });
        }
        let router = shipper.router.clone();
        drop(shipper);
        for step in steps {
            let (topic, p) = (step.topic.clone(), step.partition);
            match router
                .call(Location { node: me, core: 0 }, Request::MoveLeader(step))
                .await
            {
                Ok(Reply::Done) => {}
                other => {
                    warn!(topic = %topic, partition = p, answer = ?other.map(|_| ()), "a replica move could not be written; it is tried again")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(
        replicas: &[NodeIndex],
        leader: NodeIndex,
        target: usize,
        leaving: &[NodeIndex],
        dead: &[NodeIndex],
        behind: &[NodeIndex],
        candidates: &[NodeIndex],
    ) -> Option<Step> {
        next_step(&PartitionView {
            replicas,
            leader,
            target,
            leaving: &|n| leaving.contains(&n),
            alive: &|n| !dead.contains(&n),
            in_sync: &|n| !behind.contains(&n) && !dead.contains(&n),
            candidates,
        })
    }

    #[test]
    fn a_live_leaving_follower_is_replaced_by_adding_first_then_removing_once_the_new_one_is_in_sync(
    ) {
        // R = 3 on 0, 1, 2; node 2 drains; node 3 is free.
        assert_eq!(
            step(&[0, 1, 2], 0, 3, &[2], &[], &[], &[3]),
            Some(Step::Add(3))
        );
        // Four replicas, 3 still a learner: nothing goes yet.
        assert_eq!(step(&[0, 1, 2, 3], 0, 3, &[2], &[], &[3], &[]), None);
        // 3 caught up: 2 goes.
        assert_eq!(
            step(&[0, 1, 2, 3], 0, 3, &[2], &[], &[], &[]),
            Some(Step::Remove(2))
        );
        // Done: R replicas, none leaving.
        assert_eq!(step(&[0, 1, 3], 0, 3, &[2], &[], &[], &[4]), None);
        // No node to move to: it waits.
        assert_eq!(step(&[0, 1, 2], 0, 3, &[2], &[], &[], &[]), None);
    }

    #[test]
    fn a_leaving_leader_hands_its_leadership_to_an_in_sync_follower_first() {
        assert_eq!(
            step(&[0, 1, 2], 0, 3, &[0], &[], &[], &[3]),
            Some(Step::Lead(1))
        );
        // Follower 1 behind: 2.
        assert_eq!(
            step(&[0, 1, 2], 0, 3, &[0], &[], &[1], &[3]),
            Some(Step::Lead(2))
        );
        // None in sync: a replica is added first, then the leadership goes once one is in sync.
        assert_eq!(
            step(&[0, 1, 2], 0, 3, &[0], &[], &[1, 2], &[3]),
            Some(Step::Add(3))
        );
        assert_eq!(step(&[0, 1, 2, 3], 0, 3, &[0], &[], &[1, 2, 3], &[]), None);
        assert_eq!(
            step(&[0, 1, 2, 3], 0, 3, &[0], &[], &[1, 2], &[]),
            Some(Step::Lead(3))
        );
        // A leaving follower is never the heir.
        assert_eq!(
            step(&[0, 1, 2], 0, 3, &[0, 1], &[], &[], &[3]),
            Some(Step::Lead(2))
        );
    }

    #[test]
    fn a_dead_leaving_node_is_removed_first_and_the_partition_is_brought_back_to_r() {
        assert_eq!(
            step(&[0, 1, 2], 0, 3, &[2], &[2], &[], &[3]),
            Some(Step::Remove(2))
        );
        assert_eq!(
            step(&[0, 1], 0, 3, &[2], &[2], &[], &[3]),
            Some(Step::Add(3))
        );
        assert_eq!(step(&[0, 1, 3], 0, 3, &[2], &[2], &[3], &[]), None);
        // A partition of one replica never loses its last one.
        assert_eq!(step(&[2], 2, 1, &[], &[], &[], &[3]), None);
    }

    #[test]
    fn every_step_changes_one_member_and_consecutive_majorities_overlap() {
        // Walk every drain of one node of R = 3 over five nodes, with the learner catching up between steps: each
        // step's replica set differs from the one before by one node, so a majority of each meets a majority of the
        // previous one.
        for target in 1..=3usize {
            for drained in 0..target as NodeIndex {
                let mut replicas: Vec<NodeIndex> = (0..target as NodeIndex).collect();
                let mut leader = 0;
                for _ in 0..10 {
                    let candidates: Vec<NodeIndex> = (0..5)
                        .filter(|n| !replicas.contains(n) && *n != drained)
                        .collect();
                    let Some(s) =
                        step(&replicas, leader, target, &[drained], &[], &[], &candidates)
                    else {
                        break;
                    };
                    let before = replicas.clone();
                    match s {
                        Step::Lead(n) => leader = n,
                        Step::Add(n) => replicas.push(n),
                        Step::Remove(n) => replicas.retain(|&r| r != n),
                    }
                    let changed = before.iter().filter(|n| !replicas.contains(n)).count()
                        + replicas.iter().filter(|n| !before.contains(n)).count();
                    assert!(changed <= 1, "{before:?} -> {replicas:?}");
                    assert!(replicas.contains(&leader));
                }
                assert!(!replicas.contains(&drained), "R = {target}: {replicas:?}");
                assert_eq!(replicas.len(), target);
            }
        }
    }
}
