//! A follower fed every batch its leader ships holds byte-identical segments, across rolls, write-behind,
//! journal checkpoints and a power cut of the follower; a batch that does not continue its log exactly changes
//! nothing.

use super::super::{JournalLink, Log, LogOptions};
use super::{FollowError, MAX_QUEUED_SHIPS};
use crate::clock::RealClock;
use crate::storage::backend::Storage;
use crate::storage::frame;
use crate::storage::journal::{self, EntryHead, Journal, JournalOptions};
use crate::storage::log::ReadError;
use crate::storage::sim::{Sim, SimStorage};
use crate::storage::FsyncPolicy;
use bytes::Bytes;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

fn run(f: impl std::future::Future<Output = ()>) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(f)
}

const TOPIC_ID: u64 = 7;

fn dir() -> PathBuf {
    PathBuf::from("/sim/topics/t/0")
}

/// A core's journal (small files, so checkpoints come often) and partition 0 of topic `t` on `storage`.
async fn open(storage: &Rc<dyn Storage>) -> (Rc<Journal>, Rc<Log>) {
    storage.create_dir_all(&dir()).unwrap();
    let journal = Journal::open(
        storage.clone(),
        Rc::new(RealClock),
        Path::new("/sim/journal"),
        0,
        JournalOptions {
            fsync: FsyncPolicy::Always,
            file_bytes: 16 << 10,
            commit_delay_us: 0,
        },
        journal::no_frontiers(),
    )
    .await
    .expect("journal opens");
    let log = Log::open_with(
        storage.clone(),
        Rc::new(RealClock),
        &dir(),
        LogOptions {
            segment_bytes: 4096,
            max_payload: 1 << 12,
            fsync: FsyncPolicy::Always,
            tail_cache_bytes: 0,
            write_behind_bytes: 1500,
        },
        Some(JournalLink {
            journal: journal.clone(),
            topic: "t".into(),
            topic_id: TOPIC_ID,
            partition: 0,
        }),
    )
    .await
    .expect("log opens");
    (journal, log)
}

/// The next process on `disk` (what a crash or power cut left): the journal replayed, then the journal and
/// partition 0 of `t` opened again.
async fn restart(disk: &Rc<Sim>) -> (Rc<Journal>, Rc<Log>) {
    let storage: Rc<dyn Storage> = Rc::new(SimStorage(disk.clone()));
    let locate = |name: &str, id: u64, p: u32| (name == "t" && id == TOPIC_ID && p == 0).then(dir);
    let has_group = |_: &str, _: u64, _: &str| false;
    journal::replay(&*storage, Path::new("/sim/journal"), &locate, &has_group)
        .await
        .expect("replay");
    open(&storage).await
}

type Disks = (Rc<Sim>, Rc<Sim>, Rc<dyn Storage>, Rc<dyn Storage>);

/// The leader's and the follower's simulated disks, and their storage.
fn two_disks() -> Disks {
    let (a, b) = (Sim::new(), Sim::new());
    let (sa, sb): (Rc<dyn Storage>, Rc<dyn Storage>) = (
        Rc::new(SimStorage(a.clone())),
        Rc::new(SimStorage(b.clone())),
    );
    (a, b, sa, sb)
}

type Shipped = Rc<RefCell<Vec<(EntryHead, Vec<u8>)>>>;

/// The leader's log, shipping into the returned queue.
async fn leader(storage: &Rc<dyn Storage>) -> (Rc<Journal>, Rc<Log>, Shipped) {
    let (journal, log) = open(storage).await;
    let shipped: Shipped = Rc::default();
    let queue = shipped.clone();
    log.set_on_ship(Box::new(move |head, frames| {
        queue.borrow_mut().push((head.clone(), frames.to_vec()))
    }));
    (journal, log, shipped)
}

