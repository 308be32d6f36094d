//! A replicated partition's commit rule (`docs/replication.md` §4 and step 3), on its leader: an offset is
//! **committed** once a majority of the partition's R replicas (the leader included) has it durable. The leader's
//! own durable end is its log's end; each follower's is the end it last answered to a shipped batch or a probe
//! (`front/replicate.rs` calls [`Partition::follower_acked`]). Only committed records are served (taken, replayed,
//! counted as deliverable, or used as a new group's `latest` start), and a produce is answered only once its records
//! are committed ([`Partition::wait_committed`]).
//!
//! The commit offset lives in memory only: a leader that starts again starts at its log's start and serves nothing
//! above it until a majority has answered (its followers are probed when the partition opens), so a record it holds
//! alone is never served. For R = 1 nothing here applies: the readable end is the log's end, as before.

use super::{bump, Partition, PartitionError};
use std::time::Duration;

/// Where a replicated partition's commit stands.
pub(super) struct Commit {
    /// R, the leader included (1: not replicated).
    pub(super) replicas: std::cell::Cell<u32>,
    /// Every offset below it is durable on a majority.
    pub(super) end: std::cell::Cell<u64>,
    /// Each follower's durable end, as it last answered (a follower that never answered is not here).
    pub(super) acked: std::cell::RefCell<Vec<(u32, u64)>>,
    /// Notified when `end` moves, when the partition closes, and when it is deposed.
    pub(super) moved: event_listener::Event,
    /// Some(epoch) once this leader learned that a newer leadership (that epoch) began: it serves nothing more
    /// (`Partition::depose`).
    pub(super) deposed: std::cell::Cell<Option<u64>>,
    /// The newest epoch this replica began leading at (0: none): a deposition by it or an older one is a stale
    /// answer to an older stream, not a newer leadership.
    pub(super) leading: std::cell::Cell<u64>,
    /// Takes under way (they hold the group shards across awaits): a replica that starts following waits them out
    /// before it drops the shards (`Serving`).
    pub(super) serving: std::cell::Cell<usize>,
    pub(super) served: event_listener::Event,
    /// Where the epoch it leads at starts in its log (its history's entry for that epoch): the commit offset moves
    /// only once a majority has everything below it, each replica holding that entry (Raft's figure 8: a record of
    /// an older epoch is never served on the strength of its replica count alone; `docs/replication.md`, step 4).
    pub(super) since: std::cell::Cell<u64>,
    /// Some(epoch) while the fencing round of a leadership at that epoch is under way (it serves nothing yet).
    pub(super) round: std::cell::Cell<Option<u64>>,
    /// Followers the partition key names learners (added by a move, not promoted yet): their answers are recorded
    /// (a move waits for them to be in sync) but the majority is over the other replicas, so a learner being
    /// caught up never holds the commit back.
    pub(super) learners: std::cell::RefCell<Vec<u32>>,
    /// Some(epoch): this replica led at that epoch before a restart, and waits to be named leader at a newer one
    /// (`Partition::renew`); it leads at no epoch up to it.
    pub(super) renewing: std::cell::Cell<Option<u64>>,
    /// The leader's lease on its takes (`lease.rs`).
    pub(super) lease: super::lease::Lease,
}

/// While it lives a take is under way on the partition.
pub(super) struct Serving<'a>(&'a Commit);

