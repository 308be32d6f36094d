//! The fencing round (`docs/replication.md`, step 4), the new leader's side: a replica named leader of a replicated
//! partition at a new epoch (by an election, a transfer, or a view it starts with) serves nothing until it has fenced
//! a majority of the partition's replicas at that epoch and found its own log the greatest among them.
//!
//! It sends `BeginEpoch` to every other replica (each raises its durable epoch floor, so no older leader can count
//! it from then on, an old leader is deposed, and each answers its log's end and epoch: `ops::replicate::begin_epoch`),
//! raises its own floor, and ranks the answers with its own by (epoch, end) (`Partition::rank`). With a majority
//! answered (itself included):
//! - its log the greatest: it serves (`Engine::finish_round`: its history records where its epoch starts, and its
//!   commit offset moves only once a majority holds everything below that start);
//! - another replica's greater: it hands the leadership to that replica (core 0 writes the partition key naming it,
//!   at a newer epoch, `Request::MoveLeader`), which then runs its own round. Each hand-over goes to a strictly
//!   greater log, so they end. Replicas whose node is live are preferred when they alone make a majority (a replica
//!   that answered but whose session lapsed would be named leader only to be replaced again).
//!
//! Any acknowledged record is on a majority, and any two majorities share a replica, so the greatest log of a
//! majority holds every acknowledged record: the new leader serves them all, and loses none. Without a majority
//! it retries (50 ms doubling to 1 s) for as long as the partition's metadata names it leader at that epoch.

use super::replicate::Shipper;
use crate::engine::placement::{replica_core, Location, NodeIndex};
use crate::engine::{EngineError, RoundOf};
use crate::ops::replicate::{Began, BeginEpoch, FrontierMark, MoveLeader, MAX_FRONTIER_MARKS};
use crate::ops::{OpError, Reply, Request};
use crate::partition::{nonces, PartitionError};
use std::rc::Rc;
use std::time::Duration;
use tracing::{info, warn};

const FIRST_RETRY: Duration = Duration::from_millis(50);
const LAST_RETRY: Duration = Duration::from_secs(1);
/// How long a fencing round (or a nonce promise) waits for the other replicas' answers once a majority answered
/// (`Shipper::fence_others`).
pub const ROUND_GRACE: Duration = Duration::from_millis(100);

/// A replica's answer to a round's `BeginEpoch`.
type Answer = (NodeIndex, Result<Reply, OpError>);

/// What a round found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Fewer than a majority answered.
    NoMajority,
    /// This replica's log is the greatest of a majority: it leads.
    Lead,
    /// Node `.0`'s log is greater: it should lead.
    HandTo(NodeIndex),
}

/// Ranks a round's answers: `mine` is this replica's (epoch, end) and whether it is a learner, `answers` the other
/// replicas' with whether their node is live. A majority of `replicas` must have answered, this one included, not
/// counting learners (`storage::learner`: replicas on a new disk that no leader has caught up yet), which are never
/// ranked either: an empty log in a majority could otherwise make a log that lacks acknowledged records the
/// greatest. A learner that won an election hands the leadership to the greatest log.
pub fn decide(
    me: NodeIndex,
    mine: (u64, u64),
    me_learner: bool,
    answers: &[(NodeIndex, Began, bool)],
    replicas: usize,
) -> Outcome {
    let majority = replicas / 2 + 1;
    let own = usize::from(!me_learner);
    let voters: Vec<&(NodeIndex, Began, bool)> = answers.iter().filter(|a| !a.1.learner).collect();
    if own + voters.len() < majority {
        return Outcome::NoMajority;
    }
    let live = voters.iter().filter(|a| a.2).count();
    let pool: Vec<(NodeIndex, (u64, u64))> = (!me_learner)
        .then_some((me, mine))
        .into_iter()
        .chain(
            voters
                .iter()
                .filter(|a| a.2 || own + live < majority)
                .map(|(n, b, _)| (*n, (b.last_epoch, b.end))),
        )
        .collect();
    assert!(pool.len() >= majority, "a round decides over a majority");
    // The greatest; this replica wins ties (it need not hand over for an equal log).
    let (best, rank) = pool
        .iter()
        .copied()
        .fold(pool[0], |acc, x| if x.1 > acc.1 { x } else { acc });
    if !me_learner && (best == me || rank <= mine) {
        Outcome::Lead
    } else if answers.iter().any(|a| a.0 == best && a.2) {
        Outcome::HandTo(best)
    } else {
        // The greatest log is on a node without a session: named leader it would only be replaced again. The round
        // runs again (its node registers again, or a majority of live ones answers without it).
        Outcome::NoMajority
    }
}

