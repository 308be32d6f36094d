//! One core's broker: the topics it knows, the partitions it owns, and the operations it runs on them. An `Rc<Core>`
//! lives on each executor; nothing in it is shared with another core. Requests from the HTTP edge on this core
//! arrive through `broker::router`; requests from other cores arrive as `Command`s in `serve_command`.

use super::command::Command;
use super::error::{BrokerError, BrokerResult};
use super::mesh::Mesh;
use super::metrics::{CoreMetrics, CoreStats};
use super::topic::{owner, TopicConfig};
use crate::config::Config;
use crate::partition::inflight::Limits;
use crate::partition::{now_ms, Partition, PartitionInfo, SettleOp, Take, Wake};
use crate::storage::log::{LogOptions, Record};
use bytes::Bytes;
use event_listener::Event;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;
use tracing::{error, info, warn};

/// Long-poll wiring of one topic on one core.
pub struct TopicSignal {
    topic: String,
    /// Consumers parked on this core listen here.
    pub event: Event,
    /// Cores with consumers parked on this topic, to wake when a partition here gets something deliverable.
    remote_interest: RefCell<Vec<bool>>,
    /// Cores this core asked to be woken by (cleared when their Wake arrives).
    registered: RefCell<Vec<bool>>,
}

impl TopicSignal {
    fn new(topic: &str, cores: usize) -> TopicSignal {
        TopicSignal {
            topic: topic.to_string(),
            event: Event::new(),
            remote_interest: RefCell::new(vec![false; cores]),
            registered: RefCell::new(vec![false; cores]),
        }
    }

    /// Wakes up to `n` consumers parked here and every core that registered interest. A wake that cannot be sent
    /// (full channel) keeps the interest so the next one retries.
    fn wake(&self, n: usize, mesh: &Mesh, me: usize) {
        // Additional: listeners notified by an earlier wake and not yet run must not absorb this one.
        self.event.notify_additional(n);
        let mut interest = self.remote_interest.borrow_mut();
        for (core, wanted) in interest.iter_mut().enumerate() {
            if *wanted {
                let command = Command::Wake {
                    topic: self.topic.clone(),
                    from: me,
                };
                if mesh.send(core, command).is_ok() {
                    *wanted = false;
                }
            }
        }
    }
}

/// A topic as one core sees it.
pub struct TopicLocal {
    pub config: TopicConfig,
    /// Some(partition) for the partitions this core owns.
    pub partitions: Vec<Option<Rc<Partition>>>,
    /// The owned partition numbers, for round-robin.
    pub owned: Vec<u32>,
    /// Round-robin cursor over `owned` (produce without key, consume).
    pub cursor: Cell<usize>,
    pub signal: Rc<TopicSignal>,
    /// Set when the topic is deleted; parked consumers notice and leave.
    pub deleted: Cell<bool>,
}

/// One core's broker state.
pub struct Core {
    /// This core's index (0-based); equals its mesh peer id.
    pub id: usize,
    /// Number of cores.
    pub cores: usize,
    pub config: Rc<Config>,
    pub mesh: Mesh,
    topics: RefCell<HashMap<String, Rc<TopicLocal>>>,
    /// Topics that could not be opened at start (name → why): they answer 503 topic_unavailable.
    quarantined: RefCell<std::collections::BTreeMap<String, String>>,
    /// Serialises topic creation and deletion (core 0 only).
    admin_lock: glommio::sync::Semaphore,
    pub metrics: CoreMetrics,
    /// Wakes the expiry task when a lease earlier than its current deadline appears.
    pub expiry_rearm: Event,
    /// The deadline the expiry task currently sleeps to (ms, monotonic).
    pub expiry_deadline: Cell<u64>,
    /// Set at shutdown: new long-polls return at once, connections close after their current response.
    pub stopping: Cell<bool>,
    /// Notified when `stopping` is set (idle connections and parked consumers listen).
    pub stop_event: Event,
    /// Process-wide readiness and connection counts (shared by every core; not on the data path).
    pub shared: std::sync::Arc<Shared>,
    /// Where partitions keep their files.
    pub storage: Rc<dyn crate::storage::backend::Storage>,
}

