//! Topic records in etcd: creation with its placement (one txn, only if absent), changes of settings (compare and
//! swap on the key's mod revision, retried), deletion, and direct reads. Called on core 0.

use super::keys::{
    decode_partition, decode_topic, encode_topic, PartitionState, TopicRecord, MAX_REPLICAS,
};
use super::placement::{followers, spread};
use super::snapshot::Snapshot;
use super::{ranges, MetaError, Metastore, MAX_TXN_ATTEMPTS};
use crate::cluster::etcd::{
    prefix_range_end, Compare, CompareOp, CompareTarget, KeyValue, TxnOp, TxnOpResponse,
};
use crate::engine::placement::NodeIndex;
use crate::engine::topic::{validate_name, TopicConfig, MAX_PARTITIONS};
use tracing::{info, warn};

fn check_name(name: &str) -> Result<(), MetaError> {
    validate_name(name).map_err(|e| MetaError::Invalid(format!("topic {e}")))
}

/// Reads every key under `prefix` in a transaction.
fn range_prefix(prefix: Vec<u8>) -> TxnOp {
    let range_end = prefix_range_end(&prefix);
    TxnOp::Range {
        key: prefix,
        range_end: Some(range_end),
    }
}

/// Deletes every key under `prefix` in a transaction.
fn delete_prefix(prefix: Vec<u8>) -> TxnOp {
    let range_end = prefix_range_end(&prefix);
    TxnOp::Delete {
        key: prefix,
        range_end: Some(range_end),
    }
}

impl Metastore {
    /// A topic as etcd has it now (the replica may lag behind this).
    pub async fn topic(&self, name: &str) -> Result<Option<TopicRecord>, MetaError> {
        check_name(name)?;
        let read = self.etcd.range(&self.keys.topic(name), None).await?;
        read.kvs
            .first()
            .map(|kv| decode_topic(name, kv))
            .transpose()
    }

    /// Creates a topic with `config.partitions` partitions spread over the nodes alive now (see
    /// [`spread`](super::spread)). Returns `(true, record)`, or `(false, existing)` when a topic of that name
    /// exists, whatever its settings (the caller compares, as the single node's PUT does). The record's
    /// `config.id` is new; the `id` passed in is ignored.
    pub async fn create_topic(
        &self,
        config: TopicConfig,
    ) -> Result<(bool, TopicRecord), MetaError> {
        check_name(&config.name)?;
        if config.partitions == 0 || config.partitions > MAX_PARTITIONS {
            return Err(MetaError::Invalid(format!(
                "partitions must be 1 to {MAX_PARTITIONS}"
            )));
        }
        let key = self.keys.topic(&config.name);
        for _ in 0..MAX_TXN_ATTEMPTS {
            // The topic and the nodes, at one revision.
            let read = self
                .etcd
                .txn(
                    &[],
                    &[
                        TxnOp::get(key.clone()),
                        range_prefix(self.keys.members()),
                        range_prefix(self.keys.alives()),
                        range_prefix(self.keys.drains()),
                    ],
                    &[],
                )
                .await?;
            let r = ranges(&read, 4)?;
            if let Some(kv) = r[0].kvs.first() {
                return Ok((false, decode_topic(&config.name, kv)?));
            }
            let nodes = Snapshot::from_kvs(
                &self.keys,
                read.revision,
                r[1].kvs.iter().chain(&r[2].kvs).chain(&r[3].kvs),
            );
            // A node being drained or removed takes no new partition.
            let live: Vec<_> = nodes
                .live_nodes()
                .into_iter()
                .filter(|&n| nodes.node_by_index(n).is_some_and(|n| n.drain.is_none()))
                .collect();
            let placement = spread(&config.name, config.partitions, &live);
            if placement.is_empty() {
                return Err(MetaError::NoLiveNodes);
            }
            if config.replicas as usize > live.len() {
                return Err(MetaError::Invalid(format!(
                    "replicas={} but {} nodes are live",
                    config.replicas,
                    live.len()
                )));
            }
            if config.replicas != 1 && !self.replication_preview {
                return Err(MetaError::Invalid(format!(
                    "replicas={}: replication is not finished in this build (docs/replication.md); use replicas=1, \
                     or start every node with --replication-preview to try it",
                    config.replicas
                )));
            }
            let followers = followers(&placement, &live, config.replicas as usize);
            let value = encode_topic(&config, &placement, &followers);
            // Partition keys left by a deleted topic of this name (a deletion before they were deleted with it)
            // go with the new topic's creation.
            let t = self
                .etcd
                .txn(
                    &[Compare::absent(key.clone())],
                    &[
                        TxnOp::put(key.clone(), value.clone(), None),
                        delete_prefix(self.keys.partitions_of(&config.name)),
                    ],
                    &[TxnOp::get(key.clone())],
                )
                .await?;
            if t.succeeded {
                // Decoding what was written gives exactly what every replica will hold.
                let written = KeyValue {
                    key,
                    value,
                    create_revision: t.revision,
                    mod_revision: t.revision,
                    version: 1,
                    lease: 0,
                };
                let record = decode_topic(&config.name, &written)?;
                info!(topic = %config.name, id = record.id(), placement = ?record.placement, "metastore: topic created");
                return Ok((true, record));
            }
            // Created by someone else between the read and the write.
            if let Some(kv) = ranges(&t, 1)?[0].kvs.first() {
                return Ok((false, decode_topic(&config.name, kv)?));
            }
        }
        Err(MetaError::Contended("create_topic"))
    }

