//! A follower's side of a partition's log (replication, `docs/replication.md` step 2): the leader ships each batch
//! it made durable as the journal entry's head ([`EntryHead`]: segment, position, first offset, count) and its
//! frames exactly as written; the follower checks them and writes them at the very same place, through its own
//! core's journal (one fdatasync per pass, whatever the number of leaders feeding it), so its segments are
//! byte-identical to the leader's. Nothing shipped is trusted: a batch that does not continue this log exactly, or
//! whose frames do not verify, changes nothing and says why.
//!
//! The leader's side is [`Log::set_on_ship`], called with every durable batch (a log with a journal only: its
//! link names the partition, and a follower writes through its own journal). On the follower, shipped batches go
//! through the log's writer task like appends (in arrival order; consecutive batches queued while a pass was written
//! go in one write, as appends do: `Log::take_ships`), so nothing else writes the segment meanwhile, a caller that stops waiting leaves nothing half done, and a close waits for
//! them. A follower's log takes no appends of its own (its partition is served by the leader); one that did would
//! only make the next shipped batch a `Gap`.

use super::{AppendError, Built, Log, ReadError, MAX_BATCH_BYTES};
use crate::storage::frame::{self, NO_POSITION};
use crate::storage::journal::{self, EntryHead};
use futures_channel::oneshot;

/// Called with each durable batch: its head and its frames (exactly the segment's bytes).
pub type ShipHook = Box<dyn Fn(&EntryHead, &[u8])>;

/// A shipped batch, or a cut of a diverged tail, waiting for the writer task.
pub(super) struct ShipJob {
    work: Work,
    reply: oneshot::Sender<Result<u64, FollowError>>,
}

enum Work {
    /// A batch of the leadership of this epoch.
    Batch(EntryHead, Vec<u8>, u64),
    /// [`Log::truncate_diverged`] to this offset.
    Cut(u64),
    /// [`Log::restart_at`] this offset, for the leadership of this epoch.
    Restart(u64, u64),
}

impl Work {
    fn frames_len(&self) -> usize {
        match self {
            Work::Batch(_, frames, _) => frames.len(),
            Work::Cut(_) | Work::Restart(..) => 0,
        }
    }
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

/// While it lives a shipped batch is being written; however that ends, its drop says so (`Log::stop_following`).
struct Shipping<'a>(&'a Log);

impl<'a> Shipping<'a> {
    fn start(log: &'a Log) -> Shipping<'a> {
        log.shipping.set(true);
        Shipping(log)
    }
}

impl Drop for Shipping<'_> {
    fn drop(&mut self) {
        self.0.shipping.set(false);
        self.0.ship_done.notify(usize::MAX);
    }
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

    /// A follower's replica becomes its partition's leader: from now on every shipped batch is refused (those
    /// queued too); returns once the one being written, if any, is written or failed, so that the log's end no
    /// longer moves but by the new leader's own appends.
    pub async fn stop_following(&self) {
        self.ships_refused.set(true);
        let queued: Vec<ShipJob> = self.ships.borrow_mut().drain(..).collect();
        for job in queued {
            let _ = job.reply.send(Err(FollowError::Mismatch(
                "this replica leads the partition now".into(),
            )));
        }
        while self.shipping.get() {
            let done = self.ship_done.listen();
            if self.shipping.get() {
                done.await;
            }
        }
    }

    /// A leader's replica becomes a follower: it ships nothing more, and takes shipped batches again. Its own
    /// appends still queued (behind a slow sync, say) are refused, not written: the writer would put them after
    /// what the new leader ships, or after a truncation by epoch, as records no leader wrote there. (Found by the
    /// node simulation: a deposed leader's queued appends landed where its cut diverged tail had been, and a power
    /// cut later made that log the greatest of its fencing round.) The batch being written, if any, lands first,
    /// like the rest of its old log.
    pub fn start_following(&self) {
        *self.on_ship.borrow_mut() = None;
        // Nothing of its own is held for a commit any more (`Log::gather_behind_commit`).
        self.commit_at(u64::MAX);
        self.ships_refused.set(false);
        let queued: Vec<_> = self.queue.borrow_mut().drain(..).collect();
        for p in queued {
            let _ = p.reply.send(Err(AppendError::NotLeading));
        }
        self.own_written.notify(usize::MAX);
    }

