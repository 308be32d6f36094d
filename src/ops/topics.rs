//! Topic administration: `PUT /topics/T` (create), `PATCH /topics/T` (change settings), `DELETE /topics/T`,
//! `GET /topics/T` (describe) and `GET /topics`. Settings are parsed here; core 0 applies creations, changes and
//! deletions (`engine::admin`), every core describes its own partitions.
//!
//! Read in order: `parse_settings`, then `front/admin.rs` (to core 0, which runs the change on every core:
//! `engine/admin.rs`), and the `render_*` replies here. Route: `http/routes.rs`.

use super::error::{OpError, OpResult};
use super::params::Query;
use super::response::Response;
use crate::duration::format_ms;
use crate::engine::placement::MAX_REPLICAS;
use crate::engine::topic::{
    self, BackoffKind, TopicConfig, MAX_CAP, MAX_DELAY_MS, MAX_DELIVERIES_LIMIT, MAX_GROUPS_LIMIT,
    MAX_PARTITIONS, MAX_RETENTION_MS, MAX_VISIBILITY_MS, MIN_VISIBILITY_MS,
};
use crate::engine::{Engine, EngineError};
use crate::partition::PartitionInfo;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::rc::Rc;

/// Settings a request sets (None: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub partitions: Option<u32>,
    pub visibility_ms: Option<u64>,
    pub max_in_flight: Option<usize>,
    pub max_acked_ahead: Option<usize>,
    pub retention_ms: Option<u64>,
    pub redelivery_delay_ms: Option<u64>,
    pub redelivery_backoff: Option<BackoffKind>,
    pub redelivery_delay_max_ms: Option<u64>,
    pub max_deliveries: Option<u32>,
    /// Some(None): cleared (`dead_letter=` empty).
    pub dead_letter: Option<Option<String>>,
    pub max_groups: Option<usize>,
    /// Replicas per partition: creation only.
    pub replicas: Option<u32>,
    pub dedup_window_ms: Option<u64>,
    /// A FIFO topic: creation only.
    pub fifo: Option<bool>,
    /// A FIFO topic's produces without a `dedup_id` are deduplicated by the SHA-256 of their body.
    pub content_dedup: Option<bool>,
    /// The delay of produces that give none.
    pub delay_ms: Option<u64>,
    /// The `wait` of consumes that give none.
    pub receive_wait_ms: Option<u64>,
    /// The topic's message size limit (0: the server's).
    pub max_message_bytes: Option<u64>,
    /// Tags set (added or replaced) or removed (SQS's TagQueue / UntagQueue).
    pub tags: Option<TagChange>,
    /// SQS's Policy and RedriveAllowPolicy documents (empty: none).
    pub sqs_policy: Option<String>,
    pub sqs_redrive_allow_policy: Option<String>,
}

/// A change to a topic's tags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TagChange {
    /// Added, or replacing the value of a tag of the same key.
    Set(std::collections::BTreeMap<String, String>),
    /// Removed (keys the topic lacks are ignored).
    Remove(Vec<String>),
}

/// Checks a tag as SQS does: a key of 1–128 characters, a value of at most 256 (letters, digits, white space and
/// `_ . : / = + - @`), and no key starting with `aws:`.
pub fn check_tag(key: &str, value: &str) -> Result<(), String> {
    let allowed = |s: &str| {
        s.chars()
            .all(|c| c.is_alphanumeric() || c.is_whitespace() || "_.:/=+-@".contains(c))
    };
    let keys = key.chars().count();
    if keys == 0 || keys > 128 || !allowed(key) {
        return Err(format!(
            "tag key '{key}' must be 1 to 128 letters, digits, spaces or _.:/=+-@"
        ));
    }
    if key.to_ascii_lowercase().starts_with("aws:") {
        return Err(format!("tag key '{key}' may not start with aws:"));
    }
    if value.chars().count() > 256 || !allowed(value) {
        return Err(format!(
            "the value of tag '{key}' must be at most 256 letters, digits, spaces or _.:/=+-@"
        ));
    }
    Ok(())
}