/// Every file under the partition's directory, by name, with its bytes.
fn files(sim: &Sim) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = sim
        .paths()
        .into_iter()
        .filter(|p| p.starts_with(dir()))
        .map(|p| {
            let bytes = sim.contents(&p).unwrap_or_default();
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

/// The two disks hold the same files under the partition's directory, byte for byte.
fn assert_same_files(a: &Sim, b: &Sim, seed: u64) {
    let (la, fb) = (files(a), files(b));
    assert_eq!(
        la.iter().map(|f| &f.0).collect::<Vec<_>>(),
        fb.iter().map(|f| &f.0).collect::<Vec<_>>(),
        "seed {seed}"
    );
    for ((path, x), (_, y)) in la.iter().zip(&fb) {
        assert!(x == y, "seed {seed}: {} differs", path.display());
    }
}

/// A small deterministic generator (xorshift), so a failure names its round.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Appends `rounds` rounds of 1 to 4 concurrent batches of 1 to 3 records (0 to 600 bytes each) to `log`.
async fn produce(log: &Rc<Log>, rng: &mut Rng, rounds: usize) {
    for _ in 0..rounds {
        let tasks: Vec<_> = (0..1 + rng.below(4))
            .map(|_| {
                let payloads: Vec<Bytes> = (0..1 + rng.below(3))
                    .map(|_| Bytes::from(vec![b'a' + rng.below(26) as u8; rng.below(600) as usize]))
                    .collect();
                let log = log.clone();
                glommio::spawn_local(async move { log.append_batch(payloads).await })
            })
            .collect();
        for t in tasks {
            t.await.expect("appended");
        }
    }
}

async fn apply_all(follower: &Log, shipped: &Shipped) {
    let batches = std::mem::take(&mut *shipped.borrow_mut());
    for (head, frames) in batches {
        if let Err(e) = follower.apply_shipped(&head, &frames).await {
            panic!(
                "a shipped batch at {} was refused: {e:?}",
                head.first_offset
            );
        }
    }
}

#[test]
fn a_follower_fed_every_shipped_batch_holds_the_leaders_segments_byte_for_byte() {
    run(async {
        for seed in 1..=5u64 {
            let (a, b, sa, sb) = two_disks();
            let (lj, leader, shipped) = leader(&sa).await;
            let (fj, follower) = open(&sb).await;
            let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
            for _ in 0..20 {
                let rounds = 1 + rng.below(4) as usize;
                produce(&leader, &mut rng, rounds).await;
                apply_all(&follower, &shipped).await;
                assert_eq!(follower.end_offset(), leader.end_offset(), "seed {seed}");
            }
            assert!(
                leader.end_offset() > 100,
                "seed {seed}: {}",
                leader.end_offset()
            );
            for (log, journal) in [(&leader, &lj), (&follower, &fj)] {
                log.close().await;
                journal.close().await;
            }
            let la = files(&a);
            assert!(
                la.len() > 3,
                "seed {seed}: the leader rolled its segments: {la:?}"
            );
            assert_same_files(&a, &b, seed);
        }
    });
}

/// What a follower made durable survives a power cut: its journal replays it into the segment.
#[test]
fn a_shipped_batch_applied_survives_a_power_cut_of_the_follower() {
    run(async {
        let (_a, b, sa, sb) = two_disks();
        let (_lj, leader, shipped) = leader(&sa).await;
        let (_fj, follower) = open(&sb).await;
        let mut rng = Rng(42);
        produce(&leader, &mut rng, 6).await;
        apply_all(&follower, &shipped).await;
        let end = follower.end_offset();
        let cut = b.power_cut(|_, _| 0);
        let (_j, reopened) = restart(&cut).await;
        assert_eq!(
            reopened.end_offset(),
            end,
            "what the follower acknowledged is there"
        );
    });
}

#[test]
fn a_shipped_batch_that_does_not_continue_the_log_changes_nothing() {
    run(async {
        let (a, b, sa, sb) = two_disks();
        let (lj, leader, shipped) = leader(&sa).await;
        let (fj, follower) = open(&sb).await;
        let mut rng = Rng(3);
        produce(&leader, &mut rng, 12).await;
        let batches = std::mem::take(&mut *shipped.borrow_mut());
        assert!(batches.len() >= 6);
        // The refusals are tried at a batch that starts a new segment (the leader rolled before it), with the ones
        // before it applied.
        let roll = batches
            .iter()
            .position(|(h, _)| h.position == 0 && h.first_offset > 0)
            .expect("the leader rolled");
        for (head, frames) in &batches[..roll] {
            follower.apply_shipped(head, frames).await.expect("applied");
        }
        let end = follower.end_offset();
        let (head, frames) = &batches[roll];
        let before = files(&b);
        let refused = |r: Result<(), FollowError>| match r {
            Err(FollowError::Gap { .. }) | Err(FollowError::Mismatch(_)) => {}
            other => panic!("applied or refused for another reason: {other:?}"),
        };
        // Not the next batch: a gap, and the follower's end to resend from.
        match follower
            .apply_shipped(&batches[roll + 1].0, &batches[roll + 1].1)
            .await
        {
            Err(FollowError::Gap { end: e }) if e == end => {}
            other => panic!("{other:?}"),
        }
        // Bytes between two frames (the scan would resync over them), or before the first.
        let first_len = frame::decode_header(frames, 1 << 12).unwrap().frame_len();
        if head.count > 1 {
            let mut gap = frames[..first_len].to_vec();
            gap.extend_from_slice(&[0u8; 8]);
            gap.extend_from_slice(&frames[first_len..]);
            refused(follower.apply_shipped(head, &gap).await);
        }
        let mut prefixed = vec![0u8; 40];
        prefixed.extend_from_slice(frames);
        refused(follower.apply_shipped(head, &prefixed).await);
        // A batch past the end of its segment, and one larger than any a leader writes.
        let mut far = head.clone();
        far.segment_base = batches[roll - 1].0.segment_base;
        far.position = 4000;
        refused(follower.apply_shipped(&far, frames).await);
        match follower.apply_shipped(head, &vec![0u8; 5 << 20]).await {
            Err(FollowError::Mismatch(_)) => {}
            other => panic!("{other:?}"),
        }
        // A flipped byte in a frame, a frame too few or too many, another place or another topic.
        let mut flipped = frames.clone();
        let at = flipped.len() - 1;
        flipped[at] ^= 1;
        refused(follower.apply_shipped(head, &flipped).await);
        refused(
            follower
                .apply_shipped(head, &frames[..frames.len() - 1])
                .await,
        );
        let mut more = head.clone();
        more.count += 1;
        refused(follower.apply_shipped(&more, frames).await);
        let mut moved = head.clone();
        moved.position += 1;
        refused(follower.apply_shipped(&moved, frames).await);
        let mut other = head.clone();
        other.topic_id += 1;
        refused(follower.apply_shipped(&other, frames).await);
        let mut rolled = head.clone();
        rolled.segment_base += 5;
        refused(follower.apply_shipped(&rolled, frames).await);
        assert_eq!(follower.end_offset(), end);
        assert_eq!(files(&b), before, "a refused batch wrote nothing");
        // The real ones still apply, in order.
        for (head, frames) in &batches[roll..] {
            follower.apply_shipped(head, frames).await.expect("applied");
        }
        assert_eq!(follower.end_offset(), leader.end_offset());
        for (log, journal) in [(&leader, &lj), (&follower, &fj)] {
            log.close().await;
            journal.close().await;
        }
        assert_eq!(files(&a), files(&b));
    });
}

/// A shipped batch is the writer task's job once queued: a caller that stops waiting leaves it applied, not half
/// done, and a close waits for it.
#[test]
fn a_shipped_batch_whose_caller_stops_waiting_is_applied_and_a_close_waits_for_it() {
    run(async {
        let (_a, _b, sa, sb) = two_disks();
        let (lj, leader, shipped) = leader(&sa).await;
        let (fj, follower) = open(&sb).await;
        let mut rng = Rng(9);
        produce(&leader, &mut rng, 4).await;
        let batches = std::mem::take(&mut *shipped.borrow_mut());
        assert!(batches.len() >= 3);
        // Asked, then abandoned at once.
        {
            let mut abandoned = Box::pin(follower.apply_shipped(&batches[0].0, &batches[0].1));
            assert!(futures_lite::future::poll_once(&mut abandoned)
                .await
                .is_none());
        }
        follower
            .apply_shipped(&batches[1].0, &batches[1].1)
            .await
            .expect("the next batch applies: the abandoned one was applied");
        // Queued, then the log closes: the close waits for it.
        let mut last = Box::pin(follower.apply_shipped(&batches[2].0, &batches[2].1));
        assert!(futures_lite::future::poll_once(&mut last).await.is_none());
        follower.close().await;
        assert_eq!(
            follower.end_offset(),
            batches[2].0.first_offset + u64::from(batches[2].0.count)
        );
        assert!(last.await.is_ok());
        leader.close().await;
        lj.close().await;
        fj.close().await;
    });
}

/// A peer cannot make a follower queue without bound: beyond `MAX_QUEUED_SHIPS` waiting for the writer, a shipped
/// batch is refused (`Busy`, the leader retries) and nothing of it is queued; the queued ones still apply in order.
#[test]
fn a_follower_queues_at_most_max_queued_ships_batches() {
    run(async {
        let (_a, _b, sa, sb) = two_disks();
        let (lj, leader, shipped) = leader(&sa).await;
        let (fj, follower) = open(&sb).await;
        let mut rng = Rng(3);
        let mut rounds = 0;
        while shipped.borrow().len() <= MAX_QUEUED_SHIPS {
            // Bounded: a leader that ships nothing fails here instead of hanging the suite.
            rounds += 1;
            assert!(
                rounds < 100_000,
                "the leader shipped only {} batches",
                shipped.borrow().len()
            );
            produce(&leader, &mut rng, 4).await;
        }
        let batches = std::mem::take(&mut *shipped.borrow_mut());
        // Queued, each polled once (so it is in the queue) before the writer task runs.
        let mut waiting = Vec::new();
        for (head, frames) in &batches[..MAX_QUEUED_SHIPS] {
            let mut f = Box::pin(follower.apply_shipped(head, frames));
            assert!(futures_lite::future::poll_once(&mut f).await.is_none());
            waiting.push(f);
        }
        let (head, frames) = &batches[MAX_QUEUED_SHIPS];
        assert!(matches!(
            follower.apply_shipped(head, frames).await,
            Err(FollowError::Busy)
        ));
        for f in waiting {
            f.await.expect("a queued batch applies");
        }
        // Refused, not lost: sent again, it applies.
        follower
            .apply_shipped(head, frames)
            .await
            .expect("the retry applies");
        assert_eq!(
            follower.end_offset(),
            head.first_offset + u64::from(head.count)
        );
        leader.close().await;
        follower.close().await;
        lj.close().await;
        fj.close().await;
    });
}

/// Shipped batches until the leader has shipped at least `n`.
async fn ship_at_least(
    leader: &Rc<Log>,
    shipped: &Shipped,
    rng: &mut Rng,
    n: usize,
) -> Vec<(EntryHead, Vec<u8>)> {
    let mut rounds = 0;
    while shipped.borrow().len() < n {
        rounds += 1;
        assert!(
            rounds < 100_000,
            "the leader shipped only {} batches",
            shipped.borrow().len()
        );
        produce(leader, rng, 1).await;
    }
    std::mem::take(&mut *shipped.borrow_mut())
}

/// Batches queued while the writer was busy: each polled once (so it is in the queue) before the writer runs.
async fn queue_all<'a>(
    follower: &'a Log,
    batches: &'a [(EntryHead, Vec<u8>)],
) -> Vec<std::pin::Pin<Box<impl std::future::Future<Output = Result<(), FollowError>> + 'a>>> {
    let mut waiting = Vec::new();
    for (head, frames) in batches {
        let mut f = Box::pin(follower.apply_shipped(head, frames));
        assert!(futures_lite::future::poll_once(&mut f).await.is_none());
        waiting.push(f);
    }
    waiting
}

