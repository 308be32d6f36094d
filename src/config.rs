//! Server configuration: every limit berth enforces, with its default next to its name.
//! Built from embedded defaults, then a TOML file (`--config`), then command-line flags; read by `server` at start.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

pub use crate::storage::FsyncPolicy;

/// Cluster mode: how this node joins (`[cluster]` in TOML, or the `serve` flags).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// etcd client URLs (`http://host:port`).
    pub etcd: Vec<String>,
    /// This node's id (letters, digits, `-`, `_`, `.`), unique in the cluster.
    pub node_id: String,
    /// This node's client HTTP address as other nodes and clients should reach it (`GET /cluster`).
    pub advertise: String,
    /// Where node RPC listens; published in etcd. Default: the `listen` address's host, port + 100.
    pub peer_listen: Option<SocketAddr>,
    /// etcd key prefix `/berth/<name>/`: several clusters can share one etcd. Default `default`.
    #[serde(default = "default_cluster_name")]
    pub name: String,
    /// Session lease TTL in seconds: a node that stops renewing is dead this long after. Default 5.
    #[serde(default = "default_node_ttl")]
    pub node_ttl_s: u64,
    /// A node RPC call that gets no answer in this long fails with 503 partition_unavailable. Default 2000 ms.
    #[serde(default = "default_rpc_timeout")]
    pub rpc_timeout_ms: u64,
    /// Seconds a node keeps serving its partitions while it cannot reach etcd, from the last lease refresh etcd
    /// acknowledged (a value below `node_ttl_s` counts as `node_ttl_s`; docs/cluster.md, "Riding out an etcd outage"). Default 15.
    #[serde(default = "default_etcd_grace")]
    pub etcd_grace_s: u64,
    /// A file holding the cluster secret every node presents in its node RPC hello (at least 16 characters, at most
    /// 1024, and not the client token: a client's bearer token never opens node RPC). Required when node RPC
    /// listens on a non-loopback address, unless `insecure`. Default: none (node RPC on loopback accepts any hello).
    #[serde(default)]
    pub peer_token_file: Option<PathBuf>,
    /// A PEM file with the CA certificate(s) that sign every node's node RPC certificate. Set, node RPC speaks TLS
    /// only, both ways: each node checks its peer's certificate against this CA and the host the peer is
    /// published under (the host of its `peer_listen`). Every node of a cluster must agree. Default: none (plain).
    #[serde(default)]
    pub peer_tls_ca_file: Option<PathBuf>,
    /// This node's node RPC certificate chain (PEM). Default: `tls_cert_file`.
    #[serde(default)]
    pub peer_tls_cert_file: Option<PathBuf>,
    /// The key of `peer_tls_cert_file` (PEM). Default: `tls_key_file`.
    #[serde(default)]
    pub peer_tls_key_file: Option<PathBuf>,
    /// With `peer_tls_ca_file`: a node accepts node RPC only from a peer presenting a certificate signed by that
    /// CA (each node presents its own when it connects). Default false (the cluster secret authenticates peers).
    #[serde(default)]
    pub peer_tls_client_auth: bool,
    /// Topics may be created with `replicas` > 1. Replication is being built (docs/replication.md): produces are
    /// answered once a majority of the replicas has them durable, but there is no failover yet, so this is for
    /// trying it, not for data that must survive a node. Default false. Every node should agree.
    #[serde(default)]
    pub replication_preview: bool,
    /// How long a produce to a replicated partition waits for a majority of its replicas to have it durable before
    /// it is answered `503 not_enough_replicas` (1 to 600000). Default 2000.
    #[serde(default = "default_replica_timeout")]
    pub replica_timeout_ms: u64,
    /// Bytes of shipped batches a leader keeps per replicated partition for followers that lack them (1 MiB to
    /// 4 GiB); a follower further behind is marked lagging. Default 64 MiB.
    #[serde(default = "default_replica_window")]
    pub replica_window_bytes: u64,
    /// The same per core, all its partitions together (at least `replica_window_bytes`, at most 16 GiB): over it,
    /// the partition keeping the most drops its oldest batch. Default 256 MiB.
    #[serde(default = "default_replica_core_window")]
    pub replica_core_window_bytes: u64,
    /// Batches in flight to each follower of a partition (1 to 16, what a follower queues). Default 8.
    #[serde(default = "default_replica_in_flight")]
    pub replica_max_in_flight: u64,
    /// How long a replicated partition's leader holds its next batch while its last one is not yet on a majority
    /// (0 to 100000 µs; 0: never): the produces that arrive meanwhile go in one batch, one journal pass and one
    /// fdatasync on every replica, instead of one each behind the other. Default [`DEFAULT_GATHER_US`]: measured
    /// against 0 with early ship on one machine, it cut the nodes' CPU per replicated cycle and the cycle's p99, and
    /// the produce's p99 ratio grew within the noise. Where a commit takes longer than the hold (replicas across a
    /// slow network, slow disks) each batch behind one uncommitted waits the whole hold (`docs/benchmarks.md`,
    /// "Replication: the gather again, with early ship").
    #[serde(default = "default_gather_us")]
    pub replica_gather_us: u64,
    /// A replicated partition's leader ships each batch to its followers once written, before its own fdatasync
    /// (true), or once durable here (false). Either way a produce is answered once the leader and enough followers
    /// for a majority have it durable; shipping early lets the replicas' syncs overlap. A batch ships early only
    /// with room reserved for its entry in the journal (`Journal::reserve`), so a full disk refuses it (`507`)
    /// before anything is shipped; a pass the device refuses (`EIO`) after an early ship stops the partition's
    /// appends on this replica until a restart (its leadership goes to a healthy follower when a majority of them
    /// is up: `front/quorum.rs`). Default true: faster on every measured row (`docs/benchmarks.md`, "Replication:
    /// early ship with the journal's reservation, now the default"; docs/replication.md, step 4).
    #[serde(default = "default_ship_early")]
    pub replica_ship_early: bool,
    /// A replicated partition's leader hands out leases (consumes) only while a majority of its replicas, itself
    /// counted, answered it within this long; a new leader hands out none for this long and an eighth after its
    /// fencing round, so that a deposed leader that has not heard of its successor (a stalled metastore watch, its
    /// followers out of reach) never hands out what its successor settled (docs/replication.md, "The leader's
    /// lease"). Longer rides out slower answers; shorter fails consumes over sooner (100 to 60000). Default 1000.
    #[serde(default = "default_replica_lease")]
    pub replica_lease_ms: u64,
}

