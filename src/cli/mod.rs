//! The command line: `berth serve` runs the broker; the other commands are a client for people at a terminal (the
//! load generator is its own binary, `berth-bench`, in `bench/`). Part of the binary only: the server library links none of it.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use berth::client::{enc, Answer, Client};
use berth::config::{Config, FsyncPolicy};
use clap::{Args, Parser, Subcommand};
use std::io::{Read, Write};
use std::path::PathBuf;

/// Where client commands go by default (the serve default).
const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

#[derive(Parser, Debug)]
#[command(
    name = "berth",
    version,
    about = "A thread-per-core message-queue broker with leases"
)]
struct Cli {
    /// The server: a URL, or HOST:PORT for http [default: 127.0.0.1:7070].
    #[arg(
        long,
        global = true,
        env = "BERTH_SERVER",
        hide_env_values = true,
        help_heading = "Connection"
    )]
    server: Option<String>,
    /// The bearer token the server requires (one started with --auth-token-file).
    #[arg(
        long,
        global = true,
        env = "BERTH_AUTH_TOKEN",
        hide_env_values = true,
        help_heading = "Connection"
    )]
    auth_token: Option<String>,
    /// HTTPS: trust only the CA certificate(s) in this PEM file (as curl's --cacert), e.g. for a server started with
    /// --tls-cert-file. Without it, an https:// server's certificate is checked against the public CAs.
    #[arg(
        long,
        global = true,
        env = "BERTH_CACERT",
        hide_env_values = true,
        help_heading = "Connection"
    )]
    cacert: Option<PathBuf>,
    /// Output: `json` (one JSON value or line per result, for scripts) or `table` (aligned columns, for people).
    #[arg(long, global = true, value_enum, default_value = "json")]
    format: Format,
    #[command(subcommand)]
    command: Command,
}

/// How results are printed (`--format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Table,
}

/// The `--format` of this run (set once in `main`).
static FORMAT: std::sync::OnceLock<Format> = std::sync::OnceLock::new();

fn table_format() -> bool {
    FORMAT.get() == Some(&Format::Table)
}

/// A scalar JSON value as a table cell.
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Rows of objects as aligned columns, headed by the column names in capitals; `columns` picks and orders them
/// (empty: every key of the first row).
fn print_table(rows: &[serde_json::Value], columns: &[&str]) {
    let columns: Vec<String> = if columns.is_empty() {
        rows.first()
            .and_then(|r| r.as_object())
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    } else {
        columns.iter().map(|c| c.to_string()).collect()
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| cell(&r[c.as_str()])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = std::io::stdout().lock();
    let line = |cols: &[String]| {
        cols.iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let head: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
    let _ = writeln!(out, "{}", line(&head));
    for r in &cells {
        let _ = writeln!(out, "{}", line(r));
    }
}

/// Prints a result in the chosen format: as JSON, or as a table (a list of objects as rows; an object's scalar
/// fields as `key: value` lines, then any list of objects in it as a table).
fn print_result(value: &serde_json::Value, columns: &[&str]) {
    if !table_format() {
        let _ = writeln!(std::io::stdout().lock(), "{value}");
        return;
    }
    match value {
        serde_json::Value::Array(rows) if rows.iter().all(|r| r.is_object()) => {
            print_table(rows, columns)
        }
        serde_json::Value::Array(items) => {
            let mut out = std::io::stdout().lock();
            for item in items {
                let _ = writeln!(out, "{}", cell(item));
            }
        }
        serde_json::Value::Object(o) => {
            let mut tables = Vec::new();
            {
                let mut out = std::io::stdout().lock();
                for (k, v) in o {
                    match v {
                        serde_json::Value::Array(rows)
                            if !rows.is_empty() && rows.iter().all(|r| r.is_object()) =>
                        {
                            tables.push(rows)
                        }
                        serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
                            let _ = writeln!(out, "{k}: {v}");
                        }
                        _ => {
                            let _ = writeln!(out, "{k}: {}", cell(v));
                        }
                    }
                }
            }
            for rows in tables {
                print_table(rows, columns);
            }
        }
        other => {
            let _ = writeln!(std::io::stdout().lock(), "{}", cell(other));
        }
    }
}

/// One delivered message: a JSON line, or a table row (the header before the first).
fn print_message(line: &serde_json::Value) {
    if !table_format() {
        let _ = writeln!(std::io::stdout().lock(), "{line}");
        return;
    }
    static HEADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let mut out = std::io::stdout().lock();
    if !HEADED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let _ = writeln!(
            out,
            "{:<9}  {:<10}  {:<10}  {:<28}  BODY",
            "PARTITION", "OFFSET", "DELIVERIES", "RECEIPT_HANDLE"
        );
    }
    let body = match line.get("body") {
        Some(b) => cell(b),
        None => format!("base64:{}", cell(&line["body_base64"])),
    };
    let _ = writeln!(
        out,
        "{:<9}  {:<10}  {:<10}  {:<28}  {body}",
        cell(&line["partition"]),
        cell(&line["offset"]),
        cell(&line["delivery_count"]),
        cell(&line["receipt_handle"]),
    );
}

