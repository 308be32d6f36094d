//! What describe, `/stats` and `/metrics` see of a partition: a snapshot of its log and each group's frontier,
//! leases and counters.

use super::*;

/// One group's state on one partition, as describe and metrics show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupInfo {
    pub group: String,
    pub committed: u64,
    /// The frontier known durable (in its file or the core's journal): a crash keeps every settle below it.
    pub durable: u64,
    pub in_flight: usize,
    pub delayed: usize,
    pub acked_ahead: usize,
    pub corrupt_skipped: u64,
    /// delivered, redelivered, acked, nacked, extended, expired, lease_gone, dead_lettered, retention_skipped.
    pub counters: [u64; 9],
    /// Append time (Unix ms) of its oldest unsettled record, the one at its frontier; `None` when every readable
    /// record is settled, when that record cannot be read, and in describe's snapshot (only the stats read it:
    /// [`Partition::info_with_ages`]).
    pub oldest_unsettled_ms: Option<u64>,
}

/// How far a follower replica has a partition, as its leader knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowerInfo {
    /// The follower's node index.
    pub node: u32,
    /// The follower's log end as it last answered: every offset below it is durable there.
    pub end: u64,
    /// It fell behind what the leader keeps to resend (or answered out of line): it gets nothing until it is
    /// caught up from the segments (docs/replication.md, step 5).
    pub lagging: bool,
    /// It answered as a learner (a replica on a new disk, `storage::learner`) and has not been promoted yet.
    #[serde(default)]
    pub learner: bool,
    /// Its last answer said its log refuses appends until its node restarts (a refused sync there): it counts in
    /// no fencing round and is not given the leadership.
    pub poisoned: bool,
}

impl Partition {
    /// The leader's record of its followers' progress (what they last answered).
    pub fn followers_progress(&self) -> Vec<FollowerInfo> {
        self.followers.borrow().clone()
    }

    /// The leader's record of follower `info.node`'s progress.
    pub fn set_follower(&self, info: FollowerInfo) {
        let mut followers = self.followers.borrow_mut();
        match followers.iter_mut().find(|f| f.node == info.node) {
            Some(f) => *f = info,
            None => followers.push(info),
        }
    }
}

/// What `GET /topics/{topic}` shows per partition (the default group's state at the top level, as in version 1),
/// and what `/metrics` exports.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionInfo {
    pub partition: u32,
    pub core: usize,
    pub start_offset: u64,
    pub end_offset: u64,
    pub committed: u64,
    pub durable: u64,
    pub in_flight: usize,
    pub acked_ahead: usize,
    pub corrupt_skipped: u64,
    #[serde(skip_serializing)]
    pub groups: Vec<GroupInfo>,
    /// produced, read_errors.
    #[serde(skip_serializing)]
    pub counters: [u64; 2],
    /// (append batches, fdatasyncs) of its log.
    #[serde(skip_serializing)]
    pub io_counts: (u64, u64),
    /// A replicated partition's followers as its leader knows them (`GET /topics/T` renders them with node ids).
    #[serde(skip_serializing)]
    pub followers: Vec<FollowerInfo>,
    /// A replicated partition's commit offset (every record below it is durable on a majority of its replicas and
    /// served); `None` on a partition that is not replicated, whose records are served once durable here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_offset: Option<u64>,
    /// A replicated partition whose leader is in its fencing round for this epoch: it serves nothing (`503`) until a
    /// majority of its replicas answered (`docs/replication.md`, step 4). Shown only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round: Option<u64>,
}

