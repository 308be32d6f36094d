//! A seeded, deterministic simulation of berth's owner-core layers: one to three engines (cores) with their fronts,
//! wired by a simulated mesh (`net`), on the simulated disk (`storage::sim`) and a manual clock, all on one executor.
//! A seeded random workload produces, consumes (parking with long-polls), acks, nacks with and without delays,
//! extends, lets leases expire, dead-letters, changes delivery policies, deletes and recreates a topic, flips bits
//! in segments, redrives dead letters, presents stale receipt handles, fails writes and syncs (a failed sync drops
//! its pages, as Linux does), and kills the process or cuts the power — after a step has settled, while syncs are
//! in flight, or right after a failed sync; after every step it checks, against an oracle of what clients were
//! told:
//!
//! * nothing acknowledged is lost (at the end, after draining, every acknowledged produce was acknowledged by a
//!   client in every group of its topic, or its dead-letter copy was, or that copy's redriven copy was; every
//!   frontier reached its log's end);
//! * nothing unproduced is delivered, and a record is always the same bytes at the same place;
//! * no live lease is held twice, a live lease is never refused, and a settled offset is not handed out again by
//!   the same process;
//! * no frontier moves backwards, in memory or on disk;
//! * no parked consumer sleeps while a message is deliverable to it.
//!
//! A failing seed prints itself; `BERTH_SIM_SEED=N cargo test --release --lib sim::` replays it exactly, and
//! `BERTH_SIM_SEEDS=20000` runs that many seeds (the default run covers a thousand, in a few seconds);
//! `BERTH_SIM_TRACE=1` (with `-- --nocapture`) prints every event, each start's files and journal replay, and the
//! small-file calls on the simulated disk as they happen.
//!
//! The rooms (the split of Iggy's simulator): this file is the driver (a seed's processes, one after another, and
//! each process's steps); `world.rs` the simulated process and how the driver waits for it; `workload.rs` the plan
//! and the client operations; `oracle.rs` what clients were told; `faults.rs` kills, power cuts, I/O faults and bit
//! flips; `checks.rs` the checks after each step and the drain at the end; `net.rs` the simulated mesh;
//! `tests.rs` the seeds in the suite and targeted scenarios; `nodes/` the same extended to three replicating nodes
//! (its own driver, network, etcd and oracle).

mod checks;
mod faults;
mod net;
pub(crate) mod nodes;
mod oracle;
#[cfg(test)]
pub(super) mod tests;
mod workload;
mod world;

use checks::*;
use faults::*;
use oracle::*;
use workload::*;
use world::*;

use crate::clock::{Clock, ManualClock};
use crate::config::{Config, FsyncPolicy};
use crate::engine::topic::{BackoffKind, TopicConfig};
use crate::engine::{Engine, Shared};
use crate::front::Front;
use crate::ops::consume::ConsumeParams;
use crate::ops::produce::{ClientRecord, ProduceParams, Target};
use crate::ops::settle::SettleParams;
use crate::ops::topics::Settings;
use crate::ops::OpError;
use crate::partition::{Delivery, PartitionError, SettleOp, DEFAULT_GROUP};
use crate::storage::backend::Storage;
use crate::storage::sim::{Sim, SimStorage};
use crate::transport::{Router, RouterPeers};
use bytes::Bytes;
use net::SimNet;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A small deterministic generator (splitmix64 seeding, xorshift64*), so a seed replays exactly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Runs one seed to the end (panics with the seed and the recent events on a violation), on an executor of its
/// own.
pub fn run_seed(seed: u64) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(run_seed_here(seed));
}

