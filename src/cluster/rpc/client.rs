//! The client end of node RPC: one per (local core, peer node), living on that core. One persistent connection
//! carries every call, many at once (replies come back in any order, matched by request id). Nothing here waits
//! for room: a full queue refuses the call at once, and while the peer is unreachable calls fail at once; a driver
//! task reconnects in the background with backoff.

use super::frame::{self, FrameReader, Hello, Kind, ReplyBody, Welcome};
use super::{overloaded, unreachable, until_set, RpcConfig, Undelivered, UndeliveredHook};
use crate::cluster::{set_tcp_keepalive, within};
use crate::ops::{self, OpError, OpResult, Reply, Request};
use crate::tls::{self, Stream};
use event_listener::Event;
use futures_channel::oneshot;
use futures_lite::future::or;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::ToSocketAddrs;
use std::rc::Rc;
use std::time::Duration;
use tracing::{debug, warn};

/// A node RPC client for one peer node, on one core. Dropping it closes the connection and fails its calls.
pub struct RpcClient {
    shared: Rc<Shared>,
}

/// Counters of a client, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests (one-way included) queued for the peer.
    pub sent: u64,
    /// Calls refused at once because the outstanding or queued-bytes bound was reached.
    pub refused: u64,
    /// Calls that failed at once because there was no connection (or that lost theirs).
    pub unreachable: u64,
    /// Calls that gave up waiting for their reply.
    pub timeouts: u64,
    /// Replies that came after their caller had gone (given to the undeliverable hook when successful).
    pub late_replies: u64,
    /// Connections established after the first one.
    pub reconnects: u64,
    /// Connection attempts that failed (connect, handshake, refusal).
    pub connect_failures: u64,
}

/// Where the connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Connecting. Calls are queued (to be sent once connected) only during the very first attempt; during a
    /// reconnection they fail at once.
    Connecting {
        queue_calls: bool,
    },
    Up,
    /// The last attempt failed (or the connection was lost): waiting out the backoff.
    Down,
    Closed,
}

/// A call waiting for its reply.
struct Pending {
    /// Gone when the caller stopped waiting.
    reply: oneshot::Sender<OpResult<Reply>>,
    core: u32,
    probe: Option<(String, String)>,
}

struct Shared {
    config: RpcConfig,
    /// `host:port`, resolved at each connection attempt.
    peer_addr: String,
    peer_node: u32,
    link: Cell<Link>,
    /// Notified when `link` changes.
    link_changed: Event,
    pending: RefCell<HashMap<u64, Pending>>,
    /// Encoded frames not yet handed to the socket.
    out: RefCell<Vec<u8>>,
    /// Notified when `out` gets bytes.
    wake_writer: Event,
    next_id: Cell<u64>,
    closed: Cell<bool>,
    close: Event,
    /// Set by [`RpcClient::reconnect_now`]: the backoff under way ends, and the next one starts from the minimum.
    kicked: Cell<bool>,
    kick: Event,
    stats: Cell<ClientStats>,
    undeliverable: RefCell<Option<UndeliveredHook>>,
}

impl RpcClient {
    /// A client for node `peer_node` at `peer_addr` (`host:port`, as the peer publishes its `--peer-listen`). Starts
    /// connecting at once, on this core's executor; calls made meanwhile wait for the first connection.
    pub fn new(peer_addr: impl Into<String>, peer_node: u32, config: RpcConfig) -> RpcClient {
        let shared = Rc::new(Shared {
            config,
            peer_addr: peer_addr.into(),
            peer_node,
            link: Cell::new(Link::Connecting { queue_calls: true }),
            link_changed: Event::new(),
            pending: RefCell::new(HashMap::new()),
            out: RefCell::new(Vec::new()),
            wake_writer: Event::new(),
            next_id: Cell::new(1),
            closed: Cell::new(false),
            close: Event::new(),
            kicked: Cell::new(false),
            kick: Event::new(),
            stats: Cell::new(ClientStats::default()),
            undeliverable: RefCell::new(None),
        });
        glommio::spawn_local(drive(shared.clone())).detach();
        RpcClient { shared }
    }

