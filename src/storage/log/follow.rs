//! A follower's side of a partition's log (replication, `docs/replication.md` step 2): the leader ships each batch
//! it made durable as the journal entry's head ([`EntryHead`]: segment, position, first offset, count) and its
//! frames exactly as written; the follower checks them and writes them at the very same place, through its own
//! core's journal (one fdatasync per pass, whatever the number of leaders feeding it), so its segments are
//! byte-identical to the leader's. Nothing shipped is trusted: a batch that does not continue this log exactly, or
//! whose frames do not verify, changes nothing and says why.
//!
//! The leader's side is [`Log::set_on_ship`], called with every durable batch (a log with a journal only: its
//! link names the partition, and a follower writes through its own journal). On the follower, shipped batches go
//! through the log's writer task like appends (one at a time, in arrival order, each alone in its write), so nothing
//! else writes the segment meanwhile, a caller that stops waiting leaves nothing half done, and a close waits for
//! them. A follower's log takes no appends of its own (its partition is served by the leader); one that did would
//! only make the next shipped batch a `Gap`.

use super::{AppendError, Built, Log, MAX_BATCH_BYTES};
use crate::storage::frame::{self, NO_POSITION};
use crate::storage::journal::{self, EntryHead};
use futures_channel::oneshot;

/// Called with each durable batch: its head and its frames (exactly the segment's bytes).
pub type ShipHook = Box<dyn Fn(&EntryHead, &[u8])>;

/// A shipped batch waiting for the writer task.
pub(super) struct ShipJob {
    head: EntryHead,
    frames: Vec<u8>,
    reply: oneshot::Sender<Result<u64, FollowError>>,
}

/// Why a shipped batch was not applied. Nothing of it was written (a refused batch may leave an empty new segment
/// behind when the leader rolled and the write then failed: the retry writes into it).
#[derive(Debug, Clone)]
pub enum FollowError {
    /// It does not start at this log's end: the leader resends from `end`.
    Gap { end: u64 },
    /// It claims another partition, or a place in the segments that is not this log's end, or its frames are not
    /// exactly `count` consecutive verified frames from its first offset, back to back, or it is larger than any
    /// batch a leader writes.
    Mismatch(String),
    /// The write or its sync failed, or the log is closed or has no journal (`Poisoned`, `Closed`, `Io`,
    /// `NoSpace` as for an append).
    Append(AppendError),
    /// `MAX_QUEUED_SHIPS` batches already wait for this log's writer: nothing was queued (the leader retries).
    Busy,
}

/// Shipped batches that may wait for a log's writer task at once: a leader keeps at most
/// `[cluster] replica_max_in_flight` (8 by default, 16 at most) in flight per follower and partition
/// (`front::replicate::Windows`); a peer that sends more is refused, not queued.
pub const MAX_QUEUED_SHIPS: usize = 16;

impl From<AppendError> for FollowError {
    fn from(e: AppendError) -> FollowError {
        FollowError::Append(e)
    }
}

impl Log {
    /// Leader side: `hook` is called with every batch once it is durable (its head and frames), in log order.
    pub fn set_on_ship(&self, hook: ShipHook) {
        *self.on_ship.borrow_mut() = Some(hook);
    }

    /// Follower side: writes a batch shipped by the leader at the end of this log, at the segment and position the
    /// leader wrote it (rolling to a new segment first when the leader did), durable through the core's journal;
    /// its offsets are readable when this returns `Ok`.
    pub async fn apply_shipped(&self, head: &EntryHead, frames: &[u8]) -> Result<(), FollowError> {
        if self.closed.get() {
            return Err(AppendError::Closed.into());
        }
        if self.is_poisoned() {
            return Err(AppendError::Poisoned.into());
        }
        if self.journal.is_none() {
            return Err(FollowError::Mismatch(
                "a follower writes through its core's journal (fsync always or interval)".into(),
            ));
        }
        // Checked before it is copied and queued: a batch larger than any a leader writes is refused here.
        if frames.len() as u64 > MAX_BATCH_BYTES.max(self.opts.segment_bytes) {
            return Err(FollowError::Mismatch(format!(
                "{} bytes: larger than any batch a leader writes",
                frames.len()
            )));
        }
        if self.ships.borrow().len() >= MAX_QUEUED_SHIPS {
            return Err(FollowError::Busy);
        }
        let (tx, rx) = oneshot::channel();
        self.ships.borrow_mut().push_back(ShipJob {
            head: head.clone(),
            frames: frames.to_vec(),
            reply: tx,
        });
        self.queue_event.notify(1);
        rx.await.unwrap_or(Err(AppendError::Closed.into()))?;
        Ok(())
    }

