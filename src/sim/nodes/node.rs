//! One simulated node's process: a one-core engine with its front, router and shipper on its own simulated disk,
//! joined to the cluster as `cluster::node::join` joins it (the node table published, the topics learned from the
//! metastore, stale ones trashed), then kept current by an applier task that takes the snapshots the driver hands
//! it (the watch), as `follow` does. Its node RPC is the simulated network's link.

use super::super::world::Tasks;
use super::meta::{SimEtcd, SimMetadata};
use super::net::{Endpoint, NodeNet};
use crate::clock::ManualClock;
use crate::cluster::metastore::{Change, Snapshot};
use crate::cluster::unopened::Retries;
use crate::config::{ClusterSettings, Config, FsyncPolicy};
use crate::engine::placement::NodeIndex;
use crate::engine::{Engine, Shared};
use crate::front::replicate::Shipper;
use crate::front::Front;
use crate::storage::backend::Storage;
use crate::storage::sim::{Sim, SimStorage};
use crate::transport::{Router, RouterPeers};
use futures_channel::mpsc;
use futures_lite::StreamExt;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

/// A node's process while it runs.
pub(super) struct SimNode {
    pub(super) index: NodeIndex,
    pub(super) engine: Rc<Engine>,
    pub(super) front: Rc<Front>,
    shipper: Rc<Shipper>,
    pub(super) sim: Rc<Sim>,
    pub(super) tasks: Tasks,
    /// The snapshot the node applied last (its metastore replica).
    pub(super) seen: Rc<RefCell<Arc<Snapshot>>>,
    watch: mpsc::UnboundedSender<Arc<Snapshot>>,
    /// Fenced: its session lapsed as it sees it.
    pub(super) fenced: Rc<Cell<bool>>,
}

pub(super) fn node_config(index: NodeIndex, incarnation: &str) -> Config {
    Config {
        // A directory per node: the log lines name it.
        data_dir: PathBuf::from(format!("/sim/n{index}")),
        fsync: FsyncPolicy::Always,
        segment_bytes: 2048,
        journal_file_bytes: 4096,
        max_message_bytes: 512,
        tail_cache_bytes: 1024,
        write_behind_bytes: 1500,
        frontier_flush_interval_ms: 100,
        purge_interval_ms: 1000,
        incarnation: incarnation.to_string(),
        cluster: Some(ClusterSettings {
            etcd: vec!["http://sim-etcd:2379".into()],
            node_id: super::meta::node_id(index),
            advertise: format!("sim-{index}:7070"),
            peer_listen: None,
            name: "sim".into(),
            node_ttl_s: super::TTL_MS / 1000,
            rpc_timeout_ms: 2000,
            etcd_grace_s: super::TTL_MS / 1000,
            peer_token_file: None,
            peer_tls_ca_file: None,
            peer_tls_cert_file: None,
            peer_tls_key_file: None,
            peer_tls_client_auth: false,
            replication_preview: true,
            replica_timeout_ms: 2000,
            replica_window_bytes: 1 << 20,
            replica_core_window_bytes: 1 << 20,
            replica_max_in_flight: 4,
            replica_gather_us: 0,
            replica_ship_early: false,
            replica_lease_ms: crate::partition::lease::DEFAULT_LEASE_MS,
        }),
        ..Config::default()
    }
}

/// Which node starts, as which process, on which disk.
pub(super) struct Start {
    pub(super) index: NodeIndex,
    pub(super) process: u64,
    pub(super) sim: Rc<Sim>,
    /// Its data directory's incarnation.
    pub(super) incarnation: String,
    /// Its disk is new to the cluster: the revision its `joined` file records (written before the start, as
    /// `note_new_disk` does).
    pub(super) joined: Option<u64>,
    /// `[cluster] replica_gather_us` (each seed runs with it on or off).
    pub(super) gather_us: u64,
    /// `[cluster] replica_ship_early`.
    pub(super) ship_early: bool,
}

