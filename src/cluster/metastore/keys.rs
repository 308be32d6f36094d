//! The metastore's key layout under the cluster prefix, and the JSON value of each key (see `docs/cluster.md`).
//! Pure: building keys, recognising them, encoding and decoding values. Anything etcd returns that does not decode
//! is an error value here, never a panic.

use super::MetaError;
use crate::cluster::etcd::KeyValue;
use crate::engine::placement::NodeIndex;
pub use crate::engine::placement::{PartitionState, MAX_REPLICAS};
use crate::engine::topic::{validate_name, TopicConfig, MAX_PARTITIONS, TOPIC_FORMAT};
use serde::{Deserialize, Serialize};

/// Root of every cluster's keys: the default prefix is `/berth/<cluster>/`.
pub const ROOT: &str = "/berth/";

const NODE_COUNTER: &str = "node-counter";
const NODES: &str = "nodes/";
const ALIVE: &str = "alive/";
const TOPICS: &str = "topics/";
const PARTITIONS: &str = "partitions/";
const DRAINS: &str = "drains/";

/// The keys of one cluster, all under one prefix (ending in `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

/// What a key under the prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// `node-counter`
    NodeCounter,
    /// `nodes/<id>`
    Member(String),
    /// `alive/<id>`
    Alive(String),
    /// `topics/<name>`
    Topic(String),
    /// `partitions/<topic>/<p>`
    Partition(String, u32),
    /// `drains/<id>`
    Drain(String),
}

impl Keys {
    /// `/berth/<cluster>/`; the cluster name follows the topic-name rule.
    pub fn for_cluster(cluster: &str) -> Result<Keys, MetaError> {
        validate_name(cluster).map_err(|e| MetaError::Invalid(format!("cluster name: {e}")))?;
        Ok(Keys {
            prefix: format!("{ROOT}{cluster}/"),
        })
    }

