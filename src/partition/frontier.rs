//! A group's frontier: the first offset not yet settled, everything below it acked or dead-lettered, and where it
//! is durable. This module is the one place to read how a frontier becomes durable; the pieces it drives are named
//! here with where they live.
//!
//! - **Committed** (in memory): `InFlight::committed` (`inflight.rs`) moves up as acks fill the gap at the
//!   frontier; acks above it are held in the acked-ahead set (in memory only).
//! - **Journaled**: under fsync `always`/`interval`, the engine's flush tick (`engine/timers.rs`,
//!   `frontier_flush_interval_ms`) gathers every moved frontier of the core ([`Partition::moved_frontiers`]) into one
//!   journal entry (`storage/journal`, frontier records) and, once it is durable, marks them
//!   ([`Partition::frontiers_journaled`]). A group's start (created, or recreated after a delete) is a journal
//!   record with `start` set ([`Partition::write_start`]), so the replay never credits a deleted group's frontier to
//!   a new one of the same name.
//! - **Flushed** (its file): without a journal, the tick writes each moved frontier's file
//!   ([`Partition::flush_frontiers`]); with one, a journal checkpoint writes every file behind its frontier
//!   ([`Partition::write_frontier_files`], through the `Checkpoint` the engine gives the journal) before it removes
//!   a journal file. The file format (8-byte value + CRC, atomically replaced) is `storage/frontier.rs`.
//! - **Durable** = the higher of journaled and flushed: what a restart starts from. A file is never written with a
//!   lower value than it holds, nor after its partition closed (its directory may belong to a new topic by then).
//! - **Restart**: the journal's replay (`storage/journal/replay.rs`) brings each file up to the highest value its
//!   group's records carry since the group's last start record; the partition then reads the files at its first
//!   touch (`load_shards`).
//!
//! - **Replicated** (a follower replica, `docs/replication.md` step 3): the leader ships each frontier it made
//!   durable (journaled, or a group's start) to its followers; a follower records it in its own journal
//!   ([`Partition::follow_frontiers`]) and keeps it as the group's `replica` value, which its checkpoints write to
//!   the file as a leader's do its committed one. A follower never loads its groups' shards: the value is all it
//!   keeps, until it leads.
//!
//! The flush lag (how long a frontier waited to become durable, the `frontier_lag` histogram) is measured here from
//! `moved_at`.

pub use crate::storage::frontier::*;

use super::{Group, Partition, PartitionError};
use crate::storage::journal;
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use tracing::warn;

/// Where one group's frontier is durable, and the flush running for it.
pub(super) struct FrontierState {
    /// Its frontier file.
    pub(super) path: PathBuf,
    /// Frontier value known durable in its file (read at the first touch, then each flush).
    pub(super) flushed: Cell<u64>,
    /// The acked-ahead ranges its file holds beside `flushed` (docs/format.md, "consumer.offset").
    pub(super) flushed_acked: RefCell<Vec<(u64, u64)>>,
    /// The loaded shard's `InFlight::acked_version` its file holds (`u64::MAX`: not the shard's ranges), so that
    /// telling whether the file is behind costs no pass over the ranges.
    pub(super) acks_flushed: Cell<u64>,
    /// The loaded shard's `InFlight::acked_version` last recorded in the journal (its ranges with the frontier):
    /// a tick records the group again when its acked-ahead set changed since, even if the frontier did not move.
    pub(super) acks_journaled: Cell<u64>,
    /// Which shard `acks_journaled` counts for: bumped at each install (a new shard counts its versions from 0; a
    /// journal write of the old one's that lands after it must not stand for the new one's).
    pub(super) shard_gen: Cell<u64>,
    /// The acked-ahead ranges the journal holds beside `journaled` (its newest record's).
    pub(super) journaled_acked: RefCell<Vec<(u64, u64)>>,
    /// Frontier value known durable in the core's journal (0: none recorded there yet); the durable frontier is the
    /// higher of this and `flushed`.
    pub(super) journaled: Cell<u64>,
    /// On a follower replica: the frontier its leader last shipped (None: none since the replica opened). Its
    /// files are written from it as a leader's are from its shard's committed frontier.
    pub(super) replica: Cell<Option<u64>>,
    /// With `replica`: the acked-ahead ranges above it its leader shipped (canonical for `replica`).
    pub(super) replica_acked: RefCell<Vec<(u64, u64)>>,
    /// `flushed` holds what its file held when the partition opened, at least (a leader's load reads it; a
    /// follower reads it at the first value its leader ships).
    pub(super) file_known: Cell<bool>,
    /// A flush of its file is running.
    pub(super) flushing: Cell<bool>,
    /// When the frontier first moved past its durable value (cleared when a flush catches up): the flush lag's
    /// start.
    pub(super) moved_at: Cell<Option<u64>>,
    pub(super) flushed_event: event_listener::Event,
}

