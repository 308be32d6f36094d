//! CheckQuorum (`docs/replication.md`, §4 "Leader isolated from its followers, not from etcd", and step 4): a
//! leader that keeps its etcd session but cannot reach a majority of its replicas would keep its partitions `503`
//! for as long as the cut lasts, since no follower is elected while its session lives. So each core looks, once a
//! second, at every replicated partition it leads and serves: when records have waited for their majority and the
//! commit offset has not moved for [`stuck_for`], it gives the leadership to a follower whose session is alive
//! (the healthy one with the greatest recorded log: [`healthy_followers`]), through core 0 (`Request::MoveLeader`: an etcd
//! transaction, only if the partition is still at the epoch it read). That follower runs its fencing round with the
//! replicas it can reach, and the old leader, named follower by the view that follows, is deposed (its
//! unacknowledged records are cut when it is reachable again: truncation by epoch). With no healthy live follower it
//! does nothing: no election could succeed.
//!
//! A leader that is merely slow (a follower's disk, a long pause) may give its leadership away too: like Raft's
//! CheckQuorum, it trades a leader change for never staying stuck.
//!
//! The same look hands over at once every replicated partition it leads whose log refuses appends until a restart
//! (poisoned: a sync refused, or with `replica_ship_early` a journal pass refused after its batch was shipped), as a
//! failed disk's partitions move in Kafka: the partition is served again by a follower after its round, and this
//! replica, refusing what is shipped to it, counts for nothing until the node restarts (and recovers, and is caught
//! up). Its followers are asked where they stand first (a probe each, once nothing is in flight to it; their answers
//! say whether their own logs refuse appends), and it goes only when the healthy followers up (alive, neither
//! learners nor poisoned, and answered since they were asked, or lagging: a lagging follower is not asked and keeps
//! what it last said) are a majority of the voters, since this replica counts for nothing in their round: until then it
//! keeps the partition, serving what is committed (produces `503`), rather than leave it with a leader that can
//! serve nothing.

use super::replicate::Shipper;
use crate::engine::placement::Location;
use crate::ops::replicate::MoveLeader;
use crate::ops::{Reply, Request};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;
use tracing::{info, warn};

/// How often the partitions are looked at.
const EVERY: Duration = Duration::from_secs(1);

/// After a partition's leadership was given away from this core, it is not given away again for this long (a
/// leader handed the leadership back by its follower's round, its log being the greater, does not ping-pong).
const AFTER_A_MOVE: Duration = Duration::from_secs(60);

/// A partition whose log refuses appends (poisoned) is handed over at once, and again this long after an attempt
/// while it is still led here (the transaction may have lost to a newer epoch, or no follower was alive).
const AFTER_A_POISON: Duration = Duration::from_secs(2);

/// How long a led partition's commit may stand still with records waiting before its leader gives the leadership
/// away: three replica timeouts (each produce in it was answered `503 not_enough_replicas` by then), and never less
/// than 5 s (a follower paused or restarting for a moment is not worth a leader change).
pub fn stuck_for(replica_timeout: Duration) -> Duration {
    (replica_timeout * 3).max(Duration::from_secs(5))
}

/// Where one partition's commit, and what its followers had, stood when it was first seen stuck.
struct Stuck {
    epoch: u64,
    commit: u64,
    /// The followers' answered ends: one that moves is a follower catching up, not a lost majority.
    progress: u64,
    since: u64,
}

impl Shipper {
    /// Starts this core's CheckQuorum task (it ends with the shipper).
    pub fn start_quorum_checks(self: &Rc<Self>) {
        glommio::spawn_local(run(Rc::downgrade(self))).detach();
    }
}

