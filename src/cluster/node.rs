//! Cluster mode wiring: how a node joins (registration under an etcd lease), how the metastore's topics and node
//! table reach the engine (core 0 watches and applies them on every core), how requests reach owners on other
//! nodes (node RPC, one client per (core, peer node)), and the node RPC server (core 0; a request for another core
//! crosses the mesh). `server` calls `join` on core 0 and `link` on every core; nothing here is on the single-node
//! path.

use super::metastore::{
    Change, MetaConfig, MetaError, Metastore, NodeSpec, Replica, Session, SessionState, Snapshot,
    TopicRecord,
};
use super::rpc::{Handler, RpcClient, RpcConfig, RpcServer, Undelivered};
use super::unopened::Retries;
use crate::config::{ClusterSettings, Config};
use crate::engine::cluster::{ChangeFn, ClusterView, LocalFuture, Metadata, NodeEntry, Placed};
use crate::engine::metrics::ExtraSeries;
use crate::engine::placement::{Location, NodeIndex, PartitionState};
use crate::engine::topic::TopicConfig;
use crate::engine::{Engine, EngineError, EngineResult};
use crate::ops::consume::GiveBack;
use crate::ops::params::BatchLimits;
use crate::ops::{validate, OpError, OpResult, Reply, Request};
use crate::transport::{NodeLink, Router};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;
use tracing::{error, info, warn};

/// Maps a metastore failure to what a client sees: etcd out of reach is a 503 (retry), not a 500.
fn engine_error(e: MetaError) -> EngineError {
    match e {
        MetaError::TopicNotFound(t) => EngineError::TopicNotFound(t),
        MetaError::Invalid(s) => EngineError::InvalidSetting(s),
        MetaError::Contended(_) => EngineError::Overloaded,
        MetaError::Etcd(e) => {
            EngineError::ClusterUnavailable(format!("the metastore (etcd) failed: {e}; retry"))
        }
        MetaError::NoLiveNodes => {
            EngineError::ClusterUnavailable("no live node to place partitions on".into())
        }
        other => EngineError::Storage(other.to_string()),
    }
}

impl From<MetaError> for EngineError {
    fn from(e: MetaError) -> EngineError {
        engine_error(e)
    }
}

/// A topic as the engine takes it: settings with the metastore's id, where each partition lives, and each
/// partition's replicas, leader and epoch.
pub(crate) fn as_engine(record: &TopicRecord, snapshot: &Snapshot) -> Placed {
    let mut config = record.config.clone();
    config.id = record.id();
    (
        config,
        snapshot.locations(record),
        record.partitions.clone(),
    )
}

/// The node table, fencing and the topics not opened here, as every core holds them.
pub(crate) fn view_of(
    snapshot: &Snapshot,
    me: NodeIndex,
    fenced: bool,
    retries: &Retries,
) -> ClusterView {
    ClusterView {
        node: me,
        nodes: snapshot
            .nodes()
            .into_iter()
            .map(|n| {
                let (leads, follows) = snapshot.partitions_on(n.index);
                NodeEntry {
                    index: n.index,
                    id: n.id,
                    advertise: n.advertise,
                    peer_addr: n.peer_addr,
                    alive: n.alive,
                    leads: leads as u64,
                    follows: follows as u64,
                    cores: n.cores,
                    session: n.session,
                    draining: n.drain.is_some(),
                    removed: n.drain.is_some_and(|d| d.removed),
                }
            })
            .collect(),
        fenced,
        unopened: retries.listed(),
        open_failures: retries.failures(),
    }
}

