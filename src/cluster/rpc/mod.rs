//! Node RPC: how a request for an owner on another node gets there. The operation layer's `Request` goes in, tagged
//! with the destination core on the peer; the peer applies it as its own mesh would (the server hands it to a
//! `Handler`, which the node wires to its router) and the `OpResult<Reply>` comes back. The wire format is in
//! `docs/format.md` ("Node RPC"); `frame` implements it.
//!
//! - `RpcServer` (one per core that listens on `--peer-listen`; glommio's `SO_REUSEPORT` spreads the connections):
//!   accepts connections (a cap on those still handshaking, another on peers), checks each one's small, bounded
//!   hello (cluster token, version), runs its requests concurrently and writes replies as they complete, out of
//!   order.
//! - `RpcClient` (one per local core and peer node): one persistent connection with many requests outstanding,
//!   refusing rather than queueing without bound, a per-call timeout, and reconnection with backoff.
//!
//! All state of a server or a client lives on the core that created it (`Rc`/`Cell`, tasks spawned on that
//! executor); other cores reach a peer through their own clients. Bodies are serialised with `postcard`: compact
//! (varints, no field names), `serde`-based, with a written wire specification that stays stable across its 1.x
//! releases, and maintained; `bincode` would do the same job, but its 1.x and 2.x formats differ and its
//! development has stopped.

pub mod client;
pub mod frame;
pub mod server;
#[cfg(test)]
mod tests;

pub use client::{ClientStats, RpcClient};
pub use server::{RpcServer, ServerStats};

use crate::engine::EngineError;
use crate::ops::{OpError, OpResult, Reply, Request};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

/// Tunables of node RPC, for both ends (each field says which end uses it). `Default` gives the stated defaults.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// This node's id: sent in the client's hello, answered in the server's welcome.
    pub node: u32,
    /// Client: the peer's node id as the cluster names it (`n3`), for the messages of its errors; empty: its
    /// index. Default empty.
    pub peer_name: String,
    /// The cluster token (`--auth-token-file`). Server: None accepts any hello. Client: sent in the hello.
    pub token: Option<String>,
    /// Both: largest frame body sent or accepted. Default 64 MiB.
    pub max_body_bytes: usize,
    /// Client: how long `call` waits for its reply. Default 5 s (long-polls pass their own to `call_within`).
    pub call_timeout: Duration,
    /// Client: time for the TCP connect and the handshake together. Default 2 s.
    pub connect_timeout: Duration,
    /// Client: the first wait before reconnecting after a failure; doubles while attempts fail. Default 50 ms.
    pub reconnect_backoff_min: Duration,
    /// Client: the longest wait between reconnection attempts. Default 5 s.
    pub reconnect_backoff_max: Duration,
    /// Client: requests sent and not answered (timed-out ones included, until their reply or the connection's end)
    /// beyond which calls are refused. Default 1024.
    pub max_outstanding: usize,
    /// Client: bytes queued for the socket beyond which calls are refused. Default 64 MiB.
    pub max_queued_bytes: usize,
    /// Both: a write to the socket that makes no progress for this long closes the connection. Default 10 s.
    pub write_timeout: Duration,
    /// Server: time a new connection has to complete its handshake. Default 5 s.
    pub handshake_timeout: Duration,
    /// Server: largest hello body accepted, the frame limit until the handshake completes; a hello header
    /// announcing more closes the connection before any of its body is read (so a cluster token must be shorter).
    /// Default 4096.
    pub max_hello_bytes: usize,
    /// Server: connections still in their handshake beyond which the oldest of them is closed to make room for a
    /// new one (a real peer sends its hello at once, so a flood of silent connections cannot keep it out; at least
    /// 1). Default 64.
    pub max_handshaking: usize,
    /// Server: connections past their handshake (peers) beyond which new ones are closed at once, or refused at
    /// the handshake if the cap filled while theirs ran. Default 256.
    pub max_connections: usize,
    /// Server: requests per connection running or answered but not yet written, beyond which requests are answered
    /// `Overloaded` at once. Default 1024.
    pub max_in_flight_per_connection: usize,
    /// Server: one-way requests queued per connection beyond which they are dropped (and counted). Default 1024.
    pub max_one_way_queued: usize,
    /// Both: TLS (`[cluster] peer_tls_*`): the server completes a TLS handshake before it reads the hello (within
    /// `handshake_timeout`, counted among the connections handshaking), the client before it sends one. Default
    /// none (plain text).
    pub tls: Option<crate::tls::PeerTls>,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            node: 0,
            peer_name: String::new(),
            token: None,
            max_body_bytes: 64 << 20,
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(5),
            max_outstanding: 1024,
            max_queued_bytes: 64 << 20,
            write_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(5),
            max_hello_bytes: 4096,
            max_handshaking: 64,
            max_connections: 256,
            max_in_flight_per_connection: 1024,
            max_one_way_queued: 1024,
            tls: None,
        }
    }
}

/// What a request's handler answers with.
pub type HandlerFuture = Pin<Box<dyn Future<Output = OpResult<Reply>>>>;

/// Applies a request that arrived from node `peer` (as its accepted hello said) for `core` of this node: the
/// server's only link to the engine.
pub type Handler = Rc<dyn Fn(u32, u32, Request) -> HandlerFuture>;

/// A successful reply that never reached whoever asked: a client's call that timed out or was dropped before its
/// reply came, or a server's reply whose connection closed before it was written. A probe's reply carries leases,
/// which the owner must give back (`ops::undeliverable`) or they wait out their visibility.
#[derive(Debug)]
pub struct Undelivered {
    /// The core the request was for (on the server's node).
    pub core: u32,
    /// The (topic, group) of a probe (`ops::probe_key`), to release its leases.
    pub probe: Option<(String, String)>,
    pub reply: Reply,
}

/// Told about every `Undelivered` reply.
pub type UndeliveredHook = Rc<dyn Fn(Undelivered)>;

/// The call could not be made or completed: the peer is unreachable (503 partition_unavailable).
fn unreachable(peer: &str, why: impl std::fmt::Display) -> OpError {
    OpError::PartitionUnavailable(format!("{peer} is unreachable: {why}"))
}

/// A bound was hit; the caller may retry later (503 overloaded).
fn overloaded() -> OpError {
    EngineError::Overloaded.into()
}

/// The cluster token check: constant time over SHA-256 digests, so neither the token's content nor its length
/// leaks through timing (as the HTTP `Authorization` check does).
fn token_matches(want: &str, presented: &str) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let want = Sha256::digest(want.as_bytes());
    let got = Sha256::digest(presented.as_bytes());
    want.ct_eq(&got).into()
}

/// Resolves once `flag` is set; `event` is notified whenever it is.
async fn until_set(flag: &std::cell::Cell<bool>, event: &event_listener::Event) {
    loop {
        if flag.get() {
            return;
        }
        let listener = event.listen();
        if flag.get() {
            return;
        }
        listener.await;
    }
}
