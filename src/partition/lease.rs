//! A replicated leader's lease on its takes (`docs/replication.md`, "The leader's lease"). A leader learns that a
//! newer leadership began only when a replica or its metastore view tells it; one cut off from both (its watch
//! stalled, its followers fenced by a newer round and then out of reach) would go on leasing from an ended
//! leadership, handing out again what its successor settled. So a replicated leader takes (hands out leases) only
//! while a majority of its voters, itself counted, answered a request of this leadership sent less than the lease
//! (`[cluster] replica_lease_ms`) ago, as Raft's leader leases do. A replica answers a leader's request only at an
//! epoch it has not fenced past (`stale_epoch` otherwise), and a new leadership's fencing round raises the floor of a
//! majority before it ends: every majority the old leader could count meets that one in a replica that answered it
//! last before the round ended. So the old leader's lease runs out at most one lease after the new round ended, and
//! the new leader takes nothing before that ([`Partition::start_serving`] sets `from`), with an eighth more for
//! clocks that run at slightly different rates; unless its round found that no other leadership served since its
//! own last one (it led the epoch before, and no floor of the round's answers is above it: `Began::floor`), as when a
//! replica set changes under the same leader. The monotonic clock must run while a process is paused (SIGSTOP);
//! a VM paused whole, its clock stopped with it, can outlive its lease unseen (as with Raft's leases).
//!
//! The shipper renews the lease with the answers it gets anyway (every batch, every probe: `front/replicate.rs`);
//! a partition that is consumed but not produced to asks for a renewal (an empty `ReplicateFrontiers` to each
//! follower, lagging or not) when a take finds its lease past half its length, and a take that finds it run out asks, then waits at most half a lease for the
//! answers. The lease is kept on the engine's monotonic clock; it bounds how long a deposed leader may still hand
//! out leases, not the leases themselves (a consumer's lease from an old leader may outlive its leadership, and the
//! new one hands the message out again once it has waited: at-least-once, as after any failover).

use super::Partition;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// The default lease: 1 s (`[cluster] replica_lease_ms`).
pub const DEFAULT_LEASE_MS: u64 = 1000;

/// What a leader calls to have its followers asked where they stand (their answers renew the lease).
pub type LeaseRenewer = Rc<dyn Fn()>;

/// A replicated leader's lease.
pub(super) struct Lease {
    /// Its length, ms.
    ms: Cell<u64>,
    /// Takes are served before this (engine ms): when the newest request a majority answered was sent, plus `ms`.
    until: Cell<u64>,
    /// A new leadership takes nothing before this (engine ms): its predecessor's lease has run out by then.
    from: Cell<u64>,
    /// When a renewal was last asked (engine ms; 0: never).
    asked: Cell<u64>,
    /// When a take last waited for a renewal in vain: for a lease after it, takes find the partition unavailable
    /// at once rather than each waiting again.
    failed: Cell<Option<u64>>,
    /// Whether the next round's end waits out a predecessor's lease (true unless the round found no other
    /// leadership could have served since this replica's last one: `Partition::wait_out_predecessor_next`).
    wait_next: Cell<bool>,
    /// Notified when `until` moves.
    moved: event_listener::Event,
    renewer: RefCell<Option<LeaseRenewer>>,
}

impl Lease {
    pub(super) fn new() -> Lease {
        Lease {
            ms: Cell::new(DEFAULT_LEASE_MS),
            until: Cell::new(0),
            from: Cell::new(0),
            asked: Cell::new(0),
            failed: Cell::new(None),
            wait_next: Cell::new(true),
            moved: event_listener::Event::new(),
            renewer: RefCell::new(None),
        }
    }
}

/// Why a take may not lease now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoLease {
    /// A new leadership waits out its predecessor's lease until then (engine ms).
    NotYet(u64),
    /// No majority answered this leader within a lease.
    Lapsed,
}

