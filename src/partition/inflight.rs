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
use fifo::{Admitted, FifoGroups};
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
    /// Deliveries so far (0 for a delayed produce not yet delivered); the next lease gets one more.
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
/// - Delivery counts are >= 1 for leases (0 for an offset given back or deferred before it
///   reached a consumer) and are kept exactly for leased, redeliver and delayed
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
    /// Bumped at each offset parked in `acked_ahead`: the caller persists the set as ranges when it changed since
    /// it last did ([`InFlight::acked_version`]).
    acked_version: u64,
    /// Corrupt-skipped offsets above `committed`, as maximal disjoint half-open runs
    /// `start -> end`. Run-length encoded so a long stretch of unreadable records costs
    /// O(1) memory: the number of runs is bounded by the caps, not by the log.
    corrupt_runs: Runs,
    /// Total number of corrupt skips ever reported to this shard (since construction).
    corrupt_skipped_total: u64,
    /// Min-heap of `(expires_at_ms, offset, nonce)`. May hold stale slots (superseded by
    /// an extend, or whose lease was settled / released); those are skipped on pop.
    expiry: BinaryHeap<Reverse<(u64, u64, u64)>>,
    /// FIFO message groups (`admit`): each group's head, and the offsets held behind it. Empty unless the
    /// caller admits offsets (a FIFO topic).
    fifo: FifoGroups,
}

