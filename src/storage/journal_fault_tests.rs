//! The journal path (fsync `always` and `interval:MS`, the path every produce takes) under storage faults and power
//! cuts, on the simulated disk. Written by the journal-fault tests work; see `fault_tests` for the log without one.
//!
//! Every test runs partitions' logs on one core's journal as the server does (`Log::open_with` and a
//! `JournalLink`), and restarts them as the server does: `journal::replay` over what the cut left, then a new
//! journal and the logs opened again. What they check: an append is answered only once its journal pass is synced;
//! a failed journal sync is never an acknowledgement and stops the core's appends until a restart; no power cut, at
//! any moment and with any torn tail, loses an acknowledged append (under `interval:MS`, only appends acknowledged
//! since the last completed sync); a refused write leaves no trace and no hole; a failed read is an error; a device
//! that lies about its syncs never makes a restart fail or hand out a wrong record.

use super::backend::Storage;
use super::journal::{self, Journal, JournalOptions};
use super::log::{AppendError, JournalLink, Log, LogOptions, ReadAhead, ReadError};
use super::sim::{Sim, SimStorage};
use super::FsyncPolicy;
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

fn journal_dir() -> &'static Path {
    Path::new("/sim/journal")
}

fn partition_dir(partition: u32) -> PathBuf {
    Path::new("/sim/topics/t").join(partition.to_string())
}

use super::fault_tests::{clock, run, storage, Rng};

/// How one core's journal and its partitions are set up.
#[derive(Clone, Copy, Debug)]
struct Setup {
    fsync: FsyncPolicy,
    /// The journal rotates (and checkpoints the old file) past this many bytes.
    file_bytes: u64,
    commit_delay_us: u64,
    write_behind_bytes: u32,
    segment_bytes: u64,
    tail_cache_bytes: u32,
    partitions: u32,
}

const SETUP: Setup = Setup {
    fsync: FsyncPolicy::Always,
    file_bytes: 1 << 20,
    commit_delay_us: 0,
    write_behind_bytes: 0,
    segment_bytes: 1 << 20,
    tail_cache_bytes: 0,
    partitions: 1,
};

/// One core as a (re)started server runs it: its journal and its partitions' logs.
struct Node {
    journal: Rc<Journal>,
    logs: Vec<Rc<Log>>,
}

/// Starts a core on `sim` as the server does after a crash: the journal's replay over what the disk holds, then a
/// fresh journal, then the logs.
async fn start(sim: &Rc<Sim>, setup: Setup) -> Node {
    let storage = storage(sim);
    let report = replay(&storage)
        .await
        .expect("the replay at start must succeed");
    assert_eq!(report.failed, 0, "replay: {report:?}");
    open(&storage, setup).await
}

/// The replay of topic `t` (id 1), every group kept.
async fn replay(storage: &Rc<dyn Storage>) -> std::io::Result<journal::ReplayReport> {
    let locate = |name: &str, id: u64, p: u32| (name == "t" && id == 1).then(|| partition_dir(p));
    journal::replay(&**storage, journal_dir(), &locate, &|_, _, _| true).await
}

/// The journal and logs, without a replay (it ran, or must not).
async fn open(storage: &Rc<dyn Storage>, setup: Setup) -> Node {
    let journal = Journal::open(
        storage.clone(),
        clock(),
        journal_dir(),
        0,
        JournalOptions {
            fsync: setup.fsync,
            file_bytes: setup.file_bytes,
            commit_delay_us: setup.commit_delay_us,
        },
        crate::storage::journal::no_frontiers(),
    )
    .await
    .expect("the journal opens");
    let mut logs = Vec::new();
    for partition in 0..setup.partitions {
        let log = Log::open_with(
            storage.clone(),
            clock(),
            &partition_dir(partition),
            LogOptions {
                segment_bytes: setup.segment_bytes,
                max_payload: 1 << 16,
                fsync: setup.fsync,
                tail_cache_bytes: setup.tail_cache_bytes,
                write_behind_bytes: setup.write_behind_bytes,
            },
            Some(JournalLink {
                journal: journal.clone(),
                topic: "t".into(),
                topic_id: 1,
                partition,
            }),
        )
        .await
        .expect("a log opens after a restart");
        logs.push(log);
    }
    Node { journal, logs }
}

/// An acknowledged append.
#[derive(Clone, Debug)]
struct Acked {
    partition: u32,
    offset: u64,
    body: Bytes,
    /// The journal's completed syncs when the appender saw the answer (interval mode: a sync counted two later
    /// began after the answer, so it covers the record).
    syncs: u64,
}

/// What was appended to one incarnation of a node.
#[derive(Clone, Default)]
struct Book {
    /// Every append tried, by body: (partition, writer, seq).
    tried: HashMap<Bytes, (u32, usize, usize)>,
    /// The acknowledged appends, in the order of their answers.
    acked: Vec<Acked>,
    /// The appends answered with an error, by body.
    refused: HashMap<Bytes, AppendError>,
}

type SharedBook = Rc<RefCell<Book>>;

fn body_of(round: usize, partition: u32, writer: usize, seq: usize) -> Bytes {
    Bytes::from(format!(
        "r{round}-p{partition}-w{writer}-m{seq}-{}",
        "x".repeat(seq * 7 % 61)
    ))
}

/// Appends `body` to `partition` and writes down what happened.
async fn append(
    node: &Node,
    book: &SharedBook,
    partition: u32,
    who: (usize, usize),
    body: Bytes,
) -> Result<u64, AppendError> {
    book.borrow_mut()
        .tried
        .insert(body.clone(), (partition, who.0, who.1));
    let log = node.logs[partition as usize].clone();
    let answer = log.append(body.clone()).await;
    let mut b = book.borrow_mut();
    match &answer {
        Ok(offset) => b.acked.push(Acked {
            partition,
            offset: *offset,
            body,
            syncs: node.journal.stats().syncs,
        }),
        Err(e) => {
            b.refused.insert(body, e.clone());
        }
    }
    answer
}

/// A task appending `count` records, one after the other, to `partition` as writer `writer`.
fn spawn_writer(
    node: &Rc<Node>,
    book: &SharedBook,
    round: usize,
    partition: u32,
    writer: usize,
    count: usize,
) -> glommio::Task<()> {
    paced_writer(node, book, round, partition, writer, count, 0)
}

/// `spawn_writer`, pausing `pause_us` after each answer (under `interval:MS`, where an append does not wait for a
/// sync, so that the timer's syncs fall between the appends).
fn paced_writer(
    node: &Rc<Node>,
    book: &SharedBook,
    round: usize,
    partition: u32,
    writer: usize,
    count: usize,
    pause_us: u64,
) -> glommio::Task<()> {
    let (node, book) = (node.clone(), book.clone());
    glommio::spawn_local(async move {
        for seq in 0..count {
            let body = body_of(round, partition, writer, seq);
            // Writers of different rounds are different writers.
            let who = (round * 100 + writer, seq);
            let _ = append(&node, &book, partition, who, body).await;
            if pause_us > 0 {
                glommio::timer::sleep(std::time::Duration::from_micros(pause_us)).await;
            }
        }
    })
}

