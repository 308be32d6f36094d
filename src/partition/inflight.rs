//! In-flight lease shard of ONE partition of a queue: the commit frontier, the live
//! reservations behind receipt handles, parked out-of-order acks and corrupt skips.
//! Driven only by the partition's owning core; it lives on that core alone (no locks,
//! no clock: every time-dependent call takes `now_ms`, no I/O).

use crate::storage::runs::Runs;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

/// The expiry heap is rebuilt from the live leases once it holds more than
/// `HEAP_SLACK_FACTOR * live + HEAP_SLACK_BASE` slots (superseded/stale slots pile up
/// under extends and acks). Amortised O(1) per push; keeps memory bounded by the caps.
/// (Test builds use a tiny base so the property tests exercise the rebuild often.)
const HEAP_SLACK_FACTOR: usize = 4;
const HEAP_SLACK_BASE: usize = if cfg!(test) { 2 } else { 64 };

/// Caps for one shard. Both may be changed at runtime with [`InFlight::set_limits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum number of live reservations; `reserve` answers `AtCap` at this count.
    pub max_in_flight: usize,
    /// Maximum number of parked out-of-order acks (offsets above `committed`).
    pub max_acked_ahead: usize,
}

/// One live reservation, i.e. what a receipt handle `partition:offset:nonce` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Log offset of the leased record.
    pub offset: u64,
    /// Fresh, never-zero nonce distinguishing this lease from earlier leases of the offset.
    pub nonce: u64,
    /// The lease is released (offset deliverable again) at the first purge with `now_ms >= expires_at_ms`.
    pub expires_at_ms: u64,
}

/// Outcome of [`InFlight::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The lowest deliverable offset was leased.
    Leased(Lease),
    /// Nothing is deliverable in `[committed, end)` (checked before the cap).
    Empty,
    /// Something is deliverable, but `in_flight() >= max_in_flight`.
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
}

