//! The log under storage faults and power cuts, on the simulated disk: no append that was acknowledged is ever
//! lost, a failed write or sync never turns into a success, and every restart succeeds.

use super::backend::Storage;
use super::log::{AppendError, Log, LogOptions, ReadAhead, ReadError};
use super::sim::{Sim, SimStorage};
use super::FsyncPolicy;
use bytes::Bytes;
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

const OPTS: LogOptions = LogOptions {
    segment_bytes: 4096,
    max_payload: 1 << 16,
    fsync: FsyncPolicy::Always,
    tail_cache_bytes: 0,
    write_behind_bytes: 0,
};

fn dir() -> &'static Path {
    Path::new("/sim/topics/t/0")
}

pub(super) fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(f)
}

pub(super) fn clock() -> Rc<dyn crate::clock::Clock> {
    Rc::new(crate::clock::RealClock)
}

pub(super) fn storage(sim: &Rc<Sim>) -> Rc<dyn Storage> {
    Rc::new(SimStorage(sim.clone()))
}

/// A small deterministic generator (xorshift64*), so failures reproduce from the seed.
pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(super) fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

fn payload(writer: usize, seq: usize) -> Bytes {
    Bytes::from(format!("w{writer}-m{seq}-{}", "x".repeat(seq % 97)))
}

/// Reopens the log from `sim` and checks that every acknowledged record is there, intact, at its offset.
async fn check_survivors(sim: &Rc<Sim>, acked: &[(u64, Bytes)]) -> Rc<Log> {
    let log = Log::open(storage(sim), clock(), dir(), OPTS)
        .await
        .expect("restart must succeed");
    for (offset, body) in acked {
        match log.read(*offset).await {
            Ok(record) => assert_eq!(&record.payload, body, "offset {offset} changed content"),
            Err(e) => panic!("acknowledged offset {offset} lost after the cut: {e:?}"),
        }
    }
    log
}

#[test]
fn power_cut_at_any_point_loses_no_acknowledged_append() {
    for seed in 1..=120u64 {
        run(async move {
            let sim = Sim::new();
            let log = Log::open(storage(&sim), clock(), dir(), OPTS)
                .await
                .unwrap();
            let acked: Rc<RefCell<Vec<(u64, Bytes)>>> = Rc::default();
            let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
            let writers: Vec<_> = (0..4)
                .map(|w| {
                    let log = log.clone();
                    let acked = acked.clone();
                    glommio::spawn_local(async move {
                        for seq in 0..40 {
                            let body = payload(w, seq);
                            if let Ok(offset) = log.append(body.clone()).await {
                                acked.borrow_mut().push((offset, body));
                            }
                        }
                    })
                })
                .collect();
            // Cut the power after a random number of scheduler turns, with a random torn tail per file.
            for _ in 0..rng.below(300) {
                futures_lite::future::yield_now().await;
            }
            let acked_at_cut = acked.borrow().clone();
            let torn = rng.next();
            let image = sim.power_cut(|_, unsynced| (torn as usize) % (unsynced + 1));
            for w in writers {
                w.await;
            }
            let reopened = check_survivors(&image, &acked_at_cut).await;
            // The log goes on from where the cut left it: offsets stay contiguous.
            let end = reopened.end_offset();
            assert_eq!(
                reopened.append(Bytes::from_static(b"after")).await.unwrap(),
                end,
                "seed {seed}"
            );
            assert_eq!(&reopened.read(end).await.unwrap().payload[..], b"after");
        });
    }
}

#[test]
fn a_failed_sync_is_never_acknowledged_and_refuses_appends_until_restart() {
    run(async {
        let sim = Sim::new();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        let first = log.append(Bytes::from_static(b"kept")).await.unwrap();
        sim.fail_syncs(libc::EIO, 1);
        assert!(matches!(
            log.append(Bytes::from_static(b"lost")).await,
            Err(AppendError::Io(_))
        ));
        // Nothing of the failed batch is readable, and the log does not retry the sync into a false success.
        assert_eq!(log.end_offset(), first + 1);
        assert!(matches!(log.read(first + 1).await, Err(ReadError::NotYet)));
        assert!(matches!(
            log.append(Bytes::from_static(b"later")).await,
            Err(AppendError::Poisoned)
        ));
        // A restart rescans what is on the medium and appends again.
        let image = sim.power_cut(|_, _| 0);
        let reopened = check_survivors(&image, &[(first, Bytes::from_static(b"kept"))]).await;
        let next = reopened.append(Bytes::from_static(b"again")).await.unwrap();
        assert_eq!(next, reopened.end_offset() - 1);
    });
}

