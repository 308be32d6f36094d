//! A follower replica's group frontiers (`Partition::follow_frontiers`, `docs/replication.md` step 3): what its
//! leader ships is durable in the follower's journal when the call returns (a power cut before any checkpoint
//! keeps it, through the journal's replay), reaches the frontier files at checkpoints, never moves back, and a
//! group's start replaces the group at once; values for groups the replica does not know are passed over.

use super::inflight::{Limits, Redelivery};
use super::{Partition, PartitionSetup, DEFAULT_GROUP};
use crate::clock::ManualClock;
use crate::config::FsyncPolicy;
use crate::ops::replicate::FrontierMark;
use crate::storage::backend::Storage;
use crate::storage::frontier;
use crate::storage::journal::{self, Journal, JournalOptions};
use crate::storage::log::{JournalLink, LogOptions};
use crate::storage::sim::{Sim, SimStorage};
use std::path::{Path, PathBuf};
use std::rc::Rc;

const TOPIC_ID: u64 = 9;

fn run(f: impl std::future::Future<Output = ()>) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(f)
}

fn dir() -> PathBuf {
    PathBuf::from("/sim/topics/t/0")
}

fn journal_dir() -> &'static Path {
    Path::new("/sim/journal")
}

/// A follower replica of partition 0 of `t` (groups `default` and `g`) writing through a core journal.
async fn follower(storage: &Rc<dyn Storage>) -> (Rc<Journal>, Rc<Partition>) {
    let (journal, partition, _clock) = replica_on(storage).await;
    (journal, partition)
}

/// A new leadership hands out no lease until its predecessor's lease has run out, a lease and an eighth after its
/// fencing round ended (`lease.rs`), whatever its own followers answered: a take says when to look again.
#[test]
fn a_new_leader_takes_nothing_until_its_predecessors_lease_ran_out() {
    use bytes::Bytes;
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p, clock) = replica_on(&storage).await;
        p.lead(3, 3, Rc::new(|_, _| {})).await;
        p.start_serving(3).await.expect("serves at epoch 3");
        p.open_nonces(p.nonce_floor(), p.nonce_ask(), Rc::new(|| {}));
        let ab = ["a", "b"].map(|s| Bytes::from_static(s.as_bytes()));
        assert_eq!(p.append(ab.to_vec()).await.unwrap(), 0);
        p.follower_acked(7, 2);
        p.lease_granted(u64::MAX);
        let wait = p.lease_ms() * 9 / 8;
        let taken = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
        assert!(taken.deliveries.is_empty());
        assert_eq!(taken.retry_in_ms, Some(wait));
        clock.advance(wait - 1);
        let taken = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
        assert_eq!((taken.deliveries.len(), taken.retry_in_ms), (0, Some(1)));
        clock.advance(1);
        let taken = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
        assert_eq!(offsets(&taken), vec![0]);
        // Its next leadership waits again.
        lead_leased(&p, 5).await;
        let taken = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
        assert_eq!(taken.retry_in_ms, Some(wait));
        clock.advance(wait);
        // Unless its round found no other leadership served since its last (`Began::floor`): a replica set changed
        // under it, say. It serves at once, once a majority answered this leadership.
        p.lead(7, 3, Rc::new(|_, _| {})).await;
        p.wait_out_predecessor_next(false);
        p.start_serving(7).await.expect("serves at epoch 7");
        p.open_nonces(p.nonce_floor(), p.nonce_ask(), Rc::new(|| {}));
        p.follower_acked(7, 2);
        p.lease_granted(u64::MAX);
        let taken = p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap();
        assert_eq!(offsets(&taken), vec![1]);
        // And the one after that waits again by default.
        lead_leased(&p, 9).await;
        assert_eq!(
            p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap().retry_in_ms,
            Some(wait)
        );
        // A round that found another leadership may have served starts the wait at once, before its end is written
        // (an end that fails, and a retry that finds this epoch begun, must not take before it).
        clock.advance(wait);
        p.wait_out_predecessor_next(true);
        assert_eq!(
            p.take(DEFAULT_GROUP, 1, 30_000).await.unwrap().retry_in_ms,
            Some(wait)
        );
    });
}

