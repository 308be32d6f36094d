//! The checks a request passes before it is applied, whatever carried it. HTTP builds its `Request`s from parsed,
//! validated parameters (`params`, one parser per operation); node RPC decodes them from a peer's bytes, and a peer
//! is not trusted to have done the same: `admit` is where such a value becomes a request this node will apply.
//!
//! - Only the requests another node has a reason to send cross node RPC: the data path (produce, probe, settle,
//!   replay), describe, the one-way wake-up signals and give-backs, and a leader's batches and frontiers for its
//!   followers (`Replicate`, `ReplicateFrontiers`: only as the leader the sender is). Administration is never forwarded between
//!   nodes (each node applies its own through the metastore), and admin steps, stats and metastore lookups are a
//!   node's own business: a peer that sends one gets `400`, and no core ever sees it.
//! - Every name is valid (`validate_name`: what the HTTP layer checks), every count and byte size within the
//!   server's batch limits, every duration within the range its HTTP parameter accepts.
//! - The core exists (`cores`).
//!
//! `on_core_zero` is the other half: the requests that only core 0 may run, refused on any other core by
//! `ops::apply` itself (whatever transport delivered them), so no peer or bug can reach the engine's core-0
//! assertions.

use super::params::BatchLimits;
use super::settle::Settle;
use super::{OpError, OpResult, Reply, Request};
use crate::engine::placement::{Location, NodeIndex};
use crate::engine::topic::{validate_name, MAX_DELAY_MS, MAX_VISIBILITY_MS, MIN_VISIBILITY_MS};
use crate::engine::Signal;
use crate::partition::SettleOp;

/// The requests only core 0 runs: topic and group administration and metastore lookups.
pub fn on_core_zero(request: &Request) -> bool {
    matches!(
        request,
        Request::CreateTopic(_)
            | Request::ChangeTopic(..)
            | Request::DeleteTopic(_)
            | Request::CreateGroup(..)
            | Request::DeleteGroup(..)
            | Request::LookupTopic(..)
            | Request::MoveLeader(_)
            | Request::DrainNode(..)
    )
}

