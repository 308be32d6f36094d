//! The SQS actions, on the JSON protocol's shapes (input and output `serde_json::Value`s with AWS's member names).
//! Each maps onto berth's own operations through the front, as the native HTTP API does: a queue is a topic, its
//! consumer state the `default` group, a receipt handle berth's own. `docs/sqs.md` says where berth differs.

use super::md5::{md5_hex, md5_of_message_attributes, AttrValue};
use super::{Context, SqsError};
use crate::engine::topic::{TopicConfig, MAX_VISIBILITY_MS, MIN_VISIBILITY_MS};
use crate::ops::consume::ConsumeParams;
use crate::ops::produce::{ClientRecord, ProduceParams, Target};
use crate::ops::receipt::ReceiptHandle;
use crate::ops::settle::SettleParams;
use crate::ops::topics::Settings;
use crate::partition::{Delivery, SettleOp, DEFAULT_GROUP};
use crate::storage::meta::{Attribute, RecordMeta};
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Map, Value};

type Result<T> = std::result::Result<T, SqsError>;

/// Every action of the SQS API model.
pub(super) const ACTIONS: [&str; 23] = [
    "AddPermission",
    "CancelMessageMoveTask",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "CreateQueue",
    "DeleteMessage",
    "DeleteMessageBatch",
    "DeleteQueue",
    "GetQueueAttributes",
    "GetQueueUrl",
    "ListDeadLetterSourceQueues",
    "ListMessageMoveTasks",
    "ListQueueTags",
    "ListQueues",
    "PurgeQueue",
    "ReceiveMessage",
    "RemovePermission",
    "SendMessage",
    "SendMessageBatch",
    "SetQueueAttributes",
    "StartMessageMoveTask",
    "TagQueue",
    "UntagQueue",
];

/// Whether `action` is an action of the SQS API.
pub fn known(action: &str) -> bool {
    ACTIONS.contains(&action)
}

/// Most entries of a batch action (AWS's limit).
const MAX_BATCH_ENTRIES: usize = 10;

/// Runs one action.
pub async fn run(ctx: &Context<'_>, action: &str, input: Value) -> Result<Value> {
    match action {
        "CreateQueue" => create_queue(ctx, &input).await,
        "GetQueueUrl" => get_queue_url(ctx, &input),
        "ListQueues" => list_queues(ctx, &input),
        "DeleteQueue" => delete_queue(ctx, &input).await,
        "GetQueueAttributes" => get_queue_attributes(ctx, &input).await,
        "SetQueueAttributes" => set_queue_attributes(ctx, &input).await,
        "SendMessage" => send_message(ctx, &input).await,
        "SendMessageBatch" => send_message_batch(ctx, &input).await,
        "ReceiveMessage" => receive_message(ctx, &input).await,
        "DeleteMessage" => delete_message(ctx, &input).await,
        "DeleteMessageBatch" => delete_message_batch(ctx, &input).await,
        "ChangeMessageVisibility" => change_visibility(ctx, &input).await,
        "ChangeMessageVisibilityBatch" => change_visibility_batch(ctx, &input).await,
        "PurgeQueue" => super::manage::purge_queue(ctx, &input).await,
        "TagQueue" => super::manage::tag_queue(ctx, &input).await,
        "UntagQueue" => super::manage::untag_queue(ctx, &input).await,
        "ListQueueTags" => super::manage::list_queue_tags(ctx, &input),
        "AddPermission" => super::manage::add_permission(ctx, &input).await,
        "RemovePermission" => super::manage::remove_permission(ctx, &input).await,
        "ListDeadLetterSourceQueues" => super::manage::list_dead_letter_source_queues(ctx, &input),
        "StartMessageMoveTask" => super::tasks::start(ctx, &input).await,
        "ListMessageMoveTasks" => super::tasks::list(ctx, &input),
        "CancelMessageMoveTask" => super::tasks::cancel(ctx, &input),
        other => Err(SqsError::unsupported(other)),
    }
}

// ---- Input helpers ----

pub(super) fn string<'v>(input: &'v Value, name: &str) -> Result<Option<&'v str>> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(SqsError::invalid(format!("{name} must be a string"))),
    }
}

pub(super) fn required<'v>(input: &'v Value, name: &str) -> Result<&'v str> {
    string(input, name)?.ok_or_else(|| SqsError::missing(name))
}

/// An integer member within `min..=max` (AWS's texts for the receive parameters).
pub(super) fn integer(input: &Value, name: &str, min: i64, max: i64) -> Result<Option<i64>> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(SqsError::invalid(format!(
                "Value {v} for parameter {name} is invalid. Reason: Must be between {min} and {max}, if provided."
            ))),
        },
    }
}

pub(super) fn list<'v>(input: &'v Value, name: &str) -> Result<&'v [Value]> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(SqsError::invalid(format!("{name} must be a list"))),
    }
}

/// Most names a list of attribute names may hold (every system attribute, or many message attribute names).
const MAX_NAMES: usize = 100;

pub(super) fn strings(input: &Value, name: &str) -> Result<Vec<String>> {
    let items = list(input, name)?;
    if items.len() > MAX_NAMES {
        return Err(SqsError::invalid(format!(
            "{name} holds more than {MAX_NAMES} names"
        )));
    }
    items
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| SqsError::invalid(format!("{name} must be a list of strings")))
        })
        .collect()
}

pub(super) fn attribute_map<'v>(
    input: &'v Value,
    name: &str,
) -> Result<Option<&'v Map<String, Value>>> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(SqsError::invalid(format!("{name} must be a map"))),
    }
}

// ---- Queues ----

/// An SQS queue name: 1–80 of `A-Za-z0-9_-`, a FIFO queue's ending in `.fifo` (counted in the 80).
fn check_queue_name(name: &str, fifo: bool) -> Result<()> {
    let stem = if fifo {
        name.strip_suffix(".fifo").ok_or_else(|| {
            SqsError::invalid(
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length",
            )
        })?
    } else {
        name
    };
    if name.len() > 80
        || stem.is_empty()
        || !stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(SqsError::invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ));
    }
    Ok(())
}

/// The queue name of a queue URL: its path's last segment.
fn name_of_url(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or("");
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string()
}

