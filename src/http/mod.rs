//! The HTTP/1.1 edge: connection handling with keep-alive and pipelining (`conn`), request parsing with its limits
//! (`request`), and the route table (`routes`). Each operation renders its own reply (`ops::<op>::render`, as an
//! `ops::response::Response`); the one error → status mapping is `ops::status`.

pub mod conn;
pub mod reaper;
pub mod request;
pub mod routes;

pub use crate::ops::{response, status};
