//! The exit status says the class of a failure (`pagewise --help`): 2 wrong
//! usage, 3 not supported here, 4 not permitted, 5 the process went away,
//! 6 busy now (try again later), 1 any other failure; and the message stays one line.

mod support;
use support::*;

/// Runs `pagewise ARGS`: its status and its error output.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn exit_status_says_the_class_of_failure() {
    let mut cases: Vec<(Vec<&str>, i32, String)> = vec![
        // Usage: clap's own, and the tool's checks of its arguments.
        (
            vec!["track", "--no-such-flag"],
            2,
            "unexpected argument".into(),
        ),
        (vec!["track", "--count", "1"], 2, "say which process".into()),
        (
            vec!["snapshot", "--count", "0"],
            2,
            "--count must be at least 1".into(),
        ),
        (vec!["inspect"], 2, "give a process".into()),
        // The process went away (never was).
        (
            vec!["track", "--pid", "999999999", "--count", "1"],
            5,
            "no process with pid 999999999".into(),
        ),
        // Something else failed.
        (
            vec!["snapshot", "inspect", "/nonexistent/store"],
            1,
            "/nonexistent/store".into(),
        ),
    ];
    // Not permitted: init cannot be stopped to act inside it.
    if pagewise::track::BackendKind::UffdWp
        .available_for_pid()
        .is_ok()
    {
        cases.push((
            vec![
                "track",
                "--pid",
                "1",
                "--backend",
                "uffd-wp",
                "--count",
                "1",
            ],
            4,
            "permission denied on pid 1".into(),
        ));
    }
    // Not supported here: a backend this kernel lacks.
    let missing = [
        pagewise::track::BackendKind::SoftDirty,
        pagewise::track::BackendKind::UffdWp,
    ]
    .into_iter()
    .find_map(|b| b.available_for_pid().err().map(|why| (b, why)));
    match missing {
        Some((b, why)) => cases.push((
            vec!["track", "--pid", "1", "--backend", b.name(), "--count", "1"],
            3,
            why,
        )),
        None => pagewise_testkit::not_happened!(
            "every tracking backend is available here: no \"not supported\" case to run"
        ),
    }
    for (args, want, text) in &cases {
        let (code, err) = run(args);
        assert_eq!(code, Some(*want), "{args:?}: {err}");
        assert!(
            err.contains(text.as_str()),
            "{args:?}: {err:?} lacks {text:?}"
        );
        if *want != 2 || !err.contains("Usage:") {
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        }
    }
}

#[test]
fn help_lists_the_exit_statuses() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for want in [
        "Exit status",
        "2 wrong usage",
        "3 not supported",
        "4 not permitted",
        "5 the process went away",
        "6 busy now",
    ] {
        assert!(text.contains(want), "--help lacks {want:?}: {text}");
    }
}

/// A process pagewise cannot stop now exits 6 ("busy now, try again
/// later") from every command that stops it: one traced by another tool
/// (here this test), and one in the middle of a `vfork`.
#[test]
fn a_process_held_or_in_vfork_is_busy_everywhere() {
    if let Some(why) = pagewise_testkit::can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let commands = |pid: &str| -> Vec<Vec<String>> {
        let dir = temp_dir("busy").display().to_string();
        [
            vec!["snapshot", "--pid", pid, "--out", &dir],
            vec!["snapshot", "--live", "--pid", pid, "--out", &dir],
            vec![
                "track",
                "--pid",
                pid,
                "--backend",
                "uffd-wp",
                "--count",
                "1",
            ],
        ]
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect()
    };
    // Traced: seized by this test's thread.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let spid = sleeper.id() as i32;
    pagewise_sys::process::ptrace_seize(spid).unwrap();
    for c in commands(&spid.to_string()) {
        let args: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
        let (code, err) = run(&args);
        assert_eq!(code, Some(6), "{args:?}: {err}");
        assert!(err.contains("is traced by"), "{args:?}: {err}");
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // In vfork: the parent waits for its child, which sleeps.
    let mut v = Command::new(c_program("vfork_wait"))
        .arg("30")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let v_pid = v.id() as i32;
    let line = pagewise_testkit::line_within(&mut BufReader::new(v.stdout.take().unwrap()), v_pid)
        .unwrap_or_default();
    let vpid = line.trim().to_string();
    std::thread::sleep(Duration::from_millis(100));
    for c in commands(&vpid) {
        let args: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
        let (code, err) = run(&args);
        assert_eq!(code, Some(6), "{args:?}: {err}");
        assert!(err.contains("vfork"), "{args:?}: {err}");
    }
    for p in pagewise_mech::procfs::children(v.id() as i32).unwrap_or_default() {
        // SAFETY: kill(2) of the vfork child, this test's grandchild.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    let _ = v.kill();
    let _ = v.wait();
}