/// Milliseconds on core 0's monotonic clock since `start` (the retry timer's time base).
fn ms_since(start: std::time::Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// Core 0: opens (or brings up to date) a topic of the metastore here. A failure (this node's caps, a core that
/// could not open its share) is logged and listed for a retry; a success clears it.
pub(crate) async fn learn(
    engine: &Rc<Engine>,
    record: &TopicRecord,
    snapshot: &Snapshot,
    retries: &RefCell<Retries>,
    now_ms: u64,
) {
    let (config, locations, followers) = as_engine(record, snapshot);
    match engine.learn_topic(config, locations, followers).await {
        Ok(()) => {
            if retries.borrow_mut().clear(record.name()) {
                info!(topic = %record.name(), "opened a topic of the cluster that could not be opened before");
            }
        }
        Err(e) => {
            error!(topic = %record.name(), error = %e, "cannot open a topic of the cluster here; retrying later (GET /cluster lists it under unopened)");
            retries
                .borrow_mut()
                .failed(record.name(), record.id(), e.to_string(), now_ms);
        }
    }
}

/// `/metrics` series of the topics of the cluster not opened here (core 0 reports them, from its view).
pub fn unopened_series(engine: &Engine) -> Vec<ExtraSeries> {
    let view = engine.cluster_view();
    vec![
        series(
            "cluster_topics_unopened",
            "topics of the cluster this node could not open (over its caps, or a core failed); retried",
            "gauge",
            String::new(),
            view.unopened.len() as u64,
        ),
        series(
            "cluster_topic_open_failures_total",
            "attempts to open a topic of the cluster here that failed, retries included",
            "counter",
            String::new(),
            view.open_failures,
        ),
    ]
}

/// How long a change made through this node waits for the replica to reach it (the admin permit is held meanwhile).
const CAUGHT_UP_TIMEOUT: Duration = Duration::from_secs(5);

/// The replica at `revision` or later (read your writes), within [`CAUGHT_UP_TIMEOUT`]; else a 503: the change is
/// in the metastore, but this node's copy lags (its watch is broken or far behind).
async fn caught_up(replica: &Replica, revision: i64) -> EngineResult<std::sync::Arc<Snapshot>> {
    super::within(CAUGHT_UP_TIMEOUT, replica.caught_up(revision))
        .await
        .ok_or_else(|| {
            EngineError::ClusterUnavailable(format!(
                "the change was made in the metastore, but this node's replica did not reach it within {} s; retry",
                CAUGHT_UP_TIMEOUT.as_secs()
            ))
        })
}

/// A partition key to write: the topic, and the partition's replicas and learners.
pub(crate) type MoveWrite<'a> = (&'a TopicRecord, Vec<NodeIndex>, Vec<NodeIndex>);

/// What a `MoveLeader` asks the metastore to write, read from `snapshot`: the topic and the partition's new replica
/// set and learners; None when there is nothing to write (the partition moved on from the epoch asked, or the
/// leader named does not vote yet: a round's hand-over never names a learner, it ranks none).
pub(crate) fn move_to_write<'a>(
    snapshot: &'a Snapshot,
    r: &crate::ops::replicate::MoveLeader,
) -> EngineResult<Option<MoveWrite<'a>>> {
    let Some(record) = snapshot.topic(&r.topic).filter(|t| t.id() == r.topic_id) else {
        return Err(EngineError::TopicNotFound(r.topic.clone()));
    };
    let Some(state) = record.partitions.get(r.partition as usize) else {
        return Err(EngineError::TopicNotFound(r.topic.clone()));
    };
    if state.epoch != r.epoch {
        return Ok(None);
    }
    let (replicas, learners) = if r.replicas.is_empty() {
        (&state.replicas, &state.learners)
    } else {
        (&r.replicas, &r.learners)
    };
    if learners.contains(&r.leader) {
        return Ok(None);
    }
    Ok(Some((record, replicas.clone(), learners.clone())))
}

/// The engine's metadata service over etcd (core 0).
struct EtcdMetadata {
    meta: Rc<Metastore>,
    replica: Rc<Replica>,
}

