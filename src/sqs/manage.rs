//! The SQS actions that manage a queue beyond its attributes: PurgeQueue (the native purge of the `default` group),
//! TagQueue / UntagQueue / ListQueueTags (the topic's `tags`), AddPermission / RemovePermission (statements of the
//! queue's `Policy` document, kept and shown, not enforced: berth has no IAM) and ListDeadLetterSourceQueues (the
//! topics whose `dead_letter` is this one).

use super::actions::{
    attribute_map, integer, queue_arn, queue_name, queue_topic, queue_url, required, string,
    strings,
};
use super::{Context, SqsError};
use crate::engine::topic::{MAX_POLICY_BYTES, MAX_TAGS};
use crate::ops::topics::{check_tag, Settings, TagChange};
use crate::partition::DEFAULT_GROUP;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

type Result<T> = std::result::Result<T, SqsError>;

/// Deletes every message of the queue, leased, delayed and held ones included, at once (SQS takes up to 60 s and
/// allows one purge a minute; berth purges at once, any time).
pub(super) async fn purge_queue(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let (name, _) = queue_topic(ctx, input)?;
    ctx.front.purge_group(&name, DEFAULT_GROUP).await?;
    Ok(json!({}))
}

/// The tags of a `Tags`/`tags` member, checked as SQS checks them.
pub(super) fn tags_of(input: &Value, member: &str) -> Result<Option<BTreeMap<String, String>>> {
    let Some(map) = attribute_map(input, member)? else {
        return Ok(None);
    };
    if map.len() > MAX_TAGS {
        return Err(SqsError::invalid(format!(
            "Too many tags: a queue has at most {MAX_TAGS}."
        )));
    }
    let mut tags = BTreeMap::new();
    for (k, v) in map {
        let v = v
            .as_str()
            .ok_or_else(|| SqsError::invalid(format!("The value of tag {k} must be a string.")))?;
        check_tag(k, v).map_err(|why| SqsError::invalid(format!("Invalid tag: {why}.")))?;
        tags.insert(k.clone(), v.to_string());
    }
    Ok(Some(tags))
}

/// A change of the queue's settings; a queue that is gone is `QueueDoesNotExist`.
async fn change(ctx: &Context<'_>, name: String, settings: Settings) -> Result<()> {
    ctx.front
        .change_topic(name, settings)
        .await
        .map_err(|e| match e {
            crate::ops::OpError::Engine(crate::engine::EngineError::InvalidSetting(why)) => {
                SqsError::invalid(why)
            }
            other => SqsError::of(&other),
        })?;
    Ok(())
}

pub(super) async fn tag_queue(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let tags = tags_of(input, "Tags")?.ok_or_else(|| SqsError::missing("Tags"))?;
    ctx.front
        .engine()
        .topic(&name)
        .map_err(|_| SqsError::no_queue())?;
    let settings = Settings {
        tags: Some(TagChange::Set(tags)),
        ..Settings::default()
    };
    change(ctx, name, settings).await?;
    Ok(json!({}))
}

pub(super) async fn untag_queue(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let keys = strings(input, "TagKeys")?;
    if keys.is_empty() {
        return Err(SqsError::missing("TagKeys"));
    }
    ctx.front
        .engine()
        .topic(&name)
        .map_err(|_| SqsError::no_queue())?;
    let settings = Settings {
        tags: Some(TagChange::Remove(keys)),
        ..Settings::default()
    };
    change(ctx, name, settings).await?;
    Ok(json!({}))
}

pub(super) fn list_queue_tags(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let (_, topic) = queue_topic(ctx, input)?;
    let tags = topic.config().tags.clone();
    if tags.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({ "Tags": tags }))
}

/// Most statements AddPermission keeps in a queue's policy.
const MAX_STATEMENTS: usize = 100;

/// The actions AddPermission grants (`*` or an action other queues' principals may be given).
fn grantable(action: &str) -> bool {
    matches!(
        action,
        "*" | "SendMessage"
            | "ReceiveMessage"
            | "DeleteMessage"
            | "ChangeMessageVisibility"
            | "GetQueueAttributes"
            | "GetQueueUrl"
            | "ListDeadLetterSourceQueues"
            | "PurgeQueue"
            | "ListQueueTags"
            | "StartMessageMoveTask"
            | "ListMessageMoveTasks"
            | "CancelMessageMoveTask"
    )
}

/// A permission label: 1–80 of `A-Za-z0-9_-`.
fn check_label(label: &str) -> Result<()> {
    if label.is_empty()
        || label.len() > 80
        || !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(SqsError::invalid(format!(
            "Value {label} for parameter Label is invalid. Reason: Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length."
        )));
    }
    Ok(())
}

/// The queue's policy document as a JSON object (a fresh one when it has none).
fn policy_of(ctx: &Context<'_>, name: &str, stored: &str) -> Map<String, Value> {
    match serde_json::from_str::<Value>(stored) {
        Ok(Value::Object(m)) => m,
        _ => {
            let mut m = Map::new();
            m.insert("Version".into(), json!("2012-10-17"));
            m.insert(
                "Id".into(),
                json!(format!("{}/SQSDefaultPolicy", queue_arn(ctx, name))),
            );
            m
        }
    }
}

/// The statements of a policy document (an empty list when it has none, or a single statement as an object).
fn statements(policy: &mut Map<String, Value>) -> &mut Vec<Value> {
    let entry = policy
        .entry("Statement")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !entry.is_array() {
        let single = entry.take();
        *entry = Value::Array(if single.is_null() {
            Vec::new()
        } else {
            vec![single]
        });
    }
    entry.as_array_mut().expect("made an array above")
}