impl FrontierState {
    pub(super) fn new(path: PathBuf) -> FrontierState {
        FrontierState {
            path,
            flushed: Cell::new(0),
            flushed_acked: RefCell::new(Vec::new()),
            acks_flushed: Cell::new(u64::MAX),
            acks_journaled: Cell::new(0),
            shard_gen: Cell::new(0),
            journaled_acked: RefCell::new(Vec::new()),
            journaled: Cell::new(0),
            replica: Cell::new(None),
            replica_acked: RefCell::new(Vec::new()),
            file_known: Cell::new(false),
            flushing: Cell::new(false),
            moved_at: Cell::new(None),
            flushed_event: event_listener::Event::new(),
        }
    }

    /// The frontier known durable, in its file or in the journal.
    pub(super) fn durable(&self) -> u64 {
        self.flushed.get().max(self.journaled.get())
    }

    /// What is known durable, in its file or in the journal, acked-ahead ranges included: what a restart starts
    /// from.
    pub(super) fn durable_value(&self) -> FrontierValue {
        let mut value = FrontierValue {
            committed: self.flushed.get(),
            acked: self.flushed_acked.borrow().clone(),
        };
        value.merge(&FrontierValue {
            committed: self.journaled.get(),
            acked: self.journaled_acked.borrow().clone(),
        });
        value
    }

    /// Waits out a running flush of this file (one whose task is dropped mid-write ends too: see `Flushing`).
    pub(super) async fn wait_flush(&self) {
        while self.flushing.get() {
            let done = self.flushed_event.listen();
            if self.flushing.get() {
                done.await;
            }
        }
    }
}

impl Partition {
    /// Writes the frontier file a new group starts from: the oldest retained offset, or with `latest` the end;
    /// returns that offset.
    pub async fn write_start(&self, group: &str, latest: bool) -> Result<u64, PartitionError> {
        self.ensure_loaded().await?;
        let value = if latest {
            self.readable_end()
        } else {
            self.log.start_offset()
        };
        let path = self.dir.join(file_name(group));
        write(&*self.storage, &path, value)
            .await
            .map_err(|e| PartitionError::Storage(e.to_string()))?;
        // Records of a deleted group of the same name may still be in the journal: this start record, after them,
        // tells the replay to leave them out.
        if let Some(link) = self.log.journal_link() {
            let record = journal::FrontierRecord {
                topic: link.topic.clone(),
                topic_id: link.topic_id,
                partition: link.partition,
                group: group.to_string(),
                committed: value,
                start: true,
                acked: Vec::new(),
            };
            link.journal
                .commit_frontiers(journal::frontier_entry(&[record]))
                .await?;
            link.journal.sync_now().await?;
        }
        Ok(value)
    }

