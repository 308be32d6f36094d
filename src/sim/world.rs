//! The world: the simulated process (one to three engines with their fronts, a simulated mesh, the simulated disk
//! and a manual clock, all on one executor), how it boots and shuts down, and how the driver waits for it.

use super::*;

/// One process: the engines and fronts of its cores, on a disk image, with its own monotonic clock.
pub(super) struct World {
    /// The seed this world runs (for the report of a stuck operation).
    pub(super) seed: u64,
    pub(super) engines: Vec<Rc<Engine>>,
    pub(super) fronts: Vec<Rc<Front>>,
    pub(super) net: Rc<SimNet>,
    pub(super) clock: Rc<ManualClock>,
    pub(super) sim: Rc<Sim>,
    /// Operations spawned and not finished (their outcome is unknown if the process dies).
    pub(super) in_flight: Rc<Cell<usize>>,
    /// Every task the simulation spawned (pumps, timers, clients): cancelled when the process ends, so nothing of
    /// it lingers (glommio leaks tasks still pending when an executor is dropped).
    pub(super) tasks: Tasks,
    /// A write, sync or read fault was injected in this process (an administrative step may then fail).
    pub(super) faults_injected: Cell<bool>,
    /// Failed reads this process may still be given.
    pub(super) read_faults_left: Cell<u32>,
}

/// Handles of spawned tasks; dropping one cancels its task.
#[derive(Clone, Default)]
pub(super) struct Tasks(pub(super) Rc<RefCell<Vec<glommio::Task<()>>>>);

impl Tasks {
    pub(super) fn spawn(&self, future: impl std::future::Future<Output = ()> + 'static) {
        // A world spawns at most a few hundred tasks: their handles are kept until it ends. (glommio runs a new
        // task at once, and it may spawn in turn: no borrow is held across the spawn.)
        let task = glommio::spawn_local(future);
        self.0.borrow_mut().push(task);
    }
}

pub(super) fn sim_config(plan: &Plan) -> Config {
    Config {
        data_dir: PathBuf::from("/sim"),
        fsync: plan.fsync,
        segment_bytes: 2048,
        // Journal files rotate (and checkpoint) every few passes.
        journal_file_bytes: 4096,
        // The journal's commit delay is the default (it sleeps on the simulation's clock): passes gather several
        // partitions' entries, logs wait in `Journal::next_pass`, and power cuts land inside a delay.
        max_message_bytes: 512,
        // Small, so reads go to the tail and to the disk (and its read faults) alike.
        tail_cache_bytes: 1024,
        // Smaller than a segment and larger than the tail, so frames wait behind (and are read from there), reach
        // the file at flushes, rolls and checkpoints, and are lost behind by power cuts and crashes (the journal's
        // replay restores them).
        write_behind_bytes: 1500,
        frontier_flush_interval_ms: 100,
        purge_interval_ms: 1000,
        ..Config::default()
    }
}

/// Every simulated topic's caps (small, so that they bind).
pub(super) const SIM_LIMITS: crate::partition::inflight::Limits =
    crate::partition::inflight::Limits {
        max_in_flight: 6,
        max_acked_ahead: 4,
    };

pub(super) fn topic_config(name: &str, partitions: u32) -> TopicConfig {
    let mut c = TopicConfig::with_defaults(name);
    c.partitions = partitions;
    c.max_in_flight = SIM_LIMITS.max_in_flight;
    c.max_acked_ahead = SIM_LIMITS.max_acked_ahead;
    c.groups = vec!["g2".to_string()];
    if name == SOURCE {
        c.max_deliveries = MAX_DELIVERIES;
        c.dead_letter = Some(DLQ.to_string());
    }
    c
}