fn default_replica_lease() -> u64 {
    crate::partition::lease::DEFAULT_LEASE_MS
}

fn default_replica_window() -> u64 {
    64 << 20
}

fn default_replica_core_window() -> u64 {
    256 << 20
}

fn default_replica_in_flight() -> u64 {
    8
}

fn default_replica_timeout() -> u64 {
    2000
}

fn default_cluster_name() -> String {
    "default".into()
}

fn default_node_ttl() -> u64 {
    5
}

fn default_etcd_grace() -> u64 {
    15
}

fn default_rpc_timeout() -> u64 {
    2000
}

/// `[cluster] replica_ship_early`'s default.
pub const DEFAULT_SHIP_EARLY: bool = true;

/// `[cluster] replica_gather_us`'s default.
pub const DEFAULT_GATHER_US: u64 = 1000;

fn default_gather_us() -> u64 {
    DEFAULT_GATHER_US
}

fn default_ship_early() -> bool {
    DEFAULT_SHIP_EARLY
}

impl ClusterSettings {
    /// The node RPC address: `peer_listen`, else `listen`'s host at port + 100.
    pub fn peer_addr(&self, listen: SocketAddr) -> SocketAddr {
        self.peer_listen
            .unwrap_or_else(|| SocketAddr::new(listen.ip(), listen.port().wrapping_add(100)))
    }
}

