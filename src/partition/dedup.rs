//! Produce deduplication: within its topic's `dedup_window`, a produce whose `dedup_id` a partition already holds
//! is answered with the first one's offset and not appended. The ids live in the records' meta blocks, so the window
//! survives restarts and failovers: a leader's table is built from its log (the records of the window) at the
//! first deduplicated produce of its leadership, then kept in memory. Deduplicated produces of one partition run
//! one at a time (check, append, remember), so two with the same id never both append.

use super::{Partition, PartitionError};
use crate::storage::log::{ReadAhead, ReadError};
use crate::storage::meta::RecordMeta;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use tracing::{info, warn};

/// The ids a leader remembers: id → (offset, time), and (time, id) oldest first to expire them; the window they
/// were read from the log for.
#[derive(Default)]
pub(super) struct DedupTable {
    ids: HashMap<Bytes, (u64, u64)>,
    order: VecDeque<(u64, Bytes)>,
    window_ms: u64,
}

impl DedupTable {
    /// Remembers `id` at `offset` unless it is remembered already (the first one stays: an id in the log twice,
    /// appended again after it left the table, answers with its first offset). Copies the id: a slice would keep
    /// its whole record (or read buffer) in memory.
    fn insert(&mut self, id: &Bytes, offset: u64, at_ms: u64, max_ids: usize) {
        if self.ids.contains_key(id) {
            return;
        }
        while self.ids.len() >= max_ids.max(1) {
            let Some((_, old)) = self.order.pop_front() else {
                break;
            };
            self.ids.remove(&old);
        }
        let id = Bytes::copy_from_slice(id);
        self.ids.insert(id.clone(), (offset, at_ms));
        self.order.push_back((at_ms, id));
    }