/// The queue a request names, if any: its `QueueUrl`, its `QueueName`, else the request path's queue.
pub(super) fn queue_named(input: &Value, path_queue: Option<&str>) -> Option<String> {
    input
        .get("QueueUrl")
        .and_then(Value::as_str)
        .map(name_of_url)
        .or_else(|| {
            input
                .get("QueueName")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .or_else(|| path_queue.map(str::to_string))
        .filter(|n| crate::engine::topic::validate_name(n).is_ok())
}

/// The queue a request names: its `QueueUrl`'s last path segment, else the request path's queue.
pub(super) fn queue_name(ctx: &Context<'_>, input: &Value) -> Result<String> {
    let name = match string(input, "QueueUrl")? {
        Some(url) => name_of_url(url),
        None => ctx
            .path_queue
            .clone()
            .ok_or_else(|| SqsError::missing("QueueUrl"))?,
    };
    if crate::engine::topic::validate_name(&name).is_err() {
        return Err(SqsError::no_queue());
    }
    Ok(name)
}

/// The queue a request names and its topic (`QueueDoesNotExist` when there is none).
pub(super) fn queue_topic(
    ctx: &Context<'_>,
    input: &Value,
) -> Result<(String, std::rc::Rc<crate::engine::topic::Topic>)> {
    let name = queue_name(ctx, input)?;
    let topic = ctx
        .front
        .engine()
        .topic(&name)
        .map_err(|_| SqsError::no_queue())?;
    Ok((name, topic))
}

pub(super) fn queue_url(ctx: &Context<'_>, name: &str) -> String {
    format!("{}://{}/{}/{}", ctx.scheme, ctx.host, ctx.account, name)
}

pub(super) fn queue_arn(ctx: &Context<'_>, name: &str) -> String {
    format!("arn:aws:sqs:{}:{}:{}", ctx.region, ctx.account, name)
}

/// The settings of a topic the SQS attributes `attrs` ask for (validated as AWS does), and whether it is FIFO.
fn settings_of(
    ctx: &Context<'_>,
    attrs: &Map<String, Value>,
    creating: Option<&str>,
    current: Option<&TopicConfig>,
) -> Result<Settings> {
    let mut settings = Settings::default();
    let fifo_name = creating.is_some_and(|n| n.ends_with(".fifo"));
    let is_fifo = current.map_or(fifo_name, |c| c.fifo);
    let config = ctx.front.engine().config();
    for (name, value) in attrs {
        let Some(text) = value.as_str() else {
            return Err(SqsError::invalid(format!(
                "Invalid value for the parameter {name}."
            )));
        };
        let bad = || {
            SqsError::new(
                400,
                "InvalidAttributeValue",
                "InvalidAttributeValue",
                format!("Invalid value for the parameter {name}."),
            )
        };
        let seconds = |min: u64, max: u64| -> Result<u64> {
            text.parse::<u64>()
                .ok()
                .filter(|v| (min..=max).contains(v) && text.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(bad)
        };
        let unknown = || {
            SqsError::new(
                400,
                "InvalidAttributeName",
                "InvalidAttributeName",
                format!("Unknown Attribute {name}."),
            )
        };
        match name.as_str() {
            "VisibilityTimeout" => {
                // berth's shortest lease is 1 s: 0 is taken as 1 s (docs/sqs.md).
                let s = seconds(0, 43_200)?;
                settings.visibility_ms =
                    Some((s * 1000).clamp(MIN_VISIBILITY_MS, MAX_VISIBILITY_MS));
            }
            "MessageRetentionPeriod" => {
                settings.retention_ms = Some(seconds(60, 1_209_600)? * 1000);
            }
            "DelaySeconds" => settings.delay_ms = Some(seconds(0, 900)? * 1000),
            "ReceiveMessageWaitTimeSeconds" => {
                settings.receive_wait_ms = Some(seconds(0, 20)? * 1000)
            }
            "MaximumMessageSize" => {
                // The topic's limit, within the server's `max_message_bytes` (docs/sqs.md).
                let bytes = seconds(1024, 1_048_576)?;
                if bytes as usize > config.max_message_bytes {
                    return Err(SqsError::new(
                        400,
                        "InvalidAttributeValue",
                        "InvalidAttributeValue",
                        format!("Invalid value for the parameter MaximumMessageSize. Reason: above the server's max_message_bytes ({}) (docs/sqs.md).", config.max_message_bytes),
                    ));
                }
                settings.max_message_bytes = Some(bytes);
            }
            "RedrivePolicy" => {
                if text.is_empty() {
                    settings.max_deliveries = Some(0);
                    settings.dead_letter = Some(None);
                    continue;
                }
                let policy: Value = serde_json::from_str(text).map_err(|_| bad())?;
                let target = policy
                    .get("deadLetterTargetArn")
                    .and_then(Value::as_str)
                    .ok_or_else(bad)?;
                let count = match policy.get("maxReceiveCount") {
                    Some(Value::Number(n)) => n.as_u64(),
                    Some(Value::String(s)) => s.parse().ok(),
                    _ => None,
                }
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| SqsError::invalid(format!("Value {text} for parameter RedrivePolicy is invalid. Reason: Invalid value for maxReceiveCount, valid values are from 1 to 1000 both inclusive.")))?;
                // `arn:aws:sqs:{region}:{account}:{queue}` of this server's account, a queue that exists and is of
                // the same kind (FIFO or standard) as the queue it serves.
                let parts: Vec<&str> = target.split(':').collect();
                let dlq = match parts.as_slice() {
                    ["arn", _, "sqs", _, account, name] if *account == ctx.account => *name,
                    _ => {
                        return Err(SqsError::invalid(format!("Value {text} for parameter RedrivePolicy is invalid. Reason: deadLetterTargetArn must be the ARN of a queue of account {}.", ctx.account)))
                    }
                };
                let source_arn = creating
                    .or(current.map(|c| c.name.as_str()))
                    .map(|n| queue_arn(ctx, n));
                match ctx.front.engine().topic(dlq) {
                    Ok(t) if t.config().fifo == is_fifo => {
                        let allow = &t.config().sqs_redrive_allow_policy;
                        if !allow.is_empty() && redrive_allowed(allow, source_arn.as_deref()) != Ok(true) {
                            return Err(SqsError::invalid(format!("Value {text} for parameter RedrivePolicy is invalid. Reason: Queue {dlq} does not allow this queue as a source queue (its RedriveAllowPolicy).")));
                        }
                    }
                    Ok(_) => {
                        return Err(SqsError::invalid(format!("Value {text} for parameter RedrivePolicy is invalid. Reason: Dead-letter queue must be same type of queue as the source.")))
                    }
                    Err(_) => {
                        return Err(SqsError::invalid(format!("Value {text} for parameter RedrivePolicy is invalid. Reason: Dead letter target does not exist.")))
                    }
                }
                settings.max_deliveries = Some(count as u32);
                settings.dead_letter = Some(Some(dlq.to_string()));
            }
            "FifoQueue" => {
                let yes = text.eq_ignore_ascii_case("true");
                if !is_fifo && creating.is_none() {
                    return Err(unknown());
                }
                if creating.is_some() {
                    if !fifo_name {
                        return Err(if yes {
                            SqsError::invalid("The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length")
                        } else {
                            unknown()
                        });
                    }
                    if !yes {
                        return Err(bad());
                    }
                    settings.fifo = Some(true);
                } else if !yes {
                    return Err(SqsError::new(400, "InvalidAttributeValue", "InvalidAttributeValue", "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not supported.".into()));
                }
            }
            "ContentBasedDeduplication" => {
                if !is_fifo {
                    return Err(unknown());
                }
                settings.content_dedup = Some(match text.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad()),
                });
            }
            "DeduplicationScope" | "FifoThroughputLimit" => {
                if !is_fifo {
                    return Err(SqsError::new(
                        400,
                        "InvalidAttributeName",
                        "InvalidAttributeName",
                        format!("You can specify the {name} only when FifoQueue is set to true."),
                    ));
                }
                // berth's scope is the partition and an SQS FIFO queue has one: exactly `queue` / `perQueue`.
                let want = if name == "DeduplicationScope" {
                    "queue"
                } else {
                    "perQueue"
                };
                if text != want {
                    return Err(SqsError::new(400, "InvalidAttributeValue", "InvalidAttributeValue", format!("Invalid value for the parameter {name}. Reason: berth supports {want} only (docs/sqs.md).")));
                }
            }
            "Policy" => {
                // Kept and returned, not enforced: berth has no IAM (docs/sqs.md).
                if !text.is_empty()
                    && (text.len() > crate::engine::topic::MAX_POLICY_BYTES
                        || !matches!(serde_json::from_str::<Value>(text), Ok(Value::Object(_))))
                {
                    return Err(bad());
                }
                settings.sqs_policy = Some(text.to_string());
            }
            "RedriveAllowPolicy" => {
                // Kept (normalised: its two members only, so its size is bounded), returned, and checked when a
                // queue names this one as its dead-letter queue.
                let normal = if text.is_empty() {
                    String::new()
                } else {
                    normal_redrive_allow_policy(text).map_err(|_| bad())?
                };
                settings.sqs_redrive_allow_policy = Some(normal);
            }
            "KmsMasterKeyId" | "KmsDataKeyReusePeriodSeconds" | "SqsManagedSseEnabled" => {
                // Accepted and not kept: berth has no encryption at rest (docs/sqs.md).
            }
            _ => return Err(unknown()),
        }
    }
    if creating.is_some() && fifo_name && settings.fifo != Some(true) {
        return Err(SqsError::invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ));
    }
    Ok(settings)
}

