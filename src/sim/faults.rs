//! The faults: process kills and power cuts (after a step settled, with syncs held in flight, right after a failed
//! sync), failed writes, syncs and reads, and bit flips in segments.

use super::*;

/// Holds every sync, then starts one to three produces (`produce_percent` of them) and consumes and lets them run
/// until they wait for a sync: the process is then cut or killed in the middle of their steps.
pub(super) async fn in_flight_at_held_syncs(
    world: &World,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
    produce_percent: u64,
) {
    world.sim.hold_syncs();
    for _ in 0..1 + rng.below(3) {
        if rng.chance(produce_percent) {
            spawn_produce(world, oracle, rng);
        } else {
            spawn_consume(world, oracle, rng);
        }
    }
    world.clock.advance(rng.below(60));
    world.settle().await;
}

/// Some log refuses appends after a failed sync (until a restart).
pub(super) fn any_poisoned(world: &World) -> bool {
    world.engines.iter().any(|e| {
        e.owned_partitions()
            .iter()
            .any(|(_, p)| p.log.is_poisoned())
    })
}

/// Flips a byte in a frame of some segment (often the last frame of the newest one), excusing that record.
pub(super) fn corrupt(world: &World, oracle: &Rc<RefCell<Oracle>>, rng: &mut Rng) {
    let topic = topics_now()[rng.below(4) as usize];
    let Some(&topic_id) = oracle.borrow().ids.get(topic) else {
        return;
    };
    let Ok(t) = world.fronts[0].engine().topic(topic) else {
        return;
    };
    let mut p = rng.below(t.partition_count() as u64) as u32;
    // Often, the dangerous case on purpose: a partition whose every record is settled and whose frontiers are on
    // disk, so losing its last frame leaves the durable frontier beyond what recovery finds.
    let settled: Vec<u32> = world
        .engines
        .iter()
        .filter_map(|e| e.topic(topic).ok())
        .flat_map(|t| {
            t.owned_partitions()
                .filter(|p| {
                    let end = p.log.end_offset();
                    end > 0 && GROUPS.iter().all(|g| p.committed(g) == Some(end))
                })
                .map(|p| p.id)
                .collect::<Vec<_>>()
        })
        .collect();
    if !settled.is_empty() && rng.chance(50) {
        p = settled[rng.below(settled.len() as u64) as usize];
    }
    let dir = PathBuf::from(format!("/sim/topics/{topic}/{p}"));
    let mut segments: Vec<PathBuf> = world
        .sim
        .paths()
        .into_iter()
        .filter(|path| {
            path.parent() == Some(dir.as_path()) && path.extension().is_some_and(|e| e == "log")
        })
        .collect();
    segments.sort();
    let Some(path) = (if rng.chance(70) {
        segments.last().cloned()
    } else {
        segments
            .get(rng.below(segments.len() as u64) as usize)
            .cloned()
    }) else {
        return;
    };
    let Some(bytes) = world.sim.contents(&path) else {
        return;
    };
    let base: u64 = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let scan = crate::storage::frame::scan(&bytes, base, 512);
    let frames: Vec<(usize, u64)> = scan
        .positions
        .iter()
        .enumerate()
        .filter(|(_, &pos)| pos != crate::storage::frame::NO_POSITION)
        .map(|(i, &pos)| (pos as usize, base + i as u64))
        .collect();
    let Some(&(pos, offset)) = (if rng.chance(60) {
        frames.last()
    } else {
        frames.get(rng.below(frames.len() as u64) as usize)
    }) else {
        return;
    };
    let end = frames
        .iter()
        .find(|(q, _)| *q > pos)
        .map_or(scan.valid_len as usize, |(q, _)| *q);
    let at = pos + rng.below((end - pos).max(1) as u64) as usize;
    // The body the flip damages (a copy in the dead-letter or redriven topic may not have been seen yet).
    let damaged = crate::storage::frame::decode_frame(&bytes[pos..], offset, 512)
        .ok()
        .map(|(_, payload)| String::from_utf8_lossy(payload).to_string());
    world.sim.corrupt(&path, at, 1 << rng.below(8));
    let mut o = oracle.borrow_mut();
    if let Some(body) = damaged {
        if o.produced.contains_key(&body) {
            o.excused.insert(body);
        }
    }
    let hit: Vec<String> = o
        .produced
        .iter()
        .filter(|(_, r)| r.topic_id == topic_id && r.place == Some((p, offset)))
        .map(|(body, _)| body.clone())
        .collect();
    o.excused.extend(hit);
    if let Some(body) = o.copy_places.get(&(topic_id, p, offset)).cloned() {
        o.excused.insert(body);
    }
    o.note(format!(
        "flipped a bit of {topic} {p}:{offset} at byte {at} of {}",
        path.display()
    ));
}

/// A process crash (kill -9), often in the middle of two-step operations (a dead letter's copy and settle, a
/// redrive's append and ack, a frontier file's temp write and rename), held at their syncs.
pub(super) async fn kill(
    world: &World,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
    step: usize,
) -> Outcome {
    let how = if rng.chance(40) {
        in_flight_at_held_syncs(world, oracle, rng, 50).await;
        " with syncs in flight"
    } else {
        ""
    };
    oracle
        .borrow_mut()
        .note(format!("step {step}: process crash (kill -9){how}"));
    Outcome::Crash
}

/// A power cut: after the step settled, with syncs in flight (replies sent before their sync are acknowledged
/// losses now), or right after a failed sync (it dropped its pages: whatever it answered as durable is lost now).
pub(super) async fn power_cut(
    world: &World,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
    step: usize,
) -> Outcome {
    let how = match rng.below(3) {
        0 => "after the step settled",
        1 => {
            in_flight_at_held_syncs(world, oracle, rng, 60).await;
            "with syncs in flight"
        }
        _ => {
            world.sim.fail_syncs(libc::EIO, 1);
            world.faults_injected.set(true);
            for _ in 0..1 + rng.below(2) {
                spawn_produce(world, oracle, rng);
            }
            world.clock.advance(rng.below(60));
            world.settle().await;
            "right after a failed sync"
        }
    };
    oracle
        .borrow_mut()
        .note(format!("step {step}: power cut {how}"));
    Outcome::PowerCut(rng.next())
}

/// Arms a fault for the next I/O calls: one to three failed writes (EIO or ENOSPC), a failed sync, or one or two
/// failed reads (fewer in a process than make a record count as corrupt: it would be skipped, a loss by design,
/// `partition::MAX_READ_FAILURES`).
pub(super) fn inject_fault(
    world: &World,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
    step: usize,
) {
    let what = match rng.below(3) {
        0 => {
            let errno = if rng.chance(50) {
                libc::EIO
            } else {
                libc::ENOSPC
            };
            let count = 1 + rng.below(3) as u32;
            world.sim.fail_writes(errno, count);
            format!("the next {count} writes fail with errno {errno}")
        }
        1 => {
            world.sim.fail_syncs(libc::EIO, 1);
            "the next sync fails".to_string()
        }
        _ => {
            let left = world.read_faults_left.get();
            let count = (1 + rng.below(2) as u32).min(left);
            world.read_faults_left.set(left - count);
            world.sim.fail_reads(libc::EIO, count);
            format!("the next {count} reads fail")
        }
    };
    world.faults_injected.set(true);
    oracle.borrow_mut().note(format!("step {step}: {what}"));
}
