//! The metastore as one point in etcd's history: members, live sessions and topics at revision `revision`. Built
//! from one range read, advanced event by event by the replica's watch, and handed out as an immutable
//! `Arc<Snapshot>` (`Send`), which is how other cores get the cluster state. Comparing two snapshots gives the list
//! of changes between them, so a subscriber that wakes late (or after a full re-read) still learns everything that
//! differs.

use super::keys::{
    decode_drain, decode_member, decode_partition, decode_topic, DrainRecord, KeyKind, Keys,
    MemberRecord, PartitionRecord, PartitionState, TopicRecord,
};
use crate::cluster::etcd::{Event, EventKind, KeyValue};
use crate::engine::placement::{Location, NodeIndex};
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::warn;

/// A node as the cluster sees it: its member record and whether it holds a session now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: String,
    pub index: NodeIndex,
    pub advertise: String,
    pub peer_addr: String,
    pub cores: u32,
    /// Holds a live session (its alive key exists).
    pub alive: bool,
    /// The session lease while alive, 0 when dead. A new value means the node lost its session (or restarted) and
    /// registered again, even if no snapshot ever showed it dead.
    pub session: i64,
    /// Its replicas are moving to other nodes (`drains/<id>`): a drain, or (`removed`) a removal for good.
    pub drain: Option<DrainRecord>,
}

/// One difference between two snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A node appeared, or its addresses, cores, liveness or session changed.
    Node(NodeInfo),
    /// A node's member record went away (removed by hand: berth never deletes one).
    NodeRemoved(String),
    TopicCreated(Arc<TopicRecord>),
    /// Same topic (same id), new settings.
    TopicChanged(Arc<TopicRecord>),
    /// The topic is gone, or was deleted and created again (a `TopicCreated` with the new id follows).
    TopicDeleted(Arc<TopicRecord>),
}

/// Everything under the cluster prefix, decoded, at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every change up to this etcd revision is reflected.
    pub revision: i64,
    /// Local count of published snapshots (the replica's version when it published this one).
    pub version: u64,
    members: BTreeMap<String, MemberRecord>,
    /// Node id → session lease, from the alive keys.
    sessions: BTreeMap<String, i64>,
    /// Topic records as their `topics/<name>` keys hold them (each partition where the creation put it).
    stored: BTreeMap<String, Arc<TopicRecord>>,
    /// `partitions/<topic>/<p>` keys, decoded, by topic then partition.
    partition_keys: BTreeMap<String, BTreeMap<u32, PartitionRecord>>,
    /// The topics as everyone reads them: `stored` with the partition keys of the same topic id applied.
    topics: BTreeMap<String, Arc<TopicRecord>>,
    /// Node id → its drain or removal (`drains/<id>`).
    drains: BTreeMap<String, DrainRecord>,
}