    /// Follower replica: records the frontiers its leader made durable (`marks`: one per group). A group's start
    /// replaces the group: a new one takes its place at once, its file written with the start; any other value
    /// raises the group's (never lowers it, nor below what its file holds). Then one journal entry of the starts
    /// and raised values, synced: durable when this returns `Ok`; the files of raised values follow at the
    /// journal's checkpoints. A value for a group this replica does not know (deleted, or created without a start
    /// it has seen) is passed over; a start of a group it does not know is taken while the partition has fewer than
    /// `max_groups` groups. Calls on one partition run one at a time, in arrival order.
    pub async fn follow_frontiers(
        &self,
        marks: &[crate::ops::replicate::FrontierMark],
        max_groups: usize,
        epoch: u64,
    ) -> Result<(), PartitionError> {
        let Some(link) = self.log.journal_link().cloned() else {
            return Err(PartitionError::Unavailable(
                "a follower replica records frontiers through its core's journal".into(),
            ));
        };
        let _turn = FollowTurn::take(self).await;
        // The leadership that shipped them, checked again at the turn: a fencing round's answer waits for the
        // recording under way (`wait_frontiers_followed`), and marks of an older leadership that come to their
        // turn after a newer one raised the floor are refused, not recorded after that answer (sim seed 22771).
        let floor = self.epoch_floor();
        if epoch < floor {
            return Err(PartitionError::StaleEpoch {
                epoch,
                known: floor,
            });
        }
        let record = |group: &str, value: FrontierValue, start: bool| journal::FrontierRecord {
            topic: link.topic.clone(),
            topic_id: link.topic_id,
            partition: link.partition,
            group: group.to_string(),
            committed: value.committed,
            start,
            acked: value.acked,
        };
        let mut records = Vec::new();
        let mut raised = Vec::new();
        for m in marks {
            if self.closed.get() {
                return Err(PartitionError::Closed);
            }
            let old = self.groups.borrow().get(&m.group).cloned();
            if m.start {
                if old.is_none() && self.groups.borrow().len() >= max_groups {
                    warn!(dir = %self.dir.display(), group = %m.group, max_groups, "a leader started a group beyond the topic's max_groups on this replica: passed over");
                    continue;
                }
                // The new group takes the old one's place before anything awaits, its file marked as being written
                // (checkpoints, a close and a removal wait for it); the old one has nothing left to write.
                let g = Group::new(&m.group, &self.dir);
                g.frontier.file_known.set(true);
                let writing = Flushing::start(&g.frontier);
                self.groups.borrow_mut().insert(m.group.clone(), g.clone());
                if let Some(old) = old {
                    old.frontier.replica.set(None);
                    old.frontier.wait_flush().await;
                }
                if self.closed.get() {
                    return Err(PartitionError::Closed);
                }
                let value = m.value();
                write_value(&*self.storage, &g.frontier.path, &value)
                    .await
                    .map_err(|e| PartitionError::Storage(e.to_string()))?;
                g.frontier.flushed.set(m.committed);
                *g.frontier.flushed_acked.borrow_mut() = m.acked.clone();
                g.frontier.replica.set(Some(m.committed));
                *g.frontier.replica_acked.borrow_mut() = m.acked.clone();
                drop(writing);
                records.push(record(&m.group, value, true));
                continue;
            }
            let Some(g) = old else {
                continue;
            };
            if !g.frontier.file_known.get() {
                // First value since the replica opened: what its file holds (a restart forgets it) is the floor.
                g.frontier.wait_flush().await;
                let stored = read_value(&*self.storage, &g.frontier.path).map_err(|e| {
                    PartitionError::Unavailable(format!("cannot read its frontier: {e}"))
                })?;
                if !g.frontier.file_known.get() {
                    if stored.committed >= g.frontier.flushed.get() {
                        g.frontier.flushed.set(stored.committed);
                        *g.frontier.flushed_acked.borrow_mut() = stored.acked;
                    }
                    g.frontier.file_known.set(true);
                }
            }
            // What the replica held, what its file holds and what the leader settled: all true of this group.
            let before = FrontierValue {
                committed: g.frontier.replica.get().unwrap_or(0),
                acked: g.frontier.replica_acked.borrow().clone(),
            };
            let mut value = before.clone();
            value.merge(&m.value());
            value.merge(&FrontierValue {
                committed: g.frontier.flushed.get(),
                acked: g.frontier.flushed_acked.borrow().clone(),
            });
            g.frontier.replica.set(Some(value.committed));
            *g.frontier.replica_acked.borrow_mut() = value.acked.clone();
            if m.committed > g.frontier.durable() || value.acked != before.acked {
                raised.push((g, value.clone()));
                records.push(record(&m.group, value, false));
            }
        }
        if records.is_empty() {
            return Ok(());
        }
        link.journal
            .commit_frontiers(journal::frontier_entry(&records))
            .await?;
        // Durable before the answer under `fsync interval` too: the leader counts on it.
        link.journal.sync_now().await?;
        for (g, value) in raised {
            if value.committed >= g.frontier.journaled.get() {
                g.frontier.journaled.set(value.committed);
                *g.frontier.journaled_acked.borrow_mut() = value.acked;
            }
        }
        Ok(())
    }