// Parsed once at start: the size of its largest variant (serve's settings) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the broker.
    Serve(ServeArgs),
    /// Create, update, list, describe or delete topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Cluster mode: the nodes, their liveness and how many partitions each owns.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// List, create, describe or delete a topic's consumer groups.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Move messages from one topic (a dead-letter topic, say) to another: each is appended to the target before
    /// it is acked in the source. Prints the server's reply, e.g. {"moved":3}.
    Redrive {
        /// The topic to read (consumed in --group).
        topic: String,
        /// The topic to append to.
        #[arg(long)]
        to: String,
        /// Move at most this many [default: all available now].
        #[arg(long)]
        max: Option<u64>,
        /// The consumer group that reads the source [default: default].
        #[arg(long)]
        group: Option<String>,
    },
    /// Produce the argument as one message; without it, every line of stdin as a message (or, with --frames,
    /// every frame: a 4-byte little-endian length, then the bytes), sent in batches. Prints one JSON line per
    /// message.
    Produce {
        /// The topic to append to.
        topic: String,
        /// The message (its bytes as given); without it, stdin is read.
        message: Option<String>,
        /// Messages with the same key go to the same partition (crc32c(key) % partitions).
        #[arg(long)]
        key: Option<String>,
        /// The partition to append to [default: by --key, else round-robin].
        #[arg(long)]
        partition: Option<u64>,
        /// Read stdin as frames (binary-safe) instead of lines.
        #[arg(long)]
        frames: bool,
        /// Messages per request when reading stdin.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Deliverable only after this long, e.g. 30s (0 to 15m).
        #[arg(long)]
        delay: Option<String>,
        /// Deduplication id of the message (with MESSAGE only): a repeat within the topic's dedup_window is
        /// answered with the first one's partition and offset and not appended.
        #[arg(long)]
        dedup_id: Option<String>,
        /// Message attributes for every message, as JSON:
        /// '{"color":{"type":"String","value":"red"}}' (docs/api.md, "Attributes and delay").
        #[arg(long)]
        attributes: Option<String>,
        /// The message group of every message (a FIFO topic's required group_key): delivered in order, one at a
        /// time per group.
        #[arg(long)]
        group_key: Option<String>,
    },
    /// Lease messages (queue style), or replay one with --partition and --offset.
    Consume {
        /// The topic to consume from.
        topic: String,
        /// Long-poll budget, e.g. 10s [default: the topic's receive_wait, 0 unless set; 20s with --follow].
        #[arg(long)]
        wait: Option<String>,
        /// Lease length, e.g. 30s (default: the topic's).
        #[arg(long)]
        visibility: Option<String>,
        /// Messages to take before stopping, over as many requests as needed (stops early when none is
        /// available) [default: --max, one request].
        #[arg(long)]
        count: Option<u64>,
        /// Messages per request (a batch consume; acks and nacks are sent as one batch too).
        #[arg(long, default_value_t = 1)]
        max: u64,
        /// Ack each message once printed.
        #[arg(long, conflicts_with = "nack")]
        ack: bool,
        /// Nack each message once printed (it becomes deliverable again at once).
        #[arg(long)]
        nack: bool,
        /// Keep consuming, as `nats sub` or `rpk topic consume` do: long-poll (--wait, 20s unless given), print,
        /// ack, repeat until interrupted or --count messages. With --partition/--offset: follow the partition's end.
        #[arg(long)]
        follow: bool,
        /// With --follow: leave each lease to expire (or to a later ack) instead of acking it.
        #[arg(long, requires = "follow", conflicts_with_all = ["ack", "nack"])]
        no_ack: bool,
        /// Consumer group to lease in (and to ack or nack in) [default: default].
        #[arg(long, conflicts_with = "partition")]
        group: Option<String>,
        /// Replay: read this partition from --offset without leasing (--count records, default 1).
        #[arg(long, requires = "offset")]
        partition: Option<u64>,
        /// Replay: the first offset to read (with --partition).
        #[arg(long, requires = "partition")]
        offset: Option<u64>,
    },
    /// Ack a lease.
    Ack {
        /// The topic of the lease.
        topic: String,
        /// The lease's receipt handle (PARTITION:OFFSET:NONCE, as consume printed it).
        receipt_handle: String,
        /// The consumer group that leased it [default: default].
        #[arg(long)]
        group: Option<String>,
    },
    /// Nack a lease: the message is deliverable again at once, or after --delay.
    Nack {
        /// The topic of the lease.
        topic: String,
        /// The lease's receipt handle (PARTITION:OFFSET:NONCE, as consume printed it).
        receipt_handle: String,
        /// The consumer group that leased it [default: default].
        #[arg(long)]
        group: Option<String>,
        /// Deliverable again only after this long, e.g. 30s (0 to 12h) [default: 0].
        #[arg(long)]
        delay: Option<String>,
    },
    /// Extend a lease to now + visibility.
    Extend {
        /// The topic of the lease.
        topic: String,
        /// The lease's receipt handle (PARTITION:OFFSET:NONCE, as consume printed it).
        receipt_handle: String,
        /// The lease ends this long from now, e.g. 1m [default: the lease's own length].
        #[arg(long)]
        visibility: Option<String>,
        /// The consumer group that leased it [default: default].
        #[arg(long)]
        group: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Prints `GET /cluster`: every node (dead ones too), alive or not, and its partition count.
    Status,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to listen on [default 127.0.0.1:7070].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Data directory [default ./berth-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Number of cores (executors) [default: all available].
    #[arg(long)]
    cores: Option<usize>,
    /// CPUs to pin to, comma separated, e.g. 0,1.
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// always | interval:MS | never [default always].
    #[arg(long)]
    fsync: Option<FsyncPolicy>,
    /// A TOML file with any of the settings in docs/configuration.md (every one: berth.example.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Require `Authorization: Bearer TOKEN` with the token in this file (`/health` stays open).
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// Allow a non-loopback --listen address without --auth-token-file.
    #[arg(long)]
    insecure: bool,
    /// Cluster mode: etcd client URLs, comma separated (http://host:port).
    #[arg(long, value_delimiter = ',')]
    cluster: Option<Vec<String>>,
    /// Cluster mode: this node's id, unique in the cluster.
    #[arg(long)]
    node_id: Option<String>,
    /// Cluster mode: this node's HTTP address as others reach it [default: --listen].
    #[arg(long)]
    advertise: Option<String>,
    /// Cluster mode: node RPC listen address [default: --listen's host, port + 100].
    #[arg(long)]
    peer_listen: Option<std::net::SocketAddr>,
    /// Cluster mode: etcd key prefix /berth/NAME/ [default: default].
    #[arg(long)]
    cluster_name: Option<String>,
    /// Cluster mode: seconds a node that stops renewing its etcd lease stays alive [default 5].
    #[arg(long)]
    node_ttl: Option<u64>,
    /// Cluster mode: seconds a node keeps serving while etcd cannot be reached [default 15, at least --node-ttl].
    #[arg(long)]
    etcd_grace: Option<u64>,
    /// Cluster mode: the cluster secret nodes present to each other's node RPC (a file; not the client token).
    #[arg(long)]
    peer_token_file: Option<PathBuf>,
    /// Cluster mode: allow topics with replicas > 1 (replication is unfinished: no failover, produces answered at
    /// the leader's durability; docs/replication.md).
    #[arg(long)]
    replication_preview: bool,
    /// Cluster mode: milliseconds a produce to a replicated partition waits for a majority of its replicas before
    /// it is answered 503 not_enough_replicas [default 2000].
    #[arg(long)]
    replica_timeout_ms: Option<u64>,
    /// Cluster mode: milliseconds a replicated partition's leader hands out leases after a majority of its replicas
    /// last answered it; a new leader waits this long and an eighth before it hands out any [default 1000].
    #[arg(long)]
    replica_lease_ms: Option<u64>,
    /// HTTPS: the certificate chain (PEM) the listener presents; with --tls-key-file it speaks HTTPS only.
    #[arg(long)]
    tls_cert_file: Option<PathBuf>,
    /// HTTPS: the private key (PEM) of --tls-cert-file.
    #[arg(long)]
    tls_key_file: Option<PathBuf>,
    /// Cluster mode: node RPC over TLS, checking every peer's certificate against this CA (PEM).
    #[arg(long)]
    peer_tls_ca_file: Option<PathBuf>,
    /// Cluster mode: this node's node RPC certificate (PEM) [default: --tls-cert-file].
    #[arg(long)]
    peer_tls_cert_file: Option<PathBuf>,
    /// Cluster mode: the key (PEM) of --peer-tls-cert-file [default: --tls-key-file].
    #[arg(long)]
    peer_tls_key_file: Option<PathBuf>,
    /// Cluster mode: accept node RPC only from peers presenting a certificate signed by --peer-tls-ca-file.
    #[arg(long)]
    peer_tls_client_auth: bool,
    /// The SQS face: the account id in queue URLs and ARNs [default 000000000000].
    #[arg(long)]
    sqs_account: Option<String>,
    /// The SQS face: the region in ARNs [default: the request's credential scope, else us-east-1].
    #[arg(long)]
    sqs_region: Option<String>,
}

/// A topic's settings (everything but `partitions`), as `PUT` and `PATCH /topics/T` take them. Unset ones are not
/// sent: the server's default on create, unchanged on update.
#[derive(Args, Debug, Default)]
struct TopicSettings {
    /// Default lease length, e.g. 30s (1s to 12h).
    #[arg(long)]
    visibility: Option<String>,
    /// Leases (and delayed nacks) at once per partition and group.
    #[arg(long)]
    max_in_flight: Option<u64>,
    /// Acks above the committed frontier per partition and group.
    #[arg(long)]
    max_acked_ahead: Option<u64>,
    /// How long records are kept, e.g. 7d.
    #[arg(long)]
    retention: Option<String>,
    /// Consumer groups the topic may hold.
    #[arg(long)]
    max_groups: Option<u64>,
    /// Wait before a message released by an expiry or a nack without delay is deliverable again, e.g. 1s.
    #[arg(long)]
    redelivery_delay: Option<String>,
    /// fixed | exponential (redelivery_delay * 2^(delivery_count - 1)).
    #[arg(long, value_parser = ["fixed", "exponential"])]
    redelivery_backoff: Option<String>,
    /// Cap of the exponential redelivery delay, e.g. 15m.
    #[arg(long)]
    redelivery_delay_max: Option<String>,
    /// Deliveries before a message goes to --dead-letter (0: unlimited).
    #[arg(long)]
    max_deliveries: Option<u64>,
    /// The dead-letter topic (an existing topic other than this one); "" clears it.
    #[arg(long)]
    dead_letter: Option<String>,
    /// A produce repeating a dedup_id taken within this long is not appended, e.g. 5m (0: off).
    #[arg(long)]
    dedup_window: Option<String>,
    /// FIFO topics: a message without a dedup id is deduplicated by the SHA-256 of its body (true or false).
    #[arg(long, value_parser = ["true", "false"])]
    content_dedup: Option<String>,
    /// Delay of a produced message that gives none of its own, e.g. 30s (0 to 15m).
    #[arg(long)]
    delay: Option<String>,
    /// How long a consume that gives no --wait waits for a message, e.g. 20s (0 to 20s).
    #[arg(long)]
    receive_wait: Option<String>,
    /// The largest message (body and attributes) the topic takes; 0: the server's max_message_bytes.
    #[arg(long)]
    max_message_bytes: Option<u64>,
}

impl TopicSettings {
    /// The given settings as `&key=value` query parameters.
    fn query(&self) -> String {
        let number = |v: Option<u64>| v.map(|n| n.to_string());
        let mut out = String::new();
        for (key, value) in [
            ("visibility", self.visibility.clone()),
            ("max_in_flight", number(self.max_in_flight)),
            ("max_acked_ahead", number(self.max_acked_ahead)),
            ("retention", self.retention.clone()),
            ("max_groups", number(self.max_groups)),
            ("redelivery_delay", self.redelivery_delay.clone()),
            ("redelivery_backoff", self.redelivery_backoff.clone()),
            ("redelivery_delay_max", self.redelivery_delay_max.clone()),
            ("max_deliveries", number(self.max_deliveries)),
            ("dead_letter", self.dead_letter.clone()),
            ("dedup_window", self.dedup_window.clone()),
            ("content_dedup", self.content_dedup.clone()),
            ("delay", self.delay.clone()),
            ("receive_wait", self.receive_wait.clone()),
            ("max_message_bytes", number(self.max_message_bytes)),
        ] {
            if let Some(v) = value {
                out += &format!("&{key}={}", enc(&v));
            }
        }
        out
    }
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic (200 when it already exists with the same partition count).
    Create {
        /// The topic's name ([A-Za-z0-9._-], 1 to 128 characters).
        name: String,
        /// Partitions (1 to 4096), fixed at creation.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Nodes holding each partition (a cluster; 1 on a single node).
        #[arg(long)]
        replicas: Option<u32>,
        /// A FIFO topic: every message names its message group (--group-key), delivered in order, one at a time
        /// per group. Fixed at creation.
        #[arg(long)]
        fifo: bool,
        #[command(flatten)]
        settings: TopicSettings,
    },
    /// Change a topic's settings (every one but partitions); prints the new config.
    Update {
        /// The topic to change.
        name: String,
        #[command(flatten)]
        settings: TopicSettings,
    },
    /// List topic names.
    List,
    /// Show a topic's settings and partitions.
    Describe {
        /// The topic.
        name: String,
    },
    /// Delete a topic and its data.
    Delete {
        /// The topic.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum GroupCommand {
    /// List a topic's consumer groups with their state per partition.
    List {
        /// The topic.
        topic: String,
    },
    /// Create a consumer group (a consume naming a new group creates it too, at earliest).
    Create {
        /// The topic.
        topic: String,
        /// The group's name ([A-Za-z0-9._-]).
        group: String,
        /// Where the group starts: the oldest retained record, or the end of each partition.
        #[arg(long, value_parser = ["earliest", "latest"])]
        start: Option<String>,
    },
    /// Show one consumer group's state per partition: end offset, frontier, lag, leases.
    Describe {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
    },
    /// Delete a consumer group and its consumer state.
    Delete {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
    },
    /// Settle everything the group has not settled, at once (leased, delayed and waiting messages alike). Prints
    /// the server's reply, e.g. {"group":"default","purged":12,"topic":"jobs"}.
    Purge {
        /// The topic.
        topic: String,
        /// The group.
        #[arg(default_value = "default")]
        group: String,
    },
}

/// Runs the command line; returns the exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let _ = FORMAT.set(cli.format);
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        other => {
            let client = Client::new(&server_url(cli.server.as_deref().unwrap_or(DEFAULT_SERVER)))
                .with_token(cli.auth_token);
            match cli.cacert {
                Some(ca) => client
                    .with_ca_file(&ca)
                    .and_then(|client| client_command(&client, other)),
                None => client_command(&client, other),
            }
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("berth: {e}");
            1
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log redirected to a file (or read by a test) stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

fn serve(args: ServeArgs) -> Result<i32, String> {
    init_logging();
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(v) = args.listen {
        config.listen = v;
    }
    if let Some(v) = args.data_dir {
        config.data_dir = v;
    }
    if let Some(v) = args.cores {
        config.cores = Some(v);
    }
    if let Some(v) = args.cpus {
        config.cpus = Some(v);
    }
    if let Some(v) = args.fsync {
        config.fsync = v;
    }
    if let Some(v) = args.auth_token_file {
        config.auth_token_file = Some(v);
    }
    if args.insecure {
        config.insecure = true;
    }
    if let Some(v) = args.tls_cert_file {
        config.tls_cert_file = Some(v);
    }
    if let Some(v) = args.tls_key_file {
        config.tls_key_file = Some(v);
    }
    if let Some(v) = args.sqs_account {
        config.sqs_account = v;
    }
    if let Some(v) = args.sqs_region {
        config.sqs_region = Some(v);
    }
    if let Some(etcd) = args.cluster {
        let node_id = args
            .node_id
            .ok_or("--cluster needs --node-id (this node's id, unique in the cluster)")?;
        let mut cluster = config
            .cluster
            .take()
            .unwrap_or(berth::config::ClusterSettings {
                etcd: Vec::new(),
                node_id: String::new(),
                advertise: String::new(),
                peer_listen: None,
                name: "default".into(),
                node_ttl_s: 5,
                rpc_timeout_ms: 2000,
                etcd_grace_s: 15,
                peer_token_file: None,
                peer_tls_ca_file: None,
                peer_tls_cert_file: None,
                peer_tls_key_file: None,
                peer_tls_client_auth: false,
                replication_preview: false,
                replica_timeout_ms: 2000,
                replica_window_bytes: 64 << 20,
                replica_core_window_bytes: 256 << 20,
                replica_max_in_flight: 8,
                replica_gather_us: berth::config::DEFAULT_GATHER_US,
                replica_ship_early: berth::config::DEFAULT_SHIP_EARLY,
                replica_lease_ms: berth::partition::lease::DEFAULT_LEASE_MS,
            });
        cluster.etcd = etcd;
        cluster.node_id = node_id;
        cluster.advertise = args.advertise.unwrap_or_else(|| config.listen.to_string());
        if let Some(v) = args.peer_listen {
            cluster.peer_listen = Some(v);
        }
        if let Some(v) = args.cluster_name {
            cluster.name = v;
        }
        if let Some(v) = args.node_ttl {
            cluster.node_ttl_s = v;
        }
        if let Some(v) = args.peer_token_file {
            cluster.peer_token_file = Some(v);
        }
        if let Some(v) = args.etcd_grace {
            cluster.etcd_grace_s = v;
        }
        if let Some(v) = args.peer_tls_ca_file {
            cluster.peer_tls_ca_file = Some(v);
        }
        if let Some(v) = args.peer_tls_cert_file {
            cluster.peer_tls_cert_file = Some(v);
        }
        if let Some(v) = args.peer_tls_key_file {
            cluster.peer_tls_key_file = Some(v);
        }
        if args.peer_tls_client_auth {
            cluster.peer_tls_client_auth = true;
        }
        if args.replication_preview {
            cluster.replication_preview = true;
        }
        if let Some(v) = args.replica_timeout_ms {
            cluster.replica_timeout_ms = v;
        }
        if let Some(v) = args.replica_lease_ms {
            cluster.replica_lease_ms = v;
        }
        config.cluster = Some(cluster);
    } else if args.node_id.is_some()
        || args.advertise.is_some()
        || args.peer_listen.is_some()
        || args.peer_token_file.is_some()
        || args.etcd_grace.is_some()
        || args.peer_tls_ca_file.is_some()
        || args.peer_tls_cert_file.is_some()
        || args.peer_tls_key_file.is_some()
        || args.peer_tls_client_auth
        || args.replication_preview
        || args.replica_timeout_ms.is_some()
        || args.replica_lease_ms.is_some()
    {
        return Err(
            "--node-id, --advertise, --peer-listen, --peer-token-file, --etcd-grace, --peer-tls-*, \
             --replication-preview, --replica-timeout-ms and --replica-lease-ms need --cluster"
                .into(),
        );
    }
    berth::server::run(config)?;
    Ok(0)
}

/// `--server` as a URL: `host:port` (as `serve --listen` takes it) means `http://host:port`.
fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// Prints a JSON answer, or the error and a failing status.
fn finish(answer: Answer, ok: &[u16]) -> Result<i32, String> {
    finish_with(answer, ok, &[])
}

/// `finish`, with the columns (and their order) a table shows.
fn finish_with(answer: Answer, ok: &[u16], columns: &[&str]) -> Result<i32, String> {
    if ok.contains(&answer.status) {
        if !answer.body.is_empty() {
            // A reader that closed the pipe early (`berth ... | head`) is not the command's failure: no panic.
            match serde_json::from_slice::<serde_json::Value>(&answer.body) {
                Ok(value) if table_format() => print_result(&value, columns),
                _ => {
                    let _ = writeln!(std::io::stdout().lock(), "{}", answer.text());
                }
            }
        }
        Ok(0)
    } else {
        let json = answer.json();
        match (json["error"].as_str(), json["message"].as_str()) {
            (Some(code), Some(message)) => Err(format!("{} {code}: {message}", answer.status)),
            // Not a berth error: whatever answered is shown as it is, with a hint.
            _ => {
                let text = answer.text();
                let text = text.trim();
                let shown: String = text.chars().take(200).collect();
                Err(format!(
                    "{} from a server that is not berth, or not this API ({}): is --server right?",
                    answer.status,
                    if shown.is_empty() {
                        "empty body".to_string()
                    } else {
                        format!("body: {shown}")
                    }
                ))
            }
        }
    }
}

fn client_command(client: &Client, command: Command) -> Result<i32, String> {
    match command {
        Command::Serve(_) => unreachable!("handled by main"),
        Command::Topic(t) => topic_command(client, t),
        Command::Group(g) => group_command(client, g),
        Command::Cluster(ClusterCommand::Status) => {
            finish(client.call("GET", "/cluster", &[])?, &[200])
        }
        Command::Redrive {
            topic,
            to,
            max,
            group,
        } => {
            let mut path = format!("/topics/{}/redrive?to={}", enc(&topic), enc(&to));
            path += &params(&[
                ("max", max.map(|n| n.to_string()).as_deref()),
                ("group", group.as_deref()),
            ]);
            finish(client.call("POST", &path, &[])?, &[200])
        }
        Command::Produce {
            topic,
            message,
            key,
            partition,
            frames,
            batch,
            delay,
            dedup_id,
            attributes,
            group_key,
        } => {
            let mut path = format!("/produce?topic={}", enc(&topic));
            if let Some(k) = key {
                path += &format!("&key={}", enc(&k));
            }
            if let Some(g) = group_key {
                path += &format!("&group_key={}", enc(&g));
            }
            if let Some(p) = partition {
                path += &format!("&partition={p}");
            }
            if let Some(d) = delay {
                path += &format!("&delay={}", enc(&d));
            }
            let headers: Vec<(&str, &str)> = attributes
                .as_deref()
                .map(|a| ("attributes", a))
                .into_iter()
                .collect();
            if let Some(m) = message {
                if let Some(id) = dedup_id {
                    path += &format!("&dedup_id={}", enc(&id));
                }
                return finish(
                    client.call_with("POST", &path, &headers, m.as_bytes())?,
                    &[200],
                );
            }
            if dedup_id.is_some() {
                return Err(
                    "--dedup-id names one message: give it as MESSAGE (stdin's messages are sent as batches)"
                        .into(),
                );
            }
            let mut input = Vec::new();
            std::io::stdin()
                .read_to_end(&mut input)
                .map_err(|e| format!("reading stdin: {e}"))?;
            let messages = if frames {
                split_frames(&input)?
            } else {
                split_lines(&input)
            };
            produce_batches(client, &path, &headers, &messages, batch.max(1))
        }
        Command::Consume {
            topic,
            wait,
            visibility,
            count,
            max,
            ack,
            nack,
            follow,
            no_ack,
            group,
            partition,
            offset,
        } => {
            // Following waits for what comes: a long-poll, 20 s unless --wait says otherwise.
            let wait = match wait {
                Some(w) if !(follow && w == "0") => Some(w),
                _ if follow => Some("20s".to_string()),
                _ => None,
            };
            if let (Some(p), Some(first)) = (partition, offset) {
                // A replay of --count records from --offset (read-only: no lease, nothing to ack).
                let count = count.unwrap_or(if follow { u64::MAX } else { 1 });
                let mut o = first;
                while o - first < count {
                    let path = format!(
                        "/consume?topic={}&partition={p}&offset={o}&wait={}",
                        enc(&topic),
                        enc(wait.as_deref().unwrap_or("0"))
                    );
                    let answer = client.call("GET", &path, &[])?;
                    if answer.status == 204 && follow {
                        continue;
                    }
                    if !print_messages(client, answer, None)? {
                        eprintln!("no record at partition {p} offset {o}: the end of the partition (so far)");
                        break;
                    }
                    o += 1;
                }
                return Ok(0);
            }
            let mut path = format!("/consume?topic={}", enc(&topic));
            path += &params(&[
                ("wait", wait.as_deref()),
                ("visibility", visibility.as_deref()),
                ("group", group.as_deref()),
            ]);
            let op = if ack || (follow && !no_ack && !nack) {
                Some("ack")
            } else if nack {
                Some("nack")
            } else {
                None
            };
            let settle_with = op.map(|op| Settle {
                op,
                topic: &topic,
                group: group.as_deref(),
            });
            if follow {
                return consume_batches(
                    client,
                    &path,
                    count.unwrap_or(u64::MAX),
                    max,
                    settle_with,
                    true,
                );
            }
            let count = count.unwrap_or(max);
            if max > 1 {
                return consume_batches(client, &path, count, max, settle_with, false);
            }
            for _ in 0..count {
                let answer = client.call("GET", &path, &[])?;
                if !print_messages(client, answer, settle_with)? {
                    eprintln!("no message available");
                    break;
                }
            }
            Ok(0)
        }
        Command::Ack {
            topic,
            receipt_handle,
            group,
        } => Settle {
            op: "ack",
            topic: &topic,
            group: group.as_deref(),
        }
        .one_reported(client, &receipt_handle, &[]),
        Command::Nack {
            topic,
            receipt_handle,
            group,
            delay,
        } => Settle {
            op: "nack",
            topic: &topic,
            group: group.as_deref(),
        }
        .one_reported(client, &receipt_handle, &[("delay", delay.as_deref())]),
        Command::Extend {
            topic,
            receipt_handle,
            visibility,
            group,
        } => Settle {
            op: "extend",
            topic: &topic,
            group: group.as_deref(),
        }
        .one_reported(
            client,
            &receipt_handle,
            &[("visibility", visibility.as_deref())],
        ),
    }
}

/// The given query parameters as `&key=value` (percent-encoded); unset ones are left out.
fn params(pairs: &[(&str, Option<&str>)]) -> String {
    pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("&{k}={}", enc(v))))
        .collect()
}

/// A settle (`ack`, `nack` or `extend`) of leases of one topic, in one consumer group.
#[derive(Clone, Copy)]
struct Settle<'a> {
    op: &'a str,
    topic: &'a str,
    group: Option<&'a str>,
}