/// Consecutive batches queued together go in one journal pass (one fdatasync) per run that continues one segment,
/// each answered, and the follower still holds the leader's bytes, across a power cut too.
#[test]
fn batches_queued_together_are_written_in_one_pass_and_hold_the_leaders_bytes() {
    run(async {
        for seed in 1..=4u64 {
            let (a, b, sa, sb) = two_disks();
            let (lj, leader, shipped) = leader(&sa).await;
            let (fj, follower) = open(&sb).await;
            let mut rng = Rng(seed * 0x2545_f491_4f6c_dd1d);
            let mut together = 0;
            for _ in 0..6 {
                let n = 2 + rng.below(8) as usize;
                let batches = ship_at_least(&leader, &shipped, &mut rng, n).await;
                let rolls = batches
                    .windows(2)
                    .filter(|w| w[0].0.segment_base != w[1].0.segment_base)
                    .count();
                let passes = fj.stats().passes;
                for f in queue_all(&follower, &batches).await {
                    f.await.expect("a queued batch applies");
                }
                let took = fj.stats().passes - passes;
                // One pass per run of batches within one segment (a roll starts a new run; a run stops at
                // MAX_BATCH_BYTES, far above these), plus at most one for the segment's roll itself.
                assert!(
                    took <= 2 * (rolls as u64 + 1),
                    "seed {seed}: {} batches ({rolls} rolls) took {took} passes",
                    batches.len()
                );
                together += batches.len() as u64 - took.min(batches.len() as u64);
                assert_eq!(follower.end_offset(), leader.end_offset(), "seed {seed}");
            }
            assert!(together > 0, "seed {seed}: no two batches shared a pass");
            let end = follower.end_offset();
            let cut = b.power_cut(|_, _| 0);
            let (rj, reopened) = restart(&cut).await;
            assert_eq!(
                reopened.end_offset(),
                end,
                "seed {seed}: what the follower acknowledged is there"
            );
            reopened.close().await;
            rj.close().await;
            for (log, journal) in [(&leader, &lj), (&follower, &fj)] {
                log.close().await;
                journal.close().await;
            }
            assert_same_files(&a, &b, seed);
        }
    });
}

