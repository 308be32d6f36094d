//! The cluster metastore on etcd: which nodes exist and which are alive, which topics exist, and where each
//! partition lives. It exists so that nodes agree on placement without talking to each other; etcd's transactions
//! make every decision (a node index, a topic's creation, a settings change) once, for everyone.
//!
//! Core 0 owns all of it: the [`Metastore`] handle (one etcd client), the node's [`Session`] (lease and keep-alive)
//! and the [`Replica`] (one watch). Nothing here is `Send` except [`Snapshot`]: other cores get the cluster state as
//! an `Arc<Snapshot>` in a message from core 0, and ask core 0 for anything that must read or write etcd (a lookup
//! on a miss, a topic creation). The metastore's logic runs as glommio tasks on core 0; the etcd calls themselves
//! run on the etcd client's control-plane thread (`cluster::etcd`), which core 0 reaches over channels.
//!
//! Key layout under the prefix (default `/berth/<cluster>/`), values JSON (`docs/cluster.md` has the details):
//!
//! | key | value | written by, in |
//! |---|---|---|
//! | `node-counter` | next node index, e.g. `3` | a node's first registration, in its registration txn |
//! | `nodes/<id>` | `{"id","index","advertise","peer_addr","cores"}`, permanent | registration txn |
//! | `alive/<id>` | `{"lease","since_ms"}`, attached to the session lease | registration txn; goes with the lease |
//! | `drains/<id>` | `{"removed","since_ms"}`: the node's replicas move to other nodes | `set_drain` (drain, removal) |
//! | `topics/<name>` | `{"config": TopicConfig, "placement": [node index per partition]}` | `create_topic` txn (if absent), `change_topic` txn (if mod revision unchanged), `delete_topic` |
//!
//! A topic's id is the revision that created its key (stored as `id: 0` in `config`), so a topic created again
//! under the same name has a new id.

mod drains;
mod keys;
mod placement;
mod replica;
mod session;
mod snapshot;
mod topics;
mod watched;

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use keys::{
    check_learners, encode_alive, encode_member, encode_partition_with, encode_topic,
};
pub use keys::{
    DrainRecord, Keys, MemberRecord, PartitionRecord, PartitionState, TopicRecord, MAX_REPLICAS,
};
pub use placement::spread;
pub use replica::{Changes, Replica, ReplicaStatus};
pub use session::{NodeSpec, Session, SessionState};
pub use snapshot::{Change, NodeInfo, Snapshot};

use super::etcd::{Etcd, EtcdConfig, EtcdError, RangeResponse, TxnOpResponse, TxnResponse};
use std::fmt;
use std::rc::Rc;
use std::time::Duration;

/// Default session lease TTL: how long a node that stops answering keeps its partitions (and how long a crashed
/// node's id stays taken).
pub const DEFAULT_LEASE_TTL_S: i64 = 5;
/// How long a node keeps serving while it cannot reach etcd, counted from the send time of its last acknowledged
/// lease refresh (`MetaConfig::grace`). 15 s: a 10 s etcd outage is ridden out whenever it starts.
pub const DEFAULT_GRACE: std::time::Duration = std::time::Duration::from_secs(15);
/// Longest session lease TTL accepted.
pub const MAX_LEASE_TTL_S: i64 = 3600;
/// Most rounds of read-then-compare-and-write before a metastore write gives up with [`MetaError::Contended`]
/// (each lost round means another writer's change went in).
pub const MAX_TXN_ATTEMPTS: usize = 32;
/// First delay before retrying etcd after a failure (watch reconnect, re-registration, keep-alive retry).
pub const RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest delay between retries; doubles from [`RETRY_MIN`] up to this.
pub const RETRY_MAX: Duration = Duration::from_secs(2);

/// Everything a metastore call can fail with.
#[derive(Debug)]
pub enum MetaError {
    /// etcd failed the call; [`EtcdError::Transport`] on a write means its outcome is unknown.
    Etcd(EtcdError),
    /// A name, setting or argument is unusable.
    Invalid(String),
    /// Another live node holds this node id (its alive key exists under another session).
    NodeIdInUse {
        id: String,
    },
    /// No node holds a session, so a topic has nowhere to go.
    NoLiveNodes,
    TopicNotFound(String),
    /// Other writers kept changing the same keys: `what` gave up after [`MAX_TXN_ATTEMPTS`] rounds.
    Contended(&'static str),
    /// A stored value does not decode or contradicts its key.
    Corrupt {
        key: String,
        reason: String,
    },
    /// Every `u32` node index has been handed out.
    NodeIndexExhausted,
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaError::Etcd(e) => write!(f, "metastore: {e}"),
            MetaError::Invalid(s) => write!(f, "metastore: {s}"),
            MetaError::NodeIdInUse { id } => write!(
                f,
                "node id '{id}' is held by another live node (a crashed node's id frees up once its lease expires)"
            ),
            MetaError::NoLiveNodes => write!(f, "no live node to place partitions on"),
            MetaError::TopicNotFound(t) => write!(f, "topic '{t}' not found"),
            MetaError::Contended(what) => write!(
                f,
                "metastore: {what} gave up after {MAX_TXN_ATTEMPTS} concurrent changes"
            ),
            MetaError::Corrupt { key, reason } => write!(f, "metastore key {key}: {reason}"),
            MetaError::NodeIndexExhausted => write!(f, "metastore: node indices exhausted"),
        }
    }
}

