//! The operation layer's errors: what a request can fail with, from parsing to the owner's answer. Wraps the engine
//! (and through it the partition) layer's errors; `ops::status` maps each to a status code in one place. Plain data
//! (it crosses cores inside replies, and nodes over RPC).

use crate::engine::EngineError;
use crate::partition::PartitionError;
use serde::{Deserialize, Serialize};

/// A failed operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpError {
    /// 400 invalid_topic (also an invalid group name).
    InvalidTopic(String),
    /// 400 invalid_duration (the parameter name and the reason).
    InvalidDuration(String),
    /// 400 invalid_receipt_handle.
    InvalidReceiptHandle(String),
    /// 400 invalid_parameter: any other malformed query parameter.
    InvalidParameter(String),
    /// 400 invalid_record: a batch body that does not parse (nothing is written).
    InvalidRecord(String),
    /// 413 message_too_large.
    MessageTooLarge { limit: usize },
    /// 413 batch_too_large: over `max_batch_records` or `max_batch_bytes`.
    BatchTooLarge(String),
    /// 503 partition_unavailable: the partition's owner cannot be reached now.
    PartitionUnavailable(String),
    /// The engine's (and partition's) errors.
    Engine(EngineError),
    /// 404 group_not_found, as `EngineError::GroupNotFound`: a consume whose group was deleted while it ran. Made
    /// by the front of the node that took the request, never sent over node RPC; unlike a group this node has not
    /// heard of yet, the HTTP layer does not run the consume again after a metastore look-up (run again, it would be
    /// a first consume and create the group anew, at the oldest offset).
    GroupDeleted { topic: String, group: String },
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InvalidTopic(t) => {
                write!(f, "name '{t}' must match [A-Za-z0-9._-]{{1,128}}")
            }
            Self::InvalidDuration(why) => write!(f, "{why}"),
            Self::InvalidReceiptHandle(h) => {
                write!(f, "receipt handle '{h}' is not partition:offset:nonce")
            }
            Self::InvalidParameter(why) => write!(f, "{why}"),
            Self::InvalidRecord(why) => write!(f, "{why}"),
            Self::MessageTooLarge { limit } => write!(f, "message exceeds {limit} bytes"),
            Self::BatchTooLarge(why) => write!(f, "{why}"),
            Self::PartitionUnavailable(why) => write!(f, "{why}"),
            Self::Engine(e) => write!(f, "{e}"),
            Self::GroupDeleted { topic, group } => EngineError::GroupNotFound {
                topic: topic.clone(),
                group: group.clone(),
            }
            .fmt(f),
        }
    }
}

impl From<EngineError> for OpError {
    fn from(e: EngineError) -> Self {
        Self::Engine(e)
    }
}

impl From<PartitionError> for OpError {
    fn from(e: PartitionError) -> Self {
        Self::Engine(EngineError::Partition(e))
    }
}

impl From<crate::engine::topic::InvalidName> for OpError {
    fn from(e: crate::engine::topic::InvalidName) -> Self {
        Self::InvalidTopic(e.0)
    }
}

/// Result of an operation.
pub type OpResult<T> = Result<T, OpError>;
