//! In-flight lease shard of ONE partition of a queue (for one consumer group): the commit
//! frontier, the live reservations behind receipt handles, released offsets waiting to be
//! delivered again (at once, or after a redelivery delay), per-offset delivery counts,
//! parked out-of-order acks and corrupt skips.
//! Driven only by the partition's owning core; it lives on that core alone (no locks,
//! no clock: every time-dependent call takes `now_ms`, no I/O).
//!
//! Life of an offset in `[committed, end)`:
//!
//! ```text
//!   never delivered (>= cursor) --reserve--> leased (delivery count 1)
//!   leased --nack / expiry--> redeliver (delay 0)  or  delayed (until its ready time)
//!   delayed --purge with now >= ready time--> redeliver
//!   redeliver --reserve--> leased (delivery count + 1)
//!   leased --ack--> acked-ahead, or past the frontier         } settled: the delivery
//!   leased --skip_corrupt--> corrupt run, or past the frontier } count is forgotten
//!   anything below a retention start --advance_to--> past the frontier
//! ```
//!
//! A release by expiry or by a nack without an explicit delay waits
//! [`Redelivery::delay_for`] its delivery count (the [`InFlight::set_redelivery`] policy);
//! a nack with `Some(d)` waits exactly `d`. Delayed offsets count against
//! `max_in_flight` until they are deliverable again. Delivery counts live only here (in
//! memory): a restarted shard counts from 1 again.
//!
//! Batch calls (`reserve_batch`, `ack_batch`, `nack_batch`, `extend_batch`) purge once
//! and then answer item by item exactly as the single calls would at the same `now_ms`
//! (see each for the one place where "purge once" is observable).

use crate::storage::runs::Runs;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

/// The expiry heap is rebuilt from the live leases once it holds more than
/// `HEAP_SLACK_FACTOR * live + HEAP_SLACK_BASE` slots (superseded/stale slots pile up
/// under extends and acks). Amortised O(1) per push; keeps memory bounded by the caps.
/// (Test builds use a tiny base so the property tests exercise the rebuild often.)
const HEAP_SLACK_FACTOR: usize = 4;
const HEAP_SLACK_BASE: usize = if cfg!(test) { 2 } else { 64 };

/// Default cap of a policy redelivery delay: 15 minutes.
pub const DEFAULT_MAX_REDELIVERY_DELAY_MS: u64 = 15 * 60 * 1_000;

/// Caps for one shard. Both may be changed at runtime with [`InFlight::set_limits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum number of live reservations plus delayed offsets (released, waiting for
    /// their redelivery time); `reserve` answers `AtCap` at this count.
    pub max_in_flight: usize,
    /// Maximum number of parked out-of-order acks (offsets above `committed`).
    pub max_acked_ahead: usize,
}

/// How a delay between deliveries grows with the delivery count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backoff {
    /// Every redelivery waits `delay_ms`.
    Fixed,
    /// The redelivery after the n-th delivery waits `delay_ms * 2^(n-1)`.
    Exponential,
}

/// Redelivery policy: how long an offset released by an expiry, or by a nack without an
/// explicit delay, waits before it is deliverable again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Redelivery {
    /// Base delay; 0 means "deliverable again at once".
    pub delay_ms: u64,
    pub backoff: Backoff,
    /// Upper bound of any policy delay (also of `Fixed`).
    pub max_delay_ms: u64,
}

impl Default for Redelivery {
    /// No delay, fixed, capped at 15 minutes.
    fn default() -> Self {
        Redelivery {
            delay_ms: 0,
            backoff: Backoff::Fixed,
            max_delay_ms: DEFAULT_MAX_REDELIVERY_DELAY_MS,
        }
    }
}

impl Redelivery {
    /// Delay before an offset delivered `delivery_count` times is deliverable again:
    /// `Fixed`: `delay_ms`; `Exponential`: `delay_ms * 2^(delivery_count - 1)` (saturating;
    /// a count of 0 is treated as 1); both capped at `max_delay_ms`.
    pub fn delay_for(&self, delivery_count: u32) -> u64 {
        let raw = match self.backoff {
            Backoff::Fixed => self.delay_ms,
            Backoff::Exponential if self.delay_ms == 0 => 0,
            Backoff::Exponential => 2u64
                .checked_pow(delivery_count.saturating_sub(1))
                .and_then(|factor| self.delay_ms.checked_mul(factor))
                .unwrap_or(u64::MAX),
        };
        raw.min(self.max_delay_ms)
    }
}

/// One live reservation, i.e. what a receipt handle `partition:offset:nonce` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Log offset of the leased record.
    pub offset: u64,
    /// Fresh, never-zero nonce distinguishing this lease from earlier leases of the offset.
    pub nonce: u64,
    /// The lease is released (offset deliverable again, possibly after a redelivery delay)
    /// at the first purge with `now_ms >= expires_at_ms`.
    pub expires_at_ms: u64,
    /// How many times the offset has been leased, this lease included (1 at the first
    /// delivery; since this shard was created).
    pub delivery_count: u32,
}

/// Outcome of [`InFlight::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The lowest deliverable offset was leased.
    Leased(Lease),
    /// Nothing is deliverable in `[committed, end)` (checked before the cap). Delayed
    /// offsets that are not yet due are not deliverable.
    Empty,
    /// Something is deliverable, but `in_flight() + delayed() >= max_in_flight`.
    AtCap,
}

/// Why [`InFlight::reserve_batch`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveStop {
    /// `max` leases were granted.
    Max,
    /// Fewer: nothing more is deliverable (what `reserve` would answer next).
    Empty,
    /// Fewer: the cap was reached while something is still deliverable.
    AtCap,
}

/// Why a handle-based call (`ack`, `nack`, `extend`) was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleError {
    /// No live lease with this `(offset, nonce)`: stale, expired, settled, retained away, or garbage.
    Gone,
    /// The ack would need a new acked-ahead slot and the set is full; nothing changed, the lease stays live.
    AckedAheadFull,
}

/// The live part of a lease, keyed by offset in [`InFlight::leases`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    nonce: u64,
    expires_at_ms: u64,
    /// The lease length it was granted with; an extend without a length re-arms this one.
    visibility_ms: u64,
    /// Deliveries of the offset so far, this lease included (>= 1).
    delivery_count: u32,
}

/// A released offset waiting for its redelivery time, keyed by offset in [`InFlight::delayed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Delayed {
    /// Deliverable again at the first purge with `now_ms >= ready_at_ms`.
    ready_at_ms: u64,
    /// Deliveries so far (>= 1); the next lease gets one more.
    delivery_count: u32,
}

/// In-flight state of one partition.
///
/// Invariants:
/// - `committed <= cursor`, and every offset in `[committed, cursor)` is in exactly one of
///   `leases`, `redeliver`, `delayed`, `acked_ahead`, `corrupt_runs`; nothing at or above
///   `cursor` is in any of them. `acked_ahead` and `corrupt_runs` hold only offsets
///   strictly above `committed` (the frontier is always fully advanced).
/// - `delay_order` holds exactly one `(ready_at_ms, offset)` per `delayed` entry and
///   nothing else (no stale entries, so it needs no compaction).
/// - Every live lease has its exact `(expires_at_ms, offset, nonce)` slot in `expiry`
///   (which may also hold stale slots, compacted past a bound).
/// - Delivery counts are >= 1 and are kept exactly for leased, redeliver and delayed
///   offsets; an offset at or above `cursor` has never been delivered (count 0).
/// - `leases.len() + delayed.len()` grows only through `reserve`, which refuses at
///   `max_in_flight`; so every structure here is bounded by the caps (the highest cap
///   ever set), not by the log.
#[derive(Clone, Debug)]
pub struct InFlight {
    /// Every offset below this is settled (acked, corrupt-skipped or retained away).
    /// The only durable piece; persisted by the caller. Never decreases.
    committed: u64,
    /// One past the highest offset ever handed out (or `committed`, if higher).
    /// Offsets at or above it have never been delivered.
    cursor: u64,
    /// Last nonce issued (initially the caller's `nonce_seed`); the next lease gets the
    /// following non-zero value.
    last_nonce: u64,
    /// Current caps.
    limits: Limits,
    /// Current redelivery policy (applied at release time).
    redelivery: Redelivery,
    /// Live reservations: offset -> (nonce, expiry, length, delivery count). At most one
    /// per offset by construction.
    leases: HashMap<u64, Slot>,
    /// Offsets below `cursor` that were handed out and released (nack / expiry, with any
    /// delay elapsed) and are deliverable again, with their delivery counts; served lowest
    /// first, before `cursor`.
    redeliver: BTreeMap<u64, u32>,
    /// Released offsets below `cursor` that are not deliverable before their ready time.
    /// They count against `max_in_flight`. Moved to `redeliver` by a purge once due.
    delayed: BTreeMap<u64, Delayed>,
    /// `(ready_at_ms, offset)` of every `delayed` entry, earliest first. Exact (never stale).
    delay_order: BTreeSet<(u64, u64)>,
    /// Out-of-order acks (offset > `committed`) parked until the gap beneath closes.
    /// At most `limits.max_acked_ahead` entries are ever added (a batch ack also parks,
    /// for the length of the call, the acks that the frontier passes at its end).
    acked_ahead: BTreeSet<u64>,
    /// Corrupt-skipped offsets above `committed`, as maximal disjoint half-open runs
    /// `start -> end`. Run-length encoded so a long stretch of unreadable records costs
    /// O(1) memory: the number of runs is bounded by the caps, not by the log.
    corrupt_runs: Runs,
    /// Total number of corrupt skips ever reported to this shard (since construction).
    corrupt_skipped_total: u64,
    /// Min-heap of `(expires_at_ms, offset, nonce)`. May hold stale slots (superseded by
    /// an extend, or whose lease was settled / released); those are skipped on pop.
    expiry: BinaryHeap<Reverse<(u64, u64, u64)>>,
}

impl InFlight {
    /// A fresh shard whose frontier is the persisted `committed`. Issued nonces start at
    /// `nonce_seed + 1`; the caller must seed above every nonce issued before a restart
    /// (see [`InFlight::nonce_high_water`]). The redelivery policy is the default (no
    /// delay) until [`InFlight::set_redelivery`].
    pub fn new(committed: u64, nonce_seed: u64, limits: Limits) -> Self {
        InFlight {
            committed,
            cursor: committed,
            last_nonce: nonce_seed,
            limits,
            redelivery: Redelivery::default(),
            leases: HashMap::new(),
            redeliver: BTreeMap::new(),
            delayed: BTreeMap::new(),
            delay_order: BTreeSet::new(),
            acked_ahead: BTreeSet::new(),
            corrupt_runs: Runs::new(),
            corrupt_skipped_total: 0,
            expiry: BinaryHeap::new(),
        }
    }

    /// Replace the caps. Lowering them never revokes anything: existing leases, delayed
    /// offsets and parked acks stay; new reservations / acked-ahead slots are refused
    /// until below the cap.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Current caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Replace the redelivery policy. It applies to releases from now on; offsets already
    /// delayed keep their ready times.
    pub fn set_redelivery(&mut self, redelivery: Redelivery) {
        self.redelivery = redelivery;
    }

    /// Current redelivery policy.
    pub fn redelivery(&self) -> Redelivery {
        self.redelivery
    }

    /// Every offset below this is settled.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Number of live reservations (including expired ones not yet purged).
    pub fn in_flight(&self) -> usize {
        self.leases.len()
    }

    /// Number of released offsets waiting for their redelivery time (not yet moved to
    /// deliverable by a purge). They count against `max_in_flight`.
    pub fn delayed(&self) -> usize {
        self.delayed.len()
    }

    /// Number of parked out-of-order acks.
    pub fn acked_ahead(&self) -> usize {
        self.acked_ahead.len()
    }

    /// Total corrupt skips reported to this shard.
    pub fn corrupt_skipped_total(&self) -> u64 {
        self.corrupt_skipped_total
    }

    /// How many times `offset` has been leased, if it is leased, released (deliverable
    /// again) or delayed; 0 if it was never delivered or is settled (counts are forgotten
    /// at settlement).
    pub fn delivery_count(&self, offset: u64) -> u32 {
        if let Some(slot) = self.leases.get(&offset) {
            slot.delivery_count
        } else if let Some(&count) = self.redeliver.get(&offset) {
            count
        } else if let Some(d) = self.delayed.get(&offset) {
            d.delivery_count
        } else {
            0
        }
    }

