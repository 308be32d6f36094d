//! Cluster harness (design/api.md, "Cluster mode"; docs/cluster.md): a real etcd on free loopback ports
//! ([`Etcd`]), N `berth serve --cluster ...` nodes on it ([`Cluster`]), each with one core, its own temp data dir,
//! client port, peer port and log file, that a test can kill -9, restart on the same data dir and ports, pause with
//! SIGSTOP, and (optionally) cut off the network: with [`Opts::netns`] every node runs in its own network namespace,
//! joined to the host by a veth pair on one bridge ([`Net`]), and [`Cluster::cut`] takes its link down.
//!
//! Skips, never fails, when the environment lacks a piece: [`Cluster::start`] prints `SKIP <test>: ...` and returns
//! `None` when etcd is not installed (or `BERTH_ETCD_BIN` names no file), or when netns was asked for and
//! `ip netns` does not work here (not root, no `ip`, no CAP_NET_ADMIN) or `BERTH_NO_NETNS` is set.
//!
//! Every child process (etcd, nodes) is killed on drop, and also by the kernel if the thread that started it dies
//! (`PR_SET_PDEATHSIG`): start and restart processes from the test's own thread. Namespaces, veths and the bridge
//! are deleted on drop; ones left behind by a test binary that was killed are swept by the next [`Net::new`].
//! On a panic the tail of every node's log and of etcd's is printed; `BERTH_KEEP_LOGS=1` keeps the whole temp dir
//! (logs and data) and prints its path.

use berth::client::{Answer, Client};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use super::etcd::Etcd;
use super::etcd::{signal, tail};
use super::free_port;

/// How long a node may take from spawn to `/health` 200.
const NODE_START: Duration = Duration::from_secs(30);
/// Poll interval of every wait.
const POLL: Duration = Duration::from_millis(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The berth binary the nodes run: `BERTH_CLUSTER_BIN` if set (to run these tests against another build), else
/// this package's.
pub fn berth_bin() -> PathBuf {
    std::env::var_os("BERTH_CLUSTER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_berth")))
}

// ---------------------------------------------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------------------------------------------

/// Polls `f` until it returns `Ok`, at most `timeout`; panics with `what` and the last `Err` (the last observation)
/// when the deadline passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) => {
                if Instant::now() >= deadline {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------------------------------

/// Configures `cmd` to die with the thread that spawns it and, when `netns` is given, to run in that network
/// namespace (entered between fork and exec: the child is the program itself, so its pid is the one to signal).
/// The returned file (the namespace) must be held until `spawn` returns.
fn prepare(cmd: &mut Command, netns: Option<&str>) -> std::io::Result<Option<std::fs::File>> {
    let ns_file = match netns {
        Some(ns) => Some(std::fs::File::open(format!("/run/netns/{ns}"))?),
        None => None,
    };
    let ns_fd = ns_file.as_ref().map(|f| f.as_raw_fd());
    // SAFETY: only async-signal-safe calls (prctl, setns) between fork and exec; the fd is open until the caller
    // drops the returned file, after spawn (O_CLOEXEC keeps it out of the program).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = ns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(ns_file)
}

// ---------------------------------------------------------------------------------------------------------------
// Network namespaces
// ---------------------------------------------------------------------------------------------------------------

fn ip_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join("ip"))
        .find(|p| p.is_file())
}

/// Runs `ip ARGS`; Err with its stderr when it fails.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let bin = ip_binary().ok_or("no `ip` binary (iproute2)")?;
    let out = Command::new(bin)
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Runs `f` on a thread that entered network namespace `ns` (the calling thread stays where it is).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns on this thread only, with an fd we hold open.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("thread in netns panicked")
    })
}

/// Whether a TCP connection to `addr` opens within `timeout`, from network namespace `from` (None: this one).
pub fn tcp_reachable(from: Option<&str>, addr: SocketAddr, timeout: Duration) -> bool {
    let probe = move || TcpStream::connect_timeout(&addr, timeout).is_ok();
    match from {
        Some(ns) => in_netns(ns, probe),
        None => probe(),
    }
}

/// Whether a socket listens on TCP port `port` in network namespace `ns` (None: this one). (Not "can the port be
/// bound": the old process's connections in TIME_WAIT refuse a probe, yet not a server binding with SO_REUSEPORT,
/// or SO_REUSEADDR; what must be gone before a restart is the old listener.)
fn listening(ns: Option<&str>, port: u16) -> bool {
    let probe = move || {
        ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"]
            .iter()
            .any(|table| {
                std::fs::read_to_string(table)
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .any(|line| {
                        // "sl local_address rem_address st ...": local "0100007F:1F90", state 0A = LISTEN.
                        let cols: Vec<&str> = line.split_whitespace().collect();
                        cols.len() > 3
                            && cols[3] == "0A"
                            && cols[1]
                                .rsplit(':')
                                .next()
                                .and_then(|p| u16::from_str_radix(p, 16).ok())
                                == Some(port)
                    })
            })
    };
    match ns {
        Some(ns) => in_netns(ns, probe),
        None => probe(),
    }
}