    /// Follower replica: group `group` went (deleted, perhaps to be created again): a start record at 0 in the
    /// core's journal, synced, so that the journal's replay never raises a later group of the same name with the
    /// deleted one's values (the leader's start for the new one may come later).
    pub async fn journal_group_gone(&self, group: &str) -> Result<(), PartitionError> {
        let Some(link) = self.log.journal_link() else {
            return Ok(());
        };
        let record = journal::FrontierRecord {
            topic: link.topic.clone(),
            topic_id: link.topic_id,
            partition: link.partition,
            group: group.to_string(),
            committed: 0,
            start: true,
            acked: Vec::new(),
        };
        link.journal
            .commit_frontiers(journal::frontier_entry(&[record]))
            .await?;
        link.journal.sync_now().await?;
        Ok(())
    }

    /// Leader of a replicated partition: every group's durable frontier (a loaded group's as it knows it, any other's
    /// read from its file: a blocking read of a few bytes per group, as at a load), as starts for its followers.
    /// Sent when the partition opens here, so that a follower that missed some values, or a group's start, before
    /// this leader's restart holds what this leader holds: as a start, since no value this leader shipped is above
    /// its durable one, and a follower that missed a start may hold a deleted group's higher value. A group whose
    /// file cannot be read is left out (its followers keep what they have).
    pub fn durable_frontiers(&self) -> Vec<journal::FrontierRecord> {
        let Some(link) = self.log.journal_link() else {
            return Vec::new();
        };
        self.groups
            .borrow()
            .values()
            .filter_map(|g| {
                let value = self.durable_value(g)?;
                Some(journal::FrontierRecord {
                    topic: link.topic.clone(),
                    topic_id: link.topic_id,
                    partition: link.partition,
                    group: g.name.clone(),
                    committed: value.committed,
                    start: true,
                    acked: value.acked,
                })
            })
            .collect()
    }

    /// Leader of a replicated partition: group `group`'s durable frontier as [`Partition::durable_frontiers`] gives
    /// it (None: no such group, or its file cannot be read). A group's start goes to a follower with this value as
    /// it is when the start is sent, not when it was queued (`front::replicate`): a follower down since the round
    /// would otherwise take a start older than what the leader's other followers hold since, and the frontier a
    /// majority holds would move back until the next value reached it (seed 1471 of the node simulation).
    pub fn durable_frontier_to_ship(&self, group: &str) -> Option<FrontierValue> {
        let g = self.groups.borrow().get(group).cloned()?;
        self.durable_value(&g)
    }

    /// A group's durable frontier, with the acked-ahead ranges known durable with it: a loaded shard's in its file
    /// or journal; else its file's and the shipped ones.
    fn durable_value(&self, g: &Group) -> Option<FrontierValue> {
        Some(if g.shard.borrow().is_some() {
            g.frontier.durable_value()
        } else {
            // A replica that led since it followed: its leader's shipped frontier (journaled here) may be ahead of
            // its file.
            let mut value = read_value(&*self.storage, &g.frontier.path).ok()?;
            value.merge(&FrontierValue {
                committed: g.frontier.replica.get().unwrap_or(0),
                acked: g.frontier.replica_acked.borrow().clone(),
            });
            value.merge(&FrontierValue::at(g.frontier.durable()));
            value
        })
    }