impl Metadata for EtcdMetadata {
    fn create_topic(&self, config: TopicConfig) -> LocalFuture<'_, EngineResult<(bool, Placed)>> {
        Box::pin(async move {
            let partitions = config.partitions;
            let (created, record) = self.meta.create_topic(config).await?;
            if !created && record.config.partitions != partitions {
                return Err(EngineError::TopicExists {
                    topic: record.config.name.clone(),
                    partitions: record.config.partitions,
                });
            }
            let snapshot = caught_up(&self.replica, record.mod_revision).await?;
            Ok((created, as_engine(&record, &snapshot)))
        })
    }

    fn change_topic(
        &self,
        name: String,
        mut change: ChangeFn,
    ) -> LocalFuture<'_, EngineResult<Placed>> {
        Box::pin(async move {
            let record = self
                .meta
                .change_topic::<EngineError>(&name, |c| change(c))
                .await?;
            let snapshot = caught_up(&self.replica, record.mod_revision).await?;
            Ok(as_engine(&record, &snapshot))
        })
    }

    fn lookup_topic(
        &self,
        name: String,
        fresh: bool,
    ) -> LocalFuture<'_, EngineResult<Option<Placed>>> {
        Box::pin(async move {
            let record = if fresh {
                self.meta.topic(&name).await?.map(std::sync::Arc::new)
            } else {
                self.replica.lookup_topic(&name).await?
            };
            let Some(record) = record else {
                return Ok(None);
            };
            // Placement needs the owners' core counts: give the replica a moment to reach the record's revision.
            let snapshot =
                futures_lite::future::or(self.replica.caught_up(record.mod_revision), async {
                    glommio::timer::sleep(Duration::from_secs(1)).await;
                    self.replica.snapshot()
                })
                .await;
            Ok(Some(as_engine(&record, &snapshot)))
        })
    }

    fn partitions(&self, name: &str) -> Option<(u64, Vec<PartitionState>)> {
        let snapshot = self.replica.snapshot();
        let record = snapshot.topic(name)?;
        Some((record.id(), record.partitions.clone()))
    }

    fn move_leader(
        &self,
        r: crate::ops::replicate::MoveLeader,
    ) -> LocalFuture<'_, EngineResult<()>> {
        Box::pin(async move {
            let snapshot = self.replica.snapshot();
            let Some((record, replicas, learners)) = move_to_write(&snapshot, &r)? else {
                return Ok(());
            };
            let moved = self
                .meta
                .set_partition_with(record, r.partition, r.epoch, &replicas, r.leader, &learners)
                .await?;
            if let Some(moved) = moved {
                info!(topic = %r.topic, partition = r.partition, leader = r.leader, replicas = ?moved.replicas, epoch = moved.epoch, "the partition's leadership or replica set moved");
            }
            Ok(())
        })
    }

    fn drain_node(
        &self,
        id: String,
        action: crate::engine::cluster::DrainAction,
    ) -> LocalFuture<'_, EngineResult<()>> {
        use crate::engine::cluster::DrainAction;
        Box::pin(async move {
            let removed = action == DrainAction::Remove;
            let snapshot = self.replica.snapshot();
            if removed {
                if let Some(node) = snapshot.node(&id) {
                    if node.alive {
                        return Err(EngineError::NodeAlive(id));
                    }
                    // Its partitions of which it is the only voter (R = 1, or every other replica a learner) have
                    // no other copy: removing it would lose them for good.
                    let only: Vec<String> = snapshot
                        .topics()
                        .flat_map(|t| {
                            t.partitions
                                .iter()
                                .enumerate()
                                .filter(|(_, s)| {
                                    s.voters().iter().all(|&v| {
                                        v == node.index
                                            || snapshot
                                                .node_by_index(v)
                                                .and_then(|n| n.drain)
                                                .is_some_and(|d| d.removed)
                                    })
                                })
                                .map(|(p, _)| format!("{}/{p}", t.name()))
                        })
                        .take(5)
                        .collect();
                    if !only.is_empty() {
                        return Err(EngineError::NodeHoldsOnlyCopy(id, only));
                    }
                }
            }
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let done = if action == DrainAction::End {
                self.meta.end_drain(&id).await?
            } else {
                self.meta.set_drain(&id, removed, now_ms).await?
            };
            match done {
                Some(d) if d.removed && action != DrainAction::Remove => {
                    Err(EngineError::NodeRemoved(id))
                }
                Some(_) => Ok(()),
                None => Err(EngineError::NodeNotFound(id)),
            }
        })
    }

    fn delete_topic(&self, name: String) -> LocalFuture<'_, EngineResult<()>> {
        Box::pin(async move {
            match self.meta.delete_topic(&name).await? {
                Some(_) => Ok(()),
                None => Err(EngineError::TopicNotFound(name)),
            }
        })
    }
}

/// What core 0 keeps alive while the node is in the cluster.
pub struct Membership {
    pub session: Rc<Session>,
    pub replica: Rc<Replica>,
    pub rpc: Rc<RpcServer>,
    /// The metastore handle: its etcd client's control-plane thread stops in [`Membership::leave`].
    pub meta: Rc<Metastore>,
}

impl Membership {
    /// A clean stop (core 0, once the partitions are closed): revokes the session's lease, so other nodes see this
    /// one dead at once and it may start again right away, then stops the etcd client's control-plane thread.
    pub async fn leave(self) {
        if let Err(e) = self.session.close().await {
            warn!(error = %e, "could not give the metastore session back; it expires within its TTL");
        }
        self.meta.close().await;
    }
}

fn series(name: &str, help: &str, kind: &str, labels: String, value: u64) -> ExtraSeries {
    ExtraSeries {
        name: name.into(),
        help: help.into(),
        kind: kind.into(),
        labels,
        value,
    }
}