/// The topic and this core's partition that `round` names, if the topic is still the one it was made for.
fn owned_here(
    engine: &crate::engine::Engine,
    round: &RoundOf,
) -> Option<(
    Rc<crate::engine::topic::Topic>,
    Rc<crate::partition::Partition>,
)> {
    engine
        .topic(&round.topic)
        .ok()
        .filter(|t| t.id() == round.topic_id)
        .and_then(|t| Some((t.clone(), t.owned_partition(round.partition)?)))
}

/// [`owned_here`], while the partition's metadata names this node leader at `round`'s epoch; Err(the partition,
/// if still owned here) otherwise.
#[allow(clippy::type_complexity)]
fn named_here(
    engine: &crate::engine::Engine,
    round: &RoundOf,
) -> Result<
    (
        Rc<crate::engine::topic::Topic>,
        Rc<crate::partition::Partition>,
    ),
    Option<Rc<crate::partition::Partition>>,
> {
    let (topic, partition) = owned_here(engine, round).ok_or(None)?;
    if topic.epoch(round.partition) != round.epoch
        || topic.location(round.partition).node != engine.node()
    {
        return Err(Some(partition));
    }
    Ok((topic, partition))
}

impl Shipper {
    /// Starts the fencing round of `round` on this core (its own task).
    pub(crate) fn round(self: &Rc<Self>, round: RoundOf) {
        let shipper = self.clone();
        glommio::spawn_local(async move { shipper.run_round(round).await }).detach();
    }

