//! The server end of node RPC: an accept loop (one cap on connections still handshaking, which evicts the oldest,
//! another on peers) and, per connection, a reader that checks the hello under a small frame limit then starts one
//! task per request, a writer that sends replies in completion order, and a task applying one-way requests in
//! arrival order. Lives on the core that created it; the node runs one per core on `--peer-listen`.

use super::frame::{self, Frame, FrameReader, Hello, Kind, ReplyBody, RequestBody, Welcome};
use super::{
    overloaded, token_matches, until_set, Handler, RpcConfig, Undelivered, UndeliveredHook,
};
use crate::cluster::within;
use crate::ops::{self, OpError, OpResult, Reply};
use crate::tls::{self, Stream};
use event_listener::Event;
use futures_lite::future::or;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::{TcpListener, TcpStream};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::time::Duration;
use tracing::{debug, warn};

/// Replies gathered into one socket write, at most (a single larger reply is written alone). 256 KiB.
const WRITE_BATCH_BYTES: usize = 256 << 10;
/// Pause after a failed accept (out of descriptors, say), so the loop does not spin. 50 ms.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// A node RPC server on one core.
pub struct RpcServer {
    shared: Rc<Shared>,
}

/// Counters of a server, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now, handshaking or past it.
    pub connections_open: u64,
    pub connections_accepted: u64,
    /// Connections closed for the `max_connections` cap on peers: at once, or with a refusal when the cap filled
    /// while their handshake ran (those count in `handshakes_failed` too).
    pub connections_refused: u64,
    /// Connections whose handshake was refused (token, version, the peer cap), whose hello was malformed or over
    /// `max_hello_bytes`, or that never completed it (evicted ones included).
    pub handshakes_failed: u64,
    /// Connections closed in their handshake to make room for a newer one (the `max_handshaking` cap).
    pub handshakes_evicted: u64,
    /// Bytes read from connections before their handshake ended: the hellos, what came in the same reads, and
    /// whatever arrived instead (at most a 24-byte header and `max_hello_bytes` per connection).
    pub handshake_read_bytes: u64,
    /// Requests handed to the handler, one-way ones included.
    pub requests: u64,
    /// Requests answered `Overloaded` (in-flight bound), and one-way requests dropped (their queue was full).
    pub overloaded: u64,
    /// Connections closed for a malformed frame or a protocol violation.
    pub bad_frames: u64,
    /// Successful replies that could not be delivered, given to the undeliverable hook.
    pub undelivered: u64,
}

struct Shared {
    config: RpcConfig,
    handler: Handler,
    undeliverable: RefCell<Option<UndeliveredHook>>,
    /// Bound and not yet handed to the accept loop.
    listener: RefCell<Option<TcpListener>>,
    local_addr: SocketAddr,
    stopping: Cell<bool>,
    stop: Event,
    accepting: Cell<bool>,
    /// Notified when a connection closes or the accept loop ends.
    changed: Event,
    stats: Cell<ServerStats>,
    /// Connections in their handshake by arrival (oldest first), each with what evicts it.
    handshaking: RefCell<BTreeMap<u64, Rc<Eviction>>>,
    /// The arrival number of the next connection accepted.
    next_arrival: Cell<u64>,
    /// Connections past their handshake, held against `max_connections`.
    peers: Cell<usize>,
}