#[test]
fn a_full_disk_refuses_the_write_and_recovers_without_restart() {
    run(async {
        let sim = Sim::new();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        assert_eq!(log.append(Bytes::from_static(b"a")).await.unwrap(), 0);
        sim.fail_writes(libc::ENOSPC, 2);
        assert!(matches!(
            log.append(Bytes::from_static(b"b")).await,
            Err(AppendError::NoSpace)
        ));
        assert!(matches!(
            log.append(Bytes::from_static(b"c")).await,
            Err(AppendError::NoSpace)
        ));
        // Space is back: the next append takes the next offset, with no hole and no trace of the refused ones.
        assert_eq!(log.append(Bytes::from_static(b"d")).await.unwrap(), 1);
        assert_eq!(&log.read(1).await.unwrap().payload[..], b"d");
        check_survivors(
            &sim.power_cut(|_, _| 0),
            &[(0, Bytes::from_static(b"a")), (1, Bytes::from_static(b"d"))],
        )
        .await;
    });
}

#[test]
fn an_eio_write_is_rolled_back_and_the_log_goes_on() {
    run(async {
        let sim = Sim::new();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        sim.fail_writes(libc::EIO, 1);
        assert!(matches!(
            log.append(Bytes::from_static(b"x")).await,
            Err(AppendError::Io(_))
        ));
        assert_eq!(log.append(Bytes::from_static(b"y")).await.unwrap(), 0);
        assert_eq!(&log.read(0).await.unwrap().payload[..], b"y");
    });
}

#[test]
fn bit_flips_in_random_frames_never_panic_and_spare_every_untouched_frame() {
    let path = dir().join("00000000000000000000.log");
    for trial in 0..1000u64 {
        run({
            let path = path.clone();
            async move {
                let sim = Sim::new();
                let opts = LogOptions {
                    segment_bytes: 1 << 20,
                    ..OPTS
                };
                let log = Log::open(storage(&sim), clock(), dir(), opts)
                    .await
                    .unwrap();
                let mut bodies = Vec::new();
                for i in 0..20 {
                    let body = payload(0, i + trial as usize % 7);
                    log.append(body.clone()).await.unwrap();
                    bodies.push(body);
                }
                log.close().await;
                // Flip 1–3 random bits anywhere in the segment and remember which frames they hit.
                let file = sim.contents(&path).unwrap();
                let mut frame_starts = Vec::new();
                let mut pos = 0usize;
                for b in &bodies {
                    frame_starts.push(pos);
                    pos += super::frame::encoded_len(b.len());
                }
                let mut rng = Rng(trial.wrapping_mul(0x2545_f491) + 7);
                let mut hit = vec![false; bodies.len()];
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(file.len() as u64) as usize;
                    sim.corrupt(&path, at, 1 << rng.below(8));
                    hit[frame_starts.partition_point(|&s| s <= at) - 1] = true;
                }
                let reopened = Log::open(storage(&sim), clock(), dir(), opts)
                    .await
                    .expect("reopen after bit flips");
                for (offset, body) in bodies.iter().enumerate() {
                    match reopened.read(offset as u64).await {
                        Ok(r) => assert_eq!(&r.payload, body, "trial {trial}: offset {offset} read wrong data"),
                        Err(e) => assert!(hit[offset], "trial {trial}: untouched offset {offset} unreadable: {e:?}, hits {hit:?}"),
                    }
                }
                // The same through one read-ahead over the whole batch, as a consume batch reads.
                let mut ahead = ReadAhead::default();
                for (offset, body) in bodies.iter().enumerate() {
                    match reopened.read_ahead(offset as u64, bodies.len() as u64, &mut ahead).await {
                        Ok(r) => assert_eq!(&r.payload, body, "trial {trial}: offset {offset} read ahead wrong data"),
                        Err(e) => assert!(hit[offset], "trial {trial}: untouched offset {offset} unreadable ahead: {e:?}, hits {hit:?}"),
                    }
                }
            }
        });
    }
}

