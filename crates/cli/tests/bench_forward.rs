//! `pagewise bench` forwards to `pagewise-bench`, the benchmarks' own
//! program, and says clearly when it is not installed.

mod support;
use support::*;

#[test]
fn bench_runs_the_bench_program_beside_the_tool() {
    let beside = std::path::Path::new(BIN).with_file_name("pagewise-bench");
    if !beside.exists() {
        pagewise_testkit::skip!(
            "{} is not built (cargo build --release -p pagewise-bench)",
            beside.display()
        );
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