impl Settle<'_> {
    /// `/op?topic=T[&group=G]`.
    fn path(&self) -> String {
        format!(
            "/{}?topic={}{}",
            self.op,
            enc(self.topic),
            params(&[("group", self.group)])
        )
    }

    /// Settles one handle with the `extra` query parameters.
    fn one(
        &self,
        client: &Client,
        handle: &str,
        extra: &[(&str, Option<&str>)],
    ) -> Result<i32, String> {
        let path = format!(
            "{}&receipt_handle={}{}",
            self.path(),
            enc(handle),
            params(extra)
        );
        finish(client.call("POST", &path, &[])?, &[200])
    }

    /// `one`, then says what was done (the server's answer is empty), as one JSON line like every other result:
    /// `{"acked":"H"}`, `{"nacked":"H"}`, `{"extended":"H"}`.
    fn one_reported(
        &self,
        client: &Client,
        handle: &str,
        extra: &[(&str, Option<&str>)],
    ) -> Result<i32, String> {
        let code = self.one(client, handle, extra)?;
        let done = match self.op {
            "ack" => "acked",
            "nack" => "nacked",
            _ => "extended",
        };
        print_result(&serde_json::json!({ done: handle }), &[]);
        Ok(code)
    }
}

/// Lines of `input` (without their `\n` or `\r\n`); a last line without a newline counts, an empty input has none.
fn split_lines(input: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
        .into_iter()
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect()
}

