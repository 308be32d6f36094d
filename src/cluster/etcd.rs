//! The etcd v3 client the cluster metastore uses: an async facade on core 0 over the control-plane thread
//! (`control_plane.rs`), which runs etcd's own gRPC client (`etcd-client`) on a current-thread tokio runtime.
//!
//! Every call here is a message to that thread and an await on its `futures_channel` answer, so core 0's executor
//! only ever awaits runtime-agnostic channels; nothing of tokio or tonic runs on a glommio core. Watches are gRPC
//! streams whose batches come back on a bounded channel; a lease is refreshed over one gRPC keep-alive stream that
//! the thread holds open ([`Etcd::lease_keepalive_once`] is one request and its answer on it).
//!
//! The thread holds one gRPC client per endpoint and tries them in order from the last one that answered. A call
//! moves to the next endpoint when the connection cannot be made (the request never left); reads also move on when
//! an endpoint is unavailable or silent. A write that got no answer (connection lost, the request timeout, the
//! thread stopped mid-call) fails with [`EtcdError::Transport`], because its outcome is unknown: the caller decides.
//! Nothing reachable is [`EtcdError::Unavailable`], listing each endpoint's failure.

use super::control_plane::{Command, ControlPlane, Reply};
use futures_channel::{mpsc, oneshot};
use futures_lite::StreamExt;
use std::fmt;
use std::time::Duration;

/// Default time allowed to connect to an endpoint.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for a unary call, or for a watch's or keep-alive stream's first answer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default HTTP/2 ping interval on etcd connections (idle ones too): a dead etcd under a quiet watch is noticed
/// within this plus [`DEFAULT_KEEP_ALIVE_TIMEOUT`].
pub const DEFAULT_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Default time to wait for a ping's answer before the connection counts as dead.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default commands queued for the control-plane thread before calls are refused (`Unavailable`).
pub const DEFAULT_MAX_QUEUED: usize = 1024;
/// Default unary calls running at once on the control-plane thread (watches and keep-alives not counted).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// Default watch batches buffered per watch before the thread stops reading that watch until core 0 catches up.
pub const DEFAULT_WATCH_BUFFER: usize = 64;

/// Timeouts and limits of the etcd client.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Connecting to one endpoint gives up after this (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: Duration,
    /// A call without an answer after this fails (default [`DEFAULT_REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// HTTP/2 ping interval (default [`DEFAULT_KEEP_ALIVE_INTERVAL`]).
    pub keep_alive_interval: Duration,
    /// HTTP/2 ping answer timeout (default [`DEFAULT_KEEP_ALIVE_TIMEOUT`]).
    pub keep_alive_timeout: Duration,
    /// Command queue bound (default [`DEFAULT_MAX_QUEUED`]).
    pub max_queued: usize,
    /// Concurrent unary calls (default [`DEFAULT_MAX_IN_FLIGHT`]).
    pub max_in_flight: usize,
    /// Batches buffered per watch (default [`DEFAULT_WATCH_BUFFER`]).
    pub watch_buffer: usize,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            keep_alive_interval: DEFAULT_KEEP_ALIVE_INTERVAL,
            keep_alive_timeout: DEFAULT_KEEP_ALIVE_TIMEOUT,
            max_queued: DEFAULT_MAX_QUEUED,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            watch_buffer: DEFAULT_WATCH_BUFFER,
        }
    }
}

/// One key-value pair as etcd stores it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    /// Lease id the key is attached to, 0 if none.
    pub lease: i64,
}

/// The answer to a range (get) request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResponse {
    /// Store revision at which the range was read (header revision).
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// Number of keys in the range.
    pub count: i64,
    /// More keys exist than were returned (only with a limit; this client sets none).
    pub more: bool,
}

/// The answer to a delete.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteResponse {
    pub revision: i64,
    pub deleted: i64,
}

