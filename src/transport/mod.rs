//! Transports: how a request reaches the owner that applies it. A direct call on this core; the core-to-core mesh
//! (`mesh`) for another core of this node. Every path ends in `ops::apply` on the owner, and the reply channel
//! lives in the transport's envelope, never in the request. The `Router` picks the path from a `Location`; the
//! engine reaches other cores through the `Peers` implemented here (admin steps, wake-up signals).

pub mod mesh;

use crate::engine::placement::Location;
use crate::engine::{AdminStep, Engine, EngineError, EngineResult, Peers, Signal};
use crate::ops::{self, OpError, OpResult, Reply, Request};
use futures_channel::oneshot;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

/// A request on its way to another core, with the channel its reply goes back on (none for one-way signals).
pub struct Envelope {
    pub request: Request,
    pub reply: Option<oneshot::Sender<OpResult<Reply>>>,
}

/// A way to hand envelopes to the other cores of this node without waiting: a full channel refuses (the caller
/// answers 503 or retries), it never blocks the sender.
pub trait CoreLink {
    /// Sends to `core`; false (and the envelope dropped) if it cannot be taken now.
    fn send(&self, core: usize, envelope: Envelope) -> bool;
}

/// A way to reach the owners on other nodes (cluster mode): node RPC, implemented by the cluster layer. The link
/// answers `PartitionUnavailable` when the node cannot be reached or does not answer in time.
pub trait NodeLink {
    fn call(
        &self,
        to: Location,
        request: Request,
    ) -> Pin<Box<dyn Future<Output = OpResult<Reply>>>>;
    /// Sends a one-way signal to a core of another node; false when it cannot be sent now.
    fn signal(&self, to: Location, signal: Signal) -> bool;
}

/// Applies an envelope that arrived from another core, on this core: one-way signals at once (in arrival order),
/// requests as their own tasks (a long-poll must not block the pump). A reply that cannot be delivered (the asker
/// went away) has its leases released.
pub fn serve_envelope(engine: &Rc<Engine>, envelope: Envelope) {
    let Envelope { request, reply } = envelope;
    if request.is_signal() {
        if let Request::Signal(signal) = request {
            engine.on_signal(signal);
        }
        return;
    }
    let engine = engine.clone();
    glommio::spawn_local(async move {
        let key = ops::probe_key(&request);
        let result = ops::apply(&engine, request).await;
        if let Some(reply) = reply {
            if let Err(Ok(undelivered)) = reply.send(result) {
                ops::undeliverable(&engine, key, undelivered).await;
            }
        }
    })
    .detach();
}

/// Routes requests from this core to their owners.
pub struct Router {
    engine: Rc<Engine>,
    link: Rc<dyn CoreLink>,
    /// Cluster mode: the other nodes.
    nodes: std::cell::RefCell<Option<Rc<dyn NodeLink>>>,
}

impl Router {
    pub fn new(engine: Rc<Engine>, link: Rc<dyn CoreLink>) -> Rc<Router> {
        Rc::new(Router {
            engine,
            link,
            nodes: std::cell::RefCell::new(None),
        })
    }

    /// Cluster mode: wires node RPC (set once, before serving).
    pub fn set_node_link(&self, link: Rc<dyn NodeLink>) {
        *self.nodes.borrow_mut() = Some(link);
    }

    pub fn engine(&self) -> &Rc<Engine> {
        &self.engine
    }

    /// This node's core `core`.
    pub fn core(&self, core: usize) -> Location {
        Location {
            node: self.engine.node(),
            core: core as u32,
        }
    }

    /// Sends `request` to the owner at `to` and awaits its reply.
    pub async fn call(&self, to: Location, request: Request) -> OpResult<Reply> {
        if to.node != self.engine.node() {
            let link = self.nodes.borrow().clone();
            let Some(link) = link else {
                return Err(OpError::PartitionUnavailable(format!(
                    "node {} is not reachable from this node",
                    to.node
                )));
            };
            if !self.engine.node_alive(to.node) {
                return Err(OpError::PartitionUnavailable(format!(
                    "node {} is down (its metastore session lapsed)",
                    self.engine
                        .node_id(to.node)
                        .unwrap_or_else(|| to.node.to_string())
                )));
            }
            return link.call(to, request).await;
        }
        if self.engine.clustered()
            && !self.engine.node_alive(to.node)
            && matches!(
                request,
                Request::Produce(_) | Request::Probe(_) | Request::Settle(_) | Request::Replay(_)
            )
        {
            // Fenced: this node's session lapsed, so others may count it dead; it serves its partitions again
            // once it has registered again.
            return Err(OpError::PartitionUnavailable(
                "this node lost its metastore session; it serves its partitions again once it re-registers".into(),
            ));
        }
        if to.core as usize == self.engine.id() {
            return ops::apply(&self.engine, request).await;
        }
        let (tx, rx) = oneshot::channel();
        let envelope = Envelope {
            request,
            reply: Some(tx),
        };
        if !self.link.send(to.core as usize, envelope) {
            let m = self.engine.metrics();
            m.mesh_full.set(m.mesh_full.get() + 1);
            return Err(EngineError::Overloaded.into());
        }
        rx.await
            .unwrap_or(Err(OpError::Engine(EngineError::ShuttingDown)))
    }

    /// Sends a one-way signal to a core of this node or (cluster mode) another; false if refused (full channel,
    /// unreachable node).
    pub fn signal_to(&self, to: Location, signal: Signal) -> bool {
        if to.node == self.engine.node() {
            return self.signal(to.core as usize, signal);
        }
        let link = self.nodes.borrow().clone();
        link.is_some_and(|link| self.engine.node_alive(to.node) && link.signal(to, signal))
    }

    /// Sends a one-way signal to another core of this node; false if refused (full channel).
    pub fn signal(&self, core: usize, signal: Signal) -> bool {
        let envelope = Envelope {
            request: Request::Signal(signal),
            reply: None,
        };
        let sent = self.link.send(core, envelope);
        if !sent {
            let m = self.engine.metrics();
            m.mesh_full.set(m.mesh_full.get() + 1);
        }
        sent
    }
}

/// The engine's view of the other cores, over the router.
pub struct RouterPeers(pub std::rc::Weak<Router>);

impl Peers for RouterPeers {
    fn broadcast(
        &self,
        step: AdminStep,
    ) -> Pin<Box<dyn Future<Output = Vec<EngineResult<()>>> + '_>> {
        Box::pin(async move {
            let Some(router) = self.0.upgrade() else {
                return vec![Err(EngineError::ShuttingDown)];
            };
            let me = router.engine.id();
            let calls: Vec<_> = (0..router.engine.cores())
                .filter(|&c| c != me)
                .map(|c| {
                    let router = router.clone();
                    let step = step.clone();
                    async move {
                        match router
                            .call(router.core(c), Request::Admin(Box::new(step)))
                            .await
                        {
                            Ok(_) => Ok(()),
                            Err(OpError::Engine(e)) => Err(e),
                            Err(other) => Err(EngineError::Storage(other.to_string())),
                        }
                    }
                })
                .collect();
            let mut results = Vec::with_capacity(calls.len());
            for call in calls {
                results.push(call.await);
            }
            results
        })
    }

    fn signal(&self, to: Location, signal: Signal) -> bool {
        self.0
            .upgrade()
            .is_some_and(|router| router.signal_to(to, signal))
    }
}

#[cfg(test)]
mod tests;