/// Frames of `input`: a 4-byte little-endian length, then that many bytes.
fn split_frames(input: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < input.len() {
        let len = input
            .get(pos..pos + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or("stdin ends inside a frame length")?;
        let body = input
            .get(pos + 4..pos + 4 + len)
            .ok_or("stdin ends inside a frame")?;
        out.push(body);
        pos += 4 + len;
    }
    Ok(out)
}

/// Sends messages in batches (binary-safe frames) and prints one JSON result line per message, in order.
fn produce_batches(
    client: &Client,
    path: &str,
    headers: &[(&str, &str)],
    messages: &[&[u8]],
    batch: usize,
) -> Result<i32, String> {
    let mut failed = 0;
    let mut out = std::io::stdout().lock();
    for chunk in messages.chunks(batch) {
        let mut body = Vec::new();
        for m in chunk {
            body.extend_from_slice(&(m.len() as u32).to_le_bytes());
            body.extend_from_slice(m);
        }
        let mut with = vec![("content-type", berth::ops::params::FRAMES)];
        with.extend_from_slice(headers);
        let answer = client.call_with("POST", path, &with, &body)?;
        if answer.status != 200 {
            return finish(answer, &[]);
        }
        let json = answer.json();
        for r in json["results"].as_array().into_iter().flatten() {
            if r.get("error").is_some() {
                failed += 1;
            }
            let _ = writeln!(out, "{r}");
        }
    }
    if failed > 0 {
        return Err(format!(
            "{failed} of {} messages were not written",
            messages.len()
        ));
    }
    Ok(0)
}

/// Batch consumes of up to `max` until `count` messages were printed (or none is available), settling each
/// batch with one request when asked.
fn consume_batches(
    client: &Client,
    path: &str,
    count: u64,
    max: u64,
    settle_with: Option<Settle>,
    follow: bool,
) -> Result<i32, String> {
    let mut printed = 0u64;
    while printed < count {
        let want = max.min(count - printed);
        let answer = client.call_with(
            "GET",
            &format!("{path}&max={want}"),
            &[("accept", berth::ops::params::NDJSON)],
            &[],
        )?;
        match answer.status {
            // Following: the long-poll ran out with nothing new; poll again.
            204 if follow => continue,
            204 => {
                eprintln!("no message available");
                break;
            }
            200 => {}
            _ => return finish(answer, &[]),
        }
        let text = answer.text();
        let mut handles = Vec::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            printed += 1;
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(v) => {
                    print_message(&v);
                    if let Some(h) = v["receipt_handle"].as_str() {
                        handles.push(h.to_string());
                    }
                }
                Err(_) => {
                    let _ = writeln!(std::io::stdout().lock(), "{line}");
                }
            }
        }
        if let (Some(settle), false) = (settle_with, handles.is_empty()) {
            let body = handles.join("\n");
            let answer = client.call_with(
                "POST",
                &settle.path(),
                &[("content-type", "text/plain")],
                body.as_bytes(),
            )?;
            if answer.status != 200 {
                return finish(answer, &[]);
            }
            let failed: Vec<String> = answer.json()["results"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["status"] != 200)
                .map(|r| r.to_string())
                .collect();
            if !failed.is_empty() {
                return Err(format!("{} failed for: {}", settle.op, failed.join(", ")));
            }
        }
    }
    Ok(0)
}