/// A leader deposed while a batch of its own appends is still being written (its journal's fdatasync held) lands
/// that batch after it follows; a probe of its new leader meanwhile (truncation by epoch) waits for it, so the end it
/// looks at holds the old leadership's record, which it cuts. Before (node simulation seed 10152) the probe found no
/// divergence at the end before that batch and its history took the new leadership's entry for that offset: the
/// old leadership's record stayed there under the new epoch, and was served, after a power cut, as the one a
/// majority had acknowledged.
#[test]
fn a_probe_reaching_a_deposed_leader_waits_for_its_own_batch_being_written_and_cuts_it() {
    use crate::storage::epoch_history::EpochStart;
    use bytes::Bytes;
    let e = |epoch, start| EpochStart { epoch, start };
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.lead(3, 3, Rc::new(|_, _| {})).await;
        p.start_serving(3).await.expect("serves at epoch 3");
        let ab = ["a", "b"].map(|s| Bytes::from_static(s.as_bytes()));
        assert_eq!(p.append(ab.to_vec()).await.unwrap(), 0);
        // c's journal pass is written, its sync held.
        sim.hold_syncs();
        let appending = {
            let p = p.clone();
            glommio::spawn_local(async move { p.append(vec![Bytes::from_static(b"c")]).await })
        };
        for _ in 0..100 {
            if sim.held_syncs() > 0 {
                break;
            }
            futures_lite::future::yield_now().await;
        }
        assert_eq!(sim.held_syncs(), 1, "c's sync is held");
        // Deposed: a leadership of epoch 5 began elsewhere at offset 2, without c.
        p.follow(5).await;
        let leader = [e(3, 0), e(5, 2)];
        let mut probe = std::pin::pin!(p.truncate_diverged(&leader, 5));
        for _ in 0..100 {
            assert!(
                futures_lite::future::poll_once(probe.as_mut())
                    .await
                    .is_none(),
                "decided while its own batch is still being written"
            );
        }
        sim.release_syncs();
        assert_eq!(
            appending.await.unwrap(),
            2,
            "c landed, as the rest of its old log"
        );
        assert_eq!(probe.await.expect("not refused"), Some(2), "c is cut");
        assert_eq!(p.log.end_offset(), 2);
        p.follow_epochs(&leader, 2, 5).await.expect("continues it");
        assert_eq!(p.epoch_history().entries(), &leader);
    })
}

/// The offsets a take handed out.
fn offsets(taken: &super::Taken) -> Vec<u64> {
    taken.deliveries.iter().map(|d| d.offset).collect()
}

/// `p` leads at `epoch` over three replicas, its round ended, a majority having answered it (its lease granted).
async fn lead_leased(p: &Partition, epoch: u64) {
    p.lead(epoch, 3, Rc::new(|_, _| {})).await;
    p.start_serving(epoch)
        .await
        .unwrap_or_else(|e| panic!("serves at epoch {epoch}: {e:?}"));
    p.lease_granted(u64::MAX);
}

/// As after a leader's fencing round and its followers' answers: its predecessor's lease waited out, and a lease of
/// its own (`partition/lease.rs`).
fn takes_allowed(p: &Partition, clock: &ManualClock) {
    clock.advance(p.lease_ms() * 9 / 8);
    p.lease_granted(u64::MAX);
}

/// The replica `follower` opens, with its clock.
async fn replica_on(storage: &Rc<dyn Storage>) -> (Rc<Journal>, Rc<Partition>, Rc<ManualClock>) {
    storage.create_dir_all(&dir()).unwrap();
    let clock = ManualClock::new(1_000);
    let journal = Journal::open(
        storage.clone(),
        clock.clone(),
        journal_dir(),
        0,
        JournalOptions {
            fsync: FsyncPolicy::Always,
            file_bytes: 1 << 20,
            commit_delay_us: 0,
        },
        journal::no_frontiers(),
    )
    .await
    .expect("journal opens");
    let partition = Partition::open(PartitionSetup {
        storage: storage.clone(),
        clock: clock.clone(),
        dir: dir(),
        id: 0,
        core: 0,
        journal: Some(JournalLink {
            journal: journal.clone(),
            topic: "t".into(),
            topic_id: TOPIC_ID,
            partition: 0,
        }),
        log_options: LogOptions {
            segment_bytes: 1 << 20,
            max_payload: 1 << 16,
            fsync: FsyncPolicy::Always,
            tail_cache_bytes: 0,
            write_behind_bytes: 0,
        },
        limits: Limits {
            max_in_flight: 16,
            max_acked_ahead: 16,
        },
        redelivery: Redelivery::default(),
        groups: vec![DEFAULT_GROUP.to_string(), "g".to_string()],
        wake: Rc::new(|_, _| {}),
        learner_if_new: None,
        fifo: false,
    })
    .await
    .expect("the partition opens");
    (journal, partition, clock)
}