/// A RedriveAllowPolicy document as berth keeps it: `redrivePermission`, and `sourceQueueArns` with `byQueue`
/// (each ARN at most 256 bytes); anything else in it is refused.
fn normal_redrive_allow_policy(text: &str) -> std::result::Result<String, ()> {
    redrive_allowed(text, None)?;
    let v: Value = serde_json::from_str(text).map_err(|_| ())?;
    let map = v.as_object().ok_or(())?;
    if map
        .keys()
        .any(|k| k != "redrivePermission" && k != "sourceQueueArns")
    {
        return Err(());
    }
    let mut out = Map::new();
    out.insert("redrivePermission".into(), map["redrivePermission"].clone());
    if let Some(arns) = map.get("sourceQueueArns") {
        if arns
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x.as_str().is_none_or(|s| s.len() > 256)))
        {
            return Err(());
        }
        out.insert("sourceQueueArns".into(), arns.clone());
    }
    Ok(Value::Object(out).to_string())
}

/// Checks a RedriveAllowPolicy document (`{"redrivePermission": "allowAll"|"denyAll"|"byQueue",
/// "sourceQueueArns": [..]}`, 1–10 ARNs with `byQueue` only) and whether it lets the queue of `source` use this
/// queue as its dead-letter queue (`Ok(true)` for no source).
fn redrive_allowed(policy: &str, source: Option<&str>) -> std::result::Result<bool, ()> {
    let v: Value = serde_json::from_str(policy).map_err(|_| ())?;
    let arns: Vec<&str> = match v.get("sourceQueueArns") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().ok_or(()))
            .collect::<std::result::Result<_, _>>()?,
        Some(_) => return Err(()),
    };
    let allowed = match v.get("redrivePermission").and_then(Value::as_str) {
        Some("allowAll") if arns.is_empty() => true,
        Some("denyAll") if arns.is_empty() => false,
        Some("byQueue") if (1..=10).contains(&arns.len()) => {
            source.is_none_or(|s| arns.contains(&s))
        }
        _ => return Err(()),
    };
    Ok(allowed || source.is_none())
}