/// Prints one delivered message as a JSON line; returns false on 204.
fn print_messages(
    client: &Client,
    answer: Answer,
    settle_with: Option<Settle>,
) -> Result<bool, String> {
    match answer.status {
        204 => Ok(false),
        200 => {
            let handle = answer.header("receipt-handle").map(str::to_string);
            let mut line = serde_json::json!({
                "partition": answer.header("partition").and_then(|v| v.parse::<u64>().ok()),
                "offset": answer.header("offset").and_then(|v| v.parse::<u64>().ok()),
                "receipt_handle": handle,
                "delivery_count": answer.header("delivery-count").and_then(|v| v.parse::<u64>().ok()),
            });
            // As the batch format does: the text when the bytes are UTF-8, else `body_base64`, never a lossy
            // conversion.
            let (field, body) = match std::str::from_utf8(&answer.body) {
                Ok(text) => ("body", serde_json::json!(text)),
                Err(_) => (
                    "body_base64",
                    serde_json::json!(STANDARD.encode(&answer.body)),
                ),
            };
            line[field] = body;
            if let Some(attributes) = answer
                .header("attributes")
                .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok())
            {
                line["attributes"] = attributes;
            }
            print_message(&line);
            if let (Some(settle), Some(handle)) = (settle_with, handle) {
                settle.one(client, &handle, &[])?;
            }
            Ok(true)
        }
        _ => finish(answer, &[]).map(|_| false),
    }
}