/// Checks a request that arrived from node `peer` (its handshake's node) for `core` of this node (of `cores`): `Ok`
/// if it may be applied, else the `400`/`413` it is answered with. A wake-up registration (a signal's `from`, a
/// probe's `waker`) must name a core of the sending node itself: a peer cannot make this node signal a third one.
/// Allocates nothing; touches no engine state.
pub fn admit(
    request: &Request,
    peer: NodeIndex,
    core: u32,
    cores: usize,
    limits: &BatchLimits,
) -> OpResult<()> {
    if core as usize >= cores {
        return Err(OpError::InvalidParameter(format!(
            "this node has no core {core}"
        )));
    }
    match request {
        Request::Produce(r) => {
            validate_name(&r.topic)?;
            if r.records.is_empty() {
                // HTTP never builds one (an empty batch is 400 there); the log asserts it never gets one.
                return Err(OpError::InvalidRecord("a produce of no records".into()));
            }
            count(r.records.len(), limits, "records")?;
            if !r.meta.is_empty() && r.meta.len() != r.records.len() {
                // The log asserts one flag per record, or none.
                return Err(OpError::InvalidRecord(format!(
                    "{} meta flags for {} records",
                    r.meta.len(),
                    r.records.len()
                )));
            }
            let mut total = 0usize;
            for (i, record) in r.records.iter().enumerate() {
                let bound = match r.meta.get(i) {
                    Some(true) => {
                        // A block that would not parse would be a corrupt record for good.
                        let (meta, _) =
                            crate::storage::meta::RecordMeta::decode(record).map_err(|e| {
                                OpError::InvalidRecord(format!("record {i}: its meta block: {e:?}"))
                            })?;
                        // What HTTP refuses a peer cannot store either: a delivery time past the longest delay
                        // (an hour allowed for clocks apart), an id outside the rule.
                        let latest = crate::clock::wall_clock_ms()
                            .saturating_add(crate::storage::meta::MAX_DELAY_MS + 3_600_000);
                        if meta.not_before_ms > latest {
                            return Err(OpError::InvalidRecord(format!(
                                "record {i}: its delivery time is past the longest delay (15m)"
                            )));
                        }
                        for (name, token) in
                            [("dedup_id", &meta.dedup_id), ("group_key", &meta.group_key)]
                        {
                            if let Some(token) = token {
                                std::str::from_utf8(token)
                                    .map_err(|_| format!("{name} is not UTF-8"))
                                    .and_then(|t| crate::ops::produce::check_token(name, t))
                                    .map_err(|why| {
                                        OpError::InvalidRecord(format!("record {i}: {why}"))
                                    })?;
                            }
                        }
                        limits.max_message_bytes + crate::storage::meta::MAX_OVERHEAD
                    }
                    _ => limits.max_message_bytes,
                };
                if record.len() > bound {
                    return Err(OpError::MessageTooLarge {
                        limit: limits.max_message_bytes,
                    });
                }
                total += record.len();
            }
            if total > limits.max_batch_bytes + r.meta.len() * crate::storage::meta::MAX_OVERHEAD {
                return Err(OpError::BatchTooLarge(format!(
                    "the batch holds more than {} bytes (max_batch_bytes)",
                    limits.max_batch_bytes
                )));
            }
            Ok(())
        }
        Request::Probe(r) => {
            names(&r.topic, &r.group)?;
            if let Some(waker) = r.waker {
                from_peer(waker, peer)?;
            }
            if r.max == 0 {
                return Err(OpError::InvalidParameter("max must be at least 1".into()));
            }
            count(r.max, limits, "messages asked for")?;
            if r.max_bytes > limits.max_batch_bytes {
                return Err(OpError::BatchTooLarge(format!(
                    "a probe for {} payload bytes: more than {} (max_batch_bytes)",
                    r.max_bytes, limits.max_batch_bytes
                )));
            }
            if let Some(v) = r.visibility_ms {
                within("visibility", v, MIN_VISIBILITY_MS, MAX_VISIBILITY_MS)?;
            }
            Ok(())
        }
        Request::Settle(r) => settle(r, limits),
        Request::Replicate(r) => {
            validate_name(&r.topic)?;
            nonce_ceiling(r.nonces)?;
            if r.leader != peer {
                return Err(OpError::InvalidParameter(format!(
                    "node {peer} shipped a batch as node {}",
                    r.leader
                )));
            }
            // A probe (no records, no bytes) asks for the replica's end; anything else carries both. Only a probe
            // may ask a replica to start its log anew.
            if r.restart && r.count > 0 {
                return Err(OpError::InvalidParameter(
                    "a shipped batch that restarts the replica's log: only a probe may".into(),
                ));
            }
            if r.first_offset > crate::storage::log::MAX_OFFSET {
                return Err(OpError::InvalidParameter(format!(
                    "offset {} is beyond any log (at most {})",
                    r.first_offset,
                    crate::storage::log::MAX_OFFSET
                )));
            }
            if (r.count == 0) != r.frames.is_empty() {
                return Err(OpError::InvalidRecord(format!(
                    "a shipped batch of {} records in {} bytes",
                    r.count,
                    r.frames.len()
                )));
            }
            // No larger than a batch this node's leaders write: their log batches up to 4 MiB, or one produce's
            // records when larger (framed: a 32-byte header each).
            // (Each record's meta block may add up to `MAX_OVERHEAD` to what the limits count.)
            let header = crate::storage::frame::HEADER_LEN + crate::storage::meta::MAX_OVERHEAD;
            let most = (4usize << 20)
                .max(limits.max_batch_bytes + limits.max_batch_records * header)
                .max(limits.max_message_bytes + header);
            if r.frames.len() > most {
                return Err(OpError::BatchTooLarge(format!(
                    "a shipped batch of {} bytes: more than {most}",
                    r.frames.len()
                )));
            }
            // Its epochs: as a history holds them, the first covering the record before the batch (or starting
            // inside it: records older than the history have none), each other one starting inside the batch or
            // right after it, none of a newer leadership than the sender's; a probe's, its sender's whole history
            // (whatever offset it probes from: a follower may hold more of its leader's records than it asks about).
            if r.epochs.len() > crate::ops::replicate::MAX_EPOCH_ENTRIES {
                return Err(OpError::BatchTooLarge(format!(
                    "{} epoch entries with one batch: more than {}",
                    r.epochs.len(),
                    crate::ops::replicate::MAX_EPOCH_ENTRIES
                )));
            }
            let end = r.first_offset.saturating_add(u64::from(r.count));
            let inside = r.count == 0
                || r.epochs
                    .iter()
                    .skip(1)
                    .all(|e| e.start >= r.first_offset && e.start <= end);
            if !crate::storage::epoch_history::ascending(&r.epochs)
                || (r.count > 0 && r.epochs.first().is_some_and(|e| e.start > end))
                || !inside
                || r.epochs.iter().any(|e| e.epoch > r.epoch)
            {
                return Err(OpError::InvalidParameter(format!(
                    "epoch entries {:?} do not cover a batch of offsets {}..{end}",
                    r.epochs, r.first_offset
                )));
            }
            Ok(())
        }
        Request::MoveLeader(_) | Request::DrainNode(..) => Err(OpError::InvalidParameter(format!(
            "{} is internal to a node: a peer cannot send it",
            kind(request)
        ))),
        Request::BeginEpoch(r) => {
            validate_name(&r.topic)?;
            nonce_ceiling(r.nonces)?;
            if r.leader != peer {
                return Err(OpError::InvalidParameter(format!(
                    "node {peer} began an epoch as node {}",
                    r.leader
                )));
            }
            Ok(())
        }
        Request::ReplicateFrontiers(r) => {
            validate_name(&r.topic)?;
            if r.leader != peer {
                return Err(OpError::InvalidParameter(format!(
                    "node {peer} shipped frontiers as node {}",
                    r.leader
                )));
            }
            if r.marks.len() > crate::ops::replicate::MAX_FRONTIER_MARKS {
                return Err(OpError::BatchTooLarge(format!(
                    "{} frontiers in one request: more than {}",
                    r.marks.len(),
                    crate::ops::replicate::MAX_FRONTIER_MARKS
                )));
            }
            for (i, m) in r.marks.iter().enumerate() {
                validate_name(&m.group)?;
                if !m.value().is_normal() {
                    return Err(OpError::InvalidParameter(format!(
                        "the acked ranges of group '{}' are not sorted, disjoint ranges above its frontier {} (at most {})",
                        m.group,
                        m.committed,
                        crate::storage::frontier::MAX_RANGES
                    )));
                }
                // One mark per group, in name order (as a leader sends them): no group twice in one request.
                if i > 0 && r.marks[i - 1].group >= m.group {
                    return Err(OpError::InvalidParameter(format!(
                        "frontiers not in ascending group order at '{}'",
                        m.group
                    )));
                }
            }
            Ok(())
        }
        Request::Replay(r) => {
            validate_name(&r.topic)?;
            within("wait", r.wait_ms, 0, super::consume::MAX_WAIT_MS)
        }
        Request::Describe(name) => Ok(validate_name(name)?),
        Request::Purge(topic, group) => names(topic, group),
        Request::Signal(Signal::Interest { topic, group, from })
        | Request::Signal(Signal::NoInterest { topic, group, from }) => {
            names(topic, group)?;
            from_peer(*from, peer)
        }
        // A wake-up's count only says how many parked consumers to wake: any number is harmless.
        Request::Signal(Signal::Wake { topic, group, .. }) => names(topic, group),
        Request::GiveBack(r) => {
            names(&r.topic, &r.group)?;
            count(r.leases.len(), limits, "leases")
        }
        Request::CreateTopic(_)
        | Request::ChangeTopic(..)
        | Request::DeleteTopic(_)
        | Request::CreateGroup(..)
        | Request::DeleteGroup(..)
        | Request::Stats
        | Request::Admin(_)
        | Request::LookupTopic(..)
        | Request::Partitions(_) => Err(OpError::InvalidParameter(format!(
            "{} is not accepted over node RPC",
            kind(request)
        ))),
    }
}