    /// Sets what is done with successful replies that came after their caller had gone (`Undelivered`): a probe's
    /// leases should be given back to their owner.
    pub fn on_undeliverable(&self, hook: UndeliveredHook) {
        *self.shared.undeliverable.borrow_mut() = Some(hook);
    }

    /// Sends `request` to `core` of the peer and waits for the reply, at most `call_timeout`.
    pub async fn call(&self, core: u32, request: Request) -> OpResult<Reply> {
        self.call_within(core, request, self.shared.config.call_timeout)
            .await
    }

    /// `call` with its own timeout (a long-poll's wait plus a margin, say). Fails at once, without sending, when
    /// the peer is unreachable (`PartitionUnavailable`) or a bound is reached (`Overloaded`). A connection lost
    /// after sending fails the call with `PartitionUnavailable`: the peer may or may not have applied it.
    pub async fn call_within(
        &self,
        core: u32,
        request: Request,
        timeout: Duration,
    ) -> OpResult<Reply> {
        let shared = &self.shared;
        let id = shared.enqueue(Kind::Request, core, &request)?;
        let probe = ops::probe_key(&request);
        let (tx, rx) = oneshot::channel();
        shared.pending.borrow_mut().insert(
            id,
            Pending {
                reply: tx,
                core,
                probe,
            },
        );
        match within(timeout, rx).await {
            Some(Ok(result)) => result,
            Some(Err(oneshot::Canceled)) => Err(unreachable(&shared.peer(), "the client closed")),
            None => {
                shared.bump(|s| s.timeouts += 1);
                Err(OpError::PartitionUnavailable(format!(
                    "{} did not answer within {} ms",
                    shared.peer(),
                    timeout.as_millis()
                )))
            }
        }
    }

    /// Sends a one-way request (a signal) to `core` of the peer; fails at once as `call` does. Delivery is not
    /// confirmed: one sent just before a connection is lost may be lost with it.
    pub fn send_one_way(&self, core: u32, request: Request) -> OpResult<()> {
        self.shared.enqueue(Kind::OneWay, core, &request).map(drop)
    }

    /// True while a connection to the peer is established.
    pub fn is_connected(&self) -> bool {
        self.shared.link.get() == Link::Up
    }

    pub fn stats(&self) -> ClientStats {
        self.shared.stats.get()
    }

    /// The peer is known to be back (it registered again): a backoff under way ends and the client connects at
    /// once, its backoff starting again from `reconnect_backoff_min`. Nothing happens while connected.
    pub fn reconnect_now(&self) {
        if self.shared.link.get() != Link::Up {
            self.shared.kicked.set(true);
            self.shared.kick.notify(usize::MAX);
        }
    }

    /// Closes the connection; calls outstanding fail, later ones fail at once.
    pub fn close(&self) {
        let shared = &self.shared;
        shared.closed.set(true);
        shared.set_link(Link::Closed);
        shared.close.notify(usize::MAX);
    }
}

impl Drop for RpcClient {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    /// The peer as messages name it: `node n3` (its id), or `node 2` (its index) when the id is not known.
    fn peer(&self) -> String {
        if self.config.peer_name.is_empty() {
            format!("node {}", self.peer_node)
        } else {
            format!("node {}", self.config.peer_name)
        }
    }