    /// Any prefix that is not empty and ends in `/` (tests, or several berth clusters sharing an etcd by path).
    pub fn with_prefix(prefix: &str) -> Result<Keys, MetaError> {
        if prefix.is_empty() || !prefix.ends_with('/') {
            return Err(MetaError::Invalid(format!(
                "metastore prefix '{prefix}' must be non-empty and end with '/'"
            )));
        }
        Ok(Keys {
            prefix: prefix.to_string(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn node_counter(&self) -> Vec<u8> {
        format!("{}{NODE_COUNTER}", self.prefix).into_bytes()
    }

    pub fn member(&self, id: &str) -> Vec<u8> {
        format!("{}{NODES}{id}", self.prefix).into_bytes()
    }

    pub fn alive(&self, id: &str) -> Vec<u8> {
        format!("{}{ALIVE}{id}", self.prefix).into_bytes()
    }

    pub fn topic(&self, name: &str) -> Vec<u8> {
        format!("{}{TOPICS}{name}", self.prefix).into_bytes()
    }

    /// `partitions/<topic>/<p>`: partition `p`'s replica set, leader and epoch, once they differ from the ones its
    /// topic record implies.
    pub fn partition(&self, topic: &str, p: u32) -> Vec<u8> {
        format!("{}{PARTITIONS}{topic}/{p}", self.prefix).into_bytes()
    }

    /// Prefix of every partition key of `topic`.
    pub fn partitions_of(&self, topic: &str) -> Vec<u8> {
        format!("{}{PARTITIONS}{topic}/", self.prefix).into_bytes()
    }

    /// `drains/<id>`: node `id` is being drained (`POST /cluster/nodes/ID/drain`) or was removed for good
    /// (`DELETE /cluster/nodes/ID`): its replicas move to other nodes (`cluster::mover`).
    pub fn drain(&self, id: &str) -> Vec<u8> {
        format!("{}{DRAINS}{id}", self.prefix).into_bytes()
    }

    /// Prefix of every drain key.
    pub fn drains(&self) -> Vec<u8> {
        format!("{}{DRAINS}", self.prefix).into_bytes()
    }

    /// Prefix of every member key.
    pub fn members(&self) -> Vec<u8> {
        format!("{}{NODES}", self.prefix).into_bytes()
    }

    /// Prefix of every alive key.
    pub fn alives(&self) -> Vec<u8> {
        format!("{}{ALIVE}", self.prefix).into_bytes()
    }

    /// What `key` is; `None` for keys outside the prefix, unknown kinds, and names that break the naming rule (a
    /// key someone else wrote by hand is ignored, not trusted).
    pub fn classify(&self, key: &[u8]) -> Option<KeyKind> {
        let rest = std::str::from_utf8(key).ok()?.strip_prefix(&self.prefix)?;
        let named = |sub: &str| {
            rest.strip_prefix(sub)
                .filter(|name| validate_name(name).is_ok())
                .map(str::to_string)
        };
        if rest == NODE_COUNTER {
            Some(KeyKind::NodeCounter)
        } else if let Some(id) = named(NODES) {
            Some(KeyKind::Member(id))
        } else if let Some(id) = named(ALIVE) {
            Some(KeyKind::Alive(id))
        } else if let Some(id) = named(DRAINS) {
            Some(KeyKind::Drain(id))
        } else if let Some(rest) = rest.strip_prefix(PARTITIONS) {
            let (topic, p) = rest.rsplit_once('/')?;
            validate_name(topic).ok()?;
            // The canonical decimal only: "007" or "+7" would be a second key for the same partition.
            let p: u32 = p.parse().ok().filter(|n: &u32| n.to_string() == p)?;
            (p < MAX_PARTITIONS).then(|| KeyKind::Partition(topic.to_string(), p))
        } else {
            named(TOPICS).map(KeyKind::Topic)
        }
    }
}

fn one() -> u32 {
    1
}

/// `nodes/<id>`: a node that registered once. Permanent, so a dead node stays listed; its index never changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub id: String,
    /// The node's small number, which `Location.node` carries.
    pub index: NodeIndex,
    /// Client HTTP address as others should reach it (`--advertise`).
    pub advertise: String,
    /// Node RPC address (`--peer-listen`).
    pub peer_addr: String,
    /// Executor cores, so every node can compute every partition's `Location.core`.
    #[serde(default = "one")]
    pub cores: u32,
    /// The node's data directory incarnation (`storage::incarnation`, 32 hex digits); empty in records written
    /// before it existed. A node that registers with another one lost what its data directory held.
    #[serde(default)]
    pub incarnation: String,
}

/// `drains/<id>`: a node whose replicas move elsewhere. Written once per drain or removal (a removal replaces a
/// drain); a drain is ended by deleting the key, a removal is for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// `DELETE /cluster/nodes/ID`: the node is gone for good and may not register again under its id.
    pub removed: bool,
    /// Wall clock of the request.
    pub since_ms: u64,
}

/// `alive/<id>`, attached to the node's session lease. The value is for people reading etcd; the lease id that
/// counts is the key's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AliveRecord {
    /// The session lease, hex (as `etcdctl lease list` shows it).
    pub lease: String,
    /// Wall clock of the registration.
    pub since_ms: u64,
}

/// A topic as the metastore holds it: settings, the node each partition was placed on, and each partition's
/// replica set, leader and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    /// The settings. `config.id` is the revision that created the key: unique per creation, so a topic created
    /// again under the same name never shares the old one's id.
    pub config: TopicConfig,
    /// The node partition `p` was placed on at creation is `placement[p]`.
    pub placement: Vec<NodeIndex>,
    /// Replicated topics (`replicas` > 1): the other nodes the creation gave partition `p` a replica on are
    /// `followers[p]`, R - 1 of them. Empty for R = 1 (and in every record written before replication).
    pub followers: Vec<Vec<NodeIndex>>,
    /// Partition `p`'s replicas, leader and epoch: its `partitions/<topic>/<p>` key when one of this topic exists,
    /// otherwise the ones the creation implies ([`PartitionState::initial`]).
    pub partitions: Vec<PartitionState>,
    /// Revision of the last write of `topics/<name>` (what a change compares against).
    pub mod_revision: i64,
}

/// `partitions/<topic>/<p>`: a partition's state, for the topic created at `topic_id` (a key left by a deleted
/// topic of the same name names another id and is ignored). Its epoch is the key's mod revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRecord {
    pub topic_id: u64,
    pub state: PartitionState,
}

/// The stored form of a partition key (the epoch is not stored: it is the revision that wrote the key).
#[derive(Serialize, Deserialize)]
struct StoredPartition {
    topic_id: u64,
    replicas: Vec<NodeIndex>,
    leader: NodeIndex,
    /// Replicas that do not vote yet (added by a move, not promoted); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    learners: Vec<NodeIndex>,
}

impl TopicRecord {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn id(&self) -> u64 {
        self.config.id
    }