    /// Forgets ids remembered before `since_ms`.
    fn expire(&mut self, since_ms: u64) {
        while let Some((at, _)) = self.order.front() {
            if *at >= since_ms {
                break;
            }
            let (_, id) = self.order.pop_front().expect("a front");
            self.ids.remove(&id);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// A deduplicated produce's records, as the owner appends them.
pub struct DedupRecords {
    /// Payloads as the log stores them.
    pub payloads: Vec<Bytes>,
    /// Which payloads start with a meta block (empty: none does).
    pub meta: Vec<bool>,
    /// Each record's deduplication id, if any (the same as in its meta block).
    pub ids: Vec<Option<Bytes>>,
}

impl Partition {
    /// Appends `records`, except those whose id the partition holds from within the last `window_ms` (or that
    /// repeat an earlier record of the same call): each gets its offset, the first one's for a duplicate. At most
    /// `max_ids` ids are remembered (the oldest are forgotten first). Resolves once the appended ones are durable.
    pub async fn append_deduplicated(
        &self,
        records: DedupRecords,
        window_ms: u64,
        max_ids: usize,
    ) -> Result<Vec<u64>, PartitionError> {
        assert_eq!(
            records.ids.len(),
            records.payloads.len(),
            "an id slot per record"
        );
        self.check_leading()?;
        let _turn = self.dedup_turn.take().await;
        self.check_leading()?;
        let now = self.clock.wall_ms();
        let since = now.saturating_sub(window_ms);
        // A window widened since the table was read: read it again (the log holds the older ids).
        if self
            .dedup
            .borrow()
            .as_ref()
            .is_some_and(|t| t.window_ms < window_ms)
        {
            self.forget_dedup();
        }
        if self.dedup.borrow().is_none() {
            let generation = self.dedup_generation.get();
            let mut table = self.load_dedup(since, max_ids).await?;
            table.window_ms = window_ms;
            // A leadership that ended (or began) while the log was read: the table may hold ids of records a new
            // leader cut; not installed.
            self.check_leading()?;
            if self.dedup_generation.get() != generation {
                return Err(PartitionError::Unavailable(format!(
                    "partition {}: its leadership changed while its deduplication ids were read",
                    self.id
                )));
            }
            *self.dedup.borrow_mut() = Some(table);
        }
        let generation = self.dedup_generation.get();
        // Which records are new, and for each duplicate the offset it repeats (or the new record it repeats).
        enum Slot {
            Known(u64),
            New(usize),
        }
        let mut slots = Vec::with_capacity(records.ids.len());
        let mut fresh: Vec<usize> = Vec::new();
        {
            let mut guard = self.dedup.borrow_mut();
            let table = guard.as_mut().expect("loaded above");
            table.expire(since);
            let mut in_call: HashMap<&Bytes, usize> = HashMap::new();
            for (i, id) in records.ids.iter().enumerate() {
                let Some(id) = id else {
                    slots.push(Slot::New(fresh.len()));
                    fresh.push(i);
                    continue;
                };
                if let Some((offset, _)) = table.ids.get(id) {
                    slots.push(Slot::Known(*offset));
                } else if let Some(&k) = in_call.get(id) {
                    slots.push(Slot::New(k));
                } else {
                    in_call.insert(id, fresh.len());
                    slots.push(Slot::New(fresh.len()));
                    fresh.push(i);
                }
            }
        }
        let first = if fresh.is_empty() {
            0
        } else {
            let payloads = fresh.iter().map(|&i| records.payloads[i].clone()).collect();
            let meta = if records.meta.is_empty() {
                Vec::new()
            } else {
                fresh.iter().map(|&i| records.meta[i]).collect()
            };
            let first = self.append_records(payloads, meta).await?;
            let mut guard = self.dedup.borrow_mut();
            // (The table of this leadership only: one forgotten meanwhile is read again from the log.)
            if let Some(table) = guard
                .as_mut()
                .filter(|_| self.dedup_generation.get() == generation)
            {
                for (k, &i) in fresh.iter().enumerate() {
                    if let Some(id) = &records.ids[i] {
                        table.insert(id, first + k as u64, now, max_ids);
                    }
                }
            }
            first
        };
        Ok(slots
            .into_iter()
            .map(|s| match s {
                Slot::Known(offset) => offset,
                Slot::New(k) => first + k as u64,
            })
            .collect())
    }

    /// The table of a new leadership, from the log's records written since `since_ms`.
    async fn load_dedup(
        &self,
        since_ms: u64,
        max_ids: usize,
    ) -> Result<DedupTable, PartitionError> {
        let mut table = DedupTable::default();
        let end = self.log.end_offset();
        let mut offset = self
            .log
            .first_offset_since(since_ms)
            .max(self.log.start_offset());
        let from = offset;
        let mut ahead = ReadAhead::default();
        let (mut unread, mut bytes) = (0u64, 0usize);
        while offset < end {
            match self.log.read_ahead(offset, end, &mut ahead).await {
                Ok(record) => {
                    bytes += record.payload.len();
                    let id = record
                        .meta
                        .as_deref()
                        .and_then(|m: &RecordMeta| m.dedup_id.as_ref());
                    if let Some(id) = id.filter(|_| record.timestamp_ms >= since_ms) {
                        table.insert(id, offset, record.timestamp_ms, max_ids);
                    }
                    offset += 1;
                }
                Err(ReadError::Io(e)) => return Err(PartitionError::Storage(e.to_string())),
                Err(ReadError::OutOfRetention { start }) => offset = start.max(offset + 1),
                // Corrupt or not there: nothing to remember there.
                Err(_) => {
                    unread += 1;
                    offset += 1;
                }
            }
            if bytes >= 1 << 20 || offset.is_multiple_of(4096) {
                // A long window must not hold the core.
                bytes = 0;
                futures_lite::future::yield_now().await;
            }
        }
        if unread > 0 {
            warn!(dir = %self.dir.display(), unread, "records of the deduplication window could not be read (corrupt): their ids are not remembered");
        }
        info!(dir = %self.dir.display(), from, to = end, ids = table.len(), "deduplication window read from the log");
        Ok(table)
    }

    /// The topic's window is 0 (deduplication off): a table kept now would miss the ids appended meanwhile if it
    /// were turned on again; forgotten.
    pub fn dedup_off(&self) {
        if self.dedup.borrow().is_some() {
            self.forget_dedup();
        }
    }

    /// Forgets the table (a leadership ended or begins, or the window changed): the next deduplicated produce reads
    /// it again from the log.
    pub(super) fn forget_dedup(&self) {
        self.dedup_generation.set(self.dedup_generation.get() + 1);
        *self.dedup.borrow_mut() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_forgets_the_oldest_past_its_size_and_what_left_the_window() {
        let mut t = DedupTable::default();
        for i in 0..5u64 {
            t.insert(&Bytes::from(format!("id{i}")), i, 100 + i, 3);
        }
        // The first one stays.
        t.insert(&Bytes::from_static(b"id4"), 99, 200, 3);
        assert_eq!(t.len(), 3);
        assert!(!t.ids.contains_key(&Bytes::from_static(b"id1")));
        assert!(t.ids.contains_key(&Bytes::from_static(b"id2")));
        t.expire(104);
        assert_eq!(t.len(), 1);
        assert_eq!(t.ids.get(&Bytes::from_static(b"id4")), Some(&(4, 104)));
    }
}
