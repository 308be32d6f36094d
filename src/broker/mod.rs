//! The broker: topics, partition ownership, and the operations the HTTP edge calls, routed to the owning core.

pub mod command;
pub mod core;
pub mod error;
pub mod mesh;
pub mod metrics;
pub mod router;
pub mod timers;
pub mod topic;
