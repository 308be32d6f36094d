//! berth: a thread-per-core message-queue broker with a leasing consume path.
//!
//! Layers, one direction: `cli` → `server` (executors, listeners, shutdown) → `http` (parse, route, status codes)
//! → `broker` (topics, ownership, cross-core commands) → `partition` (log + lease shard + frontier) → `storage`.

pub mod bench;
pub mod broker;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod duration;
pub mod http;
pub mod partition;
pub mod server;
pub mod storage;
