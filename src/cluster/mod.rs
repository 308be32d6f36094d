//! Cluster mode support: the etcd client, the metastore built on it, and node RPC between brokers.
//!
//! `etcd` is the metastore's view of etcd: an async facade, used on core 0, over `control_plane`, a thread of its
//! own that runs etcd's gRPC client (`etcd-client`, on a current-thread tokio runtime) so that no etcd work runs on
//! a core that owns partitions; the two talk over channels only. `metastore` keeps the cluster's nodes, topics and
//! placement in etcd (registration and liveness, transactional topic changes, a replica kept current by a watch).
//! `rpc` carries the operation layer's requests to owners on other nodes. `node` wires them into a running server.

mod control_plane;
pub mod election;
pub mod etcd;
pub mod metastore;
pub mod node;
pub mod rpc;
#[cfg(test)]
mod test_etcd;
pub(crate) mod unopened;

use glommio::net::TcpStream;
use std::future::Future;
use std::time::Duration;

/// TCP keepalive: idle time before the first probe, so a dead peer under a quiet connection is noticed.
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// TCP keepalive: time between probes.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// TCP keepalive: unanswered probes before the kernel drops the connection.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// Runs `fut` under a glommio timer; `None` if it did not finish within `dur`.
pub async fn within<F: Future>(dur: Duration, fut: F) -> Option<F::Output> {
    glommio::timer::timeout(dur, async { Ok(fut.await) })
        .await
        .ok()
}

/// Turns on TCP keepalive with the timings above (node RPC's connections).
pub(crate) fn set_tcp_keepalive(stream: &TcpStream) {
    use std::os::fd::{AsRawFd, BorrowedFd};
    // SAFETY: the descriptor belongs to `stream`, which is borrowed for longer than `fd` lives.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    let params = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    // Best effort: without it a dead peer is only noticed by the caller's own timeouts.
    let _ = socket2::SockRef::from(&fd).set_tcp_keepalive(&params);
}
