//! Topic metadata (names, settings, validation, the `topic.json` file that makes them survive restarts) and a topic
//! as one core sees it. Every core holds a copy of every topic's settings; core 0 alone creates, changes and
//! deletes (see `engine::admin`).

use super::placement::{Location, NodeIndex, PartitionState};
use crate::partition::inflight::{Backoff, Limits, Redelivery};
use crate::partition::Partition;
use crate::storage::backend::Storage;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Most partitions a topic may have.
pub const MAX_PARTITIONS: u32 = 4096;
/// Visibility bounds of docs/api.md.
pub const MIN_VISIBILITY_MS: u64 = 1000;
pub const MAX_VISIBILITY_MS: u64 = 12 * 3600 * 1000;
/// Bounds on the per-partition caps (a cap of 0 would wedge the topic; above 1M defeats the memory bound).
pub const MAX_CAP: usize = 1 << 20;
/// Retention bounds: 1 s to 10 years.
pub const MAX_RETENTION_MS: u64 = 3650 * 24 * 3600 * 1000;
/// Longest redelivery delay (docs/api.md: `delay` 0 to 12 h).
pub const MAX_DELAY_MS: u64 = 12 * 3600 * 1000;
/// Most groups a topic may be configured to hold.
pub const MAX_GROUPS_LIMIT: usize = 4096;
/// Largest `max_deliveries`.
pub const MAX_DELIVERIES_LIMIT: u64 = 1_000_000;

/// The metadata format this release writes. Version 1 files (no `format` key) load with defaults for every field
/// added since.
pub const TOPIC_FORMAT: u32 = 2;

/// How the redelivery delay grows with the delivery count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackoffKind {
    #[default]
    Fixed,
    Exponential,
}

fn format_v1() -> u32 {
    1
}

fn default_delay_max_ms() -> u64 {
    15 * 60 * 1000
}

fn default_max_groups() -> usize {
    32
}

/// A topic's settings, as stored in `topic.json` and shown under `config` by `GET /topics/{topic}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    /// Metadata format version (absent in version 1 files).
    #[serde(default = "format_v1")]
    pub format: u32,
    /// The topic's name.
    pub name: String,
    /// Unique per creation: a topic deleted and created again under the same name gets a new id, so nothing
    /// addressed to the old one (a request in flight, a timer, a journal record) is mistaken for the new one.
    /// Version 1 files have none; they get one derived from the name at load.
    #[serde(default)]
    pub id: u64,
    /// Number of partitions, fixed at creation.
    pub partitions: u32,
    /// Default lease length for consumes that give no `visibility`.
    pub visibility_ms: u64,
    /// Live leases (and delayed redeliveries) per partition and group before consume answers 204.
    pub max_in_flight: usize,
    /// Out-of-order acks parked per partition and group before ack answers 503.
    pub max_acked_ahead: usize,
    /// Sealed segments whose newest record is older than this are deleted.
    pub retention_ms: u64,
    /// Delay before a released message (expiry, nack without `delay`) is deliverable again.
    #[serde(default)]
    pub redelivery_delay_ms: u64,
    /// `fixed`, or `exponential`: the delay doubles with every delivery.
    #[serde(default)]
    pub redelivery_backoff: BackoffKind,
    /// Cap on the redelivery delay.
    #[serde(default = "default_delay_max_ms")]
    pub redelivery_delay_max_ms: u64,
    /// A message about to be delivered for the (N+1)th time goes to `dead_letter` instead (0: unlimited).
    #[serde(default)]
    pub max_deliveries: u32,
    /// The dead-letter topic (required with `max_deliveries`).
    #[serde(default)]
    pub dead_letter: Option<String>,
    /// Most consumer groups the topic may hold.
    #[serde(default = "default_max_groups")]
    pub max_groups: usize,
    /// Consumer groups besides `default`, in creation order.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Cluster mode: the groups created with `start=latest`, so that every node starts them at the end of its own
    /// partitions when it learns of them (a single node prepares a group before announcing it, and keeps none here).
    /// Always written (node RPC's encoding is not self-describing: no field may be skipped).
    #[serde(default)]
    pub latest_groups: std::collections::BTreeSet<String>,
    /// A fresh random id per group creation, so that a node that was down while a group was deleted and created
    /// again under the same name tells the new group from the old one (whose frontier files it still holds).
    /// Groups created before this field have none. Always written, as `latest_groups`.
    #[serde(default)]
    pub group_ids: std::collections::BTreeMap<String, u64>,
    /// Replicas per partition (R), fixed at creation; 1 (the default, and what older files mean) keeps each
    /// partition on one node. Always written, as `latest_groups`.
    #[serde(default = "one_replica")]
    pub replicas: u32,
    /// A produce whose `dedup_id` the partition took within this long is answered with the first one's offset and
    /// not appended (0: no deduplication). Always written, as `latest_groups`.
    #[serde(default = "default_dedup_window_ms")]
    pub dedup_window_ms: u64,
    /// A FIFO topic (fixed at creation): every produce names a message group (`group_key`), and at most one message
    /// of a group is leased at a time, in produce order. Always written, as `latest_groups`.
    #[serde(default)]
    pub fifo: bool,
    /// A FIFO topic's produce without a `dedup_id` is deduplicated by the SHA-256 of its body. Always written, as
    /// `latest_groups`.
    #[serde(default)]
    pub content_dedup: bool,
    /// The delay of a produced record that gives none of its own (`delay=0` on the record is its own); 0 to
    /// `MAX_PRODUCE_DELAY_MS`. SQS's queue `DelaySeconds`. Always written, as `latest_groups`.
    #[serde(default)]
    pub delay_ms: u64,
    /// The `wait` of a queue-style consume that gives none; 0 to `MAX_RECEIVE_WAIT_MS`. SQS's queue
    /// `ReceiveMessageWaitTimeSeconds`. Always written, as `latest_groups`.
    #[serde(default)]
    pub receive_wait_ms: u64,
    /// The largest message (body and attributes) a produce may append to this topic; 0: the server's
    /// `max_message_bytes`, which also caps any value here. SQS's `MaximumMessageSize`. Always written.
    #[serde(default)]
    pub max_message_bytes: u64,
    /// When the topic was created and its settings last changed, Unix ms (0: before these were kept). Always
    /// written.
    #[serde(default)]
    pub created_ms: u64,
    #[serde(default)]
    pub modified_ms: u64,
    /// Tags (SQS's queue tags: at most `MAX_TAGS`, keys 1–128 and values 0–256 characters). Always written.
    #[serde(default)]
    pub tags: std::collections::BTreeMap<String, String>,
    /// SQS's `Policy` and `RedriveAllowPolicy` documents, kept as given and not enforced (berth has no IAM);
    /// empty when unset. Always written.
    #[serde(default)]
    pub sqs_policy: String,
    #[serde(default)]
    pub sqs_redrive_allow_policy: String,
}