/// A nonce ceiling a peer asks a replica to promise: at most `nonces::NONCE_MAX` (a higher one would leave its
/// partition's later leaders no room).
fn nonce_ceiling(nonces: u64) -> Result<(), OpError> {
    if nonces > crate::partition::nonces::NONCE_MAX {
        return Err(OpError::InvalidParameter(format!(
            "a nonce ceiling of {nonces} is above the limit {}",
            crate::partition::nonces::NONCE_MAX
        )));
    }
    Ok(())
}

fn settle(r: &Settle, limits: &BatchLimits) -> OpResult<()> {
    names(&r.topic, &r.group)?;
    if r.items.is_empty() {
        return Err(OpError::InvalidReceiptHandle(String::new()));
    }
    count(r.items.len(), limits, "receipt handles")?;
    match r.op {
        SettleOp::Ack => Ok(()),
        SettleOp::Nack(delay) => delay.map_or(Ok(()), |d| within("delay", d, 0, MAX_DELAY_MS)),
        SettleOp::Extend(v) => v.map_or(Ok(()), |v| {
            within("visibility", v, MIN_VISIBILITY_MS, MAX_VISIBILITY_MS)
        }),
    }
}

fn from_peer(location: Location, peer: NodeIndex) -> OpResult<()> {
    if location.node != peer {
        return Err(OpError::InvalidParameter(format!(
            "node {peer} registered a wake-up for node {}",
            location.node
        )));
    }
    Ok(())
}

fn names(topic: &str, group: &str) -> OpResult<()> {
    validate_name(topic)?;
    validate_name(group)?;
    Ok(())
}

fn count(n: usize, limits: &BatchLimits, what: &str) -> OpResult<()> {
    if n > limits.max_batch_records {
        return Err(OpError::BatchTooLarge(format!(
            "{n} {what}: more than {} (max_batch_records)",
            limits.max_batch_records
        )));
    }
    Ok(())
}