    /// Follower side: writes a batch shipped by the leader at the end of this log, at the segment and position the
    /// leader wrote it (rolling to a new segment first when the leader did), durable through the core's journal;
    /// its offsets are readable when this returns `Ok`.
    pub async fn apply_shipped(&self, head: &EntryHead, frames: &[u8]) -> Result<(), FollowError> {
        self.apply_shipped_of(u64::MAX, head, frames).await
    }

    /// [`Log::apply_shipped`] for a batch of the leadership of `epoch`: refused, unwritten, if a newer one fenced
    /// this replica ([`Log::fence_ships`]) before its turn to be written came.
    pub async fn apply_shipped_of(
        &self,
        epoch: u64,
        head: &EntryHead,
        frames: &[u8],
    ) -> Result<(), FollowError> {
        // Checked before it is copied and queued: a batch larger than any a leader writes is refused here.
        if frames.len() as u64 > MAX_BATCH_BYTES.max(self.opts.segment_bytes) {
            return Err(FollowError::Mismatch(format!(
                "{} bytes: larger than any batch a leader writes",
                frames.len()
            )));
        }
        self.queue_work(|| Work::Batch(head.clone(), frames.to_vec(), epoch))
            .await?;
        Ok(())
    }

    /// Queues work for the writer task and waits for its answer, unless the log cannot take it now (closed,
    /// poisoned, without a journal, leading, or `MAX_QUEUED_SHIPS` jobs waiting already: nothing is queued).
    async fn queue_work(&self, work: impl FnOnce() -> Work) -> Result<u64, FollowError> {
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
        if self.ships_refused.get() {
            return Err(FollowError::Mismatch(
                "this replica leads the partition now".into(),
            ));
        }
        if self.ships.borrow().len() >= MAX_QUEUED_SHIPS {
            return Err(FollowError::Busy);
        }
        let (tx, rx) = oneshot::channel();
        self.ships.borrow_mut().push_back(ShipJob {
            work: work(),
            reply: tx,
        });
        self.queue_event.notify(1);
        rx.await.unwrap_or(Err(AppendError::Closed.into()))
    }

    /// A newer leadership fenced this replica at `epoch` (its floor): shipped batches of older ones still queued,
    /// or shipped later, are refused at their turn to be written, so that once [`Log::ships_settled`] returns the
    /// log's end moves only by batches of `epoch` or newer.
    pub fn fence_ships(&self, epoch: u64) {
        self.ship_fence.set(self.ship_fence.get().max(epoch));
    }

    /// Follower side: waits until no batch of this replica's own appends is being written, and none is queued (a
    /// replica deposed a moment ago refuses its queued ones once it follows: `start_following`). A leader deposed
    /// while one was being written (behind a stalled sync) lands it after it follows: its end, and what its history
    /// says of it, are decided only once it has (found by the node simulation, seed 10152: a probe found no
    /// divergence at an end the landing batch then passed, took its leader's history for that offset, and the old
    /// leadership's record stayed there under the new epoch, to be served as the acknowledged one after a power cut).
    pub async fn own_writes_settled(&self) {
        while self.own_writing.get() || !self.queue.borrow().is_empty() {
            let done = self.own_written.listen();
            if self.own_writing.get() || !self.queue.borrow().is_empty() {
                done.await;
            }
        }
    }

    /// Returns once no shipped batch is being written (one under way lands first).
    pub async fn ships_settled(&self) {
        while self.shipping.get() {
            let done = self.ship_done.listen();
            if self.shipping.get() {
                done.await;
            }
        }
    }

