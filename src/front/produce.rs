//! Produce at the front: each record's partition (its own, its key's, else one round-robin partition for all the
//! keyless records of the request, preferring this core's), one append per partition at its owner (in parallel),
//! results merged in request order.

use super::Front;
use crate::engine::topic::partition_for_key;
use crate::engine::EngineError;
use crate::join::join_all;
use crate::ops::produce::{Produce, ProduceParams, Target};
use crate::ops::{OpError, OpResult, Reply, Request};
use bytes::Bytes;
use std::collections::BTreeMap;

/// A record's payload as the log stores it, and whether it starts with a meta block.
type Payload = (Bytes, bool);

/// (partition, offset) per record, in request order, or why the record was not written.
pub type ProduceResults = Vec<OpResult<(u32, u64)>>;

impl Front {
    /// A client's produce: the topic's rules (`ops::produce::apply_topic_rules`: its message size limit, its
    /// delay, FIFO), then [`Front::produce`]. Moves between topics (dead letters, redrives) skip the rules: a moved
    /// record keeps its message group, which only a FIFO topic reads (a FIFO topic's record without one is
    /// delivered outside any group's order), and is not delayed again.
    pub async fn produce_from_client(&self, mut params: ProduceParams) -> OpResult<ProduceResults> {
        let topic = self.engine().topic(&params.topic)?;
        let clock = self.engine().clock().clone();
        crate::ops::produce::apply_topic_rules(&topic.config(), &mut params.records, || {
            clock.wall_ms()
        })?;
        self.produce(params).await
    }

    /// Appends the records; each partition's share is durable under the fsync policy before its results are known.
    /// A partition out of range fails the whole request before anything is written.
    pub async fn produce(&self, params: ProduceParams) -> OpResult<ProduceResults> {
        let engine = self.engine();
        let topic = engine.topic(&params.topic)?;
        let count = topic.partition_count();
        let mut any: Option<u32> = None;
        let mut pick_any = || {
            *any.get_or_insert_with(|| {
                let owned = topic.owned();
                let i = topic.next_cursor();
                if !owned.is_empty() {
                    return owned[i % owned.len()];
                }
                // Cluster mode: a partition whose node is alive, round robin from the cursor.
                let locations = topic.locations();
                (0..count as usize)
                    .map(|k| (i + k) % count as usize)
                    .find(|&p| engine.node_alive(locations[p].node))
                    .unwrap_or(i % count as usize) as u32
            })
        };
        let mut place = |target: &Target| -> OpResult<u32> {
            Ok(match target {
                Target::Partition(p) if *p < count as u64 => *p as u32,
                Target::Partition(p) => {
                    return Err(EngineError::PartitionNotFound {
                        topic: params.topic.clone(),
                        partition: *p,
                    }
                    .into())
                }
                Target::Key(key) => partition_for_key(key.as_bytes(), count),
                Target::Any => pick_any(),
            })
        };
        let topic_id = topic.id();
        if params.records.len() == 1 {
            // One record (every version 1 produce): no grouping by partition, no lists of jobs and indexes.
            let record = params.records.into_iter().next().expect("one record");
            let partition = place(&record.target)?;
            let (payload, meta) = record.into_payload();
            let request = Request::Produce(Produce {
                topic: params.topic,
                topic_id,
                partition,
                records: vec![payload],
                meta: if meta { vec![true] } else { Vec::new() },
            });
            let reply = self.router().call(topic.location(partition), request).await;
            return Ok(vec![match reply {
                Ok(Reply::Produced(produced)) => Ok((
                    partition,
                    produced.offset_of(0).unwrap_or(produced.first_offset),
                )),
                Ok(other) => unreachable!("a produce answered {other:?}"),
                Err(e) => Err(e),
            }]);
        }
        // Per partition: each record's index in the request, its payload, and whether it has a meta block.
        let mut by_partition: BTreeMap<u32, Vec<(usize, Payload)>> = BTreeMap::new();
        for (i, record) in params.records.into_iter().enumerate() {
            let p = place(&record.target)?;
            by_partition
                .entry(p)
                .or_default()
                .push((i, record.into_payload()));
        }
        let total: usize = by_partition.values().map(Vec::len).sum();
        let mut jobs: Vec<_> = by_partition
            .into_iter()
            .map(|(partition, records)| {
                let (indexes, payloads): (Vec<usize>, Vec<Payload>) = records.into_iter().unzip();
                let meta = if payloads.iter().any(|(_, m)| *m) {
                    payloads.iter().map(|(_, m)| *m).collect()
                } else {
                    Vec::new()
                };
                let request = Request::Produce(Produce {
                    topic: params.topic.clone(),
                    topic_id,
                    partition,
                    records: payloads.into_iter().map(|(p, _)| p).collect(),
                    meta,
                });
                (partition, indexes, topic.location(partition), request)
            })
            .collect();
        // One partition (every single-message produce) is called in place: a future moved into a list is copied.
        let replies = if jobs.len() == 1 {
            let (partition, indexes, location, request) = jobs.pop().expect("one job");
            vec![(
                partition,
                indexes,
                self.router().call(location, request).await,
            )]
        } else {
            let calls = jobs
                .into_iter()
                .map(|(partition, indexes, location, request)| {
                    let router = self.router().clone();
                    async move {
                        let reply = router.call(location, request).await;
                        (partition, indexes, reply)
                    }
                })
                .collect();
            join_all(calls).await
        };
        let mut results: ProduceResults = (0..total)
            .map(|_| Err(OpError::Engine(EngineError::ShuttingDown)))
            .collect();
        for (partition, indexes, reply) in replies {
            match reply {
                Ok(Reply::Produced(produced)) => {
                    for (k, i) in indexes.into_iter().enumerate() {
                        results[i] = match produced.offset_of(k) {
                            Some(offset) => Ok((partition, offset)),
                            None => Err(OpError::Engine(EngineError::ClusterUnavailable(
                                "the owner's answer had no offset for this record".into(),
                            ))),
                        };
                    }
                }
                Ok(other) => unreachable!("a produce answered {other:?}"),
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