impl Partition {
    /// `follow_frontiers` with a generous group cap.
    async fn follow_frontiers_all(
        &self,
        marks: &[FrontierMark],
    ) -> Result<(), super::PartitionError> {
        self.follow_frontiers(marks, 64, u64::MAX).await
    }
}

/// The disk a power cut leaves (nothing unsynced kept), after the journal's replay at the next start, with `groups`
/// the topic's groups then.
async fn replayed_after_power_cut(sim: &Sim, groups: &[&str]) -> Rc<dyn Storage> {
    let after: Rc<dyn Storage> = Rc::new(SimStorage(sim.power_cut(|_, _| 0)));
    let locate = |name: &str, id: u64, n: u32| (name == "t" && id == TOPIC_ID && n == 0).then(dir);
    let has_group = |_: &str, _: u64, g: &str| groups.contains(&g);
    journal::replay(&*after, journal_dir(), &locate, &has_group)
        .await
        .expect("replay");
    after
}

fn mark(group: &str, committed: u64, start: bool) -> FrontierMark {
    FrontierMark {
        group: group.into(),
        committed,
        start,
        group_id: 0,
        acked: Vec::new(),
    }
}

fn file(storage: &dyn Storage, group: &str) -> Option<u64> {
    let path = dir().join(frontier::file_name(group));
    storage.read(&path).ok()?;
    Some(frontier::read(storage, &path).expect("a frontier file reads"))
}

#[test]
fn a_followed_frontier_is_durable_when_recorded_and_reaches_its_file_at_a_checkpoint() {
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.follow_frontiers_all(&[mark(DEFAULT_GROUP, 5, false), mark("g", 3, false)])
            .await
            .expect("recorded");
        assert_eq!(
            file(&*storage, DEFAULT_GROUP),
            None,
            "files wait for a checkpoint"
        );
        assert!(p.frontier_file_behind());

        // A power cut now: the journal's replay brings the files up to what was recorded.
        let after = replayed_after_power_cut(&sim, &[DEFAULT_GROUP, "g"]).await;
        assert_eq!(file(&*after, DEFAULT_GROUP), Some(5));
        assert_eq!(file(&*after, "g"), Some(3));

        // Without the cut: a checkpoint writes them; a lower value later changes nothing.
        assert!(p.write_frontier_files().await);
        assert_eq!(file(&*storage, DEFAULT_GROUP), Some(5));
        p.follow_frontiers_all(&[mark(DEFAULT_GROUP, 4, false), mark("g", 8, false)])
            .await
            .expect("recorded");
        assert!(p.write_frontier_files().await);
        assert_eq!(file(&*storage, DEFAULT_GROUP), Some(5), "never back");
        assert_eq!(file(&*storage, "g"), Some(8));
        assert!(!p.frontier_file_behind());
    });
}

#[test]
fn a_followed_group_start_replaces_the_group_at_once_and_unknown_groups_are_passed_over() {
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.follow_frontiers_all(&[mark("g", 40, false)])
            .await
            .unwrap();
        assert!(p.write_frontier_files().await);
        assert_eq!(file(&*storage, "g"), Some(40));
        // The group deleted and created again on the leader, starting lower: its file says so at once.
        p.follow_frontiers_all(&[mark("g", 7, true)]).await.unwrap();
        assert_eq!(file(&*storage, "g"), Some(7));
        assert!(!p.frontier_file_behind());
        // A group created on the leader that this replica has not heard of yet: its start brings it.
        p.follow_frontiers_all(&[mark("late", 2, true), mark("late", 6, false)])
            .await
            .unwrap();
        assert_eq!(file(&*storage, "late"), Some(2));
        assert!(p.write_frontier_files().await);
        assert_eq!(file(&*storage, "late"), Some(6));
        // A value for a group it does not know, without a start: nothing.
        p.follow_frontiers_all(&[mark("unknown", 9, false)])
            .await
            .unwrap();
        assert!(p.write_frontier_files().await);
        assert_eq!(file(&*storage, "unknown"), None);
        // The start survives a power cut (its file, then its journal record, were synced before the answer), and
        // the replay does not raise it with the deleted group's older records.
        let after = replayed_after_power_cut(&sim, &["g", "late"]).await;
        assert_eq!(file(&*after, "g"), Some(7));
        assert_eq!(file(&*after, "late"), Some(6));
    });
}

