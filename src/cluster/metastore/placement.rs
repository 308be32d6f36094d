//! Cluster placement, pure: which node gets each partition of a new topic, and which core of that node. The node is
//! chosen once, by whoever creates the topic, and stored in the metastore; the core is computed by every node alike
//! from the stored placement and each node's published core count.

use crate::engine::placement::{core_of, Location, NodeIndex};

/// The node of every partition: the live nodes sorted by index, taken round robin from an offset derived from the
/// topic name (so small topics do not all start on the lowest node). Each node gets ⌊p/n⌋ or ⌈p/n⌉ partitions.
/// `live` may be in any order and hold duplicates; empty `live` gives an empty placement.
pub fn spread(topic: &str, partitions: u32, live: &[NodeIndex]) -> Vec<NodeIndex> {
    let mut nodes = live.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    if nodes.is_empty() {
        return Vec::new();
    }
    let start = crc32c::crc32c(topic.as_bytes()) as usize % nodes.len();
    (0..partitions as usize)
        .map(|p| nodes[(start + p) % nodes.len()])
        .collect()
}

/// The location of every partition. A node's partitions are numbered in order (its first, its second, ...) and
/// that rank picks the core, so a node's share of a topic is spread over all of its cores whatever the number of
/// nodes (hashing the partition number itself would put every partition of a node on one core whenever the node
/// count is a multiple of the core count). `cores_of` gives a node's core count (0 is read as 1).
pub fn locations(
    topic: &str,
    placement: &[NodeIndex],
    cores_of: impl Fn(NodeIndex) -> usize,
) -> Vec<Location> {
    let mut ranks: std::collections::HashMap<NodeIndex, u32> = Default::default();
    placement
        .iter()
        .map(|&node| {
            let rank = ranks.entry(node).or_default();
            let core = core_of(topic, *rank, cores_of(node).max(1)) as u32;
            *rank += 1;
            Location { node, core }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(placement: &[NodeIndex], node: NodeIndex) -> usize {
        placement.iter().filter(|&&n| n == node).count()
    }

    #[test]
    fn partitions_spread_evenly_over_the_live_nodes_only() {
        for partitions in 0..20u32 {
            let p = spread("orders", partitions, &[7, 2, 5, 2]);
            assert_eq!(p.len(), partitions as usize);
            for node in [2, 5, 7] {
                let n = count(&p, node);
                assert!(
                    n == partitions as usize / 3 || n == partitions as usize / 3 + 1,
                    "{partitions}: node {node} has {n}"
                );
            }
            assert!(p.iter().all(|n| [2, 5, 7].contains(n)));
        }
        assert!(spread("orders", 4, &[]).is_empty());
    }

    #[test]
    fn placement_is_deterministic_and_starts_where_the_name_says() {
        assert_eq!(spread("a", 5, &[0, 1, 2]), spread("a", 5, &[2, 1, 0]));
        let starts: std::collections::HashSet<NodeIndex> = (0..30)
            .map(|i| spread(&format!("topic-{i}"), 1, &[0, 1, 2])[0])
            .collect();
        assert_eq!(starts.len(), 3, "one-partition topics land on every node");
    }

    #[test]
    fn each_node_spreads_its_share_over_its_cores() {
        // Two nodes of two cores: round robin gives each node every other partition; hashing the partition number
        // would put all of them on one core.
        let placement = spread("t", 8, &[0, 1]);
        let locs = locations("t", &placement, |_| 2);
        for node in [0, 1] {
            for core in [0, 1] {
                let n = locs
                    .iter()
                    .filter(|l| l.node == node && l.core == core)
                    .count();
                assert_eq!(n, 2, "node {node} core {core}: {locs:?}");
            }
        }
        assert!(locations("t", &[3, 3], |_| 0).iter().all(|l| l.core == 0));
    }
}
