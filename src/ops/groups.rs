//! Consumer groups: `PUT /topics/T/groups/G[?start=earliest|latest]` (create), `DELETE /topics/T/groups/G`, and
//! `GET /topics/T/groups` (list, with per-partition state). Core 0 applies creations and deletions (every core
//! writes its partitions' frontier files first); a consume naming a group that does not exist creates it too.
//!
//! Read in order: `parse_start`, then `front/admin.rs` and `engine/admin.rs` (core 0, then every core), and the
//! replies here (`render_created`, `groups_json`, `group_json`). Route: `http/routes.rs`.

use super::error::{OpError, OpResult};
use super::params::Query;
use super::response::Response;
use crate::engine::topic::TopicConfig;
use crate::engine::Engine;
use crate::partition::{GroupInfo, PartitionInfo};
use serde_json::json;
use std::rc::Rc;

/// Where a new group starts.
pub fn parse_start(query: &Query) -> OpResult<bool> {
    match query.get("start").as_deref() {
        None | Some("earliest") => Ok(false),
        Some("latest") => Ok(true),
        Some(other) => Err(OpError::InvalidParameter(format!(
            "start must be earliest or latest, not '{other}'"
        ))),
    }
}

/// Creates a group (core 0): true if created, false if it existed.
pub async fn create(engine: &Rc<Engine>, topic: &str, group: &str, latest: bool) -> OpResult<bool> {
    Ok(engine.create_group(topic, group, latest).await?)
}

/// Deletes a group (core 0).
pub async fn delete(engine: &Rc<Engine>, topic: &str, group: &str) -> OpResult<()> {
    Ok(engine.delete_group(topic, group).await?)
}

/// Purges a group on the partitions of `topic` this core leads (any core: `Request::Purge`): how many messages
/// were unsettled. The new frontiers are durable before this returns, as a tick of the frontier timer makes them:
/// recorded in the core's journal (synced) and shipped to a replicated partition's followers, or without a journal
/// written to their files. A group the topic lacks is `404 group_not_found`.
pub async fn purge(engine: &Rc<Engine>, topic: &str, group: &str) -> OpResult<u64> {
    let gone = || {
        OpError::Engine(crate::engine::EngineError::GroupNotFound {
            topic: topic.to_string(),
            group: group.to_string(),
        })
    };
    let t = engine.topic(topic)?;
    if !t.config().has_group(group) {
        return Err(gone());
    }
    let mut purged = 0u64;
    let mut ends = Vec::new();
    // A partition that cannot purge (deposed, its frontier unreadable) fails the request, but only once the ones
    // purged already are made durable: what the answer says was reached stays purged.
    let mut failed = None;
    for p in t.owned_partitions() {
        match p.purge_group(group).await {
            Ok((n, end)) => {
                purged = purged.saturating_add(n);
                ends.push((p, end));
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let journaled = crate::engine::timers::journal_moved(engine).await;
    match engine.journal() {
        Some(journal) if journaled => journal.sync_now().await.map_err(|e| {
            OpError::Engine(crate::engine::EngineError::Partition(
                crate::partition::PartitionError::from(e),
            ))
        })?,
        _ => {
            for (p, end) in &ends {
                p.make_frontier_durable(group, *end).await;
            }
        }
    }
    if let Some(e) = failed {
        return Err(OpError::Engine(crate::engine::EngineError::Partition(e)));
    }
    for (p, end) in &ends {
        match p.durable_frontier(group) {
            // Its shard went meanwhile: the group was deleted, or this node stopped leading the partition.
            None if t.config().has_group(group) && engine.topic(topic).is_ok() => {
                return Err(OpError::PartitionUnavailable(format!(
                    "partition {} changed leader during the purge; run it again",
                    p.id
                )))
            }
            None => return Err(gone()),
            Some(d) if d < *end => {
                return Err(OpError::Engine(crate::engine::EngineError::Storage(format!(
                    "partition {}: the purge holds in memory, but its frontier could not be made durable now (retried at the next flush)",
                    p.id
                ))))
            }
            Some(_) => {}
        }
    }
    Ok(purged)
}

/// The answer to `POST /topics/T/groups/G/purge`.
pub fn render_purged(topic: &str, group: &str, purged: u64) -> Response {
    Response::json(
        200,
        &json!({"topic": topic, "group": group, "purged": purged}),
    )
}

// ---- The replies ----

/// A group's state on one partition, as both the topic description and the group listing show it (the counters in
/// `GroupInfo::counters` order: delivered, redelivered, acked, nacked, extended, expired, lease_gone, dead_lettered,
/// retention_skipped).
pub fn group_state_json(g: &GroupInfo) -> serde_json::Value {
    json!({
        "committed": g.committed,
        "durable": g.durable,
        "in_flight": g.in_flight,
        "delayed": g.delayed,
        "acked_ahead": g.acked_ahead,
        "redelivered": g.counters[1],
        "dead_lettered": g.counters[7],
        "retention_skipped": g.counters[8],
    })
}

/// Every group of a topic with its state on every partition.
pub fn groups_json(config: &TopicConfig, partitions: &[PartitionInfo]) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = config
        .all_groups()
        .iter()
        .map(|g| group_json(g, partitions))
        .collect();
    json!(groups)
}

/// The partition's end as a group sees it (a replicated partition serves up to its commit offset), and the
/// group's lag there: what is not settled yet between its frontier (at least the partition's start: retention
/// removed what lies below) and that end, less what is acked ahead.
pub fn end_and_lag(p: &PartitionInfo, g: &GroupInfo) -> (u64, u64) {
    let end = p.commit_offset.unwrap_or(p.end_offset).min(p.end_offset);
    let lag = end
        .saturating_sub(g.committed.max(p.start_offset))
        .saturating_sub(g.acked_ahead as u64);
    (end, lag)
}

pub fn group_json(group: &str, partitions: &[PartitionInfo]) -> serde_json::Value {
    let mut total = 0;
    let parts: Vec<serde_json::Value> = partitions
        .iter()
        .filter_map(|p| {
            let g = p.groups.iter().find(|g| g.group == group)?;
            let mut v = group_state_json(g);
            let (end, lag) = end_and_lag(p, g);
            total += lag;
            v["end_offset"] = json!(end);
            v["lag"] = json!(lag);
            v["partition"] = json!(p.partition);
            v["corrupt_skipped"] = json!(g.corrupt_skipped);
            v["delivered"] = json!(g.counters[0]);
            v["acked"] = json!(g.counters[2]);
            v["nacked"] = json!(g.counters[3]);
            v["expired"] = json!(g.counters[5]);
            Some(v)
        })
        .collect();
    json!({"group": group, "lag": total, "partitions": parts})
}

/// The answer to `PUT /topics/T/groups/G`: `201` when created, `200` when it existed.
pub fn render_created(topic: &str, group: &str, created: bool) -> Response {
    Response::json(
        if created { 201 } else { 200 },
        &json!({"topic": topic, "group": group, "created": created}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_is_earliest_by_default_or_latest() {
        let q = |s: &str| Query::new(s);
        assert_eq!(parse_start(&q("")), Ok(false));
        assert_eq!(parse_start(&q("start=earliest")), Ok(false));
        assert_eq!(parse_start(&q("start=latest")), Ok(true));
        assert!(parse_start(&q("start=now")).is_err());
    }
}
