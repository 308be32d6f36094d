//! The process: one pinned glommio executor per core, the cross-core mesh, the listeners, the background tasks and
//! graceful shutdown. `run` is what `berth serve` calls; each executor runs `core_main`.

pub mod shutdown;

use crate::clock::RealClock;
use crate::config::Config;
use crate::engine::{timers, Engine, Shared};
use crate::front::Front;
use crate::http::reaper::{self, ConnTable};
use crate::storage::backend::Disk;
use crate::transport::mesh::{self, Mesh};
use crate::transport::{Envelope, Router, RouterPeers};
use futures_lite::future;
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::net::TcpListener;
use glommio::{CpuSet, LocalExecutorBuilder, Placement, PoolPlacement};
use shutdown::Shutdown;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Runs the broker until SIGTERM or SIGINT. Errors are one-line reasons for the exit status.
pub fn run(mut config: Config) -> Result<(), String> {
    crate::ops::overview::mark_start();
    config.validate()?;
    config.resolve_auth()?;
    // Files and directories berth creates are readable by their owner only (topics hold message bodies).
    // SAFETY: umask(2) only changes this process's file-creation mask.
    unsafe { libc::umask(0o077) };
    let unusable = |e: std::io::Error| {
        format!(
            "data directory {} is unusable: {e}",
            config.data_dir.display()
        )
    };
    // First: a start that fails here (the port is taken) leaves no trace, not even a new data directory.
    config.listen = check_listen_address(config.listen)?;
    std::fs::create_dir_all(config.data_dir.join("topics")).map_err(unusable)?;
    std::fs::create_dir_all(config.data_dir.join("trash")).map_err(unusable)?;
    // One absolute path from here on: io_uring opens relative to no directory, and a symlink or `..` in the
    // path given must not change meaning later.
    config.data_dir = std::fs::canonicalize(&config.data_dir).map_err(unusable)?;
    let _lock = lock_data_dir(&config.data_dir)?;
    let incarnation =
        crate::storage::incarnation::load_or_create(&config.data_dir).map_err(|e| {
            format!(
                "data directory {} is unusable: its incarnation file: {e}",
                config.data_dir.display()
            )
        })?;
    match incarnation {
        crate::storage::incarnation::Found::Kept(id) => {
            info!(incarnation = %id, "data directory incarnation")
        }
        crate::storage::incarnation::Found::New(id) => {
            info!(incarnation = %id, "new data directory incarnation (a new or wiped data directory, or one from an older build)")
        }
        crate::storage::incarnation::Found::Replaced(id) => {
            tracing::error!(incarnation = %id, "the data directory's incarnation file failed its check: wrote a new one; this node counts as a new disk")
        }
    }
    config.incarnation = incarnation.id().to_string();
    let fd_limit = raise_fd_limit();
    config.fit_fd_limit(fd_limit);
    replay_journal(&config)?;
    let cpus = choose_cpus(&config)?;
    let cores = cpus.len();
    let shared = Arc::new(Shared::default());
    let stop = Arc::new(Shutdown::new(cores));
    shutdown::install_signal_handler(stop.clone())?;
    let mesh = MeshBuilder::<Envelope, _>::full(cores, config.mesh_channel_depth);
    info!(listen = %config.listen, data_dir = %config.data_dir.display(), cores, cpus = ?cpus, fsync = %config.fsync, "berth starting");
    let mut handles = Vec::with_capacity(cores);
    for (id, cpu) in cpus.into_iter().enumerate() {
        let config = config.clone();
        let shared = shared.clone();
        let stop = stop.clone();
        let mesh = mesh.clone();
        let builder = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("berth-core-{id}"))
            .spin_before_park(Duration::from_micros(config.spin_before_park_us))
            .io_memory(config.io_memory_bytes)
            .ring_depth(config.ring_depth)
            .preempt_timer(Duration::from_millis(config.preempt_timer_ms))
            // Two blocking threads on the core's CPU (or `blocking_cpus`): a group commit's fdatasync never waits
            // behind a batch of small-file replacements.
            .blocking_thread_pool_placement(PoolPlacement::Custom(vec![
                blocking_set(&config, cpu)?;
                2
            ]));
        let handle = builder
            .spawn(move || async move { core_main(cores, config, shared, stop, mesh).await })
            .map_err(|e| format!("cannot start the executor for cpu {cpu}: {e}"))?;
        handles.push(handle);
    }
    let mut failure = None;
    for handle in handles {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                stop.trigger();
                failure.get_or_insert(e);
            }
            Err(e) => {
                stop.trigger();
                failure.get_or_insert(format!("an executor failed: {e}"));
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => {
            info!("berth stopped cleanly");
            Ok(())
        }
    }
}

