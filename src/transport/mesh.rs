//! The core-to-core transport of one node: glommio's channel mesh carrying `Envelope`s. Sends never wait: a full
//! channel refuses and is counted (`berth_mesh_full_total`), so a busy core can slow its peers but never wedge them
//! (glommio #555 deadlocks a mesh whose senders block). One `Mesh` per core.

use super::{serve_envelope, CoreLink, Envelope};
use crate::engine::Engine;
use futures_lite::StreamExt;
use glommio::channels::channel_mesh::{Receivers, Senders};
use std::rc::Rc;

/// This core's senders to every other core.
pub struct Mesh {
    senders: Senders<Envelope>,
}

impl Mesh {
    pub fn new(senders: Senders<Envelope>) -> Mesh {
        Mesh { senders }
    }
}

impl CoreLink for Mesh {
    fn send(&self, core: usize, envelope: Envelope) -> bool {
        self.senders.try_send_to(core, envelope).is_ok()
    }
}

/// Serves what the other cores send this one, one task per peer channel.
pub fn serve(engine: &Rc<Engine>, mut receivers: Receivers<Envelope>) {
    for (_, stream) in receivers.streams() {
        let engine = engine.clone();
        glommio::spawn_local(async move {
            let mut stream = stream;
            while let Some(envelope) = stream.next().await {
                serve_envelope(&engine, envelope);
            }
        })
        .detach();
    }
}
