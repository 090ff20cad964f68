//! Thread pools that never stand still (`tests/c/churn.c`: every thread
//! checks its work, starts its successor and ends): snapshots and live
//! snapshots of 5, 64 and 1,024 such threads leave the program unharmed
//! (it exits 0, every thread's work right), refuse nothing they should
//! take, and a restore is refused for the threads that changed — never a
//! crash. A short slice runs by default; `PAGEWISE_LONG_RUNS=1` runs 100
//! snapshots per size.
//!
//! The live snapshot is held to [`LIVE_PASSES`] passes: 1,024 threads that
//! never stop leave the copier a thousandth of the CPU, and passes that
//! never converge would run for minutes (the stop after the last pass is
//! what is tested, not convergence). The program is given
//! [`LIFETIME`] seconds, far more than any run needs; it ends when its
//! stdin closes.

use super::*;
use pagewise_snap::RollbackRefusal;
use std::time::Duration;

fn churn() -> Option<PathBuf> {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/churn.c");
    match pagewise_testkit::c_program(&src, Path::new(env!("CARGO_TARGET_TMPDIR")), &["-pthread"]) {
        Ok(p) => Some(p),
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            None
        }
    }
}

/// Passes of the live snapshot before it stops the pool for the rest.
const LIVE_PASSES: usize = 3;

/// The seconds the program runs at most unless its stdin closes first.
const LIFETIME: &str = "3600";

fn long() -> bool {
    std::env::var_os("PAGEWISE_LONG_RUNS").is_some_and(|v| v == "1")
}

/// One pool of `n` threads: `takes` snapshots, one live snapshot, one
/// restore; then the program's own verdict.
fn pool(path: &Path, n: usize, takes: usize) {
    let mut child = Command::new(path)
        .args([&n.to_string(), LIFETIME])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let line = pagewise_testkit::line_within(&mut out, pid).unwrap_or_default();
    assert_eq!(line, "ready");
    let mut h = ProcessSnapshots::open(pid).unwrap();
    let mut slowest = Duration::ZERO;
    let mut last = 0;
    for i in 0..takes {
        let t0 = std::time::Instant::now();
        last = match h.take() {
            Ok(id) => id,
            Err(e) => {
                drop(h);
                std::thread::sleep(Duration::from_millis(200));
                let how = child.try_wait();
                panic!("{n} threads, snapshot {i}: {e} (the program: {how:?})")
            }
        };
        slowest = slowest.max(t0.elapsed());
        assert!(
            pagewise_mech::procfs::is_alive(pid),
            "{n} threads: the program died at snapshot {i}"
        );
    }
    // The pool changed since: refused, naming the threads, not a crash.
    match h.restore(last, RestoreOptions::default()) {
        Err(pagewise_snap::Error::Rollback(RollbackRefusal::ThreadsChanged { .. })) => {}
        Ok(_) => println!("{n} threads: the pool stood still between take and restore"),
        Err(e) => panic!("{n} threads: restore: {e}"),
    }
    drop(h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rollback-pool-{n}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut dest = pagewise_snap::live::StoreSeries::new(
        pagewise_snap::DiskStore::create(&dir, true).unwrap(),
    );
    let live = pagewise_snap::live::live_snapshot(
        pid,
        &mut dest,
        "pool",
        &pagewise_snap::live::LiveOptions::default().max_passes(LIVE_PASSES),
        &mut |_| {},
        &mut || {},
    );
    let _ = std::fs::remove_dir_all(&dir);
    match live {
        Ok(r) => assert!(
            r.passes.len() <= LIVE_PASSES,
            "{n} threads: {} passes, held to {LIVE_PASSES}",
            r.passes.len()
        ),
        Err(e) => {
            let how = child.try_wait();
            panic!("{n} threads: live snapshot: {e} (the program: {how:?})")
        }
    }
    assert!(
        pagewise_mech::procfs::is_alive(pid),
        "{n} threads: died in the live snapshot"
    );
    // The program's verdict.
    drop(child.stdin.take());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "{n} threads: {st} {rest}");
    assert!(rest.contains("bad=0"), "{n} threads: {rest}");
    println!(
        "{n} threads: {takes} snapshots, slowest {slowest:?}; {}",
        rest.trim()
    );
}

#[test]
fn thread_pools_are_snapshotted_unharmed() {
    let Some(path) = churn() else { return };
    let takes = if long() { 100 } else { 10 };
    pool(&path, 5, takes);
    pool(&path, 64, takes);
    pool(&path, 1024, if long() { 100 } else { 2 });
}

/// Memory-only restores leave every running thread's stack and
/// thread-local data alone: `mt_selfcheck.c`'s five workers, which check
/// both all the time, find nothing wrong over 100 memory-only restores,
/// and every thread joins at the end.
#[test]
fn memory_only_restores_leave_running_threads_their_stacks() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mt_selfcheck.c");
    let path = match pagewise_testkit::c_program(
        &src,
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &["-pthread"],
    ) {
        Ok(p) => p,
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            return;
        }
    };
    let mut t = pagewise_testkit::Piped::start(Command::new(path).arg("5"));
    assert_eq!(t.line(), "ready");
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    // Taken with the main thread waiting in its read, where it is at every
    // restore: a memory-only restore puts its stack back as it was then
    // (taken while it was still on its way there, the stack put back
    // would not be the one it runs on).
    t.settle_in_read();
    let id = h.take().unwrap();
    let mut left = 0;
    for i in 0..100 {
        std::thread::sleep(Duration::from_millis(2));
        let r = h
            .restore(id, RestoreOptions::default().memory_only(true))
            .unwrap_or_else(|e| panic!("restore {i}: {e}"));
        left = r.thread_areas.len();
    }
    let c = t.ask("c");
    assert!(
        c.starts_with("bad=0 "),
        "after 100 memory-only restores: {c}"
    );
    drop(h);
    let end = t.ask("q");
    assert_eq!(end, "joined bad=0");
    assert!(left >= 5, "the workers' stacks were left: {left}");
}
