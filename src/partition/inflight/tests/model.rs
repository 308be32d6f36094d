//! InFlight against a naive per-offset model (proptest), and its batch calls against single calls.

use super::*;
use std::collections::BTreeSet;

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
    /// Read by a take while another offset of its message group was unsettled (FIFO).
    Held {
        count: u32,
    },
    Acked,
    Corrupt,
    Dropped,
}

/// The message group of an offset (FIFO ops): four groups, interleaved.
fn grp(o: u64) -> u64 {
    (o.wrapping_mul(7) + 3) % 4
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
    /// FIFO: each message group's head (the first admitted offset not settled).
    heads: HashMap<u64, u64>,
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
    /// Whether `o` is a FIFO group's head (leased whatever the cap: only its settling frees its group's held
    /// offsets).
    fn is_head(&self, o: u64) -> bool {
        self.heads.values().any(|&h| h == o)
    }
    fn held_count(&self) -> usize {
        self.st
            .iter()
            .filter(|s| matches!(s, St::Held { .. }))
            .count()
    }
    /// `o` settled: if it was its group's head, the group's lowest held offset is the head, deliverable.
    fn settled(&mut self, o: u64) {
        let g = grp(o);
        if self.heads.get(&g) != Some(&o) {
            return;
        }
        self.promote(g);
    }
    /// Group `g`'s head is gone: its lowest held offset is the head, deliverable.
    fn promote(&mut self, g: u64) {
        let next = (0..self.end())
            .find(|&x| grp(x) == g && matches!(self.st[x as usize], St::Held { .. }));
        match next {
            Some(x) => {
                let St::Held { count } = self.st[x as usize] else {
                    unreachable!()
                };
                self.st[x as usize] = St::Free { count };
                self.heads.insert(g, x);
            }
            None => {
                self.heads.remove(&g);
            }
        }
    }
    fn admit(&mut self, o: u64, n: u64) -> Result<bool, SettleError> {
        let count = match self.st.get(o as usize) {
            Some(St::Leased { nonce, count, .. }) if *nonce == n => *count,
            _ => return Err(SettleError::Gone),
        };
        let g = grp(o);
        match self.heads.get(&g) {
            None => {
                self.heads.insert(g, o);
                Ok(true)
            }
            Some(&h) if h == o => Ok(true),
            Some(_) => {
                self.st[o as usize] = St::Held { count: count - 1 };
                Ok(false)
            }
        }
    }
    fn admit_released(&mut self, o: u64) {
        if o >= self.handed_end {
            // Never handed out: not released.
            return;
        }
        let g = grp(o);
        let count = match self.st.get(o as usize) {
            Some(St::Free { count }) => *count,
            Some(St::Delayed { .. }) if self.heads.contains_key(&g) => return,
            Some(St::Delayed { count, .. }) => *count,
            _ => return,
        };
        if self.heads.values().any(|&h| h == o) {
            return;
        }
        match self.heads.entry(g) {
            std::collections::hash_map::Entry::Occupied(_) => {
                self.st[o as usize] = St::Held { count };
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(o);
            }
        }
    }
    fn acked_count(&self) -> usize {
        self.st[self.committed as usize..]
            .iter()
            .filter(|s| **s == St::Acked)
            .count()
    }
    fn count(&self, o: u64) -> u32 {
        match self.st.get(o as usize) {
            Some(
                St::Free { count }
                | St::Delayed { count, .. }
                | St::Leased { count, .. }
                | St::Held { count },
            ) => *count,
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
        let head = self.heads.values().any(|&h| h == o);
        if self.leased_count() + self.delayed_count() + self.held_count()
            >= self.limits.max_in_flight
            && !head
        {
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
        self.settled(o);
        self.advance();
        Ok(self.committed)
    }
    fn nack(&mut self, o: u64, n: u64, now: u64, delay: Option<u64>) -> Result<(), SettleError> {
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
    fn extend(&mut self, o: u64, n: u64, now: u64, vis: Option<u64>) -> Result<Lease, SettleError> {
        self.purge(now);
        self.extend_live(o, n, now, vis)
    }
    fn skip(&mut self, o: u64, n: u64) -> u64 {
        if self.live(o, n) {
            self.st[o as usize] = St::Corrupt;
            self.settled(o);
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
        self.settled(o);
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
        let gone: Vec<u64> = self
            .heads
            .iter()
            .filter(|&(_, &h)| h < start)
            .map(|(&g, _)| g)
            .collect();
        for g in gone {
            self.promote(g);
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
    /// Defer each lease to now + the delay (a delayed produce found at read).
    Defer(Vec<H>, u64),
    /// FIFO: the take read the lease's record, of group `grp(offset)`.
    Admit(H),
    /// FIFO: the take read an offset whose lease ended meanwhile.
    AdmitReleased(u64),
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
        1 => (handles(), 0..30u64).prop_map(|(h, d)| Op::Defer(h, d)),
        4 => handle().prop_map(Op::Admit),
        1 => (0..40u64).prop_map(Op::AdmitReleased),
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
    /// FIFO: offsets admitted as their group's head, per group (pruned of settled ones as it goes).
    admitted: HashMap<u64, BTreeSet<u64>>,
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
        heads: HashMap::new(),
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
                    // A FIFO head is leased whatever the cap; anything else only below it.
                    if !model.is_head(l.offset) {
                        assert!(real.unsettled_count() <= cap, "cap exceeded");
                    }
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
                if !got.is_empty() && !got.iter().any(|l| model.is_head(l.offset)) {
                    assert!(real.unsettled_count() <= cap, "cap exceeded");
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
            Op::Defer(hs, delay) => {
                let items = batch(hs, &model, &seen);
                let ready = now.saturating_add(*delay);
                let deferred: Vec<(u64, u64, u64)> =
                    items.iter().map(|&(o, n)| (o, n, ready)).collect();
                let got = real.defer_batch(&deferred, now);
                model.purge(now);
                let want: Vec<_> = items
                    .iter()
                    .map(|&(o, n)| match model.st.get(o as usize) {
                        Some(St::Leased { nonce, count, .. }) if *nonce == n => {
                            model.st[o as usize] = Model::release(count - 1, ready, now);
                            Ok(())
                        }
                        _ => Err(SettleError::Gone),
                    })
                    .collect();
                assert_eq!(got, want, "defer_batch({items:?})");
                for (&(o, _), r) in items.iter().zip(&got) {
                    if r.is_ok() {
                        *seen.deliveries.get_mut(&o).expect("a lease was issued") -= 1;
                    }
                }
            }
            Op::Admit(h) => {
                let (o, n) = resolve(h, &model, &seen.issued);
                let got = real.admit(o, n, format!("g{}", grp(o)).as_bytes());
                assert_eq!(got, model.admit(o, n), "admit({o},{n})");
                if let Ok(head) = got {
                    if head {
                        // At most one offset of a group is delivered and unsettled at a time. (Order within the
                        // group needs the take's precondition, admission in lease order, which these ops break.)
                        let delivered = seen.admitted.entry(grp(o)).or_default();
                        delivered.retain(|x| !seen.ever_settled.contains(x));
                        delivered.insert(o);
                        assert_eq!(
                            delivered.len(),
                            1,
                            "two of a group delivered: {delivered:?}"
                        );
                    } else {
                        *seen.deliveries.get_mut(&o).expect("a lease was issued") -= 1;
                    }
                }
            }
            Op::AdmitReleased(o) => {
                real.admit_released(*o, format!("g{}", grp(*o)).as_bytes());
                model.admit_released(*o);
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
                | Op::Admit(_)
                | Op::AdmitReleased(_)
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
        assert_eq!(real.held(), model.held_count(), "held");
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
                St::Held { count } => {
                    assert_eq!(seen.deliveries.get(&o).copied().unwrap_or(0), count);
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
    let picks = proptest::collection::vec((proptest::bool::weighted(0.8), any::<usize>()), 0..10);
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
            let mut live: Vec<(u64, u64)> = s.leases.iter().map(|(&o, l)| (o, l.nonce)).collect();
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