/// Replays the last run's journals into the segments before any core opens a partition (on a short-lived executor:
/// the storage goes through io_uring).
fn replay_journal(config: &Config) -> Result<(), String> {
    let data_dir = config.data_dir.clone();
    let sync_via = config.sync_via;
    LocalExecutorBuilder::default()
        .name("berth-replay")
        .spawn(move || async move {
            let storage = Disk::new(sync_via);
            crate::engine::admin::replay_journal(&storage, &data_dir)
                .await
                .map(|_| ())
        })
        .map_err(|e| format!("cannot start the journal replay: {e}"))?
        .join()
        .map_err(|e| format!("the journal replay failed: {e}"))?
}

/// Raises the soft file-descriptor limit to the hard one (partitions and connections each hold descriptors);
/// returns the limit in force.
fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
    }
    limit.rlim_cur
}

/// Takes an exclusive lock on the data directory so two servers never share it.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, String> {
    use std::os::unix::io::AsRawFd;
    let path = dir.join("berth.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("data directory {} is unusable: {e}", dir.display()))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(format!(
            "data directory {} is in use by another berth process",
            dir.display()
        ));
    }
    Ok(file)
}

/// A listening socket with SO_REUSEPORT (every core binds the same address; the kernel spreads connections) and
/// SO_REUSEADDR (a restart right after a crash is not refused for the old connections in TIME_WAIT).
fn bind_listener(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::unix::io::{FromRawFd, IntoRawFd};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog.min(i32::MAX as u32) as i32)?;
    // SAFETY: the descriptor is a bound, listening TCP socket whose ownership moves into the listener.
    Ok(unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

/// Fails if another process listens on the address (the probe has no SO_REUSEPORT, so any listener blocks it, while
/// SO_REUSEADDR lets it past connections in TIME_WAIT); resolves port 0 to a concrete free port.
///
/// A port still held by a process that was just killed (its io_uring sockets linger for a few ms while the kernel
/// tears them down) is retried for up to a second, so a restart right after kill -9 succeeds.
fn check_listen_address(addr: SocketAddr) -> Result<SocketAddr, String> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match probe_listen_address(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            result => return result.map_err(|e| format!("cannot listen on {addr}: {e}")),
        }
    }
}

fn probe_listen_address(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    use socket2::{Domain, Protocol, Socket, Type};
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into())?;
    probe.listen(1)?;
    probe
        .local_addr()?
        .as_socket()
        .ok_or_else(|| std::io::Error::other("not an IP address"))
}

/// The one-CPU set of `cpu`, for the core's blocking threads.
fn cpu_set(cpu: usize) -> Result<CpuSet, String> {
    let online = CpuSet::online().map_err(|e| format!("cannot list the online CPUs: {e}"))?;
    Ok(online.filter(|l| l.cpu == cpu))
}

/// Where a core's blocking threads run: `blocking_cpus` if given (each must be online), else the core's CPU.
fn blocking_set(config: &Config, cpu: usize) -> Result<CpuSet, String> {
    let Some(cpus) = &config.blocking_cpus else {
        return cpu_set(cpu);
    };
    let online = CpuSet::online().map_err(|e| format!("cannot list the online CPUs: {e}"))?;
    if let Some(missing) = cpus.iter().find(|&&c| !online.iter().any(|l| l.cpu == c)) {
        return Err(format!("blocking_cpus: CPU {missing} is not online"));
    }
    Ok(online.filter(|l| cpus.contains(&l.cpu)))
}

/// The CPUs to pin to: `cpus` if given, else the first `cores` that core_affinity lists.
fn choose_cpus(config: &Config) -> Result<Vec<usize>, String> {
    let available: Vec<usize> = core_affinity::get_core_ids()
        .ok_or("cannot list the available CPUs")?
        .into_iter()
        .map(|c| c.id)
        .collect();
    let cpus = match &config.cpus {
        Some(cpus) => {
            if let Some(bad) = cpus.iter().find(|c| !available.contains(c)) {
                return Err(format!(
                    "cpu {bad} is not available (available: {available:?})"
                ));
            }
            cpus.clone()
        }
        None => available.clone(),
    };
    let cores = config.cores.unwrap_or(cpus.len());
    if cores == 0 || cores > cpus.len() {
        return Err(format!(
            "cannot run {cores} cores on {} available CPUs",
            cpus.len()
        ));
    }
    Ok(cpus[..cores].to_vec())
}