impl<'a> Serving<'a> {
    pub(super) fn start(commit: &'a Commit) -> Serving<'a> {
        commit.serving.set(commit.serving.get() + 1);
        Serving(commit)
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.serving.set(self.0.serving.get() - 1);
        self.0.served.notify(usize::MAX);
    }
}

impl Commit {
    pub(super) fn new() -> Commit {
        Commit {
            replicas: std::cell::Cell::new(1),
            end: std::cell::Cell::new(0),
            acked: std::cell::RefCell::new(Vec::new()),
            moved: event_listener::Event::new(),
            deposed: std::cell::Cell::new(None),
            leading: std::cell::Cell::new(0),
            serving: std::cell::Cell::new(0),
            served: event_listener::Event::new(),
            since: std::cell::Cell::new(0),
            round: std::cell::Cell::new(None),
            learners: std::cell::RefCell::new(Vec::new()),
            renewing: std::cell::Cell::new(None),
            lease: super::lease::Lease::new(),
        }
    }
}

/// The majority-durable end among `ends` (the leader's first), for `replicas` replicas: the `⌊R/2⌋ + 1`-th largest,
/// or None while fewer replicas than a majority have answered.
pub fn majority_end(replicas: u32, ends: &mut [u64]) -> Option<u64> {
    let majority = (replicas / 2 + 1) as usize;
    if ends.len() < majority {
        return None;
    }
    ends.sort_unstable_by(|a, b| b.cmp(a));
    Some(ends[majority - 1])
}

impl Partition {
    /// Makes this leader's partition replicated over `replicas` replicas (itself included), before it serves anything.
    /// From here on only committed records are served, starting from nothing above the log's start.
    pub fn set_replicas(&self, replicas: u32) {
        assert!(replicas >= 1, "a partition has at least its leader");
        self.commit.replicas.set(replicas);
        self.set_commit_end(if replicas > 1 {
            self.log.start_offset()
        } else {
            0
        });
        self.commit.acked.borrow_mut().clear();
        // What its followers had is learnt again from their answers (the set may have changed with the epoch).
        self.followers.borrow_mut().clear();
    }

    /// The replicas the partition key names learners: they count for no majority (`Commit::learners`). Set with the
    /// replica count, before the partition leads at a new epoch.
    pub fn set_learners(&self, learners: &[u32]) {
        *self.commit.learners.borrow_mut() = learners.to_vec();
    }

    /// Whether this leadership's commit has reached where it began (a majority of the current replicas holds every
    /// record up to there): before that the commit offset says nothing about the followers (it starts at the log's
    /// start at every new epoch). Always true for an unreplicated partition.
    pub fn commit_settled(&self) -> bool {
        !self.replicated() || self.commit.end.get() >= self.commit.since.get()
    }

    /// Whether produces wait for followers and consumers see only committed records.
    pub fn replicated(&self) -> bool {
        self.commit.replicas.get() > 1
    }

    /// The end of what may be served: the log's end, or for a replicated partition the commit offset (never above
    /// the log's end).
    pub fn readable_end(&self) -> u64 {
        let end = self.log.end_offset();
        if self.replicated() {
            end.min(self.commit.end.get())
        } else {
            end
        }
    }

    /// A listener that fires when more records become readable (register before checking `readable_end`).
    pub fn listen_readable(&self) -> event_listener::EventListener {
        if self.replicated() {
            self.commit.moved.listen()
        } else {
            self.log.listen_appended()
        }
    }

    /// A durable frontier at `offset` was read at load: it covers only what was served, so a majority has it.
    pub(super) fn committed_at_least(&self, offset: u64) {
        if self.replicated() && offset > self.commit.end.get() {
            // (Above the log's end only when the log lost records: the load moves its end up to the frontier.)
            self.set_commit_end(offset);
        }
    }

    /// A follower answered: every offset below `end` is durable on node `node`. Moves the commit offset when a
    /// majority now has more, and wakes consumers for what became readable.
    pub fn follower_acked(&self, node: u32, end: u64) {
        if !self.replicated() {
            return;
        }
        {
            let mut acked = self.commit.acked.borrow_mut();
            match acked.iter_mut().find(|(n, _)| *n == node) {
                // A follower's durable end only grows (its disk lost is a new replica: step 5).
                Some((_, e)) => *e = (*e).max(end),
                None => acked.push((node, end)),
            }
        }
        self.recompute_commit();
    }

    /// The end the commit counts follower `node` for (0: none): what it was ever credited with in this leadership,
    /// which a learner on that node must hold again before it is promoted.
    pub fn follower_counted(&self, node: u32) -> u64 {
        self.commit
            .acked
            .borrow()
            .iter()
            .find(|(n, _)| *n == node)
            .map_or(0, |&(_, e)| e)
    }

    /// The leader's own log grew: with followers ahead of it (they cannot be, today), the commit may move.
    pub(super) fn leader_appended(&self, n: usize) {
        bump(&self.counters.produced, n as u64);
        if self.replicated() {
            self.recompute_commit();
        } else {
            self.wake_consumers(None, n);
        }
    }

