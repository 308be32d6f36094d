//! A replica's epoch history: in which leadership epoch each record of a replicated partition's log was written,
//! as (epoch, first offset) pairs (Kafka's leader-epoch checkpoint), kept in `replica.epochs` in the partition's
//! directory (format in `docs/format.md`, "replica.epochs"). A leader adds an entry when it starts leading at an
//! epoch (its log's end then); a follower copies its leader's entries for the records it is shipped, before it
//! writes them, so every replica's history matches its leader's over the records they share. The fencing round and
//! truncation of `docs/replication.md` (step 4) compare replicas by (last epoch, end) and cut a replica's log where
//! its last epoch ends in the new leader's history.
//!
//! Pure: the partition (`partition/fence.rs`) reads it at open and writes it (`Storage::replace`: a temp file,
//! fdatasync, rename, directory fsync) before anything relies on a change.

use crate::storage::backend::Storage;
use serde::{Deserialize, Serialize};
use std::path::Path;
use tracing::error;

/// The file's name inside the partition directory.
pub const FILE_NAME: &str = "replica.epochs";

/// Most entries kept: past it the oldest goes (a lookup below the oldest kept entry answers as if that entry
/// covered it, which only ever cuts a returning replica's log shorter than needed, never longer).
pub const MAX_ENTRIES: usize = 256;

/// The records from `start` on (up to the next entry's start) were written by the leader of `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EpochStart {
    pub epoch: u64,
    pub start: u64,
}

/// Entries in strictly ascending order of both epoch and start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochHistory {
    entries: Vec<EpochStart>,
}

/// Whether `entries` ascend strictly in both epoch and start (what a history holds and what a leader ships).
pub fn ascending(entries: &[EpochStart]) -> bool {
    entries
        .windows(2)
        .all(|w| w[0].epoch < w[1].epoch && w[0].start < w[1].start)
}

impl EpochHistory {
    pub fn entries(&self) -> &[EpochStart] {
        &self.entries
    }

    pub fn last(&self) -> Option<EpochStart> {
        self.entries.last().copied()
    }

    /// The epoch whose leader wrote `offset` (0: no entry covers it, a record from before the history, or none).
    pub fn epoch_of(&self, offset: u64) -> u64 {
        self.covering_index(offset)
            .map_or(0, |i| self.entries[i].epoch)
    }

    fn covering_index(&self, offset: u64) -> Option<usize> {
        self.entries
            .partition_point(|e| e.start <= offset)
            .checked_sub(1)
    }

    /// The entries that say in which epochs the records `[from, to)` were written: the one covering `from` (none
    /// when `from` is older than the history: those records have no epoch) and each that starts inside. Empty for
    /// an empty range.
    pub fn covering(&self, from: u64, to: u64) -> Vec<EpochStart> {
        if from >= to {
            return Vec::new();
        }
        let first = self.covering_index(from).unwrap_or(0);
        self.entries[first..]
            .iter()
            .take_while(|e| e.start < to)
            .copied()
            .collect()
    }

    /// What a probe from this history's leader at `epoch` carries: every entry up to that epoch, whatever offset the
    /// probe asks at. Never only those up to the probe's offset: a follower holding more of this leader's records
    /// than the probe asks about (a lost answer, then its node restarted) would read the entries left out as another
    /// leadership's and cut records a majority may hold (`divergence`).
    pub fn up_to_epoch(&self, epoch: u64) -> Vec<EpochStart> {
        self.entries
            .iter()
            .filter(|e| e.epoch <= epoch)
            .copied()
            .collect()
    }