fn within(what: &str, v: u64, min: u64, max: u64) -> OpResult<()> {
    if v < min || v > max {
        return Err(OpError::InvalidParameter(format!(
            "{what} must be between {min} and {max} ms, not {v}"
        )));
    }
    Ok(())
}

/// What the reply to a request must be: its variant and, for a batch, its length. Taken before the request is
/// sent to another node, checked on its reply (`check_reply`): a peer's reply is untrusted input too, and a wrong
/// variant or length must become an error answer, never a panic or a silent `200` for handles nobody settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    Produced(usize),
    /// At most this many deliveries.
    Probed(usize),
    /// Exactly this many results.
    Settled(usize),
    Replayed,
    Created,
    Changed,
    GroupCreated,
    Described,
    Stats,
    Done,
    Partitions,
    Replicated,
    Began,
    Purged,
}

/// The reply `request` must get.
pub fn expect(request: &Request) -> Expected {
    match request {
        Request::Produce(p) => Expected::Produced(p.records.len()),
        Request::Probe(p) => Expected::Probed(p.max),
        Request::Settle(s) => Expected::Settled(s.items.len()),
        Request::Replay(_) => Expected::Replayed,
        Request::CreateTopic(_) => Expected::Created,
        Request::ChangeTopic(..) => Expected::Changed,
        Request::CreateGroup(..) => Expected::GroupCreated,
        Request::Describe(_) => Expected::Described,
        Request::Stats => Expected::Stats,
        Request::Partitions(_) => Expected::Partitions,
        Request::Replicate(_) => Expected::Replicated,
        Request::BeginEpoch(_) => Expected::Began,
        Request::Purge(..) => Expected::Purged,
        Request::DeleteTopic(_)
        | Request::DeleteGroup(..)
        | Request::Admin(_)
        | Request::Signal(_)
        | Request::LookupTopic(..)
        | Request::GiveBack(_)
        | Request::ReplicateFrontiers(_)
        | Request::MoveLeader(_)
        | Request::DrainNode(..) => Expected::Done,
    }
}

/// `Err(why)` when `reply` is not what `expected` says.
pub fn check_reply(expected: Expected, reply: &Reply) -> Result<(), String> {
    let fits = match (expected, reply) {
        (Expected::Produced(n), Reply::Produced(p)) => {
            if !p.offsets.is_empty() && p.offsets.len() != n {
                return Err(format!(
                    "{} offsets for a produce of {n} records",
                    p.offsets.len()
                ));
            }
            true
        }
        (Expected::Probed(max), Reply::Probed(p)) => {
            if p.deliveries.len() > max {
                return Err(format!(
                    "{} deliveries for a probe of at most {max}",
                    p.deliveries.len()
                ));
            }
            true
        }
        (Expected::Settled(n), Reply::Settled(s)) => {
            if s.results.len() != n {
                return Err(format!(
                    "{} results for {n} receipt handles",
                    s.results.len()
                ));
            }
            true
        }
        (Expected::Replayed, Reply::Replayed(_))
        | (Expected::Created, Reply::Created(..))
        | (Expected::Changed, Reply::Changed(_))
        | (Expected::GroupCreated, Reply::GroupCreated(_))
        | (Expected::Described, Reply::Described(_))
        | (Expected::Stats, Reply::Stats(_))
        | (Expected::Partitions, Reply::Partitions(_))
        | (Expected::Replicated, Reply::Replicated(_))
        | (Expected::Began, Reply::Began(_))
        | (Expected::Purged, Reply::Purged(_))
        | (Expected::Done, Reply::Done) => true,
        _ => false,
    };
    if fits {
        Ok(())
    } else {
        Err(format!("expected {expected:?}, got {}", reply_kind(reply)))
    }
}

fn reply_kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Produced(_) => "Produced",
        Reply::Probed(_) => "Probed",
        Reply::Settled(_) => "Settled",
        Reply::Replayed(_) => "Replayed",
        Reply::Created(..) => "Created",
        Reply::Changed(_) => "Changed",
        Reply::GroupCreated(_) => "GroupCreated",
        Reply::Described(_) => "Described",
        Reply::Stats(_) => "Stats",
        Reply::Done => "Done",
        Reply::Partitions(_) => "Partitions",
        Reply::Replicated(_) => "Replicated",
        Reply::Began(_) => "Began",
        Reply::Purged(_) => "Purged",
    }
}