/// In-flight state of one partition.
///
/// Invariant: `committed <= cursor`, and every offset in `[committed, cursor)` is in
/// exactly one of `leases`, `redeliver`, `acked_ahead`, `corrupt_runs`; nothing at or
/// above `cursor` is in any of them. `acked_ahead` and `corrupt_runs` hold only offsets
/// strictly above `committed` (the frontier is always fully advanced).
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
    /// Live reservations: offset -> (nonce, expiry). At most one per offset by construction.
    leases: HashMap<u64, Slot>,
    /// Offsets below `cursor` that were handed out and released (nack / expiry) and are
    /// deliverable again; served lowest first, before `cursor`.
    redeliver: BTreeSet<u64>,
    /// Out-of-order acks (offset > `committed`) parked until the gap beneath closes.
    /// At most `limits.max_acked_ahead` entries are ever added.
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
    /// (see [`InFlight::nonce_high_water`]).
    pub fn new(committed: u64, nonce_seed: u64, limits: Limits) -> Self {
        InFlight {
            committed,
            cursor: committed,
            last_nonce: nonce_seed,
            limits,
            leases: HashMap::new(),
            redeliver: BTreeSet::new(),
            acked_ahead: BTreeSet::new(),
            corrupt_runs: Runs::new(),
            corrupt_skipped_total: 0,
            expiry: BinaryHeap::new(),
        }
    }

    /// Replace the caps. Lowering them never revokes anything: existing leases and parked
    /// acks stay; new reservations / acked-ahead slots are refused until below the cap.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Current caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Every offset below this is settled.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Number of live reservations (including expired ones not yet purged).
    pub fn in_flight(&self) -> usize {
        self.leases.len()
    }

    /// Number of parked out-of-order acks.
    pub fn acked_ahead(&self) -> usize {
        self.acked_ahead.len()
    }

    /// Total corrupt skips reported to this shard.
    pub fn corrupt_skipped_total(&self) -> u64 {
        self.corrupt_skipped_total
    }

    /// The last nonce issued (or the seed, if none yet). A restarted shard must be seeded
    /// with at least this value so that old handles never match new leases.
    pub fn nonce_high_water(&self) -> u64 {
        self.last_nonce
    }

    /// Earliest deadline in the expiry heap. May belong to a stale slot; it is only a
    /// wake-up hint (a purge at that time may release nothing).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.expiry.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Release every lease whose `expires_at_ms <= now_ms`; the offsets become
    /// deliverable again. Returns how many were released.
    pub fn purge_expired(&mut self, now_ms: u64) -> usize {
        let mut released = 0;
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
                self.leases.remove(&offset);
                let fresh = self.redeliver.insert(offset);
                debug_assert!(fresh, "leased offset {offset} was also in redeliver");
                released += 1;
            }
        }
        released
    }

    /// Purges first, then leases the lowest unresolved offset in `[committed, end)` (not
    /// leased, not acked-ahead, not corrupt-skipped) until `now_ms + visibility_ms`.
    /// `end` is the exclusive end of what may be delivered (the durable log end).
    /// Returns `Empty` if there is nothing to deliver; the cap is checked only when there
    /// is, so `AtCap` always means "something is waiting".
    pub fn reserve(&mut self, end: u64, now_ms: u64, visibility_ms: u64) -> Reserve {
        self.purge_expired(now_ms);
        let Some(offset) = self.next_deliverable(end) else {
            return Reserve::Empty;
        };
        if self.leases.len() >= self.limits.max_in_flight {
            return Reserve::AtCap;
        }
        if offset == self.cursor {
            // offset < end <= u64::MAX, so this cannot overflow.
            self.cursor += 1;
        } else {
            let was_there = self.redeliver.remove(&offset);
            debug_assert!(
                was_there,
                "deliverable {offset} below cursor not in redeliver"
            );
        }
        let nonce = self.issue_nonce();
        let expires_at_ms = now_ms.saturating_add(visibility_ms);
        let prev = self.leases.insert(
            offset,
            Slot {
                nonce,
                expires_at_ms,
                visibility_ms,
            },
        );
        assert!(prev.is_none(), "offset {offset} leased twice");
        self.push_expiry(expires_at_ms, offset, nonce);
        Reserve::Leased(Lease {
            offset,
            nonce,
            expires_at_ms,
        })
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
            debug_assert!(offset > self.committed);
            if self.acked_ahead.len() >= self.limits.max_acked_ahead {
                return Err(SettleError::AckedAheadFull);
            }
            self.leases.remove(&offset);
            let fresh = self.acked_ahead.insert(offset);
            debug_assert!(fresh, "leased offset {offset} was also acked-ahead");
        }
        Ok(self.committed)
    }

    /// Purges first. Ok only if `offset` has a live lease with exactly this `nonce`.
    /// Releases the lease; the offset is deliverable again at once (lowest first).
    pub fn nack(&mut self, offset: u64, nonce: u64, now_ms: u64) -> Result<(), SettleError> {
        self.purge_expired(now_ms);
        if !self.is_live(offset, nonce) {
            return Err(SettleError::Gone);
        }
        self.leases.remove(&offset);
        let fresh = self.redeliver.insert(offset);
        debug_assert!(fresh, "leased offset {offset} was also in redeliver");
        Ok(())
    }

    /// Purges first. Ok only if `offset` has a live lease with exactly this `nonce`.
    /// Sets its expiry to `now_ms + visibility_ms` (which may be earlier than before), or,
    /// without a length, to `now_ms +` the length the lease was granted or last extended
    /// with; the nonce is unchanged. Returns the updated lease.
    pub fn extend(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
        visibility_ms: Option<u64>,
    ) -> Result<Lease, SettleError> {
        self.purge_expired(now_ms);
        match self.leases.get_mut(&offset) {
            Some(slot) if slot.nonce == nonce => {
                let visibility_ms = visibility_ms.unwrap_or(slot.visibility_ms);
                let expires_at_ms = now_ms.saturating_add(visibility_ms);
                slot.visibility_ms = visibility_ms;
                let changed = slot.expires_at_ms != expires_at_ms;
                slot.expires_at_ms = expires_at_ms;
                if changed {
                    self.push_expiry(expires_at_ms, offset, nonce);
                }
                Ok(Lease {
                    offset,
                    nonce,
                    expires_at_ms,
                })
            }
            _ => Err(SettleError::Gone),
        }
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
    /// leases / acked-ahead / corrupt / redelivery state below it; handles below `start`
    /// then get `Gone`. O(live leases), which is bounded by the cap; retention is rare.
    pub fn advance_to(&mut self, start: u64) {
        if start <= self.committed {
            return;
        }
        self.committed = start;
        self.cursor = self.cursor.max(start);
        self.leases.retain(|&offset, _| offset >= start);
        self.redeliver = self.redeliver.split_off(&start);
        self.acked_ahead = self.acked_ahead.split_off(&start);
        self.corrupt_runs.drop_below(start);
        self.advance_frontier();
        // Slots of dropped leases are now stale; shed them if they dominate the heap.
        self.maybe_compact_expiry();
    }

    /// Is anything deliverable in `[committed, end)` right now, ignoring the cap? O(1)-ish.
    /// Leases that have expired but not yet been purged do not count (use
    /// `next_expiry_ms` to schedule the purge that frees them).
    pub fn has_deliverable(&self, end: u64) -> bool {
        self.next_deliverable(end).is_some()
    }

    // ---- private helpers ----

    /// Lowest deliverable offset below `end`: the lowest released offset, else `cursor`.
    /// Every `redeliver` entry is below `cursor`, so this is the minimum of both.
    fn next_deliverable(&self, end: u64) -> Option<u64> {
        let candidate = self.redeliver.first().copied().unwrap_or(self.cursor);
        (candidate < end).then_some(candidate)
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
        debug_assert!(self.committed < self.cursor);
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
        debug_assert!(self.committed <= self.cursor);
    }

    /// Record `offset` (> committed, < cursor, not in any run) as corrupt, merging with
    /// adjacent runs so runs stay maximal.
    fn insert_corrupt(&mut self, offset: u64) {
        debug_assert!(offset > self.committed && offset < self.cursor);
        debug_assert!(
            !self.corrupt_runs.contains(offset),
            "offset {offset} already corrupt"
        );
        // offset < cursor <= u64::MAX, so this cannot overflow.
        self.corrupt_runs.insert(offset, offset + 1);
    }

    /// Test-only full consistency check (O(n)).
    #[cfg(test)]
    fn check_invariants(&self) {
        assert!(self.committed <= self.cursor);
        let in_range = |o: u64| o >= self.committed && o < self.cursor;
        let mut covered: u64 = 0;
        for &o in self.leases.keys() {
            assert!(in_range(o), "lease {o} outside [committed, cursor)");
            assert!(!self.redeliver.contains(&o) && !self.acked_ahead.contains(&o));
            assert!(!self.in_corrupt(o));
            covered += 1;
        }
        for &o in &self.redeliver {
            assert!(in_range(o), "redeliver {o} outside [committed, cursor)");
            assert!(!self.acked_ahead.contains(&o) && !self.in_corrupt(o));
            covered += 1;
        }
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
            assert_ne!(slot.nonce, 0);
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
    use std::collections::HashSet;

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
        assert_eq!(s.nack(0, first.nonce, 1_000), Err(SettleError::Gone));
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
        s.nack(2, ls[2].nonce, 0).expect("live");
        s.nack(1, ls[1].nonce, 0).expect("live");
        assert_eq!(s.nack(1, ls[1].nonce, 0), Err(SettleError::Gone));
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
                        s.nack(l.offset, l.nonce, now).expect("live");
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
        s.nack(1, ls[1].nonce, 0).expect("live");
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

    // ---------------- property tests against a naive model ----------------

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum St {
        Free,
        Leased { nonce: u64, expiry: u64, vis: u64 },
        Acked,
        Corrupt,
        Dropped,
    }

    /// Per-offset states for `[0, end)`, scanned naively.
    struct Model {
        st: Vec<St>,
        committed: u64,
        last_nonce: u64,
        limits: Limits,
        corrupt_total: u64,
        /// One past the highest offset ever leased (offsets are handed out lowest first).
        handed_end: u64,
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
        fn acked_count(&self) -> usize {
            self.st[self.committed as usize..]
                .iter()
                .filter(|s| **s == St::Acked)
                .count()
        }
        fn lowest_free(&self) -> Option<u64> {
            (self.committed..self.end()).find(|&o| self.st[o as usize] == St::Free)
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
        fn purge(&mut self, now: u64) -> usize {
            let mut n = 0;
            for s in &mut self.st {
                if matches!(s, St::Leased { expiry, .. } if *expiry <= now) {
                    *s = St::Free;
                    n += 1;
                }
            }
            n
        }
        fn reserve(&mut self, now: u64, vis: u64) -> Reserve {
            self.purge(now);
            let Some(o) = self.lowest_free() else {
                return Reserve::Empty;
            };
            if self.leased_count() >= self.limits.max_in_flight {
                return Reserve::AtCap;
            }
            self.last_nonce = self.last_nonce.checked_add(1).unwrap_or(1);
            let expiry = now.saturating_add(vis);
            self.st[o as usize] = St::Leased {
                nonce: self.last_nonce,
                expiry,
                vis,
            };
            self.handed_end = self.handed_end.max(o + 1);
            Reserve::Leased(Lease {
                offset: o,
                nonce: self.last_nonce,
                expires_at_ms: expiry,
            })
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
        fn nack(&mut self, o: u64, n: u64, now: u64) -> Result<(), SettleError> {
            self.purge(now);
            if !self.live(o, n) {
                return Err(SettleError::Gone);
            }
            self.st[o as usize] = St::Free;
            Ok(())
        }
        fn extend(
            &mut self,
            o: u64,
            n: u64,
            now: u64,
            vis: Option<u64>,
        ) -> Result<Lease, SettleError> {
            self.purge(now);
            let own = match self.st.get(o as usize) {
                Some(St::Leased { nonce, vis, .. }) if *nonce == n => *vis,
                _ => return Err(SettleError::Gone),
            };
            let vis = vis.unwrap_or(own);
            let expiry = now.saturating_add(vis);
            self.st[o as usize] = St::Leased {
                nonce: n,
                expiry,
                vis,
            };
            Ok(Lease {
                offset: o,
                nonce: n,
                expires_at_ms: expiry,
            })
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
        Ack(H),
        Nack(H),
        Extend(H, Option<u64>),
        Skip(H),
        SkipRun(H, u64),
        Tick(u64),
        Purge,
        Grow(u64),
        AdvanceTo(u64),
        SetLimits(Limits),
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

    fn limits_strategy() -> impl Strategy<Value = Limits> {
        (0..6usize, 0..4usize).prop_map(|(a, b)| limits(a, b))
    }

    fn op() -> impl Strategy<Value = Op> {
        let vis = prop_oneof![Just(0u64), 1..40u64, Just(u64::MAX)];
        prop_oneof![
            8 => vis.clone().prop_map(Op::Reserve),
            6 => handle().prop_map(Op::Ack),
            2 => handle().prop_map(Op::Nack),
            3 => (handle(), proptest::option::of(vis)).prop_map(|(h, v)| Op::Extend(h, v)),
            1 => handle().prop_map(Op::Skip),
            1 => (handle(), 0..6u64).prop_map(|(h, n)| Op::SkipRun(h, n)),
            3 => (0..30u64).prop_map(Op::Tick),
            1 => Just(Op::Purge),
            2 => (0..4u64).prop_map(Op::Grow),
            1 => any::<u64>().prop_map(Op::AdvanceTo),
            1 => limits_strategy().prop_map(Op::SetLimits),
        ]
    }

    fn run(committed: u64, seed: u64, lim: Limits, end0: u64, ops: Vec<Op>) {
        let mut real = InFlight::new(committed, seed, lim);
        let mut model = Model {
            st: vec![St::Dropped; committed as usize],
            committed,
            last_nonce: seed,
            limits: lim,
            corrupt_total: 0,
            handed_end: committed,
        };
        model.st.resize((committed + end0) as usize, St::Free);
        let mut now = 0u64;
        let mut issued: Vec<(u64, u64)> = Vec::new();
        let mut ever_settled: HashSet<u64> = (0..committed).collect();
        let mut seen_nonces: HashSet<u64> = HashSet::new();

        for op in ops {
            let prev_committed = real.committed();
            let end = model.end();
            let resolve = |h: &H, model: &Model, issued: &[(u64, u64)]| -> (u64, u64) {
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
            };
            match &op {
                Op::Reserve(vis) => {
                    let got = real.reserve(end, now, *vis);
                    let want = model.reserve(now, *vis);
                    assert_eq!(got, want, "reserve");
                    if let Reserve::Leased(l) = got {
                        assert!(
                            !ever_settled.contains(&l.offset),
                            "settled offset redelivered"
                        );
                        assert!(l.offset < end && l.offset >= real.committed());
                        assert!(l.nonce != 0 && seen_nonces.insert(l.nonce), "nonce reused");
                        issued.push((l.offset, l.nonce));
                    }
                }
                Op::Ack(h) => {
                    let (o, n) = resolve(h, &model, &issued);
                    let was_live = model.live(o, n);
                    let got = real.ack(o, n, now);
                    assert_eq!(got, model.ack(o, n, now), "ack({o},{n})");
                    if got.is_ok() {
                        assert!(was_live, "stale handle accepted");
                        ever_settled.insert(o);
                    }
                }
                Op::Nack(h) => {
                    let (o, n) = resolve(h, &model, &issued);
                    let got = real.nack(o, n, now);
                    assert_eq!(got, model.nack(o, n, now), "nack({o},{n})");
                }
                Op::Extend(h, vis) => {
                    let (o, n) = resolve(h, &model, &issued);
                    let got = real.extend(o, n, now, *vis);
                    assert_eq!(got, model.extend(o, n, now, *vis), "extend({o},{n})");
                }
                Op::Skip(h) => {
                    let (o, n) = resolve(h, &model, &issued);
                    if model.live(o, n) {
                        ever_settled.insert(o);
                    }
                    assert_eq!(real.skip_corrupt(o, n), model.skip(o, n), "skip({o},{n})");
                }
                Op::SkipRun(h, len) => {
                    let (o, n) = resolve(h, &model, &issued);
                    let end = (o + 1 + len).min(model.end());
                    let was_live = model.live(o, n);
                    let got = real.skip_corrupt_run(o, n, end);
                    assert_eq!(got, model.skip_run(o, n, end), "skip_run({o},{n},{end})");
                    if was_live {
                        for x in o..end {
                            if model.st[x as usize] == St::Corrupt {
                                ever_settled.insert(x);
                            }
                        }
                    }
                }
                Op::Tick(dt) => now += dt,
                Op::Purge => assert_eq!(real.purge_expired(now), model.purge(now), "purge"),
                Op::Grow(n) => {
                    let new_len = model.st.len() + *n as usize;
                    model.st.resize(new_len, St::Free);
                }
                Op::AdvanceTo(x) => {
                    let span = end - model.committed + 1;
                    let start = model.committed + x % span;
                    ever_settled.extend(0..start);
                    real.advance_to(start);
                    model.advance_to(start);
                }
                Op::SetLimits(l) => {
                    real.set_limits(*l);
                    model.limits = *l;
                }
            }

            // Cross-checks after every step.
            let end = model.end();
            real.check_invariants();
            assert_eq!(real.committed(), model.committed, "committed after {op:?}");
            assert!(real.committed() >= prev_committed, "committed went back");
            assert!(real.committed() <= end, "committed passed the log end");
            assert_eq!(real.in_flight(), model.leased_count(), "in_flight");
            assert_eq!(real.acked_ahead(), model.acked_count(), "acked_ahead");
            assert_eq!(real.corrupt_skipped_total(), model.corrupt_total);
            assert_eq!(real.has_deliverable(end), model.lowest_free().is_some());
            let mut min_expiry = None;
            for (o, s) in model.st.iter().enumerate() {
                match *s {
                    St::Leased { nonce, expiry, vis } => {
                        let slot = real.leases.get(&(o as u64));
                        assert_eq!(
                            slot,
                            Some(&Slot {
                                nonce,
                                expires_at_ms: expiry,
                                visibility_ms: vis,
                            })
                        );
                        min_expiry = Some(min_expiry.map_or(expiry, |m: u64| m.min(expiry)));
                    }
                    St::Acked | St::Corrupt | St::Dropped => {
                        assert!(ever_settled.contains(&(o as u64)));
                    }
                    St::Free => {}
                }
            }
            if let Some(m) = min_expiry {
                let hint = real.next_expiry_ms().expect("live lease without a wake-up");
                assert!(hint <= m, "wake-up hint later than a live deadline");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

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
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Roomy caps and a long log: exercises long runs, many redeliveries and heap compaction.
        #[test]
        fn matches_reference_model_roomy(
            seed in 0..1_000u64,
            ops in proptest::collection::vec(op(), 200..600),
        ) {
            run(0, seed, limits(40, 20), 30, ops);
        }
    }
}