/// Runs one seed on the current executor. Each simulated process ("world") ends with all its tasks cancelled, so
/// many seeds can share one executor (glommio keeps a descriptor per executor until the thread ends).
pub async fn run_seed_here(seed: u64) {
    if std::env::var_os("BERTH_SIM_TRACE").is_some() {
        eprintln!("seed {seed} starts");
    }
    let plan = Plan::for_seed(seed);
    let oracle = Rc::new(RefCell::new(Oracle {
        seed,
        ..Oracle::default()
    }));
    let mut rng = Rng::new(seed);
    let mut image = Sim::new();
    let mut wall_ms = 1_700_000_000_000u64;
    let mut step = 0usize;
    let mut first = true;
    loop {
        let world = World::boot(&plan, image.clone(), wall_ms, seed).await;
        if first {
            create_topics(&world, &plan, &oracle).await;
        } else {
            check_durable_frontiers(&world, &mut oracle.borrow_mut());
        }
        let outcome = run_world(&world, &plan, &oracle, &mut rng, &mut step).await;
        // The disk as the process leaves it, taken before the shutdown below writes anything; then the process's
        // held syncs go on, so its tasks can end.
        if matches!(outcome, Outcome::PowerCut(_)) && world.journals_delaying() {
            COVERAGE.cuts_in_delay.fetch_add(1, Ordering::Relaxed);
        }
        world.count_journal_coverage();
        let next = match outcome {
            Outcome::Crash => Some(world.sim.process_crash()),
            Outcome::PowerCut(torn) => {
                let mut t = Rng::new(torn);
                Some(
                    world
                        .sim
                        .power_cut(|_, unsynced| t.below(unsynced as u64 + 1) as usize),
                )
            }
            Outcome::Done => None,
        };
        world.sim.release_syncs();
        wall_ms = world.clock.wall_ms() + 1000;
        world.shut_down().await;
        first = false;
        {
            let mut o = oracle.borrow_mut();
            // The process is gone: its leases and in-memory frontiers with it.
            o.leases.clear();
            o.nacking.clear();
            o.settled.clear();
            o.frontier_mem.clear();
        }
        match next {
            Some(next) => image = next,
            None => return,
        }
    }
}

/// Simulated time after which an operation the driver waits for (`World::complete`) counts as stuck: ten
/// minutes, far beyond any lease, long-poll, retry or delay of the simulation's configuration.
const STUCK_MS: u64 = 600_000;

/// Yields per round of a settle: it ends after a round in which no net message was delivered.
const SETTLE_YIELDS: usize = 40;

/// Rounds of `SETTLE_YIELDS` yields a settle may take before the world counts as livelocked (over the default
/// 1,000 seeds none took more than 2).
const SETTLE_ROUNDS: usize = 1_000;

/// What the seeds run so far exercised of the journal's commit delay (the default run checks each is not 0).
struct Coverage {
    /// Journal passes that carried several partitions' entries.
    shared_passes: AtomicU64,
    /// Times a log waited in `Journal::next_pass`.
    next_pass_waits: AtomicU64,
    /// Power cuts while a journal was in its commit delay.
    cuts_in_delay: AtomicU64,
}

static COVERAGE: Coverage = Coverage {
    shared_passes: AtomicU64::new(0),
    next_pass_waits: AtomicU64::new(0),
    cuts_in_delay: AtomicU64::new(0),
};

enum Outcome {
    Crash,
    PowerCut(u64),
    Done,
}

/// The steps of one process's life; returns how it ended.
async fn run_world(
    world: &World,
    plan: &Plan,
    oracle: &Rc<RefCell<Oracle>>,
    rng: &mut Rng,
    step: &mut usize,
) -> Outcome {
    while *step < plan.steps {
        *step += 1;
        let roll = rng.below(1000);
        match roll {
            0..=279 => spawn_produce(world, oracle, rng),
            280..=629 => spawn_consume(world, oracle, rng),
            630..=639 => {
                let dt = rng.below(300);
                world.clock.advance(dt);
            }
            640..=649 => recreate_plain(world, plan, oracle).await,
            650..=659 => change_policy(world, oracle, rng).await,
            660..=669 => {
                corrupt(world, oracle, rng);
                // Bit rot found at the next start: often that start comes before anything else is written.
                if rng.chance(40) {
                    oracle
                        .borrow_mut()
                        .note(format!("step {step}: process crash right after the flip"));
                    return Outcome::Crash;
                }
            }
            670..=681 => return kill(world, oracle, rng, *step).await,
            682..=689 if plan.power_cuts => return power_cut(world, oracle, rng, *step).await,
            690..=699 => redrive_dead_letters(world, oracle, rng).await,
            700..=714 => spawn_stale_settle(world, oracle, rng),
            715..=719 => inject_fault(world, oracle, rng, *step),
            _ => {}
        }
        let dt = rng.below(60);
        world.clock.advance(dt);
        world.settle().await;
        check(world, oracle).await;
    }
    // A log that refused appends after a failed sync stays that way until a restart (what the error tells the
    // operator to do): restart before the drain, so a dead-letter topic can take its copies again.
    if any_poisoned(world) {
        oracle
            .borrow_mut()
            .note("before the drain: restart (a log refuses appends after a failed sync)".into());
        return Outcome::Crash;
    }
    if !drain(world, oracle, rng).await {
        oracle
            .borrow_mut()
            .note("during the drain: restart (a log refuses appends after a failed sync)".into());
        return Outcome::Crash;
    }
    Outcome::Done
}
