//! Cluster mode support: the etcd metastore client, and node RPC between brokers.
//!
//! `http_client` is a minimal HTTP/1.1 client on glommio sockets (keep-alive reuse, `Content-Length` and chunked
//! bodies, a streaming mode that yields whole JSON objects, timeouts and size limits). `etcd` speaks etcd v3's JSON
//! gRPC-gateway (`/v3/kv/*`, `/v3/lease/*`, `/v3/watch`) over it, with endpoint failover. No tokio, no gRPC: every
//! call runs on the calling glommio executor. `rpc` carries the operation layer's requests to owners on other nodes.

pub mod etcd;
pub mod http_client;
pub mod rpc;
