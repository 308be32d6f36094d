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
    /// The replicas the topic's creation gave the partition (empty: `replicas`, which a partition whose replica set
    /// never changed has). A replica set changes when a node is drained or removed (`cluster::mover`); where a
    /// node's replicas live on its cores is ranked over these, which never change, so a change of one partition's
    /// replicas moves no other replica between cores (`replica_core`).
    pub placed: Vec<NodeIndex>,
    /// Replicas added by a move (`front::mover`) that have not been promoted by a later change of the partition key:
    /// they take batches and count for the commit once they hold them, but never vote in a fencing round or an
    /// election, nor lead (empty for every partition whose replica set never changed).
    pub learners: Vec<NodeIndex>,
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
            placed: Vec::new(),
            learners: Vec::new(),
        }
    }

    /// The replicas that vote (in fencing rounds and elections): all but the learners.
    pub fn voters(&self) -> Vec<NodeIndex> {
        self.replicas
            .iter()
            .copied()
            .filter(|n| !self.learners.contains(n))
            .collect()
    }

    /// The replicas the topic's creation gave the partition.
    pub fn placed(&self) -> &[NodeIndex] {
        if self.placed.is_empty() {
            &self.replicas
        } else {
            &self.placed
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

/// The core of node `node` that holds its replica of partition `p`, leading or following (None: it holds none),
/// given each partition's replica set and the node's core count: the partitions whose creation placed a replica on
/// the node are ranked in partition order and the rank picks the core, so a node's replicas spread over its cores; a
/// replica a later change of the replica set put on the node (a drain, a removal) is on the core its partition
/// number picks. It never depends on which replica leads, nor on other partitions' changes of replicas: a replica
/// keeps its core (its log in that core's journal) through every change of leadership, and a follower that becomes
/// leader serves where it followed. With one replica per partition (R = 1) it is the core a partition had before
/// replication existed (its rank among the node's partitions). Every node computes it alike: a node to open its
/// replicas, a leader to address its followers.
pub fn replica_core(
    topic: &str,
    states: &[PartitionState],
    node: NodeIndex,
    p: u32,
    cores: usize,
) -> Option<u32> {
    let state = states.get(p as usize)?;
    if !state.replicas.contains(&node) {
        return None;
    }
    if !state.placed().contains(&node) {
        return Some(core_of(topic, p, cores.max(1)) as u32);
    }
    let rank = states[..p as usize]
        .iter()
        .filter(|s| s.placed().contains(&node))
        .count() as u32;
    Some(core_of(topic, rank, cores.max(1)) as u32)
}

/// Where each partition is served: its leader, and the leader's core for its replica (`replica_core`).
/// `cores_of` gives a node's core count (0 is read as 1).
pub fn leader_locations(
    topic: &str,
    states: &[PartitionState],
    cores_of: impl Fn(NodeIndex) -> usize,
) -> Vec<Location> {
    (0..states.len() as u32)
        .map(|p| {
            let node = states[p as usize].leader;
            let core = replica_core(topic, states, node, p, cores_of(node))
                .expect("a partition's leader is one of its replicas");
            Location { node, core }
        })
        .collect()
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

    fn state(replicas: &[NodeIndex], leader: NodeIndex) -> PartitionState {
        PartitionState {
            placed: Vec::new(),
            learners: Vec::new(),
            replicas: replicas.to_vec(),
            leader,
            epoch: 1,
        }
    }

    #[test]
    fn replicas_spread_over_every_core_and_only_replicas_have_one() {
        let states = [
            state(&[0, 1, 2], 0),
            state(&[1, 2, 0], 1),
            state(&[2, 0, 1], 2),
            state(&[0, 1, 2], 0),
            state(&[3], 3),
        ];
        // Node 1 holds a replica of partitions 0 to 3 (ranks 0 to 3): consecutive ranks, consecutive cores.
        let cores: Vec<u32> = (0..4)
            .map(|p| replica_core("t", &states, 1, p, 2).unwrap())
            .collect();
        assert_ne!(
            cores[0], cores[1],
            "node 1's replicas share a core: {cores:?}"
        );
        assert_eq!(replica_core("t", &states, 1, 4, 2), None);
        assert_eq!(replica_core("t", &states, 9, 0, 2), None);
        assert_eq!(replica_core("t", &states, 1, 7, 2), None);
    }

    #[test]
    fn a_replica_keeps_its_core_whoever_leads() {
        let states: Vec<PartitionState> = (0..6).map(|p| state(&[0, 1, 2], p % 3)).collect();
        for node in 0..3 {
            for p in 0..6 {
                let before = replica_core("t", &states, node, p, 4);
                // Partition 2's leadership moves to each replica in turn: no replica of any partition moves.
                for leader in 0..3 {
                    let mut moved = states.clone();
                    moved[2].leader = leader;
                    assert_eq!(replica_core("t", &moved, node, p, 4), before);
                }
            }
        }
        // The leader's location is its replica's core.
        let locations = leader_locations("t", &states, |_| 4);
        for (p, l) in locations.iter().enumerate() {
            assert_eq!(l.node, p as u32 % 3);
            assert_eq!(
                Some(l.core),
                replica_core("t", &states, l.node, p as u32, 4)
            );
        }
    }

    #[test]
    fn a_change_of_one_partitions_replicas_moves_no_other_replica_between_cores() {
        // Six partitions on nodes 0-2; partition 2 gains node 3, then loses node 1 (a drain of node 1, one member at
        // a time): no other replica changes core on any node, and the new one has a core.
        let placed: Vec<PartitionState> = (0..6).map(|p| state(&[0, 1, 2], p % 3)).collect();
        let mut changed = placed.clone();
        changed[2].placed = changed[2].replicas.clone();
        changed[2].replicas.push(3);
        let mut removed = changed.clone();
        removed[2].replicas.retain(|&n| n != 1);
        for states in [&changed, &removed] {
            for node in 0..3 {
                for p in (0..6).filter(|&p| p != 2) {
                    assert_eq!(
                        replica_core("t", states, node, p, 4),
                        replica_core("t", &placed, node, p, 4),
                        "node {node}, partition {p}"
                    );
                }
            }
            assert!(replica_core("t", states, 3, 2, 4).is_some_and(|c| c < 4));
        }
        assert_eq!(replica_core("t", &removed, 1, 2, 4), None);
        assert_eq!(
            replica_core("t", &removed, 0, 2, 4),
            replica_core("t", &placed, 0, 2, 4)
        );
    }

    #[test]
    fn without_replication_a_partition_is_where_its_nodes_rank_puts_it() {
        // R = 1: the core is the partition's rank among its node's partitions, as before replication existed (a
        // data directory of an unreplicated cluster opens each partition on the core it had).
        let leaders = [0, 1, 0, 0, 1, 2, 0];
        let states: Vec<PartitionState> = leaders.iter().map(|&n| state(&[n], n)).collect();
        let locations = leader_locations("t", &states, |n| n as usize + 2);
        let mut ranks = std::collections::HashMap::new();
        for (p, &n) in leaders.iter().enumerate() {
            let rank = ranks.entry(n).or_insert(0u32);
            assert_eq!(
                locations[p],
                Location {
                    node: n,
                    core: core_of("t", *rank, n as usize + 2) as u32
                }
            );
            *rank += 1;
        }
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