/// The little state every core shares: readiness for /health, the server-wide connection count, and the boot-time
/// agreement on quarantined topics (never on the data path).
#[derive(Default)]
pub struct Shared {
    /// Cores serving (listening) now.
    pub ready: std::sync::atomic::AtomicUsize,
    /// Client connections open across all cores.
    pub connections: std::sync::atomic::AtomicUsize,
    /// Topics some core could not open at boot (name → why), gathered before any core serves.
    pub boot_failures: std::sync::Mutex<Vec<(String, String)>>,
    /// Cores done loading their topics (a barrier with `loaded_event`).
    pub loaded: std::sync::atomic::AtomicUsize,
    pub loaded_event: Event,
}

impl Core {
    pub fn new(
        id: usize,
        cores: usize,
        config: Rc<Config>,
        mesh: Mesh,
        shared: std::sync::Arc<Shared>,
    ) -> Core {
        let sync_via = config.sync_via;
        Core {
            id,
            cores,
            config,
            mesh,
            topics: RefCell::new(HashMap::new()),
            quarantined: RefCell::new(std::collections::BTreeMap::new()),
            admin_lock: glommio::sync::Semaphore::new(1),
            metrics: CoreMetrics::default(),
            expiry_rearm: Event::new(),
            expiry_deadline: Cell::new(u64::MAX),
            stopping: Cell::new(false),
            stop_event: Event::new(),
            shared,
            storage: Rc::new(crate::storage::backend::Disk { sync_via }),
        }
    }

    pub fn topics_dir(&self) -> PathBuf {
        self.config.data_dir.join("topics")
    }

    fn log_options(&self) -> LogOptions {
        LogOptions {
            segment_bytes: self.config.segment_bytes,
            max_payload: self.config.max_message_bytes as u32,
            fsync: self.config.fsync,
        }
    }

    /// The topic as this core knows it.
    pub fn topic(&self, name: &str) -> BrokerResult<Rc<TopicLocal>> {
        if let Some(topic) = self.topics.borrow().get(name) {
            return Ok(topic.clone());
        }
        if self.quarantined.borrow().contains_key(name) {
            return Err(BrokerError::TopicUnavailable(name.to_string()));
        }
        Err(BrokerError::TopicNotFound(name.to_string()))
    }

