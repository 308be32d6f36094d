//! Moving replicas off a drained or removed node (`POST /cluster/nodes/ID/drain`, `DELETE /cluster/nodes/ID`;
//! `docs/replication.md`, step 5). The metastore only says which nodes are leaving (`drains/<id>`); each partition's
//! leader moves its own partition, one replica at a time, each step one etcd transaction at a new epoch
//! (`Request::MoveLeader` with the new replica set, through core 0: only if the partition is still at the epoch the
//! leader read), so every change of replica set is fenced like any change of leadership: the leader runs its fencing
//! round with the new set before it serves again.
//!
//! The steps ([`next_step`]), for a partition of R replicas:
//! - a learner of the partition key (a replica a move added: it takes batches and counts for the commit once it
//!   holds them, but never votes in a fencing round or an election, nor leads) that is dead is removed, and one that
//!   is caught up (promoted by its leader, counted up to the commit offset) is promoted in the key: it votes; while
//!   one catches up, nothing else changes;
//! - a leader that is itself leaving hands its leadership to a voter in sync; with none, a replica is added first;
//! - a live leaving replica X is replaced: a learner Y is added on another node (no majority changes), promoted once
//!   in sync (the voters grow by one), and X is removed once every other replica is in sync (they shrink by one):
//!   the partition keeps R in-sync replicas throughout;
//! - a leaving replica without a session (gone, as `DELETE` says) is removed first (one voter less: the new
//!   majority overlaps every old one), then a learner is added;
//! - a partition below R replicas gains one.
//!
//! One member or one vote changes per step, so the voters' majorities of any two consecutive replica sets overlap.
//! A new replica goes to a live node that is not leaving and not a replica yet, the one holding the fewest replicas
//! first.

use super::replicate::Shipper;
use crate::engine::placement::{Location, NodeIndex, MAX_REPLICAS};
use crate::ops::replicate::MoveLeader;
use crate::ops::{Reply, Request};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;
use tracing::{info, warn};

/// How often a core looks at the partitions it leads.
const EVERY: Duration = Duration::from_millis(500);

/// A step asked for and not seen applied (the partition's epoch has not moved) is asked again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The next change to one partition's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The leadership goes to this in-sync voter (the leader is leaving).
    Lead(NodeIndex),
    /// This node becomes a replica, as a learner (it votes once promoted).
    Add(NodeIndex),
    /// This learner, caught up, votes from now on.
    Promote(NodeIndex),
    /// This node is a replica no more.
    Remove(NodeIndex),
}

/// One partition as its leader sees it.
pub struct PartitionView<'a> {
    pub replicas: &'a [NodeIndex],
    /// Those of them that do not vote yet (the partition key's learners).
    pub learners: &'a [NodeIndex],
    pub leader: NodeIndex,
    /// The topic's replica count R.
    pub target: usize,
    pub leaving: &'a dyn Fn(NodeIndex) -> bool,
    pub alive: &'a dyn Fn(NodeIndex) -> bool,
    /// A follower that holds everything committed and answers as a replica (promoted, not lagging).
    pub in_sync: &'a dyn Fn(NodeIndex) -> bool,
    /// Nodes that could take a replica, best first (live, not leaving, not replicas yet).
    pub candidates: &'a [NodeIndex],
}

