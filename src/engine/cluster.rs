//! What a core knows of the cluster (cluster mode only): this node's index, the node table with liveness, whether
//! this node is fenced (its metastore session lapsed), and, on core 0, the metadata service topic changes go
//! through. The cluster layer (`crate::cluster`) implements [`Metadata`] over etcd and feeds the table; the engine
//! only reads it, so it never imports the layer above it. Every core holds its own copy, changed by admin steps.

use super::placement::{Location, NodeIndex, PartitionState};
use super::topic::TopicConfig;
use super::{AdminStep, Engine, EngineResult};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

/// Names the metastore was asked about and did not have, remembered this long (core 0)...
const MISSING_TTL_MS: u64 = 1000;
/// ...up to this many.
const MISSING_CACHE: usize = 4096;

/// A node as every core sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    pub index: NodeIndex,
    pub id: String,
    /// Client HTTP address (`--advertise`).
    pub advertise: String,
    /// Node RPC address (`--peer-listen`).
    pub peer_addr: String,
    pub alive: bool,
    /// Partitions it leads, and partitions it holds a replica of without leading (`GET /cluster`).
    #[serde(default)]
    pub leads: u64,
    #[serde(default)]
    pub follows: u64,
    /// Its core count (where its follower replicas are: `placement::follower_core`).
    #[serde(default)]
    pub cores: u32,
    /// Its metastore session (the lease id; 0 while dead): a new one means it restarted or registered again, so a
    /// leader asks it afresh where its replicas stand.
    #[serde(default)]
    pub session: i64,
    /// Its replicas move to other nodes (`POST /cluster/nodes/ID/drain`), and (`removed`) it is gone for good
    /// (`DELETE /cluster/nodes/ID`).
    #[serde(default)]
    pub draining: bool,
    #[serde(default)]
    pub removed: bool,
}

/// The cluster view a core holds, replaced whole by an admin step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// This node's index.
    pub node: NodeIndex,
    pub nodes: Vec<NodeEntry>,
    /// The metastore session lapsed: this node does not serve its partitions until it registers again.
    pub fenced: bool,
    /// Topics of the cluster this node could not open (over its caps, a failure on some core), retried by core 0.
    #[serde(default)]
    pub unopened: Vec<Unopened>,
    /// Times a topic of the cluster failed to open here since this node started (a `/metrics` counter).
    #[serde(default)]
    pub open_failures: u64,
}

/// A topic of the cluster this node has not opened, and why (`GET /cluster`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unopened {
    pub topic: String,
    pub reason: String,
    /// Attempts so far.
    pub attempts: u32,
}

/// A topic's settings, where each of its partitions lives (its leader), and each partition's replicas, leader and
/// epoch.
pub type Placed = (TopicConfig, Vec<Location>, Vec<PartitionState>);

pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// A settings change applied inside the metastore's compare-and-set loop (it may run more than once).
pub type ChangeFn = Box<dyn FnMut(&mut TopicConfig) -> EngineResult<()>>;

/// The cluster's metadata service as core 0 uses it: topic creation, changes and deletion decided once for every
/// node. Each answers with the topic as stored (its id, and where its partitions are).
pub trait Metadata {
    /// Creates the topic unless it exists (then returns the existing one, `false`).
    fn create_topic(&self, config: TopicConfig) -> LocalFuture<'_, EngineResult<(bool, Placed)>>;
    /// Changes a topic's settings.
    fn change_topic(&self, name: String, change: ChangeFn)
        -> LocalFuture<'_, EngineResult<Placed>>;
    /// Deletes a topic.
    fn delete_topic(&self, name: String) -> LocalFuture<'_, EngineResult<()>>;
    /// Reads a topic from the replica or, when it does not have it or `fresh` is asked, from the metastore itself
    /// (the replica may lag behind a change made through another node).
    fn lookup_topic(
        &self,
        name: String,
        fresh: bool,
    ) -> LocalFuture<'_, EngineResult<Option<Placed>>>;
    /// A topic's id and each partition's replicas, leader and epoch, from this node's replica (no etcd call).
    fn partitions(&self, name: &str) -> Option<(u64, Vec<PartitionState>)>;
    /// Names `r.leader` leader of its partition at a new epoch if the partition is still at `r.epoch` (Ok either
    /// way: a partition that moved on is someone else's decision).
    fn move_leader(
        &self,
        r: crate::ops::replicate::MoveLeader,
    ) -> LocalFuture<'_, EngineResult<()>>;
    /// Marks node `id` drained, or removed for good (its replicas move to other nodes: `front::mover`), or ends its
    /// drain. A removal is refused while the node holds a session, and is never ended.
    fn drain_node(&self, id: String, action: DrainAction) -> LocalFuture<'_, EngineResult<()>>;
}

