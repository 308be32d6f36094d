//! The default group in the node simulation: consumers that lease, ack, nack and let leases expire through any node
//! that is not paused (the front routes each to the partitions' leaders, as it routes produces), and the oracle's
//! checks of the group's frontier across leader changes, kills, power cuts and the lost disk.
//!
//! What is checked:
//! - **The majority's frontier.** After every step, each replica's durable frontier of the default group is read
//!   from its disk as a restart would find it (`durable_frontiers`: the frontier file and the journal's frontier
//!   records, each as a power cut now would leave it), and the highest value a majority of the replicas holds
//!   (the second highest of three) is taken. It never moves backwards, but at the step a disk was lost (that
//!   replica starts empty); the highest it ever was is `held`.
//! - **The leader serves from it.** The leader etcd names, serving at that epoch (its fencing round won, not
//!   deposed, its group loaded), has its committed frontier at `held` at least: a new leader's round raises its
//!   groups to the highest frontier the replicas of its round hold, and any majority of the voters shares a replica
//!   with the majority that held it (a replica on a new disk is a learner: it votes for nothing).
//! - **Nothing below it is leased again.** Each leadership change (a write of the partition key: an election, a
//!   hand-over, CheckQuorum) makes `held`, as the check before it found it, the partition's `floor`; a lease answered
//!   at an offset below the floor that stood when its consume was sent is a finding. (A leader that has not learnt
//!   of its successor yet may still lease what its successor settled since: those are above the floor, and allowed,
//!   as any redelivery above the frontier is: at-least-once.)
//! - **The end.** With everything healed, the group is drained through node 1 (every lease acked) until each
//!   partition's leader has settled everything it serves, and every acknowledged produce was delivered in the drain
//!   or had an ack sent before it (one whose answer was lost may have settled it).
//!
//! Not checked: that an ack answered `200` moves the frontier past its offset (a leader that has not learnt of its
//! successor answers `200` to acks its successor never hears of; the drain covers what matters: nothing is skipped).

use super::{Cluster, Oracle, PARTITIONS, TOPIC};
use crate::clock::Clock;
use crate::engine::placement::NodeIndex;
use crate::ops::consume::ConsumeParams;
use crate::ops::receipt::ReceiptHandle;
use crate::ops::settle::SettleParams;
use crate::partition::{Delivery, SettleOp, DEFAULT_GROUP};
use crate::storage::backend::Storage;
use crate::storage::frontier::FrontierValue;
use crate::storage::sim::{Sim, SimStorage};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::rc::Rc;

/// What the oracle keeps of the default group.
#[derive(Default)]
pub(super) struct GroupOracle {
    /// Per partition: the frontier a majority of the replicas held durably at the last check.
    pub(super) majority: BTreeMap<u32, u64>,
    /// Per partition: the highest frontier a majority of the replicas ever held durably.
    pub(super) held: BTreeMap<u32, u64>,
    /// Per partition: `held` as it stood at the check before the last leadership change (no leader, however stale,
    /// leases below it from then on).
    pub(super) floor: BTreeMap<u32, u64>,
    /// Offsets whose ack was answered `200` (by whichever leader).
    pub(super) settled: BTreeSet<(u32, u64)>,
    /// Offsets an ack was sent for, whatever its answer (one whose answer was lost, or that timed out, may have
    /// settled it).
    pub(super) ack_sent: BTreeSet<(u32, u64)>,
    /// Offsets delivered in the final drain.
    pub(super) drained: BTreeSet<(u32, u64)>,
    pub(super) draining: bool,
    /// A disk was lost since the last check (the majority's frontier may be lower now).
    pub(super) disk_lost: bool,
    /// Per partition: every offset a majority of the replicas ever held durably settled, the acks above the
    /// frontier included (`held` with the acked-ahead ranges).
    pub(super) held_acked: BTreeMap<u32, FrontierValue>,
    /// Per partition: `held_acked` as it stood at the check before the last leadership change.
    pub(super) floor_acked: BTreeMap<u32, FrontierValue>,
    pub(super) consumes: u64,
    pub(super) deliveries: u64,
}

/// What a consumer does with a delivery: ack, nack (with a delay or the topic's), or nothing (its lease expires);
/// after how long (ms).
#[derive(Clone, Copy, Debug)]
enum Plan {
    Ack(u64),
    Nack(u64, Option<u64>),
    Expire,
}