async fn create_queue(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = required(input, "QueueName")?;
    let empty = Map::new();
    let attrs = attribute_map(input, "Attributes")?.unwrap_or(&empty);
    let fifo = name.ends_with(".fifo");
    check_queue_name(name, fifo)?;
    let mut settings = settings_of(ctx, attrs, Some(name), None)?;
    let tags = super::manage::tags_of(input, "tags")?;
    // A standard queue spreads over the node's cores; a FIFO queue is one partition, so its deduplication scope is
    // the queue, as SQS's default.
    settings.partitions = Some(if fifo {
        1
    } else {
        ctx.front.engine().cores().max(1) as u32
    });
    // It exists: the given attributes must match what it has (AWS: QueueAlreadyExists). Checked before, and again
    // when the creation finds it existing (created meanwhile, or through a node whose metastore replica lagged).
    let matches = |current: &TopicConfig| -> Result<()> {
        let mut want = current.clone();
        settings.apply_to(&mut want);
        // The message size limit compares as the queue sees it (unset is the server's).
        let server_max = ctx.front.engine().config().max_message_bytes;
        let mut have = current.clone();
        for c in [&mut want, &mut have] {
            c.max_message_bytes = c.message_limit(server_max) as u64;
        }
        if settings.fifo.is_some_and(|f| f != current.fifo) || want != have {
            return Err(SqsError::new(
                400,
                "QueueNameExists",
                "QueueAlreadyExists",
                "A queue already exists with the same name and a different value for an attribute"
                    .into(),
            ));
        }
        Ok(())
    };
    if let Ok(topic) = ctx.front.engine().topic(name) {
        matches(&topic.config())?;
        return Ok(json!({"QueueUrl": queue_url(ctx, name)}));
    }
    let mut config = settings.new_topic(name);
    // Tags are set at creation only (an existing queue keeps its own, as on SQS).
    config.tags = tags.unwrap_or_default();
    let (created, existing) = ctx.front.create_topic(config).await?;
    if !created {
        matches(&existing)?;
    }
    Ok(json!({"QueueUrl": queue_url(ctx, name)}))
}

fn get_queue_url(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = required(input, "QueueName")?;
    if let Some(owner) = string(input, "QueueOwnerAWSAccountId")? {
        if owner != ctx.account {
            return Err(SqsError::no_queue());
        }
    }
    ctx.front
        .engine()
        .topic(name)
        .map_err(|_| SqsError::no_queue())?;
    Ok(json!({"QueueUrl": queue_url(ctx, name)}))
}

fn list_queues(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let prefix = string(input, "QueueNamePrefix")?.unwrap_or("");
    let max = integer(input, "MaxResults", 1, 1000)?;
    let after = string(input, "NextToken")?;
    let mut names: Vec<String> = ctx
        .front
        .engine()
        .topic_names()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .filter(|n| after.is_none_or(|a| n.as_str() > a))
        .collect();
    names.sort();
    let limit = max.unwrap_or(1000) as usize;
    let more = names.len() > limit;
    names.truncate(limit);
    let mut out = Map::new();
    if !names.is_empty() {
        out.insert(
            "QueueUrls".into(),
            json!(names.iter().map(|n| queue_url(ctx, n)).collect::<Vec<_>>()),
        );
    }
    if more && max.is_some() {
        out.insert("NextToken".into(), json!(names.last()));
    }
    Ok(Value::Object(out))
}

async fn delete_queue(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    ctx.front.delete_topic(name).await?;
    Ok(json!({}))
}

/// Every attribute `All` returns.
const QUEUE_ATTRIBUTES: [&str; 19] = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesDelayed",
    "ApproximateNumberOfMessagesNotVisible",
    "CreatedTimestamp",
    "DelaySeconds",
    "LastModifiedTimestamp",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "QueueArn",
    "ReceiveMessageWaitTimeSeconds",
    "SqsManagedSseEnabled",
    "VisibilityTimeout",
    "RedrivePolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
    "Policy",
    "RedriveAllowPolicy",
];

async fn get_queue_attributes(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let asked = strings(input, "AttributeNames")?;
    let (config, partitions) = ctx.front.describe_topic(&name).await?;
    if asked.is_empty() {
        return Ok(json!({}));
    }
    let all = asked.iter().any(|a| a == "All");
    for a in &asked {
        if a != "All"
            && !QUEUE_ATTRIBUTES.contains(&a.as_str())
            && !matches!(
                a.as_str(),
                "KmsMasterKeyId" | "KmsDataKeyReusePeriodSeconds"
            )
        {
            return Err(SqsError::new(
                400,
                "InvalidAttributeName",
                "InvalidAttributeName",
                format!("Unknown Attribute {a}."),
            ));
        }
    }
    // Live counts over the default group: visible (neither leased nor delayed), leased, delayed.
    let (mut ready, mut leased, mut delayed) = (0u64, 0u64, 0u64);
    for p in &partitions {
        if let Some(g) = p.groups.iter().find(|g| g.group == DEFAULT_GROUP) {
            let unsettled = p.end_offset.saturating_sub(g.committed);
            let busy = (g.in_flight + g.delayed + g.acked_ahead) as u64;
            ready += unsettled.saturating_sub(busy);
            leased += g.in_flight as u64;
            delayed += g.delayed as u64;
        }
    }
    let mut out = Map::new();
    let mut put = |k: &str, v: String| {
        if all || asked.iter().any(|a| a == k) {
            out.insert(k.to_string(), Value::String(v));
        }
    };
    put("ApproximateNumberOfMessages", ready.to_string());
    put("ApproximateNumberOfMessagesNotVisible", leased.to_string());
    put("ApproximateNumberOfMessagesDelayed", delayed.to_string());
    put("DelaySeconds", (config.delay_ms / 1000).to_string());
    put(
        "MaximumMessageSize",
        config
            .message_limit(ctx.front.engine().config().max_message_bytes)
            .to_string(),
    );
    if config.created_ms > 0 {
        put("CreatedTimestamp", (config.created_ms / 1000).to_string());
        put(
            "LastModifiedTimestamp",
            (config.modified_ms / 1000).to_string(),
        );
    }
    if !config.sqs_policy.is_empty() {
        put("Policy", config.sqs_policy.clone());
    }
    if !config.sqs_redrive_allow_policy.is_empty() {
        put(
            "RedriveAllowPolicy",
            config.sqs_redrive_allow_policy.clone(),
        );
    }
    put(
        "MessageRetentionPeriod",
        (config.retention_ms / 1000).to_string(),
    );
    put("QueueArn", queue_arn(ctx, &name));
    put(
        "ReceiveMessageWaitTimeSeconds",
        (config.receive_wait_ms / 1000).to_string(),
    );
    put("SqsManagedSseEnabled", "false".into());
    put(
        "VisibilityTimeout",
        (config.visibility_ms / 1000).to_string(),
    );
    if let (Some(dlq), n) = (&config.dead_letter, config.max_deliveries) {
        if n > 0 {
            put(
                "RedrivePolicy",
                json!({"deadLetterTargetArn": queue_arn(ctx, dlq), "maxReceiveCount": n})
                    .to_string(),
            );
        }
    }
    if config.fifo {
        put("FifoQueue", "true".into());
        put(
            "ContentBasedDeduplication",
            config.content_dedup.to_string(),
        );
        put("DeduplicationScope", "queue".into());
        put("FifoThroughputLimit", "perQueue".into());
    }
    if out.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({ "Attributes": out }))
}