/// `ss`'s lines about TCP port `port` (in namespace `ns`), for a diagnosis.
fn sockets_on(ns: Option<&str>, port: u16) -> String {
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new(ip_binary().unwrap_or_else(|| "ip".into()));
            c.args(["netns", "exec", ns, "ss"]);
            c
        }
        None => Command::new("ss"),
    };
    match cmd.args(["-tanp"]).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&format!(":{port} ")))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(ss: {e})"),
    }
}

/// One network namespace of a [`Net`]: a veth pair, `host_veth` on the bridge, the other end inside with `ip`.
pub struct Slot {
    pub ns: String,
    pub host_veth: String,
    pub ip: String,
}

/// A bridge in this namespace with two addresses (`gateway`, and `etcd_ip`, where the nodes reach etcd), and one
/// network namespace per node joined to it by a veth pair: the nodes reach each other and etcd over the bridge, the
/// test reaches
/// every node at its address, and [`Net::cut`] takes one node's link down (nothing in or out) until
/// [`Net::heal`]. Names carry this process's pid (`berth-<pid>-<seq>-<i>`, `bb<pid hex>g<seq hex>`), so leftovers
/// of a killed test binary are recognised and swept.
pub struct Net {
    pub bridge: String,
    /// The first three octets of the /24 (`10.x.y`).
    pub subnet: String,
    pub gateway: String,
    /// A second address of the bridge, on which etcd listens for the nodes ([`Net::block_etcd`] cuts one node off
    /// it alone).
    pub etcd_ip: String,
    tag: String,
    pub slots: Vec<Slot>,
}

static NET_SEQ: AtomicU32 = AtomicU32::new(0);

impl Net {
    /// Whether network namespaces can be made here: Err with the reason when not.
    pub fn probe() -> Result<(), String> {
        if std::env::var_os("BERTH_NO_NETNS").is_some() {
            return Err("BERTH_NO_NETNS is set".into());
        }
        let name = format!("berth-{}-probe", std::process::id());
        ip(&["netns", "add", &name])?;
        let exec = ip(&["-n", &name, "link", "set", "lo", "up"]);
        let del = ip(&["netns", "del", &name]);
        exec.and(del).map(|_| ())
    }

