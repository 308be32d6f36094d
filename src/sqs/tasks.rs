//! SQS message move tasks: StartMessageMoveTask moves a dead-letter queue's messages back (to the queue given as
//! `DestinationArn`, else to the one queue that dead-letters into it), in rounds of the native redrive
//! (`front::redrive`: each message appended to the destination before it is acked in the dead-letter queue), at most
//! `MaxNumberOfMessagesPerSecond`. A task runs on the core that took its start; the node's table of tasks
//! (`engine::Shared::move_tasks`, a lock taken by these three actions only, never on the data path) lets any core
//! list and cancel it. Tasks live in memory: a restart forgets them (the messages moved stay moved).

use super::actions::{integer, required, string};
use super::{Context, SqsError};
use crate::front::redrive::REDRIVE_BATCH;
use crate::front::Front;
use crate::ops::redrive::RedriveParams;
use crate::partition::DEFAULT_GROUP;
use base64::Engine as _;
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, SqsError>;

/// Most tasks the table keeps: the oldest finished ones go first.
pub const MAX_TASKS: usize = 1000;

/// Where a task stands (SQS's statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Running,
    Completed,
    Cancelling,
    Cancelled,
    Failed,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Running => "RUNNING",
            Status::Completed => "COMPLETED",
            Status::Cancelling => "CANCELLING",
            Status::Cancelled => "CANCELLED",
            Status::Failed => "FAILED",
        }
    }

    fn active(self) -> bool {
        matches!(self, Status::Running | Status::Cancelling)
    }
}

/// One task.
#[derive(Debug, Clone)]
pub struct MoveTask {
    pub handle: String,
    /// The source and destination queues (topics), and their ARNs as given.
    pub source: String,
    pub source_arn: String,
    pub destination: String,
    pub destination_arn: Option<String>,
    pub rate: Option<u32>,
    pub moved: u64,
    pub to_move: u64,
    pub status: Status,
    pub failure: Option<String>,
    pub started_ms: u64,
}

/// The node's tasks, oldest first.
#[derive(Debug, Default)]
pub struct MoveTasks {
    tasks: VecDeque<MoveTask>,
    next: u64,
}

impl MoveTasks {
    fn find(&mut self, handle: &str) -> Option<&mut MoveTask> {
        self.tasks.iter_mut().find(|t| t.handle == handle)
    }

    /// Adds a task, dropping the oldest finished ones beyond `MAX_TASKS`.
    fn add(&mut self, task: MoveTask) {
        while self.tasks.len() >= MAX_TASKS {
            match self.tasks.iter().position(|t| !t.status.active()) {
                Some(i) => {
                    self.tasks.remove(i);
                }
                None => break,
            }
        }
        self.tasks.push_back(task);
    }
}

fn table(ctx: &Context<'_>) -> Arc<crate::engine::Shared> {
    ctx.front.engine().shared().clone()
}

fn lock(shared: &crate::engine::Shared) -> std::sync::MutexGuard<'_, MoveTasks> {
    // A panic while the lock was held leaves a table that is still whole (every change is one assignment).
    shared
        .move_tasks
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn not_found(what: &str) -> SqsError {
    SqsError::new(
        400,
        "ResourceNotFoundException",
        "ResourceNotFoundException",
        format!("The resource that you specified for the {what} parameter doesn't exist."),
    )
}

/// The queue an ARN of this account names, if it exists.
fn queue_of_arn(ctx: &Context<'_>, arn: &str, member: &str) -> Result<String> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts.as_slice() {
        ["arn", _, "sqs", _, account, name] if *account == ctx.account => {
            if ctx.front.engine().topic(name).is_ok() {
                Ok(name.to_string())
            } else {
                Err(not_found(member))
            }
        }
        ["arn", _, "sqs", _, _, _] => Err(not_found(member)),
        _ => Err(SqsError::invalid(format!(
            "Value {arn} for parameter {member} is invalid. Reason: not an SQS queue ARN."
        ))),
    }
}