async fn set_queue_attributes(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let (name, topic) = queue_topic(ctx, input)?;
    let empty = Map::new();
    let attrs = attribute_map(input, "Attributes")?.unwrap_or(&empty);
    let settings = settings_of(ctx, attrs, None, Some(&topic.config()))?;
    if settings != Settings::default() {
        ctx.front.change_topic(name, settings).await?;
    }
    Ok(json!({}))
}

// ---- Messages ----

/// Whether every character of a body is one SQS allows: `#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD |
/// #x10000-#x10FFFF` (a Rust string has no surrogates).
fn allowed_body(body: &str) -> bool {
    body.chars().all(|c| {
        matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
    })
}

/// SQS message attributes (`{"name": {"DataType": .., "StringValue"|"BinaryValue": ..}}`) as berth's, by berth's
/// rules (SQS's: `ops::attributes`).
fn message_attributes(value: Option<&Map<String, Value>>) -> Result<Vec<Attribute>> {
    let Some(map) = value else {
        return Ok(Vec::new());
    };
    if map.len() > crate::ops::attributes::MAX_ATTRIBUTES {
        return Err(SqsError::invalid(format!(
            "Number of message attributes [{}] exceeds the allowed maximum [{}].",
            map.len(),
            crate::ops::attributes::MAX_ATTRIBUTES
        )));
    }
    let mut native = Map::new();
    for (name, spec) in map {
        // One text member of the attribute's spec, or why it is refused.
        let member = |key: &str, why: &dyn Fn() -> String| -> Result<&str> {
            spec.get(key)
                .and_then(Value::as_str)
                .ok_or_else(|| SqsError::invalid(why()))
        };
        let data_type = member("DataType", &|| {
            format!("The message attribute '{name}' must contain a non-empty attribute type.")
        })?;
        let value = if data_type.starts_with("Binary") {
            let b64 = member("BinaryValue", &|| {
                format!(
                    "The message attribute '{name}' with type 'Binary' must use field 'Binary'."
                )
            })?;
            json!({"type": data_type, "value_base64": b64})
        } else {
            let text = member("StringValue", &|| {
                format!(
                    "The message attribute '{name}' with type '{data_type}' must use field 'String'."
                )
            })?;
            if !allowed_body(text) {
                return Err(SqsError::new(
                    400,
                    "InvalidMessageContents",
                    "InvalidMessageContents",
                    format!("The message attribute '{name}' has characters SQS does not allow."),
                ));
            }
            json!({"type": data_type, "value": text})
        };
        native.insert(name.clone(), value);
    }
    crate::ops::attributes::parse_value(&Value::Object(native))
        .map_err(|e| SqsError::invalid(e.to_string()))
}

/// AWS's MD5 of message attributes.
fn attributes_md5(attrs: &[Attribute]) -> String {
    let items: Vec<(&str, &str, AttrValue<'_>)> = attrs
        .iter()
        .map(|a| {
            let value = if a.is_binary() {
                AttrValue::Binary(&a.value)
            } else {
                AttrValue::Text(std::str::from_utf8(&a.value).unwrap_or(""))
            };
            (a.name.as_str(), a.data_type.as_str(), value)
        })
        .collect();
    md5_of_message_attributes(&items)
}

/// berth's attributes as SQS's `MessageAttributes`.
fn attributes_json(attrs: &[&Attribute]) -> Value {
    let mut out = Map::new();
    for a in attrs {
        let spec = if a.is_binary() {
            json!({"DataType": a.data_type, "BinaryValue": base64::engine::general_purpose::STANDARD.encode(&a.value)})
        } else {
            json!({"DataType": a.data_type, "StringValue": String::from_utf8_lossy(&a.value)})
        };
        out.insert(a.name.clone(), spec);
    }
    Value::Object(out)
}

/// A message id: the topic's id, the partition and the offset, as a UUID-shaped string (the same message always
/// has the same id, so a deduplicated send answers the first one's).
fn message_id(topic_id: u64, partition: u32, offset: u64) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (topic_id >> 32) as u32,
        (topic_id >> 16) as u16,
        partition as u16,
        (offset >> 48) as u16,
        offset & 0xffff_ffff_ffff
    )
}

/// A FIFO message's sequence number: increasing with the offset within a partition (SQS's are large and sparse).
fn sequence_number(partition: u32, offset: u64) -> String {
    ((u128::from(partition) << 64) | u128::from(offset)).to_string()
}

/// One message to send, from a SendMessage input or a SendMessageBatch entry.
struct Outgoing {
    record: ClientRecord,
    md5_body: String,
    md5_attributes: Option<String>,
}