/// What a restarted node must hold.
struct Expect<'a> {
    /// Every append tried on the disk's earlier incarnations (bodies are unique).
    books: &'a [Book],
    /// Appends that must be there, intact at their offsets.
    must: &'a [Acked],
    /// Every offset from the start to the end reads (what survives is a prefix of each partition); else an offset
    /// may read as corrupt (never as another record).
    gapless: bool,
    /// No refused append may be found (a refused write leaves no trace).
    refused_absent: bool,
}

/// Checks a restarted node against `expect`: every record of `must` is there intact at its offset, and every
/// record that can be read was appended to that partition, at the offset it was acknowledged at if it was, at most
/// once, and in its writer's order.
async fn check(node: &Node, expect: &Expect<'_>, what: &str) {
    for a in expect.must {
        match node.logs[a.partition as usize].read(a.offset).await {
            Ok(r) => assert_eq!(
                r.payload, a.body,
                "{what}: partition {} offset {} changed content",
                a.partition, a.offset
            ),
            Err(e) => panic!(
                "{what}: acknowledged partition {} offset {} ({:?}) lost: {e:?}",
                a.partition, a.offset, a.body
            ),
        }
    }
    let mut tried: HashMap<&Bytes, (u32, usize, usize)> = HashMap::new();
    let mut acked_at: HashMap<&Bytes, u64> = HashMap::new();
    for book in expect.books {
        tried.extend(book.tried.iter().map(|(b, t)| (b, *t)));
        acked_at.extend(book.acked.iter().map(|a| (&a.body, a.offset)));
    }
    for (partition, log) in node.logs.iter().enumerate() {
        let mut seen: HashMap<Bytes, u64> = HashMap::new();
        // The newest offset found per writer (and its seq), for the writer's order.
        let mut last: HashMap<(usize, usize), (usize, u64)> = HashMap::new();
        for offset in log.start_offset()..log.end_offset() {
            let record = match log.read(offset).await {
                Ok(record) => record,
                Err(ReadError::Corrupt) if !expect.gapless => continue,
                Err(e) => panic!("{what}: partition {partition} offset {offset} unreadable: {e:?}"),
            };
            let body = record.payload;
            let Some(&(p, writer, seq)) = tried.get(&body) else {
                // Records the test appended after a restart, outside the books.
                assert!(
                    body.starts_with(b"extra-"),
                    "{what}: partition {partition} offset {offset} holds {body:?}, never appended"
                );
                continue;
            };
            assert_eq!(
                p as usize, partition,
                "{what}: {body:?} found in the wrong partition"
            );
            if let Some(&at) = acked_at.get(&body) {
                assert_eq!(
                    at, offset,
                    "{what}: {body:?} acknowledged at {at}, found at {offset}"
                );
            }
            if let Some(earlier) = seen.insert(body.clone(), offset) {
                panic!("{what}: {body:?} found twice, at {earlier} and {offset}");
            }
            if let Some((prev_seq, prev_offset)) = last.insert((p as usize, writer), (seq, offset))
            {
                assert!(
                    prev_seq < seq,
                    "{what}: writer {writer}'s seq {seq} at {offset} after its seq {prev_seq} at {prev_offset}"
                );
            }
            if expect.refused_absent {
                for book in expect.books {
                    assert!(
                        !book.refused.contains_key(&body),
                        "{what}: refused {body:?} ({:?}) found at {offset}",
                        book.refused[&body]
                    );
                }
            }
        }
    }
}

/// A power cut that keeps, per file, none, all or a random torn prefix of what was not synced.
fn torn(rng: &mut Rng) -> impl FnMut(&Path, usize) -> usize {
    let mut rng = Rng(rng.next() | 1);
    move |_, unsynced| match rng.below(3) {
        0 => 0,
        1 => unsynced,
        _ => rng.below(unsynced as u64 + 1) as usize,
    }
}

async fn turns(n: u64) {
    for _ in 0..n {
        futures_lite::future::yield_now().await;
    }
}

/// Yields until `cond` holds (at most `limit` turns, with a short sleep every hundred so a commit delay's timer can
/// fire); whether it does.
async fn until(limit: usize, cond: impl Fn() -> bool) -> bool {
    for turn in 0..limit {
        if cond() {
            return true;
        }
        if turn % 100 == 99 {
            glommio::timer::sleep(std::time::Duration::from_micros(200)).await;
        }
        futures_lite::future::yield_now().await;
    }
    cond()
}

// ---------------------------------------------------------------------------------------------------------------
// The answer waits for the sync.

#[test]
fn an_append_is_not_answered_before_its_journal_pass_is_synced() {
    for write_behind_bytes in [0u32, 4096] {
        run(async move {
            let setup = Setup {
                write_behind_bytes,
                ..SETUP
            };
            let what = format!("write_behind_bytes {write_behind_bytes}");
            let sim = Sim::new();
            let node = Rc::new(start(&sim, setup).await);
            let book: SharedBook = Rc::default();
            // Each answer is durable when it is given: a power cut right after it keeps the record.
            for i in 0..4u64 {
                let body = Bytes::from(format!("answered-{i}"));
                assert_eq!(
                    append(&node, &book, 0, (0, i as usize), body)
                        .await
                        .unwrap(),
                    i
                );
                let at_answer = book.borrow().clone();
                let image = sim.power_cut(|_, _| 0);
                let expect = Expect {
                    books: std::slice::from_ref(&at_answer),
                    must: &at_answer.acked,
                    gapless: true,
                    refused_absent: true,
                };
                check(&start(&image, setup).await, &expect, &what).await;
            }
            // While the journal's sync is in flight the append is neither answered nor readable.
            sim.hold_syncs();
            let answer: Rc<RefCell<Option<Result<u64, AppendError>>>> = Rc::default();
            let task = glommio::spawn_local({
                let (node, book, answer) = (node.clone(), book.clone(), answer.clone());
                async move {
                    let r = append(&node, &book, 0, (0, 4), Bytes::from_static(b"held")).await;
                    *answer.borrow_mut() = Some(r.clone());
                    r
                }
            });
            assert!(
                until(10_000, || sim.held_syncs() > 0 || answer.borrow().is_some()).await,
                "{what}: the append's journal pass never reached its sync"
            );
            turns(500).await;
            assert!(
                answer.borrow().is_none(),
                "{what}: answered {:?} while its journal pass was still syncing",
                answer.borrow()
            );
            assert_eq!(sim.held_syncs(), 1, "{what}: the pass is syncing");
            assert!(
                matches!(node.logs[0].read(4).await, Err(ReadError::NotYet)),
                "{what}: readable before it is durable"
            );
            // A cut now may lose it (it was never acknowledged), and only it.
            let before = book.borrow().clone();
            let image = sim.power_cut(|_, _| 0);
            let expect = Expect {
                books: std::slice::from_ref(&before),
                must: &before.acked,
                gapless: true,
                refused_absent: true,
            };
            check(&start(&image, setup).await, &expect, &what).await;
            // Once the sync is done, it is answered, and a cut keeps it.
            sim.release_syncs();
            assert_eq!(task.await.expect("the held append is answered"), 4);
            let after = book.borrow().clone();
            let image = sim.power_cut(|_, _| 0);
            let expect = Expect {
                books: std::slice::from_ref(&after),
                must: &after.acked,
                gapless: true,
                refused_absent: true,
            };
            let restarted = start(&image, setup).await;
            check(&restarted, &expect, &what).await;
            assert_eq!(restarted.logs[0].end_offset(), 5, "{what}");
        });
    }
}

