//! The tuning lab's runner (`tuning/run.sh`) as a person meets it first: `--help` says what it does and changes,
//! `--dry-run` shows what each profile would change and changes nothing, a wrong option or profile is refused
//! before anything is touched.

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tuning/run.sh"))
        .args(args)
        .output()
        .expect("run tuning/run.sh");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The host settings the low-latency profile changes (those this host has).
fn settings() -> Vec<(String, String)> {
    let mut files = vec![
        "/proc/sys/net/core/busy_poll".to_string(),
        "/proc/sys/net/ipv4/tcp_autocorking".into(),
        "/proc/sys/kernel/timer_migration".into(),
        "/sys/kernel/mm/transparent_hugepage/enabled".into(),
    ];
    if let Ok(dir) = std::fs::read_dir("/proc/irq") {
        for e in dir.flatten() {
            files.push(format!("{}/smp_affinity", e.path().display()));
        }
    }
    files
        .into_iter()
        .filter_map(|f| std::fs::read_to_string(&f).ok().map(|v| (f, v)))
        .collect()
}

#[test]
fn help_lists_the_options_and_what_the_lab_changes() {
    let (code, stdout, _) = run(&["--help"]);
    assert_eq!(code, Some(0));
    for word in ["--profiles", "--dry-run", "--duration", "IRQ", "restores"] {
        assert!(
            stdout.contains(word),
            "--help does not mention {word}: {stdout}"
        );
    }
}

#[test]
fn a_dry_run_shows_each_profiles_changes_and_changes_nothing() {
    let before = settings();
    let (code, stdout, stderr) = run(&["--dry-run", "--profiles", "baseline low-latency"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("== low-latency"), "{stdout}");
    assert!(stdout.contains("net.core.busy_poll"), "{stdout}");
    assert!(stdout.contains("transparent_hugepage"), "{stdout}");
    assert_eq!(settings(), before, "a dry run changed the host");
}

#[test]
fn a_wrong_option_or_profile_is_refused_before_anything_runs() {
    let (code, _, stderr) = run(&["--bogus"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--help"), "{stderr}");
    let (code, stdout, stderr) = run(&["--profiles", "no-such-profile"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stderr.contains("no-such-profile"), "{stderr}");
}

/// Every thread's own CPU mask (`/proc/TID/status`, `Cpus_allowed`), by thread id.
fn thread_masks() -> std::collections::BTreeMap<String, String> {
    let mut masks = std::collections::BTreeMap::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            if let Some(mask) = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed:")) {
                masks.insert(
                    t.file_name().to_string_lossy().into_owned(),
                    mask.trim().to_string(),
                );
            }
        }
    }
    masks
}

/// A real run of the knobs that change the running system's scheduling (receive packet steering, every thread moved
/// off the server's CPU, C-states held) applies them (as root) and puts everything back: a thread pinned on its own
/// to CPU 0 is on CPU 0 again, every other thread that lived through the run has its mask again, and the loopback's
/// steering is what it was. A host without root, or with one CPU, only checks that nothing changed.
#[test]
fn a_run_of_the_scheduling_knobs_puts_every_thread_and_setting_back() {
    let bench = concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/berth-bench");
    if !std::path::Path::new(bench).exists()
        || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2
    {
        eprintln!("skipped: needs target/release/berth-bench and two CPUs");
        return;
    }
    let rps = "/sys/class/net/lo/queues/rx-0/rps_cpus";
    let rps_before = std::fs::read_to_string(rps).ok();
    // A process whose one thread is pinned to CPU 0 alone: the isolation moves it, the revert brings it back.
    let mut pinned = Command::new("taskset")
        .args(["-c", "0", "sleep", "120"])
        .spawn()
        .expect("taskset");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = thread_masks();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lab");
    let (code, stdout, stderr) = run(&[
        "--profiles",
        "baseline rps isolate no-cstates",
        "--duration",
        "1s",
        "--bench-args",
        "--workload cycle --connections 2 --fsync never",
        "--out",
        out.to_str().unwrap(),
    ]);
    let after = thread_masks();
    let _ = pinned.kill();
    let _ = pinned.wait();
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        std::fs::read_to_string(rps).ok(),
        rps_before,
        "rps_cpus not restored"
    );
    let changed: Vec<_> = before
        .iter()
        .filter(|(tid, mask)| after.get(*tid).is_some_and(|m| m != *mask))
        .collect();
    assert!(
        changed.is_empty(),
        "threads left with another mask: {changed:?}\n{stdout}"
    );
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        let knobs = std::fs::read_to_string(out.join("isolate.knobs.tsv")).unwrap();
        assert!(knobs.contains("isolation\tapplied"), "{knobs}");
        // (A host whose sysfs is read-only refuses the steering: reported, not applied.)
        let knobs = std::fs::read_to_string(out.join("rps.knobs.tsv")).unwrap();
        assert!(
            ["applied", "refused", "skipped"]
                .iter()
                .any(|s| knobs.contains(&format!("rps_cpus(lo)\t{s}"))),
            "{knobs}"
        );
        assert!(out.join("comparison.md").exists(), "{stdout}");
    }
}