    /// The last nonce issued (or the seed, if none yet). A restarted shard must be seeded
    /// with at least this value so that old handles never match new leases.
    pub fn nonce_high_water(&self) -> u64 {
        self.last_nonce
    }

    /// When a purge may next change something: the earliest of the expiry heap's deadlines
    /// and of the delayed offsets' ready times. A wake-up hint: it may be early (a stale
    /// heap slot; a purge then releases nothing), never later than a live lease's expiry
    /// or a delayed offset's ready time.
    pub fn next_wakeup_ms(&self) -> Option<u64> {
        let expiry = self.expiry.peek().map(|Reverse((at, _, _))| *at);
        let delay = self.delay_order.first().map(|&(at, _)| at);
        match (expiry, delay) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Alias of [`InFlight::next_wakeup_ms`] (it now covers redelivery delays too).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.next_wakeup_ms()
    }

    /// Release every lease whose `expires_at_ms <= now_ms`, and make every delayed offset
    /// whose ready time is `<= now_ms` deliverable again.
    ///
    /// A lease released by expiry is deliverable again at `expires_at_ms +`
    /// [`Redelivery::delay_for`] its delivery count: at once if that is `<= now_ms`, else
    /// it is delayed until then. (The deadline, not `now_ms`, starts the delay, so the
    /// outcome does not depend on how late the purge runs.)
    ///
    /// Returns how many offsets became deliverable in this call (expired with the delay
    /// already elapsed, plus delayed offsets now due): callers wake that many consumers.
    pub fn purge_expired(&mut self, now_ms: u64) -> usize {
        let mut deliverable = 0;
        while let Some(&Reverse((at, offset, nonce))) = self.expiry.peek() {
            if at > now_ms {
                break;
            }
            self.expiry.pop();
            // Only the slot matching the live lease exactly may evict it; superseded
            // deadlines (after an extend) and slots of settled leases are skipped.
            let matches = self
                .leases
                .get(&offset)
                .is_some_and(|slot| slot.nonce == nonce && slot.expires_at_ms == at);
            if matches {
                let slot = self.leases.remove(&offset).expect("matched above");
                let delay = self.redelivery.delay_for(slot.delivery_count);
                if self.release(
                    offset,
                    slot.delivery_count,
                    at.saturating_add(delay),
                    now_ms,
                ) {
                    deliverable += 1;
                }
            }
        }
        while let Some(&(ready_at_ms, offset)) = self.delay_order.first() {
            if ready_at_ms > now_ms {
                break;
            }
            self.delay_order.pop_first();
            let d = self
                .delayed
                .remove(&offset)
                .expect("delay_order entry without a delayed offset");
            assert_eq!(d.ready_at_ms, ready_at_ms);
            self.make_deliverable(offset, d.delivery_count);
            deliverable += 1;
        }
        deliverable
    }

    /// Purges first, then leases the lowest deliverable offset in `[committed, end)` (not
    /// leased, not delayed, not acked-ahead, not corrupt-skipped) until
    /// `now_ms + visibility_ms`. `end` is the exclusive end of what may be delivered (the
    /// durable log end). Returns `Empty` if there is nothing to deliver; the cap
    /// (`in_flight() + delayed()` against `max_in_flight`) is checked only when there is,
    /// so `AtCap` always means "something is waiting".
    pub fn reserve(&mut self, end: u64, now_ms: u64, visibility_ms: u64) -> Reserve {
        self.purge_expired(now_ms);
        self.lease_next(end, now_ms, visibility_ms)
    }

    /// Purges once, then leases up to `max` lowest deliverable offsets in one pass,
    /// appending them to `out` in offset order; returns why it stopped. Same leases, in the
    /// same order, as `max` calls of [`InFlight::reserve`] at the same `now_ms` (stopping
    /// at the first non-`Leased` answer, which becomes the `ReserveStop`), with one
    /// deliberate difference: leases granted by this call are not purged within it, so a
    /// zero-length lease (`now_ms + visibility_ms <= now_ms`) is not released and handed
    /// out again inside the same batch.
    pub fn reserve_batch(
        &mut self,
        end: u64,
        now_ms: u64,
        visibility_ms: u64,
        max: usize,
        out: &mut Vec<Lease>,
    ) -> ReserveStop {
        self.purge_expired(now_ms);
        let room = self
            .limits
            .max_in_flight
            .saturating_sub(self.leases.len() + self.delayed.len());
        let fresh = usize::try_from(end.saturating_sub(self.cursor)).unwrap_or(usize::MAX);
        out.reserve(
            max.min(room)
                .min(fresh.saturating_add(self.redeliver.len())),
        );
        for _ in 0..max {
            match self.lease_next(end, now_ms, visibility_ms) {
                Reserve::Leased(lease) => out.push(lease),
                Reserve::Empty => return ReserveStop::Empty,
                Reserve::AtCap => return ReserveStop::AtCap,
            }
        }
        ReserveStop::Max
    }

    /// Purges first. Ok only if `offset` has a live lease with exactly this `nonce`.
    /// Settles it and advances `committed` over the contiguous settled run (acked-ahead
    /// and corrupt-skipped offsets). Returns the new `committed`.
    ///
    /// An ack above `committed` parks in acked-ahead; if that set is full it returns
    /// `AckedAheadFull` and changes nothing. An ack of `offset == committed` never needs
    /// a slot and always succeeds.
    pub fn ack(&mut self, offset: u64, nonce: u64, now_ms: u64) -> Result<u64, SettleError> {
        self.purge_expired(now_ms);
        if !self.is_live(offset, nonce) {
            return Err(SettleError::Gone);
        }
        if offset == self.committed {
            self.leases.remove(&offset);
            self.settle_at_frontier();
        } else {
            assert!(offset > self.committed);
            if self.acked_ahead.len() >= self.limits.max_acked_ahead {
                return Err(SettleError::AckedAheadFull);
            }
            self.leases.remove(&offset);
            let fresh = self.acked_ahead.insert(offset);
            assert!(fresh, "leased offset {offset} was also acked-ahead");
        }
        Ok(self.committed)
    }

    /// Settles a lease whose record was appended to a dead-letter topic: like
    /// [`InFlight::ack`], but never refused for a full acked-ahead set. The record is
    /// already elsewhere; keeping its lease would only make it come back and be copied
    /// again, and a poison message above the frontier must not wedge the partition. The
    /// set may exceed its cap by at most the number of leases live at the time.
    pub fn ack_dead_letter(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
    ) -> Result<u64, SettleError> {
        let cap = self.limits.max_acked_ahead;
        self.limits.max_acked_ahead = usize::MAX;
        let result = self.ack(offset, nonce, now_ms);
        self.limits.max_acked_ahead = cap;
        result
    }

    /// Purges once, then settles each `(offset, nonce)` in order with exactly the answer
    /// the sequence of single [`InFlight::ack`] calls would give (`Gone`, or
    /// `AckedAheadFull` when that ack, after the previous ones, would need an acked-ahead
    /// slot and none is free). The frontier is advanced once, at the end; `committed()`
    /// then equals what the single acks would have left.
    pub fn ack_batch(&mut self, items: &[(u64, u64)], now_ms: u64) -> Vec<Result<(), SettleError>> {
        self.purge_expired(now_ms);
        // Accepted acks are parked in `acked_ahead` (even the ones the single sequence
        // would have settled at the frontier) and the frontier is advanced at the end.
        // To answer `AckedAheadFull` exactly, `frontier` tracks where the single sequence's
        // `committed` would be, and `passed` how many parked acks lie below it (those hold
        // no slot). It is caught up lazily, only when the cap could bind: the parked count
        // minus a stale `passed` over-estimates the slots in use, so below the cap the
        // answer is Ok either way. Each catch-up step passes an offset the final advance
        // passes too, so the whole batch stays O(items + advance) set operations.
        let mut frontier = self.committed;
        let mut passed = 0usize;
        let mut results = Vec::with_capacity(items.len());
        for &(offset, nonce) in items {
            if !self.is_live(offset, nonce) {
                results.push(Err(SettleError::Gone));
                continue;
            }
            let max = self.limits.max_acked_ahead;
            if self.acked_ahead.len() - passed >= max {
                self.catch_up_frontier(&mut frontier, &mut passed);
                // A live lease is never below the frontier: everything there is settled.
                assert!(offset >= frontier);
                if offset != frontier && self.acked_ahead.len() - passed >= max {
                    results.push(Err(SettleError::AckedAheadFull));
                    continue;
                }
            }
            self.leases.remove(&offset);
            let fresh = self.acked_ahead.insert(offset);
            assert!(fresh, "leased offset {offset} was also acked-ahead");
            results.push(Ok(()));
        }
        self.advance_frontier();
        results
    }

    /// Purges first. Ok only if `offset` has a live lease with exactly this `nonce`.
    /// Releases the lease (its delivery count is kept). With `delay_ms: Some(d)` the
    /// offset is deliverable again at `now_ms + d` (`d == 0`: at once); with `None` after
    /// the redelivery policy's [`Redelivery::delay_for`] its delivery count. Until then it
    /// is delayed: not deliverable and counted against `max_in_flight`. Deliverable
    /// offsets are served lowest first.
    pub fn nack(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
        delay_ms: Option<u64>,
    ) -> Result<(), SettleError> {
        self.purge_expired(now_ms);
        self.nack_live(offset, nonce, now_ms, delay_ms)
    }

    /// Purges once, then nacks each `(offset, nonce)` in order as [`InFlight::nack`]
    /// would (the same `delay_ms` for each).
    pub fn nack_batch(
        &mut self,
        items: &[(u64, u64)],
        now_ms: u64,
        delay_ms: Option<u64>,
    ) -> Vec<Result<(), SettleError>> {
        self.purge_expired(now_ms);
        items
            .iter()
            .map(|&(offset, nonce)| self.nack_live(offset, nonce, now_ms, delay_ms))
            .collect()
    }

    /// Purges once, then gives back each live `(offset, nonce)` lease that never reached a
    /// consumer (its record could not be read, or the consumer that asked for it left): the
    /// offset is deliverable at once and the delivery is not counted (its count goes back to
    /// what it was before this lease). Stale handles are `Gone`, as for a nack.
    pub fn give_back_batch(
        &mut self,
        items: &[(u64, u64)],
        now_ms: u64,
    ) -> Vec<Result<(), SettleError>> {
        self.purge_expired(now_ms);
        items
            .iter()
            .map(|&(offset, nonce)| {
                if !self.is_live(offset, nonce) {
                    return Err(SettleError::Gone);
                }
                let slot = self.leases.remove(&offset).expect("live above");
                self.make_deliverable(offset, slot.delivery_count - 1);
                Ok(())
            })
            .collect()
    }

    /// Purges first. Ok only if `offset` has a live lease with exactly this `nonce`.
    /// Sets its expiry to `now_ms + visibility_ms` (which may be earlier than before), or,
    /// without a length, to `now_ms +` the length the lease was granted or last extended
    /// with; the nonce and delivery count are unchanged. Returns the updated lease.
    pub fn extend(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
        visibility_ms: Option<u64>,
    ) -> Result<Lease, SettleError> {
        self.purge_expired(now_ms);
        self.extend_live(offset, nonce, now_ms, visibility_ms)
    }

    /// Purges once, then extends each `(offset, nonce)` in order as [`InFlight::extend`]
    /// would (the same `visibility_ms` for each). As with `reserve_batch`, nothing is
    /// purged between items: a lease extended to expire at `now_ms` stays live (and
    /// extendable) until the end of the call.
    pub fn extend_batch(
        &mut self,
        items: &[(u64, u64)],
        now_ms: u64,
        visibility_ms: Option<u64>,
    ) -> Vec<Result<Lease, SettleError>> {
        self.purge_expired(now_ms);
        items
            .iter()
            .map(|&(offset, nonce)| self.extend_live(offset, nonce, now_ms, visibility_ms))
            .collect()
    }

