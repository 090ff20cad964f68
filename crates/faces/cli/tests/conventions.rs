//! The conventions every command that runs a program (`-- CMD`) keeps
//! (crates/faces/cli/src/stop.rs): SIGINT/SIGTERM end it with its summary, the
//! program ended first and the exit status 128 + the signal; a pagewise
//! killed outright leaves no program behind; with `--json` its standard
//! output holds JSON alone.

mod support;
use support::*;

/// A shell that says it is ready, notes the signal it gets in `mark` and
/// exits 0 on it, else loops.
fn trapping_shell(dir: &Path) -> (String, PathBuf, PathBuf) {
    let (mark, ready) = (dir.join("signalled"), dir.join("ready"));
    let script = format!(
        "trap 'echo term > {m}; exit 0' TERM; trap 'echo int > {m}; exit 0' INT; \
         echo $$ > {r}; while :; do sleep 0.05; done",
        m = mark.display(),
        r = ready.display()
    );
    (script, mark, ready)
}

/// Starts pagewise as `c` (its output to `out()`), and waits until its
/// program says it is ready.
fn start(
    name: &str,
    c: &mut Command,
    mark: &Path,
    ready: &Path,
    out: fn() -> Stdio,
) -> std::process::Child {
    let _ = std::fs::remove_file(ready);
    let _ = std::fs::remove_file(mark);
    let p = c.stdout(out()).stderr(out()).spawn().unwrap();
    assert!(appears(ready), "{name}: the program did not start");
    p
}