    /// Deletes namespaces and bridges left by test processes that no longer exist.
    fn sweep() {
        if let Ok(list) = ip(&["netns", "list"]) {
            for line in list.lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                let pid = name
                    .strip_prefix("berth-")
                    .and_then(|rest| rest.split('-').next())
                    .and_then(|p| p.parse::<u32>().ok());
                if let Some(pid) = pid {
                    if !pid_alive(pid) {
                        let _ = ip(&["netns", "del", name]);
                    }
                }
            }
        }
        if let Ok(list) = ip(&["-o", "link", "show", "type", "bridge"]) {
            for line in list.lines() {
                // "12: bb1a2bg0: <...>"
                let name = line.split(':').nth(1).unwrap_or("").trim();
                let pid = name
                    .strip_prefix("bb")
                    .and_then(|rest| rest.split('g').next())
                    .and_then(|p| u32::from_str_radix(p, 16).ok());
                if let Some(pid) = pid {
                    if !pid_alive(pid) {
                        let _ = ip(&["link", "del", name]);
                    }
                }
            }
        }
    }

    /// A new bridge on a /24 nobody here uses; no slots yet.
    pub fn new() -> Result<Net, String> {
        Net::probe()?;
        Net::sweep();
        let pid = std::process::id();
        let seq = NET_SEQ.fetch_add(1, Ordering::Relaxed) % 256;
        let tag = format!("{pid:x}g{seq:x}");
        let bridge = format!("bb{tag}");
        let used = ip(&["-4", "-o", "addr", "show"])?;
        let mut h = pid
            .wrapping_mul(2654435761)
            .wrapping_add(seq.wrapping_mul(40503));
        let subnet = loop {
            let candidate = format!("10.{}.{}", 100 + (h >> 8) % 100, h & 0xff);
            if !used.contains(&format!(" {candidate}.")) {
                break candidate;
            }
            h = h.wrapping_add(1);
        };
        let gateway = format!("{subnet}.1");
        let etcd_ip = format!("{subnet}.2");
        ip(&[
            "link",
            "add",
            "name",
            &bridge,
            "type",
            "bridge",
            "forward_delay",
            "0",
        ])?;
        let net = Net {
            bridge,
            subnet,
            gateway,
            etcd_ip,
            tag,
            slots: Vec::new(),
        };
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.gateway),
            "dev",
            &net.bridge,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.etcd_ip),
            "dev",
            &net.bridge,
        ])?;
        // A bridge takes the lowest MAC address among its ports unless it has its own: a slot added later whose
        // veth happened to have a lower one changed it, and the namespaces already running kept the old one in their
        // neighbour caches, so their packets to the bridge's addresses (etcd's) went out another port instead, for
        // as long as those entries lived (a node's etcd calls timed out for 30 s). A fixed, locally administered
        // address per bridge never changes.
        let mac = format!(
            "02:62:{:02x}:{:02x}:{:02x}:{:02x}",
            (pid >> 16) & 0xff,
            (pid >> 8) & 0xff,
            pid & 0xff,
            seq & 0xff
        );
        ip(&["link", "set", "dev", &net.bridge, "address", &mac])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        Ok(net)
    }

    /// Adds namespace `i` (slots are added in order: `i` must be `slots.len()`), with address `subnet.(10 + i)`.
    pub fn add_slot(&mut self, i: usize) -> Result<&Slot, String> {
        assert_eq!(i, self.slots.len(), "slots are added in order");
        let ns = format!("berth-{}-{}-{i}", std::process::id(), self.tag);
        let host_veth = format!("bv{}n{i}", self.tag);
        let inner = format!("bp{}n{i}", self.tag);
        let addr = format!("{}.{}", self.subnet, 10 + i);
        ip(&["netns", "add", &ns])?;
        // From here on the slot is ours to delete, even if a later step fails.
        self.slots.push(Slot {
            ns: ns.clone(),
            host_veth: host_veth.clone(),
            ip: addr.clone(),
        });
        ip(&[
            "link", "add", &host_veth, "type", "veth", "peer", "name", &inner,
        ])?;
        ip(&["link", "set", &inner, "netns", &ns])?;
        ip(&["link", "set", &host_veth, "master", &self.bridge])?;
        ip(&["link", "set", &host_veth, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            &inner,
        ])?;
        ip(&["-n", &ns, "link", "set", &inner, "up"])?;
        ip(&["-n", &ns, "route", "add", "default", "via", &self.gateway])?;
        Ok(&self.slots[i])
    }

    /// Cuts namespace `i` off: its link to the bridge goes down (packets in either direction are dropped).
    pub fn cut(&self, i: usize) {
        ip(&["link", "set", &self.slots[i].host_veth, "down"]).unwrap();
    }

    /// Undoes [`Net::cut`].
    pub fn heal(&self, i: usize) {
        ip(&["link", "set", &self.slots[i].host_veth, "up"]).unwrap();
    }

    /// Cuts namespaces `i` and `j` off each other only (a blackhole route to the other's address in each): both
    /// still reach etcd, the test and every other node.
    pub fn block(&self, i: usize, j: usize) {
        self.blackhole("add", i, &self.slots[j].ip);
        self.blackhole("add", j, &self.slots[i].ip);
    }

    /// Cuts namespace `i` off etcd only (a blackhole route to `etcd_ip`): it still reaches every node, and the test
    /// reaches it.
    pub fn block_etcd(&self, i: usize) {
        self.blackhole("add", i, &self.etcd_ip);
    }

    /// Undoes [`Net::block_etcd`].
    pub fn unblock_etcd(&self, i: usize) {
        self.blackhole("del", i, &self.etcd_ip);
    }

    /// Undoes [`Net::block`].
    pub fn unblock(&self, i: usize, j: usize) {
        self.blackhole("del", i, &self.slots[j].ip);
        self.blackhole("del", j, &self.slots[i].ip);
    }

    /// `op` ("add" or "del") a blackhole route to `ip` in namespace `i`.
    fn blackhole(&self, op: &str, i: usize, ip_addr: &str) {
        let dst = format!("{ip_addr}/32");
        ip(&["-n", &self.slots[i].ns, "route", op, "blackhole", &dst]).unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for slot in &self.slots {
            // Deleting the namespace destroys the veth end inside it, and with it the pair.
            let _ = ip(&["netns", "del", &slot.ns]);
            let _ = ip(&["link", "del", &slot.host_veth]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------------------------------

/// One berth node of a [`Cluster`].
pub struct Node {
    /// `n1`, `n2`, ... (node `i` of the cluster is `n{i+1}`).
    pub id: String,
    /// The address it listens on and advertises: 127.0.0.1, or its namespace's address.
    pub ip: String,
    pub port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    /// The `serve` arguments (the same at every restart).
    pub args: Vec<String>,
    /// A client for its HTTP port (a new one after each restart: no pooled connection to a dead process).
    pub client: Client,
    /// Network namespace it runs in, if any.
    pub netns: Option<String>,
    /// How many times it was started.
    pub starts: u32,
    /// SIGSTOPped and not continued yet.
    pub paused: bool,
    /// The token its clients send ([`Opts::token`]).
    pub token: Option<String>,
    /// With [`Opts::tls`]: the CA its certificate is signed by (its clients speak HTTPS and trust only this).
    pub ca: Option<PathBuf>,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    pub fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.ip, self.port)
    }

    /// `ip:port` as it advertises it.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// A client of its own (a new connection pool), sending the cluster's token if any.
    pub fn new_client(&self) -> Client {
        self.anonymous_client().with_token(self.token.clone())
    }

    /// A client of its own that sends no token (but speaks HTTPS, trusting the cluster's CA, under TLS).
    pub fn anonymous_client(&self) -> Client {
        let client = Client::new(&self.url());
        match &self.ca {
            Some(ca) => client.with_ca_file(ca).expect("the test CA loads"),
            None => client,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The process's state letter from `/proc/PID/stat` (`S` sleeping, `R` running, `T` stopped, ...).
    pub fn process_state(&self) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()?)).ok()?;
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit(')').next()?.trim_start().chars().next()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A request; transport failures are `Err`.
    pub fn call(&self, method: &str, path: &str, body: &[u8]) -> Result<Answer, String> {
        self.client.call(method, path, body)
    }

    pub fn get(&self, path: &str) -> Answer {
        self.call("GET", path, &[])
            .unwrap_or_else(|e| panic!("{} GET {path}: {e}", self.id))
    }

    pub fn post(&self, path: &str, body: &[u8]) -> Answer {
        self.call("POST", path, body)
            .unwrap_or_else(|e| panic!("{} POST {path}: {e}", self.id))
    }

    pub fn put(&self, path: &str) -> Answer {
        self.call("PUT", path, &[])
            .unwrap_or_else(|e| panic!("{} PUT {path}: {e}", self.id))
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.data_dir).expect("data dir");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("node log");
        self.starts += 1;
        {
            use std::io::Write;
            let _ = writeln!(
                log,
                "=== harness: start #{} of {}{}: berth {}",
                self.starts,
                self.id,
                self.netns
                    .as_ref()
                    .map(|ns| format!(" in netns {ns}"))
                    .unwrap_or_default(),
                self.args.join(" ")
            );
        }
        let mut cmd = Command::new(berth_bin());
        cmd.args(&self.args)
            .env(
                "BERTH_LOG",
                std::env::var("BERTH_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let _ns = prepare(&mut cmd, self.netns.as_deref()).expect("netns for the node");
        self.child = Some(cmd.spawn().expect("spawn berth"));
        self.paused = false;
        self.client = self.new_client();
    }

    /// Waits (bounded) until `/health` answers 200; panics with the log if the process exits first.
    fn wait_healthy(&mut self) {
        let what = format!("node {}", self.id);
        super::await_healthy(&self.client, &mut self.child, NODE_START, &what, &self.log);
    }

    /// SIGKILL (also a paused process), and reap.
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused = false;
    }

    /// SIGTERM (a clean stop) and reap; panics if the process has not exited within `timeout`.
    fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        let mut child = self.child.take().expect("running");
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if started.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "node {} did not stop within {timeout:?} of SIGTERM\n{}",
                        self.id,
                        tail(&self.log_text(), 40)
                    );
                }
            }
        }
    }

    fn signal(&mut self, sig: libc::c_int) {
        signal(
            self.child
                .as_ref()
                .unwrap_or_else(|| panic!("node {} is not running", self.id)),
            sig,
        );
    }
}

