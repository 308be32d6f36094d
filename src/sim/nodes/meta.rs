//! The simulated etcd: the cluster's keys in memory, with etcd's revisions, written and decoded by the metastore's
//! own encoders and `Snapshot`, so that the nodes' elections (`cluster::election::candidacies`), views
//! (`cluster::node::view_of`) and topics (`as_engine`) come from the code the real nodes run. What etcd's leases do
//! (an `alive/<id>` key that goes when its session is not refreshed for a TTL) the driver does by hand, on the
//! simulation's clock. Also here: the `Metadata` a simulated node's core 0 asks (the hand-overs and moves of its
//! fencing rounds and CheckQuorum), which fails while the node is cut from etcd.

use crate::cluster::etcd::KeyValue;
use crate::cluster::metastore::{
    Keys, MemberRecord, PartitionState, Snapshot, TopicRecord, MAX_REPLICAS,
};
use crate::engine::cluster::{ChangeFn, DrainAction, LocalFuture, Metadata, Placed};
use crate::engine::placement::NodeIndex;
use crate::engine::topic::TopicConfig;
use crate::engine::{EngineError, EngineResult};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

/// The keys of one cluster and etcd's revision counter.
pub(super) struct SimEtcd {
    pub(super) keys: Keys,
    kvs: RefCell<BTreeMap<Vec<u8>, KeyValue>>,
    revision: Cell<i64>,
    next_lease: Cell<i64>,
    /// Nodes cut from etcd now: their calls fail.
    pub(super) cut: RefCell<BTreeSet<NodeIndex>>,
    /// Partition keys written (elections, hand-overs, moves).
    pub(super) moves: Cell<u64>,
    /// What was written, for the driver's event log.
    pub(super) notes: RefCell<Vec<String>>,
    /// Partition keys written since the oracle last looked: (partition, epoch), in order.
    pub(super) leaderships: RefCell<Vec<(u32, i64)>>,
    /// The last snapshot decoded (the driver and the oracle ask for one several times a step).
    decoded: RefCell<Option<Arc<Snapshot>>>,
}

impl SimEtcd {
    pub(super) fn new() -> Rc<SimEtcd> {
        Rc::new(SimEtcd {
            keys: Keys::for_cluster("sim").expect("keys"),
            kvs: RefCell::new(BTreeMap::new()),
            revision: Cell::new(1),
            next_lease: Cell::new(0x1000),
            cut: RefCell::new(BTreeSet::new()),
            moves: Cell::new(0),
            notes: RefCell::new(Vec::new()),
            leaderships: RefCell::new(Vec::new()),
            decoded: RefCell::new(None),
        })
    }

    pub(super) fn revision(&self) -> i64 {
        self.revision.get()
    }

    /// Writes `key` at a new revision (etcd's put); returns the revision.
    pub(super) fn put(&self, key: Vec<u8>, value: Vec<u8>, lease: i64) -> i64 {
        let revision = self.revision.get() + 1;
        self.revision.set(revision);
        let mut kvs = self.kvs.borrow_mut();
        let (create_revision, version) = kvs
            .get(&key)
            .map_or((revision, 1), |kv| (kv.create_revision, kv.version + 1));
        kvs.insert(
            key.clone(),
            KeyValue {
                key,
                value,
                create_revision,
                mod_revision: revision,
                version,
                lease,
            },
        );
        revision
    }

    pub(super) fn delete(&self, key: &[u8]) {
        if self.kvs.borrow_mut().remove(key).is_some() {
            self.revision.set(self.revision.get() + 1);
        }
    }

    fn get(&self, key: &[u8]) -> Option<KeyValue> {
        self.kvs.borrow().get(key).cloned()
    }

    /// Everything, decoded as a node's replica would have it at this revision.
    pub(super) fn snapshot(&self) -> Arc<Snapshot> {
        if let Some(s) = self
            .decoded
            .borrow()
            .as_ref()
            .filter(|s| s.revision == self.revision.get())
        {
            return s.clone();
        }
        let kvs = self.kvs.borrow();
        let s = Arc::new(Snapshot::from_kvs(
            &self.keys,
            self.revision.get(),
            kvs.values(),
        ));
        *self.decoded.borrow_mut() = Some(s.clone());
        s
    }

    /// A node's registration: its member record and a new session (an `alive/` key under a new lease).
    pub(super) fn register(
        &self,
        index: NodeIndex,
        cores: u32,
        incarnation: &str,
        now_ms: u64,
    ) -> i64 {
        let id = node_id(index);
        let member = MemberRecord {
            id: id.clone(),
            index,
            advertise: format!("sim-{index}:7070"),
            peer_addr: format!("sim-{index}:7170"),
            cores,
            incarnation: incarnation.to_string(),
        };
        self.put(
            self.keys.member(&id),
            crate::cluster::metastore::encode_member(&member),
            0,
        );
        let lease = self.next_lease.get();
        self.next_lease.set(lease + 1);
        self.put(
            self.keys.alive(&id),
            crate::cluster::metastore::encode_alive(lease, now_ms),
            lease,
        );
        lease
    }

    /// The session of node `index` lapsed (its lease expired).
    pub(super) fn expire(&self, index: NodeIndex) {
        self.delete(&self.keys.alive(&node_id(index)));
    }