fn sid_of(statement: &Value) -> Option<&str> {
    statement.get("Sid").and_then(Value::as_str)
}

async fn set_policy(
    ctx: &Context<'_>,
    name: String,
    policy: Option<Map<String, Value>>,
) -> Result<()> {
    let text = policy.map_or_else(String::new, |p| Value::Object(p).to_string());
    if text.len() > MAX_POLICY_BYTES {
        return Err(SqsError::new(
            403,
            "OverLimit",
            "OverLimit",
            format!("The queue's policy would exceed {MAX_POLICY_BYTES} bytes."),
        ));
    }
    let settings = Settings {
        sqs_policy: Some(text),
        ..Settings::default()
    };
    change(ctx, name, settings).await
}

/// Adds a statement to the queue's `Policy`: kept and returned by GetQueueAttributes, not enforced (berth has no
/// IAM: every client that may reach the face may run every action). Concurrent changes to one queue's policy are
/// last-writer-wins.
pub(super) async fn add_permission(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let label = required(input, "Label")?;
    check_label(label)?;
    let accounts = strings(input, "AWSAccountIds")?;
    if accounts.is_empty() {
        return Err(SqsError::missing("AWSAccountIds"));
    }
    for a in &accounts {
        if a.len() != 12 || !a.bytes().all(|b| b.is_ascii_digit()) {
            return Err(SqsError::invalid(format!(
                "Value {a} for parameter AWSAccountIds is invalid. Reason: An AWS account id is 12 digits."
            )));
        }
    }
    let actions = strings(input, "Actions")?;
    if actions.is_empty() {
        return Err(SqsError::missing("Actions"));
    }
    for a in &actions {
        if !grantable(a) {
            return Err(SqsError::invalid(format!(
                "Value SQS:{a} for parameter ActionName is invalid. Reason: Only the queue owner is allowed to invoke this action."
            )));
        }
    }
    let topic = ctx
        .front
        .engine()
        .topic(&name)
        .map_err(|_| SqsError::no_queue())?;
    let mut policy = policy_of(ctx, &name, &topic.config().sqs_policy);
    let list = statements(&mut policy);
    if list.iter().any(|s| sid_of(s) == Some(label)) {
        return Err(SqsError::invalid(format!(
            "Value {label} for parameter Label is invalid. Reason: Already exists."
        )));
    }
    if list.len() >= MAX_STATEMENTS {
        return Err(SqsError::new(
            403,
            "OverLimit",
            "OverLimit",
            format!("A queue's policy holds at most {MAX_STATEMENTS} statements."),
        ));
    }
    let one_or_list = |items: Vec<String>| -> Value {
        if items.len() == 1 {
            json!(items[0])
        } else {
            json!(items)
        }
    };
    list.push(json!({
        "Sid": label,
        "Effect": "Allow",
        "Principal": {"AWS": one_or_list(accounts.iter().map(|a| format!("arn:aws:iam::{a}:root")).collect())},
        "Action": one_or_list(actions.iter().map(|a| format!("SQS:{a}")).collect()),
        "Resource": queue_arn(ctx, &name),
    }));
    set_policy(ctx, name, Some(policy)).await?;
    Ok(json!({}))
}

/// Removes the statement AddPermission added under `Label`; a policy left without statements is removed.
pub(super) async fn remove_permission(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let label = required(input, "Label")?;
    let topic = ctx
        .front
        .engine()
        .topic(&name)
        .map_err(|_| SqsError::no_queue())?;
    let stored = topic.config().sqs_policy.clone();
    let mut policy = policy_of(ctx, &name, &stored);
    let list = statements(&mut policy);
    let before = list.len();
    list.retain(|s| sid_of(s) != Some(label));
    if stored.is_empty() || list.len() == before {
        return Err(SqsError::invalid(format!(
            "Value {label} for parameter Label is invalid. Reason: can't find label on existing policy."
        )));
    }
    let empty = list.is_empty();
    set_policy(ctx, name, (!empty).then_some(policy)).await?;
    Ok(json!({}))
}

/// The queues whose RedrivePolicy names this one as their dead-letter queue, by name, paged as ListQueues.
pub(super) fn list_dead_letter_source_queues(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let engine = ctx.front.engine();
    engine.topic(&name).map_err(|_| SqsError::no_queue())?;
    let max = integer(input, "MaxResults", 1, 1000)?;
    let after = string(input, "NextToken")?;
    let mut sources: Vec<String> = dead_letter_sources(ctx, &name)
        .into_iter()
        .filter(|n| after.is_none_or(|a| n.as_str() > a))
        .collect();
    let limit = max.unwrap_or(1000) as usize;
    let more = sources.len() > limit;
    sources.truncate(limit);
    let mut out = Map::new();
    out.insert(
        "queueUrls".into(),
        json!(sources
            .iter()
            .map(|n| queue_url(ctx, n))
            .collect::<Vec<_>>()),
    );
    if more && max.is_some() {
        out.insert("NextToken".into(), json!(sources.last()));
    }
    Ok(Value::Object(out))
}

/// The topics that dead-letter into `name`, sorted.
pub(super) fn dead_letter_sources(ctx: &Context<'_>, name: &str) -> Vec<String> {
    let engine = ctx.front.engine();
    let mut sources: Vec<String> = engine
        .topic_names()
        .into_iter()
        .filter(|n| {
            engine.topic(n).is_ok_and(|t| {
                let c = t.config();
                c.max_deliveries > 0 && c.dead_letter.as_deref() == Some(name)
            })
        })
        .collect();
    sources.sort();
    sources
}