    /// Follower side, truncation by epoch (`docs/replication.md`, step 4): cuts this log back to `to`, removing
    /// the records from `to` on, which another leadership wrote and the partition's leader does not hold (the
    /// caller found where they diverge: `EpochHistory::divergence`). Never below the log's start. Run by the writer
    /// task between shipped batches, so nothing writes meanwhile: first every journal file holding this log's
    /// entries is checkpointed away (`Journal::checkpoint_now`; a replay must never write the cut batches back),
    /// then the later segments are removed, newest first, the one holding `to` is cut at its frame and synced, and
    /// the directory synced; each step leaves a prefix of the old log. Returns the log's end once it is durable
    /// (`to`, or the end if it was already at or below it). A failed removal, cut or sync poisons the log until a
    /// restart (which opens whatever prefix is on disk; the next probe cuts again).
    pub async fn truncate_diverged(&self, to: u64) -> Result<u64, FollowError> {
        self.queue_work(|| Work::Cut(to)).await
    }

    /// Follower side, a replica behind its leader's retention (`docs/replication.md`, step 5): the leader's log
    /// starts at `at` (retention removed every segment below it), past this log's end, so nothing this log holds is
    /// a record the leader still keeps, and nothing the leader keeps can continue it. The log starts anew at `at`,
    /// empty, in a new segment there, so that the leader's whole sealed segments and then its stream fill it at
    /// their own places (byte-identical files). Run by the writer task between shipped batches, as a cut is: the
    /// journal files holding this log's entries are checkpointed away first (a replay must never write the old
    /// records back), then the segment at `at` is created and the directory synced, and only then are the old
    /// segments removed, oldest first, and the directory synced again; a crash at any step leaves a log whose
    /// end is `at` (old segments left over sit below a gap, which recovery reads as lost offsets, under the
    /// leader's retention anyway, and the next restart drops them). Returns the log's end: `at`; or, unchanged,
    /// the end of a log that ends past `at`, or starts and ends there (a restart done already). Refused at its turn
    /// when a leadership newer than `epoch` fenced this replica meanwhile ([`Log::fence_ships`]): its round read
    /// this log's end. A failed creation, checkpoint or sync poisons the log until a restart.
    pub async fn restart_at(&self, at: u64, epoch: u64) -> Result<u64, FollowError> {
        self.queue_work(|| Work::Restart(at, epoch)).await
    }