/// Several appenders on several partitions, a sync held at a random moment: nothing is answered until the pass that
/// carries it is synced, so a cut while the sync is held loses nothing that was answered.
#[test]
fn appends_of_several_partitions_waiting_on_a_held_sync_are_all_unanswered() {
    for seed in 1..=20u64 {
        run(async move {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let setup = Setup {
                partitions: 3,
                write_behind_bytes: rng.pick(&[0, 512, 4096]),
                commit_delay_us: rng.pick(&[0, 0, 100]),
                ..SETUP
            };
            let what = format!("seed {seed} {setup:?}");
            let sim = Sim::new();
            let node = Rc::new(start(&sim, setup).await);
            let book: SharedBook = Rc::default();
            let writers: Vec<_> = (0..3)
                .flat_map(|p| (0..2).map(move |w| (p, w)))
                .map(|(p, w)| spawn_writer(&node, &book, 0, p, w, 15))
                .collect();
            turns(rng.below(30)).await;
            sim.hold_syncs();
            // Answers of passes synced before the hold may still be on their way to their appenders.
            assert!(
                until(10_000, || sim.held_syncs() > 0).await,
                "{what}: no sync was held"
            );
            turns(50).await;
            let answered = book.borrow().acked.len() + book.borrow().refused.len();
            turns(300 + rng.below(300)).await;
            assert_eq!(
                book.borrow().acked.len() + book.borrow().refused.len(),
                answered,
                "{what}: appends answered while every sync was held"
            );
            let at_cut = book.borrow().clone();
            let image = sim.power_cut(|_, _| 0);
            sim.release_syncs();
            for w in writers {
                w.await;
            }
            assert_eq!(book.borrow().acked.len(), 90, "{what}");
            let expect = Expect {
                books: std::slice::from_ref(&at_cut),
                must: &at_cut.acked,
                gapless: true,
                refused_absent: true,
            };
            check(&start(&image, setup).await, &expect, &what).await;
        });
    }
}

/// A stop answers the appends queued when it began and leaves them durable: the journal's close waits for its
/// committer before it syncs the segments its file covers and removes the file. (Not waiting, it took the segments
/// while partition 0's entry still waited behind partition 1's held sync, and the pass written after that was
/// acknowledged from a removed journal file, partition 0's segment never synced: the power cut lost it.)
#[test]
fn the_journals_stop_answers_and_keeps_the_appends_queued_before_it() {
    run(async move {
        let setup = Setup {
            partitions: 2,
            ..SETUP
        };
        let sim = Sim::new();
        let node = Rc::new(start(&sim, setup).await);
        let book: SharedBook = Rc::default();
        sim.hold_syncs();
        let first = spawn_writer(&node, &book, 0, 1, 0, 1);
        assert!(until(10_000, || sim.held_syncs() > 0).await, "no sync held");
        let second = spawn_writer(&node, &book, 0, 0, 0, 1);
        assert!(
            until(10_000, || node.journal.queued() > 0).await,
            "partition 0's entry never queued"
        );
        let stop = glommio::spawn_local({
            let node = node.clone();
            // The journal alone: the server closes its logs first (each waits for its answers), so only a flush
            // tick's frontier entry can be queued there; the journal's own promise is checked here.
            async move { node.journal.close().await }
        });
        turns(200).await;
        sim.release_syncs();
        first.await;
        second.await;
        stop.await;
        assert_eq!(book.borrow().acked.len(), 2, "{:?}", book.borrow().refused);
        let left = storage(&sim).list(journal_dir()).unwrap();
        assert!(left.is_empty(), "a clean stop left {left:?}");
        let at_stop = book.borrow().clone();
        let image = sim.power_cut(|_, _| 0);
        let expect = Expect {
            books: std::slice::from_ref(&at_stop),
            must: &at_stop.acked,
            gapless: true,
            refused_absent: true,
        };
        check(
            &start(&image, setup).await,
            &expect,
            "stop with a queued append",
        )
        .await;
    });
}

// ---------------------------------------------------------------------------------------------------------------
// A failed sync.

#[test]
fn a_failed_journal_sync_is_never_acknowledged_and_refuses_appends_until_restart() {
    for write_behind_bytes in [0u32, 4096] {
        run(async move {
            let setup = Setup {
                write_behind_bytes,
                partitions: 2,
                ..SETUP
            };
            let what = format!("write_behind_bytes {write_behind_bytes}");
            let sim = Sim::new();
            let node = start(&sim, setup).await;
            let book: SharedBook = Rc::default();
            for p in 0..2 {
                append(&node, &book, p, (0, 0), Bytes::from(format!("kept-{p}")))
                    .await
                    .unwrap();
            }
            sim.fail_syncs_under(journal_dir(), libc::EIO, 1);
            let failed = append(&node, &book, 0, (0, 1), Bytes::from_static(b"lost")).await;
            assert!(
                matches!(failed, Err(AppendError::Io(_))),
                "{what}: the append whose journal sync failed was answered {failed:?}"
            );
            assert!(node.journal.is_poisoned(), "{what}");
            assert!(
                !sim.faults_armed(),
                "{what}: the failing sync was not the pass's"
            );
            // Nothing of it is readable, and every later append of the core is refused although the disk works
            // again: a retried fdatasync would report a false success.
            assert_eq!(node.logs[0].end_offset(), 1, "{what}");
            assert!(matches!(node.logs[0].read(1).await, Err(ReadError::NotYet)));
            for (p, body) in [(0, "later-0"), (1, "later-1"), (0, "later-2")] {
                let r = append(&node, &book, p, (0, 2), Bytes::from(body)).await;
                assert!(
                    matches!(r, Err(AppendError::Poisoned)),
                    "{what}: partition {p} answered {r:?} after the failed sync"
                );
                assert!(node.logs[p as usize].is_poisoned());
            }
            // After a power cut: every acknowledged record is there, and nothing of the refused ones (the failed sync
            // dropped their journal pages; their segments were never synced).
            let at_cut = book.borrow().clone();
            let image = sim.power_cut(|_, _| 0);
            let restarted = start(&image, setup).await;
            let expect = Expect {
                books: std::slice::from_ref(&at_cut),
                must: &at_cut.acked,
                gapless: true,
                refused_absent: true,
            };
            check(&restarted, &expect, &what).await;
            for log in &restarted.logs {
                assert_eq!(log.end_offset(), 1, "{what}");
            }
            // The restarted core appends again, at the next offset.
            let again = Rc::new(RefCell::new(Book::default()));
            assert_eq!(
                append(
                    &restarted,
                    &again,
                    0,
                    (9, 0),
                    Bytes::from_static(b"extra-again")
                )
                .await
                .unwrap(),
                1
            );
            // After a process crash instead (the page cache survives, less the pages the failed sync dropped):
            // every acknowledged record is there too; the refused one may be (it was answered with an error, never
            // acknowledged), but only whole and at the offset it was written at.
            let image = sim.process_crash();
            let expect = Expect {
                books: std::slice::from_ref(&at_cut),
                must: &at_cut.acked,
                gapless: true,
                refused_absent: false,
            };
            let restarted = start(&image, setup).await;
            check(&restarted, &expect, &what).await;
            // And a power cut after that restart still has them (the replay made them durable).
            let image = image.power_cut(|_, _| 0);
            check(&start(&image, setup).await, &expect, &what).await;
        });
    }
}

