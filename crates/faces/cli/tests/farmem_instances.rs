//! `pagewise farmem run | ls | set` and its instances: exact fetch counts
//! (DiME's Table 5.1), memory checked by the program itself, shared
//! instances listed and changed live, and bad or planted input refused.

#[macro_use]
mod support;
use support::*;

/// DiME's Table 5.1 under `farmem run`: the 2000-page buffer is fetched
/// exactly 2000 times for x <= 1000 and 2000 + x above; the C library adds
/// only its malloc header page. Output is that of a plain run.
fn table_5_1_exact_under_farmem_run() {
    need_support!();
    let dir = instance_dir("table");
    for x in [0u64, 500, 1000, 1100, 2000] {
        let tr = dir.join(format!("trace-{x}"));
        let stats = dir.join(format!("stats-{x}.json"));
        let xs = x.to_string();
        let (out, _) = run_target(
            &dir,
            &[
                "--local-pages",
                "1000",
                "--trace",
                tr.to_str().unwrap(),
                "--stats-json",
                stats.to_str().unwrap(),
            ],
            &["table", &xs],
        );
        assert_eq!(
            out.split_whitespace().last(),
            plain(&["table", &xs]).split_whitespace().last(),
            "the program's result changed"
        );
        let w: Vec<&str> = out.split_whitespace().collect();
        let a = u64::from_str_radix(w[1].trim_start_matches("0x"), 16).unwrap();
        let b = u64::from_str_radix(w[2].trim_start_matches("0x"), 16).unwrap();
        let ev = trace_events(&tr);
        let fetches = |inside: bool| {
            ev.iter()
                .filter(|e| e["kind"] == "fetch")
                .filter(|e| {
                    let addr = e["addr"].as_u64().unwrap();
                    (a <= addr && addr < b) == inside
                })
                .count() as u64
        };
        let want = if x <= 1000 { 2000 } else { 2000 + x };
        assert_eq!(fetches(true), want, "buffer fetches for x = {x}");
        let extra = fetches(false);
        assert!(extra <= 8, "{extra} fetches outside the buffer for x = {x}");
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        for k in [
            "page_fault_count",
            "remote_fetches",
            "evictions",
            "writebacks",
            "injected_delay_ns",
            "floor_ns",
        ] {
            assert!(s[k].is_u64(), "stats JSON lacks {k}: {s}");
        }
        // The counters also see faults after the trace was written at exit
        // (the C library flushes stdout last), and the last fault before
        // exit may beat its publication: a page or two either way.
        let f = s["page_fault_count"].as_u64().unwrap();
        assert_eq!(s["remote_fetches"].as_u64().unwrap(), f);
        assert!(
            f.abs_diff(want + extra) <= 2,
            "{f} faults counted, {} traced",
            want + extra
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Memory stays correct through read(), realloc (mremap), threads and fork,
/// with a budget of 100 pages.
fn programs_keep_their_memory() {
    need_support!();
    let dir = instance_dir("memory");
    let file = dir.join("input");
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["read", file.to_str().unwrap()],
        vec!["grow"],
        vec!["threads"],
        // Threads whose first fault comes after the whole heap was pushed
        // out while they slept.
        vec!["parked"],
        vec!["fork"],
    ];
    for args in &cases {
        for policy in ["fifo", "clock"] {
            let (out, err) = run_target(&dir, &["--local-pages", "100", "--policy", policy], args);
            assert_eq!(
                out,
                plain(args),
                "{args:?} with {policy}: output differs\n{err}"
            );
            assert!(!err.contains("stopped"), "{args:?}: {err}");
        }
    }
    // Thread stacks emulated too (--stacks): threads start, run and exit.
    let (out, err) = run_target(
        &dir,
        &["--stacks", "--local-pages", "100", "--policy", "clock"],
        &["threads"],
    );
    assert_eq!(out, plain(&["threads"]), "threads with --stacks\n{err}");

    // A forked child stays in its parent's instance: two members, one run.
    let stats = dir.join("fork-stats.json");
    run_target(
        &dir,
        &[
            "--local-pages",
            "100",
            "--stats-json",
            stats.to_str().unwrap(),
        ],
        &["fork"],
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let members = s["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "parent and child: {s}");
    assert_ne!(members[0]["pid"], members[1]["pid"]);
    assert!(
        members
            .iter()
            .all(|m| m["stats"]["page_fault_count"].as_u64().unwrap() > 0),
        "{s}"
    );

    // The plain run itself is right (its check is what we compare).
    let fnv = data
        .iter()
        .take(256 * 4096)
        .fold(1469598103934665603u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(1099511628211)
        });
    assert!(plain(&cases[0]).contains(&format!("fnv {fnv:016x} other_bad 0")));
    assert!(plain(&["grow"]).contains("bad 0"));
    assert!(plain(&["threads"]).contains("bad 0"));
    assert!(plain(&["fork"]).contains("child_bad 0 parent_bad 0"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two processes share one named instance; `ls` lists both with the
/// instance's figures; `set` shrinks the budget and both fit under it at
/// once; another user may not change it.
fn shared_instance_listed_and_set_live() {
    need_support!();
    let dir = instance_dir("live");
    let a = hold_in_instance(&dir, "shared", 400, 6);
    let b = hold_in_instance(&dir, "shared", 400, 6);
    let l = ls(&dir);
    let inst = l
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance_id"] == "shared")
        .expect("instance listed");
    assert_eq!(inst["latency_ns"], 1000);
    assert_eq!(inst["local_npages"], 600);
    assert_eq!(inst["pids"].as_array().unwrap().len(), 2, "{inst}");
    for k in [
        "page_fault_count",
        "remote_fetches",
        "evictions",
        "injected_delay_ns",
        "bandwidth_bps",
    ] {
        assert!(inst[k].is_u64(), "ls lacks {k}");
    }
    // Both hold 400 pages: the shared budget of 600 keeps them under it.
    assert!(
        inst["local_pages_now"].as_u64().unwrap() <= 600 + 2,
        "{inst}"
    );

    // Another user may not change it.
    if let Some(mut nobody) = as_nobody() {
        let out = nobody
            .args(["farmem", "set", "shared", "local_npages=10"])
            .env("PAGEWISE_FARMEM_DIR", &dir)
            .output()
            .unwrap();
        assert!(!out.status.success(), "another user changed the instance");
        assert!(String::from_utf8_lossy(&out.stderr).contains("owner"));
    } else {
        pagewise_testkit::skip!("owner check: needs root and setpriv");
    }

    // `latency=2us` says its unit; `farmem list` is `farmem ls`.
    ok(farmem(&dir).args(["set", "shared", "local_npages=50", "latency=2us"]));
    ok(farmem(&dir).args(["list"]));
    let t0 = Instant::now();
    loop {
        let l = ls(&dir);
        let i = &l[0];
        assert_eq!(i["latency_ns"], 2000);
        assert_eq!(i["local_npages"], 50);
        assert_eq!(
            i["pids"].as_array().unwrap().len(),
            2,
            "a member left early: {i}"
        );
        if i["local_pages_now"].as_u64().unwrap() <= 50 + 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "budget not applied: {i}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hold bad 0");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a process joining a shared instance whose other member sat
/// above its share of a full budget was held to the few pages left (the
/// other member, not faulting, never gave any back) and crawled. Now a
/// member well above its share of a full budget comes down to it: the
/// newcomer gets its share, the budget holds, and every byte is kept.
fn a_newcomer_gets_its_share_of_a_shared_budget() {
    need_support!();
    let dir = instance_dir("share");
    let a = hold_in_instance(&dir, "share", 500, 14);
    let b = hold_in_instance(&dir, "share", 400, 10);
    let (pa, pb) = (a.id() as i64, b.id() as i64);
    // The target's pages with data are 500 and 400 and a few of its own:
    // shares of 600 near 333 and 267. Held to what `a` left, `b` had
    // at most about 100.
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let got = loop {
        let l = ls(&dir);
        let i = l
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["instance_id"] == "share")
            .expect("instance listed")
            .clone();
        let local = |pid: i64| {
            i["members"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["live"] == true)
                // `farmem run` runs the target as its child: the member is
                // the run or its child.
                .find(|m| {
                    let p = m["pid"].as_i64().unwrap();
                    p == pid
                        || std::fs::read_to_string(format!("/proc/{p}/status"))
                            .ok()
                            .and_then(|t| pagewise_mech::procfs::status_field(&t, "PPid"))
                            == Some(pid as u64)
                })
                .map(|m| m["stats"]["local_pages_now"].as_u64().unwrap())
        };
        let (la, lb) = (local(pa), local(pb));
        let total = i["local_pages_now"].as_u64().unwrap();
        assert!(total <= 600 + 2, "budget broken: {i}");
        seen.push((la, lb));
        if let (Some(la), Some(lb)) = (la, lb) {
            if lb >= 200 && la <= 333 + 30 {
                break (la, lb);
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "the newcomer never got its share (local pages of the first and \
             the newcomer over time: {seen:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("shares reached: first {} pages, newcomer {}", got.0, got.1);
    for c in [b, a] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hold bad 0");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad input gets one clear line and a non-zero exit.
fn bad_input_is_refused_clearly() {
    let dir = instance_dir("bad");
    let run = |args: &[&str]| {
        let out = farmem(&dir).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["run", "--", "true"]).contains("--local-pages"));
    assert!(run(&["run", "--local-percent", "0", "--", "true"]).contains("1..=100"));
    assert!(run(&["set", "nosuch", "latency_ns=1"]).contains("no far-memory instance"));
    // A bare number where the unit is not in the key's name is refused
    // (before the instance is looked for), not taken as ns or bytes/s.
    assert!(run(&["set", "nosuch", "latency=5"]).contains("say the unit"));
    assert!(run(&["set", "nosuch", "bandwidth=7"]).contains("say the unit"));
    // A user without a full userfaultfd is told which setting says so.
    if let (Some(mut nobody), true) = (as_nobody(), unprivileged_userfaultfd_off()) {
        let out = nobody
            .args(["farmem", "run", "--local-pages", "100", "--", "true"])
            .env("PAGEWISE_FARMEM_DIR", &dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "farmem run without userfaultfd succeeded"
        );
        assert!(err.contains("vm.unprivileged_userfaultfd is 0"), "{err}");
    } else {
        pagewise_testkit::skip!(
            "unprivileged farmem run: needs root, setpriv and vm.unprivileged_userfaultfd=0"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: an instance file another user planted (a copy of a live one,
/// under the name the next run would take, or a pre-created `--instance`)
/// made root's `farmem run` join it and hang. Now a process joins only an
/// instance its own user owns, names are not predictable, instance files
/// are owner-only, and a shared directory another user could rewrite is
/// refused.
fn planted_instances_are_never_joined() {
    need_support!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_testkit::skip!("making a file another user owns needs root");
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = instance_dir("planted");
    // A live instance to copy.
    let mut live = farmem(&dir)
        .args([
            "run",
            "--instance",
            "victim",
            "--local-pages",
            "1000",
            "--",
            "sleep",
            "3",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let src = dir.join("victim");
    let t0 = Instant::now();
    while !src.exists() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(src.exists(), "the instance file never appeared");
    let mode = std::fs::metadata(&src).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "instance files are owner-only");
    let planted = dir.join("planted");
    std::fs::copy(&src, &planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    let mut c = farmem(&dir);
    c.args(["run", "--instance", "planted", "--", "true"]);
    let Some((code, _, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
        panic!("farmem run hung on a planted instance");
    };
    assert_ne!(code, 0, "joined an instance another user owns: {err}");
    assert!(err.contains("belongs to uid 65534"), "{err}");
    let _ = live.wait();
    // Names farmem run makes up are not the next pid.
    let names: Vec<String> = (0..2)
        .map(|_| {
            let out = farmem(&dir)
                .args(["run", "--local-pages", "100", "--", "true"])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let name = err
                .split_whitespace()
                .find(|w| w.starts_with("run-"))
                .unwrap_or_else(|| panic!("no instance name in {err}"))
                .trim_end_matches(':')
                .to_string();
            let hex = name.trim_start_matches("run-");
            assert!(
                hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()),
                "a predictable name: {name}"
            );
            name
        })
        .collect();
    assert_ne!(names[0], names[1]);
    // A shared directory another user owns, writable without the sticky bit.
    let bad = instance_dir("planted-dir");
    std::os::unix::fs::chown(&bad, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = farmem(&bad)
        .args(["run", "--local-pages", "100", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "used an unsafe directory: {err}");
    assert!(err.contains("not a safe instance directory"), "{err}");
    assert_eq!(std::fs::metadata(&bad).unwrap().uid(), 65534);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&bad);
}

/// Regression: a latency near `u64::MAX` overflowed to "0.0 ms injected",
/// and an unknown policy (or a plugin that does not load) only warned and
/// ran the program without emulation. Each is refused in one line before
/// the program starts, and `farmem set` refuses the same values on a live
/// instance. (Budgets of 1 to 3 pages run: see
/// `budgets_of_one_to_three_pages_run`.)
fn bad_settings_are_refused_before_the_program_starts() {
    need_support!();
    let dir = instance_dir("badsettings");
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--local-pages",
                "100",
                "--latency-ns",
                "18446744073709551615",
            ],
            "at most",
        ),
        (
            &["--local-pages", "100", "--policy", "bogus"],
            "unknown policy",
        ),
        (
            &["--local-pages", "100", "--policy", "FIFO"],
            "unknown policy",
        ),
        (&["--local-pages", "100", "--policy", ""], "unknown policy"),
        (
            &["--local-pages", "100", "--policy", "./no-such-policy.so"],
            "policy plugin",
        ),
        (
            &["--local-pages", "100", "--policy", "/etc/hostname"],
            "policy plugin",
        ),
    ];
    for (opts, want) in cases {
        let out = farmem(&dir)
            .arg("run")
            .args(*opts)
            .args(["--", "sh", "-c", "echo the program ran"])
            .output()
            .unwrap();
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{opts:?} accepted:\n{so}{se}");
        assert!(!so.contains("the program ran"), "{opts:?}: the program ran");
        assert!(se.contains(want), "{opts:?}: {se}");
        assert_eq!(se.trim().lines().count(), 1, "{opts:?}: one line: {se}");
    }
    // On a live instance.
    let mut live = farmem(&dir)
        .args([
            "run",
            "--instance",
            "live",
            "--local-pages",
            "1000",
            "--",
            "sleep",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !dir.join("live").exists() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (kv, want) in [
        ("local_npages=0", "1..=100"),
        ("latency_ns=18446744073709551615", "at most"),
        ("local_percent=0", "1..=100"),
    ] {
        let out = farmem(&dir).args(["set", "live", kv]).output().unwrap();
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kv} accepted");
        assert!(se.contains(want), "{kv}: {se}");
    }
    let _ = live.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: with several processes in one run, the summary reported the
/// last one's fetches (130 where three processes fetched 130 each: exited
/// members' slots were reused and their counts dropped), and members that
/// left through `_exit` kept their slots, so after 64 of them new processes
/// ran without emulation. Totals are totals, checked against every
/// process's own trace; slots of exited members are reused.
fn several_processes_add_up_and_free_their_slots() {
    need_support!();
    let dir = instance_dir("stats");
    let touch = c_program("farmem_touch");
    let t = touch.to_str().unwrap();
    let tr = dir.join("trace");
    let stats = dir.join("stats.json");
    ok(farmem(&dir)
        .args(["run", "--local-pages", "1000", "--trace"])
        .arg(&tr)
        .arg("--stats-json")
        .arg(&stats)
        .args(["--", "sh", "-c", &format!("{t} 130; {t} 130; {t} 130")]));
    let traced = trace_events(&tr)
        .iter()
        .filter(|e| e["kind"] == "fetch")
        .count() as u64;
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(traced >= 3 * 130, "{traced} fetches traced");
    assert_eq!(
        s["remote_fetches"].as_u64().unwrap(),
        traced,
        "the total is not the sum"
    );
    // 70 members that leave through _exit, then one more.
    let out = farmem(&dir)
        .args(["run", "--local-pages", "1000", "--stats-json"])
        .arg(&stats)
        .args([
            "--",
            "sh",
            "-c",
            &format!("i=0; while [ $i -lt 70 ]; do {t} 5 _exit; i=$((i+1)); done; {t} 130"),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("members already") && !err.contains("without"),
        "{err}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let f = s["remote_fetches"].as_u64().unwrap();
    assert!(
        f >= 70 * 5 + 130,
        "{f} fetches for 70 x 5 + 130 pages touched"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: `snapshot --pid` of a process under `farmem run` failed with
/// "more pages pushed than the regions hold" (or could wait forever on the
/// handler it had stopped), and `inspect --pid` of one could hang. Now the
/// snapshot is refused with the reason, and inspect finishes.
fn snapshot_and_inspect_of_an_emulated_process_never_hang() {
    need_support!();
    let dir = instance_dir("outside");
    let mut run = farmem(&dir)
        .args([
            "run",
            "--local-pages",
            "2000",
            "--",
            BIN,
            "workload",
            "--mib",
            "32",
        ])
        .args(["--seconds", "20", "--pages-per-sec", "5000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run_pid = run.id() as i32;
    // Its first line: the workload runs.
    pagewise_testkit::line_within(&mut BufReader::new(run.stdout.as_mut().unwrap()), run_pid);
    // The workload is the run's child.
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", run.id(), run.id()))
            .unwrap_or_default();
    let pid = children
        .split_whitespace()
        .next()
        .expect("the workload's pid")
        .to_string();
    let store = dir.join("store");
    let mut c = Command::new(BIN);
    c.args(["snapshot", "--pid", &pid, "--out"]).arg(&store);
    let Some((code, _, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
        panic!("snapshot --pid of an emulated process hung");
    };
    assert_ne!(
        code, 0,
        "a snapshot of an emulated process was taken: {err}"
    );
    assert!(err.contains("serves its own page faults"), "{err}");
    assert!(!store.exists(), "a store was left behind");
    for i in 0..4 {
        let mut c = Command::new(BIN);
        c.args(["inspect", "--json", "--pid", &pid]);
        let Some((code, out, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
            panic!("inspect --pid of an emulated process hung (run {i})");
        };
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(v["rss_bytes"].as_u64().unwrap() >= 32 << 20, "{out}");
        // Its engine served the inspector's reads: the program runs on.
        assert!(
            pagewise_mech::procfs::is_alive(pid.parse().unwrap()),
            "the emulated process died while inspected (run {i})"
        );
    }
    // SAFETY: kill(2) of the workload this test started.
    unsafe { libc::kill(pid.parse().unwrap(), libc::SIGTERM) };
    let _ = run.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plugin policy is never loaded into pagewise unless asked: a file
/// another user could change is refused unloaded, and one that is no
/// plugin (a copy of /bin/true) passes the file check but is refused by
/// `--load-plugin-here`, which loads it here first. Each refusal is one
/// line before the program starts.
fn plugins_are_loaded_into_pagewise_only_when_asked() {
    need_support!();
    use std::os::unix::fs::PermissionsExt;
    let dir = instance_dir("plugins");
    // Beside the instance directory (one per fault path), not in it: the
    // directory's own mode is pagewise's to check.
    let plugin = dir.with_extension("plugin.so");
    std::fs::copy("/bin/true", &plugin).unwrap();
    let refused = |extra: &[&str], want: &str| {
        let out = farmem(&dir)
            .arg("run")
            .args(["--local-pages", "100", "--policy"])
            .arg(&plugin)
            .args(extra)
            .args(["--", "sh", "-c", "echo the program ran"])
            .output()
            .unwrap();
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} accepted:\n{so}{se}");
        assert!(
            !so.contains("the program ran"),
            "{extra:?}: the program ran"
        );
        assert!(se.contains(want), "{extra:?}: {se}");
        assert_eq!(se.trim().lines().count(), 1, "{extra:?}: one line: {se}");
    };
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o666)).unwrap();
    refused(&[], "writable by its group or others");
    refused(&["--load-plugin-here"], "writable by its group or others");
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    refused(&["--load-plugin-here"], "policy plugin");
    let _ = std::fs::remove_file(&plugin);
    let _ = std::fs::remove_dir_all(&dir);
}

// Every test runs on both fault paths: `NAME::thread` and `NAME::inline`.
pagewise_testkit::per_fault_path!(
    super::on_path;
    table_5_1_exact_under_farmem_run,
    programs_keep_their_memory,
    shared_instance_listed_and_set_live,
    a_newcomer_gets_its_share_of_a_shared_budget,
    bad_input_is_refused_clearly,
    planted_instances_are_never_joined,
    bad_settings_are_refused_before_the_program_starts,
    plugins_are_loaded_into_pagewise_only_when_asked,
    several_processes_add_up_and_free_their_slots,
    snapshot_and_inspect_of_an_emulated_process_never_hang,
);
