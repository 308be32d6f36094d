//! The broker's core-to-core transport: glommio's channel mesh carrying `Command`s, each with a oneshot for its
//! reply. One `Mesh` per core. Sends never wait: a full channel is counted and answered as `Overloaded` (503).

use super::command::{Command, Reply};
use super::error::{BrokerError, BrokerResult};
use futures_channel::oneshot;
use glommio::channels::channel_mesh::Senders;
use std::cell::Cell;

/// This core's senders to every other core.
pub struct Mesh {
    senders: Senders<Command>,
    /// Sends refused because the peer's channel was full.
    pub full: Cell<u64>,
}

impl Mesh {
    pub fn new(senders: Senders<Command>) -> Mesh {
        Mesh {
            senders,
            full: Cell::new(0),
        }
    }

    /// Sends without waiting; a full channel is counted and refused.
    pub fn send(&self, to: usize, command: Command) -> BrokerResult<()> {
        self.senders.try_send_to(to, command).map_err(|_| {
            self.full.set(self.full.get() + 1);
            BrokerError::Overloaded
        })
    }

    /// Sends a command built around a fresh reply channel and awaits the answer.
    pub async fn call<T>(
        &self,
        to: usize,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> BrokerResult<T> {
        let (tx, rx) = oneshot::channel();
        self.send(to, make(tx))?;
        rx.await.unwrap_or(Err(BrokerError::ShuttingDown))
    }

    /// Closes the outgoing channels (shutdown).
    pub fn close(&self) {
        self.senders.close();
    }
}