#[test]
fn a_followed_value_never_writes_below_the_file_a_restart_left_and_two_calls_never_interleave() {
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (journal, p) = follower(&storage).await;
        p.follow_frontiers_all(&[mark("g", 50, false)])
            .await
            .unwrap();
        assert!(p.write_frontier_files().await);
        assert!(p.close().await);
        journal.close().await;
        // Opened again (a restart): it knows nothing of its groups until its leader ships; a lower value then does
        // not write the file down (nor trip the flush's never-lower assertion).
        let (_journal, p) = follower(&storage).await;
        p.follow_frontiers_all(&[mark("g", 40, false)])
            .await
            .unwrap();
        assert!(p.write_frontier_files().await);
        assert_eq!(file(&*storage, "g"), Some(50));
        // A start and a value of the same group in two calls at once: one after the other, in arrival order.
        let (a, b) = futures_lite::future::zip(
            p.follow_frontiers_all(&[mark("g", 0, true)]),
            p.follow_frontiers_all(&[mark("g", 1, false)]),
        )
        .await;
        a.unwrap();
        b.unwrap();
        assert!(p.write_frontier_files().await);
        assert_eq!(file(&*storage, "g"), Some(1));
    });
}

#[test]
fn a_follower_takes_no_more_groups_than_the_topic_allows() {
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        // It has `default` and `g`: with a cap of 3, one more group starts, the next is passed over.
        p.follow_frontiers(&[mark("a", 1, true), mark("b", 1, true)], 3, u64::MAX)
            .await
            .unwrap();
        assert_eq!(file(&*storage, "a"), Some(1));
        assert_eq!(file(&*storage, "b"), None);
        // A known group starts again whatever the cap.
        p.follow_frontiers(&[mark("g", 4, true)], 3, u64::MAX)
            .await
            .unwrap();
        assert_eq!(file(&*storage, "g"), Some(4));
    });
}

#[test]
fn a_group_gone_on_a_follower_leaves_its_values_out_of_the_replay_of_a_new_group_of_that_name() {
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.follow_frontiers_all(&[mark("g", 40, false)])
            .await
            .unwrap();
        p.remove_group("g").await;
        p.journal_group_gone("g").await.unwrap();
        // Power lost before the leader's start of the new `g`: the replay (the new `g` exists by then) must not
        // give it the deleted one's 40.
        let after = replayed_after_power_cut(&sim, &["g"]).await;
        assert_eq!(file(&*after, "g").unwrap_or(0), 0);
    });
}

/// Raises of the epoch floor that overlap write one at a time and leave the highest: the file never moves back,
/// whatever order they finish in; a failed write raises nothing (the request is not answered) and the next one
/// writes.
#[test]
fn overlapping_raises_of_the_epoch_floor_leave_the_highest_and_a_failed_one_raises_nothing() {
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        assert_eq!(p.epoch_floor(), 0);
        let ((a, b), c) = futures_lite::future::zip(
            futures_lite::future::zip(p.raise_epoch_floor(5), p.raise_epoch_floor(9)),
            p.raise_epoch_floor(7),
        )
        .await;
        for r in [a, b, c] {
            r.expect("raised");
        }
        assert_eq!(p.epoch_floor(), 9);
        let path = dir().join(crate::storage::epoch_floor::FILE_NAME);
        assert_eq!(
            sim.durable_contents(&path),
            Some(crate::storage::epoch_floor::encode(
                crate::storage::epoch_floor::Fence::at(9)
            ))
        );
        p.raise_epoch_floor(3)
            .await
            .expect("below the floor: nothing to write");
        assert_eq!(p.epoch_floor(), 9);

        sim.fail_syncs(libc::EIO, 1);
        p.raise_epoch_floor(11)
            .await
            .expect_err("a failed sync raises nothing");
        assert_eq!(p.epoch_floor(), 9);
        p.raise_epoch_floor(11)
            .await
            .expect("the next raise writes");
        assert_eq!(p.epoch_floor(), 11);
        assert_eq!(
            crate::storage::epoch_floor::read(&*storage, &dir())
                .unwrap()
                .floor,
            11
        );
    })
}

