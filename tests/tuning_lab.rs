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