/// The longest topic `delay`: 15 minutes (SQS's `DelaySeconds` bound, as a produce's own `delay`).
pub const MAX_PRODUCE_DELAY_MS: u64 = crate::storage::meta::MAX_DELAY_MS;
/// The longest topic `receive_wait`: 20 s (SQS's `ReceiveMessageWaitTimeSeconds` bound).
pub const MAX_RECEIVE_WAIT_MS: u64 = 20_000;
/// Most tags of a topic (SQS's limit).
pub const MAX_TAGS: usize = 50;
/// Longest SQS `Policy` document kept: 20 KiB (every topic's copy lives on every core; SQS's own limit on a
/// policy is about this size).
pub const MAX_POLICY_BYTES: usize = 20 << 10;

fn one_replica() -> u32 {
    1
}

/// Deduplication window of a new topic: 5 minutes (SQS's).
pub fn default_dedup_window_ms() -> u64 {
    5 * 60 * 1000
}

/// The longest deduplication window: 1 day.
pub const MAX_DEDUP_WINDOW_MS: u64 = 24 * 3600 * 1000;

impl TopicConfig {
    /// docs/api.md's defaults.
    pub fn with_defaults(name: &str) -> TopicConfig {
        TopicConfig {
            format: TOPIC_FORMAT,
            name: name.to_string(),
            id: 0,
            partitions: 1,
            visibility_ms: 30_000,
            max_in_flight: 1024,
            max_acked_ahead: 1024,
            retention_ms: 7 * 24 * 3600 * 1000,
            redelivery_delay_ms: 0,
            redelivery_backoff: BackoffKind::Fixed,
            redelivery_delay_max_ms: default_delay_max_ms(),
            max_deliveries: 0,
            dead_letter: None,
            max_groups: default_max_groups(),
            groups: Vec::new(),
            latest_groups: Default::default(),
            group_ids: Default::default(),
            replicas: 1,
            dedup_window_ms: default_dedup_window_ms(),
            fifo: false,
            content_dedup: false,
            delay_ms: 0,
            receive_wait_ms: 0,
            max_message_bytes: 0,
            created_ms: 0,
            modified_ms: 0,
            tags: Default::default(),
            sqs_policy: String::new(),
            sqs_redrive_allow_policy: String::new(),
        }
    }

    /// The topic directory under the data dir.
    pub fn dir(data_dir: &Path, name: &str) -> PathBuf {
        data_dir.join("topics").join(name)
    }