impl Oracle {
    /// A lease answered at `d`, of a consume sent while the floors were `floors`.
    fn delivered(&mut self, d: &Delivery, floors: &Floors, via: NodeIndex) {
        let (floors, acked) = floors;
        let body = String::from_utf8_lossy(&d.payload).into_owned();
        let (p, offset) = (d.partition, d.offset);
        self.groups.deliveries += 1;
        self.note(format!(
            "leased {p}:{offset} = {body} (delivery {}, nonce {}) through node {via}",
            d.delivery_count, d.nonce
        ));
        self.at(p, offset, &body, false);
        let floor = floors.get(&p).copied().unwrap_or(0);
        if offset < floor {
            self.fail(format!(
                "{body} leased at {p}:{offset} through node {via}, below the default group's frontier {floor} that a majority of the replicas held durably when the consume was sent (a settled message delivered again after a leader change)"
            ));
        }
        if let Some(v) = acked
            .get(&p)
            .filter(|v| v.acked.iter().any(|&(s, e)| (s..e).contains(&offset)))
        {
            self.fail(format!(
                "{body} leased at {p}:{offset} through node {via}, acked above the default group's frontier on a majority of the replicas durably when the consume was sent ({v:?}; a settled message delivered again after a leader change)"
            ));
        }
        if self.groups.draining {
            self.groups.drained.insert((p, offset));
        }
    }
}

/// What the oracle last read of one node's disk, so that a check reads again only what may have changed.
#[derive(Default)]
pub(super) struct DiskRead {
    /// The disk read (kept, so that its address is no other disk's).
    disk: Option<Rc<Sim>>,
    /// Its values while its node is down (nothing writes to its disk then).
    down: Option<Vec<FrontierValue>>,
    /// The lowest index of its journal's files at the last read.
    first: u64,
    /// Journal file index → its durable bytes when last read, and their default group's frontier records
    /// ((partition, value, start), in order; None: an entry failed its check).
    journals: BTreeMap<u64, JournalRead>,
}

/// A journal file's durable bytes when last read, and its default group's frontier records.
type JournalRead = (Vec<u8>, Option<Vec<(u32, FrontierValue, bool)>>);

/// The floors a consume is checked against: each partition's frontier and what a majority held settled.
type Floors = (BTreeMap<u32, u64>, BTreeMap<u32, FrontierValue>);