    /// The caller reserved `(offset, nonce)` and found the record unreadable: drops the
    /// lease, records the offset as corrupt-skipped (settled; never handed out again),
    /// bumps the counter and advances `committed`. Returns the new `committed`. If the
    /// lease is not live (e.g. nonce mismatch) nothing happens and `committed` is
    /// returned unchanged. Does not purge (it takes no clock): a lease that has expired
    /// but not yet been purged still counts as live here.
    pub fn skip_corrupt(&mut self, offset: u64, nonce: u64) -> u64 {
        if !self.is_live(offset, nonce) {
            return self.committed;
        }
        self.leases.remove(&offset);
        self.corrupt_skipped_total = self.corrupt_skipped_total.saturating_add(1);
        if offset == self.committed {
            self.settle_at_frontier();
        } else {
            self.insert_corrupt(offset);
        }
        self.committed
    }

    /// Like [`InFlight::skip_corrupt`] for a whole run: the caller reserved `(offset,
    /// nonce)` and the log says every offset in `[offset, end)` is unreadable. When the
    /// lease was fresh (the rest of the run was never handed out), the run is settled in
    /// one step; otherwise only `offset` is. Returns the new `committed`.
    pub fn skip_corrupt_run(&mut self, offset: u64, nonce: u64, end: u64) -> u64 {
        if !self.is_live(offset, nonce) {
            return self.committed;
        }
        if end <= offset + 1 || offset + 1 != self.cursor {
            return self.skip_corrupt(offset, nonce);
        }
        self.leases.remove(&offset);
        self.cursor = end;
        self.corrupt_skipped_total = self.corrupt_skipped_total.saturating_add(end - offset);
        if offset == self.committed {
            self.committed = end;
            self.advance_frontier();
        } else {
            self.corrupt_runs.insert(offset, end);
        }
        self.committed
    }

    /// Retention removed everything below `start`: if `committed < start`, moves
    /// `committed` to `start` (and then over any settled run at `start`), forgetting
    /// leases / delayed / acked-ahead / corrupt / redelivery state (and delivery counts)
    /// below it; handles below `start` then get `Gone`. O(live leases + delayed), which is
    /// bounded by the cap; retention is rare.
    pub fn advance_to(&mut self, start: u64) {
        if start <= self.committed {
            return;
        }
        self.committed = start;
        self.cursor = self.cursor.max(start);
        self.leases.retain(|&offset, _| offset >= start);
        self.redeliver = self.redeliver.split_off(&start);
        let kept = self.delayed.split_off(&start);
        for (offset, d) in std::mem::replace(&mut self.delayed, kept) {
            let was_there = self.delay_order.remove(&(d.ready_at_ms, offset));
            assert!(was_there, "delayed {offset} missing from delay_order");
        }
        self.acked_ahead = self.acked_ahead.split_off(&start);
        self.corrupt_runs.drop_below(start);
        self.advance_frontier();
        // Slots of dropped leases are now stale; shed them if they dominate the heap.
        self.maybe_compact_expiry();
    }

    /// Is anything deliverable in `[committed, end)` right now, ignoring the cap? O(1)-ish.
    /// Leases that have expired and delayed offsets that are due, but not yet purged, do
    /// not count (use `next_wakeup_ms` to schedule the purge that frees them).
    pub fn has_deliverable(&self, end: u64) -> bool {
        self.next_deliverable(end).is_some()
    }

    // ---- private helpers ----

    /// Lowest deliverable offset below `end`: the lowest released offset, else `cursor`.
    /// Every `redeliver` entry is below `cursor`, so this is the minimum of both.
    fn next_deliverable(&self, end: u64) -> Option<u64> {
        let candidate = self
            .redeliver
            .first_key_value()
            .map_or(self.cursor, |(&offset, _)| offset);
        (candidate < end).then_some(candidate)
    }

    /// `reserve` without the purge.
    fn lease_next(&mut self, end: u64, now_ms: u64, visibility_ms: u64) -> Reserve {
        let Some(offset) = self.next_deliverable(end) else {
            return Reserve::Empty;
        };
        if self.leases.len().saturating_add(self.delayed.len()) >= self.limits.max_in_flight {
            return Reserve::AtCap;
        }
        let delivery_count = if offset == self.cursor {
            // offset < end <= u64::MAX, so this cannot overflow.
            self.cursor += 1;
            1
        } else {
            let prior = self.redeliver.remove(&offset);
            assert!(
                prior.is_some(),
                "deliverable {offset} below cursor not in redeliver"
            );
            prior.unwrap_or(0).saturating_add(1)
        };
        let nonce = self.issue_nonce();
        let expires_at_ms = now_ms.saturating_add(visibility_ms);
        let prev = self.leases.insert(
            offset,
            Slot {
                nonce,
                expires_at_ms,
                visibility_ms,
                delivery_count,
            },
        );
        assert!(prev.is_none(), "offset {offset} leased twice");
        self.push_expiry(expires_at_ms, offset, nonce);
        Reserve::Leased(Lease {
            offset,
            nonce,
            expires_at_ms,
            delivery_count,
        })
    }

    /// `nack` without the purge.
    fn nack_live(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
        delay_ms: Option<u64>,
    ) -> Result<(), SettleError> {
        if !self.is_live(offset, nonce) {
            return Err(SettleError::Gone);
        }
        let slot = self.leases.remove(&offset).expect("live above");
        let delay = delay_ms.unwrap_or_else(|| self.redelivery.delay_for(slot.delivery_count));
        self.release(
            offset,
            slot.delivery_count,
            now_ms.saturating_add(delay),
            now_ms,
        );
        Ok(())
    }

    /// `extend` without the purge.
    fn extend_live(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
        visibility_ms: Option<u64>,
    ) -> Result<Lease, SettleError> {
        match self.leases.get_mut(&offset) {
            Some(slot) if slot.nonce == nonce => {
                let visibility_ms = visibility_ms.unwrap_or(slot.visibility_ms);
                let expires_at_ms = now_ms.saturating_add(visibility_ms);
                slot.visibility_ms = visibility_ms;
                let changed = slot.expires_at_ms != expires_at_ms;
                slot.expires_at_ms = expires_at_ms;
                let delivery_count = slot.delivery_count;
                if changed {
                    self.push_expiry(expires_at_ms, offset, nonce);
                }
                Ok(Lease {
                    offset,
                    nonce,
                    expires_at_ms,
                    delivery_count,
                })
            }
            _ => Err(SettleError::Gone),
        }
    }

    /// `offset` (delivered `delivery_count` times) has just left `leases`: it becomes
    /// deliverable at `ready_at_ms` — at once if that is not after `now_ms`, else it waits
    /// in `delayed`. Returns whether it is deliverable now.
    fn release(&mut self, offset: u64, delivery_count: u32, ready_at_ms: u64, now_ms: u64) -> bool {
        assert!(!self.leases.contains_key(&offset));
        if ready_at_ms <= now_ms {
            self.make_deliverable(offset, delivery_count);
            return true;
        }
        let prev = self.delayed.insert(
            offset,
            Delayed {
                ready_at_ms,
                delivery_count,
            },
        );
        assert!(prev.is_none(), "offset {offset} delayed twice");
        assert!(!self.redeliver.contains_key(&offset));
        let fresh = self.delay_order.insert((ready_at_ms, offset));
        assert!(fresh);
        false
    }

    fn make_deliverable(&mut self, offset: u64, delivery_count: u32) {
        assert!(!self.delayed.contains_key(&offset));
        let prev = self.redeliver.insert(offset, delivery_count);
        assert!(prev.is_none(), "offset {offset} was already in redeliver");
    }

    fn is_live(&self, offset: u64, nonce: u64) -> bool {
        matches!(self.leases.get(&offset), Some(slot) if slot.nonce == nonce)
    }

    /// Next nonce: `last + 1`, skipping 0 on (practically unreachable) wrap-around.
    fn issue_nonce(&mut self) -> u64 {
        let next = self.last_nonce.checked_add(1).unwrap_or(1);
        self.last_nonce = next;
        next
    }

    fn push_expiry(&mut self, expires_at_ms: u64, offset: u64, nonce: u64) {
        self.expiry.push(Reverse((expires_at_ms, offset, nonce)));
        self.maybe_compact_expiry();
    }

    fn maybe_compact_expiry(&mut self) {
        let limit = self
            .leases
            .len()
            .saturating_mul(HEAP_SLACK_FACTOR)
            .saturating_add(HEAP_SLACK_BASE);
        if self.expiry.len() > limit {
            self.expiry = self
                .leases
                .iter()
                .map(|(&offset, slot)| Reverse((slot.expires_at_ms, offset, slot.nonce)))
                .collect();
        }
    }

    /// The offset at `committed` has just been settled (its lease already removed).
    fn settle_at_frontier(&mut self) {
        assert!(self.committed < self.cursor);
        self.committed += 1;
        self.advance_frontier();
    }

    /// Move `committed` over every acked-ahead offset and corrupt run starting at it.
    /// Amortised O(log n) per settled entry.
    fn advance_frontier(&mut self) {
        loop {
            if self.acked_ahead.first() == Some(&self.committed) {
                self.acked_ahead.pop_first();
                self.committed += 1;
            } else if let Some(end) = self.corrupt_runs.remove_starting_at(self.committed) {
                self.committed = end;
            } else {
                break;
            }
        }
        assert!(self.committed <= self.cursor);
    }

    /// For `ack_batch`: move the would-be frontier `frontier` (>= `committed`) over the
    /// parked acks and corrupt runs starting at it, without changing anything, counting
    /// the parked acks it passes in `passed`.
    fn catch_up_frontier(&self, frontier: &mut u64, passed: &mut usize) {
        loop {
            let before = *frontier;
            for &offset in self.acked_ahead.range(*frontier..) {
                if offset != *frontier {
                    break;
                }
                *frontier += 1;
                *passed += 1;
            }
            // Runs are maximal and disjoint from acked-ahead, so one containing the
            // frontier starts exactly there.
            if let Some((start, end)) = self.corrupt_runs.run_at(*frontier) {
                assert_eq!(start, *frontier);
                *frontier = end;
            }
            if *frontier == before {
                break;
            }
        }
    }

    /// Record `offset` (> committed, < cursor, not in any run) as corrupt, merging with
    /// adjacent runs so runs stay maximal.
    fn insert_corrupt(&mut self, offset: u64) {
        assert!(offset > self.committed && offset < self.cursor);
        assert!(
            !self.corrupt_runs.contains(offset),
            "offset {offset} already corrupt"
        );
        // offset < cursor <= u64::MAX, so this cannot overflow.
        self.corrupt_runs.insert(offset, offset + 1);
    }

    /// Test-only full consistency check (O(n)): every invariant of [`InFlight`].
    #[cfg(test)]
    fn check_invariants(&self) {
        assert!(self.committed <= self.cursor);
        let in_range = |o: u64| o >= self.committed && o < self.cursor;
        // Partition of [committed, cursor): membership in each structure is counted, the
        // pairwise exclusions are checked, and the total must equal the range's length.
        let mut covered: u64 = 0;
        for (&o, slot) in &self.leases {
            assert!(in_range(o), "lease {o} outside [committed, cursor)");
            assert!(!self.redeliver.contains_key(&o) && !self.delayed.contains_key(&o));
            assert!(!self.acked_ahead.contains(&o) && !self.in_corrupt(o));
            assert_ne!(slot.nonce, 0);
            assert!(slot.delivery_count >= 1, "lease {o} with delivery count 0");
            covered += 1;
        }
        for (&o, &count) in &self.redeliver {
            assert!(in_range(o), "redeliver {o} outside [committed, cursor)");
            assert!(!self.delayed.contains_key(&o));
            assert!(!self.acked_ahead.contains(&o) && !self.in_corrupt(o));
            // A count of 0 is an offset given back undelivered (`give_back_batch`).
            let _ = count;
            covered += 1;
        }
        for (&o, d) in &self.delayed {
            assert!(in_range(o), "delayed {o} outside [committed, cursor)");
            assert!(!self.acked_ahead.contains(&o) && !self.in_corrupt(o));
            assert!(d.delivery_count >= 1, "delayed {o} with delivery count 0");
            assert!(
                self.delay_order.contains(&(d.ready_at_ms, o)),
                "delayed {o} missing from delay_order"
            );
            covered += 1;
        }
        assert_eq!(
            self.delay_order.len(),
            self.delayed.len(),
            "stale delay_order entries"
        );
        for &o in &self.acked_ahead {
            assert!(
                in_range(o) && o > self.committed,
                "acked-ahead {o} misplaced"
            );
            assert!(!self.in_corrupt(o));
            covered += 1;
        }
        let mut last_end = None;
        for (s, e) in self.corrupt_runs.iter() {
            assert!(
                s < e && s > self.committed && e <= self.cursor,
                "bad run {s}..{e}"
            );
            if let Some(le) = last_end {
                assert!(le < s, "runs not disjoint and maximal");
            }
            last_end = Some(e);
            covered += e - s;
        }
        assert_eq!(covered, self.cursor - self.committed, "gap in coverage");
        let slots: std::collections::HashSet<(u64, u64, u64)> =
            self.expiry.iter().map(|Reverse(t)| *t).collect();
        for (&o, slot) in &self.leases {
            assert!(
                slots.contains(&(slot.expires_at_ms, o, slot.nonce)),
                "lease {o} has no heap slot"
            );
        }
    }