/// Waits (10 s at most) for `path` to exist; whether it did.
fn appears(path: &Path) -> bool {
    let t0 = Instant::now();
    while !path.exists() {
        if t0.elapsed() > Duration::from_secs(10) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The writer may not have finished its line.
    std::thread::sleep(Duration::from_millis(50));
    true
}

/// Whether `pid` is gone or a zombie (its program no longer runs).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// What a process is doing, for a failure's message: its state, wait
/// channel, signals and children.
fn state(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let keep = [
        "State", "PPid", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt",
    ];
    let lines: Vec<&str> = status
        .lines()
        .filter(|l| keep.iter().any(|k| l.starts_with(k)))
        .collect();
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let kids: Vec<String> = children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
        .map(|c| {
            let cmd = std::fs::read_to_string(format!("/proc/{c}/cmdline")).unwrap_or_default();
            format!("{c} {:?}: {}", cmd.replace('\0', " "), state(c))
        })
        .collect();
    format!(
        "{} wchan {wchan}; children [{}]",
        lines.join(", "),
        kids.join("; ")
    )
}

/// Waits (5 s at most) for `pid` to end; whether it did.
fn ends(pid: i32) -> bool {
    let t0 = Instant::now();
    while !ended(pid) {
        if t0.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The commands under test, each running the trapping shell (the shim is
/// there: the callers checked [`unsupported`]).
fn commands(script: &str) -> Vec<(&'static str, Command)> {
    let mut t = Command::new(BIN);
    t.args(["track", "--interval-ms", "100", "--", "sh", "-c", script]);
    let inst = instance_dir("conventions");
    let mut f = farmem(&inst);
    f.args(["run", "--local-pages", "4096", "--", "sh", "-c", script]);
    let mut z = Command::new(BIN);
    z.args(["thp", "prezero", "--", "sh", "-c", script]);
    vec![("track", t), ("farmem run", f), ("thp prezero", z)]
}

/// Commands that start their program plainly, not under the shim: `track`
/// with a backend that works from outside, and an agent's `-- CMD`.
fn plain_commands(script: &str) -> Vec<(&'static str, Command)> {
    let mut t = Command::new(BIN);
    t.args(["track", "--backend", "hash", "--interval-ms", "100"]);
    t.args(["--", "sh", "-c", script]);
    let mut a = Command::new(BIN);
    a.args(["thp", "run", "--", "sh", "-c", script]);
    vec![("track --backend hash", t), ("thp run", a)]
}

/// SIGTERM and SIGINT to pagewise alone (not to its process group, as a
/// terminal would): the program gets the signal, pagewise says so in its
/// summary and exits with 128 + the signal.
#[test]
fn a_signal_ends_the_program_then_pagewise_with_its_summary() {
    if let Some(why) = unsupported() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    for (sig, word) in [(libc::SIGTERM, "term"), (libc::SIGINT, "int")] {
        let dir = temp_dir(&format!("signal-{sig}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (script, mark, ready) = trapping_shell(&dir);
        for (name, mut c) in commands(&script) {
            let mut p = start(name, &mut c, &mark, &ready, Stdio::piped);
            // SAFETY: kill(2) of the pagewise this test started.
            unsafe { libc::kill(p.id() as i32, sig) };
            let t0 = Instant::now();
            let st = loop {
                if let Some(st) = p.try_wait().unwrap() {
                    break Some(st);
                }
                if t0.elapsed() > Duration::from_secs(15) {
                    let _ = p.kill();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let out = p.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let st = st.unwrap_or_else(|| panic!("{name}: pagewise did not end on {sig}: {err}"));
            assert_eq!(st.code(), Some(128 + sig), "{name} on signal {sig}: {err}");
            assert_eq!(
                std::fs::read_to_string(&mark).unwrap_or_default().trim(),
                word,
                "{name}: the program was handed signal {sig}"
            );
            // The summary is written as at a normal end. (A shell ends
            // with _exit(2): no pre-zeroing report, and the summary says so.)
            let summary = match name {
                "track" => "stopped by signal",
                "farmem run" => "pagewise farmem: instance",
                _ => "sh ended (",
            };
            assert!(err.contains(summary), "{name}: no summary: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// pagewise killed outright (SIGKILL): the program it started gets SIGTERM
/// and ends; it is not left running on its own.
#[test]
fn a_killed_pagewise_leaves_no_program_behind() {
    if let Some(why) = unsupported() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = temp_dir("orphan");
    std::fs::create_dir_all(&dir).unwrap();
    let (script, mark, ready) = trapping_shell(&dir);
    for (name, mut c) in commands(&script).into_iter().chain(plain_commands(&script)) {
        let mut p = start(name, &mut c, &mark, &ready, Stdio::null);
        let pid: i32 = std::fs::read_to_string(&ready)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        p.kill().unwrap();
        p.wait().unwrap();
        let gone = ends(pid);
        let seen = state(pid);
        if !gone {
            // SAFETY: kill(2) of the shell this test's pagewise started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert!(
            gone,
            "{name}: program {pid} runs on after pagewise was killed: {seen}"
        );
        assert_eq!(
            std::fs::read_to_string(&mark).unwrap_or_default().trim(),
            "term",
            "{name}: the program was sent SIGTERM"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--json`, stdout is JSON alone; the program's own stdout reaches
/// stderr, whole.
#[test]
fn json_stays_apart_from_the_programs_output() {
    if let Some(why) = unsupported() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let script = "for i in 1 2 3 4 5 6; do echo program-line-$i; sleep 0.05; done";
    let inst = instance_dir("json-apart");
    let mut runs = vec![(
        "track",
        Command::new(BIN)
            .args([
                "track",
                "--json",
                "--interval-ms",
                "50",
                "--",
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap(),
    )];
    runs.push((
        "farmem run",
        farmem(&inst)
            .args([
                "run",
                "--json",
                "--local-pages",
                "4096",
                "--",
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap(),
    ));
    runs.push((
        "thp prezero",
        Command::new(BIN)
            .args(["thp", "prezero", "--json", "--", "sh", "-c", script])
            .output()
            .unwrap(),
    ));
    for (name, out) in runs {
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{name}: {stderr}");
        assert!(!stdout.trim().is_empty(), "{name}: no JSON");
        for l in stdout.lines() {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {l}"));
            assert_eq!(v["schema"], 1, "{name}: {l}");
        }
        for i in 1..=6 {
            assert!(
                stderr.contains(&format!("program-line-{i}\n")),
                "{name}: the program's line {i} is not on stderr: {stderr}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&inst);
}

/// `snapshot --every-ms` ended by SIGTERM between snapshots: exit 143, the
/// snapshots taken are in the store, as many as it said it took.
#[test]
fn periodic_snapshots_end_on_sigterm_keeping_those_taken() {
    let (mut wl, _, _) = spawn_workload(&["workload", "--mib", "8", "--seconds", "20"]);
    let dir = temp_dir("periodic");
    std::fs::create_dir_all(&dir).unwrap();
    let store = dir.join("s.d");
    let p = Command::new(BIN)
        .args(["snapshot", "--every-ms", "400", "--count", "50", "--pid"])
        .arg(wl.id().to_string())
        .arg("--out")
        .arg(&store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) of the pagewise this test started.
    unsafe { libc::kill(p.id() as i32, libc::SIGTERM) };
    let out = p.wait_with_output().unwrap();
    let _ = wl.kill();
    let _ = wl.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(143),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = text.lines().filter(|l| l.starts_with("snapshot ")).count();
    assert!((1..50).contains(&said), "{text}");
    assert!(text.contains("store: "), "{text}");
    let list = pagewise::snap::DiskStore::open(&store)
        .unwrap()
        .ids()
        .unwrap();
    assert_eq!(
        list.len(),
        said,
        "the store holds the snapshots it said it took"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A signal sent to a program started under the shim reaches the program's
/// own threads, never the shim's: `signal_owner.c` blocks SIGUSR1, sends
/// it to its process, and checks it stays pending until it unblocks it,
/// then runs on its main thread (20 rounds); and that no other thread of
/// its takes SIGTERM, SIGINT or SIGUSR1. (A shell in `vfork` blocks every
/// signal and drops one its handler gets meanwhile: a SIGTERM taken by a
/// shim thread was lost, and the shell ran on.)
#[test]
fn the_programs_signals_reach_the_program_not_the_shim() {
    if let Some(why) = unsupported() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let prog = c_program("signal_owner");
    let prog = prog.to_str().unwrap();
    let inst = instance_dir("signal-owner");
    let mut t = Command::new(BIN);
    t.args(["track", "--interval-ms", "50", "--", prog]);
    let mut f = farmem(&inst);
    f.args(["run", "--local-pages", "4096", "--", prog]);
    let mut z = Command::new(BIN);
    z.args(["thp", "prezero", "--", prog]);
    for (name, mut c) in [("track", t), ("farmem run", f), ("thp prezero", z)] {
        let out = c.output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let said = format!("{stdout}{stderr}");
        assert!(said.contains("ok\n"), "{name}: {said}");
        assert!(out.status.success(), "{name}: {said}");
    }
    let _ = std::fs::remove_dir_all(&inst);
}