/// Each partition's durable frontier of the default group on node `i`'s disk `sim`, as a restart now would find it
/// after a power cut that keeps nothing unsynced: the higher of its frontier file and its journal's records since
/// the group's last start record (none of the journal's when one of its entries fails its check, as the replay
/// does). `read` keeps what it read: files whose durable bytes did not change are not decoded again, and a disk
/// whose node is down (`running` false) is not read again.
pub(super) fn durable_frontiers(
    read: &mut DiskRead,
    sim: &Rc<Sim>,
    i: NodeIndex,
    running: bool,
) -> Vec<FrontierValue> {
    if !read.disk.as_ref().is_some_and(|d| Rc::ptr_eq(d, sim)) {
        *read = DiskRead {
            disk: Some(sim.clone()),
            ..DiskRead::default()
        };
    }
    if let Some(values) = read.down.as_ref().filter(|_| !running) {
        return values.clone();
    }
    let data = PathBuf::from(format!("/sim/n{i}"));
    let mut values: Vec<FrontierValue> = (0..PARTITIONS)
        .map(|p| {
            let file = data
                .join("topics")
                .join(TOPIC)
                .join(p.to_string())
                .join(crate::partition::frontier::file_name(DEFAULT_GROUP));
            sim.durable_contents(&file)
                .and_then(|bytes| crate::partition::frontier::decode_value(&bytes))
                .unwrap_or_default()
        })
        .collect();
    let journal = data.join("journal");
    // The journal's files in index order, as the replay reads them (one core: `0000-{index}.jnl`). A rotation adds
    // the next index, a checkpoint removes the oldest: they are looked for from the lowest one of the last read on,
    // and listed only when that window does not hold them all.
    const WINDOW: u64 = 8;
    let name = |index: u64| format!("0000-{index:020}.jnl");
    let mut files: Vec<(u64, Vec<u8>)> = (read.first..read.first + WINDOW)
        .filter_map(|k| sim.durable_contents(&journal.join(name(k))).map(|b| (k, b)))
        .collect();
    if files.is_empty()
        || files
            .last()
            .is_some_and(|(k, _)| *k == read.first + WINDOW - 1)
    {
        let mut names = SimStorage(sim.clone()).list(&journal).unwrap_or_default();
        names.sort();
        files = names
            .iter()
            .filter_map(|n| n.strip_prefix("0000-")?.strip_suffix(".jnl")?.parse().ok())
            .filter_map(|k| sim.durable_contents(&journal.join(name(k))).map(|b| (k, b)))
            .collect();
    }
    if let Some((k, _)) = files.first() {
        read.first = *k;
    }
    read.journals
        .retain(|k, _| files.iter().any(|(f, _)| f == k));
    let mut journaled: BTreeMap<u32, FrontierValue> = BTreeMap::new();
    let mut damaged = false;
    for (name, bytes) in files {
        if read
            .journals
            .get(&name)
            .is_none_or(|(was, _)| *was != bytes)
        {
            let found = crate::storage::journal::scan(&bytes);
            let records = (found.damaged == 0).then(|| {
                found
                    .frontiers
                    .iter()
                    .filter(|r| {
                        r.topic == TOPIC && r.group == DEFAULT_GROUP && r.partition < PARTITIONS
                    })
                    .map(|r| (r.partition, r.value(), r.start))
                    .collect()
            });
            read.journals.insert(name, (bytes, records));
        }
        let records = &read.journals[&name].1;
        let Some(records) = records else {
            damaged = true;
            continue;
        };
        for (p, value, start) in records {
            let v = journaled.entry(*p).or_default();
            if *start {
                *v = value.clone();
            } else {
                v.merge(value);
            }
        }
    }
    if !damaged {
        for (p, v) in journaled {
            values[p as usize].merge(&v);
        }
    }
    read.down = (!running).then(|| values.clone());
    values
}

/// The offsets a majority of `values` (settled offsets: below the frontier or in an acked range) holds, as a
/// frontier value: a sweep over the ranges' ends, counting how many values cover each stretch.
fn majority_settled(values: &[FrontierValue]) -> FrontierValue {
    let need = values.len() / 2 + 1;
    let mut edges: Vec<(u64, i64)> = Vec::new();
    for v in values {
        for (s, e) in std::iter::once((0, v.committed)).chain(v.acked.iter().copied()) {
            if s < e {
                edges.push((s, 1));
                edges.push((e, -1));
            }
        }
    }
    edges.sort_unstable();
    let mut out = FrontierValue::default();
    let (mut count, mut from) = (0i64, None);
    for (at, delta) in edges {
        count += delta;
        match from {
            None if count as usize >= need => from = Some(at),
            Some(start) if (count as usize) < need => {
                out.acked.push((start, at));
                from = None;
            }
            _ => {}
        }
    }
    out.normalise();
    out
}

/// The value a majority of three replicas holds at least: the second highest.
fn majority_of(mut values: Vec<u64>) -> u64 {
    values.sort_unstable_by(|a, b| b.cmp(a));
    values.get(values.len() / 2).copied().unwrap_or(0)
}

impl Cluster {
    /// Each partition's frontier that a majority of its replicas holds durably now (per partition, each node's).
    fn majority_frontiers(&self) -> (Vec<u64>, Vec<Vec<u64>>, Vec<FrontierValue>) {
        let mut reads = self.disk_reads.borrow_mut();
        let values: Vec<Vec<FrontierValue>> = self
            .slots
            .borrow()
            .iter()
            .zip(reads.iter_mut())
            .map(|(s, read)| durable_frontiers(read, &s.disk, s.index, s.node.is_some()))
            .collect();
        let per_node: Vec<Vec<u64>> = values
            .iter()
            .map(|v| v.iter().map(|v| v.committed).collect())
            .collect();
        let majority = (0..PARTITIONS as usize)
            .map(|p| majority_of(per_node.iter().map(|v| v[p]).collect()))
            .collect();
        let settled = (0..PARTITIONS as usize)
            .map(|p| majority_settled(&values.iter().map(|v| v[p].clone()).collect::<Vec<_>>()))
            .collect();
        (majority, per_node, settled)
    }

