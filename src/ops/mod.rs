//! The operation layer: one file per operation, each holding its parameters parsed from HTTP into a plain request
//! value, the owner-side request it becomes, the function that applies that on the owning core, and its reply
//! rendered (`render`); each file's header names the rest of its path (the fan-out in `front/`, the route in
//! `http/routes.rs`). Receipt handles are `receipt.rs`; the one error -> status mapping is `status.rs`. Here,
//! the one enum of owner-side requests and replies and the one `apply` every transport ends in: a direct call on
//! this core, the mesh from another core, node RPC from another node; so a remote owner applies exactly what a local
//! one would. Requests are data: the reply channel belongs to the transport's envelope.

pub mod attributes;
pub mod consume;
pub mod error;
pub mod groups;
pub mod overview;
pub mod params;
pub mod produce;
pub mod receipt;
pub mod redrive;
pub mod replay;
pub mod replicate;
pub mod response;
pub mod settle;
pub mod status;
pub mod topics;
pub mod validate;

use crate::engine::metrics::CoreStats;
use crate::engine::placement::PartitionState;
use crate::engine::topic::TopicConfig;
use crate::engine::{AdminStep, Engine, Signal};
use crate::partition::PartitionInfo;
pub use error::{OpError, OpResult};
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// A request for the owner of some state: a partition's owning core, or core 0 for topic administration. Node RPC
/// carries it serialised (`cluster::rpc`): the order of the variants is part of that wire format, so add new ones at
/// the end.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    Produce(produce::Produce),
    Probe(consume::Probe),
    Settle(settle::Settle),
    Replay(replay::Replay),
    /// Core 0: create a topic.
    CreateTopic(Box<TopicConfig>),
    /// Core 0: change a topic's settings.
    ChangeTopic(String, Box<topics::Settings>),
    /// Core 0: delete a topic.
    DeleteTopic(String),
    /// Core 0: create a consumer group (topic, group, start at the latest offset).
    CreateGroup(String, String, bool),
    /// Core 0: delete a consumer group (topic, group).
    DeleteGroup(String, String),
    /// This core's partitions of a topic.
    Describe(String),
    /// This core's counters and latency histogram.
    Stats,
    /// A step of a topic change every core applies (boxed: the largest variant by far, and rare).
    Admin(Box<AdminStep>),
    /// A one-way long-poll signal.
    Signal(Signal),
    /// Core 0, cluster mode: look a topic up in the metastore and open it here (`Done`, or `TopicNotFound`); with
    /// `true`, read the metastore itself even if this node knows the topic (its replica may lag).
    LookupTopic(String, bool),
    /// The owner core: leases whose probe reply never reached its consumer, given back.
    GiveBack(consume::GiveBack),
    /// Core 0, cluster mode: each partition's replicas, leader and epoch as this node's metastore replica has them.
    Partitions(String),
    /// A leader's durable batch for this node's follower replica of the partition, on the core that holds it.
    Replicate(replicate::Replicate),
    /// A leader's durable group frontiers for this node's follower replica of the partition (`Done`).
    ReplicateFrontiers(replicate::ReplicateFrontiers),
    /// A new leader's fencing round: this node's replica of the partition takes no request of an older epoch from
    /// here on, and answers where its log stands (`Began`).
    BeginEpoch(replicate::BeginEpoch),
    /// Core 0, cluster mode, internal (refused from a peer): a fencing round hands a partition's leadership to a
    /// replica with a greater log (`Done`; `Done` too when the partition moved on first).
    MoveLeader(replicate::MoveLeader),
    /// Core 0, cluster mode, internal (refused from a peer): `POST /cluster/nodes/ID/drain`, `DELETE
    /// /cluster/nodes/ID` (the node's replicas move to other nodes) or `DELETE /cluster/nodes/ID/drain` (`Done`).
    DrainNode(String, crate::engine::cluster::DrainAction),
    /// The partitions of a topic this core leads: each settles everything of the group at once (`Purged`, how
    /// many messages were unsettled): `POST /topics/T/groups/G/purge`, SQS's PurgeQueue.
    Purge(String, String),
}

/// The answer to a `Request` (serialised by node RPC like `Request`: add variants at the end).
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Produced(produce::Produced),
    Probed(consume::Probed),
    Settled(settle::Settled),
    Replayed(replay::Replayed),
    /// Boxed, as `Changed`: a topic's configuration is several times larger than a data-path reply, and every
    /// reply is moved by value through the request's layers.
    Created(bool, Box<TopicConfig>),
    Changed(Box<TopicConfig>),
    /// A group was created (true) or already existed (false).
    GroupCreated(bool),
    Described(#[serde(with = "crate::partition::whole_infos")] Vec<PartitionInfo>),
    Stats(Box<CoreStats>),
    Done,
    /// A topic's id and each partition's replicas, leader and epoch (`None`: the replica does not have the topic).
    Partitions(Option<(u64, Vec<PartitionState>)>),
    Replicated(replicate::Replicated),
    Began(replicate::Began),
    /// Messages purged.
    Purged(u64),
}

impl Request {
    /// One-way requests are applied in arrival order by the receiving pump (a signal must take effect before the
    /// requests sent after it on the same channel); the others run as their own tasks.
    pub fn is_signal(&self) -> bool {
        matches!(self, Request::Signal(_))
    }
}