/// A follower's epoch history: what `follow_epochs` took is on disk when it returns (a power cut right after keeps
/// it, and the partition opened again reads it); entries that contradict it are refused and write nothing; a
/// leader's new epoch starts at its log's end.
#[test]
fn a_followers_epoch_history_is_durable_when_taken_and_a_contradiction_changes_nothing() {
    use crate::partition::FollowEpochsError;
    use crate::storage::epoch_history::{self, EpochStart};
    let e = |epoch, start| EpochStart { epoch, start };
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.follow_epochs(&[], 0, 9).await.expect("nothing to take");
        assert_eq!(sim.contents(&dir().join(epoch_history::FILE_NAME)), None);
        p.follow_epochs(&[e(7, 0), e(9, 4)], 0, 9)
            .await
            .expect("taken");
        let after = sim.power_cut(|_, _| 0);
        let durable = epoch_history::read(&SimStorage(after), &dir()).expect("reads");
        assert_eq!(durable.entries(), &[e(7, 0), e(9, 4)]);
        assert_eq!(p.epoch_history(), durable);
        assert_eq!(p.epochs_covering(5, 6), vec![e(9, 4)]);

        let written = sim.contents(&dir().join(epoch_history::FILE_NAME));
        for bad in [vec![e(9, 5)], vec![e(8, 6)], vec![e(10, 3)]] {
            let r = p.follow_epochs(&bad, 5, 10).await;
            assert!(
                matches!(r, Err(FollowEpochsError::Mismatch(_))),
                "{bad:?}: {r:?}"
            );
        }
        assert_eq!(sim.contents(&dir().join(epoch_history::FILE_NAME)), written);
        assert_eq!(p.epoch_history(), durable);

        // This replica leads at epoch 12 from its log's end (0 here: nothing was written to it).
        p.begin_leading(12, p.log.end_offset())
            .await
            .expect("recorded");
        assert_eq!(p.epoch_history().entries(), &[e(12, 0)]);
        p.begin_leading(12, 5)
            .await
            .expect("the same epoch: nothing");
        assert_eq!(p.epoch_history().entries(), &[e(12, 0)]);
        let after = sim.power_cut(|_, _| 0);
        assert_eq!(
            epoch_history::read(&SimStorage(after), &dir())
                .unwrap()
                .entries(),
            &[e(12, 0)]
        );
    })
}

/// A batch's epoch entries change the history with the log's end at their turn, not at the request's arrival: a
/// batch carrying only `(29, 76)`, sent with an end from before pipelined batches landed (40), keeps the entry of
/// the records 55.. that landed meanwhile. (The node simulation's seed 38579: given the old end, the history lost
/// `(13, 55)`; the replica, later elected, cut acknowledged records 55.. from the others.)
#[test]
fn a_batchs_epoch_entries_are_taken_with_the_logs_end_at_their_turn() {
    use crate::storage::epoch_history::EpochStart;
    let e = |epoch, start| EpochStart { epoch, start };
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.follow_epochs(&[e(8, 0), e(13, 55)], 0, 29)
            .await
            .expect("taken");
        p.log
            .append_batch(vec![bytes::Bytes::from_static(b"r"); 76])
            .await
            .expect("76 records landed");
        assert_eq!(p.log.end_offset(), 76);
        p.follow_epochs(&[e(29, 76)], 40, 29).await.expect("taken");
        assert_eq!(
            p.epoch_history().entries(),
            &[e(8, 0), e(13, 55), e(29, 76)],
            "the entry of the records that landed meanwhile is kept"
        );
    })
}

/// Whole-segment copy, a follower's side: a restart at its leader's start empties the log there and takes the
/// leader's history up to it, durably; and a log left empty at its start with its old history (a crash between the
/// two steps, or a lost answer) is put right by the next probe, whose divergence lies below the log's start: the
/// history up to the start becomes the leader's, nothing is cut below the start, and the probe's checks then pass
/// (before, the cut was refused at every probe, and the replica stuck for good).
#[test]
fn a_replica_started_anew_at_its_leaders_start_takes_its_history_up_to_there() {
    use crate::storage::epoch_history::{self, EpochStart};
    let e = |epoch, start| EpochStart { epoch, start };
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.follow_epochs(&[e(3, 0)], 0, 3).await.expect("taken");
        let leader = [e(2, 0), e(5, 10), e(8, 60)];
        // The log alone restarted (the history step never ran): empty at 40, its old history.
        assert_eq!(p.log.restart_at(40, 8).await.expect("restarted"), 40);
        assert_eq!(p.epoch_history().entries(), &[e(3, 0)]);
        assert_eq!(
            p.truncate_diverged(&leader, 8).await.expect("not refused"),
            Some(40)
        );
        assert_eq!(p.epoch_history().entries(), &[e(2, 0), e(5, 10)]);
        p.follow_epochs(&leader, 40, 8).await.expect("continues it");
        assert_eq!(
            (p.log.start_offset(), p.log.end_offset()),
            (40, 40),
            "nothing cut below the start"
        );
        // A restart at a later start, as a restart probe runs it: both steps, durably.
        assert_eq!(
            p.start_anew_at(70, &leader, 8).await.expect("restarted"),
            70
        );
        let after = sim.power_cut(|_, _| 0);
        let durable = epoch_history::read(&SimStorage(after), &dir()).expect("reads");
        assert_eq!(durable.entries(), &[e(2, 0), e(5, 10), e(8, 60)]);
        // An older leadership than the floor restarts nothing.
        p.raise_epoch_floor(9).await.expect("raised");
        assert!(matches!(
            p.start_anew_at(90, &leader, 8).await,
            Err(crate::partition::PartitionError::StaleEpoch { .. })
        ));
        assert_eq!(p.log.end_offset(), 70);
    })
}