/// `/metrics` series of the node RPC server (core 0).
pub fn server_series(server: &RpcServer) -> Vec<ExtraSeries> {
    let s = server.stats();
    vec![
        series(
            "rpc_server_connections_open",
            "node RPC connections open (from other nodes)",
            "gauge",
            String::new(),
            s.connections_open,
        ),
        series(
            "rpc_server_requests_total",
            "node RPC requests received, one-way ones included",
            "counter",
            String::new(),
            s.requests,
        ),
        series(
            "rpc_server_overloaded_total",
            "node RPC requests refused by the in-flight bound (and one-way ones dropped)",
            "counter",
            String::new(),
            s.overloaded,
        ),
        series(
            "rpc_server_handshakes_failed_total",
            "node RPC handshakes refused (token, version) or not completed",
            "counter",
            String::new(),
            s.handshakes_failed,
        ),
        series(
            "rpc_server_handshakes_evicted_total",
            "node RPC connections closed in their handshake to make room for a newer one (max_handshaking)",
            "counter",
            String::new(),
            s.handshakes_evicted,
        ),
        series(
            "rpc_server_handshake_read_bytes_total",
            "bytes read from node RPC connections before their handshake ended",
            "counter",
            String::new(),
            s.handshake_read_bytes,
        ),
        series(
            "rpc_server_bad_frames_total",
            "node RPC connections closed for a malformed frame",
            "counter",
            String::new(),
            s.bad_frames,
        ),
        series(
            "rpc_server_undelivered_total",
            "node RPC replies that could not be written back",
            "counter",
            String::new(),
            s.undelivered,
        ),
    ]
}

/// Before this node registers: if its `nodes/<id>` record names another incarnation than its data directory's (the
/// disk was wiped or replaced since), writes `DATA/joined` with etcd's revision (`storage::learner`).
async fn note_new_disk(
    meta: &Rc<Metastore>,
    spec: &NodeSpec,
    data_dir: &std::path::Path,
) -> Result<(), MetaError> {
    let (record, revision) = meta.member(&spec.id).await?;
    if let Some(m) =
        record.filter(|m| !m.incarnation.is_empty() && m.incarnation != spec.incarnation)
    {
        warn!(node = %spec.id, was = %m.incarnation, now = %spec.incarnation, revision, "this node's data directory is not the one the cluster knew: its replicas of topics created at or before revision {revision} start as learners (they neither lead nor count in a fencing round until a leader has caught them up)");
        crate::storage::learner::write_joined(data_dir, revision.max(0) as u64).map_err(|e| {
            MetaError::Invalid(format!(
                "cannot write the data directory's joined file: {e}"
            ))
        })?;
    }
    Ok(())
}

