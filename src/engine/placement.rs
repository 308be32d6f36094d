//! Placement: where a (topic, partition) lives. A node is chosen when the topic is created (always this node
//! without a cluster; in a cluster, the metastore's placement); within a node, a partition's core is a pure hash
//! every core computes alike. Each core keeps the locations of every partition in its `Topic`.

use serde::{Deserialize, Serialize};

/// A node, by its index in the node table (0 is this node when there is no cluster).
pub type NodeIndex = u32;

/// Most replicas a partition may have (`replicas=R` on a topic's creation).
pub const MAX_REPLICAS: usize = 7;

/// Where a partition lives: a node, and a core on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Location {
    pub node: NodeIndex,
    pub core: u32,
}

/// Who holds a partition: its replica set, the one of them that leads (serves and orders every write), and the
/// epoch of that leadership: the etcd revision of the transaction that made it, so every new leadership has a higher
/// one than any before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    pub replicas: Vec<NodeIndex>,
    pub leader: NodeIndex,
    pub epoch: u64,
}

impl PartitionState {
    /// A partition as its topic's creation left it: on the node it was placed on, alone (R = 1), which leads at
    /// the topic's creation revision. A cluster that never replicates never writes a partition key: its
    /// partitions stay here, exactly where they were before partition keys existed.
    pub fn initial(node: NodeIndex, topic_id: u64) -> PartitionState {
        PartitionState {
            replicas: vec![node],
            leader: node,
            epoch: topic_id,
        }
    }
}

/// The core of a partition within its node: consecutive partitions land on consecutive cores, so a topic with at
/// least as many partitions as cores uses every core.
pub fn core_of(topic: &str, partition: u32, cores: usize) -> usize {
    ((crc32c::crc32c(topic.as_bytes()) as usize) + partition as usize) % cores
}

/// Each partition's replicas other than its leader; empty when no partition has more than one replica (the topic is
/// not replicated).
pub fn followers(states: &[PartitionState]) -> Vec<Vec<NodeIndex>> {
    if states.iter().all(|s| s.replicas.len() <= 1) {
        return Vec::new();
    }
    states
        .iter()
        .map(|s| {
            s.replicas
                .iter()
                .copied()
                .filter(|&n| n != s.leader)
                .collect()
        })
        .collect()
}

/// The core of node `node` that holds its follower replica of partition `p` (`followers[p]` names it), given its
/// core count: the partitions a node follows are ranked in partition order and the rank picks the core, as for the
/// partitions it leads. Both ends compute it: the follower to open the replica, the leader to address it.
pub fn follower_core(
    topic: &str,
    followers: &[Vec<NodeIndex>],
    node: NodeIndex,
    p: u32,
    cores: usize,
) -> Option<u32> {
    if !followers.get(p as usize)?.contains(&node) {
        return None;
    }
    let rank = followers[..p as usize]
        .iter()
        .filter(|f| f.contains(&node))
        .count() as u32;
    Some(core_of(topic, rank, cores.max(1)) as u32)
}

/// Locations of every partition of a topic placed on `node` alone (a single node).
pub fn on_node(topic: &str, partitions: u32, node: NodeIndex, cores: usize) -> Vec<Location> {
    (0..partitions)
        .map(|p| Location {
            node,
            core: core_of(topic, p, cores) as u32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followed_partitions_spread_over_every_core_and_only_their_followers_have_one() {
        let followers = vec![vec![1, 2], vec![2, 0], vec![0, 1], vec![1, 2]];
        assert_eq!(follower_core("t", &followers, 0, 0, 2), None);
        // Node 1 follows partitions 0, 2 and 3 (ranks 0, 1, 2): consecutive ranks, consecutive cores.
        let cores: Vec<u32> = [0, 2]
            .iter()
            .map(|&p| follower_core("t", &followers, 1, p, 2).unwrap())
            .collect();
        assert_ne!(
            cores[0], cores[1],
            "node 1's two followed partitions share a core"
        );
        assert_eq!(follower_core("t", &followers, 9, 0, 2), None);
        assert_eq!(follower_core("t", &followers, 1, 7, 2), None);
    }

    #[test]
    fn partitions_spread_over_every_core() {
        for cores in 1..8 {
            let mut seen = vec![false; cores];
            for p in 0..cores as u32 {
                seen[core_of("t", p, cores)] = true;
            }
            assert!(seen.iter().all(|&s| s));
        }
    }
}