#[test]
fn a_frontier_replace_is_old_or_new_after_a_cut() {
    run(async {
        let sim = Sim::new();
        let disk = SimStorage(sim.clone());
        crate::partition::frontier::write(&disk, &dir().join("consumer.offset"), 5)
            .await
            .unwrap();
        let before = sim.power_cut(|_, _| 0);
        crate::partition::frontier::write(&disk, &dir().join("consumer.offset"), 9)
            .await
            .unwrap();
        let after = sim.power_cut(|_, _| 0);
        assert_eq!(
            crate::partition::frontier::read(&SimStorage(before), &dir().join("consumer.offset"))
                .unwrap(),
            5
        );
        assert_eq!(
            crate::partition::frontier::read(&SimStorage(after), &dir().join("consumer.offset"))
                .unwrap(),
            9
        );
        sim.fail_syncs(libc::EIO, 1);
        assert!(
            crate::partition::frontier::write(&disk, &dir().join("consumer.offset"), 12)
                .await
                .is_err()
        );
        // The page cache may show the new value (it was settled: reading it is no harm), but a failed write is not
        // durable: a cut leaves the old one, never a torn file.
        let seen = crate::partition::frontier::read(&disk, &dir().join("consumer.offset")).unwrap();
        assert!(seen == 9 || seen == 12, "a failed write left {seen}");
        assert_eq!(
            crate::partition::frontier::read(
                &SimStorage(sim.power_cut(|_, n| n)),
                &dir().join("consumer.offset")
            )
            .unwrap(),
            9,
            "a failed write must not reach the medium"
        );
    });
}

#[test]
fn reading_ahead_returns_what_single_reads_return_with_one_read_per_run() {
    run(async {
        let sim = Sim::new();
        // Small segments, so runs cross segment boundaries (a sealed segment is reopened for its reads).
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        let mut bodies = Vec::new();
        for i in 0..300 {
            let body = payload(i % 3, i);
            bodies.push(body.clone());
            log.append(body).await.unwrap();
        }
        let n = bodies.len() as u64;
        let mut rng = Rng(42);
        for _ in 0..200 {
            let from = rng.below(n);
            let until = (from + 1 + rng.below(64)).min(n);
            let mut ahead = ReadAhead::default();
            for offset in from..until {
                let r = log.read_ahead(offset, until, &mut ahead).await.unwrap();
                assert_eq!(
                    r.payload, bodies[offset as usize],
                    "offset {offset} of {from}..{until}"
                );
                assert_eq!(r.offset, offset);
            }
            // Out of order and past `until`: still right, read afresh.
            let back = rng.below(n);
            let r = log.read_ahead(back, until, &mut ahead).await.unwrap();
            assert_eq!(r.payload, bodies[back as usize]);
        }
        // A run inside one segment costs one read; one record per read without read-ahead.
        let seg_len = OPTS.segment_bytes as usize;
        let per_segment = seg_len / super::frame::encoded_len(bodies[0].len() + 100);
        assert!(
            per_segment >= 4,
            "the test needs several records per segment"
        );
        let before = sim.reads();
        let mut ahead = ReadAhead::default();
        let run_end = n - 2;
        let run_start = run_end - 3;
        for offset in run_start..run_end {
            log.read_ahead(offset, run_end, &mut ahead).await.unwrap();
        }
        let ahead_reads = sim.reads() - before;
        let before = sim.reads();
        for offset in run_start..run_end {
            log.read(offset).await.unwrap();
        }
        let single_reads = sim.reads() - before;
        assert_eq!(single_reads, 3);
        assert!(ahead_reads <= 2, "a run of 3 took {ahead_reads} reads");
        // Records not yet in the log are not read ahead (nor handed out).
        assert!(matches!(
            log.read_ahead(n, n + 10, &mut ReadAhead::default()).await,
            Err(ReadError::NotYet)
        ));
    });
}