    async fn run_round(self: Rc<Self>, round: RoundOf) {
        let mut delay = FIRST_RETRY;
        // Where its nonces may start (this replica's own promises and nonces, before this round's) and the ceiling
        // it asks for: fixed for the whole round, so that retries do not raise them (each would move the
        // partition's nonces a block further up).
        let mut nonce_plan: Option<(u64, u64)> = None;
        let mut own_floor: Option<u64> = None;
        loop {
            let engine = self.engine().clone();
            let me = engine.node();
            // Still this replica's to begin? (A newer view may have moved the leadership, or won it already.)
            let (topic, partition) = match named_here(&engine, &round) {
                Ok(found) if found.1.round_under_way() == Some(round.epoch) => found,
                Ok((_, partition)) | Err(Some(partition)) => {
                    partition.round_abandoned(round.epoch);
                    return;
                }
                Err(None) => return,
            };
            let replicas = topic.replicas_of(round.partition);
            let states = topic.states();
            // Learners the partition key names (added by a move, not promoted yet) neither count nor rank, whatever
            // they answer: the majority is over the voters.
            let learners = states
                .get(round.partition as usize)
                .map(|s| s.learners.clone())
                .unwrap_or_default();
            let mut answers = Vec::new();
            // The nonce ceiling this leadership asks its replicas to promise (`partition/nonces.rs`), and where its
            // own promises and nonces stand before it.
            let (own_nonces, mut asked) =
                *nonce_plan.get_or_insert_with(|| (partition.nonce_floor(), partition.nonce_ask()));
            // Its own epoch floor before this round first raised it (`Began::floor`).
            let own_floor = *own_floor.get_or_insert_with(|| partition.epoch_floor());
            let outcome = match partition.raise_fence(round.epoch, asked).await {
                Err(e) => {
                    warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, error = %e, "a fencing round cannot raise its own epoch floor");
                    Outcome::NoMajority
                }
                Ok(()) if partition.epoch_floor() > round.epoch => {
                    // This replica answered a newer leadership's round already: it leads no more.
                    warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, floor = partition.epoch_floor(), "a newer leadership fenced this replica: this fencing round ends");
                    partition.depose(partition.epoch_floor());
                    partition.round_abandoned(round.epoch);
                    return;
                }
                // Planted (`crate::planted`): leads without fencing anyone or ranking any log.
                Ok(()) if crate::planted::planted(crate::planted::Bug::NoFencing) => Outcome::Lead,
                Ok(()) => {
                    // (A replica whose log refuses appends counts as a learner: it hands over.)
                    let me_learner = partition.is_learner()
                        || partition.log.is_poisoned()
                        || learners.contains(&me);
                    let voters = replicas.len() - learners.len();
                    let need = (voters / 2 + 1).saturating_sub(usize::from(!me_learner));
                    let fenced = self
                        .fence_others(&round, &replicas, &states, asked, need)
                        .await;
                    answers = match fenced {
                        Ok(answers) => answers,
                        Err(known) => {
                            // A newer leadership fenced a replica first: this one ends here (its view follows).
                            warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, known, "a newer leadership began: this fencing round ends");
                            partition.depose(known);
                            partition.round_abandoned(round.epoch);
                            return;
                        }
                    };
                    for (node, b, _) in &mut answers {
                        if learners.contains(node) {
                            b.learner = true;
                        }
                    }
                    decide(me, partition.rank(), me_learner, &answers, voters)
                }
            };
            // Its nonces start above every ceiling the answers promised to older leaderships; when an old leader's
            // ceiling leaves too little room below the one asked, a higher one is promised first.
            let mut window = None;
            if outcome == Outcome::Lead {
                let promised: Vec<u64> = answers.iter().map(|a| a.1.nonces).collect();
                match nonces::window_from(own_nonces, &promised, asked) {
                    Ok(w) => window = Some(w),
                    Err(start) => {
                        asked = start.saturating_add(nonces::NONCE_BLOCK);
                        nonce_plan = Some((own_nonces, asked));
                        info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, start, "an older leadership's nonce ceiling is above this round's: a higher one is promised");
                        match self
                            .promise_nonces(&round, &partition, &replicas, &states, asked)
                            .await
                        {
                            Ok(true) => window = Some((start, asked)),
                            Ok(false) => {}
                            Err(known) => {
                                partition.depose(known);
                                partition.round_abandoned(round.epoch);
                                return;
                            }
                        }
                    }
                }
            }
            // Looked at again after the awaits.
            if partition.round_under_way() != Some(round.epoch) {
                return;
            }
            match outcome {
                Outcome::Lead if window.is_none() => {
                    info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, "fencing round won, but no majority promised its nonce ceiling; the round runs again")
                }
                Outcome::Lead => match self.raise_frontiers(&round, &partition, &answers).await {
                    Err(e) => {
                        warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, error = %e, "fencing round won, but its groups' frontiers cannot be raised yet; the round runs again")
                    }
                    Ok(()) => {
                        // It waits out a predecessor's lease (`partition/lease.rs`) unless it led the epoch before
                        // this one's round and no floor it met is above that: then no other leadership served in
                        // between (its round would have raised a floor of this majority past it).
                        let led = partition.leading_epoch();
                        let others = led == 0
                            // (An end of this very round that failed after it was begun: as any other.)
                            || led >= round.epoch
                            || own_floor > led
                            || answers.iter().any(|(_, b, _)| b.floor > led);
                        partition.wait_out_predecessor_next(others);
                        match engine.finish_round(&round, window.expect("checked")).await {
                            Ok(()) => {
                                info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, "fencing round won: this node leads the partition");
                                return;
                            }
                            Err(e) => {
                                warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, error = %e, "fencing round won, but the partition cannot serve yet; the round runs again")
                            }
                        }
                    }
                },
                Outcome::HandTo(node) => {
                    info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, to = node, "a replica's log is greater: the leadership goes to it");
                    match self.move_leader_to(&round, node).await {
                        Ok(_) => {
                            // Moved (or moved on by someone else first): the view that follows makes this
                            // replica a follower.
                            partition.round_abandoned(round.epoch);
                            return;
                        }
                        Err(e) => {
                            warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, error = %e, "cannot hand the leadership over; the round runs again")
                        }
                    }
                }
                Outcome::NoMajority => {
                    info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, "a fencing round found no majority; it runs again")
                }
            }
            self.engine().sleep(delay).await;
            delay = (delay * 2).min(LAST_RETRY);
        }
    }
}