    /// Moves the commit offset, and tells the log's writer, which may hold a batch for it (`Log::commit_at`;
    /// an unreplicated partition's holds nothing).
    fn set_commit_end(&self, end: u64) {
        self.commit.end.set(end);
        self.log
            .commit_at(if self.replicated() { end } else { u64::MAX });
    }

    fn recompute_commit(&self) {
        let leader = self.log.end_offset();
        let learners = self.commit.learners.borrow();
        let mut ends: Vec<u64> = std::iter::once(leader)
            .chain(
                self.commit
                    .acked
                    .borrow()
                    .iter()
                    .filter(|(n, _)| !learners.contains(n))
                    .map(|&(_, e)| e.min(leader)),
            )
            .collect();
        let voters = self
            .commit
            .replicas
            .get()
            .saturating_sub(learners.len() as u32)
            .max(1);
        drop(learners);
        let voters = if crate::planted::planted(crate::planted::Bug::MinorityCommit) {
            1
        } else {
            voters
        };
        let Some(majority) = majority_end(voters, &mut ends) else {
            return;
        };
        if majority < self.commit.since.get() {
            // Not yet on a majority up to where this leadership began: nothing more is committed (figure 8).
            return;
        }
        let old = self.commit.end.get();
        if majority > old {
            self.set_commit_end(majority);
            assert!(
                self.commit.end.get() <= self.log.end_offset(),
                "a commit offset past the leader's durable end"
            );
            self.commit.moved.notify(usize::MAX);
            self.wake_consumers(None, (majority - old) as usize);
        }
    }

    /// Waits until every offset below `end` is committed, at most `timeout`: `NotEnoughReplicas` after that (the
    /// records stay in the leader's log and may still be committed later), `Closed` when the partition closes first.
    pub async fn wait_committed(&self, end: u64, timeout: Duration) -> Result<(), PartitionError> {
        if !self.replicated() {
            return Ok(());
        }
        let deadline = self.clock.now_ms() + timeout.as_millis() as u64;
        loop {
            let moved = self.commit.moved.listen();
            // Deposed first: once a newer leader's round fenced this one, what its commit offset says may rest on
            // its own records written after the round read its end, so nothing more is acknowledged here.
            self.check_leading()?;
            if self.commit.end.get() >= end {
                return Ok(());
            }
            if self.closed.get() {
                return Err(PartitionError::Closed);
            }
            if self.clock.now_ms() >= deadline {
                let have = 1 + self
                    .commit
                    .acked
                    .borrow()
                    .iter()
                    .filter(|&&(_, e)| e >= end)
                    .count();
                return Err(PartitionError::NotEnoughReplicas(format!(
                    "{have} of {} replicas have the records durable after {} ms; a majority is needed",
                    self.commit.replicas.get(),
                    timeout.as_millis()
                )));
            }
            futures_lite::future::or(moved, async {
                self.clock.sleep_until(deadline).await;
            })
            .await;
        }
    }

    /// At close: produces waiting for their commit give up.
    pub(super) fn wake_commit_waiters(&self) {
        self.commit.moved.notify(usize::MAX);
    }

    /// This leader learned that a leadership of `epoch` began (its metadata names another leader, or a replica
    /// answered `stale_epoch`, or a new leader's fencing reached it): from now on it appends, leases and settles
    /// nothing (`503 partition_unavailable`: the client retries and is routed to the new leader), and the produces
    /// waiting for their commit are answered so at once (their records may or may not survive: a retry can
    /// duplicate, never lose). Its log stays as it is, for the new leader's truncation. Only a newer epoch than
    /// the one it leads at counts.
    pub fn depose(&self, epoch: u64) {
        if self.commit.deposed.get().is_some_and(|d| d >= epoch)
            || epoch <= self.commit.leading.get()
        {
            return;
        }
        tracing::warn!(dir = %self.dir.display(), epoch, "a newer leadership began: this leader serves the partition no more");
        self.commit.deposed.set(Some(epoch));
        self.forget_dedup();
        self.close_nonces();
        self.commit.moved.notify(usize::MAX);
        self.lease_interrupted();
        // Its writer holds nothing more for a commit that will not come.
        self.log.commit_at(u64::MAX);
        self.wake_consumers(None, 1);
    }