impl SimNode {
    /// Starts a node (registered already).
    pub(super) async fn boot(
        start: Start,
        clock: Rc<ManualClock>,
        etcd: Rc<SimEtcd>,
        net: Rc<NodeNet>,
    ) -> SimNode {
        let Start {
            index,
            process,
            sim,
            incarnation,
            joined,
            gather_us,
            ship_early,
        } = start;
        let mut config = node_config(index, &incarnation);
        if let Some(cluster) = config.cluster.as_mut() {
            cluster.replica_gather_us = gather_us;
            cluster.replica_ship_early = ship_early;
        }
        let config = Rc::new(config);
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        storage
            .create_dir_all(&config.data_dir.join("topics"))
            .expect("sim dir");
        storage
            .create_dir_all(&config.data_dir.join("trash"))
            .expect("sim dir");
        if let Some(revision) = joined {
            storage
                .replace(
                    &config.data_dir.join(crate::storage::learner::JOINED),
                    crate::storage::frontier::encode(revision),
                )
                .await
                .expect("the joined file");
        }
        crate::engine::admin::replay_journal(&*storage, &config.data_dir)
            .await
            .expect("journal replay");
        let mesh = super::super::net::SimNet::new(1, 16, process);
        let engine = Engine::new(
            0,
            1,
            config.clone(),
            clock.clone(),
            storage,
            Arc::new(Shared::default()),
        );
        let router = Router::new(engine.clone(), mesh.link(0));
        engine.set_peers(Rc::new(RouterPeers(Rc::downgrade(&router))));
        let front = Front::new(router.clone());
        let failed = engine.load_topics().await.expect("load topics");
        assert!(
            failed.is_empty(),
            "node {index}: topics failed to load: {failed:?}"
        );
        // As `join`: the node table, then every topic of the metastore, then what is no longer there trashed.
        let snapshot = etcd.snapshot();
        let retries = RefCell::new(Retries::default());
        let view = crate::cluster::node::view_of(&snapshot, index, false, &retries.borrow());
        engine
            .publish_cluster_view(view)
            .await
            .expect("the node table");
        let mut known = BTreeMap::new();
        for record in snapshot.topics() {
            known.insert(record.name().to_string(), record.id());
            crate::cluster::node::learn(&engine, record, &snapshot, &retries, 0).await;
        }
        engine.trash_unknown_topics(&known).await;
        let seen = Rc::new(RefCell::new(snapshot));
        engine.set_metadata(Rc::new(SimMetadata {
            etcd: etcd.clone(),
            me: index,
            seen: seen.clone(),
        }));
        router.set_node_link(net.link(index, process));
        let shipper = Shipper::new(router.clone());
        engine.set_ship_sink(shipper.sink());
        shipper.start_quorum_checks();
        shipper.start_mover();
        let tasks = Tasks::default();
        tasks.spawn(crate::engine::timers::run_lease_timer(engine.clone()));
        tasks.spawn(crate::engine::timers::run_frontier_flush(engine.clone()));
        let (watch, snapshots) = mpsc::unbounded();
        let fenced = Rc::new(Cell::new(false));
        tasks.spawn(apply(
            engine.clone(),
            index,
            seen.clone(),
            snapshots,
            fenced.clone(),
            retries,
        ));
        net.attach(
            index,
            Endpoint {
                router,
                tasks: tasks.clone(),
                process,
            },
        );
        SimNode {
            index,
            engine,
            front,
            shipper,
            sim,
            tasks,
            seen,
            watch,
            fenced,
        }
    }

    /// The watch brings `snapshot` (applied in order by the node's applier).
    pub(super) fn watch(&self, snapshot: Arc<Snapshot>) {
        let _ = self.watch.unbounded_send(snapshot);
    }

    /// The process dies: nothing of it runs or reaches the network from now on. Its disk is the caller's to keep
    /// (as a crash or a power cut leaves it) or to replace; the engine closes in the background, writing to the
    /// image the caller no longer looks at.
    pub(super) fn kill(self, net: &NodeNet) {
        net.detach(self.index);
        self.engine.begin_stop();
        let shipper = self.shipper.clone();
        let engine = self.engine.clone();
        // Cancelling a task can make another spawn one: until none is left.
        loop {
            let tasks = std::mem::take(&mut *self.tasks.0.borrow_mut());
            if tasks.is_empty() {
                break;
            }
            drop(tasks);
        }
        glommio::spawn_local(async move {
            shipper.drain(std::time::Duration::ZERO).await;
            engine.close_all().await;
        })
        .detach();
    }
}

/// The node's applier, as `cluster::node::follow`: each snapshot's topic changes learned, the node table (with
/// this node's fencing) published.
async fn apply(
    engine: Rc<Engine>,
    me: NodeIndex,
    seen: Rc<RefCell<Arc<Snapshot>>>,
    mut snapshots: mpsc::UnboundedReceiver<Arc<Snapshot>>,
    fenced: Rc<Cell<bool>>,
    retries: RefCell<Retries>,
) {
    while let Some(mut snapshot) = snapshots.next().await {
        // Behind: only the newest matters (a watch that fell behind reads everything again).
        while let Ok(newer) = snapshots.try_recv() {
            snapshot = newer;
        }
        let old = seen.borrow().clone();
        if snapshot.revision < old.revision {
            continue;
        }
        *seen.borrow_mut() = snapshot.clone();
        for change in snapshot.changes_since(&old) {
            match change {
                Change::TopicCreated(record) | Change::TopicChanged(record) => {
                    crate::cluster::node::learn(&engine, &record, &snapshot, &retries, 0).await;
                }
                Change::TopicDeleted(record) => {
                    let _ = engine.unlearn_topic(record.name(), record.id()).await;
                }
                Change::Node(_) | Change::NodeRemoved(_) => {}
            }
        }
        let view = crate::cluster::node::view_of(&snapshot, me, fenced.get(), &retries.borrow());
        let _ = engine.publish_cluster_view(view).await;
    }
}
