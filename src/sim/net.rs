//! The simulation's core-to-core network: one FIFO queue per (sender, receiver) pair with a bounded depth, like the
//! glommio mesh (a full queue refuses, it never blocks), drained by one pump task per simulated core. Everything runs
//! on one executor, so which queue a pump drains next is the only freedom, and the seeded RNG decides it.

use crate::engine::Engine;
use crate::transport::{serve_envelope, CoreLink, Envelope};
use event_listener::Event;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

/// Every queue of the simulated node.
pub struct SimNet {
    cores: usize,
    depth: usize,
    /// queues[to][from]
    queues: RefCell<Vec<Vec<VecDeque<Envelope>>>>,
    /// Notified when a queue of a receiver gets an envelope.
    arrived: Vec<Event>,
    /// Envelopes refused because a queue was full.
    pub refused: Cell<u64>,
    /// Envelopes delivered.
    pub delivered: Cell<u64>,
    /// The pumps' choice of queue.
    rng: RefCell<super::Rng>,
}

impl SimNet {
    pub fn new(cores: usize, depth: usize, seed: u64) -> Rc<SimNet> {
        Rc::new(SimNet {
            cores,
            depth,
            queues: RefCell::new(
                (0..cores)
                    .map(|_| (0..cores).map(|_| VecDeque::new()).collect())
                    .collect(),
            ),
            arrived: (0..cores).map(|_| Event::new()).collect(),
            refused: Cell::new(0),
            delivered: Cell::new(0),
            rng: RefCell::new(super::Rng::new(seed ^ 0x006e_6574)),
        })
    }

    /// Envelopes waiting anywhere.
    pub fn queued(&self) -> usize {
        self.queues
            .borrow()
            .iter()
            .flatten()
            .map(VecDeque::len)
            .sum()
    }

    /// The sending side for core `from`.
    pub fn link(self: &Rc<Self>, from: usize) -> Rc<dyn CoreLink> {
        Rc::new(SimLink {
            net: self.clone(),
            from,
        })
    }

    /// Runs core `me`'s pump: takes envelopes from its queues (a random non-empty one each time, FIFO within it)
    /// and serves them on `engine`.
    pub async fn pump(self: Rc<Self>, me: usize, engine: Rc<Engine>) {
        loop {
            let listener = self.arrived[me].listen();
            let next = {
                let mut queues = self.queues.borrow_mut();
                let ready: Vec<usize> = (0..self.cores)
                    .filter(|&from| !queues[me][from].is_empty())
                    .collect();
                if ready.is_empty() {
                    None
                } else {
                    let pick = ready[self.rng.borrow_mut().below(ready.len() as u64) as usize];
                    queues[me][pick].pop_front()
                }
            };
            match next {
                Some(envelope) => {
                    self.delivered.set(self.delivered.get() + 1);
                    serve_envelope(&engine, envelope);
                    futures_lite::future::yield_now().await;
                }
                None => listener.await,
            }
        }
    }
}

struct SimLink {
    net: Rc<SimNet>,
    from: usize,
}

impl CoreLink for SimLink {
    fn send(&self, core: usize, envelope: Envelope) -> bool {
        let mut queues = self.net.queues.borrow_mut();
        let queue = &mut queues[core][self.from];
        if queue.len() >= self.net.depth {
            self.net.refused.set(self.net.refused.get() + 1);
            return false;
        }
        queue.push_back(envelope);
        self.net.arrived[core].notify(1);
        true
    }
}