/// A failed fdatasync of a segment at a checkpoint: the journal file that covers it stays (and the journal refuses
/// appends until a restart), and the replay at the next start puts back what the segment lost.
#[test]
fn a_failed_segment_sync_at_a_checkpoint_keeps_the_journal_file_for_the_replay() {
    for write_behind_bytes in [0u32, 4096] {
        run(async move {
            let setup = Setup {
                write_behind_bytes,
                file_bytes: 4096,
                ..SETUP
            };
            let what = format!("write_behind_bytes {write_behind_bytes}");
            let sim = Sim::new();
            let node = start(&sim, setup).await;
            let book: SharedBook = Rc::default();
            sim.fail_syncs_under(&partition_dir(0), libc::EIO, 1);
            for seq in 0..400 {
                let body = body_of(0, 0, 0, seq);
                if append(&node, &book, 0, (0, seq), body).await.is_err() {
                    break;
                }
            }
            assert!(
                node.journal.is_poisoned(),
                "{what}: no checkpoint met the failing segment sync"
            );
            assert_eq!(node.journal.stats().checkpoints, 0, "{what}");
            assert!(
                SimStorage(sim.clone()).list(journal_dir()).unwrap().len() >= 2,
                "{what}: the checkpointed journal file is gone"
            );
            let r = append(&node, &book, 0, (1, 0), Bytes::from_static(b"refused")).await;
            assert!(matches!(r, Err(AppendError::Poisoned)), "{what}: {r:?}");
            let at_cut = book.borrow().clone();
            assert!(at_cut.acked.len() > 10, "{what}");
            let expect = Expect {
                books: std::slice::from_ref(&at_cut),
                must: &at_cut.acked,
                gapless: true,
                refused_absent: false,
            };
            let image = sim.power_cut(|_, _| 0);
            check(&start(&image, setup).await, &expect, &what).await;
        });
    }
}