async fn run(shipper: Weak<Shipper>) {
    let mut stuck: HashMap<(String, u32), Stuck> = HashMap::new();
    let mut moved: HashMap<(String, u32), u64> = HashMap::new();
    // Poisoned partitions kept here for want of healthy followers (logged once).
    let mut held: std::collections::HashSet<(String, u32)> = std::collections::HashSet::new();
    // Poisoned partitions whose followers were asked where they stand: when, at the last two looks that asked (an
    // answer since the earlier one counts, so a follower answering once a second, its retries backed off, is not
    // missed by a window of one look).
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
        let limit = stuck_for(engine.replica_timeout());
        let now = engine.now_ms();
        // In order (a deterministic simulation replays the same moves).
        let led: std::collections::BTreeSet<(String, u32)> =
            shipper.streamed().into_iter().collect();
        stuck.retain(|key, _| led.contains(key));
        held.retain(|key| led.contains(key));
        asked.retain(|key, _| led.contains(key));
        moved.retain(|_, at| now.saturating_sub(*at) < AFTER_A_MOVE.as_millis() as u64);
        let mut moves = Vec::new();
        let mut stuck_move = None;
        for key in led {
            let Ok(topic) = engine.topic(&key.0) else {
                stuck.remove(&key);
                asked.remove(&key);
                continue;
            };
            let p = key.1;
            let Some(partition) = topic.owned_partition(p) else {
                stuck.remove(&key);
                asked.remove(&key);
                continue;
            };
            let (commit, end) = (partition.readable_end(), partition.log.end_offset());
            if partition.replicated()
                && partition.deposed().is_none()
                && partition.round_under_way().is_none()
                && partition.log.is_poisoned()
                && !crate::planted::planted(crate::planted::Bug::PoisonedLeaderStays)
                && moved
                    .get(&key)
                    .is_none_or(|&at| now.saturating_sub(at) >= AFTER_A_POISON.as_millis() as u64)
            {
                // Its log refuses appends until a restart (a refused sync, or a journal pass refused after its batch
                // was shipped): the partition is handed to a live follower now, as a disk's failure would be.
                stuck.remove(&key);
                let epoch = topic.epoch(p);
                // Its followers are asked where they stand first (a leader that ships nothing hears nothing, and a
                // follower whose own log refuses appends could win no round): the answers are read at the next look.
                let Some(&(since, last)) = asked.get(&key) else {
                    shipper.ask_status(&key);
                    asked.insert(key.clone(), (now, now));
                    continue;
                };
                // Only to a follower whose fencing round can succeed without this replica (which counts for nothing
                // in it): while fewer healthy followers than a majority are up, the partition stays here, serving
                // what is committed, until one returns or this node restarts.
                let voters = topic
                    .states()
                    .get(p as usize)
                    .map_or(0, |s| s.voters().len());
                let mut healthy = healthy_followers(&engine, &topic, &partition, p);
                // Counted only if it answered since it was asked (its flag is fresh): one that has not answered
                // yet (slow, or cut off from this node) may have had its own log fail since it last said.
                let answered = shipper.answered_since(&key, since);
                healthy.retain(|n| answered.contains(n));
                let to = healthy
                    .first()
                    .copied()
                    .filter(|_| healthy.len() > voters / 2);
                let Some(to) = to else {
                    // Asked again, so that the next look counts those that answered since.
                    shipper.ask_status(&key);
                    asked.insert(key.clone(), (last, now));
                    if held.insert(key.clone()) {
                        warn!(topic = %key.0, partition = p, epoch, healthy = healthy.len(), voters, "this replica's log refuses appends until a restart, and too few healthy followers are up to lead instead: it serves what is committed until they are");
                    }
                    continue;
                };
                held.remove(&key);
                asked.remove(&key);
                warn!(topic = %key.0, partition = p, epoch, commit, end, to, "this replica's log refuses appends until a restart: the leadership goes to a live follower");
                moved.insert(key.clone(), now);
                moves.push((key, epoch, topic.id(), to));
                continue;
            }
            // Not (or no longer) a poisoned leader deciding: the next time it is, it asks afresh (and says so again
            // if it holds the partition).
            asked.remove(&key);
            held.remove(&key);
            if stuck_move.is_some() {
                // One stuck partition per look (the others keep their place for the next).
                continue;
            }
            if !partition.replicated()
                || partition.deposed().is_some()
                || partition.round_under_way().is_some()
                || commit >= end
            {
                stuck.remove(&key);
                continue;
            }
            let epoch = topic.epoch(p);
            let progress = partition
                .followers_progress()
                .iter()
                .map(|f| f.end)
                .fold(0u64, u64::saturating_add);
            let seen = stuck.entry(key.clone()).or_insert(Stuck {
                epoch,
                commit,
                progress,
                since: now,
            });
            if seen.epoch != epoch || seen.commit != commit || seen.progress != progress {
                *seen = Stuck {
                    epoch,
                    commit,
                    progress,
                    since: now,
                };
                continue;
            }
            if now.saturating_sub(seen.since) < limit.as_millis() as u64 || moved.contains_key(&key)
            {
                continue;
            }
            // Once per `limit` at most, whatever comes of it.
            seen.since = now;
            let Some(to) = healthy_followers(&engine, &topic, &partition, p)
                .first()
                .copied()
            else {
                info!(topic = %key.0, partition = p, epoch, commit, end, "no majority for {limit:?} and no healthy follower alive: the leadership stays");
                continue;
            };
            warn!(topic = %key.0, partition = p, epoch, commit, end, to, "no majority for {limit:?} while this node keeps its session: the leadership goes to a live follower (CheckQuorum)");
            moved.insert(key.clone(), now);
            stuck_move = Some((key, epoch, topic.id(), to));
        }
        let me = engine.node();
        let router = shipper.router.clone();
        drop(shipper);
        for (key, epoch, topic_id, to) in moves.into_iter().chain(stuck_move) {
            let request = Request::MoveLeader(MoveLeader {
                topic: key.0.clone(),
                topic_id,
                partition: key.1,
                epoch,
                leader: to,
                replicas: Vec::new(),
                learners: Vec::new(),
            });
            match router.call(Location { node: me, core: 0 }, request).await {
                Ok(Reply::Done) => {}
                other => {
                    warn!(topic = %key.0, partition = key.1, epoch, answer = ?other.map(|_| ()), "the leadership could not be handed over; it is tried again later")
                }
            }
        }
    }
}

/// The followers a leadership may go to, the first of them first: the live voters (a learner never leads) other than
/// this node, the greatest recorded log first (its round fetches what it lacks from the others), without those whose
/// last answer here said they are learners on a new disk or that their log refuses appends until a restart
/// (`poisoned`): none of those counts in a fencing round.
fn healthy_followers(
    engine: &crate::engine::Engine,
    topic: &crate::engine::topic::Topic,
    partition: &crate::partition::Partition,
    p: u32,
) -> Vec<u32> {
    let me = engine.node();
    let voters = topic
        .states()
        .get(p as usize)
        .map(|s| s.voters())
        .unwrap_or_default();
    let progress = partition.followers_progress();
    let mut healthy: Vec<u32> = voters
        .into_iter()
        .filter(|&n| n != me && engine.node_alive(n))
        .filter(|&n| {
            !progress
                .iter()
                .any(|f| f.node == n && (f.poisoned || f.learner))
        })
        .collect();
    // The greatest recorded log first (its round would hand the leadership to the greatest anyway: one hop less),
    // replica order between equals.
    let end = |n: u32| progress.iter().find(|f| f.node == n).map_or(0, |f| f.end);
    healthy.sort_by_key(|&n| std::cmp::Reverse(end(n)));
    healthy
}