    #[cfg(test)]
    fn in_corrupt(&self, o: u64) -> bool {
        self.corrupt_runs.contains(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    fn limits(max_in_flight: usize, max_acked_ahead: usize) -> Limits {
        Limits {
            max_in_flight,
            max_acked_ahead,
        }
    }

    fn leased(r: Reserve) -> Lease {
        match r {
            Reserve::Leased(l) => l,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    #[test]
    fn a_dead_lettered_lease_is_settled_even_when_the_acked_ahead_set_is_full() {
        let mut s = InFlight::new(0, 0, limits(8, 1));
        let ls: Vec<Lease> = (0..3).map(|_| leased(s.reserve(3, 0, 100))).collect();
        assert_eq!(s.ack(ls[1].offset, ls[1].nonce, 0), Ok(0));
        assert_eq!(
            s.ack(ls[2].offset, ls[2].nonce, 0),
            Err(SettleError::AckedAheadFull)
        );
        assert_eq!(s.ack_dead_letter(ls[2].offset, ls[2].nonce, 0), Ok(0));
        assert_eq!(s.acked_ahead(), 2);
        assert_eq!(s.ack(ls[0].offset, ls[0].nonce, 0), Ok(3));
        assert_eq!(s.limits().max_acked_ahead, 1, "the cap is unchanged");
        s.check_invariants();
    }

    /// The invariant checks are `assert!`s, on in release builds (the suite's and the server's): a broken one
    /// stops the core at once instead of handing out or settling from a corrupt state.
    #[test]
    #[should_panic(expected = "offset 1 already corrupt")]
    fn a_broken_invariant_is_caught_in_a_release_build() {
        let mut s = InFlight::new(0, 0, limits(8, 8));
        for _ in 0..3 {
            leased(s.reserve(3, 0, 100));
        }
        s.insert_corrupt(1);
        s.insert_corrupt(1);
    }

    #[test]
    fn fresh_shard_hands_out_from_committed_in_order() {
        let mut s = InFlight::new(10, 0, limits(8, 8));
        assert!(!s.has_deliverable(10));
        assert_eq!(s.reserve(10, 0, 100), Reserve::Empty);
        assert!(s.has_deliverable(13));
        let offsets: Vec<u64> = (0..3)
            .map(|_| leased(s.reserve(13, 0, 100)).offset)
            .collect();
        assert_eq!(offsets, vec![10, 11, 12]);
        assert_eq!(s.reserve(13, 0, 100), Reserve::Empty);
        assert_eq!(s.in_flight(), 3);
        s.check_invariants();
    }

    #[test]
    fn stale_handle_after_redelivery_gets_gone() {
        let mut s = InFlight::new(0, 100, limits(10, 10));
        let first = leased(s.reserve(10, 0, 1_000));
        assert_eq!((first.offset, first.nonce), (0, 101));
        assert_eq!(s.purge_expired(1_000), 1);
        let second = leased(s.reserve(10, 1_000, 1_000));
        assert_eq!((second.offset, second.nonce), (0, 102));
        assert_eq!(s.ack(0, first.nonce, 1_000), Err(SettleError::Gone));
        assert_eq!(s.nack(0, first.nonce, 1_000, None), Err(SettleError::Gone));
        assert_eq!(
            s.extend(0, first.nonce, 1_000, Some(5)),
            Err(SettleError::Gone)
        );
        assert_eq!(s.skip_corrupt(0, first.nonce), 0);
        assert_eq!(s.corrupt_skipped_total(), 0);
        assert_eq!(s.in_flight(), 1);
        assert_eq!(s.ack(0, second.nonce, 1_000), Ok(1));
        // Once settled, the current handle is stale too.
        assert_eq!(s.ack(0, second.nonce, 1_000), Err(SettleError::Gone));
        s.check_invariants();
    }

    #[test]
    fn expired_but_unpurged_lease_is_gone_for_ack() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let l = leased(s.reserve(5, 0, 100));
        assert_eq!(s.in_flight(), 1);
        assert_eq!(s.ack(l.offset, l.nonce, 100), Err(SettleError::Gone));
        assert_eq!(s.in_flight(), 0);
        assert_eq!(leased(s.reserve(5, 100, 100)).offset, 0);
    }

    #[test]
    fn extended_lease_outlives_first_deadline() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let l = leased(s.reserve(5, 0, 100));
        let ext = s.extend(l.offset, l.nonce, 50, Some(100)).expect("live");
        assert_eq!(
            ext,
            Lease {
                expires_at_ms: 150,
                ..l
            }
        );
        assert_eq!(s.purge_expired(120), 0);
        assert_eq!(s.ack(l.offset, l.nonce, 149), Ok(1));
    }

    #[test]
    fn superseded_heap_slot_does_not_evict_extended_lease() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let l = leased(s.reserve(5, 0, 100));
        s.extend(l.offset, l.nonce, 10, Some(1_000)).expect("live");
        assert_eq!(s.next_expiry_ms(), Some(100)); // the superseded slot, a mere hint
        assert_eq!(s.purge_expired(100), 0);
        assert_eq!(s.in_flight(), 1);
        assert_eq!(s.next_expiry_ms(), Some(1_010));
        assert_eq!(s.purge_expired(1_009), 0);
        assert_eq!(s.purge_expired(1_010), 1);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.next_expiry_ms(), None);
    }