    /// Where the records of `epoch` end here: the start of the first later epoch (None: no later epoch, so at the
    /// log's end). A replica whose last epoch is `epoch` keeps its log below this and cuts the rest.
    pub fn end_of(&self, epoch: u64) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.epoch > epoch)
            .map(|e| e.start)
    }

    /// Truncation by epoch: the first offset below `end` (this replica's log's end) where `leader`'s history (a
    /// probe's: the leader's whole history up to its end) and this one say different leaderships wrote the record,
    /// the records from there on being another leadership's that the leader does not hold; None when they agree on
    /// every record both place. A record older than either history is taken as shared (nothing says otherwise).
    /// Where two histories name the same epoch for a record, they hold the same record: one leader writes an offset
    /// once in its epoch, and a follower takes it only from that leader (the previous-entry check of `follow`).
    /// The coverings change only at entries' starts, so those are the only places to look.
    pub fn divergence(&self, leader: &[EpochStart], end: u64) -> Option<u64> {
        let theirs = EpochHistory {
            entries: leader.to_vec(),
        };
        let mut at: Vec<u64> = self
            .entries
            .iter()
            .chain(leader)
            .map(|e| e.start)
            .filter(|&s| s < end)
            .collect();
        at.sort_unstable();
        at.dedup();
        at.into_iter().find(|&o| {
            let mine = self.covering_index(o).map(|i| self.entries[i]);
            let other = theirs.covering_index(o).map(|i| theirs.entries[i]);
            matches!((mine, other), (Some(m), Some(t)) if m != t)
        })
    }

    /// A leader starts leading at `epoch` with its log ending at `start`: records from there on are this epoch's.
    /// Nothing changes at an epoch not above the last (false). Entries at or past `start` go first: an entry at the
    /// same start wrote no records, and one past it claims records the log no longer has (a power cut took what
    /// was written but not synced after the entry).
    pub fn begin(&mut self, epoch: u64, start: u64) -> bool {
        if self.last().is_some_and(|last| epoch <= last.epoch) {
            return false;
        }
        while self.last().is_some_and(|last| last.start >= start) {
            self.entries.pop();
        }
        self.entries.push(EpochStart { epoch, start });
        self.trim();
        true
    }

    /// A follower whose log ends at `end` takes its leader's entries for a batch it is about to write there or
    /// later (as [`covering`] gave them, in ascending order, from the one covering the record before the batch), or
    /// its leader's whole history with a probe. Its own entries past `end` go first. Where the leader's entries
    /// cover record `end - 1`, its own must say the same epoch (and start) wrote it. An entry it holds already changes
    /// nothing; a newer one is added (replacing any of its own entries at or past that start, which claim no record
    /// it holds). Err when
    /// they contradict this history (an older epoch it holds at another start, or one it lacks where its own
    /// entries say another epoch wrote; a newer epoch starting below `end`, which would relabel records it holds):
    /// the replica's log does not continue its leader's. Ok(true) when the history changed (to be written before the
    /// batch).
    pub fn follow(&mut self, entries: &[EpochStart], end: u64) -> Result<bool, String> {
        if !ascending(entries) {
            return Err(format!("epoch entries out of order: {entries:?}"));
        }
        let mut next = self.clone();
        let mut changed = false;
        // Its own entries past its end claim records it does not hold (taken for a batch never written): gone.
        while next.last().is_some_and(|last| last.start > end) {
            next.entries.pop();
            changed = true;
        }
        // Raft's previous-entry check: where the leader's entries say which epoch wrote this replica's last record,
        // its own history must say the same, or its log does not continue the leader's (it holds another
        // leadership's record there, and everything from there on is suspect).
        if let Some(prev) = end.checked_sub(1) {
            let theirs = entries.iter().rev().find(|e| e.start <= prev);
            let mine = next.covering_index(prev).map(|i| next.entries[i]);
            if let Some(theirs) = theirs {
                if mine != Some(*theirs) {
                    return Err(format!(
                        "record {prev}: epoch {theirs:?} on the leader, {mine:?} here"
                    ));
                }
            }
        }
        for &e in entries {
            match next.last() {
                Some(last) if e.epoch < last.epoch => {
                    // An older epoch: this history holds it at the same start, or (a replica that joined later, or
                    // whose oldest entries were trimmed) not at all, below its first entry.
                    let mine = next.entries.iter().find(|m| m.epoch == e.epoch);
                    let first = next.entries[0];
                    if mine.map_or(e.start >= first.start, |m| m.start != e.start) {
                        return Err(format!(
                            "epoch {} from {} on the leader, against this replica's {:?}",
                            e.epoch,
                            e.start,
                            mine.unwrap_or(&first)
                        ));
                    }
                }
                Some(last) if e.epoch == last.epoch => {
                    if e.start != last.start {
                        return Err(format!(
                            "epoch {} starts at {} on the leader and at {} here",
                            e.epoch, e.start, last.start
                        ));
                    }
                }
                _ if e.start < end => {
                    return Err(format!(
                        "epoch {} from {} on the leader, below this replica's end {end}: it would claim records \
                         this replica holds from another leadership",
                        e.epoch, e.start
                    ));
                }
                _ => {
                    next.begin(e.epoch, e.start);
                    changed = true;
                }
            }
        }
        if changed {
            *self = next;
        }
        Ok(changed)
    }

    /// A replica whose log holds nothing and starts at `at` (started anew at its leader's start,
    /// `Partition::start_anew_at`) takes its leader's entries up to `at` as its own: it holds no record they could
    /// mislabel, and the leader's next batches continue them. Entries out of order are refused (Err); Ok(true) when
    /// the history changed.
    pub fn adopt(&mut self, leader: &[EpochStart], at: u64) -> Result<bool, String> {
        if !ascending(leader) {
            return Err(format!("epoch entries out of order: {leader:?}"));
        }
        let mut next = EpochHistory {
            entries: leader.iter().copied().filter(|e| e.start <= at).collect(),
        };
        next.trim();
        let changed = next != *self;
        *self = next;
        Ok(changed)
    }

    fn trim(&mut self) {
        if self.entries.len() > MAX_ENTRIES {
            let extra = self.entries.len() - MAX_ENTRIES;
            self.entries.drain(..extra);
        }
    }

    /// The file's bytes: u32 count, then per entry u64 epoch and u64 start, then the CRC-32C of all that.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 16 * self.entries.len());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.epoch.to_le_bytes());
            out.extend_from_slice(&e.start.to_le_bytes());
        }
        out.extend_from_slice(&crc32c::crc32c(&out).to_le_bytes());
        out
    }

    /// None when the length, the check, the count or the order is wrong.
    pub fn decode(bytes: &[u8]) -> Option<EpochHistory> {
        let count = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        if count > MAX_ENTRIES || bytes.len() != 8 + 16 * count {
            return None;
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
            return None;
        }
        let entries: Vec<EpochStart> = body[4..]
            .chunks_exact(16)
            .map(|c| EpochStart {
                epoch: u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                start: u64::from_le_bytes(c[8..].try_into().expect("8 bytes")),
            })
            .collect();
        ascending(&entries).then_some(EpochHistory { entries })
    }
}

