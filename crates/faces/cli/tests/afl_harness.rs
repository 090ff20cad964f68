//! `pagewise snapshot afl` end to end, the test playing afl-fuzz's side of
//! the fork-server protocol on descriptors 198 and 199: every input's
//! status (exit code, or the signal of a crash) equals that of the same
//! program run on the same input without pagewise, the target's state
//! included (its exit code is made of the state it read); every run is a
//! reset of one process (one pid), until a run is killed as afl-fuzz
//! kills a timeout, and the next run is a fresh start; the served counts
//! are exact. Then afl-fuzz itself, where installed, fuzzes through it.

#[macro_use]
mod support;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use support::*;

fn afl_target() -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../examples/afl/target.c");
    match pagewise_testkit::c_program(&src, Path::new(env!("CARGO_TARGET_TMPDIR")), &[]) {
        Ok(p) => Some(p),
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            None
        }
    }
}

/// Why a reset session cannot run here, if so.
fn no_sessions() -> Option<String> {
    let p = pagewise::probe::get();
    if !p.uffd_has(pagewise_sys::uffd::feature::WP_ASYNC) || !p.pagemap_scan {
        return Some("[uffd-wp] resets need uffd-wp (WP_ASYNC) and PAGEMAP_SCAN".into());
    }
    if !cfg!(target_arch = "x86_64") {
        return Some("resets put x86-64 registers back".into());
    }
    None
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let (r, w) = std::io::pipe().expect("pipe");
    (r.into(), w.into())
}

/// The status the program gives `input` run on its own, as a wait
/// status.
fn native(target: &Path, args: &[&str], input: &[u8]) -> i32 {
    let mut c = Command::new(target)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input).unwrap();
    let st = c.wait().unwrap();
    match (st.code(), st.signal()) {
        (Some(code), _) => (code & 0xff) << 8,
        (_, Some(sig)) => sig & 0x7f,
        _ => unreachable!(),
    }
}

struct Afl {
    child: std::process::Child,
    ctl: std::fs::File,
    st: std::fs::File,
    input: std::fs::File,
}

impl Afl {
    fn word(&mut self) -> i32 {
        let mut b = [0u8; 4];
        self.st
            .read_exact(&mut b)
            .expect("a word from the fork server");
        i32::from_ne_bytes(b)
    }

    /// Writes `input` as afl-fuzz does (the file rewritten, its offset at
    /// 0) and asks for a run: the run's pid.
    fn start(&mut self, input: &[u8]) -> i32 {
        self.input.seek(SeekFrom::Start(0)).unwrap();
        self.input.write_all(input).unwrap();
        self.input.set_len(input.len() as u64).unwrap();
        self.input.seek(SeekFrom::Start(0)).unwrap();
        self.ctl.write_all(&0u32.to_ne_bytes()).unwrap();
        self.word()
    }

    /// Closes the control pipe as afl-fuzz does at its end: the server
    /// ends with success; its stats and what it said on standard error.
    fn end(&mut self, stats: &Path, dir: &Path) -> (serde_json::Value, String) {
        drop(std::mem::replace(
            &mut self.ctl,
            std::fs::File::open("/dev/null").unwrap(),
        ));
        let st = self.child.wait().unwrap();
        assert!(st.success(), "{st:?}");
        let s = serde_json::from_str(&std::fs::read_to_string(stats).unwrap()).unwrap();
        (s, std::fs::read_to_string(dir.join("server.err")).unwrap())
    }
}

impl Drop for Afl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(target: &Path, args: &[&str], stats: &Path, dir: &Path) -> Afl {
    start_server_with(target, args, stats, dir, &[])
}