/// Messages visible in the default group now (what a task sets out to move).
async fn visible(front: &Front, name: &str) -> Result<u64> {
    let (_, partitions) = front.describe_topic(name).await?;
    Ok(partitions
        .iter()
        .filter_map(|p| {
            p.groups.iter().find(|g| g.group == DEFAULT_GROUP).map(|g| {
                let unsettled = p.end_offset.saturating_sub(g.committed);
                unsettled.saturating_sub((g.in_flight + g.delayed + g.acked_ahead) as u64)
            })
        })
        .sum())
}

pub(super) async fn start(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let source_arn = required(input, "SourceArn")?.to_string();
    let source = queue_of_arn(ctx, &source_arn, "SourceArn")?;
    let sources = super::manage::dead_letter_sources(ctx, &source);
    if sources.is_empty() {
        return Err(SqsError::invalid(format!(
            "Value {source_arn} for parameter SourceArn is invalid. Reason: Source queue must be configured as a Dead Letter Queue."
        )));
    }
    let destination_arn = string(input, "DestinationArn")?.map(str::to_string);
    let destination = match &destination_arn {
        Some(arn) => queue_of_arn(ctx, arn, "DestinationArn")?,
        // berth does not record which queue a dead-lettered message came from: without a destination, the source
        // must be the dead-letter queue of exactly one queue.
        None if sources.len() == 1 => sources[0].clone(),
        None => {
            return Err(SqsError::invalid(format!(
                "Value {source_arn} for parameter SourceArn is invalid. Reason: {} queues use it as their dead-letter queue, and berth does not record which one a message came from: give DestinationArn.",
                sources.len()
            )))
        }
    };
    if destination == source {
        return Err(SqsError::invalid(
            "Value for parameter DestinationArn is invalid. Reason: the destination must be another queue than the source.",
        ));
    }
    let (source_fifo, destination_fifo) = {
        let engine = ctx.front.engine();
        let fifo = |n: &str| engine.topic(n).map(|t| t.config().fifo).unwrap_or(false);
        (fifo(&source), fifo(&destination))
    };
    if source_fifo != destination_fifo {
        return Err(SqsError::invalid(
            "Value for parameter DestinationArn is invalid. Reason: the destination must be of the same type (FIFO or standard) as the source.",
        ));
    }
    let rate = integer(input, "MaxNumberOfMessagesPerSecond", 1, 500)?.map(|r| r as u32);
    // The queues as they are now: a task whose source or destination is deleted (and perhaps created again under
    // its name) meanwhile fails rather than move into another queue.
    let ids = {
        let engine = ctx.front.engine();
        let id = |n: &str| {
            engine
                .topic(n)
                .map(|t| t.id())
                .map_err(|_| not_found("SourceArn"))
        };
        (id(&source)?, id(&destination)?)
    };
    let to_move = visible(ctx.front, &source).await?;
    let shared = table(ctx);
    let handle = {
        let mut tasks = lock(&shared);
        if tasks
            .tasks
            .iter()
            .any(|t| t.source == source && t.status.active())
        {
            return Err(SqsError::new(
                400,
                "UnsupportedOperation",
                "AWS.SimpleQueueService.UnsupportedOperation",
                "There is already a task running. Only one active task is allowed for each source queue arn at a given time.".into(),
            ));
        }
        tasks.next += 1;
        // Opaque to clients, as AWS's: a task id unique in this process, and the source ARN.
        let id = format!("{:x}-{}", ctx.front.engine().clock().wall_ms(), tasks.next);
        let handle = base64::engine::general_purpose::STANDARD
            .encode(json!({"taskId": id, "sourceArn": source_arn}).to_string());
        tasks.add(MoveTask {
            handle: handle.clone(),
            source: source.clone(),
            source_arn: source_arn.clone(),
            destination: destination.clone(),
            destination_arn,
            rate,
            moved: 0,
            to_move,
            status: Status::Running,
            failure: None,
            started_ms: ctx.front.engine().clock().wall_ms(),
        });
        handle
    };
    let front = Front::new(ctx.front.router().clone());
    glommio::spawn_local(run(
        front,
        shared,
        handle.clone(),
        [(source, ids.0), (destination, ids.1)],
        rate,
        to_move,
    ))
    .detach();
    Ok(json!({ "TaskHandle": handle }))
}