fn topic_command(client: &Client, command: TopicCommand) -> Result<i32, String> {
    match command {
        TopicCommand::Create {
            name,
            partitions,
            replicas,
            fifo,
            settings,
        } => {
            let mut replicas = replicas
                .map(|r| format!("&replicas={r}"))
                .unwrap_or_default();
            if fifo {
                replicas += "&fifo=true";
            }
            let path = format!(
                "/topics/{}?partitions={partitions}{replicas}{}",
                enc(&name),
                settings.query()
            );
            finish(client.call("PUT", &path, &[])?, &[200, 201])
        }
        TopicCommand::Update { name, settings } => {
            let query = settings.query();
            let Some(query) = query.strip_prefix('&') else {
                return Err(
                    "topic update needs at least one setting to change (see berth topic update --help)"
                        .into(),
                );
            };
            let path = format!("/topics/{}?{query}", enc(&name));
            finish(client.call("PATCH", &path, &[])?, &[200])
        }
        TopicCommand::List => finish(client.call("GET", "/topics", &[])?, &[200]),
        TopicCommand::Describe { name } => finish(
            client.call("GET", &format!("/topics/{}", enc(&name)), &[])?,
            &[200],
        ),
        TopicCommand::Delete { name } => {
            let answer = client.call("DELETE", &format!("/topics/{}", enc(&name)), &[])?;
            let code = finish(answer, &[204])?;
            eprintln!("deleted {name}");
            Ok(code)
        }
    }
}