    /// A follower replica is about to lead at `epoch`, over `replicas` replicas (itself included): until
    /// [`Partition::lead`] has run it serves nothing (`503`), and whatever reaches it meanwhile waits for a majority.
    /// Called before anything awaits once the roles are swapped, so no produce or take finds it unreplicated.
    pub fn prepare_to_lead(&self, epoch: u64, replicas: u32) {
        self.commit.deposed.set(Some(epoch));
        // Its deduplication ids come from its log, read at its first deduplicated produce.
        self.forget_dedup();
        // Its round opens a window of nonces (`nonces.rs`); none before.
        self.close_nonces();
        // Nor does the last leadership's lease hold.
        self.lease_ended();
        self.set_replicas(replicas);
        // Produces waiting for their commit (a leader named again at a newer epoch) are answered `503` at once.
        self.commit.moved.notify(usize::MAX);
    }

    /// This replica opened as the leader of its partition at `epoch`, an epoch it began leading at before a restart
    /// (`engine/admin.rs`): it serves nothing (deposed, as [`Partition::prepare_to_lead`]) and leads again only at
    /// a newer epoch, after that epoch's fencing round. What it shipped before its own sync may be on its followers
    /// and not on its disk, and records it wrote at those offsets in the same epoch would be indistinguishable from
    /// theirs to a truncation by epoch.
    pub fn renew(&self, epoch: u64, replicas: u32) {
        self.prepare_to_lead(epoch, replicas);
        self.commit.renewing.set(Some(epoch));
    }

    /// The epoch a restarted leader waits to leave ([`Partition::renew`]), while it waits.
    pub fn renewing(&self) -> Option<u64> {
        self.commit.renewing.get()
    }

    /// This replica is to lead its partition at `epoch`, over `replicas` replicas (itself included): shipped batches
    /// are refused from now on (one being written is finished first), consumers are woken through `wake`, nothing
    /// is served above what a majority has (the commit starts at the log's start, as at an open). It stays deposed
    /// (`503`) while its fencing round runs (`front/round.rs`): [`Partition::start_serving`] ends it once the round
    /// found its log the greatest of a majority. Its groups load at the first touch, each from its file or the
    /// frontier its leader shipped, whichever is higher.
    pub async fn lead(&self, epoch: u64, replicas: u32, wake: super::Wake) {
        if self.commit.renewing.get().is_some_and(|r| r < epoch) {
            // Named leader at a newer epoch than the one it led at before its restart: its round follows.
            self.commit.renewing.set(None);
        }
        if self.commit.deposed.get().is_none_or(|d| d < epoch) {
            self.prepare_to_lead(epoch, replicas);
        }
        self.commit.round.set(Some(epoch));
        self.log.stop_following().await;
        self.set_wake(wake);
        self.set_replicas(replicas);
    }

    /// The fencing round of its leadership at `epoch` found its log the greatest of a majority: its records from
    /// its log's end on are this epoch's, durably (`begin_leading`), and the deposition ends: it serves. Err: a
    /// newer leadership deposed it meanwhile, or the history could not be written (it stays unable to serve,
    /// `503`, and the round runs again while its metadata names it leader at this epoch).
    pub async fn start_serving(&self, epoch: u64) -> Result<(), PartitionError> {
        // Never at an epoch an earlier process of this replica began (its history has it, this process did not
        // begin it): that is a renewal's to leave (`Partition::renew`), whatever view asked for the round.
        let begun_before = self.commit.leading.get() < epoch
            && self
                .epoch_history()
                .last()
                .is_some_and(|last| last.epoch >= epoch);
        if begun_before || self.commit.renewing.get().is_some_and(|r| epoch <= r) {
            return Err(PartitionError::Unavailable(format!(
                "epoch {epoch} was begun before this replica restarted: it leads again only at a newer one"
            )));
        }
        if self.epoch_floor() > epoch {
            // It answered a newer leadership's fencing round: that one may lead already.
            self.depose(self.epoch_floor());
        }
        if self.commit.deposed.get().is_some_and(|d| d > epoch) {
            return self.check_leading();
        }
        self.begin_leading(epoch, self.log.end_offset()).await?;
        if self.commit.round.get() == Some(epoch) {
            self.commit.round.set(None);
        }
        if self.commit.deposed.get().is_some_and(|d| d <= epoch) {
            // Its takes wait out its predecessor's lease (`lease.rs`); its produces need only their majority.
            self.lease_wait_out_predecessor();
            self.commit.deposed.set(None);
        }
        tracing::info!(dir = %self.dir.display(), epoch, "this replica leads the partition now");
        Ok(())
    }