/// What a transaction compare looks at, with the operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    /// Number of modifications since creation (0 = absent).
    Version(i64),
    /// Revision of the key's creation (0 = absent).
    CreateRevision(i64),
    /// Revision of the key's last modification.
    ModRevision(i64),
    Value(Vec<u8>),
    Lease(i64),
}

/// The comparison of a transaction compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// One condition of a transaction: `target(key) op operand`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub op: CompareOp,
    pub target: CompareTarget,
}

impl Compare {
    pub fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: CompareTarget) -> Compare {
        Compare {
            key: key.into(),
            op,
            target,
        }
    }

    /// The key does not exist ("create only if absent").
    pub fn absent(key: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::CreateRevision(0))
    }

    /// The key was last modified at `revision` ("update only if unchanged since read").
    pub fn mod_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::ModRevision(revision))
    }

    /// The key holds `value`.
    pub fn value_is(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::Value(value.into()))
    }

    /// The key's version is `version`.
    pub fn version_is(key: impl Into<Vec<u8>>, version: i64) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::Version(version))
    }
}

/// One operation of a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: Option<i64>,
    },
    Range {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
    },
    Delete {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
    },
}

impl TxnOp {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: Option<i64>) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }

    pub fn get(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Range {
            key: key.into(),
            range_end: None,
        }
    }

    pub fn delete(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Delete {
            key: key.into(),
            range_end: None,
        }
    }
}

/// The result of one transaction operation, in the order of the branch that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOpResponse {
    Put { revision: i64 },
    Range(RangeResponse),
    Delete(DeleteResponse),
}

/// The answer to a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnResponse {
    pub revision: i64,
    /// The compares held and the success branch ran (else the failure branch ran).
    pub succeeded: bool,
    pub responses: Vec<TxnOpResponse>,
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change seen by a watch. For a delete, `kv` carries the key and `mod_revision` (the deletion revision) only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
}

impl Event {
    /// The revision of this change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

/// The events of one watch message, in revision order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBatch {
    /// Header revision of the message: the store revision when it was sent (at least the last event's).
    pub revision: i64,
    pub events: Vec<Event>,
}

/// Everything an etcd call can fail with.
#[derive(Debug)]
pub enum EtcdError {
    /// The endpoint list or an argument is unusable.
    Config(String),
    /// etcd could not be reached (or the control-plane thread is stopped or overloaded), and the call changed
    /// nothing: a read, or a request that never left.
    Unavailable(String),
    /// A write got no answer (connection lost, timeout, the control-plane thread stopped mid-call): it may or may
    /// not have been applied.
    Transport(String),
    /// etcd refused the request (gRPC status code and message).
    Server { code: i32, message: String },
    /// The answer did not have the expected shape.
    Decode(String),
    /// A watch's start revision was compacted away: re-read with `range` and re-watch from its revision + 1.
    Compacted { compact_revision: i64 },
    /// etcd canceled the watch for another reason.
    WatchCanceled(String),
    /// The watch stream ended (or was already broken by an earlier error).
    WatchClosed,
    /// The lease does not exist (expired or revoked).
    LeaseNotFound(i64),
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Config(s) => write!(f, "etcd client configuration: {s}"),
            EtcdError::Unavailable(s) => write!(f, "etcd unavailable: {s}"),
            EtcdError::Transport(s) => write!(f, "etcd write outcome unknown: {s}"),
            EtcdError::Server { code, message } => {
                write!(f, "etcd error (gRPC code {code}): {message}")
            }
            EtcdError::Decode(s) => write!(f, "unexpected etcd answer: {s}"),
            EtcdError::Compacted { compact_revision } => write!(
                f,
                "watch start revision compacted (compact revision {compact_revision})"
            ),
            EtcdError::WatchCanceled(s) => write!(f, "watch canceled by etcd: {s}"),
            EtcdError::WatchClosed => write!(f, "watch stream closed"),
            EtcdError::LeaseNotFound(id) => write!(f, "lease {id:x} not found"),
        }
    }
}

impl std::error::Error for EtcdError {}

