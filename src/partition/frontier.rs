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
//! The flush lag (how long a frontier waited to become durable, the `frontier_lag` histogram) is measured here from
//! `moved_at`.

pub use crate::storage::frontier::*;

use super::{Group, Partition, PartitionError};
use crate::storage::journal;
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use tracing::warn;

/// Where one group's frontier is durable, and the flush running for it.
pub(super) struct FrontierState {
    /// Its frontier file.
    pub(super) path: PathBuf,
    /// Frontier value known durable in its file (read at the first touch, then each flush).
    pub(super) flushed: Cell<u64>,
    /// Frontier value known durable in the core's journal (0: none recorded there yet); the durable frontier is the
    /// higher of this and `flushed`.
    pub(super) journaled: Cell<u64>,
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
            journaled: Cell::new(0),
            flushing: Cell::new(false),
            moved_at: Cell::new(None),
            flushed_event: event_listener::Event::new(),
        }
    }

    /// The frontier known durable, in its file or in the journal.
    pub(super) fn durable(&self) -> u64 {
        self.flushed.get().max(self.journaled.get())
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
    /// Writes the frontier file a new group starts from: the oldest retained offset, or with `latest` the end.
    pub async fn write_start(&self, group: &str, latest: bool) -> Result<(), PartitionError> {
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
            };
            link.journal
                .commit_frontiers(journal::frontier_entry(&[record]))
                .await?;
            link.journal.sync_now().await?;
        }
        Ok(())
    }

    /// Adds to `out` a record of each group whose frontier moved past the durable one (for one journal entry of
    /// the whole core); returns the groups and values recorded, for [`Partition::frontiers_journaled`]. Nothing
    /// without a journal, or after the partition closed.
    pub fn moved_frontiers(&self, out: &mut Vec<journal::FrontierRecord>) -> Vec<(Rc<Group>, u64)> {
        let Some(link) = self.log.journal_link() else {
            return Vec::new();
        };
        if self.closed.get() {
            return Vec::new();
        }
        let mut marks = Vec::new();
        for g in self.groups.borrow().values() {
            let Some(committed) = g.with_loaded(|s| s.committed()) else {
                continue;
            };
            if committed <= g.frontier.durable() {
                continue;
            }
            out.push(journal::FrontierRecord {
                topic: link.topic.clone(),
                topic_id: link.topic_id,
                partition: link.partition,
                group: g.name.clone(),
                committed,
                start: false,
            });
            marks.push((g.clone(), committed));
        }
        marks
    }

    /// The journal made the values `moved_frontiers` recorded at `started` (ms) durable: returns how long each had
    /// waited since its frontier first moved (ms).
    pub fn frontiers_journaled(&self, marks: &[(Rc<Group>, u64)], started: u64) -> Vec<u64> {
        let now = self.clock.now_ms();
        let mut lags = Vec::with_capacity(marks.len());
        for (g, value) in marks {
            if *value <= g.frontier.durable() {
                continue;
            }
            let moved_at = g.frontier.moved_at.get().unwrap_or(started);
            g.frontier.journaled.set(*value);
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
        self.groups.borrow().values().any(|g| {
            g.frontier.flushing.get()
                || g.with_loaded(|s| s.committed())
                    .is_some_and(|c| c != g.frontier.flushed.get())
        })
    }

    /// Writes every group's frontier file that is behind its frontier, after the writes already running (a
    /// journal checkpoint: every value the journal recorded must be in the files before the journal file goes).
    /// True when every file holds its group's frontier as it stood when this began.
    pub async fn write_frontier_files(&self) -> bool {
        self.wait_flushes().await;
        let groups: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        let mut ok = true;
        for g in groups {
            let Some(committed) = g.with_loaded(|s| s.committed()) else {
                continue;
            };
            if g.frontier.flushed.get() >= committed || self.closed.get() {
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
        let committed = g.with_loaded(|s| s.committed())?;
        if g.frontier.flushed.get() == committed || g.frontier.flushing.get() || self.closed.get() {
            return None;
        }
        let started = self.clock.now_ms();
        let was_durable = committed <= g.frontier.durable();
        let moved_at = g.frontier.moved_at.get().unwrap_or(started);
        assert!(
            committed > g.frontier.flushed.get(),
            "frontier {committed} would replace the durable {} with a lower one",
            g.frontier.flushed.get()
        );
        let _flushing = Flushing::start(&g.frontier);
        let lag = match write(&*self.storage, &g.frontier.path, committed).await {
            Ok(()) => {
                g.frontier.flushed.set(committed);
                if was_durable {
                    None
                } else {
                    // Acks that came during the write are counted from the write's start.
                    let behind = g.with_loaded(|s| s.committed()) != Some(committed);
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

    /// Waits out running flushes (a flush whose task is dropped mid-write ends too: see `Flushing`).
    pub(super) async fn wait_flushes(&self) {
        let groups: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        for g in groups {
            g.frontier.wait_flush().await;
        }
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