    /// Reads a stored topic.json (any format version).
    pub fn load(storage: &dyn Storage, path: &Path) -> Result<TopicConfig, String> {
        let text = storage
            .read(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut config: TopicConfig =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        validate_name(&config.name).map_err(|e| format!("{}: {e}", path.display()))?;
        if config.id == 0 {
            config.id = legacy_id(&config.name);
        }
        Ok(config)
    }

    /// The largest message a produce may append: the topic's `max_message_bytes` within the server's.
    pub fn message_limit(&self, server: usize) -> usize {
        match self.max_message_bytes {
            0 => server,
            n => (n as usize).min(server),
        }
    }

    /// The caps each partition's shards use.
    pub fn limits(&self) -> Limits {
        Limits {
            max_in_flight: self.max_in_flight,
            max_acked_ahead: self.max_acked_ahead,
        }
    }

    /// The redelivery policy each partition's shards use.
    pub fn redelivery(&self) -> Redelivery {
        Redelivery {
            delay_ms: self.redelivery_delay_ms,
            backoff: match self.redelivery_backoff {
                BackoffKind::Fixed => Backoff::Fixed,
                BackoffKind::Exponential => Backoff::Exponential,
            },
            max_delay_ms: self.redelivery_delay_max_ms,
        }
    }

    /// Every group of the topic, `default` first.
    pub fn all_groups(&self) -> Vec<String> {
        let mut all = vec![crate::partition::DEFAULT_GROUP.to_string()];
        all.extend(self.groups.iter().cloned());
        all
    }

    pub fn has_group(&self, group: &str) -> bool {
        group == crate::partition::DEFAULT_GROUP || self.groups.iter().any(|g| g == group)
    }

    /// Adds a group with a fresh id (`latest`: it starts at the end of each partition, in cluster mode).
    pub fn add_group(&mut self, group: &str, latest: bool) {
        if self.has_group(group) {
            return;
        }
        self.groups.push(group.to_string());
        self.group_ids.insert(group.to_string(), new_topic_id());
        if latest {
            self.latest_groups.insert(group.to_string());
        }
    }

    /// Removes a group and what is recorded about it.
    pub fn remove_group(&mut self, group: &str) {
        self.groups.retain(|g| g != group);
        self.latest_groups.remove(group);
        self.group_ids.remove(group);
    }

    /// The groups of `newer` (a later version of this topic's settings) that are not the groups of the same name
    /// here: deleted and created again since (their ids differ). Groups without an id on both sides are the same.
    pub fn recreated_groups(&self, newer: &TopicConfig) -> Vec<String> {
        newer
            .groups
            .iter()
            .filter(|g| self.has_group(g) && !self.same_group(newer, g))
            .cloned()
            .collect()
    }

    /// These settings with only the groups `known` (an earlier version) has under the same id: the groups a node
    /// that held `known` can open from its frontier files. The others are new to it, or recreated, and must be
    /// prepared as new (any file of theirs is a deleted group's).
    pub fn keeping_groups_of(&self, known: &TopicConfig) -> TopicConfig {
        let mut kept = self.clone();
        for group in &self.groups {
            if !(known.has_group(group) && known.same_group(self, group)) {
                kept.remove_group(group);
            }
        }
        kept
    }

    fn same_group(&self, other: &TopicConfig, group: &str) -> bool {
        self.group_ids.get(group) == other.group_ids.get(group)
    }
}

/// The id of a version 1 topic (its file has none): stable for the name, with the top bit set so it never equals
/// an id drawn for a new topic (those have it clear).
fn legacy_id(name: &str) -> u64 {
    let lo = crc32c::crc32c(name.as_bytes()) as u64;
    let hi = crc32c::crc32c_append(0x5eed, name.as_bytes()) as u64;
    (1 << 63) | (hi << 32) | lo
}

/// A fresh topic (or group) id: random, top bit clear, never 0.
pub fn new_topic_id() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom(2) fills the buffer we own; on failure we fall back to the clock below.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let random = if n == 8 {
        u64::from_le_bytes(bytes)
    } else {
        crate::clock::wall_clock_ms().wrapping_mul(0x9e37_79b9_7f4a_7c15)
    };
    (random >> 1).max(1)
}

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName(pub String);

impl std::fmt::Display for InvalidName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "name '{}' must match [A-Za-z0-9._-]{{1,128}}", self.0)
    }
}

/// `[A-Za-z0-9._-]{1,128}` (topic and group names); `.` and `..` are refused too since they would escape the
/// topics directory.
pub fn validate_name(name: &str) -> Result<(), InvalidName> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(InvalidName(name.chars().take(200).collect()))
    }
}