/// Everything `berth serve` can be told. Field names are the TOML keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address every core listens on (SO_REUSEPORT). Default 127.0.0.1:7070.
    pub listen: SocketAddr,
    /// Where topics, logs and frontier files live. Default ./berth-data.
    pub data_dir: PathBuf,
    /// Number of executors (one pinned core each). Default: every available core.
    pub cores: Option<usize>,
    /// Which CPUs to pin the executors to, in order. Default: the first `cores` CPUs core_affinity lists.
    pub cpus: Option<Vec<usize>>,
    /// Produce durability. Default always.
    pub fsync: FsyncPolicy,
    /// How syncs are issued: `thread` (a blocking thread of the core's pool calls fdatasync while the core keeps
    /// serving; default), `inline` (the core calls fdatasync itself) or `io_uring` (an io-wq worker syncs). See
    /// `storage::backend::SyncVia` for the measured trade-off.
    pub sync_via: crate::storage::backend::SyncVia,
    /// Largest message body accepted. Default 1 MiB.
    pub max_message_bytes: usize,
    /// Listen backlog of each core's socket. Default 1024.
    pub listen_backlog: u32,
    /// Open client connections across the whole server. Default 10000.
    pub max_connections: usize,
    /// Open client connections on one core. Default 4096.
    pub max_connections_per_core: usize,
    /// Bytes of request line plus headers. Default 16 KiB.
    pub max_header_bytes: usize,
    /// Number of request headers. Default 64.
    pub max_headers: usize,
    /// Time from a request's first byte to the end of its headers; slow clients are closed. Default 10 s.
    pub header_read_timeout_ms: u64,
    /// Time a keep-alive connection may sit idle between requests. Default 60 s.
    pub idle_timeout_ms: u64,
    /// Depth of each core-to-core channel; a full channel answers 503. Default 1024.
    pub mesh_channel_depth: usize,
    /// A segment file rolls once it would pass this size. Default 64 MiB, max 4 GiB - 1.
    pub segment_bytes: u64,
    /// Bytes of each partition's newest frames kept in memory, so a consumer keeping up with its producers reads
    /// them without a system call. Memory: at most this much per written partition. 0 to 16 MiB. Default 16 KiB.
    pub tail_cache_bytes: u32,
    /// With a journal (fsync `always` or `interval`): each partition's newest frames are written to its segment
    /// file in pieces of about this many bytes instead of batch by batch (the journal holds them meanwhile).
    /// Memory: at most this much per written partition. 0 writes every batch at once. 0 to 16 MiB. Default 16 KiB.
    pub write_behind_bytes: u32,
    /// A core's journal file is checkpointed (its segments synced) and replaced once it holds this many bytes.
    /// Bounds the replay at start. 64 MiB.
    pub journal_file_bytes: u64,
    /// fsync `always`: how long an append waits for others before it is written and synced, once appends are
    /// concurrent: the journal's next pass after a pass that carried more than one partition's entry (entries
    /// queued during its sync wait too), or else a partition's next batch when its previous batch gathered more
    /// than one append.
    /// A lone appender never waits.
    /// 0 to 10000 µs. Default 100.
    pub journal_commit_delay_us: u64,
    /// How often a moved frontier is made durable: recorded in the core's journal (fsync `always` or `interval`),
    /// or written to its consumer.offset file (fsync `never`). Default 50 ms.
    pub frontier_flush_interval_ms: u64,
    /// Background expiry sweep and retention cadence. Default 1000 ms.
    pub purge_interval_ms: u64,
    /// Longest in-flight wait at shutdown before connections are cut. Default 5000 ms.
    pub shutdown_grace_ms: u64,
    /// glommio: busy-spin this long before parking an idle core (burns CPU, cuts wake latency). Default 0.
    pub spin_before_park_us: u64,
    /// The executor threads' timer slack (`prctl(PR_SET_TIMERSLACK)`), ns: how late the kernel may fire their
    /// timed waits to batch wake-ups. 0 (default) leaves the kernel's (50 µs); at most 1 s.
    pub timer_slack_ns: u64,
    /// The CPUs each core's blocking threads (`sync_via = "thread"`'s fdatasync, file replacements) run on.
    /// Default: none, the core's own CPU.
    pub blocking_cpus: Option<Vec<usize>>,
    /// glommio: io_uring registered buffer memory per core. Default 10 MiB (glommio's default).
    pub io_memory_bytes: usize,
    /// glommio: io_uring ring depth per core. Default 128 (glommio's default).
    pub ring_depth: usize,
    /// glommio: preemption timer for task fairness. Default 100 ms (glommio's default).
    pub preempt_timer_ms: u64,
    /// A file holding the bearer token clients must send (`Authorization: Bearer TOKEN`); `/health` stays open.
    /// Default: none (no authentication; only allowed on a loopback address unless `insecure`).
    pub auth_token_file: Option<PathBuf>,
    /// Allow listening on a non-loopback address without authentication. Default false.
    pub insecure: bool,
    /// A PEM file with the certificate chain the client listener presents (the leaf first). With `tls_key_file`,
    /// the listener speaks HTTPS only (ALPN `http/1.1`). Default: none (plain HTTP).
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of `tls_cert_file` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: Option<PathBuf>,
    /// TLS listener: connections in their handshake at once on one core, beyond which the oldest is closed for a
    /// new one (a handshake holds up to 64 KiB of what its client sent, and a real client completes it at once).
    /// Default 128.
    pub max_tls_handshakes_per_core: usize,
    /// Most records (or receipt handles) in one batch request; more is `413 batch_too_large`. Default 1000.
    pub max_batch_records: usize,
    /// Largest batch request body; more is `413 batch_too_large`. Default 16 MiB.
    pub max_batch_bytes: usize,
    /// Most topics this node holds; more is `409 topic_limit`. Default 10000.
    pub max_topics: usize,
    /// Deduplication ids a partition's leader remembers (`dedup_id` on produce); past it the oldest are forgotten
    /// before the topic's `dedup_window` ends. Default 100000.
    pub max_dedup_ids: usize,
    /// Most partitions this node holds, over all topics; more is `409 partition_limit`. Also bounded at start by
    /// the file-descriptor limit (see `fit_fd_limit`). Default 100000.
    pub max_partitions: usize,
    /// Host names (besides loopback names and addresses) that requests may name in `Host` and `Origin` when no
    /// token is configured: guards against DNS rebinding from a browser. Default none.
    pub allowed_hosts: Vec<String>,
    /// The SQS face (`sqs/`): the account id in queue URLs and ARNs (12 digits). Default `000000000000`.
    pub sqs_account: String,
    /// The SQS face: the region in queue ARNs. Default: the request's SigV4 credential scope, else `us-east-1`.
    pub sqs_region: Option<String>,
    /// The SQS face: access key id -> secret. When any is set, SQS requests must carry a valid SigV4 signature by
    /// one of them (and need no bearer token); else any credentials are accepted on the terms of a request without
    /// a token. Default none.
    pub sqs_credentials: std::collections::BTreeMap<String, String>,
    /// Responses a connection may have queued but not yet written before berth stops reading its further
    /// pipelined requests until they drain. Default 1 MiB.
    pub max_pending_output_bytes: usize,
    /// A response write that makes no progress for this long closes the connection (a client that pipelines
    /// without reading). Default 30 s.
    pub write_timeout_ms: u64,
    /// Cluster mode (`--cluster`): etcd endpoints, this node's id and addresses. Default: none (one node).
    pub cluster: Option<ClusterSettings>,
    /// The token read from `auth_token_file` at start (not a config key).
    #[serde(skip)]
    pub auth_token: Option<String>,
    /// The cluster secret read from `cluster.peer_token_file` at start (not a config key).
    #[serde(skip)]
    pub peer_token: Option<String>,
    /// The client listener's TLS, loaded at start from `tls_cert_file` and `tls_key_file` (not a config key).
    #[serde(skip)]
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Node RPC's TLS, loaded at start from the cluster's `peer_tls_*` files (not a config key).
    #[serde(skip)]
    pub peer_tls: Option<crate::tls::PeerTls>,
    /// Partitions this node may hold: `max_partitions`, lowered to what the file-descriptor limit allows (set at
    /// start by `fit_fd_limit`; not a config key).
    #[serde(skip)]
    pub partition_budget: usize,
    /// The data directory's incarnation id, 32 hex digits (`storage::incarnation`; read or written at start, not a
    /// config key): published in the node's cluster record.
    #[serde(skip)]
    pub incarnation: String,
}