/// The next step for a partition, or None (nothing to do, or waiting: for a learner to be caught up, for a node
/// to move to).
pub fn next_step(v: &PartitionView) -> Option<Step> {
    // Learners first: a dead one goes (it holds up the commit, which counts it), a caught-up one votes; while one
    // is catching up, nothing else changes (one member at a time).
    if let Some(&dead) = v.learners.iter().find(|&&l| !(v.alive)(l)) {
        return Some(Step::Remove(dead));
    }
    if let Some(&ready) = v.learners.iter().find(|&&l| (v.in_sync)(l)) {
        return Some(Step::Promote(ready));
    }
    // A voter without a session in a set larger than R (the one a move added, or the one it is moving off) goes: a
    // move that waits for it would wait for good (with two voters, every commit needed both).
    if v.replicas.len() > v.target {
        if let Some(&dead) = v
            .replicas
            .iter()
            .find(|&&n| n != v.leader && !v.learners.contains(&n) && !(v.alive)(n))
        {
            return Some(Step::Remove(dead));
        }
    }
    let room = v.learners.is_empty() && v.replicas.len() < MAX_REPLICAS;
    let add = || {
        room.then(|| v.candidates.first().map(|&n| Step::Add(n)))
            .flatten()
    };
    if (v.leaving)(v.leader) {
        let heir = v.replicas.iter().copied().find(|&n| {
            n != v.leader
                && !v.learners.contains(&n)
                && !(v.leaving)(n)
                && (v.alive)(n)
                && (v.in_sync)(n)
        });
        return match heir {
            Some(n) => Some(Step::Lead(n)),
            None if v.replicas.len() <= v.target => add(),
            None => None,
        };
    }
    let Some(x) = v.replicas.iter().copied().find(|&n| (v.leaving)(n)) else {
        return if v.replicas.len() < v.target {
            add()
        } else {
            None
        };
    };
    if !v.learners.is_empty() {
        return None;
    }
    if v.replicas.len() > v.target {
        // A replica was added for X: X goes once the others all hold what is committed.
        let others_in_sync = v
            .replicas
            .iter()
            .filter(|&&n| n != v.leader && !(v.leaving)(n))
            .all(|&n| (v.in_sync)(n));
        return others_in_sync.then_some(Step::Remove(x));
    }
    if (!(v.alive)(x) || v.replicas.len() >= MAX_REPLICAS) && v.replicas.len() > 1 {
        // Gone (no point waiting for it to be in sync), or no room for one more: it goes first.
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
    let mut asked: HashMap<(String, u32), (u64, u64)> = HashMap::new();
    loop {
        // On the engine's clock (the simulation's manual one under it); the shipper is not held while asleep.
        let Some(clock) = shipper.upgrade().map(|s| s.engine().clock().clone()) else {
            return;
        };
        clock
            .sleep_until(clock.now_ms() + EVERY.as_millis() as u64)
            .await;
        let Some(shipper) = shipper.upgrade() else {
            return;
        };
        if shipper.is_stopped() {
            return;
        }
        let engine = shipper.engine().clone();
        if !engine.clustered() {
            continue;
        }
        let view = engine.cluster_view();
        let me = engine.node();
        let leaving = |n: NodeIndex| view.nodes.iter().any(|e| e.index == n && e.draining);
        let alive = |n: NodeIndex| engine.node_alive(n);
        let now = engine.now_ms();
        asked.retain(|_, (_, at)| now.saturating_sub(*at) < RETRY_AFTER.as_millis() as u64);
        let mut steps = Vec::new();
        for name in engine.topic_names() {
            let Ok(topic) = engine.topic(&name) else {
                continue;
            };
            let states = topic.states();
            let target = topic.config().replicas.max(1) as usize;
            for p in topic.owned().iter().copied() {
                let Some(state) = states.get(p as usize) else {
                    continue;
                };
                // Only partitions with a replica leaving, a learner, or not at R replicas: all others as they should be.
                if state.learners.is_empty()
                    && state.replicas.len() == target
                    && !state.replicas.iter().any(|&n| leaving(n))
                {
                    continue;
                }
                let Some(partition) = topic.owned_partition(p) else {
                    continue;
                };
                let key = (name.clone(), p);
                let epoch = state.epoch;
                if state.leader != me
                    || partition.deposed().is_some()
                    || partition.round_under_way().is_some()
                    || asked.get(&key).is_some_and(|(e, _)| *e == epoch)
                {
                    continue;
                }
                let progress = partition.followers_progress();
                let commit = partition.readable_end();
                let settled = partition.commit_settled();
                let in_sync = |n: NodeIndex| {
                    settled
                        && alive(n)
                        && progress
                            .iter()
                            .any(|f| f.node == n && !f.learner && !f.lagging && !f.poisoned)
                        && partition.follower_counted(n) >= commit
                };
                // Live nodes that stay and hold no replica of the partition, the least loaded first (then by a hash
                // of the partition, so that many partitions moving at once spread out).
                let mut candidates: Vec<(u64, u32, NodeIndex)> = view
                    .nodes
                    .iter()
                    .filter(|n| !n.draining && !state.replicas.contains(&n.index) && alive(n.index))
                    .map(|n| {
                        let spread = crc32c::crc32c(format!("{name}/{p}/{}", n.index).as_bytes());
                        (n.leads + n.follows, spread, n.index)
                    })
                    .collect();
                candidates.sort_unstable();
                // A new replica starts its log at the leader's start, and is filled with the leader's segments from
                // there (`front::replicate`, a restart probe), whatever retention removed.
                let candidates: Vec<NodeIndex> = candidates.into_iter().map(|c| c.2).collect();
                let step = next_step(&PartitionView {
                    replicas: &state.replicas,
                    learners: &state.learners,
                    leader: me,
                    target,
                    leaving: &leaving,
                    alive: &alive,
                    in_sync: &in_sync,
                    candidates: &candidates,
                });
                let Some(step) = step else {
                    continue;
                };
                let (replicas, learners) = (&state.replicas, &state.learners);
                let without = |n: NodeIndex, of: &[NodeIndex]| -> Vec<NodeIndex> {
                    of.iter().copied().filter(|&r| r != n).collect()
                };
                let (leader, new, learners) = match step {
                    Step::Lead(n) => (n, Vec::new(), Vec::new()),
                    Step::Add(n) => (
                        me,
                        replicas.iter().copied().chain([n]).collect(),
                        learners.iter().copied().chain([n]).collect(),
                    ),
                    Step::Promote(n) => (me, replicas.clone(), without(n, learners)),
                    Step::Remove(n) => (me, without(n, replicas), without(n, learners)),
                };
                info!(topic = %name, partition = p, epoch, ?step, "changing a partition's replicas (a node is leaving, or a replica is missing)");
                asked.insert(key, (epoch, now));
                steps.push(MoveLeader {
                    topic: name.clone(),
                    topic_id: topic.id(),
                    partition: p,
                    epoch,
                    leader,
                    replicas: new,
                    learners,
                });
            }
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
                    warn!(topic = %topic, partition = p, answer = ?other.map(|_| ()), "a change of replicas could not be written; it is tried again")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next step for `replicas` (learners: `learning`) led by `leader` at R = `target`, with `leaving`, `dead`
    /// and (not in sync) `behind` nodes, and `candidates` to move to.
    #[allow(clippy::too_many_arguments)]
    fn step(
        replicas: &[NodeIndex],
        learning: &[NodeIndex],
        leader: NodeIndex,
        target: usize,
        leaving: &[NodeIndex],
        dead: &[NodeIndex],
        behind: &[NodeIndex],
        candidates: &[NodeIndex],
    ) -> Option<Step> {
        next_step(&PartitionView {
            replicas,
            learners: learning,
            leader,
            target,
            leaving: &|n| leaving.contains(&n),
            alive: &|n| !dead.contains(&n),
            in_sync: &|n| !behind.contains(&n) && !dead.contains(&n),
            candidates,
        })
    }

    #[test]
    fn a_live_leaving_follower_is_replaced_by_a_learner_promoted_once_in_sync_then_removed() {
        // R = 3 on 0, 1, 2; node 2 drains; node 3 is free.
        assert_eq!(
            step(&[0, 1, 2], &[], 0, 3, &[2], &[], &[], &[3]),
            Some(Step::Add(3))
        );
        // Four replicas, 3 a learner still catching up: nothing changes.
        assert_eq!(step(&[0, 1, 2, 3], &[3], 0, 3, &[2], &[], &[3], &[]), None);
        // 3 caught up: it votes, then 2 goes.
        assert_eq!(
            step(&[0, 1, 2, 3], &[3], 0, 3, &[2], &[], &[], &[]),
            Some(Step::Promote(3))
        );
        assert_eq!(
            step(&[0, 1, 2, 3], &[], 0, 3, &[2], &[], &[], &[]),
            Some(Step::Remove(2))
        );
        // ...but not while another replica is behind.
        assert_eq!(step(&[0, 1, 2, 3], &[], 0, 3, &[2], &[], &[1], &[]), None);
        // Done: R replicas, none leaving.
        assert_eq!(step(&[0, 1, 3], &[], 0, 3, &[2], &[], &[], &[4]), None);
        // No node to move to: it waits.
        assert_eq!(step(&[0, 1, 2], &[], 0, 3, &[2], &[], &[], &[]), None);
        // A learner that died goes (a new one is added after).
        assert_eq!(
            step(&[0, 1, 2, 3], &[3], 0, 3, &[2], &[3], &[], &[4]),
            Some(Step::Remove(3))
        );
        // So does a promoted one, or the leaving one, once dead in a set larger than R.
        assert_eq!(
            step(&[0, 1, 2, 3], &[], 0, 3, &[2], &[3], &[], &[4]),
            Some(Step::Remove(3))
        );
        assert_eq!(
            step(&[0, 1, 2, 3], &[], 0, 3, &[2], &[2], &[], &[4]),
            Some(Step::Remove(2))
        );
        // R = 1 moving, its new replica promoted and then dead: the leaving leader drops it rather than wait.
        assert_eq!(
            step(&[0, 3], &[], 0, 1, &[0], &[3], &[], &[4]),
            Some(Step::Remove(3))
        );
    }

    #[test]
    fn a_leaving_leader_hands_its_leadership_to_an_in_sync_voter_first() {
        assert_eq!(
            step(&[0, 1, 2], &[], 0, 3, &[0], &[], &[], &[3]),
            Some(Step::Lead(1))
        );
        // Follower 1 behind: 2.
        assert_eq!(
            step(&[0, 1, 2], &[], 0, 3, &[0], &[], &[1], &[3]),
            Some(Step::Lead(2))
        );
        // None in sync: a replica is added first, then the leadership goes once one is in sync.
        assert_eq!(
            step(&[0, 1, 2], &[], 0, 3, &[0], &[], &[1, 2], &[3]),
            Some(Step::Add(3))
        );
        assert_eq!(
            step(&[0, 1, 2, 3], &[3], 0, 3, &[0], &[], &[1, 2, 3], &[]),
            None
        );
        assert_eq!(
            step(&[0, 1, 2, 3], &[3], 0, 3, &[0], &[], &[1, 2], &[]),
            Some(Step::Promote(3))
        );
        assert_eq!(
            step(&[0, 1, 2, 3], &[], 0, 3, &[0], &[], &[1, 2], &[]),
            Some(Step::Lead(3))
        );
        // A leaving follower or a learner is never the heir.
        assert_eq!(
            step(&[0, 1, 2], &[], 0, 3, &[0, 1], &[], &[], &[3]),
            Some(Step::Lead(2))
        );
        // R = 1: a learner is added, promoted, and leads.
        assert_eq!(
            step(&[0], &[], 0, 1, &[0], &[], &[], &[3]),
            Some(Step::Add(3))
        );
        assert_eq!(
            step(&[0, 3], &[3], 0, 1, &[0], &[], &[], &[]),
            Some(Step::Promote(3))
        );
        assert_eq!(
            step(&[0, 3], &[], 0, 1, &[0], &[], &[], &[]),
            Some(Step::Lead(3))
        );
    }

    #[test]
    fn a_dead_leaving_node_is_removed_first_and_the_partition_is_brought_back_to_r() {
        assert_eq!(
            step(&[0, 1, 2], &[], 0, 3, &[2], &[2], &[], &[3]),
            Some(Step::Remove(2))
        );
        assert_eq!(
            step(&[0, 1], &[], 0, 3, &[2], &[2], &[], &[3]),
            Some(Step::Add(3))
        );
        assert_eq!(step(&[0, 1, 3], &[3], 0, 3, &[2], &[2], &[3], &[]), None);
        // A partition of one replica never loses its last one.
        assert_eq!(step(&[2], &[], 2, 1, &[], &[], &[], &[3]), None);
        // R = MAX_REPLICAS: no room for one more, so a live leaving one goes first.
        let full: Vec<NodeIndex> = (0..MAX_REPLICAS as NodeIndex).collect();
        assert_eq!(
            step(&full, &[], 0, MAX_REPLICAS, &[3], &[], &[], &[9]),
            Some(Step::Remove(3))
        );
    }

    #[test]
    fn every_step_changes_one_member_or_one_vote_and_consecutive_majorities_overlap() {
        // Walk every drain of one node of R = 1 to 3 over five nodes, the learner catching up between steps: each
        // step changes one replica or one replica's vote, so a majority of the voters of each set meets a majority
        // of the voters of the one before; the leader always votes.
        for target in 1..=3usize {
            for drained in 0..target as NodeIndex {
                let mut replicas: Vec<NodeIndex> = (0..target as NodeIndex).collect();
                let mut learners: Vec<NodeIndex> = Vec::new();
                let mut leader = 0;
                for _ in 0..12 {
                    let candidates: Vec<NodeIndex> = (0..5)
                        .filter(|n| !replicas.contains(n) && *n != drained)
                        .collect();
                    let Some(s) = step(
                        &replicas,
                        &learners,
                        leader,
                        target,
                        &[drained],
                        &[],
                        &[],
                        &candidates,
                    ) else {
                        break;
                    };
                    let voters = |r: &[NodeIndex], l: &[NodeIndex]| -> Vec<NodeIndex> {
                        r.iter().copied().filter(|n| !l.contains(n)).collect()
                    };
                    let (before_r, before_v) = (replicas.clone(), voters(&replicas, &learners));
                    match s {
                        Step::Lead(n) => leader = n,
                        Step::Add(n) => {
                            replicas.push(n);
                            learners.push(n);
                        }
                        Step::Promote(n) => learners.retain(|&l| l != n),
                        Step::Remove(n) => {
                            replicas.retain(|&r| r != n);
                            learners.retain(|&l| l != n);
                        }
                    }
                    let after_v = voters(&replicas, &learners);
                    let changed = before_v.iter().filter(|n| !after_v.contains(n)).count()
                        + after_v.iter().filter(|n| !before_v.contains(n)).count();
                    assert!(changed <= 1, "voters {before_v:?} -> {after_v:?}");
                    let members = before_r.iter().filter(|n| !replicas.contains(n)).count()
                        + replicas.iter().filter(|n| !before_r.contains(n)).count();
                    assert!(members <= 1, "{before_r:?} -> {replicas:?}");
                    assert!(
                        after_v.contains(&leader),
                        "the leader {leader} votes: {after_v:?}"
                    );
                }
                assert!(!replicas.contains(&drained), "R = {target}: {replicas:?}");
                assert_eq!((replicas.len(), learners.len()), (target, 0));
            }
        }
    }
}