    /// Leader side, catch-up of a follower behind what the shipper keeps: the durable frames from offset `from`
    /// on, as a batch a follower applies with [`Log::apply_shipped`]: whole consecutive frames of one segment,
    /// back to back, exactly as the segment holds them (from its file, or from the write-behind buffer), at most
    /// `max_bytes` unless the first frame alone is larger (or the segment is larger than `segment_bytes`: a batch
    /// that was larger alone, read whole), and none at or past `until`. `Ok(None)`: nothing at
    /// `from` yet. `Err`: they cannot be shipped (`OutOfRetention`; `Corrupt` for a damaged frame, or an offset the
    /// log skipped to a frontier; `Io`).
    pub async fn read_for_follower(
        &self,
        from: u64,
        until: u64,
        max_bytes: u64,
    ) -> Result<Option<(EntryHead, Vec<u8>)>, ReadError> {
        let Some(link) = self.journal.as_ref() else {
            return Err(ReadError::Corrupt);
        };
        let (file, base, pos, len, count) = {
            let st = self.state.borrow();
            let start = st.segments.first().map_or(0, |s| s.base);
            if from < start {
                return Err(ReadError::OutOfRetention { start });
            }
            let end = st.next_offset.min(until);
            if from >= end {
                return Ok(None);
            }
            if st.corrupt.contains(from) {
                return Err(ReadError::Corrupt);
            }
            let idx = st.segments.partition_point(|s| s.base <= from);
            let Some(seg) = idx.checked_sub(1).map(|i| &st.segments[i]) else {
                return Err(ReadError::Corrupt);
            };
            let slot = (from - seg.base) as usize;
            // Where frame `k` of the segment ends: where the next one starts, or the segment's end for its last.
            let frame_end = |k: usize| match seg.positions.get(k + 1) {
                Some(&p) if p != NO_POSITION => Some(u64::from(p)),
                Some(_) => None,
                None => Some(seg.len),
            };
            let first = match seg.positions.get(slot) {
                Some(&p) if p != NO_POSITION => u64::from(p),
                _ => return Err(ReadError::Corrupt),
            };
            // Frames not yet in the file are read from the write-behind buffer: a run is one or the other.
            let unwritten = self.behind.unwritten_from(seg.base);
            let in_buffer = unwritten.is_some_and(|u| first >= u);
            // A segment larger than `segment_bytes` holds one batch that was larger alone: it goes whole, since a
            // follower takes a batch past that size only at a segment's start.
            let max_bytes = if seg.len > self.opts.segment_bytes {
                u64::MAX
            } else {
                max_bytes
            };
            let mut to = match frame_end(slot) {
                Some(e) => e,
                None => return Err(ReadError::Corrupt),
            };
            let mut count = 1usize;
            loop {
                let k = slot + count;
                let offset = seg.base + k as u64;
                if offset >= end || k >= seg.positions.len() || st.corrupt.contains(offset) {
                    break;
                }
                let Some(next_end) = frame_end(k) else {
                    break;
                };
                if next_end - first > max_bytes
                    || (!in_buffer && unwritten.is_some_and(|u| next_end > u))
                {
                    break;
                }
                to = next_end;
                count += 1;
            }
            if !in_buffer && unwritten.is_some_and(|u| to > u) {
                // (A frame that straddles the buffer's start cannot be: the buffer starts at a frame.)
                return Err(ReadError::Corrupt);
            }
            let file = if in_buffer {
                None
            } else {
                Some(seg.file.clone().ok_or(seg.base))
            };
            (file, seg.base, first, to - first, count)
        };
        let frames = match file {
            None => self.behind.get(base, pos, len).ok_or(ReadError::Corrupt)?,
            Some(file) => {
                let file = match file {
                    Ok(file) => file,
                    Err(base) => self.sealed_file(base).await.map_err(ReadError::Io)?,
                };
                match file.read_cached(pos, len as usize) {
                    Some(bytes) => bytes,
                    None => file
                        .read_at(pos, len as usize)
                        .await
                        .map_err(ReadError::Io)?,
                }
            }
        };
        if frames.len() as u64 != len {
            return Err(ReadError::Corrupt);
        }
        let head = EntryHead {
            topic: link.topic.clone(),
            topic_id: link.topic_id,
            partition: link.partition,
            segment_base: base,
            position: pos,
            first_offset: from,
            count: count as u32,
        };
        Ok(Some((head, frames)))
    }

    /// The next shipped work for the writer task: one job, or the run of batches at the front of the queue that
    /// continue each other exactly (one leadership's consecutive batches in one segment, queued while the last pass
    /// was written), together at most `MAX_BATCH_BYTES`. Written in one pass, as appends queued meanwhile are: a
    /// follower fed faster than it syncs does not fall further behind one fdatasync per leader pass.
    pub(super) fn take_ships(&self) -> Vec<ShipJob> {
        let mut ships = self.ships.borrow_mut();
        let Some(first) = ships.pop_front() else {
            return Vec::new();
        };
        let mut bytes = first.work.frames_len();
        let mut jobs = vec![first];
        loop {
            let last = &jobs.last().expect("one job at least").work;
            let (Work::Batch(last, last_frames, epoch), Some(next)) = (last, ships.front()) else {
                break;
            };
            let Work::Batch(head, frames, next_epoch) = &next.work else {
                break;
            };
            let len = frames.len() as u64;
            let continues = next_epoch == epoch
                && last.count > 0
                && head.count > 0
                && (head.topic_id, head.partition) == (last.topic_id, last.partition)
                && head.topic == last.topic
                && head.segment_base == last.segment_base
                && last.first_offset.checked_add(u64::from(last.count)) == Some(head.first_offset)
                && last.position.checked_add(last_frames.len() as u64) == Some(head.position)
                // Its own place in the segment, as if it came alone (a batch that is not first in its segment
                // stays within `segment_bytes`).
                && head.position.checked_add(len).is_some_and(|to| to <= self.opts.segment_bytes)
                && bytes as u64 + len <= MAX_BATCH_BYTES;
            if !continues {
                break;
            }
            bytes += frames.len();
            jobs.push(ships.pop_front().expect("the front job"));
        }
        jobs
    }