    /// Every topic name (quarantined ones included), sorted.
    pub fn topic_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.topics.borrow().keys().cloned().collect();
        names.extend(self.quarantined.borrow().keys().cloned());
        names.sort();
        names
    }

    /// Every owned partition (for the timers).
    pub fn owned_partitions(&self) -> Vec<(Rc<TopicLocal>, Rc<Partition>)> {
        let topics = self.topics.borrow();
        let mut out = Vec::new();
        for topic in topics.values() {
            for p in topic.partitions.iter().flatten() {
                out.push((topic.clone(), p.clone()));
            }
        }
        out
    }

    /// Learns a topic and opens the partitions this core owns (recovery runs inside `Partition::open`).
    pub async fn apply_topic(self: &Rc<Self>, config: TopicConfig) -> BrokerResult<()> {
        if self.topics.borrow().contains_key(&config.name) {
            return Ok(());
        }
        let signal = Rc::new(TopicSignal::new(&config.name, self.cores));
        let dir = TopicConfig::dir(&self.config.data_dir, &config.name);
        let limits = Limits {
            max_in_flight: config.max_in_flight,
            max_acked_ahead: config.max_acked_ahead,
        };
        let mut partitions = Vec::with_capacity(config.partitions as usize);
        let mut owned = Vec::new();
        for p in 0..config.partitions {
            if owner(&config.name, p, self.cores) != self.id {
                partitions.push(None);
                continue;
            }
            let wake: Wake = {
                let core = Rc::downgrade(self);
                let signal = signal.clone();
                Rc::new(move |n| {
                    if let Some(core) = core.upgrade() {
                        signal.wake(n, &core.mesh, core.id);
                    }
                })
            };
            let partition = Partition::open(
                self.storage.clone(),
                &dir.join(p.to_string()),
                p,
                self.id,
                self.log_options(),
                limits,
                wake,
            )
            .await
            .map_err(|e| {
                error!(topic = %config.name, partition = p, error = %e, "cannot open partition");
                BrokerError::Storage(e.to_string())
            })?;
            partitions.push(Some(partition));
            owned.push(p);
        }
        let name = config.name.clone();
        let topic = Rc::new(TopicLocal {
            config,
            partitions,
            owned,
            cursor: Cell::new(self.id),
            signal,
            deleted: Cell::new(false),
        });
        self.topics.borrow_mut().insert(name, topic);
        Ok(())
    }

    /// Forgets a topic: wakes its parked consumers, flushes and closes its partitions here.
    pub async fn drop_topic(&self, name: &str) -> BrokerResult<()> {
        self.quarantined.borrow_mut().remove(name);
        let Some(topic) = self.topics.borrow_mut().remove(name) else {
            return Ok(());
        };
        topic.deleted.set(true);
        topic.signal.event.notify(usize::MAX);
        for p in topic.partitions.iter().flatten() {
            p.close_deleted().await;
        }
        Ok(())
    }

    /// Opens every stored topic at boot. A topic that cannot be opened here is not a reason to stay down: it is
    /// returned (name, reason) for quarantine, which every core then applies alike (`quarantine`).
    pub async fn load_topics(self: &Rc<Self>) -> Result<Vec<(String, String)>, String> {
        let dir = self.topics_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        let mut failed = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| e.to_string())?;
            let name = entry.file_name().to_string_lossy().to_string();
            let meta = entry.path().join("topic.json");
            if !meta.exists() {
                continue;
            }
            let config = match TopicConfig::load(&meta) {
                Ok(config) if config.name == name => config,
                // A deleted topic's data left in place by an older release: core 0 trashes it after the load.
                Ok(_) if is_leftover(&name) => continue,
                Ok(config) => {
                    failed.push((
                        name,
                        format!("topic.json names another topic, '{}'", config.name),
                    ));
                    continue;
                }
                Err(e) => {
                    failed.push((name, e));
                    continue;
                }
            };
            if let Err(e) = self.apply_topic(config).await {
                failed.push((name, e.to_string()));
            }
        }
        Ok(failed)
    }

    /// Takes topics that some core could not open out of service on this core: their partitions here close, and
    /// every request naming them answers 503 topic_unavailable until a restart opens them (or they are deleted).
    pub async fn quarantine(&self, topics: &[(String, String)]) {
        for (name, reason) in topics {
            let _ = self.drop_topic(name).await;
            if self.id == 0 {
                error!(topic = %name, reason = %reason, "topic quarantined: it could not be opened at start; it answers 503 topic_unavailable until a restart can open it, or until it is deleted");
            }
            self.quarantined
                .borrow_mut()
                .insert(name.clone(), reason.clone());
        }
        if self.id == 0 {
            info!(
                topics = self.topics.borrow().len(),
                quarantined = topics.len(),
                "topics loaded"
            );
        }
    }

    /// Moves a directory into the trash (same file system), from where it is removed in the background.
    fn trash(&self, dir: &std::path::Path) -> std::io::Result<()> {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let target = self.config.data_dir.join("trash").join(format!(
            "{name}-{}-{}",
            crate::storage::wall_clock_ms(),
            TRASH_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::rename(dir, &target)?;
        remove_in_background(target);
        Ok(())
    }

    /// Empties the trash left by an earlier run, and trashes deleted topics an older release left under topics/
    /// (core 0, at boot, once every core has loaded).
    pub fn empty_trash(&self) {
        if let Ok(entries) = std::fs::read_dir(self.topics_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                let leftover = is_leftover(&name)
                    && TopicConfig::load(&entry.path().join("topic.json"))
                        .is_ok_and(|c| c.name != name);
                if leftover {
                    info!(dir = %entry.path().display(), "moving a deleted topic's leftover data to the trash");
                    if let Err(e) = self.trash(&entry.path()) {
                        warn!(dir = %entry.path().display(), error = %e, "cannot trash a deleted topic's leftover data");
                    }
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(self.config.data_dir.join("trash")) {
            for entry in entries.flatten() {
                remove_in_background(entry.path());
            }
        }
    }

    /// Partitions this node holds over every topic (quarantined ones count by what their metadata says).
    fn partitions_held(&self) -> usize {
        self.topics
            .borrow()
            .values()
            .map(|t| t.config.partitions as usize)
            .sum()
    }

    /// Creates a topic (core 0 only, serialised): checks the node's caps before anything is written, writes
    /// topic.json, then has every core open its partitions. All or nothing: if any core cannot open its share, every
    /// core forgets the topic and its directory goes, so no core is left disagreeing and no restart trips on it.
    pub async fn create_topic(
        self: &Rc<Self>,
        config: TopicConfig,
    ) -> BrokerResult<(bool, TopicConfig)> {
        debug_assert_eq!(self.id, 0);
        let _permit = self
            .admin_lock
            .acquire_permit(1)
            .await
            .map_err(|_| BrokerError::ShuttingDown)?;
        if let Ok(existing) = self.topic(&config.name) {
            if existing.config.partitions == config.partitions {
                return Ok((false, existing.config.clone()));
            }
            return Err(BrokerError::TopicExists {
                topic: config.name.clone(),
                partitions: existing.config.partitions,
            });
        }
        let held_topics = self.topics.borrow().len() + self.quarantined.borrow().len();
        if held_topics >= self.config.max_topics {
            return Err(BrokerError::TopicLimit {
                limit: self.config.max_topics,
            });
        }
        let budget = self.config.partition_budget;
        if self.partitions_held() + config.partitions as usize > budget {
            let reason = if budget < self.config.max_partitions {
                "bounded by the file-descriptor limit; raise it with ulimit -n".to_string()
            } else {
                "max_partitions".to_string()
            };
            return Err(BrokerError::PartitionLimit {
                limit: budget,
                reason: format!("{reason}; {} held now", self.partitions_held()),
            });
        }
        let dir = TopicConfig::dir(&self.config.data_dir, &config.name);
        let storage = |e: std::io::Error| BrokerError::Storage(e.to_string());
        std::fs::create_dir_all(&dir).map_err(storage)?;
        let written = async {
            let json = serde_json::to_vec_pretty(&config).expect("topic config serialises");
            crate::storage::atomic_file::replace(&dir.join("topic.json"), json)
                .await
                .map_err(storage)?;
            crate::storage::atomic_file::sync_dir(&self.topics_dir())
                .await
                .map_err(storage)
        }
        .await;
        let applied = match written {
            Ok(()) => {
                self.broadcast(
                    |core| {
                        let config = config.clone();
                        async move { core.apply_topic(config).await }
                    },
                    |reply| Command::ApplyTopic {
                        config: config.clone(),
                        reply,
                    },
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = applied {
            error!(topic = %config.name, error = %e, "topic creation failed: undoing it on every core");
            let name = config.name.clone();
            let undone = self
                .broadcast(
                    |core| {
                        let name = name.clone();
                        async move { core.drop_topic(&name).await }
                    },
                    |reply| Command::DropTopic {
                        name: name.clone(),
                        reply,
                    },
                )
                .await;
            if let Err(undo) = undone {
                error!(topic = %config.name, error = %undo, "cannot undo a failed topic creation on every core");
            }
            if let Err(trash) = self.trash(&dir) {
                error!(topic = %config.name, error = %trash, "cannot remove a failed topic's directory");
            }
            let _ = crate::storage::atomic_file::sync_dir(&self.topics_dir()).await;
            return Err(match e {
                BrokerError::Storage(text)
                    if text.contains("os error 24") || text.contains("os error 23") =>
                {
                    BrokerError::PartitionLimit {
                        limit: self.partitions_held(),
                        reason: format!("the process ran out of file descriptors: {text}"),
                    }
                }
                other => other,
            });
        }
        info!(topic = %config.name, partitions = config.partitions, "topic created");
        Ok((true, config))
    }

    /// Deletes a topic (core 0 only, serialised): every core closes its partitions, then the directory goes.
    pub async fn delete_topic(self: &Rc<Self>, name: String) -> BrokerResult<()> {
        debug_assert_eq!(self.id, 0);
        let _permit = self
            .admin_lock
            .acquire_permit(1)
            .await
            .map_err(|_| BrokerError::ShuttingDown)?;
        match self.topic(&name) {
            Ok(_) | Err(BrokerError::TopicUnavailable(_)) => {}
            Err(e) => return Err(e),
        }
        self.broadcast(
            |core| {
                let name = name.clone();
                async move { core.drop_topic(&name).await }
            },
            |reply| Command::DropTopic {
                name: name.clone(),
                reply,
            },
        )
        .await?;
        let dir = TopicConfig::dir(&self.config.data_dir, &name);
        let storage = |e: std::io::Error| BrokerError::Storage(e.to_string());
        // Into the trash, outside the topics namespace (the data goes in the background: removing many segment
        // files must not stall this core).
        self.trash(&dir).map_err(storage)?;
        crate::storage::atomic_file::sync_dir(&self.topics_dir())
            .await
            .map_err(storage)?;
        info!(topic = %name, "topic deleted");
        Ok(())
    }

    /// Runs an admin step on this core and on every other core (over the mesh); fails if any fails.
    async fn broadcast<F, Fut>(
        self: &Rc<Self>,
        local: F,
        remote: impl Fn(super::command::Reply<()>) -> Command,
    ) -> BrokerResult<()>
    where
        F: FnOnce(Rc<Core>) -> Fut,
        Fut: std::future::Future<Output = BrokerResult<()>>,
    {
        let mut pending = Vec::new();
        for core in (0..self.cores).filter(|&c| c != self.id) {
            let (tx, rx) = futures_channel::oneshot::channel();
            self.mesh.send(core, remote(tx))?;
            pending.push(rx);
        }
        local(self.clone()).await?;
        for rx in pending {
            rx.await.unwrap_or(Err(BrokerError::ShuttingDown))?;
        }
        Ok(())
    }

    /// The owned partition `p` of `topic`.
    pub fn partition(&self, topic: &str, p: u32) -> BrokerResult<Rc<Partition>> {
        let t = self.topic(topic)?;
        match t.partitions.get(p as usize) {
            Some(Some(partition)) => Ok(partition.clone()),
            Some(None) => Err(BrokerError::Storage(format!(
                "partition {p} of '{topic}' is not owned by core {}",
                self.id
            ))),
            None => Err(BrokerError::PartitionNotFound {
                topic: topic.to_string(),
                partition: p as u64,
            }),
        }
    }

    pub async fn local_produce(&self, topic: &str, p: u32, payload: Bytes) -> BrokerResult<u64> {
        self.partition(topic, p)?.append(payload).await
    }

    /// Tries every owned partition of the topic, round-robin from a moving start. AtCap only when every partition
    /// that had nothing to give was at its cap.
    pub async fn local_take(&self, topic: &str, visibility_ms: Option<u64>) -> BrokerResult<Take> {
        let t = self.topic(topic)?;
        let visibility_ms = visibility_ms.unwrap_or(t.config.visibility_ms);
        let n = t.owned.len();
        let start = t.cursor.get();
        t.cursor.set(start.wrapping_add(1));
        if n == 0 {
            return Ok(Take::NoPartitions);
        }
        let mut all_at_cap = true;
        let mut unavailable = false;
        for i in 0..n {
            let p = t.owned[(start + i) % n];
            let Some(partition) = t.partitions[p as usize].clone() else {
                continue;
            };
            match partition.take(visibility_ms).await? {
                Take::Leased(d) => {
                    self.note_lease(now_ms() + visibility_ms);
                    return Ok(Take::Leased(d));
                }
                Take::AtCap => {}
                Take::Unavailable => unavailable = true,
                Take::Empty | Take::NoPartitions => all_at_cap = false,
            }
        }
        Ok(if unavailable {
            Take::Unavailable
        } else if all_at_cap {
            Take::AtCap
        } else {
            Take::Empty
        })
    }

    pub async fn local_settle(
        &self,
        topic: &str,
        p: u32,
        offset: u64,
        nonce: u64,
        op: SettleOp,
    ) -> BrokerResult<()> {
        let partition = self.partition(topic, p)?;
        partition.settle(offset, nonce, op).await?;
        if let (SettleOp::Extend(_), Some(deadline)) = (op, partition.next_expiry_ms()) {
            self.note_lease(deadline);
        }
        Ok(())
    }

    /// Tells the expiry task about a new deadline if it is earlier than the one it sleeps to.
    fn note_lease(&self, expires_at_ms: u64) {
        if expires_at_ms < self.expiry_deadline.get() {
            self.expiry_deadline.set(expires_at_ms);
            self.expiry_rearm.notify(1);
        }
    }

    /// Reads a record for replay, long-polling up to `wait_ms` for an offset at the end.
    pub async fn local_replay(
        &self,
        topic: &str,
        p: u32,
        offset: u64,
        wait_ms: u64,
    ) -> BrokerResult<Option<Record>> {
        let partition = self.partition(topic, p)?;
        let deadline = now_ms() + wait_ms;
        loop {
            let listener = partition.log.listen_appended();
            if let Some(record) = partition.replay(offset).await? {
                return Ok(Some(record));
            }
            let now = now_ms();
            if now >= deadline || self.stopping.get() {
                return Ok(None);
            }
            let wait = Duration::from_millis(deadline - now);
            let stop = self.stop_event.listen();
            if self.stopping.get() {
                return Ok(None);
            }
            let _ = glommio::timer::timeout(wait, async {
                futures_lite::future::or(listener, stop).await;
                Ok(())
            })
            .await;
        }
    }

    pub async fn local_describe(&self, topic: &str) -> BrokerResult<Vec<PartitionInfo>> {
        let t = self.topic(topic)?;
        let mut out = Vec::new();
        for p in t.partitions.iter().flatten() {
            out.push(p.info().await);
        }
        Ok(out)
    }

    pub async fn local_stats(&self) -> CoreStats {
        let mut partitions = Vec::new();
        for (topic, p) in self.owned_partitions() {
            partitions.push((topic.config.name.clone(), p.info().await));
        }
        partitions.sort_by(|a, b| (&a.0, a.1.partition).cmp(&(&b.0, b.1.partition)));
        let m = &self.metrics;
        CoreStats {
            core: self.id,
            requests: m.requests.get(),
            latency_us: m.latency_us.borrow().clone(),
            connections_open: m.connections_open.get(),
            connections_refused: m.connections_refused.get(),
            connections_timed_out: m.connections_timed_out.get(),
            mesh_full: self.mesh.full.get(),
            partitions,
        }
    }

    /// Records that core `from` has consumers parked on `topic`.
    fn note_interest(&self, topic: &str, from: usize) {
        if let Ok(t) = self.topic(topic) {
            // The consumer's TryConsume follows this on the same FIFO channel, so anything that becomes
            // deliverable from here on is covered by the wake; nothing earlier is missed.
            t.signal.remote_interest.borrow_mut()[from] = true;
        }
    }

    /// Core `from` reported something deliverable on `topic`.
    fn note_wake(&self, topic: &str, from: usize) {
        if let Ok(t) = self.topic(topic) {
            t.signal.registered.borrow_mut()[from] = false;
            t.signal.event.notify(usize::MAX);
        }
    }

    /// Asks core `to` to wake this core on `topic`, unless already asked.
    pub fn register_interest(&self, topic: &TopicLocal, to: usize) {
        let mut registered = topic.signal.registered.borrow_mut();
        if !registered[to] {
            let command = Command::Interest {
                topic: topic.config.name.clone(),
                from: self.id,
            };
            if self.mesh.send(to, command).is_ok() {
                registered[to] = true;
            }
        }
    }

    /// Enters shutdown: parked consumers and idle connections let go.
    pub fn begin_stop(&self) {
        self.stopping.set(true);
        self.stop_event.notify(usize::MAX);
        for topic in self.topics.borrow().values() {
            topic.signal.event.notify(usize::MAX);
        }
    }

    /// Flushes every frontier and closes every log this core owns (shutdown).
    pub async fn close_all(&self) {
        for (_, p) in self.owned_partitions() {
            p.close().await;
        }
    }

    /// Executes a command that arrived from another core. One-way signals run inline (so they keep their order
    /// relative to later requests); requests run as their own tasks so a long-poll never blocks the pump.
    pub fn serve_command(self: &Rc<Self>, command: Command) {
        let core = self.clone();
        match command {
            Command::Interest { topic, from } => self.note_interest(&topic, from),
            Command::Wake { topic, from } => self.note_wake(&topic, from),
            Command::Describe { topic, reply } => spawn(async move {
                let _ = reply.send(core.local_describe(&topic).await);
            }),
            Command::Stats { reply } => spawn(async move {
                let _ = reply.send(Ok(core.local_stats().await));
            }),
            Command::Settle {
                topic,
                partition,
                offset,
                nonce,
                op,
                reply,
            } => spawn(async move {
                let _ = reply.send(
                    core.local_settle(&topic, partition, offset, nonce, op)
                        .await,
                );
            }),
            Command::CreateTopic { config, reply } => spawn(async move {
                let _ = reply.send(core.create_topic(config).await);
            }),
            Command::DeleteTopic { name, reply } => spawn(async move {
                let _ = reply.send(core.delete_topic(name).await);
            }),
            Command::ApplyTopic { config, reply } => spawn(async move {
                let _ = reply.send(core.apply_topic(config).await);
            }),
            Command::DropTopic { name, reply } => spawn(async move {
                let _ = reply.send(core.drop_topic(&name).await);
            }),
            Command::Produce {
                topic,
                partition,
                payload,
                reply,
            } => spawn(async move {
                let _ = reply.send(core.local_produce(&topic, partition, payload).await);
            }),
            Command::TryConsume {
                topic,
                visibility_ms,
                reply,
            } => spawn(async move {
                let _ = reply.send(core.local_take(&topic, visibility_ms).await);
            }),
            Command::Replay {
                topic,
                partition,
                offset,
                wait_ms,
                reply,
            } => spawn(async move {
                let _ = reply.send(core.local_replay(&topic, partition, offset, wait_ms).await);
            }),
        }
    }
}

/// A directory an older release renamed a deleted topic to (`.deleted-{name}-{ms}`, its topic.json still naming
/// the old topic).
fn is_leftover(dir_name: &str) -> bool {
    dir_name.starts_with(".deleted-")
}

/// Makes trash names unique within a process.
static TRASH_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Removes a renamed-away topic directory on a plain thread (it is no longer reachable by any core).
fn remove_in_background(dir: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("berth-remove".into())
        .spawn(move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a deleted topic's data");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the removal thread; deleted data stays until the next start");
    }
}

fn spawn(future: impl std::future::Future<Output = ()> + 'static) {
    glommio::spawn_local(future).detach();
}