/// [`start_server`] with options of `snapshot afl` (`--outside`).
fn start_server_with(
    target: &Path,
    args: &[&str],
    stats: &Path,
    dir: &Path,
    options: &[&str],
) -> Afl {
    let (ctl_r, ctl_w) = pipe();
    let (st_r, st_w) = pipe();
    let path = dir.join(".cur_input");
    let input = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let mut c = Command::new(BIN);
    c.args(["snapshot", "afl"])
        .args(options)
        .arg("--stats")
        .arg(stats)
        .arg("--")
        .arg(target)
        .args(args)
        .stdin(input.try_clone().unwrap())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("server.err")).unwrap());
    let (a, b) = (ctl_r.as_raw_fd(), st_w.as_raw_fd());
    // SAFETY: the closure only calls dup2, which is async-signal-safe,
    // on descriptors that stay open until the spawn returns.
    unsafe {
        c.pre_exec(move || {
            if libc::dup2(a, 198) < 0 || libc::dup2(b, 199) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = c.spawn().expect("starting pagewise snapshot afl");
    drop((ctl_r, st_w));
    Afl {
        child,
        ctl: ctl_w.into(),
        st: st_r.into(),
        input,
    }
}

/// Inputs: random bytes of random lengths from a fixed seed, the crash
/// and an empty input among them.
fn inputs(n: usize) -> Vec<Vec<u8>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as u32
    };
    let mut all: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let len = 1 + next() as usize % 300;
            (0..len).map(|_| next() as u8).collect()
        })
        .collect();
    all[3] = b"PW!!".to_vec();
    all[7] = Vec::new();
    all[11] = b"PW!".to_vec();
    all[20] = b"PW!!and more".to_vec();
    all
}

#[test]
fn each_run_of_the_fork_server_is_a_reset_with_the_status_of_a_run_without_pagewise() {
    each_run_is_a_reset_with_the_status_of_a_run_without_pagewise(Way::Inside);
}

#[test]
fn each_run_reset_from_outside_has_the_status_of_a_run_without_pagewise() {
    each_run_is_a_reset_with_the_status_of_a_run_without_pagewise(Way::Outside);
}

/// Which way `snapshot afl` resets the program.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    /// From inside it, by the preload shim (the default).
    Inside,
    /// From outside (`--outside`).
    Outside,
}

impl Way {
    fn options(self) -> &'static [&'static str] {
        match self {
            Way::Inside => &[],
            Way::Outside => &["--outside"],
        }
    }

    /// Checks that the served runs were reset this way: every reset but
    /// the first run's inside, or none.
    fn check(self, s: &serde_json::Value) {
        let inside = s["inside_resets"].as_u64().unwrap();
        match self {
            Way::Inside => {
                assert!(s["inside_refused"].is_null(), "{s}");
                assert!(inside > 0, "resets were made inside: {s}");
                // Each of them in the histogram of their times.
                let d = &s["inside_reset_spread"];
                assert_eq!(d["resets"], inside, "every reset counted: {s}");
                let f = |k: &str| d[k].as_f64().unwrap();
                assert!(
                    0.0 < f("p50_us") && f("min_us") <= f("p50_us"),
                    "a spread in order: {d}"
                );
                assert!(
                    f("p50_us") <= f("p99_us") && f("p99_us") <= f("max_us"),
                    "{d}"
                );
            }
            Way::Outside => {
                assert_eq!(inside, 0, "no reset was made inside: {s}");
                assert!(s["inside_reset_spread"].is_null(), "{s}");
            }
        }
    }
}