    /// The floors a consume sent now is checked against.
    fn floors(&self) -> Floors {
        let o = self.oracle.borrow();
        (o.groups.floor.clone(), o.groups.floor_acked.clone())
    }

    /// The checks of the default group's frontier after a step (see the module's header).
    pub(super) fn check_frontiers(&self) {
        // Leadership changes since the last check (elections, hand-overs, CheckQuorum): from each on, no leader
        // leases below what a majority held at the last check before it.
        let changes = std::mem::take(&mut *self.etcd.leaderships.borrow_mut());
        let (majority, per_node, settled) = self.majority_frontiers();
        let mut o = self.oracle.borrow_mut();
        for &(p, _) in &changes {
            let acked = o.groups.held_acked.get(&p).cloned().unwrap_or_default();
            o.groups.floor_acked.insert(p, acked);
        }
        for (p, epoch) in changes {
            let floor = o.groups.held.get(&p).copied().unwrap_or(0);
            if o.groups.floor.insert(p, floor) != Some(floor) {
                o.note(format!(
                    "partition {p} at epoch {epoch}: no leader leases the default group below {floor} from now on"
                ));
            }
        }
        let disk_lost = std::mem::take(&mut o.groups.disk_lost);
        for p in 0..PARTITIONS {
            let m = majority[p as usize];
            let was = o.groups.majority.insert(p, m).unwrap_or(0);
            if m != was {
                let replicas: Vec<u64> = per_node.iter().map(|v| v[p as usize]).collect();
                o.note(format!(
                    "partition {p}: the default group's durable frontiers {replicas:?} (nodes 1 to 3), {m} on a majority"
                ));
            }
            if m < was && !disk_lost {
                // (Seed 1471 found this: a new leader's group start, queued when its round ended, reached a replica
                // that was down only on its return, and replaced the higher value it kept from its own leadership
                // with one older than what the leader's other followers held by then. Starts now go with the
                // group's durable value as it is when sent: `Partition::durable_frontier_to_ship`.)
                o.fail(format!(
                    "the default group's frontier of partition {p} that a majority of the replicas held durably moved back from {was} to {m} (each node's now: {:?})",
                    per_node.iter().map(|v| v[p as usize]).collect::<Vec<_>>()
                ));
            }
            let held = o.groups.held.entry(p).or_insert(0);
            *held = (*held).max(m);
            o.groups
                .held_acked
                .entry(p)
                .or_default()
                .merge(&settled[p as usize]);
        }
        drop(o);
        // The leader etcd names, serving at its epoch, serves from the held frontier at least.
        let snapshot = self.etcd.snapshot();
        let Some(record) = snapshot.topic(TOPIC) else {
            return;
        };
        for p in 0..PARTITIONS {
            let state = &record.partitions[p as usize];
            let Some(c) = self.serving_committed(state.leader, p, state.epoch) else {
                continue;
            };
            let o = self.oracle.borrow();
            let held = o.groups.held.get(&p).copied().unwrap_or(0);
            if c < held {
                o.fail(format!(
                    "node {}, leading partition {p} at epoch {}, serves the default group from {c}, below the frontier {held} a majority of the replicas held durably",
                    state.leader, state.epoch
                ));
            }
        }
    }

    /// The default group's committed frontier on node `i`'s replica of partition `p` if it leads and serves it at
    /// `epoch` (its round won, not deposed, its group loaded).
    fn serving_committed(&self, i: NodeIndex, p: u32, epoch: u64) -> Option<u64> {
        let slots = self.slots.borrow();
        let node = slots.get(i as usize - 1)?.node.as_ref()?;
        let topic = node.engine.topic(TOPIC).ok()?;
        if topic.epoch(p) != epoch {
            return None;
        }
        let partition = topic.owned_partition(p)?;
        if partition.deposed().is_some() || partition.round_under_way().is_some() {
            return None;
        }
        partition.committed(DEFAULT_GROUP)
    }

