//! Queue-style consume and replay at the front. A consume registers as a waiter first (so no wake-up is missed),
//! then gathers up to `max` messages: this core's partitions, then the other cores' in a rotating order (each told
//! first, on the same FIFO channel, that this core may park on the topic), and only then spends its `wait` parked.
//! A message about to be delivered past the topic's `max_deliveries` goes to the dead-letter topic instead.

use super::Front;
use crate::engine::topic::{Topic, TopicConfig};
use crate::engine::waiters::Waiter;
use crate::engine::{Engine, EngineError};
use crate::ops::consume::{ConsumeParams, Probe, Probed};
use crate::ops::produce::{ClientRecord, ProduceParams};
use crate::ops::replay::{Replay, ReplayParams};
use crate::ops::settle::Settle;
use crate::ops::{OpError, OpResult, Reply, Request};
use crate::partition::{Delivery, PartitionError, SettleOp};
use crate::storage::log::Record;
use std::rc::Rc;
use tracing::warn;

/// How long a parked consumer sleeps at most when some owner could not be told to wake it (its channel was full):
/// it looks again then instead of trusting a wake-up that may never come. 10 ms.
pub const UNREGISTERED_POLL_MS: u64 = 10;

/// Cluster mode: a consumer parked on owners of other nodes looks again this often, in case a wake-up was lost on
/// the network (a one-way signal dropped with a connection); normally the owner's wake-up comes first.
pub const REMOTE_RECHECK_MS: u64 = 500;

/// How many times the settle of a dead-lettered message is retried when its owner's channel is full (1 ms apart).
pub const DEAD_LETTER_SETTLE_RETRIES: u32 = 100;

/// A message whose copy to the dead-letter topic failed is deliverable again (and tried again) after this long. 1 s.
pub const DEAD_LETTER_RETRY_MS: u64 = 1000;

/// The consume's group does not exist at an owner: the typed error, as the owner's engine or partition gave it
/// (over node RPC too), never read from a rendered reply.
fn group_missing(e: &OpError) -> bool {
    matches!(
        e,
        OpError::Engine(
            EngineError::GroupNotFound { .. }
                | EngineError::Partition(PartitionError::GroupNotFound(_))
        )
    )
}

/// Deregisters a consumer's waiter, then lets the engine tell owners when no consumer is parked any more.
struct Parked<'a> {
    engine: Rc<Engine>,
    topic: &'a str,
    group: &'a str,
    waiter: Option<Waiter>,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        drop(self.waiter.take());
        self.engine.release_wait_queue(self.topic, self.group);
    }
}

/// Counts a parked consumer that polls (some owner could not be told to wake it) while it sleeps.
struct Polling<'a>(&'a Engine);

impl<'a> Polling<'a> {
    fn start(engine: &'a Engine) -> Polling<'a> {
        engine.note_polling(true);
        Polling(engine)
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.0.note_polling(false);
    }
}

/// What one round of looking found.
#[derive(Default)]
struct Round {
    deliveries: Vec<Delivery>,
    /// Every partition that had nothing to give was at its cap.
    at_cap: bool,
    unavailable: bool,
    /// Why (the first owner's reason).
    why: Option<String>,
    /// The soonest an unavailable partition may be served, in ms (`Probed::retry_in_ms`).
    retry_in_ms: Option<u64>,
    /// Some owner could not be told to wake this core.
    unregistered: bool,
    /// Cluster mode: some owner on another node was probed (and registered this core for wake-ups).
    remote: bool,
    /// Messages diverted to the dead-letter topic: they took places in `max`, so look again before parking.
    diverted: usize,
}

impl Front {
    /// Leases up to `max` messages (empty: 204).
    pub async fn consume(&self, params: ConsumeParams) -> OpResult<Vec<Delivery>> {
        self.consume_parked(params, &std::cell::Cell::new(0)).await
    }

