//! The engine layer's errors: topics, ownership and admin on one core, wrapping the partition layer's. Plain data
//! (it crosses cores and nodes inside replies); `ops::OpError` wraps it and `ops::status` maps it to a status.

use crate::partition::PartitionError;
use serde::{Deserialize, Serialize};

/// A failed engine operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineError {
    /// 404 topic_not_found.
    TopicNotFound(String),
    /// 404 partition_not_found.
    PartitionNotFound { topic: String, partition: u64 },
    /// 409 topic_exists (with another partition count).
    TopicExists { topic: String, partitions: u32 },
    /// 503 topic_unavailable: the topic could not be opened at start and is quarantined.
    TopicUnavailable(String),
    /// 409 topic_limit: the node holds `max_topics` topics.
    TopicLimit { limit: usize },
    /// 409 partition_limit: the topic would take the node past its partition budget.
    PartitionLimit { limit: usize, reason: String },
    /// 409 group_limit: the topic holds `max_groups` groups.
    GroupLimit { limit: usize },
    /// 404 group_not_found.
    GroupNotFound { topic: String, group: String },
    /// 409 topic_in_use: the topic is another topic's dead-letter topic.
    TopicInUse { topic: String, by: String },
    /// 400 invalid_parameter: a setting that does not fit (e.g. a dead-letter topic that does not exist).
    InvalidSetting(String),
    /// The request reached a core that does not own the partition, or a topic incarnation that is gone (the topic
    /// was deleted or recreated meanwhile): 404 topic_not_found to the client.
    Stale(String),
    /// 503 shutting_down.
    ShuttingDown,
    /// 503 overloaded: a core-to-core channel was full.
    Overloaded,
    /// 500 storage_error: a metadata write failed.
    Storage(String),
    /// The partition layer's error.
    Partition(PartitionError),
    /// 404 node_not_found: no node of this id ever joined the cluster.
    NodeNotFound(String),
    /// 409 node_alive: `DELETE /cluster/nodes/ID` for a node that holds a session (drain it instead, or stop it).
    NodeAlive(String),
    /// 409 node_removed: the end of a drain asked for a node removed for good.
    NodeRemoved(String),
    /// 409 only_copy: `DELETE /cluster/nodes/ID` for a node that holds the only voting replica of these partitions
    /// (`topic/partition`, the first few).
    NodeHoldsOnlyCopy(String, Vec<String>),
    /// 503 topic_unavailable, for a reason of the cluster's (etcd out of reach, no live node, a replica behind), said
    /// as it is: a topic change could not be made or seen now; retry.
    ClusterUnavailable(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TopicNotFound(t) => write!(f, "topic '{t}' does not exist"),
            Self::PartitionNotFound { topic, partition } => {
                write!(f, "topic '{topic}' has no partition {partition}")
            }
            Self::TopicExists { topic, partitions } => {
                write!(f, "topic '{topic}' exists with {partitions} partitions")
            }
            Self::TopicUnavailable(t) => write!(
                f,
                "topic '{t}' could not be opened at start and is quarantined; see the server log"
            ),
            Self::TopicLimit { limit } => {
                write!(
                    f,
                    "this node holds its maximum of {limit} topics (max_topics)"
                )
            }
            Self::PartitionLimit { limit, reason } => {
                write!(
                    f,
                    "this node can hold at most {limit} partitions ({reason})"
                )
            }
            Self::GroupLimit { limit } => {
                write!(
                    f,
                    "this topic holds its maximum of {limit} groups (max_groups)"
                )
            }
            Self::TopicInUse { topic, by } => {
                write!(f, "topic '{topic}' is the dead-letter topic of '{by}': change or clear that first (PATCH /topics/{by}?max_deliveries=0&dead_letter=)")
            }
            Self::GroupNotFound { topic, group } => {
                write!(f, "topic '{topic}' has no consumer group '{group}'")
            }
            Self::InvalidSetting(why) => write!(f, "{why}"),
            Self::Stale(why) => write!(f, "{why}"),
            Self::ShuttingDown => write!(f, "the server is shutting down"),
            Self::Overloaded => write!(f, "a core's request channel is full; retry shortly"),
            Self::Storage(e) => write!(f, "storage error: {e}"),
            Self::Partition(e) => write!(f, "{e}"),
            Self::NodeNotFound(id) => write!(f, "no node '{id}' ever joined the cluster"),
            Self::ClusterUnavailable(why) => write!(f, "{why}"),
            Self::NodeHoldsOnlyCopy(id, partitions) => write!(
                f,
                "node '{id}' holds the only copy of partitions {partitions:?}: removing it would lose them (bring it back, or delete those topics first)"
            ),
            Self::NodeRemoved(id) => write!(
                f,
                "node '{id}' was removed from the cluster for good: its drain does not end"
            ),
            Self::NodeAlive(id) => write!(
                f,
                "node '{id}' is alive: a removal is for a node gone for good (stop it first, or drain it: POST /cluster/nodes/{id}/drain)"
            ),
        }
    }
}

impl From<PartitionError> for EngineError {
    fn from(e: PartitionError) -> Self {
        Self::Partition(e)
    }
}

/// Result of an engine operation.
pub type EngineResult<T> = Result<T, EngineError>;