/// `[cluster] replica_gather_us` (`Log::gather_behind_commit`): a replicated leader's writer holds its next batch
/// while its last one is not on a majority, so the appends that arrive meanwhile go in one batch (one journal pass,
/// one fdatasync on each replica) once a follower's answer moves the commit; without an answer it holds them no
/// longer than the gather; with the gather at 0 each goes as it comes.
#[test]
fn a_replicated_leader_gathers_the_appends_behind_an_uncommitted_batch_for_at_most_its_gather() {
    #[derive(Clone, Copy, PartialEq)]
    enum Release {
        /// A follower's answer moves the commit.
        Acked,
        /// Nothing: the gather runs out.
        Timer,
        /// A newer leadership deposes it.
        Deposed,
    }
    async fn batches_of_three_appends(gather_us: u64, release: Release) -> u64 {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p, clock) = replica_on(&storage).await;
        p.set_replicas(3);
        // A leader that ships (only those hold their batches).
        p.log.set_on_ship(Box::new(|_, _| {}));
        p.log.gather_behind_commit(gather_us);
        let first = p
            .log
            .append(bytes::Bytes::from_static(b"a"))
            .await
            .expect("durable");
        assert_eq!(first, 0);
        let log = || p.log.clone();
        let b = glommio::spawn_local({
            let log = log();
            async move { log.append(bytes::Bytes::from_static(b"b")).await }
        });
        for _ in 0..20 {
            glommio::yield_if_needed().await;
            futures_lite::future::yield_now().await;
        }
        let c = glommio::spawn_local({
            let log = log();
            async move { log.append(bytes::Bytes::from_static(b"c")).await }
        });
        for _ in 0..20 {
            futures_lite::future::yield_now().await;
        }
        if gather_us > 0 {
            assert_eq!(
                p.log.io_counts().0,
                1,
                "the appends behind an uncommitted batch are held"
            );
        }
        match release {
            // A follower has the first batch: a majority of 3, the commit moves and the writer goes on.
            Release::Acked => p.follower_acked(2, 1),
            Release::Timer => {
                // Held for the whole gather, not a microsecond less.
                clock.advance_us(gather_us - 1);
                for _ in 0..20 {
                    futures_lite::future::yield_now().await;
                }
                assert_eq!(p.log.io_counts().0, 1, "held until the gather ends");
                clock.advance_us(1);
            }
            Release::Deposed => p.depose(7),
        }
        assert_eq!(b.await.expect("durable"), 1);
        assert_eq!(c.await.expect("durable"), 2);
        let batches = p.log.io_counts().0;
        p.close().await;
        batches
    }
    run(async {
        assert_eq!(
            batches_of_three_appends(0, Release::Acked).await,
            3,
            "no gather: one batch each"
        );
        assert_eq!(
            batches_of_three_appends(2000, Release::Acked).await,
            2,
            "gathered until the commit moved"
        );
        assert_eq!(
            batches_of_three_appends(2000, Release::Timer).await,
            2,
            "gathered until the gather ran out"
        );
        assert_eq!(
            batches_of_three_appends(2000, Release::Deposed).await,
            2,
            "gathered until a newer leadership deposed it"
        );
    });
}