    /// Each partition as the creation left it: led by the node it was placed on, at the topic's creation
    /// revision, with the followers the creation chose (none for R = 1: exactly where partitions were before
    /// partition keys existed).
    pub fn initial_states(&self) -> Vec<PartitionState> {
        self.placement
            .iter()
            .enumerate()
            .map(|(p, &node)| {
                let mut state = PartitionState::initial(node, self.id());
                if let Some(followers) = self.followers.get(p) {
                    state.replicas.extend_from_slice(followers);
                }
                state
            })
            .collect()
    }
}

/// The stored form of a topic.
#[derive(Serialize, Deserialize)]
struct StoredTopic {
    config: TopicConfig,
    placement: Vec<NodeIndex>,
    /// Absent for R = 1, so that such a record reads and writes as before replication.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    followers: Vec<Vec<NodeIndex>>,
}

fn corrupt(kv: &KeyValue, reason: impl std::fmt::Display) -> MetaError {
    MetaError::Corrupt {
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        reason: reason.to_string(),
    }
}

/// The value of `topics/<name>`: the settings with `id` 0 (the id is the key's create revision), the placement, and
/// for a replicated topic each partition's followers.
pub fn encode_topic(
    config: &TopicConfig,
    placement: &[NodeIndex],
    followers: &[Vec<NodeIndex>],
) -> Vec<u8> {
    let mut config = config.clone();
    config.id = 0;
    config.format = TOPIC_FORMAT;
    serde_json::to_vec(&StoredTopic {
        config,
        placement: placement.to_vec(),
        followers: followers.to_vec(),
    })
    .expect("a topic serialises")
}

/// Decodes `topics/<name>`, checking that it is consistent with its key.
pub fn decode_topic(name: &str, kv: &KeyValue) -> Result<TopicRecord, MetaError> {
    let stored: StoredTopic = serde_json::from_slice(&kv.value).map_err(|e| corrupt(kv, e))?;
    let mut config = stored.config;
    if config.name != name {
        return Err(corrupt(kv, format!("names topic '{}'", config.name)));
    }
    if config.partitions == 0
        || config.partitions > MAX_PARTITIONS
        || stored.placement.len() != config.partitions as usize
    {
        return Err(corrupt(
            kv,
            format!(
                "{} partitions with {} placed",
                config.partitions,
                stored.placement.len()
            ),
        ));
    }
    if kv.create_revision <= 0 {
        return Err(corrupt(kv, "no create revision"));
    }
    // A replicated topic's followers: R - 1 distinct nodes per partition, none of them its placement's node.
    if !stored.followers.is_empty() || config.replicas != 1 {
        let want = (config.replicas as usize).saturating_sub(1);
        let bad = config.replicas as usize > MAX_REPLICAS
            || stored.followers.len() != stored.placement.len()
            || stored
                .followers
                .iter()
                .zip(&stored.placement)
                .any(|(f, node)| {
                    let mut distinct = f.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    f.len() != want || distinct.len() != want || f.contains(node)
                });
        if bad {
            return Err(corrupt(
                kv,
                format!(
                    "replicas={} with followers {:?} for placement {:?}",
                    config.replicas, stored.followers, stored.placement
                ),
            ));
        }
    }
    config.id = kv.create_revision as u64;
    let mut record = TopicRecord {
        config,
        placement: stored.placement,
        followers: stored.followers,
        partitions: Vec::new(),
        mod_revision: kv.mod_revision,
    };
    record.partitions = record.initial_states();
    Ok(record)
}

/// The value of `partitions/<topic>/<p>` for `topic_id`, `replicas` and `leader`.
#[cfg(test)]
pub fn encode_partition(topic_id: u64, replicas: &[NodeIndex], leader: NodeIndex) -> Vec<u8> {
    encode_partition_with(topic_id, replicas, leader, &[])
}

/// [`encode_partition`] with the replicas that do not vote yet.
pub fn encode_partition_with(
    topic_id: u64,
    replicas: &[NodeIndex],
    leader: NodeIndex,
    learners: &[NodeIndex],
) -> Vec<u8> {
    serde_json::to_vec(&StoredPartition {
        topic_id,
        replicas: replicas.to_vec(),
        leader,
        learners: learners.to_vec(),
    })
    .expect("a partition record serialises")
}