#[test]
fn the_tail_cache_serves_recent_records_without_a_read_and_never_a_refused_batch() {
    for cap in [100u32, 1024, 4096] {
        run(async move {
            let sim = Sim::new();
            let opts = LogOptions {
                tail_cache_bytes: cap,
                ..OPTS
            };
            let log = Log::open(storage(&sim), clock(), dir(), opts)
                .await
                .unwrap();
            let mut acked: Vec<(u64, Bytes)> = Vec::new();
            let mut rng = Rng(u64::from(cap));
            for i in 0..120 {
                let body = payload(0, i % 40);
                if rng.below(5) == 0 {
                    // A refused write leaves nothing behind, in the file or in the tail.
                    sim.fail_writes(libc::EIO, 1);
                    assert!(log.append(payload(9, i)).await.is_err());
                }
                let offset = log.append(body.clone()).await.unwrap();
                assert_eq!(
                    &log.read(offset).await.unwrap().payload,
                    &body,
                    "cap {cap}: offset {offset}"
                );
                acked.push((offset, body));
                // Reads right behind the producer, as a consumer keeping up does.
                let (o, b) = &acked[rng.below(acked.len() as u64) as usize];
                assert_eq!(
                    &log.read(*o).await.unwrap().payload,
                    b,
                    "cap {cap}: offset {o}"
                );
            }
            for (o, b) in &acked {
                assert_eq!(
                    &log.read(*o).await.unwrap().payload,
                    b,
                    "cap {cap}: offset {o}"
                );
            }
            // The newest record is in the tail: no read reaches the disk.
            let (last, body) = acked.last().unwrap();
            if crate::storage::frame::encoded_len(body.len()) <= cap as usize {
                let before = sim.reads();
                assert_eq!(&log.read(*last).await.unwrap().payload, body);
                assert_eq!(
                    sim.reads(),
                    before,
                    "cap {cap}: the newest record was read from the disk"
                );
            }
            // The oldest one is not (the tail holds at most `cap` bytes).
            let before = sim.reads();
            log.read(acked[0].0).await.unwrap();
            assert_eq!(sim.reads(), before + 1);
        });
    }
}

/// Cuts power at every step of a small-file replacement (the real disk's algorithm over the simulated calls: temp
/// file, sync, rename, sync; or an overwrite in place and a sync), with every choice of what reached the medium, and
/// checks that the file holds its old content or its new one, never an empty or torn one.
#[test]
fn a_small_file_replacement_is_old_or_new_at_every_step_of_a_cut() {
    let path = dir().join("consumer.offset");
    let old = crate::partition::frontier::encode(5);
    let new = crate::partition::frontier::encode(9);
    for existing in [false, true] {
        for in_place in [false, true] {
            run({
                let (path, old, new) = (path.clone(), old.clone(), new.clone());
                async move {
                    let sim = Sim::new();
                    let disk: Rc<dyn Storage> = storage(&sim);
                    if existing {
                        disk.replace(&path, old.clone()).await.unwrap();
                    }
                    sim.hold_syncs();
                    let done = Rc::new(std::cell::Cell::new(false));
                    let task = glommio::spawn_local({
                        let (disk, path, new, done) =
                            (disk.clone(), path.clone(), new.clone(), done.clone());
                        async move {
                            let bytes = new.clone();
                            if in_place {
                                disk.overwrite_small(&path, bytes).await.unwrap();
                            } else {
                                disk.replace(&path, bytes).await.unwrap();
                            }
                            done.set(true);
                        }
                    });
                    let mut step = 0;
                    while !done.get() {
                        step += 1;
                        assert!(step < 1000, "the replacement never ended");
                        // Every choice for each file: nothing unsynced reached the medium, all of it, a torn half;
                        // and for a rename not yet durable, lost or kept.
                        for choice in 0..6u32 {
                            let mut calls = std::collections::HashMap::new();
                            let image = sim.power_cut(|p, unsynced| {
                                let n: &mut u32 = calls.entry(p.to_path_buf()).or_default();
                                *n += 1;
                                if *n == 1 {
                                    match choice % 3 {
                                        0 => 0,
                                        1 => unsynced,
                                        _ => unsynced / 2,
                                    }
                                } else {
                                    (choice / 3) as usize
                                }
                            });
                            let found = image.contents(&path);
                            let fine = match &found {
                                Some(bytes) => *bytes == old && existing || *bytes == new,
                                None => !existing,
                            };
                            assert!(
                                fine,
                                "existing {existing}, in place {in_place}, step {step}, choice {choice}: a cut leaves {found:?} (old {old:?}, new {new:?})"
                            );
                        }
                        if sim.held_syncs() > 0 {
                            sim.release_syncs();
                            futures_lite::future::yield_now().await;
                            sim.hold_syncs();
                        } else {
                            futures_lite::future::yield_now().await;
                        }
                    }
                    sim.release_syncs();
                    task.await;
                    assert_eq!(sim.power_cut(|_, _| 0).contents(&path), Some(new.clone()));
                }
            });
        }
    }
}