fn each_run_is_a_reset_with_the_status_of_a_run_without_pagewise(path: Way) {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(target) = afl_target() else {
        return;
    };
    let dir = temp_dir(&format!("afl-protocol-{path:?}"));
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let args = ["8", "16"];
    let mut afl = start_server_with(&target, &args, &stats, &dir, path.options());
    assert_eq!(
        afl.word(),
        0,
        "the hello of a program built without afl-cc has no map size"
    );
    let all = inputs(60);
    let mut pids = std::collections::BTreeSet::new();
    let mut crashes = 0;
    for (i, input) in all.iter().enumerate() {
        let pid = afl.start(input);
        let status = afl.word();
        let want = native(&target, &args, input);
        assert_eq!(
            status, want,
            "input {i} ({} bytes): status {status:#x} through the fork server, {want:#x} without pagewise",
            input.len()
        );
        crashes += u64::from(want & 0x7f != 0);
        pids.insert(pid);
    }
    assert_eq!(crashes, 2, "the two crashing inputs crashed");
    assert_eq!(
        pids.len(),
        1,
        "every run was a reset of one process: {pids:?}"
    );
    // A run that does not end: killed as afl-fuzz kills a timeout.
    let hung = afl.start(b"pagewise-hang!");
    std::thread::sleep(Duration::from_millis(200));
    pagewise_sys::process::kill(hung, libc::SIGKILL).unwrap();
    assert_eq!(afl.word(), libc::SIGKILL, "the killed run's status");
    let after = afl.start(&all[0]);
    assert_ne!(after, hung, "a killed program is started again");
    assert_eq!(afl.word(), native(&target, &args, &all[0]));
    // afl-fuzz closes the control pipe: the server ends, saying what it served.
    let Afl { child, ctl, .. } = &mut afl;
    drop(std::mem::replace(
        ctl,
        std::fs::File::open("/dev/null").unwrap(),
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "{st:?}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(s["runs"], all.len() as u64 + 2, "{s}");
    assert_eq!(s["crashes"], 2, "{s}");
    assert_eq!(s["starts"], 2, "{s}");
    assert_eq!(s["full_resets"], 0, "{s}");
    path.check(&s);
}

#[test]
fn afl_fuzz_runs_a_target_through_pagewise_resets() {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let (Some(afl), Some(cc)) = (which("afl-fuzz"), which("afl-cc")) else {
        pagewise_testkit::skip!(
            "[afl++] afl-fuzz or afl-cc is not installed (scripts/setup.sh installs afl++)"
        );
        return;
    };
    let dir = temp_dir("afl-fuzz");
    std::fs::create_dir_all(dir.join("in")).unwrap();
    std::fs::write(dir.join("in/hello"), b"hello").unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../examples/afl/target.c");
    let target = dir.join("target");
    let built = Command::new(&cc)
        .args(["-O2", "-o"])
        .arg(&target)
        .arg(&src)
        .env("AFL_QUIET", "1")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(built.success(), "afl-cc failed on {}", src.display());
    let stats = dir.join("served.json");
    let mut c = Command::new(afl);
    c.arg("-i")
        .arg(dir.join("in"))
        .arg("-o")
        .arg(dir.join("out"))
        // A timeout far above a run's, so that a loaded machine kills none.
        .args([
            "-t", "5000", "-V", "3", "--", BIN, "snapshot", "afl", "--stats",
        ])
        .arg(&stats)
        .arg("--")
        .arg(&target)
        .args(["8", "16"])
        .env("AFL_NO_UI", "1")
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        .env("AFL_SKIP_BIN_CHECK", "1")
        .stdin(Stdio::null());
    let (code, out, err) = run_with_deadline(c, Duration::from_secs(120)).expect("afl-fuzz ended");
    assert_eq!(code, 0, "afl-fuzz failed:\n{out}\n{err}");
    let text = std::fs::read_to_string(dir.join("out/default/fuzzer_stats")).unwrap();
    let field = |k: &str| -> f64 {
        text.lines()
            .find_map(|l| {
                let (key, v) = l.split_once(':')?;
                (key.trim() == k).then(|| v.trim().trim_end_matches('%').parse().ok())?
            })
            .unwrap_or_else(|| panic!("fuzzer_stats has no {k}:\n{text}"))
    };
    let served: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let execs = field("execs_done");
    assert!(execs > 0.0, "{text}");
    assert_eq!(
        field("stability"),
        100.0,
        "resets are deterministic:\n{text}"
    );
    // afl-fuzz ends its fork server with SIGTERM; the stats are written
    // every second, so the last second's runs may be missing from them.
    let runs = served["runs"].as_f64().unwrap();
    assert!(
        runs > 0.0 && runs <= execs,
        "{served} against {execs} executions"
    );
    assert_eq!(served["starts"], 1, "no run timed out: {served}");
    assert_eq!(served["full_resets"], 0, "{served}");
    assert!(
        field("corpus_count") >= 2.0,
        "coverage reached afl-fuzz:\n{text}"
    );
}

#[test]
fn a_run_that_leaves_a_thread_behind_is_followed_by_a_fresh_start() {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let target = c_program("afl_threads");
    let dir = temp_dir("afl-threads");
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let mut afl = start_server(&target, &[], &stats, &dir);
    assert_eq!(afl.word(), 0);
    let inputs: [&[u8]; 6] = [b"abc", b"Tone", b"abc", b"xyz", b"Ttwo", b"abc"];
    let mut pids = Vec::new();
    for input in inputs {
        let pid = afl.start(input);
        let status = afl.word();
        assert_eq!(
            status,
            native(&target, &[], input),
            "{:?}: through the fork server and without pagewise",
            String::from_utf8_lossy(input)
        );
        pids.push(pid);
    }
    // A reset after a run that left a thread cannot put the point back:
    // the program was started again for the run after it, and only then.
    assert_eq!(pids[0], pids[1]);
    assert_ne!(pids[1], pids[2], "started again after the thread was left");
    assert_eq!(pids[2], pids[3]);
    assert_eq!(pids[3], pids[4]);
    assert_ne!(pids[4], pids[5]);
    let (s, err) = afl.end(&stats, &dir);
    assert_eq!(s["failed_resets"], 2, "{s}");
    assert_eq!(s["starts"], 3, "{s}");
    assert_eq!(
        err.matches("warning: a reset failed").count(),
        1,
        "the first restart warned, once:\n{err}"
    );
    assert!(
        err.contains("6 run(s)") && err.contains("2 failed; the program started 3 time(s)"),
        "the summary at the end:\n{err}"
    );
    assert!(
        s["failed_reasons"][0].as_str().unwrap().contains("thread"),
        "{s}"
    );
}

/// Every input of `heap_moves MODE` moves the program's heap; every run
/// is still a reset of the one process, with the status of a run without
/// pagewise, and no reset failed.
fn runs_that_move_the_heap_are_reset(mode: &str, path: Way) {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let target = c_program("heap_moves");
    let dir = temp_dir(&format!("afl-heap-{mode}-{path:?}"));
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let mut afl = start_server_with(&target, &[mode], &stats, &dir, path.options());
    assert_eq!(afl.word(), 0);
    let all = inputs(30);
    let mut pids = std::collections::BTreeSet::new();
    for (i, input) in all.iter().enumerate() {
        let want = native(&target, &[mode], input);
        assert_ne!(
            want & (32 << 8),
            0,
            "precondition: input {i} moved the heap of a run without pagewise ({want:#x})"
        );
        let pid = afl.start(input);
        let status = afl.word();
        assert_eq!(
            status,
            want,
            "{mode}, input {i} ({} bytes): status {status:#x} through the fork server, \
             {want:#x} without pagewise",
            input.len()
        );
        pids.insert(pid);
    }
    let (s, err) = afl.end(&stats, &dir);
    assert_eq!(s["failed_resets"], 0, "{mode}: no reset failed: {s}");
    assert!(
        err.contains(&format!("{} run(s)", all.len()))
            && err.contains("0 failed; the program started 1 time(s)")
            && !err.contains("warning"),
        "{mode}: the summary at the end, no warning:\n{err}"
    );
    assert_eq!(s["starts"], 1, "{mode}: the program was started once: {s}");
    assert_eq!(
        pids.len(),
        1,
        "{mode}: every run was a reset of one process: {pids:?}"
    );
    path.check(&s);
}

#[test]
fn runs_that_grow_and_trim_the_break_are_reset() {
    runs_that_move_the_heap_are_reset("brk", Way::Inside);
}

#[test]
fn runs_that_map_move_and_unmap_an_arena_are_reset() {
    runs_that_move_the_heap_are_reset("arena", Way::Inside);
}

#[test]
fn runs_that_move_the_break_or_map_an_arena_are_reset_from_outside() {
    runs_that_move_the_heap_are_reset("brk", Way::Outside);
    runs_that_move_the_heap_are_reset("arena", Way::Outside);
}

/// Random inputs for `afl_shadow` (none of its special first bytes).
fn shadow_inputs(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut x = seed;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as u32
    };
    (0..n)
        .map(|_| {
            let len = 1 + next() as usize % 200;
            let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if b"UCTRSKA".contains(&v[0]) {
                v[0] = b'x';
            }
            v
        })
        .collect()
}

#[test]
fn a_reset_inside_the_program_finds_every_run_as_its_point_left_it() {
    let Some(s) = shadow_runs(&[]) else { return };
    // The state (8 MiB) collapsed into huge pages at the point: the runs
    // wrote into huge pages, and every check held.
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    match thp {
        Ok(t) if !t.contains("[never]") => assert!(
            s["inside_collapsed_mib"].as_f64().unwrap() >= 2.0,
            "at least one 2 MiB block of the state was collapsed at the point: {s}"
        ),
        _ => eprintln!("note: no huge pages here: the state stayed in base pages"),
    }
    assert!(
        s["inside_collapse_ms"].as_f64().unwrap() <= s["inside_point_ms"].as_f64().unwrap(),
        "the collapse is part of the point: {s}"
    );
}

/// The same runs with the state left in base pages (`--no-huge-pages`):
/// nothing collapsed, every check held.
#[test]
fn a_reset_inside_in_base_pages_finds_every_run_as_its_point_left_it() {
    let Some(s) = shadow_runs(&["--no-huge-pages"]) else {
        return;
    };
    assert_eq!(s["inside_collapsed_mib"], 0.0, "{s}");
    assert!(s["inside_point_ms"].as_f64().unwrap() > 0.0, "{s}");
}

/// 150 runs of `afl_shadow` (which checks its state against the point
/// at each run), two of them crashes, through `snapshot afl` with
/// `options`: every status as without pagewise, one process, every reset
/// inside. The stats, or `None` (a skip) where resets cannot be served.
fn shadow_runs(options: &[&str]) -> Option<serde_json::Value> {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return None;
    }
    let target = c_program("afl_shadow");
    let dir = temp_dir(&format!("afl-shadow{}", options.join("")));
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let mut afl = start_server_with(&target, &[], &stats, &dir, options);
    assert_eq!(afl.word(), 0);
    // Crashes among them, each caught inside: still one process.
    let mut all = shadow_inputs(150, 7);
    all[40] = b"Kaboom".to_vec();
    all[90] = b"Abort".to_vec();
    let mut pids = std::collections::BTreeSet::new();
    for (i, input) in all.iter().enumerate() {
        let want = native(&target, &[], input);
        assert_eq!(
            want & (7 << 12),
            0,
            "precondition: a program started afresh passes its own checks ({want:#x})"
        );
        let pid = afl.start(input);
        let status = afl.word();
        assert_eq!(
            status,
            want,
            "input {i} ({} bytes): status {status:#x} through the fork server, {want:#x} \
             without pagewise (bits 12-14: a check of the point that failed)",
            input.len()
        );
        pids.insert(pid);
    }
    assert_eq!(
        pids.len(),
        1,
        "every run was a reset of one process: {pids:?}"
    );
    let (s, err) = afl.end(&stats, &dir);
    Way::Inside.check(&s);
    assert_eq!(s["runs"], all.len() as u64, "{s}");
    assert_eq!(
        s["inside_resets"],
        all.len() as u64 - 1,
        "every reset inside: {s}"
    );
    assert_eq!(s["crashes"], 2, "{s}");
    assert_eq!(s["starts"], 1, "{s}");
    assert_eq!(s["failed_resets"], 0, "{s}");
    assert!(
        s["pages_dirty"].as_f64().unwrap() >= 16.0,
        "a reset found at least the 16 pages of the state each run writes: {s}"
    );
    assert!(!err.contains("warning"), "{err}");
    Some(s)
}