/// A batch whose head lies about where its frames end, queued with batches before and after it whose heads make
/// the run's total right: written together they would pass as a whole, so each boundary is checked, and each batch
/// gets the answer it would have had alone (the first applies, the liar is a mismatch, the next a gap).
#[test]
fn a_batch_queued_with_others_that_lies_about_its_frames_is_refused_alone() {
    run(async {
        let (_a, _b, sa, sb) = two_disks();
        let (lj, leader, shipped) = leader(&sa).await;
        let (fj, follower) = open(&sb).await;
        let mut rng = Rng(11);
        // Three batches in one segment, the last of more than one record.
        let batches = loop {
            let all = ship_at_least(&leader, &shipped, &mut rng, 3).await;
            let run = all.windows(3).find(|w| {
                w[0].0.segment_base == w[2].0.segment_base && w[1].0.count >= 1 && w[2].0.count >= 2
            });
            if let Some(w) = run {
                // Whatever came before goes first, alone.
                let first = w[0].0.first_offset;
                for (head, frames) in all.iter().take_while(|(h, _)| h.first_offset < first) {
                    follower.apply_shipped(head, frames).await.expect("applies");
                }
                break w.to_vec();
            }
            for (head, frames) in &all {
                follower.apply_shipped(head, frames).await.expect("applies");
            }
        };
        let mut lying = batches.clone();
        lying[1].0.count += 1;
        lying[2].0.first_offset += 1;
        lying[2].0.count -= 1;
        let start = follower.end_offset();
        let answers: Vec<_> = {
            let waiting = queue_all(&follower, &lying).await;
            let mut answers = Vec::new();
            for f in waiting {
                answers.push(f.await);
            }
            answers
        };
        assert!(answers[0].is_ok(), "{answers:?}");
        assert!(
            matches!(answers[1], Err(FollowError::Mismatch(_))),
            "{answers:?}"
        );
        assert!(
            matches!(answers[2], Err(FollowError::Gap { .. })),
            "{answers:?}"
        );
        let (h0, _) = &batches[0];
        assert_eq!(follower.end_offset(), start + u64::from(h0.count));
        // The truth, sent again, applies.
        for (head, frames) in &batches[1..] {
            follower
                .apply_shipped(head, frames)
                .await
                .expect("the true batch applies");
        }
        leader.close().await;
        follower.close().await;
        lj.close().await;
        fj.close().await;
    });
}

/// Catch-up: a follower fed only runs of frames read back from the leader's log (`read_for_follower`: sealed
/// segments, the active one's file and its write-behind buffer, in runs of at most a few hundred bytes) holds the
/// leader's segments byte for byte; where a run must stop (`until`) and what cannot be shipped are kept to.
#[test]
fn a_follower_caught_up_from_the_leaders_log_holds_its_segments_byte_for_byte() {
    run(async {
        for seed in 1..=5u64 {
            let (a, b, sa, sb) = two_disks();
            let (lj, leader, _shipped) = leader(&sa).await;
            let (fj, follower) = open(&sb).await;
            let mut rng = Rng(seed * 0x2545_f491_4f6c_dd1d);
            for i in 0..10 {
                // At first far behind (sealed segments to read), then a little.
                let rounds = if i == 0 {
                    12
                } else {
                    1 + rng.below(4) as usize
                };
                produce(&leader, &mut rng, rounds).await;
                let end = leader.end_offset();
                // Up to a point short of the end first: nothing at or past it is read.
                let until = end - rng.below(3).min(end);
                let before = follower.end_offset();
                loop {
                    let from = follower.end_offset();
                    let max = 1 + rng.below(900);
                    match leader.read_for_follower(from, until, max).await {
                        Ok(Some((head, frames))) => {
                            assert!(head.first_offset + u64::from(head.count) <= until);
                            assert!(head.count == 1 || frames.len() as u64 <= max, "seed {seed}");
                            follower
                                .apply_shipped(&head, &frames)
                                .await
                                .unwrap_or_else(|e| panic!("seed {seed}: at {from}: {e:?}"));
                        }
                        Ok(None) => break,
                        Err(e) => panic!("seed {seed}: at {from}: {e:?}"),
                    }
                }
                assert_eq!(follower.end_offset(), until.max(before), "seed {seed}");
                while let Ok(Some((head, frames))) = leader
                    .read_for_follower(follower.end_offset(), u64::MAX, 4096)
                    .await
                {
                    follower
                        .apply_shipped(&head, &frames)
                        .await
                        .expect("applied");
                }
                assert_eq!(follower.end_offset(), end, "seed {seed}");
            }
            assert!(matches!(
                leader
                    .read_for_follower(leader.end_offset(), u64::MAX, 4096)
                    .await,
                Ok(None)
            ));
            for (log, journal) in [(&leader, &lj), (&follower, &fj)] {
                log.close().await;
                journal.close().await;
            }
            let la = files(&a);
            assert!(la.len() > 3, "seed {seed}: the leader rolled: {la:?}");
            assert_same_files(&a, &b, seed);
        }
    });
}