/// Err(why) unless `learners` are distinct replicas other than the leader.
pub fn check_learners(
    replicas: &[NodeIndex],
    leader: NodeIndex,
    learners: &[NodeIndex],
) -> Result<(), String> {
    let mut distinct = learners.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() != learners.len()
        || learners.contains(&leader)
        || learners.iter().any(|l| !replicas.contains(l))
    {
        return Err(format!(
            "learners {learners:?}: distinct replicas of {replicas:?}, not the leader {leader}"
        ));
    }
    Ok(())
}

/// Decodes `partitions/<topic>/<p>`: one to [`MAX_REPLICAS`] distinct replicas, the leader one of them, a topic id;
/// the epoch is the key's mod revision.
pub fn decode_partition(kv: &KeyValue) -> Result<PartitionRecord, MetaError> {
    let stored: StoredPartition = serde_json::from_slice(&kv.value).map_err(|e| corrupt(kv, e))?;
    let replicas = stored.replicas;
    let mut distinct = replicas.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if replicas.is_empty() || replicas.len() > MAX_REPLICAS || distinct.len() != replicas.len() {
        return Err(corrupt(
            kv,
            format!("replicas {replicas:?}: 1 to {MAX_REPLICAS} distinct nodes"),
        ));
    }
    if !replicas.contains(&stored.leader) {
        return Err(corrupt(
            kv,
            format!("leader {} is not one of {replicas:?}", stored.leader),
        ));
    }
    if stored.topic_id == 0 || kv.mod_revision <= 0 {
        return Err(corrupt(kv, "no topic id or no mod revision"));
    }
    check_learners(&replicas, stored.leader, &stored.learners).map_err(|e| corrupt(kv, e))?;
    Ok(PartitionRecord {
        topic_id: stored.topic_id,
        state: PartitionState {
            placed: Vec::new(),

            replicas,
            leader: stored.leader,
            epoch: kv.mod_revision as u64,
            learners: stored.learners,
        },
    })
}

pub fn encode_member(member: &MemberRecord) -> Vec<u8> {
    serde_json::to_vec(member).expect("a member serialises")
}

/// Decodes `nodes/<id>`, checking that it names the node of its key.
pub fn decode_member(id: &str, kv: &KeyValue) -> Result<MemberRecord, MetaError> {
    let member: MemberRecord = serde_json::from_slice(&kv.value).map_err(|e| corrupt(kv, e))?;
    if member.id != id {
        return Err(corrupt(kv, format!("names node '{}'", member.id)));
    }
    Ok(member)
}

pub fn encode_drain(drain: &DrainRecord) -> Vec<u8> {
    serde_json::to_vec(drain).expect("a drain record serialises")
}

pub fn decode_drain(kv: &KeyValue) -> Result<DrainRecord, MetaError> {
    serde_json::from_slice(&kv.value).map_err(|e| corrupt(kv, e))
}

pub fn encode_alive(lease: i64, since_ms: u64) -> Vec<u8> {
    serde_json::to_vec(&AliveRecord {
        lease: format!("{lease:x}"),
        since_ms,
    })
    .expect("an alive record serialises")
}

/// Decodes `node-counter`: the next index to hand out.
pub fn decode_counter(kv: &KeyValue) -> Result<NodeIndex, MetaError> {
    serde_json::from_slice(&kv.value).map_err(|e| corrupt(kv, e))
}