    /// A consumer of the default group through node `i`: a consume, then each delivery acked, nacked or left to
    /// expire, one after another.
    pub(super) fn consume(&self, rng: &mut super::Rng, i: NodeIndex) {
        let Some((front, tasks)) = self.front(i) else {
            return;
        };
        let max = 1 + rng.below(4) as usize;
        let wait_ms = if rng.chance(70) {
            0
        } else {
            100 + rng.below(900)
        };
        let visibility_ms = [1000, 1500, 2000][rng.below(3) as usize];
        let plans: Vec<Plan> = (0..max)
            .map(|_| match rng.below(20) {
                0..=14 => Plan::Ack(rng.below(300)),
                15..=16 => Plan::Nack(rng.below(300), rng.chance(50).then(|| rng.below(500))),
                _ => Plan::Expire,
            })
            .collect();
        let n = {
            let mut o = self.oracle.borrow_mut();
            o.groups.consumes += 1;
            o.groups.consumes
        };
        self.note(format!(
            "consume c{n} (max {max}, wait {wait_ms} ms, visibility {visibility_ms} ms) through node {i}"
        ));
        let floors = self.floors();
        let oracle = self.oracle.clone();
        let clock = self.clock.clone();
        tasks.spawn(async move {
            let result = front
                .consume(ConsumeParams {
                    topic: TOPIC.to_string(),
                    group: DEFAULT_GROUP.to_string(),
                    wait_ms: Some(wait_ms),
                    visibility_ms: Some(visibility_ms),
                    max,
                    media: None,
                })
                .await;
            let deliveries = match result {
                Ok(d) => d,
                Err(e) => {
                    oracle
                        .borrow_mut()
                        .note(format!("t={} consume c{n} failed: {e}", clock.now_ms()));
                    return;
                }
            };
            {
                let mut o = oracle.borrow_mut();
                o.note(format!(
                    "t={} consume c{n}: {} leases",
                    clock.now_ms(),
                    deliveries.len()
                ));
                for d in &deliveries {
                    o.delivered(d, &floors, i);
                }
            }
            for (d, plan) in deliveries.into_iter().zip(plans) {
                let (after, op) = match plan {
                    Plan::Ack(after) => (after, SettleOp::Ack),
                    Plan::Nack(after, delay) => (after, SettleOp::Nack(delay)),
                    Plan::Expire => continue,
                };
                clock.sleep_until(clock.now_ms() + after).await;
                if op == SettleOp::Ack {
                    oracle
                        .borrow_mut()
                        .groups
                        .ack_sent
                        .insert((d.partition, d.offset));
                }
                let result = settle(&front, &d, op).await;
                let mut o = oracle.borrow_mut();
                let now = clock.now_ms();
                match result {
                    Ok(()) => {
                        o.note(format!(
                            "t={now} {op:?} of {}:{} (c{n}) answered 200",
                            d.partition, d.offset
                        ));
                        if op == SettleOp::Ack {
                            o.groups.settled.insert((d.partition, d.offset));
                        }
                    }
                    Err(e) => o.note(format!(
                        "t={now} {op:?} of {}:{} (c{n}) failed: {e}",
                        d.partition, d.offset
                    )),
                }
            }
        });
    }

    /// Whether the default group is drained: each partition's leader (as etcd names it) serves at its epoch with
    /// everything it serves settled, at least up to the last offset any answer named. Err: why not.
    fn drained(&self) -> Result<(), String> {
        let snapshot = self.etcd.snapshot();
        let record = snapshot
            .topic(TOPIC)
            .ok_or_else(|| "no topic in etcd".to_string())?;
        for p in 0..PARTITIONS {
            let state = &record.partitions[p as usize];
            let slots = self.slots.borrow();
            let Some(partition) = slots[state.leader as usize - 1]
                .node
                .as_ref()
                .and_then(|n| n.engine.topic(TOPIC).ok())
                .filter(|t| t.epoch(p) == state.epoch)
                .and_then(|t| t.owned_partition(p))
                .filter(|p| p.deposed().is_none() && p.round_under_way().is_none())
            else {
                return Err(format!(
                    "partition {p}: node {} does not serve it at epoch {} yet",
                    state.leader, state.epoch
                ));
            };
            let end = partition.readable_end();
            let committed = partition.committed(DEFAULT_GROUP);
            let answered = self.oracle.borrow().end(p);
            if committed != Some(end) || end < answered {
                return Err(format!(
                    "partition {p}: node {} has the default group at {committed:?}, serves up to {end} (answered up to {answered})",
                    state.leader
                ));
            }
        }
        Ok(())
    }