    /// Adds to `out` a record of each group whose frontier moved past the durable one (for one journal entry of
    /// the whole core); returns the groups and values recorded, for [`Partition::frontiers_journaled`]. Nothing
    /// without a journal, or after the partition closed.
    pub fn moved_frontiers(&self, out: &mut Vec<journal::FrontierRecord>) -> Vec<Moved> {
        let Some(link) = self.log.journal_link() else {
            return Vec::new();
        };
        if self.closed.get() {
            return Vec::new();
        }
        let mut marks = Vec::new();
        for g in self.groups.borrow().values() {
            let Some((committed, version)) = g.with_loaded(|s| (s.committed(), s.acked_version()))
            else {
                continue;
            };
            if committed <= g.frontier.durable() && version == g.frontier.acks_journaled.get() {
                continue;
            }
            let acked = g.acked_ranges();
            out.push(journal::FrontierRecord {
                topic: link.topic.clone(),
                topic_id: link.topic_id,
                partition: link.partition,
                group: g.name.clone(),
                committed,
                start: false,
                acked: if crate::planted::planted(crate::planted::Bug::AcksNotJournaled) {
                    Vec::new()
                } else {
                    acked.clone()
                },
            });
            marks.push(Moved {
                group: g.clone(),
                committed,
                version,
                shard_gen: g.frontier.shard_gen.get(),
                acked,
            });
        }
        marks
    }

    /// The journal made the values `moved_frontiers` recorded at `started` (ms) durable: returns how long each had
    /// waited since its frontier first moved (ms).
    pub fn frontiers_journaled(&self, marks: &[Moved], started: u64) -> Vec<u64> {
        let now = self.clock.now_ms();
        let mut lags = Vec::with_capacity(marks.len());
        for Moved {
            group: g,
            committed: value,
            version,
            shard_gen,
            acked,
        } in marks
        {
            if g.shard.borrow().is_some()
                && *shard_gen == g.frontier.shard_gen.get()
                && *version > g.frontier.acks_journaled.get()
            {
                g.frontier.acks_journaled.set(*version);
            }
            let newly_durable = *value > g.frontier.durable();
            // The newest record's ranges are the journal's (a value only grows: the same frontier with more acks
            // above it, or a higher one).
            if *value >= g.frontier.journaled.get() {
                *g.frontier.journaled_acked.borrow_mut() = acked.clone();
                g.frontier.journaled.set(*value);
            }
            if !newly_durable {
                continue;
            }
            let moved_at = g.frontier.moved_at.get().unwrap_or(started);
            if g.shard.borrow().is_none() {
                // Journaled after its shard went (this leader was deposed meanwhile, `Partition::follow`): the value
                // it keeps as its replica's frontier takes it too, so that leading again here, or a checkpoint's
                // file, never starts below what its own journal holds. (Found by the node simulation: a re-elected
                // leader served from below an ack it had answered `200`.)
                let mut replica = FrontierValue {
                    committed: g.frontier.replica.get().unwrap_or(0),
                    acked: g.frontier.replica_acked.borrow().clone(),
                };
                replica.merge(&FrontierValue {
                    committed: *value,
                    acked: acked.clone(),
                });
                g.frontier.replica.set(Some(replica.committed));
                *g.frontier.replica_acked.borrow_mut() = replica.acked;
            }
            let behind = g.with_loaded(|s| s.committed()).is_some_and(|c| c > *value);
            g.frontier.moved_at.set(behind.then_some(started));
            lags.push(now.saturating_sub(moved_at));
        }
        lags
    }

    /// Remembers when a group's frontier first moved past its durable value (for the flush-lag histogram).
    pub(super) fn note_moved(&self, g: &Group) {
        if g.frontier.moved_at.get().is_none()
            && g.with_loaded(|s| s.committed())
                .is_some_and(|c| c > g.frontier.durable())
        {
            g.frontier.moved_at.set(Some(self.clock.now_ms()));
        }
    }