/// Runs a task to its end: everything it set out to move moved, nothing visible left, a cancel, or a failure.
async fn run(
    front: std::rc::Rc<Front>,
    shared: Arc<crate::engine::Shared>,
    handle: String,
    [(source, source_id), (destination, destination_id)]: [(String, u64); 2],
    rate: Option<u32>,
    to_move: u64,
) {
    let started = Instant::now();
    let mut moved = 0u64;
    let (status, failure) = loop {
        if lock(&shared)
            .find(&handle)
            .is_none_or(|t| t.status == Status::Cancelling)
        {
            break (Status::Cancelled, None);
        }
        if moved >= to_move {
            break (Status::Completed, None);
        }
        if front.engine().is_stopping() {
            break (Status::Failed, Some("the server is stopping".to_string()));
        }
        let current = |name: &str, id: u64| front.engine().topic(name).is_ok_and(|t| t.id() == id);
        if !current(&source, source_id) || !current(&destination, destination_id) {
            break (
                Status::Failed,
                Some("the source or the destination queue was deleted".to_string()),
            );
        }
        let mut want = (to_move - moved).min(REDRIVE_BATCH as u64);
        if let Some(r) = rate {
            want = want.min(r as u64);
        }
        let round = front
            .redrive(RedriveParams {
                from: source.clone(),
                to: destination.clone(),
                group: DEFAULT_GROUP.to_string(),
                max: Some(want),
            })
            .await;
        match round {
            Ok(0) => break (Status::Completed, None),
            Ok(n) => {
                moved += n;
                if let Some(t) = lock(&shared).find(&handle) {
                    t.moved = moved;
                }
            }
            Err(e) => break (Status::Failed, Some(e.to_string())),
        }
        if let Some(r) = rate {
            // Paced: `moved` messages take at least moved / rate seconds from the start.
            let due = Duration::from_secs_f64(moved as f64 / r as f64);
            if let Some(rest) = due.checked_sub(started.elapsed()) {
                glommio::timer::sleep(rest).await;
            }
        }
    };
    if let Some(t) = lock(&shared).find(&handle) {
        t.moved = moved;
        t.status = status;
        t.failure = failure;
    }
}

pub(super) fn list(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let source_arn = required(input, "SourceArn")?;
    let source = queue_of_arn(ctx, source_arn, "SourceArn")?;
    let max = integer(input, "MaxResults", 1, 10)?.unwrap_or(1) as usize;
    let shared = table(ctx);
    let tasks = lock(&shared);
    let results: Vec<Value> = tasks
        .tasks
        .iter()
        .rev()
        .filter(|t| t.source == source)
        .take(max)
        .map(|t| {
            let mut m = Map::new();
            if t.status == Status::Running {
                m.insert("TaskHandle".into(), json!(t.handle));
            }
            m.insert("Status".into(), json!(t.status.name()));
            m.insert("SourceArn".into(), json!(t.source_arn));
            if let Some(d) = &t.destination_arn {
                m.insert("DestinationArn".into(), json!(d));
            }
            if let Some(r) = t.rate {
                m.insert("MaxNumberOfMessagesPerSecond".into(), json!(r));
            }
            m.insert("ApproximateNumberOfMessagesMoved".into(), json!(t.moved));
            m.insert("ApproximateNumberOfMessagesToMove".into(), json!(t.to_move));
            if let Some(f) = &t.failure {
                m.insert("FailureReason".into(), json!(f));
            }
            m.insert("StartedTimestamp".into(), json!(t.started_ms));
            Value::Object(m)
        })
        .collect();
    Ok(json!({ "Results": results }))
}

pub(super) fn cancel(ctx: &Context<'_>, input: &Value) -> Result<Value> {
    let handle = required(input, "TaskHandle")?;
    let shared = table(ctx);
    let mut tasks = lock(&shared);
    let task = tasks.find(handle).ok_or_else(|| not_found("TaskHandle"))?;
    if task.status != Status::Running {
        return Err(SqsError::new(
            400,
            "UnsupportedOperation",
            "AWS.SimpleQueueService.UnsupportedOperation",
            format!(
                "Only a running task can be cancelled; this one is {}.",
                task.status.name()
            ),
        ));
    }
    task.status = Status::Cancelling;
    Ok(json!({ "ApproximateNumberOfMessagesMoved": task.moved }))
}
