//! The front: what the core that took a client's request does for it. It resolves partitions (a key's, a
//! round-robin one, the partitions of a batch), splits a request by owner, sends each part through the `Router`,
//! merges the answers in request order, and for a queue-style consume gathers from this core, then the others, then
//! parks. One `Front` per core; it holds no state of its own beyond what the engine keeps for parked consumers.

pub mod admin;
pub mod consume;
pub mod mover;
pub mod produce;
pub mod quorum;
pub mod redrive;
pub mod replicate;
pub mod round;
pub mod settle;

use crate::engine::Engine;
use crate::transport::Router;
use std::rc::Rc;

/// One core's front.
pub struct Front {
    router: Rc<Router>,
}

impl Front {
    pub fn new(router: Rc<Router>) -> Rc<Front> {
        Rc::new(Front { router })
    }

    pub fn engine(&self) -> &Rc<Engine> {
        self.router.engine()
    }

    pub fn router(&self) -> &Rc<Router> {
        &self.router
    }
}
