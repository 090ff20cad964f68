//! `pagewise probe`, `track` and `workload` end to end: the known writes
//! of a workload seen from outside and through the shim, bad input in one
//! line, exit statuses, gone processes and closed pipes.

#[macro_use]
mod support;
use support::*;

#[test]
fn probe_json_has_every_feature() {
    let out = Command::new(BIN)
        .args(["probe", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for want in [
        "userfaultfd",
        "uffd.WP",
        "uffd.WP_ASYNC",
        "uffd.WP_UNPOPULATED",
        "uffd.MINOR_SHMEM",
        "uffd.SIGBUS",
        "uffd.EVENT_FORK",
        "uffd.MOVE",
        "uffd.THREAD_ID",
        "pagemap_scan",
        "soft_dirty",
        "thp",
        "madv_collapse",
        "ksm",
        "ksm.memory_merge",
        "process_madvise",
        "idle_page_tracking",
        "damon_vaddr",
        "perf_hw_counters",
    ] {
        assert!(names.contains(&want), "probe lacks {want}");
    }
    for f in v["features"].as_array().unwrap() {
        assert!(
            !f["detail"].as_str().unwrap().is_empty(),
            "{f} has no reason"
        );
    }
}

#[test]
fn track_pid_from_outside_sees_the_known_writes() {
    let when = temp_dir("track-when");
    let args = known_workload_when(&when);
    let (mut wl, addr, len) = spawn_workload(&args);
    let pid = wl.id().to_string();
    let mut tr = Command::new(BIN)
        .args(["track", "--pid", &pid, "--backend", "hash"])
        .args(["--interval", "100", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let tr_pid = tr.id() as i32;
    let mut tr_out = BufReader::new(tr.stdout.take().unwrap());
    let mut next = || {
        let l = pagewise_testkit::line_within(&mut tr_out, tr_pid).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&l).expect("a collection's JSON line")
    };
    // A collection before the writes, then two after the workload said it
    // wrote (the second began after they were done).
    let mut lines = vec![next()];
    written(&mut wl, &when);
    lines.push(next());
    lines.push(next());
    pagewise_sys::process::kill(tr_pid, libc::SIGTERM).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut tr_out, &mut rest).unwrap();
    lines.extend(json_lines(rest.as_bytes()));
    let st = tr.wait().unwrap();
    // Ended by SIGTERM as the conventions say: 128 + 15, its output whole.
    assert_eq!(st.code(), Some(143), "track ended on SIGTERM with {st}");
    std::fs::remove_file(&when).unwrap();
    assert!(wl.wait().unwrap().success());
    for l in &lines {
        assert!(
            l["t_ms"].is_u64() && l["dirty_pages"].is_u64() && l["ranges"].is_array(),
            "{l}"
        );
    }
    let got = pages_in(&lines, addr, len);
    let want: std::collections::BTreeSet<u64> = (0..300).collect();
    assert_eq!(
        got, want,
        "hash from outside must report exactly the 300 written pages"
    );
}

#[test]
fn track_command_through_the_shim_sees_the_known_writes() {
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_in_process() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(shim) = shim() else {
        pagewise_testkit::skip!("libpagewise_preload.so not built beside {BIN}");
        return;
    };
    let out = Command::new(BIN)
        .env("PAGEWISE_PRELOAD", &shim)
        .args([
            "track",
            "--backend",
            "uffd-wp",
            "--interval",
            "300",
            "--count",
            "6",
            "--json",
            "--",
            BIN,
        ])
        .args(KNOWN_WORKLOAD)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // With --json the program's stdout (its region) is on stderr, the JSON
    // alone on stdout.
    let text = String::from_utf8_lossy(&out.stderr);
    let first = text
        .lines()
        .find(|l| l.starts_with("0x"))
        .expect("workload prints its region");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .all(|l| l.starts_with('{')),
        "JSON alone on stdout"
    );
    let (addr, len) = region_line(first);
    let lines = json_lines(&out.stdout);
    assert!(lines.iter().all(|l| l["backend"] == "uffd-wp"));
    let got = pages_in(&lines, addr, len);
    // Every written page is reported; the initial 1-byte pass may add more (all pages).
    assert!(
        (0..300).all(|p| got.contains(&p)),
        "a written page was not reported: {} of 300",
        (0..300).filter(|p| got.contains(p)).count()
    );
}

#[test]
fn bad_input_gets_one_clear_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["track", "--pid", "999999999", "--count", "1"],
            "no process with pid 999999999",
        ),
        (
            &[
                "track",
                "--pid",
                "1",
                "--backend",
                "uffd-wp",
                "--count",
                "1",
            ],
            // uffd-wp from outside stops the target to open a userfaultfd in
            // it: init may not be stopped.
            "permission denied on pid 1",
        ),
        (&["track", "--count", "1"], "say which process"),
        (
            &["track", "--backend", "bogus", "--pid", "1"],
            "unknown backend",
        ),
        (
            &["track", "--count", "1", "--", "/nonexistent/program"],
            "starting /nonexistent/program",
        ),
    ];
    let _ = shim();
    for (args, want) in cases {
        let out = Command::new(BIN).args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            err.contains(want),
            "{args:?}: stderr {err:?} lacks {want:?}"
        );
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
    if let Err(why) = pagewise::track::BackendKind::SoftDirty.available_for_pid() {
        let out = Command::new(BIN)
            .args([
                "track",
                "--pid",
                "1",
                "--backend",
                "soft-dirty",
                "--count",
                "1",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&why), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn process_exiting_mid_run_is_reported() {
    let mut wl = Command::new(BIN)
        .args(["workload", "--mib", "4", "--seconds", "0.6"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = wl.id().to_string();
    let out = Command::new(BIN)
        .args([
            "track",
            "--pid",
            &pid,
            "--interval",
            "200",
            "--count",
            "20",
            "--backend",
            "hash",
        ])
        .output()
        .unwrap();
    let _ = wl.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "must fail when the process goes away"
    );
    assert!(err.contains(&format!("process {pid} exited")), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Regression: the hidden `workload` command panicked on `--mib 0` and never
/// returned with a rate beyond what the machine can write.
#[test]
fn workload_bad_input_and_huge_rates() {
    let out = Command::new(BIN)
        .args(["workload", "--mib", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--mib 0"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let mut c = Command::new(BIN)
        .args(["workload", "--mib", "4", "--seconds", "1"])
        .args(["--pages-per-sec", "18446744073709551615"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(60) {
            let _ = c.kill();
            panic!("workload --seconds 1 still ran after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(c.wait().unwrap().success());
}

/// Regression: `track -- CMD` with a short command said the shim did not
/// answer (exit 1), and for longer ones the command's exit status was lost.
/// The tool's status is the command's, like `time` and `strace`: its exit
/// code, or 128 + the signal that ended it.
#[test]
fn track_command_reports_the_commands_exit_status() {
    if shim().is_none() {
        pagewise_testkit::skip!("the preload shim is not built");
        return;
    }
    for (script, want) in [
        ("exit 3", 3),
        ("sleep 0.5; exit 7", 7),
        ("sleep 1.6; exit 9", 9),
        ("kill -9 $$", 128 + 9),
        ("sleep 1.2; kill -15 $$", 128 + 15),
    ] {
        let out = Command::new(BIN)
            .args(["track", "--interval", "200", "--", "sh", "-c", script])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(want), "{script}: {err}");
        assert!(!err.contains("did not answer"), "{script}: {err}");
    }
}

/// `--count` ends the command it started with SIGTERM (and a grace
/// period), not SIGKILL: the command's handler runs.
#[test]
fn count_ends_the_command_politely() {
    if shim().is_none() {
        pagewise_testkit::skip!("the preload shim is not built");
        return;
    }
    let dir = temp_dir("count");
    std::fs::create_dir_all(&dir).unwrap();
    let (mark, ready) = (dir.join("termed"), dir.join("ready"));
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; : > {}; while :; do sleep 0.05; done",
        mark.display(),
        ready.display()
    );
    let out = Command::new(BIN)
        .args([
            "track",
            "--interval",
            "100",
            "--count",
            "10",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (got, trapped) = (
        std::fs::read_to_string(&mark).unwrap_or_default(),
        ready.exists(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    if !trapped {
        pagewise_testkit::not_happened!(
            "count_ends_the_command_politely: the shell had not set its trap when --count ended it"
        );
        return;
    }
    assert_eq!(got.trim(), "term", "the command's SIGTERM handler ran");
}

/// Regression: `track --pid 0` said "process 0 exited"; a kernel thread
/// gave `No such process` twice (or, to `snapshot`, advice to run as root);
/// OS errors were printed twice; `inspect --pid X --pid X` counted X twice.
/// Each now says what is true, once.
#[test]
fn special_pids_and_errors_are_said_once_and_truly() {
    let one_line = |args: &[&str], want: &str| {
        let out = Command::new(BIN).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("run as root"), "{args:?}: {err}");
        err.to_string()
    };
    let dir = temp_dir("specialpids");
    let d = dir.join("store");
    let d = d.to_str().unwrap();
    one_line(&["track", "--pid", "0"], "no process with pid 0");
    one_line(
        &["snapshot", "--pid", "0", "--out", d],
        "no process with pid 0",
    );
    // A kernel thread: kthreadd is pid 2 wherever there is a kernel.
    for args in [
        &["track", "--pid", "2"][..],
        &["snapshot", "--pid", "2", "--out", d],
        &["inspect", "--pid", "2"],
    ] {
        one_line(args, "kernel thread");
    }
    assert!(!dir.join("store").exists());
    // An OS error's text once.
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let err = one_line(
        &["snapshot", "inspect", file.to_str().unwrap()],
        "Not a directory",
    );
    assert_eq!(err.matches("Not a directory").count(), 1, "{err}");
    // The same process twice is inspected once.
    let (mut wl, _, _) = spawn_workload(&[
        "workload",
        "--mib",
        "8",
        "--seconds",
        "3",
        "--pages-per-sec",
        "0",
    ]);
    let pid = wl.id().to_string();
    let rss = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            v["rss_bytes"].as_u64().unwrap(),
            v["pids"].as_array().unwrap().len(),
        )
    };
    let once = rss(&["inspect", "--json", "--pid", &pid]);
    let twice = rss(&["inspect", "--json", "--pid", &pid, "--pid", &pid]);
    let _ = wl.kill();
    let _ = wl.wait();
    assert_eq!(twice.1, 1, "the process is listed twice");
    assert!(
        twice.0 <= once.0 + (1 << 20),
        "{} counted twice ({} once)",
        twice.0,
        once.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: output piped into `head` panicked (exit 101) once the reader
/// went away. Now the tool ends quietly, killed by SIGPIPE like other Unix
/// tools.
#[test]
fn a_closed_pipe_ends_quietly() {
    let (mut wl, _, _) = spawn_workload(&[
        "workload",
        "--mib",
        "256",
        "--seconds",
        "5",
        "--pages-per-sec",
        "0",
    ]);
    let mut c = Command::new(BIN)
        .args(["inspect", "--regions", "--pid", &wl.id().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c_pid = c.id() as i32;
    pagewise_testkit::line_within(&mut BufReader::new(c.stdout.take().unwrap()), c_pid);
    // The reader is gone now (its end of the pipe dropped).
    let out = c.wait_with_output().unwrap();
    let _ = wl.kill();
    let _ = wl.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.signal() == Some(libc::SIGPIPE) || out.status.success(),
        "{:?}: {err}",
        out.status
    );
}

/// Numbers out of range are refused with the range, not clamped.
#[test]
fn out_of_range_numbers_are_refused() {
    let out = Command::new(BIN)
        .args([
            "thp",
            "run",
            "--pid",
            "1",
            "--recover-bloat",
            "--zero-pages",
            "9999",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("1..=512"), "{err}");
}

/// A wrapper that replaces itself with `exec` (a pyenv shim) leaves the
/// preload shim's socket behind: the program it started, under the same
/// pid, is tracked from outside instead, said once (it was stopped with an
/// error before).
#[test]
fn a_wrapper_that_execs_is_tracked_from_outside() {
    if shim().is_none() {
        pagewise_testkit::skip!("the preload shim is not built");
        return;
    }
    let dir = temp_dir("wrapper");
    std::fs::create_dir_all(&dir).unwrap();
    let wrapper = dir.join("wrapper");
    std::fs::write(&wrapper, "#!/bin/bash\nexec /bin/sleep \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(BIN)
        .args([
            "track",
            "--json",
            "--interval-ms",
            "200",
            "--count",
            "3",
            "--",
        ])
        .arg(&wrapper)
        .arg("5")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("from outside"), "{err}");
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(lines, 3, "three collections: {err}");
}

/// Regression: tracking through the shim began on a thread of its own
/// after the program's `main` (350–400 ms later on a loaded machine), so
/// `track --interval-ms 50 -- sleep 0.3` said "exited before tracking
/// began" (5 runs in 5), and with `--json` printed nothing; and it tracked
/// the shim's own 64 GiB heap reservation (16,777,868 pages walked per
/// collection of an idle `sleep`). Now the shim makes the tracker and
/// answers the hello before `main`, and leaves its own memory out. A
/// second regression: the shim found its zero-filled data from where one
/// static lay; once that static sat in the file's last page, the rest of
/// its data was tracked, one page reported at every collection. The sleep
/// lasts 1 s, so that on a loaded machine its start-up is over in time.
#[test]
fn a_short_program_is_tracked_from_its_start_and_not_the_shim() {
    if let Some(why) = no_shim_tracking() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let _busy = [Busy::start(), Busy::start()];
    for run in 0..5 {
        let out = Command::new(BIN)
            .args(["track", "--json", "--interval-ms", "50", "--", "sleep", "1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run {run}: {err}");
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(!lines.is_empty(), "run {run}: no collection: {err}");
        for v in &lines {
            let scanned = v["pages_scanned"].as_u64().unwrap();
            assert!(
                scanned < 1 << 20,
                "run {run}: {scanned} pages walked for an idle sleep (the shim's heap tracked?)"
            );
        }
        // Once started, the sleep writes nothing: from the first collection
        // that reports no page on, none between the first and the last two
        // reports one (the shim's own data is not the program's, and it
        // writes at every collection). The sleep's start-up may still write
        // in the first few on a loaded machine; what its exit writes is in
        // the last two: one asked for as it exits, or the one its shim
        // sends from exit.
        let idle = &lines[..lines.len().saturating_sub(2).max(1)];
        if idle.len() < 2 {
            pagewise_testkit::not_happened!(
                "run {run}: {} collections: none between the first and the exit's",
                lines.len()
            );
        }
        let quiet = idle
            .iter()
            .skip(1)
            .position(|v| v["dirty_pages"] == 0)
            .unwrap_or_else(|| {
                panic!("run {run}: every collection of an idle sleep reported pages: {lines:?}")
            });
        for (i, v) in idle.iter().enumerate().skip(1 + quiet) {
            assert_eq!(
                v["dirty_pages"], 0,
                "run {run}: collection {i} of an idle sleep, after a quiet one: {v}"
            );
        }
        println!(
            "run {run}: {} collections, {} pages walked in the first",
            lines.len(),
            lines[0]["pages_scanned"]
        );
    }
}

/// A program that ends before the first collection gets its last one, sent
/// by its shim as it exits: `write_and_exit.c` writes 100 pages of a fresh
/// mapping and exits at once, under a 2 s interval. Before, `track --json`
/// printed nothing ("after 0 collections").
#[test]
fn a_program_that_ends_first_gets_its_last_collection() {
    if let Some(why) = no_shim_tracking() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let prog = c_program("write_and_exit");
    for json in [true, false] {
        let out = Command::new(BIN)
            .args(["track", "--interval-ms", "2000"])
            .args(json.then_some("--json"))
            .arg("--")
            .arg(&prog)
            .arg("100")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count(), 1, "one collection: {text} {err}");
        if json {
            let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
            let pages = v["dirty_pages"].as_u64().unwrap();
            assert!(pages >= 100, "the 100 pages written: {v}");
        } else {
            assert!(err.contains("after 1 collections"), "{err}");
        }
    }
}

/// Why a command cannot be tracked through its shim here, if it cannot:
/// the shim not built, or no uffd-wp inside a process.
fn no_shim_tracking() -> Option<String> {
    if shim().is_none() {
        return Some("the preload shim is not built".into());
    }
    pagewise::track::BackendKind::UffdWp
        .available_in_process()
        .err()
        .map(|why| format!("uffd-wp: {why}"))
}

/// A worker that grows and gives back its heap with `brk` in a tight loop
/// (tests/c/brk_loop.c), tracked from outside every 200 ms, five times,
/// beside two busy loops: five collections, while the worker's break moved
/// (its own count, before and after) and it runs on. Reported against an
/// earlier tree: no collection in 12 s, then "process W exited after 0
/// collections" while W ran on.
#[test]
fn a_worker_moving_its_break_is_collected_on_time() {
    let mut w = pagewise_testkit::Piped::start(&mut Command::new(c_program("brk_loop")));
    assert_eq!(w.line(), "ready");
    let moves = |w: &mut pagewise_testkit::Piped| -> u64 {
        // SAFETY: a signal to our own child, which handles it.
        unsafe { libc::kill(w.pid(), libc::SIGUSR1) };
        let l = w.line();
        l.strip_prefix("moves ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the worker said {l:?}"))
    };
    // Two busy loops: threads of this test, ended by a flag.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let before = moves(&mut w);
    let out = Command::new("timeout")
        .args(["60", BIN, "track", "--pid", &w.pid().to_string()])
        .args(["--count", "5", "--interval-ms", "200", "--json"])
        .output()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    let after = moves(&mut w);
    let lines = ok_json_lines(&out);
    assert_eq!(lines.len(), 5, "collections made");
    assert!(
        after > before,
        "precondition: the break moved during the run ({before} then {after})"
    );
    assert!(
        pagewise_mech::procfs::is_alive(w.pid()),
        "the worker runs on"
    );
}