/// Checks and builds one message: body, delay, attributes, and the FIFO members.
fn outgoing(ctx: &Context<'_>, config: &TopicConfig, entry: &Value) -> Result<Outgoing> {
    let body = required(entry, "MessageBody")?;
    if body.is_empty() {
        return Err(SqsError::missing("MessageBody"));
    }
    if !allowed_body(body) {
        return Err(SqsError::new(
            400,
            "InvalidMessageContents",
            "InvalidMessageContents",
            "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF".into(),
        ));
    }
    let delay = integer(entry, "DelaySeconds", 0, 900).map_err(|_| {
        SqsError::invalid(format!(
            "Value {} for parameter DelaySeconds is invalid. Reason: DelaySeconds must be >= 0 and <= 900.",
            entry["DelaySeconds"]
        ))
    })?;
    if config.fifo && delay.is_some_and(|d| d > 0) {
        return Err(SqsError::invalid(format!("Value {} for parameter DelaySeconds is invalid. Reason: The request include parameter that is not valid for this queue type.", delay.unwrap_or(0))));
    }
    let attributes = message_attributes(attribute_map(entry, "MessageAttributes")?)?;
    let size = body.len() + crate::ops::attributes::size(&attributes);
    let limit = config.message_limit(ctx.front.engine().config().max_message_bytes);
    if size > limit {
        return Err(SqsError::invalid(format!(
            "One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes."
        )));
    }
    let token = |name: &str| -> Result<Option<String>> {
        match string(entry, name)? {
            None => Ok(None),
            Some(v) => {
                crate::ops::produce::check_token(name, v).map_err(|_| {
                    SqsError::invalid(format!("Value {v} for parameter {name} is invalid. Reason: {name} can only include alphanumeric and punctuation characters. 1 to 128 in length."))
                })?;
                Ok(Some(v.to_string()))
            }
        }
    };
    let group = token("MessageGroupId")?;
    let dedup = token("MessageDeduplicationId")?;
    if config.fifo {
        if group.is_none() {
            return Err(SqsError::missing("MessageGroupId"));
        }
        if dedup.is_none() && !config.content_dedup {
            return Err(SqsError::invalid("The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly"));
        }
    } else if dedup.is_some() {
        return Err(SqsError::invalid(format!("Value {} for parameter MessageDeduplicationId is invalid. Reason: The request includes a parameter that is not valid for this queue type.", dedup.unwrap_or_default())));
    }
    // A standard queue keeps no message group (SQS's fair queues: not in berth yet).
    let group = if config.fifo { group } else { None };
    let md5_attributes = (!attributes.is_empty()).then(|| attributes_md5(&attributes));
    let not_before_ms = match delay {
        Some(d) if d > 0 => ctx
            .front
            .engine()
            .clock()
            .wall_ms()
            .saturating_add(d as u64 * 1000)
            .saturating_add(1),
        _ => 0,
    };
    let meta = RecordMeta {
        not_before_ms,
        attributes,
        dedup_id: dedup.map(Bytes::from),
        group_key: group.clone().map(Bytes::from),
    };
    Ok(Outgoing {
        md5_body: md5_hex(body.as_bytes()),
        md5_attributes,
        record: ClientRecord {
            body: Bytes::copy_from_slice(body.as_bytes()),
            target: group.map_or(Target::Any, Target::Key),
            meta: (!meta.is_empty()).then(|| Box::new(meta)),
            // Without DelaySeconds, the queue's DelaySeconds applies (SQS's rule).
            topic_delay: delay.is_none(),
        },
    })
}

/// The reply entry of a sent message.
fn sent(config: &TopicConfig, out: &Outgoing, partition: u32, offset: u64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "MessageId".into(),
        json!(message_id(config.id, partition, offset)),
    );
    m.insert("MD5OfMessageBody".into(), json!(out.md5_body));
    if let Some(md5) = &out.md5_attributes {
        m.insert("MD5OfMessageAttributes".into(), json!(md5));
    }
    if config.fifo {
        m.insert(
            "SequenceNumber".into(),
            json!(sequence_number(partition, offset)),
        );
    }
    m
}

async fn send_message(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let (name, topic) = queue_topic(ctx, input)?;
    let config = topic.config();
    let out = outgoing(ctx, &config, input)?;
    let results = ctx
        .front
        .produce_from_client(ProduceParams {
            topic: name,
            records: vec![out.record.clone()],
            batch: false,
        })
        .await?;
    let (partition, offset) = results.into_iter().next().expect("one result per record")?;
    Ok(Value::Object(sent(&config, &out, partition, offset)))
}

/// A batch entry's `Id`: 1–80 of `A-Za-z0-9_-`, distinct within the batch; 1–10 entries.
fn check_entries(entries: &[Value], entry_name: &str) -> Result<Vec<String>> {
    if entries.is_empty() {
        return Err(SqsError::new(
            400,
            "EmptyBatchRequest",
            "AWS.SimpleQueueService.EmptyBatchRequest",
            format!("There should be at least one {entry_name} in the request."),
        ));
    }
    if entries.len() > MAX_BATCH_ENTRIES {
        return Err(SqsError::new(
            400,
            "TooManyEntriesInBatchRequest",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            format!(
                "Maximum number of entries per request are {MAX_BATCH_ENTRIES}. You have sent {}.",
                entries.len()
            ),
        ));
    }
    let mut ids = Vec::with_capacity(entries.len());
    for e in entries {
        let id = e.get("Id").and_then(Value::as_str).unwrap_or("");
        if id.is_empty()
            || id.len() > 80
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(SqsError::new(400, "InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId", "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long.".into()));
        }
        if ids.iter().any(|i| i == id) {
            return Err(SqsError::new(
                400,
                "BatchEntryIdsNotDistinct",
                "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                format!("Id {id} repeated."),
            ));
        }
        ids.push(id.to_string());
    }
    Ok(ids)
}

fn failed(id: &str, e: &SqsError) -> Value {
    json!({"Id": id, "SenderFault": e.sender, "Code": e.code, "Message": e.message})
}

/// `{"Successful": [...], "Failed": [...]}`, `Failed` left out when empty (as AWS does).
fn batch_reply(successful: Vec<Value>, failures: Vec<Value>) -> Value {
    let mut out = Map::new();
    out.insert("Successful".into(), Value::Array(successful));
    if !failures.is_empty() {
        out.insert("Failed".into(), Value::Array(failures));
    }
    Value::Object(out)
}

