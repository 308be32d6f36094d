//! Test support for the cluster modules: a real single-member etcd on free loopback ports with its own temporary
//! data dir, that a test can kill, restart (on another client port or its old one, keeping its data), pause with
//! SIGSTOP and continue. Tests that need etcd call [`start_etcd`] and return early (printing a skip line) when it is
//! not installed.

use glommio::{LocalExecutorBuilder, Placement};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd may take to answer after being started.
const START_DEADLINE: Duration = Duration::from_secs(20);

fn etcd_binary() -> Option<PathBuf> {
    // An explicit choice wins; one naming no file means "no etcd" (which also exercises the skip path).
    if let Some(p) = std::env::var_os("BERTH_ETCD_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

/// A TCP port nobody listens on right now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A running single-member etcd; killed on drop (its data dir goes with the guard).
pub(crate) struct EtcdProcess {
    child: Option<Child>,
    bin: PathBuf,
    /// The client URL it serves now (`http://127.0.0.1:port`).
    pub url: String,
    peer_port: u16,
    dir: tempfile::TempDir,
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl EtcdProcess {
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// Kills the process now (SIGKILL: no goodbye to its clients beyond the kernel closing the sockets).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills etcd and starts it again with the same data, serving clients on `client_port` from now on (clients
    /// of the old URL cannot reach it until it is restarted there).
    pub fn restart_on(&mut self, client_port: u16) {
        self.kill();
        self.url = format!("http://127.0.0.1:{client_port}");
        assert!(
            self.spawn_and_wait(),
            "etcd did not restart; log:\n{}",
            self.log()
        );
    }

    /// SIGSTOP: etcd keeps its sockets but answers nothing, and its clock keeps running (leases expire on continue).
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`EtcdProcess::pause`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        let child = self.child.as_ref().expect("etcd is running");
        // SAFETY: kill(2) on our own child's pid, which we have not reaped (it is still in `self.child`).
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({sig}) failed");
    }

    /// Starts the process on the current ports; true once it answers, false if it exits or never answers.
    fn spawn_and_wait(&mut self) -> bool {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        let child = Command::new(&self.bin)
            .arg("--name=t")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={}", self.url))
            .arg(format!("--advertise-client-urls={}", self.url))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=t={peer}"))
            .env_remove("ETCD_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + START_DEADLINE;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false; // exited: port clash or similar
            }
            let ready = ureq::post(&format!("{}/v3/kv/range", self.url))
                .timeout(Duration::from_secs(1))
                .send_string(r#"{"key":"AA=="}"#)
                .is_ok();
            if ready {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

/// Starts etcd, or prints a skip line and returns `None` when it is not installed.
pub(crate) fn start_etcd(test: &str) -> Option<EtcdProcess> {
    let Some(bin) = etcd_binary() else {
        println!("SKIP {test}: etcd not installed (apt-get install -y etcd-server)");
        return None;
    };
    for _attempt in 0..3 {
        let mut proc = EtcdProcess {
            child: None,
            bin: bin.clone(),
            url: format!("http://127.0.0.1:{}", free_port()),
            peer_port: free_port(),
            dir: tempfile::tempdir().unwrap(),
        };
        if proc.spawn_and_wait() {
            return Some(proc);
        }
        eprintln!("etcd did not start; log:\n{}", proc.log());
    }
    panic!("etcd would not start");
}

/// Runs `fut` to completion on a fresh glommio executor on this thread.
pub(crate) fn run<Fut: std::future::Future<Output = ()>>(fut: Fut) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .make()
        .unwrap()
        .run(fut);
}
