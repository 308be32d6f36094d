//! The simulated network between nodes, in place of node RPC: every call and every reply is a message that waits a
//! random delay (so messages overtake each other), and is lost when either end is down or the link between them is
//! cut when it is delivered. A lost call or reply fails the call at once (the connection broke), as does a
//! call that gets no answer within `timeout_ms` (a peer paused). Messages to or from a paused node wait until it
//! runs again. One pump delivers them all, a random ready one at a time, so the seed decides every order.

use super::super::world::Tasks;
use super::super::Rng;
use crate::clock::{Clock, ManualClock};
use crate::engine::placement::{Location, NodeIndex};
use crate::engine::Signal;
use crate::ops::params::BatchLimits;
use crate::ops::{validate, OpError, OpResult, Reply, Request};
use crate::transport::{NodeLink, Router};
use event_listener::Event;
use futures_channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

/// A node that runs: its router, the tasks of its process, and which process it is.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) router: Rc<Router>,
    pub(super) tasks: Tasks,
    pub(super) process: u64,
}

enum Body {
    Call(Request, oneshot::Sender<OpResult<Reply>>),
    Reply(OpResult<Reply>, oneshot::Sender<OpResult<Reply>>),
    Signal(Signal),
}

struct Message {
    from: NodeIndex,
    /// The sender's process: a message of a process that died is lost with it.
    process: u64,
    to: Location,
    at_ms: u64,
    body: Body,
}

pub(super) struct NodeNet {
    clock: Rc<ManualClock>,
    rng: RefCell<Rng>,
    nodes: RefCell<BTreeMap<NodeIndex, Endpoint>>,
    cut: RefCell<BTreeSet<(NodeIndex, NodeIndex)>>,
    /// Slow links: the longest extra delay of a message on them, ms (a congested path, retransmissions).
    slow: RefCell<BTreeMap<(NodeIndex, NodeIndex), u64>>,
    paused: RefCell<BTreeSet<NodeIndex>>,
    queue: RefCell<Vec<Message>>,
    arrived: Event,
    /// Longest delay of a message, ms.
    pub(super) max_delay_ms: Cell<u64>,
    /// A call without an answer fails after this, ms (node RPC's `rpc_timeout_ms`).
    pub(super) timeout_ms: u64,
    pub(super) delivered: Cell<u64>,
    pub(super) lost: Cell<u64>,
    limits: BatchLimits,
}

impl NodeNet {
    pub(super) fn new(clock: Rc<ManualClock>, seed: u64, limits: BatchLimits) -> Rc<NodeNet> {
        Rc::new(NodeNet {
            clock,
            rng: RefCell::new(Rng::new(seed ^ 0x6e6f_6465)),
            nodes: RefCell::new(BTreeMap::new()),
            cut: RefCell::new(BTreeSet::new()),
            slow: RefCell::new(BTreeMap::new()),
            paused: RefCell::new(BTreeSet::new()),
            queue: RefCell::new(Vec::new()),
            arrived: Event::new(),
            max_delay_ms: Cell::new(5),
            timeout_ms: 2000,
            delivered: Cell::new(0),
            lost: Cell::new(0),
            limits,
        })
    }

    pub(super) fn attach(&self, node: NodeIndex, endpoint: Endpoint) {
        self.nodes.borrow_mut().insert(node, endpoint);
    }

    pub(super) fn detach(&self, node: NodeIndex) {
        self.nodes.borrow_mut().remove(&node);
    }

    fn process(&self, node: NodeIndex) -> Option<u64> {
        self.nodes.borrow().get(&node).map(|e| e.process)
    }

    pub(super) fn set_cut(&self, a: NodeIndex, b: NodeIndex, cut: bool) {
        let pair = (a.min(b), a.max(b));
        if cut {
            self.cut.borrow_mut().insert(pair);
        } else {
            self.cut.borrow_mut().remove(&pair);
        }
    }

    /// Link a-b delays each message by up to `extra_ms` more (0: no more).
    pub(super) fn set_slow(&self, a: NodeIndex, b: NodeIndex, extra_ms: u64) {
        let pair = (a.min(b), a.max(b));
        if extra_ms == 0 {
            self.slow.borrow_mut().remove(&pair);
        } else {
            self.slow.borrow_mut().insert(pair, extra_ms);
        }
    }

    pub(super) fn heal(&self) {
        self.cut.borrow_mut().clear();
        self.slow.borrow_mut().clear();
        self.paused.borrow_mut().clear();
        self.arrived.notify(1);
    }

    pub(super) fn set_paused(&self, node: NodeIndex, paused: bool) {
        if paused {
            self.paused.borrow_mut().insert(node);
        } else {
            self.paused.borrow_mut().remove(&node);
            self.arrived.notify(1);
        }
    }

    pub(super) fn paused(&self, node: NodeIndex) -> bool {
        self.paused.borrow().contains(&node)
    }

    fn is_cut(&self, a: NodeIndex, b: NodeIndex) -> bool {
        self.cut.borrow().contains(&(a.min(b), a.max(b)))
    }