    /// Writes each group's frontier file whose frontier moved since the last write. A failed write leaves the old
    /// value as the durable one and is retried at the next tick. Never writes a lower value than the one on disk,
    /// and never after the partition closed (its directory may belong to a new topic by then). Returns, for each
    /// file written, how long its frontier had waited to become durable (ms).
    pub async fn flush_frontiers(&self) -> Vec<u64> {
        let groups: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        let mut lags = Vec::new();
        for g in groups {
            if let Some(lag) = self.flush_group(&g).await {
                lags.push(lag);
            }
        }
        lags
    }

    /// Whether some group's frontier file is behind its frontier (a checkpoint must write it).
    pub fn frontier_file_behind(&self) -> bool {
        self.groups
            .borrow()
            .values()
            .any(|g| g.frontier.flushing.get() || g.file_behind())
    }

    /// Writes every group's frontier file that is behind its frontier, after the writes already running (a
    /// journal checkpoint: every value the journal recorded must be in the files before the journal file goes).
    /// True when every file holds its group's frontier as it stood when this began.
    pub async fn write_frontier_files(&self) -> bool {
        self.wait_flushes().await;
        let groups: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        let mut ok = true;
        for g in groups {
            let Some(committed) = g.frontier_value() else {
                continue;
            };
            if !g.file_behind() || self.closed.get() {
                continue;
            }
            self.flush_group(&g).await;
            ok &= g.frontier.flushed.get() >= committed;
        }
        ok
    }

    /// Writes a group's frontier file; returns the lag when that made its frontier durable (it was not yet, in the
    /// journal either).
    async fn flush_group(&self, g: &Group) -> Option<u64> {
        let committed = g.frontier_value()?;
        if !g.file_behind() || g.frontier.flushing.get() || self.closed.get() {
            return None;
        }
        let acked = g.acked_ranges();
        let version = g.with_loaded(|s| s.acked_version());
        let started = self.clock.now_ms();
        let was_durable = committed <= g.frontier.durable();
        let moved_at = g.frontier.moved_at.get().unwrap_or(started);
        assert!(
            committed >= g.frontier.flushed.get(),
            "frontier {committed} would replace the durable {} with a lower one",
            g.frontier.flushed.get()
        );
        let _flushing = Flushing::start(&g.frontier);
        let value = FrontierValue { committed, acked };
        let lag = match write_value(&*self.storage, &g.frontier.path, &value).await {
            Ok(()) => {
                if g.shard.borrow().is_none() {
                    // Written after its shard went (this leader was deposed meanwhile, `Partition::follow`, which
                    // took the durable value before this write landed): the replica's value takes it too, so that
                    // no later flush writes its file below it (as `frontiers_journaled` does for the journal).
                    let mut replica = FrontierValue {
                        committed: g.frontier.replica.get().unwrap_or(0),
                        acked: g.frontier.replica_acked.borrow().clone(),
                    };
                    replica.merge(&value);
                    g.frontier.replica.set(Some(replica.committed));
                    *g.frontier.replica_acked.borrow_mut() = replica.acked;
                }
                g.frontier.flushed.set(committed);
                *g.frontier.flushed_acked.borrow_mut() = value.acked;
                g.frontier.acks_flushed.set(version.unwrap_or(u64::MAX));
                if was_durable {
                    None
                } else {
                    // Acks that came during the write are counted from the write's start.
                    let behind = g.frontier_value() != Some(committed);
                    g.frontier.moved_at.set(behind.then_some(started));
                    Some(self.clock.now_ms().saturating_sub(moved_at))
                }
            }
            Err(e) => {
                warn!(file = %g.frontier.path.display(), error = %e, "cannot write a frontier file; will retry");
                None
            }
        };
        lag
    }