/// The part of the acks persisted above a frontier at `committed` (`acked`: ranges in canonical form) that
/// [`InFlight::seed_acked`] takes: only offsets below `end` (the log's end: under `fsync never` a crash may have lost
/// records an ack settled, and offsets there are new records to come), at most `max_acked_ahead + max_in_flight`
/// of them (acks park up to `max_acked_ahead`, dead-lettered leases beyond it), and none past more than
/// `max_in_flight + max_acked_ahead` unsettled offsets between the frontier and them (each becomes deliverable
/// again, so this bounds the memory a restart spends on them). Lower caps than when the acks were made, or a long
/// run of corrupt records under them, leave the higher ones out: they redeliver.
pub fn seedable(committed: u64, acked: &[(u64, u64)], end: u64, limits: Limits) -> Vec<(u64, u64)> {
    let mut room = (limits.max_acked_ahead as u64).saturating_add(limits.max_in_flight as u64);
    let mut gaps = room;
    let mut cursor = committed;
    let mut out = Vec::new();
    for &(start, stop) in acked {
        if start < cursor || start - cursor > gaps {
            break;
        }
        let stop = stop.min(end).min(start.saturating_add(room));
        if start >= stop {
            break;
        }
        gaps -= start - cursor;
        room -= stop - start;
        out.push((start, stop));
        cursor = stop;
    }
    out
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
            acked_version: 0,
            corrupt_runs: Runs::new(),
            corrupt_skipped_total: 0,
            expiry: BinaryHeap::new(),
            fifo: FifoGroups::default(),
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

    /// Number of offsets held behind their message group's head (FIFO topics: [`InFlight::admit`]). They count
    /// against `max_in_flight`.
    pub fn held(&self) -> usize {
        self.fifo.held_len()
    }

    /// How many held offsets became deliverable (their group's head settled) since the last call: consumers to
    /// wake.
    pub fn take_promoted(&mut self) -> usize {
        self.fifo.take_promoted()
    }

    /// Leases, delayed and held offsets: what `max_in_flight` caps.
    pub fn unsettled_count(&self) -> usize {
        self.leases.len() + self.delayed.len() + self.fifo.held_len()
    }

    /// Number of parked out-of-order acks.
    pub fn acked_ahead(&self) -> usize {
        self.acked_ahead.len()
    }

    /// Grows each time an ack is parked above the frontier: the acked-ahead set may differ from the one persisted
    /// at an older version (a set that only shrank did so as `committed` moved past it).
    pub fn acked_version(&self) -> u64 {
        self.acked_version
    }

    /// The parked out-of-order acks as half-open ranges `[start, end)`, sorted, disjoint and not touching (what
    /// the caller persists beside `committed`). O(parked acks).
    pub fn acked_ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &o in &self.acked_ahead {
            match out.last_mut() {
                Some(last) if last.1 == o => last.1 = o + 1,
                _ => out.push((o, o + 1)),
            }
        }
        out
    }

    /// Right after [`InFlight::new`]: the acks persisted above the frontier (`acked`, ranges in canonical form
    /// above `committed`) are settled again, so a restart does not deliver them; every offset between them is
    /// deliverable again (undelivered, count 0), lowest first, as after a restart without them. What is taken is
    /// [`seedable`]'s part of them (below the log's `end`, within the caps); the rest redeliver, as they did
    /// before acks were persisted. Returns how many acked offsets were taken.
    pub fn seed_acked(&mut self, acked: &[(u64, u64)], end: u64) -> u64 {
        assert!(
            self.cursor == self.committed && self.leases.is_empty() && self.acked_ahead.is_empty(),
            "acks are seeded into a fresh shard"
        );
        let mut taken = 0;
        for (start, stop) in seedable(self.committed, acked, end, self.limits) {
            assert!(
                start > self.cursor,
                "acked ranges in canonical form above the frontier"
            );
            for o in self.cursor..start {
                self.redeliver.insert(o, 0);
            }
            self.acked_ahead.extend(start..stop);
            self.cursor = stop;
            taken += stop - start;
        }
        taken
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
            self.fifo.held_count(offset).unwrap_or(0)
        }
    }

    /// The last nonce issued (or the seed, if none yet). A restarted shard must be seeded
    /// with at least this value so that old handles never match new leases.
    pub fn nonce_high_water(&self) -> u64 {
        self.last_nonce
    }

    /// The next nonce issued is above `nonce` (never lowers: a shard that draws from a window its partition shares
    /// with other groups continues from the window's last nonce).
    pub fn raise_nonce_floor(&mut self, nonce: u64) {
        self.last_nonce = self.last_nonce.max(nonce);
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
            .saturating_sub(self.unsettled_count());
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
            self.acked_version += 1;
        }
        self.fifo_settled(offset);
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
            self.acked_version += 1;
            self.fifo_settled(offset);
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

    /// Purges once, then defers each live `(offset, nonce, ready_at_ms)` lease whose record
    /// turned out not to be deliverable before `ready_at_ms` (a delayed produce): the delivery
    /// is not counted (its count goes back to what it was before this lease) and the offset
    /// waits in `delayed` until then, counted against `max_in_flight`, or is deliverable at
    /// once if that time has come. Stale handles are `Gone`, as for a nack.
    pub fn defer_batch(
        &mut self,
        items: &[(u64, u64, u64)],
        now_ms: u64,
    ) -> Vec<Result<(), SettleError>> {
        self.purge_expired(now_ms);
        items
            .iter()
            .map(|&(offset, nonce, ready_at_ms)| {
                if !self.is_live(offset, nonce) {
                    return Err(SettleError::Gone);
                }
                let slot = self.leases.remove(&offset).expect("live above");
                self.release(offset, slot.delivery_count - 1, ready_at_ms, now_ms);
                Ok(())
            })
            .collect()
    }

    /// FIFO topics: the take has read the live lease `(offset, nonce)` and its record belongs to message `group`.
    /// `Ok(true)`: the offset is its group's head (the group's first unsettled offset read); deliver it.
    /// `Ok(false)`: another offset of the group is unsettled, so this one is held: its lease is dropped (the
    /// delivery not counted), and it becomes deliverable when every offset of the group before it has settled.
    /// Held offsets count against `max_in_flight`. Stale handles are `Gone`. Does not purge.
    ///
    /// The caller admits one consumer group's offsets in the order it leased them, one take at a time, so that
    /// a group's head is its lowest unsettled offset.
    pub fn admit(&mut self, offset: u64, nonce: u64, group: &[u8]) -> Result<bool, SettleError> {
        let Some(slot) = self
            .leases
            .get(&offset)
            .filter(|s| s.nonce == nonce)
            .copied()
        else {
            return Err(SettleError::Gone);
        };
        match self.fifo.admit(offset, group, slot.delivery_count - 1) {
            Admitted::Head => Ok(true),
            Admitted::Held => {
                self.leases.remove(&offset);
                Ok(false)
            }
        }
    }

    /// FIFO topics: the take read `offset`'s record, of message `group`, but its lease ended meanwhile (it expired,
    /// or a guessed handle settled or released it). If it is still unsettled and not leased (deliverable again, or
    /// delayed), it takes its place in its group as [`InFlight::admit`] would have given it: its group's head when
    /// the group has none (it stays where it is), else held (out of the deliverable offsets; a delayed one is left
    /// delayed, to be admitted when read again). A settled, leased or already admitted offset is left alone. Does
    /// not purge.
    pub fn admit_released(&mut self, offset: u64, group: &[u8]) {
        if self.fifo.is_admitted(offset) || self.leases.contains_key(&offset) {
            return;
        }
        let count = match (self.redeliver.get(&offset), self.delayed.get(&offset)) {
            (Some(&count), _) => count,
            // A delayed one keeps its time: it is read again, and admitted, once due (as its group's head now if
            // the group has none, so that nothing of the group passes it meanwhile).
            (None, Some(_)) if self.fifo.has_group(group) => return,
            (None, Some(d)) => d.delivery_count,
            (None, None) => return,
        };
        // Held: out of the deliverable offsets, or out of the delayed ones.
        if self.fifo.admit(offset, group, count) == Admitted::Held
            && self.redeliver.remove(&offset).is_none()
        {
            let d = self
                .delayed
                .remove(&offset)
                .expect("a released offset is deliverable or delayed");
            let was_there = self.delay_order.remove(&(d.ready_at_ms, offset));
            assert!(was_there, "delayed {offset} missing from delay_order");
        }
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
        self.fifo_settled(offset);
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
        self.fifo_settled(offset);
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
        // Groups lose what lies below `start`; a held offset at or above it may become its group's head.
        for offset in self.fifo.admitted_below(start) {
            if let Some((next, count)) = self.fifo.settled(offset) {
                if next >= start {
                    self.make_deliverable(next, count);
                }
            }
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
        // A FIFO group's head released again is leased whatever the cap: its group's held offsets count against
        // the cap and only its settling frees them (a cap lowered below them would wedge the group otherwise).
        if self.unsettled_count() >= self.limits.max_in_flight && !self.fifo.is_head(offset) {
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

    /// `offset` left the unsettled offsets: a held offset of its message group may now be the head.
    fn fifo_settled(&mut self, offset: u64) {
        if let Some((next, count)) = self.fifo.settled(offset) {
            self.make_deliverable(next, count);
        }
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
            // A count of 0 is an offset deferred undelivered (`defer_batch`: a delayed produce).
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
        for o in self.fifo.held_offsets() {
            assert!(in_range(o), "held {o} outside [committed, cursor)");
            assert!(!self.leases.contains_key(&o) && !self.redeliver.contains_key(&o));
            assert!(!self.delayed.contains_key(&o));
            assert!(!self.acked_ahead.contains(&o) && !self.in_corrupt(o));
            covered += 1;
        }
        self.fifo.check(|head| {
            self.leases.contains_key(&head)
                || self.redeliver.contains_key(&head)
                || self.delayed.contains_key(&head)
        });
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

mod fifo;

#[cfg(test)]
mod tests;
