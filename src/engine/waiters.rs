//! Parked consumers of one (topic, group) on one core, and the wake-ups that reach them. Lives on the core that
//! took the consume requests (the "front"); the owners of the topic's partitions wake it with a count of newly
//! deliverable messages, over the mesh when they are other cores.
//!
//! The rule that makes wake-ups impossible to lose: a consumer registers (`WaitQueue::register`) before it looks
//! at any partition, and every unit of a wake goes to a distinct registered consumer that has no unit yet. A
//! consumer holding a unit looks again before it sleeps. One that finishes with messages, or gives up, hands its
//! units on to another registered consumer, since the message its unit stood for may still be there (a spurious
//! wake costs one look; a lost one would cost a whole `wait`). Units left when every registered consumer holds one
//! are dropped: each of those will look again anyway.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// One registered consumer's slot.
#[derive(Default)]
struct Slot {
    /// Wake units received and not yet acted on (0 or 1: a slot takes at most one).
    units: Cell<u32>,
    /// Set while the consumer sleeps in `Waiter::wait`.
    waker: RefCell<Option<Waker>>,
    /// The consumer is in `Waiter::wait` (not looking at partitions).
    waiting: Cell<bool>,
}

/// Where units go that no consumer of this queue can take: the engine signals them again as newly deliverable
/// messages, so another core's parked consumers hear of them.
pub type Spill = Box<dyn Fn(usize)>;

/// The consumers parked on one (topic, group) on this core.
#[derive(Default)]
pub struct WaitQueue {
    /// Registered consumers, oldest first.
    slots: RefCell<VecDeque<Rc<Slot>>>,
    /// Wake units handed to consumers, ever (for tests and metrics).
    woken_total: Cell<u64>,
    /// Units a leaving consumer could not hand to another one here.
    spill: RefCell<Option<Spill>>,
}

impl WaitQueue {
    pub fn new() -> Rc<WaitQueue> {
        Rc::new(WaitQueue::default())
    }

    /// Sets where units no consumer here can take go (set once, by the engine that owns the queue).
    pub fn set_spill(&self, spill: Spill) {
        *self.spill.borrow_mut() = Some(spill);
    }

    /// Registers a consumer: from now on it can receive wake units. Register before looking.
    pub fn register(self: &Rc<Self>) -> Waiter {
        let slot = Rc::new(Slot::default());
        self.slots.borrow_mut().push_back(slot.clone());
        Waiter {
            queue: self.clone(),
            slot,
        }
    }

    /// Hands up to `n` wake units to distinct registered consumers that hold none, oldest first; returns how many
    /// were handed out (the rest had nobody to go to).
    pub fn wake(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let mut given = 0;
        for slot in self.slots.borrow().iter() {
            if given == n {
                break;
            }
            if slot.units.get() == 0 {
                slot.units.set(1);
                if let Some(w) = slot.waker.borrow_mut().take() {
                    w.wake();
                }
                given += 1;
            }
        }
        self.woken_total.set(self.woken_total.get() + given as u64);
        given
    }

    /// Registered consumers now.
    pub fn len(&self) -> usize {
        self.slots.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.borrow().is_empty()
    }

    /// Registered consumers asleep in `wait` with no wake unit: these sleep until woken (or their wait runs out).
    pub fn sleeping(&self) -> usize {
        self.slots
            .borrow()
            .iter()
            .filter(|s| s.units.get() == 0 && s.waiting.get())
            .count()
    }

    /// Wake units handed out since the queue was made.
    pub fn woken_total(&self) -> u64 {
        self.woken_total.get()
    }
}

/// A registered consumer. Dropping it deregisters it and hands any unit it holds on.
pub struct Waiter {
    queue: Rc<WaitQueue>,
    slot: Rc<Slot>,
}

impl Waiter {
    /// Takes the unit this consumer holds, if any: it must look again before sleeping.
    pub fn take_unit(&self) -> bool {
        let had = self.slot.units.get() > 0;
        self.slot.units.set(0);
        had
    }