/// A sync that fails drops the pages it should have written (as Linux does): a later sync that succeeds does not
/// write them, so a power cut loses them although every read saw them.
#[test]
fn a_failed_sync_drops_its_pages_for_good_and_a_rewrite_brings_them_back() {
    run(async {
        let sim = Sim::new();
        let disk = storage(&sim);
        let path = dir().join("f");
        let file = disk.open(&path, true).await.unwrap();
        disk.sync_dir(dir()).await.unwrap();
        file.write_at(b"aaaa", 0).unwrap();
        file.sync().await.unwrap();
        file.write_at(b"bbbb", 4).unwrap();
        sim.fail_syncs(libc::EIO, 1);
        assert!(file.sync().await.is_err());
        file.sync().await.unwrap();
        assert_eq!(
            sim.contents(&path).unwrap(),
            b"aaaabbbb",
            "reads still see the pages"
        );
        assert_eq!(
            sim.power_cut(|_, _| 0).contents(&path).unwrap(),
            b"aaaa\0\0\0\0",
            "the dropped pages never reached the medium"
        );
        file.write_at(b"cc", 4).unwrap();
        file.sync().await.unwrap();
        assert_eq!(
            sim.power_cut(|_, _| 0).contents(&path).unwrap(),
            b"aaaacc\0\0",
            "what is written again is synced again"
        );
        sim.lie_syncs(1);
        file.write_at(b"dd", 6).unwrap();
        file.sync().await.unwrap();
        assert_eq!(
            sim.power_cut(|_, _| 0).contents(&path).unwrap(),
            b"aaaacc\0\0",
            "a lying sync makes nothing durable"
        );
    });
}

/// Only a file that carries its own checksum (`overwrite_small`, at most 512 bytes) may be overwritten in place: a
/// `replace` (topic.json, a group's first frontier file) always goes through a temp file and a rename, whatever its
/// size, so a device that tears a sector can never leave it half old, half new.
#[test]
fn a_replace_goes_through_a_temp_file_even_when_an_overwrite_in_place_would_fit() {
    run(async {
        let sim = Sim::new();
        let disk = storage(&sim);
        let path = dir().join("topic.json");
        let tmp = dir().join("topic.json.tmp");
        disk.replace(&path, b"{\"old\":1}".to_vec()).await.unwrap();
        sim.hold_syncs();
        let task = glommio::spawn_local({
            let (disk, path) = (disk.clone(), path.clone());
            async move { disk.replace(&path, b"{\"new\":2}".to_vec()).await }
        });
        while sim.held_syncs() == 0 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(
            sim.contents(&path).unwrap(),
            b"{\"old\":1}",
            "overwritten in place"
        );
        assert_eq!(sim.contents(&tmp).unwrap(), b"{\"new\":2}");
        sim.release_syncs();
        task.await.unwrap();
        assert_eq!(sim.contents(&path).unwrap(), b"{\"new\":2}");
        // And an overwrite in place is for small files only.
        let big = vec![7u8; 600];
        disk.replace(&path, big.clone()).await.unwrap();
        sim.hold_syncs();
        let task = glommio::spawn_local({
            let (disk, path) = (disk.clone(), path.clone());
            async move { disk.overwrite_small(&path, vec![8u8; 600]).await }
        });
        while sim.held_syncs() == 0 {
            futures_lite::future::yield_now().await;
        }
        assert_eq!(
            sim.contents(&path).unwrap(),
            big,
            "600 bytes overwritten in place"
        );
        sim.release_syncs();
        task.await.unwrap();
    });
}