/// The partition a key maps to: crc32c of the key, modulo the partition count (stable across restarts).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    crc32c::crc32c(key) % partitions
}

/// The (node, core) pairs of nodes other than `node` in `locations`, sorted, each once.
fn remote_owners(locations: &[Location], node: NodeIndex) -> Rc<[Location]> {
    let mut remote: Vec<Location> = locations
        .iter()
        .copied()
        .filter(|l| l.node != node)
        .collect();
    remote.sort_unstable();
    remote.dedup();
    remote.into()
}

/// A topic as one core sees it: its settings, where each partition lives, and the partitions this core holds.
pub struct Topic {
    config: RefCell<Rc<TopicConfig>>,
    /// Where each partition lives (its leader's node and core). Cluster mode: replaced whole when another node's
    /// core count changes, or a partition's leadership moves (`relocate`).
    locations: RefCell<Rc<[Location]>>,
    /// The partitions this core holds, leading or following: replaced whole when a leadership moves to or from a
    /// replica on this core (`relocate`), so that a reader's snapshot stays consistent across awaits.
    roles: RefCell<Rc<Roles>>,
    /// Cluster mode: (node, core) pairs of other nodes that own partitions of the topic (replaced with `locations`).
    remote_owners: RefCell<Rc<[Location]>>,
    /// Round-robin cursor over `owned` (produce without key) and over cores (consume).
    cursor: Cell<usize>,
    /// Set when the topic is deleted; parked consumers notice and leave.
    deleted: Cell<bool>,
    /// Each partition's replicas, leader and epoch, as the metastore last had them (`set_states`).
    states: RefCell<Rc<[PartitionState]>>,
    /// This node.
    node: NodeIndex,
    /// Cluster mode, core 0: the last view could not be applied on every core (a replica that could not begin to
    /// lead): the next learning of the topic applies it again even if nothing changed.
    reapply: Cell<bool>,
    /// Per group: the partitions owned here that may have something to deliver, so that a probe over many
    /// partitions looks at the few with messages (`ops::consume::apply`). Kept by the partitions' wake-ups; a
    /// partition found with nothing leaves it; a periodic full scan covers anything that became deliverable
    /// without a wake-up.
    ready: RefCell<std::collections::HashMap<String, Ready>>,
}

/// A replicated topic's replicas as one core sees them when it opens the topic.
#[derive(Default)]
pub struct Replicas {
    /// Per partition, its replicas other than its leader (empty: the topic is not replicated).
    pub followers: Vec<Vec<NodeIndex>>,
    /// Some(partition) for the follower replicas this core holds (empty: none).
    pub followed: Vec<Option<Rc<Partition>>>,
    /// Each partition's replicas, leader and epoch, as the metastore had them (replica sets that change later are
    /// taken by `Topic::set_members`).
    pub states: Vec<PartitionState>,
}

/// The partitions of a topic one core holds, and in which role. A snapshot: `Topic::roles` hands out the current
/// one, and a move of leadership replaces it whole.
pub struct Roles {
    /// Some(partition) for the partitions this core leads (owns).
    pub partitions: Vec<Option<Rc<Partition>>>,
    /// The owned partition numbers, for round-robin.
    pub owned: Rc<[u32]>,
    /// The cores of this node that own some partition of the topic, ascending.
    pub owner_cores: Rc<[u32]>,
    /// Per partition, its replicas other than its leader (empty: the topic is not replicated).
    pub followers: Rc<[Vec<NodeIndex>]>,
    /// Some(partition) for the follower replicas this core holds (empty: none).
    pub followed: Vec<Option<Rc<Partition>>>,
}

impl Roles {
    fn new(
        partitions: Vec<Option<Rc<Partition>>>,
        followed: Vec<Option<Rc<Partition>>>,
        followers: Vec<Vec<NodeIndex>>,
        locations: &[Location],
        node: NodeIndex,
    ) -> Roles {
        let owned: Vec<u32> = partitions
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_some())
            .map(|(i, _)| i as u32)
            .collect();
        let mut owner_cores: Vec<u32> = locations
            .iter()
            .filter(|l| l.node == node)
            .map(|l| l.core)
            .collect();
        owner_cores.sort_unstable();
        owner_cores.dedup();
        Roles {
            partitions,
            owned: owned.into(),
            owner_cores: owner_cores.into(),
            followers: followers.into(),
            followed,
        }
    }
}

/// The partitions of one core whose role a new view changes (`Topic::relocate`).
#[derive(Default)]
pub struct RoleMoves {
    /// Follower replicas that lead now.
    pub lead: Vec<(u32, Rc<Partition>)>,
    /// Leaders that follow now.
    pub follow: Vec<(u32, Rc<Partition>)>,
}