/// How a [`Cluster`] is started.
#[derive(Clone, Debug, Default)]
pub struct Opts {
    /// `--node-ttl SECONDS` (etcd lease TTL); None: the server's default (5 s).
    pub ttl_s: Option<u64>,
    /// Every node in its own network namespace (needed by [`Cluster::cut`]).
    pub netns: bool,
    /// More `serve` flags for every node.
    pub extra: Vec<String>,
    /// `--cores N` for every node; None: one core.
    pub cores: Option<usize>,
    /// Start every node with `--auth-token-file` holding this token; the nodes' clients send it. Without a token,
    /// nodes in namespaces (listening on non-loopback addresses) get `--insecure`.
    pub token: Option<String>,
    /// Start every node with `--peer-token-file` holding this cluster secret (node RPC's hello).
    pub peer_token: Option<String>,
    /// Harness self-check only: nodes are plain single-node servers (no cluster flags), so the harness's process,
    /// namespace and restart handling can be checked with any server build.
    pub plain: bool,
    /// TLS everywhere: one CA for the cluster, a certificate per node for its address; every node's client
    /// listener speaks HTTPS (its clients trust only that CA) and node RPC runs over TLS with client certificates
    /// required (`--peer-tls-client-auth`). Also on for every cluster when `BERTH_TEST_TLS=1`.
    pub tls: bool,
}