#[test]
fn what_a_reset_inside_cannot_put_back_starts_the_program_again_and_says_why() {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let target = c_program("afl_shadow");
    let dir = temp_dir("afl-shadow-restarts");
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let mut afl = start_server(&target, &[], &stats, &dir);
    assert_eq!(afl.word(), 0);
    let cases: [(&[u8], &str); 5] = [
        (b"Unmap", "unmapped"),
        (b"Close", "descriptor of the point was closed"),
        (b"Thread", "thread"),
        // Made by clone(), which no trapped call marks: the count of
        // threads at the run's end alone sees it.
        (b"Raw thread", "thread"),
        (b"Stack", "alternate signal stack"),
    ];
    let plain = shadow_inputs(3, 11);
    let mut restarts = 0;
    for (input, why) in cases {
        let before = afl.start(&plain[0]);
        assert_eq!(afl.word(), native(&target, &[], &plain[0]));
        let special = afl.start(input);
        assert_eq!(special, before, "a plain run is followed by a reset");
        assert_eq!(
            afl.word(),
            native(&target, &[], input),
            "{}: the run that changed the program (pid {special})",
            String::from_utf8_lossy(input)
        );
        let mut restarted = None;
        for p in &plain[1..] {
            let after = afl.start(p);
            assert_eq!(
                afl.word(),
                native(&target, &[], p),
                "after {why} (pid {after}, before {special})"
            );
            match restarted {
                None => {
                    assert_ne!(after, special, "{why}: the program was started again");
                    restarted = Some(after);
                }
                Some(r) => assert_eq!(after, r, "{why}: then reset again"),
            }
        }
        restarts += 1;
    }
    let (s, _) = afl.end(&stats, &dir);
    Way::Inside.check(&s);
    assert_eq!(s["failed_resets"], restarts, "{s}");
    assert_eq!(s["starts"], restarts + 1, "{s}");
    let reasons = s["failed_reasons"].to_string();
    for (input, why) in cases {
        assert!(
            reasons.contains(why),
            "{}: the reason says {why:?}: {reasons}",
            String::from_utf8_lossy(input)
        );
    }
}