async fn send_message_batch(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let (name, topic) = queue_topic(ctx, input)?;
    let config = topic.config();
    let entries = list(input, "Entries")?;
    let ids = check_entries(entries, "SendMessageBatchRequestEntry")?;
    let total: usize = entries
        .iter()
        .map(|e| {
            e.get("MessageBody")
                .and_then(Value::as_str)
                .map_or(0, str::len)
        })
        .sum();
    let limit = ctx.front.engine().config().max_batch_bytes.min(1 << 20);
    if total > limit {
        return Err(SqsError::new(
            400,
            "BatchRequestTooLong",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            format!(
                "Batch requests cannot be longer than {limit} bytes. You have sent {total} bytes."
            ),
        ));
    }
    let mut failures = Vec::new();
    let mut good: Vec<(usize, Outgoing)> = Vec::new();
    for (k, entry) in entries.iter().enumerate() {
        match outgoing(ctx, &config, entry) {
            Ok(out) => good.push((k, out)),
            // A FIFO queue's missing group or deduplication id fails the whole request, as on AWS.
            Err(e)
                if config.fifo
                    && (e.message.contains("MessageGroupId.")
                        || e.message.starts_with("The queue should")) =>
            {
                return Err(SqsError::invalid(e.message));
            }
            Err(e) => failures.push(failed(&ids[k], &e)),
        }
    }
    let mut successful = Vec::new();
    if !good.is_empty() {
        let results = ctx
            .front
            .produce_from_client(ProduceParams {
                topic: name,
                records: good.iter().map(|(_, o)| o.record.clone()).collect(),
                batch: true,
            })
            .await?;
        for ((k, out), result) in good.iter().zip(results) {
            match result {
                Ok((partition, offset)) => {
                    let mut m = sent(&config, out, partition, offset);
                    m.insert("Id".into(), json!(ids[*k]));
                    successful.push(Value::Object(m));
                }
                Err(e) => failures.push(failed(&ids[*k], &SqsError::of(&e))),
            }
        }
    }
    Ok(batch_reply(successful, failures))
}

/// The system attributes of a delivery ReceiveMessage was asked for (`names`; `All` for every one).
fn system_attributes(
    ctx: &Context<'_>,
    config: &TopicConfig,
    d: &Delivery,
    names: &[String],
    now_ms: u64,
) -> Map<String, Value> {
    let all = names.iter().any(|n| n == "All");
    let wanted = |n: &str| all || names.iter().any(|x| x == n);
    let mut out = Map::new();
    let mut put = |k: &str, v: String| {
        if wanted(k) {
            out.insert(k.to_string(), Value::String(v));
        }
    };
    put("SenderId", ctx.account.clone());
    put("SentTimestamp", d.sent_ms.to_string());
    put("ApproximateReceiveCount", d.delivery_count.to_string());
    // berth does not keep a message's first receive time: the first receive's is this one's.
    put("ApproximateFirstReceiveTimestamp", now_ms.to_string());
    let meta = d.meta.as_deref();
    if let Some(g) = meta.and_then(|m| m.group_key.as_ref()) {
        put("MessageGroupId", String::from_utf8_lossy(g).into_owned());
    }
    if config.fifo {
        if let Some(id) = meta.and_then(|m| m.dedup_id.as_ref()) {
            put(
                "MessageDeduplicationId",
                String::from_utf8_lossy(id).into_owned(),
            );
        }
        put("SequenceNumber", sequence_number(d.partition, d.offset));
    }
    out
}

/// Whether a message attribute name is selected by ReceiveMessage's `MessageAttributeNames` (`All`, `.*`, `*`,
/// `prefix.*` or an exact name).
fn attribute_selected(name: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|p| {
        p == "All"
            || p == ".*"
            || p == "*"
            || p == name
            || p.strip_suffix(".*")
                .is_some_and(|prefix| name.starts_with(prefix))
    })
}

async fn receive_message(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let (name, topic) = queue_topic(ctx, input)?;
    let config = topic.config();
    let max = integer(input, "MaxNumberOfMessages", 1, 10)?.unwrap_or(1) as usize;
    // Without WaitTimeSeconds, the queue's ReceiveMessageWaitTimeSeconds (the topic's `receive_wait`) applies.
    let wait = integer(input, "WaitTimeSeconds", 0, 20)?.map(|w| w as u64);
    let visibility = integer(input, "VisibilityTimeout", 0, 43_200)?
        .map(|s| (s as u64 * 1000).clamp(MIN_VISIBILITY_MS, MAX_VISIBILITY_MS));
    let mut system = strings(input, "AttributeNames")?;
    system.extend(strings(input, "MessageSystemAttributeNames")?);
    let wanted_attributes = strings(input, "MessageAttributeNames")?;
    let deliveries = ctx
        .front
        .consume(ConsumeParams {
            topic: name,
            group: DEFAULT_GROUP.to_string(),
            wait_ms: wait.map(|w| w * 1000),
            visibility_ms: visibility,
            max,
            media: Some(crate::ops::params::Media::Ndjson),
        })
        .await?;
    if deliveries.is_empty() {
        return Ok(json!({}));
    }
    let now_ms = ctx.front.engine().clock().wall_ms();
    let messages: Vec<Value> = deliveries
        .iter()
        .map(|d| {
            let body = String::from_utf8_lossy(&d.payload);
            let mut m = Map::new();
            m.insert(
                "MessageId".into(),
                json!(message_id(config.id, d.partition, d.offset)),
            );
            m.insert(
                "ReceiptHandle".into(),
                json!(ReceiptHandle::of(d).to_string()),
            );
            m.insert("MD5OfBody".into(), json!(md5_hex(body.as_bytes())));
            m.insert("Body".into(), json!(body));
            let attrs = system_attributes(ctx, &config, d, &system, now_ms);
            if !attrs.is_empty() {
                m.insert("Attributes".into(), Value::Object(attrs));
            }
            let selected: Vec<&Attribute> = d
                .meta
                .as_deref()
                .map(|meta| {
                    meta.attributes
                        .iter()
                        .filter(|a| attribute_selected(&a.name, &wanted_attributes))
                        .collect()
                })
                .unwrap_or_default();
            if !selected.is_empty() {
                let owned: Vec<Attribute> = selected.iter().map(|a| (*a).clone()).collect();
                m.insert(
                    "MD5OfMessageAttributes".into(),
                    json!(attributes_md5(&owned)),
                );
                m.insert("MessageAttributes".into(), attributes_json(&selected));
            }
            Value::Object(m)
        })
        .collect();
    Ok(json!({ "Messages": messages }))
}

/// Settles receipt handles in one call; one result per handle, in order.
async fn settle(
    ctx: &Context<'_>,
    name: String,
    handles: &[&str],
    op: SettleOp,
) -> Result<Vec<std::result::Result<(), SqsError>>> {
    let parsed = handles
        .iter()
        .map(|h| {
            let handle = ReceiptHandle::parse(h)
                .ok_or_else(|| crate::ops::OpError::InvalidReceiptHandle((*h).to_string()));
            ((*h).to_string(), handle)
        })
        .collect();
    let results = ctx
        .front
        .settle(SettleParams {
            topic: name,
            group: DEFAULT_GROUP.to_string(),
            op,
            handles: parsed,
            batch: true,
        })
        .await?;
    Ok(results
        .into_iter()
        .zip(handles)
        .map(|(r, h)| r.map_err(|e| handle_error(h, &e)))
        .collect())
}