    /// Changes a topic's settings: `change` edits a copy of the current settings, which is written only if the
    /// topic has not changed since it was read; otherwise it is read again and `change` runs again on the newer
    /// settings, so concurrent changes all land, one after another. `change` may not touch `name`, `id` or
    /// `partitions`. An unchanged result writes nothing. Returns the new record.
    pub async fn change_topic<E: From<MetaError>>(
        &self,
        name: &str,
        mut change: impl FnMut(&mut TopicConfig) -> Result<(), E>,
    ) -> Result<TopicRecord, E> {
        check_name(name)?;
        let key = self.keys.topic(name);
        for _ in 0..MAX_TXN_ATTEMPTS {
            let current = self
                .topic(name)
                .await?
                .ok_or_else(|| MetaError::TopicNotFound(name.to_string()))?;
            let mut config = current.config.clone();
            change(&mut config)?;
            if (&config.name, config.id, config.partitions)
                != (
                    &current.config.name,
                    current.id(),
                    current.config.partitions,
                )
            {
                return Err(MetaError::Invalid(
                    "a topic change may not alter its name, id or partition count".into(),
                )
                .into());
            }
            if config == current.config {
                return Ok(current);
            }
            let value = encode_topic(&config, &current.placement, &current.followers);
            let t = self
                .etcd
                .txn(
                    &[Compare::mod_revision_is(key.clone(), current.mod_revision)],
                    &[TxnOp::put(key.clone(), value.clone(), None)],
                    &[],
                )
                .await
                .map_err(MetaError::from)?;
            if t.succeeded {
                info!(topic = %name, revision = t.revision, "metastore: topic settings changed");
                let written = KeyValue {
                    key,
                    value,
                    create_revision: current.id() as i64,
                    mod_revision: t.revision,
                    version: 0,
                    lease: 0,
                };
                return Ok(decode_topic(name, &written)?);
            }
        }
        Err(MetaError::Contended("change_topic").into())
    }