/// A JSON document of `n` members, for a parser that then grows its heap
/// in small allocations (one per value), prefixed by the options the
/// fuzz target reads from its first four bytes and ended by its NUL.
fn json_input(n: usize, opts: &str) -> Vec<u8> {
    let members: Vec<String> = (0..n)
        .map(|i| format!("\"k{i}\":[{i},\"v{}\",{{\"x\":{}.5}}]", i * 7, i % 13))
        .collect();
    format!("{opts}{{{}}}\0", members.join(",")).into_bytes()
}

#[test]
fn a_real_parser_built_with_afl_cc_is_served_by_resets_that_move_its_heap() {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(cc) = which("afl-cc") else {
        pagewise_testkit::skip!(
            "[afl++] afl-cc is not installed (scripts/setup.sh installs afl++)"
        );
        return;
    };
    let src = pagewise_testkit::debian_source("cjson");
    if !src.join("cJSON.c").exists() {
        pagewise_testkit::skip!(
            "[debian-source] cJSON's Debian source is not at {} (scripts/setup.sh unpacks it)",
            src.display()
        );
        return;
    }
    let dir = temp_dir("afl-cjson");
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("cjson_fuzz");
    let main = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/stdin_fuzz_main.c");
    let built = Command::new(&cc)
        .args(["-O2", "-I"])
        .arg(&src)
        .arg("-o")
        .arg(&target)
        .arg(src.join("cJSON.c"))
        .arg(src.join("fuzzing/cjson_read_fuzzer.c"))
        .arg(&main)
        .env("AFL_QUIET", "1")
        .status()
        .unwrap();
    assert!(built.success(), "afl-cc failed on cJSON");
    let stats = dir.join("stats.json");
    let mut afl = start_server(&target, &[], &stats, &dir);
    let hello = afl.word();
    assert_ne!(hello, 0, "a program built with afl-cc says its map size");
    // Small and large documents, each option, malformed ones between.
    let mut all = Vec::new();
    for (i, opts) in ["0000", "1111", "0101", "1010", "0011", "1100"]
        .iter()
        .enumerate()
    {
        all.push(json_input(2 + i, opts));
        all.push(json_input(3_000 + 1_500 * i, opts));
        let mut bad = json_input(800 * (i + 1), opts);
        let cut = bad.len() / 2;
        bad[cut] = b'}';
        all.push(bad);
        all.push(b"1111[1,2,{\"a\":\0".to_vec());
    }
    let mut moved = 0;
    let mut pids = std::collections::BTreeSet::new();
    for (i, input) in all.iter().enumerate() {
        let want = native(&target, &[], input);
        moved += usize::from(want & (32 << 8) != 0);
        let pid = afl.start(input);
        let status = afl.word();
        assert_eq!(
            status,
            want,
            "input {i} ({} bytes): {status:#x} through the fork server, {want:#x} without pagewise",
            input.len()
        );
        pids.insert(pid);
    }
    assert!(
        moved >= 6,
        "precondition: runs without pagewise moved the break ({moved} of {})",
        all.len()
    );
    let (s, err) = afl.end(&stats, &dir);
    assert_eq!(s["failed_resets"], 0, "no reset failed: {s}");
    assert_eq!(s["starts"], 1, "the parser was started once: {s}");
    assert!(!err.contains("warning"), "no restart was warned of:\n{err}");
    assert_eq!(pids.len(), 1, "every run a reset of one process: {pids:?}");
    println!(
        "ok   cJSON: {} inputs, {moved} moved the break, {} reset by the whole path",
        all.len(),
        s["full_resets"]
    );
}

