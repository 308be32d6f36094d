//! berth: a thread-per-core message-queue broker with a leasing consume path.
//!
//! The server library; the command line and the load generator are the binary's (`src/main.rs`, `src/cli/`).
//!
//! Layers, one direction: `server` (executors, listeners, shutdown) → `http` (parse, route, status codes)
//! → `front` (what the core that took a request does for it) → `transport` (the router: a direct call, the mesh)
//! (and `sqs`, the SQS-compatible face, on top of `front`) → `ops` (one file per operation: request, owner-side apply, reply) → `engine` (one core's topics, partitions,
//! parked consumers, timers) → `partition` (log + per-group lease shards + frontier files) → `storage`. `clock`,
//! `config`, `duration` and `join` are leaves every layer may use.

pub mod client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod duration;
pub mod engine;
#[cfg(test)]
mod format_doc;
pub mod front;
pub mod http;
pub mod join;
pub mod ops;
pub mod partition;
pub(crate) mod planted;
pub mod server;
#[cfg(test)]
mod sim;
pub mod sqs;
pub mod storage;
pub mod tls;
pub mod transport;