    /// The writer task: applies shipped work taken by [`Log::take_ships`] and answers each job. Several batches go
    /// in one write, each checked to be exactly what it claims; if that write is refused, each is tried alone, so
    /// every answer is the one it would have had on its own.
    pub(super) async fn run_ships(&self, mut jobs: Vec<ShipJob>) {
        if jobs.len() > 1 {
            if let Ok(first) = self.apply_together(&jobs).await {
                self.batches.set(self.batches.get() + jobs.len() as u64);
                self.appended.notify(usize::MAX);
                if let Some(f) = self.on_append.borrow().as_ref() {
                    f((self.end_offset() - first) as usize);
                }
                for job in jobs {
                    let Work::Batch(head, _, _) = &job.work else {
                        unreachable!("only batches are taken together")
                    };
                    let _ = job.reply.send(Ok(head.first_offset));
                }
                return;
            }
            for job in jobs {
                self.run_ship(job).await;
            }
            return;
        }
        if let Some(job) = jobs.pop() {
            self.run_ship(job).await;
        }
    }

    /// Writes consecutive shipped batches ([`Log::take_ships`]) as one: their frames back to back under the first
    /// one's head, each batch's first frame checked to start where its bytes do.
    async fn apply_together(&self, jobs: &[ShipJob]) -> Result<u64, FollowError> {
        let mut frames = Vec::with_capacity(jobs.iter().map(|j| j.work.frames_len()).sum());
        let mut bounds = Vec::with_capacity(jobs.len());
        let mut count = 0u32;
        let mut head = None;
        let mut epoch = 0;
        for job in jobs {
            let Work::Batch(h, f, e) = &job.work else {
                return Err(FollowError::Mismatch(
                    "only batches are written together".into(),
                ));
            };
            bounds.push((count as usize, frames.len()));
            count = count
                .checked_add(h.count)
                .ok_or_else(|| FollowError::Mismatch("too many frames together".into()))?;
            frames.extend_from_slice(f);
            head.get_or_insert_with(|| h.clone());
            epoch = *e;
        }
        let mut head = head.ok_or_else(|| FollowError::Mismatch("nothing to write".into()))?;
        head.count = count;
        if self.is_poisoned() || self.ships_refused.get() || epoch < self.ship_fence.get() {
            // Each alone says why.
            return Err(FollowError::Mismatch("refused".into()));
        }
        let _writing = Shipping::start(self);
        self.apply_checked(&head, &frames, &bounds).await
    }