pub fn encode_counter(next: NodeIndex) -> Vec<u8> {
    next.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &[u8], value: &[u8], create: i64, modr: i64) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            value: value.to_vec(),
            create_revision: create,
            mod_revision: modr,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn keys_are_recognised_only_under_the_prefix_and_with_valid_names() {
        let k = Keys::for_cluster("prod").unwrap();
        assert_eq!(k.prefix(), "/berth/prod/");
        assert_eq!(
            k.classify(&k.member("n1")),
            Some(KeyKind::Member("n1".into()))
        );
        assert_eq!(
            k.classify(&k.alive("n1")),
            Some(KeyKind::Alive("n1".into()))
        );
        assert_eq!(
            k.classify(&k.topic("t.1")),
            Some(KeyKind::Topic("t.1".into()))
        );
        assert_eq!(k.classify(&k.node_counter()), Some(KeyKind::NodeCounter));
        assert_eq!(
            k.classify(&k.partition("t.1", 4095)),
            Some(KeyKind::Partition("t.1".into(), 4095))
        );
        assert!(k.partition("t", 3).starts_with(&k.partitions_of("t")));
        assert!(!k.partition("tt", 3).starts_with(&k.partitions_of("t")));
        for other in [
            &b"/berth/prod/partitions/t/4096"[..],
            b"/berth/prod/partitions/t/007",
            b"/berth/prod/partitions/t/+7",
            b"/berth/prod/partitions/t/",
            b"/berth/prod/partitions/t",
            b"/berth/prod/partitions//1",
            b"/berth/prod/partitions/a/b/1",
        ] {
            assert_eq!(
                k.classify(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        for other in [
            &b"/berth/other/topics/t"[..],
            b"/berth/prod/topics/a/b",
            b"/berth/prod/topics/",
            b"/berth/prod/nodes/\xff",
            b"/berth/prod/whatever",
        ] {
            assert_eq!(
                k.classify(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        assert!(Keys::for_cluster("a/b").is_err());
        assert!(Keys::with_prefix("/x").is_err());
        assert!(Keys::with_prefix("").is_err());
    }

    #[test]
    fn a_topic_round_trips_and_takes_its_id_from_the_create_revision() {
        let mut config = TopicConfig::with_defaults("orders");
        config.partitions = 3;
        config.id = 99;
        let value = encode_topic(&config, &[0, 1, 0], &[]);
        let rec = decode_topic("orders", &kv(b"k", &value, 7, 9)).unwrap();
        assert_eq!(rec.id(), 7);
        assert_eq!(rec.mod_revision, 9);
        assert_eq!(rec.placement, [0, 1, 0]);
        assert_eq!(
            rec.partitions,
            [0, 1, 0].map(|n| PartitionState::initial(n, 7)),
            "no partition key: each partition alone on its node, at the topic's creation"
        );
        assert_eq!(rec.partitions[1].epoch, 7);
        config.id = 7;
        assert_eq!(rec.config, config);
    }

    #[test]
    fn inconsistent_values_are_errors_not_panics() {
        let mut config = TopicConfig::with_defaults("orders");
        config.partitions = 2;
        let short = encode_topic(&config, &[0], &[]);
        let good = encode_topic(&config, &[0, 1], &[]);
        for (name, value, create) in [
            ("orders", &short[..], 5),
            ("other", &good[..], 5),
            ("orders", &good[..], 0),
            ("orders", b"{", 5),
            ("orders", b"[]", 5),
            ("orders", br#"{"config":{},"placement":[]}"#, 5),
        ] {
            assert!(matches!(
                decode_topic(name, &kv(b"k", value, create, create)),
                Err(MetaError::Corrupt { .. })
            ));
        }
        let member = MemberRecord {
            id: "n1".into(),
            index: 3,
            advertise: "a:1".into(),
            peer_addr: "a:2".into(),
            cores: 2,
            incarnation: String::new(),
        };
        let value = encode_member(&member);
        assert_eq!(
            decode_member("n1", &kv(b"k", &value, 1, 1)).unwrap(),
            member
        );
        assert!(decode_member("n2", &kv(b"k", &value, 1, 1)).is_err());
        assert!(decode_counter(&kv(b"k", b"-1", 1, 1)).is_err());
        let value = encode_partition(5, &[2, 0, 1], 0);
        assert_eq!(
            std::str::from_utf8(&value).unwrap(),
            r#"{"topic_id":5,"replicas":[2,0,1],"leader":0}"#
        );
        assert_eq!(
            decode_partition(&kv(b"k", &value, 3, 9)).unwrap(),
            PartitionRecord {
                topic_id: 5,
                state: PartitionState {
                    placed: Vec::new(),
                    learners: Vec::new(),
                    replicas: vec![2, 0, 1],
                    leader: 0,
                    epoch: 9,
                },
            },
            "the epoch is the revision of the key's last write"
        );
        for bad in [
            &br#"{"topic_id":5,"replicas":[],"leader":0}"#[..],
            br#"{"topic_id":5,"replicas":[0,0],"leader":0}"#,
            br#"{"topic_id":5,"replicas":[1,2],"leader":0}"#,
            br#"{"topic_id":0,"replicas":[0],"leader":0}"#,
            br#"{"topic_id":5,"replicas":[0,1,2,3,4,5,6,7],"leader":0}"#,
            br#"{"topic_id":5,"leader":0}"#,
            b"[",
        ] {
            assert!(
                matches!(
                    decode_partition(&kv(b"k", bad, 1, 1)),
                    Err(MetaError::Corrupt { .. })
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(decode_partition(&kv(b"k", &value, 0, 0)).is_err());
    }
}