    fn bump(&self, f: impl FnOnce(&mut ClientStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    fn set_link(&self, link: Link) {
        if self.link.get() != Link::Closed {
            self.link.set(link);
        }
        self.link_changed.notify(usize::MAX);
    }

    /// Encodes a frame for the writer; its request id, or why it cannot be sent now.
    fn enqueue(&self, kind: Kind, core: u32, request: &Request) -> OpResult<u64> {
        match self.link.get() {
            Link::Up | Link::Connecting { queue_calls: true } => {}
            Link::Connecting { queue_calls: false } | Link::Down | Link::Closed => {
                self.bump(|s| s.unreachable += 1);
                let why = match self.link.get() {
                    Link::Closed => "the client is closed",
                    _ => "no connection (reconnecting)",
                };
                return Err(unreachable(&self.peer(), why));
            }
        }
        let config = &self.config;
        let mut out = self.out.borrow_mut();
        if (kind == Kind::Request && self.pending.borrow().len() >= config.max_outstanding)
            || out.len() >= config.max_queued_bytes
        {
            self.bump(|s| s.refused += 1);
            return Err(overloaded());
        }
        let id = self.next_id.get();
        frame::encode(kind, id, &(core, request), config.max_body_bytes, &mut out).map_err(
            |e| {
                OpError::BatchTooLarge(format!(
                    "the request cannot be sent to {}: {e}",
                    self.peer()
                ))
            },
        )?;
        self.next_id.set(id + 1);
        self.bump(|s| s.sent += 1);
        self.wake_writer.notify(1);
        Ok(id)
    }

    /// Hands a reply to its caller, or to the undeliverable hook if the caller has gone.
    fn complete(&self, id: u64, result: ReplyBody) {
        let Some(pending) = self.pending.borrow_mut().remove(&id) else {
            debug!(id, "node RPC: a reply to no outstanding request");
            return;
        };
        let Err(result) = pending.reply.send(result) else {
            return;
        };
        self.bump(|s| s.late_replies += 1);
        let Ok(reply) = result else {
            return;
        };
        let hook = self.undeliverable.borrow().clone();
        if let Some(hook) = hook {
            hook(Undelivered {
                core: pending.core,
                probe: pending.probe,
                reply,
            });
        }
    }

    /// Fails every outstanding call and drops what was not sent: the connection is gone.
    fn fail_all(&self, why: &str) {
        self.out.borrow_mut().clear();
        let pending: Vec<Pending> = self.pending.borrow_mut().drain().map(|(_, p)| p).collect();
        for p in pending {
            if p.reply.send(Err(unreachable(&self.peer(), why))).is_ok() {
                self.bump(|s| s.unreachable += 1);
            }
        }
    }
}

/// The connection's life: connect and greet, serve until it breaks, fail what was outstanding, wait out the
/// backoff, again; until the client is closed.
async fn drive(shared: Rc<Shared>) {
    let config = shared.config.clone();
    let closed = || until_set(&shared.closed, &shared.close);
    let mut backoff = config.reconnect_backoff_min;
    let mut ever_up = false;
    loop {
        let attempt = or(
            async { Some(within(config.connect_timeout, connect(&shared)).await) },
            async {
                closed().await;
                None
            },
        )
        .await;
        let Some(attempt) = attempt else { break };
        let why = match attempt.unwrap_or_else(|| {
            Err(format!(
                "connect and handshake took over {:?}",
                config.connect_timeout
            ))
        }) {
            Ok((stream, frames)) => {
                if ever_up {
                    shared.bump(|s| s.reconnects += 1);
                }
                ever_up = true;
                backoff = config.reconnect_backoff_min;
                shared.set_link(Link::Up);
                let why = serve(&shared, stream, frames).await;
                if shared.closed.get() {
                    break;
                }
                warn!(node = shared.peer_node, "node RPC: connection lost: {why}");
                // Reconnect at once; calls made meanwhile fail rather than wait on an outage.
                shared.set_link(Link::Connecting { queue_calls: false });
                shared.fail_all(&format!("connection lost: {why}"));
                continue;
            }
            Err(why) => why,
        };
        shared.bump(|s| s.connect_failures += 1);
        debug!(node = shared.peer_node, "node RPC: cannot connect: {why}");
        shared.set_link(Link::Down);
        shared.fail_all(&why);
        let slept = or(
            async {
                or(glommio::timer::sleep(backoff), async {
                    until_set(&shared.kicked, &shared.kick).await;
                })
                .await;
                true
            },
            async {
                closed().await;
                false
            },
        )
        .await;
        if !slept {
            break;
        }
        backoff = if shared.kicked.replace(false) {
            debug!(
                node = shared.peer_node,
                "node RPC: the peer registered again: connecting at once"
            );
            config.reconnect_backoff_min
        } else {
            (backoff * 2).min(config.reconnect_backoff_max)
        };
        shared.set_link(Link::Connecting { queue_calls: false });
    }
    shared.set_link(Link::Closed);
    shared.fail_all("the client is closed");
}

/// Connects to the peer and completes the handshake.
async fn connect(shared: &Shared) -> Result<(Stream, FrameReader), String> {
    let addrs: Vec<_> = shared
        .peer_addr
        .as_str()
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", shared.peer_addr))?
        .collect();
    let mut last = format!("{} resolves to no address", shared.peer_addr);
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return greet(shared, stream).await,
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(last)
}

async fn greet(shared: &Shared, tcp: TcpStream) -> Result<(Stream, FrameReader), String> {
    let config = &shared.config;
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_write_timeout(Some(config.write_timeout));
    set_tcp_keepalive(&tcp);
    let mut stream = match &config.tls {
        None => Stream::Plain(tcp),
        Some(tls) => tls::connect(&tls.connect, tls::host_of(&shared.peer_addr), tcp)
            .await
            .map_err(|e| format!("TLS handshake with {}: {e}", shared.peer_addr))?,
    };
    let hello = Hello {
        version: frame::VERSION as u32,
        node: config.node,
        token: config.token.clone().unwrap_or_default(),
    };
    let mut out = Vec::new();
    frame::encode(Kind::Handshake, 0, &hello, config.max_body_bytes, &mut out)
        .map_err(|e| format!("the hello does not encode: {e}"))?;
    async {
        stream.write_all(&out).await?;
        stream.flush().await
    }
    .await
    .map_err(|e| format!("sending the hello failed: {e}"))?;
    let mut frames = FrameReader::new(config.max_body_bytes);
    let answer = match frames.next(&mut stream).await {
        Ok(Some(f)) if f.kind == Kind::Handshake => f,
        Ok(Some(f)) => {
            return Err(format!(
                "the peer answered the hello with a {:?} frame",
                f.kind
            ))
        }
        Ok(None) => return Err("the peer closed the connection during the handshake".into()),
        Err(e) => return Err(format!("malformed handshake answer: {e}")),
    };
    match frame::decode::<Welcome>(&answer.body) {
        Ok(Welcome::Accepted { node }) if node == shared.peer_node => Ok((stream, frames)),
        Ok(Welcome::Accepted { node }) => Err(format!(
            "{} is node {node}, not node {}",
            shared.peer_addr, shared.peer_node
        )),
        Ok(Welcome::Refused { reason }) => Err(format!("the peer refused the handshake: {reason}")),
        Err(e) => Err(format!(
            "the handshake answer (version {}) does not decode: {e}",
            answer.version
        )),
    }
}

/// Runs an established connection until it breaks or the client closes; returns why it ended.
async fn serve(shared: &Shared, stream: Stream, mut frames: FrameReader) -> String {
    let (mut rd, mut wr) = futures_lite::io::split(stream);
    or(
        or(
            read_replies(shared, &mut frames, &mut rd),
            write_requests(shared, &mut wr),
        ),
        async {
            until_set(&shared.closed, &shared.close).await;
            "the client closed".to_string()
        },
    )
    .await
}

async fn read_replies<R: AsyncRead + Unpin>(
    shared: &Shared,
    frames: &mut FrameReader,
    rd: &mut R,
) -> String {
    loop {
        let frame = match frames.next(rd).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return "the peer closed the connection".into(),
            Err(e) => return format!("malformed frame: {e}"),
        };
        if frame.kind != Kind::Reply || frame.version != frame::VERSION {
            return format!(
                "unexpected {:?} frame of version {}",
                frame.kind, frame.version
            );
        }
        match frame::decode::<ReplyBody>(&frame.body) {
            Ok(result) => shared.complete(frame.id, result),
            Err(e) => return format!("a reply does not decode: {e}"),
        }
    }
}

async fn write_requests<W: AsyncWrite + Unpin>(shared: &Shared, wr: &mut W) -> String {
    let mut batch = Vec::new();
    loop {
        loop {
            if !shared.out.borrow().is_empty() {
                break;
            }
            let listener = shared.wake_writer.listen();
            if !shared.out.borrow().is_empty() {
                break;
            }
            listener.await;
        }
        std::mem::swap(&mut batch, &mut *shared.out.borrow_mut());
        if let Err(e) = wr.write_all(&batch).await {
            return format!("writing requests failed: {e}");
        }
        // TLS may hold the last record until flushed (a no-op on a plain socket).
        if let Err(e) = wr.flush().await {
            return format!("writing requests failed: {e}");
        }
        batch.clear();
    }
}