impl Shared {
    fn bump(&self, f: impl FnOnce(&mut ServerStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    fn peers_full(&self) -> bool {
        self.peers.get() >= self.config.max_connections
    }

    /// Hands a reply that cannot be delivered to the hook (which gives a probe's leases back).
    fn give_back(&self, undelivered: Undelivered) {
        self.bump(|s| s.undelivered += 1);
        let hook = self.undeliverable.borrow().clone();
        match hook {
            Some(hook) => hook(undelivered),
            None => debug!(
                core = undelivered.core,
                "node RPC: a reply could not be delivered and no hook takes it"
            ),
        }
    }
}

impl RpcServer {
    /// Binds `addr` now (so `local_addr` is known, port 0 included); serves once `start`ed.
    pub fn bind(
        addr: impl ToSocketAddrs,
        config: RpcConfig,
        handler: Handler,
    ) -> io::Result<RpcServer> {
        let listener = TcpListener::bind(addr).map_err(io::Error::from)?;
        let local_addr = listener.local_addr().map_err(io::Error::from)?;
        Ok(RpcServer {
            shared: Rc::new(Shared {
                config,
                handler,
                undeliverable: RefCell::new(None),
                listener: RefCell::new(Some(listener)),
                local_addr,
                stopping: Cell::new(false),
                stop: Event::new(),
                accepting: Cell::new(false),
                changed: Event::new(),
                stats: Cell::new(ServerStats::default()),
                handshaking: RefCell::new(BTreeMap::new()),
                next_arrival: Cell::new(0),
                peers: Cell::new(0),
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Sets what is done with replies that cannot be delivered (`Undelivered`).
    pub fn on_undeliverable(&self, hook: UndeliveredHook) {
        *self.shared.undeliverable.borrow_mut() = Some(hook);
    }

    /// Starts accepting, on this core's executor. Does nothing the second time, or after `stop`.
    pub fn start(&self) {
        let Some(listener) = self.shared.listener.borrow_mut().take() else {
            return;
        };
        self.shared.accepting.set(true);
        glommio::spawn_local(accept_loop(self.shared.clone(), listener)).detach();
    }

    /// Stops accepting (the port is released), closes every connection, and returns once all are closed. Requests
    /// still running finish; their replies go to the undeliverable hook.
    pub async fn stop(&self) {
        let shared = &self.shared;
        shared.stopping.set(true);
        shared.stop.notify(usize::MAX);
        shared.listener.borrow_mut().take();
        loop {
            let done = || !shared.accepting.get() && shared.stats.get().connections_open == 0;
            if done() {
                return;
            }
            let listener = shared.changed.listen();
            if done() {
                return;
            }
            listener.await;
        }
    }

    pub fn stats(&self) -> ServerStats {
        self.shared.stats.get()
    }
}

impl Drop for RpcServer {
    /// Stops the accept loop and the connections (without waiting for them).
    fn drop(&mut self) {
        self.shared.stopping.set(true);
        self.shared.stop.notify(usize::MAX);
    }
}

async fn accept_loop(shared: Rc<Shared>, listener: TcpListener) {
    let stopped = || until_set(&shared.stopping, &shared.stop);
    loop {
        let accepted = or(async { Some(listener.accept().await) }, async {
            stopped().await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok(stream)) => {
                if shared.peers_full() {
                    shared.bump(|s| s.connections_refused += 1);
                    continue;
                }
                let handshaking = Handshaking::admit(&shared);
                shared.bump(|s| {
                    s.connections_accepted += 1;
                    s.connections_open += 1;
                });
                glommio::spawn_local(serve_connection(shared.clone(), stream, handshaking))
                    .detach();
            }
            Some(Err(e)) => {
                warn!("node RPC: accept failed: {e}");
                or(glommio::timer::sleep(ACCEPT_RETRY), stopped()).await;
            }
        }
    }
    drop(listener);
    shared.accepting.set(false);
    shared.changed.notify(usize::MAX);
}

/// Counts a connection closed, whichever way its task ends.
struct OpenConnection(Rc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.bump(|s| s.connections_open -= 1);
        self.0.changed.notify(usize::MAX);
    }
}

/// Set to close a connection still in its handshake.
#[derive(Default)]
struct Eviction {
    evicted: Cell<bool>,
    event: Event,
}

/// A connection in its handshake: listed in `Shared::handshaking` while this is held.
struct Handshaking {
    shared: Rc<Shared>,
    arrival: u64,
    eviction: Rc<Eviction>,
}

impl Handshaking {
    /// Lists a connection just accepted, first evicting the oldest one still handshaking if `max_handshaking` are.
    /// The oldest, because a real peer sends its hello as soon as it connects: only a connection that has said
    /// nothing useful for a while is left to lose.
    fn admit(shared: &Rc<Shared>) -> Handshaking {
        let arrival = shared.next_arrival.get();
        shared.next_arrival.set(arrival + 1);
        let mut listed = shared.handshaking.borrow_mut();
        while listed.len() >= shared.config.max_handshaking.max(1) {
            let Some((_, oldest)) = listed.pop_first() else {
                break;
            };
            oldest.evicted.set(true);
            oldest.event.notify(usize::MAX);
            shared.bump(|s| s.handshakes_evicted += 1);
        }
        let eviction = Rc::new(Eviction::default());
        listed.insert(arrival, eviction.clone());
        Handshaking {
            shared: shared.clone(),
            arrival,
            eviction,
        }
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.shared.handshaking.borrow_mut().remove(&self.arrival);
    }
}

/// A connection past its handshake, held against `max_connections`.
struct PeerSlot(Rc<Shared>);

impl PeerSlot {
    /// A place for an accepted hello's connection, or why there is none (counted as refused).
    fn admit(shared: &Rc<Shared>) -> Result<PeerSlot, String> {
        if shared.peers_full() {
            shared.bump(|s| s.connections_refused += 1);
            return Err(format!(
                "this node has max_connections ({}) peers already",
                shared.config.max_connections
            ));
        }
        shared.peers.set(shared.peers.get() + 1);
        Ok(PeerSlot(shared.clone()))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        self.0.peers.set(self.0.peers.get() - 1);
    }
}

/// A reply queued for the socket.
struct OutFrame {
    bytes: Vec<u8>,
    /// It answers a request that counts against the in-flight bound until written.
    holds_slot: bool,
    /// For a successful reply: (core, probe key), to give it back if it is never written.
    undelivered: Option<(u32, Option<(String, String)>)>,
}

/// One connection's state shared by its reader, writer and request tasks.
#[derive(Default)]
struct Conn {
    out: RefCell<VecDeque<OutFrame>>,
    /// Notified when `out` gets a frame.
    wake: Event,
    closed: Cell<bool>,
    /// Requests running or answered and not yet written.
    in_flight: Cell<usize>,
}

impl Conn {
    /// Queues the answer to request `id` (or gives a successful one back if the connection is gone).
    fn push(
        &self,
        shared: &Shared,
        id: u64,
        result: OpResult<Reply>,
        origin: (u32, Option<(String, String)>),
        holds_slot: bool,
    ) {
        let (core, probe) = origin;
        if self.closed.get() {
            if let Ok(reply) = result {
                shared.give_back(Undelivered { core, probe, reply });
            }
            return;
        }
        let max = shared.config.max_body_bytes;
        let mut bytes = Vec::new();
        let undelivered = match frame::encode(Kind::Reply, id, &result, max, &mut bytes) {
            Ok(()) => result.is_ok().then_some((core, probe)),
            Err(e) => {
                let refusal: ReplyBody = Err(OpError::BatchTooLarge(format!(
                    "the reply cannot be sent over node RPC: {e}"
                )));
                // Small enough for any sane limit; with an absurd one the caller times out.
                let _ = frame::encode(Kind::Reply, id, &refusal, max, &mut bytes);
                if let Ok(reply) = result {
                    shared.give_back(Undelivered { core, probe, reply });
                }
                None
            }
        };
        self.out.borrow_mut().push_back(OutFrame {
            bytes,
            holds_slot,
            undelivered,
        });
        self.wake.notify(1);
    }
}

async fn serve_connection(shared: Rc<Shared>, tcp: TcpStream, handshaking: Handshaking) {
    let _open = OpenConnection(shared.clone());
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_write_timeout(Some(shared.config.write_timeout));
    // Until the hello is accepted, nothing larger than a hello is read: a stranger costs a few KiB at most.
    let mut frames = FrameReader::new(shared.config.max_hello_bytes);
    let stopped = || async {
        until_set(&shared.stopping, &shared.stop).await;
        "the server is stopping".to_string()
    };

    let eviction = handshaking.eviction.clone();
    let greeted = async {
        let timeout = shared.config.handshake_timeout;
        // The TLS handshake (if any) and the hello share the timeout and the place among connections handshaking.
        let greeting = async {
            let stream = match &shared.config.tls {
                None => Stream::Plain(tcp),
                Some(tls) => tls::accept(&tls.accept, tcp)
                    .await
                    .map_err(|e| format!("TLS handshake failed: {e}"))?,
            };
            let (mut rd, mut wr) = futures_lite::io::split(stream);
            match handshake(&shared, handshaking, &mut frames, &mut rd, &mut wr).await {
                Ok(accepted) => Ok((accepted, rd, wr)),
                Err(why) => {
                    let _ = wr.close().await;
                    Err(why)
                }
            }
        };
        within(timeout, greeting)
            .await
            .unwrap_or_else(|| Err(format!("no hello within {timeout:?}")))
    };
    let evicted = async {
        until_set(&eviction.evicted, &eviction.event).await;
        Err("closed to make room for a newer connection (max_handshaking)".to_string())
    };
    let greeting = or(greeted, or(evicted, async { Err(stopped().await) })).await;
    shared.bump(|s| s.handshake_read_bytes += frames.received());
    let ((peer, _slot), mut rd, mut wr) = match greeting {
        Ok(accepted) => accepted,
        Err(why) => {
            shared.bump(|s| s.handshakes_failed += 1);
            debug!("node RPC: handshake failed: {why}");
            return;
        }
    };
    frames.set_max_body(shared.config.max_body_bytes);

    let conn = Rc::new(Conn::default());
    let (one_way, queue) = local_channel::new_bounded(shared.config.max_one_way_queued.max(1));
    glommio::spawn_local(apply_one_way(shared.clone(), peer, queue)).detach();
    let why = or(
        or(
            read_requests(&shared, peer, &conn, &mut frames, &mut rd, &one_way),
            write_replies(&conn, &mut wr),
        ),
        stopped(),
    )
    .await;
    debug!(peer, "node RPC: connection closed: {why}");
    conn.closed.set(true);
    // Replies never handed to the socket certainly did not arrive: give them back. (Those in a failed write may
    // have; their leases wait out their visibility rather than risk being released under a consumer.)
    let unsent: Vec<OutFrame> = conn.out.borrow_mut().drain(..).collect();
    for f in unsent {
        let Some((core, probe)) = f.undelivered else {
            continue;
        };
        let body = f.bytes.get(frame::HEADER_LEN..).unwrap_or_default();
        if let Ok(Ok(reply)) = frame::decode::<ReplyBody>(body) {
            shared.give_back(Undelivered { core, probe, reply });
        }
    }
}

/// Reads the hello and answers it: the peer's node id and its place among the peers, or why it was refused (after
/// telling it, unless the hello was malformed or over the limit).
async fn handshake<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    shared: &Rc<Shared>,
    handshaking: Handshaking,
    frames: &mut FrameReader,
    rd: &mut R,
    wr: &mut W,
) -> Result<(u32, PeerSlot), String> {
    let frame = match frames.next(rd).await {
        Ok(Some(frame)) => frame,
        Ok(None) => return Err("closed before its hello".into()),
        Err(e) => return Err(format!("malformed hello: {e}")),
    };
    let verdict = check_hello(&shared.config, &frame)
        .and_then(|node| PeerSlot::admit(shared).map(|slot| (node, slot)));
    // Judged: no longer one of the connections a newcomer may evict, whatever the verdict.
    drop(handshaking);
    let welcome = match &verdict {
        Ok(_) => Welcome::Accepted {
            node: shared.config.node,
        },
        Err(reason) => Welcome::Refused {
            reason: reason.clone(),
        },
    };
    let mut out = Vec::new();
    frame::encode(Kind::Handshake, frame.id, &welcome, usize::MAX, &mut out)
        .map_err(|e| format!("the welcome does not encode: {e}"))?;
    async {
        wr.write_all(&out).await?;
        wr.flush().await
    }
    .await
    .map_err(|e| format!("writing the welcome failed: {e}"))?;
    verdict
}

fn check_hello(config: &RpcConfig, frame: &Frame) -> Result<u32, String> {
    let unsupported = |v: u32| {
        format!(
            "protocol version {v} is not supported (this node speaks {})",
            frame::VERSION
        )
    };
    if frame.kind != Kind::Handshake {
        return Err("the first frame must be a hello".into());
    }
    if frame.version != frame::VERSION {
        return Err(unsupported(frame.version as u32));
    }
    let hello: Hello =
        frame::decode(&frame.body).map_err(|e| format!("the hello does not decode: {e}"))?;
    if hello.version != frame::VERSION as u32 {
        return Err(unsupported(hello.version));
    }
    if let Some(token) = &config.token {
        if !token_matches(token, &hello.token) {
            return Err("bad cluster token".into());
        }
    }
    Ok(hello.node)
}

/// Reads requests until the stream ends or breaks; returns why.
async fn read_requests<R: AsyncRead + Unpin>(
    shared: &Rc<Shared>,
    peer: u32,
    conn: &Rc<Conn>,
    frames: &mut FrameReader,
    rd: &mut R,
    one_way: &LocalSender<RequestBody>,
) -> String {
    let config = &shared.config;
    loop {
        let frame = match frames.next(rd).await {
            Ok(Some(frame)) => frame,
            // The peer is gone (RpcClient never half-closes): what it still waits for is given back at the close.
            Ok(None) => return "the peer closed the connection".into(),
            Err(e) => {
                shared.bump(|s| s.bad_frames += 1);
                return format!("malformed frame: {e}");
            }
        };
        if frame.version != frame::VERSION || !matches!(frame.kind, Kind::Request | Kind::OneWay) {
            shared.bump(|s| s.bad_frames += 1);
            return format!(
                "unexpected {:?} frame of version {}",
                frame.kind, frame.version
            );
        }
        if frame.kind == Kind::Request
            && conn.in_flight.get() >= config.max_in_flight_per_connection
        {
            shared.bump(|s| s.overloaded += 1);
            conn.push(shared, frame.id, Err(overloaded()), (0, None), false);
        } else {
            match (frame.kind, frame::decode::<RequestBody>(&frame.body)) {
                (Kind::OneWay, Ok(body)) => match one_way.try_send(body) {
                    Ok(()) => shared.bump(|s| s.requests += 1),
                    Err(_) => shared.bump(|s| s.overloaded += 1),
                },
                (Kind::OneWay, Err(e)) => {
                    debug!("node RPC: a one-way request does not decode: {e}")
                }
                (_, Ok((core, request))) => {
                    shared.bump(|s| s.requests += 1);
                    conn.in_flight.set(conn.in_flight.get() + 1);
                    let (shared, conn, id) = (shared.clone(), conn.clone(), frame.id);
                    glommio::spawn_local(async move {
                        let probe = ops::probe_key(&request);
                        let result = (shared.handler)(peer, core, request).await;
                        conn.push(&shared, id, result, (core, probe), true);
                    })
                    .detach();
                }
                (_, Err(e)) => {
                    let why = format!("node RPC: the request does not decode: {e}");
                    conn.push(
                        shared,
                        frame.id,
                        Err(OpError::InvalidParameter(why)),
                        (0, None),
                        false,
                    );
                }
            }
        }
        // Answers to a peer that does not read pile up only so far (its writes time out meanwhile).
        if conn.out.borrow().len() > 2 * config.max_in_flight_per_connection {
            return "the peer does not read its replies".into();
        }
    }
}

/// Writes queued replies, several per write, until the socket fails; returns why.
async fn write_replies<W: AsyncWrite + Unpin>(conn: &Conn, wr: &mut W) -> String {
    let mut batch = Vec::new();
    loop {
        loop {
            if !conn.out.borrow().is_empty() {
                break;
            }
            let listener = conn.wake.listen();
            if !conn.out.borrow().is_empty() {
                break;
            }
            listener.await;
        }
        let mut slots = 0;
        {
            let mut out = conn.out.borrow_mut();
            while batch.len() < WRITE_BATCH_BYTES {
                let Some(f) = out.pop_front() else {
                    break;
                };
                batch.extend_from_slice(&f.bytes);
                slots += usize::from(f.holds_slot);
            }
        }
        if let Err(e) = wr.write_all(&batch).await {
            return format!("writing replies failed: {e}");
        }
        // TLS may hold the last record until flushed (a no-op on a plain socket).
        if let Err(e) = wr.flush().await {
            return format!("writing replies failed: {e}");
        }
        conn.in_flight.set(conn.in_flight.get() - slots);
        batch.clear();
        if batch.capacity() > 4 * WRITE_BATCH_BYTES {
            batch = Vec::new();
        }
    }
}

/// Applies a connection's one-way requests one at a time, in arrival order, until the connection ends and its
/// queue is drained.
async fn apply_one_way(shared: Rc<Shared>, peer: u32, queue: LocalReceiver<RequestBody>) {
    while let Some((core, request)) = queue.recv().await {
        let probe = ops::probe_key(&request);
        match (shared.handler)(peer, core, request).await {
            Ok(Reply::Done) => {}
            Ok(reply) => shared.give_back(Undelivered { core, probe, reply }),
            Err(e) => debug!(core, "node RPC: a one-way request failed: {e}"),
        }
    }
}
