//! A real single-member etcd for tests, on free loopback ports with its own temporary data dir: started, killed,
//! restarted (on its ports, or on another client port keeping its data), paused with SIGSTOP and continued, and
//! read through its v3 JSON gateway. Skips, never fails, when etcd is not installed: [`Etcd::start`] prints
//! `SKIP <test>: ...` and returns `None`.
//!
//! One file for both kinds of tests: the end-to-end harness (`tests/common`, `mod etcd`) and the library's cluster
//! unit tests (`src/cluster/test_etcd.rs` includes it by path). Its parent module provides `free_port`.
#![allow(dead_code)]

use super::free_port;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd may take to answer after being started.
const ETCD_START: Duration = Duration::from_secs(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Sends `sig` to a child this test started and has not reaped.
pub fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid, which we have not reaped (the Child is still held).
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({}, {sig}) failed", child.id());
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
pub fn etcd_binary() -> Option<PathBuf> {
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

/// A running single-member etcd with its own temp data dir; killed on drop.
pub struct Etcd {
    child: Option<Child>,
    bin: PathBuf,
    /// The client URL on loopback (`http://127.0.0.1:port`).
    pub url: String,
    pub port: u16,
    peer_port: u16,
    /// More addresses it serves clients on (a bridge address, for nodes in network namespaces).
    extra_ips: Vec<String>,
    dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Etcd {
    /// Starts etcd on free loopback ports, or prints a skip line and returns `None` when it is not installed.
    pub fn start(test: &str) -> Option<Etcd> {
        Etcd::start_on(test, &[])
    }

    /// [`Etcd::start`], also serving clients on `extra_ips` (same port).
    pub fn start_on(test: &str, extra_ips: &[String]) -> Option<Etcd> {
        let Some(bin) = etcd_binary() else {
            println!("SKIP {test}: etcd not installed (apt-get install -y etcd-server, or set BERTH_ETCD_BIN)");
            return None;
        };
        for _attempt in 0..3 {
            let port = free_port();
            let mut etcd = Etcd {
                child: None,
                bin: bin.clone(),
                url: format!("http://127.0.0.1:{port}"),
                port,
                peer_port: free_port(),
                extra_ips: extra_ips.to_vec(),
                dir: tempfile::tempdir().expect("tempdir"),
            };
            if etcd.spawn_and_wait() {
                return Some(etcd);
            }
            eprintln!("etcd did not start; log:\n{}", tail(&etcd.log(), 40));
        }
        panic!("etcd would not start");
    }

    /// The client URL on `ip` (one of the extra addresses, or 127.0.0.1).
    pub fn url_on(&self, ip: &str) -> String {
        format!("http://{ip}:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills etcd and starts it again with the same data, serving clients on `client_port` from now on (clients
    /// of the old URL cannot reach it until it is restarted there).
    pub fn restart_on(&mut self, client_port: u16) {
        self.port = client_port;
        self.url = format!("http://127.0.0.1:{client_port}");
        self.restart();
    }

    /// Kills etcd and starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn_and_wait(),
            "etcd did not restart; log:\n{}",
            tail(&self.log(), 40)
        );
    }

    /// SIGSTOP: etcd keeps its sockets but answers nothing.
    pub fn pause(&self) {
        signal(self.child.as_ref().expect("etcd is running"), libc::SIGSTOP);
    }

    /// SIGCONT after [`Etcd::pause`].
    pub fn resume(&self) {
        signal(self.child.as_ref().expect("etcd is running"), libc::SIGCONT);
    }

    fn spawn_and_wait(&mut self) -> bool {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let clients: Vec<String> = std::iter::once("127.0.0.1".to_string())
            .chain(self.extra_ips.iter().cloned())
            .map(|ip| self.url_on(&ip))
            .collect();
        let clients = clients.join(",");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("etcd log");
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--name=t")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={clients}"))
            .arg(format!("--advertise-client-urls={clients}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=t={peer}"))
            .env_remove("ETCD_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: only prctl, async-signal-safe, between fork and exec: etcd dies with the thread that started it.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.child = Some(cmd.spawn().expect("spawn etcd"));
        let deadline = Instant::now() + ETCD_START;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false; // exited: port clash or similar
            }
            if self.range_raw("", false).is_ok() {
                return true;
            }
            std::thread::sleep(ms(50));
        }
        false
    }

    /// One range read through the JSON gateway: `key`, or every key starting with it when `prefix`.
    fn range_raw(&self, key: &str, prefix: bool) -> Result<Vec<(String, String)>, String> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut body =
            serde_json::json!({ "key": b64.encode(if key.is_empty() { "\0" } else { key }) });
        if prefix {
            let mut end = key.as_bytes().to_vec();
            // The prefix's range end: its last byte plus one (keys here are ASCII, never 0xff).
            *end.last_mut().expect("non-empty prefix") += 1;
            body["range_end"] = b64.encode(end).into();
        }
        let answer = ureq::post(&format!("{}/v3/kv/range", self.url))
            .timeout(Duration::from_secs(2))
            .send_string(&body.to_string())
            .map_err(|e| format!("etcd range: {e}"))?;
        let text = answer
            .into_string()
            .map_err(|e| format!("etcd range answer: {e}"))?;
        let j: Value =
            serde_json::from_str(&text).map_err(|e| format!("etcd range answer {text}: {e}"))?;
        let decode = |v: &Value| -> String {
            let bytes = b64.decode(v.as_str().unwrap_or("")).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Ok(j["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .map(|kv| (decode(&kv["key"]), decode(&kv["value"])))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The value of `key`, if it exists.
    pub fn get(&self, key: &str) -> Result<Option<String>, String> {
        Ok(self
            .range_raw(key, false)?
            .into_iter()
            .next()
            .map(|kv| kv.1))
    }

    /// Every key (and value) under `prefix`.
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, String)>, String> {
        self.range_raw(prefix, true)
    }

    /// Writes `key` = `value` through the JSON gateway (as an operator's `etcdctl put` would).
    pub fn put(&self, key: &str, value: &str) -> Result<(), String> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = serde_json::json!({ "key": b64.encode(key), "value": b64.encode(value) });
        ureq::post(&format!("{}/v3/kv/put", self.url))
            .timeout(Duration::from_secs(2))
            .send_string(&body.to_string())
            .map_err(|e| format!("etcd put: {e}"))?;
        Ok(())
    }
}