    #[test]
    fn extend_can_shorten_and_old_later_slot_is_then_stale() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let l = leased(s.reserve(5, 0, 1_000));
        s.extend(l.offset, l.nonce, 10, Some(10)).expect("live");
        assert_eq!(s.purge_expired(20), 1);
        let again = leased(s.reserve(5, 20, 5_000));
        assert_eq!(again.offset, 0);
        // The first lease's 1_000 slot must not evict the new lease.
        assert_eq!(s.purge_expired(1_000), 0);
        assert_eq!(s.in_flight(), 1);
    }

    #[test]
    fn zero_visibility_lease_expires_on_next_call() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let l = leased(s.reserve(5, 7, 0));
        assert_eq!(l.expires_at_ms, 7);
        assert_eq!(
            s.extend(l.offset, l.nonce, 7, Some(10)),
            Err(SettleError::Gone)
        );
        assert_eq!(leased(s.reserve(5, 7, 10)).offset, 0);
    }

    #[test]
    fn out_of_order_acks_park_until_gap_closes() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..4).map(|_| leased(s.reserve(4, 0, 100))).collect();
        assert_eq!(s.ack(2, ls[2].nonce, 0), Ok(0));
        assert_eq!(s.ack(3, ls[3].nonce, 0), Ok(0));
        assert_eq!(s.ack(1, ls[1].nonce, 0), Ok(0));
        assert_eq!(s.acked_ahead(), 3);
        assert_eq!(s.ack(0, ls[0].nonce, 0), Ok(4));
        assert_eq!(s.acked_ahead(), 0);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.reserve(4, 0, 100), Reserve::Empty);
        s.check_invariants();
    }

    #[test]
    fn acked_ahead_cap_refuses_and_keeps_lease() {
        let mut s = InFlight::new(0, 0, limits(10, 1));
        let ls: Vec<Lease> = (0..3).map(|_| leased(s.reserve(3, 0, 100))).collect();
        assert_eq!(s.ack(1, ls[1].nonce, 0), Ok(0));
        assert_eq!(s.ack(2, ls[2].nonce, 0), Err(SettleError::AckedAheadFull));
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.acked_ahead(), 1);
        // The refused lease is still live and extendable.
        s.extend(2, ls[2].nonce, 0, Some(100)).expect("still live");
        // An ack at the frontier needs no slot even though the set is full.
        assert_eq!(s.ack(0, ls[0].nonce, 0), Ok(2));
        assert_eq!(s.ack(2, ls[2].nonce, 0), Ok(3));
        s.check_invariants();
    }

    #[test]
    fn zero_acked_ahead_cap_forces_in_order_acks() {
        let mut s = InFlight::new(0, 0, limits(10, 0));
        let a = leased(s.reserve(2, 0, 100));
        let b = leased(s.reserve(2, 0, 100));
        assert_eq!(
            s.ack(b.offset, b.nonce, 0),
            Err(SettleError::AckedAheadFull)
        );
        assert_eq!(s.ack(a.offset, a.nonce, 0), Ok(1));
        assert_eq!(s.ack(b.offset, b.nonce, 0), Ok(2));
    }

    #[test]
    fn in_flight_cap_returns_at_cap() {
        let mut s = InFlight::new(0, 0, limits(2, 10));
        let a = leased(s.reserve(5, 0, 100));
        leased(s.reserve(5, 0, 100));
        assert_eq!(s.reserve(5, 0, 100), Reserve::AtCap);
        // With nothing deliverable the answer is Empty, not AtCap.
        assert_eq!(s.reserve(2, 0, 100), Reserve::Empty);
        assert_eq!(s.ack(a.offset, a.nonce, 0), Ok(1));
        assert_eq!(leased(s.reserve(5, 0, 100)).offset, 2);
        // Lowering the cap below the live count refuses further reservations.
        s.set_limits(limits(1, 10));
        assert_eq!(s.reserve(5, 0, 100), Reserve::AtCap);
        assert_eq!(s.in_flight(), 2);
    }

    #[test]
    fn nack_makes_offset_deliverable_at_once_and_lowest_first() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..4).map(|_| leased(s.reserve(10, 0, 100))).collect();
        s.nack(2, ls[2].nonce, 0, None).expect("live");
        s.nack(1, ls[1].nonce, 0, None).expect("live");
        assert_eq!(s.nack(1, ls[1].nonce, 0, None), Err(SettleError::Gone));
        let got: Vec<u64> = (0..3)
            .map(|_| leased(s.reserve(10, 0, 100)).offset)
            .collect();
        assert_eq!(got, vec![1, 2, 4]);
        s.check_invariants();
    }

    #[test]
    fn corrupt_skip_advances_frontier() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..3).map(|_| leased(s.reserve(3, 0, 100))).collect();
        assert_eq!(s.skip_corrupt(1, ls[1].nonce + 99), 0); // stale: nothing happens
        assert_eq!(s.corrupt_skipped_total(), 0);
        assert_eq!(s.skip_corrupt(1, ls[1].nonce), 0);
        assert_eq!(s.corrupt_skipped_total(), 1);
        assert_eq!(s.acked_ahead(), 0); // corrupt skips use no acked-ahead slot
        assert_eq!(s.ack(0, ls[0].nonce, 0), Ok(2));
        assert_eq!(s.skip_corrupt(2, ls[2].nonce), 3);
        assert_eq!(s.corrupt_skipped_total(), 2);
        assert!(!s.has_deliverable(3));
        assert_eq!(s.reserve(3, 0, 100), Reserve::Empty);
        s.check_invariants();
    }

    #[test]
    fn long_corrupt_stretch_is_run_length_encoded() {
        let mut s = InFlight::new(0, 0, limits(2, 0));
        let head = leased(s.reserve(u64::MAX, 0, 1_000_000));
        for _ in 0..1_000 {
            let l = leased(s.reserve(u64::MAX, 0, 1_000_000));
            s.skip_corrupt(l.offset, l.nonce);
        }
        assert_eq!(s.corrupt_runs.len(), 1);
        assert_eq!(s.corrupt_skipped_total(), 1_000);
        s.check_invariants();
        assert_eq!(s.ack(head.offset, head.nonce, 0), Ok(1_001));
        assert!(s.corrupt_runs.is_empty());
    }

    #[test]
    fn nonces_never_repeat_across_reservations() {
        let mut s = InFlight::new(0, 7, limits(3, 3));
        let mut seen = HashSet::new();
        let mut now = 0;
        for round in 0..300u64 {
            match s.reserve(5, now, 10) {
                Reserve::Leased(l) => {
                    assert!(
                        l.nonce != 0 && seen.insert(l.nonce),
                        "nonce {} reused",
                        l.nonce
                    );
                    if round % 3 == 0 {
                        s.nack(l.offset, l.nonce, now, None).expect("live");
                    }
                }
                Reserve::AtCap => now += 11, // let everything expire
                Reserve::Empty => unreachable!("nothing is ever settled here"),
            }
        }
        assert_eq!(seen.iter().min(), Some(&8));
        assert_eq!(s.nonce_high_water(), 7 + seen.len() as u64);

        // Wrap-around skips 0.
        let mut w = InFlight::new(0, u64::MAX, limits(3, 3));
        assert_eq!(leased(w.reserve(5, 0, 10)).nonce, 1);
    }

    #[test]
    fn advance_to_drops_state_below_start() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..6).map(|_| leased(s.reserve(6, 0, 100))).collect();
        s.ack(3, ls[3].nonce, 0).expect("live");
        s.skip_corrupt(4, ls[4].nonce);
        s.nack(1, ls[1].nonce, 0, None).expect("live");
        s.advance_to(2); // 0 and 1 are retained away
        assert_eq!(s.committed(), 2);
        s.advance_to(1); // below committed: no-op
        assert_eq!(s.committed(), 2);
        s.advance_to(4);
        // 4 is corrupt-skipped, so the frontier runs on to 5.
        assert_eq!(s.committed(), 5);
        assert_eq!(s.acked_ahead(), 0);
        assert_eq!(s.in_flight(), 1); // only offset 5
        for l in &ls[..5] {
            assert_eq!(s.ack(l.offset, l.nonce, 0), Err(SettleError::Gone));
        }
        assert_eq!(s.reserve(6, 0, 100), Reserve::Empty); // released offset 1 is forgotten
        s.check_invariants();
        // Retention beyond everything handed out.
        s.advance_to(100);
        assert_eq!(s.committed(), 100);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(leased(s.reserve(200, 0, 100)).offset, 100);
        s.check_invariants();
    }

    #[test]
    fn advance_to_splits_straddling_corrupt_run() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..6).map(|_| leased(s.reserve(6, 0, 100))).collect();
        for l in &ls[1..5] {
            s.skip_corrupt(l.offset, l.nonce);
        }
        assert_eq!(s.corrupt_runs.len(), 1);
        s.advance_to(3);
        assert_eq!(s.committed(), 5);
        assert!(s.corrupt_runs.is_empty());
        assert_eq!(s.ack(5, ls[5].nonce, 0), Ok(6));
        s.check_invariants();
    }

    #[test]
    fn heap_stays_bounded_under_repeated_extends() {
        let mut s = InFlight::new(0, 0, limits(4, 4));
        let l = leased(s.reserve(10, 0, 100));
        for t in 1..10_000u64 {
            s.extend(l.offset, l.nonce, t, Some(100)).expect("live");
            assert!(s.expiry.len() <= HEAP_SLACK_FACTOR + HEAP_SLACK_BASE);
        }
        s.check_invariants();
        assert_eq!(s.purge_expired(10_098), 0);
        assert_eq!(s.purge_expired(10_099), 1);
    }

    // ---------------- delivery counts, redelivery delays, batches ----------------

    fn policy(delay_ms: u64, backoff: Backoff, max_delay_ms: u64) -> Redelivery {
        Redelivery {
            delay_ms,
            backoff,
            max_delay_ms,
        }
    }

    #[test]
    fn a_delayed_offset_is_not_delivered_before_its_time() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let a = leased(s.reserve(3, 0, 100));
        s.nack(a.offset, a.nonce, 10, Some(50)).expect("live");
        assert_eq!((s.in_flight(), s.delayed()), (0, 1));
        assert_eq!(s.delivery_count(0), 1);
        assert_eq!(s.next_wakeup_ms(), Some(60));
        assert_eq!(s.next_expiry_ms(), Some(60));
        // Offsets above it are served meanwhile; it is not.
        assert_eq!(leased(s.reserve(3, 59, 100)).offset, 1);
        assert!(!s.has_deliverable(2));
        assert_eq!(s.reserve(2, 59, 100), Reserve::Empty);
        assert!(s.has_deliverable(3));
        // Due at 60: the purge makes it deliverable and says so (one consumer to wake).
        assert_eq!(s.purge_expired(60), 1);
        assert_eq!((s.in_flight(), s.delayed()), (1, 0));
        assert!(s.has_deliverable(2));
        let again = leased(s.reserve(3, 60, 100));
        assert_eq!((again.offset, again.delivery_count), (0, 2));
        s.check_invariants();
    }

    #[test]
    fn expiry_waits_the_policy_delay_counted_from_the_deadline() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        s.set_redelivery(policy(30, Backoff::Fixed, 1_000));
        let a = leased(s.reserve(1, 0, 100));
        assert_eq!(a.delivery_count, 1);
        // Expired at 100, deliverable at 130 (not 110 + 30).
        assert_eq!(s.purge_expired(110), 0);
        assert_eq!((s.in_flight(), s.delayed()), (0, 1));
        assert_eq!(s.next_wakeup_ms(), Some(130));
        assert_eq!(s.reserve(1, 129, 100), Reserve::Empty);
        let b = leased(s.reserve(1, 130, 100));
        assert_eq!((b.offset, b.delivery_count, b.expires_at_ms), (0, 2, 230));
        // A late purge: deadline + delay has already passed, so it is deliverable at once.
        assert_eq!(s.purge_expired(500), 1);
        assert_eq!(s.delayed(), 0);
        // A nack without a delay applies the policy ...
        let c = leased(s.reserve(1, 500, 100));
        s.nack(0, c.nonce, 500, None).expect("live");
        assert_eq!(s.reserve(1, 529, 100), Reserve::Empty);
        let d = leased(s.reserve(1, 530, 100));
        assert_eq!(d.delivery_count, 4);
        // ... and an explicit delay replaces it (0: at once).
        s.nack(0, d.nonce, 530, Some(0)).expect("live");
        assert_eq!(s.delayed(), 0);
        assert_eq!(leased(s.reserve(1, 530, 100)).delivery_count, 5);
        s.check_invariants();
    }

    #[test]
    fn exponential_backoff_doubles_per_delivery_and_caps() {
        let r = policy(10, Backoff::Exponential, 75);
        let delays: Vec<u64> = (0..=6).map(|n| r.delay_for(n)).collect();
        assert_eq!(delays, vec![10, 10, 20, 40, 75, 75, 75]);
        assert_eq!(r.delay_for(u32::MAX), 75);
        let huge = policy(u64::MAX / 2, Backoff::Exponential, u64::MAX);
        assert_eq!(huge.delay_for(2), u64::MAX - 1);
        assert_eq!(huge.delay_for(3), u64::MAX);
        assert_eq!(huge.delay_for(u32::MAX), u64::MAX);
        assert_eq!(policy(0, Backoff::Exponential, 100).delay_for(99), 0);
        // Fixed is capped too.
        assert_eq!(policy(500, Backoff::Fixed, 300).delay_for(1), 300);
        assert_eq!(policy(500, Backoff::Fixed, 300).delay_for(9), 300);
        let default = Redelivery::default();
        assert_eq!(default, policy(0, Backoff::Fixed, 15 * 60 * 1_000));
        assert_eq!(default.delay_for(7), 0);

        // In the shard: each expiry of the same offset waits twice as long, up to the cap.
        let mut s = InFlight::new(0, 0, limits(4, 4));
        s.set_redelivery(policy(10, Backoff::Exponential, 35));
        let mut now = 0;
        for (count, delay) in [(1, 10), (2, 20), (3, 35), (4, 35)] {
            let l = leased(s.reserve(1, now, 5));
            assert_eq!(l.delivery_count, count);
            now = l.expires_at_ms;
            assert_eq!(s.purge_expired(now), 0);
            assert_eq!(s.delivery_count(0), count);
            assert_eq!(s.next_wakeup_ms(), Some(now + delay));
            assert_eq!(s.reserve(1, now + delay - 1, 5), Reserve::Empty);
            now += delay;
        }
        s.check_invariants();
    }

    #[test]
    fn delayed_offsets_count_against_the_in_flight_cap() {
        let mut s = InFlight::new(0, 0, limits(2, 10));
        let a = leased(s.reserve(5, 0, 100));
        let b = leased(s.reserve(5, 0, 100));
        assert_eq!(s.reserve(5, 0, 100), Reserve::AtCap);
        s.nack(a.offset, a.nonce, 0, Some(50)).expect("live");
        assert_eq!((s.in_flight(), s.delayed()), (1, 1));
        // Offset 2 is waiting, but one live lease + one delayed offset fill the cap.
        assert_eq!(s.reserve(5, 10, 100), Reserve::AtCap);
        assert_eq!(s.ack(b.offset, b.nonce, 10), Ok(0));
        assert_eq!(leased(s.reserve(5, 10, 100)).offset, 2);
        assert_eq!(s.reserve(5, 10, 100), Reserve::AtCap);
        // Once due, the delayed offset leaves the count and is served first.
        let again = leased(s.reserve(5, 50, 100));
        assert_eq!((again.offset, again.delivery_count), (0, 2));
        assert_eq!(s.reserve(5, 50, 100), Reserve::AtCap);
        s.check_invariants();

        // With nothing else deliverable the answer is Empty, not AtCap.
        let mut t = InFlight::new(0, 0, limits(1, 10));
        let l = leased(t.reserve(1, 0, 100));
        t.nack(l.offset, l.nonce, 0, Some(50)).expect("live");
        assert_eq!(t.reserve(1, 10, 100), Reserve::Empty);
        assert_eq!(t.reserve(2, 10, 100), Reserve::AtCap);
    }

    #[test]
    fn delivery_counts_follow_the_offset_until_it_is_settled() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..4).map(|_| leased(s.reserve(4, 0, 100))).collect();
        assert!(ls.iter().all(|l| l.delivery_count == 1));
        s.nack(1, ls[1].nonce, 0, None).expect("live");
        assert_eq!(s.delivery_count(1), 1); // deliverable again, count kept
        let l1 = leased(s.reserve(4, 0, 100));
        assert_eq!((l1.offset, l1.delivery_count), (1, 2));
        let ext = s.extend(1, l1.nonce, 10, Some(5)).expect("live");
        assert_eq!(ext.delivery_count, 2);
        assert_eq!(s.purge_expired(15), 1);
        assert_eq!(s.delivery_count(1), 2); // expired, count kept
        assert_eq!(s.delivery_count(4), 0); // never delivered
                                            // Settling forgets: ack, corrupt skip, retention.
        assert_eq!(s.ack(0, ls[0].nonce, 15), Ok(1));
        assert_eq!(s.delivery_count(0), 0);
        s.skip_corrupt(2, ls[2].nonce);
        assert_eq!(s.delivery_count(2), 0);
        s.advance_to(4);
        assert_eq!((0..5).map(|o| s.delivery_count(o)).max(), Some(0));
        s.check_invariants();
    }

    #[test]
    fn retention_drops_delayed_offsets_and_their_wake_ups() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..3).map(|_| leased(s.reserve(3, 0, 1_000))).collect();
        s.nack(0, ls[0].nonce, 0, Some(10)).expect("live");
        s.nack(2, ls[2].nonce, 0, Some(20)).expect("live");
        assert_eq!(s.delayed(), 2);
        s.advance_to(1);
        assert_eq!(s.delayed(), 1);
        assert_eq!(s.delivery_count(0), 0);
        assert_eq!(s.next_wakeup_ms(), Some(20));
        s.check_invariants();
        s.advance_to(3);
        assert_eq!((s.in_flight(), s.delayed(), s.committed()), (0, 0, 3));
        assert_eq!(s.purge_expired(u64::MAX), 0);
        s.check_invariants();
    }

    #[test]
    fn reserve_batch_leases_lowest_first_and_says_why_it_stopped() {
        let mut s = InFlight::new(0, 0, limits(4, 4));
        let mut out = Vec::new();
        assert_eq!(s.reserve_batch(3, 0, 100, 2, &mut out), ReserveStop::Max);
        assert_eq!(out.iter().map(|l| l.offset).collect::<Vec<_>>(), vec![0, 1]);
        s.nack(0, out[0].nonce, 0, None).expect("live");
        assert_eq!(s.reserve_batch(3, 0, 100, 10, &mut out), ReserveStop::Empty);
        let got: Vec<(u64, u32)> = out[2..]
            .iter()
            .map(|l| (l.offset, l.delivery_count))
            .collect();
        assert_eq!(got, vec![(0, 2), (2, 1)]);
        assert_eq!(
            s.reserve_batch(10, 0, 100, 10, &mut out),
            ReserveStop::AtCap
        );
        assert_eq!(out.len(), 5);
        assert_eq!(s.reserve_batch(10, 0, 100, 0, &mut out), ReserveStop::Max);
        assert_eq!(out.len(), 5);
        s.check_invariants();
    }

    #[test]
    fn reserve_batch_does_not_recycle_its_own_zero_length_leases() {
        // `reserve` three times at 5 with visibility 0 would lease offset 0 three times
        // (each call purges the previous zero-length lease); a batch purges once.
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let mut out = Vec::new();
        assert_eq!(s.reserve_batch(3, 5, 0, 3, &mut out), ReserveStop::Max);
        assert_eq!(
            out.iter().map(|l| l.offset).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(s.purge_expired(5), 3);
    }

    #[test]
    fn ack_batch_advances_the_frontier_once_and_answers_like_single_acks() {
        let mut single = InFlight::new(0, 0, limits(10, 2));
        let ls: Vec<Lease> = (0..8).map(|_| leased(single.reserve(8, 0, 100))).collect();
        let mut batch = single.clone();
        let h = |o: usize| (ls[o].offset, ls[o].nonce);
        // Two acked-ahead slots: 3 and 4 fill them; 6 is refused until the frontier acks
        // 0, 1, 2 carry `committed` past 3 and 4 and free both; then 6 and 7 park and 5
        // closes the gap. The second ack of 0 is stale.
        let items = [
            h(3),
            h(4),
            h(6),
            h(0),
            h(6),
            h(1),
            h(2),
            h(6),
            h(7),
            h(5),
            h(0),
        ];
        let want: Vec<Result<(), SettleError>> = items
            .iter()
            .map(|&(o, n)| single.ack(o, n, 0).map(|_| ()))
            .collect();
        use SettleError::{AckedAheadFull as Full, Gone};
        assert_eq!(
            want,
            vec![
                Ok(()),
                Ok(()),
                Err(Full),
                Ok(()),
                Err(Full),
                Ok(()),
                Ok(()),
                Ok(()),
                Ok(()),
                Ok(()),
                Err(Gone)
            ]
        );
        assert_eq!(batch.ack_batch(&items, 0), want);
        assert_eq!(batch.committed(), 8);
        assert_eq!(single.committed(), 8);
        batch.check_invariants();

        // A refused ack changes nothing: the lease stays live, the frontier stays put.
        let mut s = InFlight::new(0, 0, limits(10, 1));
        let ls: Vec<Lease> = (0..4).map(|_| leased(s.reserve(4, 0, 100))).collect();
        let got = s.ack_batch(&[(2, ls[2].nonce), (3, ls[3].nonce), (9, 1)], 0);
        assert_eq!(got, vec![Ok(()), Err(Full), Err(Gone)]);
        assert_eq!((s.committed(), s.in_flight(), s.acked_ahead()), (0, 3, 1));
        assert_eq!(
            s.ack_batch(&[(0, ls[0].nonce), (1, ls[1].nonce)], 0),
            vec![Ok(()); 2]
        );
        assert_eq!((s.committed(), s.in_flight(), s.acked_ahead()), (3, 1, 0));
        s.check_invariants();
    }

    #[test]
    fn nack_and_extend_batches_answer_per_item() {
        let mut s = InFlight::new(0, 0, limits(10, 10));
        let ls: Vec<Lease> = (0..3).map(|_| leased(s.reserve(3, 0, 100))).collect();
        let ext = s.extend_batch(&[(0, ls[0].nonce), (1, 77), (2, ls[2].nonce)], 10, Some(50));
        assert_eq!(
            ext,
            vec![
                Ok(Lease {
                    expires_at_ms: 60,
                    ..ls[0]
                }),
                Err(SettleError::Gone),
                Ok(Lease {
                    expires_at_ms: 60,
                    ..ls[2]
                }),
            ]
        );
        let nacked = s.nack_batch(
            &[(2, ls[2].nonce), (2, ls[2].nonce), (0, ls[0].nonce)],
            20,
            Some(5),
        );
        assert_eq!(nacked, vec![Ok(()), Err(SettleError::Gone), Ok(())]);
        assert_eq!((s.in_flight(), s.delayed()), (1, 2));
        assert_eq!(s.purge_expired(25), 2);
        s.check_invariants();
    }

    // ---------------- property tests against a naive model ----------------

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum St {
        /// Deliverable: never delivered (`count == 0`), or released and due.
        Free {
            count: u32,
        },
        /// Released; deliverable once a purge runs with `now >= ready_at`.
        Delayed {
            count: u32,
            ready_at: u64,
        },
        Leased {
            nonce: u64,
            expiry: u64,
            vis: u64,
            count: u32,
        },
        Acked,
        Corrupt,
        Dropped,
    }

    const FRESH: St = St::Free { count: 0 };

    /// Per-offset states for `[0, end)`, scanned naively.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Model {
        st: Vec<St>,
        committed: u64,
        last_nonce: u64,
        limits: Limits,
        redelivery: Redelivery,
        corrupt_total: u64,
        /// One past the highest offset ever leased (offsets are handed out lowest first).
        handed_end: u64,
    }

    /// The policy delay, computed the slow way (doubling step by step).
    fn naive_delay(r: &Redelivery, count: u32) -> u64 {
        let mut d = r.delay_ms;
        if r.backoff == Backoff::Exponential {
            for _ in 1..count {
                if d == 0 || d >= r.max_delay_ms {
                    break;
                }
                d = d.saturating_mul(2);
            }
        }
        d.min(r.max_delay_ms)
    }

    impl Model {
        fn end(&self) -> u64 {
            self.st.len() as u64
        }
        fn live(&self, o: u64, n: u64) -> bool {
            matches!(self.st.get(o as usize), Some(St::Leased { nonce, .. }) if *nonce == n)
        }
        fn leased_count(&self) -> usize {
            self.st
                .iter()
                .filter(|s| matches!(s, St::Leased { .. }))
                .count()
        }
        fn delayed_count(&self) -> usize {
            self.st
                .iter()
                .filter(|s| matches!(s, St::Delayed { .. }))
                .count()
        }
        fn acked_count(&self) -> usize {
            self.st[self.committed as usize..]
                .iter()
                .filter(|s| **s == St::Acked)
                .count()
        }
        fn count(&self, o: u64) -> u32 {
            match self.st.get(o as usize) {
                Some(St::Free { count } | St::Delayed { count, .. } | St::Leased { count, .. }) => {
                    *count
                }
                _ => 0,
            }
        }
        fn lowest_free(&self) -> Option<u64> {
            (self.committed..self.end()).find(|&o| matches!(self.st[o as usize], St::Free { .. }))
        }
        fn advance(&mut self) {
            while (self.committed as usize) < self.st.len()
                && matches!(
                    self.st[self.committed as usize],
                    St::Acked | St::Corrupt | St::Dropped
                )
            {
                self.committed += 1;
            }
        }
        /// A released offset: free at `ready_at` if that is not after `now`, else delayed.
        fn release(count: u32, ready_at: u64, now: u64) -> St {
            if ready_at <= now {
                St::Free { count }
            } else {
                St::Delayed { count, ready_at }
            }
        }
        /// Returns how many offsets became deliverable.
        fn purge(&mut self, now: u64) -> usize {
            let mut n = 0;
            let r = self.redelivery;
            for s in &mut self.st {
                match *s {
                    St::Leased { expiry, count, .. } if expiry <= now => {
                        let ready_at = expiry.saturating_add(naive_delay(&r, count));
                        *s = Self::release(count, ready_at, now);
                        n += usize::from(ready_at <= now);
                    }
                    St::Delayed { count, ready_at } if ready_at <= now => {
                        *s = St::Free { count };
                        n += 1;
                    }
                    _ => {}
                }
            }
            n
        }
        /// `reserve` without the purge.
        fn pick(&mut self, now: u64, vis: u64) -> Reserve {
            let Some(o) = self.lowest_free() else {
                return Reserve::Empty;
            };
            if self.leased_count() + self.delayed_count() >= self.limits.max_in_flight {
                return Reserve::AtCap;
            }
            let St::Free { count } = self.st[o as usize] else {
                unreachable!()
            };
            self.last_nonce = self.last_nonce.checked_add(1).unwrap_or(1);
            let expiry = now.saturating_add(vis);
            let count = count + 1;
            self.st[o as usize] = St::Leased {
                nonce: self.last_nonce,
                expiry,
                vis,
                count,
            };
            self.handed_end = self.handed_end.max(o + 1);
            Reserve::Leased(Lease {
                offset: o,
                nonce: self.last_nonce,
                expires_at_ms: expiry,
                delivery_count: count,
            })
        }
        fn reserve(&mut self, now: u64, vis: u64) -> Reserve {
            self.purge(now);
            self.pick(now, vis)
        }
        /// Purge once, then pick until `max` or a refusal.
        fn reserve_batch(&mut self, now: u64, vis: u64, max: usize) -> (Vec<Lease>, ReserveStop) {
            self.purge(now);
            let mut out = Vec::new();
            for _ in 0..max {
                match self.pick(now, vis) {
                    Reserve::Leased(l) => out.push(l),
                    Reserve::Empty => return (out, ReserveStop::Empty),
                    Reserve::AtCap => return (out, ReserveStop::AtCap),
                }
            }
            (out, ReserveStop::Max)
        }
        /// The batch as one purge and the literal sequence of single reserves.
        fn reserve_singles(&mut self, now: u64, vis: u64, max: usize) -> (Vec<Lease>, ReserveStop) {
            self.purge(now);
            let mut out = Vec::new();
            for _ in 0..max {
                match self.reserve(now, vis) {
                    Reserve::Leased(l) => out.push(l),
                    Reserve::Empty => return (out, ReserveStop::Empty),
                    Reserve::AtCap => return (out, ReserveStop::AtCap),
                }
            }
            (out, ReserveStop::Max)
        }
        fn ack(&mut self, o: u64, n: u64, now: u64) -> Result<u64, SettleError> {
            self.purge(now);
            if !self.live(o, n) {
                return Err(SettleError::Gone);
            }
            if o != self.committed && self.acked_count() >= self.limits.max_acked_ahead {
                return Err(SettleError::AckedAheadFull);
            }
            self.st[o as usize] = St::Acked;
            self.advance();
            Ok(self.committed)
        }
        fn nack(
            &mut self,
            o: u64,
            n: u64,
            now: u64,
            delay: Option<u64>,
        ) -> Result<(), SettleError> {
            self.purge(now);
            let count = match self.st.get(o as usize) {
                Some(St::Leased { nonce, count, .. }) if *nonce == n => *count,
                _ => return Err(SettleError::Gone),
            };
            let d = delay.unwrap_or_else(|| naive_delay(&self.redelivery, count));
            self.st[o as usize] = Self::release(count, now.saturating_add(d), now);
            Ok(())
        }
        /// `extend` without the purge.
        fn extend_live(
            &mut self,
            o: u64,
            n: u64,
            now: u64,
            vis: Option<u64>,
        ) -> Result<Lease, SettleError> {
            let (own, count) = match self.st.get(o as usize) {
                Some(St::Leased {
                    nonce, vis, count, ..
                }) if *nonce == n => (*vis, *count),
                _ => return Err(SettleError::Gone),
            };
            let vis = vis.unwrap_or(own);
            let expiry = now.saturating_add(vis);
            self.st[o as usize] = St::Leased {
                nonce: n,
                expiry,
                vis,
                count,
            };
            Ok(Lease {
                offset: o,
                nonce: n,
                expires_at_ms: expiry,
                delivery_count: count,
            })
        }
        fn extend(
            &mut self,
            o: u64,
            n: u64,
            now: u64,
            vis: Option<u64>,
        ) -> Result<Lease, SettleError> {
            self.purge(now);
            self.extend_live(o, n, now, vis)
        }
        fn skip(&mut self, o: u64, n: u64) -> u64 {
            if self.live(o, n) {
                self.st[o as usize] = St::Corrupt;
                self.corrupt_total += 1;
                self.advance();
            }
            self.committed
        }
        fn skip_run(&mut self, o: u64, n: u64, end: u64) -> u64 {
            if !self.live(o, n) {
                return self.committed;
            }
            if end <= o + 1 || o + 1 != self.handed_end {
                return self.skip(o, n);
            }
            for s in &mut self.st[o as usize..end as usize] {
                *s = St::Corrupt;
            }
            self.corrupt_total += end - o;
            self.handed_end = end;
            self.advance();
            self.committed
        }
        fn advance_to(&mut self, start: u64) {
            if start <= self.committed {
                return;
            }
            for s in &mut self.st[..start as usize] {
                *s = St::Dropped;
            }
            self.committed = start;
            self.handed_end = self.handed_end.max(start);
            self.advance();
        }
    }

    #[derive(Clone, Debug)]
    enum H {
        /// Index into the model's currently live leases (by offset).
        Live(usize),
        /// Index into every handle ever issued (mostly stale).
        Issued(usize),
        /// A live/issued handle with its nonce nudged (wrong nonce, right offset).
        Nudged(usize, u64),
        /// Arbitrary (offset, nonce), including nonce 0.
        Garbage(u64, u64),
    }

    #[derive(Clone, Debug)]
    enum Op {
        Reserve(u64),
        ReserveBatch(u64, usize),
        Ack(H),
        AckBatch(Vec<H>),
        Nack(H, Option<u64>),
        NackBatch(Vec<H>, Option<u64>),
        GiveBack(Vec<H>),
        Extend(H, Option<u64>),
        ExtendBatch(Vec<H>, Option<u64>),
        Skip(H),
        SkipRun(H, u64),
        Tick(u64),
        Purge,
        Grow(u64),
        AdvanceTo(u64),
        SetLimits(Limits),
        SetRedelivery(Redelivery),
    }

    fn handle() -> impl Strategy<Value = H> {
        prop_oneof![
            6 => any::<usize>().prop_map(H::Live),
            2 => any::<usize>().prop_map(H::Issued),
            1 => (any::<usize>(), 1..3u64).prop_map(|(i, d)| H::Nudged(i, d)),
            1 => (0..40u64, prop_oneof![Just(0u64), 0..300u64, any::<u64>()])
                .prop_map(|(o, n)| H::Garbage(o, n)),
        ]
    }

    fn handles() -> impl Strategy<Value = Vec<H>> {
        proptest::collection::vec(handle(), 0..8)
    }

    fn limits_strategy() -> impl Strategy<Value = Limits> {
        (0..6usize, 0..4usize).prop_map(|(a, b)| limits(a, b))
    }

    fn redelivery_strategy() -> impl Strategy<Value = Redelivery> {
        (
            prop_oneof![Just(Backoff::Fixed), Just(Backoff::Exponential)],
            prop_oneof![Just(0u64), 0..20u64],
            0..100u64,
        )
            .prop_map(|(backoff, delay, max)| policy(delay, backoff, max))
    }

    fn nack_delay() -> impl Strategy<Value = Option<u64>> {
        proptest::option::of(prop_oneof![Just(0u64), 1..30u64])
    }

    fn op() -> impl Strategy<Value = Op> {
        let vis = prop_oneof![Just(0u64), 1..40u64, Just(u64::MAX)];
        prop_oneof![
            8 => vis.clone().prop_map(Op::Reserve),
            3 => (vis.clone(), 0..6usize).prop_map(|(v, m)| Op::ReserveBatch(v, m)),
            6 => handle().prop_map(Op::Ack),
            3 => handles().prop_map(Op::AckBatch),
            2 => (handle(), nack_delay()).prop_map(|(h, d)| Op::Nack(h, d)),
            1 => (handles(), nack_delay()).prop_map(|(h, d)| Op::NackBatch(h, d)),
            1 => handles().prop_map(Op::GiveBack),
            3 => (handle(), proptest::option::of(vis.clone())).prop_map(|(h, v)| Op::Extend(h, v)),
            1 => (handles(), proptest::option::of(vis)).prop_map(|(h, v)| Op::ExtendBatch(h, v)),
            1 => handle().prop_map(Op::Skip),
            1 => (handle(), 0..6u64).prop_map(|(h, n)| Op::SkipRun(h, n)),
            3 => (0..30u64).prop_map(Op::Tick),
            1 => Just(Op::Purge),
            2 => (0..4u64).prop_map(Op::Grow),
            1 => any::<u64>().prop_map(Op::AdvanceTo),
            1 => limits_strategy().prop_map(Op::SetLimits),
            1 => redelivery_strategy().prop_map(Op::SetRedelivery),
        ]
    }

    /// What the harness has seen, independently of the model.
    #[derive(Default)]
    struct Seen {
        /// Every handle ever issued, in order.
        issued: Vec<(u64, u64)>,
        /// Offsets that were ever settled (acked, corrupt-skipped, retained away).
        ever_settled: HashSet<u64>,
        nonces: HashSet<u64>,
        /// Leases issued per offset.
        deliveries: HashMap<u64, u32>,
        /// Ready time of offsets seen delayed, until their next delivery.
        not_before: HashMap<u64, u64>,
    }

    impl Seen {
        /// Checks one lease handed out at `now` by a reserve over `[committed, end)`.
        fn leased(&mut self, l: &Lease, now: u64, committed: u64, end: u64) {
            assert!(
                !self.ever_settled.contains(&l.offset),
                "settled offset redelivered"
            );
            assert!(l.offset < end && l.offset >= committed);
            assert!(l.nonce != 0 && self.nonces.insert(l.nonce), "nonce reused");
            if let Some(t) = self.not_before.remove(&l.offset) {
                assert!(
                    now >= t,
                    "offset {} delivered at {now}, delayed until {t}",
                    l.offset
                );
            }
            let n = self.deliveries.entry(l.offset).or_insert(0);
            *n += 1;
            assert_eq!(l.delivery_count, *n, "delivery count of {}", l.offset);
            self.issued.push((l.offset, l.nonce));
        }
    }

    fn resolve(h: &H, model: &Model, issued: &[(u64, u64)]) -> (u64, u64) {
        let live: Vec<(u64, u64)> = model
            .st
            .iter()
            .enumerate()
            .filter_map(|(o, s)| match s {
                St::Leased { nonce, .. } => Some((o as u64, *nonce)),
                _ => None,
            })
            .collect();
        match h {
            H::Live(i) if !live.is_empty() => live[i % live.len()],
            H::Live(i) | H::Issued(i) if !issued.is_empty() => issued[i % issued.len()],
            H::Nudged(i, d) if !issued.is_empty() => {
                let (o, n) = issued[i % issued.len()];
                (o, n.wrapping_add(*d))
            }
            H::Garbage(o, n) => (*o, *n),
            _ => (0, 1),
        }
    }

    fn run(committed: u64, seed: u64, lim: Limits, end0: u64, ops: Vec<Op>) {
        let mut real = InFlight::new(committed, seed, lim);
        let mut model = Model {
            st: vec![St::Dropped; committed as usize],
            committed,
            last_nonce: seed,
            limits: lim,
            redelivery: Redelivery::default(),
            corrupt_total: 0,
            handed_end: committed,
        };
        model.st.resize((committed + end0) as usize, FRESH);
        let mut now = 0u64;
        // `now` of the last call that purged.
        let mut last_purge = 0u64;
        let mut seen = Seen {
            ever_settled: (0..committed).collect(),
            ..Seen::default()
        };

        for op in ops {
            let prev_committed = real.committed();
            let end = model.end();
            let cap = model.limits.max_in_flight;
            let batch = |hs: &[H], model: &Model, seen: &Seen| -> Vec<(u64, u64)> {
                hs.iter().map(|h| resolve(h, model, &seen.issued)).collect()
            };
            match &op {
                Op::Reserve(vis) => {
                    let got = real.reserve(end, now, *vis);
                    let want = model.reserve(now, *vis);
                    assert_eq!(got, want, "reserve");
                    if let Reserve::Leased(l) = got {
                        seen.leased(&l, now, real.committed(), end);
                        assert!(real.in_flight() + real.delayed() <= cap, "cap exceeded");
                    }
                }
                Op::ReserveBatch(vis, max) => {
                    let mut got = vec![Lease {
                        offset: u64::MAX,
                        nonce: 0,
                        expires_at_ms: 0,
                        delivery_count: 0,
                    }];
                    let stop = real.reserve_batch(end, now, *vis, *max, &mut got);
                    assert_eq!(got.remove(0).offset, u64::MAX, "reserve_batch must append");
                    let mut singles = model.clone();
                    let want = model.reserve_batch(now, *vis, *max);
                    assert_eq!((&got, stop), (&want.0, want.1), "reserve_batch");
                    if *vis > 0 {
                        // Nothing it grants expires within the call: exactly the single reserves.
                        assert_eq!(singles.reserve_singles(now, *vis, *max), want);
                        assert_eq!(singles, model);
                    }
                    let offsets: Vec<u64> = got.iter().map(|l| l.offset).collect();
                    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "not lowest first");
                    for l in &got {
                        seen.leased(l, now, real.committed(), end);
                    }
                    if !got.is_empty() {
                        assert!(real.in_flight() + real.delayed() <= cap, "cap exceeded");
                    }
                }
                Op::Ack(h) => {
                    let (o, n) = resolve(h, &model, &seen.issued);
                    let was_live = model.live(o, n);
                    let got = real.ack(o, n, now);
                    assert_eq!(got, model.ack(o, n, now), "ack({o},{n})");
                    if got.is_ok() {
                        assert!(was_live, "stale handle accepted");
                        seen.ever_settled.insert(o);
                    }
                }
                Op::AckBatch(hs) => {
                    let items = batch(hs, &model, &seen);
                    let got = real.ack_batch(&items, now);
                    // The model: one purge, then the literal sequence of single acks.
                    model.purge(now);
                    let want: Vec<_> = items
                        .iter()
                        .map(|&(o, n)| model.ack(o, n, now).map(|_| ()))
                        .collect();
                    assert_eq!(got, want, "ack_batch({items:?})");
                    for (&(o, _), r) in items.iter().zip(&got) {
                        if r.is_ok() {
                            seen.ever_settled.insert(o);
                        }
                    }
                }
                Op::Nack(h, delay) => {
                    let (o, n) = resolve(h, &model, &seen.issued);
                    let got = real.nack(o, n, now, *delay);
                    assert_eq!(got, model.nack(o, n, now, *delay), "nack({o},{n})");
                }
                Op::NackBatch(hs, delay) => {
                    let items = batch(hs, &model, &seen);
                    let got = real.nack_batch(&items, now, *delay);
                    model.purge(now);
                    let want: Vec<_> = items
                        .iter()
                        .map(|&(o, n)| model.nack(o, n, now, *delay))
                        .collect();
                    assert_eq!(got, want, "nack_batch({items:?})");
                }
                Op::GiveBack(hs) => {
                    let items = batch(hs, &model, &seen);
                    let got = real.give_back_batch(&items, now);
                    model.purge(now);
                    let want: Vec<_> = items
                        .iter()
                        .map(|&(o, n)| match model.st.get(o as usize) {
                            Some(St::Leased { nonce, count, .. }) if *nonce == n => {
                                model.st[o as usize] = St::Free { count: count - 1 };
                                Ok(())
                            }
                            _ => Err(SettleError::Gone),
                        })
                        .collect();
                    assert_eq!(got, want, "give_back_batch({items:?})");
                    for (&(o, _), r) in items.iter().zip(&got) {
                        if r.is_ok() {
                            *seen.deliveries.get_mut(&o).expect("a lease was issued") -= 1;
                        }
                    }
                }
                Op::Extend(h, vis) => {
                    let (o, n) = resolve(h, &model, &seen.issued);
                    let got = real.extend(o, n, now, *vis);
                    assert_eq!(got, model.extend(o, n, now, *vis), "extend({o},{n})");
                }
                Op::ExtendBatch(hs, vis) => {
                    let items = batch(hs, &model, &seen);
                    let got = real.extend_batch(&items, now, *vis);
                    model.purge(now);
                    let want: Vec<_> = items
                        .iter()
                        .map(|&(o, n)| model.extend_live(o, n, now, *vis))
                        .collect();
                    assert_eq!(got, want, "extend_batch({items:?})");
                }
                Op::Skip(h) => {
                    let (o, n) = resolve(h, &model, &seen.issued);
                    if model.live(o, n) {
                        seen.ever_settled.insert(o);
                    }
                    assert_eq!(real.skip_corrupt(o, n), model.skip(o, n), "skip({o},{n})");
                }
                Op::SkipRun(h, len) => {
                    let (o, n) = resolve(h, &model, &seen.issued);
                    let end = (o + 1 + len).min(model.end());
                    let was_live = model.live(o, n);
                    let got = real.skip_corrupt_run(o, n, end);
                    assert_eq!(got, model.skip_run(o, n, end), "skip_run({o},{n},{end})");
                    if was_live {
                        for x in o..end {
                            if model.st[x as usize] == St::Corrupt {
                                seen.ever_settled.insert(x);
                            }
                        }
                    }
                }
                Op::Tick(dt) => now += dt,
                Op::Purge => assert_eq!(real.purge_expired(now), model.purge(now), "purge"),
                Op::Grow(n) => {
                    let new_len = model.st.len() + *n as usize;
                    model.st.resize(new_len, FRESH);
                }
                Op::AdvanceTo(x) => {
                    let span = end - model.committed + 1;
                    let start = model.committed + x % span;
                    seen.ever_settled.extend(0..start);
                    real.advance_to(start);
                    model.advance_to(start);
                }
                Op::SetLimits(l) => {
                    real.set_limits(*l);
                    model.limits = *l;
                }
                Op::SetRedelivery(r) => {
                    real.set_redelivery(*r);
                    model.redelivery = *r;
                    assert_eq!(real.redelivery(), *r);
                    for n in 0..12 {
                        assert_eq!(r.delay_for(n), naive_delay(r, n), "delay_for({n})");
                    }
                }
            }

            // Cross-checks after every step.
            if !matches!(
                op,
                Op::Tick(_)
                    | Op::Grow(_)
                    | Op::Skip(_)
                    | Op::SkipRun(..)
                    | Op::AdvanceTo(_)
                    | Op::SetLimits(_)
                    | Op::SetRedelivery(_)
            ) {
                last_purge = now;
            }
            let end = model.end();
            real.check_invariants();
            assert_eq!(real.committed(), model.committed, "committed after {op:?}");
            assert!(real.committed() >= prev_committed, "committed went back");
            assert!(real.committed() <= end, "committed passed the log end");
            assert_eq!(real.cursor, model.handed_end, "cursor");
            assert_eq!(real.in_flight(), model.leased_count(), "in_flight");
            assert_eq!(real.delayed(), model.delayed_count(), "delayed");
            assert_eq!(real.acked_ahead(), model.acked_count(), "acked_ahead");
            assert_eq!(real.corrupt_skipped_total(), model.corrupt_total);
            assert_eq!(real.has_deliverable(end), model.lowest_free().is_some());
            let mut earliest = None;
            let mut note = |t: u64| earliest = Some(earliest.map_or(t, |m: u64| m.min(t)));
            for (o, s) in model.st.iter().enumerate() {
                let o = o as u64;
                assert_eq!(
                    real.delivery_count(o),
                    model.count(o),
                    "delivery count of {o}"
                );
                match *s {
                    St::Leased {
                        nonce,
                        expiry,
                        vis,
                        count,
                    } => {
                        let slot = real.leases.get(&o);
                        let want = Slot {
                            nonce,
                            expires_at_ms: expiry,
                            visibility_ms: vis,
                            delivery_count: count,
                        };
                        assert_eq!(slot, Some(&want));
                        assert_eq!(seen.deliveries.get(&o), Some(&count));
                        note(expiry);
                    }
                    St::Delayed { count, ready_at } => {
                        let want = Delayed {
                            ready_at_ms: ready_at,
                            delivery_count: count,
                        };
                        assert_eq!(real.delayed.get(&o), Some(&want));
                        assert_eq!(seen.deliveries.get(&o), Some(&count));
                        assert!(ready_at > last_purge, "a due offset is still delayed");
                        seen.not_before.insert(o, ready_at);
                        note(ready_at);
                    }
                    St::Free { count } => {
                        assert_eq!(seen.deliveries.get(&o).copied().unwrap_or(0), count);
                        if count > 0 {
                            assert_eq!(real.redeliver.get(&o), Some(&count));
                        }
                    }
                    St::Acked | St::Corrupt | St::Dropped => {
                        assert!(seen.ever_settled.contains(&o));
                    }
                }
            }
            if let Some(m) = earliest {
                let hint = real
                    .next_wakeup_ms()
                    .expect("lease or delay without a wake-up");
                assert!(hint <= m, "wake-up hint later than a deadline");
                assert_eq!(real.next_expiry_ms(), Some(hint));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        #[test]
        fn matches_reference_model(
            committed in prop_oneof![Just(0u64), 0..50u64],
            seed in prop_oneof![Just(0u64), 0..1_000u64, Just(u64::MAX - 3)],
            lim in limits_strategy(),
            end0 in 0..8u64,
            ops in proptest::collection::vec(op(), 1..250),
        ) {
            run(committed, seed, lim, end0, ops);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Roomy caps and a long log: exercises long runs, many redeliveries and heap compaction.
        #[test]
        fn matches_reference_model_roomy(
            seed in 0..1_000u64,
            ops in proptest::collection::vec(op(), 200..600),
        ) {
            run(0, seed, limits(40, 20), 30, ops);
        }
    }

    // ---------------- batch calls against single calls ----------------

    #[derive(Clone, Debug)]
    enum BOp {
        Reserve {
            vis: u64,
            max: usize,
        },
        /// `(live?, index)`: a live lease by offset rank, or any handle ever issued.
        Ack(Vec<(bool, usize)>),
        Nack(Vec<(bool, usize)>, Option<u64>),
        Extend(Vec<(bool, usize)>, Option<u64>),
        /// Corrupt-skip a live lease (by offset rank) on both.
        Skip(usize),
        Tick(u64),
        Grow(u64),
    }

    fn bop() -> impl Strategy<Value = BOp> {
        let picks =
            proptest::collection::vec((proptest::bool::weighted(0.8), any::<usize>()), 0..10);
        prop_oneof![
            4 => (1..50u64, 0..8usize).prop_map(|(vis, max)| BOp::Reserve { vis, max }),
            4 => picks.clone().prop_map(BOp::Ack),
            1 => (picks.clone(), nack_delay()).prop_map(|(p, d)| BOp::Nack(p, d)),
            1 => (picks, proptest::option::of(1..50u64)).prop_map(|(p, v)| BOp::Extend(p, v)),
            1 => any::<usize>().prop_map(BOp::Skip),
            2 => (0..30u64).prop_map(BOp::Tick),
            2 => (0..6u64).prop_map(BOp::Grow),
        ]
    }

    /// The same inputs, as batches on one shard and as single calls on a clone of it.
    /// (Visibilities are >= 1, so nothing a call grants can expire within it.)
    fn batch_vs_single(lim: Limits, r: Redelivery, ops: Vec<BOp>) {
        let mut batched = InFlight::new(0, 0, lim);
        batched.set_redelivery(r);
        let mut single = batched.clone();
        let mut issued: Vec<(u64, u64)> = Vec::new();
        let (mut now, mut end) = (0u64, 4u64);
        for op in ops {
            let pick = |ps: &[(bool, usize)], s: &InFlight, issued: &[(u64, u64)]| {
                let mut live: Vec<(u64, u64)> =
                    s.leases.iter().map(|(&o, l)| (o, l.nonce)).collect();
                live.sort_unstable();
                ps.iter()
                    .map(
                        |&(want_live, i)| match (want_live, live.len(), issued.len()) {
                            (true, n, _) if n > 0 => live[i % n],
                            (_, _, n) if n > 0 => issued[i % n],
                            _ => (0, 1),
                        },
                    )
                    .collect::<Vec<_>>()
            };
            if !matches!(op, BOp::Tick(_) | BOp::Grow(_) | BOp::Skip(_)) {
                // A batch call is one purge and then the single calls (whose own purges,
                // at the same `now`, then find nothing more to do).
                single.purge_expired(now);
            }
            match &op {
                BOp::Reserve { vis, max } => {
                    let mut got = Vec::new();
                    let stop = batched.reserve_batch(end, now, *vis, *max, &mut got);
                    let mut want = Vec::new();
                    let mut want_stop = ReserveStop::Max;
                    for _ in 0..*max {
                        match single.reserve(end, now, *vis) {
                            Reserve::Leased(l) => want.push(l),
                            Reserve::Empty => {
                                want_stop = ReserveStop::Empty;
                                break;
                            }
                            Reserve::AtCap => {
                                want_stop = ReserveStop::AtCap;
                                break;
                            }
                        }
                    }
                    assert_eq!((&got, stop), (&want, want_stop), "reserve_batch");
                    issued.extend(got.iter().map(|l| (l.offset, l.nonce)));
                }
                BOp::Ack(ps) => {
                    let items = pick(ps, &batched, &issued);
                    let got = batched.ack_batch(&items, now);
                    let want: Vec<_> = items
                        .iter()
                        .map(|&(o, n)| single.ack(o, n, now).map(|_| ()))
                        .collect();
                    assert_eq!(got, want, "ack_batch({items:?})");
                }
                BOp::Nack(ps, delay) => {
                    let items = pick(ps, &batched, &issued);
                    let got = batched.nack_batch(&items, now, *delay);
                    let want: Vec<_> = items
                        .iter()
                        .map(|&(o, n)| single.nack(o, n, now, *delay))
                        .collect();
                    assert_eq!(got, want, "nack_batch({items:?})");
                }
                BOp::Extend(ps, vis) => {
                    let items = pick(ps, &batched, &issued);
                    let got = batched.extend_batch(&items, now, *vis);
                    let want: Vec<_> = items
                        .iter()
                        .map(|&(o, n)| single.extend(o, n, now, *vis))
                        .collect();
                    assert_eq!(got, want, "extend_batch({items:?})");
                }
                BOp::Skip(i) => {
                    if let [(o, n)] = pick(&[(true, *i)], &batched, &issued)[..] {
                        assert_eq!(batched.skip_corrupt(o, n), single.skip_corrupt(o, n));
                    }
                }
                BOp::Tick(dt) => now += dt,
                BOp::Grow(n) => end += n,
            }
            batched.check_invariants();
            assert_eq!(
                batched.committed(),
                single.committed(),
                "committed after {op:?}"
            );
            assert_eq!(batched.in_flight(), single.in_flight());
            assert_eq!(batched.delayed(), single.delayed());
            assert_eq!(batched.acked_ahead(), single.acked_ahead());
            assert_eq!(batched.has_deliverable(end), single.has_deliverable(end));
            assert_eq!(batched.next_wakeup_ms(), single.next_wakeup_ms());
            for o in 0..end {
                assert_eq!(batched.delivery_count(o), single.delivery_count(o));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        #[test]
        fn batch_calls_match_single_calls(
            lim in (1..8usize, 0..4usize).prop_map(|(a, b)| limits(a, b)),
            r in redelivery_strategy(),
            ops in proptest::collection::vec(bop(), 1..120),
        ) {
            batch_vs_single(lim, r, ops);
        }
    }
}