/// `Partition::renew`: a leader that began an epoch, restarted (the same disk, a new process), leads again at no epoch
/// up to it: a fencing round at that epoch, whatever view asked for it, cannot end in serving (`start_serving`
/// refuses it, as it refuses any epoch an earlier process began), and a newer epoch's round can.
#[test]
fn a_restarted_leader_serves_again_only_at_a_newer_epoch_than_one_it_began_before() {
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (journal, p, _clock) = replica_on(&storage).await;
        p.begin_leading(5, 0).await.expect("began epoch 5");
        p.set_replicas(3);
        p.close().await;
        journal.close().await;
        // The same disk, a new process.
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.process_crash()));
        let (journal, p, _clock) = replica_on(&storage).await;
        assert_eq!(p.epoch_history().last().map(|e| e.epoch), Some(5));
        p.renew(5, 3);
        assert_eq!(p.renewing(), Some(5));
        assert!(p.deposed().is_some(), "a renewing leader serves nothing");
        // A view re-applied at epoch 5 (the `retry` path in `engine/admin.rs` skips it; were it not to): its round
        // cannot end in serving.
        p.lead(5, 3, Rc::new(|_, _| {})).await;
        assert_eq!(
            p.renewing(),
            Some(5),
            "a round at the same epoch ends no renewal"
        );
        assert!(
            p.start_serving(5).await.is_err(),
            "serving again at the epoch it began before its restart"
        );
        assert!(p.deposed().is_some());
        // Without the renewal flag too: an epoch its history holds that this process never began.
        p.commit.renewing.set(None);
        assert!(
            p.start_serving(5).await.is_err(),
            "an epoch an earlier process began"
        );
        p.commit.renewing.set(Some(5));
        // Named leader at a newer epoch: its round's end serves.
        p.lead(8, 3, Rc::new(|_, _| {})).await;
        assert_eq!(p.renewing(), None);
        p.start_serving(8).await.expect("serves at the newer epoch");
        assert!(p.deposed().is_none());
        assert_eq!(p.epoch_history().last().map(|e| e.epoch), Some(8));
        p.close().await;
        journal.close().await;
    });
}

/// A leader's frontier file write still held in its fdatasync when it is deposed, named leader again and its shards
/// load (a consume's touch): the load waits for that write (`load_shards`), so the shard starts at what the write
/// made durable, not at the file as it stood before. Before, the shard loaded below it (the file not renamed yet,
/// the replica's value taken before the write), the write then landed with a shard there and marked the file
/// flushed above it: the next flush tripped the never-lower assertion in `flush_group`, and the acked records were
/// delivered again.
#[test]
fn a_frontier_write_landing_while_a_reelected_leader_loads_its_shards_is_what_they_load_from() {
    use super::SettleOp;
    use bytes::Bytes;
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p, clock) = replica_on(&storage).await;
        // Leader at epoch 3 over 3 replicas: a, b, c committed, a and b acked (the default group's frontier at 2).
        p.lead(3, 3, Rc::new(|_, _| {})).await;
        p.start_serving(3).await.expect("serves at epoch 3");
        takes_allowed(&p, &clock);
        p.open_nonces(p.nonce_floor(), p.nonce_ask(), Rc::new(|| {}));
        let abc = ["a", "b", "c"].map(|s| Bytes::from_static(s.as_bytes()));
        assert_eq!(p.append(abc.to_vec()).await.unwrap(), 0);
        p.follower_acked(7, 3);
        let taken = p.take(DEFAULT_GROUP, 2, 30_000).await.unwrap();
        assert_eq!(offsets(&taken), vec![0, 1]);
        let leases: Vec<(u64, u64)> = taken
            .deliveries
            .iter()
            .map(|d| (d.offset, d.nonce))
            .collect();
        let acked = p.settle(DEFAULT_GROUP, &leases, SettleOp::Ack).await;
        assert!(acked.unwrap().iter().all(|r| r.is_ok()));

        // Its frontier file's first write (a new file: a temporary one, renamed once synced) held in its fdatasync.
        sim.hold_syncs();
        let flush = {
            let p = p.clone();
            glommio::spawn_local(async move { p.flush_frontiers().await })
        };
        while sim.held_syncs() == 0 {
            futures_lite::future::yield_now().await;
        }
        // Deposed by epoch 5 meanwhile (its shards go; the durable value it keeps is the file's, none yet), then led
        // again at epoch 6: its history's syncs go through (held sync 0, the frontier write's, stays held).
        p.follow(5).await;
        p.lead(6, 3, Rc::new(|_, _| {})).await;
        let mut serving = std::pin::pin!(p.start_serving(6));
        let mut next = 1;
        let served = loop {
            if let Some(r) = futures_lite::future::poll_once(serving.as_mut()).await {
                break r;
            }
            if sim.held_syncs() > 1 {
                sim.release_held_sync(next);
                next += 1;
            }
            futures_lite::future::yield_now().await;
        };
        served.expect("serves at epoch 6");
        takes_allowed(&p, &clock);
        p.open_nonces(p.nonce_floor(), p.nonce_ask(), Rc::new(|| {}));
        p.follower_acked(7, 3);
        // A consume's touch loads the shards while the write is still held.
        let consume = {
            let p = p.clone();
            glommio::spawn_local(async move { p.take(DEFAULT_GROUP, 10, 30_000).await })
        };
        for _ in 0..100 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(sim.held_syncs(), 1, "the frontier write is still held");
        sim.release_syncs();
        assert_eq!(flush.await.len(), 1, "the held write landed");
        let taken = consume.await.unwrap();
        assert_eq!(file(&*storage, DEFAULT_GROUP), Some(2));

        // The next flush writes nothing lower (before: the assertion), and only c was delivered.
        p.flush_frontiers().await;
        assert_eq!(file(&*storage, DEFAULT_GROUP), Some(2), "never back");
        assert_eq!(offsets(&taken), vec![2], "acked records delivered again");
        let lease = (taken.deliveries[0].offset, taken.deliveries[0].nonce);
        let acked = p.settle(DEFAULT_GROUP, &[lease], SettleOp::Ack).await;
        assert!(acked.unwrap().iter().all(|r| r.is_ok()));
        assert_eq!(p.flush_frontiers().await.len(), 1);
        assert_eq!(file(&*storage, DEFAULT_GROUP), Some(3));
        assert!(p
            .take(DEFAULT_GROUP, 10, 30_000)
            .await
            .unwrap()
            .deliveries
            .is_empty());
    });
}

