//! Test support for the cluster modules: a real single-member etcd on free loopback ports with its own temporary
//! data dir, that a test can kill, restart (on another client port or its old one, keeping its data), pause with
//! SIGSTOP and continue. Tests that need etcd call [`start_etcd`] and return early (printing a skip line) when it is
//! not installed. The etcd process itself is the end-to-end harness's (`tests/common/etcd.rs`), included here.

use glommio::{LocalExecutorBuilder, Placement};

#[path = "../../tests/common/etcd.rs"]
mod etcd;

pub(crate) use etcd::Etcd as EtcdProcess;

/// A TCP port nobody listens on right now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// Starts etcd, or prints a skip line and returns `None` when it is not installed.
pub(crate) fn start_etcd(test: &str) -> Option<EtcdProcess> {
    EtcdProcess::start(test)
}

/// Runs `fut` to completion on a fresh glommio executor on this thread.
pub(crate) fn run<Fut: std::future::Future<Output = ()>>(fut: Fut) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .make()
        .unwrap()
        .run(fut);
}
