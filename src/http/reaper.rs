//! Connection deadlines without a timer per read: each connection publishes its deadline in its core's table, and
//! one task per core sweeps the table and shuts down the read side of any connection past it (the pending read then
//! returns 0). The same table lets shutdown wake idle connections. Lives on one core; no locks.

use crate::clock::coarse_ms as now_ms;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::unix::io::RawFd;
use std::rc::Rc;
use std::time::Duration;

/// What the sweeper knows of one connection.
pub struct Watch {
    fd: RawFd,
    /// Monotonic ms after which the connection is cut.
    pub deadline_ms: Cell<u64>,
    /// Between requests, with nothing buffered (shutdown may close it at once).
    pub idle: Cell<bool>,
    /// Set when the sweeper cut the connection for its deadline.
    pub expired: Cell<bool>,
    /// A response write is in progress: its deadline cuts both directions (a blocked send must end too).
    pub writing: Cell<bool>,
}

/// One core's open connections.
#[derive(Default)]
pub struct ConnTable {
    next_id: Cell<u64>,
    conns: RefCell<HashMap<u64, Rc<Watch>>>,
}

/// Removes the connection from its table when the connection ends.
pub struct Registration {
    table: Rc<ConnTable>,
    id: u64,
    pub watch: Rc<Watch>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.table.conns.borrow_mut().remove(&self.id);
    }
}

fn shut(fd: RawFd, how: libc::c_int) {
    // SAFETY: shutdown(2) on a socket descriptor the connection still owns (it deregisters before closing).
    unsafe { libc::shutdown(fd, how) };
}

impl ConnTable {
    pub fn register(self: &Rc<Self>, fd: RawFd, deadline_ms: u64) -> Registration {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let watch = Rc::new(Watch {
            fd,
            deadline_ms: Cell::new(deadline_ms),
            idle: Cell::new(true),
            expired: Cell::new(false),
            writing: Cell::new(false),
        });
        self.conns.borrow_mut().insert(id, watch.clone());
        Registration {
            table: self.clone(),
            id,
            watch,
        }
    }

    /// Cuts every connection past its deadline; returns how many.
    pub fn sweep(&self, now_ms: u64) -> usize {
        let mut cut = 0;
        for watch in self.conns.borrow().values() {
            if !watch.expired.get() && watch.deadline_ms.get() <= now_ms {
                watch.expired.set(true);
                let how = if watch.writing.get() {
                    libc::SHUT_RDWR
                } else {
                    libc::SHUT_RD
                };
                shut(watch.fd, how);
                cut += 1;
            }
        }
        cut
    }

    /// Shutdown: ends every idle connection's pending read.
    pub fn close_idle(&self) {
        for watch in self.conns.borrow().values() {
            if watch.idle.get() {
                shut(watch.fd, libc::SHUT_RD);
            }
        }
    }
}

/// Sweeps the table every `tick` until `stopped` says so.
pub async fn run(table: Rc<ConnTable>, tick: Duration, stopped: impl Fn() -> bool) {
    while !stopped() {
        glommio::timer::sleep(tick).await;
        table.sweep(now_ms());
    }
}
