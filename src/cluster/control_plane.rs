//! The control-plane thread: etcd's gRPC client (`etcd-client`, over tonic) on a current-thread tokio runtime of
//! its own, so that no etcd work (HTTP/2, protobuf, TLS-free but still CPU) runs on a glommio core that owns
//! partitions, and no tokio runs on those cores. `etcd::Etcd` on core 0 is the only caller.
//!
//! Core 0 sends [`Command`]s on a bounded tokio channel (`try_send` is synchronous, so glommio never awaits tokio);
//! each carries a `futures_channel::oneshot` for its answer, which glommio awaits. A watch answers with a bounded
//! `futures_channel::mpsc` receiver of batches. The thread ends when the last command sender is dropped or on
//! [`Command::Close`]; dropping its runtime drops every call, watch and keep-alive still in flight, so their
//! receivers on core 0 see the end.

use super::etcd::{
    Compare, CompareOp, CompareTarget, DeleteResponse, EtcdConfig, EtcdError, Event, EventKind,
    KeyValue, RangeResponse, TxnOp, TxnOpResponse, TxnResponse, WatchBatch,
};
use etcd_client as ec;
use futures_channel::{mpsc, oneshot};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tonic::Code;

/// Where a command's answer goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, EtcdError>>;

/// An opened watch as core 0 receives it.
pub(crate) struct Opened {
    /// Header revision of the `created` message.
    pub created_revision: i64,
    /// Batches in revision order; an error is the last item.
    pub batches: mpsc::Receiver<Result<WatchBatch, EtcdError>>,
    /// Dropping it cancels the watch on the thread (and at etcd).
    pub cancel: oneshot::Sender<()>,
}

/// One request from core 0.
pub(crate) enum Command {
    Range {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
        reply: Reply<RangeResponse>,
    },
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: Option<i64>,
        reply: Reply<i64>,
    },
    Delete {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
        reply: Reply<DeleteResponse>,
    },
    Txn {
        compares: Vec<Compare>,
        success: Vec<TxnOp>,
        failure: Vec<TxnOp>,
        reply: Reply<TxnResponse>,
    },
    Compact {
        revision: i64,
        physical: bool,
        reply: Reply<()>,
    },
    LeaseGrant {
        ttl_s: i64,
        reply: Reply<i64>,
    },
    /// One refresh over the lease's keep-alive stream (opened on first use, kept open by the thread).
    LeaseKeepAlive {
        id: i64,
        reply: Reply<i64>,
    },
    LeaseRevoke {
        id: i64,
        reply: Reply<()>,
    },
    Watch {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
        start_revision: i64,
        reply: Reply<Opened>,
    },
    /// Stop: answered once the runtime, and everything running on it, is gone.
    Close {
        done: oneshot::Sender<()>,
    },
}

/// Core 0's end of the control-plane thread.
#[derive(Debug)]
pub(crate) struct ControlPlane {
    commands: tokio::sync::mpsc::Sender<Command>,
}

impl ControlPlane {
    /// Starts the thread (unpinned: it runs on the process's CPUs, not on the calling core's alone). The client
    /// connects lazily, so this succeeds without etcd.
    pub(crate) fn start(
        endpoints: Vec<String>,
        config: EtcdConfig,
    ) -> Result<ControlPlane, EtcdError> {
        let (commands, receiver) = tokio::sync::mpsc::channel(config.max_queued.max(1));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                EtcdError::Config(format!("cannot build the control-plane runtime: {e}"))
            })?;
        std::thread::Builder::new()
            .name("berth-etcd".into())
            .spawn(move || {
                unpin_current_thread();
                let done = runtime.block_on(serve(endpoints, config, receiver));
                // Dropping the runtime drops every task still on it: calls, watches, keep-alive streams.
                drop(runtime);
                if let Some(done) = done {
                    let _ = done.send(());
                }
            })
            .map_err(|e| {
                EtcdError::Config(format!("cannot start the control-plane thread: {e}"))
            })?;
        Ok(ControlPlane { commands })
    }

    /// Hands `command` to the thread without waiting: a full queue or a stopped thread is refused at once.
    pub(crate) fn submit(&self, command: Command) -> Result<(), EtcdError> {
        use tokio::sync::mpsc::error::TrySendError;
        self.commands.try_send(command).map_err(|e| match e {
            TrySendError::Full(_) => {
                EtcdError::Unavailable("the etcd control plane is overloaded".into())
            }
            TrySendError::Closed(_) => {
                EtcdError::Unavailable("the etcd control plane has stopped".into())
            }
        })
    }
}

