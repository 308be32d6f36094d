//! A replicated partition's receipt-handle nonces (`docs/replication.md`, step 1, the nonce rule; the promises are
//! kept in `replica.epoch`, `storage/epoch_floor.rs`). An R = 1 partition seeds each group's nonces from the wall
//! clock (`install_shard`), which is enough on one node: a restart starts above what it issued. A replicated
//! partition's leader may be another node, whose clock may be behind, so its leader issues nonces only inside a
//! window `(issued, ceiling)`:
//! - `ceiling` is durable on a majority of the replicas (its fencing round's `BeginEpoch` carried it, or a raise
//!   did, `front/round.rs`) before any nonce below it is issued;
//! - the window starts above the highest ceiling a majority of the replicas promised to older leaderships, above
//!   everything this replica promised or issued, and above its wall clock in µs « 8. (A leader serving without a
//!   round, at its topic's creation epoch or at an epoch it began before a restart, starts from its own promises
//!   and nonces: a round at that epoch, its own, already went above the older leaderships'.)
//!
//! Any two majorities share a replica, so no nonce is issued twice for a partition, and a receipt handle of an old
//! leader meets no lease of the new one: `410 lease_gone`. All the groups of the partition draw from the one window,
//! in order, so a handle is also never valid in another group than its own. When fewer than [`NONCE_LOW`] remain the
//! leader asks for a raise (its shipper sends `BeginEpoch` again at its epoch with a higher ceiling); with none left
//! it leases nothing (`503`) until the raise lands.

use super::Partition;
use std::rc::Rc;

/// How far above its start a leadership's ceiling is asked for: 2^40 nonces (about 12 days of a million leases a
/// second, then a raise), while the 64-bit space above today's wall-clock seeds (µs « 8, about 2^58.6) holds about
/// 16 million such blocks: each leadership, and each restart of a leader, takes at least one.
pub const NONCE_BLOCK: u64 = 1 << 40;

/// With fewer nonces than this left below its ceiling, a leader asks for a raise.
pub const NONCE_LOW: u64 = 1 << 36;

/// The highest ceiling a replica promises (a peer asking more is refused, `validate`; an answer above it is not
/// counted): room for a few thousand blocks above it, so nothing computed from it wraps. A partition whose nonces
/// reach it (after about 16 million leaderships) leases nothing more (`503`), loudly.
pub const NONCE_MAX: u64 = u64::MAX - (1 << 52);

/// How long a take waits for a raise under way before it leases nothing (`503`, the client retries).
pub const NONCE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The nonces a replicated partition's leader may issue: above `issued` (the last issued, or where the window
/// starts) and below `ceiling` (0: none may be issued, not leading or its round not won).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NonceWindow {
    pub issued: u64,
    pub ceiling: u64,
}

/// Called when a leader's window runs low (set by the engine when its fencing round is won).
pub type NonceHook = Rc<dyn Fn()>;

/// Where a window may start and what ceiling the round asked for, given everything known: `own` the ceilings this
/// replica promised and issued (and its wall-clock seed), `answered` what the other replicas of the round promised
/// to older leaderships. `asked` is the ceiling the round made durable. Some((start, ceiling)) when it leaves at
/// least [`NONCE_LOW`] nonces, else None (the round raises again from `start`).
pub fn window_from(own: u64, answered: &[u64], asked: u64) -> Result<(u64, u64), u64> {
    let start = answered.iter().copied().fold(own, u64::max);
    if asked > start && asked - start >= NONCE_LOW {
        Ok((start, asked))
    } else {
        Err(start)
    }
}

impl Partition {
    /// The wall clock as a nonce seed (µs « 8), as an R = 1 partition seeds its groups.
    pub(super) fn wall_nonce_seed(&self) -> u64 {
        self.clock.wall_ms().saturating_mul(1000) << 8
    }

    /// The lowest start this replica allows a window of its own: above every ceiling it promised (to any
    /// leadership, its own included), every nonce it issued, and its wall clock.
    pub fn nonce_floor(&self) -> u64 {
        let w = self.nonce_window.get();
        self.fence_state()
            .promised()
            .max(w.issued)
            .max(w.ceiling)
            .max(self.next_nonce_seed.get())
            .max(self.wall_nonce_seed())
    }

    /// The ceiling a leader asks its replicas to promise for a new window or a raise.
    pub fn nonce_ask(&self) -> u64 {
        self.nonce_floor().saturating_add(NONCE_BLOCK)
    }

    /// The window in force.
    pub fn nonce_window(&self) -> NonceWindow {
        self.nonce_window.get()
    }

    /// Its fencing round was won: nonces above `start` and below `ceiling` (durable on a majority) are this
    /// leadership's; `hook` asks for a raise when they run low.
    pub fn open_nonces(&self, start: u64, ceiling: u64, hook: NonceHook) {
        let w = self.nonce_window.get();
        // A window this replica had (a round won again without a deposition between) ends: the new one starts
        // above it.
        self.nonce_window.set(NonceWindow {
            issued: w.issued.max(w.ceiling.min(start)),
            ceiling: 0,
        });
        *self.nonce_hook.borrow_mut() = Some(hook);
        self.nonces_promised(start, ceiling);
    }

