//! What one core asks of another. Each request carries its own typed reply channel; `Interest` and `Wake` are
//! one-way long-poll signals. Built by `broker::router`, executed by `broker::core::Core::serve_command`.

use super::error::BrokerResult;
use super::metrics::CoreStats;
use super::topic::TopicConfig;
use crate::partition::{PartitionInfo, SettleOp, Take};
use crate::storage::log::Record;
use bytes::Bytes;
use futures_channel::oneshot;

/// The reply half a request carries.
pub type Reply<T> = oneshot::Sender<BrokerResult<T>>;

/// A request from one core to another.
pub enum Command {
    /// Core 0 only: create a topic (true = created, false = already there with the same partition count).
    CreateTopic {
        config: TopicConfig,
        reply: Reply<(bool, TopicConfig)>,
    },
    /// Core 0 only: delete a topic everywhere.
    DeleteTopic { name: String, reply: Reply<()> },
    /// Learn a topic and open the partitions this core owns.
    ApplyTopic {
        config: TopicConfig,
        reply: Reply<()>,
    },
    /// Forget a topic and close its partitions here.
    DropTopic { name: String, reply: Reply<()> },
    /// Append to a partition this core owns.
    Produce {
        topic: String,
        partition: u32,
        payload: Bytes,
        reply: Reply<u64>,
    },
    /// Lease from any partition of the topic this core owns.
    TryConsume {
        topic: String,
        visibility_ms: Option<u64>,
        reply: Reply<Take>,
    },
    /// Ack, nack or extend a lease on a partition this core owns.
    Settle {
        topic: String,
        partition: u32,
        offset: u64,
        nonce: u64,
        op: SettleOp,
        reply: Reply<()>,
    },
    /// Read a record for replay, waiting up to `wait_ms` for it to be written.
    Replay {
        topic: String,
        partition: u32,
        offset: u64,
        wait_ms: u64,
        reply: Reply<Option<Record>>,
    },
    /// This core's partitions of a topic.
    Describe {
        topic: String,
        reply: Reply<Vec<PartitionInfo>>,
    },
    /// This core's counters and latency histogram.
    Stats { reply: Reply<CoreStats> },
    /// Core `from` has consumers parked on `topic`: wake it at the next deliverable offset here.
    Interest { topic: String, from: usize },
    /// Something became deliverable on `topic` at core `from`.
    Wake { topic: String, from: usize },
}