/// Core 0: registers this node (waiting out a crashed predecessor's lease), loads the metastore, opens the topics
/// this node owns partitions of, publishes the node table on every core, starts the node RPC server, and keeps it
/// all current from the watch.
pub async fn join(
    engine: &Rc<Engine>,
    router: &Rc<Router>,
    config: &Config,
    settings: &ClusterSettings,
) -> Result<Membership, String> {
    let mut meta_config = MetaConfig::new(settings.etcd.clone(), &settings.name)
        .map_err(|e| format!("--cluster: {e}"))?;
    meta_config.lease_ttl_s = settings.node_ttl_s as i64;
    meta_config.grace = Duration::from_secs(settings.etcd_grace_s);
    meta_config.replication_preview = settings.replication_preview;
    let meta = Metastore::new(meta_config).map_err(|e| format!("--cluster: {e}"))?;
    let peer_addr = settings.peer_addr(config.listen);
    let spec = NodeSpec {
        id: settings.node_id.clone(),
        advertise: settings.advertise.clone(),
        peer_addr: peer_addr.to_string(),
        cores: engine.cores() as u32,
        incarnation: config.incarnation.clone(),
    };
    // A node restarted right after a crash finds its old session still alive in etcd until the lease runs out.
    // And one started while etcd is out of reach for a moment keeps trying for at least 30 s.
    let deadline =
        std::time::Instant::now() + Duration::from_secs((settings.node_ttl_s + 5).max(30));
    let session = loop {
        // A data directory the cluster did not know (wiped, replaced): noted, with etcd's revision, before the
        // registration records the new incarnation, so that this node's replicas of older topics start as learners
        // (`storage::learner`), crash or not.
        let noted = match crate::storage::learner::read_joined(&config.data_dir) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => note_new_disk(&meta, &spec, &config.data_dir).await,
            Err(e) => return Err(format!("cannot read the data directory's joined file: {e}")),
        };
        // A node removed for good (`DELETE /cluster/nodes/ID`) does not come back under its id: its replicas were
        // moved to other nodes.
        let noted = match noted {
            Ok(()) => match meta.drain_of(&spec.id).await {
                Ok(Some(d)) if d.removed => {
                    return Err(format!(
                        "node '{}' was removed from the cluster (DELETE /cluster/nodes/{}): start it under a new --node-id, with an empty data directory",
                        spec.id, spec.id
                    ))
                }
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let registered = match noted {
            Ok(()) => meta.register(spec.clone()).await,
            Err(e) => Err(e),
        };
        match registered {
            Ok(session) => break session,
            Err(e @ MetaError::NodeIdInUse { .. }) | Err(e @ MetaError::Etcd(_))
                if std::time::Instant::now() < deadline =>
            {
                warn!(error = %e, "cannot register with the metastore yet; retrying");
                glommio::timer::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("cannot join the cluster: {e}")),
        }
    };
    let me = session.index();
    let session = Rc::new(session);
    let replica = Rc::new(
        meta.replica()
            .await
            .map_err(|e| format!("cannot read the metastore: {e}"))?,
    );
    // Subscribed at the very snapshot the engine starts from (no await between): every later change reaches
    // `follow`, even one the watch applies while this node is still opening its topics.
    let changes = replica.changes();
    let snapshot = replica.snapshot();
    let retries = Rc::new(RefCell::new(Retries::default()));
    let start = std::time::Instant::now();
    let view = view_of(&snapshot, me, false, &retries.borrow());
    engine
        .publish_cluster_view(view)
        .await
        .map_err(|e| format!("cannot publish the node table: {e}"))?;
    let mut known = BTreeMap::new();
    for record in snapshot.topics() {
        known.insert(record.name().to_string(), record.id());
        learn(engine, record, &snapshot, &retries, ms_since(start)).await;
    }
    if !retries.borrow().names().is_empty() {
        let view = view_of(&snapshot, me, false, &retries.borrow());
        let _ = engine.publish_cluster_view(view).await;
    }
    engine.trash_unknown_topics(&known).await;
    engine.set_metadata(Rc::new(EtcdMetadata {
        meta: meta.clone(),
        replica: replica.clone(),
    }));
    let handler: Handler = {
        let router = router.clone();
        let limits = BatchLimits {
            max_batch_records: config.max_batch_records,
            max_batch_bytes: config.max_batch_bytes,
            max_message_bytes: config.max_message_bytes,
        };
        Rc::new(move |peer: u32, core: u32, request: Request| {
            let router = router.clone();
            Box::pin(async move {
                // A peer's request is checked like any untrusted input before a core sees it.
                validate::admit(&request, peer, core, router.engine().cores(), &limits)?;
                // A request from a node that knows more than this one (a topic, a new incarnation or a group
                // created through it a moment ago, not yet in this node's replica): read the metastore first.
                if let Some(name) = behind(router.engine(), &request) {
                    let _ = router
                        .call(router.core(0), Request::LookupTopic(name, true))
                        .await;
                }
                router.call(router.core(core as usize), request).await
            }) as Pin<Box<dyn Future<Output = OpResult<Reply>>>>
        })
    };
    let rpc = Rc::new(
        RpcServer::bind(peer_addr, rpc_config(config, settings, me), handler)
            .map_err(|e| format!("cannot listen for node RPC on {peer_addr}: {e}"))?,
    );
    // A probe's reply that could not be written back to its node: its leases go back at once.
    {
        let router = router.clone();
        rpc.on_undeliverable(Rc::new(move |u: Undelivered| {
            if let Some(give) = undelivered_leases(&u) {
                let router = router.clone();
                glommio::spawn_local(async move {
                    let _ = router
                        .call(router.core(u.core as usize), Request::GiveBack(give))
                        .await;
                })
                .detach();
            }
        }));
    }
    rpc.start();
    info!(node = %settings.node_id, index = me, peer = %peer_addr, topics = known.len(), "joined the cluster");
    let elections = super::election::Elections::new(
        meta.clone(),
        replica.clone(),
        me,
        super::election::STAGGER,
    );
    elections.consider(&replica.snapshot());
    glommio::spawn_local(follow(
        engine.clone(),
        replica.clone(),
        changes,
        session.clone(),
        me,
        (retries, start, elections),
    ))
    .detach();
    Ok(Membership {
        session,
        replica,
        rpc,
        meta,
    })
}

/// The topic a request from another node names, when this node's copy of it is missing, another incarnation, or
/// lacks the request's group.
fn behind(engine: &Engine, request: &Request) -> Option<String> {
    let (topic, id, group) = match request {
        Request::Produce(r) => (&r.topic, r.topic_id, None),
        Request::Probe(r) => (&r.topic, r.topic_id, Some(&r.group)),
        Request::Settle(r) => (&r.topic, r.topic_id, Some(&r.group)),
        Request::Replay(r) => (&r.topic, r.topic_id, None),
        Request::Describe(name) => {
            return engine.topic(name).is_err().then(|| name.clone());
        }
        // (A purge of a group created through another node a moment ago answered `404` here until this node's
        // replica learnt of it: seen in the replicated-frontiers cluster test.)
        Request::Purge(name, group) => {
            let current = engine
                .topic(name)
                .is_ok_and(|t| t.config().has_group(group));
            return (!current).then(|| name.clone());
        }
        _ => return None,
    };
    let current = match engine.topic(topic) {
        Ok(t) => t.id() == id && group.is_none_or(|g| t.config().has_group(g)),
        Err(_) => false,
    };
    (!current).then(|| topic.clone())
}

/// The leases in an undelivered reply (a probe's), as a give-back for their owner.
fn undelivered_leases(u: &Undelivered) -> Option<GiveBack> {
    match (&u.reply, &u.probe) {
        (Reply::Probed(probed), Some((topic, group))) => {
            GiveBack::of(topic.clone(), group.clone(), &probed.deliveries)
        }
        _ => None,
    }
}

fn rpc_config(config: &Config, settings: &ClusterSettings, me: NodeIndex) -> RpcConfig {
    RpcConfig {
        node: me,
        // The cluster secret, never the clients' token (`--peer-token-file`).
        token: config.peer_token.clone(),
        tls: config.peer_tls.clone(),
        call_timeout: Duration::from_millis(settings.rpc_timeout_ms),
        // A frame carries at most one batch (a produce's body, a consume's reply: `max_batch_bytes` of payload,
        // one message over at most) plus its framing: room for both, and never less than the default.
        max_body_bytes: RpcConfig::default().max_body_bytes.max(
            config
                .max_batch_bytes
                .saturating_add(config.max_message_bytes)
                .saturating_add(config.max_batch_records.saturating_mul(64))
                .saturating_add(64 << 10),
        ),
        ..RpcConfig::default()
    }
}

/// Core 0: applies the metastore's changes (topics created, changed or deleted through other nodes; nodes coming
/// and going, or back with another core count: their partitions' cores are computed again), retries the topics that
/// could not be opened here (at every change, and on a timer with backoff), and this node's own session state
/// (fenced while it has lapsed).
async fn follow(
    engine: Rc<Engine>,
    replica: Rc<Replica>,
    mut changes: super::metastore::Changes,
    session: Rc<Session>,
    me: NodeIndex,
    (retries, start, elections): (
        Rc<RefCell<Retries>>,
        std::time::Instant,
        Rc<super::election::Elections>,
    ),
) {
    let mut seen = 0u64;
    let fenced = Rc::new(std::cell::Cell::new(false));
    // Session state: its own task, so a lapse is noticed while no metastore change arrives.
    {
        let engine = engine.clone();
        let replica = replica.clone();
        let fenced = fenced.clone();
        let session = session.clone();
        let retries = retries.clone();
        glommio::spawn_local(async move {
            loop {
                let state = session.next_state(&mut seen).await;
                if matches!(state, SessionState::Closed) && engine.is_stopping() {
                    return; // a clean stop gave the lease back (`Membership::leave`): nothing to fence
                }
                let lost = matches!(state, SessionState::Lost | SessionState::Closed);
                if lost != fenced.get() {
                    fenced.set(lost);
                    if lost {
                        warn!("the metastore session lapsed: this node stops serving its partitions until it registers again");
                    } else {
                        info!("registered again: serving this node's partitions");
                    }
                    let view = view_of(&replica.snapshot(), me, lost, &retries.borrow());
                    let _ = engine.publish_cluster_view(view).await;
                }
                if matches!(state, SessionState::Closed) || engine.is_stopping() {
                    return;
                }
            }
        })
        .detach();
    }
    loop {
        // The next change, or the end of the earliest retry's wait, whichever comes first.
        let wait_ms = retries
            .borrow()
            .next_at_ms()
            .map(|at| at.saturating_sub(ms_since(start)));
        let next = match wait_ms {
            None => Some(changes.next().await),
            Some(ms) => {
                futures_lite::future::or(async { Some(changes.next().await) }, async {
                    glommio::timer::sleep(Duration::from_millis(ms)).await;
                    None
                })
                .await
            }
        };
        if engine.is_stopping() {
            return;
        }
        let (snapshot, list, retry) = match next {
            Some((snapshot, list)) => (snapshot, list, retries.borrow().names()),
            None => (
                replica.snapshot(),
                Vec::new(),
                retries.borrow().due(ms_since(start)),
            ),
        };
        let listed_before = retries.borrow().listed();
        let mut nodes_changed = false;
        let mut done = std::collections::BTreeSet::new();
        for change in list {
            match change {
                Change::Node(_) | Change::NodeRemoved(_) => nodes_changed = true,
                Change::TopicCreated(record) | Change::TopicChanged(record) => {
                    learn(&engine, &record, &snapshot, &retries, ms_since(start)).await;
                    done.insert(record.name().to_string());
                }
                Change::TopicDeleted(record) => {
                    retries.borrow_mut().clear(record.name());
                    if let Err(e) = engine.unlearn_topic(record.name(), record.id()).await {
                        error!(topic = %record.name(), error = %e, "cannot apply a topic deletion from the metastore");
                    }
                    done.insert(record.name().to_string());
                }
            }
        }
        if nodes_changed {
            // A node back with another core count moves its partitions to other cores of its own: every topic with
            // partitions there is routed anew (this node's own partitions never move while it runs).
            for record in snapshot.topics() {
                let moved = engine.topic(record.name()).is_ok_and(|t| {
                    t.id() == record.id() && *t.locations() != *snapshot.locations(record)
                });
                if moved && done.insert(record.name().to_string()) {
                    learn(&engine, record, &snapshot, &retries, ms_since(start)).await;
                }
            }
        }
        for name in retry.into_iter().filter(|n| !done.contains(n)) {
            match snapshot.topic(&name) {
                Some(record) => learn(&engine, record, &snapshot, &retries, ms_since(start)).await,
                None => {
                    retries.borrow_mut().clear(&name);
                }
            }
        }
        // A leader that lost its session, or a partition key that moved: stand for what needs a leader.
        elections.consider(&snapshot);
        // Topic changes move the partitions each node leads and follows (`GET /cluster`) too.
        if nodes_changed || !done.is_empty() || retries.borrow().listed() != listed_before {
            let view = view_of(&snapshot, me, fenced.get(), &retries.borrow());
            if let Err(e) = engine.publish_cluster_view(view).await {
                warn!(error = %e, "cannot publish the node table");
            }
        }
    }
}

/// Every core: node RPC clients to the other nodes, one per peer, made at first use from the node table (and made
/// again when a peer's address changes).
pub struct RpcNodes {
    engine: Rc<Engine>,
    config: RpcConfig,
    clients: RefCell<HashMap<NodeIndex, PeerClient>>,
}

/// A peer's client with its address and the metastore session the peer had when last looked at.
type PeerClient = (String, i64, Rc<RpcClient>);

impl RpcNodes {
    pub fn new(engine: Rc<Engine>, config: &Config, settings: &ClusterSettings) -> Rc<RpcNodes> {
        Rc::new(RpcNodes {
            config: rpc_config(config, settings, engine.node()),
            engine,
            clients: RefCell::new(HashMap::new()),
        })
    }

    /// `/metrics` series of this core's clients, one per peer node.
    pub fn series(&self) -> Vec<ExtraSeries> {
        let view = self.engine.cluster_view();
        let mut out = Vec::new();
        for (node, (_, _, client)) in self.clients.borrow().iter() {
            let peer = view
                .nodes
                .iter()
                .find(|n| n.index == *node)
                .map_or_else(|| node.to_string(), |n| n.id.clone());
            let labels = format!("peer=\"{peer}\"");
            let s = client.stats();
            out.push(series(
                "rpc_client_sent_total",
                "node RPC requests sent to a peer, one-way ones included",
                "counter",
                labels.clone(),
                s.sent,
            ));
            out.push(series(
                "rpc_client_refused_total",
                "node RPC calls refused at once (outstanding or queued-bytes bound)",
                "counter",
                labels.clone(),
                s.refused,
            ));
            out.push(series(
                "rpc_client_unreachable_total",
                "node RPC calls failed for want of a connection",
                "counter",
                labels.clone(),
                s.unreachable,
            ));
            out.push(series(
                "rpc_client_timeouts_total",
                "node RPC calls that gave up waiting for their reply",
                "counter",
                labels.clone(),
                s.timeouts,
            ));
            out.push(series(
                "rpc_client_reconnects_total",
                "node RPC connections made again after a failure",
                "counter",
                labels,
                s.reconnects,
            ));
        }
        out
    }

    fn client(&self, node: NodeIndex) -> OpResult<Rc<RpcClient>> {
        let view = self.engine.cluster_view();
        let Some(entry) = view.nodes.iter().find(|n| n.index == node) else {
            return Err(OpError::PartitionUnavailable(format!(
                "node {node} is not in the node table"
            )));
        };
        let mut clients = self.clients.borrow_mut();
        if let Some((addr, session, client)) = clients.get_mut(&node) {
            if *addr == entry.peer_addr {
                if entry.session != *session {
                    // It registered again (a restart, or its session came back): a reconnection backing off after
                    // its absence tries at once, so that it is reachable as soon as it is live.
                    *session = entry.session;
                    if entry.session != 0 {
                        client.reconnect_now();
                    }
                }
                return Ok(client.clone());
            }
        }
        let mut config = self.config.clone();
        config.node = view.node;
        config.peer_name = entry.id.clone();
        let client = Rc::new(RpcClient::new(entry.peer_addr.clone(), node, config));
        // A probe's reply that came after its caller gave up: its leases go back to the owner at once (one-way).
        let weak = Rc::downgrade(&client);
        client.on_undeliverable(Rc::new(move |u: Undelivered| {
            if let (Some(give), Some(client)) = (undelivered_leases(&u), weak.upgrade()) {
                let _ = client.send_one_way(u.core, Request::GiveBack(give));
            }
        }));
        clients.insert(
            node,
            (entry.peer_addr.clone(), entry.session, client.clone()),
        );
        Ok(client)
    }
}

impl NodeLink for RpcNodes {
    fn call(
        &self,
        to: Location,
        request: Request,
    ) -> Pin<Box<dyn Future<Output = OpResult<Reply>>>> {
        let client = self.client(to.node);
        let expected = validate::expect(&request);
        let call_timeout = self.config.call_timeout;
        let replica_timeout = self.engine.replica_timeout();
        Box::pin(async move {
            // A produce to a replicated partition may wait up to `replica_timeout` for its commit after the append:
            // the caller waits that much longer, so it hears the leader's answer (`503 not_enough_replicas`, or
            // the 200 of a commit that came late) instead of timing out first.
            let timeout = match &request {
                Request::Produce(_) => call_timeout + replica_timeout,
                _ => call_timeout,
            };
            let reply = client?.call_within(to.core, request, timeout).await?;
            // The peer's reply is untrusted input: the wrong variant or length is an error, never a panic or a
            // partial answer passed off as whole.
            validate::check_reply(expected, &reply).map_err(|why| {
                OpError::PartitionUnavailable(format!(
                    "node {} answered out of protocol: {why}",
                    to.node
                ))
            })?;
            Ok(reply)
        })
    }

    fn signal(&self, to: Location, signal: crate::engine::Signal) -> bool {
        self.client(to.node).is_ok_and(|client| {
            client
                .send_one_way(to.core, Request::Signal(signal))
                .is_ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_etcd::{run, start_etcd};

    #[test]
    fn a_change_whose_replica_lags_answers_503_within_the_bound_and_lands_once_it_catches_up() {
        let Some(etcd) = start_etcd(
            "a_change_whose_replica_lags_answers_503_within_the_bound_and_lands_once_it_catches_up",
        ) else {
            return;
        };
        run(async {
            let store = || {
                Metastore::new(MetaConfig::new(vec![etcd.url.clone()], "test").unwrap()).unwrap()
            };
            let meta = store();
            let _node = meta
                .register(NodeSpec {
                    id: "n1".into(),
                    advertise: "n1.local:8080".into(),
                    peer_addr: "n1.local:9090".into(),
                    cores: 2,
                    incarnation: String::new(),
                })
                .await
                .unwrap();
            let replica = Rc::new(meta.replica().await.unwrap());
            let metadata = EtcdMetadata {
                meta: meta.clone(),
                replica: replica.clone(),
            };
            // The replica's watch is held: the topic is created in etcd, and the answer waits for this node's copy
            // only as long as the bound, the admin permit with it.
            replica.hold(true);
            let mut config = TopicConfig::with_defaults("lagging");
            config.partitions = 2;
            let started = std::time::Instant::now();
            let e = metadata.create_topic(config.clone()).await.unwrap_err();
            let waited = started.elapsed();
            assert!(
                matches!(&e, EngineError::ClusterUnavailable(why) if why.contains("did not reach it")),
                "{e:?}"
            );
            assert!(
                waited >= CAUGHT_UP_TIMEOUT && waited < CAUGHT_UP_TIMEOUT + Duration::from_secs(3),
                "answered after {waited:?}"
            );
            // The change is in the metastore: once the replica follows again, the same request answers it
            // (created by the first call, so `false`) with the placement.
            replica.hold(false);
            let (created, (placed, locations, _)) = metadata.create_topic(config).await.unwrap();
            assert!(!created);
            assert_eq!(placed.partitions, 2);
            assert_eq!(locations.len(), 2);
        });
    }
}