impl Opts {
    /// Failure tests: a 2 s lease, so a dead node is noticed within about 2.5 s.
    pub fn short_ttl() -> Opts {
        Opts {
            ttl_s: Some(2),
            ..Opts::default()
        }
    }
}

/// A node's line in `GET /cluster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    pub advertise: String,
    pub alive: bool,
    pub partitions: u64,
    /// Partitions it leads, and holds a replica of without leading, per the metastore.
    pub leads: u64,
    pub follows: u64,
}

/// etcd plus N berth nodes in cluster mode (api.md "Cluster mode"), on one test's own cluster name.
pub struct Cluster {
    pub test: String,
    /// `--cluster-name`: the etcd key prefix is `/berth/<name>/`.
    pub name: String,
    pub opts: Opts,
    nodes: Vec<Node>,
    // Field order is drop order after `Drop::drop`: the nodes die first (in `drop`), then etcd, the namespaces, and
    // the temp dir last.
    pub etcd: Etcd,
    net: Option<Net>,
    dir: Option<tempfile::TempDir>,
}

impl Cluster {
    /// Starts etcd and `n` nodes with the default options, and waits until every node lists all `n` alive.
    /// `None` (after printing `SKIP test: ...`) when etcd is not installed.
    pub fn start(test: &str, n: usize) -> Option<Cluster> {
        Cluster::start_with(test, n, Opts::default())
    }

    /// [`Cluster::start`] with options; also `None` (after a SKIP line) when `opts.netns` and namespaces cannot be
    /// made here.
    pub fn start_with(test: &str, n: usize, opts: Opts) -> Option<Cluster> {
        let cluster = Cluster::launch(test, n, opts)?;
        cluster.wait_all_live();
        Some(cluster)
    }