/// Parses the settings in a `PUT` or `PATCH` query.
pub fn parse_settings(query: &Query) -> OpResult<Settings> {
    let backoff = match query.get("redelivery_backoff").as_deref() {
        None => None,
        Some("fixed") => Some(BackoffKind::Fixed),
        Some("exponential") => Some(BackoffKind::Exponential),
        Some(other) => {
            return Err(OpError::InvalidParameter(format!(
                "redelivery_backoff must be fixed or exponential, not '{other}'"
            )))
        }
    };
    let dead_letter = match query.get("dead_letter").as_deref() {
        None => None,
        Some("") => Some(None),
        Some(name) => {
            topic::validate_name(name)?;
            Some(Some(name.to_string()))
        }
    };
    Ok(Settings {
        partitions: query
            .number("partitions", 1, MAX_PARTITIONS as u64)?
            .map(|v| v as u32),
        replicas: query
            .number("replicas", 1, MAX_REPLICAS as u64)?
            .map(|v| v as u32),
        visibility_ms: query.duration("visibility", MIN_VISIBILITY_MS, MAX_VISIBILITY_MS)?,
        max_in_flight: query
            .number("max_in_flight", 1, MAX_CAP as u64)?
            .map(|v| v as usize),
        max_acked_ahead: query
            .number("max_acked_ahead", 1, MAX_CAP as u64)?
            .map(|v| v as usize),
        retention_ms: query.duration("retention", 1000, MAX_RETENTION_MS)?,
        redelivery_delay_ms: query.duration("redelivery_delay", 0, MAX_DELAY_MS)?,
        redelivery_backoff: backoff,
        redelivery_delay_max_ms: query.duration("redelivery_delay_max", 0, MAX_DELAY_MS)?,
        max_deliveries: query
            .number("max_deliveries", 0, MAX_DELIVERIES_LIMIT)?
            .map(|v| v as u32),
        dead_letter,
        max_groups: query
            .number("max_groups", 1, MAX_GROUPS_LIMIT as u64)?
            .map(|v| v as usize),
        dedup_window_ms: query.duration("dedup_window", 0, topic::MAX_DEDUP_WINDOW_MS)?,
        fifo: query.flag("fifo")?,
        content_dedup: query.flag("content_dedup")?,
        delay_ms: query.duration("delay", 0, topic::MAX_PRODUCE_DELAY_MS)?,
        receive_wait_ms: query.duration("receive_wait", 0, topic::MAX_RECEIVE_WAIT_MS)?,
        max_message_bytes: query.number("max_message_bytes", 0, u32::MAX as u64)?,
        tags: None,
        sqs_policy: None,
        sqs_redrive_allow_policy: None,
    })
}

impl Settings {
    /// Writes the given settings into `config` (everything but `partitions`).
    pub fn apply_to(&self, config: &mut TopicConfig) {
        if let Some(v) = self.visibility_ms {
            config.visibility_ms = v;
        }
        if let Some(v) = self.max_in_flight {
            config.max_in_flight = v;
        }
        if let Some(v) = self.max_acked_ahead {
            config.max_acked_ahead = v;
        }
        if let Some(v) = self.retention_ms {
            config.retention_ms = v;
        }
        if let Some(v) = self.redelivery_delay_ms {
            config.redelivery_delay_ms = v;
        }
        if let Some(v) = self.redelivery_backoff {
            config.redelivery_backoff = v;
        }
        if let Some(v) = self.redelivery_delay_max_ms {
            config.redelivery_delay_max_ms = v;
        }
        if let Some(v) = self.max_deliveries {
            config.max_deliveries = v;
        }
        if let Some(v) = &self.dead_letter {
            config.dead_letter = v.clone();
        }
        if let Some(v) = self.max_groups {
            config.max_groups = v;
        }
        if let Some(v) = self.dedup_window_ms {
            config.dedup_window_ms = v;
        }
        if let Some(v) = self.content_dedup {
            config.content_dedup = v;
        }
        if let Some(v) = self.delay_ms {
            config.delay_ms = v;
        }
        if let Some(v) = self.receive_wait_ms {
            config.receive_wait_ms = v;
        }
        if let Some(v) = self.max_message_bytes {
            config.max_message_bytes = v;
        }
        match &self.tags {
            Some(TagChange::Set(tags)) => config
                .tags
                .extend(tags.iter().map(|(k, v)| (k.clone(), v.clone()))),
            Some(TagChange::Remove(keys)) => {
                for k in keys {
                    config.tags.remove(k);
                }
            }
            None => {}
        }
        if let Some(v) = &self.sqs_policy {
            config.sqs_policy = v.clone();
        }
        if let Some(v) = &self.sqs_redrive_allow_policy {
            config.sqs_redrive_allow_policy = v.clone();
        }
    }

    /// Checks the settings' values that depend on the server (the topic's message size limit within the server's)
    /// and the topic's tags once applied.
    pub fn check(&self, config: &TopicConfig, max_message_bytes: usize) -> Result<(), String> {
        if let Some(v) = self.max_message_bytes {
            if v > max_message_bytes as u64 {
                return Err(format!(
                    "max_message_bytes {v} is above the server's max_message_bytes ({max_message_bytes})"
                ));
            }
        }
        if config.tags.len() > topic::MAX_TAGS {
            return Err(format!("a topic has at most {} tags", topic::MAX_TAGS));
        }
        Ok(())
    }