/// A follower replica that starts leading (`stop_following`) takes no shipped batch after it returns: the queued
/// ones are answered `Mismatch` and change nothing, the one being written (if any) is written first, and the log's
/// end moves no more; one that follows again (`start_following`) takes the next batch.
#[test]
fn a_replica_that_starts_leading_refuses_queued_and_new_shipped_batches() {
    run(async {
        // The stop comes before the writer task ran, then after it took the queued batches.
        for yield_first in [false, true] {
            let (_a, _b, sa, sb) = two_disks();
            let (lj, leader, shipped) = leader(&sa).await;
            let (fj, follower) = open(&sb).await;
            let mut rng = Rng(5);
            while shipped.borrow().len() < 5 {
                produce(&leader, &mut rng, 2).await;
            }
            let batches = std::mem::take(&mut *shipped.borrow_mut());
            let mut waiting = Vec::new();
            for (head, frames) in &batches[..3] {
                let mut f = Box::pin(follower.apply_shipped(head, frames));
                assert!(futures_lite::future::poll_once(&mut f).await.is_none());
                waiting.push(f);
            }
            if yield_first {
                // The writer task picks them up (consecutive queued batches go in one write): they land.
                futures_lite::future::yield_now().await;
            }
            follower.stop_following().await;
            let end = follower.end_offset();
            let mut applied = 0;
            for (i, f) in waiting.into_iter().enumerate() {
                match f.await {
                    Ok(()) => {
                        assert_eq!(i, applied, "only a prefix is applied");
                        applied += 1;
                    }
                    Err(FollowError::Mismatch(why)) => assert!(why.contains("leads"), "{why}"),
                    Err(e) => panic!("batch {i}: {e:?}"),
                }
            }
            if !yield_first {
                assert_eq!(applied, 0, "a batch queued before the stop was applied");
            }
            let expected = batches[..applied]
                .last()
                .map_or(0, |(h, _)| h.first_offset + u64::from(h.count));
            assert_eq!(end, expected);
            let (head, frames) = &batches[applied];
            assert!(matches!(
                follower.apply_shipped(head, frames).await,
                Err(FollowError::Mismatch(_))
            ));
            for _ in 0..10 {
                futures_lite::future::yield_now().await;
            }
            assert_eq!(
                follower.end_offset(),
                end,
                "the end moved after stop_following"
            );
            // Following again: the batches apply from where the log stands.
            follower.start_following();
            for (head, frames) in &batches[applied..] {
                follower
                    .apply_shipped(head, frames)
                    .await
                    .expect("a follower again takes the next batch");
            }
            leader.close().await;
            follower.close().await;
            lj.close().await;
            fj.close().await;
        }
    });
}

/// Truncation by epoch: a follower whose log ran past the leader's with records of its own (an old leader's
/// unacknowledged tail, spanning segments) cuts it where the two diverge, durably: neither a process crash (the
/// journal's replay) nor a power cut brings the cut records back; then, caught up from the leader's log, it holds
/// the leader's segments byte for byte.
#[test]
fn a_diverged_tail_cut_never_comes_back_and_the_log_then_holds_the_leaders_bytes() {
    run(async {
        // (seeds whose cut lands inside a segment and a crash follows; seeds whose cut removes segments)
        let (mut inside, mut removing) = (0, 0);
        for seed in 1..=12u64 {
            let (a, b, sa, sb) = two_disks();
            let (lj, leader, shipped) = leader(&sa).await;
            let (_fj, follower) = open(&sb).await;
            let mut rng = Rng(seed * 0x6c8e_9cf5_7093_2bd5);
            // A common prefix, shipped.
            let rounds = 2 + rng.below(6) as usize;
            produce(&leader, &mut rng, rounds).await;
            apply_all(&follower, &shipped).await;
            let common = follower.end_offset();
            assert_eq!(common, leader.end_offset());
            // The follower's own tail (it led, and nobody else took these), then the leader's new records.
            let rounds = 1 + rng.below(8) as usize;
            produce(&follower, &mut rng, rounds).await;
            let rounds = 3 + rng.below(6) as usize;
            produce(&leader, &mut rng, rounds).await;
            shipped.borrow_mut().clear();
            let diverged_end = follower.end_offset();
            assert!(diverged_end > common);
            let segments = |sim: &Sim| {
                files(sim)
                    .iter()
                    .filter(|f| f.0.extension().is_some_and(|e| e == "log"))
                    .count()
            };
            let before = segments(&b);
            let cut = follower
                .truncate_diverged(common)
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
            assert_eq!(
                (cut, follower.end_offset()),
                (common, common),
                "seed {seed}"
            );
            removing += usize::from(segments(&b) < before);
            let base = files(&b)
                .iter()
                .filter_map(|f| f.0.file_stem()?.to_str()?.parse::<u64>().ok())
                .max();
            inside += usize::from(seed % 3 != 0 && base.is_some_and(|base| base < common));
            // Nothing of the cut tail is readable.
            assert!(matches!(
                follower.read_for_follower(common, u64::MAX, 4096).await,
                Ok(None)
            ));
            // Half the seeds: a process crash or a power cut right after the cut, the journal replayed, reopened.
            let (fj, follower, b) = match seed % 3 {
                0 => (_fj, follower, b),
                crash => {
                    let disk = if crash == 1 {
                        b.process_crash()
                    } else {
                        b.power_cut(|_, _| 0)
                    };
                    let (fj, reopened) = restart(&disk).await;
                    assert_eq!(
                        reopened.end_offset(),
                        common,
                        "seed {seed}: the cut tail came back after a crash"
                    );
                    (fj, reopened, disk)
                }
            };
            while let Ok(Some((head, frames))) = leader
                .read_for_follower(follower.end_offset(), u64::MAX, 4096)
                .await
            {
                follower
                    .apply_shipped(&head, &frames)
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
            }
            assert_eq!(follower.end_offset(), leader.end_offset(), "seed {seed}");
            for (log, journal) in [(&leader, &lj), (&follower, &fj)] {
                log.close().await;
                journal.close().await;
            }
            assert_same_files(&a, &b, seed);
        }
        assert!(
            inside >= 2 && removing >= 2,
            "cuts inside a segment before a crash: {inside}; cuts that removed segments: {removing}"
        );
    });
}

