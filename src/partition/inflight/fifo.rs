//! Message groups of a FIFO topic, for one [`super::InFlight`] shard: at most one unsettled offset of a group is
//! handed to consumers at a time, the group's lowest.
//!
//! The shard does not read records, so it learns an offset's group when the take has read it and asks
//! ([`super::InFlight::admit`]). The first offset admitted for a group is its *head*: delivered, and leased,
//! released or delayed (by a nack or an expiry) until it settles. Offsets of the group read meanwhile are *held*:
//! not deliverable, counted against `max_in_flight`, and kept in offset order. When the head settles (ack, dead
//! letter, corrupt skip, retention) the lowest held offset becomes the head and deliverable.
//!
//! The take admits the offsets of one consumer group one take at a time, in offset order (`Partition::take`), so
//! a group's head is always its lowest unsettled offset that was read. Memory is bounded by the caps: every offset
//! here is a head (leased, released or delayed) or held (counted against `max_in_flight`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

/// Groups with unsettled offsets, and their held offsets.
#[derive(Clone, Debug, Default)]
pub(super) struct FifoGroups {
    /// Per group: its admitted unsettled offsets, the head first, then the held ones in offset order.
    queues: HashMap<Rc<[u8]>, VecDeque<u64>>,
    /// Offset -> its group, for every offset in `queues`.
    group_of: HashMap<u64, Rc<[u8]>>,
    /// Held offsets -> their delivery counts (0 unless the offset was delivered before it was held).
    held: BTreeMap<u64, u32>,
    /// Held offsets made deliverable since the caller last asked (`take_promoted`): consumers to wake.
    promoted: usize,
}

/// What [`FifoGroups::admit`] decided for a read offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admitted {
    /// The offset is its group's head: deliver it.
    Head,
    /// Another offset of its group is unsettled: the offset is now held (the caller drops its lease).
    Held,
}

impl FifoGroups {
    /// Number of held offsets.
    pub(super) fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Whether `offset` was admitted to a group (and is unsettled): its head or held.
    pub(super) fn is_admitted(&self, offset: u64) -> bool {
        self.group_of.contains_key(&offset)
    }

    /// Whether `group` has unsettled admitted offsets (a head).
    pub(super) fn has_group(&self, group: &[u8]) -> bool {
        self.queues.contains_key(group)
    }

    /// Whether `offset` is its group's head (admitted, unsettled, not held).
    pub(super) fn is_head(&self, offset: u64) -> bool {
        self.group_of.contains_key(&offset) && !self.held.contains_key(&offset)
    }

    /// Test-only: every held offset.
    #[cfg(test)]
    pub(super) fn held_offsets(&self) -> impl Iterator<Item = u64> + '_ {
        self.held.keys().copied()
    }

    pub(super) fn held_count(&self, offset: u64) -> Option<u32> {
        self.held.get(&offset).copied()
    }

    /// `offset`, leased and delivered `delivery_count` times before this lease, was read and belongs to `group`.
    pub(super) fn admit(&mut self, offset: u64, group: &[u8], delivery_count: u32) -> Admitted {
        if let Some(known) = self.group_of.get(&offset) {
            // A head that was released and leased again: it stays the head.
            assert_eq!(&**known, group, "offset {offset} changed group");
            assert!(
                !self.held.contains_key(&offset),
                "a held offset {offset} was leased"
            );
            return Admitted::Head;
        }
        let key: Rc<[u8]> = match self.queues.get_key_value(group) {
            Some((k, _)) => k.clone(),
            None => Rc::from(group),
        };
        let queue = self.queues.entry(key.clone()).or_default();
        self.group_of.insert(offset, key);
        if queue.is_empty() {
            queue.push_back(offset);
            return Admitted::Head;
        }
        // Held, in offset order behind the head (an offset below the head, which the take's order rules out, is
        // held right behind it: the group stays one at a time).
        if queue.back().is_some_and(|&last| last < offset) {
            queue.push_back(offset);
        } else {
            let at = 1 + queue.make_contiguous()[1..].partition_point(|&o| o < offset);
            queue.insert(at, offset);
        }
        let prev = self.held.insert(offset, delivery_count);
        assert!(prev.is_none(), "offset {offset} held twice");
        Admitted::Held
    }

    /// `offset` is settled (or retained away). Returns the held offset that became its group's head, with its
    /// delivery count, for the caller to make deliverable.
    pub(super) fn settled(&mut self, offset: u64) -> Option<(u64, u32)> {
        let group = self.group_of.remove(&offset)?;
        let queue = self
            .queues
            .get_mut(&group)
            .expect("an admitted offset's group has a queue");
        if queue.front() == Some(&offset) {
            queue.pop_front();
            let next = queue.front().copied();
            if queue.is_empty() {
                self.queues.remove(&group);
            }
            let next = next?;
            let count = self
                .held
                .remove(&next)
                .expect("a queue's second offset is held");
            self.promoted += 1;
            Some((next, count))
        } else {
            // Only retention settles a held offset.
            let at = queue
                .iter()
                .position(|&o| o == offset)
                .expect("an admitted offset is in its group's queue");
            queue.remove(at);
            self.held.remove(&offset);
            None
        }
    }

    /// How many held offsets became their group's head since the last call.
    pub(super) fn take_promoted(&mut self) -> usize {
        std::mem::take(&mut self.promoted)
    }

    /// Every admitted offset below `start`, lowest first (for retention).
    pub(super) fn admitted_below(&self, start: u64) -> Vec<u64> {
        let mut below: Vec<u64> = self
            .group_of
            .keys()
            .copied()
            .filter(|&o| o < start)
            .collect();
        below.sort_unstable();
        below
    }

    /// Test-only: the structure is consistent, and every head satisfies `head_ok` (unsettled and not held).
    #[cfg(test)]
    pub(super) fn check(&self, head_ok: impl Fn(u64) -> bool) {
        let mut seen = 0usize;
        for (group, queue) in &self.queues {
            assert!(!queue.is_empty(), "empty queue of {group:?}");
            let head = queue[0];
            assert!(!self.held.contains_key(&head), "head {head} held");
            assert!(head_ok(head), "head {head} of {group:?} is not unsettled");
            for w in queue.iter().skip(1).collect::<Vec<_>>().windows(2) {
                assert!(w[0] < w[1], "held offsets of {group:?} out of order");
            }
            for &o in queue {
                assert_eq!(self.group_of.get(&o).map(|g| &**g), Some(&**group));
                seen += 1;
            }
            for &o in queue.iter().skip(1) {
                assert!(self.held.contains_key(&o), "queued {o} not held");
            }
        }
        assert_eq!(seen, self.group_of.len(), "stale group_of entries");
        assert_eq!(
            self.held.len() + self.queues.len(),
            self.group_of.len(),
            "held offsets outside the queues"
        );
    }
}