    /// Creates a topic with each partition's replicas as given (the first leads), as `create_topic`'s transaction
    /// would: its id is the revision of the write.
    pub(super) fn create_topic(&self, config: &TopicConfig, replicas: &[Vec<NodeIndex>]) -> u64 {
        let placement: Vec<NodeIndex> = replicas.iter().map(|r| r[0]).collect();
        let followers: Vec<Vec<NodeIndex>> = replicas.iter().map(|r| r[1..].to_vec()).collect();
        let value = crate::cluster::metastore::encode_topic(config, &placement, &followers);
        self.put(self.keys.topic(&config.name), value, 0) as u64
    }

    /// `Metastore::set_partition_with`'s transaction: partition `p` of `topic` gets `replicas`, `leader` and
    /// `learners` at a new epoch if it is still at `epoch` and the topic is still the one created at its id.
    /// Returns whether it was written.
    pub(super) fn set_partition(
        &self,
        topic: &TopicRecord,
        p: u32,
        epoch: u64,
        replicas: &[NodeIndex],
        leader: NodeIndex,
        learners: &[NodeIndex],
    ) -> bool {
        let mut distinct = replicas.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(
            p < topic.config.partitions
                && !replicas.is_empty()
                && replicas.len() <= MAX_REPLICAS
                && distinct.len() == replicas.len()
                && replicas.contains(&leader)
                && crate::cluster::metastore::check_learners(replicas, leader, learners)
                    .is_ok(),
            "an invalid partition key asked of the metastore: {replicas:?} led by {leader}, learners {learners:?}"
        );
        let same_topic = self
            .get(&self.keys.topic(topic.name()))
            .is_some_and(|kv| kv.create_revision as u64 == topic.id());
        let key = self.keys.partition(topic.name(), p);
        let unchanged = match self.get(&key) {
            None => epoch == topic.id(),
            Some(kv) => kv.mod_revision as u64 == epoch,
        };
        if !same_topic || !unchanged {
            return false;
        }
        let value = crate::cluster::metastore::encode_partition_with(
            topic.id(),
            replicas,
            leader,
            learners,
        );
        let revision = self.put(key, value, 0);
        self.moves.set(self.moves.get() + 1);
        self.leaderships.borrow_mut().push((p, revision));
        self.notes.borrow_mut().push(format!(
            "etcd: partition {p} at epoch {revision} (was {epoch}): led by {leader} of {replicas:?}, learners {learners:?}"
        ));
        true
    }
}

/// A simulated node's id.
pub(super) fn node_id(index: NodeIndex) -> String {
    format!("n{index}")
}

/// What a simulated node's core 0 asks of the metastore: it reads its own (possibly stale) snapshot, as the real
/// one reads its replica, and writes through the simulated etcd unless the node is cut from it.
pub(super) struct SimMetadata {
    pub(super) etcd: Rc<SimEtcd>,
    pub(super) me: NodeIndex,
    /// The snapshot this node last applied.
    pub(super) seen: Rc<RefCell<Arc<Snapshot>>>,
}

impl SimMetadata {
    fn reachable(&self) -> EngineResult<()> {
        if self.etcd.cut.borrow().contains(&self.me) {
            return Err(EngineError::ClusterUnavailable(
                "the simulated etcd is out of this node's reach".into(),
            ));
        }
        Ok(())
    }
}

impl Metadata for SimMetadata {
    fn create_topic(&self, _config: TopicConfig) -> LocalFuture<'_, EngineResult<(bool, Placed)>> {
        Box::pin(async {
            Err(EngineError::InvalidSetting(
                "the node simulation creates its topics itself".into(),
            ))
        })
    }

    fn change_topic(
        &self,
        _name: String,
        _change: ChangeFn,
    ) -> LocalFuture<'_, EngineResult<Placed>> {
        Box::pin(async {
            Err(EngineError::InvalidSetting(
                "the node simulation changes no topic".into(),
            ))
        })
    }

    fn delete_topic(&self, _name: String) -> LocalFuture<'_, EngineResult<()>> {
        Box::pin(async {
            Err(EngineError::InvalidSetting(
                "the node simulation deletes no topic".into(),
            ))
        })
    }

    fn lookup_topic(
        &self,
        name: String,
        _fresh: bool,
    ) -> LocalFuture<'_, EngineResult<Option<Placed>>> {
        Box::pin(async move {
            self.reachable()?;
            let snapshot = self.seen.borrow().clone();
            Ok(snapshot
                .topic(&name)
                .map(|record| crate::cluster::node::as_engine(record, &snapshot)))
        })
    }

    fn partitions(&self, name: &str) -> Option<(u64, Vec<PartitionState>)> {
        let snapshot = self.seen.borrow().clone();
        let record = snapshot.topic(name)?;
        Some((record.id(), record.partitions.clone()))
    }

    fn move_leader(
        &self,
        r: crate::ops::replicate::MoveLeader,
    ) -> LocalFuture<'_, EngineResult<()>> {
        Box::pin(async move {
            self.reachable()?;
            // As `EtcdMetadata::move_leader`: from this node's snapshot, the same decision.
            let snapshot = self.seen.borrow().clone();
            if let Some((record, replicas, learners)) =
                crate::cluster::node::move_to_write(&snapshot, &r)?
            {
                self.etcd.set_partition(
                    record,
                    r.partition,
                    r.epoch,
                    &replicas,
                    r.leader,
                    &learners,
                );
            }
            Ok(())
        })
    }

    fn drain_node(&self, _id: String, _action: DrainAction) -> LocalFuture<'_, EngineResult<()>> {
        Box::pin(async {
            Err(EngineError::InvalidSetting(
                "the node simulation drains no node".into(),
            ))
        })
    }
}