/// The longest cluster secret: it travels in the node RPC hello, which is read with a small fixed limit (4 KiB).
pub const MAX_PEER_TOKEN_BYTES: usize = 1024;

/// Descriptors kept aside for everything that is neither a client connection nor a partition: listeners, io_uring
/// rings, files being replaced, directories being synced, the signal thread. 256.
pub const FD_RESERVE: u64 = 256;
/// Descriptors one partition may hold open: its active segment and one sealed segment being read. 2.
pub const FDS_PER_PARTITION: u64 = 2;

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7070".parse().expect("static address"),
            data_dir: PathBuf::from("./berth-data"),
            cores: None,
            cpus: None,
            fsync: FsyncPolicy::Always,
            sync_via: crate::storage::backend::SyncVia::Thread,
            max_message_bytes: 1 << 20,
            listen_backlog: 1024,
            max_connections: 10_000,
            max_connections_per_core: 4096,
            max_header_bytes: 16 << 10,
            max_headers: 64,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            mesh_channel_depth: 1024,
            segment_bytes: 64 << 20,
            tail_cache_bytes: 16 << 10,
            write_behind_bytes: 16 << 10,
            journal_file_bytes: 64 << 20,
            journal_commit_delay_us: 100,
            frontier_flush_interval_ms: 50,
            purge_interval_ms: 1000,
            shutdown_grace_ms: 5000,
            spin_before_park_us: 0,
            timer_slack_ns: 0,
            blocking_cpus: None,
            io_memory_bytes: 10 << 20,
            ring_depth: 128,
            preempt_timer_ms: 100,
            auth_token_file: None,
            cluster: None,
            insecure: false,
            auth_token: None,
            peer_token: None,
            incarnation: String::new(),
            tls_cert_file: None,
            tls_key_file: None,
            max_tls_handshakes_per_core: 128,
            tls: None,
            peer_tls: None,
            max_batch_records: 1000,
            max_batch_bytes: 16 << 20,
            max_topics: 10_000,
            max_dedup_ids: 100_000,
            max_partitions: 100_000,
            allowed_hosts: Vec::new(),
            sqs_account: "000000000000".into(),
            sqs_region: None,
            sqs_credentials: Default::default(),
            max_pending_output_bytes: 1 << 20,
            write_timeout_ms: 30_000,
            partition_budget: 100_000,
        }
    }
}

