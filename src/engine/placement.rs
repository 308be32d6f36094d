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