    /// Messages that could be delivered now (their time come, neither end paused).
    pub(super) fn ready(&self) -> usize {
        let now = self.clock.now_ms();
        let paused = self.paused.borrow();
        self.queue
            .borrow()
            .iter()
            .filter(|m| m.at_ms <= now && !paused.contains(&m.from) && !paused.contains(&m.to.node))
            .count()
    }

    /// The sending side for node `from`'s process `process`.
    pub(super) fn link(self: &Rc<Self>, from: NodeIndex, process: u64) -> Rc<dyn NodeLink> {
        Rc::new(SimNodeLink {
            net: self.clone(),
            from,
            process,
        })
    }

    fn send(&self, from: NodeIndex, process: u64, to: Location, body: Body) {
        let extra = self
            .slow
            .borrow()
            .get(&(from.min(to.node), from.max(to.node)))
            .copied()
            .unwrap_or(0);
        let delay = {
            let mut rng = self.rng.borrow_mut();
            rng.below(self.max_delay_ms.get() + 1) + rng.below(extra + 1)
        };
        self.queue.borrow_mut().push(Message {
            from,
            process,
            to,
            at_ms: self.clock.now_ms() + delay,
            body,
        });
        self.arrived.notify(1);
    }

    /// Delivers messages for as long as the simulation runs.
    pub(super) async fn pump(self: Rc<Self>) {
        loop {
            let listener = self.arrived.listen();
            let next = {
                let now = self.clock.now_ms();
                let paused = self.paused.borrow();
                let mut queue = self.queue.borrow_mut();
                let ready: Vec<usize> = (0..queue.len())
                    .filter(|&i| {
                        let m = &queue[i];
                        m.at_ms <= now && !paused.contains(&m.from) && !paused.contains(&m.to.node)
                    })
                    .collect();
                if ready.is_empty() {
                    Err(queue
                        .iter()
                        .filter(|m| !paused.contains(&m.from) && !paused.contains(&m.to.node))
                        .map(|m| m.at_ms)
                        .min())
                } else {
                    let pick = ready[self.rng.borrow_mut().below(ready.len() as u64) as usize];
                    Ok(queue.swap_remove(pick))
                }
            };
            match next {
                Ok(message) => {
                    self.deliver(message);
                    futures_lite::future::yield_now().await;
                }
                Err(Some(at)) => {
                    futures_lite::future::or(listener, self.clock.sleep_until(at)).await;
                }
                Err(None) => listener.await,
            }
        }
    }

    fn deliver(self: &Rc<Self>, m: Message) {
        let to = m.to.node;
        let sender_lives = self.process(m.from) == Some(m.process);
        let target = self.nodes.borrow().get(&to).cloned();
        let (Some(target), true, false) = (target, sender_lives, self.is_cut(m.from, to)) else {
            // Lost: a call's or reply's sender is dropped, which fails the call.
            self.lost.set(self.lost.get() + 1);
            return;
        };
        self.delivered.set(self.delivered.get() + 1);
        match m.body {
            Body::Signal(signal) => target.router.engine().on_signal(signal),
            Body::Reply(result, reply) => {
                let _ = reply.send(result);
            }
            Body::Call(request, reply) => {
                let net_from = m.from;
                let core = m.to.core;
                let limits = self.limits;
                let router = target.router.clone();
                let back = Location {
                    node: net_from,
                    core: 0,
                };
                let process = target.process;
                let net = self.clone();
                target.tasks.spawn(async move {
                    // As node RPC's handler: checked like any peer's request, then applied on its core.
                    let result = match validate::admit(
                        &request,
                        net_from,
                        core,
                        router.engine().cores(),
                        &limits,
                    ) {
                        Ok(()) => router.call(router.core(core as usize), request).await,
                        Err(e) => Err(e),
                    };
                    net.send(to, process, back, Body::Reply(result, reply));
                });
            }
        }
    }
}

struct SimNodeLink {
    net: Rc<NodeNet>,
    from: NodeIndex,
    process: u64,
}

impl NodeLink for SimNodeLink {
    fn call(
        &self,
        to: Location,
        request: Request,
    ) -> Pin<Box<dyn Future<Output = OpResult<Reply>>>> {
        let (tx, rx) = oneshot::channel();
        self.net
            .send(self.from, self.process, to, Body::Call(request, tx));
        let clock = self.net.clock.clone();
        let deadline = clock.now_ms() + self.net.timeout_ms;
        Box::pin(async move {
            let unavailable = |why: &str| {
                Err(OpError::PartitionUnavailable(format!(
                    "node {} {why} (simulated node RPC)",
                    to.node
                )))
            };
            futures_lite::future::or(
                async {
                    match rx.await {
                        Ok(result) => result,
                        Err(_) => unavailable("could not be reached"),
                    }
                },
                async {
                    clock.sleep_until(deadline).await;
                    unavailable("did not answer in time")
                },
            )
            .await
        })
    }

    fn signal(&self, to: Location, signal: Signal) -> bool {
        self.net
            .send(self.from, self.process, to, Body::Signal(signal));
        true
    }
}