impl World {
    pub(super) async fn boot(plan: &Plan, sim: Rc<Sim>, wall_ms: u64, seed: u64) -> World {
        let clock = ManualClock::new(wall_ms);
        let config = Rc::new(sim_config(plan));
        let storage: Rc<dyn Storage> = Rc::new(SimStorage(sim.clone()));
        storage
            .create_dir_all(&config.data_dir.join("topics"))
            .expect("sim dir");
        storage
            .create_dir_all(&config.data_dir.join("trash"))
            .expect("sim dir");
        if std::env::var_os("BERTH_SIM_TRACE").is_some() {
            for path in sim.paths() {
                eprintln!(
                    "  boot: {} {:?}",
                    path.display(),
                    sim.contents(&path).map(|c| c.len())
                );
            }
        }
        let report = crate::engine::admin::replay_journal(&*storage, &config.data_dir)
            .await
            .expect("journal replay");
        if std::env::var_os("BERTH_SIM_TRACE").is_some() {
            eprintln!("  boot: replay {report:?}");
        }
        let net = SimNet::new(plan.cores, plan.net_depth, seed);
        let shared = std::sync::Arc::new(Shared::default());
        let mut engines = Vec::new();
        let mut fronts = Vec::new();
        for id in 0..plan.cores {
            let engine = Engine::new(
                id,
                plan.cores,
                config.clone(),
                clock.clone(),
                storage.clone(),
                shared.clone(),
            );
            let router = Router::new(engine.clone(), net.link(id));
            engine.set_peers(Rc::new(RouterPeers(Rc::downgrade(&router))));
            fronts.push(Front::new(router));
            engines.push(engine);
        }
        let mut failed = Vec::new();
        for e in &engines {
            failed.extend(e.load_topics().await.expect("load topics"));
        }
        if !failed.is_empty() {
            panic!("topics failed to load in the simulation: {failed:?}");
        }
        let tasks = Tasks::default();
        for (id, e) in engines.iter().enumerate() {
            tasks.spawn(net.clone().pump(id, e.clone()));
            tasks.spawn(crate::engine::timers::run_lease_timer(e.clone()));
            tasks.spawn(crate::engine::timers::run_frontier_flush(e.clone()));
        }
        World {
            engines,
            fronts,
            net,
            clock,
            sim,
            in_flight: Rc::new(Cell::new(0)),
            tasks,
            faults_injected: Cell::new(false),
            seed,
            read_faults_left: Cell::new(crate::partition::MAX_READ_FAILURES - 1),
        }
    }

    /// Ends the process's tasks so nothing of it outlives its executor: clients and pumps are cancelled, the
    /// engines stop and close their partitions (writing to this process's disk, which is no longer looked at), and
    /// the clock runs on so every timer sees the stop.
    pub(super) async fn shut_down(self) {
        for e in &self.engines {
            e.begin_stop();
        }
        // Until nothing is left: cancelling a task can make another spawn one.
        loop {
            let tasks = std::mem::take(&mut *self.tasks.0.borrow_mut());
            if tasks.is_empty() {
                break;
            }
            drop(tasks);
            futures_lite::future::yield_now().await;
        }
        // Closing waits on the clock (a journal's checkpoint still running, a commit delay): time goes on, 1 ms at a
        // time, until the engines are closed (not `complete`: the net's pumps are cancelled, so it never empties).
        let engines = self.engines.clone();
        let closing = glommio::spawn_local(async move {
            for e in &engines {
                e.close_all().await;
            }
        });
        let closed = Rc::new(Cell::new(false));
        let flag = closed.clone();
        glommio::spawn_local(async move {
            closing.await;
            flag.set(true);
        })
        .detach();
        let started = self.clock.now_ms();
        while !closed.get() {
            for _ in 0..SETTLE_YIELDS {
                futures_lite::future::yield_now().await;
            }
            if !closed.get() {
                self.check_not_stuck(started, "the engines not closed");
                self.clock.advance(1);
            }
        }
        self.clock.advance(24 * 3600 * 1000);
        for _ in 0..50 {
            futures_lite::future::yield_now().await;
        }
    }

