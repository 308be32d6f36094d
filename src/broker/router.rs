//! Routing: what the HTTP edge calls. Each operation runs on this core when it owns the partition, or goes to the
//! owner over the mesh. Queue-style consumes try this core's partitions, then the other cores', then park.

use super::command::Command;
use super::core::Core;
use super::error::{BrokerError, BrokerResult};
use super::metrics::CoreStats;
use super::topic::{owner, partition_for_key, TopicConfig};
use crate::partition::{now_ms, Delivery, PartitionInfo, SettleOp, Take};
use crate::storage::log::Record;
use bytes::Bytes;
use std::rc::Rc;
use std::time::Duration;

/// Where a produce should go.
pub enum Target<'a> {
    Partition(u64),
    Key(&'a [u8]),
    Any,
}

impl Core {
    pub async fn create(self: &Rc<Self>, config: TopicConfig) -> BrokerResult<(bool, TopicConfig)> {
        if self.id == 0 {
            self.create_topic(config).await
        } else {
            self.mesh
                .call(0, |reply| Command::CreateTopic { config, reply })
                .await
        }
    }

    pub async fn delete(self: &Rc<Self>, name: &str) -> BrokerResult<()> {
        let name = name.to_string();
        if self.id == 0 {
            self.delete_topic(name).await
        } else {
            self.mesh
                .call(0, |reply| Command::DeleteTopic { name, reply })
                .await
        }
    }

    /// Every partition of the topic, from every core, in partition order.
    pub async fn describe(
        self: &Rc<Self>,
        topic: &str,
    ) -> BrokerResult<(TopicConfig, Vec<PartitionInfo>)> {
        let config = self.topic(topic)?.config.clone();
        let mut all = self.local_describe(topic).await?;
        for core in self.others() {
            let topic = topic.to_string();
            all.extend(
                self.mesh
                    .call(core, |reply| Command::Describe { topic, reply })
                    .await?,
            );
        }
        all.sort_by_key(|p| p.partition);
        Ok((config, all))
    }

