//! Elections (`docs/replication.md`, step 4), on core 0: when the leader of a replicated partition loses its
//! metastore session (its `alive/` key expired: killed, paused past its TTL, cut from etcd), a follower that is live
//! names itself leader with one etcd transaction (`Metastore::set_partition`: only if the partition key is still at
//! the epoch it read), so one leadership per epoch is decided once, for everyone; the epoch is that write's
//! revision. The new leader then runs its fencing round before it serves (`front/round.rs`), which hands the
//! leadership on if another replica's log is greater.
//!
//! The live followers stand in replica order: the first at once, the others `stagger` apart, each only if the
//! partition is still where it was when it looked, so one of them normally wins without contention, and another
//! stands if the first one cannot. An R = 1 partition never elects; neither does one without a majority of its
//! replicas live (an unclean election is never automatic: a minority could not fence a majority anyway).

use super::metastore::{Metastore, Replica, Snapshot};
use crate::engine::placement::NodeIndex;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;
use tracing::{info, warn};

/// Time between the live followers' turns to stand.
pub const STAGGER: Duration = Duration::from_millis(1000);

/// This node's turn to stand for a partition whose leader is down.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidacy {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    /// The epoch the partition is at (the transaction requires it still is).
    pub epoch: u64,
    /// Its place among the live followers (0: stands at once).
    pub turn: usize,
}

/// The partitions `me` should stand for in `snapshot`: replicated, `me` one of its followers and live, its leader
/// without a session, a majority of its replicas live.
pub fn candidacies(snapshot: &Snapshot, me: NodeIndex) -> Vec<Candidacy> {
    let live = snapshot.live_nodes();
    if !live.contains(&me) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for record in snapshot.topics() {
        for (p, state) in record.partitions.iter().enumerate() {
            // Only voters stand, and a majority of the voters must be live (learners: `PartitionState::learners`).
            let voters = state.voters();
            if state.replicas.len() < 2
                || state.leader == me
                || !voters.contains(&me)
                || live.contains(&state.leader)
            {
                continue;
            }
            let standing: Vec<NodeIndex> = voters
                .iter()
                .copied()
                .filter(|n| *n != state.leader && live.contains(n))
                .collect();
            if standing.len() < voters.len() / 2 + 1 {
                continue;
            }
            let turn = standing
                .iter()
                .position(|&n| n == me)
                .expect("a live follower stands");
            out.push(Candidacy {
                topic: record.name().to_string(),
                topic_id: record.id(),
                partition: p as u32,
                epoch: state.epoch,
                turn,
            });
        }
    }
    out
}

/// Core 0's elections: a task per candidacy, started once per (partition, epoch).
pub struct Elections {
    meta: Rc<Metastore>,
    replica: Rc<Replica>,
    me: NodeIndex,
    stagger: Duration,
    under_way: RefCell<BTreeSet<(String, u64, u32, u64)>>,
}

impl Elections {
    pub fn new(
        meta: Rc<Metastore>,
        replica: Rc<Replica>,
        me: NodeIndex,
        stagger: Duration,
    ) -> Rc<Elections> {
        Rc::new(Elections {
            meta,
            replica,
            me,
            stagger,
            under_way: RefCell::new(BTreeSet::new()),
        })
    }

    /// Looks at a new snapshot: stands for each partition that needs it (once per epoch).
    pub fn consider(self: &Rc<Self>, snapshot: &Snapshot) {
        for c in candidacies(snapshot, self.me) {
            let key = (c.topic.clone(), c.topic_id, c.partition, c.epoch);
            if !self.under_way.borrow_mut().insert(key.clone()) {
                continue;
            }
            let this = self.clone();
            glommio::spawn_local(async move {
                this.stand(c).await;
                this.under_way.borrow_mut().remove(&key);
            })
            .detach();
        }
    }

    async fn stand(&self, c: Candidacy) {
        let mut wait = self.stagger * c.turn as u32;
        loop {
            if !wait.is_zero() {
                glommio::timer::sleep(wait).await;
            }
            // Still needed, as the metastore is now? (Another follower may have won, the leader come back.)
            let snapshot = self.replica.snapshot();
            let still = candidacies(&snapshot, self.me).into_iter().any(|n| {
                n.topic == c.topic
                    && n.topic_id == c.topic_id
                    && n.partition == c.partition
                    && n.epoch == c.epoch
            });
            let Some(record) = snapshot.topic(&c.topic).filter(|_| still) else {
                return;
            };
            let state = record.partitions[c.partition as usize].clone();
            info!(topic = %c.topic, partition = c.partition, epoch = c.epoch, dead = state.leader, "the partition's leader is down: this node stands for election");
            match self
                .meta
                .set_partition_with(
                    record,
                    c.partition,
                    c.epoch,
                    &state.replicas,
                    self.me,
                    &state.learners,
                )
                .await
            {
                Ok(Some(won)) => {
                    info!(topic = %c.topic, partition = c.partition, epoch = won.epoch, "elected: this node leads the partition once its fencing round is won");
                    return;
                }
                Ok(None) => return, // the partition moved on first
                Err(e) => {
                    warn!(topic = %c.topic, partition = c.partition, error = %e, "an election transaction failed; standing again");
                    wait = self.stagger.max(Duration::from_millis(200));
                }
            }
        }
    }
}
