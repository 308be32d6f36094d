use super::entry::{frames_start, seal_entry, FRONTIER_MAGIC_BYTES, MAGIC_BYTES};
use super::*;

fn head(topic: &str) -> EntryHead {
    EntryHead {
        topic: topic.to_string(),
        topic_id: 7,
        partition: 3,
        segment_base: 100,
        position: 4096,
        first_offset: 120,
        count: 2,
    }
}

fn record(topic: &str, group: &str, committed: u64, start: bool) -> FrontierRecord {
    FrontierRecord {
        topic: topic.into(),
        topic_id: 7,
        partition: 0,
        group: group.into(),
        committed,
        start,
        acked: Vec::new(),
    }
}

fn frontiers(records: &[FrontierRecord], seq: u64) -> Vec<u8> {
    let mut e = frontier_entry(records);
    seal_entry(&mut e, seq);
    e
}

/// Replay moves each frontier file up to the highest value its group's records carry since the group's last
/// start record, passes over groups and topics that are gone, and never lowers a file.
#[test]
fn replay_restores_frontiers_and_forgets_a_deleted_group_of_the_same_name() {
    on_sim_disk(|storage| async move {
        let dir = Path::new("/data/journal");
        let part = Path::new("/data/topics/t/0");
        storage.create_dir_all(dir).unwrap();
        storage.create_dir_all(part).unwrap();
        let file = |g: &str| part.join(super::super::frontier::file_name(g));
        let held = |g: &str| super::super::frontier::read(&*storage, &file(g)).unwrap();
        // "g" was acked to 500, deleted, created again at 2 (its file written before its start record), then
        // acked to 4 (a later record of 3 checks that the highest counts); "default" has a newer value in its
        // file than in the journal; "gone" was deleted; topic "old" with id 6 no longer exists.
        super::super::frontier::write(&*storage, &file("g"), 2)
            .await
            .unwrap();
        super::super::frontier::write(&*storage, &file("default"), 10)
            .await
            .unwrap();
        let mut other = record("old", "default", 50, false);
        other.topic_id = 6;
        let first = [
            record("t", "g", 300, false),
            record("t", "default", 8, false),
            record("t", "gone", 7, false),
            other,
        ];
        let second = [
            record("t", "g", 500, false),
            record("t", "g", 2, true),
            record("t", "g", 4, false),
        ];
        let mut bytes = frontiers(&first, 1);
        bytes.extend(frontiers(&second, 2));
        bytes.extend(frontiers(&[record("t", "g", 3, false)], 3));
        storage
            .replace(&dir.join("0000-00000000000000000001.jnl"), bytes)
            .await
            .unwrap();
        let locate = |name: &str, id: u64, p: u32| {
            (name == "t" && id == 7)
                .then(|| Path::new("/data/topics").join(name).join(p.to_string()))
        };
        let has_group = |_: &str, _: u64, g: &str| g != "gone";
        let report = replay(&*storage, dir, &locate, &has_group).await.unwrap();
        assert_eq!(
            held("g"),
            4,
            "the deleted group's 500 must not count for the new one"
        );
        assert_eq!(held("default"), 10, "a file is never lowered");
        assert!(
            storage.read(&file("gone")).is_err(),
            "no file for a deleted group"
        );
        // Every frontier file with records is written again (a read may show pages a failed sync dropped).
        assert_eq!((report.frontier_records, report.frontiers_written), (8, 2));
        assert_eq!(
            report.files, 1,
            "the one journal file, as the start's log line counts it"
        );
        assert!(storage.list(dir).unwrap().is_empty());
    });
}

/// An owner whose frontier files cannot be written while the flag holds.
struct FailingFrontiers(Rc<Cell<bool>>);

