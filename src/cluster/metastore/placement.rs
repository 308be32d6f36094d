//! Cluster placement, pure: which node gets each partition of a new topic, and which core of that node. The node is
//! chosen once, by whoever creates the topic, and stored in the metastore; the core is computed by every node alike
//! from the stored placement and each node's published core count.

use crate::engine::placement::NodeIndex;

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

/// A replicated topic's followers: for each partition, the `replicas - 1` live nodes after its placement's node in
/// index order (wrapping), so followed partitions spread over the nodes like led ones. Empty for `replicas` <= 1;
/// the caller checks that enough nodes are live (fewer give fewer followers).
pub fn followers(
    placement: &[NodeIndex],
    live: &[NodeIndex],
    replicas: usize,
) -> Vec<Vec<NodeIndex>> {
    if replicas <= 1 {
        return Vec::new();
    }
    let mut nodes = live.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    placement
        .iter()
        .map(|node| {
            let at = nodes.iter().position(|n| n == node).unwrap_or(0);
            (1..nodes.len())
                .map(|i| nodes[(at + i) % nodes.len()])
                .filter(|n| n != node)
                .take(replicas - 1)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::placement::leader_locations;

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
    fn followers_are_the_next_live_nodes_and_never_the_leader() {
        assert!(followers(&[0, 1], &[0, 1, 2], 1).is_empty());
        assert_eq!(
            followers(&[0, 1, 2], &[2, 0, 1], 3),
            [vec![1, 2], vec![2, 0], vec![0, 1]]
        );
        assert_eq!(followers(&[5, 9], &[9, 5, 7], 2), [vec![7], vec![5]]);
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
        let states: Vec<_> = placement
            .iter()
            .map(|&n| crate::engine::placement::PartitionState::initial(n, 1))
            .collect();
        let locs = leader_locations("t", &states, |_| 2);
        for node in [0, 1] {
            for core in [0, 1] {
                let n = locs
                    .iter()
                    .filter(|l| l.node == node && l.core == core)
                    .count();
                assert_eq!(n, 2, "node {node} core {core}: {locs:?}");
            }
        }
        let states = [3, 3].map(|n| crate::engine::placement::PartitionState::initial(n, 1));
        assert!(leader_locations("t", &states, |_| 0)
            .iter()
            .all(|l| l.core == 0));
    }
}
