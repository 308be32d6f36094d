//! A value that changes over time on one core, with a version per change and a way to wait for the next one. The
//! replica's snapshot and a session's state are published through it. A waiter that is slower than the changes
//! sees only the latest value (changes coalesce), so what is published must make sense on its own.

use event_listener::Event;
use std::cell::{Cell, RefCell};

pub(crate) struct Watched<T> {
    value: RefCell<T>,
    /// Number of `set` calls so far.
    version: Cell<u64>,
    changed: Event,
}

impl<T: Clone> Watched<T> {
    pub fn new(value: T) -> Watched<T> {
        Watched {
            value: RefCell::new(value),
            version: Cell::new(0),
            changed: Event::new(),
        }
    }

    pub fn get(&self) -> T {
        self.value.borrow().clone()
    }

    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// Publishes a new value and wakes every waiter.
    pub fn set(&self, value: T) {
        *self.value.borrow_mut() = value;
        self.version.set(self.version.get() + 1);
        self.changed.notify(usize::MAX);
    }

    /// The current value and its version, once the version differs from `seen`.
    pub async fn newer_than(&self, seen: u64) -> (u64, T) {
        loop {
            let listener = self.changed.listen();
            if self.version.get() != seen {
                return (self.version.get(), self.get());
            }
            listener.await;
        }
    }
}