    /// `consume`, adding the time it spends parked (waiting for messages) to `parked_us`.
    pub async fn consume_parked(
        &self,
        params: ConsumeParams,
        parked_us: &std::cell::Cell<u64>,
    ) -> OpResult<Vec<Delivery>> {
        let engine = self.engine().clone();
        let mut topic = engine.topic(&params.topic)?;
        if !topic.config().has_group(&params.group) {
            // A group comes to life at its first consume, from the oldest retained offset.
            self.create_group(params.topic.clone(), params.group.clone(), false)
                .await?;
            topic = engine.topic(&params.topic)?;
        }
        let clock = engine.clock().clone();
        let wait_ms = params
            .wait_ms
            .unwrap_or_else(|| topic.config().receive_wait_ms);
        // Rounded up from the microsecond clock: an empty long poll never answers before its full wait.
        let deadline = (clock.now_us() + wait_ms * 1000).div_ceil(1000);
        let parking = wait_ms > 0 && !engine.is_stopping();
        // Registered before the first look: a message that becomes deliverable while we look reaches us.
        let parked = parking.then(|| Parked {
            engine: engine.clone(),
            topic: &params.topic,
            group: &params.group,
            waiter: Some(engine.wait_queue(&params.topic, &params.group).register()),
        });
        let waiter = parked.as_ref().and_then(|p| p.waiter.as_ref());
        loop {
            if let Some(w) = waiter {
                w.take_unit();
            }
            let round = match self.gather(&topic, &params, parking).await {
                Err(e) if group_missing(&e) => return Err(self.group_deleted(&params).await),
                round => round?,
            };
            if !round.deliveries.is_empty() {
                return Ok(round.deliveries);
            }
            if round.diverted > 0 {
                continue;
            }
            // A partition that may be served within the consume's wait (a new leader waiting out its predecessor's
            // lease): waited for.
            let soon = round
                .retry_in_ms
                .map(|ms| clock.now_ms().saturating_add(ms));
            if let (true, Some(w), Some(at)) = (round.unavailable, waiter, soon) {
                if at < deadline && !engine.is_stopping() {
                    let parked_at = clock.now_us();
                    w.wait(clock.sleep_until(at)).await;
                    parked_us.set(parked_us.get() + clock.now_us().saturating_sub(parked_at));
                    if topic.is_deleted() {
                        return Err(EngineError::TopicNotFound(params.topic.clone()).into());
                    }
                    continue;
                }
            }
            if round.unavailable {
                // A partition with something to deliver could not be served: say so (503, retry) rather than park.
                return Err(OpError::Engine(EngineError::Partition(
                    crate::partition::PartitionError::Unavailable(format!(
                        "a partition of '{}' cannot be served now: {}",
                        params.topic,
                        round
                            .why
                            .as_deref()
                            .unwrap_or("it could not be read; see the server log")
                    )),
                )));
            }
            let now = clock.now_ms();
            let Some(w) = waiter else {
                return Ok(Vec::new());
            };
            if round.at_cap || now >= deadline || engine.is_stopping() {
                return Ok(Vec::new());
            }
            let wake_by = if round.unregistered {
                deadline.min(now + UNREGISTERED_POLL_MS)
            } else if round.remote {
                deadline.min(now + REMOTE_RECHECK_MS)
            } else {
                deadline
            };
            let polling = round.unregistered.then(|| Polling::start(&engine));
            let parked_at = clock.now_us();
            let woken = w.wait(clock.sleep_until(wake_by)).await;
            parked_us.set(parked_us.get() + clock.now_us().saturating_sub(parked_at));
            drop(polling);
            if topic.is_deleted() {
                return Err(EngineError::TopicNotFound(params.topic.clone()).into());
            }
            if !topic.config().has_group(&params.group) {
                return Err(self.group_deleted(&params).await);
            }
            if !woken && (clock.now_ms() >= deadline || engine.is_stopping()) {
                return Ok(Vec::new());
            }
        }
    }

    /// The group of a running consume was deleted (found gone at an owner, or in this node's settings after a
    /// wake-up): its answer is `group_not_found`, as `OpError::GroupDeleted`, which the HTTP layer does not run again
    /// (run again, it would be a first consume and create the group anew, at the oldest offset, delivering the whole
    /// backlog again). In cluster mode this node first reads the topic from the metastore (an owner on another node
    /// may have seen the deletion first).
    async fn group_deleted(&self, params: &ConsumeParams) -> OpError {
        if self.engine().clustered() {
            let router = self.router();
            let lookup = Request::LookupTopic(params.topic.clone(), true);
            if let Err(e) = router.call(router.core(0), lookup).await {
                warn!(topic = %params.topic, error = %e, "cannot read a topic from the metastore after its group was deleted");
            }
        }
        OpError::GroupDeleted {
            topic: params.topic.clone(),
            group: params.group.clone(),
        }
    }

