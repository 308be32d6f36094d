//! The one place where an error becomes an HTTP status and an error code (docs/api.md's words). Every layer's errors
//! arrive here wrapped in `OpError`.

use super::response::Response;
use crate::engine::EngineError;
use crate::ops::OpError;
use crate::partition::PartitionError;

/// The status and error code of every error.
pub fn status_of(e: &OpError) -> (u16, &'static str) {
    match e {
        OpError::InvalidTopic(_) => (400, "invalid_topic"),
        OpError::InvalidDuration(_) => (400, "invalid_duration"),
        OpError::InvalidReceiptHandle(_) => (400, "invalid_receipt_handle"),
        OpError::InvalidParameter(_) => (400, "invalid_parameter"),
        OpError::InvalidRecord(_) => (400, "invalid_record"),
        OpError::MessageTooLarge { .. } => (413, "message_too_large"),
        OpError::BatchTooLarge(_) => (413, "batch_too_large"),
        OpError::PartitionUnavailable(_) => (503, "partition_unavailable"),
        OpError::Engine(e) => engine_status(e),
        OpError::GroupDeleted { .. } => (404, "group_not_found"),
    }
}

/// Cluster mode: whether a request that failed with `e` may be run again after its topic is looked up in the
/// metastore (the topic, or a group of it, created through another node a moment ago and not in this node's replica
/// yet), and if so whether the look-up must read the metastore even for a topic this node knows (`true`: a group is
/// missing). None: the error is not about a missing topic or group, or it is final (`OpError::GroupDeleted`).
pub fn lookup_first(e: &OpError) -> Option<bool> {
    match e {
        OpError::Engine(EngineError::TopicNotFound(_) | EngineError::Stale(_)) => Some(false),
        OpError::Engine(
            EngineError::GroupNotFound { .. }
            | EngineError::Partition(PartitionError::GroupNotFound(_)),
        ) => Some(true),
        _ => None,
    }
}

fn engine_status(e: &EngineError) -> (u16, &'static str) {
    match e {
        EngineError::TopicNotFound(_) | EngineError::Stale(_) => (404, "topic_not_found"),
        EngineError::PartitionNotFound { .. } => (404, "partition_not_found"),
        EngineError::GroupNotFound { .. } => (404, "group_not_found"),
        EngineError::TopicExists { .. } => (409, "topic_exists"),
        EngineError::TopicLimit { .. } => (409, "topic_limit"),
        EngineError::PartitionLimit { .. } => (409, "partition_limit"),
        EngineError::GroupLimit { .. } => (409, "group_limit"),
        EngineError::TopicInUse { .. } => (409, "topic_in_use"),
        EngineError::InvalidSetting(_) => (400, "invalid_parameter"),
        EngineError::TopicUnavailable(_) => (503, "topic_unavailable"),
        EngineError::ShuttingDown => (503, "shutting_down"),
        EngineError::Overloaded => (503, "overloaded"),
        EngineError::Storage(_) => (500, "storage_error"),
        EngineError::Partition(p) => partition_status(p),
        EngineError::NodeNotFound(_) => (404, "node_not_found"),
        EngineError::NodeAlive(_) => (409, "node_alive"),
        EngineError::NodeRemoved(_) => (409, "node_removed"),
        EngineError::NodeHoldsOnlyCopy(..) => (409, "only_copy"),
        EngineError::ClusterUnavailable(_) => (503, "topic_unavailable"),
    }
}

fn partition_status(e: &PartitionError) -> (u16, &'static str) {
    match e {
        PartitionError::LeaseGone => (410, "lease_gone"),
        PartitionError::AckedAheadFull => (503, "acked_ahead_full"),
        PartitionError::Unavailable(_) => (503, "partition_unavailable"),
        PartitionError::OutOfRetention { .. } => (410, "offset_out_of_retention"),
        PartitionError::Corrupt { .. } => (422, "corrupt_record"),
        PartitionError::NoSpace => (507, "insufficient_storage"),
        PartitionError::LogUnavailable => (503, "log_unavailable"),
        PartitionError::Closed => (503, "shutting_down"),
        PartitionError::Storage(_) => (500, "storage_error"),
        PartitionError::GroupNotFound(_) => (404, "group_not_found"),
        PartitionError::NotEnoughReplicas(_) => (503, "not_enough_replicas"),
        PartitionError::StaleEpoch { .. } => (409, "stale_epoch"),
    }
}

/// The error response (503s carry Retry-After).
pub fn error_response(e: &OpError) -> Response {
    let (status, code) = status_of(e);
    let response = Response::error(status, code, &e.to_string());
    if status == 503 {
        response.with_header("retry-after", 1)
    } else {
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_api_status() {
        let lease_gone = OpError::from(PartitionError::LeaseGone);
        assert_eq!(status_of(&lease_gone), (410, "lease_gone"));
        assert_eq!(status_of(&PartitionError::AckedAheadFull.into()).0, 503);
        assert_eq!(
            status_of(&OpError::MessageTooLarge { limit: 1 }),
            (413, "message_too_large")
        );
        assert!(error_response(&EngineError::Overloaded.into())
            .header("retry-after")
            .is_some());
        let short = OpError::from(PartitionError::NotEnoughReplicas("1 of 3".into()));
        assert_eq!(status_of(&short), (503, "not_enough_replicas"));
        assert_eq!(error_response(&short).header("retry-after"), Some("1"));
        assert_eq!(
            status_of(&EngineError::Stale("gone".into()).into()),
            (404, "topic_not_found")
        );
    }

    #[test]
    fn a_missing_topic_or_group_is_looked_up_but_a_group_deleted_under_a_consume_is_final() {
        let group = |topic: &str| EngineError::GroupNotFound {
            topic: topic.into(),
            group: "g".into(),
        };
        assert_eq!(
            lookup_first(&EngineError::TopicNotFound("t".into()).into()),
            Some(false)
        );
        assert_eq!(
            lookup_first(&EngineError::Stale("t".into()).into()),
            Some(false)
        );
        assert_eq!(lookup_first(&group("t").into()), Some(true));
        assert_eq!(
            lookup_first(&PartitionError::GroupNotFound("g".into()).into()),
            Some(true)
        );
        let deleted = OpError::GroupDeleted {
            topic: "t".into(),
            group: "g".into(),
        };
        assert_eq!(lookup_first(&deleted), None);
        // Answered as any missing group is, body included.
        let (a, b) = (error_response(&deleted), error_response(&group("t").into()));
        assert_eq!((a.status, &a.body), (b.status, &b.body));
        assert_eq!(lookup_first(&EngineError::Overloaded.into()), None);
        assert_eq!(lookup_first(&OpError::InvalidTopic("x".into())), None);
    }
}