    /// The writer task: applies one shipped batch and answers it.
    pub(super) async fn run_ship(&self, job: ShipJob) {
        let result = if self.is_poisoned() {
            Err(AppendError::Poisoned.into())
        } else if self.ships_refused.get() {
            Err(FollowError::Mismatch(
                "this replica leads the partition now".into(),
            ))
        } else {
            let _writing = Shipping::start(self);
            match &job.work {
                Work::Batch(_, _, epoch) if *epoch < self.ship_fence.get() => {
                    Err(FollowError::Mismatch(format!(
                        "a batch of epoch {epoch}: a newer leadership ({}) fenced this replica",
                        self.ship_fence.get()
                    )))
                }
                Work::Batch(head, frames, _) => self.apply_checked(head, frames, &[]).await,
                Work::Cut(to) => {
                    let cut = self.cut(*to).await;
                    let _ = job.reply.send(cut);
                    return;
                }
                Work::Restart(_, epoch) if *epoch < self.ship_fence.get() => {
                    Err(FollowError::Mismatch(format!(
                        "a restart of epoch {epoch}: a newer leadership ({}) fenced this replica",
                        self.ship_fence.get()
                    )))
                }
                Work::Restart(at, _) => {
                    let restarted = self.restart(*at).await;
                    let _ = job.reply.send(restarted);
                    return;
                }
            }
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

    /// The writer task's part of [`Log::truncate_diverged`].
    async fn cut(&self, to: u64) -> Result<u64, FollowError> {
        /// Retention leaves the segments alone while it lives (the cut holds indices into them across awaits).
        struct Cutting<'a>(&'a Log);
        impl Drop for Cutting<'_> {
            fn drop(&mut self) {
                self.0.cutting.set(false);
            }
        }
        self.cutting.set(true);
        let _cutting = Cutting(self);
        let link = self.journal.as_ref().expect("checked by truncate_diverged");
        let (start, end) = (self.start_offset(), self.end_offset());
        if to >= end {
            return Ok(end);
        }
        if to < start {
            return Err(FollowError::Mismatch(format!(
                "a cut at {to} is below the log's start {start}"
            )));
        }
        // Where, checked before anything is done: the segment holding the record before `to` (one that starts at
        // `to` goes too: the leader's next batch may continue the segment before it), or the first one for a cut
        // of everything; and the frame at the cut. One lost to damage moves the cut back to the nearest frame
        // before it that is whole (cutting more than needed only makes the leader ship more).
        let (keep, to, pos, base, path, removed) = {
            let st = self.state.borrow();
            let keep = st
                .segments
                .partition_point(|s| s.base < to)
                .saturating_sub(1);
            let seg = &st.segments[keep];
            let mut slot = (to - seg.base) as usize;
            if slot > seg.positions.len() {
                // In a gap between segments (offsets lost at recovery): the cut goes to this segment's end.
                slot = seg.positions.len();
            }
            while seg.positions.get(slot) == Some(&NO_POSITION) {
                slot = slot.checked_sub(1).ok_or_else(|| {
                    FollowError::Mismatch(format!(
                        "the frames from segment {} to {to}, where the log would be cut, were lost to damage",
                        seg.base
                    ))
                })?;
            }
            let pos = seg.positions.get(slot).map_or(seg.len, |&p| u64::from(p));
            let removed: Vec<(u64, std::path::PathBuf)> = st.segments[keep + 1..]
                .iter()
                .map(|s| (s.base, s.path.clone()))
                .collect();
            (
                keep,
                seg.base + slot as u64,
                pos,
                seg.base,
                seg.path.clone(),
                removed,
            )
        };
        link.journal.checkpoint_now().await?;
        // (The checkpoint flushed this log's write-behind buffer; nothing was buffered since.)
        if let Err(e) = self.behind.flush() {
            self.poisoned.set(true);
            return Err(AppendError::Io(e.to_string()).into());
        }
        let fail = |what: &str, e: std::io::Error| {
            tracing::error!(dir = %self.dir.display(), error = %e, "cutting a diverged tail: {what} failed; refusing appends until restart");
            self.poisoned.set(true);
            FollowError::Append(AppendError::Io(e.to_string()))
        };
        // Nothing past the cut is readable from here on, whatever happens next (a failure poisons the log; the
        // next start opens whatever prefix is on disk).
        self.state.borrow_mut().next_offset = to;
        *self.tail.borrow_mut() = Default::default();
        // The segment that stays is opened first; the state changes only once the files did.
        let held = self.state.borrow().segments[keep].file.clone();
        let file = match held {
            Some(file) => file,
            None => self
                .storage
                .open(&path, false)
                .await
                .map_err(|e| fail("opening the segment to cut", e))?,
        };
        for (gone, path) in removed.iter().rev() {
            self.storage
                .remove(path)
                .await
                .map_err(|e| fail("a segment's removal", e))?;
            self.sealed_cache.borrow_mut().take_if(|(b, _)| b == gone);
        }
        self.sealed_cache.borrow_mut().take_if(|(b, _)| *b == base);
        file.truncate(pos)
            .await
            .map_err(|e| fail("the segment's cut", e))?;
        file.sync()
            .await
            .map_err(|e| fail("the segment's sync", e))?;
        self.syncs.set(self.syncs.get() + 1);
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|e| fail("the directory's sync", e))?;
        {
            let mut st = self.state.borrow_mut();
            st.segments.truncate(keep + 1);
            let seg = &mut st.segments[keep];
            assert_eq!(seg.base, base, "retention held off during the cut");
            seg.file = Some(file);
            seg.positions.truncate((to - base) as usize);
            seg.len = pos;
            seg.zeroed_to = pos;
            st.next_offset = to;
            st.corrupt.drop_from(to);
            st.dirty = false;
        }
        tracing::warn!(dir = %self.dir.display(), from = to, to = end, "cut a diverged tail: records another leadership wrote and the partition's leader does not hold");
        Ok(to)
    }

    /// The writer task's part of [`Log::restart_at`].
    async fn restart(&self, at: u64) -> Result<u64, FollowError> {
        /// Retention leaves the segments alone while it lives.
        struct Restarting<'a>(&'a Log);
        impl Drop for Restarting<'_> {
            fn drop(&mut self) {
                self.0.cutting.set(false);
            }
        }
        let (start, end) = (self.start_offset(), self.end_offset());
        if end > at || start == at {
            return Ok(end);
        }
        self.cutting.set(true);
        let _restarting = Restarting(self);
        let link = self.journal.as_ref().expect("checked by restart_at");
        let fail = |what: &str, e: std::io::Error| {
            tracing::error!(dir = %self.dir.display(), error = %e, "starting the log anew at its leader's start: {what} failed; refusing appends until restart");
            self.poisoned.set(true);
            FollowError::Append(AppendError::Io(e.to_string()))
        };
        link.journal.checkpoint_now().await?;
        if let Err(e) = self.behind.flush() {
            return Err(fail("writing the frames still behind", e));
        }
        let segment = Self::create_segment(&*self.storage, &self.dir, at)
            .await
            .map_err(|e| fail("the new segment's creation", e))?;
        // (A restart that a crash interrupted left it there already, perhaps zero-filled: emptied.)
        segment
            .open_file()
            .truncate(0)
            .await
            .map_err(|e| fail("the new segment's truncation", e))?;
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|e| fail("the directory's sync", e))?;
        // From here on the log is the new segment alone: nothing below `at` is readable.
        let old: Vec<(u64, std::path::PathBuf)> = {
            let mut st = self.state.borrow_mut();
            let old = st
                .segments
                .drain(..)
                .filter(|s| s.base != at)
                .map(|s| (s.base, s.path))
                .collect();
            st.segments.push(segment);
            st.next_offset = at;
            st.corrupt.drop_below(at);
            st.dirty = false;
            old
        };
        *self.tail.borrow_mut() = Default::default();
        *self.sealed_cache.borrow_mut() = None;
        for (base, path) in &old {
            // One left over is harmless (below a gap, under retention): it is said and the rest go on.
            if let Err(e) = self.storage.remove(path).await {
                tracing::warn!(dir = %self.dir.display(), segment = base, error = %e, "cannot remove a segment below the leader's start");
            }
        }
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|e| fail("the directory's sync", e))?;
        tracing::warn!(dir = %self.dir.display(), from = end, to = at, "this replica's log ended below its leader's start (retention removed the records between): it starts anew there, and is filled from the leader's segments");
        Ok(at)
    }

    /// Checks a shipped batch and writes it. `bounds` (index of a frame, its byte offset): where batches written
    /// together begin, each checked as its own head claims.
    async fn apply_checked(
        &self,
        head: &EntryHead,
        frames: &[u8],
        bounds: &[(usize, usize)],
    ) -> Result<u64, FollowError> {
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
        if at != frames.len()
            || bounds
                .iter()
                .any(|&(i, at)| scan.positions.get(i).is_none_or(|&p| p as usize != at))
        {
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
