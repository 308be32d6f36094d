//! Settles at the front: the handles of a request split by partition, each partition's share settled in one pass at
//! its owner (in parallel), the results merged back in request order.

use super::Front;
use crate::engine::EngineError;
use crate::join::join_all;
use crate::ops::receipt::ReceiptHandle;
use crate::ops::settle::{Settle, SettleParams};
use crate::ops::{OpError, OpResult, Reply, Request};
use std::collections::BTreeMap;

/// A handle of the request: its index, and (offset, nonce).
type Item = (usize, (u64, u64));

impl Front {
    /// One result per handle, in request order: each exactly what the single request would have answered.
    pub async fn settle(&self, params: SettleParams) -> OpResult<Vec<OpResult<()>>> {
        let engine = self.engine();
        let topic = engine.topic(&params.topic)?;
        let count = topic.partition_count() as u64;
        if let [(
            _,
            Ok(ReceiptHandle {
                partition: p,
                offset: o,
                nonce: n,
            }),
        )] = params.handles[..]
        {
            if p < count {
                // One handle (every version 1 settle): no grouping by partition, no lists of jobs and indexes.
                let partition = p as u32;
                let request = Request::Settle(Settle {
                    topic: params.topic,
                    topic_id: topic.id(),
                    group: params.group,
                    partition,
                    items: vec![(o, n)],
                    op: params.op,
                    dead_lettered: false,
                });
                let reply = self.router().call(topic.location(partition), request).await;
                return Ok(vec![match reply {
                    Ok(Reply::Settled(settled)) => settled
                        .results
                        .into_iter()
                        .next()
                        .expect("a settle of one handle has one result")
                        .map_err(OpError::from),
                    Ok(other) => unreachable!("a settle answered {other:?}"),
                    Err(e) => Err(e),
                }]);
            }
        }
        let mut results: Vec<OpResult<()>> = Vec::with_capacity(params.handles.len());
        // partition -> (index in the request, (offset, nonce))
        let mut by_partition: BTreeMap<u32, Vec<Item>> = BTreeMap::new();
        for (i, (_, parsed)) in params.handles.iter().enumerate() {
            results.push(Ok(()));
            match parsed {
                Err(e) => results[i] = Err(e.clone()),
                Ok(h) if h.partition >= count => {
                    results[i] = Err(EngineError::PartitionNotFound {
                        topic: params.topic.clone(),
                        partition: h.partition,
                    }
                    .into())
                }
                Ok(h) => by_partition
                    .entry(h.partition as u32)
                    .or_default()
                    .push((i, (h.offset, h.nonce))),
            }
        }
        let mut jobs: Vec<_> = by_partition
            .into_iter()
            .map(|(partition, items)| {
                let (indexes, items): (Vec<usize>, Vec<(u64, u64)>) = items.into_iter().unzip();
                let request = Request::Settle(Settle {
                    topic: params.topic.clone(),
                    topic_id: topic.id(),
                    group: params.group.clone(),
                    partition,
                    items,
                    op: params.op,
                    dead_lettered: false,
                });
                (indexes, topic.location(partition), request)
            })
            .collect();
        // One partition (every single-handle settle) is called in place: a future moved into a list is copied.
        let replies = if jobs.len() == 1 {
            let (indexes, location, request) = jobs.pop().expect("one job");
            vec![(indexes, self.router().call(location, request).await)]
        } else {
            let calls = jobs
                .into_iter()
                .map(|(indexes, location, request)| {
                    let router = self.router().clone();
                    async move { (indexes, router.call(location, request).await) }
                })
                .collect();
            join_all(calls).await
        };
        for (indexes, reply) in replies {
            match reply {
                Ok(Reply::Settled(settled)) => {
                    // A peer's reply was checked for its length (`validate::check_reply`); this core's own owners
                    // answer one result per handle.
                    assert_eq!(indexes.len(), settled.results.len(), "a settle's results");
                    for (i, r) in indexes.into_iter().zip(settled.results) {
                        results[i] = r.map_err(OpError::from);
                    }
                }
                Ok(other) => unreachable!("a settle answered {other:?}"),
                Err(e) => {
                    for i in indexes {
                        results[i] = Err(e.clone());
                    }
                }
            }
        }
        Ok(results)
    }
}