    /// Sleeps until a unit arrives or `deadline` resolves; true if woken by a unit (which stays held until
    /// `take_unit`).
    pub async fn wait(&self, deadline: impl Future<Output = ()>) -> bool {
        if self.slot.units.get() > 0 {
            return true;
        }
        self.slot.waiting.set(true);
        let _awake = Awake(&self.slot);
        futures_lite::future::or(
            async {
                Woken { slot: &self.slot }.await;
                true
            },
            async {
                deadline.await;
                self.slot.units.get() > 0
            },
        )
        .await
    }

    /// This consumer got what it came for (or gave up after looking): hands its unit, if any, to another.
    pub fn finish(self) {
        // Drop does the work.
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.slot.waker.borrow_mut().take();
        self.queue
            .slots
            .borrow_mut()
            .retain(|s| !Rc::ptr_eq(s, &self.slot));
        let units = self.slot.units.replace(0) as usize;
        if units > 0 {
            // The message a unit stood for may still be there: another consumer here looks, and what nobody here
            // can take is signalled again (a consumer parked on another core may be the only one left for it).
            let passed = self.queue.wake(units);
            if passed < units {
                if let Some(spill) = &*self.queue.spill.borrow() {
                    spill(units - passed);
                }
            }
        }
    }
}

/// Clears the slot's `waiting` when the wait ends, however it ends.
struct Awake<'a>(&'a Rc<Slot>);

impl Drop for Awake<'_> {
    fn drop(&mut self) {
        self.0.waiting.set(false);
    }
}

struct Woken<'a> {
    slot: &'a Rc<Slot>,
}

impl Future for Woken<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.slot.units.get() > 0 {
            Poll::Ready(())
        } else {
            *self.slot.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unit_reaches_a_distinct_consumer_and_no_unit_is_absorbed_twice() {
        let q = WaitQueue::new();
        let (a, b, c) = (q.register(), q.register(), q.register());
        // Two wakes of one each, before anyone runs: two distinct consumers hold a unit (the lost wake-up of
        // event-listener's notify(n), which counts listeners already notified, cannot happen).
        assert_eq!(q.wake(1), 1);
        assert_eq!(q.wake(1), 1);
        assert!(a.take_unit() && b.take_unit() && !c.take_unit());
        // More units than consumers: the surplus has nobody to go to.
        assert_eq!(q.wake(5), 3);
        assert_eq!(q.wake(1), 0);
    }

    #[test]
    fn a_consumer_leaving_with_a_unit_hands_it_on() {
        let q = WaitQueue::new();
        let (a, b) = (q.register(), q.register());
        assert_eq!(q.wake(1), 1);
        drop(a);
        assert!(b.take_unit(), "a's unit went to b");
        drop(b);
        assert!(q.is_empty());
        assert_eq!(q.wake(1), 0);
    }

    #[test]
    fn a_unit_nobody_here_can_take_is_spilled_for_other_cores() {
        let q = WaitQueue::new();
        let spilled = Rc::new(Cell::new(0));
        let s = spilled.clone();
        q.set_spill(Box::new(move |n| s.set(s.get() + n)));
        let a = q.register();
        assert_eq!(q.wake(1), 1);
        drop(a);
        assert_eq!(
            spilled.get(),
            1,
            "no other consumer here: the unit goes back to the engine"
        );
    }

    #[test]
    fn wait_returns_on_a_unit_or_at_the_deadline() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .unwrap()
            .run(async {
                let q = WaitQueue::new();
                let w = q.register();
                let q2 = q.clone();
                glommio::spawn_local(async move {
                    futures_lite::future::yield_now().await;
                    q2.wake(1);
                })
                .detach();
                assert!(w.wait(futures_lite::future::pending()).await);
                assert!(w.take_unit());
                assert!(!w.wait(async {}).await, "deadline reached, no unit");
            });
    }
}