/// A group's may-have-something partitions on this core, and when they were last all scanned.
#[derive(Debug, Default)]
pub struct Ready {
    pub partitions: std::collections::BTreeSet<u32>,
    pub scanned_ms: u64,
}

/// A probe that finds no partition marked ready scans every owned partition, at most this often per (topic, group).
pub const FULL_SCAN_MS: u64 = 10;
/// And every probe scans them all when the last full scan is this old, marked ones or not: a partition that became
/// deliverable without a wake-up is never passed over for longer under a steady load.
pub const FULL_SCAN_EVERY_MS: u64 = 100;

impl Topic {
    pub fn new(
        config: TopicConfig,
        locations: Vec<Location>,
        partitions: Vec<Option<Rc<Partition>>>,
        start: usize,
        node: NodeIndex,
        replicas: Replicas,
    ) -> Topic {
        let roles = Roles::new(
            partitions,
            replicas.followed,
            replicas.followers,
            &locations,
            node,
        );
        Topic {
            remote_owners: RefCell::new(remote_owners(&locations, node)),
            config: RefCell::new(Rc::new(config)),
            locations: RefCell::new(locations.into()),
            roles: RefCell::new(Rc::new(roles)),
            cursor: Cell::new(start),
            deleted: Cell::new(false),
            ready: RefCell::new(Default::default()),
            states: RefCell::new(replicas.states.into()),
            node,
            reapply: Cell::new(false),
        }
    }

    /// Marks (`true`) or takes (`false`: whether it was marked) that the last view must be applied again.
    pub fn set_reapply(&self, reapply: bool) -> bool {
        self.reapply.replace(reapply)
    }

    /// The partitions this core holds and their roles, as they are now.
    pub fn roles(&self) -> Rc<Roles> {
        self.roles.borrow().clone()
    }

    /// The epoch of partition `p`'s leadership: the topic's id until a partition key names another (`0` for a
    /// partition the topic does not have).
    pub fn epoch(&self, p: u32) -> u64 {
        self.states.borrow().get(p as usize).map_or(0, |s| s.epoch)
    }

    /// Partition `p`'s replicas (the leader among them, as the metastore last had them; empty for a partition the
    /// topic does not have).
    pub fn replicas_of(&self, p: u32) -> Vec<NodeIndex> {
        self.states
            .borrow()
            .get(p as usize)
            .map_or_else(Vec::new, |s| s.replicas.clone())
    }

    /// Each partition's replicas, leader and epoch, as the metastore last had them.
    pub fn states(&self) -> Rc<[PartitionState]> {
        self.states.borrow().clone()
    }

    /// Whether each partition's replicas, leader and epoch are `states` (or `states` is empty: not known).
    pub fn has_states(&self, states: &[PartitionState]) -> bool {
        states.is_empty() || *self.states.borrow().as_ref() == *states
    }

    /// Takes the metastore's newer view of each partition's replicas, leader and epoch (a change of the replica set
    /// opens and closes replicas through `membership` and `set_members`).
    pub fn set_states(&self, states: Vec<PartitionState>) {
        let mut current = self.states.borrow_mut();
        if current.len() == states.len() {
            *current = states.into();
        }
    }

    /// Partition `p`'s followers (empty when the topic is not replicated).
    pub fn followers(&self, p: u32) -> Vec<NodeIndex> {
        self.roles
            .borrow()
            .followers
            .get(p as usize)
            .cloned()
            .unwrap_or_default()
    }

    /// Every partition's followers (empty when the topic is not replicated).
    pub fn all_followers(&self) -> Rc<[Vec<NodeIndex>]> {
        self.roles.borrow().followers.clone()
    }

    /// This core's follower replica of partition `p`, if it holds one.
    pub fn followed_partition(&self, p: u32) -> Option<Rc<Partition>> {
        self.roles
            .borrow()
            .followed
            .get(p as usize)
            .cloned()
            .flatten()
    }

    /// Every follower replica this core holds.
    pub fn followed_partitions(&self) -> std::vec::IntoIter<Rc<Partition>> {
        let roles = self.roles.borrow();
        let v: Vec<_> = roles.followed.iter().flatten().cloned().collect();
        v.into_iter()
    }

    /// The current settings.
    pub fn config(&self) -> Rc<TopicConfig> {
        self.config.borrow().clone()
    }

    pub fn name(&self) -> String {
        self.config.borrow().name.clone()
    }

    pub fn id(&self) -> u64 {
        self.config.borrow().id
    }