fn group_command(client: &Client, command: GroupCommand) -> Result<i32, String> {
    let group_path =
        |topic: &str, group: &str| format!("/topics/{}/groups/{}", enc(topic), enc(group));
    match command {
        GroupCommand::List { topic } => finish(
            client.call("GET", &format!("/topics/{}/groups", enc(&topic)), &[])?,
            &[200],
        ),
        GroupCommand::Create {
            topic,
            group,
            start,
        } => {
            let mut path = group_path(&topic, &group);
            if let Some(start) = start {
                path += &format!("?start={}", enc(&start));
            }
            finish(client.call("PUT", &path, &[])?, &[200, 201])
        }
        GroupCommand::Describe { topic, group } => finish_with(
            client.call("GET", &group_path(&topic, &group), &[])?,
            &[200],
            &[
                "partition",
                "end_offset",
                "committed",
                "lag",
                "in_flight",
                "delayed",
                "acked_ahead",
                "delivered",
                "acked",
                "dead_lettered",
            ],
        ),
        GroupCommand::Delete { topic, group } => {
            let answer = client.call("DELETE", &group_path(&topic, &group), &[])?;
            let code = finish(answer, &[204])?;
            eprintln!("deleted group {group} of {topic}");
            Ok(code)
        }
        GroupCommand::Purge { topic, group } => {
            let path = format!("{}/purge", group_path(&topic, &group));
            finish(client.call("POST", &path, &[])?, &[200])
        }
    }
}