type Result<T> = std::result::Result<T, EtcdError>;

/// The end of the key range holding every key that starts with `prefix` (etcd's `WithPrefix`).
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // "\0": every key from `key` on
}

/// `(key, range_end)` selecting every key under `prefix` (the empty prefix selects everything).
fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let key = if prefix.is_empty() {
        vec![0]
    } else {
        prefix.to_vec()
    };
    (key, prefix_range_end(prefix))
}

/// A client for one etcd cluster: a handle on core 0 of the control-plane thread it started. Not `Send`-bound in
/// use (core 0 owns it), calls may run concurrently. Dropping it stops the thread; so does [`Etcd::close`].
#[derive(Debug)]
pub struct Etcd {
    endpoints: Vec<String>,
    plane: ControlPlane,
}

impl Etcd {
    /// A client for `endpoints` (`http://host:port`), with default timeouts and limits. Connects lazily.
    pub fn new(endpoints: Vec<String>) -> Result<Etcd> {
        Etcd::with_config(endpoints, EtcdConfig::default())
    }

    /// A client with the given timeouts and limits: starts the control-plane thread.
    pub fn with_config(endpoints: Vec<String>, config: EtcdConfig) -> Result<Etcd> {
        if endpoints.is_empty() {
            return Err(EtcdError::Config("no endpoints".into()));
        }
        for e in &endpoints {
            let host = e.strip_prefix("http://").unwrap_or_default();
            if host.trim_end_matches('/').is_empty() || host.contains(char::is_whitespace) {
                return Err(EtcdError::Config(format!(
                    "endpoint {e:?} is not http://host:port (TLS is not supported)"
                )));
            }
        }
        Ok(Etcd {
            plane: ControlPlane::start(endpoints.clone(), config)?,
            endpoints,
        })
    }

    /// The endpoint URLs, in configured order.
    pub fn endpoints(&self) -> Vec<&str> {
        self.endpoints.iter().map(String::as_str).collect()
    }

    /// Sends a command and waits for its answer. `write`: a lost answer means an unknown outcome.
    async fn ask<T>(&self, write: bool, command: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.plane.submit(command(reply))?;
        answer.await.unwrap_or_else(|_| {
            let reason = "the etcd control plane stopped during the call".to_string();
            Err(if write {
                EtcdError::Transport(reason)
            } else {
                EtcdError::Unavailable(reason)
            })
        })
    }

    /// Stops the control-plane thread: every call, watch and keep-alive still running ends (watches with
    /// [`EtcdError::WatchClosed`]), and later calls fail with [`EtcdError::Unavailable`]. Returns once the thread's
    /// runtime is gone. Revoke leases first: nothing is given back to etcd here.
    pub async fn close(&self) {
        let (done, stopped) = oneshot::channel();
        if self.plane.submit(Command::Close { done }).is_ok() {
            let _ = stopped.await;
        }
    }