    /// Replaces the settings (a change by PATCH or a new group); partitions get the new caps and policy.
    pub fn set_config(&self, config: TopicConfig) {
        // A group created again, or new settings (caps): every group's next probe scans all partitions.
        self.ready.borrow_mut().clear();
        for p in self.owned_partitions() {
            p.set_policy(config.limits(), config.redelivery());
        }
        *self.config.borrow_mut() = Rc::new(config);
    }

    pub fn partition_count(&self) -> u32 {
        self.locations.borrow().len() as u32
    }

    /// Where partition `p` lives.
    pub fn location(&self, p: u32) -> Location {
        self.locations.borrow()[p as usize]
    }

    /// Cluster mode: the topic's partitions are served from `locations` now, each partition's replicas, leader and
    /// epoch being `states` (empty: unchanged). Other nodes' partitions may move anywhere (a node restarted with
    /// another core count, a leadership moved); a partition of this node only changes role on the core that holds
    /// its replica (`placement::replica_core`): a follower replica held by core `core` becomes the leader, or the
    /// leader it holds becomes a follower replica, at a newer epoch. Any other move of this node's partitions is
    /// refused, and so is a different count: those are open where they are for as long as this node runs. Returns
    /// the partitions of `core` that change role (the caller makes them lead or follow: `Partition::lead`,
    /// `Partition::follow`); the roles are already swapped when it returns.
    pub fn relocate(
        &self,
        locations: Vec<Location>,
        states: &[PartitionState],
        core: u32,
        cores: usize,
    ) -> Result<RoleMoves, String> {
        let node = self.node;
        let mut moves = RoleMoves::default();
        {
            let old = self.locations.borrow();
            if old.len() != locations.len() {
                return Err(format!("{} partitions, not {}", old.len(), locations.len()));
            }
            if !states.is_empty() && states.len() != locations.len() {
                return Err(format!(
                    "{} partition states for {} partitions",
                    states.len(),
                    locations.len()
                ));
            }
            let current = self.states.borrow();
            let roles = self.roles.borrow();
            for (p, (a, b)) in old.iter().zip(&locations).enumerate() {
                if a == b || (a.node != node && b.node != node) {
                    continue;
                }
                let state = states
                    .get(p)
                    .ok_or("a partition's leader moved without its state")?;
                let replicated = state.replicas.len() > 1 && !roles.followers.is_empty();
                let newer = state.epoch > current.get(p).map_or(0, |s| s.epoch);
                if !(replicated && newer && state.leader == b.node && a.node != b.node) {
                    return Err(format!(
                        "partition {p} of this node would move from {a:?} to {b:?}"
                    ));
                }
                if a.node == node && !state.replicas.contains(&node) {
                    // Led here, and this node holds no replica any more (a view that skipped the leadership's move
                    // and this node's removal): it leaves (`membership`, `set_members`).
                    continue;
                }
                // Every core of this node judges the move alike: this node's side of it must be the core its
                // replica lives on.
                let mine = if a.node == node { a } else { b };
                let name = self.config.borrow().name.clone();
                if Some(mine.core)
                    != super::placement::replica_core(&name, states, node, p as u32, cores)
                {
                    return Err(format!(
                        "partition {p} would lead or follow on core {} of this node, not where its replica is",
                        mine.core
                    ));
                }
                if mine.core != core {
                    continue;
                }
                let p32 = p as u32;
                if b.node == node {
                    match roles.followed.get(p).cloned().flatten() {
                        Some(f) => moves.lead.push((p32, f)),
                        None => {
                            return Err(format!(
                                "partition {p}: this core holds no replica to lead"
                            ))
                        }
                    }
                } else {
                    match roles.partitions.get(p).cloned().flatten() {
                        Some(l) => moves.follow.push((p32, l)),
                        None => {
                            return Err(format!(
                                "partition {p}: this core holds no leader to step down"
                            ))
                        }
                    }
                }
            }
        }
        let old = self.roles();
        let mut partitions = old.partitions.clone();
        let mut followed = old.followed.clone();
        for (p, f) in &moves.lead {
            partitions[*p as usize] = Some(f.clone());
            followed[*p as usize] = None;
        }
        for (p, l) in &moves.follow {
            followed[*p as usize] = Some(l.clone());
            partitions[*p as usize] = None;
        }
        let followers = if states.is_empty() {
            old.followers.to_vec()
        } else {
            super::placement::followers(states)
        };
        *self.roles.borrow_mut() = Rc::new(Roles::new(
            partitions, followed, followers, &locations, node,
        ));
        *self.remote_owners.borrow_mut() = remote_owners(&locations, node);
        *self.locations.borrow_mut() = locations.into();
        Ok(moves)
    }