    /// Every core's counters, this core first.
    pub async fn stats(self: &Rc<Self>) -> BrokerResult<Vec<CoreStats>> {
        let mut all = vec![self.local_stats().await];
        for core in self.others() {
            all.push(
                self.mesh
                    .call(core, |reply| Command::Stats { reply })
                    .await?,
            );
        }
        all.sort_by_key(|s| s.core);
        Ok(all)
    }

    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        (1..self.cores).map(move |i| (self.id + i) % self.cores)
    }

    fn check_partition(topic: &str, config: &TopicConfig, partition: u64) -> BrokerResult<u32> {
        if partition < config.partitions as u64 {
            Ok(partition as u32)
        } else {
            Err(BrokerError::PartitionNotFound {
                topic: topic.to_string(),
                partition,
            })
        }
    }

    /// Appends a message; returns (partition, offset) once durable.
    pub async fn produce(
        self: &Rc<Self>,
        topic: &str,
        target: Target<'_>,
        payload: Bytes,
    ) -> BrokerResult<(u32, u64)> {
        let t = self.topic(topic)?;
        if payload.len() > self.config.max_message_bytes {
            return Err(BrokerError::MessageTooLarge {
                limit: self.config.max_message_bytes,
            });
        }
        let partition = match target {
            Target::Partition(p) => Self::check_partition(topic, &t.config, p)?,
            Target::Key(key) => partition_for_key(key, t.config.partitions),
            Target::Any if !t.owned.is_empty() => {
                let i = t.cursor.get();
                t.cursor.set(i.wrapping_add(1));
                t.owned[i % t.owned.len()]
            }
            Target::Any => {
                let i = t.cursor.get();
                t.cursor.set(i.wrapping_add(1));
                (i % t.config.partitions as usize) as u32
            }
        };
        let core = owner(topic, partition, self.cores);
        let offset = if core == self.id {
            self.local_produce(topic, partition, payload).await?
        } else {
            let topic = topic.to_string();
            self.mesh
                .call(core, |reply| Command::Produce {
                    topic,
                    partition,
                    payload,
                    reply,
                })
                .await?
        };
        Ok((partition, offset))
    }

    /// Queue-style consume: this core's partitions, then the others', then park up to `wait_ms` on the topic's
    /// wake signal (commits, nacks and expiries on any core wake it). None means 204.
    pub async fn consume(
        self: &Rc<Self>,
        topic: &str,
        wait_ms: u64,
        visibility_ms: Option<u64>,
    ) -> BrokerResult<Option<Delivery>> {
        let deadline = now_ms() + wait_ms;
        loop {
            let t = self.topic(topic)?;
            let parking = wait_ms > 0 && !self.stopping.get();
            // Listen before looking, so a wake between the look and the park is not lost.
            let listener = parking.then(|| t.signal.event.listen());
            // 204 at once only when every partition of the topic is at its in-flight cap; a partition below its
            // cap may still receive something, so then the consumer parks (acks on a capped partition wake it too).
            let mut all_at_cap = true;
            let mut unavailable = false;
            match self.local_take(topic, visibility_ms).await? {
                Take::Leased(d) => return Ok(Some(d)),
                Take::AtCap | Take::NoPartitions => {}
                Take::Unavailable => unavailable = true,
                Take::Empty => all_at_cap = false,
            }
            for core in self.others() {
                if parking {
                    // Sent before the TryConsume on the same FIFO channel: the owner cannot miss a wake.
                    self.register_interest(&t, core);
                }
                let name = topic.to_string();
                let outcome = self
                    .mesh
                    .call(core, |reply| Command::TryConsume {
                        topic: name,
                        visibility_ms,
                        reply,
                    })
                    .await;
                match outcome {
                    Ok(Take::Leased(d)) => return Ok(Some(d)),
                    Ok(Take::AtCap) | Ok(Take::NoPartitions) => {}
                    Ok(Take::Unavailable) => unavailable = true,
                    Ok(Take::Empty) | Err(BrokerError::Overloaded) => all_at_cap = false,
                    Err(e) => return Err(e),
                }
            }
            if unavailable {
                // A partition with something to deliver could not be served: say so (503, retry) rather than park.
                return Err(BrokerError::PartitionUnavailable(format!(
                    "a partition of '{topic}' could not be read; see the server log"
                )));
            }
            let now = now_ms();
            let Some(listener) = listener else {
                return Ok(None);
            };
            if all_at_cap || now >= deadline {
                return Ok(None);
            }
            let _ = glommio::timer::timeout(Duration::from_millis(deadline - now), async {
                listener.await;
                Ok(())
            })
            .await;
            if t.deleted.get() {
                return Err(BrokerError::TopicNotFound(topic.to_string()));
            }
            if now_ms() >= deadline || self.stopping.get() {
                return Ok(None);
            }
        }
    }

    /// Ack, nack or extend, at the partition's owner.
    pub async fn settle(
        self: &Rc<Self>,
        topic: &str,
        partition: u64,
        offset: u64,
        nonce: u64,
        op: SettleOp,
    ) -> BrokerResult<()> {
        let t = self.topic(topic)?;
        let partition = Self::check_partition(topic, &t.config, partition)?;
        let core = owner(topic, partition, self.cores);
        if core == self.id {
            self.local_settle(topic, partition, offset, nonce, op).await
        } else {
            let topic = topic.to_string();
            self.mesh
                .call(core, |reply| Command::Settle {
                    topic,
                    partition,
                    offset,
                    nonce,
                    op,
                    reply,
                })
                .await
        }
    }

    /// Replay: a read at the partition's owner that touches no queue state.
    pub async fn replay(
        self: &Rc<Self>,
        topic: &str,
        partition: u64,
        offset: u64,
        wait_ms: u64,
    ) -> BrokerResult<Option<Record>> {
        let t = self.topic(topic)?;
        let partition = Self::check_partition(topic, &t.config, partition)?;
        let core = owner(topic, partition, self.cores);
        if core == self.id {
            self.local_replay(topic, partition, offset, wait_ms).await
        } else {
            let topic = topic.to_string();
            self.mesh
                .call(core, |reply| Command::Replay {
                    topic,
                    partition,
                    offset,
                    wait_ms,
                    reply,
                })
                .await
        }
    }
}