    /// Keys in `[key, range_end)`, or just `key` when `range_end` is `None`.
    pub async fn range(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<RangeResponse> {
        let (key, range_end) = (key.to_vec(), range_end.map(<[u8]>::to_vec));
        self.ask(false, |reply| Command::Range {
            key,
            range_end,
            reply,
        })
        .await
    }

    /// Every key starting with `prefix`, in key order.
    pub async fn get_prefix(&self, prefix: &[u8]) -> Result<RangeResponse> {
        let (key, end) = prefix_range(prefix);
        self.range(&key, Some(&end)).await
    }

    /// Sets `key` to `value`, attached to `lease` if given. Returns the revision of the write.
    pub async fn put(&self, key: &[u8], value: &[u8], lease: Option<i64>) -> Result<i64> {
        let (key, value) = (key.to_vec(), value.to_vec());
        self.ask(true, |reply| Command::Put {
            key,
            value,
            lease,
            reply,
        })
        .await
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &[u8]) -> Result<DeleteResponse> {
        let key = key.to_vec();
        self.ask(true, |reply| Command::Delete {
            key,
            range_end: None,
            reply,
        })
        .await
    }

    /// Deletes every key starting with `prefix`.
    pub async fn delete_prefix(&self, prefix: &[u8]) -> Result<DeleteResponse> {
        let (key, end) = prefix_range(prefix);
        self.ask(true, |reply| Command::Delete {
            key,
            range_end: Some(end),
            reply,
        })
        .await
    }

    /// Runs `success` if every compare holds, else `failure`, atomically.
    pub async fn txn(
        &self,
        compares: &[Compare],
        success: &[TxnOp],
        failure: &[TxnOp],
    ) -> Result<TxnResponse> {
        let write = success
            .iter()
            .chain(failure)
            .any(|op| !matches!(op, TxnOp::Range { .. }));
        let (compares, success, failure) = (compares.to_vec(), success.to_vec(), failure.to_vec());
        self.ask(write, |reply| Command::Txn {
            compares,
            success,
            failure,
            reply,
        })
        .await
    }

    /// Compacts the history up to `revision` (watches from before it then fail with `Compacted`).
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<()> {
        self.ask(true, |reply| Command::Compact {
            revision,
            physical,
            reply,
        })
        .await
    }

    /// Grants a lease of `ttl_s` seconds (etcd may raise it to its minimum); returns its id.
    pub async fn lease_grant(&self, ttl_s: i64) -> Result<i64> {
        if ttl_s <= 0 {
            return Err(EtcdError::Config(format!("lease ttl {ttl_s}")));
        }
        self.ask(true, |reply| Command::LeaseGrant { ttl_s, reply })
            .await
    }

    /// Refreshes lease `id` once, over the lease's keep-alive stream (which the control-plane thread opens on first
    /// use and keeps); returns its TTL in seconds from now. An expired or revoked lease is
    /// [`EtcdError::LeaseNotFound`]. Call it every TTL/3 or so to keep a lease.
    pub async fn lease_keepalive_once(&self, id: i64) -> Result<i64> {
        self.ask(false, |reply| Command::LeaseKeepAlive { id, reply })
            .await
    }

    /// Revokes lease `id`, deleting every key attached to it (and closing its keep-alive stream).
    pub async fn lease_revoke(&self, id: i64) -> Result<()> {
        self.ask(true, |reply| Command::LeaseRevoke { id, reply })
            .await
    }

    /// Watches every key starting with `prefix`, from `start_revision` (0: from now). See [`WatchStream`].
    pub async fn watch(&self, prefix: &[u8], start_revision: i64) -> Result<WatchStream> {
        let (key, end) = prefix_range(prefix);
        self.watch_range(&key, Some(&end), start_revision).await
    }

    /// Watches `[key, range_end)` (or just `key`) from `start_revision` (0: from now). Returns once etcd has
    /// created the watch.
    pub async fn watch_range(
        &self,
        key: &[u8],
        range_end: Option<&[u8]>,
        start_revision: i64,
    ) -> Result<WatchStream> {
        let (key, range_end) = (key.to_vec(), range_end.map(<[u8]>::to_vec));
        let opened = self
            .ask(false, |reply| Command::Watch {
                key,
                range_end,
                start_revision,
                reply,
            })
            .await?;
        Ok(WatchStream {
            batches: Some(opened.batches),
            created_revision: opened.created_revision,
            _cancel: opened.cancel,
        })
    }
}

/// A live watch. `next()` yields event batches in revision order until an error; after an error the stream is
/// finished and every further `next()` returns [`EtcdError::WatchClosed`].
///
/// On [`EtcdError::Compacted`], a broken connection ([`EtcdError::Unavailable`], [`EtcdError::WatchClosed`]) or
/// [`EtcdError::WatchCanceled`], the caller re-reads with `range`/`get_prefix` and watches again from that read's
/// revision + 1. A quiet watch sends nothing; a dead etcd is noticed by HTTP/2 pings ([`EtcdConfig`]). `next()` is
/// cancellation safe. Dropping the stream cancels the watch.
#[derive(Debug)]
pub struct WatchStream {
    batches: Option<mpsc::Receiver<Result<WatchBatch>>>,
    created_revision: i64,
    /// Dropped with the stream: tells the control-plane thread to cancel the watch.
    _cancel: oneshot::Sender<()>,
}

impl WatchStream {
    /// Header revision of the `created` message: the store revision when the watch was set up.
    pub fn created_revision(&self) -> i64 {
        self.created_revision
    }

