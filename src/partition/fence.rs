//! A replica's fencing state (`docs/replication.md`, step 4): its epoch floor (`storage/epoch_floor.rs`,
//! `replica.epoch`), the lowest leadership epoch whose requests it takes, raised durably before it answers a request
//! of a higher epoch and never lowered, so that what it promised a new leader survives its crash; and its epoch
//! history (`storage/epoch_history.rs`, `replica.epochs`), in which epoch each record was written, added to by a
//! leader when it starts leading and copied by a follower from the batches it is shipped, durably before the
//! records it covers are written.

use super::{Partition, PartitionError};
use crate::storage::epoch_history::{EpochHistory, EpochStart};
use crate::storage::{epoch_floor, epoch_history};
use std::cell::Cell;

/// One writer of a file at a time: while a turn lives `busy` is set; when it ends, however it ends (a failed
/// write, a dropped task), the next waiter is woken and looks again.
struct Turn<'a> {
    busy: &'a Cell<bool>,
    done: &'a event_listener::Event,
}

impl<'a> Turn<'a> {
    async fn take(busy: &'a Cell<bool>, done: &'a event_listener::Event) -> Turn<'a> {
        while busy.get() {
            let ended = done.listen();
            if busy.get() {
                ended.await;
            }
        }
        busy.set(true);
        Turn { busy, done }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.busy.set(false);
        self.done.notify(usize::MAX);
    }
}

/// Why a follower did not take its leader's epoch entries.
#[derive(Debug)]
pub enum FollowEpochsError {
    /// They contradict this replica's history: its log does not continue its leader's.
    Mismatch(String),
    /// The history could not be written (or the partition is closing).
    Partition(PartitionError),
}

impl Partition {
    /// The epoch floor its file holds (0: none).
    pub fn epoch_floor(&self) -> u64 {
        self.fence.get().floor
    }

    /// Its fencing state as `replica.epoch` holds it: the floor and the nonce ceilings promised.
    pub fn fence_state(&self) -> epoch_floor::Fence {
        self.fence.get()
    }

    /// Raises the durable floor to `epoch`; returns once `replica.epoch` holds it (or a higher one). At or below
    /// the floor it writes nothing; one write at a time, so the file only ever moves up.
    pub async fn raise_epoch_floor(&self, epoch: u64) -> Result<(), PartitionError> {
        self.raise_fence(epoch, 0).await
    }

    /// Raises the durable floor to `epoch` and promises the leadership at `epoch` the nonce ceiling `nonces`
    /// (`epoch_floor::Fence::raised`); returns once `replica.epoch` holds both (or more). Nothing to raise: nothing
    /// written. One write at a time, so the file only ever moves up.
    pub async fn raise_fence(&self, epoch: u64, nonces: u64) -> Result<(), PartitionError> {
        self.assert_owner();
        if self.fence.get().raised(epoch, nonces) == self.fence.get() {
            return Ok(());
        }
        if epoch > self.fence.get().floor {
            // Shipped batches of older leaderships still queued are refused at their turn from now on (even if the
            // write below fails: refusing them only makes their leader send again).
            self.log.fence_ships(epoch);
        }
        let _turn = Turn::take(&self.raising_floor, &self.floor_raised).await;
        let current = self.fence.get();
        let next = current.raised(epoch, nonces);
        if next == current {
            return Ok(());
        }
        if self.closed.get() {
            // Its directory may already belong to a new topic of the same name.
            return Err(PartitionError::Closed);
        }
        epoch_floor::write(&*self.storage, &self.dir, next)
            .await
            .map_err(|e| PartitionError::Storage(format!("cannot raise its epoch floor: {e}")))?;
        assert!(
            self.fence.get() == current,
            "one write of the fencing state at a time"
        );
        self.fence.set(next);
        Ok(())
    }

    /// A replica on a new disk that no leader has promoted yet (`storage::learner`): a fencing round neither counts
    /// nor ranks it.
    pub fn is_learner(&self) -> bool {
        self.learner.get()
    }