impl Checkpoint for FailingFrontiers {
    fn write_frontier_files(
        self: Rc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>> {
        let ok = !self.0.get();
        Box::pin(async move { ok })
    }
}

/// A checkpoint whose frontier writer fails keeps its journal file, and no newer file may go before it: else
/// the file holding a recreated group's start record could go, and the replay would credit the deleted group's
/// frontier to the new one (found in review: the replay gave 375 instead of 4).
#[test]
fn a_journal_file_a_checkpoint_could_not_finish_outlives_no_newer_one() {
    on_sim_disk(|storage| async move {
        let part = Path::new("/data/topics/t/0");
        storage.create_dir_all(part).unwrap();
        let dir = Path::new("/data/journal");
        let fail = Rc::new(Cell::new(true));
        let owner = Rc::new(FailingFrontiers(fail.clone()));
        let journal = journal_at(
            &storage,
            dir,
            FsyncPolicy::Always,
            4096,
            0,
            Rc::downgrade(&owner) as std::rc::Weak<dyn Checkpoint>,
        )
        .await;
        let wait = |j: Rc<Journal>| async move {
            while j.checkpoints_running() > 0 {
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
        };
        // Old incarnation of "g" acked up to 500: file 0 fills and rotates; its checkpoint's frontier write fails.
        for v in 1..=100u64 {
            journal
                .commit_frontiers(frontier_entry(&[record("t", "g", v * 5, false)]))
                .await
                .unwrap();
        }
        wait(journal.clone()).await;
        assert!(
            storage.list(dir).unwrap().len() >= 2,
            "the unfinished checkpoint's file stays"
        );
        fail.set(false);
        // "g" deleted and created again at 2 (file written, then start record), acked to 4.
        let file = part.join(super::super::frontier::file_name("g"));
        super::super::frontier::write(&*storage, &file, 2)
            .await
            .unwrap();
        journal
            .commit_frontiers(frontier_entry(&[record("t", "g", 2, true)]))
            .await
            .unwrap();
        super::super::frontier::write(&*storage, &file, 4)
            .await
            .unwrap();
        for _ in 0..100u64 {
            journal
                .commit_frontiers(frontier_entry(&[record("t", "g", 4, false)]))
                .await
                .unwrap();
        }
        wait(journal.clone()).await;
        // kill -9: no close. Restart's replay:
        let locate = |name: &str, id: u64, p: u32| {
            (name == "t" && id == 7)
                .then(|| Path::new("/data/topics").join(name).join(p.to_string()))
        };
        let has_group = |_: &str, _: u64, _: &str| true;
        replay(&*storage, dir, &locate, &has_group).await.unwrap();
        let held = super::super::frontier::read(&*storage, &file).unwrap();
        assert_eq!(
            held, 4,
            "the deleted group's frontier was credited to the new one"
        );
    });
}

/// `checkpoint_now` (a log about to cut its tail): once it returns Ok, no journal file holds an entry written
/// before it, so a replay writes none of them back; a checkpoint that cannot finish answers Err (its files stay, in
/// order), never a wait without end, and a later call succeeds once the cause is gone.
#[test]
fn a_checkpoint_asked_for_removes_every_file_holding_earlier_entries_or_says_it_could_not() {
    on_sim_disk(|storage| async move {
        let dir = Path::new("/data/journal");
        let fail = Rc::new(Cell::new(false));
        let owner = Rc::new(FailingFrontiers(fail.clone()));
        let journal = journal_at(
            &storage,
            dir,
            FsyncPolicy::Always,
            1 << 20,
            0,
            Rc::downgrade(&owner) as std::rc::Weak<dyn Checkpoint>,
        )
        .await;
        let commit = committer(&storage, &journal).await;
        commit(1).await.unwrap();
        let before = storage.list(dir).unwrap();
        assert_eq!(before.len(), 1);
        journal.checkpoint_now().await.unwrap();
        let after = storage.list(dir).unwrap();
        assert_eq!(after.len(), 1, "{after:?}");
        assert_ne!(after, before, "the file holding the entry is gone");
        let locate = |_: &str, _: u64, _: u32| Some(PathBuf::from("/sim"));
        let has_group = |_: &str, _: u64, _: &str| true;
        // (The replay of what is left finds no entry: nothing to write back.)
        let report = replay(&*storage, dir, &locate, &has_group).await.unwrap();
        assert_eq!(report.entries, 0, "{report:?}");
        // A checkpoint that cannot write the frontier files: Err, and the files stay.
        let journal = journal_at(
            &storage,
            dir,
            FsyncPolicy::Always,
            1 << 20,
            0,
            Rc::downgrade(&owner) as std::rc::Weak<dyn Checkpoint>,
        )
        .await;
        let commit = committer(&storage, &journal).await;
        commit(1).await.unwrap();
        fail.set(true);
        assert!(journal.checkpoint_now().await.is_err());
        assert_eq!(storage.list(dir).unwrap().len(), 2);
        fail.set(false);
        commit(1).await.unwrap();
        journal.checkpoint_now().await.unwrap();
        assert_eq!(storage.list(dir).unwrap().len(), 1);
    });
}

/// A rotation under `interval:MS` syncs the file it leaves first (the interval timer syncs only the current file),
/// and the new file's name sorts after it (`{core}-{index}`, index + 1: the replay takes files in name order). Here
/// the checkpoint of the old file cannot finish, so it stays, and the timer never fires: a power cut right after the
/// rotation must still find every frontier record the old file was answered for.
#[test]
fn a_rotation_under_interval_sync_syncs_the_file_it_leaves_and_names_the_next_one_after_it() {
    on_sim(|sim, storage| async move {
        let part = Path::new("/data/topics/t/0");
        storage.create_dir_all(part).unwrap();
        let dir = Path::new("/data/journal");
        let owner = Rc::new(FailingFrontiers(Rc::new(Cell::new(true))));
        let journal = journal_at(
            &storage,
            dir,
            FsyncPolicy::IntervalMs(3_600_000),
            4096,
            0,
            Rc::downgrade(&owner) as std::rc::Weak<dyn Checkpoint>,
        )
        .await;
        let mut v = 0;
        while storage.list(dir).unwrap().len() < 2 {
            v += 1;
            assert!(v < 10_000, "the journal never rotated");
            journal
                .commit_frontiers(frontier_entry(&[record("t", "g", v, false)]))
                .await
                .unwrap();
        }
        while journal.checkpoints_running() > 0 {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
        let mut names = storage.list(dir).unwrap();
        names.sort();
        assert_eq!(
            names,
            [
                "0000-00000000000000000000.jnl",
                "0000-00000000000000000001.jnl"
            ],
            "the next file is named after the one it follows"
        );
        // The records answered in the old file; the last one (v) may be in the new file, unsynced.
        let image: Rc<dyn Storage> =
            Rc::new(super::super::sim::SimStorage(sim.power_cut(|_, _| 0)));
        let locate =
            |_: &str, _: u64, p: u32| Some(Path::new("/data/topics/t").join(p.to_string()));
        replay(&*image, dir, &locate, &|_, _, _| true)
            .await
            .unwrap();
        let file = part.join(super::super::frontier::file_name("g"));
        let held = super::super::frontier::read(&*image, &file).unwrap_or(0);
        assert!(
            held >= v - 1,
            "a power cut after the rotation lost the old file's records: the frontier replayed to {held}, answered up to {}",
            v - 1
        );
    });
}

/// A clean stop while an older journal file's checkpoint still cannot finish keeps the current file too: it may
/// hold a recreated group's start record, without which the replay would credit the older file's values of the
/// deleted group to the new one.
#[test]
fn a_stop_with_an_unfinished_checkpoint_keeps_the_current_journal_file() {
    stop_with_a_failing_checkpoint(Rc::new(FailingFrontiers(Rc::new(Cell::new(true)))), None);
}

/// A frontier writer that fails once its gate opens: a checkpoint still under way when the stop begins.
struct FailingWhenOpen(Rc<Cell<bool>>);

impl Checkpoint for FailingWhenOpen {
    fn write_frontier_files(
        self: Rc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>> {
        Box::pin(async move {
            while !self.0.get() {
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
            false
        })
    }
}

/// The same while the checkpoint is still running when the stop begins: the stop waits for it (else it would
/// find nothing pending, remove the current file, and leave the older one the checkpoint then gives back).
#[test]
fn a_stop_during_a_checkpoint_waits_for_it_and_keeps_every_journal_file() {
    let gate = Rc::new(Cell::new(false));
    stop_with_a_failing_checkpoint(Rc::new(FailingWhenOpen(gate.clone())), Some(gate));
}

/// Fills a journal file with one group's frontiers so it rotates into a checkpoint that `owner` fails, recreates
/// the group at 2 (its start record in the current file), stops, and checks that both files stay and a replay
/// leaves the group at 2. Without `gate` the stop begins after the checkpoint failed once; with it, while the
/// checkpoint waits for the gate, which opens only once the stop has had every chance to finish without it.
fn stop_with_a_failing_checkpoint<C: Checkpoint + 'static>(
    owner: Rc<C>,
    gate: Option<Rc<Cell<bool>>>,
) {
    on_sim_disk(move |storage| async move {
        let part = Path::new("/data/topics/t/0");
        storage.create_dir_all(part).unwrap();
        let dir = Path::new("/data/journal");
        let journal = journal_at(
            &storage,
            dir,
            FsyncPolicy::Always,
            4096,
            0,
            Rc::downgrade(&owner) as std::rc::Weak<dyn Checkpoint>,
        )
        .await;
        // Old incarnation of "g" up to 500: file 0 fills and rotates; its checkpoint's frontier write fails.
        for v in 1..=100u64 {
            journal
                .commit_frontiers(frontier_entry(&[record("t", "g", v * 5, false)]))
                .await
                .unwrap();
        }
        assert!(
            gate.is_none() || journal.checkpoints_running() == 1,
            "the checkpoint was over before the stop"
        );
        while gate.is_none() && journal.checkpoints_running() > 0 {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
        // "g" deleted and created again at 2 (file, then start record in the current journal file); then a stop,
        // whose last try of the old checkpoint fails too.
        let file = part.join(super::super::frontier::file_name("g"));
        super::super::frontier::write(&*storage, &file, 2)
            .await
            .unwrap();
        journal
            .commit_frontiers(frontier_entry(&[record("t", "g", 2, true)]))
            .await
            .unwrap();
        let before = storage.list(dir).unwrap().len();
        assert!(before >= 2, "{:?}", storage.list(dir).unwrap());
        let stopped = Rc::new(Cell::new(false));
        let stop = glommio::spawn_local({
            let (journal, stopped) = (journal.clone(), stopped.clone());
            async move {
                journal.close().await;
                stopped.set(true);
            }
        });
        if let Some(gate) = gate {
            // A stop that does not wait for the checkpoint is over within these turns (the simulated disk
            // answers at once); one that waits is still waiting.
            for _ in 0..200 {
                if stopped.get() {
                    break;
                }
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
            gate.set(true);
        }
        stop.await;
        assert_eq!(
            storage.list(dir).unwrap().len(),
            before,
            "the stop removed a journal file while an older one stays"
        );
        let locate = |name: &str, id: u64, p: u32| {
            (name == "t" && id == 7)
                .then(|| Path::new("/data/topics").join(name).join(p.to_string()))
        };
        replay(&*storage, dir, &locate, &|_, _, _| true)
            .await
            .unwrap();
        assert_eq!(super::super::frontier::read(&*storage, &file).unwrap(), 2);
    });
}

/// Partition 0 of topic `t`'s directory, the journal's, and a journal holding one frontier record (group `g` at 6).
async fn journal_holding_a_frontier(
    storage: &Rc<dyn Storage>,
) -> (&'static Path, &'static Path, Rc<Journal>) {
    let part = Path::new("/data/topics/t/0");
    storage.create_dir_all(part).unwrap();
    let journal = journal_with_delay(storage, 0).await;
    journal
        .commit_frontiers(frontier_entry(&[record("t", "g", 6, false)]))
        .await
        .unwrap();
    (part, Path::new("/sim/journal"), journal)
}

/// A core that could not write a frontier file at its stop keeps its journal, and the next start's replay
/// writes the file from it.
#[test]
fn a_stop_that_could_not_write_a_frontier_file_keeps_the_journal_for_the_replay() {
    on_sim_disk(|storage| async move {
        let (part, dir, journal) = journal_holding_a_frontier(&storage).await;
        journal.keep_on_close();
        journal.close().await;
        assert_eq!(storage.list(dir).unwrap().len(), 1, "the journal stays");
        let locate =
            |_: &str, _: u64, p: u32| Some(Path::new("/data/topics/t").join(p.to_string()));
        replay(&*storage, dir, &locate, &|_, _, _| true)
            .await
            .unwrap();
        let file = part.join(super::super::frontier::file_name("g"));
        assert_eq!(super::super::frontier::read(&*storage, &file).unwrap(), 6);
    });
}

/// Under `interval:MS` a commit is answered once written, before any sync: a stop is where the last ones become
/// durable. A stop that keeps its journal (a frontier file could not be written) syncs it first, so a power cut
/// right after the stop still finds the frontier record the replay writes the file from.
#[test]
fn under_interval_sync_a_stop_that_keeps_its_journal_syncs_it_first() {
    on_sim(|sim, storage| async move {
        let part = Path::new("/data/topics/t/0");
        storage.create_dir_all(part).unwrap();
        let dir = Path::new("/sim/journal");
        // The timer never fires within the test: only the stop can sync.
        let journal = journal_at(
            &storage,
            dir,
            FsyncPolicy::IntervalMs(3_600_000),
            1 << 20,
            0,
            no_frontiers(),
        )
        .await;
        journal
            .commit_frontiers(frontier_entry(&[record("t", "g", 6, false)]))
            .await
            .unwrap();
        assert_eq!(journal.stats().syncs, 0, "answered before any sync");
        journal.keep_on_close();
        journal.close().await;
        let image: Rc<dyn Storage> =
            Rc::new(super::super::sim::SimStorage(sim.power_cut(|_, _| 0)));
        assert_eq!(image.list(dir).unwrap().len(), 1, "the journal stays");
        let locate =
            |_: &str, _: u64, p: u32| Some(Path::new("/data/topics/t").join(p.to_string()));
        replay(&*image, dir, &locate, &|_, _, _| true)
            .await
            .unwrap();
        let file = part.join(super::super::frontier::file_name("g"));
        assert_eq!(
            super::super::frontier::read(&*image, &file).ok(),
            Some(6),
            "the frontier record answered before the stop was lost by a power cut after it"
        );
    });
}

/// A clean stop leaves no journal file (the next start has nothing to replay), and closing twice is fine.
#[test]
fn a_clean_stop_leaves_no_journal_file() {
    on_sim_disk(|storage| async move {
        let (_, dir, journal) = journal_holding_a_frontier(&storage).await;
        assert_eq!(
            storage.list(dir).unwrap().len(),
            1,
            "the journal file while open"
        );
        journal.close().await;
        assert!(
            storage.list(dir).unwrap().is_empty(),
            "a clean stop left {:?}",
            storage.list(dir).unwrap()
        );
        journal.close().await;
    });
}

/// A damaged entry in a core's journal may have been a group's start record: that core's frontier records are
/// not replayed (the files stay; what is above them redelivers), another core's are.
#[test]
fn a_damaged_entry_leaves_its_cores_frontier_files_as_they_are() {
    on_sim_disk(|storage| async move {
        let dir = Path::new("/data/journal");
        storage.create_dir_all(dir).unwrap();
        for p in ["0", "1"] {
            storage
                .create_dir_all(&Path::new("/data/topics/t").join(p))
                .unwrap();
        }
        let file = |p: &str| {
            Path::new("/data/topics/t")
                .join(p)
                .join("consumer.g.offset")
        };
        let held = |p: &str| super::super::frontier::read(&*storage, &file(p)).unwrap();
        // Core 0, partition 0: "g" at 500, deleted and created again at 2, whose start record is damaged,
        // then acked to 3. Core 1, partition 1: "g" at 9.
        super::super::frontier::write(&*storage, &file("0"), 2)
            .await
            .unwrap();
        let mut start = frontiers(&[record("t", "g", 2, true)], 2);
        let last = start.len() - 1;
        start[last] ^= 0x10;
        let mut core0 = frontiers(&[record("t", "g", 500, false)], 1);
        core0.extend(start);
        core0.extend(frontiers(&[record("t", "g", 3, false)], 3));
        storage
            .replace(&dir.join("0000-00000000000000000001.jnl"), core0)
            .await
            .unwrap();
        let mut one = record("t", "g", 9, false);
        one.partition = 1;
        storage
            .replace(
                &dir.join("0001-00000000000000000001.jnl"),
                frontiers(&[one], 1),
            )
            .await
            .unwrap();
        let locate =
            |_: &str, _: u64, p: u32| Some(Path::new("/data/topics/t").join(p.to_string()));
        let report = replay(&*storage, dir, &locate, &|_, _, _| true)
            .await
            .unwrap();
        assert_eq!(
            held("0"),
            2,
            "the deleted group's 500 must not count, nor anything of core 0"
        );
        assert_eq!(held("1"), 9);
        assert_eq!(
            (
                report.damaged,
                report.frontiers_dropped,
                report.frontiers_written
            ),
            (1, 1, 1)
        );
    });
}

fn entry(topic: &str, seq: u64, frames: &[u8]) -> Vec<u8> {
    let mut e = begin_entry(&head(topic), frames.len());
    e.extend_from_slice(frames);
    seal_entry(&mut e, seq);
    e
}

#[test]
fn entries_round_trip_and_zeros_end_the_scan() {
    let mut file = entry("orders", 1, b"frames-one");
    file.extend(entry("t", 2, b""));
    file.extend(vec![0u8; 1000]);
    let s = scan(&file);
    assert_eq!(s.damaged, 0);
    assert_eq!(s.entries.len(), 2);
    assert_eq!(s.entries[0].head, head("orders"));
    assert_eq!(s.entries[0].frames, b"frames-one");
    assert_eq!((s.entries[1].seq, s.entries[1].frames.len()), (2, 0));
    assert_eq!(
        frames_start(&entry("orders", 1, b"x")),
        HEADER_LEN + BODY_FIXED_LEN + 6
    );
}

/// An entry whose checks pass but whose body does not hang together (written by a bug, or by anyone with access to
/// the file: the CRC is no signature) is passed over and counted; the scan never panics and keeps what follows.
#[test]
fn an_entry_with_valid_checks_and_a_malformed_body_is_passed_over_without_a_panic() {
    let sealed = |magic: [u8; 4], body: &[u8], seq: u64| {
        let mut e = magic.to_vec();
        e.extend_from_slice(&[0u8; HEADER_LEN - 4]);
        e.extend_from_slice(body);
        seal_entry(&mut e, seq);
        e
    };
    // A data entry's body shorter than its fixed fields; one whose name runs past its end; a frontier entry that
    // announces more records than it holds.
    let mut long_name = vec![0u8; BODY_FIXED_LEN];
    long_name[40..42].copy_from_slice(&500u16.to_le_bytes());
    let mut file = sealed(MAGIC_BYTES, &[7u8; 10], 1);
    file.extend(sealed(MAGIC_BYTES, &long_name, 2));
    file.extend(sealed(FRONTIER_MAGIC_BYTES, &9u32.to_le_bytes(), 3));
    file.extend(entry("after", 4, b"kept"));
    let s = scan(&file);
    assert_eq!(s.damaged, 3);
    assert_eq!(s.entries.len(), 1);
    assert_eq!(
        (s.entries[0].seq, &s.entries[0].frames[..]),
        (4, &b"kept"[..])
    );
}

/// Sequence numbers only grow through a file: an entry whose number is not above the last one taken (a stale
/// remnant) is not taken, nor anything after it that does not continue the sequence.
#[test]
fn an_entry_that_does_not_continue_the_sequence_is_not_taken() {
    let mut file = entry("a", 5, b"five");
    file.extend(entry("a", 3, b"stale"));
    file.extend(entry("a", 5, b"again"));
    file.extend(entry("a", 6, b"six"));
    let s = scan(&file);
    let taken: Vec<(u64, &[u8])> = s.entries.iter().map(|e| (e.seq, &e.frames[..])).collect();
    assert_eq!(taken, vec![(5, &b"five"[..]), (6, &b"six"[..])]);
    assert_eq!(s.damaged, 1, "the stale run is counted once");
    // The same number twice in a row: the second is not taken either.
    let mut file = entry("a", 5, b"five");
    file.extend(entry("a", 5, b"again"));
    file.extend(entry("a", 6, b"six"));
    let s = scan(&file);
    let taken: Vec<u64> = s.entries.iter().map(|e| e.seq).collect();
    assert_eq!((taken, s.damaged), (vec![5, 6], 1));
}

#[test]
fn a_torn_last_entry_ends_the_scan() {
    let mut file = entry("a", 1, b"first");
    let second = entry("a", 2, b"second-entry");
    for cut in 0..second.len() {
        let mut torn = file.clone();
        torn.extend_from_slice(&second[..cut]);
        let s = scan(&torn);
        assert_eq!(s.entries.len(), 1, "cut {cut}");
    }
    file.extend(second);
    assert_eq!(scan(&file).entries.len(), 2);
}

/// Any single flipped bit costs at most the entry it lands in: the others are found, none is damaged.
#[test]
fn a_bit_flip_anywhere_costs_at_most_its_entry() {
    let records = [record("b", "g", 9, false), record("b", "default", 4, true)];
    let parts = [
        entry("a", 1, b"one"),
        frontiers(&records, 2),
        entry("c", 3, b"three"),
    ];
    let file: Vec<u8> = parts.concat();
    let bounds: Vec<usize> = parts
        .iter()
        .scan(0, |at, p| {
            *at += p.len();
            Some(*at)
        })
        .collect();
    for byte in 0..file.len() {
        for bit in 0..8 {
            let mut damaged = file.clone();
            damaged[byte] ^= 1 << bit;
            let s = scan(&damaged);
            let hit = bounds.iter().position(|&b| byte < b).expect("inside");
            let mut seqs: Vec<u64> = s.entries.iter().map(|e| e.seq).collect();
            if !s.frontiers.is_empty() {
                assert_eq!(s.frontiers, records, "flip at byte {byte} bit {bit}");
                seqs.push(2);
                seqs.sort();
            }
            let want: Vec<u64> = (1..=3).filter(|&q| q != hit as u64 + 1).collect();
            assert_eq!(seqs, want, "flip at byte {byte} bit {bit}");
            for e in &s.entries {
                assert_eq!(
                    entry(&e.head.topic, e.seq, &e.frames),
                    parts[e.seq as usize - 1]
                );
            }
        }
    }
}

/// docs/format.md's journal example is what `begin_entry` + `seal_entry` write, and `scan` reads it back.
#[test]
fn the_documented_example_matches_the_code() {
    let bytes = crate::format_doc::example("Journal", 0);
    let doc = include_str!("../../../docs/format.md");
    let section = &doc[doc.find("## Journal").expect("a Journal section")..];
    let mut frame = Vec::new();
    crate::storage::frame::encode(5, 1_700_000_000_000, b"hi", &mut frame);
    let head = EntryHead {
        topic: "t".into(),
        topic_id: 1,
        partition: 0,
        segment_base: 0,
        position: 0,
        first_offset: 5,
        count: 1,
    };
    let mut entry = begin_entry(&head, frame.len());
    assert_eq!(frames_start(&entry), entry.len());
    entry.extend_from_slice(&frame);
    seal_entry(&mut entry, 1);
    assert_eq!(bytes, entry, "docs/format.md's example");
    let found = scan(&bytes);
    assert_eq!(found.entries.len(), 1);
    assert_eq!(found.entries[0].head, head);
    assert!(section.contains(&format!("`0x{MAGIC:08X}`")));
    assert!(section.contains(&format!("| 0..{HEADER_LEN} |")) || HEADER_LEN == 24);
    assert!(section.contains(&format!("| 40..{BODY_FIXED_LEN} | u16 | name_len")));
}

/// docs/format.md's frontier entry example is what `frontier_entry` + `seal_entry` write, and `scan` reads it.
#[test]
fn the_documented_frontier_example_matches_the_code() {
    let bytes = crate::format_doc::example("Journal", 1);
    let doc = include_str!("../../../docs/format.md");
    let section = &doc[doc.find("## Journal").expect("a Journal section")..];
    let mut r = record("t", "g", 6, false);
    r.topic_id = 1;
    assert_eq!(
        bytes,
        frontiers(std::slice::from_ref(&r), 2),
        "docs/format.md's example"
    );
    let found = scan(&bytes);
    assert_eq!((found.frontiers, found.entries.len()), (vec![r.clone()], 0));
    assert!(section.contains(&format!("`0x{FRONTIER_MAGIC:08X}`")));
    assert!(section.contains(&format!("| 23..{FRONTIER_FIXED_LEN} | u16 | group_len")));
    // And the one with acked-ahead ranges.
    let bytes = crate::format_doc::example("Journal", 2);
    r.acked = vec![(8, 10), (12, 13)];
    assert_eq!(
        bytes,
        frontiers(std::slice::from_ref(&r), 3),
        "docs/format.md's example with ranges"
    );
    assert_eq!(scan(&bytes).frontiers, vec![r]);
}

/// A record's acked ranges round-trip; ranges out of canonical form, a count that runs past the body, or a kind
/// byte beyond 4 make the entry damaged.
#[test]
fn frontier_records_with_ranges_round_trip_and_bad_ones_are_damaged() {
    let mut a = record("t", "g", 6, false);
    a.acked = vec![(8, 10), (12, 13)];
    let mut b = record("t", "h", 0, true);
    b.acked = vec![(3, 4)];
    let c = record("u", "g", 9, false);
    let bytes = frontiers(&[a.clone(), b.clone(), c.clone()], 1);
    assert_eq!(scan(&bytes).frontiers, vec![a, b, c]);
    // Ranges that are not canonical (built by hand: `frontier_entry` refuses them).
    let mut body = frontier_entry(&[record("t", "g", 6, false)]);
    body[HEADER_LEN + 4 + 20] = 3;
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&5u64.to_le_bytes());
    body.extend_from_slice(&7u64.to_le_bytes());
    let mut bad = body.clone();
    seal_entry(&mut bad, 1);
    assert_eq!((scan(&bad).frontiers.len(), scan(&bad).damaged), (0, 1));
    // A count past the body's end.
    let mut cut = body.clone();
    let at = cut.len() - 20;
    cut[at..at + 4].copy_from_slice(&9u32.to_le_bytes());
    seal_entry(&mut cut, 1);
    assert_eq!((scan(&cut).frontiers.len(), scan(&cut).damaged), (0, 1));
    // Kind 5.
    let mut kind = frontier_entry(&[record("t", "g", 6, false)]);
    kind[HEADER_LEN + 4 + 20] = 5;
    seal_entry(&mut kind, 1);
    assert_eq!((scan(&kind).frontiers.len(), scan(&kind).damaged), (0, 1));
}

#[test]
fn garbage_never_panics() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for len in 0..300 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        let _ = scan(&bytes);
        for magic in [MAGIC_BYTES, FRONTIER_MAGIC_BYTES] {
            let mut with_magic = magic.to_vec();
            with_magic.extend(&bytes);
            let _ = scan(&with_magic);
        }
    }
}

/// Runs `test` on a fresh executor with a fresh simulated disk.
fn on_sim_disk<F: std::future::Future<Output = ()>>(test: impl FnOnce(Rc<dyn Storage>) -> F) {
    on_sim(|_, storage| test(storage));
}

/// Like `on_sim_disk`, with the simulated disk itself too (to hold its syncs, say).
fn on_sim<F: std::future::Future<Output = ()>>(
    test: impl FnOnce(Rc<super::super::sim::Sim>, Rc<dyn Storage>) -> F,
) {
    use super::super::sim::{Sim, SimStorage};
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async move {
            let sim = Sim::new();
            test(sim.clone(), Rc::new(SimStorage(sim))).await
        });
}

/// A journal of core 0 in `dir` on `storage` (real clock), as the tests set it up.
async fn journal_at(
    storage: &Rc<dyn Storage>,
    dir: &Path,
    fsync: FsyncPolicy,
    file_bytes: u64,
    commit_delay_us: u64,
    owner: std::rc::Weak<dyn Checkpoint>,
) -> Rc<Journal> {
    Journal::open(
        storage.clone(),
        Rc::new(crate::clock::RealClock),
        dir,
        0,
        JournalOptions {
            fsync,
            file_bytes,
            commit_delay_us,
        },
        owner,
    )
    .await
    .expect("journal opens")
}

/// A journal under fsync `always` on `storage` (real clock) with a commit delay of `delay_us`.
async fn journal_with_delay(storage: &Rc<dyn Storage>, delay_us: u64) -> Rc<Journal> {
    journal_at(
        storage,
        Path::new("/sim/journal"),
        FsyncPolicy::Always,
        1 << 20,
        delay_us,
        no_frontiers(),
    )
    .await
}

/// A function that commits an entry of `records` records (of a segment `/sim/seg`) to `journal` in a task of its
/// own, so several can be queued before any is written.
async fn committer(
    storage: &Rc<dyn Storage>,
    journal: &Rc<Journal>,
) -> impl Fn(u32) -> glommio::Task<Result<(), AppendError>> {
    let segment = storage
        .open(Path::new("/sim/seg"), true)
        .await
        .expect("segment");
    let journal = journal.clone();
    move |records| {
        let (journal, segment) = (journal.clone(), segment.clone());
        glommio::spawn_local(async move {
            journal
                .commit(begin_entry(&head("t"), 0), records, segment, None, false)
                .await
        })
    }
}

/// The commit delay: a lone appender is synced at once, pass after pass; once a pass carried more than one
/// entry, the committer waits for company before its next pass, and entries queued meanwhile share it.
#[test]
fn the_commit_delay_gathers_concurrent_appenders_and_never_holds_a_lone_one() {
    on_sim_disk(|storage| async move {
        // Long enough that the second entry below is queued well inside it, whatever the machine's load.
        let delay_us = 200_000;
        let journal = journal_with_delay(&storage, delay_us).await;
        let commit = committer(&storage, &journal).await;
        // A lone appender, one record at a time: no pass waits.
        let started = std::time::Instant::now();
        for _ in 0..3 {
            commit(1).await.expect("committed");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_micros(delay_us),
            "a lone appender waited for the commit delay"
        );
        assert_eq!(journal.stats().passes, 3);
        // Two entries queued together share a pass (no delay: the last pass had one entry); appenders are
        // concurrent from now on.
        // The committer starts waiting for company as soon as that pass is written, possibly before this task runs
        // again: the wait is measured from before it could start.
        let company = std::time::Instant::now();
        let (a, b) = (commit(1), commit(1));
        a.await.expect("committed");
        b.await.expect("committed");
        assert_eq!(journal.stats().passes, 4);
        let first = commit(1);
        futures_lite::future::yield_now().await;
        let second = commit(1);
        first.await.expect("committed");
        second.await.expect("committed");
        let stats = journal.stats();
        assert_eq!(stats.passes, 5, "the two entries share one pass: {stats:?}");
        assert_eq!(stats.records, 7);
        assert!(company.elapsed() >= std::time::Duration::from_micros(delay_us));
        journal.close().await;
    });
}

/// After a pass that carried several entries the committer waits for company even when entries are queued
/// already (they came while its sync ran): those and the ones that follow share the next pass. (Taking the
/// queued ones at once gave 16 partitions 40 % more syncs per record than one partition, whose log waits so.)
#[test]
fn entries_queued_during_a_sync_still_wait_for_company_after_a_pass_with_several() {
    on_sim(|sim, storage| async move {
        let delay_us = 200_000;
        let journal = journal_with_delay(&storage, delay_us).await;
        let one = committer(&storage, &journal).await;
        let commit = || one(1);
        sim.hold_syncs();
        let (a, b) = (commit(), commit());
        for _ in 0..1000 {
            if sim.held_syncs() > 0 {
                break;
            }
            futures_lite::future::yield_now().await;
        }
        assert_eq!(sim.held_syncs(), 1, "a and b's pass is syncing");
        // c is queued while that sync runs; d comes once its pass is answered.
        let c = commit();
        futures_lite::future::yield_now().await;
        sim.release_syncs();
        for _ in 0..1000 {
            if journal.stats().passes > 0 {
                break;
            }
            futures_lite::future::yield_now().await;
        }
        assert_eq!(journal.stats().passes, 1);
        let d = commit();
        for task in [a, b, c, d] {
            task.await.expect("committed");
        }
        let stats = journal.stats();
        assert_eq!(stats.passes, 2, "c waited for d: {stats:?}");
        assert_eq!(stats.records, 4);
        journal.close().await;
    });
}

/// The journal's counters count what it did: each pass, entry, record and byte, and under fsync `always` one
/// sync per pass; under `interval:MS`, `sync_now` syncs (and counts) once.
#[test]
fn the_counters_count_each_pass_entry_record_byte_and_sync() {
    on_sim_disk(|storage| async move {
        let journal = journal_with_delay(&storage, 0).await;
        let commit = committer(&storage, &journal).await;
        let start = journal.stats();
        assert_eq!(start, JournalStats::default(), "nothing counted at open");
        commit(3).await.expect("committed");
        let one = journal.stats();
        let entry_bytes = one.bytes;
        assert!((HEADER_LEN as u64..4096).contains(&entry_bytes), "{one:?}");
        assert_eq!(
            (one.passes, one.entries, one.records, one.syncs),
            (1, 1, 3, 1)
        );
        for _ in 0..4 {
            commit(2).await.expect("committed");
        }
        let five = journal.stats();
        assert_eq!(
            (five.passes, five.entries, five.records, five.syncs),
            (5, 5, 11, 5),
            "{five:?}"
        );
        assert_eq!(five.bytes, 5 * entry_bytes, "{five:?}");
        journal.close().await;

        let interval = journal_at(
            &storage,
            Path::new("/sim/journal-interval"),
            FsyncPolicy::IntervalMs(3_600_000),
            1 << 20,
            0,
            no_frontiers(),
        )
        .await;
        let commit = committer(&storage, &interval).await;
        commit(1).await.expect("committed");
        assert_eq!(interval.stats().syncs, 0, "interval: no sync per pass");
        interval.sync_now().await.expect("synced");
        assert_eq!(interval.stats().syncs, 1);
        interval.close().await;
    });
}

/// Partition `partition` of topic `t`, its appends made durable by `journal`, its frames written to the segment
/// in pieces of `write_behind_bytes` (0: batch by batch).
async fn log_on(
    storage: &Rc<dyn Storage>,
    journal: &Rc<Journal>,
    partition: u32,
    write_behind_bytes: u32,
) -> Rc<super::super::log::Log> {
    use super::super::log::{JournalLink, Log, LogOptions};
    Log::open_with(
        storage.clone(),
        Rc::new(crate::clock::RealClock),
        &Path::new("/sim/topics/t").join(partition.to_string()),
        LogOptions {
            segment_bytes: 1 << 20,
            max_payload: 1 << 16,
            fsync: FsyncPolicy::Always,
            tail_cache_bytes: 0,
            write_behind_bytes,
        },
        Some(JournalLink {
            journal: journal.clone(),
            topic: "t".into(),
            topic_id: 1,
            partition,
        }),
    )
    .await
    .expect("log opens")
}

/// A batch the journal refuses is taken back from the log's write-behind buffer: no flush (the journal's close
/// here) ever writes it to the segment, so a reopened log ends where the acknowledged records end.
#[test]
fn a_batch_the_journal_refuses_never_reaches_the_segment_from_behind() {
    on_sim(|sim, storage| async move {
        let journal = journal_with_delay(&storage, 0).await;
        let log = log_on(&storage, &journal, 0, 4096).await;
        assert_eq!(spawn_append(&log, b"kept").await.expect("appended"), 0);
        // The next write is the journal's pass (the segment's frames wait behind).
        sim.fail_writes(libc::EIO, 1);
        assert!(spawn_append(&log, b"refused").await.is_err());
        assert!(!journal.is_poisoned());
        log.close().await;
        journal.close().await;
        assert_eq!(journal.stats().records, 1, "{:?}", journal.stats());
        let journal = journal_with_delay(&storage, 0).await;
        let reopened = log_on(&storage, &journal, 0, 4096).await;
        assert_eq!(
            reopened.end_offset(),
            1,
            "the refused record reached the segment"
        );
        assert_eq!(
            reopened.read(0).await.expect("kept").payload,
            bytes::Bytes::from_static(b"kept")
        );
        // And the next append takes its place.
        assert_eq!(spawn_append(&reopened, b"next").await.expect("appended"), 1);
        reopened.close().await;
        journal.close().await;
    });
}

/// Appends `body` to `log` in a task of its own (so several appends can be queued before any is written).
fn spawn_append(
    log: &Rc<super::super::log::Log>,
    body: &'static [u8],
) -> glommio::Task<Result<u64, AppendError>> {
    let log = log.clone();
    glommio::spawn_local(async move { log.append(bytes::Bytes::from_static(body)).await })
}

/// The commit delay in a partition's log: a lone appender is written at once, batch after batch; after a batch
/// that gathered several appends, the log waits for company, and appends made meanwhile share one batch.
#[test]
fn a_log_whose_batch_gathered_several_appends_waits_for_company_and_a_lone_one_never_does() {
    on_sim_disk(|storage| async move {
        let delay_us = 200_000;
        let journal = journal_with_delay(&storage, delay_us).await;
        let log = log_on(&storage, &journal, 0, 0).await;
        let append = |body: &'static [u8]| spawn_append(&log, body);
        let started = std::time::Instant::now();
        for _ in 0..3 {
            append(b"lone").await.expect("appended");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_micros(delay_us),
            "a lone appender waited for the commit delay"
        );
        assert_eq!(log.io_counts().0, 3);
        // Two appends queued together share a batch; from then on appenders are concurrent.
        // The writer starts waiting for company as soon as that batch is durable, possibly before this task runs
        // again: the wait is measured from before it could start.
        let company = std::time::Instant::now();
        let (a, b) = (append(b"a"), append(b"b"));
        a.await.expect("appended");
        b.await.expect("appended");
        assert_eq!(log.io_counts().0, 4);
        // The writer now waits: appends made one after the other meanwhile share one batch.
        let c = append(b"c");
        futures_lite::future::yield_now().await;
        let d = append(b"d");
        assert_eq!(c.await.expect("appended"), 5);
        assert_eq!(d.await.expect("appended"), 6);
        assert_eq!(log.io_counts().0, 5, "c and d share one batch");
        assert!(company.elapsed() >= std::time::Duration::from_micros(delay_us));
        log.close().await;
        journal.close().await;
    });
}

/// One wait per commit path: when the journal's last pass carried several partitions' entries, the journal's own
/// delay gathers them, and a log whose batch gathered several appends does not add a delay of its own. It
/// builds its next batch when the journal's delay ends, so the appends made during that delay ride the very
/// next pass together. (Queuing the next batch at once left the appends that came during the delay to the pass
/// after: with wrk at 64 connections on 16 partitions, 31 records per sync against 45 on one partition.)
#[test]
fn a_log_builds_its_next_batch_when_the_journals_delay_for_several_partitions_ends() {
    on_sim_disk(|storage| async move {
        let journal = journal_with_delay(&storage, 200_000).await;
        let (one, two) = (
            log_on(&storage, &journal, 0, 0).await,
            log_on(&storage, &journal, 1, 0).await,
        );
        // The journal's delay begins as soon as the first pass is durable, possibly before this task runs again:
        // the wait is measured from before it could begin.
        let started = std::time::Instant::now();
        share_a_pass(&journal, &one, &two).await;
        // The journal is in its delay: appends made one after the other meanwhile form one batch, built when the
        // delay ends, and that batch is the next pass.
        let d = spawn_append(&one, b"d");
        futures_lite::future::yield_now().await;
        let e = spawn_append(&one, b"e");
        assert_eq!(d.await.expect("appended"), 2);
        assert_eq!(e.await.expect("appended"), 3);
        assert_eq!(one.io_counts().0, 2, "d and e share one batch");
        let stats = journal.stats();
        assert_eq!(
            stats.passes, 2,
            "d and e ride the pass after the delay: {stats:?}"
        );
        assert_eq!(stats.records, 5);
        // They waited for the delay (begun after `started`).
        assert!(started.elapsed() >= std::time::Duration::from_millis(200));
        one.close().await;
        two.close().await;
        journal.close().await;
    });
}

/// Partition `one` gathers two appends in one batch and partition `two`'s entry shares the journal's first pass:
/// the journal then waits for company before its next pass, and `one` builds its next batch when that wait ends.
async fn share_a_pass(
    journal: &Rc<Journal>,
    one: &Rc<super::super::log::Log>,
    two: &Rc<super::super::log::Log>,
) {
    let (a, b, c) = (
        spawn_append(one, b"a"),
        spawn_append(one, b"b"),
        spawn_append(two, b"c"),
    );
    a.await.expect("appended");
    b.await.expect("appended");
    c.await.expect("appended");
    assert_eq!(journal.stats().passes, 1, "{:?}", journal.stats());
    assert_eq!(journal.last_pass_entries(), 2);
    assert_eq!(one.io_counts().0, 1);
}

/// When the commit delay ends, the logs held back for it (`next_pass`) queue their batch before the committer takes
/// the next pass, even when another entry is already queued: the held-back batch rides that pass, not a pass of
/// its own after it.
#[test]
fn a_held_back_batch_rides_the_pass_an_entry_queued_during_the_delay_takes() {
    on_sim_disk(|storage| async move {
        let journal = journal_with_delay(&storage, 200_000).await;
        let (one, two, three) = (
            log_on(&storage, &journal, 0, 0).await,
            log_on(&storage, &journal, 1, 0).await,
            log_on(&storage, &journal, 2, 0).await,
        );
        share_a_pass(&journal, &one, &two).await;
        // In the delay: partition 2, in no pass yet, queues its entry at once; partition 0's next batch is held
        // back until the delay ends.
        let c = spawn_append(&three, b"c");
        let d = spawn_append(&one, b"d");
        c.await.expect("appended");
        d.await.expect("appended");
        let stats = journal.stats();
        assert_eq!(
            (stats.passes, journal.last_pass_entries()),
            (2, 2),
            "c and d share the pass after the delay: {stats:?}"
        );
        assert!(stats.next_pass_waits >= 1, "{stats:?}");
        for log in [one, two, three] {
            log.close().await;
        }
        journal.close().await;
    });
}

/// A pass takes the queued entries that fit in `MAX_PASS_BYTES` (exactly that many bytes included), never none
/// while some wait (one larger than the bound goes alone), and leaves the rest, in order, for the next pass.
#[test]
fn a_pass_takes_what_fits_in_its_byte_bound_and_never_nothing() {
    const MAX: usize = 100;
    let take = |lens: &[usize]| pass_len(lens.iter().copied(), MAX);
    assert_eq!(take(&[]), 0);
    assert_eq!(take(&[1]), 1);
    assert_eq!(take(&[50, 50, 1]), 2, "exactly the bound fits");
    assert_eq!(take(&[50, 51, 1]), 1, "one byte over does not");
    assert_eq!(take(&[30, 30, 30, 30]), 3);
    assert_eq!(take(&[101, 1]), 1, "an entry over the bound goes alone");
    assert_eq!(take(&[1, 101]), 1);
    assert_eq!(take(&[1; 100]), 100);
    assert_eq!(take(&[1; 101]), 100);
    assert_eq!(MAX_PASS_BYTES, 8 << 20);
}

/// A journal directory that is missing has nothing to replay; one that cannot be listed (here a file in its place)
/// is an error, never an empty journal: what it holds may be the only durable copy of answered appends.
#[test]
fn a_journal_directory_that_cannot_be_listed_is_an_error_not_an_empty_journal() {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async {
            use crate::storage::backend::{Disk, SyncVia};
            let tmp = tempfile::tempdir().expect("temp dir");
            let disk = Disk::new(SyncVia::Inline);
            let nowhere = |_: &str, _: u64, _: u32| None;
            let report = replay(&disk, &tmp.path().join("missing"), &nowhere, &|_, _, _| {
                true
            })
            .await
            .expect("a missing directory replays nothing");
            assert_eq!(report.entries, 0);
            let file = tmp.path().join("journal");
            std::fs::write(&file, b"not a directory").expect("write");
            let r = replay(&disk, &file, &nowhere, &|_, _, _| true).await;
            assert!(r.is_err(), "{:?}", r.map(|r| r.entries));
        });
}

/// A journal under fsync `always` with 16 KiB files (4 KiB of zeros ahead) in `dir`, and a segment `/sim/seg` for
/// its entries.
async fn small_journal(
    storage: &Rc<dyn Storage>,
    dir: &Path,
) -> (Rc<Journal>, Rc<dyn SegmentFile>) {
    let journal = journal_at(
        storage,
        dir,
        FsyncPolicy::Always,
        16 << 10,
        0,
        no_frontiers(),
    )
    .await;
    let segment = storage
        .open(Path::new("/sim/seg"), true)
        .await
        .expect("segment");
    (journal, segment)
}

/// An entry of frames of `frames` bytes.
fn sized_entry(frames: usize) -> Vec<u8> {
    let mut e = begin_entry(&head("t"), frames);
    e.resize(e.len() + frames, 7);
    e
}

/// A full disk and reserved room (`Journal::reserve`, what a leader holds before it ships a batch ahead of its own
/// sync): a pass whose zeros ahead cannot be extended still writes the entries that reserved room below the zeros
/// already written, and refuses only the others (`NoSpace`), without poisoning the journal. A reservation is
/// refused when the room left, less what is reserved, is too small, and given back when its pass is done.
#[test]
fn a_pass_on_a_full_disk_writes_its_reserved_entries_and_refuses_the_others() {
    on_sim(|sim, storage| async move {
        let dir = Path::new("/sim/journal");
        let (journal, segment) = small_journal(&storage, dir).await;
        let ahead = zero_ahead(16 << 10);
        assert_eq!(ahead, 4096);
        let commit = |e: Vec<u8>, reserved: bool| {
            let (journal, segment) = (journal.clone(), segment.clone());
            glommio::spawn_local(async move { journal.commit(e, 1, segment, None, reserved).await })
        };
        // A first pass, held in its sync while the next entries queue up behind it.
        sim.hold_syncs();
        let first_len = sized_entry(100).len() as u64;
        let first = commit(sized_entry(100), false);
        for _ in 0..1000 {
            if sim.held_syncs() > 0 {
                break;
            }
            futures_lite::future::yield_now().await;
        }
        assert_eq!(sim.held_syncs(), 1);
        // The disk is full now: only the zeros already written are left.
        sim.limit_space_under(dir, Some(sim.used_under(dir)));
        let reserved = sized_entry(200);
        // (No more than the zeros ahead can be reserved at all.)
        assert!(!journal.reserve(ahead + 1));
        assert!(journal.reserve(reserved.len() as u64));
        assert_eq!(journal.reserved(), reserved.len() as u64);
        // Room for no more than what is left below the zeros written.
        let left = ahead - journal.reserved() - first_len;
        assert!(!journal.reserve(left + 1), "{left} bytes left");
        // Queued together, in one pass: the unreserved entry needs the zeros extended, which the full disk refuses.
        let r = commit(reserved, true);
        let u = commit(sized_entry(3000), false);
        futures_lite::future::yield_now().await;
        sim.release_syncs();
        first.await.expect("the first pass");
        r.await.expect("the reserved entry is written");
        let refused = u.await;
        assert!(matches!(refused, Err(AppendError::NoSpace)), "{refused:?}");
        assert!(!journal.is_poisoned());
        assert_eq!(journal.reserved(), 0, "given back once written");
        let stats = journal.stats();
        assert_eq!((stats.passes, stats.entries), (2, 2), "{stats:?}");
        // Space back: unreserved entries are written again.
        sim.limit_space_under(dir, None);
        commit(sized_entry(3000), false)
            .await
            .expect("space is back");
        journal.close().await;
    });
}

/// Entries without a reservation never write into the room queued entries reserved: a pass that would extends the
/// zeros first, and on a full disk is refused, while the reserved entry still lands below the zeros written.
#[test]
fn entries_without_a_reservation_leave_the_reserved_room_alone() {
    on_sim(|sim, storage| async move {
        let dir = Path::new("/sim/journal");
        let (journal, segment) = small_journal(&storage, dir).await;
        journal
            .commit(sized_entry(100), 1, segment.clone(), None, false)
            .await
            .expect("a first pass");
        sim.limit_space_under(dir, Some(sim.used_under(dir)));
        // Most of the zeros ahead reserved (a batch shipped early whose entry is not queued yet).
        let reserved = sized_entry(2500);
        assert!(journal.reserve(reserved.len() as u64));
        let mut written = 0;
        let refused = loop {
            match journal
                .commit(sized_entry(400), 1, segment.clone(), None, false)
                .await
            {
                Ok(()) => written += 1,
                Err(e) => break e,
            }
            assert!(written < 20, "the full disk was never met");
        };
        assert!(matches!(refused, AppendError::NoSpace), "{refused:?}");
        assert!(written >= 1, "{written}");
        assert!(!journal.is_poisoned());
        journal
            .commit(reserved, 1, segment.clone(), None, true)
            .await
            .expect("the reserved entry still fits");
        assert_eq!(journal.reserved(), 0);
        journal.close().await;
    });
}