impl Config {
    /// Reads a TOML file; unknown keys are an error so typos do not silently fall back to defaults.
    pub fn from_file(path: &std::path::Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    /// Reads the token file and refuses an unauthenticated non-loopback listener (unless `insecure`).
    pub fn resolve_auth(&mut self) -> Result<(), String> {
        if let Some(path) = &self.auth_token_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read auth token file {}: {e}", path.display()))?;
            let token = text.trim().to_string();
            if token.len() < 16 {
                return Err(format!(
                    "auth token in {} is shorter than 16 characters",
                    path.display()
                ));
            }
            self.auth_token = Some(token);
        }
        if self.auth_token.is_none() && !self.listen.ip().is_loopback() && !self.insecure {
            return Err(format!(
                "refusing to listen on {} without --auth-token-file (pass --insecure to allow it)",
                self.listen
            ));
        }
        if let Some(cluster) = &self.cluster {
            let peer = cluster.peer_addr(self.listen);
            if let Some(path) = &cluster.peer_token_file {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read peer token file {}: {e}", path.display()))?;
                let token = text.trim().to_string();
                if !(16..=MAX_PEER_TOKEN_BYTES).contains(&token.len()) {
                    return Err(format!(
                        "peer token in {} must be 16 to {MAX_PEER_TOKEN_BYTES} characters",
                        path.display()
                    ));
                }
                if self.auth_token.as_deref() == Some(token.as_str()) {
                    return Err(format!(
                        "peer token in {} is the client token: the cluster secret must be a separate one",
                        path.display()
                    ));
                }
                self.peer_token = Some(token);
            }
            if self.peer_token.is_none() && !peer.ip().is_loopback() && !self.insecure {
                return Err(format!(
                    "refusing node RPC on {peer} without --peer-token-file (pass --insecure to allow it)"
                ));
            }
            if cluster.etcd.is_empty() {
                return Err("--cluster needs at least one etcd URL".into());
            }
            if !(1..=3600).contains(&cluster.node_ttl_s) {
                return Err("node_ttl_s must be 1 to 3600 seconds".into());
            }
            if !(1..=3600).contains(&cluster.etcd_grace_s) {
                return Err("etcd_grace_s must be 1 to 3600 seconds".into());
            }
            if cluster.rpc_timeout_ms == 0 {
                return Err("rpc_timeout_ms must be positive".into());
            }
            if !(1..=600_000).contains(&cluster.replica_timeout_ms) {
                return Err("replica_timeout_ms must be 1 to 600000".into());
            }
            if !(100..=60_000).contains(&cluster.replica_lease_ms) {
                return Err("replica_lease_ms must be 100 to 60000".into());
            }
            if !((1 << 20)..=(4 << 30)).contains(&cluster.replica_window_bytes) {
                return Err("replica_window_bytes must be 1048576 to 4294967296".into());
            }
            if !(cluster.replica_window_bytes..=(16 << 30))
                .contains(&cluster.replica_core_window_bytes)
            {
                return Err(
                    "replica_core_window_bytes must be at least replica_window_bytes and at most 17179869184"
                        .into(),
                );
            }
            if !(1..=crate::storage::log::MAX_QUEUED_SHIPS as u64)
                .contains(&cluster.replica_max_in_flight)
            {
                return Err(format!(
                    "replica_max_in_flight must be 1 to {}",
                    crate::storage::log::MAX_QUEUED_SHIPS
                ));
            }
            if cluster.replica_gather_us > 100_000 {
                return Err("replica_gather_us must be 0 to 100000".into());
            }
        }
        self.resolve_tls()
    }

