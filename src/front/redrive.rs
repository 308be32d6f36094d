//! Redrive at the front: consume a batch from the source topic, append it to the target topic, then ack it in the
//! source; repeat until the requested number moved or nothing is left. At-least-once: if the process dies between
//! an append and its ack, the message is in both topics.

use super::Front;
use crate::ops::consume::ConsumeParams;
use crate::ops::produce::{ClientRecord, ProduceParams};
use crate::ops::receipt::ReceiptHandle;
use crate::ops::redrive::RedriveParams;
use crate::ops::settle::SettleParams;
use crate::ops::OpResult;
use crate::partition::SettleOp;

/// Messages moved per round.
pub const REDRIVE_BATCH: usize = 100;

/// How long the source leases a batch while it is appended to the target (a crash leaves it deliverable again
/// after this). 30 s.
pub const REDRIVE_VISIBILITY_MS: u64 = 30_000;

impl Front {
    /// Moves messages; returns how many.
    pub async fn redrive(&self, params: RedriveParams) -> OpResult<u64> {
        let engine = self.engine();
        let source = engine.topic(&params.from)?;
        engine.topic(&params.to)?;
        let limit = match params.max {
            Some(max) => max,
            // What is there now: the records above each partition's committed frontier.
            None => {
                let (_, partitions) = self.describe_topic(&params.from).await?;
                partitions
                    .iter()
                    .map(|p| {
                        let committed = p
                            .groups
                            .iter()
                            .find(|g| g.group == params.group)
                            .map_or(p.start_offset, |g| g.committed);
                        p.end_offset.saturating_sub(committed)
                    })
                    .sum()
            }
        };
        drop(source);
        let mut moved = 0u64;
        while moved < limit {
            let want = (limit - moved).min(REDRIVE_BATCH as u64) as usize;
            let deliveries = self
                .consume(ConsumeParams {
                    topic: params.from.clone(),
                    group: params.group.clone(),
                    wait_ms: Some(0),
                    visibility_ms: Some(REDRIVE_VISIBILITY_MS),
                    max: want,
                    media: None,
                })
                .await?;
            if deliveries.is_empty() {
                break;
            }
            let records = deliveries
                .iter()
                .map(|d| ClientRecord::moved(&d.payload, &d.meta))
                .collect();
            let appended = self
                .produce(ProduceParams {
                    topic: params.to.clone(),
                    records,
                    batch: true,
                })
                .await?;
            // Only what reached the target is acked in the source; the rest comes back after its lease.
            let handles = deliveries
                .iter()
                .zip(&appended)
                .filter(|(_, r)| r.is_ok())
                .map(|(d, _)| {
                    let handle = ReceiptHandle::of(d);
                    (handle.to_string(), Ok(handle))
                })
                .collect::<Vec<_>>();
            let written = handles.len() as u64;
            if written > 0 {
                self.settle(SettleParams {
                    topic: params.from.clone(),
                    group: params.group.clone(),
                    op: SettleOp::Ack,
                    handles,
                    batch: true,
                })
                .await?;
            }
            moved += written;
            if let Some(Err(e)) = appended.into_iter().find(Result::is_err) {
                if written == 0 {
                    return Err(e);
                }
                break;
            }
        }
        Ok(moved)
    }
}