/// Reads the history of the partition in `dir`: missing → empty (an unreplicated partition, or a replica that has
/// not taken a record yet). Damaged → empty with a loud log: the replica then claims no epoch for its records, so
/// a fencing round ranks it below any replica that does (it is never preferred for what it cannot show). Any other
/// read error is returned.
pub fn read(storage: &dyn Storage, dir: &Path) -> std::io::Result<EpochHistory> {
    let path = dir.join(FILE_NAME);
    match storage.read(&path) {
        Ok(bytes) => Ok(EpochHistory::decode(&bytes).unwrap_or_else(|| {
            error!(file = %path.display(), len = bytes.len(), "replica.epochs fails its check: this replica claims no epoch for its records");
            EpochHistory::default()
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(EpochHistory::default()),
        Err(e) => Err(e),
    }
}

/// Durably replaces the history file (temp file, fdatasync, rename, directory fsync).
pub async fn write(
    storage: &dyn Storage,
    dir: &Path,
    history: &EpochHistory,
) -> std::io::Result<()> {
    storage
        .replace(&dir.join(FILE_NAME), history.encode())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(epoch: u64, start: u64) -> EpochStart {
        EpochStart { epoch, start }
    }

    fn history(entries: &[(u64, u64)]) -> EpochHistory {
        let mut h = EpochHistory::default();
        for &(epoch, start) in entries {
            assert!(h.begin(epoch, start));
        }
        h
    }

    /// A probe asked below a follower's end (its answer to a batch was lost, so its leader resends from what it last
    /// heard, and its node restarted meanwhile): the follower holds this leader's records past the probe's offset,
    /// across an epoch's start, and none of them is cut.
    #[test]
    fn a_probe_below_a_followers_end_carries_the_leaders_whole_history_and_cuts_none_of_its_records(
    ) {
        let leader = history(&[(8, 0), (9, 5), (12, 9)]);
        // The follower took every batch up to 11, the last one's answer lost: its leader believes it at 3.
        let follower = history(&[(8, 0), (9, 5), (12, 9)]);
        let probe = leader.up_to_epoch(12);
        assert_eq!(probe, leader.entries());
        assert_eq!(follower.divergence(&probe, 11), None);
        assert_eq!(follower.clone().follow(&probe, 11), Ok(false));
        // What the entries up to the probe's offset alone would say: its records from 5 on are another leadership's.
        let cut: Vec<EpochStart> = leader
            .entries()
            .iter()
            .copied()
            .filter(|e| e.start <= 3)
            .collect();
        assert_eq!(follower.divergence(&cut, 11), Some(5));
        // A follower holding another leadership's records past the probe is still cut where they begin.
        let other = history(&[(8, 0), (10, 5)]);
        assert_eq!(other.divergence(&probe, 8), Some(5));
        // A lagging follower takes the entries past its end, and its next batches continue them.
        let mut lagging = history(&[(8, 0)]);
        assert_eq!(lagging.divergence(&probe, 4), None);
        assert_eq!(lagging.follow(&probe, 4), Ok(true));
        assert_eq!(lagging.entries(), leader.entries());
        // An older leadership's stream carries nothing of a newer one.
        assert_eq!(leader.up_to_epoch(9), vec![e(8, 0), e(9, 5)]);
    }

    /// Truncation by epoch: where a replica's log stops being its leader's, read from the two histories.
    #[test]
    fn an_empty_replica_started_anew_adopts_its_leaders_entries_up_to_its_start() {
        let mut mine = history(&[(2, 0), (3, 8)]);
        // Its leader began epoch 4 at 10 and epoch 6 at 40; the log starts anew at 30.
        let leader = [e(2, 0), e(4, 10), e(6, 40)];
        assert_eq!(mine.adopt(&leader, 30), Ok(true));
        assert_eq!(mine.entries(), &[e(2, 0), e(4, 10)]);
        assert_eq!(mine.adopt(&leader, 30), Ok(false), "nothing changes twice");
        // Then the leader's batches continue it as usual, and the probe's checks find the two alike.
        assert_eq!(mine.divergence(&leader, 30), None);
        assert_eq!(mine.follow(&leader, 30), Ok(true));
        assert_eq!(mine.entries(), &leader);
        assert!(
            mine.adopt(&[e(4, 10), e(2, 20)], 30).is_err(),
            "out of order"
        );
        assert_eq!(
            mine.entries(),
            &leader,
            "a refused adoption changes nothing"
        );
    }

    #[test]
    fn divergence_is_the_first_record_the_two_histories_give_to_different_leaderships() {
        let mine = history(&[(2, 0), (3, 8)]);
        // The leader began epoch 5 at 8: this replica's epoch-3 records from 8 on are not its.
        assert_eq!(mine.divergence(&[e(2, 0), e(5, 8)], 11), Some(8));
        // Epoch 2 ended at 6 on the leader (its epoch 4 began there): this replica's epoch-2 records 6 and 7
        // were never the leader's either.
        assert_eq!(mine.divergence(&[e(2, 0), e(4, 6), e(5, 9)], 11), Some(6));
        // The same leaderships over every record it holds: nothing to cut, however long either log.
        assert_eq!(mine.divergence(&[e(2, 0), e(3, 8)], 11), None);
        assert_eq!(mine.divergence(&[e(2, 0), e(3, 8), e(6, 20)], 11), None);
        // The leader's epoch 6 starts at this replica's end: it holds nothing past it.
        assert_eq!(mine.divergence(&[e(2, 0), e(3, 8), e(6, 11)], 11), None);
        // A shorter log that stops inside the shared part diverges nowhere it holds.
        assert_eq!(mine.divergence(&[e(2, 0), e(5, 8)], 8), None);
        assert_eq!(mine.divergence(&[e(2, 0), e(5, 8)], 5), None);
        // Records older than either history are taken as shared: only what both place is compared.
        assert_eq!(mine.divergence(&[e(3, 8), e(5, 10)], 11), Some(10));
        assert_eq!(history(&[(3, 8)]).divergence(&[e(2, 0), e(3, 8)], 11), None);
        assert_eq!(mine.divergence(&[], 11), None);
        // One epoch at two starts is two leaderships' records from the earlier start on.
        assert_eq!(mine.divergence(&[e(2, 0), e(3, 9)], 11), Some(8));
    }

    #[test]
    fn the_documented_example_round_trips() {
        let doc = crate::format_doc::example("replica.epochs", 0);
        let h = history(&[(7, 0), (12, 40)]);
        assert_eq!(doc, h.encode());
        assert_eq!(EpochHistory::decode(&doc), Some(h));
    }

    #[test]
    fn every_flipped_bit_and_wrong_length_is_refused() {
        let bytes = history(&[(7, 0), (12, 40)]).encode();
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(EpochHistory::decode(&damaged), None, "bit {bit}");
        }
        assert_eq!(EpochHistory::decode(&[]), None);
        assert_eq!(EpochHistory::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(
            EpochHistory::decode(&EpochHistory::default().encode()),
            Some(EpochHistory::default())
        );
        // A count past the cap is refused before anything is allocated for it.
        let mut huge = (u32::MAX).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 4]);
        assert_eq!(EpochHistory::decode(&huge), None);
        // Entries out of order (with a good CRC) are refused.
        let mut unordered = Vec::new();
        unordered.extend_from_slice(&2u32.to_le_bytes());
        for (epoch, start) in [(9u64, 10u64), (8, 20)] {
            unordered.extend_from_slice(&epoch.to_le_bytes());
            unordered.extend_from_slice(&start.to_le_bytes());
        }
        let crc = crc32c::crc32c(&unordered);
        unordered.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(EpochHistory::decode(&unordered), None);
    }

    #[test]
    fn lookups_answer_by_offset_and_by_epoch() {
        let h = history(&[(7, 5), (12, 40), (13, 90)]);
        assert_eq!(h.epoch_of(0), 0, "before the history");
        assert_eq!(h.epoch_of(5), 7);
        assert_eq!(h.epoch_of(39), 7);
        assert_eq!(h.epoch_of(40), 12);
        assert_eq!(h.epoch_of(1 << 40), 13);
        assert_eq!(h.covering(10, 10), vec![]);
        assert_eq!(h.covering(10, 40), vec![e(7, 5)]);
        assert_eq!(h.covering(10, 41), vec![e(7, 5), e(12, 40)]);
        assert_eq!(h.covering(0, 100), vec![e(7, 5), e(12, 40), e(13, 90)]);
        assert_eq!(h.covering(95, 100), vec![e(13, 90)]);
        assert_eq!(h.end_of(3), Some(5));
        assert_eq!(h.end_of(7), Some(40));
        assert_eq!(h.end_of(11), Some(40));
        assert_eq!(h.end_of(13), None);
        assert_eq!(h.last(), Some(e(13, 90)));
    }

    #[test]
    fn a_leader_adds_an_epoch_only_above_the_last_and_an_empty_epoch_is_replaced() {
        let mut h = history(&[(7, 0)]);
        assert!(!h.begin(7, 10), "the same epoch");
        assert!(!h.begin(6, 10), "an older epoch");
        assert!(h.begin(9, 0), "epoch 7 wrote nothing: replaced");
        assert_eq!(h.entries(), &[e(9, 0)]);
        assert!(h.begin(11, 30));
        assert_eq!(h.entries(), &[e(9, 0), e(11, 30)]);
        // The log ends below the last entries' starts (a power cut took their records): they go.
        let mut h = history(&[(7, 0), (9, 10), (11, 30)]);
        assert!(h.begin(14, 12));
        assert_eq!(h.entries(), &[e(7, 0), e(9, 10), e(14, 12)]);
        assert!(h.begin(15, 0));
        assert_eq!(h.entries(), &[e(15, 0)]);
    }

    /// Raft's previous-entry check: a follower takes a leader's entries only where the leader's history says the
    /// same epoch (from the same start) wrote its last record; and its own entries past its end go first.
    #[test]
    fn a_follower_takes_entries_only_from_a_leader_whose_history_wrote_its_last_record() {
        let e = |epoch, start| EpochStart { epoch, start };
        // Records 0..2: record 0 of epoch 8, record 1 of epoch 9 (a leadership its next leader never had).
        let mut h = history(&[(8, 0), (9, 1)]);
        let leader = [e(8, 0), e(12, 2)];
        assert!(h.follow(&leader, 2).is_err(), "record 1 is epoch 8's there");
        assert_eq!(h, history(&[(8, 0), (9, 1)]), "unchanged");
        assert_eq!(h.follow(&[e(8, 0), e(9, 1), e(12, 2)], 2), Ok(true));
        assert_eq!(h, history(&[(8, 0), (9, 1), (12, 2)]));
        // Entries past its end (taken for a batch never written) claim nothing: dropped, then the leader's taken.
        let mut h = history(&[(8, 0), (9, 5)]);
        assert_eq!(h.follow(&[e(8, 0)], 2), Ok(true));
        assert_eq!(h, history(&[(8, 0)]));
        // A leader whose entries do not reach back to its last record (older than its history): nothing to check.
        let mut h = history(&[(8, 0)]);
        assert_eq!(h.follow(&[e(12, 4)], 4), Ok(true));
    }

    #[test]
    fn the_history_keeps_its_newest_entries() {
        let mut h = EpochHistory::default();
        for i in 0..(MAX_ENTRIES as u64 + 10) {
            assert!(h.begin(i + 1, i * 10));
        }
        assert_eq!(h.entries().len(), MAX_ENTRIES);
        assert_eq!(h.entries()[0], e(11, 100));
        assert_eq!(EpochHistory::decode(&h.encode()), Some(h));
    }

    /// A follower fed its leader's `covering` entries batch by batch (each at its log's end) ends with the leader's
    /// history over the records it holds, whatever the batch boundaries; contradicting entries are refused and
    /// change nothing.
    #[test]
    fn a_follower_fed_its_leaders_entries_batch_by_batch_holds_the_leaders_history() {
        let leader = history(&[(7, 0), (9, 3), (12, 40), (13, 41), (20, 90)]);
        for step in [1u64, 2, 3, 7, 38, 100] {
            let mut follower = EpochHistory::default();
            let mut from = 0;
            while from < 120 {
                let to = (from + step).min(120);
                follower
                    .follow(&leader.covering(from, to), from)
                    .expect("the leader's own entries");
                from = to;
            }
            assert_eq!(follower, leader, "batches of {step}");
            // Fed again (a resend below its end), nothing changes.
            assert_eq!(follower.follow(&leader.covering(30, 95), 120), Ok(false));
        }
        // A follower whose log began where epoch 13 did (records from before the history have no epoch) holds the
        // entries from there on.
        let mut late = EpochHistory::default();
        late.follow(&leader.covering(41, 120), 41).unwrap();
        assert_eq!(late.entries(), &[e(13, 41), e(20, 90)]);
        // Records older than the leader's history: a batch spanning its first entry carries only that entry.
        let young = history(&[(30, 100)]);
        assert_eq!(young.covering(90, 110), vec![e(30, 100)]);
        assert_eq!(young.covering(90, 100), vec![]);
        let mut f = EpochHistory::default();
        assert_eq!(f.follow(&young.covering(90, 110), 90), Ok(true));
        assert_eq!(f, young);

        let mut f = history(&[(7, 0), (12, 40)]);
        let before = f.clone();
        for bad in [
            vec![e(9, 50)],             // an older epoch after a newer one, not in this history
            vec![e(7, 3)],              // epoch 7 at another start
            vec![e(12, 41)],            // epoch 12 at another start
            vec![e(10, 20)],            // an older epoch it lacks, where its own say epoch 7 wrote
            vec![e(14, 30)],            // a newer epoch starting below this replica's last
            vec![e(14, 45)],            // a newer epoch starting below this replica's end (50)
            vec![e(12, 40), e(11, 60)], // out of order
        ] {
            assert!(f.follow(&bad, 50).is_err(), "{bad:?}");
            assert_eq!(f, before, "{bad:?} changed nothing");
        }
        assert_eq!(
            f.follow(&[e(7, 0), e(12, 40)], 50),
            Ok(false),
            "entries it holds"
        );
        assert_eq!(f.follow(&[e(12, 40), e(14, 50)], 50), Ok(true));
        assert_eq!(f.entries(), &[e(7, 0), e(12, 40), e(14, 50)]);
        // Its own entries past its end (taken for a batch that was never written) give way to the leader's.
        let mut ahead = history(&[(7, 0), (12, 60)]);
        assert_eq!(ahead.follow(&[e(7, 0), e(13, 55)], 50), Ok(true));
        assert_eq!(ahead.entries(), &[e(7, 0), e(13, 55)]);
    }
}
