//! The partition layer's errors: what can go wrong with one partition's log, leases or frontier files. Plain data
//! (it crosses cores and nodes inside replies); `ops::OpError` wraps it and `ops::status` maps it to a status.

use crate::storage::log::AppendError;
use serde::{Deserialize, Serialize};

/// A failed partition operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionError {
    /// No live lease matches the handle (410 lease_gone).
    LeaseGone,
    /// The out-of-order ack cap is reached (503 acked_ahead_full).
    AckedAheadFull,
    /// The partition cannot be served now: its frontier or a record could not be read (503 partition_unavailable).
    Unavailable(String),
    /// Below the oldest retained offset (410 offset_out_of_retention).
    OutOfRetention { start: u64 },
    /// The record cannot be read intact (422 corrupt_record).
    Corrupt { partition: u32, offset: u64 },
    /// The disk is full; nothing was written (507).
    NoSpace,
    /// A sync failed earlier; appends are refused until a restart rescans the log (503 log_unavailable).
    LogUnavailable,
    /// The partition is closing (topic deleted or server stopping) (503 shutting_down).
    Closed,
    /// A write, sync or read failed (500 storage_error).
    Storage(String),
    /// The consumer group does not exist on this partition (404 group_not_found).
    GroupNotFound(String),
    /// A replicated partition's produce was not durable on a majority of its replicas within `replica_timeout`
    /// (503 not_enough_replicas): it may still become visible, so a retry can duplicate, never lose.
    NotEnoughReplicas(String),
    /// Node RPC only: a leader's request (`Replicate`, `ReplicateFrontiers`) carries an older epoch than the
    /// replica's metadata knows: another leadership began since (409 stale_epoch, never sent to a client).
    StaleEpoch { epoch: u64, known: u64 },
}

impl std::fmt::Display for PartitionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LeaseGone => write!(f, "no live lease matches this receipt handle"),
            Self::AckedAheadFull => write!(
                f,
                "too many out-of-order acks on this partition; retry once the gap closes"
            ),
            Self::Unavailable(why) => {
                write!(
                    f,
                    "the partition cannot be served now: {why}; retry shortly"
                )
            }
            Self::OutOfRetention { start } => {
                write!(f, "offset is below the oldest retained offset {start}")
            }
            Self::Corrupt { partition, offset } => {
                write!(f, "record {partition}:{offset} cannot be read intact")
            }
            Self::NoSpace => write!(f, "no space left on the data device; nothing was written"),
            Self::LogUnavailable => write!(
                f,
                "this partition's log refused appends after a failed sync; restart the server"
            ),
            Self::Closed => write!(f, "the partition is closing"),
            Self::Storage(e) => write!(f, "storage error: {e}"),
            Self::GroupNotFound(g) => write!(f, "consumer group '{g}' does not exist"),
            Self::NotEnoughReplicas(why) => write!(
                f,
                "not acknowledged: {why} (the records may still become visible; a retry can duplicate them)"
            ),
            Self::StaleEpoch { epoch, known } => write!(
                f,
                "epoch {epoch} is over: this replica knows epoch {known} of the partition's leadership"
            ),
        }
    }
}

impl From<AppendError> for PartitionError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::Io(e) => Self::Storage(e),
            AppendError::NoSpace => Self::NoSpace,
            AppendError::Poisoned => Self::LogUnavailable,
            AppendError::Closed => Self::Closed,
            AppendError::NotLeading => Self::Unavailable(
                "this replica stopped leading the partition before the record was written; it was not written"
                    .into(),
            ),
        }
    }
}

impl From<super::inflight::SettleError> for PartitionError {
    fn from(e: super::inflight::SettleError) -> Self {
        match e {
            super::inflight::SettleError::Gone => Self::LeaseGone,
            super::inflight::SettleError::AckedAheadFull => Self::AckedAheadFull,
        }
    }
}