/// Files in a partition's directory that are not segments (a `.log` whose name is not 20 digits: a stray copy, an
/// editor's backup) are passed over: the log opens, its records read back, and the stray file is left as it is.
#[test]
fn a_file_that_is_not_a_segment_is_passed_over_at_open() {
    run(async {
        let sim = Sim::new();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        let mut acked = Vec::new();
        for seq in 0..3 {
            let body = payload(0, seq);
            acked.push((log.append(body.clone()).await.unwrap(), body));
        }
        log.close().await;
        let s = storage(&sim);
        for stray in ["5.log", "000000000000000000000.log", "-1.log", "abc.log"] {
            s.replace(&dir().join(stray), b"not a segment".to_vec())
                .await
                .unwrap();
        }
        let log = check_survivors(&sim, &acked).await;
        assert_eq!(log.append(payload(0, 3)).await.unwrap(), 3);
        assert!(s.list(dir()).unwrap().contains(&"5.log".to_string()));
    });
}

/// A segment lost from the middle of a log (deleted by hand, a failed restore) leaves a gap between its neighbours:
/// at open, the gap's offsets are recorded as unreadable (skipped, never delivered), and what lies on both sides
/// reads back.
#[test]
fn a_segment_missing_between_two_others_is_recorded_as_a_gap_at_open() {
    run(async {
        let sim = Sim::new();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        let mut acked = Vec::new();
        let s = storage(&sim);
        let mut seq = 0;
        while segment_names(&sim).len() < 4 {
            // Bounded: a log that never rolls fails here instead of hanging the suite.
            assert!(seq < 10_000, "4 segments not reached after {seq} appends");
            let body = payload(0, seq);
            acked.push((log.append(body.clone()).await.unwrap(), body));
            seq += 1;
        }
        log.close().await;
        let segments = segment_names(&sim);
        let base = |name: &str| name.trim_end_matches(".log").parse::<u64>().unwrap();
        let (lost_from, lost_to) = (base(&segments[1]), base(&segments[2]));
        assert!(lost_from < lost_to, "{segments:?}");
        s.remove(&dir().join(&segments[1])).await.unwrap();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .expect("the log opens with a segment missing");
        for offset in lost_from..lost_to {
            assert_eq!(
                log.corrupt_run_end(offset),
                Some(lost_to),
                "offset {offset} of the missing segment is not recorded as unreadable"
            );
        }
        for (offset, body) in acked
            .iter()
            .filter(|(o, _)| *o < lost_from || *o >= lost_to)
        {
            assert_eq!(
                &log.read(*offset).await.unwrap().payload,
                body,
                "offset {offset}"
            );
            assert_eq!(log.corrupt_run_end(*offset), None, "offset {offset}");
        }
    });
}

/// The segment files in the test partition's directory, in offset order.
fn segment_names(sim: &Rc<Sim>) -> Vec<String> {
    let mut names: Vec<String> = storage(sim)
        .list(dir())
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".log"))
        .collect();
    names.sort();
    names
}

/// A log on `sim` with `n` records appended (one segment), closed: their bodies and the segment's path.
async fn one_closed_segment(sim: &Rc<Sim>, n: usize) -> (Vec<Bytes>, std::path::PathBuf) {
    let log = Log::open(storage(sim), clock(), dir(), OPTS).await.unwrap();
    let bodies: Vec<Bytes> = (0..n).map(|i| payload(0, i)).collect();
    for b in &bodies {
        log.append(b.clone()).await.unwrap();
    }
    log.close().await;
    let path = dir().join("00000000000000000000.log");
    assert!(sim.contents(&path).is_some(), "one segment holds them");
    (bodies, path)
}