impl Snapshot {
    /// Decodes a range read of the whole prefix (or any part of it).
    pub(crate) fn from_kvs<'a>(
        keys: &Keys,
        revision: i64,
        kvs: impl IntoIterator<Item = &'a KeyValue>,
    ) -> Snapshot {
        let mut s = Snapshot {
            revision,
            ..Snapshot::default()
        };
        for kv in kvs {
            s.put(keys, kv);
        }
        s
    }

    /// Applies one watch event. Values that do not decode are logged and treated as absent.
    pub(crate) fn apply(&mut self, keys: &Keys, event: &Event) {
        match event.kind {
            EventKind::Put => self.put(keys, &event.kv),
            EventKind::Delete => self.remove(keys, &event.kv.key),
        }
        self.revision = self.revision.max(event.revision());
    }

    fn put(&mut self, keys: &Keys, kv: &KeyValue) {
        match keys.classify(&kv.key) {
            Some(KeyKind::Member(id)) => match decode_member(&id, kv) {
                Ok(member) => {
                    self.members.insert(id, member);
                }
                Err(e) => {
                    warn!(error = %e, "metastore: ignoring a member record");
                    self.members.remove(&id);
                }
            },
            Some(KeyKind::Alive(id)) => {
                self.sessions.insert(id, kv.lease);
            }
            Some(KeyKind::Drain(id)) => match decode_drain(kv) {
                Ok(drain) => {
                    self.drains.insert(id, drain);
                }
                Err(e) => {
                    warn!(error = %e, "metastore: ignoring a drain record");
                    self.drains.remove(&id);
                }
            },
            Some(KeyKind::Topic(name)) => {
                match decode_topic(&name, kv) {
                    Ok(topic) => {
                        self.stored.insert(name.clone(), Arc::new(topic));
                    }
                    Err(e) => {
                        warn!(error = %e, "metastore: ignoring a topic record");
                        self.stored.remove(&name);
                    }
                }
                self.merge(&name);
            }
            Some(KeyKind::Partition(topic, p)) => {
                match decode_partition(kv) {
                    Ok(record) => {
                        self.partition_keys
                            .entry(topic.clone())
                            .or_default()
                            .insert(p, record);
                    }
                    Err(e) => {
                        warn!(error = %e, "metastore: ignoring a partition record");
                        self.remove_partition(&topic, p);
                    }
                }
                self.merge(&topic);
            }
            Some(KeyKind::NodeCounter) | None => {}
        }
    }

    fn remove_partition(&mut self, topic: &str, p: u32) {
        if let Some(keys) = self.partition_keys.get_mut(topic) {
            keys.remove(&p);
            if keys.is_empty() {
                self.partition_keys.remove(topic);
            }
        }
    }

    /// Brings `topics[name]` up to date with its stored record and partition keys.
    fn merge(&mut self, name: &str) {
        let Some(stored) = self.stored.get(name) else {
            self.topics.remove(name);
            return;
        };
        let mut merged = TopicRecord::clone(stored);
        merged.partitions = self.partition_states(stored);
        if self.topics.get(name).is_none_or(|now| **now != merged) {
            self.topics.insert(name.to_string(), Arc::new(merged));
        }
    }

    /// Each partition's replicas, leader and epoch: its partition key here, or where the creation put it. A key
    /// applies only to the topic id it names and to a partition the topic has (one left by a deleted topic of the
    /// same name is ignored). `topic` may be newer than this snapshot (just written by a change): its partitions
    /// still take the keys known here.
    pub fn partition_states(&self, topic: &TopicRecord) -> Vec<PartitionState> {
        let mut states = topic.initial_states();
        for (&p, key) in self.partition_keys.get(topic.name()).into_iter().flatten() {
            if key.topic_id == topic.id() {
                if let Some(state) = states.get_mut(p as usize) {
                    // The creation's replicas stay known: they rank a node's replicas over its cores.
                    let placed = std::mem::take(&mut state.replicas);
                    *state = key.state.clone();
                    state.placed = placed;
                }
            }
        }
        states
    }

    fn remove(&mut self, keys: &Keys, key: &[u8]) {
        match keys.classify(key) {
            Some(KeyKind::Member(id)) => {
                self.members.remove(&id);
            }
            Some(KeyKind::Alive(id)) => {
                self.sessions.remove(&id);
            }
            Some(KeyKind::Drain(id)) => {
                self.drains.remove(&id);
            }
            Some(KeyKind::Topic(name)) => {
                self.stored.remove(&name);
                self.merge(&name);
            }
            Some(KeyKind::Partition(topic, p)) => {
                self.remove_partition(&topic, p);
                self.merge(&topic);
            }
            Some(KeyKind::NodeCounter) | None => {}
        }
    }

    pub fn topic(&self, name: &str) -> Option<&Arc<TopicRecord>> {
        self.topics.get(name)
    }

    /// Every topic, by name.
    pub fn topics(&self) -> impl Iterator<Item = &Arc<TopicRecord>> {
        self.topics.values()
    }

    fn info(&self, member: &MemberRecord) -> NodeInfo {
        let session = self.sessions.get(&member.id).copied();
        NodeInfo {
            id: member.id.clone(),
            index: member.index,
            advertise: member.advertise.clone(),
            peer_addr: member.peer_addr.clone(),
            cores: member.cores,
            alive: session.is_some(),
            session: session.unwrap_or(0),
            drain: self.drains.get(&member.id).copied(),
        }
    }

    pub fn node(&self, id: &str) -> Option<NodeInfo> {
        self.members.get(id).map(|m| self.info(m))
    }

    pub fn node_by_index(&self, index: NodeIndex) -> Option<NodeInfo> {
        self.members
            .values()
            .find(|m| m.index == index)
            .map(|m| self.info(m))
    }

    /// Every registered node, dead ones included, by index.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let mut nodes: Vec<NodeInfo> = self.members.values().map(|m| self.info(m)).collect();
        nodes.sort_by_key(|n| n.index);
        nodes
    }

    /// Indices of the nodes holding a session, ascending.
    pub fn live_nodes(&self) -> Vec<NodeIndex> {
        let mut live: Vec<NodeIndex> = self
            .members
            .values()
            .filter(|m| self.sessions.contains_key(&m.id))
            .map(|m| m.index)
            .collect();
        live.sort_unstable();
        live
    }

    /// Where each partition of `topic` is served: its leader, and the leader's core for its replica (a node not
    /// known here counts as one core; `placement::replica_core`).
    pub fn locations(&self, topic: &TopicRecord) -> Vec<Location> {
        crate::engine::placement::leader_locations(
            topic.name(),
            &self.partition_states(topic),
            |node| self.node_by_index(node).map_or(1, |n| n.cores as usize),
        )
    }

    /// Number of partitions node `index` leads, and of those it is a replica of without leading, over every topic.
    pub fn partitions_on(&self, index: NodeIndex) -> (usize, usize) {
        let mut leads = 0;
        let mut follows = 0;
        for s in self.topics.values().flat_map(|t| &t.partitions) {
            if s.leader == index {
                leads += 1;
            } else if s.replicas.contains(&index) {
                follows += 1;
            }
        }
        (leads, follows)
    }

    /// What differs from `old` to `self`: node changes first, then topic deletions, then creations and changes.
    pub fn changes_since(&self, old: &Snapshot) -> Vec<Change> {
        let mut changes = Vec::new();
        let ids = old.members.keys().chain(self.members.keys());
        let mut ids: Vec<&String> = ids.collect();
        ids.sort();
        ids.dedup();
        for id in ids {
            match (old.node(id), self.node(id)) {
                (Some(_), None) => changes.push(Change::NodeRemoved(id.clone())),
                (before, Some(now)) if before.as_ref() != Some(&now) => {
                    changes.push(Change::Node(now))
                }
                _ => {}
            }
        }
        for (name, before) in &old.topics {
            match self.topics.get(name) {
                Some(now) if now.id() == before.id() => {}
                _ => changes.push(Change::TopicDeleted(before.clone())),
            }
        }
        for (name, now) in &self.topics {
            match old.topics.get(name) {
                Some(before) if before.id() == now.id() => {
                    if before.config != now.config
                        || before.placement != now.placement
                        || before.partitions != now.partitions
                    {
                        changes.push(Change::TopicChanged(now.clone()));
                    }
                }
                _ => changes.push(Change::TopicCreated(now.clone())),
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::{encode_member, encode_topic};
    use super::*;
    use crate::engine::topic::TopicConfig;

    fn put(key: Vec<u8>, value: Vec<u8>, rev: i64, create: i64, lease: i64) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key,
                value,
                create_revision: create,
                mod_revision: rev,
                version: 1,
                lease,
            },
        }
    }

    fn delete(key: Vec<u8>, rev: i64) -> Event {
        Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key,
                mod_revision: rev,
                ..KeyValue::default()
            },
        }
    }

    fn member(id: &str, index: NodeIndex) -> Vec<u8> {
        encode_member(&MemberRecord {
            id: id.into(),
            index,
            advertise: format!("{id}:80"),
            peer_addr: format!("{id}:81"),
            cores: 2,
            incarnation: String::new(),
        })
    }

    fn topic(name: &str, visibility_ms: u64) -> Vec<u8> {
        let mut c = TopicConfig::with_defaults(name);
        c.partitions = 2;
        c.visibility_ms = visibility_ms;
        encode_topic(&c, &[0, 1], &[])
    }

    #[test]
    fn events_move_a_snapshot_and_the_diff_names_every_difference() {
        let k = Keys::for_cluster("c").unwrap();
        let mut s = Snapshot::default();
        for ev in [
            put(k.member("a"), member("a", 0), 2, 2, 0),
            put(k.alive("a"), b"{}".to_vec(), 2, 2, 11),
            put(k.member("b"), member("b", 1), 3, 3, 0),
            put(k.topic("t"), topic("t", 5000), 4, 4, 0),
            put(k.topic("u"), topic("u", 5000), 5, 5, 0),
            put(k.node_counter(), b"2".to_vec(), 5, 2, 0),
        ] {
            s.apply(&k, &ev);
        }
        assert_eq!(s.revision, 5);
        assert_eq!(s.live_nodes(), [0]);
        assert_eq!(s.nodes().len(), 2);
        assert!(!s.node("b").unwrap().alive);
        assert_eq!(s.partitions_on(1), (2, 0));
        let before = s.clone();

        for ev in [
            delete(k.alive("a"), 6),
            put(k.alive("b"), b"{}".to_vec(), 7, 7, 12),
            put(k.topic("t"), topic("t", 9000), 8, 4, 0),
            delete(k.topic("u"), 9),
            put(k.topic("u"), topic("u", 5000), 10, 10, 0),
            put(k.topic("v"), b"garbage".to_vec(), 11, 11, 0),
        ] {
            s.apply(&k, &ev);
        }
        let changes = s.changes_since(&before);
        let summary: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Node(n) => format!("node {} alive={} session={}", n.id, n.alive, n.session),
                Change::NodeRemoved(id) => format!("removed {id}"),
                Change::TopicCreated(t) => format!("created {} {}", t.name(), t.id()),
                Change::TopicChanged(t) => {
                    format!("changed {} {}", t.name(), t.config.visibility_ms)
                }
                Change::TopicDeleted(t) => format!("deleted {} {}", t.name(), t.id()),
            })
            .collect();
        assert_eq!(
            summary,
            [
                "node a alive=false session=0",
                "node b alive=true session=12",
                "deleted u 5",
                "changed t 9000",
                "created u 10",
            ]
        );
        assert!(s.topic("v").is_none(), "an undecodable topic is absent");
        assert!(s.changes_since(&s).is_empty());
        assert_eq!(s.locations(s.topic("t").unwrap()).len(), 2);
    }

    /// A partition key moves the partition's leader (and so where it is served) for the topic id it names; a key of
    /// a deleted topic of the same name, or for a partition the topic does not have, changes nothing.
    #[test]
    fn partition_keys_move_leaders_for_their_topic_id_only() {
        use super::super::keys::encode_partition;
        let k = Keys::for_cluster("c").unwrap();
        let mut s = Snapshot::default();
        for ev in [
            put(k.member("a"), member("a", 0), 2, 2, 0),
            put(k.member("b"), member("b", 1), 3, 3, 0),
            // Left by an older topic "t" (id 1): ignored.
            put(k.partition("t", 0), encode_partition(1, &[1], 1), 3, 3, 0),
            put(k.topic("t"), topic("t", 5000), 4, 4, 0),
        ] {
            s.apply(&k, &ev);
        }
        let t = s.topic("t").unwrap().clone();
        assert_eq!(t.partitions[0], PartitionState::initial(0, 4));
        assert_eq!(t.partitions[1], PartitionState::initial(1, 4));
        assert_eq!(
            s.locations(&t).iter().map(|l| l.node).collect::<Vec<_>>(),
            [0, 1]
        );
        let before = s.clone();

        s.apply(
            &k,
            &put(
                k.partition("t", 0),
                encode_partition(4, &[0, 1], 1),
                6,
                6,
                0,
            ),
        );
        s.apply(
            &k,
            &put(k.partition("t", 7), encode_partition(4, &[0], 0), 7, 7, 0),
        );
        let t = s.topic("t").unwrap().clone();
        assert_eq!(t.partitions[0].leader, 1);
        assert_eq!(t.partitions[0].epoch, 6);
        assert_eq!(
            s.locations(&t).iter().map(|l| l.node).collect::<Vec<_>>(),
            [1, 1]
        );
        let stored = s.stored.get("t").unwrap().clone();
        assert_eq!(
            s.locations(&stored)
                .iter()
                .map(|l| l.node)
                .collect::<Vec<_>>(),
            [1, 1],
            "a record as a change wrote it is located by the partition keys known"
        );
        assert_eq!((s.partitions_on(0), s.partitions_on(1)), ((0, 1), (2, 0)));
        assert!(
            matches!(&s.changes_since(&before)[..], [Change::TopicChanged(t)] if t.partitions[0].leader == 1),
            "a leader move is a change of the topic"
        );

        // Deleted: the topic's partitions go back to where the creation put them.
        let moved = s.clone();
        s.apply(&k, &delete(k.partition("t", 0), 8));
        assert_eq!(
            s.topic("t").unwrap().partitions[0],
            PartitionState::initial(0, 4)
        );
        assert_eq!(s.changes_since(&moved).len(), 1);
        // An undecodable key is absent.
        s.apply(&k, &put(k.partition("t", 1), b"{".to_vec(), 9, 9, 0));
        assert_eq!(
            s.topic("t").unwrap().partitions[1],
            PartitionState::initial(1, 4)
        );
    }
}