impl NoLease {
    /// The consumer's `503` reason.
    pub fn why(&self, partition: u32, now: u64) -> String {
        match self {
            NoLease::NotYet(at) => format!(
                "partition {partition}: a new leader waits {} ms more for its predecessor's lease to run out",
                at.saturating_sub(now)
            ),
            NoLease::Lapsed => format!(
                "partition {partition}: a majority of its replicas has not answered its leader within its lease (docs/replication.md, \"The leader's lease\")"
            ),
        }
    }
}

impl Partition {
    /// The lease's length (`[cluster] replica_lease_ms`), set by the engine before the partition leads.
    pub fn set_lease_ms(&self, ms: u64) {
        assert!(ms > 0, "a lease of no length");
        self.commit.lease.ms.set(ms);
    }

    pub fn lease_ms(&self) -> u64 {
        self.commit.lease.ms.get()
    }

    /// Until when (engine ms) the lease lets this leader take: 0 when it never held one in this leadership.
    pub fn lease_until(&self) -> u64 {
        self.commit.lease.until.get()
    }

    /// What the shipper calls to renew the lease (None: the stream ended).
    pub fn set_lease_renewer(&self, renewer: Option<LeaseRenewer>) {
        *self.commit.lease.renewer.borrow_mut() = renewer;
    }

    /// A majority of the voters answered a request of this leadership sent at `until - lease_ms`: it may take until
    /// `until`.
    pub fn lease_granted(&self, until: u64) {
        let lease = &self.commit.lease;
        if until > lease.until.get() {
            lease.until.set(until);
            lease.failed.set(None);
            lease.moved.notify(usize::MAX);
        }
    }

    /// This leader was deposed: a take waiting for a renewal stops waiting.
    pub(super) fn lease_interrupted(&self) {
        self.commit.lease.moved.notify(usize::MAX);
    }

    /// A new leadership (`Partition::lead`): nothing of the last one's lease holds (a wait it had not finished
    /// stays: `from` never moves back).
    pub(super) fn lease_ended(&self) {
        let lease = &self.commit.lease;
        lease.until.set(0);
        lease.failed.set(None);
    }

    /// The epoch this replica last began leading at (0: none in this process).
    pub fn leading_epoch(&self) -> u64 {
        self.commit.leading.get()
    }

    /// Set by a fencing round before it ends: whether another leadership may have served since this replica's
    /// last one (`Began::floor`), so that its end waits out that one's lease. A round that found none (this
    /// replica led the epoch before, every floor it met is at or below it: a replica set changed under the same
    /// leader, say) serves at once.
    pub fn wait_out_predecessor_next(&self, others: bool) {
        self.commit.lease.wait_next.set(others);
        if others {
            // At once, not only once the round's end is written: an end that fails (its history write) and a
            // retried round that then finds this epoch among its own must not take before it.
            self.raise_lease_from();
        }
    }

    /// No take before a lease and an eighth from now (`from` never moves back).
    fn raise_lease_from(&self) {
        let lease = &self.commit.lease;
        let ms = lease.ms.get();
        let from = self.clock.now_ms().saturating_add(ms + ms / 8);
        lease.from.set(lease.from.get().max(from));
    }

    /// Its fencing round ended: it takes nothing until its predecessor's lease has run out (unless the round found
    /// no other leadership could have served since its last one).
    pub(super) fn lease_wait_out_predecessor(&self) {
        if self.commit.lease.wait_next.replace(true) {
            self.raise_lease_from();
        }
    }

    /// Whether a take may lease at `now` (always, unreplicated).
    pub(super) fn lease_holds(&self, now: u64) -> Result<(), NoLease> {
        if !self.replicated() || crate::planted::planted(crate::planted::Bug::NoLeaderLease) {
            return Ok(());
        }
        let lease = &self.commit.lease;
        // A predecessor's lease is waited out even by a leader that is now its partition's only voter.
        if now < lease.from.get() {
            return Err(NoLease::NotYet(lease.from.get()));
        }
        if !self.needs_lease() || now < lease.until.get() {
            return Ok(());
        }
        Err(NoLease::Lapsed)
    }