/// A frame damaged in the middle of a segment is found at open and recorded as one unreadable offset (never
/// delivered, counted as corrupt), its neighbours untouched.
#[test]
fn a_frame_damaged_in_the_middle_is_one_unreadable_offset_at_open() {
    run(async {
        let sim = Sim::new();
        let (bodies, path) = one_closed_segment(&sim, 5).await;
        let start_of_2: usize = bodies[..2]
            .iter()
            .map(|b| super::frame::encoded_len(b.len()))
            .sum();
        // A byte of frame 2's payload (past its 32-byte header).
        sim.corrupt(&path, start_of_2 + 32 + 1, 0x40);
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        assert_eq!(
            log.corrupt_run_end(2),
            Some(3),
            "offset 2 recorded unreadable"
        );
        for offset in [0, 1, 3, 4] {
            assert_eq!(log.corrupt_run_end(offset), None, "offset {offset}");
            assert_eq!(
                log.read(offset).await.unwrap().payload,
                bodies[offset as usize]
            );
        }
        assert!(matches!(log.read(2).await, Err(ReadError::Corrupt)));
        assert_eq!(log.end_offset(), 5);
    });
}

/// Bytes after the last whole frame of the last segment (a write torn by a crash) are cut at open, so the segment
/// ends at its last frame and the next append follows it; after another reopen every record reads back.
#[test]
fn a_torn_tail_is_cut_at_open_and_the_next_append_follows_the_last_frame() {
    run(async {
        let sim = Sim::new();
        let (bodies, path) = one_closed_segment(&sim, 3).await;
        let whole: usize = bodies
            .iter()
            .map(|b| super::frame::encoded_len(b.len()))
            .sum();
        // Non-zero bytes after the last frame (the file may have a zeroed reserve there).
        let file = storage(&sim).open(&path, false).await.unwrap();
        file.write_at(&[0x5a; 300], whole as u64).unwrap();
        file.sync().await.unwrap();
        drop(file);
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        assert_eq!(
            sim.contents(&path).unwrap().len(),
            whole,
            "the torn tail is cut at open"
        );
        assert_eq!(log.append(Bytes::from_static(b"d")).await.unwrap(), 3);
        log.close().await;
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        assert_eq!(log.end_offset(), 4);
        for (offset, body) in bodies.iter().enumerate() {
            assert_eq!(&log.read(offset as u64).await.unwrap().payload, body);
        }
        assert_eq!(&log.read(3).await.unwrap().payload[..], b"d");
    });
}

/// Appends queued together are written as one batch only while they fit the segment size: two records of 3,000 bytes
/// queued at once against 4 KiB segments go to two segments, each within its size (a batch past it would make a
/// segment larger than `segment_bytes`, which a follower takes only at a segment's start), and both read back.
#[test]
fn appends_queued_together_never_batch_past_the_segment_size() {
    run(async {
        let sim = Sim::new();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        let bodies = [Bytes::from(vec![b'a'; 3000]), Bytes::from(vec![b'b'; 3000])];
        let (a, b) =
            futures_lite::future::zip(log.append(bodies[0].clone()), log.append(bodies[1].clone()))
                .await;
        assert_eq!((a.unwrap(), b.unwrap()), (0, 1));
        log.close().await;
        let segments = segment_names(&sim);
        assert_eq!(segments.len(), 2, "{segments:?}");
        for name in &segments {
            let len = sim.contents(&dir().join(name)).unwrap().len();
            assert!(len <= OPTS.segment_bytes as usize, "{name}: {len} bytes");
        }
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        for (offset, body) in bodies.iter().enumerate() {
            assert_eq!(&log.read(offset as u64).await.unwrap().payload, body);
        }
    });
}

/// A segment takes appends until they fill it exactly, and rolls only before one that would take it past
/// `segment_bytes` (`docs/format.md`): two frames of 2,048 bytes fill a 4 KiB segment, the third starts the next.
#[test]
fn a_segment_is_filled_to_exactly_its_size_before_it_rolls() {
    run(async {
        let sim = Sim::new();
        let log = Log::open(storage(&sim), clock(), dir(), OPTS)
            .await
            .unwrap();
        let body = Bytes::from(vec![b'f'; 2048 - 32]);
        for offset in 0..3 {
            assert_eq!(log.append(body.clone()).await.unwrap(), offset);
        }
        log.close().await;
        let segments = segment_names(&sim);
        let bases: Vec<u64> = segments
            .iter()
            .map(|n| n.trim_end_matches(".log").parse().unwrap())
            .collect();
        assert_eq!(bases, [0, 2], "{segments:?}");
    });
}
