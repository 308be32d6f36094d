//! The metastore's key layout under the cluster prefix, and the JSON value of each key (see `docs/cluster.md`).
//! Pure: building keys, recognising them, encoding and decoding values. Anything etcd returns that does not decode
//! is an error value here, never a panic.

use super::MetaError;
use crate::cluster::etcd::KeyValue;
use crate::engine::placement::NodeIndex;
use crate::engine::topic::{validate_name, TopicConfig, MAX_PARTITIONS, TOPIC_FORMAT};
use serde::{Deserialize, Serialize};

/// Root of every cluster's keys: the default prefix is `/berth/<cluster>/`.
pub const ROOT: &str = "/berth/";

const NODE_COUNTER: &str = "node-counter";
const NODES: &str = "nodes/";
const ALIVE: &str = "alive/";
const TOPICS: &str = "topics/";

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

/// `alive/<id>`, attached to the node's session lease. The value is for people reading etcd; the lease id that
/// counts is the key's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AliveRecord {
    /// The session lease, hex (as `etcdctl lease list` shows it).
    pub lease: String,
    /// Wall clock of the registration.
    pub since_ms: u64,
}

/// A topic as the metastore holds it: settings and the node of every partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    /// The settings. `config.id` is the revision that created the key: unique per creation, so a topic created
    /// again under the same name never shares the old one's id.
    pub config: TopicConfig,
    /// The node of partition `p` is `placement[p]`.
    pub placement: Vec<NodeIndex>,
    /// Revision of the last write (what a change compares against).
    pub mod_revision: i64,
}

impl TopicRecord {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn id(&self) -> u64 {
        self.config.id
    }
}

/// The stored form of a topic.
#[derive(Serialize, Deserialize)]
struct StoredTopic {
    config: TopicConfig,
    placement: Vec<NodeIndex>,
}

fn corrupt(kv: &KeyValue, reason: impl std::fmt::Display) -> MetaError {
    MetaError::Corrupt {
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        reason: reason.to_string(),
    }
}

/// The value of `topics/<name>`: the settings with `id` 0 (the id is the key's create revision) and the placement.
pub fn encode_topic(config: &TopicConfig, placement: &[NodeIndex]) -> Vec<u8> {
    let mut config = config.clone();
    config.id = 0;
    config.format = TOPIC_FORMAT;
    serde_json::to_vec(&StoredTopic {
        config,
        placement: placement.to_vec(),
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
    config.id = kv.create_revision as u64;
    Ok(TopicRecord {
        config,
        placement: stored.placement,
        mod_revision: kv.mod_revision,
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
        let value = encode_topic(&config, &[0, 1, 0]);
        let rec = decode_topic("orders", &kv(b"k", &value, 7, 9)).unwrap();
        assert_eq!(rec.id(), 7);
        assert_eq!(rec.mod_revision, 9);
        assert_eq!(rec.placement, [0, 1, 0]);
        config.id = 7;
        assert_eq!(rec.config, config);
    }

    #[test]
    fn inconsistent_values_are_errors_not_panics() {
        let mut config = TopicConfig::with_defaults("orders");
        config.partitions = 2;
        let short = encode_topic(&config, &[0]);
        let good = encode_topic(&config, &[0, 1]);
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
        assert_eq!(
            decode_counter(&kv(b"k", &encode_counter(4), 1, 1)).unwrap(),
            4
        );
    }
}