/// What `POST /cluster/nodes/ID/drain`, `DELETE /cluster/nodes/ID` and `DELETE /cluster/nodes/ID/drain` ask of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainAction {
    /// Its replicas move to other nodes; it takes no new ones.
    Drain,
    /// It is gone for good: as a drain, and it may not register again under its id.
    Remove,
    /// The drain ends: it takes replicas again (none move back by themselves).
    End,
}

impl Engine {
    /// Cluster mode: core 0's metadata service (set once, before serving).
    pub fn set_metadata(&self, metadata: Rc<dyn Metadata>) {
        *self.metadata.borrow_mut() = Some(metadata);
    }

    pub(crate) fn metadata(&self) -> Option<Rc<dyn Metadata>> {
        self.metadata.borrow().clone()
    }

    /// Whether this node runs in a cluster.
    pub fn clustered(&self) -> bool {
        self.config.cluster.is_some()
    }

    /// The cluster view (default: one node, index 0, when not clustered).
    pub fn cluster_view(&self) -> Rc<ClusterView> {
        self.view.borrow().clone()
    }

    /// Node `index` holds a live session (always true for this node unless fenced, and without a cluster).
    /// Node `index`'s metastore session as this core's view has it (0: dead or unknown; always 0 outside a
    /// cluster).
    pub fn node_session(&self, index: NodeIndex) -> i64 {
        self.view
            .borrow()
            .nodes
            .iter()
            .find(|n| n.index == index)
            .map_or(0, |n| n.session)
    }

    pub fn node_alive(&self, index: NodeIndex) -> bool {
        let view = self.view.borrow();
        if !self.clustered() {
            return true;
        }
        if index == view.node {
            return !view.fenced;
        }
        view.nodes.iter().any(|n| n.index == index && n.alive)
    }

    /// The core count of node `index` (0 when unknown).
    pub fn node_cores(&self, index: NodeIndex) -> u32 {
        if !self.clustered() || index == self.node() {
            return self.cores as u32;
        }
        self.view
            .borrow()
            .nodes
            .iter()
            .find(|n| n.index == index)
            .map_or(0, |n| n.cores)
    }

    /// The id of node `index`, if known.
    pub fn node_id(&self, index: NodeIndex) -> Option<String> {
        self.view
            .borrow()
            .nodes
            .iter()
            .find(|n| n.index == index)
            .map(|n| n.id.clone())
    }

    /// Applies a new cluster view on this core (an admin step).
    pub(crate) fn set_cluster_view(&self, view: ClusterView) {
        self.node.set(view.node);
        *self.view.borrow_mut() = Rc::new(view);
    }

    /// Core 0: a topic this node does not know may exist in the metastore already (created through another node a
    /// moment ago): looks it up there and opens it here. `TopicNotFound` when the metastore does not have it.
    pub async fn lookup_topic(self: &Rc<Self>, name: &str, fresh: bool) -> EngineResult<()> {
        if !fresh && self.topic(name).is_ok() {
            // Known on core 0; the view that brought it (the metastore watch's, applied on every core under the
            // admin permit) may not have reached the core that asked yet: waited out, so that its retry finds it.
            drop(self.admin_permit().await?);
            return Ok(());
        }
        let Some(metadata) = self.metadata() else {
            return Err(super::EngineError::TopicNotFound(name.to_string()));
        };
        // Requests naming topics that do not exist cost at most one metastore read per name and second.
        let now = self.clock.now_ms();
        if !fresh
            && self
                .missing
                .borrow()
                .get(name)
                .is_some_and(|&until| until > now)
        {
            return Err(super::EngineError::TopicNotFound(name.to_string()));
        }
        match metadata.lookup_topic(name.to_string(), fresh).await? {
            Some((config, locations, states)) => {
                self.missing.borrow_mut().remove(name);
                self.learn_topic(config, locations, states).await
            }
            None => {
                let mut missing = self.missing.borrow_mut();
                if missing.len() >= MISSING_CACHE {
                    missing.retain(|_, until| *until > now);
                    if missing.len() >= MISSING_CACHE {
                        missing.clear();
                    }
                }
                missing.insert(name.to_string(), now + MISSING_TTL_MS);
                Err(super::EngineError::TopicNotFound(name.to_string()))
            }
        }
    }

    /// Core 0: applies a cluster view on every core.
    pub async fn publish_cluster_view(self: &Rc<Self>, view: ClusterView) -> EngineResult<()> {
        self.everywhere(AdminStep::Cluster(view)).await
    }
}