    /// Promotes this learner (its leader found that its log reaches past everything that leader could have
    /// acknowledged, and sent it its groups' frontiers): `replica.learner` removed durably, then it counts in
    /// fencing rounds like any replica. On a failed removal it stays a learner, and the next request tries again.
    pub async fn promote(&self) -> Result<(), PartitionError> {
        self.assert_owner();
        if !self.learner.get() {
            return Ok(());
        }
        if self.closed.get() {
            // Its directory may already belong to a new topic of the same name.
            return Err(PartitionError::Closed);
        }
        crate::storage::learner::remove(&*self.storage, &self.dir)
            .await
            .map_err(|e| PartitionError::Storage(format!("cannot promote a learner: {e}")))?;
        if self.learner.replace(false) {
            tracing::info!(dir = %self.dir.display(), end = self.log.end_offset(), "a learner caught up: promoted (it counts in fencing rounds from now on)");
        }
        Ok(())
    }

    /// Waits out a floor or history write under way (a closing partition: nothing starts one after `closed`).
    pub(super) async fn wait_fence_writes(&self) {
        drop(Turn::take(&self.raising_floor, &self.floor_raised).await);
        drop(Turn::take(&self.writing_epochs, &self.epochs_written).await);
    }

    /// Its epoch history as its file holds it.
    pub fn epoch_history(&self) -> EpochHistory {
        self.epochs.borrow().clone()
    }

    /// The entries of its epoch history that cover the records `[from, to)` (what a leader ships with them).
    pub fn epochs_covering(&self, from: u64, to: u64) -> Vec<EpochStart> {
        self.epochs.borrow().covering(from, to)
    }

    /// A leader starts leading at `epoch`, its log ending at `start` (taken when the epoch changed): the history
    /// gains the entry, durably, unless it holds this epoch or a newer one already.
    pub async fn begin_leading(&self, epoch: u64, start: u64) -> Result<(), PartitionError> {
        self.commit
            .leading
            .set(self.commit.leading.get().max(epoch));
        // Nothing is committed below where this leadership began until its history says where that is.
        self.commit.since.set(self.commit.since.get().max(start));
        self.change_history(|h| Ok::<_, PartitionError>(h.begin(epoch, start)))
            .await
            .and_then(|r| r)?;
        if let Some(e) = self
            .epochs
            .borrow()
            .entries()
            .iter()
            .find(|e| e.epoch == epoch)
        {
            self.commit.since.set(e.start);
        }
        Ok(())
    }

    /// Where its log stands for a fencing round: (the newest epoch its history places at or below its log's end,
    /// that end). An entry that starts exactly at the end counts: a replica that took a leader's entry (E, S) and
    /// holds every record below S holds that leader's log as it began (Viewstamped Replication's log view), and
    /// ranks above a replica whose last record is of an epoch older than E at the same end. So once a leader's
    /// commit passed S (a majority holds the entry and the log up to it), no round can pick a log without what it
    /// served (Raft's figure 8; `docs/replication.md`, step 4). A later epoch first, then a longer log.
    pub fn rank(&self) -> (u64, u64) {
        let end = self.log.end_offset();
        (self.epochs.borrow().epoch_of(end), end)
    }

