//! The broker's error enum: every way a request can fail, in the API's words. The HTTP edge maps each variant to a
//! status code in exactly one place (`http::routes::status_of`). Crosses cores inside replies, so it is `Send`.

/// A failed broker operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerError {
    /// 400 invalid_topic.
    InvalidTopic(String),
    /// 400 invalid_duration (the parameter name and the reason).
    InvalidDuration(String),
    /// 400 invalid_receipt_handle.
    InvalidReceiptHandle(String),
    /// 400 invalid_parameter: any other malformed query parameter.
    InvalidParameter(String),
    /// 404 topic_not_found.
    TopicNotFound(String),
    /// 404 partition_not_found.
    PartitionNotFound { topic: String, partition: u64 },
    /// 409 topic_exists (with another partition count).
    TopicExists { topic: String, partitions: u32 },
    /// 410 lease_gone.
    LeaseGone,
    /// 410 offset_out_of_retention.
    OffsetOutOfRetention { start: u64 },
    /// 413 message_too_large.
    MessageTooLarge { limit: usize },
    /// 422 corrupt_record.
    CorruptRecord { partition: u32, offset: u64 },
    /// 503 acked_ahead_full, with Retry-After.
    AckedAheadFull,
    /// 503 overloaded: a core-to-core channel was full, with Retry-After.
    Overloaded,
    /// 503 shutting_down.
    ShuttingDown,
    /// 503 log_unavailable: a sync failed earlier; the partition refuses appends until a restart rescans it.
    LogUnavailable,
    /// 503 partition_unavailable: the partition cannot be served now (its frontier or a record could not be
    /// read); retried at the next touch.
    PartitionUnavailable(String),
    /// 503 topic_unavailable: the topic could not be opened at boot and is quarantined until a restart.
    TopicUnavailable(String),
    /// 409 topic_limit: the node holds `max_topics` topics.
    TopicLimit { limit: usize },
    /// 409 partition_limit: the topic would take the node past its partition budget.
    PartitionLimit { limit: usize, reason: String },
    /// 500 storage_error: a write, sync or read failed.
    Storage(String),
    /// 507 insufficient_storage: the disk is full; nothing was written. Produce recovers once space returns.
    NoSpace,
}

impl std::fmt::Display for BrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InvalidTopic(t) => {
                write!(f, "topic name '{t}' must match [A-Za-z0-9._-]{{1,128}}")
            }
            Self::InvalidDuration(why) => write!(f, "{why}"),
            Self::InvalidReceiptHandle(h) => {
                write!(f, "receipt handle '{h}' is not partition:offset:nonce")
            }
            Self::InvalidParameter(why) => write!(f, "{why}"),
            Self::TopicNotFound(t) => write!(f, "topic '{t}' does not exist"),
            Self::PartitionNotFound { topic, partition } => {
                write!(f, "topic '{topic}' has no partition {partition}")
            }
            Self::TopicExists { topic, partitions } => {
                write!(f, "topic '{topic}' exists with {partitions} partitions")
            }
            Self::LeaseGone => write!(f, "no live lease matches this receipt handle"),
            Self::OffsetOutOfRetention { start } => {
                write!(f, "offset is below the oldest retained offset {start}")
            }
            Self::MessageTooLarge { limit } => write!(f, "message exceeds {limit} bytes"),
            Self::CorruptRecord { partition, offset } => {
                write!(f, "record {partition}:{offset} cannot be read intact")
            }
            Self::AckedAheadFull => {
                write!(
                    f,
                    "too many out-of-order acks on this partition; retry once the gap closes"
                )
            }
            Self::Overloaded => write!(f, "a core's request channel is full; retry shortly"),
            Self::ShuttingDown => write!(f, "the server is shutting down"),
            Self::LogUnavailable => write!(
                f,
                "this partition's log refused appends after a failed sync; restart the server"
            ),
            Self::PartitionUnavailable(why) => {
                write!(
                    f,
                    "the partition cannot be served now: {why}; retry shortly"
                )
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
            Self::Storage(e) => write!(f, "storage error: {e}"),
            Self::NoSpace => write!(f, "no space left on the data device; nothing was written"),
        }
    }
}

/// Result of a broker operation.
pub type BrokerResult<T> = Result<T, BrokerError>;