/// The same failed segment sync, then a restart without a power cut (kill -9: the page cache survives, and still
/// shows the frames the failed sync dropped), then a power cut: Linux wrote nothing of those pages and never will,
/// so the replay at the restart must not take the page cache's copy for a durable one.
#[test]
fn a_restart_after_a_failed_checkpoint_sync_makes_the_dropped_frames_durable_again() {
    for write_behind_bytes in [0u32, 4096] {
        run(async move {
            let setup = Setup {
                write_behind_bytes,
                file_bytes: 4096,
                ..SETUP
            };
            let what = format!("write_behind_bytes {write_behind_bytes}");
            let sim = Sim::new();
            let node = start(&sim, setup).await;
            let book: SharedBook = Rc::default();
            sim.fail_syncs_under(&partition_dir(0), libc::EIO, 1);
            for seq in 0..400 {
                let body = body_of(0, 0, 0, seq);
                if append(&node, &book, 0, (0, seq), body).await.is_err() {
                    break;
                }
            }
            assert!(node.journal.is_poisoned(), "{what}");
            let at_crash = book.borrow().clone();
            let expect = Expect {
                books: std::slice::from_ref(&at_crash),
                must: &at_crash.acked,
                gapless: true,
                refused_absent: false,
            };
            let image = sim.process_crash();
            let restart = format!("{what}, after the kill -9 restart");
            check(&start(&image, setup).await, &expect, &restart).await;
            let image = image.power_cut(|_, _| 0);
            let cut = format!("{what}, after a power cut following that restart");
            check(&start(&image, setup).await, &expect, &cut).await;
        });
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Power cuts at random moments.

/// Several appenders on several partitions of one journal, in two incarnations of the disk: each is cut at a random
/// moment (sometimes while the syncs are held, sometimes after a failed journal sync), with a random torn tail per
/// file, replayed and reopened, and the next incarnation goes on from there.
fn power_cut_sweep(seed: u64, fsync: FsyncPolicy) {
    run(async move {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let setup = Setup {
            fsync,
            file_bytes: rng.pick(&[2048, 4096, 16384, 1 << 20]),
            commit_delay_us: rng.pick(&[0, 0, 0, 50]),
            write_behind_bytes: rng.pick(&[0, 512, 4096]),
            segment_bytes: rng.pick(&[2048, 8192, 1 << 20]),
            tail_cache_bytes: rng.pick(&[0, 1024]),
            partitions: 1 + rng.below(3) as u32,
        };
        let interval = fsync != FsyncPolicy::Always;
        let mut sim = Sim::new();
        let mut node = Rc::new(start(&sim, setup).await);
        let mut books: Vec<Book> = Vec::new();
        let mut must: Vec<Acked> = Vec::new();
        for round in 0..2 {
            let what = format!("seed {seed} round {round} {setup:?}");
            let book: SharedBook = Rc::default();
            let pause_us = if interval { 100 + rng.below(200) } else { 0 };
            let writers: Vec<_> = (0..setup.partitions)
                .flat_map(|p| (0..2).map(move |w| (p, w)))
                .map(|(p, w)| paced_writer(&node, &book, round, p, w, 25, pause_us))
                .collect();
            let cut_at = rng.below(700);
            let hold_at = (rng.below(2) == 0).then(|| rng.below(cut_at + 1));
            let fail_at = (rng.below(3) == 0).then(|| rng.below(cut_at + 1));
            for turn in 0..cut_at {
                if hold_at == Some(turn) {
                    sim.hold_syncs();
                }
                if fail_at == Some(turn) {
                    sim.fail_syncs_under(journal_dir(), libc::EIO, 1);
                }
                if interval && rng.below(10) == 0 {
                    glommio::timer::sleep(std::time::Duration::from_micros(200)).await;
                }
                futures_lite::future::yield_now().await;
            }
            let at_cut = book.borrow().clone();
            let syncs = node.journal.stats().syncs;
            let image = sim.power_cut(torn(&mut rng));
            // The same moment with nothing unsynced on the medium: the strictest cut (a torn tail may happen to keep
            // what a wrongly acknowledged append needed).
            let bare = sim.power_cut(|_, _| 0);
            sim.release_syncs();
            for w in writers {
                w.await;
            }
            must.extend(
                at_cut
                    .acked
                    .iter()
                    .filter(|a| !interval || a.syncs + 2 <= syncs)
                    .cloned(),
            );
            books.push(at_cut);
            let expect = Expect {
                books: &books,
                must: &must,
                gapless: true,
                refused_absent: false,
            };
            check(
                &start(&bare, setup).await,
                &expect,
                &format!("{what}, nothing unsynced kept"),
            )
            .await;
            node = Rc::new(start(&image, setup).await);
            check(&node, &expect, &what).await;
            sim = image;
        }
        // The logs go on from where the cuts left them: offsets stay contiguous.
        let book: SharedBook = Rc::default();
        for p in 0..setup.partitions {
            let end = node.logs[p as usize].end_offset();
            let body = Bytes::from(format!("extra-after-{p}"));
            assert_eq!(
                append(&node, &book, p, (0, 0), body.clone()).await.unwrap(),
                end,
                "seed {seed}"
            );
            assert_eq!(node.logs[p as usize].read(end).await.unwrap().payload, body);
        }
    });
}

#[test]
fn a_power_cut_at_any_moment_loses_no_acknowledged_append_across_restarts() {
    for seed in 1..=150u64 {
        power_cut_sweep(seed, FsyncPolicy::Always);
    }
}

#[test]
fn under_interval_sync_a_power_cut_loses_only_appends_answered_since_the_last_completed_sync() {
    for seed in 1..=60u64 {
        power_cut_sweep(seed, FsyncPolicy::IntervalMs(1));
    }
}

/// `interval:MS`: an append is answered once written, before any sync; `Journal::sync_now` (and the timer) make
/// every answered one durable.
#[test]
fn under_interval_sync_appends_answered_before_a_completed_sync_survive_a_power_cut() {
    for write_behind_bytes in [0u32, 4096] {
        run(async move {
            let setup = Setup {
                fsync: FsyncPolicy::IntervalMs(60_000),
                write_behind_bytes,
                partitions: 2,
                ..SETUP
            };
            let what = format!("write_behind_bytes {write_behind_bytes}");
            let sim = Sim::new();
            let node = start(&sim, setup).await;
            let book: SharedBook = Rc::default();
            // Answered while every sync is held: the interval mode does not wait for one.
            sim.hold_syncs();
            for seq in 0..6 {
                let p = (seq % 2) as u32;
                append(&node, &book, p, (0, seq), body_of(0, p, 0, seq))
                    .await
                    .unwrap();
            }
            let synced = book.borrow().acked.clone();
            let sync = glommio::spawn_local({
                let journal = node.journal.clone();
                async move { journal.sync_now().await }
            });
            assert!(until(10_000, || sim.held_syncs() > 0).await, "{what}");
            // Appends answered while the sync runs need not survive a cut; the ones before it must, once it is done.
            for seq in 6..9 {
                append(&node, &book, 0, (0, seq), body_of(0, 0, 0, seq))
                    .await
                    .unwrap();
            }
            sim.release_syncs();
            sync.await.expect("sync_now");
            let at_cut = book.borrow().clone();
            let expect = Expect {
                books: std::slice::from_ref(&at_cut),
                must: &synced,
                gapless: true,
                refused_absent: true,
            };
            check(
                &start(&sim.power_cut(|_, _| 0), setup).await,
                &expect,
                &what,
            )
            .await;
            // A second sync covers the rest.
            node.journal.sync_now().await.expect("sync_now");
            let expect = Expect {
                must: &at_cut.acked,
                ..expect
            };
            check(
                &start(&sim.power_cut(|_, _| 0), setup).await,
                &expect,
                &what,
            )
            .await;
        });
    }
}

/// `interval:MS` with nothing calling `sync_now`: the journal's own timer syncs what was answered within about
/// its interval, so a power cut after that keeps every answered append.
#[test]
fn under_interval_sync_the_timer_alone_makes_answered_appends_durable() {
    run(async move {
        let setup = Setup {
            fsync: FsyncPolicy::IntervalMs(5),
            partitions: 2,
            ..SETUP
        };
        let sim = Sim::new();
        let node = start(&sim, setup).await;
        let book: SharedBook = Rc::default();
        for seq in 0..6 {
            let p = (seq % 2) as u32;
            append(&node, &book, p, (0, seq), body_of(0, p, 0, seq))
                .await
                .unwrap();
        }
        // Bytes of the journal a power cut would lose now.
        let unsynced = || {
            let mut total = 0;
            sim.power_cut(|path, unsynced| {
                if path.starts_with(journal_dir()) {
                    total += unsynced;
                }
                0
            });
            total
        };
        let mut waited_ms = 0;
        while unsynced() > 0 {
            assert!(
                waited_ms < 5_000,
                "the interval timer never synced the journal ({} bytes unsynced after {waited_ms} ms)",
                unsynced()
            );
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            waited_ms += 1;
        }
        let at_cut = book.borrow().clone();
        let expect = Expect {
            books: std::slice::from_ref(&at_cut),
            must: &at_cut.acked,
            gapless: true,
            refused_absent: true,
        };
        check(
            &start(&sim.power_cut(|_, _| 0), setup).await,
            &expect,
            "interval timer",
        )
        .await;
    });
}

// ---------------------------------------------------------------------------------------------------------------
// Refused writes.

#[derive(Clone, Copy, Debug)]
enum Target {
    Journal,
    Segment,
}

/// A write of the journal or of a segment fails with EIO or ENOSPC: that append is refused with the matching
/// error, nothing of it is acknowledged or readable, the next append takes the same offset, the other partitions
/// and the journal go on, and a cut (torn or not) after more appends keeps every acknowledged one and none of the
/// refused ones.
#[test]
fn a_refused_journal_or_segment_write_acknowledges_nothing_leaves_no_hole_and_the_log_goes_on() {
    for target in [Target::Journal, Target::Segment] {
        for errno in [libc::EIO, libc::ENOSPC] {
            for write_behind_bytes in [0u32, 1024] {
                refused_write(target, errno, write_behind_bytes);
            }
        }
    }
}

fn refused_write(target: Target, errno: i32, write_behind_bytes: u32) {
    run(async move {
        let setup = Setup {
            write_behind_bytes,
            partitions: 2,
            tail_cache_bytes: 1024,
            ..SETUP
        };
        let what = format!("{target:?} errno {errno} write_behind_bytes {write_behind_bytes}");
        let sim = Sim::new();
        let node = start(&sim, setup).await;
        let book: SharedBook = Rc::default();
        let mut seq = 0;
        let mut next = |p: u32| {
            seq += 1;
            (body_of(0, p, 0, seq), (0, seq))
        };
        for _ in 0..3 {
            for p in 0..2 {
                let (body, who) = next(p);
                append(&node, &book, p, who, body).await.unwrap();
            }
        }
        let dir = match target {
            Target::Journal => journal_dir().to_path_buf(),
            Target::Segment => partition_dir(0),
        };
        sim.fail_writes_under(&dir, errno, 1);
        // With write-behind, a segment write happens only when the buffer is flushed: append until one fails.
        let mut refusals = 0;
        for _ in 0..200 {
            let expected = node.logs[0].end_offset();
            let (body, who) = next(0);
            match append(&node, &book, 0, who, body.clone()).await {
                Ok(offset) => assert_eq!(offset, expected, "{what}"),
                Err(e) => {
                    refusals += 1;
                    let kind_ok = match errno {
                        libc::ENOSPC => matches!(e, AppendError::NoSpace),
                        _ => matches!(e, AppendError::Io(_)),
                    };
                    assert!(kind_ok, "{what}: refused with {e:?}");
                    assert_eq!(node.logs[0].end_offset(), expected, "{what}");
                    assert!(matches!(
                        node.logs[0].read(expected).await,
                        Err(ReadError::NotYet)
                    ));
                    break;
                }
            }
        }
        assert_eq!(refusals, 1, "{what}: the failing write was never met");
        assert!(!sim.faults_armed(), "{what}");
        assert!(
            !node.journal.is_poisoned(),
            "{what}: a refused write poisoned the journal"
        );
        assert!(!node.logs[0].is_poisoned(), "{what}");
        // The next appends take the next offsets, on both partitions, and read back (from the tail too).
        for _ in 0..3 {
            for p in 0..2 {
                let log = &node.logs[p as usize];
                let expected = log.end_offset();
                let (body, who) = next(p);
                assert_eq!(
                    append(&node, &book, p, who, body.clone()).await.unwrap(),
                    expected,
                    "{what}: a hole after the refused write"
                );
                assert_eq!(log.read(expected).await.unwrap().payload, body, "{what}");
            }
        }
        let after = book.borrow().clone();
        let expect = Expect {
            books: std::slice::from_ref(&after),
            must: &after.acked,
            gapless: true,
            refused_absent: true,
        };
        for o in 0..node.logs[0].end_offset() {
            let acked = after
                .acked
                .iter()
                .find(|a| a.partition == 0 && a.offset == o);
            let read = node.logs[0].read(o).await.unwrap().payload;
            assert_eq!(Some(&read), acked.map(|a| &a.body), "{what}: offset {o}");
        }
        let mut rng = Rng(errno as u64 * 31 + write_behind_bytes as u64 + 7);
        for image in [
            sim.power_cut(|_, _| 0),
            sim.power_cut(|_, unsynced| unsynced),
            sim.power_cut(torn(&mut rng)),
            sim.process_crash(),
        ] {
            let restarted = start(&image, setup).await;
            check(&restarted, &expect, &what).await;
            for p in 0..2u32 {
                assert_eq!(
                    restarted.logs[p as usize].end_offset(),
                    after.acked.iter().filter(|a| a.partition == p).count() as u64,
                    "{what}: partition {p}"
                );
            }
        }
    });
}

/// A journal write fails and so does the write that zeroes what it may have left: the journal cannot vouch for its
/// file any more and refuses every append until a restart; the restart finds every acknowledged record.
#[test]
fn a_journal_write_whose_scrub_fails_too_refuses_appends_until_restart() {
    run(async {
        let setup = Setup {
            partitions: 2,
            ..SETUP
        };
        let sim = Sim::new();
        let node = start(&sim, setup).await;
        let book: SharedBook = Rc::default();
        for p in 0..2 {
            append(&node, &book, p, (0, 0), Bytes::from(format!("kept-{p}")))
                .await
                .unwrap();
        }
        sim.fail_writes_under(journal_dir(), libc::EIO, 2);
        let r = append(&node, &book, 0, (0, 1), Bytes::from_static(b"refused")).await;
        assert!(matches!(r, Err(AppendError::Io(_))), "{r:?}");
        assert!(node.journal.is_poisoned());
        assert!(
            !sim.faults_armed(),
            "the scrub did not meet the second failure"
        );
        for p in 0..2 {
            let r = append(&node, &book, p, (0, 2), Bytes::from(format!("later-{p}"))).await;
            assert!(matches!(r, Err(AppendError::Poisoned)), "{r:?}");
        }
        let at_cut = book.borrow().clone();
        let expect = Expect {
            books: std::slice::from_ref(&at_cut),
            must: &at_cut.acked,
            gapless: true,
            refused_absent: false,
        };
        for image in [sim.power_cut(|_, unsynced| unsynced), sim.process_crash()] {
            let restarted = start(&image, setup).await;
            check(&restarted, &expect, "scrub failed").await;
            assert!(append(
                &restarted,
                &Rc::default(),
                1,
                (0, 0),
                Bytes::from_static(b"extra-1")
            )
            .await
            .is_ok());
        }
    });
}

// ---------------------------------------------------------------------------------------------------------------
// Failed reads.

#[test]
fn an_eio_on_a_segment_read_is_an_error_never_a_panic_and_the_data_stays_intact() {
    for write_behind_bytes in [0u32, 4096] {
        run(async move {
            let setup = Setup {
                write_behind_bytes,
                segment_bytes: 4096,
                ..SETUP
            };
            let what = format!("write_behind_bytes {write_behind_bytes}");
            let sim = Sim::new();
            let node = start(&sim, setup).await;
            let book: SharedBook = Rc::default();
            for seq in 0..120 {
                append(&node, &book, 0, (0, seq), body_of(0, 0, 0, seq))
                    .await
                    .unwrap();
            }
            let acked = book.borrow().acked.clone();
            let log = &node.logs[0];
            sim.fail_reads_under(&partition_dir(0), libc::EIO, 5);
            let mut failed = 0;
            for a in &acked {
                match log.read(a.offset).await {
                    Ok(r) => assert_eq!(r.payload, a.body, "{what}: offset {}", a.offset),
                    Err(ReadError::Io(e)) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}");
                        failed += 1;
                    }
                    Err(e) => panic!("{what}: offset {} read as {e:?}", a.offset),
                }
            }
            assert_eq!(failed, 5, "{what}: the failing reads were not all met");
            // Appends go on while reads fail, and reads ahead meet the fault as single reads do.
            sim.fail_reads_under(&partition_dir(0), libc::EIO, 2);
            for seq in 120..130 {
                append(&node, &book, 0, (0, seq), body_of(0, 0, 0, seq))
                    .await
                    .unwrap();
            }
            let acked = book.borrow().acked.clone();
            let mut ahead = ReadAhead::default();
            let end = log.end_offset();
            for a in &acked {
                match log.read_ahead(a.offset, end, &mut ahead).await {
                    Ok(r) => assert_eq!(r.payload, a.body, "{what}: offset {}", a.offset),
                    Err(ReadError::Io(_)) => ahead = ReadAhead::default(),
                    Err(e) => panic!("{what}: offset {} read ahead as {e:?}", a.offset),
                }
            }
            // Once the device reads again, everything is there, and after a restart too.
            assert!(sim.reads_to_fail() == 0, "{what}");
            for a in &acked {
                assert_eq!(log.read(a.offset).await.unwrap().payload, a.body, "{what}");
            }
            assert!(!log.is_poisoned(), "{what}");
            let expect = Expect {
                books: &[book.borrow().clone()],
                must: &acked,
                gapless: true,
                refused_absent: true,
            };
            check(
                &start(&sim.power_cut(|_, _| 0), setup).await,
                &expect,
                &what,
            )
            .await;
        });
    }
}