    /// The writer task: applies one shipped batch and answers it.
    pub(super) async fn run_ship(&self, job: ShipJob) {
        let result = if self.is_poisoned() {
            Err(AppendError::Poisoned.into())
        } else {
            self.apply_checked(&job.head, &job.frames).await
        };
        if let Ok(first) = result {
            self.batches.set(self.batches.get() + 1);
            self.appended.notify(usize::MAX);
            if let Some(f) = self.on_append.borrow().as_ref() {
                f((self.end_offset() - first) as usize);
            }
        }
        let _ = job.reply.send(result);
    }

    async fn apply_checked(&self, head: &EntryHead, frames: &[u8]) -> Result<u64, FollowError> {
        let link = self.journal.as_ref().expect("checked by apply_shipped");
        if (head.topic.as_str(), head.topic_id, head.partition)
            != (link.topic.as_str(), link.topic_id, link.partition)
        {
            return Err(FollowError::Mismatch(format!(
                "a batch of {}/{} (id {}) shipped to {}/{} (id {})",
                head.topic,
                head.partition,
                head.topic_id,
                link.topic,
                link.partition,
                link.topic_id
            )));
        }
        let end = self.end_offset();
        if head.first_offset != end {
            return Err(FollowError::Gap { end });
        }
        let mismatch = || {
            FollowError::Mismatch(format!(
                "{} bytes shipped as {} frames from offset {} are not exactly that",
                frames.len(),
                head.count,
                head.first_offset
            ))
        };
        // Exactly `count` consecutive verified frames from the first offset, back to back from byte 0: the scan
        // passes over bytes between frames (resyncing), so each frame must start where the one before ended.
        let last = head
            .first_offset
            .checked_add(u64::from(head.count))
            .ok_or_else(mismatch)?;
        let scan = frame::scan(frames, head.first_offset, self.opts.max_payload);
        if head.count == 0
            || scan.valid_len != frames.len() as u64
            || !scan.corrupt.is_empty()
            || scan.next_offset != last
            || scan.positions.len() != head.count as usize
        {
            return Err(mismatch());
        }
        let mut at = 0usize;
        for &p in &scan.positions {
            let header = frame::decode_header(&frames[at..], self.opts.max_payload);
            match header {
                Ok(h) if p as usize == at => at += h.frame_len(),
                _ => return Err(mismatch()),
            }
        }
        if at != frames.len() {
            return Err(mismatch());
        }
        let len = frames.len() as u64;
        let (active_base, active_len) = {
            let st = self.state.borrow();
            let active = st.segments.last().expect("a log always has a segment");
            (active.base, active.len)
        };
        // Where the leader wrote it: its rule is a roll before a batch that would push a segment that holds frames
        // past `segment_bytes` (a batch alone may be larger), and positions fit below NO_POSITION.
        let position_ok = head
            .position
            .checked_add(len)
            .is_some_and(|to| to < u64::from(NO_POSITION))
            && (head.position == 0 || head.position + len <= self.opts.segment_bytes);
        if !position_ok {
            return Err(FollowError::Mismatch(format!(
                "{len} bytes at position {} overflow a segment of {} bytes",
                head.position, self.opts.segment_bytes
            )));
        }
        if head.segment_base != active_base {
            // The leader rolled: a new segment starts at this batch.
            if head.segment_base != end || head.position != 0 {
                return Err(FollowError::Mismatch(format!(
                    "segment {} at {} does not start at this log's end {end}",
                    head.segment_base, head.position
                )));
            }
            self.roll(head.segment_base).await?;
        } else if head.position != active_len {
            return Err(FollowError::Mismatch(format!(
                "position {} in segment {} is not this log's end {active_len}",
                head.position, head.segment_base
            )));
        }
        let (file, start_pos, old_positions, zeroed_to, base) = {
            let st = self.state.borrow();
            let active = st.segments.last().expect("a log always has a segment");
            (
                active.open_file(),
                active.len,
                active.positions.len(),
                active.zeroed_to,
                active.base,
            )
        };
        let mut buf = journal::begin_entry(head, frames.len());
        let frames_at = buf.len();
        buf.extend_from_slice(frames);
        // Below NO_POSITION, checked above.
        let positions = scan
            .positions
            .iter()
            .map(|&p| (start_pos + u64::from(p)) as u32)
            .collect();
        let timestamp_ms = scan.last_timestamp_ms.unwrap_or(0);
        Ok(self
            .write_built(Built {
                buf,
                frames_at,
                file,
                start_pos,
                old_positions,
                zeroed_to,
                base,
                first: head.first_offset,
                positions,
                timestamp_ms,
            })
            .await?)
    }
}

#[cfg(test)]
mod tests;