    /// The settings of a new topic named `name`: docs/api.md's defaults, then these.
    pub fn new_topic(&self, name: &str) -> TopicConfig {
        let mut config = TopicConfig::with_defaults(name);
        if let Some(p) = self.partitions {
            config.partitions = p;
        }
        if let Some(r) = self.replicas {
            config.replicas = r;
        }
        if let Some(f) = self.fifo {
            config.fifo = f;
        }
        self.apply_to(&mut config);
        config
    }
}

/// Creates a topic (core 0): (created, its settings).
pub async fn create(engine: &Rc<Engine>, config: TopicConfig) -> OpResult<(bool, TopicConfig)> {
    let given = Settings {
        max_message_bytes: Some(config.max_message_bytes),
        ..Settings::default()
    };
    given
        .check(&config, engine.config().max_message_bytes)
        .map_err(OpError::InvalidParameter)?;
    Ok(engine.create_topic(config).await?)
}

/// Changes a topic's settings (core 0): the new settings. `partitions` cannot change.
pub async fn change(engine: &Rc<Engine>, name: &str, settings: Settings) -> OpResult<TopicConfig> {
    if settings.partitions.is_some() {
        return Err(OpError::InvalidParameter(
            "partitions cannot be changed; create a new topic".into(),
        ));
    }
    if settings.replicas.is_some() {
        return Err(OpError::InvalidParameter(
            "replicas cannot be changed; create a new topic".into(),
        ));
    }
    if settings.fifo.is_some() {
        return Err(OpError::InvalidParameter(
            "fifo cannot be changed; create a new topic".into(),
        ));
    }
    let server_max = engine.config().max_message_bytes;
    let now = engine.clock().wall_ms();
    Ok(engine
        .change_topic(name, move |config| {
            settings.apply_to(config);
            config.modified_ms = now;
            settings
                .check(config, server_max)
                .map_err(EngineError::InvalidSetting)?;
            if config.groups.len() + 1 > config.max_groups {
                return Err(EngineError::InvalidSetting(format!(
                    "max_groups {} is below the {} groups the topic holds",
                    config.max_groups,
                    config.groups.len() + 1
                )));
            }
            Ok(())
        })
        .await?)
}

/// Deletes a topic (core 0).
pub async fn delete(engine: &Rc<Engine>, name: &str) -> OpResult<()> {
    Ok(engine.delete_topic(name).await?)
}

/// This core's partitions of a topic.
pub async fn describe(engine: &Rc<Engine>, name: &str) -> OpResult<Vec<PartitionInfo>> {
    let topic = engine.topic(name)?;
    let mut out = Vec::new();
    for p in topic.owned_partitions() {
        out.push(p.info().await);
    }
    Ok(out)
}

// ---- The replies ----

pub fn config_json(c: &TopicConfig) -> serde_json::Value {
    json!({
        "partitions": c.partitions,
        "replicas": c.replicas,
        "visibility": format_ms(c.visibility_ms),
        "visibility_ms": c.visibility_ms,
        "max_in_flight": c.max_in_flight,
        "max_acked_ahead": c.max_acked_ahead,
        "retention": format_ms(c.retention_ms),
        "retention_ms": c.retention_ms,
        "redelivery_delay": format_ms(c.redelivery_delay_ms),
        "redelivery_delay_ms": c.redelivery_delay_ms,
        "redelivery_backoff": c.redelivery_backoff,
        "redelivery_delay_max": format_ms(c.redelivery_delay_max_ms),
        "redelivery_delay_max_ms": c.redelivery_delay_max_ms,
        "max_deliveries": c.max_deliveries,
        "dead_letter": c.dead_letter,
        "max_groups": c.max_groups,
        "dedup_window": format_ms(c.dedup_window_ms),
        "dedup_window_ms": c.dedup_window_ms,
        "fifo": c.fifo,
        "content_dedup": c.content_dedup,
        "delay": format_ms(c.delay_ms),
        "delay_ms": c.delay_ms,
        "receive_wait": format_ms(c.receive_wait_ms),
        "receive_wait_ms": c.receive_wait_ms,
        "max_message_bytes": c.max_message_bytes,
        "created_ms": c.created_ms,
        "modified_ms": c.modified_ms,
        "tags": c.tags,
    })
}