    /// A fencing round that could not finish (the partition's leadership moved on): a view naming this replica
    /// leader again starts a new one.
    pub fn round_abandoned(&self, epoch: u64) {
        if self.commit.round.get() == Some(epoch) {
            self.commit.round.set(None);
        }
    }

    /// The epoch of the fencing round under way, if any.
    pub fn round_under_way(&self) -> Option<u64> {
        self.commit.round.get()
    }

    /// This leader's replica becomes a follower: a leadership of `epoch` began elsewhere. It is deposed (if it was
    /// not yet: a produce waiting for its majority is answered `503`), ships nothing more and takes shipped batches
    /// again; once the takes under way are done, its groups' leases go (a consumer's ack meets the new leader:
    /// `410`), each group keeping what is durable here as its shipped frontier, so its file never moves back. Its
    /// log stays as it is: a suffix the new leader lacks makes its batches a `Gap` or `Mismatch` until the
    /// truncation by epoch exists (`docs/replication.md`, step 4).
    pub async fn follow(&self, epoch: u64) {
        self.depose(epoch);
        self.forget_dedup();
        // A load under way installs its shards, and a take under way uses them, before they are dropped.
        self.wait_load().await;
        while self.commit.serving.get() > 0 {
            let done = self.commit.served.listen();
            if self.commit.serving.get() > 0 {
                done.await;
            }
        }
        self.log.start_following();
        self.set_wake(std::rc::Rc::new(|_, _| {}));
        for g in self.groups.borrow().values() {
            if g.shard.borrow_mut().take().is_some() {
                let mut value = crate::storage::frontier::FrontierValue {
                    committed: g.frontier.replica.get().unwrap_or(0),
                    acked: g.frontier.replica_acked.borrow().clone(),
                };
                // What it made durable itself, the acks above the frontier included (its files are written from
                // this value from now on).
                value.merge(&g.frontier.durable_value());
                g.frontier.replica.set(Some(value.committed));
                *g.frontier.replica_acked.borrow_mut() = value.acked;
            }
        }
    }

    /// The epoch of the newer leadership that deposed this leader, if any.
    pub fn deposed(&self) -> Option<u64> {
        self.commit.deposed.get()
    }

    /// Err when deposed: what every append, take and settle on a leader checks first.
    pub(super) fn check_leading(&self) -> Result<(), PartitionError> {
        match self.commit.deposed.get() {
            None => Ok(()),
            Some(epoch) if self.commit.round.get() == Some(epoch) => {
                Err(PartitionError::Unavailable(format!(
                    "partition {}: this node's fencing round for epoch {epoch} is under way (it serves once a majority of the replicas answered)",
                    self.id
                )))
            }
            Some(epoch) => Err(PartitionError::Unavailable(format!(
                "partition {} is no longer led by this node: a leadership of epoch {epoch} began",
                self.id
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::majority_end;

    #[test]
    fn the_majority_end_is_the_end_a_majority_has_reached() {
        // R = 3: the leader and the faster follower.
        assert_eq!(majority_end(3, &mut [10, 4, 7]), Some(7));
        assert_eq!(majority_end(3, &mut [10, 7]), Some(7));
        assert_eq!(majority_end(3, &mut [10]), None);
        // R = 2: both.
        assert_eq!(majority_end(2, &mut [10, 4]), Some(4));
        assert_eq!(majority_end(2, &mut [10]), None);
        // R = 5: three of five.
        assert_eq!(majority_end(5, &mut [9, 1, 8, 2, 5]), Some(5));
        assert_eq!(majority_end(5, &mut [9, 8]), None);
        // R = 1: the leader alone.
        assert_eq!(majority_end(1, &mut [3]), Some(3));
    }
}