    /// The next batch of events.
    pub async fn next(&mut self) -> Result<WatchBatch> {
        let Some(batches) = self.batches.as_mut() else {
            return Err(EtcdError::WatchClosed);
        };
        match batches.next().await {
            Some(Ok(batch)) => Ok(batch),
            Some(Err(e)) => {
                self.batches = None;
                Err(e)
            }
            None => {
                self.batches = None;
                Err(EtcdError::WatchClosed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_etcd::{free_port, run, start_etcd, EtcdProcess};
    use crate::cluster::within;
    use std::time::Instant;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_range_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_range_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
    }

    // ---- integration tests against a real etcd on loopback ----

    fn client(p: &EtcdProcess) -> Etcd {
        Etcd::new(vec![p.url.clone()]).unwrap()
    }

    fn keys(r: &RangeResponse) -> Vec<String> {
        r.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect()
    }

    #[test]
    fn etcd_put_get_prefix_delete() {
        let Some(p) = start_etcd("etcd_put_get_prefix_delete") else {
            return;
        };
        run(async {
            let e = client(&p);
            let r1 = e.put(b"a/1", b"one", None).await.unwrap();
            let r2 = e.put(b"a/2", b"\x00\xff binary", None).await.unwrap();
            e.put(b"b/1", b"other", None).await.unwrap();
            assert!(r2 > r1);
            let got = e.range(b"a/1", None).await.unwrap();
            assert_eq!(got.kvs.len(), 1);
            assert_eq!(got.kvs[0].value, b"one");
            assert_eq!(
                (got.kvs[0].create_revision, got.kvs[0].mod_revision),
                (r1, r1)
            );
            assert_eq!(got.kvs[0].version, 1);
            assert!(got.revision >= r2);
            let prefix = e.get_prefix(b"a/").await.unwrap();
            assert_eq!(keys(&prefix), ["a/1", "a/2"]);
            assert_eq!(prefix.kvs[1].value, b"\x00\xff binary");
            assert_eq!(prefix.count, 2);
            assert_eq!(e.get_prefix(b"").await.unwrap().kvs.len(), 3);
            assert!(e.range(b"missing", None).await.unwrap().kvs.is_empty());
            let r3 = e.put(b"a/1", b"uno", None).await.unwrap();
            let got = e.range(b"a/1", None).await.unwrap();
            assert_eq!(
                (
                    got.kvs[0].mod_revision,
                    got.kvs[0].version,
                    got.kvs[0].create_revision
                ),
                (r3, 2, r1)
            );
            assert_eq!(e.delete(b"a/1").await.unwrap().deleted, 1);
            assert_eq!(e.delete(b"a/1").await.unwrap().deleted, 0);
            assert_eq!(e.delete_prefix(b"a/").await.unwrap().deleted, 1);
            assert_eq!(keys(&e.get_prefix(b"").await.unwrap()), ["b/1"]);
        });
    }

    #[test]
    fn etcd_txn_create_if_absent_and_cas() {
        let Some(p) = start_etcd("etcd_txn_create_if_absent_and_cas") else {
            return;
        };
        run(async {
            let e = client(&p);
            let create = |v: &'static [u8]| {
                let e = &e;
                async move {
                    e.txn(
                        &[Compare::absent(b"k".to_vec())],
                        &[TxnOp::put(b"k".to_vec(), v.to_vec(), None)],
                        &[TxnOp::get(b"k".to_vec())],
                    )
                    .await
                    .unwrap()
                }
            };
            let first = create(b"v1").await;
            assert!(first.succeeded);
            assert!(
                matches!(first.responses[..], [TxnOpResponse::Put { revision }] if revision == first.revision)
            );
            let second = create(b"v2").await;
            assert!(!second.succeeded);
            let TxnOpResponse::Range(current) = &second.responses[0] else {
                panic!("expected a range response: {second:?}");
            };
            assert_eq!(current.kvs[0].value, b"v1");
            let rev = current.kvs[0].mod_revision;

            // Update only if unchanged since read.
            let cas = |rev: i64, v: &'static [u8]| {
                let e = &e;
                async move {
                    e.txn(
                        &[Compare::mod_revision_is(b"k".to_vec(), rev)],
                        &[TxnOp::put(b"k".to_vec(), v.to_vec(), None)],
                        &[],
                    )
                    .await
                    .unwrap()
                }
            };
            assert!(cas(rev, b"v3").await.succeeded);
            let stale = cas(rev, b"v4").await;
            assert!(!stale.succeeded);
            assert!(stale.responses.is_empty());
            assert_eq!(e.range(b"k", None).await.unwrap().kvs[0].value, b"v3");

            // Value and version compares, and a delete in a txn.
            let t = e
                .txn(
                    &[
                        Compare::value_is(b"k".to_vec(), b"v3".to_vec()),
                        Compare::version_is(b"k".to_vec(), 2),
                        Compare::new(
                            b"k".to_vec(),
                            CompareOp::Greater,
                            CompareTarget::ModRevision(0),
                        ),
                    ],
                    &[TxnOp::delete(b"k".to_vec())],
                    &[],
                )
                .await
                .unwrap();
            assert!(t.succeeded);
            assert!(matches!(
                t.responses[..],
                [TxnOpResponse::Delete(DeleteResponse { deleted: 1, .. })]
            ));
        });
    }

    #[test]
    fn etcd_lease_attach_keepalive_revoke() {
        let Some(p) = start_etcd("etcd_lease_attach_keepalive_revoke") else {
            return;
        };
        run(async {
            let e = client(&p);
            let id = e.lease_grant(30).await.unwrap();
            e.put(b"node/1", b"alive", Some(id)).await.unwrap();
            let got = e.range(b"node/1", None).await.unwrap();
            assert_eq!(got.kvs[0].lease, id);
            let ttl = e.lease_keepalive_once(id).await.unwrap();
            assert!((1..=30).contains(&ttl), "ttl {ttl}");
            // Later refreshes go over the same keep-alive stream.
            assert_eq!(e.lease_keepalive_once(id).await.unwrap(), ttl);
            assert_eq!(e.lease_keepalive_once(id).await.unwrap(), ttl);
            e.lease_revoke(id).await.unwrap();
            assert!(e.range(b"node/1", None).await.unwrap().kvs.is_empty());
            assert!(matches!(
                e.lease_keepalive_once(id).await,
                Err(EtcdError::LeaseNotFound(x)) if x == id
            ));
            assert!(matches!(
                e.lease_revoke(id).await,
                Err(EtcdError::LeaseNotFound(_))
            ));
            assert!(matches!(
                e.put(b"node/2", b"x", Some(id)).await,
                Err(EtcdError::LeaseNotFound(x)) if x == id
            ));
        });
    }

    #[test]
    fn etcd_lease_expiry_removes_key() {
        let Some(p) = start_etcd("etcd_lease_expiry_removes_key") else {
            return;
        };
        run(async {
            let e = client(&p);
            let id = e.lease_grant(2).await.unwrap();
            e.put(b"ephemeral", b"x", Some(id)).await.unwrap();
            let t = Instant::now();
            loop {
                if e.range(b"ephemeral", None).await.unwrap().kvs.is_empty() {
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(15), "lease never expired");
                glommio::timer::sleep(Duration::from_millis(200)).await;
            }
            assert!(
                t.elapsed() >= Duration::from_millis(1500),
                "expired too early"
            );
            assert!(matches!(
                e.lease_keepalive_once(id).await,
                Err(EtcdError::LeaseNotFound(_))
            ));
        });
    }

    #[test]
    fn etcd_watch_sees_puts_and_deletes_in_order() {
        let Some(p) = start_etcd("etcd_watch_sees_puts_and_deletes_in_order") else {
            return;
        };
        run(async {
            let e = client(&p);
            let before = e.put(b"p/0", b"before", None).await.unwrap();
            e.put(b"q/0", b"outside", None).await.unwrap();
            let mut w = e.watch(b"p/", 0).await.unwrap();
            assert!(w.created_revision() >= before);
            let r1 = e.put(b"p/1", b"1", None).await.unwrap();
            e.put(b"q/1", b"outside", None).await.unwrap();
            let r2 = e.put(b"p/2", b"2", None).await.unwrap();
            let r3 = e.delete(b"p/1").await.unwrap().revision;
            let t = e
                .txn(
                    &[],
                    &[
                        TxnOp::put(b"p/3".to_vec(), b"3".to_vec(), None),
                        TxnOp::put(b"p/4".to_vec(), b"4".to_vec(), None),
                    ],
                    &[],
                )
                .await
                .unwrap();
            let r5 = e.delete_prefix(b"p/").await.unwrap().revision;
            let mut seen = Vec::new();
            while seen.len() < 8 {
                let batch = within(Duration::from_secs(5), w.next())
                    .await
                    .expect("watch stalled")
                    .unwrap();
                for ev in &batch.events {
                    assert!(batch.revision >= ev.revision());
                }
                seen.extend(batch.events);
            }
            let summary: Vec<(EventKind, String, i64)> = seen
                .iter()
                .map(|ev| {
                    (
                        ev.kind,
                        String::from_utf8_lossy(&ev.kv.key).into_owned(),
                        ev.revision(),
                    )
                })
                .collect();
            use EventKind::{Delete, Put};
            let expect: Vec<(EventKind, String, i64)> = vec![
                (Put, "p/1".into(), r1),
                (Put, "p/2".into(), r2),
                (Delete, "p/1".into(), r3),
                (Put, "p/3".into(), t.revision),
                (Put, "p/4".into(), t.revision),
                (Delete, "p/0".into(), r5),
                (Delete, "p/2".into(), r5),
                (Delete, "p/3".into(), r5),
            ];
            assert_eq!(summary[..8], expect[..]);
            assert_eq!(seen[0].kv.value, b"1");

            // A watch from a past revision replays history, starting at that revision.
            let mut replay = e.watch(b"p/", before).await.unwrap();
            let first = within(Duration::from_secs(5), replay.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(first.events[0].kv.key, b"p/0");
            assert_eq!(first.events[0].revision(), before);

            // Killing etcd breaks the stream: unavailable or closed, never `Compacted`.
            let mut p = p;
            p.kill();
            let broken = within(Duration::from_secs(10), w.next())
                .await
                .expect("no error after kill");
            assert!(
                matches!(
                    broken,
                    Err(EtcdError::Unavailable(_) | EtcdError::WatchClosed)
                ),
                "{broken:?}"
            );
            assert!(matches!(w.next().await, Err(EtcdError::WatchClosed)));
            drop(e);
        });
    }

    #[test]
    fn etcd_watch_from_compacted_revision() {
        let Some(p) = start_etcd("etcd_watch_from_compacted_revision") else {
            return;
        };
        run(async {
            let e = client(&p);
            let first = e.put(b"c/x", b"0", None).await.unwrap();
            let mut last = first;
            for i in 1..5 {
                last = e
                    .put(b"c/x", format!("{i}").as_bytes(), None)
                    .await
                    .unwrap();
            }
            e.compact(last, true).await.unwrap();
            let mut w = e.watch(b"c/", first).await.unwrap();
            let err = within(Duration::from_secs(5), w.next())
                .await
                .expect("no compaction notice")
                .unwrap_err();
            assert!(
                matches!(err, EtcdError::Compacted { compact_revision } if compact_revision == last),
                "{err:?}"
            );
            assert!(matches!(w.next().await, Err(EtcdError::WatchClosed)));

            // The recovery recipe: re-read everything, watch from the read's revision + 1.
            let snapshot = e.get_prefix(b"c/").await.unwrap();
            assert_eq!(snapshot.kvs[0].value, b"4");
            let mut w = e.watch(b"c/", snapshot.revision + 1).await.unwrap();
            let next = e.put(b"c/y", b"new", None).await.unwrap();
            let batch = within(Duration::from_secs(5), w.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(batch.events[0].revision(), next);
            assert_eq!(batch.events[0].kv.key, b"c/y");
        });
    }

    #[test]
    fn etcd_failover_from_dead_endpoint() {
        let Some(p) = start_etcd("etcd_failover_from_dead_endpoint") else {
            return;
        };
        run(async {
            let dead = format!("http://127.0.0.1:{}", free_port());
            let e = Etcd::new(vec![dead.clone(), p.url.clone()]).unwrap();
            assert_eq!(e.endpoints(), [dead.as_str(), p.url.as_str()]);
            e.put(b"f", b"1", None).await.unwrap();
            assert_eq!(e.range(b"f", None).await.unwrap().kvs[0].value, b"1");
            let mut w = e.watch(b"f", 0).await.unwrap();
            e.put(b"f", b"2", None).await.unwrap();
            let b = within(Duration::from_secs(5), w.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(b.events[0].kv.value, b"2");
            let id = e.lease_grant(10).await.unwrap();
            assert!(e.lease_keepalive_once(id).await.unwrap() > 0);

            // Nothing reachable: reads are Unavailable, writes Unavailable or Transport (outcome unknown), within
            // the request timeout.
            let config = EtcdConfig {
                request_timeout: Duration::from_millis(500),
                ..EtcdConfig::default()
            };
            let nowhere = format!("http://127.0.0.1:{}", free_port());
            let e = Etcd::with_config(vec![dead.clone(), nowhere], config).unwrap();
            let t = Instant::now();
            assert!(matches!(
                e.range(b"f", None).await,
                Err(EtcdError::Unavailable(_))
            ));
            assert!(matches!(
                e.put(b"f", b"3", None).await,
                Err(EtcdError::Unavailable(_) | EtcdError::Transport(_))
            ));
            assert!(matches!(
                e.watch(b"f", 0).await,
                Err(EtcdError::Unavailable(_))
            ));
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            assert!(Etcd::new(vec![]).is_err());
            assert!(Etcd::new(vec!["https://x:1".into()]).is_err());
        });
    }

    #[test]
    fn closing_the_client_ends_its_watches_and_calls() {
        let Some(p) = start_etcd("closing_the_client_ends_its_watches_and_calls") else {
            return;
        };
        run(async {
            let e = client(&p);
            e.put(b"w", b"1", None).await.unwrap();
            let mut w = e.watch(b"w", 0).await.unwrap();
            e.close().await;
            let ended = within(Duration::from_secs(5), w.next())
                .await
                .expect("the watch outlived the control plane");
            assert!(matches!(ended, Err(EtcdError::WatchClosed)), "{ended:?}");
            assert!(matches!(
                e.range(b"w", None).await,
                Err(EtcdError::Unavailable(_))
            ));
            e.close().await; // twice is fine

            // Dropping the last handle stops the thread too: its watch ends.
            let e = client(&p);
            let mut w = e.watch(b"w", 0).await.unwrap();
            drop(e);
            let ended = within(Duration::from_secs(5), w.next())
                .await
                .expect("the watch outlived its client");
            assert!(matches!(ended, Err(EtcdError::WatchClosed)), "{ended:?}");
        });
    }
}
