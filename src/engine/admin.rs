//! Topic administration on one core: loading topics at boot (and quarantining what cannot open), creating, changing
//! and deleting them (core 0 serialises these and has every core apply them through `Peers`), and the trash that
//! deleted data goes through. Runs on the core that owns the engine.

use super::placement::{self, Location, PartitionState};
use super::topic::{new_topic_id, Replicas, Topic, TopicConfig, TOPIC_FORMAT};
use super::{AdminStep, Engine, EngineError, EngineResult};
use crate::partition::{Partition, PartitionSetup};
use crate::storage::backend::Storage;
use crate::storage::log::LogOptions;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tracing::{error, info, warn};

/// Makes trash names unique within a process.
static TRASH_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A directory an older release renamed a deleted topic to (`.deleted-{name}-{ms}`, its topic.json still naming
/// the old topic).
fn is_leftover(dir_name: &str) -> bool {
    dir_name.starts_with(".deleted-")
}

/// A view of a topic older than the one applied, partition by partition (a metastore read of the topic key alone
/// carries each partition's state as the topic's creation placed it; a snapshot can be overtaken by a newer one):
/// a partition never moves back to an older epoch, its state and location stay as they are. Epochs are etcd
/// revisions, so a newer leadership always has the greater one.
fn newer_per_partition(
    existing: &Topic,
    mut locations: Vec<Location>,
    mut states: Vec<PartitionState>,
) -> (Vec<Location>, Vec<PartitionState>) {
    let (current, placed) = (existing.states(), existing.locations());
    if states.len() == current.len() && locations.len() == placed.len() {
        for p in 0..states.len() {
            if current[p].epoch > states[p].epoch {
                states[p] = current[p].clone();
                locations[p] = placed[p];
            }
        }
    }
    (locations, states)
}

impl Engine {
    pub fn topics_dir(&self) -> PathBuf {
        self.config.data_dir.join("topics")
    }

    /// Topic and group administration is serialised (on core 0): the permit is held for the whole change.
    pub(super) async fn admin_permit(&self) -> EngineResult<glommio::sync::Permit<'_>> {
        self.admin_lock
            .acquire_permit(1)
            .await
            .map_err(|_| EngineError::ShuttingDown)
    }

    fn log_options(&self) -> LogOptions {
        LogOptions {
            segment_bytes: self.config.segment_bytes,
            max_payload: (self.config.max_message_bytes + crate::storage::meta::MAX_OVERHEAD)
                as u32,
            fsync: self.config.fsync,
            tail_cache_bytes: self.config.tail_cache_bytes,
            write_behind_bytes: self.config.write_behind_bytes,
        }
    }

    /// Learns a topic and opens the partitions this core owns (recovery runs inside `Partition::open`), and, in a
    /// replicated topic, this node's follower replicas that live on this core (`followers[p]`: partition `p`'s
    /// replicas other than its leader; empty when the topic is not replicated).
    pub async fn apply_topic(
        self: &Rc<Self>,
        config: TopicConfig,
        locations: Vec<Location>,
        states: Vec<PartitionState>,
    ) -> EngineResult<()> {
        let existing = self.topics.borrow().get(&config.name).cloned();
        if let Some(existing) = existing {
            if existing.id() == config.id {
                let (locations, states) = newer_per_partition(&existing, locations, states);
                // A partition led here that another node now leads stops serving at once (it is deposed), whatever
                // else this view changes.
                let node = self.node.get();
                for p in existing.owned_partitions() {
                    if let Some(s) = states.get(p.id as usize) {
                        if s.leader != node && s.epoch > existing.epoch(p.id) {
                            p.depose(s.epoch);
                        }
                    }
                }
                // A replicated partition led here whose metadata names this node leader again at a newer epoch:
                // another leader may have served in between (one that fenced a majority this node was not in), so
                // it begins this leadership as a promoted follower does, with a fencing round, serving nothing
                // until the round is won (before anything awaits).
                // (So does one whose replica set changed: it gained its first follower, or lost its last one.)
                let led: Vec<Rc<Partition>> = existing
                    .owned_partitions()
                    .filter(|p| {
                        states.get(p.id as usize).is_some_and(|s| {
                            (!existing.followers(p.id).is_empty() || s.replicas.len() > 1)
                                && s.leader == node
                                && s.epoch > existing.epoch(p.id)
                                && p.deposed().is_none()
                        })
                    })
                    .collect();
                for p in &led {
                    let s = &states[p.id as usize];
                    p.set_learners(&s.learners);
                    p.prepare_to_lead(s.epoch, s.replicas.len() as u32);
                }
                // Cluster mode: the same topic, perhaps with another node's partitions on other cores now, or a
                // partition's leadership moved to or from a replica on this core.
                let moves = if *existing.locations() != *locations {
                    existing
                        .relocate(locations, &states, self.id as u32, self.cores)
                        .map_err(|why| {
                            EngineError::Storage(format!(
                                "topic '{}' cannot take its new locations: {why}",
                                config.name
                            ))
                        })?
                } else {
                    Default::default()
                };
                // Before anything awaits: a replica about to lead serves nothing until it leads.
                for (p, partition) in &moves.lead {
                    let s = &states[*p as usize];
                    partition.set_learners(&s.learners);
                    partition.prepare_to_lead(s.epoch, s.replicas.len() as u32);
                }
                let to_lead: Vec<(u32, Rc<Partition>, PartitionState)> = {
                    // And a partition led here that is deposed at or below the epoch its metadata names this node
                    // leader at (a promotion that failed, or a deposition by a leadership this view skipped): it
                    // leads again.
                    let retry = existing.owned_partitions().filter_map(|partition| {
                        let s = states.get(partition.id as usize)?;
                        let deposed = partition.deposed()?;
                        (s.leader == node
                            && (s.replicas.len() > 1
                                || led.iter().any(|l| Rc::ptr_eq(l, &partition)))
                            && deposed <= s.epoch
                            && partition.round_under_way() != Some(s.epoch)
                            // (Not at the epoch a restarted leader waits to leave: `Partition::renew`.)
                            && partition.renewing().is_none_or(|r| s.epoch > r)
                            && !moves.lead.iter().any(|(p, _)| *p == partition.id))
                        .then(|| (partition.id, partition.clone(), s.clone()))
                    });
                    moves
                        .lead
                        .iter()
                        .map(|(p, partition)| (*p, partition.clone(), states[*p as usize].clone()))
                        .chain(retry)
                        .collect()
                };
                let epochs: Vec<u64> = states.iter().map(|s| s.epoch).collect();
                let changed = (!states.is_empty()).then(|| states.clone());
                if !states.is_empty() {
                    existing.set_states(states);
                }
                for (p, partition) in moves.follow {
                    partition.follow(epochs[p as usize]).await;
                }

                for (p, partition, s) in &to_lead {
                    let wake = self.consumer_wake(&config.name, *p);
                    partition.set_learners(&s.learners);
                    partition.lead(s.epoch, s.replicas.len() as u32, wake).await;
                    self.ship_from(partition);
                    // It serves once its fencing round is won (`front/round.rs`, then `finish_round`).
                    self.begin_round(&config.name, config.id, *p, s.epoch);
                }
                // Replicas gained or lost here, after the leaders above were started (a journal checkpoint may run
                // first); a failure fails the view, which core 0 then applies again.
                if let Some(states) = changed {
                    self.change_members(&existing, &config, &states).await?;
                }
                return Ok(());
            }
        }
        let mine = Location {
            node: self.node.get(),
            core: self.id as u32,
        };
        let states = if states.is_empty() {
            locations
                .iter()
                .map(|l| PartitionState::initial(l.node, config.id))
                .collect()
        } else {
            states
        };
        let followers = placement::followers(&states);
        let mut partitions = Vec::with_capacity(config.partitions as usize);
        let mut followed = Vec::with_capacity(followers.len());
        let mut opened_all = Ok(());
        let mut rounds = Vec::new();
        let mut renewals = Vec::new();
        for (p, location) in locations.iter().enumerate() {
            let p = p as u32;
            let follows_here = location.node != mine.node
                && placement::replica_core(&config.name, &states, mine.node, p, self.cores)
                    == Some(mine.core);
            if *location == mine {
                match self.open_partition(&config, p, true).await {
                    Ok(partition) => {
                        if let Some(f) = followers.get(p as usize).filter(|f| !f.is_empty()) {
                            if let Some(s) = states.get(p as usize) {
                                partition.set_learners(&s.learners);
                            }
                            // Its records from its log's end on are this epoch's, durably before it serves.
                            let epoch = states.get(p as usize).map_or(config.id, |s| s.epoch);
                            let began = partition
                                .epoch_history()
                                .last()
                                .is_some_and(|last| last.epoch >= epoch);
                            if partition.epoch_floor() > epoch {
                                // It answered a newer leader's fencing round before a restart: it leads no more.
                                partition.depose(partition.epoch_floor());
                            } else if !began && (epoch != config.id || partition.is_learner()) {
                                // Named leader at an epoch it never began leading at (elected, then stopped before
                                // its round was won): it runs the round first. (At the topic's creation epoch no
                                // leadership came before, unless this replica is a learner: its disk lost what it
                                // led with, and the round hands the leadership to the greatest log.)
                                partition.prepare_to_lead(epoch, f.len() as u32 + 1);
                                rounds.push((p, epoch, f.len() as u32 + 1));
                            } else if began
                                && !crate::planted::planted(crate::planted::Bug::NoRenewal)
                            {
                                // Led at this epoch before a restart: what it shipped before its own sync may be
                                // on its followers and not here, so it leads again only at a newer epoch, after a
                                // fencing round (`Ship::Renew`); until then it serves nothing.
                                partition.renew(epoch, f.len() as u32 + 1);
                                renewals.push((p, epoch));
                            }
                            if rounds.last().is_none_or(|&(r, _, _)| r != p)
                                && renewals.last().is_none_or(|&(r, _)| r != p)
                            {
                                if let Err(e) = partition
                                    .begin_leading(epoch, partition.log.end_offset())
                                    .await
                                {
                                    partition.close_deleted().await;
                                    opened_all = Err((p, std::io::Error::other(e.to_string())));
                                    break;
                                }
                                // No round: its nonces wait for a majority's promise at the first take.
                                self.open_nonces_later(
                                    &config.name,
                                    config.id,
                                    p,
                                    epoch,
                                    &partition,
                                );
                            }
                            // Only what a majority has is served, and produces wait for it.
                            partition.set_replicas(f.len() as u32 + 1);
                            self.ship_from(&partition);
                        }
                        partitions.push(Some(partition));
                    }
                    Err(e) => {
                        opened_all = Err((p, e));
                        break;
                    }
                }
            } else {
                partitions.push(None);
            }
            if follows_here {
                // A replica a move added (not one the creation placed), or one the partition key still names a
                // learner: opened from nothing (this node restarted before it opened it), it is a learner.
                let added = states.get(p as usize).and_then(|s| {
                    (s.learners.contains(&mine.node) || !s.placed().contains(&mine.node))
                        .then_some(s.epoch)
                });
                match self.open_replica(&config, p, false, added).await {
                    Ok(partition) => followed.push(Some(partition)),
                    Err(e) => {
                        opened_all = Err((p, e));
                        break;
                    }
                }
            } else if !followers.is_empty() {
                followed.push(None);
            }
        }
        if let Err((p, e)) = opened_all {
            error!(topic = %config.name, partition = p, error = %e, "cannot open partition");
            // Close what this core opened of the topic: nothing half-open stays behind.
            for opened in partitions.iter().chain(&followed).flatten() {
                opened.close_deleted().await;
            }
            return Err(EngineError::Storage(e.to_string()));
        }
        let name = config.name.clone();
        let topic = Rc::new(Topic::new(
            config,
            locations,
            partitions,
            self.id,
            self.node.get(),
            Replicas {
                followers,
                followed,
                states,
            },
        ));
        self.topics.borrow_mut().insert(name.clone(), topic.clone());
        self.probe_followers(&topic);
        for (p, epoch, replicas) in rounds {
            if let Some(partition) = topic.owned_partition(p) {
                partition
                    .lead(epoch, replicas, self.consumer_wake(&name, p))
                    .await;
            }
            self.begin_round(&name, topic.id(), p, epoch);
        }
        for (p, epoch) in renewals {
            self.renew_leadership(&name, topic.id(), p, epoch);
        }
        Ok(())
    }

    /// A view of an open topic whose replica sets changed for this node (a drain, a removal: `front::mover`): this
    /// core opens the follower replicas it gains, each as a learner on an empty directory (whatever an older
    /// replica of this node left there goes to the trash first: a replica added to a set holds nothing until its
    /// leader has caught it up and promoted it), and closes those it holds no more, their directories to the trash.
    async fn change_members(
        self: &Rc<Self>,
        topic: &Rc<Topic>,
        config: &TopicConfig,
        states: &[PartitionState],
    ) -> EngineResult<()> {
        let (open, leave) = topic.membership(states, self.id as u32, self.cores);
        if open.is_empty()
            && leave.is_empty()
            && *topic.all_followers() == *placement::followers(states)
        {
            return Ok(());
        }
        let dir = TopicConfig::dir(&self.config.data_dir, &config.name);
        let storage = |e: std::io::Error| EngineError::Storage(e.to_string());
        let mut opened = Vec::with_capacity(open.len());
        let mut failed = None;
        // The core's journal may still hold entries of a replica this node had of these partitions before: they go
        // to their segments now, so that a replay at the next start never writes them into what replaces them.
        let checkpointed = async {
            match self.journal() {
                Some(journal) => journal
                    .checkpoint_now()
                    .await
                    .map_err(|e| EngineError::Storage(format!("journal checkpoint: {e:?}"))),
                None => Ok(()),
            }
        };
        if !open.is_empty() {
            if let Err(e) = checkpointed.await {
                error!(topic = %config.name, error = %e, "cannot open a replica this node was given");
                return Err(e);
            }
        }
        for p in open {
            let partition_dir = dir.join(p.to_string());
            if self.storage.list(&partition_dir).is_ok() {
                if let Err(e) = self.trash(&partition_dir) {
                    failed = Some(storage(e));
                    break;
                }
            }
            let epoch = states[p as usize].epoch;
            match self.open_replica(config, p, false, Some(epoch)).await {
                Ok(partition) => {
                    info!(topic = %config.name, partition = p, epoch, "this node is a new replica of the partition: a learner until its leader has caught it up");
                    opened.push((p, partition));
                }
                Err(e) => {
                    failed = Some(storage(e));
                    break;
                }
            }
        }
        let left = topic.set_members(states, opened, &leave);
        for partition in &left {
            partition.depose(u64::MAX);
            // Closed first: a batch its writer had queued is journaled before the checkpoint below.
            partition.close_deleted().await;
        }
        // What the journal holds of them goes to their segments before their directories go (see above).
        let flushed = if left.is_empty() {
            Ok(())
        } else {
            match self.journal() {
                Some(journal) => journal.checkpoint_now().await.map_err(|e| format!("{e:?}")),
                None => Ok(()),
            }
        };
        for partition in left {
            let partition_dir = dir.join(partition.id.to_string());
            if let Err(e) = &flushed {
                warn!(topic = %config.name, partition = partition.id, error = %e, "a replica this node no longer holds stays on disk: the journal could not be checkpointed");
                continue;
            }
            info!(topic = %config.name, partition = partition.id, "this node is no longer a replica of the partition: its data goes to the trash");
            if let Err(e) = self.trash(&partition_dir) {
                warn!(topic = %config.name, partition = partition.id, error = %e, "cannot trash a replica this node no longer holds");
            }
        }
        match failed {
            Some(e) => {
                error!(topic = %config.name, error = %e, "cannot open a replica this node was given");
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Opens partition `p` of a topic on this core: as its leader (`leads`: it serves consumers, wakes them as
    /// records arrive) or as a follower replica (its log takes what the leader ships; nothing is served from it).
    async fn open_partition(
        self: &Rc<Self>,
        config: &TopicConfig,
        p: u32,
        leads: bool,
    ) -> std::io::Result<Rc<Partition>> {
        self.open_replica(config, p, leads, None).await
    }

    /// `open_partition`, and with `added` (the epoch of the replica set that added this node) a learner if its
    /// directory holds no log.
    async fn open_replica(
        self: &Rc<Self>,
        config: &TopicConfig,
        p: u32,
        leads: bool,
        added: Option<u64>,
    ) -> std::io::Result<Rc<Partition>> {
        let wake: crate::partition::Wake = if leads {
            self.consumer_wake(&config.name, p)
        } else {
            Rc::new(|_, _| {})
        };
        let dir = TopicConfig::dir(&self.config.data_dir, &config.name);
        // A replicated topic older than this node's disk (`storage::learner`): a replica opened from nothing is a
        // learner. (A small file read at each open: opens are rare, and the file is written once, at start.)
        let learner_if_new = if added.is_some() {
            added
        } else if config.replicas > 1 && self.clustered() {
            crate::storage::learner::read_joined_in(&*self.storage, &self.config.data_dir)?
                .filter(|&revision| config.id <= revision)
        } else {
            None
        };
        Partition::open(PartitionSetup {
            storage: self.storage.clone(),
            clock: self.clock.clone(),
            dir: dir.join(p.to_string()),
            id: p,
            core: self.id,
            log_options: self.log_options(),
            journal: self
                .journal()
                .map(|journal| crate::storage::log::JournalLink {
                    journal,
                    topic: config.name.clone(),
                    topic_id: config.id,
                    partition: p,
                }),
            limits: config.limits(),
            redelivery: config.redelivery(),
            groups: config.all_groups(),
            wake,
            learner_if_new,
            fifo: config.fifo,
        })
        .await
        .inspect(|partition| partition.set_lease_ms(self.replica_lease_ms()))
    }

    /// The wake-up of partition `p` of topic `name` led here: its consumers hear of what became deliverable.
    fn consumer_wake(self: &Rc<Self>, name: &str, p: u32) -> crate::partition::Wake {
        let engine = Rc::downgrade(self);
        let name = name.to_string();
        Rc::new(move |group, n| {
            if let Some(engine) = engine.upgrade() {
                if let Ok(topic) = engine.topic(&name) {
                    topic.mark_ready(group, p);
                }
                engine.deliverable(&name, group, n);
            }
        })
    }

    /// A replicated partition led here: its followers get every batch once it is written here (before its sync,
    /// `[cluster] replica_ship_early`), or once it is durable here.
    fn ship_from(self: &Rc<Self>, partition: &Partition) {
        let cluster = self.config.cluster.as_ref();
        partition
            .log
            .gather_behind_commit(cluster.map_or(0, |c| c.replica_gather_us));
        partition
            .log
            .ship_before_sync(cluster.is_some_and(|c| c.replica_ship_early));
        let engine = Rc::downgrade(self);
        partition.log.set_on_ship(Box::new(move |head, frames| {
            if let Some(engine) = engine.upgrade() {
                engine.ship(head, frames);
            }
        }));
    }

    /// Forgets a topic: wakes its parked consumers, closes its partitions here without writing to their files.
    pub async fn drop_topic(&self, name: &str) -> EngineResult<()> {
        self.quarantined.borrow_mut().remove(name);
        let Some(topic) = self.topics.borrow_mut().remove(name) else {
            return Ok(());
        };
        topic.mark_deleted();
        let queues: Vec<_> = self
            .waiters
            .borrow()
            .iter()
            .filter(|((t, _), _)| t == name)
            .map(|(_, q)| q.clone())
            .collect();
        for q in queues {
            q.wake(usize::MAX);
        }
        // Queues kept empty for the next consume go with the topic (parked consumers release theirs as they leave).
        self.waiters
            .borrow_mut()
            .retain(|(t, _), q| t != name || !q.is_empty());
        self.interest.borrow_mut().retain(|(t, _), _| t != name);
        self.pending_wakes
            .borrow_mut()
            .retain(|(_, t, _), _| t != name);
        for p in topic.owned_partitions().chain(topic.followed_partitions()) {
            p.close_deleted().await;
        }
        Ok(())
    }

    /// New settings for a known topic, on this core: new groups join its partitions, removed ones leave them (their
    /// parked consumers are woken to find the group gone, their frontier files removed).
    pub async fn update_topic(&self, config: TopicConfig) -> EngineResult<()> {
        let topic = self.topic(&config.name)?;
        if topic.id() != config.id {
            return Err(EngineError::TopicNotFound(config.name));
        }
        let old = topic.config();
        let added: Vec<String> = config
            .groups
            .iter()
            .filter(|g| !old.has_group(g))
            .cloned()
            .collect();
        let removed: Vec<String> = old
            .groups
            .iter()
            .filter(|g| !config.has_group(g))
            .cloned()
            .collect();
        topic.set_config(config);
        // Follower replicas too: their groups' frontiers come from their leaders (`Partition::follow_frontiers`).
        for p in topic.owned_partitions().chain(topic.followed_partitions()) {
            for g in &added {
                p.add_group(g);
            }
            for g in &removed {
                p.remove_group(g).await;
            }
        }
        for p in topic.followed_partitions() {
            for g in &removed {
                // (A leader's own start record does this when it prepares the new group.)
                if let Err(e) = p.journal_group_gone(g).await {
                    warn!(topic = %topic.name(), partition = p.id, group = %g, error = %e, "cannot record a deleted group in the journal");
                }
            }
        }
        for g in &removed {
            let key = (topic.name(), g.clone());
            let queue = self.waiters.borrow().get(&key).cloned();
            if let Some(q) = queue {
                q.wake(usize::MAX);
                // A queue kept empty for the next consume goes with its group.
                if q.is_empty() {
                    self.waiters.borrow_mut().remove(&key);
                }
            }
        }
        Ok(())
    }

    /// Writes a new group's frontier files for the partitions this core owns.
    async fn prepare_group(
        &self,
        topic: &str,
        topic_id: u64,
        group: &str,
        latest: bool,
    ) -> EngineResult<()> {
        let topic = self.topic_of(topic, topic_id)?;
        for p in topic.owned_partitions() {
            let start = p
                .write_start(group, latest)
                .await
                .map_err(EngineError::Partition)?;
            if p.replicated() {
                // Its followers start the group where this leader did (not at their own ends).
                self.ship_frontiers(&[crate::storage::journal::FrontierRecord {
                    topic: topic.name(),
                    topic_id: topic.id(),
                    partition: p.id,
                    group: group.to_string(),
                    committed: start,
                    start: true,
                    acked: Vec::new(),
                }]);
            }
        }
        Ok(())
    }

    /// Applies an admin step on this core.
    pub async fn apply_step(self: &Rc<Self>, step: AdminStep) -> EngineResult<()> {
        match step {
            AdminStep::Apply(config, locations, states) => {
                self.apply_topic(config, locations, states).await
            }
            AdminStep::Drop(name) => self.drop_topic(&name).await,
            AdminStep::Update(config) => self.update_topic(config).await,
            AdminStep::PrepareGroup {
                topic,
                topic_id,
                group,
                latest,
            } => self.prepare_group(&topic, topic_id, &group, latest).await,
            AdminStep::Cluster(view) => {
                self.set_cluster_view(view);
                Ok(())
            }
        }
    }

    /// Applies a step here and on every other core; the first failure, after every core answered.
    pub(crate) async fn everywhere(self: &Rc<Self>, step: AdminStep) -> EngineResult<()> {
        let peers = self.peers.borrow().clone();
        let remote = async {
            match &peers {
                Some(peers) => peers.broadcast(step.clone()).await,
                None => Vec::new(),
            }
        };
        let (local, remote) =
            futures_lite::future::zip(self.apply_step(step.clone()), remote).await;
        local?;
        remote.into_iter().collect()
    }

    /// Opens every stored topic at boot. A topic that cannot be opened here is not a reason to stay down: it is
    /// returned (name, reason) for quarantine, which every core then applies alike (`quarantine`).
    pub async fn load_topics(self: &Rc<Self>) -> Result<Vec<(String, String)>, String> {
        self.start_journal().await?;
        if self.clustered() {
            // The metastore says which topics exist and where their partitions are: core 0 opens them once it is
            // registered (`learn_topic`).
            return Ok(Vec::new());
        }
        let dir = self.topics_dir();
        let mut names = match self.storage.list_dirs(&dir) {
            Ok(names) => names,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        names.sort();
        let mut failed = Vec::new();
        for name in names {
            let meta = dir.join(&name).join("topic.json");
            let config = match TopicConfig::load(&*self.storage, &meta) {
                Err(_)
                    if !self
                        .storage
                        .list(&dir.join(&name))
                        .is_ok_and(|f| f.iter().any(|f| f == "topic.json")) =>
                {
                    // No metadata (a directory that is not a topic): ignored.
                    continue;
                }
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
            let locations =
                placement::on_node(&config.name, config.partitions, self.node.get(), self.cores);
            if let Err(e) = self.apply_topic(config, locations, Vec::new()).await {
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
    fn trash(&self, dir: &Path) -> std::io::Result<()> {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let target = self.config.data_dir.join("trash").join(format!(
            "{name}-{}-{}",
            self.clock.wall_ms(),
            TRASH_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        self.storage.rename(dir, &target)?;
        self.storage.remove_tree(&target);
        Ok(())
    }

    /// Empties the trash left by an earlier run, and trashes deleted topics an older release left under topics/
    /// (core 0, at boot, once every core has loaded).
    pub fn empty_trash(&self) {
        let topics = self.topics_dir();
        for name in self.storage.list_dirs(&topics).unwrap_or_default() {
            let path = topics.join(&name);
            let leftover = is_leftover(&name)
                && TopicConfig::load(&*self.storage, &path.join("topic.json"))
                    .is_ok_and(|c| c.name != name);
            if leftover {
                info!(dir = %path.display(), "moving a deleted topic's leftover data to the trash");
                if let Err(e) = self.trash(&path) {
                    warn!(dir = %path.display(), error = %e, "cannot trash a deleted topic's leftover data");
                }
            }
        }
        let trash = self.config.data_dir.join("trash");
        for name in self.storage.list_dirs(&trash).unwrap_or_default() {
            self.storage.remove_tree(&trash.join(name));
        }
    }

    /// Partitions this node holds (opens on one of its cores) over every topic.
    fn partitions_held(&self) -> usize {
        let me = self.node.get();
        self.topics
            .borrow()
            .values()
            .map(|t| {
                let led = t.locations().iter().filter(|l| l.node == me).count();
                let followed = t.all_followers().iter().filter(|f| f.contains(&me)).count();
                led + followed
            })
            .sum()
    }

    /// This node's caps, checked before a topic is opened here, whether created through this node or learnt from
    /// the cluster: `max_topics`, and the partition budget (`max_partitions`, lowered by the file-descriptor limit)
    /// for `partitions` more partitions held here.
    fn check_caps(&self, partitions: usize) -> EngineResult<()> {
        let held_topics = self.topics.borrow().len() + self.quarantined.borrow().len();
        if held_topics >= self.config.max_topics {
            return Err(EngineError::TopicLimit {
                limit: self.config.max_topics,
            });
        }
        let budget = self.config.partition_budget;
        let held = self.partitions_held();
        if held + partitions > budget {
            let reason = if budget < self.config.max_partitions {
                "bounded by the file-descriptor limit; raise it with ulimit -n"
            } else {
                "max_partitions"
            };
            return Err(EngineError::PartitionLimit {
                limit: budget,
                reason: format!("{reason}; {held} held now"),
            });
        }
        Ok(())
    }

    /// Writes a topic's metadata durably.
    async fn write_meta(&self, config: &TopicConfig) -> EngineResult<()> {
        let storage = |e: std::io::Error| EngineError::Storage(e.to_string());
        let dir = TopicConfig::dir(&self.config.data_dir, &config.name);
        let json = serde_json::to_vec_pretty(config).expect("topic config serialises");
        self.storage
            .replace(&dir.join("topic.json"), json)
            .await
            .map_err(storage)
    }

    /// Creates a topic (core 0 only, serialised): checks the node's caps before anything is written, writes
    /// topic.json, then has every core open its partitions. All or nothing: if any core cannot open its share, every
    /// core forgets the topic and its directory goes, so no core is left disagreeing and no restart trips on it.
    /// Returns (created, the topic's settings).
    pub async fn create_topic(
        self: &Rc<Self>,
        mut config: TopicConfig,
    ) -> EngineResult<(bool, TopicConfig)> {
        assert_eq!(self.id, 0, "topics are created on core 0");
        let _permit = self.admin_permit().await?;
        match self.topic(&config.name) {
            Ok(existing) if existing.partition_count() == config.partitions => {
                return Ok((false, (*existing.config()).clone()));
            }
            Ok(existing) => {
                return Err(EngineError::TopicExists {
                    topic: config.name.clone(),
                    partitions: existing.partition_count(),
                });
            }
            Err(EngineError::TopicNotFound(_)) => {}
            Err(e) => return Err(e),
        }
        self.check_dead_letter(&config)?;
        if self.metadata().is_none() && config.replicas != 1 {
            return Err(EngineError::InvalidSetting(format!(
                "replicas={} needs a cluster of at least that many nodes; a single node holds one replica",
                config.replicas
            )));
        }
        // Cluster mode: before the metastore places it, every partition is counted as if it landed here.
        self.check_caps(config.partitions as usize)?;
        config.format = TOPIC_FORMAT;
        if config.created_ms == 0 {
            config.created_ms = self.clock().wall_ms();
            config.modified_ms = config.created_ms;
        }
        if let Some(metadata) = self.metadata() {
            let (created, (config, locations, states)) = metadata.create_topic(config).await?;
            self.materialise(config.clone(), locations, states).await?;
            if created {
                info!(topic = %config.name, partitions = config.partitions, "topic created in the cluster");
            }
            return Ok((created, config));
        }
        config.id = new_topic_id();
        let dir = TopicConfig::dir(&self.config.data_dir, &config.name);
        let storage = |e: std::io::Error| EngineError::Storage(e.to_string());
        self.storage.create_dir_all(&dir).map_err(storage)?;
        let written = async {
            self.write_meta(&config).await?;
            self.storage
                .sync_dir(&self.topics_dir())
                .await
                .map_err(storage)
        }
        .await;
        let locations =
            placement::on_node(&config.name, config.partitions, self.node.get(), self.cores);
        let applied = match written {
            Ok(()) => {
                self.everywhere(AdminStep::Apply(config.clone(), locations, Vec::new()))
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = applied {
            error!(topic = %config.name, error = %e, "topic creation failed: undoing it on every core");
            if let Err(undo) = self.everywhere(AdminStep::Drop(config.name.clone())).await {
                error!(topic = %config.name, error = %undo, "cannot undo a failed topic creation on every core");
            }
            if let Err(trash) = self.trash(&dir) {
                error!(topic = %config.name, error = %trash, "cannot remove a failed topic's directory");
            }
            let _ = self.storage.sync_dir(&self.topics_dir()).await;
            return Err(match e {
                EngineError::Storage(text)
                    if text.contains("os error 24") || text.contains("os error 23") =>
                {
                    EngineError::PartitionLimit {
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

    /// A dead-letter topic must exist and be another topic.
    fn check_dead_letter(&self, config: &TopicConfig) -> EngineResult<()> {
        match (&config.dead_letter, config.max_deliveries) {
            (None, 0) => Ok(()),
            (None, _) => Err(EngineError::InvalidSetting(
                "max_deliveries needs dead_letter (the topic dead letters go to)".into(),
            )),
            (Some(dlq), _) if *dlq == config.name => Err(EngineError::InvalidSetting(
                "dead_letter must be another topic than the topic itself".into(),
            )),
            (Some(dlq), _) => match self.topic(dlq) {
                Ok(_) => Ok(()),
                Err(EngineError::TopicNotFound(_)) => Err(EngineError::InvalidSetting(format!(
                    "dead_letter topic '{dlq}' does not exist"
                ))),
                Err(e) => Err(e),
            },
        }
    }

    /// Changes a topic's settings (core 0 only, serialised): `change` edits a copy of the current settings, which
    /// is persisted and applied on every core. Returns the new settings. In cluster mode `change` runs on the
    /// settings etcd holds, again on every compare-and-set round, so it may run more than once.
    pub async fn change_topic(
        self: &Rc<Self>,
        name: &str,
        mut change: impl FnMut(&mut TopicConfig) -> EngineResult<()> + 'static,
    ) -> EngineResult<TopicConfig> {
        assert_eq!(self.id, 0, "topics are changed on core 0");
        let _permit = self.admin_permit().await?;
        let topic = self.topic(name)?;
        if let Some(metadata) = self.metadata() {
            // The requested change is made to the settings just read from etcd, never to this node's copy: that
            // may lack a change made through another node a moment ago, which writing it back would undo.
            let engine = self.clone();
            let (config, locations, states) = metadata
                .change_topic(
                    name.to_string(),
                    Box::new(move |stored: &mut TopicConfig| {
                        change(stored)?;
                        engine.check_dead_letter(stored)
                    }),
                )
                .await?;
            self.materialise(config.clone(), locations, states).await?;
            info!(topic = %name, "topic settings changed in the cluster");
            return Ok(config);
        }
        let mut config = (*topic.config()).clone();
        change(&mut config)?;
        self.check_dead_letter(&config)?;
        config.format = TOPIC_FORMAT;
        self.write_meta(&config).await?;
        self.everywhere(AdminStep::Update(config.clone())).await?;
        info!(topic = %name, "topic settings changed");
        Ok(config)
    }

    /// Creates a consumer group (core 0 only, serialised): every core writes the group's frontier files for its
    /// partitions (at the oldest retained offset, or at the end with `latest`), then the group joins the topic's
    /// metadata and every core's partitions. Returns whether it was created (false: it existed).
    pub async fn create_group(
        self: &Rc<Self>,
        name: &str,
        group: &str,
        latest: bool,
    ) -> EngineResult<bool> {
        assert_eq!(self.id, 0, "groups are created on core 0");
        let _permit = self.admin_permit().await?;
        let topic = self.topic(name)?;
        if let Some(metadata) = self.metadata() {
            // Decided on the settings etcd holds (whether the group exists, the limit), on every compare-and-set
            // round. Every node prepares the group's frontier files for its partitions when it learns the new
            // settings (`materialise`), at the oldest retained offset or, for a group in `latest_groups`, at the end.
            let add = group.to_string();
            let created = Rc::new(Cell::new(false));
            let added = created.clone();
            let (config, locations, states) = metadata
                .change_topic(
                    name.to_string(),
                    Box::new(move |stored: &mut TopicConfig| {
                        added.set(!stored.has_group(&add));
                        if added.get() {
                            if stored.groups.len() + 1 >= stored.max_groups {
                                return Err(EngineError::GroupLimit {
                                    limit: stored.max_groups,
                                });
                            }
                            stored.add_group(&add, latest);
                        }
                        Ok(())
                    }),
                )
                .await?;
            self.materialise(config, locations, states).await?;
            if created.get() {
                info!(topic = %name, group = %group, "consumer group created in the cluster");
            }
            return Ok(created.get());
        }
        let mut config = (*topic.config()).clone();
        if config.has_group(group) {
            return Ok(false);
        }
        if config.groups.len() + 1 >= config.max_groups {
            return Err(EngineError::GroupLimit {
                limit: config.max_groups,
            });
        }
        self.everywhere(AdminStep::PrepareGroup {
            topic: name.to_string(),
            topic_id: config.id,
            group: group.to_string(),
            latest,
        })
        .await?;
        config.add_group(group, false);
        config.format = TOPIC_FORMAT;
        self.write_meta(&config).await?;
        self.everywhere(AdminStep::Update(config)).await?;
        info!(topic = %name, group = %group, latest, "consumer group created");
        Ok(true)
    }

    /// Deletes a consumer group (core 0 only, serialised): it leaves the metadata, then every core's partitions
    /// (its frontier files go; its parked consumers are woken and find it gone). The `default` group stays.
    pub async fn delete_group(self: &Rc<Self>, name: &str, group: &str) -> EngineResult<()> {
        assert_eq!(self.id, 0, "groups are deleted on core 0");
        if group == crate::partition::DEFAULT_GROUP {
            return Err(EngineError::InvalidSetting(
                "the default group cannot be deleted".into(),
            ));
        }
        let _permit = self.admin_permit().await?;
        let topic = self.topic(name)?;
        if let Some(metadata) = self.metadata() {
            // Whether the group exists is decided on the settings etcd holds, on every compare-and-set round.
            let remove = group.to_string();
            let topic_name = name.to_string();
            let (config, locations, states) = metadata
                .change_topic(
                    name.to_string(),
                    Box::new(move |stored: &mut TopicConfig| {
                        if !stored.has_group(&remove) {
                            return Err(EngineError::GroupNotFound {
                                topic: topic_name.clone(),
                                group: remove.clone(),
                            });
                        }
                        stored.remove_group(&remove);
                        Ok(())
                    }),
                )
                .await?;
            self.materialise(config, locations, states).await?;
            info!(topic = %name, group = %group, "consumer group deleted in the cluster");
            return Ok(());
        }
        let mut config = (*topic.config()).clone();
        if !config.has_group(group) {
            return Err(EngineError::GroupNotFound {
                topic: name.to_string(),
                group: group.to_string(),
            });
        }
        config.remove_group(group);
        config.format = TOPIC_FORMAT;
        self.write_meta(&config).await?;
        self.everywhere(AdminStep::Update(config)).await?;
        info!(topic = %name, group = %group, "consumer group deleted");
        Ok(())
    }

    /// Deletes a topic (core 0 only, serialised): every core closes its partitions, then the directory goes to the
    /// trash. A quarantined topic can be deleted too.
    pub async fn delete_topic(self: &Rc<Self>, name: &str) -> EngineResult<()> {
        assert_eq!(self.id, 0, "topics are deleted on core 0");
        let _permit = self.admin_permit().await?;
        match self.topic(name) {
            Ok(_) | Err(EngineError::TopicUnavailable(_)) => {}
            Err(e) => return Err(e),
        }
        // A dead-letter topic stays while a topic sends to it (else its poison messages would have nowhere to go).
        let user = self
            .topics
            .borrow()
            .values()
            .map(|t| t.config())
            .find(|c| c.name != name && c.dead_letter.as_deref() == Some(name))
            .map(|c| c.name.clone());
        if let Some(by) = user {
            return Err(EngineError::TopicInUse {
                topic: name.to_string(),
                by,
            });
        }
        if let Some(metadata) = self.metadata() {
            metadata.delete_topic(name.to_string()).await?;
            self.forget(name).await?;
            info!(topic = %name, "topic deleted in the cluster");
            return Ok(());
        }
        self.everywhere(AdminStep::Drop(name.to_string())).await?;
        let dir = TopicConfig::dir(&self.config.data_dir, name);
        let storage = |e: std::io::Error| EngineError::Storage(e.to_string());
        // Into the trash, outside the topics namespace (the data goes in the background: removing many segment
        // files must not stall this core).
        self.trash(&dir).map_err(storage)?;
        self.storage
            .sync_dir(&self.topics_dir())
            .await
            .map_err(storage)?;
        info!(topic = %name, "topic deleted");
        Ok(())
    }

    /// Cluster mode (core 0): takes the metastore's version of a topic, serialised with local admin changes.
    pub async fn learn_topic(
        self: &Rc<Self>,
        config: TopicConfig,
        locations: Vec<Location>,
        states: Vec<PartitionState>,
    ) -> EngineResult<()> {
        let _permit = self.admin_permit().await?;
        self.materialise(config, locations, states).await
    }

    /// Cluster mode (core 0): forgets a topic the metastore no longer has (deleted through another node).
    pub async fn unlearn_topic(self: &Rc<Self>, name: &str, id: u64) -> EngineResult<()> {
        let _permit = self.admin_permit().await?;
        match self.topic(name) {
            Ok(t) if t.id() == id => self.forget(name).await,
            _ => Ok(()),
        }
    }

    /// Cluster mode: makes this node's state match the metastore's version of a topic: opened if new (an older
    /// topic of the same name, another id, is forgotten first), new settings and groups if changed. The caller
    /// holds the admin permit.
    async fn materialise(
        self: &Rc<Self>,
        mut config: TopicConfig,
        locations: Vec<Location>,
        states: Vec<PartitionState>,
    ) -> EngineResult<()> {
        config.format = TOPIC_FORMAT;
        let known = self.topic(&config.name).ok();
        if let Some(existing) = &known {
            if existing.id() != config.id {
                self.forget(&config.name).await?;
            }
        }
        let known = known.filter(|t| t.id() == config.id);
        match known {
            None => {
                let me = self.node.get();
                let followed = placement::followers(&states)
                    .iter()
                    .filter(|f| f.contains(&me))
                    .count();
                self.check_caps(locations.iter().filter(|l| l.node == me).count() + followed)?;
                let dir = TopicConfig::dir(&self.config.data_dir, &config.name);
                let storage = |e: std::io::Error| EngineError::Storage(e.to_string());
                // What this node's disk holds of the topic from before: at every start in cluster mode, each
                // topic is learnt afresh from the metastore, and the metastore may have moved on meanwhile.
                let local = TopicConfig::load(&*self.storage, &dir.join("topic.json")).ok();
                if local.as_ref().is_some_and(|l| l.id != config.id) {
                    info!(topic = %config.name, "topic deleted and created again in the cluster while this node was away: its old data goes to the trash");
                    self.trash(&dir).map_err(storage)?;
                }
                let same = local.filter(|l| l.id == config.id);
                // Groups deleted while this node was away: nothing will open their frontier files again, so they
                // go now, before the settings that no longer name them are stored (a crash in between tries again).
                if let Some(known) = &same {
                    let gone: Vec<&String> = known
                        .groups
                        .iter()
                        .filter(|g| !config.has_group(g))
                        .collect();
                    if !gone.is_empty() {
                        info!(topic = %config.name, groups = ?gone, "groups deleted in the cluster while this node was away: their frontier files go");
                        // A file that cannot go only takes a few bytes: the topic opens all the same.
                        if let Err(e) = self.remove_group_files(&dir, &gone).await {
                            warn!(topic = %config.name, error = %e, "cannot remove a deleted group's frontier files");
                        }
                    }
                }
                // Only the groups this node knew under the same id are opened from their frontier files. The others
                // were created (or deleted and created again) while it was away: whatever file they have is a
                // deleted group's, so they are prepared as new first.
                let opening = match &same {
                    Some(known) => config.keeping_groups_of(known),
                    None => config.clone(),
                };
                let fresh: Vec<&String> = config
                    .groups
                    .iter()
                    .filter(|g| !opening.has_group(g))
                    .collect();
                self.storage.create_dir_all(&dir).map_err(storage)?;
                self.write_meta(&opening).await?;
                self.storage
                    .sync_dir(&self.topics_dir())
                    .await
                    .map_err(storage)?;
                let applied = self
                    .everywhere(AdminStep::Apply(opening.clone(), locations, states))
                    .await;
                if let Err(e) = applied {
                    // All or nothing, so that a retry opens it anew on every core (the data stays on disk).
                    if let Err(undo) = self.everywhere(AdminStep::Drop(config.name.clone())).await {
                        error!(topic = %config.name, error = %undo, "cannot close a topic that did not open on every core");
                    }
                    return Err(e);
                }
                if fresh.is_empty() {
                    return Ok(());
                }
                info!(topic = %config.name, groups = ?fresh, "groups created in the cluster while this node was away (some perhaps after a deletion of the same name): starting them afresh");
                self.join_groups(config, &opening).await
            }
            Some(topic) => {
                if *topic.locations() != *locations
                    || !topic.has_states(&states)
                    || topic.set_reapply(false)
                {
                    // Another node came back with another core count (its partitions are on other cores now), or a
                    // partition's epoch moved (or the last such view did not apply on every core).
                    info!(topic = %config.name, "partitions of another node moved to other cores of it, or a partition's epoch moved");
                    let current = (*topic.config()).clone();
                    if let Err(e) = self
                        .everywhere(AdminStep::Apply(current, locations, states))
                        .await
                    {
                        topic.set_reapply(true);
                        return Err(e);
                    }
                }
                let old = topic.config();
                if *old == config {
                    return Ok(());
                }
                // A group deleted and created again while this node did not see it (one change of the settings
                // seen for both): the old one goes first (its shards and frontier files, as a deletion takes
                // them), then the new one is prepared as new.
                let recreated = old.recreated_groups(&config);
                if !recreated.is_empty() {
                    let mut without = (*old).clone();
                    for group in &recreated {
                        without.remove_group(group);
                    }
                    info!(topic = %config.name, groups = ?recreated, "groups deleted and created again in the cluster: starting them afresh");
                    self.everywhere(AdminStep::Update(without)).await?;
                }
                let old = topic.config();
                self.join_groups(config, &old).await
            }
        }
    }

    /// Cluster mode: takes `config`, a newer version of an open topic's settings `old`: every core prepares the
    /// frontier files of the groups `old` lacks, then the settings are stored and every core takes them.
    async fn join_groups(
        self: &Rc<Self>,
        config: TopicConfig,
        old: &TopicConfig,
    ) -> EngineResult<()> {
        for group in config.groups.iter().filter(|g| !old.has_group(g)) {
            self.everywhere(AdminStep::PrepareGroup {
                topic: config.name.clone(),
                topic_id: config.id,
                group: group.clone(),
                latest: config.latest_groups.contains(group),
            })
            .await?;
        }
        self.write_meta(&config).await?;
        self.everywhere(AdminStep::Update(config)).await
    }

    /// Removes the frontier files of `groups` from every partition directory of the topic at `dir`, which no core
    /// has open (cluster mode, at a topic's first touch).
    async fn remove_group_files(&self, dir: &Path, groups: &[&String]) -> std::io::Result<()> {
        for partition in self.storage.list_dirs(dir)? {
            let pdir = dir.join(&partition);
            for group in groups {
                let path = pdir.join(crate::storage::frontier::file_name(group));
                match self.storage.remove(&path).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            self.storage.sync_dir(&pdir).await?;
        }
        Ok(())
    }

    /// Closes a topic on every core and moves its directory to the trash. The caller holds the admin permit.
    async fn forget(self: &Rc<Self>, name: &str) -> EngineResult<()> {
        self.everywhere(AdminStep::Drop(name.to_string())).await?;
        let dir = TopicConfig::dir(&self.config.data_dir, name);
        let storage = |e: std::io::Error| EngineError::Storage(e.to_string());
        if self.storage.read(&dir.join("topic.json")).is_ok() {
            self.trash(&dir).map_err(storage)?;
            self.storage
                .sync_dir(&self.topics_dir())
                .await
                .map_err(storage)?;
        }
        Ok(())
    }

    /// Cluster mode (core 0, at start): topics on this node's disk that the metastore no longer has (deleted
    /// while this node was down) go to the trash.
    pub async fn trash_unknown_topics(self: &Rc<Self>, known: &BTreeMap<String, u64>) {
        let dir = self.topics_dir();
        let Ok(names) = self.storage.list_dirs(&dir) else {
            return;
        };
        for name in names {
            let meta = dir.join(&name).join("topic.json");
            let Ok(config) = TopicConfig::load(&*self.storage, &meta) else {
                continue;
            };
            if known.get(&name) == Some(&config.id) || self.topic(&name).is_ok() {
                continue;
            }
            info!(topic = %name, "topic deleted in the cluster while this node was away: its data goes to the trash");
            if let Err(e) = self.trash(&dir.join(&name)) {
                warn!(topic = %name, error = %e, "cannot trash a deleted topic's directory");
            }
        }
        let _ = self.storage.sync_dir(&dir).await;
    }
}

/// Replays the journals of the last run into the partitions' segments (see `storage::journal`), before any core
/// opens a partition. An entry counts only if its topic still exists with the same id.
pub async fn replay_journal(
    storage: &dyn Storage,
    data_dir: &std::path::Path,
) -> Result<crate::storage::journal::ReplayReport, String> {
    let topics = data_dir.join("topics");
    let configs: RefCell<BTreeMap<String, Option<Rc<TopicConfig>>>> = RefCell::new(BTreeMap::new());
    let config = |name: &str, id: u64| -> Option<Rc<TopicConfig>> {
        configs
            .borrow_mut()
            .entry(name.to_string())
            .or_insert_with(|| {
                TopicConfig::load(storage, &topics.join(name).join("topic.json"))
                    .ok()
                    .filter(|c| c.name == name)
                    .map(Rc::new)
            })
            .clone()
            .filter(|c| c.id == id)
    };
    let locate = |name: &str, id: u64, partition: u32| -> Option<PathBuf> {
        config(name, id).map(|_| topics.join(name).join(partition.to_string()))
    };
    let has_group =
        |name: &str, id: u64, group: &str| config(name, id).is_some_and(|c| c.has_group(group));
    crate::storage::journal::replay(storage, &data_dir.join("journal"), &locate, &has_group)
        .await
        .map_err(|e| format!("cannot replay the journal: {e}"))
}
