//! Looking up the maps keyed by (topic, group) with borrowed names. The front's wait queues and the owners'
//! interest sets are consulted on every produce and consume; building an owned `(String, String)` key for each
//! lookup cost two allocations per request. `(topic, group) as &dyn NamePair` finds the same entry without them.
//! No state: plain functions over whatever core's maps call them.

use std::borrow::Borrow;
use std::cmp::Ordering;

/// A (topic, group) pair of names, owned or borrowed; ordered exactly like `(String, String)`.
pub trait NamePair {
    fn names(&self) -> (&str, &str);
}

impl NamePair for (String, String) {
    fn names(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl NamePair for (&str, &str) {
    fn names(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> Borrow<dyn NamePair + 'a> for (String, String) {
    fn borrow(&self) -> &(dyn NamePair + 'a) {
        self
    }
}

impl PartialEq for dyn NamePair + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for dyn NamePair + '_ {}

impl PartialOrd for dyn NamePair + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn NamePair + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.names().cmp(&other.names())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn borrowed_names_find_exactly_the_owned_keys() {
        let names = ["", "a", "a-b", "ab", "b", "default", "g"];
        let mut map = BTreeMap::new();
        for t in names {
            for g in names {
                map.insert((t.to_string(), g.to_string()), format!("{t}/{g}"));
            }
        }
        for t in names {
            for g in names {
                let found = map.get(&(t, g) as &dyn NamePair);
                assert_eq!(found, Some(&format!("{t}/{g}")));
            }
        }
        assert_eq!(map.get(&("a", "c") as &dyn NamePair), None);
        assert_eq!(map.get(&("c", "") as &dyn NamePair), None);
        // The trait's order is the tuple's: sorting either way gives one sequence.
        let mut owned: Vec<(String, String)> = map.keys().cloned().collect();
        owned.sort();
        let mut by_trait = owned.clone();
        by_trait.sort_by(|x, y| (x as &dyn NamePair).cmp(y as &dyn NamePair));
        assert_eq!(owned, by_trait);
    }
}