    /// One round: this core's partitions, then the other owning cores' from a rotating start, until `max` are
    /// leased; dead letters diverted.
    async fn gather(
        &self,
        topic: &Rc<Topic>,
        params: &ConsumeParams,
        parking: bool,
    ) -> OpResult<Round> {
        let engine = self.engine();
        let me = engine.id() as u32;
        let config = topic.config();
        let mut round = Round {
            at_cap: true,
            ..Round::default()
        };
        let mut any_partition = false;
        let others: Vec<u32> = topic
            .owner_cores()
            .iter()
            .copied()
            .filter(|&c| c != me)
            .collect();
        let start = if others.is_empty() {
            0
        } else {
            topic.next_cursor() % others.len()
        };
        let local = topic
            .owner_cores()
            .contains(&me)
            .then_some(me)
            .into_iter()
            .chain((0..others.len()).map(|i| others[(start + i) % others.len()]))
            .map(|core| self.router().core(core as usize));
        // Cluster mode: then other nodes' owners (alive ones), from the same rotating start.
        let remote: Vec<_> = topic
            .remote_owners()
            .iter()
            .copied()
            .filter(|l| engine.node_alive(l.node))
            .collect();
        let rstart = if remote.is_empty() {
            0
        } else {
            topic.next_cursor() % remote.len()
        };
        let order = local.chain((0..remote.len()).map(|i| remote[(rstart + i) % remote.len()]));
        // The reply's payload bytes are bounded like a batch produce's body (`max_batch_bytes`), spent across the
        // owners in turn: a batch of large messages stops early rather than building a reply no one can carry.
        let mut bytes_left = engine.config().max_batch_bytes;
        for to in order {
            if round.deliveries.len() >= params.max
                || (!round.deliveries.is_empty() && bytes_left == 0)
            {
                break;
            }
            let remote = to.node != engine.node();
            if remote && parking {
                // Registered by the probe itself (`waker`); a wake-up lost on the network is covered by a slow
                // recheck (`REMOTE_RECHECK_MS`).
                engine.note_remote_interest(&params.topic, &params.group, to);
                round.remote = true;
            } else if parking && !engine.register_interest(&params.topic, &params.group, to) {
                round.unregistered = true;
            }
            let probe = Request::Probe(Probe {
                topic: params.topic.clone(),
                topic_id: topic.id(),
                group: params.group.clone(),
                max: params.max - round.deliveries.len(),
                visibility_ms: params.visibility_ms,
                waker: (remote && parking).then(|| engine.here()),
                max_bytes: bytes_left,
                taken_any: !round.deliveries.is_empty(),
            });
            let reply = self.router().call(to, probe).await;
            match reply {
                Ok(Reply::Probed(probed)) => {
                    let Probed {
                        deliveries,
                        at_cap,
                        unavailable,
                        why,
                        none_owned,
                        budget_spent,
                        retry_in_ms,
                    } = probed;
                    if budget_spent {
                        // Other owners would each read a record only to give it back.
                        bytes_left = 0;
                    }
                    any_partition |= !none_owned;
                    round.at_cap &= at_cap || none_owned;
                    round.unavailable |= unavailable;
                    if round.why.is_none() {
                        round.why = why;
                    }
                    if let Some(ms) = retry_in_ms {
                        round.retry_in_ms = Some(round.retry_in_ms.map_or(ms, |r| r.min(ms)));
                    }
                    let leased = deliveries.len();
                    // Boxed, and only when a delivery is over the limit: the diversion's future (a produce and a
                    // settle) is larger than the rest of a consume's, and held in place it would be copied with the
                    // consume's on every request.
                    let diverting = config.dead_letter.is_some()
                        && config.max_deliveries > 0
                        && deliveries
                            .iter()
                            .any(|d| d.delivery_count > config.max_deliveries);
                    let kept = if diverting {
                        Box::pin(self.divert_dead_letters(
                            topic,
                            &config,
                            &params.group,
                            deliveries,
                        ))
                        .await
                    } else {
                        deliveries
                    };
                    round.diverted += leased - kept.len();
                    let bytes: usize = kept.iter().map(|d| d.payload.len()).sum();
                    bytes_left = bytes_left.saturating_sub(bytes);
                    if round.deliveries.is_empty() {
                        round.deliveries = kept;
                    } else {
                        round.deliveries.extend(kept);
                    }
                }
                Ok(other) => unreachable!("a probe answered {other:?}"),
                Err(OpError::Engine(EngineError::Overloaded)) => {
                    round.at_cap = false;
                    round.unregistered = true;
                }
                // Another node's owner that cannot be reached now: skipped, as a dead one is.
                Err(OpError::PartitionUnavailable(_)) if remote => {}
                // Leases already gathered must reach the consumer: the error is reported only when there are none.
                Err(_) if !round.deliveries.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        round.at_cap &= any_partition;
        if !round.deliveries.is_empty() {
            round.unavailable = false;
        }
        Ok(round)
    }

    /// Moves messages past `max_deliveries` to the dead-letter topic (appended durably there first, then settled
    /// here); returns the others.
    async fn divert_dead_letters(
        &self,
        topic: &Rc<Topic>,
        config: &TopicConfig,
        group: &str,
        deliveries: Vec<Delivery>,
    ) -> Vec<Delivery> {
        let (Some(dead_letter), limit) = (&config.dead_letter, config.max_deliveries) else {
            return deliveries;
        };
        if limit == 0 {
            return deliveries;
        }
        let mut kept = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            if d.delivery_count <= limit {
                kept.push(d);
                continue;
            }
            let record = ClientRecord::moved(&d.payload, &d.meta);
            let appended = self
                .produce(ProduceParams {
                    topic: dead_letter.clone(),
                    records: vec![record],
                    batch: false,
                })
                .await;
            match appended {
                Ok(results) if results.iter().all(|r| r.is_ok()) => {
                    if let Err(e) = self
                        .settle_dead_letter(topic, config, group, &d, SettleOp::Ack)
                        .await
                    {
                        warn!(topic = %config.name, partition = d.partition, offset = d.offset, error = %e, "a dead-lettered message could not be settled in its topic: it may be delivered again (at-least-once)");
                    }
                }
                failed => {
                    let e = match failed {
                        Ok(results) => results
                            .into_iter()
                            .find_map(Result::err)
                            .map(|e| e.to_string()),
                        Err(e) => Some(e.to_string()),
                    };
                    warn!(topic = %config.name, dead_letter = %dead_letter, error = ?e, retry_ms = DEAD_LETTER_RETRY_MS, "cannot append to the dead-letter topic; the message is released and tried again later");
                    // Released with a delay (not held for its whole visibility): the next delivery tries again.
                    let release = SettleOp::Nack(Some(DEAD_LETTER_RETRY_MS));
                    if let Err(e) = self
                        .settle_dead_letter(topic, config, group, &d, release)
                        .await
                    {
                        warn!(topic = %config.name, partition = d.partition, offset = d.offset, error = %e, "cannot release a message that failed to dead-letter: it stays leased until its visibility ends");
                    }
                }
            }
        }
        kept
    }

    /// Settles a message being dead-lettered, at its owner: `Ack` once its dead-letter topic holds it, `Nack` to
    /// release it when the copy failed. A full channel is retried (briefly) rather than leaving the lease to run out
    /// (and the copy to be made again).
    async fn settle_dead_letter(
        &self,
        topic: &Rc<Topic>,
        config: &TopicConfig,
        group: &str,
        d: &Delivery,
        op: SettleOp,
    ) -> OpResult<()> {
        let clock = self.engine().clock().clone();
        let mut attempts = 0;
        loop {
            let settle = Request::Settle(Settle {
                topic: config.name.clone(),
                topic_id: config.id,
                group: group.to_string(),
                partition: d.partition,
                items: vec![(d.offset, d.nonce)],
                dead_lettered: op == SettleOp::Ack,
                op,
            });
            match self
                .router()
                .call(topic.location(d.partition), settle)
                .await
            {
                Err(OpError::Engine(EngineError::Overloaded))
                    if attempts < DEAD_LETTER_SETTLE_RETRIES =>
                {
                    attempts += 1;
                    clock.sleep_until(clock.now_ms() + 1).await;
                }
                Err(e) => return Err(e),
                Ok(Reply::Settled(settled)) => {
                    return settled
                        .results
                        .into_iter()
                        .next()
                        .unwrap_or(Ok(()))
                        .map_err(OpError::from)
                }
                Ok(other) => unreachable!("a settle answered {other:?}"),
            }
        }
    }

    /// Replay: a read at the partition's owner (None: not written within `wait`).
    pub async fn replay(&self, params: ReplayParams) -> OpResult<Option<Record>> {
        let topic = self.engine().topic(&params.topic)?;
        if params.partition >= topic.partition_count() as u64 {
            return Err(EngineError::PartitionNotFound {
                topic: params.topic,
                partition: params.partition,
            }
            .into());
        }
        let partition = params.partition as u32;
        let request = Request::Replay(Replay {
            topic: params.topic,
            topic_id: topic.id(),
            partition,
            offset: params.offset,
            wait_ms: params.wait_ms,
        });
        match self
            .router()
            .call(topic.location(partition), request)
            .await?
        {
            Reply::Replayed(replayed) => Ok(replayed.record),
            other => unreachable!("a replay answered {other:?}"),
        }
    }
}