/// A request's name, for error texts.
pub fn kind(request: &Request) -> &'static str {
    match request {
        Request::Produce(_) => "Produce",
        Request::Probe(_) => "Probe",
        Request::Settle(_) => "Settle",
        Request::Replay(_) => "Replay",
        Request::CreateTopic(_) => "CreateTopic",
        Request::ChangeTopic(..) => "ChangeTopic",
        Request::DeleteTopic(_) => "DeleteTopic",
        Request::CreateGroup(..) => "CreateGroup",
        Request::DeleteGroup(..) => "DeleteGroup",
        Request::Describe(_) => "Describe",
        Request::Stats => "Stats",
        Request::Admin(_) => "Admin",
        Request::Signal(_) => "Signal",
        Request::LookupTopic(..) => "LookupTopic",
        Request::GiveBack(_) => "GiveBack",
        Request::Partitions(_) => "Partitions",
        Request::Replicate(_) => "Replicate",
        Request::ReplicateFrontiers(_) => "ReplicateFrontiers",
        Request::BeginEpoch(_) => "BeginEpoch",
        Request::MoveLeader(_) => "MoveLeader",
        Request::DrainNode(..) => "DrainNode",
        Request::Purge(..) => "Purge",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::topic::TopicConfig;
    use crate::ops::consume::{GiveBack, Probe};
    use crate::ops::produce::Produce;
    use crate::ops::replay::Replay;
    use bytes::Bytes;

    const LIMITS: BatchLimits = BatchLimits {
        max_batch_records: 10,
        max_batch_bytes: 100,
        max_message_bytes: 40,
    };

    fn produce(topic: &str, records: Vec<Bytes>) -> Request {
        Request::Produce(Produce {
            topic: topic.into(),
            topic_id: 1,
            partition: 0,
            records,
            meta: Vec::new(),
        })
    }

    fn probe(group: &str, max: usize, visibility_ms: Option<u64>) -> Request {
        Request::Probe(Probe {
            topic: "t".into(),
            topic_id: 1,
            group: group.into(),
            max,
            visibility_ms,
            waker: None,
            max_bytes: 100,
            taken_any: false,
        })
    }

    fn settle(items: usize, op: SettleOp) -> Request {
        Request::Settle(Settle {
            topic: "t".into(),
            topic_id: 1,
            group: "g".into(),
            partition: 0,
            items: vec![(0, 0); items],
            op,
            dead_lettered: false,
        })
    }

    #[test]
    fn administration_and_a_nodes_own_business_never_cross_node_rpc() {
        let refused = [
            Request::CreateTopic(Box::new(TopicConfig::with_defaults("t"))),
            Request::DeleteTopic("t".into()),
            Request::CreateGroup("t".into(), "g".into(), false),
            Request::DeleteGroup("t".into(), "g".into()),
            Request::ChangeTopic("t".into(), Default::default()),
            Request::Stats,
            Request::Admin(Box::new(crate::engine::AdminStep::Drop("t".into()))),
            Request::LookupTopic("t".into(), true),
        ];
        for r in refused {
            let e = admit(&r, 5, 0, 2, &LIMITS).unwrap_err();
            assert!(
                matches!(e, OpError::InvalidParameter(ref m) if m.contains("not accepted over node RPC")),
                "{r:?}: {e}"
            );
        }
        // A node's own moves of leadership and replicas (its fencing rounds, CheckQuorum, drains) and the drains
        // its clients ask for: a peer can send neither.
        let internal = [
            Request::MoveLeader(crate::ops::replicate::MoveLeader {
                topic: "t".into(),
                topic_id: 1,
                partition: 0,
                epoch: 1,
                leader: 5,
                replicas: vec![5, 6, 7],
                learners: vec![7],
            }),
            Request::DrainNode("n1".into(), crate::engine::cluster::DrainAction::Remove),
        ];
        for r in internal {
            let e = admit(&r, 5, 0, 2, &LIMITS).unwrap_err();
            assert!(
                matches!(e, OpError::InvalidParameter(ref m) if m.contains("internal to a node")),
                "{r:?}: {e}"
            );
        }
    }

    #[test]
    fn the_data_path_is_admitted_within_limits_and_refused_beyond() {
        let ok = |r: Request| admit(&r, 5, 1, 2, &LIMITS).unwrap();
        let refused = |r: Request| admit(&r, 5, 1, 2, &LIMITS).unwrap_err();
        ok(produce("t", vec![Bytes::from_static(b"x"); 10]));
        ok(probe("g", 10, Some(MIN_VISIBILITY_MS)));
        ok(settle(10, SettleOp::Ack));
        ok(settle(1, SettleOp::Nack(Some(MAX_DELAY_MS))));
        ok(Request::Describe("t".into()));

        assert!(matches!(
            refused(produce("../x", vec![])),
            OpError::InvalidTopic(_)
        ));
        assert!(matches!(
            refused(produce("t", vec![])),
            OpError::InvalidRecord(_)
        ));
        assert!(matches!(
            refused(produce("t", vec![Bytes::from_static(b"x"); 11])),
            OpError::BatchTooLarge(_)
        ));
        assert!(matches!(
            refused(produce("t", vec![Bytes::from(vec![0u8; 41])])),
            OpError::MessageTooLarge { limit: 40 }
        ));
        assert!(matches!(
            refused(produce("t", vec![Bytes::from(vec![0u8; 40]); 3])),
            OpError::BatchTooLarge(_)
        ));
        assert!(matches!(
            refused(probe("../x/y", 1, None)),
            OpError::InvalidTopic(_)
        ));
        assert!(matches!(
            refused(probe("g", 0, None)),
            OpError::InvalidParameter(_)
        ));
        assert!(matches!(
            refused(probe("g", 11, None)),
            OpError::BatchTooLarge(_)
        ));
        assert!(matches!(
            refused(probe("g", 1, Some(1))),
            OpError::InvalidParameter(_)
        ));
        let Request::Probe(mut greedy) = probe("g", 1, None) else {
            unreachable!()
        };
        greedy.max_bytes = 101;
        assert!(matches!(
            refused(Request::Probe(greedy)),
            OpError::BatchTooLarge(_)
        ));
        assert!(matches!(
            refused(settle(11, SettleOp::Ack)),
            OpError::BatchTooLarge(_)
        ));
        assert!(matches!(
            refused(settle(0, SettleOp::Ack)),
            OpError::InvalidReceiptHandle(_)
        ));
        assert!(matches!(
            refused(settle(1, SettleOp::Extend(Some(MAX_VISIBILITY_MS + 1)))),
            OpError::InvalidParameter(_)
        ));
        assert!(matches!(
            refused(Request::Replay(Replay {
                topic: "t".into(),
                topic_id: 1,
                partition: 0,
                offset: 0,
                wait_ms: u64::MAX,
            })),
            OpError::InvalidParameter(_)
        ));
        assert!(matches!(
            refused(Request::GiveBack(GiveBack {
                topic: "t".into(),
                group: "a/b".into(),
                leases: vec![],
            })),
            OpError::InvalidTopic(_)
        ));
        assert!(matches!(
            refused(Request::Signal(Signal::Wake {
                topic: "t".into(),
                group: "..".into(),
                n: 1,
            })),
            OpError::InvalidTopic(_)
        ));
        // Wake-ups registered for another node than the sender.
        let elsewhere = Location { node: 6, core: 0 };
        let Request::Probe(mut p) = probe("g", 1, None) else {
            unreachable!()
        };
        p.waker = Some(elsewhere);
        assert!(matches!(
            refused(Request::Probe(p)),
            OpError::InvalidParameter(_)
        ));
        let interest = |from| {
            Request::Signal(Signal::Interest {
                topic: "t".into(),
                group: "g".into(),
                from,
            })
        };
        assert!(matches!(
            refused(interest(elsewhere)),
            OpError::InvalidParameter(_)
        ));
        ok(interest(Location { node: 5, core: 1 }));
        // A core this node does not have.
        assert!(matches!(
            admit(&probe("g", 1, None), 5, 2, 2, &LIMITS).unwrap_err(),
            OpError::InvalidParameter(_)
        ));
    }

    fn delivery() -> crate::partition::Delivery {
        crate::partition::Delivery {
            meta: None,
            partition: 0,
            offset: 0,
            nonce: 0,
            delivery_count: 1,
            expires_at_ms: 0,
            sent_ms: 0,
            payload: Bytes::new(),
        }
    }

    #[test]
    fn shipped_frontiers_are_admitted_only_from_their_leader_with_valid_names_and_bounded() {
        let ship = |leader: u32, groups: &[&str]| {
            Request::ReplicateFrontiers(crate::ops::replicate::ReplicateFrontiers {
                topic: "t".into(),
                topic_id: 1,
                partition: 0,
                leader,
                epoch: 1,
                marks: groups
                    .iter()
                    .map(|g| crate::ops::replicate::FrontierMark {
                        group: g.to_string(),
                        committed: 5,
                        start: false,
                        group_id: 0,
                        acked: Vec::new(),
                    })
                    .collect(),
            })
        };
        assert!(admit(&ship(3, &["g", "h"]), 3, 0, 2, &LIMITS).is_ok());
        assert!(matches!(
            admit(&ship(4, &["g"]), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(ref m)) if m.contains("as node 4")
        ));
        assert!(admit(&ship(3, &["../x"]), 3, 0, 2, &LIMITS).is_err());
        assert!(admit(&ship(3, &[""]), 3, 0, 2, &LIMITS).is_err());
        // One mark per group, in name order.
        assert!(matches!(
            admit(&ship(3, &["h", "g"]), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(_))
        ));
        assert!(matches!(
            admit(&ship(3, &["g", "g"]), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(_))
        ));
        let names: Vec<String> = (0..=crate::ops::replicate::MAX_FRONTIER_MARKS)
            .map(|i| format!("g{i:05}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let most = &names[..crate::ops::replicate::MAX_FRONTIER_MARKS];
        assert!(admit(&ship(3, most), 3, 0, 2, &LIMITS).is_ok());
        let more = &names[..];
        assert!(matches!(
            admit(&ship(3, more), 3, 0, 2, &LIMITS),
            Err(OpError::BatchTooLarge(_))
        ));
        assert!(matches!(expect(&ship(3, &["g"])), Expected::Done));
    }

    #[test]
    fn a_shipped_batch_is_admitted_only_from_its_leader_and_no_larger_than_a_leaders_batch() {
        let ship = |leader: u32, len: usize| {
            Request::Replicate(crate::ops::replicate::Replicate {
                topic: "t".into(),
                topic_id: 1,
                partition: 0,
                leader,
                epoch: 1,
                segment_base: 0,
                position: 0,
                first_offset: 0,
                count: 1,
                frames: Bytes::from(vec![0u8; len]),
                epochs: Vec::new(),
                hold: 0,
                promote: false,
                nonces: 0,
                restart: false,
            })
        };
        assert!(admit(&ship(3, 64), 3, 0, 2, &LIMITS).is_ok());
        assert!(matches!(
            admit(&ship(4, 64), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(ref m)) if m.contains("as node 4")
        ));
        assert!(matches!(
            admit(&ship(3, 0), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidRecord(_))
        ));
        // A probe (no records and no bytes) is admitted; no records with bytes is not.
        let probe = |len: usize| match ship(3, len) {
            Request::Replicate(mut r) => {
                r.count = 0;
                Request::Replicate(r)
            }
            _ => unreachable!(),
        };
        assert!(admit(&probe(0), 3, 0, 2, &LIMITS).is_ok());
        assert!(matches!(
            admit(&probe(8), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidRecord(_))
        ));
        // Only a probe may start a replica's log anew at its leader's start.
        let restart = |r: Request| match r {
            Request::Replicate(mut r) => {
                r.restart = true;
                Request::Replicate(r)
            }
            _ => unreachable!(),
        };
        assert!(admit(&restart(probe(0)), 3, 0, 2, &LIMITS).is_ok());
        assert!(matches!(
            admit(&restart(ship(3, 64)), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(ref m)) if m.contains("only a probe")
        ));
        // A probe carries its sender's whole history, past the offset it asks at (a restart probe's, past the start it
        // restarts at).
        let with_history = |r: Request| match r {
            Request::Replicate(mut r) => {
                use crate::storage::epoch_history::EpochStart;
                r.epoch = 3;
                r.first_offset = 50;
                r.epochs = vec![
                    EpochStart { epoch: 1, start: 0 },
                    EpochStart {
                        epoch: 3,
                        start: 90,
                    },
                ];
                Request::Replicate(r)
            }
            _ => unreachable!(),
        };
        assert!(admit(&with_history(restart(probe(0))), 3, 0, 2, &LIMITS).is_ok());
        assert!(admit(&with_history(probe(0)), 3, 0, 2, &LIMITS).is_ok());
        // No offset beyond any log.
        let far = |r: Request| match r {
            Request::Replicate(mut r) => {
                r.first_offset = crate::storage::log::MAX_OFFSET + 1;
                Request::Replicate(r)
            }
            _ => unreachable!(),
        };
        assert!(matches!(
            admit(&far(restart(probe(0))), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(ref m)) if m.contains("beyond any log")
        ));
        // With these tiny limits a leader's batch is at most the log's 4 MiB.
        assert!(admit(&ship(3, 4 << 20), 3, 0, 2, &LIMITS).is_ok());
        assert!(matches!(
            admit(&ship(3, (4 << 20) + 1), 3, 0, 2, &LIMITS),
            Err(OpError::BatchTooLarge(_))
        ));
        assert!(matches!(
            admit(&ship(3, 64), 3, 2, 2, &LIMITS),
            Err(OpError::InvalidParameter(_))
        ));
        // Its epochs: the one covering the record before it, then each starting inside it or right after it,
        // ascending; a probe's, the sender's whole history, ascending, none newer than its epoch.
        use crate::storage::epoch_history::EpochStart;
        const EPOCH: u64 = 1; // the sender's, as `ship` makes it
        let with = |first: u64, count: u32, epochs: &[(u64, u64)]| match ship(3, 64) {
            Request::Replicate(mut r) => {
                r.first_offset = first;
                r.count = count;
                if count == 0 {
                    r.frames = Bytes::new();
                }
                r.epochs = epochs
                    .iter()
                    .map(|&(epoch, start)| EpochStart { epoch, start })
                    .collect();
                Request::Replicate(r)
            }
            _ => unreachable!(),
        };
        for good in [
            with(10, 5, &[]),
            with(10, 5, &[(1, 0)]),
            with(10, 5, &[(1, 10)]),
            with(10, 5, &[(1, 12)]),
            with(10, 5, &[(0, 0), (1, 11)]),
            with(10, 5, &[(1, 15)]),
            with(10, 5, &[(0, 0), (1, 15)]),
            with(10, 0, &[]),
            with(10, 0, &[(EPOCH, 10)]),
            with(10, 0, &[(EPOCH, 3)]),
            with(10, 0, &[(0, 3)]),
            with(10, 0, &[(0, 3), (EPOCH, 4)]),
            with(10, 0, &[(EPOCH, 11)]),
            with(10, 0, &[(0, 3), (EPOCH, 11)]),
            with(10, 5, &[(0, 0), (1, 10)]),
        ] {
            assert!(admit(&good, 3, 0, 2, &LIMITS).is_ok(), "{good:?}");
        }
        for bad in [
            with(10, 5, &[(1, 16)]),
            with(10, 5, &[(0, 0), (1, 9)]),
            with(10, 5, &[(0, 0), (1, 16)]),
            with(10, 0, &[(EPOCH, 3), (0, 4)]),
            with(10, 0, &[(0, 3), (EPOCH + 1, 11)]),
            with(10, 5, &[(1, 0), (0, 12)]),
            with(10, 5, &[(0, 0), (1, 12), (2, 12)]),
            with(10, 5, &[(2, 0)]),
        ] {
            assert!(
                matches!(
                    admit(&bad, 3, 0, 2, &LIMITS),
                    Err(OpError::InvalidParameter(_))
                ),
                "{bad:?}"
            );
        }
        // A fencing round only from the new leader it names.
        let begin = |leader: u32| {
            Request::BeginEpoch(crate::ops::replicate::BeginEpoch {
                topic: "t".into(),
                topic_id: 1,
                partition: 0,
                leader,
                epoch: 9,
                nonces: 0,
            })
        };
        assert!(admit(&begin(3), 3, 0, 2, &LIMITS).is_ok());
        assert!(matches!(
            admit(&begin(4), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(ref m)) if m.contains("as node 4")
        ));
        assert!(matches!(expect(&begin(3)), Expected::Began));
        // A nonce ceiling above the limit, asked by a round or carried by a batch: refused, nothing promised.
        use crate::partition::nonces::NONCE_MAX;
        let asking = |nonces: u64| {
            Request::BeginEpoch(crate::ops::replicate::BeginEpoch {
                topic: "t".into(),
                topic_id: 1,
                partition: 0,
                leader: 3,
                epoch: 9,
                nonces,
            })
        };
        assert!(admit(&asking(NONCE_MAX), 3, 0, 2, &LIMITS).is_ok());
        assert!(matches!(
            admit(&asking(NONCE_MAX + 1), 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(ref m)) if m.contains("nonce ceiling")
        ));
        let mut probe = with(0, 0, &[]);
        if let Request::Replicate(r) = &mut probe {
            r.nonces = u64::MAX;
        }
        assert!(matches!(
            admit(&probe, 3, 0, 2, &LIMITS),
            Err(OpError::InvalidParameter(ref m)) if m.contains("nonce ceiling")
        ));
        let many: Vec<(u64, u64)> = (0..=crate::ops::replicate::MAX_EPOCH_ENTRIES as u64)
            .map(|i| (i + 1, i))
            .collect();
        assert!(matches!(
            admit(&with(0, 10_000, &many), 3, 0, 2, &LIMITS),
            Err(OpError::BatchTooLarge(_))
        ));
    }

    #[test]
    fn a_peers_reply_of_the_wrong_variant_or_length_is_refused() {
        use crate::ops::consume::Probed;
        use crate::ops::settle::Settled;

        let settled = |n: usize| {
            Reply::Settled(Settled {
                results: vec![Ok(()); n],
            })
        };
        let e = expect(&settle(3, SettleOp::Ack));
        assert_eq!(e, Expected::Settled(3));
        assert!(check_reply(e, &settled(3)).is_ok());
        assert!(check_reply(e, &settled(2))
            .unwrap_err()
            .contains("2 results for 3"));
        assert!(check_reply(e, &settled(4)).is_err());
        assert!(check_reply(e, &Reply::Done)
            .unwrap_err()
            .contains("got Done"));
        let e = expect(&probe("g", 1, None));
        assert!(check_reply(e, &Reply::Probed(Probed::default())).is_ok());
        let two = Probed {
            deliveries: vec![delivery(), delivery()],
            ..Default::default()
        };
        assert!(check_reply(e, &Reply::Probed(two)).is_err());
        assert!(check_reply(expect(&produce("t", vec![])), &settled(0)).is_err());
    }
}
