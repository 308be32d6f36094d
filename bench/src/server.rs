//! The server under load: the embedded one (`berth serve` as a child process), the targets `--server` names, and
//! the CPU time the server processes spent (from `/proc/PID/stat`).

use super::*;

/// An embedded server: `berth serve` (the `berth` binary beside this one, or `--berth-bin`), as a child process on
/// the server CPUs, with a temp data dir.
pub(super) struct Embedded {
    pub(super) child: std::process::Child,
    dir: PathBuf,
}

impl Embedded {
    pub(super) fn start(plan: &Plan) -> Result<(Embedded, SocketAddr), String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let dir = std::env::temp_dir().join(format!("berth-bench-{}-{port}", std::process::id()));
        let cpus: Vec<String> = plan.server_cpus.iter().map(|c| c.to_string()).collect();
        let exe = berth_binary(plan.args.berth_bin.as_deref())?;
        let child = std::process::Command::new(&exe)
            .args(["serve", "--listen", &addr.to_string(), "--data-dir"])
            .arg(&dir)
            .args(["--cpus", &cpus.join(","), "--fsync", &plan.args.fsync])
            .args(
                plan.args
                    .server_config
                    .iter()
                    .flat_map(|c| [std::ffi::OsStr::new("--config"), c.as_os_str()]),
            )
            .env("BERTH_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the embedded server {}: {e}", exe.display()))?;
        let embedded = Embedded { child, dir };
        let client = berth::client::Client::new(&format!("http://{addr}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.call("GET", "/health", &[]).map(|a| a.status) != Ok(200) {
            if Instant::now() > deadline {
                return Err("the embedded server did not become healthy".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((embedded, addr))
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// CPU time of a process, in µs, from /proc: (user, system).
fn process_cpu_us(pid: u32) -> Option<CpuTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(CpuTime {
        user_us: utime * 1_000_000 / ticks,
        system_us: stime * 1_000_000 / ticks,
    })
}

/// The bench topic's `max_in_flight` / `max_acked_ahead`: berth's default, or enough for every connection to hold
/// two batches.
pub(super) fn topic_cap(plan: &Plan) -> usize {
    plan.args.max_in_flight.unwrap_or_else(|| {
        if plan.args.batch == 1 {
            DEFAULT_TOPIC_CAP
        } else {
            let conns = plan.args.connections * plan.client_cpus.len();
            (2 * conns * plan.args.batch).clamp(DEFAULT_TOPIC_CAP, MAX_TOPIC_CAP)
        }
    })
}

/// `--server URL[,URL...]`: each URL with its address (`http://`, `redis://` and `nats://` prefixes and a trailing `/` are
/// dropped for the address; the URL is kept as given, as the report's key).
pub(super) fn parse_servers(list: &str) -> Result<Vec<(String, SocketAddr)>, String> {
    let mut out: Vec<(String, SocketAddr)> = Vec::new();
    for url in list.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        if out.iter().any(|(u, _)| u == url) {
            return Err(format!("--server: {url} given twice"));
        }
        let hostport = url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_start_matches("redis://")
            .trim_start_matches("nats://")
            .trim_end_matches('/');
        let addr = std::net::ToSocketAddrs::to_socket_addrs(hostport)
            .map_err(|e| format!("--server {url}: {e}"))?
            .next()
            .ok_or_else(|| format!("--server {url}: no address"))?;
        out.push((url.to_string(), addr));
    }
    if out.is_empty() {
        return Err("--server: no URL given".into());
    }
    Ok(out)
}

/// CPU time of all these processes together; None when there are none or one cannot be read.
pub(super) fn processes_cpu_us(pids: &[u32]) -> Option<CpuTime> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|&pid| process_cpu_us(pid))
        .try_fold(CpuTime::default(), |sum, t| {
            let t = t?;
            Some(CpuTime {
                user_us: sum.user_us + t.user_us,
                system_us: sum.system_us + t.system_us,
            })
        })
}
