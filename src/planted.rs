//! Bugs planted on purpose, so that the node simulation (`sim::nodes`) can show it finds them: each is a known way
//! to lose acknowledged records in a replicated partition. Test builds only: outside them [`planted`] is a constant
//! `false` and the checks compile away.

/// A bug the simulation must find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The commit offset moves once the leader alone has a record durable, not a majority (`partition/commit.rs`).
    MinorityCommit,
    /// A follower whose log diverges from its new leader's keeps its old tail (`Partition::truncate_diverged`).
    NoTruncation,
    /// A new leader serves without its fencing round: it fences no replica (an old leader goes on committing) and
    /// ranks no log (it may lack acknowledged records a majority holds) (`front/round.rs`).
    NoFencing,
    /// A replicated leader that restarts goes on leading at the epoch it led at before (`engine/admin.rs`), with
    /// no fencing round: it ships batches before its own sync, so its followers may hold records it lost, and it
    /// writes other records at those offsets in the same epoch.
    NoRenewal,
    /// A replicated leader whose log refuses appends until a restart keeps its partitions (`front/quorum.rs`):
    /// they stay unavailable while a majority of healthy replicas could serve them (a liveness bug, found when the
    /// healed cluster does not serve what was acknowledged).
    PoisonedLeaderStays,
    /// A replicated leader hands out leases without a lease of its own (`partition/lease.rs`): one deposed without
    /// hearing of it (its watch stalled, its followers out of reach) hands out again what its successor settled.
    NoLeaderLease,
    /// The journal's frontier records leave out the acks above the frontier (`Partition::moved_frontiers`), though
    /// the process counts them durable.
    AcksNotJournaled,
    /// A restart does not take back the acks above the frontier that were durable (`Partition::install_shard`).
    AcksNotSeeded,
}

#[cfg(test)]
thread_local! {
    static PLANTED: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Plants `bug` (None: none) for what runs on this thread from now on.
#[cfg(test)]
pub fn plant(bug: Option<Bug>) {
    PLANTED.with(|p| p.set(bug));
}

/// Whether `bug` is planted on this thread (always false outside test builds).
#[inline(always)]
pub fn planted(bug: Bug) -> bool {
    #[cfg(test)]
    {
        PLANTED.with(|p| p.get() == Some(bug))
    }
    #[cfg(not(test))]
    {
        let _ = bug;
        false
    }
}