    /// Cluster mode: how `states` changes which partitions core `core` (of `cores`) holds a replica of, this node's
    /// replica sets having changed (a drain, a removal: `front::mover`). Returns the partitions it must open as
    /// follower replicas (this node was added to their replica set, and the replica's core is this one) and those
    /// it must close (this node is no longer one of their replicas).
    pub fn membership(
        &self,
        states: &[PartitionState],
        core: u32,
        cores: usize,
    ) -> (Vec<u32>, Vec<u32>) {
        let node = self.node;
        let roles = self.roles.borrow();
        let name = self.config.borrow().name.clone();
        let held = |p: usize| {
            roles.partitions.get(p).is_some_and(Option::is_some)
                || roles.followed.get(p).is_some_and(Option::is_some)
        };
        let (mut open, mut leave) = (Vec::new(), Vec::new());
        for (p, s) in states.iter().enumerate() {
            let mine = s.replicas.contains(&node);
            if mine
                && s.leader != node
                && !held(p)
                && super::placement::replica_core(&name, states, node, p as u32, cores)
                    == Some(core)
            {
                open.push(p as u32);
            } else if !mine && held(p) {
                leave.push(p as u32);
            }
        }
        (open, leave)
    }

    /// Takes a change of replica sets (`states`, applied already by `set_states`) on this core: `opened` are the new
    /// follower replicas it holds, `leave` the partitions it holds no replica of any more, which it returns (the
    /// caller closes them); every partition's followers are the new ones.
    pub fn set_members(
        &self,
        states: &[PartitionState],
        opened: Vec<(u32, Rc<Partition>)>,
        leave: &[u32],
    ) -> Vec<Rc<Partition>> {
        let old = self.roles();
        let count = self.partition_count() as usize;
        let mut partitions = old.partitions.clone();
        let mut followed = old.followed.clone();
        if followed.len() < count {
            followed.resize(count, None);
        }
        let mut left = Vec::new();
        for &p in leave {
            left.extend(partitions[p as usize].take());
            left.extend(followed[p as usize].take());
        }
        for (p, partition) in opened {
            debug_assert!(followed[p as usize].is_none() && partitions[p as usize].is_none());
            followed[p as usize] = Some(partition);
        }
        let locations = self.locations();
        *self.roles.borrow_mut() = Rc::new(Roles::new(
            partitions,
            followed,
            super::placement::followers(states),
            &locations,
            self.node,
        ));
        left
    }

    /// The owned partition `p`, if this core owns it.
    pub fn owned_partition(&self, p: u32) -> Option<Rc<Partition>> {
        self.roles
            .borrow()
            .partitions
            .get(p as usize)
            .cloned()
            .flatten()
    }

    /// Every partition this core owns.
    pub fn owned_partitions(&self) -> std::vec::IntoIter<Rc<Partition>> {
        let roles = self.roles.borrow();
        let v: Vec<_> = roles.partitions.iter().flatten().cloned().collect();
        v.into_iter()
    }

    /// The cores owning some partition of the topic (on this node).
    pub fn owner_cores(&self) -> Rc<[u32]> {
        self.roles.borrow().owner_cores.clone()
    }

    /// Cluster mode: the (node, core) pairs of other nodes owning partitions of this topic.
    pub fn remote_owners(&self) -> Rc<[Location]> {
        self.remote_owners.borrow().clone()
    }

    /// Every partition's location, in partition order.
    pub fn locations(&self) -> Rc<[Location]> {
        self.locations.borrow().clone()
    }

    /// The partitions this core owns, ascending.
    pub fn owned(&self) -> Rc<[u32]> {
        self.roles.borrow().owned.clone()
    }

    /// Partition `p` (owned here) may have something deliverable for `group`, or (None) for every group.
    pub fn mark_ready(&self, group: Option<&str>, p: u32) {
        let mut ready = self.ready.borrow_mut();
        match group {
            Some(g) => {
                if let Some(r) = ready.get_mut(g) {
                    r.partitions.insert(p);
                }
            }
            None => {
                for r in ready.values_mut() {
                    r.partitions.insert(p);
                }
            }
        }
    }