    /// A follower whose log ends at `end` takes the entries its leader at `epoch` sent with a batch before writing
    /// it there or later, or with a probe ([`EpochHistory::follow`]): durable when it returns Ok. Refused
    /// (`stale_epoch`) when its floor is above `epoch` once its turn to write came: a fencing round that raised the
    /// floor meanwhile read this replica's rank without these entries ([`Partition::wait_history_written`]), so no
    /// entry of the older leadership may land after it.
    pub async fn follow_epochs(
        &self,
        entries: &[EpochStart],
        end: u64,
        epoch: u64,
    ) -> Result<(), FollowEpochsError> {
        if entries.is_empty() {
            return Ok(());
        }
        let fence = &self.fence;
        let stale = Cell::new(false);
        let result = self
            .change_history(|h| {
                if fence.get().floor > epoch {
                    stale.set(true);
                    return Err(String::new());
                }
                // The log may have grown while this waited its turn (pipelined batches landed): its end now says
                // which of its own entries claim records it does not hold. (Found by the node simulation: given the
                // end from before its turn, a batch's entries dropped the entries of records landed meanwhile, and a
                // replica later elected cut acknowledged records from the others.)
                h.follow(entries, end.max(self.log.end_offset()))
            })
            .await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) if stale.get() => {
                Err(FollowEpochsError::Partition(PartitionError::StaleEpoch {
                    epoch,
                    known: fence.get().floor,
                }))
            }
            Ok(Err(why)) => Err(FollowEpochsError::Mismatch(why)),
            Err(e) => Err(FollowEpochsError::Partition(e)),
        }
    }

    /// Truncation by epoch, a follower's side (`docs/replication.md`, step 4): where its log and the history of its
    /// leader at `epoch` (a probe's: the leader's whole history up to its end) first disagree on which leadership
    /// wrote a record, the log is cut (`Log::truncate_diverged`): those records are another leadership's, never
    /// acknowledged (the leader's fencing round took the greatest log of a majority, which holds everything that
    /// was). Returns where it was cut (None: nothing diverges). Refused (`stale_epoch`) when its floor is above
    /// `epoch`: only the current leadership's history may cut. Its history's entries past the cut go at the next
    /// `follow_epochs`, which the probe runs next.
    pub async fn truncate_diverged(
        &self,
        leader: &[EpochStart],
        epoch: u64,
    ) -> Result<Option<u64>, PartitionError> {
        self.assert_owner();
        // A batch of an older leadership being written lands first (its floor fenced the ones still queued), and
        // so does one of this replica's own from a leadership it lost, so the end looked at is the one the answer
        // gives.
        self.log.own_writes_settled().await;
        self.log.ships_settled().await;
        let (start, end) = (self.log.start_offset(), self.log.end_offset());
        let Some(at) = self.epochs.borrow().divergence(leader, end) else {
            return Ok(None);
        };
        if crate::planted::planted(crate::planted::Bug::NoTruncation) {
            return Ok(None);
        }
        if self.epoch_floor() > epoch {
            return Err(PartitionError::StaleEpoch {
                epoch,
                known: self.epoch_floor(),
            });
        }
        if at < start {
            // Below what this log holds (retention, or a restart at an older leader's start a crash or a lost
            // answer left with its old history): every record it holds is suspect, so all go, and the history up
            // to its start becomes its leader's.
            if end > start {
                tracing::warn!(dir = %self.dir.display(), at, start, end, epoch, "this replica's log diverges from its leader's below its start: cutting all of it");
                self.cut_to(start).await?;
            }
            self.adopt_history_if_empty(start, leader, epoch).await?;
            return Ok(Some(start));
        }
        tracing::warn!(dir = %self.dir.display(), at, end, epoch, "this replica's log diverges from its leader's: cutting it");
        self.cut_to(at).await.map(Some)
    }

    /// [`Log::truncate_diverged`] to `at`, its errors as the partition's.
    async fn cut_to(&self, at: u64) -> Result<u64, PartitionError> {
        match self.log.truncate_diverged(at).await {
            Ok(end) => Ok(end),
            Err(crate::storage::log::FollowError::Append(e)) => Err(e.into()),
            Err(crate::storage::log::FollowError::Busy) => Err(PartitionError::Storage(
                "its log is busy with shipped batches; the cut waits for the next probe".into(),
            )),
            Err(e) => Err(PartitionError::Storage(format!(
                "cannot cut its diverged log: {e:?}"
            ))),
        }
    }

    /// A follower's side of a restart probe (`docs/replication.md`, step 5): its leader at `epoch` keeps nothing
    /// below `at` (retention) and this log holds nothing at or past it, so the log starts anew at `at`, empty
    /// (`Log::restart_at`), and takes the leader's history up to `at` (`EpochHistory::adopt`, durably). Also run
    /// when the log is at `at` already and holds nothing (a crash between the two steps). Returns the log's end
    /// (one past `at`: the log holds records there, and nothing changed). Refused (`stale_epoch`) when its floor is
    /// above `epoch`, before anything changes and again at the history's turn.
    pub async fn start_anew_at(
        &self,
        at: u64,
        leader: &[EpochStart],
        epoch: u64,
    ) -> Result<u64, PartitionError> {
        self.assert_owner();
        self.log.own_writes_settled().await;
        self.log.ships_settled().await;
        if self.epoch_floor() > epoch {
            return Err(PartitionError::StaleEpoch {
                epoch,
                known: self.epoch_floor(),
            });
        }
        let end = match self.log.restart_at(at, epoch).await {
            Ok(end) => end,
            Err(crate::storage::log::FollowError::Append(e)) => return Err(e.into()),
            Err(crate::storage::log::FollowError::Busy) => {
                return Err(PartitionError::Storage(
                    "its log is busy with shipped batches; the restart waits for the next probe"
                        .into(),
                ))
            }
            Err(e) => {
                return Err(PartitionError::Storage(format!(
                    "cannot start its log anew at {at}: {e:?}"
                )))
            }
        };
        self.adopt_history_if_empty(at, leader, epoch).await?;
        Ok(end)
    }

    /// While this log holds nothing and starts at `at` (checked at the history write's turn: a batch may land
    /// meanwhile), its history up to `at` becomes its leader's (`EpochHistory::adopt`), durably. Refused
    /// (`stale_epoch`) when its floor is above `epoch` by then.
    async fn adopt_history_if_empty(
        &self,
        at: u64,
        leader: &[EpochStart],
        epoch: u64,
    ) -> Result<(), PartitionError> {
        let (fence, log) = (&self.fence, &self.log);
        let stale = Cell::new(false);
        match self
            .change_history(|h| {
                if fence.get().floor > epoch {
                    stale.set(true);
                    return Err(String::new());
                }
                if (log.start_offset(), log.end_offset()) != (at, at) {
                    return Ok(false);
                }
                h.adopt(leader, at)
            })
            .await?
        {
            Ok(()) => Ok(()),
            Err(_) if stale.get() => Err(PartitionError::StaleEpoch {
                epoch,
                known: fence.get().floor,
            }),
            Err(why) => Err(PartitionError::Storage(why)),
        }
    }

    /// Waits out a history write under way: what [`Partition::rank`] says afterwards includes it.
    pub async fn wait_history_written(&self) {
        drop(Turn::take(&self.writing_epochs, &self.epochs_written).await);
    }

    /// Applies `change` to a copy of the history, one change at a time; when it changed, writes the file and then
    /// keeps the copy. The outer Err is a failed write; the inner one `change`'s own.
    async fn change_history<E>(
        &self,
        change: impl FnOnce(&mut EpochHistory) -> Result<bool, E>,
    ) -> Result<Result<(), E>, PartitionError> {
        self.assert_owner();
        let _turn = Turn::take(&self.writing_epochs, &self.epochs_written).await;
        let mut next = self.epochs.borrow().clone();
        match change(&mut next) {
            Err(e) => return Ok(Err(e)),
            Ok(false) => return Ok(Ok(())),
            Ok(true) => {}
        }
        if self.closed.get() {
            return Err(PartitionError::Closed);
        }
        epoch_history::write(&*self.storage, &self.dir, &next)
            .await
            .map_err(|e| PartitionError::Storage(format!("cannot write its epoch history: {e}")))?;
        *self.epochs.borrow_mut() = next;
        Ok(Ok(()))
    }
}