/// The answer to `PUT /topics/T`: `201` with the new topic, or `200` with the existing one's settings.
pub fn render_created(created: bool, config: &TopicConfig) -> Response {
    let body = json!({"name": config.name, "created": created, "config": config_json(config)});
    Response::json(if created { 201 } else { 200 }, &body)
}

/// The answer to `PATCH /topics/T`: the settings now.
pub fn render_changed(config: &TopicConfig) -> Response {
    Response::json(
        200,
        &json!({"name": config.name, "config": config_json(config)}),
    )
}

/// Who holds a partition, as `GET /topics/T` names it: its replicas' and leader's node ids and its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holders {
    pub replicas: Vec<String>,
    pub leader: String,
    pub epoch: u64,
    /// Replicas added by a move that do not vote yet (shown only when there are some).
    pub learners: Vec<String>,
}

/// The answer to `GET /topics/T`: settings, groups, and each partition with its groups' state and who holds it
/// (`holders_of`); in cluster mode each partition also names its node (`node_of`: the node serving it now).
pub fn render_described(
    config: &TopicConfig,
    partitions: &[PartitionInfo],
    node_of: impl Fn(u32) -> Option<String>,
    holders_of: impl Fn(u32) -> Option<Holders>,
    id_of: impl Fn(u32) -> String,
) -> Response {
    let parts: Vec<serde_json::Value> = partitions
        .iter()
        .map(|p| {
            let mut v = serde_json::to_value(p).expect("partition info serialises");
            if let Some(node) = node_of(p.partition) {
                v["node"] = json!(node);
            }
            if let Some(h) = holders_of(p.partition) {
                v["replicas"] = json!(h.replicas);
                v["leader"] = json!(h.leader);
                v["epoch"] = json!(h.epoch);
                if !h.learners.is_empty() {
                    v["learners"] = json!(h.learners);
                }
            }
            if !p.followers.is_empty() {
                // A replicated partition's leader: how far each follower has it.
                v["followers"] = json!(p
                    .followers
                    .iter()
                    .map(|f| json!({"node": id_of(f.node), "end_offset": f.end, "lagging": f.lagging, "learner": f.learner, "poisoned": f.poisoned}))
                    .collect::<Vec<_>>());
            }
            v["groups"] = json!(p
                .groups
                .iter()
                .map(|g| {
                    let mut v = super::groups::group_state_json(g);
                    v["group"] = json!(g.group);
                    v
                })
                .collect::<Vec<_>>());
            v
        })
        .collect();
    // Partitions whose node could not be reached: listed as unavailable, with where they live.
    let mut parts = parts;
    let described: std::collections::BTreeSet<u32> =
        partitions.iter().map(|p| p.partition).collect();
    for p in (0..config.partitions).filter(|p| !described.contains(p)) {
        let mut v = json!({"partition": p, "available": false});
        if let Some(node) = node_of(p) {
            v["node"] = json!(node);
        }
        if let Some(h) = holders_of(p) {
            v["replicas"] = json!(h.replicas);
            v["leader"] = json!(h.leader);
            v["epoch"] = json!(h.epoch);
            if !h.learners.is_empty() {
                v["learners"] = json!(h.learners);
            }
        }
        parts.push(v);
    }
    parts.sort_by_key(|v| v["partition"].as_u64());
    let body = json!({
        "name": config.name,
        "config": config_json(config),
        "partitions": parts,
        "groups": config.all_groups(),
    });
    Response::json(200, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(q: &str) -> Query {
        Query::new(q)
    }

    #[test]
    fn every_setting_parses_and_bad_values_are_400() {
        let s = parse_settings(&query(
            "partitions=4&visibility=10s&redelivery_delay=1s&redelivery_backoff=exponential&redelivery_delay_max=1m&max_deliveries=5&dead_letter=t.dlq&max_groups=3",
        ))
        .unwrap();
        let c = s.new_topic("t");
        assert_eq!(
            (c.partitions, c.visibility_ms, c.max_groups),
            (4, 10_000, 3)
        );
        assert_eq!(c.redelivery_backoff, BackoffKind::Exponential);
        assert_eq!(
            (c.redelivery_delay_ms, c.redelivery_delay_max_ms),
            (1000, 60_000)
        );
        assert_eq!(
            (c.max_deliveries, c.dead_letter.as_deref()),
            (5, Some("t.dlq"))
        );
        for bad in [
            "redelivery_backoff=linear",
            "redelivery_delay=13h",
            "dead_letter=a/b",
            "max_groups=0",
            "max_deliveries=-1",
        ] {
            assert!(parse_settings(&query(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            parse_settings(&query("dead_letter=")).unwrap().dead_letter,
            Some(None)
        );
    }
}