/// A cut never goes below the log's start, nor to a frame lost to damage; at or past the end it changes nothing.
#[test]
fn a_cut_at_or_past_the_end_changes_nothing() {
    run(async {
        let (_a, _b, _sa, sb) = two_disks();
        let (_fj, follower) = open(&sb).await;
        let mut rng = Rng(7);
        produce(&follower, &mut rng, 3).await;
        let end = follower.end_offset();
        assert_eq!(follower.truncate_diverged(end).await.ok(), Some(end));
        assert_eq!(follower.truncate_diverged(end + 5).await.ok(), Some(end));
        assert_eq!(follower.end_offset(), end);
        assert_eq!(follower.truncate_diverged(0).await.ok(), Some(0));
        assert_eq!(follower.end_offset(), 0);
    });
}

/// A newer leadership's fence (its round raised the replica's floor): batches of older leaderships still queued
/// for the writer are refused at their turn, unwritten, so the end a probe reads after `ships_settled` does not
/// move under it by an old leader's records; the newer leadership's own batches apply.
#[test]
fn batches_of_an_older_leadership_queued_before_a_fence_are_refused_at_their_turn() {
    run(async {
        let (_a, _b, sa, sb) = two_disks();
        let (_lj, leader, shipped) = leader(&sa).await;
        let (_fj, follower) = open(&sb).await;
        let mut rng = Rng(11);
        produce(&leader, &mut rng, 3).await;
        let batches = std::mem::take(&mut *shipped.borrow_mut());
        assert!(batches.len() >= 2);
        // The first batch of epoch 4 applies; the rest are queued (polled once) before the writer runs.
        let (head, frames) = &batches[0];
        follower
            .apply_shipped_of(4, head, frames)
            .await
            .expect("applies");
        let end = follower.end_offset();
        let mut waiting = Vec::new();
        for (head, frames) in &batches[1..] {
            let mut f = Box::pin(follower.apply_shipped_of(4, head, frames));
            assert!(futures_lite::future::poll_once(&mut f).await.is_none());
            waiting.push(f);
        }
        follower.fence_ships(5);
        follower.ships_settled().await;
        for f in waiting {
            assert!(matches!(f.await, Err(FollowError::Mismatch(_))));
        }
        assert_eq!(
            follower.end_offset(),
            end,
            "nothing of epoch 4 landed after the fence"
        );
        // The newer leadership ships the same records: they apply.
        let (head, frames) = &batches[1];
        follower
            .apply_shipped_of(5, head, frames)
            .await
            .expect("applies");
        assert!(follower.end_offset() > end);
    });
}

/// A leader deposed while its appends wait behind a stalled sync: the one being written lands, the ones still
/// queued are refused (`NotLeading`) and never written, and a cut then leaves the log where it was cut, whatever
/// the writer does next (found by the node simulation: queued appends landed where a cut diverged tail had been).
#[test]
fn a_deposed_leaders_queued_appends_are_refused_not_written_after_its_cut() {
    run(async {
        let disk = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(disk.clone()));
        let (journal, log) = open(&storage).await;
        log.append(Bytes::from_static(b"before"))
            .await
            .expect("an append");
        disk.hold_syncs();
        let mut writing = Box::pin(log.append(Bytes::from_static(b"being written")));
        assert!(futures_lite::future::poll_once(&mut writing)
            .await
            .is_none());
        // The writer takes it and waits on the held sync.
        for _ in 0..20 {
            futures_lite::future::yield_now().await;
        }
        assert!(futures_lite::future::poll_once(&mut writing)
            .await
            .is_none());
        let mut queued: Vec<_> = (0..3)
            .map(|i| Box::pin(log.append(Bytes::from(format!("queued {i}")))))
            .collect();
        for q in &mut queued {
            assert!(futures_lite::future::poll_once(q).await.is_none());
        }
        log.start_following();
        disk.release_syncs();
        assert_eq!(writing.await.expect("the batch being written lands"), 1);
        for q in queued {
            assert!(
                matches!(q.await, Err(super::super::AppendError::NotLeading)),
                "a queued append of a deposed leader is refused"
            );
        }
        assert_eq!(log.end_offset(), 2, "nothing queued was written");
        assert_eq!(log.truncate_diverged(1).await.expect("a cut"), 1);
        for _ in 0..20 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(log.end_offset(), 1, "nothing lands after the cut");
        log.close().await;
        journal.close().await;
    });
}