    /// A leadership that serves without a fencing round (the topic's creation epoch, or an epoch this replica began
    /// before it restarted): its window opens at the first take, through `hook` (a majority promises a ceiling
    /// above everything this replica promised or issued: nothing older can be above that).
    pub fn open_nonces_later(&self, hook: NonceHook) {
        *self.nonce_hook.borrow_mut() = Some(hook);
    }

    /// A ceiling is durable on a majority (a raise, or a first window above `start`): the window opens or rises.
    pub fn nonces_promised(&self, start: u64, ceiling: u64) {
        let w = self.nonce_window.get();
        if w.ceiling == 0 && (start >= ceiling || ceiling > NONCE_MAX) {
            // The partition's nonce space is used up (see `NONCE_MAX`): it leases nothing.
            tracing::error!(dir = %self.dir.display(), start, ceiling, "this partition's receipt-handle nonces are used up: it leases nothing more");
        } else if w.ceiling == 0 {
            assert!(
                start >= w.issued,
                "a new window starts at {start}, below nonces issued up to {}",
                w.issued
            );
            self.nonce_window.set(NonceWindow {
                issued: start,
                ceiling,
            });
        } else if ceiling > w.ceiling && ceiling <= NONCE_MAX {
            self.nonce_window.set(NonceWindow { ceiling, ..w });
        }
        self.raising_nonces.set(false);
        self.nonces_moved.notify(usize::MAX);
    }

    /// A raise could not be made (it ends: the next lease that finds the window low asks again).
    pub fn nonce_raise_failed(&self) {
        self.raising_nonces.set(false);
        self.nonces_moved.notify(usize::MAX);
    }

    /// The leadership ended: no nonce may be issued until the next window.
    pub(super) fn close_nonces(&self) {
        let w = self.nonce_window.get();
        self.nonce_window.set(NonceWindow {
            issued: w.issued.max(w.ceiling),
            ceiling: 0,
        });
        self.nonce_hook.borrow_mut().take();
        self.raising_nonces.set(false);
        self.nonces_moved.notify(usize::MAX);
    }

    /// [`Partition::nonces_for`], waiting up to [`NONCE_WAIT`] for a raise under way (a leadership's first window
    /// when it serves without a round, or a window run out).
    pub(super) async fn wait_nonces(&self, want: usize) -> Option<u64> {
        if let Some(issued) = self.nonces_for(want) {
            return Some(issued);
        }
        let deadline = self.clock.now_ms() + NONCE_WAIT.as_millis() as u64;
        while self.raising_nonces.get() && self.clock.now_ms() < deadline {
            let moved = self.nonces_moved.listen();
            if !self.raising_nonces.get() {
                break;
            }
            futures_lite::future::or(moved, async {
                self.clock.sleep_until(deadline).await;
            })
            .await;
        }
        self.nonce_room(want)
    }

    /// Before a take of up to `want` leases: the last nonce issued (the group's shard continues from it), or None
    /// when the window cannot hold them (a raise is asked for). Asks for a raise when it runs low.
    pub(super) fn nonces_for(&self, want: usize) -> Option<u64> {
        let w = self.nonce_window.get();
        if w.ceiling.saturating_sub(w.issued) < NONCE_LOW {
            self.ask_nonce_raise();
        }
        self.nonce_room(want)
    }

    /// The last nonce issued, if the window holds `want` more.
    fn nonce_room(&self, want: usize) -> Option<u64> {
        let w = self.nonce_window.get();
        (w.ceiling.saturating_sub(w.issued) > want as u64).then_some(w.issued)
    }

    /// After a take: `high` is the last nonce its shard issued.
    pub(super) fn nonces_issued(&self, high: u64) {
        let w = self.nonce_window.get();
        assert!(
            high < w.ceiling,
            "nonce {high} issued at or above the ceiling {} a majority holds",
            w.ceiling
        );
        self.nonce_window.set(NonceWindow {
            issued: w.issued.max(high),
            ..w
        });
    }

    /// A leader serving without a window yet asks for one at once (a raise does nothing while one is open).
    pub fn ask_for_nonces(&self) {
        if self.nonce_window.get().ceiling == 0 {
            self.ask_nonce_raise();
        }
    }

    fn ask_nonce_raise(&self) {
        if self.raising_nonces.replace(true) {
            return;
        }
        let hook = self.nonce_hook.borrow().clone();
        match hook {
            Some(hook) => hook(),
            None => self.raising_nonces.set(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_starts_above_every_answer_and_needs_room_below_the_ceiling() {
        let own = 1_000;
        let asked = own + NONCE_BLOCK;
        assert_eq!(window_from(own, &[], asked), Ok((own, asked)));
        assert_eq!(window_from(own, &[5, 900], asked), Ok((own, asked)));
        let high = own + 77;
        assert_eq!(window_from(own, &[5, high], asked), Ok((high, asked)));
        // An old leader's clock far ahead: its ceiling is above what this round asked.
        let ahead = asked + 5;
        assert_eq!(window_from(own, &[ahead], asked), Err(ahead));
        // Too little room left.
        let close = asked - NONCE_LOW + 1;
        assert_eq!(window_from(own, &[close], asked), Err(close));
        assert_eq!(
            window_from(own, &[asked - NONCE_LOW], asked),
            Ok((asked - NONCE_LOW, asked))
        );
    }
}