/// A node of two partitions on `sim` that acknowledged eight appends, alternating between them (the node is
/// returned so that nothing closes before the caller cuts the power).
async fn eight_appends_over_two_partitions(sim: &Rc<Sim>) -> (Setup, Node, SharedBook) {
    let setup = Setup {
        partitions: 2,
        ..SETUP
    };
    let node = start(sim, setup).await;
    let book: SharedBook = Rc::default();
    for seq in 0..8 {
        let p = (seq % 2) as u32;
        append(&node, &book, p, (0, seq), body_of(0, p, 0, seq))
            .await
            .unwrap();
    }
    (setup, node, book)
}

/// The replay at start compares each journal entry with its segment and writes back what the segment lacks. A
/// segment read, write or sync that fails there must not cost an acknowledged record: the replay fails (the server
/// does not start, the journal stays for the next try), or it writes the entry back anyway.
fn replay_meets_a_failing_segment(fault: &'static str) {
    {
        run(async move {
            let sim = Sim::new();
            let (setup, _node, book) = eight_appends_over_two_partitions(&sim).await;
            let at_cut = book.borrow().clone();
            let expect = Expect {
                books: std::slice::from_ref(&at_cut),
                must: &at_cut.acked,
                gapless: true,
                refused_absent: true,
            };
            // The segments lose everything they did not sync; the journal keeps its synced entries.
            let image = sim.power_cut(|_, _| 0);
            match fault {
                "read" => image.fail_reads_under(&partition_dir(0), libc::EIO, 1),
                "open" => image.fail_opens_under(&partition_dir(0), libc::EMFILE, 1),
                "write" => image.fail_writes_under(&partition_dir(0), libc::EIO, 1),
                _ => image.fail_syncs_under(&partition_dir(0), libc::EIO, 1),
            }
            let first = replay(&storage(&image)).await;
            let what = format!("a failing segment {fault} at replay ({first:?})");
            // The server would stop here on an error, or go on after a report with failures: a second start (a
            // process restart: the page cache stays) must find every acknowledged record, and so must a power cut
            // after it.
            let image = image.process_crash();
            let restarted = start(&image, setup).await;
            check(&restarted, &expect, &format!("{what}, after a restart")).await;
            let what = format!("{what}, after a power cut following the restart");
            check(
                &start(&image.power_cut(|_, _| 0), setup).await,
                &expect,
                &what,
            )
            .await;
        });
    }
}