    /// Loads the client listener's and node RPC's TLS files (`tls_*`, `[cluster] peer_tls_*`): a file that cannot
    /// be read or is not what it should be stops the start with its path in the message.
    fn resolve_tls(&mut self) -> Result<(), String> {
        use crate::tls;
        self.tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(tls::server_config(cert, key, tls::ALPN_HTTP, None)?),
            (None, None) => None,
            _ => return Err("--tls-cert-file and --tls-key-file go together".into()),
        };
        self.peer_tls = None;
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let (cert, key) = match (&cluster.peer_tls_cert_file, &cluster.peer_tls_key_file) {
            (Some(cert), Some(key)) => (Some(cert), Some(key)),
            (None, None) => (self.tls_cert_file.as_ref(), self.tls_key_file.as_ref()),
            _ => return Err("--peer-tls-cert-file and --peer-tls-key-file go together".into()),
        };
        let Some(ca) = &cluster.peer_tls_ca_file else {
            if cluster.peer_tls_cert_file.is_some()
                || cluster.peer_tls_key_file.is_some()
                || cluster.peer_tls_client_auth
            {
                return Err("node RPC over TLS needs --peer-tls-ca-file (the CA that signs every node's certificate)".into());
            }
            return Ok(());
        };
        let (Some(cert), Some(key)) = (cert, key) else {
            return Err("node RPC over TLS needs this node's certificate and key: --peer-tls-cert-file and --peer-tls-key-file (or --tls-cert-file and --tls-key-file)".into());
        };
        let client_ca = cluster.peer_tls_client_auth.then_some(ca.as_path());
        // Presented whenever a peer asks, whether or not this node asks its peers: `peer_tls_client_auth` can then
        // be turned on one node at a time.
        let identity = Some((cert.as_path(), key.as_path()));
        self.peer_tls = Some(tls::PeerTls {
            accept: tls::server_config(cert, key, tls::ALPN_NODE_RPC, client_ca)?,
            connect: tls::client_config(ca, Some(tls::ALPN_NODE_RPC), identity)?,
        });
        Ok(())
    }

    /// Shares the file-descriptor limit between connections and partitions: partitions get what connections and
    /// `FD_RESERVE` leave, at least a quarter of the rest (`max_connections` is lowered, with a warning, to leave
    /// them that), at `FDS_PER_PARTITION` each.
    pub fn fit_fd_limit(&mut self, fd_limit: u64) {
        let available = fd_limit.saturating_sub(FD_RESERVE);
        let most_connections = available - available / 4;
        if self.max_connections as u64 > most_connections {
            tracing::warn!(
                fd_limit,
                configured = self.max_connections,
                lowered_to = most_connections,
                "max_connections lowered to fit the file-descriptor limit"
            );
            self.max_connections = most_connections as usize;
            self.max_connections_per_core = self.max_connections_per_core.min(self.max_connections);
        }
        let for_partitions = (available - self.max_connections as u64) / FDS_PER_PARTITION;
        self.partition_budget = self.max_partitions.min(for_partitions as usize);
        if self.partition_budget < self.max_partitions {
            tracing::info!(
                fd_limit,
                partitions = self.partition_budget,
                "the file-descriptor limit bounds the partitions this node can hold"
            );
        }
    }

    /// Checks the limits against each other and against what the formats can hold.
    pub fn validate(&self) -> Result<(), String> {
        if self.sqs_account.len() != 12 || !self.sqs_account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "sqs_account must be 12 digits, not '{}'",
                self.sqs_account
            ));
        }
        if let Some(region) = &self.sqs_region {
            if region.is_empty()
                || region.len() > 32
                || !region
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                return Err(format!(
                    "sqs_region must be a region name such as us-east-1, not '{region}'"
                ));
            }
        }
        let positive = [
            ("max_message_bytes", self.max_message_bytes as u64),
            ("max_connections", self.max_connections as u64),
            (
                "max_connections_per_core",
                self.max_connections_per_core as u64,
            ),
            ("max_header_bytes", self.max_header_bytes as u64),
            ("max_headers", self.max_headers as u64),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("mesh_channel_depth", self.mesh_channel_depth as u64),
            (
                "frontier_flush_interval_ms",
                self.frontier_flush_interval_ms,
            ),
            ("purge_interval_ms", self.purge_interval_ms),
            ("ring_depth", self.ring_depth as u64),
            ("preempt_timer_ms", self.preempt_timer_ms),
            ("max_topics", self.max_topics as u64),
            ("max_dedup_ids", self.max_dedup_ids as u64),
            ("max_batch_records", self.max_batch_records as u64),
            ("max_batch_bytes", self.max_batch_bytes as u64),
            ("max_partitions", self.max_partitions as u64),
            (
                "max_pending_output_bytes",
                self.max_pending_output_bytes as u64,
            ),
            ("write_timeout_ms", self.write_timeout_ms),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("{name} must be greater than 0"));
            }
        }
        if self.max_message_bytes > (256 << 20) {
            return Err("max_message_bytes must be at most 256 MiB".into());
        }
        if self.max_header_bytes > (1 << 20) {
            // A request head is held whole while it arrives, and positions in it are 32-bit (the query's pairs).
            return Err("max_header_bytes must be at most 1 MiB".into());
        }
        if self.max_batch_bytes > (1 << 30) {
            return Err("max_batch_bytes must be at most 1 GiB".into());
        }
        if self.max_batch_records > 1_000_000 {
            return Err("max_batch_records must be at most 1000000".into());
        }
        if self.mesh_channel_depth < 2 {
            return Err("mesh_channel_depth must be at least 2 (glommio #555)".into());
        }
        let frame_max = crate::storage::frame::encoded_len(
            self.max_message_bytes + crate::storage::meta::MAX_OVERHEAD,
        ) as u64;
        if self.segment_bytes < frame_max || self.segment_bytes >= u32::MAX as u64 {
            return Err(format!(
                "segment_bytes must hold one largest frame ({frame_max}) and stay below 4 GiB"
            ));
        }
        if self.journal_file_bytes < (1 << 20) || self.journal_file_bytes > (1 << 34) {
            return Err("journal_file_bytes must be 1 MiB to 16 GiB".into());
        }
        if self.tail_cache_bytes > 16 << 20 {
            return Err("tail_cache_bytes must be 0 to 16777216".into());
        }
        if self.fsync == crate::storage::FsyncPolicy::Never
            && self.cluster.as_ref().is_some_and(|c| c.replication_preview)
        {
            // Replicas are written through the core's journal, which `fsync never` does not run.
            return Err(
                "--replication-preview needs --fsync always or interval:MS, not never".into(),
            );
        }
        if self.write_behind_bytes > 16 << 20 {
            return Err("write_behind_bytes must be 0 to 16777216".into());
        }
        if self.timer_slack_ns > 1_000_000_000 {
            return Err("timer_slack_ns must be 0 to 1000000000".into());
        }
        if self.blocking_cpus.as_ref().is_some_and(|c| c.is_empty()) {
            return Err("blocking_cpus must name at least one CPU".into());
        }
        if self.journal_commit_delay_us > 10_000 {
            return Err("journal_commit_delay_us must be 0 to 10000".into());
        }
        if self.cores == Some(0) {
            return Err("cores must be at least 1".into());
        }
        if self.max_tls_handshakes_per_core == 0 {
            return Err("max_tls_handshakes_per_core must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// `berth.example.toml` parses to the built-in defaults and names every setting (commented out or not), the
    /// `[cluster]` table's too.
    #[test]
    fn the_example_config_is_the_defaults_and_names_every_setting() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("berth.example.toml");
        let parsed = super::Config::from_file(&path).expect("the example parses");
        assert_eq!(
            serde_json::to_value(&parsed).unwrap(),
            serde_json::to_value(super::Config::default()).unwrap()
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let named = |key: &str| {
            text.lines().any(|l| {
                let l = l.trim_start_matches('#').trim_start();
                l.starts_with(&format!("{key} =")) || l.starts_with(&format!("{key}="))
            })
        };
        let defaults = serde_json::to_value(super::Config::default()).unwrap();
        for key in defaults.as_object().unwrap().keys() {
            // `cluster` is the `[cluster]` table, checked below; `sqs_credentials` a table of keys.
            assert!(
                key == "cluster" || named(key) || text.contains(&format!("# [{key}]")),
                "berth.example.toml does not name `{key}`"
            );
        }
        // The cluster table, uncommented with its required keys, parses; every key of it is named.
        let cluster: String = text
            .lines()
            .skip_while(|l| !l.starts_with("# [cluster]"))
            .map(|l| l.trim_start_matches("# "))
            .collect::<Vec<_>>()
            .join("\n");
        let with_cluster: super::Config =
            toml::from_str(&cluster).expect("the cluster table parses");
        let c = serde_json::to_value(with_cluster.cluster.expect("a cluster table")).unwrap();
        for key in c.as_object().unwrap().keys() {
            assert!(
                named(key),
                "berth.example.toml does not name cluster `{key}`"
            );
        }
    }

    use super::*;

    fn clustered(
        peer: &str,
        peer_token: Option<&str>,
        auth_token: Option<&str>,
    ) -> (Config, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        if let Some(t) = auth_token {
            let f = dir.path().join("token");
            std::fs::write(&f, format!("{t}\n")).unwrap();
            config.auth_token_file = Some(f);
        }
        let peer_token_file = peer_token.map(|t| {
            let f = dir.path().join("peer-token");
            std::fs::write(&f, format!("{t}\n")).unwrap();
            f
        });
        config.cluster = Some(ClusterSettings {
            etcd: vec!["http://127.0.0.1:2379".into()],
            node_id: "n1".into(),
            advertise: "127.0.0.1:7070".into(),
            peer_listen: Some(peer.parse().unwrap()),
            name: "default".into(),
            node_ttl_s: 5,
            rpc_timeout_ms: 2000,
            etcd_grace_s: 15,
            peer_token_file,
            peer_tls_ca_file: None,
            peer_tls_cert_file: None,
            peer_tls_key_file: None,
            peer_tls_client_auth: false,
            replication_preview: false,
            replica_timeout_ms: 2000,
            replica_window_bytes: 64 << 20,
            replica_core_window_bytes: 256 << 20,
            replica_max_in_flight: 8,
            replica_gather_us: DEFAULT_GATHER_US,
            replica_ship_early: DEFAULT_SHIP_EARLY,
            replica_lease_ms: 1000,
        });
        (config, dir)
    }

    #[test]
    fn the_timer_slack_and_blocking_cpus_are_checked_at_start() {
        let check = |f: &dyn Fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            c.validate()
        };
        assert!(check(&|c| c.timer_slack_ns = 1_000_000_000).is_ok());
        assert!(check(&|c| c.timer_slack_ns = 1_000_000_001)
            .unwrap_err()
            .contains("timer_slack_ns"));
        assert!(check(&|c| c.blocking_cpus = Some(vec![0])).is_ok());
        assert!(check(&|c| c.blocking_cpus = Some(vec![]))
            .unwrap_err()
            .contains("blocking_cpus"));
        assert!(check(&|c| c.max_header_bytes = 1 << 20).is_ok());
        assert!(check(&|c| c.max_header_bytes = (1 << 20) + 1)
            .unwrap_err()
            .contains("max_header_bytes"));
    }

    #[test]
    fn the_replication_bounds_are_checked_at_start() {
        let set = |f: &dyn Fn(&mut ClusterSettings)| {
            let (mut c, _d) = clustered("127.0.0.1:7170", None, None);
            f(c.cluster.as_mut().unwrap());
            c.resolve_auth()
        };
        assert!(set(&|_| {}).is_ok());
        assert!(set(&|c| c.replica_timeout_ms = 0)
            .unwrap_err()
            .contains("replica_timeout_ms"));
        assert!(set(&|c| c.replica_window_bytes = 1000)
            .unwrap_err()
            .contains("replica_window_bytes"));
        // The core's window holds at least one partition's.
        assert!(set(&|c| c.replica_core_window_bytes = 32 << 20)
            .unwrap_err()
            .contains("replica_core_window_bytes"));
        assert!(set(&|c| c.replica_max_in_flight = 0).is_err());
        // No more in flight than a follower queues: it would refuse the rest.
        assert!(set(&|c| c.replica_max_in_flight = 17)
            .unwrap_err()
            .contains("1 to 16"));
        assert!(set(&|c| c.replica_max_in_flight = 16).is_ok());
        assert!(set(&|c| c.replica_gather_us = 100_001)
            .unwrap_err()
            .contains("replica_gather_us"));
        assert!(set(&|c| c.replica_gather_us = 0).is_ok());
    }

    /// A `[cluster]` table that names only its required keys takes the documented defaults of the replication
    /// knobs (serde's, which the CLI's own table repeats).
    #[test]
    fn a_cluster_table_without_the_replication_knobs_takes_their_defaults() {
        let c: Config = toml::from_str("[cluster]\netcd = []\nnode_id = \"\"\nadvertise = \"\"\n")
            .expect("parses");
        let cluster = c.cluster.expect("a cluster table");
        assert_eq!(cluster.replica_gather_us, DEFAULT_GATHER_US);
        assert_eq!(DEFAULT_GATHER_US, 1000);
        assert!(cluster.replica_ship_early);
        assert_eq!(cluster.replica_max_in_flight, 8);
    }

    #[test]
    fn the_cluster_secret_is_its_own_and_guards_a_non_loopback_node_rpc() {
        const SECRET: &str = "peer-secret-0123456789";
        // Loopback node RPC may run without a secret (accepting any hello); any other address needs one.
        let (mut c, _d) = clustered("127.0.0.1:7170", None, None);
        c.resolve_auth().unwrap();
        assert_eq!(c.peer_token, None);
        let (mut c, _d) = clustered("10.1.2.3:7170", None, Some("client-token-0123456789"));
        let e = c.resolve_auth().unwrap_err();
        assert!(e.contains("--peer-token-file"), "{e}");
        let (mut c, _d) = clustered("10.1.2.3:7170", None, None);
        c.insecure = true;
        c.resolve_auth().unwrap();
        // The client token never doubles as the secret, and the secret is neither short nor too long for a hello.
        let (mut c, _d) = clustered("10.1.2.3:7170", Some(SECRET), Some(SECRET));
        assert!(c.resolve_auth().unwrap_err().contains("separate"));
        let (mut c, _d) = clustered("10.1.2.3:7170", Some("short"), None);
        assert!(c.resolve_auth().is_err());
        let long = "x".repeat(MAX_PEER_TOKEN_BYTES + 1);
        let (mut c, _d) = clustered("10.1.2.3:7170", Some(&long), None);
        assert!(c.resolve_auth().is_err());
        let (mut c, _d) = clustered(
            "10.1.2.3:7170",
            Some(SECRET),
            Some("client-token-0123456789"),
        );
        c.resolve_auth().unwrap();
        assert_eq!(c.peer_token.as_deref(), Some(SECRET));
        assert_eq!(c.auth_token.as_deref(), Some("client-token-0123456789"));
    }

    #[test]
    fn tls_files_are_loaded_at_start_and_node_rpc_tls_needs_its_ca_and_an_identity() {
        let (mut c, d) = clustered("127.0.0.1:7170", None, None);
        let (ca, cert, key) = crate::tls::tests::write_test_pki(d.path());
        c.resolve_auth().unwrap();
        assert!(c.tls.is_none() && c.peer_tls.is_none());
        // One of the pair alone is a mistake, not plain text.
        c.tls_cert_file = Some(cert.clone());
        assert!(c.resolve_auth().unwrap_err().contains("go together"));
        c.tls_key_file = Some(key.clone());
        c.resolve_auth().unwrap();
        assert!(c.tls.is_some() && c.peer_tls.is_none());
        // A peer setting without the CA is refused rather than ignored.
        c.cluster.as_mut().unwrap().peer_tls_client_auth = true;
        assert!(c.resolve_auth().unwrap_err().contains("--peer-tls-ca-file"));
        // The CA with the listener's pair: node RPC uses that pair.
        c.cluster.as_mut().unwrap().peer_tls_ca_file = Some(ca.clone());
        c.resolve_auth().unwrap();
        assert!(c.peer_tls.is_some());
        // The CA without any pair: nothing to present.
        c.tls_cert_file = None;
        c.tls_key_file = None;
        assert!(c
            .resolve_auth()
            .unwrap_err()
            .contains("--peer-tls-cert-file"));
        c.cluster.as_mut().unwrap().peer_tls_cert_file = Some(cert);
        assert!(c.resolve_auth().unwrap_err().contains("go together"));
        c.cluster.as_mut().unwrap().peer_tls_key_file = Some(key);
        c.resolve_auth().unwrap();
        assert!(c.tls.is_none() && c.peer_tls.is_some());
        // A file that is not PEM is named.
        c.cluster.as_mut().unwrap().peer_tls_ca_file = Some(d.path().join("token-or-nothing"));
        assert!(c.resolve_auth().unwrap_err().contains("token-or-nothing"));
    }
}
