//! A set of offsets kept as disjoint, maximal half-open runs `[start, end)`, so that a long stretch of lost or
//! damaged records costs one entry, not one per offset. Used by the log (offsets found damaged at recovery, or lost
//! below a durable frontier) and by the lease shard (corrupt offsets skipped above the frontier). Plain data; lives
//! wherever its owner lives.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent runs: `start -> end`, every run non-empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runs {
    runs: BTreeMap<u64, u64>,
}

impl Runs {
    pub fn new() -> Runs {
        Runs::default()
    }

    /// Number of runs (not offsets).
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The run holding `offset`, if any.
    pub fn run_at(&self, offset: u64) -> Option<(u64, u64)> {
        self.runs
            .range(..=offset)
            .next_back()
            .filter(|(_, &end)| end > offset)
            .map(|(&start, &end)| (start, end))
    }

    pub fn contains(&self, offset: u64) -> bool {
        self.run_at(offset).is_some()
    }

    /// Adds `[start, end)`, merging with overlapping or adjacent runs.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut lo, mut hi) = (start, end);
        // A run that starts at or before `start` and reaches it merges from the left.
        if let Some((&s, &e)) = self.runs.range(..=start).next_back() {
            if e >= start {
                lo = s;
                hi = hi.max(e);
                self.runs.remove(&s);
            }
        }
        // Runs starting inside (or right at the end of) the new one merge from the right.
        while let Some((&s, &e)) = self.runs.range(lo..=hi).next() {
            hi = hi.max(e);
            self.runs.remove(&s);
        }
        self.runs.insert(lo, hi);
    }

    /// Takes out the run starting exactly at `start`, returning its end.
    pub fn remove_starting_at(&mut self, start: u64) -> Option<u64> {
        self.runs.remove(&start)
    }

    /// Forgets everything below `start` (a run straddling it is cut there).
    pub fn drop_below(&mut self, start: u64) {
        let straddling = self
            .runs
            .range(..start)
            .next_back()
            .map(|(_, &end)| end)
            .filter(|&end| end > start);
        let mut upper = self.runs.split_off(&start);
        if let Some(end) = straddling {
            upper.insert(start, end);
        }
        self.runs = upper;
    }

    /// Forgets everything at or above `end` (a run straddling it is cut there).
    pub fn drop_from(&mut self, end: u64) {
        self.runs.split_off(&end);
        if let Some((_, e)) = self.runs.iter_mut().next_back() {
            *e = (*e).min(end);
        }
    }

    /// Every run, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().map(|(&s, &e)| (s, e))
    }

    /// Total number of offsets covered.
    pub fn count(&self) -> u64 {
        self.runs.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// Against a plain set of offsets: membership, maximality and the count agree after any inserts and cuts.
        #[test]
        fn matches_a_plain_set(ops in proptest::collection::vec((0..3u8, 0..60u64, 0..12u64), 1..60)) {
            let mut runs = Runs::new();
            let mut model = BTreeSet::new();
            for (kind, a, len) in ops {
                if kind < 2 {
                    runs.insert(a, a + len);
                    model.extend(a..a + len);
                } else {
                    runs.drop_below(a);
                    model = model.split_off(&a);
                }
                for o in 0..80 {
                    prop_assert_eq!(runs.contains(o), model.contains(&o), "offset {}", o);
                }
                prop_assert_eq!(runs.count(), model.len() as u64);
                let all: Vec<_> = runs.iter().collect();
                for w in all.windows(2) {
                    prop_assert!(w[0].1 < w[1].0, "runs not maximal or overlapping: {:?}", all);
                }
            }
        }
    }
}
