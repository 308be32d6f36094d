//! Cluster mode support: the etcd client, the metastore built on it, and node RPC between brokers.
//!
//! `http_client` is a minimal HTTP/1.1 client on glommio sockets (keep-alive reuse, `Content-Length` and chunked
//! bodies, a streaming mode that yields whole JSON objects, timeouts and size limits). `etcd` speaks etcd v3's JSON
//! gRPC-gateway (`/v3/kv/*`, `/v3/lease/*`, `/v3/watch`) over it, with endpoint failover. No tokio, no gRPC: every
//! call runs on the calling glommio executor. `metastore` keeps the cluster's nodes, topics and placement in etcd
//! (registration and liveness, transactional topic changes, a replica kept current by a watch). `rpc` carries the
//! operation layer's requests to owners on other nodes. `node` wires them into a running server.

pub mod etcd;
pub mod http_client;
pub mod metastore;
pub mod node;
pub mod rpc;
#[cfg(test)]
mod test_etcd;