    /// Before a take: Ok when the lease holds (a renewal is asked when it is past half its length); when it ran
    /// out, a renewal is asked and waited for, at most half a lease (not again for a lease after a wait in vain).
    pub(super) async fn await_lease(&self) -> Result<(), NoLease> {
        if !self.needs_lease() {
            return self.lease_holds(self.clock.now_ms());
        }
        let lease = &self.commit.lease;
        let ms = lease.ms.get();
        let now = self.clock.now_ms();
        // Renewed ahead of need: when less than half a lease is left at the time takes may begin (now, or after a
        // new leader's wait), at most every eighth of a lease.
        let needed_from = now.max(lease.from.get());
        if lease.until.get() < needed_from.saturating_add(ms / 2)
            && now >= lease.asked.get().saturating_add(ms / 8)
        {
            self.ask_lease_renewal(now);
        }
        match self.lease_holds(now) {
            Ok(()) => return Ok(()),
            Err(NoLease::NotYet(at)) => return Err(NoLease::NotYet(at)),
            Err(NoLease::Lapsed) => {}
        }
        if lease.asked.get() != now {
            self.ask_lease_renewal(now);
        }
        if lease
            .failed
            .get()
            .is_some_and(|at| now < at.saturating_add(ms))
        {
            return Err(NoLease::Lapsed);
        }
        let deadline = now + (ms / 2).max(1);
        loop {
            let moved = lease.moved.listen();
            if self.deposed().is_some() {
                // A newer leadership began meanwhile (`Partition::depose` wakes this): no lease to wait for, and
                // a replica about to follow need not wait out this take.
                return Err(NoLease::Lapsed);
            }
            let now = self.clock.now_ms();
            match self.lease_holds(now) {
                Ok(()) => return Ok(()),
                Err(NoLease::NotYet(at)) => return Err(NoLease::NotYet(at)),
                Err(NoLease::Lapsed) if now >= deadline || self.renewer_missing() => {
                    lease.failed.set(Some(now));
                    return Err(NoLease::Lapsed);
                }
                Err(NoLease::Lapsed) => {}
            }
            futures_lite::future::or(moved, async {
                self.clock.sleep_until(deadline).await;
            })
            .await;
        }
    }

    /// A take refused for want of a lease: unavailable, and when to look again if it is a matter of time.
    pub(super) fn without_lease(&self, no: NoLease) -> super::Taken {
        let now = self.clock.now_ms();
        super::Taken {
            deliveries: Vec::new(),
            stop: Some(super::Stop::Unavailable),
            why: Some(no.why(self.id, now)),
            deferred: false,
            // A long poll looks again: at the new leader's time, or a quarter lease on (a majority may answer).
            retry_in_ms: match no {
                NoLease::NotYet(at) => Some(at.saturating_sub(now).max(1)),
                NoLease::Lapsed => Some((self.lease_ms() / 4).max(1)),
            },
        }
    }

    /// A replicated partition with another voter: a leader that is its only voter (R = 2 with the other replica a
    /// learner the partition key names, or a replica set moving through one voter) is deposed by any round that
    /// could follow it, and needs no lease of its own (it still waits out a predecessor's: `lease_holds`).
    fn needs_lease(&self) -> bool {
        self.replicated()
            && self.lease_voters() > 1
            && !crate::planted::planted(crate::planted::Bug::NoLeaderLease)
    }

    /// The partition's voters, this leader included: its replicas but the learners its key names.
    pub fn lease_voters(&self) -> usize {
        (self.commit.replicas.get() as usize).saturating_sub(self.commit.learners.borrow().len())
    }

    /// Whether the partition key names `node` a learner (it counts for no majority).
    pub fn names_learner(&self, node: u32) -> bool {
        self.commit.learners.borrow().contains(&node)
    }

    fn renewer_missing(&self) -> bool {
        self.commit.lease.renewer.borrow().is_none()
    }

    fn ask_lease_renewal(&self, now: u64) {
        self.commit.lease.asked.set(now);
        let renewer = self.commit.lease.renewer.borrow().clone();
        if let Some(renew) = renewer {
            renew();
        }
    }
}