#[test]
fn a_program_with_threads_at_its_first_read_is_reset_from_outside_and_says_why() {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let target = c_program("afl_early_thread");
    let dir = temp_dir("afl-early-thread");
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let mut afl = start_server(&target, &[], &stats, &dir);
    assert_eq!(afl.word(), 0);
    let all = shadow_inputs(20, 3);
    let mut pids = std::collections::BTreeSet::new();
    for (i, input) in all.iter().enumerate() {
        let pid = afl.start(input);
        assert_eq!(
            afl.word(),
            native(&target, &[], input),
            "input {i}: through the fork server and without pagewise"
        );
        pids.insert(pid);
    }
    let (s, err) = afl.end(&stats, &dir);
    let refused = s["inside_refused"].as_str().unwrap_or_default();
    assert!(
        refused.contains("2 threads"),
        "the reason names the threads: {s}"
    );
    assert_eq!(s["inside_resets"], 0, "{s}");
    assert_eq!(pids.len(), 1, "reset from outside, one process: {pids:?}");
    // One start refused inside, one reset from outside.
    assert_eq!(s["starts"], 2, "{s}");
    assert!(
        err.contains("not reset from inside") && err.contains("threads"),
        "the summary says why:\n{err}"
    );
}

#[test]
fn a_program_killed_between_runs_is_started_again_and_no_reset_failed() {
    if let Some(why) = no_sessions() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let target = c_program("afl_shadow");
    let dir = temp_dir("afl-killed-between");
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let mut afl = start_server(&target, &[], &stats, &dir);
    assert_eq!(afl.word(), 0);
    let all = shadow_inputs(4, 5);
    let first = afl.start(&all[0]);
    assert_eq!(afl.word(), native(&target, &[], &all[0]));
    // As afl-fuzz does as it ends: the pid it was told, killed while the
    // program waits for the next input.
    pagewise_sys::process::kill(first, libc::SIGKILL).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{first}/status"))
        .exists()
        .then(|| std::fs::read_to_string(format!("/proc/{first}/status")).unwrap_or_default())
        .is_some_and(|s| !s.contains("State:\tZ"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "process {first} did not end within 10 s of SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for input in &all[1..] {
        let pid = afl.start(input);
        assert_ne!(pid, first, "a fresh program runs the next input");
        assert_eq!(afl.word(), native(&target, &[], input));
    }
    let (s, err) = afl.end(&stats, &dir);
    assert_eq!(s["failed_resets"], 0, "no reset failed: {s}");
    assert_eq!(s["starts"], 2, "{s}");
    assert!(!err.contains("warning"), "{err}");
}