impl Shipper {
    /// Asks this node's core 0 to name `node` leader of `round`'s partition at a newer epoch, if the partition is
    /// still at `round`'s epoch (an etcd transaction: `Request::MoveLeader`).
    async fn move_leader_to(&self, round: &RoundOf, node: NodeIndex) -> Result<Reply, OpError> {
        let request = Request::MoveLeader(MoveLeader {
            topic: round.topic.clone(),
            topic_id: round.topic_id,
            partition: round.partition,
            epoch: round.epoch,
            leader: node,
            replicas: Vec::new(),
            learners: Vec::new(),
        });
        let me = self.engine().node();
        self.router
            .call(Location { node: me, core: 0 }, request)
            .await
    }

    /// Starts the renewal of a leadership this node held at `round`'s epoch before it restarted (`Ship::Renew`),
    /// in its own task.
    pub(crate) fn renew(self: &Rc<Self>, round: RoundOf) {
        let shipper = self.clone();
        glommio::spawn_local(async move { shipper.run_renew(round).await }).detach();
    }

    /// Asks core 0 to name this node leader again at a newer epoch (`Request::MoveLeader` to itself: an etcd
    /// transaction, written only while the partition key is still at `round`'s epoch), again and again (50 ms
    /// doubling to 1 s) while the partition waits here at that epoch: the view that brings the newer epoch starts
    /// its fencing round (`engine/admin.rs`), and one that names another leader ends the wait. It serves nothing
    /// meanwhile (`Partition::prepare_to_lead`).
    async fn run_renew(self: Rc<Self>, round: RoundOf) {
        let mut delay = FIRST_RETRY;
        loop {
            let engine = self.engine().clone();
            let me = engine.node();
            match named_here(&engine, &round) {
                Ok((_, partition)) if partition.renewing() == Some(round.epoch) => {}
                _ => return,
            }
            match self.move_leader_to(&round, me).await {
                Ok(_) => {
                    info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, "a leader that restarted asked to lead at a newer epoch")
                }
                Err(e) => {
                    warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, error = %e, "a leader that restarted cannot ask for a newer epoch yet; it asks again")
                }
            }
            self.engine().sleep(delay).await;
            delay = (delay * 2).min(LAST_RETRY);
        }
    }

    /// Sends `BeginEpoch` at `round`'s epoch, asking for the nonce ceiling `nonces`, to every replica of the
    /// partition but this one, and gathers the answers with whether each node is live. Err(known): a replica
    /// answered that a newer leadership (`known`) fenced it.
    ///
    /// It does not wait out a replica that does not answer (a stopped process, a cut link: each call ends only at
    /// the node RPC timeout) once it has enough: when `need` live voters (replicas that are not learners, whose node
    /// is live) have answered `Began` (with this replica's own, a majority of the voters), it waits [`ROUND_GRACE`]
    /// more for the others and goes on with what came. A majority is all the round's safety needs (any two
    /// majorities share a replica: the greatest log, the highest frontiers, the nonce ceilings and the epoch floors
    /// of any majority hold what a majority acknowledged, settled, promised or fenced); the grace only lets a live
    /// replica's answer count when it comes soon after. Calls still under way go on in their own tasks and their
    /// answers are dropped.
    async fn fence_others(
        &self,
        round: &RoundOf,
        replicas: &[NodeIndex],
        states: &[crate::engine::placement::PartitionState],
        nonces: u64,
        need: usize,
    ) -> Result<Vec<(NodeIndex, Began, bool)>, u64> {
        let engine = self.engine().clone();
        let me = engine.node();
        let learners = states
            .get(round.partition as usize)
            .map(|s| s.learners.clone())
            .unwrap_or_default();
        let came: Rc<std::cell::RefCell<Vec<Answer>>> = Rc::default();
        let arrived = Rc::new(event_listener::Event::new());
        let mut asked = 0;
        for &node in replicas.iter().filter(|&&n| n != me) {
            let cores = engine.node_cores(node) as usize;
            let Some(core) = (cores > 0)
                .then(|| replica_core(&round.topic, states, node, round.partition, cores))
                .flatten()
            else {
                continue;
            };
            let router = self.router.clone();
            let request = Request::BeginEpoch(BeginEpoch {
                topic: round.topic.clone(),
                topic_id: round.topic_id,
                partition: round.partition,
                leader: me,
                epoch: round.epoch,
                nonces,
            });
            let (came, arrived) = (came.clone(), arrived.clone());
            glommio::spawn_local(async move {
                let answer = router.call(Location { node, core }, request).await;
                came.borrow_mut().push((node, answer));
                arrived.notify(usize::MAX);
            })
            .detach();
            asked += 1;
        }
        let mut answers = Vec::new();
        let mut newer = None;
        let mut seen = 0;
        let mut enough_at: Option<u64> = None;
        loop {
            let listener = arrived.listen();
            let fresh: Vec<_> = came.borrow_mut().drain(..).collect();
            seen += fresh.len();
            for answer in fresh {
                match answer {
                    (node, Ok(Reply::Began(b))) if b.nonces > nonces::NONCE_MAX => {
                        // No replica promises that much (`validate` refuses it in a request): not an answer.
                        warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, node, nonces = b.nonces, "a replica answered a nonce ceiling above the limit; not counted")
                    }
                    (node, Ok(Reply::Began(b))) => answers.push((node, b, engine.node_alive(node))),
                    (
                        _,
                        Err(OpError::Engine(EngineError::Partition(PartitionError::StaleEpoch {
                            known,
                            ..
                        }))),
                    ) if known > round.epoch => newer = newer.max(Some(known)),
                    (node, other) => {
                        info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, node, answer = ?other.map(|_| ()), "a replica did not answer the fencing round")
                    }
                }
            }
            if let Some(known) = newer {
                return Err(known);
            }
            if seen >= asked {
                break;
            }
            let live_voters = answers
                .iter()
                .filter(|(node, b, live)| *live && !b.learner && !learners.contains(node))
                .count();
            let now = engine.now_ms();
            if live_voters >= need && enough_at.is_none() {
                enough_at = Some(now);
            }
            match enough_at {
                Some(at) if now >= at + ROUND_GRACE.as_millis() as u64 => {
                    info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, answered = seen, asked, "a fencing round goes on with a majority; the other replicas have not answered yet");
                    break;
                }
                Some(at) => {
                    futures_lite::future::or(listener, async {
                        engine
                            .clock()
                            .sleep_until(at + ROUND_GRACE.as_millis() as u64)
                            .await;
                    })
                    .await
                }
                None => listener.await,
            }
        }
        Ok(answers)
    }

    /// Makes the nonce ceiling `nonces` durable on a majority of the partition's voters at `round`'s epoch (this
    /// replica's own promise first). Ok(false): no majority answered; Err(known): a newer leadership began.
    async fn promise_nonces(
        &self,
        round: &RoundOf,
        partition: &crate::partition::Partition,
        replicas: &[NodeIndex],
        states: &[crate::engine::placement::PartitionState],
        nonces: u64,
    ) -> Result<bool, u64> {
        if let Err(e) = partition.raise_fence(round.epoch, nonces).await {
            warn!(topic = %round.topic, partition = round.partition, epoch = round.epoch, error = %e, "cannot promise a nonce ceiling here");
            return Ok(false);
        }
        if partition.epoch_floor() > round.epoch {
            return Err(partition.epoch_floor());
        }
        let learners = states
            .get(round.partition as usize)
            .map(|s| s.learners.clone())
            .unwrap_or_default();
        let me = self.engine().node();
        let voters = replicas.len() - learners.len();
        let own = usize::from(!partition.is_learner() && !learners.contains(&me));
        let need = (voters / 2 + 1).saturating_sub(own);
        let answers = self
            .fence_others(round, replicas, states, nonces, need)
            .await?;
        let promised = answers
            .iter()
            .filter(|(node, b, _)| !b.learner && !learners.contains(node))
            .count();
        Ok(own + promised > voters / 2)
    }

    /// Starts a raise of the nonce ceiling of the partition `round` names, led here at its epoch (its window ran
    /// low, or it serves without a round and has none yet: `Partition::nonces_for`), in its own task.
    pub(crate) fn raise_nonces(self: &Rc<Self>, round: RoundOf) {
        let shipper = self.clone();
        glommio::spawn_local(async move { shipper.run_raise(round).await }).detach();
    }

    /// Promises a higher ceiling on a majority, again and again (50 ms doubling to 1 s) while this replica leads
    /// the partition at the round's epoch and no majority answered.
    async fn run_raise(self: Rc<Self>, round: RoundOf) {
        let mut delay = FIRST_RETRY;
        // Fixed for the whole raise, as a round's (retries must not move the nonces further up).
        let mut plan: Option<(u64, u64)> = None;
        loop {
            let engine = self.engine().clone();
            let Some((topic, partition)) = owned_here(&engine, &round) else {
                return;
            };
            if topic.epoch(round.partition) != round.epoch
                || topic.location(round.partition).node != engine.node()
                || partition.deposed().is_some()
            {
                partition.nonce_raise_failed();
                return;
            }
            let (start, ceiling) =
                *plan.get_or_insert_with(|| (partition.nonce_floor(), partition.nonce_ask()));
            let replicas = topic.replicas_of(round.partition);
            let states = topic.states();
            match self
                .promise_nonces(&round, &partition, &replicas, &states, ceiling)
                .await
            {
                Ok(true) if partition.deposed().is_none() => {
                    info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, ceiling, "a majority promised this leadership's nonces");
                    partition.nonces_promised(start, ceiling);
                    return;
                }
                Ok(_) => {
                    info!(topic = %round.topic, partition = round.partition, epoch = round.epoch, "no majority promised this leadership's nonces yet; asking again")
                }
                Err(known) => {
                    partition.depose(known);
                    partition.nonce_raise_failed();
                    return;
                }
            }
            self.engine().sleep(delay).await;
            delay = (delay * 2).min(LAST_RETRY);
        }
    }
}