/// Whole-segment copy (`docs/replication.md`, step 5): a follower whose log ends below its leader's start (retention
/// removed the segments between on the leader) starts its log anew there (`restart_at`), and runs read back from the
/// leader's sealed segments and then its active one fill it: the same files, byte for byte, and none of its old
/// segments, also after a power cut and the journal's replay (which must not write the old records back).
#[test]
fn a_follower_behind_its_leaders_retention_starts_anew_at_its_start_and_holds_its_segments_byte_for_byte(
) {
    run(async {
        for seed in 1..=5u64 {
            let (a, b, sa, sb) = two_disks();
            let (lj, leader, _shipped) = leader(&sa).await;
            let (fj, follower) = open(&sb).await;
            let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
            produce(&leader, &mut rng, 8).await;
            // The follower holds a prefix (none at all for seed 1), then falls behind for good.
            let held = if seed == 1 {
                0
            } else {
                1 + rng.below(leader.end_offset() - 1)
            };
            while follower.end_offset() < held {
                let (head, frames) = leader
                    .read_for_follower(follower.end_offset(), held, 700)
                    .await
                    .expect("readable")
                    .expect("a run");
                follower
                    .apply_shipped(&head, &frames)
                    .await
                    .expect("applied");
            }
            produce(&leader, &mut rng, 10).await;
            // Retention by the records' times: everything but the active segment is old enough. (Long after the
            // journal's checkpoints, as retention's hours are: the simulated disk syncs a removed file by its name.)
            lj.checkpoint_now().await.expect("checkpointed");
            let start = leader.apply_retention(u64::MAX / 2, 0, u64::MAX).await;
            assert!(
                start > follower.end_offset(),
                "seed {seed}: retention removed what the follower lacks"
            );
            produce(&leader, &mut rng, 12).await;
            let from = follower.end_offset();
            assert!(matches!(
                leader.read_for_follower(from, u64::MAX, 4096).await,
                Err(ReadError::OutOfRetention { start: s }) if s == start
            ));
            // A restart below its end, or at its start, changes nothing.
            assert_eq!(
                follower
                    .restart_at(from.saturating_sub(1), 1)
                    .await
                    .expect("nothing to do"),
                from
            );
            let (mut fj, mut follower) = (fj, follower);
            if seed % 2 == 0 {
                // A restart a crash interrupted: the new segment made, the old ones still there. Recovery reads the
                // gap as lost offsets; the restart done again drops them.
                let path = dir().join(format!("{start:020}.log"));
                sb.open(&path, true).await.expect("created");
                sb.sync_dir(&dir()).await.expect("synced");
                follower.close().await;
                fj.close().await;
                (fj, follower) = restart(&b).await;
                assert_eq!(follower.end_offset(), start, "seed {seed}");
                assert!(follower.start_offset() < start, "seed {seed}");
            }
            // Not for an older leadership than one that fenced this replica since (its round read the end).
            follower.fence_ships(7);
            assert!(matches!(
                follower.restart_at(start, 6).await,
                Err(FollowError::Mismatch(_))
            ));
            assert_eq!(
                follower.restart_at(start, 7).await.expect("restarted"),
                start
            );
            assert_eq!(
                (follower.start_offset(), follower.end_offset()),
                (start, start)
            );
            assert!(follower.read(from.saturating_sub(1)).await.is_err());
            assert_eq!(
                follower.restart_at(start, 7).await.expect("again"),
                start,
                "idempotent"
            );
            let mut sealed_runs = 0;
            while let Ok(Some((head, frames))) = leader
                .read_for_follower(follower.end_offset(), u64::MAX, 1 + rng.below(2000))
                .await
            {
                sealed_runs += usize::from(head.segment_base < leader_active_base(&leader));
                follower
                    .apply_shipped(&head, &frames)
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
            }
            assert!(sealed_runs > 0, "seed {seed}: sealed segments were copied");
            assert_eq!(follower.end_offset(), leader.end_offset(), "seed {seed}");
            // Power cut of the follower (everything was synced): the journal's replay writes nothing old back.
            let b = b.power_cut(|_, _| 0);
            drop(follower);
            drop(fj);
            let (fj, follower) = restart(&b).await;
            assert_eq!(
                (follower.start_offset(), follower.end_offset()),
                (start, leader.end_offset()),
                "seed {seed}"
            );
            for (log, journal) in [(&leader, &lj), (&follower, &fj)] {
                log.close().await;
                journal.close().await;
            }
            assert_same_files(&a, &b, seed);
        }
    });
}

/// The base of a log's active segment.
fn leader_active_base(log: &Log) -> u64 {
    log.state.borrow().segments.last().expect("a segment").base
}

/// `Log::ship_before_sync` on a full journal disk: a batch ships before its sync only with room reserved below the
/// zeros the journal already wrote (`Journal::reserve`), so the full disk refuses only batches that were not shipped
/// (rolled back, `NoSpace`; the next append takes the offset) and never poisons the log, and every batch shipped is
/// durable here. (Without the reservation, the first refused pass was of a batch already shipped: the log refused
/// appends until a restart.)
#[test]
fn on_a_full_journal_disk_a_batch_ships_early_only_with_room_reserved_and_the_log_stays_writable() {
    run(async {
        let disk = Sim::new();
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(disk.clone()));
        let (journal, log, shipped) = leader(&storage).await;
        log.ship_before_sync(true);
        log.append(Bytes::from_static(b"first"))
            .await
            .expect("an append");
        let journal_dir = Path::new("/sim/journal");
        disk.limit_space_under(journal_dir, Some(disk.used_under(journal_dir)));
        let (mut written, mut refused) = (0, 0);
        let mut answered = vec![(0, Bytes::from_static(b"first"))];
        for i in 0..400u64 {
            let before = shipped.borrow().len();
            let end = log.end_offset();
            // Held in its sync: an early batch is shipped before the sync returns.
            disk.hold_syncs();
            let body = Bytes::from(format!("{i:0>200}"));
            let mut writing = Box::pin(log.append(body.clone()));
            let mut early = false;
            let mut done = None;
            for _ in 0..50 {
                done = futures_lite::future::poll_once(&mut writing).await;
                if done.is_some() {
                    break;
                }
                early |= shipped.borrow().len() > before;
                futures_lite::future::yield_now().await;
            }
            disk.release_syncs();
            let done = match done {
                Some(done) => done,
                None => writing.await,
            };
            match done {
                Ok(offset) => {
                    assert_eq!(offset, end);
                    assert!(early, "batch {i} was not shipped before its sync");
                    assert_eq!(shipped.borrow().len(), before + 1);
                    assert_eq!(log.read(offset).await.expect("a read").payload, body);
                    answered.push((offset, body));
                    written += 1;
                }
                Err(e) => {
                    assert!(matches!(e, super::super::AppendError::NoSpace), "{e:?}");
                    assert_eq!(
                        shipped.borrow().len(),
                        before,
                        "batch {i}: refused after it shipped"
                    );
                    assert_eq!(log.end_offset(), end);
                    refused += 1;
                    if refused == 3 {
                        break;
                    }
                }
            }
            assert!(
                !log.is_poisoned(),
                "batch {i}: the full disk poisoned the log"
            );
            assert!(!journal.is_poisoned());
        }
        assert!(
            written > 3 && refused == 3,
            "{written} written, {refused} refused"
        );
        assert_eq!(journal.reserved(), 0);
        // Every batch answered (and shipped) is durable here: after a power cut the journal replays them all, and
        // the refused ones left no trace.
        let cut = disk.power_cut(|_, _| 0);
        let (_j, reopened) = restart(&cut).await;
        assert_eq!(reopened.end_offset(), log.end_offset());
        for (offset, body) in &answered {
            assert_eq!(&reopened.read(*offset).await.expect("a read").payload, body);
        }
        // Space back: the next append takes the next offset, and ships early again.
        disk.limit_space_under(journal_dir, None);
        let end = log.end_offset();
        assert_eq!(
            log.append(Bytes::from_static(b"back"))
                .await
                .expect("space is back"),
            end
        );
        log.close().await;
        journal.close().await;
    });
}