#[test]
fn a_replay_whose_segment_read_fails_loses_no_acknowledged_record() {
    replay_meets_a_failing_segment("read");
}

/// A segment that exists but cannot be opened at replay (here EMFILE) keeps the journal: its entries are not
/// passed over as if the segment were gone.
#[test]
fn a_replay_that_cannot_open_a_segment_loses_no_acknowledged_record() {
    replay_meets_a_failing_segment("open");
}

/// A segment that is gone (retention or a deleted topic removed it) has nothing to restore: the replay passes its
/// entries over, counts them, and succeeds (a start must not fail for it).
#[test]
fn a_replay_passes_over_the_entries_of_a_segment_that_is_gone() {
    run(async move {
        let sim = Sim::new();
        let _started = eight_appends_over_two_partitions(&sim).await;
        let image = storage(&sim.power_cut(|_, _| 0));
        for name in image.list(&partition_dir(0)).unwrap() {
            if name.ends_with(".log") {
                image.remove(&partition_dir(0).join(name)).await.unwrap();
            }
        }
        let report = replay(&image)
            .await
            .expect("a segment that is gone is passed over");
        assert_eq!((report.entries, report.skipped), (8, 4), "{report:?}");
    });
}

/// Something else where a segment should be (a directory: `EISDIR`, or a file where its directory should be:
/// `ENOTDIR`): its data is gone whatever the replay does, so the replay passes its entries over as for a segment
/// that is gone, and the start goes on (the partition meets the same error when it opens, and its topic is
/// quarantined: `tests/integrity.rs`); it is not an open error that keeps the journal and fails the start.
#[test]
fn a_replay_passes_over_the_entries_of_a_segment_with_something_else_in_its_place() {
    for errno in [libc::EISDIR, libc::ENOTDIR] {
        run(async move {
            let sim = Sim::new();
            let _started = eight_appends_over_two_partitions(&sim).await;
            let image = sim.power_cut(|_, _| 0);
            image.fail_opens_under(&partition_dir(0), errno, 100);
            let report = replay(&storage(&image))
                .await
                .unwrap_or_else(|e| panic!("errno {errno}: the replay failed: {e:?}"));
            assert_eq!(
                (report.entries, report.skipped),
                (8, 4),
                "errno {errno}: {report:?}"
            );
        });
    }
}

#[test]
fn a_replay_whose_segment_write_fails_loses_no_acknowledged_record() {
    replay_meets_a_failing_segment("write");
}

#[test]
fn a_replay_whose_segment_sync_fails_loses_no_acknowledged_record() {
    replay_meets_a_failing_segment("sync");
}

// ---------------------------------------------------------------------------------------------------------------
// A device that lies.

