//! `pagewise bench` forwards to `pagewise-bench`, the benchmarks' own
//! program, and says clearly when it is not installed.

mod support;
use support::*;

#[test]
fn bench_runs_the_bench_program_beside_the_tool() {
    let beside = std::path::Path::new(BIN).with_file_name("pagewise-bench");
    if !beside.exists() {
        pagewise_testkit::skip!("{} is not built (make bench)", beside.display());
        return;
    }
    let out = Command::new(BIN)
        .args(["bench", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // The bench program's own help, with its experiments.
    assert!(text.contains("pagewise-bench"), "{text}");
    for what in ["track", "snap", "farmem", "dedup-redis", "thp-redis"] {
        assert!(text.contains(what), "no {what} in {text}");
    }
    // An unknown experiment is refused by the bench program, with its usage.
    let out = Command::new(BIN)
        .args(["bench", "no-such"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pagewise-bench"));
}

#[test]
fn bench_without_the_bench_program_says_so() {
    let dir = std::env::temp_dir().join(format!("pagewise-bench-fwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let alone = dir.join("pagewise");
    std::fs::copy(BIN, &alone).unwrap();
    let out = Command::new(&alone)
        .args(["bench", "track"])
        .env("PATH", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("pagewise-bench is not installed beside pagewise"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// SIGINT in the middle of a benchmark that changed a system setting
/// (`bench track` raises `vm.max_map_count` for its mprotect baseline) puts
/// the setting back before the program ends, with status 130.
#[test]
fn a_bench_ended_by_sigint_puts_its_settings_back() {
    let beside = std::path::Path::new(BIN).with_file_name("pagewise-bench");
    if !pagewise_testkit::is_root() || !beside.exists() {
        pagewise_testkit::skip!("bench and SIGINT: needs root and pagewise-bench built");
        return;
    }
    const KNOB: &str = "/proc/sys/vm/max_map_count";
    let read = || std::fs::read_to_string(KNOB).unwrap().trim().to_string();
    let orig = read();
    if orig == "4194304" {
        pagewise_testkit::not_happened!("bench and SIGINT: {KNOB} is at the bench's value already");
        return;
    }
    let mut child = Command::new(&beside)
        .arg("track")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while read() != "4194304" && t0.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if read() != "4194304" {
        let _ = child.kill();
        let _ = child.wait();
        pagewise_testkit::not_happened!("bench and SIGINT: bench track never raised {KNOB}");
        return;
    }
    // SAFETY: kill with a child's pid and a valid signal.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = pagewise_mech::child::wait_for(&mut child, std::time::Duration::from_secs(30));
    let mut err = String::new();
    use std::io::Read;
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(read(), orig, "{KNOB} put back: {err}");
    assert_eq!(st.and_then(|s| s.code()), Some(130), "{err}");
    assert!(err.contains("put back"), "{err}");
}