    /// Deletes a topic, and its partition keys with it. Returns what was deleted (`None`: there was no such topic,
    /// or its record did not decode).
    pub async fn delete_topic(&self, name: &str) -> Result<Option<TopicRecord>, MetaError> {
        check_name(name)?;
        let key = self.keys.topic(name);
        let t = self
            .etcd
            .txn(
                &[],
                &[
                    TxnOp::get(key.clone()),
                    TxnOp::delete(key),
                    delete_prefix(self.keys.partitions_of(name)),
                ],
                &[],
            )
            .await?;
        let deleted = match t.responses.first() {
            Some(TxnOpResponse::Range(r)) => r.kvs.first().cloned(),
            _ => None,
        };
        let Some(kv) = deleted else {
            return Ok(None);
        };
        match decode_topic(name, &kv) {
            Ok(record) => {
                info!(topic = %name, id = record.id(), "metastore: topic deleted");
                Ok(Some(record))
            }
            Err(e) => {
                warn!(error = %e, "metastore: deleted a topic record that did not decode");
                Ok(None)
            }
        }
    }

    /// Gives partition `p` of `topic` a new replica set and leader, at a new epoch (the revision of this write),
    /// only if it is still at `epoch` (its key's mod revision; the topic's id while it has no key) and the topic is
    /// still the one created at `topic.id()`: one leadership per epoch, decided once for everyone, as the election
    /// and the replica moves of the replication plan (`docs/replication.md`) need. Returns the new state, or `None`
    /// when the partition or its topic moved on first (read again and decide again).
    pub async fn set_partition(
        &self,
        topic: &TopicRecord,
        p: u32,
        epoch: u64,
        replicas: &[NodeIndex],
        leader: NodeIndex,
    ) -> Result<Option<PartitionState>, MetaError> {
        self.set_partition_with(topic, p, epoch, replicas, leader, &[])
            .await
    }

    /// [`Metastore::set_partition`] with the replicas that do not vote yet (`learners`: distinct replicas other than
    /// the leader).
    pub async fn set_partition_with(
        &self,
        topic: &TopicRecord,
        p: u32,
        epoch: u64,
        replicas: &[NodeIndex],
        leader: NodeIndex,
        learners: &[NodeIndex],
    ) -> Result<Option<PartitionState>, MetaError> {
        let mut distinct = replicas.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if p >= topic.config.partitions
            || replicas.is_empty()
            || replicas.len() > MAX_REPLICAS
            || distinct.len() != replicas.len()
            || !replicas.contains(&leader)
        {
            return Err(MetaError::Invalid(format!(
                "partition {p} of '{}': {replicas:?} led by {leader} (1 to {MAX_REPLICAS} distinct replicas, the \
                 leader one of them)",
                topic.name()
            )));
        }
        super::keys::check_learners(replicas, leader, learners)
            .map_err(|e| MetaError::Invalid(format!("partition {p} of '{}': {e}", topic.name())))?;
        let key = self.keys.partition(topic.name(), p);
        let unchanged = if epoch == topic.id() {
            Compare::absent(key.clone())
        } else {
            Compare::mod_revision_is(key.clone(), epoch as i64)
        };
        let same_topic = Compare::new(
            self.keys.topic(topic.name()),
            CompareOp::Equal,
            CompareTarget::CreateRevision(topic.id() as i64),
        );
        let value = super::keys::encode_partition_with(topic.id(), replicas, leader, learners);
        let t = self
            .etcd
            .txn(
                &[same_topic, unchanged],
                &[TxnOp::put(key.clone(), value.clone(), None)],
                &[],
            )
            .await?;
        if !t.succeeded {
            return Ok(None);
        }
        let written = KeyValue {
            key,
            value,
            create_revision: t.revision,
            mod_revision: t.revision,
            version: 0,
            lease: 0,
        };
        let mut record = decode_partition(&written)?;
        // As a snapshot has it: with the replicas the creation placed.
        record.state.placed = topic.initial_states().swap_remove(p as usize).replicas;
        info!(topic = %topic.name(), partition = p, replicas = ?record.state.replicas, leader, epoch = record.state.epoch, "metastore: partition moved");
        Ok(Some(record.state))
    }
}