    /// The partitions a probe for `group` looks at, from a rotating start: those marked ready, or (a full scan,
    /// `true`) every owned one when the group has no set yet, or none is marked and the last full scan is older
    /// than `FULL_SCAN_MS`.
    pub fn probe_order(&self, group: &str, now_ms: u64) -> (Vec<u32>, bool) {
        let start = self.next_cursor();
        let mut ready = self.ready.borrow_mut();
        // The ready set in rotated order, in one list: from the start position to the end, then the beginning
        // (one lookup of the group, whose key is hashed once).
        if let Some(r) = ready.get(group).filter(|r| {
            !((r.partitions.is_empty() && now_ms >= r.scanned_ms + FULL_SCAN_MS)
                || now_ms >= r.scanned_ms + FULL_SCAN_EVERY_MS)
        }) {
            let set = &r.partitions;
            let n = set.len();
            let skip = if n == 0 { 0 } else { start % n };
            let order = set
                .iter()
                .skip(skip)
                .chain(set.iter().take(skip))
                .copied()
                .collect();
            return (order, false);
        }
        // A full scan: every owned partition, and they become the ready set.
        let r = ready.entry(group.to_string()).or_default();
        r.scanned_ms = now_ms;
        let owned = self.owned();
        r.partitions = owned.iter().copied().collect();
        let order = (0..owned.len())
            .map(|i| owned[(start + i) % owned.len()])
            .collect();
        (order, true)
    }

    /// A probe found nothing deliverable in partition `p` for `group`: it leaves the ready set until a wake-up.
    pub fn not_ready(&self, group: &str, p: u32) {
        if let Some(r) = self.ready.borrow_mut().get_mut(group) {
            r.partitions.remove(&p);
        }
    }

    /// Advances the round-robin cursor; returns its previous value.
    pub fn next_cursor(&self) -> usize {
        let c = self.cursor.get();
        self.cursor.set(c.wrapping_add(1));
        c
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.get()
    }

    pub fn mark_deleted(&self) {
        self.deleted.set(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_pattern() {
        for good in [
            "a",
            "orders",
            "a.b_c-D9",
            &"x".repeat(128),
            ".deleted-orders",
        ] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", &"x".repeat(129), "a%2Fb"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_version_1_topic_json_loads_with_defaults_for_every_later_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topic.json");
        std::fs::write(
            &path,
            r#"{"name": "orders", "partitions": 4, "visibility_ms": 30000,
 "max_in_flight": 1000, "max_acked_ahead": 10000, "retention_ms": 604800000}"#,
        )
        .unwrap();
        let disk = crate::storage::backend::Disk::new(crate::storage::backend::SyncVia::Inline);
        let c = TopicConfig::load(&disk, &path).unwrap();
        assert_eq!(c.format, 1);
        assert_eq!((c.partitions, c.max_in_flight), (4, 1000));
        assert_eq!(c.redelivery_backoff, BackoffKind::Fixed);
        assert_eq!(c.redelivery_delay_max_ms, 15 * 60 * 1000);
        assert_eq!((c.max_deliveries, c.max_groups), (0, 32));
        assert!(c.groups.is_empty() && c.dead_letter.is_none());
        assert_ne!(c.id, 0, "a version 1 topic gets a stable id");
        assert_eq!(c.id, TopicConfig::load(&disk, &path).unwrap().id);
        assert_ne!(c.id, new_topic_id());
    }

    #[test]
    fn a_group_created_again_under_its_name_is_told_from_the_old_one() {
        let mut old = TopicConfig::with_defaults("t");
        old.add_group("g", false);
        old.add_group("h", true);
        old.groups.push("legacy".into()); // created before group ids: none recorded
        assert_eq!(old.group_ids.len(), 2);
        assert!(old.latest_groups.contains("h") && !old.latest_groups.contains("g"));
        let same = old.clone();
        assert!(old.recreated_groups(&same).is_empty());

        let mut newer = old.clone();
        newer.remove_group("g");
        assert!(!newer.has_group("g") && !newer.group_ids.contains_key("g"));
        assert!(
            old.recreated_groups(&newer).is_empty(),
            "a deletion alone is not a recreation"
        );
        newer.add_group("g", false);
        newer.add_group("fresh", false);
        newer.remove_group("h");
        newer.add_group("h", false);
        assert!(
            !newer.latest_groups.contains("h"),
            "the new h starts where new groups start"
        );
        assert_eq!(
            old.recreated_groups(&newer),
            vec!["g".to_string(), "h".to_string()]
        );
        // Adding a group that exists changes nothing (its id stays).
        let id = newer.group_ids["g"];
        newer.add_group("g", true);
        assert_eq!((newer.group_ids["g"], newer.groups.len()), (id, 4));
        // What a node that held `old` may open of `newer`: the groups it knew under the same id.
        let kept = newer.keeping_groups_of(&old);
        assert_eq!(kept.groups, vec!["legacy".to_string()]);
        assert!(kept.group_ids.is_empty() && kept.latest_groups.is_empty());
        assert_eq!(old.keeping_groups_of(&old), old);
        // Files without the field read as no ids.
        let text = serde_json::to_string(&old)
            .unwrap()
            .replace("\"group_ids\"", "\"ignored\"");
        let read: TopicConfig = serde_json::from_str(&text).unwrap();
        assert!(read.group_ids.is_empty());
    }
}