impl Shipper {
    /// The round's winner raises each group it knows to the highest durable frontier the answering replicas hold
    /// (never above its own log's end), journaled and synced before it serves (`Partition::follow_frontiers`, as a
    /// follower takes its leader's): what a majority settled stays settled after the failover.
    async fn raise_frontiers(
        &self,
        round: &RoundOf,
        partition: &crate::partition::Partition,
        answers: &[(NodeIndex, Began, bool)],
    ) -> Result<(), PartitionError> {
        let end = partition.log.end_offset();
        let mut highest: std::collections::BTreeMap<&str, crate::storage::frontier::FrontierValue> =
            std::collections::BTreeMap::new();
        for (_, began, _) in answers {
            for m in began.frontiers.iter().take(MAX_FRONTIER_MARKS) {
                if m.start
                    || crate::engine::topic::validate_name(&m.group).is_err()
                    || m.acked.len() > crate::storage::frontier::MAX_RANGES
                {
                    continue;
                }
                // What each replica settled, below this log's end (acks above a frontier included).
                let mut value = m.value();
                value.committed = value.committed.min(end);
                value.acked.retain_mut(|r| {
                    r.1 = r.1.min(end);
                    r.0 < r.1
                });
                highest.entry(&m.group).or_default().merge(&value);
            }
        }
        let marks: Vec<FrontierMark> = highest
            .into_iter()
            .take(MAX_FRONTIER_MARKS)
            .map(|(group, value)| FrontierMark {
                group: group.to_string(),
                committed: value.committed,
                start: false,
                group_id: 0,
                acked: value.acked,
            })
            .collect();
        if marks.is_empty() {
            return Ok(());
        }
        let max_groups = self
            .engine()
            .topic(&round.topic)
            .map_err(|e| PartitionError::Unavailable(e.to_string()))?
            .config()
            .max_groups;
        partition
            .follow_frontiers(&marks, max_groups, round.epoch)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn began(last_epoch: u64, end: u64) -> Began {
        Began {
            end,
            last_epoch,
            frontiers: Vec::new(),
            learner: false,
            nonces: 0,
            floor: 0,
        }
    }

    #[test]
    fn a_round_leads_with_the_greatest_log_of_a_majority_and_hands_over_otherwise() {
        // R = 3: itself and one more is a majority.
        assert_eq!(decide(0, (5, 10), false, &[], 3), Outcome::NoMajority);
        assert_eq!(
            decide(0, (5, 10), false, &[(1, began(5, 9), true)], 3),
            Outcome::Lead
        );
        assert_eq!(
            decide(0, (5, 10), false, &[(1, began(5, 10), true)], 3),
            Outcome::Lead,
            "an equal log: no hand-over"
        );
        assert_eq!(
            decide(0, (5, 10), false, &[(1, began(5, 11), true)], 3),
            Outcome::HandTo(1),
            "a longer log of the same epoch"
        );
        assert_eq!(
            decide(
                0,
                (5, 10),
                false,
                &[(1, began(6, 2), true), (2, began(5, 12), true)],
                3
            ),
            Outcome::HandTo(1),
            "a later epoch first, whatever its length"
        );
        // A replica whose node is not live is passed over while the live ones make a majority without it...
        assert_eq!(
            decide(
                0,
                (5, 10),
                false,
                &[(1, began(5, 11), false), (2, began(5, 9), true)],
                3
            ),
            Outcome::Lead
        );
        // ...and counted when they do not: never led from here while its node has no session.
        assert_eq!(
            decide(0, (5, 10), false, &[(1, began(5, 11), false)], 3),
            Outcome::NoMajority
        );
        assert_eq!(
            decide(0, (5, 10), false, &[(1, began(5, 9), false)], 3),
            Outcome::Lead
        );
        // R = 5: three answers needed.
        assert_eq!(
            decide(0, (5, 10), false, &[(1, began(5, 1), true)], 5),
            Outcome::NoMajority
        );
        assert_eq!(
            decide(
                0,
                (3, 10),
                false,
                &[(1, began(4, 3), true), (2, began(3, 12), true)],
                5
            ),
            Outcome::HandTo(1)
        );
    }

    fn learner(last_epoch: u64, end: u64) -> Began {
        Began {
            learner: true,
            ..began(last_epoch, end)
        }
    }

    /// A replica on a new disk neither counts for the majority nor is ranked; one that won an election hands over.
    #[test]
    fn learners_neither_count_nor_rank_and_a_learner_never_leads() {
        // R = 3, itself and a learner: no majority, though two answered (the third may hold what nobody else does).
        assert_eq!(
            decide(0, (5, 3), false, &[(1, learner(5, 0), true)], 3),
            Outcome::NoMajority
        );
        // A learner's log, however great, is not taken over a replica's.
        assert_eq!(
            decide(
                0,
                (5, 3),
                false,
                &[(1, learner(6, 9), true), (2, began(5, 2), true)],
                3
            ),
            Outcome::Lead
        );
        // A learner that won an election: the greatest of the others leads, even an equal or shorter log...
        assert_eq!(
            decide(
                0,
                (5, 9),
                true,
                &[(1, began(5, 3), true), (2, began(5, 4), true)],
                3
            ),
            Outcome::HandTo(2)
        );
        // ...and without a majority of replicas that are not learners, nobody does.
        assert_eq!(
            decide(0, (5, 9), true, &[(1, began(5, 3), true)], 3),
            Outcome::NoMajority
        );
        assert_eq!(
            decide(
                0,
                (5, 9),
                true,
                &[(1, began(5, 3), true), (2, began(5, 4), false)],
                3
            ),
            Outcome::NoMajority,
            "the greatest on a node without a session"
        );
    }
}
