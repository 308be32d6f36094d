//! The HTTP/1.1 edge: connection handling with keep-alive and pipelining (`conn`), request parsing with its limits
//! (`request`), responses (`response`) and routing with the one error → status mapping (`routes`).

pub mod conn;
pub mod reaper;
pub mod request;
pub mod response;
pub mod routes;
pub mod status;