    /// Starts etcd and `n` nodes and waits for each one's `/health`, but not for them to see each other (the
    /// harness self-check uses this; tests want [`Cluster::start_with`]).
    pub fn launch(test: &str, n: usize, opts: Opts) -> Option<Cluster> {
        let net = if opts.netns {
            match Net::new() {
                Ok(net) => Some(net),
                Err(why) => {
                    println!("SKIP {test}: network namespaces unavailable here ({why})");
                    return None;
                }
            }
        } else {
            None
        };
        let extra_ips: Vec<String> = net
            .iter()
            .flat_map(|n| [n.gateway.clone(), n.etcd_ip.clone()])
            .collect();
        let etcd = Etcd::start_on(test, &extra_ips)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("berth-cluster-{test}-"))
            .tempdir()
            .expect("tempdir");
        let name: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(100)
            .collect();
        let mut cluster = Cluster {
            test: test.to_string(),
            name,
            opts,
            nodes: Vec::new(),
            etcd,
            net,
            dir: Some(dir),
        };
        for _ in 0..n {
            cluster.spawn_new_node();
        }
        for node in &mut cluster.nodes {
            node.wait_healthy();
        }
        Some(cluster)
    }

    /// Creates node `nodes.len()` (its namespace too) and spawns it, without waiting.
    fn spawn_new_node(&mut self) -> usize {
        let i = self.nodes.len();
        let id = format!("n{}", i + 1);
        let (ip, netns, etcd_url) = match &mut self.net {
            Some(net) => {
                let slot = net
                    .add_slot(i)
                    .unwrap_or_else(|e| panic!("network namespace for {id}: {e}"));
                (
                    slot.ip.clone(),
                    Some(slot.ns.clone()),
                    self.etcd.url_on(&net.etcd_ip),
                )
            }
            None => ("127.0.0.1".to_string(), None, self.etcd.url.clone()),
        };
        let (port, peer_port) = (free_port(), free_port());
        let dir = self.dir();
        let data_dir = dir.join(&id).join("data");
        let cores = self.opts.cores.unwrap_or(1).to_string();
        let mut args: Vec<String> = [
            "serve",
            "--listen",
            &format!("{ip}:{port}"),
            "--data-dir",
            &data_dir.display().to_string(),
            "--cores",
            &cores,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let cluster_args = [
            "--cluster",
            &etcd_url,
            "--node-id",
            &id,
            "--advertise",
            &format!("{ip}:{port}"),
            "--peer-listen",
            &format!("{ip}:{peer_port}"),
            "--cluster-name",
            &self.name,
        ];
        match &self.opts.token {
            Some(token) => {
                let file = dir.join("token");
                std::fs::write(&file, format!("{token}\n")).expect("token file");
                args.extend(["--auth-token-file".to_string(), file.display().to_string()]);
            }
            None if netns.is_some() => args.push("--insecure".into()),
            None => {}
        }
        if !self.opts.plain {
            args.extend(cluster_args.iter().map(|s| s.to_string()));
            if let Some(secret) = &self.opts.peer_token {
                let file = dir.join("peer-token");
                std::fs::write(&file, format!("{secret}\n")).expect("peer token file");
                args.extend(["--peer-token-file".to_string(), file.display().to_string()]);
            }
            if let Some(ttl) = self.opts.ttl_s {
                args.extend(["--node-ttl".to_string(), ttl.to_string()]);
            }
        }
        args.extend(self.opts.extra.iter().cloned());
        let tls = (self.opts.tls || std::env::var("BERTH_TEST_TLS").is_ok_and(|v| v == "1"))
            && !self.opts.plain;
        let ca = tls.then(|| {
            let (ca, cert, key) = self.node_certificate(&id, &ip);
            args.extend(
                [
                    "--tls-cert-file",
                    &cert.display().to_string(),
                    "--tls-key-file",
                    &key.display().to_string(),
                    "--peer-tls-ca-file",
                    &ca.display().to_string(),
                    "--peer-tls-client-auth",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            ca
        });
        let mut node = Node {
            id: id.clone(),
            client: Client::new(&format!("http://{ip}:{port}")),
            token: self.opts.token.clone(),
            ca,
            ip,
            port,
            peer_port,
            data_dir,
            args,
            netns,
            starts: 0,
            paused: false,
            log: dir.join(format!("{id}.log")),
            child: None,
        };
        node.spawn();
        self.nodes.push(node);
        i
    }

    /// The cluster's test CA (made at the first call, in the cluster's dir) and a certificate it signed for node `id`
    /// at `ip` (and 127.0.0.1, localhost): (ca.pem, cert.pem, key.pem).
    fn node_certificate(&self, id: &str, ip: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir = self.dir();
        let ca_path = dir.join("ca.pem");
        let ca_key_path = dir.join("ca-key.pem");
        let ca_params = || {
            let mut params =
                rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "berth test CA");
            params
        };
        if !ca_path.exists() {
            let key = rcgen::KeyPair::generate().expect("CA key");
            let ca = ca_params().self_signed(&key).expect("CA certificate");
            std::fs::write(&ca_path, ca.pem()).expect("ca.pem");
            std::fs::write(&ca_key_path, key.serialize_pem()).expect("ca-key.pem");
        }
        // The issuer a certificate is signed by is the CA's name and key: the same parameters and key as ca.pem's
        // make the same issuer (rcgen's validity dates are fixed), so every node certificate chains to ca.pem.
        let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(&ca_key_path).unwrap())
            .expect("CA key");
        let ca = ca_params().self_signed(&ca_key).expect("CA certificate");
        let key = rcgen::KeyPair::generate().expect("node key");
        let mut names = vec![ip.to_string(), "localhost".to_string()];
        if ip != "127.0.0.1" {
            names.push("127.0.0.1".into());
        }
        let cert = rcgen::CertificateParams::new(names)
            .expect("node params")
            .signed_by(&key, &ca, &ca_key)
            .expect("node certificate");
        let (cert_path, key_path) = (
            dir.join(format!("{id}-cert.pem")),
            dir.join(format!("{id}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("node cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("node key");
        (ca_path, cert_path, key_path)
    }

    /// Where the logs and data dirs are.
    pub fn dir(&self) -> PathBuf {
        self.dir.as_ref().expect("temp dir").path().to_path_buf()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Clients of every node, in order (clones share the connection pool).
    pub fn clients(&self) -> Vec<Client> {
        self.nodes.iter().map(|n| n.client.clone()).collect()
    }

    /// The index of node `id`.
    pub fn index_of(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The network (netns clusters only).
    pub fn net(&self) -> &Net {
        self.net.as_ref().expect("cluster started without netns")
    }

    /// Starts one more node (a late joiner), waits for its `/health`; returns its index. Does not wait for the
    /// others to see it (use [`Cluster::wait_all_live`]).
    pub fn add_node(&mut self) -> usize {
        let i = self.spawn_new_node();
        self.nodes[i].wait_healthy();
        i
    }

    /// Sets `flag VALUE` in node `i`'s command line (replacing the flag's value if it is there), for its next
    /// start (`restart`, `start_again`): a node brought back with, say, another `--cores` or a `--config`.
    pub fn set_flag(&mut self, i: usize, flag: &str, value: &str) {
        let args = &mut self.nodes[i].args;
        match args.iter().position(|a| a == flag) {
            Some(at) => args[at + 1] = value.to_string(),
            None => args.extend([flag.to_string(), value.to_string()]),
        }
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].kill9();
    }

    /// SIGTERM node `i` and wait (bounded) for it to exit; returns its exit status.
    pub fn terminate(&mut self, i: usize) -> std::process::ExitStatus {
        self.nodes[i].terminate(Duration::from_secs(20))
    }

    /// Node `i` again (stopped before) on the same data dir, ports and flags, at once: no waiting for its old lease
    /// (unlike [`Cluster::restart`]); waits for `/health`.
    pub fn start_again(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        assert!(node.child.is_none(), "node {} is still running", node.id);
        node.spawn();
        node.wait_healthy();
    }

    /// Node `i` again (stopped before), expecting it to refuse to start: waits (20 s at most) for it to exit with a
    /// failure, and returns its log.
    pub fn start_refused(&mut self, i: usize) -> String {
        let node = &mut self.nodes[i];
        assert!(node.child.is_none(), "node {} is still running", node.id);
        node.spawn();
        let mut child = node.child.take().expect("spawned");
        let status = wait_for(
            &format!("{} to refuse to start", node.id),
            Duration::from_secs(20),
            || match child.try_wait() {
                Ok(Some(status)) => Ok(status),
                Ok(None) => Err("still running".into()),
                Err(e) => Err(e.to_string()),
            },
        );
        assert!(!status.success(), "{} started: {status}", node.id);
        node.log_text()
    }

    /// kill -9 (if running), then node `i` again on the same data dir, ports, namespace and flags, once etcd has
    /// expired its old session (a node id whose lease is still alive is refused, docs/cluster.md) and no socket
    /// listens on its ports any more; waits for `/health`. Does not wait for the others to see it alive.
    pub fn restart(&mut self, i: usize) {
        self.kill9(i);
        let alive_key = format!("/berth/{}/alive/{}", self.name, self.nodes[i].id);
        let ttl = self.opts.ttl_s.unwrap_or(5);
        let etcd = &self.etcd;
        wait_for(
            &format!("etcd to expire {}'s lease ({alive_key})", self.nodes[i].id),
            Duration::from_secs(3 * ttl + 5),
            || match etcd.get(&alive_key) {
                Ok(None) => Ok(()),
                Ok(Some(v)) => Err(format!("still there: {v}")),
                Err(e) => Err(e),
            },
        );
        let node = &self.nodes[i];
        let ns = node.netns.clone();
        for port in [node.port, node.peer_port] {
            wait_for(
                &format!("{}'s old listener on port {port} to be gone", node.id),
                Duration::from_secs(5),
                || {
                    if listening(ns.as_deref(), port) {
                        Err(sockets_on(ns.as_deref(), port))
                    } else {
                        Ok(())
                    }
                },
            );
        }
        let node = &mut self.nodes[i];
        node.spawn();
        node.wait_healthy();
    }

    /// SIGSTOP node `i`: its sockets stay open but it answers nothing and refreshes no lease. Returns once the
    /// process is stopped (signals are delivered asynchronously).
    pub fn pause(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.signal(libc::SIGSTOP);
        node.paused = true;
        let node = &self.nodes[i];
        wait_for(
            &format!("{} to stop", node.id),
            Duration::from_secs(5),
            || match node.process_state() {
                Some('T') => Ok(()),
                s => Err(format!("state {s:?}")),
            },
        );
    }

    /// SIGCONT after [`Cluster::pause`]; returns once the process runs again.
    pub fn resume(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.signal(libc::SIGCONT);
        node.paused = false;
        let node = &self.nodes[i];
        wait_for(
            &format!("{} to continue", node.id),
            Duration::from_secs(5),
            || match node.process_state() {
                Some('T') | None => Err("stopped".to_string()),
                Some(_) => Ok(()),
            },
        );
    }

    /// Cuts node `i` off the network (netns clusters only): nothing reaches it, it reaches nothing (not etcd, not
    /// the other nodes, not the test's clients).
    pub fn cut(&self, i: usize) {
        self.net().cut(i);
    }

    /// Undoes [`Cluster::cut`].
    pub fn heal(&self, i: usize) {
        self.net().heal(i);
    }

    /// Cuts nodes `i` and `j` off each other only (netns clusters): see [`Net::block`].
    pub fn block(&self, i: usize, j: usize) {
        self.net().block(i, j);
    }

    /// Undoes [`Cluster::block`].
    pub fn unblock(&self, i: usize, j: usize) {
        self.net().unblock(i, j);
    }

    /// `GET /cluster` on node `on`, parsed; Err on a transport error, a non-200 answer or a malformed body.
    pub fn view(&self, on: usize) -> Result<Vec<NodeView>, String> {
        let a = self.nodes[on].call("GET", "/cluster", &[])?;
        if a.status != 200 {
            return Err(format!(
                "GET /cluster on {}: {} {}",
                self.nodes[on].id,
                a.status,
                a.text()
            ));
        }
        let j = a.json();
        let nodes = j["nodes"]
            .as_array()
            .ok_or_else(|| format!("GET /cluster: no nodes array: {}", a.text()))?;
        nodes
            .iter()
            .map(|n| {
                Ok(NodeView {
                    id: n["id"].as_str().ok_or("node without id")?.to_string(),
                    advertise: n["advertise"].as_str().unwrap_or_default().to_string(),
                    alive: n["alive"].as_bool().ok_or("node without alive")?,
                    partitions: n["partitions"].as_u64().unwrap_or(0),
                    leads: n["leads"].as_u64().unwrap_or(0),
                    follows: n["follows"].as_u64().unwrap_or(0),
                })
            })
            .collect::<Result<Vec<_>, &str>>()
            .map_err(|e| format!("{e}: {}", a.text()))
    }

    /// Waits until `GET /cluster` on node `on` lists exactly `k` nodes alive; returns that view.
    pub fn wait_live(&self, on: usize, k: usize) -> Vec<NodeView> {
        self.wait_view(
            on,
            &format!("{} to list {k} live nodes", self.nodes[on].id),
            |v| v.iter().filter(|n| n.alive).count() == k,
        )
    }

    /// Waits until `GET /cluster` on node `on` lists node `id` with `alive` as given.
    pub fn wait_alive(&self, on: usize, id: &str, alive: bool) -> Vec<NodeView> {
        self.wait_view(
            on,
            &format!("{} to list {id} alive={alive}", self.nodes[on].id),
            |v| v.iter().any(|n| n.id == id && n.alive == alive),
        )
    }

    /// Waits until `GET /cluster` on node `on` satisfies `ok`; the deadline covers a lease expiry (3 TTLs + 5 s).
    pub fn wait_view(
        &self,
        on: usize,
        what: &str,
        ok: impl Fn(&[NodeView]) -> bool,
    ) -> Vec<NodeView> {
        let ttl = self.opts.ttl_s.unwrap_or(5);
        wait_for(what, Duration::from_secs(3 * ttl + 5), || {
            let v = self.view(on)?;
            if ok(&v) {
                Ok(v)
            } else {
                Err(format!("{v:?}"))
            }
        })
    }

    /// Waits until every running, unpaused node lists exactly the running, unpaused nodes as alive (those
    /// started and not killed; cut nodes count as running: do not call this while one is cut).
    pub fn wait_all_live(&self) {
        let live: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.running() && !n.paused)
            .map(|n| n.id.as_str())
            .collect();
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.running() || node.paused {
                continue;
            }
            self.wait_view(
                i,
                &format!("{} to list exactly {live:?} alive", node.id),
                |v| {
                    let mut alive: Vec<&str> = v
                        .iter()
                        .filter(|n| n.alive)
                        .map(|n| n.id.as_str())
                        .collect();
                    alive.sort();
                    let mut want = live.clone();
                    want.sort();
                    alive == want
                },
            );
        }
    }

    /// The owner (node id) of every partition of `topic`, from `GET /topics/{topic}` on node `on`.
    /// Waits (bounded, 10 s) for the topic to be known there and every partition's node to answer: tests that are
    /// not about read-your-writes should not stop at it (`topic_created_on_one_node_is_served_by_all` checks that a
    /// created topic is served at once).
    pub fn owners(&self, on: usize, topic: &str) -> Vec<String> {
        let node = &self.nodes[on];
        let path = format!("/topics/{topic}");
        let a = wait_for(
            &format!(
                "GET {path} through {} to answer 200 with every partition available",
                node.id
            ),
            Duration::from_secs(10),
            || match node.call("GET", &path, &[]) {
                Ok(a) if a.status == 200 && !a.text().contains("\"available\":false") => Ok(a),
                Ok(a) => Err(format!("{} {}", a.status, a.text())),
                Err(e) => Err(e),
            },
        );
        a.json()["partitions"]
            .as_array()
            .expect("partitions array")
            .iter()
            .map(|p| {
                p["node"]
                    .as_str()
                    .unwrap_or_else(|| panic!("partition without node: {p}"))
                    .to_string()
            })
            .collect()
    }

    /// Partitions of `topic` owned by node `i` (per node `on`).
    pub fn partitions_of(&self, on: usize, topic: &str, i: usize) -> Vec<u64> {
        let id = &self.nodes[i].id;
        self.owners(on, topic)
            .iter()
            .enumerate()
            .filter(|(_, o)| *o == id)
            .map(|(p, _)| p as u64)
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill9();
        }
        let keep = std::env::var_os("BERTH_KEEP_LOGS").is_some_and(|v| v != "0");
        if std::thread::panicking() {
            for node in &self.nodes {
                eprintln!(
                    "----- {} log ({}), last lines -----\n{}",
                    node.id,
                    node.log.display(),
                    tail(&node.log_text(), 40)
                );
            }
            eprintln!(
                "----- etcd log, last lines -----\n{}",
                tail(&self.etcd.log(), 15)
            );
        }
        if keep {
            if let Some(dir) = self.dir.take() {
                let path = dir.keep();
                eprintln!("BERTH_KEEP_LOGS: {} kept in {}", self.test, path.display());
            }
        }
    }
}