/// On a file system that allocates on overwrite (copy-on-write: btrfs, ZFS), the zeros the journal wrote hold no
/// room, so none is reserved: a leader ships each batch once durable here, whatever `ship_before_sync` says.
#[test]
fn on_a_copy_on_write_file_system_a_leader_ships_each_batch_once_durable() {
    run(async {
        let disk = Sim::new();
        disk.set_copy_on_write(true);
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(disk.clone()));
        let (journal, log, shipped) = leader(&storage).await;
        log.ship_before_sync(true);
        assert!(!journal.reserve(1));
        disk.hold_syncs();
        let mut writing = Box::pin(log.append(Bytes::from_static(b"first")));
        for _ in 0..50 {
            assert!(futures_lite::future::poll_once(&mut writing)
                .await
                .is_none());
            futures_lite::future::yield_now().await;
        }
        assert!(disk.held_syncs() > 0, "the sync is held");
        assert_eq!(shipped.borrow().len(), 0, "shipped before its sync");
        disk.release_syncs();
        assert_eq!(writing.await.expect("an append"), 0);
        assert_eq!(shipped.borrow().len(), 1);
        log.close().await;
        journal.close().await;
    });
}

/// `Log::ship_before_sync`: a leader ships a batch once its frames are written, while its own journal sync is still
/// under way (its followers' syncs overlap its own), and its log's end moves only once the sync returns. A batch
/// shipped early whose journal pass is then refused poisons the log (its offsets are never given to other records in
/// this leadership; a restart leads at a newer epoch); a batch shipped only once durable is rolled back and the next
/// append takes its offset at once.
#[test]
fn a_batch_shipped_before_its_sync_goes_out_while_the_sync_runs_and_one_refused_after_it_poisons_the_log(
) {
    run(async {
        for early in [true, false] {
            let disk = Sim::new();
            let storage: Rc<dyn Storage> = Rc::new(SimStorage(disk.clone()));
            let (journal, log, shipped) = leader(&storage).await;
            log.ship_before_sync(early);
            log.append(Bytes::from_static(b"first"))
                .await
                .expect("an append");
            assert_eq!(shipped.borrow().len(), 1, "early {early}");
            disk.hold_syncs();
            let mut writing = Box::pin(log.append(Bytes::from_static(b"second")));
            for _ in 0..20 {
                assert!(futures_lite::future::poll_once(&mut writing)
                    .await
                    .is_none());
                futures_lite::future::yield_now().await;
            }
            assert!(disk.held_syncs() > 0, "early {early}: the sync is held");
            assert_eq!(
                shipped.borrow().len(),
                if early { 2 } else { 1 },
                "early {early}: shipped while its sync is held"
            );
            assert_eq!(log.end_offset(), 1, "early {early}: not durable yet");
            disk.release_syncs();
            assert_eq!(writing.await.expect("the second lands"), 1);
            assert_eq!(shipped.borrow().len(), 2, "early {early}");
            assert_eq!(log.end_offset(), 2);
            // A journal pass whose write fails (refused, not poisoning the journal).
            disk.fail_writes_under(Path::new("/sim/journal"), libc::EIO, 1);
            assert!(log.append(Bytes::from_static(b"third")).await.is_err());
            assert!(!journal.is_poisoned(), "early {early}: a refused pass");
            assert_eq!(
                shipped.borrow().len(),
                if early { 3 } else { 2 },
                "early {early}: a batch that failed ships only if it shipped first"
            );
            assert_eq!(log.is_poisoned(), early, "early {early}");
            assert_eq!(log.end_offset(), 2);
            let next = log.append(Bytes::from_static(b"fourth")).await;
            if early {
                assert!(
                    matches!(next, Err(super::super::AppendError::Poisoned)),
                    "appends wait for a restart: {next:?}"
                );
            } else {
                assert_eq!(
                    next.expect("lands"),
                    2,
                    "the next append takes the failed batch's offset"
                );
                let read = log.read(2).await.expect("a read");
                assert_eq!(&read.payload[..], b"fourth");
            }
            log.close().await;
            journal.close().await;
        }
    });
}