    /// Fails the seed when what the driver waits for (`what`) is still pending `STUCK_MS` of simulated time after
    /// `started`.
    pub(super) fn check_not_stuck(&self, started: u64, what: &str) {
        assert!(
            self.clock.now_ms() - started < STUCK_MS,
            "simulation seed {} found: {what} after {STUCK_MS} ms of simulated time (a stuck writer or waiter)\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::",
            self.seed,
            self.seed
        );
    }

    /// Whether a core's journal is in its commit delay now.
    pub(super) fn journals_delaying(&self) -> bool {
        self.engines
            .iter()
            .any(|e| e.journal().is_some_and(|j| j.is_delaying()))
    }

    /// Adds this process's journal passes of several partitions and waits in `next_pass` to `COVERAGE`.
    pub(super) fn count_journal_coverage(&self) {
        for e in &self.engines {
            if let Some(j) = e.journal() {
                let s = j.stats();
                COVERAGE
                    .shared_passes
                    .fetch_add(s.shared_passes, Ordering::Relaxed);
                COVERAGE
                    .next_pass_waits
                    .fetch_add(s.next_pass_waits, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn front(&self, rng: &mut Rng) -> Rc<Front> {
        self.fronts[rng.below(self.fronts.len() as u64) as usize].clone()
    }

    /// Runs `future` as a task of the world while time goes on (1 ms at a time once nothing else moves), so a step
    /// of the driver that waits for the broker never waits for time the driver itself would have to advance.
    pub(super) async fn complete<T: 'static>(
        &self,
        future: impl std::future::Future<Output = T> + 'static,
    ) -> T {
        let out: Rc<RefCell<Option<T>>> = Rc::default();
        let slot = out.clone();
        self.tasks.spawn(async move {
            let value = future.await;
            *slot.borrow_mut() = Some(value);
        });
        let started = self.clock.now_ms();
        loop {
            if let Some(value) = out.borrow_mut().take() {
                return value;
            }
            self.settle().await;
            if out.borrow().is_some() {
                continue;
            }
            // Every wait the broker has (leases, long-polls, retries, delays) is far shorter: a step still waiting
            // after this much simulated time is stuck.
            self.check_not_stuck(started, "an operation not answered");
            self.clock.advance(1);
        }
    }

    /// Lets every runnable task run until nothing moves: the net is empty and a round of yields changed nothing.
    pub(super) async fn settle(&self) {
        let mut last = u64::MAX;
        for round in 0.. {
            // A settle takes a few rounds; messages that never stop flowing are a livelock (a wake-up storm, a
            // retry loop without a delay): fail with the seed rather than hang the suite.
            assert!(
                round < SETTLE_ROUNDS,
                "simulation seed {} found: the world never settles ({} net messages delivered over {SETTLE_ROUNDS} rounds of yields: a task that never stops sending)\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::",
                self.seed,
                self.net.delivered.get(),
                self.seed
            );
            for _ in 0..40 {
                futures_lite::future::yield_now().await;
            }
            let activity = self.net.delivered.get();
            if self.net.queued() == 0 && activity == last {
                return;
            }
            last = activity;
        }
    }
}

pub(super) async fn create_topics(world: &World, plan: &Plan, oracle: &Rc<RefCell<Oracle>>) {
    let front = world.fronts[0].clone();
    for (name, partitions) in [
        (DLQ, plan.partitions[2]),
        (SOURCE, plan.partitions[0]),
        (PLAIN, plan.partitions[1]),
        (REDRIVEN, plan.partitions[3]),
    ] {
        let f = front.clone();
        let (_, config) = world
            .complete(async move { f.create_topic(topic_config(name, partitions)).await })
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        oracle.borrow_mut().ids.insert(name.to_string(), config.id);
    }
    world.settle().await;
}

pub(super) fn topics_now() -> [&'static str; 4] {
    [SOURCE, PLAIN, DLQ, REDRIVEN]
}