impl std::error::Error for MetaError {}

impl From<EtcdError> for MetaError {
    fn from(e: EtcdError) -> MetaError {
        MetaError::Etcd(e)
    }
}

/// How to reach the metastore.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// etcd client URLs (`http://host:port`); calls go to those that connect.
    pub endpoints: Vec<String>,
    pub keys: Keys,
    /// Session lease TTL, seconds, 1 to [`MAX_LEASE_TTL_S`] (default [`DEFAULT_LEASE_TTL_S`]; etcd raises values
    /// below its minimum, 2 s with default settings). Keep-alives go every third of it.
    pub lease_ttl_s: i64,
    /// Timeouts and limits of the etcd client.
    pub etcd: EtcdConfig,
    /// How long the session stays `Live` while etcd cannot be reached, from the send time of the last refresh etcd
    /// acknowledged (never less than the TTL): `docs/cluster.md`, "Riding out an etcd outage". Default
    /// [`DEFAULT_GRACE`].
    pub grace: std::time::Duration,
    /// Topics may be created with `replicas` > 1 (`--replication-preview`): replication is not finished
    /// (docs/replication.md, step plan), so this is off unless asked for.
    pub replication_preview: bool,
}

impl MetaConfig {
    /// Endpoints and cluster name, defaults for the rest.
    pub fn new(endpoints: Vec<String>, cluster: &str) -> Result<MetaConfig, MetaError> {
        Ok(MetaConfig {
            endpoints,
            keys: Keys::for_cluster(cluster)?,
            lease_ttl_s: DEFAULT_LEASE_TTL_S,
            etcd: EtcdConfig::default(),
            grace: DEFAULT_GRACE,
            replication_preview: false,
        })
    }
}

/// A handle on the metastore: an etcd client and the key layout. Lives on core 0 (see the module header); shared
/// by `Rc` with the session and replica tasks it starts.
#[derive(Debug)]
pub struct Metastore {
    etcd: Etcd,
    keys: Keys,
    lease_ttl_s: i64,
    grace: std::time::Duration,
    replication_preview: bool,
}

impl Metastore {
    pub fn new(config: MetaConfig) -> Result<Rc<Metastore>, MetaError> {
        if !(1..=MAX_LEASE_TTL_S).contains(&config.lease_ttl_s) {
            return Err(MetaError::Invalid(format!(
                "lease ttl {} s is not within 1 to {MAX_LEASE_TTL_S} s",
                config.lease_ttl_s
            )));
        }
        Ok(Rc::new(Metastore {
            etcd: Etcd::with_config(config.endpoints, config.etcd)?,
            keys: config.keys,
            lease_ttl_s: config.lease_ttl_s,
            grace: config
                .grace
                .max(std::time::Duration::from_secs(config.lease_ttl_s as u64)),
            replication_preview: config.replication_preview,
        }))
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Stops the etcd client's control-plane thread (a node's last step on the way out, after
    /// [`Session::close`]): later calls fail with [`EtcdError::Unavailable`], the replica's watch ends.
    pub async fn close(&self) {
        self.etcd.close().await;
    }

    /// Reads everything under the prefix at one revision, straight from etcd.
    pub async fn read_all(&self) -> Result<Snapshot, MetaError> {
        let read = self.etcd.get_prefix(self.keys.prefix().as_bytes()).await?;
        Ok(Snapshot::from_kvs(&self.keys, read.revision, &read.kvs))
    }
}

/// The range results of a transaction whose ops are all reads, in order; anything else is a decode error.
fn ranges(t: &TxnResponse, n: usize) -> Result<Vec<&RangeResponse>, MetaError> {
    let ranges: Vec<&RangeResponse> = t
        .responses
        .iter()
        .filter_map(|r| match r {
            TxnOpResponse::Range(range) => Some(range),
            _ => None,
        })
        .collect();
    if ranges.len() != n {
        return Err(MetaError::Etcd(EtcdError::Decode(format!(
            "expected {n} range results in a transaction, got {:?}",
            t.responses
        ))));
    }
    Ok(ranges)
}
