//! One at a time on one core: an async turn (no lock: the partition's core is the only one that touches it).

use std::cell::Cell;

/// A turn that one task holds at a time; the others wait in line for it.
#[derive(Default)]
pub struct Turn {
    busy: Cell<bool>,
    done: event_listener::Event,
}

impl Turn {
    /// Waits for the turn; it ends when the returned guard drops.
    pub async fn take(&self) -> TurnGuard<'_> {
        loop {
            if !self.busy.get() {
                self.busy.set(true);
                return TurnGuard(self);
            }
            let listener = self.done.listen();
            if self.busy.get() {
                listener.await;
            }
        }
    }
}

/// Holds a [`Turn`] until dropped.
pub struct TurnGuard<'a>(&'a Turn);

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.set(false);
        self.0.done.notify(1);
    }
}
