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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::error::BrokerError;
    use glommio::channels::channel_mesh::MeshBuilder;
    use glommio::{LocalExecutorBuilder, Placement};

    /// A peer that does not drain its channel: sends fill it, then are refused at once and counted — never awaited.
    #[test]
    fn a_full_channel_is_refused_and_counted_without_waiting() {
        let mesh = MeshBuilder::<Command, _>::full(2, 2);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = mesh.clone();
        let idle_peer = LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(move || async move {
                let (_senders, _receivers) = other.join().await.unwrap();
                ready_tx.send(()).unwrap();
                // Hold the receivers without reading until the sender is done.
                while done_rx.try_recv().is_err() {
                    glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
                }
            })
            .unwrap();
        let sender = LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(move || async move {
                let (senders, _receivers) = mesh.join().await.unwrap();
                ready_rx.recv().unwrap();
                let peer = 1 - senders.peer_id();
                let mesh = Mesh::new(senders);
                let wake = |i: usize| Command::Wake {
                    topic: format!("t{i}"),
                    from: 0,
                };
                let results: Vec<_> = (0..5).map(|i| mesh.send(peer, wake(i))).collect();
                (results, mesh.full.get())
            })
            .unwrap();
        let (results, full) = sender.join().unwrap();
        done_tx.send(()).unwrap();
        idle_peer.join().unwrap();
        let refused = results
            .iter()
            .filter(|r| matches!(r, Err(BrokerError::Overloaded)))
            .count();
        assert!(results[0].is_ok(), "an empty channel takes a message");
        assert!(
            refused >= 2,
            "a depth-2 channel must refuse some of 5 sends: {results:?}"
        );
        assert_eq!(full, refused as u64, "every refusal is counted");
    }
}