/// `PartitionInfo` whole, every field included, for node RPC: its own `Serialize` leaves out what describe's JSON
/// does not show. Use as `#[serde(with = "crate::partition::whole_infos")]` on a `Vec<PartitionInfo>`.
pub mod whole_infos {
    use super::{FollowerInfo, GroupInfo, PartitionInfo};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "PartitionInfo")]
    struct Whole {
        partition: u32,
        core: usize,
        start_offset: u64,
        end_offset: u64,
        committed: u64,
        durable: u64,
        in_flight: usize,
        acked_ahead: usize,
        corrupt_skipped: u64,
        groups: Vec<GroupInfo>,
        counters: [u64; 2],
        io_counts: (u64, u64),
        followers: Vec<FollowerInfo>,
        commit_offset: Option<u64>,
        round: Option<u64>,
    }

    /// One `PartitionInfo`, whole.
    #[derive(Serialize, Deserialize)]
    pub struct WholeInfo(#[serde(with = "Whole")] pub PartitionInfo);

    struct WholeRef<'a>(&'a PartitionInfo);

    impl Serialize for WholeRef<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            Whole::serialize(self.0, s)
        }
    }

    pub fn serialize<S: Serializer>(infos: &[PartitionInfo], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(infos.iter().map(WholeRef))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PartitionInfo>, D::Error> {
        let infos = Vec::<WholeInfo>::deserialize(d)?;
        Ok(infos.into_iter().map(|w| w.0).collect())
    }

    /// The same for `(topic, PartitionInfo)` pairs (a core's stats).
    pub mod named {
        use super::{PartitionInfo, WholeInfo, WholeRef};
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(
            infos: &[(String, PartitionInfo)],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            s.collect_seq(infos.iter().map(|(t, p)| (t, WholeRef(p))))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<(String, PartitionInfo)>, D::Error> {
            let infos = Vec::<(String, WholeInfo)>::deserialize(d)?;
            Ok(infos.into_iter().map(|(t, w)| (t, w.0)).collect())
        }
    }
}

impl Partition {
    /// The append time of group `g`'s oldest unsettled record, the one at its frontier `committed` (or at the oldest
    /// retained offset when retention passed the frontier); `None` when it has no readable unsettled record. Read
    /// from the log once per frontier position and cached in the group (a failed read too), so stats taken while
    /// the frontier stands still read nothing. The read is a whole record's (a consume's read path: the tail
    /// cache, the write-behind buffer, the files); one per moved frontier per stats request.
    async fn oldest_unsettled_ms(&self, g: &Group, committed: u64, end: u64) -> Option<u64> {
        let offset = committed.max(self.log.start_offset());
        if offset >= end {
            return None;
        }
        if let Some((cached, ms)) = g.oldest.get() {
            if cached == offset {
                return ms;
            }
        }
        let ms = self.log.read(offset).await.ok().map(|r| r.timestamp_ms);
        g.oldest.set(Some((offset, ms)));
        ms
    }

    /// [`Partition::info`] with each group's `oldest_unsettled_ms` (for `/status` and `/metrics`; describe does not
    /// show it and reads nothing for it). The snapshot's other fields are taken before the reads.
    pub async fn info_with_ages(&self) -> PartitionInfo {
        let mut info = self.info().await;
        let end = info.commit_offset.unwrap_or(info.end_offset);
        let handles: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        for g in handles {
            let Some(i) = info.groups.iter().position(|x| x.group == g.name) else {
                continue;
            };
            let committed = info.groups[i].committed;
            info.groups[i].oldest_unsettled_ms = self.oldest_unsettled_ms(&g, committed, end).await;
        }
        info
    }

    /// A snapshot for describe and metrics (loads the shards: describe counts as a touch). A partition whose
    /// frontier cannot be read shows the durable frontiers it knows of and no leases.
    pub async fn info(&self) -> PartitionInfo {
        let _ = self.ensure_loaded().await;
        let lost = self.lost_below_frontier.get();
        let groups: Vec<GroupInfo> = self
            .groups
            .borrow()
            .values()
            .map(|g| {
                let (committed, in_flight, delayed, acked_ahead, corrupt) = g
                    .with_loaded(|s| {
                        (
                            s.committed(),
                            s.in_flight(),
                            s.delayed(),
                            s.acked_ahead(),
                            s.corrupt_skipped_total(),
                        )
                    })
                    .unwrap_or((g.frontier.flushed.get(), 0, 0, 0, 0));
                let c = &g.counters;
                GroupInfo {
                    group: g.name.clone(),
                    committed,
                    durable: g.frontier.durable(),
                    in_flight,
                    delayed,
                    acked_ahead,
                    corrupt_skipped: corrupt + lost,
                    counters: [
                        c.delivered.get(),
                        c.redelivered.get(),
                        c.acked.get(),
                        c.nacked.get(),
                        c.extended.get(),
                        c.expired.get(),
                        c.lease_gone.get(),
                        c.dead_lettered.get(),
                        c.retention_skipped.get(),
                    ],
                    oldest_unsettled_ms: None,
                }
            })
            .collect();
        let default = groups.iter().find(|g| g.group == DEFAULT_GROUP);
        PartitionInfo {
            partition: self.id,
            core: self.core,
            start_offset: self.log.start_offset(),
            end_offset: self.log.end_offset(),
            committed: default.map_or(0, |g| g.committed),
            durable: default.map_or(0, |g| g.durable),
            in_flight: default.map_or(0, |g| g.in_flight),
            acked_ahead: default.map_or(0, |g| g.acked_ahead),
            corrupt_skipped: default.map_or(lost, |g| g.corrupt_skipped),
            counters: [
                self.counters.produced.get(),
                self.counters.read_errors.get(),
            ],
            io_counts: self.log.io_counts(),
            followers: self.followers.borrow().clone(),
            commit_offset: self.replicated().then(|| self.readable_end()),
            round: self.round_under_way(),
            groups,
        }
    }
}