/// A fencing round's answer carries the frontiers a recording under way makes durable, and an older leadership's
/// marks that come to their turn after the floor was raised are refused (sim seed 22771: a replica answered a new
/// leader's round while an older leader's marks were being journaled, then made them durable and answered that
/// leader, which counted them acknowledged; the new leader, ranking the answer, served from below them).
#[test]
fn a_fencing_answer_carries_frontiers_being_recorded_and_older_marks_after_it_are_refused() {
    use super::PartitionError;
    run(async {
        let sim = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        let (_journal, p) = follower(&storage).await;
        p.raise_fence(3, 0).await.unwrap();
        let default_at = |p: &Partition| {
            p.durable_frontiers()
                .iter()
                .find(|r| r.group == DEFAULT_GROUP)
                .map(|r| r.committed)
        };
        // Epoch 3's marks: their journal write goes, its sync held (held sync 0).
        sim.hold_syncs();
        let recording = {
            let p = p.clone();
            glommio::spawn_local(async move {
                p.follow_frontiers(&[mark(DEFAULT_GROUP, 7, false)], 64, 3)
                    .await
            })
        };
        for _ in 0..100 {
            if sim.held_syncs() > 0 {
                break;
            }
            futures_lite::future::yield_now().await;
        }
        assert_eq!(sim.held_syncs(), 1, "the recording's sync is held");
        // Epoch 5's round reaches it: its floor is raised (its sync let go), and its answer waits.
        let answered = Rc::new(std::cell::Cell::new(false));
        let began = {
            let (p, answered) = (p.clone(), answered.clone());
            glommio::spawn_local(async move {
                p.raise_fence(5, 0).await.unwrap();
                p.wait_frontiers_followed().await;
                answered.set(true);
                default_at(&p)
            })
        };
        for _ in 0..100 {
            if sim.held_syncs() > 1 {
                sim.release_held_sync(1);
            }
            futures_lite::future::yield_now().await;
        }
        assert_eq!(p.epoch_floor(), 5, "the floor is raised");
        assert!(!answered.get(), "answered while a recording is under way");
        sim.release_syncs();
        recording.await.expect("recorded");
        assert_eq!(began.await, Some(7), "the answer carries what was recorded");
        // An older leadership's marks that come now are refused.
        let r = p
            .follow_frontiers(&[mark(DEFAULT_GROUP, 9, false)], 64, 3)
            .await;
        assert!(
            matches!(r, Err(PartitionError::StaleEpoch { epoch: 3, known: 5 })),
            "{r:?}"
        );
        assert_eq!(default_at(&p), Some(7));
    })
}