/// Applies a request on this core: the one dispatch every transport ends in.
pub async fn apply(engine: &Rc<Engine>, request: Request) -> OpResult<Reply> {
    // The data-path operations are awaited in place; the rest are boxed, so this future (and every future that
    // awaits it: the router's, the front's, a connection's) is as large as a produce, probe or settle, not as large
    // as a topic creation: moving a future copies all of it (a memcpy that showed in the profile).
    Ok(match request {
        Request::Produce(r) => Reply::Produced(produce::apply(engine, r).await?),
        Request::Probe(r) => Reply::Probed(consume::apply(engine, r).await?),
        Request::Settle(r) => Reply::Settled(settle::apply(engine, r).await?),
        Request::GiveBack(req) => {
            consume::give_back(engine, req);
            Reply::Done
        }
        Request::Signal(signal) => {
            engine.on_signal(signal);
            Reply::Done
        }
        cold => Box::pin(apply_cold(engine, cold)).await?,
    })
}

/// Everything but the data path: replays and administration.
async fn apply_cold(engine: &Rc<Engine>, request: Request) -> OpResult<Reply> {
    if validate::on_core_zero(&request) && engine.id() != 0 {
        // Whatever carried it here (a peer's node RPC addressed to the wrong core, a bug): refused, never applied.
        return Err(OpError::InvalidParameter(format!(
            "{} runs on core 0 only, not on core {}",
            validate::kind(&request),
            engine.id()
        )));
    }
    Ok(match request {
        Request::Replay(r) => Reply::Replayed(replay::apply(engine, r).await?),
        // With the cold path (boxed): a follower's apply holds the log's shipped-batch future, larger than a
        // client operation's, and comes once per shipped batch, not per message.
        Request::Replicate(r) => Reply::Replicated(replicate::apply(engine, r).await?),
        Request::ReplicateFrontiers(r) => {
            replicate::apply_frontiers(engine, r).await?;
            Reply::Done
        }
        Request::BeginEpoch(r) => Reply::Began(replicate::begin_epoch(engine, r).await?),
        Request::CreateTopic(config) => {
            let (created, config) = topics::create(engine, *config).await?;
            Reply::Created(created, Box::new(config))
        }
        Request::ChangeTopic(name, settings) => {
            Reply::Changed(Box::new(topics::change(engine, &name, *settings).await?))
        }
        Request::DeleteTopic(name) => {
            topics::delete(engine, &name).await?;
            Reply::Done
        }
        Request::CreateGroup(topic, group, latest) => {
            Reply::GroupCreated(groups::create(engine, &topic, &group, latest).await?)
        }
        Request::DeleteGroup(topic, group) => {
            groups::delete(engine, &topic, &group).await?;
            Reply::Done
        }
        Request::Describe(name) => Reply::Described(topics::describe(engine, &name).await?),
        Request::Purge(topic, group) => Reply::Purged(groups::purge(engine, &topic, &group).await?),
        Request::Stats => Reply::Stats(Box::new(engine.stats().await)),
        Request::Admin(step) => {
            engine.apply_step(*step).await?;
            Reply::Done
        }
        Request::LookupTopic(name, fresh) => {
            engine.lookup_topic(&name, fresh).await?;
            Reply::Done
        }
        Request::Partitions(name) => {
            Reply::Partitions(engine.metadata().and_then(|m| m.partitions(&name)))
        }
        Request::MoveLeader(r) => {
            let metadata = engine.metadata().ok_or_else(|| {
                OpError::PartitionUnavailable("this node has no metastore".into())
            })?;
            metadata.move_leader(r).await?;
            Reply::Done
        }
        Request::DrainNode(id, action) => {
            let metadata = engine.metadata().ok_or_else(|| {
                OpError::InvalidParameter(
                    "this node is not in a cluster: there is no node to drain or remove".into(),
                )
            })?;
            metadata.drain_node(id, action).await?;
            Reply::Done
        }
        Request::Produce(_)
        | Request::Probe(_)
        | Request::Settle(_)
        | Request::GiveBack(_)
        | Request::Signal(_) => unreachable!("the data path is applied in place"),
    })
}

/// A reply that could not be delivered to whoever asked (it went away meanwhile): leases it carries are released.
pub async fn undeliverable(
    engine: &Rc<Engine>,
    request_topic: Option<(String, String)>,
    reply: Reply,
) {
    if let (Reply::Probed(probed), Some((topic, group))) = (reply, request_topic) {
        if !probed.deliveries.is_empty() {
            consume::release(engine, &topic, &group, probed.deliveries).await;
        }
    }
}

/// The (topic, group) a probe leases from, to release its leases if its reply cannot be delivered.
pub fn probe_key(request: &Request) -> Option<(String, String)> {
    match request {
        Request::Probe(p) => Some((p.topic.clone(), p.group.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod future_sizes {
    use super::*;

    /// The size of the future a function returns, without calling it.
    pub(crate) fn size<'a, T: 'a, A, Fut: std::future::Future>(
        _: impl Fn(&'a T, A) -> Fut,
    ) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Every await of a data-path request moves its future at least once, copying all of it: administration stays
    /// boxed (`apply_cold`), so apply's future is about as large as the largest data-path operation's, not as large
    /// as topic creation's.
    #[test]
    fn the_data_path_future_is_not_as_large_as_administration() {
        let hot = size(produce::apply)
            .max(size(consume::apply))
            .max(size(settle::apply));
        let apply = size(apply);
        assert!(
            apply <= hot + 512,
            "ops::apply's future is {apply} bytes against {hot} for the largest data-path operation"
        );
    }
}