/// Syncs that report success and make nothing durable, then a power cut: acknowledged records may be lost (the
/// device lied), but the replay and the reopen succeed, and no record is ever read back at an offset it was not
/// written at, twice, out of its writer's order, or damaged.
#[test]
fn lying_syncs_then_a_power_cut_never_fail_a_restart_nor_return_a_wrong_record() {
    for seed in 1..=60u64 {
        run(async move {
            let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
            let setup = Setup {
                fsync: rng.pick(&[
                    FsyncPolicy::Always,
                    FsyncPolicy::Always,
                    FsyncPolicy::IntervalMs(1),
                ]),
                file_bytes: rng.pick(&[2048, 4096, 1 << 20]),
                write_behind_bytes: rng.pick(&[0, 512, 4096]),
                segment_bytes: rng.pick(&[2048, 8192, 1 << 20]),
                tail_cache_bytes: rng.pick(&[0, 1024]),
                partitions: 1 + rng.below(3) as u32,
                ..SETUP
            };
            let what = format!("seed {seed} {setup:?}");
            let sim = Sim::new();
            let node = Rc::new(start(&sim, setup).await);
            let book: SharedBook = Rc::default();
            let writers: Vec<_> = (0..setup.partitions)
                .flat_map(|p| (0..2).map(move |w| (p, w)))
                .map(|(p, w)| spawn_writer(&node, &book, 0, p, w, 25))
                .collect();
            let lie_at = rng.below(200);
            let cut_at = lie_at + rng.below(600);
            for turn in 0..cut_at {
                if turn == lie_at {
                    sim.lie_syncs(1 + rng.below(1000) as u32);
                }
                futures_lite::future::yield_now().await;
            }
            let at_cut = book.borrow().clone();
            let image = sim.power_cut(torn(&mut rng));
            for w in writers {
                w.await;
            }
            let restarted = start(&image, setup).await;
            let expect = Expect {
                books: std::slice::from_ref(&at_cut),
                must: &[],
                gapless: false,
                refused_absent: false,
            };
            check(&restarted, &expect, &what).await;
            // The restarted core appends again after whatever survived.
            for p in 0..setup.partitions {
                let log = &restarted.logs[p as usize];
                let end = log.end_offset();
                let body = Bytes::from(format!("extra-{p}"));
                assert_eq!(
                    append(&restarted, &Rc::default(), p, (0, 0), body.clone())
                        .await
                        .unwrap(),
                    end,
                    "{what}"
                );
                assert_eq!(log.read(end).await.unwrap().payload, body, "{what}");
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------------------------
// A full disk, and the journal file's size.

/// The journal's file system fills up: the pass that needs more zeros ahead is refused (`NoSpace`) with nothing of
/// it in the journal, and the journal is not poisoned, because its entries land only in blocks the zeros already
/// allocated (so neither an entry write nor the scrub after one meets the full disk); once space is back the next
/// append takes the next offset, and a restart finds every acknowledged append and no refused one.
#[test]
fn a_full_journal_disk_refuses_a_pass_without_poisoning_and_appends_resume_once_space_is_back() {
    run(async {
        let setup = Setup {
            file_bytes: 64 << 10,
            ..SETUP
        };
        let sim = Sim::new();
        let node = start(&sim, setup).await;
        let book: SharedBook = Rc::default();
        append(&node, &book, 0, (0, 0), body_of(0, 0, 0, 0))
            .await
            .unwrap();
        // The journal's disk is full now: only the zeros already ahead of the position are left to write into.
        sim.limit_space_under(journal_dir(), Some(sim.used_under(journal_dir())));
        let mut refused = None;
        for seq in 1..2000 {
            let expected = node.logs[0].end_offset();
            match append(&node, &book, 0, (0, seq), body_of(0, 0, 0, seq)).await {
                Ok(offset) => assert_eq!(offset, expected),
                Err(e) => {
                    refused = Some((seq, e, expected));
                    break;
                }
            }
        }
        let (seq, e, expected) = refused.expect("the full disk was never met");
        assert!(
            seq > 10,
            "refused after {seq} appends: the zeros ahead were not used"
        );
        assert!(matches!(e, AppendError::NoSpace), "{e:?}");
        assert!(
            !node.journal.is_poisoned(),
            "a full disk poisoned the journal (an entry write or its scrub met it)"
        );
        assert!(!node.logs[0].is_poisoned());
        assert_eq!(node.logs[0].end_offset(), expected);
        // Still full: refused again, the same way.
        let again = append(&node, &book, 0, (0, 5000), body_of(0, 0, 0, 5000)).await;
        assert!(matches!(again, Err(AppendError::NoSpace)), "{again:?}");
        assert!(!node.journal.is_poisoned());
        sim.limit_space_under(journal_dir(), None);
        for seq in 5001..5004 {
            let expected = node.logs[0].end_offset();
            let body = body_of(0, 0, 0, seq);
            let offset = append(&node, &book, 0, (0, seq), body.clone()).await;
            assert_eq!(
                offset.expect("space is back"),
                expected,
                "space is back: the next offset, no hole"
            );
            assert_eq!(node.logs[0].read(expected).await.unwrap().payload, body);
        }
        let after = book.borrow().clone();
        assert_eq!(after.refused.len(), 2);
        let expect = Expect {
            books: std::slice::from_ref(&after),
            must: &after.acked,
            gapless: true,
            refused_absent: true,
        };
        for image in [sim.power_cut(|_, _| 0), sim.process_crash()] {
            let restarted = start(&image, setup).await;
            check(&restarted, &expect, "full journal disk").await;
            assert_eq!(
                restarted.logs[0].end_offset(),
                after.acked.len() as u64,
                "every acknowledged append, nothing else"
            );
        }
    });
}

/// However many passes a journal file takes, it never holds more than its size, the pass that crossed it and the
/// zeros written ahead (files rotate, and the zeros ahead are extended by a fixed amount, not in proportion).
#[test]
fn a_journal_file_never_outgrows_its_size_a_pass_and_the_zeros_ahead() {
    run(async {
        let setup = Setup {
            file_bytes: 8 << 10,
            partitions: 2,
            ..SETUP
        };
        // One append at a time, so a pass is one entry: its header, the topic and one frame of under 100 bytes.
        let longest_pass = 512;
        let bound = setup.file_bytes + longest_pass + journal::zero_ahead(setup.file_bytes);
        let sim = Sim::new();
        let node = start(&sim, setup).await;
        let book: SharedBook = Rc::default();
        let mut files = std::collections::BTreeSet::new();
        for seq in 0..400 {
            for p in 0..2 {
                append(&node, &book, p, (0, seq), body_of(0, p, 0, seq))
                    .await
                    .unwrap();
                for path in sim.paths() {
                    if !path.starts_with(journal_dir()) {
                        continue;
                    }
                    let len = sim.contents(&path).map_or(0, |c| c.len()) as u64;
                    assert!(
                        len <= bound,
                        "{} is {len} bytes after {seq} appends (bound {bound})",
                        path.display()
                    );
                    files.insert(path);
                }
            }
        }
        assert!(files.len() > 3, "the journal never rotated: {files:?}");
    });
}