    /// Writes `group`'s frontier file until it holds at least `end` (waiting out a flush of an older value that is
    /// running): true once durable there, false if a write failed (retried at the next flush) or the group is gone.
    pub async fn make_frontier_durable(&self, group: &str, end: u64) -> bool {
        let Ok(g) = self.group(group) else {
            return false;
        };
        for _ in 0..3 {
            if g.frontier.durable() >= end {
                return true;
            }
            g.frontier.wait_flush().await;
            if self.flush_group(&g).await.is_none() && !g.frontier.flushing.get() {
                // Nothing written and nothing running: the write failed, or there is nothing newer to write.
                return g.frontier.durable() >= end;
            }
        }
        g.frontier.durable() >= end
    }

    /// Waits out running flushes (a flush whose task is dropped mid-write ends too: see `Flushing`).
    pub(super) async fn wait_flushes(&self) {
        let groups: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        for g in groups {
            g.frontier.wait_flush().await;
        }
    }
}

/// A group whose frontier (or acked-ahead set) moved, as [`Partition::moved_frontiers`] recorded it: the value and
/// the shard's `InFlight::acked_version` with it.
pub struct Moved {
    group: Rc<Group>,
    committed: u64,
    version: u64,
    shard_gen: u64,
    acked: Vec<(u64, u64)>,
}

impl Group {
    /// The acked-ahead ranges to persist with [`Group::frontier_value`]: the loaded shard's, or on a follower
    /// replica those its leader shipped (at most `MAX_RANGES`, the lowest).
    pub(super) fn acked_ranges(&self) -> Vec<(u64, u64)> {
        let mut acked = self
            .with_loaded(|s| s.acked_ranges())
            .unwrap_or_else(|| self.frontier.replica_acked.borrow().clone());
        acked.truncate(MAX_RANGES);
        acked
    }

    /// Its file holds less than its frontier value and acked-ahead ranges.
    fn file_behind(&self) -> bool {
        let flushed = self.frontier.flushed.get();
        match self.with_loaded(|s| (s.committed(), s.acked_version())) {
            Some((c, version)) => c != flushed || version != self.frontier.acks_flushed.get(),
            None => self.frontier.replica.get().is_some_and(|c| {
                c != flushed
                    || *self.frontier.flushed_acked.borrow()
                        != *self.frontier.replica_acked.borrow()
            }),
        }
    }
}

/// A follower partition's turn to record shipped frontiers (`follow_frontiers`): one call at a time, so that two
/// requests of one group never interleave around an await.
struct FollowTurn<'a>(&'a Partition);

impl Partition {
    /// Waits until no recording of shipped frontiers is under way: a fencing round's answer (`Began.frontiers`)
    /// carries what one accepted before the floor was raised makes durable (its leader may count it acknowledged),
    /// and later ones check the raised floor at their turn (sim seed 22771: a replica answered a new leader's
    /// round with its durable frontier while an older leader's marks were being journaled, then made them durable
    /// and answered that leader; the new one served from below what a majority held).
    pub async fn wait_frontiers_followed(&self) {
        drop(FollowTurn::take(self).await);
    }
}

impl<'a> FollowTurn<'a> {
    async fn take(p: &'a Partition) -> FollowTurn<'a> {
        while p.following.get() {
            let done = p.followed.listen();
            if p.following.get() {
                done.await;
            }
        }
        p.following.set(true);
        FollowTurn(p)
    }
}

impl Drop for FollowTurn<'_> {
    fn drop(&mut self) {
        self.0.following.set(false);
        self.0.followed.notify(1);
    }
}

/// A group's frontier write in progress: `flushing` is set while it lives, and cleared (with the waiters told) when
/// it ends, however it ends: a flush whose task is dropped mid-write (a stopping core) must not leave every later
/// checkpoint and close waiting for it.
struct Flushing<'a>(&'a FrontierState);

impl<'a> Flushing<'a> {
    fn start(g: &'a FrontierState) -> Flushing<'a> {
        g.flushing.set(true);
        Flushing(g)
    }
}

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        self.0.flushing.set(false);
        self.0.flushed_event.notify(usize::MAX);
    }
}