    /// The end of a seed, after everything acknowledged is served: the default group drained through node 1 (every
    /// lease acked at once), then every acknowledged produce delivered in the drain or acked before it.
    pub(super) async fn drain(&self, rng: &mut super::Rng) {
        self.note("the end: the default group drained through node 1".into());
        self.oracle.borrow_mut().groups.draining = true;
        let started = self.clock.now_ms();
        loop {
            let why = match self.drained() {
                Ok(()) => break,
                Err(why) => why,
            };
            if self.clock.now_ms() - started > super::HEAL_MS {
                self.oracle.borrow().fail(format!(
                    "{} s into the drain of the default group it is not drained: {why}",
                    super::HEAL_MS / 1000
                ));
            }
            let leased = match self.front(1) {
                Some((front, _)) => {
                    let floors = self.floors();
                    let f = front.clone();
                    let result = self
                        .complete(async move {
                            f.consume(ConsumeParams {
                                topic: TOPIC.to_string(),
                                group: DEFAULT_GROUP.to_string(),
                                wait_ms: Some(0),
                                visibility_ms: Some(10_000),
                                max: 32,
                                media: None,
                            })
                            .await
                        })
                        .await;
                    match result {
                        Ok(deliveries) => {
                            for d in &deliveries {
                                self.oracle.borrow_mut().delivered(d, &floors, 1);
                            }
                            // Acked at once, in one batch.
                            let items: Vec<(u32, u64)> =
                                deliveries.iter().map(|d| (d.partition, d.offset)).collect();
                            self.oracle
                                .borrow_mut()
                                .groups
                                .ack_sent
                                .extend(items.iter().copied());
                            let handles: Vec<ReceiptHandle> =
                                deliveries.iter().map(ReceiptHandle::of).collect();
                            let f = front.clone();
                            let result = self
                                .complete(async move {
                                    f.settle(SettleParams {
                                        topic: TOPIC.to_string(),
                                        group: DEFAULT_GROUP.to_string(),
                                        op: SettleOp::Ack,
                                        handles: handles
                                            .into_iter()
                                            .map(|h| (h.to_string(), Ok(h)))
                                            .collect(),
                                        batch: true,
                                    })
                                    .await
                                })
                                .await;
                            let mut o = self.oracle.borrow_mut();
                            match result {
                                Ok(results) => {
                                    for ((p, offset), r) in items.iter().zip(results) {
                                        match r {
                                            Ok(()) => {
                                                o.groups.settled.insert((*p, *offset));
                                            }
                                            Err(e) => o.note(format!(
                                                "drain: the ack of {p}:{offset} failed: {e}"
                                            )),
                                        }
                                    }
                                }
                                Err(e) => o.note(format!("drain: an ack failed: {e}")),
                            }
                            !deliveries.is_empty()
                        }
                        Err(e) => {
                            self.note(format!("drain: a consume failed: {e}"));
                            false
                        }
                    }
                }
                None => false,
            };
            if !leased {
                if (self.clock.now_ms() - started) % 10_000 < 200 {
                    self.note(format!("draining: {why}"));
                }
                self.clock.advance(200);
                self.tick(rng).await;
                self.settle().await;
                self.check_frontiers();
            }
        }
        let o = self.oracle.borrow();
        for ((p, offset), body) in &o.acked {
            if !o.groups.drained.contains(&(*p, *offset))
                && !o.groups.ack_sent.contains(&(*p, *offset))
            {
                o.fail(format!(
                    "{body}, acknowledged at {p}:{offset}, was neither delivered in the drain nor acked before it (the default group's frontier passed it unsettled)"
                ));
            }
        }
    }
}

/// Settles one lease through `front`.
async fn settle(
    front: &crate::front::Front,
    d: &Delivery,
    op: SettleOp,
) -> crate::ops::OpResult<()> {
    let handle = ReceiptHandle::of(d);
    front
        .settle(SettleParams {
            topic: TOPIC.to_string(),
            group: DEFAULT_GROUP.to_string(),
            op,
            handles: vec![(handle.to_string(), Ok(handle))],
            batch: false,
        })
        .await
        .map(|mut r| r.remove(0))
        .and_then(|r| r)
}