async fn core_main(
    cores: usize,
    config: Config,
    shared: Arc<Shared>,
    stop: Arc<Shutdown>,
    mesh: MeshBuilder<Envelope, glommio::channels::channel_mesh::Full>,
) -> Result<(), String> {
    let (senders, receivers) = mesh
        .join()
        .await
        .map_err(|_| "cannot join the core mesh".to_string())?;
    // Core ids are mesh peer ids (join order), which every core agrees on.
    let id = senders.peer_id();
    if config.timer_slack_ns > 0 {
        // SAFETY: PR_SET_TIMERSLACK takes an unsigned long and changes only this thread's timer slack.
        let done = unsafe {
            libc::prctl(
                libc::PR_SET_TIMERSLACK,
                config.timer_slack_ns as libc::c_ulong,
                0,
                0,
                0,
            )
        };
        if done != 0 {
            warn!(core = id, error = %std::io::Error::last_os_error(), "timer_slack_ns: the kernel refused the timer slack");
        }
    }
    let config = Rc::new(config);
    let storage = Rc::new(Disk::new(config.sync_via));
    let core = Engine::new(
        id,
        cores,
        config.clone(),
        Rc::new(RealClock),
        storage,
        shared.clone(),
    );
    let router = Router::new(core.clone(), Rc::new(Mesh::new(senders)));
    core.set_peers(Rc::new(RouterPeers(Rc::downgrade(&router))));
    let front = Front::new(router.clone());
    // Topics load before this core serves its peers: a request forwarded here meanwhile waits in the channel
    // instead of finding no topic (a false 404 right after a restart).
    let failed = match core.load_topics().await {
        Ok(failed) => failed,
        Err(e) => {
            shutdown::barrier(&shared.loaded, &shared.loaded_event, cores).await;
            return fail(&stop, format!("cannot load topics: {e}")).await;
        }
    };
    // Every core quarantines what any core could not open, so all agree on each topic before serving.
    shared
        .boot_failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(failed);
    shutdown::barrier(&shared.loaded, &shared.loaded_event, cores).await;
    let mut quarantine = shared
        .boot_failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    quarantine.sort();
    quarantine.dedup_by(|a, b| a.0 == b.0);
    core.quarantine(&quarantine).await;
    if id == 0 {
        core.empty_trash();
    }
    mesh::serve(&core, receivers);
    // Cluster mode: core 0 joins (registers, opens the cluster's topics on every core, starts node RPC) before any
    // core listens; every core gets its node RPC clients.
    let mut membership = None;
    let mut shipper = None;
    if let Some(settings) = &config.cluster {
        if id == 0 {
            match crate::cluster::node::join(&core, &router, &config, settings).await {
                Ok(m) => membership = Some(m),
                Err(e) => {
                    shared.cluster_joined.store(usize::MAX, Ordering::Release);
                    shared.loaded_event.notify(usize::MAX);
                    return fail(&stop, e).await;
                }
            }
            shared.cluster_joined.store(1, Ordering::Release);
            shared.loaded_event.notify(usize::MAX);
        } else {
            loop {
                let listener = shared.loaded_event.listen();
                match shared.cluster_joined.load(Ordering::Acquire) {
                    0 => listener.await,
                    1 => break,
                    _ => return fail(&stop, "core 0 could not join the cluster".into()).await,
                }
            }
        }
        let nodes = crate::cluster::node::RpcNodes::new(core.clone(), &config, settings);
        router.set_node_link(nodes.clone());
        // The sink holds the shipper weakly (the engine must not own what owns the engine): it lives as long as
        // this core serves.
        let s = crate::front::replicate::Shipper::new(router.clone());
        core.set_ship_sink(s.sink());
        s.start_quorum_checks();
        s.start_mover();
        shipper = Some(s);
        let server = membership.as_ref().map(|m| m.rpc.clone());
        let engine = Rc::downgrade(&core);
        core.set_extra_stats(Rc::new(move || {
            let mut all = nodes.series();
            if let Some(server) = &server {
                all.extend(crate::cluster::node::server_series(server));
                if let Some(engine) = engine.upgrade() {
                    all.extend(crate::cluster::node::unopened_series(&engine));
                }
            }
            all
        }));
    }
    glommio::spawn_local(timers::run_lease_timer(core.clone())).detach();
    glommio::spawn_local(timers::run_frontier_flush(core.clone())).detach();
    let listener = match bind_listener(config.listen, config.listen_backlog) {
        Ok(l) => l,
        Err(e) => return fail(&stop, format!("cannot listen on {}: {e}", config.listen)).await,
    };
    if shared.ready.fetch_add(1, Ordering::AcqRel) + 1 == cores {
        info!(listen = %config.listen, cores, "berth serving");
    }
    let table = Rc::new(ConnTable::default());
    let tick = Duration::from_millis((config.header_read_timeout_ms / 4).clamp(10, 1000));
    let (sweeper, recorder) = (core.clone(), core.clone());
    glommio::spawn_local(reaper::run(
        table.clone(),
        tick,
        move || sweeper.is_stopping(),
        move |began| recorder.metrics().record_housekeeping(began),
    ))
    .detach();
    accept_loop(&front, &table, &listener, &stop).await;
    drop(listener);
    core.begin_stop();
    table.close_idle();
    shared.ready.fetch_sub(1, Ordering::AcqRel);
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let started = Instant::now();
    while core.metrics().connections_open.get() > 0 && started.elapsed() < grace {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    if core.metrics().connections_open.get() > 0 {
        warn!(
            core = id,
            open = core.metrics().connections_open.get(),
            "grace period over; closing remaining connections"
        );
    }
    // Other cores may still forward work here until they drain too.
    stop.drained_and_wait().await;
    // The followers get the last batches before the logs close (a bounded wait: a follower that is down too is
    // not waited for longer).
    if let Some(shipper) = shipper.take() {
        // The frontiers moved since the last flush tick too (the tick stopped with the server).
        crate::engine::timers::journal_moved(&core).await;
        shipper.drain(SHIP_DRAIN).await;
    }
    core.close_all().await;
    // Cluster mode, core 0: give the session's lease back (docs/cluster.md, "Liveness"), so a node stopped and
    // started again is not refused its own id for a TTL.
    if let Some(membership) = membership.take() {
        membership.leave().await;
    }
    stop.closed_and_wait().await;
    Ok(())
}

/// How long a stopping core waits for its followers to take the last batches of the partitions it leads.
const SHIP_DRAIN: Duration = Duration::from_secs(3);

/// A core that cannot start stops the whole server, and still meets the others at the shutdown barriers so they
/// can finish.
async fn fail(stop: &Shutdown, reason: String) -> Result<(), String> {
    stop.trigger();
    stop.drained_and_wait().await;
    stop.closed_and_wait().await;
    Err(reason)
}

async fn accept_loop(
    front: &Rc<Front>,
    table: &Rc<ConnTable>,
    listener: &TcpListener,
    stop: &Arc<Shutdown>,
) {
    let core = front.engine().clone();
    let config = core.config().clone();
    loop {
        if stop.is_triggered() {
            return;
        }
        let stopped = stop.listen();
        let accepted = future::or(async { Some(listener.accept().await) }, async {
            if !stop.is_triggered() {
                stopped.await;
            }
            None
        })
        .await;
        let Some(accepted) = accepted else { return };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let m = core.metrics();
        let total = core.shared().connections.fetch_add(1, Ordering::AcqRel) + 1;
        if total > config.max_connections
            || m.connections_open.get() as usize >= config.max_connections_per_core
        {
            core.shared().connections.fetch_sub(1, Ordering::AcqRel);
            m.connections_refused.set(m.connections_refused.get() + 1);
            glommio::spawn_local(crate::http::conn::refuse(stream, config.tls.is_some())).detach();
            continue;
        }
        m.connections_open.set(m.connections_open.get() + 1);
        let front = front.clone();
        let table = table.clone();
        glommio::spawn_local(async move {
            crate::http::conn::serve(front.clone(), table, stream).await;
            let core = front.engine();
            let m = core.metrics();
            m.connections_open.set(m.connections_open.get() - 1);
            core.shared().connections.fetch_sub(1, Ordering::AcqRel);
        })
        .detach();
    }
}
