//! A follower's side of a partition's log (replication, `docs/replication.md` step 2): the leader ships each batch
//! it made durable as the journal entry's head ([`EntryHead`]: segment, position, first offset, count) and its
//! frames exactly as written; the follower checks them and writes them at the very same place, through its own
//! core's journal (one fdatasync per pass, whatever the number of leaders feeding it), so its segments are
//! byte-identical to the leader's. Nothing shipped is trusted: a batch that does not continue this log exactly, or
//! whose frames do not verify, changes nothing and says why.
//!
//! The leader's side is [`Log::set_on_ship`], called with every durable batch. A follower's log takes no appends of
//! its own (the partition is served by its leader), so shipped batches are the only writes: they are refused while
//! an append is queued or another shipped batch is being written.

use super::{AppendError, Built, Log};
use crate::storage::frame;
use crate::storage::journal::{self, EntryHead};

/// Called with each durable batch: its head and its frames (exactly the segment's bytes).
pub type ShipHook = Box<dyn Fn(&EntryHead, &[u8])>;

/// Why a shipped batch was not applied. Nothing of it was written.
#[derive(Debug, Clone)]
pub enum FollowError {
    /// It does not start at this log's end: the leader resends from `end`.
    Gap { end: u64 },
    /// It claims another topic, or a place in the segments that is not this log's end, or its frames do not verify
    /// as exactly `count` consecutive frames from its first offset.
    Mismatch(String),
    /// This log has local appends queued, or is writing another shipped batch.
    Busy,
    /// The write or its sync failed (`Poisoned`, `Closed`, `Io`, `NoSpace` as for an append).
    Append(AppendError),
}

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
    /// leader wrote it (rolling to a new segment first when the leader did), durable per policy (through the core's
    /// journal when there is one); its offsets become readable when this returns `Ok`.
    pub async fn apply_shipped(&self, head: &EntryHead, frames: &[u8]) -> Result<(), FollowError> {
        if self.closed.get() {
            return Err(AppendError::Closed.into());
        }
        if self.poisoned.get() {
            return Err(AppendError::Poisoned.into());
        }
        if self.following.get() || !self.queue.borrow().is_empty() {
            return Err(FollowError::Busy);
        }
        self.following.set(true);
        let result = self.apply_checked(head, frames).await;
        self.following.set(false);
        let first = result?;
        self.batches.set(self.batches.get() + 1);
        self.appended.notify(usize::MAX);
        if let Some(f) = self.on_append.borrow().as_ref() {
            f((self.end_offset() - first) as usize);
        }
        Ok(())
    }

    async fn apply_checked(&self, head: &EntryHead, frames: &[u8]) -> Result<u64, FollowError> {
        if let Some(link) = &self.journal {
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
        }
        let end = self.end_offset();
        if head.first_offset != end {
            return Err(FollowError::Gap { end });
        }
        // The frames: exactly `count` consecutive verified frames from the first offset, nothing else.
        let scan = frame::scan(frames, head.first_offset, self.opts.max_payload);
        if head.count == 0
            || scan.valid_len != frames.len() as u64
            || !scan.corrupt.is_empty()
            || scan.next_offset != head.first_offset + u64::from(head.count)
            || frames.len() as u64 > self.opts.segment_bytes
        {
            return Err(FollowError::Mismatch(format!(
                "{} bytes shipped as {} frames from offset {} do not verify as such",
                frames.len(),
                head.count,
                head.first_offset
            )));
        }
        let (active_base, active_len) = {
            let st = self.state.borrow();
            let active = st.segments.last().expect("a log always has a segment");
            (active.base, active.len)
        };
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
        let mut buf = match &self.journal {
            Some(_) => journal::begin_entry(head, frames.len()),
            None => Vec::with_capacity(frames.len()),
        };
        let frames_at = buf.len();
        buf.extend_from_slice(frames);
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
