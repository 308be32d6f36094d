//! InFlight's unit tests; its property tests against a naive model are in `tests/model.rs`.

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

/// The acked-ahead set persisted as ranges and seeded into a fresh shard (a restart): the offsets it held are
/// never handed out again; every other offset above the frontier is, lowest first, undelivered (count 0).
#[test]
fn seeded_acks_are_not_handed_out_again() {
    let mut s = InFlight::new(0, 0, limits(10, 10));
    let ls: Vec<Lease> = (0..8).map(|_| leased(s.reserve(8, 0, 100))).collect();
    for i in [2, 3, 5, 7] {
        assert_eq!(s.ack(i, ls[i as usize].nonce, 0), Ok(0));
    }
    assert_eq!(s.acked_ranges(), vec![(2, 4), (5, 6), (7, 8)]);
    let version = s.acked_version();
    assert_eq!(s.ack(0, ls[0].nonce, 0), Ok(1));
    assert_eq!(
        s.acked_version(),
        version,
        "an ack at the frontier parks nothing"
    );
    let mut r = InFlight::new(s.committed(), 99, limits(10, 10));
    assert_eq!(r.seed_acked(&s.acked_ranges(), 10), 4);
    r.check_invariants();
    let offsets: Vec<u64> = (0..4)
        .map(|_| leased(r.reserve(10, 0, 100)).offset)
        .collect();
    assert_eq!(offsets, vec![1, 4, 6, 8]);
    assert_eq!(r.delivery_count(1), 1);
    assert_eq!(
        r.ack(1, leased_nonce(&r, 1), 0),
        Ok(4),
        "over the seeded 2..4"
    );
    r.check_invariants();
}

fn leased_nonce(s: &InFlight, offset: u64) -> u64 {
    s.leases[&offset].nonce
}

/// Seeding takes only acks below the log's end, at most `max_acked_ahead + max_in_flight` of them, and none past
/// `max_in_flight + max_acked_ahead` unsettled offsets above the frontier: the rest redeliver.
#[test]
fn seeded_acks_are_bounded_by_the_log_end_and_the_caps() {
    let mut r = InFlight::new(10, 0, limits(4, 3));
    assert_eq!(r.seed_acked(&[(12, 14), (15, 30)], 100), 7);
    assert_eq!(r.acked_ranges(), vec![(12, 14), (15, 20)]);
    r.check_invariants();
    // The unsettled offsets between: 2 + 26 fit in 34, 2 + 46 do not.
    let mut r = InFlight::new(10, 0, limits(4, 30));
    assert_eq!(r.seed_acked(&[(12, 14), (40, 50)], 100), 2 + 10);
    r.check_invariants();
    let mut r = InFlight::new(10, 0, limits(4, 30));
    assert_eq!(r.seed_acked(&[(12, 14), (60, 70)], 100), 2);
    assert_eq!(r.acked_ranges(), vec![(12, 14)]);
    r.check_invariants();
    let mut r = InFlight::new(10, 0, limits(4, 30));
    assert_eq!(r.seed_acked(&[(12, 14), (20, 25)], 22), 2 + 2);
    assert_eq!(r.acked_ranges(), vec![(12, 14), (20, 22)]);
    r.check_invariants();
    let mut r = InFlight::new(10, 0, limits(4, 30));
    assert_eq!(r.seed_acked(&[(12, 14)], 11), 0);
    assert_eq!((r.acked_ahead(), r.cursor), (0, 10));
    r.check_invariants();
}

proptest! {
    /// Whatever order acks come in, a shard seeded from another's committed frontier and acked ranges hands out
    /// exactly the offsets the other had not settled, below its cursor, and then goes on from there.
    #[test]
    fn a_seeded_shard_hands_out_exactly_what_was_unsettled(
        n in 1u64..40,
        acks in proptest::collection::vec(any::<u16>(), 0..60),
    ) {
        let mut s = InFlight::new(0, 0, limits(64, 64));
        let ls: Vec<Lease> = (0..n).map(|_| leased(s.reserve(n, 0, 1_000))).collect();
        let mut settled = HashSet::new();
        for a in acks {
            let l = ls[a as usize % ls.len()];
            if s.ack(l.offset, l.nonce, 0).is_ok() {
                settled.insert(l.offset);
            }
        }
        let mut r = InFlight::new(s.committed(), 7, limits(64, 64));
        r.seed_acked(&s.acked_ranges(), n + 5);
        r.check_invariants();
        let mut handed = Vec::new();
        while let Reserve::Leased(l) = r.reserve(n + 5, 0, 1_000) {
            handed.push(l.offset);
        }
        let expected: Vec<u64> = (s.committed()..n + 5).filter(|o| !settled.contains(o)).collect();
        prop_assert_eq!(handed, expected);
    }
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

/// A corrupt run reported on a fresh lease (nothing past it handed out) is settled in one step, at the frontier
/// and above it; on a lease with others handed out after it, only that offset is.
#[test]
fn a_corrupt_run_on_a_fresh_lease_is_skipped_in_one_step() {
    let mut s = InFlight::new(0, 0, limits(10, 10));
    let first = leased(s.reserve(100, 0, 1_000));
    assert_eq!(
        s.skip_corrupt_run(0, first.nonce, 5),
        5,
        "the whole run, at the frontier"
    );
    assert_eq!(s.corrupt_skipped_total(), 5);
    let head = leased(s.reserve(100, 0, 1_000));
    let above = leased(s.reserve(100, 0, 1_000));
    assert_eq!((head.offset, above.offset), (5, 6));
    assert_eq!(
        s.skip_corrupt_run(6, above.nonce, 9),
        5,
        "above the frontier"
    );
    assert_eq!(s.corrupt_skipped_total(), 8);
    assert_eq!(
        leased(s.reserve(100, 0, 1_000)).offset,
        9,
        "the run is never handed out"
    );
    s.check_invariants();
    assert_eq!(s.ack(head.offset, head.nonce, 0), Ok(9));
    // Not fresh: 11 was handed out after 10, so only 10 is skipped.
    let (ten, eleven) = (
        leased(s.reserve(100, 0, 1_000)),
        leased(s.reserve(100, 0, 1_000)),
    );
    assert_eq!((ten.offset, eleven.offset), (10, 11));
    assert_eq!(s.skip_corrupt_run(10, ten.nonce, 20), 9);
    assert_eq!(s.corrupt_skipped_total(), 9);
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

mod model;
