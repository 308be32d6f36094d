//! Connection deadlines without a timer per read: each connection publishes its deadline in its core's table, and
//! one task per core sweeps the table and shuts down the read side of any connection past it (the pending read then
//! returns 0). The same table lets shutdown wake idle connections. Lives on one core; no locks.

use crate::clock::coarse_ms as now_ms;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
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
    /// Connections in their TLS handshake, oldest first (ids grow with registration).
    handshaking: RefCell<BTreeMap<u64, Rc<Watch>>>,
}

/// A connection listed among those in their TLS handshake while this is held.
pub struct Handshaking {
    table: Rc<ConnTable>,
    id: u64,
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.table.handshaking.borrow_mut().remove(&self.id);
    }
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

    /// Lists `registration`'s connection as in its TLS handshake, first cutting the oldest ones listed (both
    /// directions) while `max` (at least 1) are: a handshake holds up to 64 KiB of what its client sent, so the
    /// number at once is bounded, and a real client completes its handshake at once, so the oldest is the one to
    /// lose. Returns how many were cut.
    pub fn start_handshake(
        self: &Rc<Self>,
        registration: &Registration,
        max: usize,
    ) -> (Handshaking, usize) {
        let mut listed = self.handshaking.borrow_mut();
        let mut cut = 0;
        while listed.len() >= max.max(1) {
            let Some((_, oldest)) = listed.pop_first() else {
                break;
            };
            oldest.expired.set(true);
            shut(oldest.fd, libc::SHUT_RDWR);
            cut += 1;
        }
        listed.insert(registration.id, registration.watch.clone());
        (
            Handshaking {
                table: self.clone(),
                id: registration.id,
            },
            cut,
        )
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

/// Sweeps the table every `tick` until `stopped` says so, telling `swept` when each sweep began (its time is the
/// core's housekeeping).
pub async fn run(
    table: Rc<ConnTable>,
    tick: Duration,
    stopped: impl Fn() -> bool,
    swept: impl Fn(std::time::Instant),
) {
    while !stopped() {
        glommio::timer::sleep(tick).await;
        let began = std::time::Instant::now();
        table.sweep(now_ms());
        swept(began);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::io::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn handshakes_beyond_the_cap_cut_the_oldest_and_a_finished_one_leaves_the_list() {
        let table = Rc::new(ConnTable::default());
        let pairs: Vec<(UnixStream, UnixStream)> =
            (0..4).map(|_| UnixStream::pair().unwrap()).collect();
        let regs: Vec<Registration> = pairs
            .iter()
            .map(|(ours, _)| table.register(ours.as_raw_fd(), u64::MAX))
            .collect();
        let (first, cut) = table.start_handshake(&regs[0], 2);
        assert_eq!(cut, 0);
        let (second, cut) = table.start_handshake(&regs[1], 2);
        assert_eq!(cut, 0);
        // A third at a cap of 2: the oldest is cut (its peer reads the end), the second stays.
        let (_third, cut) = table.start_handshake(&regs[2], 2);
        assert_eq!(cut, 1);
        assert!(regs[0].watch.expired.get() && !regs[1].watch.expired.get());
        let mut end = [0u8; 1];
        assert_eq!((&pairs[0].1).read(&mut end).unwrap(), 0);
        drop(first);
        // The second finished its handshake: no longer listed, never cut.
        drop(second);
        let (_fourth, cut) = table.start_handshake(&regs[3], 2);
        assert_eq!(cut, 0);
        assert!(!regs[1].watch.expired.get() && !regs[3].watch.expired.get());
    }
}