/// Settles one receipt handle: its own result.
async fn settle_one(ctx: &Context<'_>, name: String, handle: &str, op: SettleOp) -> Result<()> {
    settle(ctx, name, &[handle], op)
        .await?
        .into_iter()
        .next()
        .expect("one result per handle")
}

/// A settle's refusal as SQS names it: a handle that is not one is invalid; a lease that is over (settled,
/// expired, or taken again under a newer handle) has expired.
fn handle_error(handle: &str, e: &crate::ops::OpError) -> SqsError {
    use crate::ops::OpError as O;
    match e {
        O::InvalidReceiptHandle(_) => SqsError::new(
            404,
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid",
            format!("The input receipt handle \"{handle}\" is not a valid receipt handle."),
        ),
        _ if crate::ops::status::status_of(e).0 == 410 => SqsError::invalid(format!(
            "Value {handle} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
        )),
        _ => SqsError::of(e),
    }
}

async fn delete_message(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let handle = required(input, "ReceiptHandle")?;
    settle_one(ctx, name, handle, SettleOp::Ack).await?;
    Ok(json!({}))
}

async fn delete_message_batch(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let entries = list(input, "Entries")?;
    let ids = check_entries(entries, "DeleteMessageBatchRequestEntry")?;
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    let mut given: Vec<(&str, &str)> = Vec::with_capacity(entries.len());
    for (id, e) in ids.iter().zip(entries) {
        match e.get("ReceiptHandle").and_then(Value::as_str) {
            Some(h) => given.push((id, h)),
            None => bad.push(failed(id, &SqsError::missing("ReceiptHandle"))),
        }
    }
    if !given.is_empty() {
        let handles: Vec<&str> = given.iter().map(|(_, h)| *h).collect();
        let results = settle(ctx, name, &handles, SettleOp::Ack).await?;
        for ((id, _), r) in given.iter().zip(results) {
            match r {
                Ok(()) => ok.push(json!({"Id": id})),
                Err(e) => bad.push(failed(id, &e)),
            }
        }
    }
    Ok(batch_reply(ok, bad))
}

/// ChangeMessageVisibility's settle: 0 releases the message at once (a nack), more extends the lease from now.
fn visibility_op(seconds: i64) -> SettleOp {
    if seconds == 0 {
        SettleOp::Nack(Some(0))
    } else {
        SettleOp::Extend(Some(seconds as u64 * 1000))
    }
}

async fn change_visibility(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let handle = required(input, "ReceiptHandle")?;
    let seconds = integer(input, "VisibilityTimeout", 0, 43_200)?
        .ok_or_else(|| SqsError::missing("VisibilityTimeout"))?;
    settle_one(ctx, name, handle, visibility_op(seconds)).await?;
    Ok(json!({}))
}

async fn change_visibility_batch(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let name = queue_name(ctx, input)?;
    let entries = list(input, "Entries")?;
    let ids = check_entries(entries, "ChangeMessageVisibilityBatchRequestEntry")?;
    // Entries may ask for different timeouts: one settle per entry (at most ten).
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for (id, e) in ids.iter().zip(entries) {
        let handle = e.get("ReceiptHandle").and_then(Value::as_str);
        let result = match (handle, integer(e, "VisibilityTimeout", 0, 43_200)) {
            (None, _) => Err(SqsError::missing("ReceiptHandle")),
            (Some(handle), Ok(Some(seconds))) => {
                settle_one(ctx, name.clone(), handle, visibility_op(seconds)).await
            }
            (Some(_), Ok(None)) => Err(SqsError::missing("VisibilityTimeout")),
            (Some(_), Err(e)) => Err(e),
        };
        match result {
            Ok(()) => ok.push(json!({"Id": id})),
            Err(e) => bad.push(failed(id, &e)),
        }
    }
    Ok(batch_reply(ok, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_follow_sqs_rules() {
        assert!(check_queue_name("orders", false).is_ok());
        assert!(check_queue_name("orders_1-a", false).is_ok());
        assert!(check_queue_name("orders.fifo", true).is_ok());
        assert!(check_queue_name("orders.fifo", false).is_err());
        assert!(check_queue_name("orders", true).is_err());
        assert!(check_queue_name(".fifo", true).is_err());
        assert!(check_queue_name("", false).is_err());
        assert!(check_queue_name(&"a".repeat(81), false).is_err());
        assert!(check_queue_name(&"a".repeat(80), false).is_ok());
        assert!(check_queue_name("a/b", false).is_err());
    }

    #[test]
    fn bodies_are_checked_against_sqs_characters() {
        assert!(allowed_body("plain text\ttab\nnew line\r é 😀"));
        assert!(!allowed_body("nul \u{0}"));
        assert!(!allowed_body("bell \u{7}"));
        assert!(!allowed_body("\u{FFFF}"));
        assert!(allowed_body("\u{E000}\u{FFFD}\u{10FFFF}"));
    }

    #[test]
    fn message_ids_are_stable_and_distinct() {
        let a = message_id(0x1234_5678_9abc_def0, 3, 42);
        assert_eq!(a, message_id(0x1234_5678_9abc_def0, 3, 42));
        assert_ne!(a, message_id(0x1234_5678_9abc_def0, 3, 43));
        assert_ne!(a, message_id(0x1234_5678_9abc_def0, 2, 42));
        assert_eq!(a.len(), 36);
        assert_eq!(sequence_number(0, 7), "7");
        assert_eq!(sequence_number(1, 0), (1u128 << 64).to_string());
    }

    #[test]
    fn attribute_selection_takes_all_prefixes_and_exact_names() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(attribute_selected("Hello", &p(&["All"])));
        assert!(attribute_selected("Hello", &p(&[".*"])));
        assert!(attribute_selected("Help.Me", &p(&["Hel.*"])));
        assert!(attribute_selected("Hello", &p(&["Hello"])));
        assert!(!attribute_selected("hello", &p(&["Hello"])));
        assert!(!attribute_selected("Hello", &p(&[])));
    }
}