/// Lets the thread run on any CPU the process may use (a thread inherits its creator's affinity, and core 0's
/// executor thread is pinned to one CPU).
fn unpin_current_thread() {
    // SAFETY: sched_getaffinity/sched_setaffinity on a zeroed cpu_set_t of the right size; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // The process's main thread (tid == pid) is never pinned by berth: its mask is the process's.
        if libc::sched_getaffinity(libc::getpid(), size, &mut set) == 0 {
            let _ = libc::sched_setaffinity(0, size, &set);
        }
    }
}

/// The thread's loop: one task per call (at most `max_in_flight` at once), one per watch, one per kept lease.
/// Returns the `Close` acknowledgement to send once the runtime is gone.
async fn serve(
    endpoints: Vec<String>,
    config: EtcdConfig,
    mut commands: tokio::sync::mpsc::Receiver<Command>,
) -> Option<oneshot::Sender<()>> {
    let options = ec::ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_keep_alive(config.keep_alive_interval, config.keep_alive_timeout)
        .with_keep_alive_while_idle(true);
    let mut clients = Vec::with_capacity(endpoints.len());
    for endpoint in &endpoints {
        match ec::Client::connect([endpoint], Some(options.clone())).await {
            Ok(client) => clients.push(client),
            Err(e) => {
                let reason = format!("cannot set up the etcd client for {endpoint}: {e}");
                while let Some(command) = commands.recv().await {
                    if let Command::Close { done } = command {
                        return Some(done);
                    }
                    command.fail(EtcdError::Config(reason.clone()));
                }
                return None;
            }
        }
    }
    let client = Endpoints {
        urls: Arc::new(endpoints),
        clients: Arc::new(clients),
        current: Arc::new(AtomicUsize::new(0)),
        timeout: config.request_timeout,
    };
    let permits = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut keepers: HashMap<i64, tokio::sync::mpsc::UnboundedSender<Reply<i64>>> = HashMap::new();
    while let Some(command) = commands.recv().await {
        match command {
            Command::Close { done } => return Some(done),
            Command::LeaseKeepAlive { id, reply } => {
                keepers.retain(|_, k| !k.is_closed());
                let mut reply = reply;
                for _ in 0..2 {
                    let keeper = keepers.entry(id).or_insert_with(|| {
                        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                        tokio::spawn(keep_lease(client.clone(), id, rx));
                        tx
                    });
                    match keeper.send(reply) {
                        Ok(()) => break,
                        // The lease's task ended meanwhile: start another and hand it this refresh.
                        Err(back) => {
                            keepers.remove(&id);
                            reply = back.0;
                        }
                    }
                }
            }
            Command::Watch {
                key,
                range_end,
                start_revision,
                reply,
            } => {
                let watch = open_watch(
                    client.clone(),
                    key,
                    range_end,
                    start_revision,
                    config.watch_buffer.max(1),
                );
                tokio::spawn(async move {
                    match watch.await {
                        Ok((opened, pump)) => {
                            if reply.send(Ok(opened)).is_ok() {
                                pump.run().await;
                            }
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                });
            }
            command => {
                if let Command::LeaseRevoke { id, .. } = &command {
                    keepers.remove(id);
                }
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    command.fail(EtcdError::Unavailable(
                        "the etcd control plane has stopped".into(),
                    ));
                    continue;
                };
                let client = client.clone();
                tokio::spawn(async move {
                    unary(&client, command).await;
                    drop(permit);
                });
            }
        }
    }
    None
}

impl Command {
    /// Answers the command with `error` (whatever it asked for).
    fn fail(self, error: EtcdError) {
        let _ = match self {
            Command::Range { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::Put { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::Delete { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::Txn { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::Compact { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::LeaseGrant { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::LeaseKeepAlive { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::LeaseRevoke { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::Watch { reply, .. } => reply.send(Err(error)).map_err(drop),
            Command::Close { done } => done.send(()).map_err(drop),
        };
    }
}

/// The endpoints' clients (one each, so that failover is in order and explicit), tried from the last one that
/// answered.
#[derive(Clone)]
struct Endpoints {
    urls: Arc<Vec<String>>,
    clients: Arc<Vec<ec::Client>>,
    current: Arc<AtomicUsize>,
    /// Per attempt.
    timeout: Duration,
}

impl Endpoints {
    /// Runs `call` against each endpoint in turn, from the current one, until one answers. A call moves to the
    /// next endpoint when the connection could not be made (the request never left, so writes may move too);
    /// reads also move on when the endpoint is unavailable or silent. A write that got no answer is `Transport`.
    async fn call<T, F, Fut>(&self, write: bool, mut call: F) -> Result<T, EtcdError>
    where
        F: FnMut(ec::Client) -> Fut,
        Fut: Future<Output = Result<T, ec::Error>>,
    {
        let n = self.clients.len();
        let start = self.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..n {
            let at = (start + i) % n;
            let url = &self.urls[at];
            let error =
                match tokio::time::timeout(self.timeout, call(self.clients[at].clone())).await {
                    Ok(Ok(answer)) => {
                        self.current.store(at, Ordering::Relaxed);
                        return Ok(answer);
                    }
                    Ok(Err(e)) if never_sent(&e) || (!write && unavailable(&e)) => e.to_string(),
                    Ok(Err(e)) => return Err(from_client(e, url, write)),
                    Err(_) if !write => format!("no answer within {:?}", self.timeout),
                    Err(_) => {
                        return Err(EtcdError::Transport(format!(
                            "{url}: no answer within {:?}",
                            self.timeout
                        )))
                    }
                };
            failures.push(format!("{url}: {error}"));
        }
        Err(EtcdError::Unavailable(failures.join("; ")))
    }
}

/// The connection could not be made: the request never left.
fn never_sent(e: &ec::Error) -> bool {
    let ec::Error::GRpcStatus(status) = e else {
        return matches!(e, ec::Error::TransportError(_));
    };
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// The endpoint cannot serve now (down, no leader, stopping): another one may.
fn unavailable(e: &ec::Error) -> bool {
    match e {
        ec::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
        ),
        ec::Error::TransportError(_) | ec::Error::IoError(_) => true,
        _ => false,
    }
}

fn from_client(e: ec::Error, url: &str, write: bool) -> EtcdError {
    let lost = |what: String| {
        let what = format!("{url}: {what}");
        if write {
            EtcdError::Transport(what)
        } else {
            EtcdError::Unavailable(what)
        }
    };
    match e {
        ec::Error::GRpcStatus(status) => {
            let message = status.message().to_string();
            match status.code() {
                Code::NotFound if message.contains("lease not found") => {
                    EtcdError::LeaseNotFound(0)
                }
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                    lost(format!("{message} ({:?})", status.code()))
                }
                code => EtcdError::Server {
                    code: code as i32,
                    message,
                },
            }
        }
        ec::Error::LeaseKeepAliveError(m) if m.contains("lease not found") => {
            EtcdError::LeaseNotFound(0)
        }
        ec::Error::InvalidArgs(m) | ec::Error::EndpointError(m) => EtcdError::Config(m),
        ec::Error::InvalidUri(e) => EtcdError::Config(e.to_string()),
        other => lost(other.to_string()),
    }
}

/// Fills in the lease id of a `LeaseNotFound` (the client's errors do not carry it).
fn for_lease(e: EtcdError, id: i64) -> EtcdError {
    match e {
        EtcdError::LeaseNotFound(_) => EtcdError::LeaseNotFound(id),
        other => other,
    }
}

fn header_revision(header: Option<&ec::ResponseHeader>) -> i64 {
    header.map_or(0, ec::ResponseHeader::revision)
}

fn key_value(kv: &ec::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn range_response(r: &ec::GetResponse) -> RangeResponse {
    RangeResponse {
        revision: header_revision(r.header()),
        kvs: r.kvs().iter().map(key_value).collect(),
        count: r.count(),
        more: r.more(),
    }
}

fn delete_response(r: &ec::DeleteResponse) -> DeleteResponse {
    DeleteResponse {
        revision: header_revision(r.header()),
        deleted: r.deleted(),
    }
}

fn get_options(range_end: Option<Vec<u8>>) -> Option<ec::GetOptions> {
    range_end.map(|end| ec::GetOptions::new().with_range(end))
}

fn delete_options(range_end: Option<Vec<u8>>) -> Option<ec::DeleteOptions> {
    range_end.map(|end| ec::DeleteOptions::new().with_range(end))
}

fn put_options(lease: Option<i64>) -> Option<ec::PutOptions> {
    lease.map(|id| ec::PutOptions::new().with_lease(id))
}

fn compare(c: Compare) -> ec::Compare {
    let op = match c.op {
        CompareOp::Equal => ec::CompareOp::Equal,
        CompareOp::Greater => ec::CompareOp::Greater,
        CompareOp::Less => ec::CompareOp::Less,
        CompareOp::NotEqual => ec::CompareOp::NotEqual,
    };
    match c.target {
        CompareTarget::Version(v) => ec::Compare::version(c.key, op, v),
        CompareTarget::CreateRevision(v) => ec::Compare::create_revision(c.key, op, v),
        CompareTarget::ModRevision(v) => ec::Compare::mod_revision(c.key, op, v),
        CompareTarget::Value(v) => ec::Compare::value(c.key, op, v),
        CompareTarget::Lease(v) => ec::Compare::lease(c.key, op, v),
    }
}

fn txn_op(op: TxnOp) -> ec::TxnOp {
    match op {
        TxnOp::Put { key, value, lease } => ec::TxnOp::put(key, value, put_options(lease)),
        TxnOp::Range { key, range_end } => ec::TxnOp::get(key, get_options(range_end)),
        TxnOp::Delete { key, range_end } => ec::TxnOp::delete(key, delete_options(range_end)),
    }
}

fn txn_response(t: &ec::TxnResponse) -> Result<TxnResponse, EtcdError> {
    let responses = t
        .op_responses()
        .iter()
        .map(|r| match r {
            ec::TxnOpResponse::Put(p) => Ok(TxnOpResponse::Put {
                revision: header_revision(p.header()),
            }),
            ec::TxnOpResponse::Get(g) => Ok(TxnOpResponse::Range(range_response(g))),
            ec::TxnOpResponse::Delete(d) => Ok(TxnOpResponse::Delete(delete_response(d))),
            ec::TxnOpResponse::Txn(_) => Err(EtcdError::Decode("a nested txn answer".into())),
        })
        .collect::<Result<_, _>>()?;
    Ok(TxnResponse {
        // Put responses inside a txn carry no header of their own on some etcd versions: the txn's is the one.
        revision: header_revision(t.header()),
        succeeded: t.succeeded(),
        responses,
    })
}

/// One unary call, answered on its reply.
async fn unary(eps: &Endpoints, command: Command) {
    match command {
        Command::Range {
            key,
            range_end,
            reply,
        } => {
            let r = eps
                .call(false, |mut c| {
                    let (key, options) = (key.clone(), get_options(range_end.clone()));
                    async move { c.get(key, options).await }
                })
                .await;
            let _ = reply.send(r.map(|r| range_response(&r)));
        }
        Command::Put {
            key,
            value,
            lease,
            reply,
        } => {
            let r = eps
                .call(true, |mut c| {
                    let (key, value) = (key.clone(), value.clone());
                    async move { c.put(key, value, put_options(lease)).await }
                })
                .await;
            let r = r.map(|r| header_revision(r.header()));
            let _ = reply.send(r.map_err(|e| for_lease(e, lease.unwrap_or(0))));
        }
        Command::Delete {
            key,
            range_end,
            reply,
        } => {
            let r = eps
                .call(true, |mut c| {
                    let (key, options) = (key.clone(), delete_options(range_end.clone()));
                    async move { c.delete(key, options).await }
                })
                .await;
            let _ = reply.send(r.map(|r| delete_response(&r)));
        }
        Command::Txn {
            compares,
            success,
            failure,
            reply,
        } => {
            let write = success
                .iter()
                .chain(&failure)
                .any(|op| !matches!(op, TxnOp::Range { .. }));
            let txn = ec::Txn::new()
                .when(compares.into_iter().map(compare).collect::<Vec<_>>())
                .and_then(success.into_iter().map(txn_op).collect::<Vec<_>>())
                .or_else(failure.into_iter().map(txn_op).collect::<Vec<_>>());
            let r = eps
                .call(write, |mut c| {
                    let txn = txn.clone();
                    async move { c.txn(txn).await }
                })
                .await;
            let _ = reply.send(r.and_then(|t| txn_response(&t)));
        }
        Command::Compact {
            revision,
            physical,
            reply,
        } => {
            let r = eps
                .call(true, |mut c| async move {
                    let options = physical.then(|| ec::CompactionOptions::new().with_physical());
                    c.compact(revision, options).await
                })
                .await;
            let _ = reply.send(r.map(drop));
        }
        Command::LeaseGrant { ttl_s, reply } => {
            let r = eps
                .call(
                    true,
                    |mut c| async move { c.lease_grant(ttl_s, None).await },
                )
                .await;
            let _ = reply.send(r.and_then(|g| {
                if !g.error().is_empty() {
                    Err(EtcdError::Server {
                        code: 0,
                        message: g.error().to_string(),
                    })
                } else if g.id() == 0 {
                    Err(EtcdError::Decode("lease grant without an id".into()))
                } else {
                    Ok(g.id())
                }
            }));
        }
        Command::LeaseRevoke { id, reply } => {
            let r = eps
                .call(true, |mut c| async move { c.lease_revoke(id).await })
                .await;
            let _ = reply.send(r.map(drop).map_err(|e| for_lease(e, id)));
        }
        other => other.fail(EtcdError::Config("not a unary call".into())),
    }
}

/// Keeps one lease's keep-alive stream and answers refreshes over it, one at a time, in order. Ends when etcd says
/// the lease is gone or nobody asks any more (the entry was removed: revoked, or the thread stopped).
async fn keep_lease(
    eps: Endpoints,
    id: i64,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<Reply<i64>>,
) {
    let mut stream: Option<(ec::LeaseKeeper, ec::LeaseKeepAliveStream)> = None;
    while let Some(reply) = requests.recv().await {
        let r = refresh(&eps, id, &mut stream)
            .await
            .map_err(|e| for_lease(e, id))
            .and_then(|ttl| {
                if ttl > 0 {
                    Ok(ttl)
                } else {
                    Err(EtcdError::LeaseNotFound(id))
                }
            });
        if r.is_err() {
            // A broken or timed-out stream may hold a late answer: open a fresh one next time.
            stream = None;
        }
        let gone = matches!(r, Err(EtcdError::LeaseNotFound(_)));
        let _ = reply.send(r);
        if gone {
            return;
        }
    }
}

/// One refresh: opens the stream if needed (with failover; opening sends a first keep-alive and reads its answer,
/// "lease not found" if there is none), sends a keep-alive, reads its answer's TTL (0: no such lease).
async fn refresh(
    eps: &Endpoints,
    id: i64,
    stream: &mut Option<(ec::LeaseKeeper, ec::LeaseKeepAliveStream)>,
) -> Result<i64, EtcdError> {
    let (keeper, answers) = match stream {
        Some(open) => open,
        None => stream.insert(
            eps.call(false, |mut c| async move { c.lease_keep_alive(id).await })
                .await?,
        ),
    };
    let answer = async {
        keeper.keep_alive().await?;
        answers.message().await
    };
    match tokio::time::timeout(eps.timeout, answer).await {
        Ok(Ok(Some(answer))) => Ok(answer.ttl()),
        Ok(Ok(None)) => Err(EtcdError::Unavailable("the keep-alive stream ended".into())),
        Ok(Err(e)) => Err(from_client(e, "keep-alive stream", false)),
        Err(_) => Err(EtcdError::Unavailable(format!(
            "no keep-alive answer within {:?}",
            eps.timeout
        ))),
    }
}

/// A watch's first message read (within `timeout`): the stream, and what the message said.
struct Pump {
    stream: ec::WatchStream,
    /// Events or an end already in the `created` message.
    first: Option<Result<WatchBatch, EtcdError>>,
    batches: mpsc::Sender<Result<WatchBatch, EtcdError>>,
    cancel: oneshot::Receiver<()>,
}

/// Opens a watch (with failover) and reads its `created` message; on success, what core 0 gets and the pump that
/// feeds it.
async fn open_watch(
    eps: Endpoints,
    key: Vec<u8>,
    range_end: Option<Vec<u8>>,
    start_revision: i64,
    buffer: usize,
) -> Result<(Opened, Pump), EtcdError> {
    let mut options = ec::WatchOptions::new();
    if let Some(end) = range_end {
        options = options.with_range(end);
    }
    if start_revision > 0 {
        options = options.with_start_revision(start_revision);
    }
    let (stream, first) = eps
        .call(false, |mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move {
                let mut stream = c.watch(key, Some(options)).await?;
                let first = stream.message().await?;
                Ok((stream, first))
            }
        })
        .await?;
    let first = first.ok_or(EtcdError::WatchClosed)?;
    if !first.created() {
        return Err(EtcdError::Decode(
            "the first watch message is not `created`".into(),
        ));
    }
    let (tx, rx) = mpsc::channel(buffer);
    let (cancel_tx, cancel_rx) = oneshot::channel();
    Ok((
        Opened {
            created_revision: header_revision(first.header()),
            batches: rx,
            cancel: cancel_tx,
        },
        Pump {
            stream,
            first: interpret(&first).transpose(),
            batches: tx,
            cancel: cancel_rx,
        },
    ))
}

impl Pump {
    /// Forwards batches until an error (sent as the last item), the stream's end, or core 0 dropping its end.
    /// The bounded channel makes a slow core 0 slow the stream down instead of buffering without limit.
    async fn run(mut self) {
        let mut next = self.first.take();
        loop {
            let item = match next.take() {
                Some(item) => item,
                None => {
                    let message = tokio::select! {
                        _ = &mut self.cancel => return,
                        m = self.stream.message() => m,
                    };
                    match message {
                        Ok(Some(m)) => match interpret(&m) {
                            Ok(None) => continue,
                            Ok(Some(batch)) => Ok(batch),
                            Err(e) => Err(e),
                        },
                        Ok(None) => Err(EtcdError::WatchClosed),
                        Err(e) => Err(from_client(e, "watch stream", false)),
                    }
                }
            };
            let last = item.is_err();
            let ready = tokio::select! {
                _ = &mut self.cancel => return,
                r = std::future::poll_fn(|cx| self.batches.poll_ready(cx)) => r,
            };
            if ready.is_err() || self.batches.start_send(item).is_err() || last {
                return;
            }
        }
    }
}

/// A batch, an error, or nothing worth reporting (created and progress messages).
fn interpret(m: &ec::WatchResponse) -> Result<Option<WatchBatch>, EtcdError> {
    if m.compact_revision() > 0 {
        return Err(EtcdError::Compacted {
            compact_revision: m.compact_revision(),
        });
    }
    if m.canceled() {
        return Err(EtcdError::WatchCanceled(m.cancel_reason().to_string()));
    }
    if m.events().is_empty() {
        return Ok(None);
    }
    let events = m
        .events()
        .iter()
        .map(|e| {
            let kind = match e.event_type() {
                ec::EventType::Put => EventKind::Put,
                ec::EventType::Delete => EventKind::Delete,
            };
            let kv = e
                .kv()
                .map(key_value)
                .ok_or_else(|| EtcdError::Decode("a watch event without a key".into()))?;
            Ok(Event { kind, kv })
        })
        .collect::<Result<Vec<_>, EtcdError>>()?;
    Ok(Some(WatchBatch {
        revision: header_revision(m.header()),
        events,
    }))
}
