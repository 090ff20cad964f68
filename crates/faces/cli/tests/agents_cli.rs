//! The agents' commands end to end (`thp run`, `thp prezero`, `dedup run`):
//! what they do to real programs, their metrics, and the system settings
//! they put back, also after SIGTERM or SIGKILL.

#[macro_use]
mod support;
use support::*;

/// `thp run` on a running workload: JSON steps whose promotions add up to
/// the total budget (each region then mapped by a huge page), the metrics
/// file saying the same; without `--steps` it ends on SIGTERM with status 0
/// and leaves no range registered in the process.
#[test]
fn thp_run_promotes_within_the_budget_and_ends_on_sigterm() {
    if let Some(why) = thp_agent_missing(true) {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let (mut wl, _, _) = spawn_workload(&[
        "workload",
        "--mib",
        "32",
        "--seconds",
        "20",
        "--pages-per-sec",
        "20000",
    ]);
    let pid = wl.id().to_string();
    let dir = temp_dir("thp");
    std::fs::create_dir_all(&dir).unwrap();
    let prom = dir.join("thp.prom");
    let out = Command::new(BIN)
        .args([
            "thp",
            "run",
            "--json",
            "--steps",
            "2",
            "--budget-total",
            "3",
            "--walk-ns",
            "30",
        ])
        .args(["--interval-ms", "500", "--pid", &pid, "--metrics"])
        .arg(&prom)
        .output()
        .unwrap();
    let lines = ok_json_lines(&out);
    // Two steps, then what the process gained.
    assert_eq!(lines.len(), 3, "{lines:?}");
    let (steps, gained) = (&lines[..2], &lines[2]["gained"]);
    let mut promoted = Vec::new();
    for s in steps {
        for a in s["actions"].as_array().unwrap() {
            match a["action"].as_str().unwrap() {
                "promoted" => promoted.push(a["start"].as_u64().unwrap()),
                "failed" => {
                    pagewise_testkit::claim_not_happened!(
                        "madv_collapse",
                        "the huge-page agent's collapse was refused by the kernel: {a}"
                    );
                    let _ = wl.kill();
                    return;
                }
                _ => {}
            }
        }
    }
    assert_eq!(promoted.len(), 3, "{steps:?}");
    let mut w = pagewise_mech::walk::PageWalker::new(Some(wl.id() as i32)).unwrap();
    let mut runs = Vec::new();
    for &start in &promoted {
        let r = pagewise::Region::new(start, 2 << 20).unwrap();
        let huge = pagewise_sys::pagemap::category::HUGE;
        w.categories(r, huge, huge, &mut runs).unwrap();
        assert!(
            !runs.is_empty(),
            "{start:#x} was promoted but is not a huge page"
        );
    }
    let text = std::fs::read_to_string(&prom).unwrap();
    assert!(text.contains("pagewise_thp_promoted_total 3"), "{text}");
    // The gains: the process from its first step, against the THP mode the
    // machine had (and has again): 3 × 2 MiB more in huge pages, unless
    // khugepaged made some of its own meanwhile (THP always).
    let mode =
        pagewise::agent::settings::current("/sys/kernel/mm/transparent_hugepage/enabled").unwrap();
    assert_eq!(gained["before"][0]["value"], mode.as_str(), "{gained}");
    assert_eq!(gained["end"]["processes"], 1, "{gained}");
    let huge = |at: &str| gained[at]["anon_huge_kib"].as_u64().unwrap();
    if mode == "always" {
        assert!(huge("end") >= huge("start") + 3 * 2048, "{gained}");
    } else {
        assert_eq!(huge("end") - huge("start"), 3 * 2048, "{gained}");
    }
    // Until SIGTERM.
    let mut run = Command::new(BIN)
        .args([
            "thp",
            "run",
            "--interval-ms",
            "300",
            "--walk-ns",
            "30",
            "--pid",
            &pid,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    pagewise_sys::process::kill(run.id() as i32, libc::SIGTERM).unwrap();
    let st = run.wait().unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(run.stdout.as_mut().unwrap(), &mut text).unwrap();
    // 128 + SIGTERM, as every long-running command, with its summary.
    assert_eq!(st.code(), Some(143), "thp run ended with {st}: {text}");
    assert!(text.contains("steps:"), "{text}");
    assert!(
        text.contains("against the machine's settings before (enabled="),
        "no gains said at the end: {text}"
    );
    let uw = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "uw"))
        .count();
    assert_eq!(uw, 0, "ranges left registered in the process");
    let _ = wl.kill();
    let _ = wl.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `thp prezero -- CMD`: the program's growing mapping has regions faulted
/// in ahead of its first 2 MiB (without pagewise only that one is), and the
/// program finds every page it then writes as written and nothing else.
#[test]
fn thp_prezero_runs_ahead_of_a_growing_program() {
    if shim().is_none() {
        pagewise_testkit::skip!("the preload shim is not built");
        return;
    }
    let dir = temp_dir("prezero");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = c_program("prezero_grow");
    let resident = |out: &std::process::Output| -> u32 {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("ok"),
            "{text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text.lines()
            .find_map(|l| l.strip_prefix("resident "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    };
    let plain = resident(&Command::new(&exe).output().unwrap());
    let run = Command::new(BIN)
        .args(["thp", "prezero", "--ahead", "3", "--"])
        .arg(&exe)
        .output()
        .unwrap();
    let pre = resident(&run);
    let _ = std::fs::remove_dir_all(&dir);
    if plain != 1 {
        pagewise_testkit::skip!("without pagewise {plain} regions were resident (THP `always` with khugepaged?): nothing to compare");
        return;
    }
    assert_eq!(pre, 4, "the first region and 3 ahead");
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(
        said.contains("huge pages pre-zeroed ahead"),
        "no summary: {said}"
    );
    // With --json: the program's lines on stderr, the report on stdout. The
    // thread populated the 3 regions seen ahead, and at most the other 28
    // of the 32 as the program wrote them.
    let run = Command::new(BIN)
        .args(["thp", "prezero", "--ahead", "3", "--json", "--"])
        .arg(&exe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && err.contains("resident 4\n") && err.contains("ok\n"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(v["reported"], true, "{v}");
    assert_eq!(v["status"], 0, "{v}");
    let n = v["populated"].as_u64().unwrap();
    assert!((3..=31).contains(&n), "{n} huge pages populated: {v}");
    assert_eq!(v["populated_bytes"].as_u64(), Some(n << 21), "{v}");
}

/// `thp prezero -- sh -c 'exec PROGRAM'`: the program that replaces the
/// shell is the same process and is pre-zeroed (its regions ahead are
/// resident; no report, its socket closed at the exec); with
/// `sh -c 'PROGRAM; true'` the program is the shell's child and is not
/// (one region resident, as without pagewise).
#[test]
fn thp_prezero_is_kept_across_exec_and_not_given_to_children() {
    if shim().is_none() {
        pagewise_testkit::skip!("the preload shim is not built");
        return;
    }
    let exe = c_program("prezero_grow");
    let plain = Command::new(&exe).output().unwrap();
    if !String::from_utf8_lossy(&plain.stdout).contains("resident 1\n") {
        pagewise_testkit::skip!(
            "without pagewise the program saw {:?} (THP `always` with khugepaged?): nothing to compare",
            String::from_utf8_lossy(&plain.stdout)
        );
        return;
    }
    let run = |script: String| {
        let out = Command::new(BIN)
            .args(["thp", "prezero", "--ahead", "3", "--json", "--", "sh", "-c"])
            .arg(script)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success() && err.contains("ok\n"), "{err}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (err, v)
    };
    let (err, v) = run(format!("exec {}", exe.display()));
    assert!(err.contains("resident 4\n"), "after exec: {err}");
    assert_eq!(v["reported"], false, "{v}");
    let (err, v) = run(format!("{}; true", exe.display()));
    assert!(err.contains("resident 1\n"), "a child: {err}");
    assert_eq!(v["status"], 0, "{v}");
}

/// `thp prezero -- CMD` reports the program's own exit status, and says
/// when no report came (a program killed outright cannot send one).
#[test]
fn thp_prezero_reports_the_status_and_a_missing_report() {
    if shim().is_none() {
        pagewise_testkit::skip!("the preload shim is not built");
        return;
    }
    let json = |cmd: &[&str]| -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["thp", "prezero", "--json", "--"])
            .args(cmd)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    // A program that ends through exit(3) reports (a shell's `exit` is
    // _exit(2), which runs no exit handler).
    let v = json(&["/usr/bin/python3", "-c", "raise SystemExit(3)"]);
    assert_eq!(
        (v["status"].as_i64(), v["reported"].as_bool()),
        (Some(3), Some(true)),
        "{v}"
    );
    let v = json(&["sh", "-c", "kill -9 $$"]);
    assert_eq!(
        (v["status"].as_i64(), v["reported"].as_bool()),
        (Some(137), Some(false)),
        "{v}"
    );
    assert!(v.get("populated").is_none(), "{v}");
}

/// `dedup run -- CMD` on a self-checking program with eight huge pages (four
/// cold and identical, two hot, two cold and unique): the program's advice
/// is made by its shim (it is never stopped), exactly the four cold
/// identical ones are split and merged, KSM shares their pages, the
/// program's output is that of a run without pagewise, the tool's exit
/// status is the program's, and KSM's settings are as before.
#[test]
fn dedup_run_merges_cold_duplicates_and_changes_no_output() {
    let Some(_ksm) = ksm_agents_one_at_a_time() else {
        return;
    };
    let p = pagewise::probe::get();
    if !p.ksm || !p.madv_collapse || !p.process_madvise {
        pagewise_testkit::skip!(
            "{} / {} / {}",
            p.why("ksm"),
            p.why("madv_collapse"),
            p.why("process_madvise")
        );
        return;
    }
    if pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!("needs root to start ksmd");
        return;
    }
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = temp_dir("dedup");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = c_program("dedup_target");
    let plain = Command::new(&exe).arg("1").output().unwrap();
    assert!(plain.status.success());
    if !String::from_utf8_lossy(&plain.stderr).contains("huge 1") {
        pagewise_testkit::claim_not_happened!(
            "madv_collapse",
            "the program's regions could not be made huge (MADV_COLLAPSE refused)"
        );
        return;
    }
    let knobs = ["run", "pages_to_scan", "sleep_millisecs", "smart_scan"]
        .map(|k| std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{k}")).unwrap_or_default());
    let out = Command::new(BIN)
        .args([
            "dedup",
            "run",
            "--json",
            "--interval-ms",
            "400",
            "--window-ms",
            "150",
        ])
        .args(["--thresholds", "0,2,0.5", "--full-scan-ms", "300", "--"])
        .arg(&exe)
        .arg("6")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text} {err}");
    // With --json, stdout is JSON alone and the program's stdout is on
    // stderr (beside its own stderr): every line it printed, in order.
    assert!(text.lines().all(|l| l.starts_with('{')), "{text}");
    let plain_out = String::from_utf8_lossy(&plain.stdout);
    let mut want = plain_out.lines().peekable();
    for l in err.lines() {
        if want.peek() == Some(&l) {
            want.next();
        }
    }
    assert!(want.peek().is_none(), "the program's output changed: {err}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let watching = lines
        .iter()
        .find(|v| v.get("watching").is_some())
        .cloned()
        .expect("the line saying what is watched");
    assert_eq!(
        watching["watching"][0]["inside"], "shim",
        "the program's advice not made by its shim: {watching}"
    );
    let steps: Vec<serde_json::Value> = lines
        .iter()
        .filter(|v| v.get("t_ms").is_some())
        .cloned()
        .collect();
    assert!(steps.len() >= 5, "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    let base = err
        .lines()
        .find_map(|l| l.strip_prefix("base 0x")?.split_whitespace().next())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .expect("the program's base address on stderr");
    // Nothing outside the program's eight regions is acted on: not the
    // shim's own heap or its threads' stacks.
    let outside: Vec<&serde_json::Value> = steps
        .iter()
        .flat_map(|s| s["actions"].as_array().unwrap())
        .filter(|a| {
            a["start"]
                .as_u64()
                .is_some_and(|s| s < base || s >= base + 8 * (2 << 20))
        })
        .collect();
    assert!(
        outside.is_empty(),
        "actions outside the program's regions (base {base:#x}): {outside:?}"
    );
    let mut split: Vec<u64> = steps
        .iter()
        .flat_map(|s| s["actions"].as_array().unwrap().clone())
        .filter(|a| a["action"] == "merge" && a["huge"] == true)
        .map(|a| a["start"].as_u64().unwrap())
        .collect();
    split.sort();
    assert_eq!(
        split,
        (0..4).map(|r| base + r * (2 << 20)).collect::<Vec<_>>(),
        "huge pages split: not the four cold identical ones"
    );
    let sharing = steps
        .iter()
        .filter_map(|s| {
            s["ksm"]["merging_pages"]
                .as_object()?
                .values()
                .next()?
                .as_u64()
        })
        .max()
        .unwrap_or(0);
    // The agent made them mergeable (the actions above); how far ksmd got
    // in the run's steps depends on the CPU it had (1,536 of 2,048 with a
    // stress run beside CI on this 2-vCPU machine).
    if sharing == 0 {
        pagewise_testkit::claim_not_happened!(
            "ksm",
            "the dedup agent's run merged none of the program's 2048 identical pages"
        );
    } else if sharing < 2048 {
        pagewise_testkit::not_happened!(
            "ksmd merged {sharing} of the program's 2048 identical pages within the run's steps"
        );
    }
    // What the program gained: it ended before the agent, so as last read
    // after a step; from nothing merged (it had just started) to at least
    // what the step before the last saw (the last may have found it
    // ending), where the kernel counts per process.
    let gained = &lines
        .iter()
        .find(|v| v.get("gained").is_some())
        .expect("the line saying what was gained")["gained"];
    assert_eq!(gained["end"]["processes"], 1, "{gained}");
    assert_eq!(gained["ended"], 1, "{gained}");
    assert_eq!(
        gained["before"][0]["value"],
        knobs[0].trim(),
        "KSM's run before: {gained}"
    );
    if let Some(end) = gained["end"]["ksm_merging_pages"].as_u64() {
        let last = steps
            .iter()
            .rev()
            .nth(1)
            .and_then(|s| {
                s["ksm"]["merging_pages"]
                    .as_object()?
                    .values()
                    .next()?
                    .as_u64()
            })
            .unwrap_or(0);
        assert_eq!(gained["start"]["ksm_merging_pages"], 0, "{gained}");
        assert!(
            end >= last,
            "{end} merged at the end, {last} at the last step: {gained}"
        );
    } else {
        assert!(gained["start"]["ksm_merging_pages"].is_null(), "{gained}");
    }
    let after = ["run", "pages_to_scan", "sleep_millisecs", "smart_scan"]
        .map(|k| std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{k}")).unwrap_or_default());
    assert_eq!(after, knobs, "KSM's settings were not put back");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--metrics-listen` on an address other than loopback is refused unless
/// `--metrics-public` says so: the counters name the watched processes.
#[test]
fn metrics_listen_beyond_loopback_asks_for_metrics_public() {
    for cmd in ["thp", "dedup"] {
        let out = Command::new(BIN)
            .args([cmd, "run", "--pid", "1", "--steps", "1"])
            .args(["--metrics-listen", "0.0.0.0:0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd}: {err}");
        assert!(err.contains("--metrics-public"), "{cmd}: {err}");
    }
}

/// `dedup run` SIGKILLed at random points leaves KSM's settings as they
/// were once the next `pagewise` command has run (it puts them back and
/// says so); while one `dedup run` holds them, a second is refused with
/// one line naming the first.
#[test]
fn a_killed_dedup_agent_is_repaired_and_a_second_is_refused() {
    if !pagewise::probe::get().ksm || pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!("needs KSM and root");
        return;
    }
    let knobs = || {
        ["run", "pages_to_scan", "smart_scan"]
            .map(|k| std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{k}")).unwrap_or_default())
    };
    let Some(_ksm) = ksm_agents_one_at_a_time() else {
        return;
    };
    let before = knobs();
    let mut target = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = target.id().to_string();
    let agent = || {
        Command::new(BIN)
            .args(["dedup", "run", "--interval-ms", "200", "--window-ms", "50"])
            .args(["--full-scan-ms", "300", "--pid", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // A second agent while the first holds the settings.
    let mut first = agent();
    let t0 = std::time::Instant::now();
    let journal = pagewise_mech::settings::journal_dir().join("%sys%kernel%mm%ksm%run");
    while !journal.exists() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "the first agent never took KSM's settings"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let second = agent().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second agent ran: {err}");
    assert!(
        err.contains(&format!("held by pagewise process {}", first.id())),
        "{err}"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    // SIGKILL at random points, each followed by another command.
    let mut seed = std::process::id() as u64 | 1;
    for round in 0..8 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut a = agent();
        std::thread::sleep(std::time::Duration::from_millis(seed % 600));
        a.kill().unwrap();
        a.wait().unwrap();
        let probe = Command::new(BIN).arg("probe").output().unwrap();
        assert!(probe.status.success());
        assert_eq!(
            knobs(),
            before,
            "round {round}: KSM's settings left changed"
        );
    }
    let _ = target.kill();
    let _ = target.wait();
}

/// KSM's settings have one owner at a time: the tests that start a
/// `dedup run` take turns, and wait (a minute at most) for a pagewise
/// outside the tests (an agent on this machine) to let KSM go; `None`,
/// said as not happened, when it did not.
fn ksm_agents_one_at_a_time() -> Option<std::sync::MutexGuard<'static, ()>> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let g = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let ksm = "/sys/kernel/mm/ksm/run";
    match pagewise_mech::settings::wait_until_free(ksm, Duration::from_secs(60)) {
        Ok(()) => Some(g),
        Err(e) => {
            pagewise_testkit::not_happened!("{e}");
            None
        }
    }
}

/// `dedup run --pid` SIGKILLed once it has made regions of a running
/// process mergeable: the next `pagewise` command takes them back (the
/// advice was journaled first), and the process runs on, checking itself.
#[test]
fn a_killed_dedup_agents_advice_is_taken_back() {
    let p = pagewise::probe::get();
    if !p.ksm || !p.madv_collapse || !p.process_madvise || pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!("needs KSM, MADV_COLLAPSE, process_madvise and root");
        return;
    }
    let Some(_ksm) = ksm_agents_one_at_a_time() else {
        return;
    };
    let dir = temp_dir("dedup-advice");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = c_program("dedup_target");
    let mut target = Command::new(&exe)
        .arg("60")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let target_pid = target.id() as i32;
    let first = pagewise_testkit::line_within(
        &mut BufReader::new(target.stderr.take().unwrap()),
        target_pid,
    )
    .unwrap_or_default();
    if !first.contains("huge 1") {
        pagewise_testkit::claim_not_happened!(
            "madv_collapse",
            "the program's regions could not be made huge: {first}"
        );
        let _ = target.kill();
        let _ = target.wait();
        return;
    }
    let pid = target.id() as i32;
    let mergeable = || pagewise_mech::procfs::with_vm_flag(Some(pid), &["mg"]).unwrap();
    let mut agent = Command::new(BIN)
        .args(["dedup", "run", "--interval-ms", "400", "--window-ms", "150"])
        .args(["--thresholds", "0,2,0.5", "--full-scan-ms", "300", "--pid"])
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while mergeable().is_empty() {
        if t0.elapsed() > std::time::Duration::from_secs(30) {
            pagewise_testkit::claim_not_happened!(
                "ksm",
                "the dedup agent made nothing mergeable in 30 s"
            );
            let _ = agent.kill();
            let _ = target.kill();
            let _ = (agent.wait(), target.wait());
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    agent.kill().unwrap();
    agent.wait().unwrap();
    assert!(
        !mergeable().is_empty(),
        "left mergeable by the killed agent"
    );
    let probe = Command::new(BIN).arg("probe").output().unwrap();
    assert!(probe.status.success());
    let said = String::from_utf8_lossy(&probe.stderr);
    assert!(said.contains("took back the advice"), "{said}");
    assert!(
        mergeable().is_empty(),
        "still mergeable after the next command"
    );
    assert!(target.try_wait().unwrap().is_none(), "the process died");
    let _ = target.kill();
    let _ = target.wait();
}

/// Without CAP_SYS_NICE every collapse would be refused one by one: `thp
/// run` says so up front and exits with the "not permitted" status (4),
/// before it starts anything.
#[test]
fn thp_run_without_cap_sys_nice_says_so_up_front() {
    let Some(mut nobody) = as_nobody() else {
        pagewise_testkit::skip!("thp run as another user: needs root and setpriv");
        return;
    };
    let out = nobody
        .args(["thp", "run", "--pid", "1", "--steps", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("CAP_SYS_NICE"), "{err}");
}

/// What the agents say they gained (`agent::gains::Ledger`), against
/// ground truth: a program that writes 64 MiB of new pages between its
/// first reading and the end gains exactly that (its stack aside); one
/// that ends counts as last read; a setting the kernel lacks reads as
/// none.
#[test]
fn gains_count_the_pages_a_program_wrote_and_keep_an_ended_ones_last_reading() {
    use pagewise::agent::gains::Ledger;
    let exe = c_program("grow_on_ask");
    let mut grower = pagewise_testkit::Piped::start(&mut Command::new(&exe));
    let mut idle = pagewise_testkit::Piped::start(&mut Command::new(&exe));
    // Both have answered once: their start-up pages are in.
    assert_eq!(grower.ask("hello"), "?");
    assert_eq!(idle.ask("hello"), "?");
    let mut l = Ledger::new(&[
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/nonexistent/setting",
    ]);
    l.watch(grower.pid());
    l.watch(idle.pid());
    assert_eq!(grower.ask("grow 64"), "grown");
    grower.settle_in_read();
    let g = l.gains();
    assert_eq!((g.ended, g.end.processes), (0, 2), "{g:?}");
    // Every page written, and at most a few of the program's own besides.
    let want = 64 * 1024;
    assert!((want..=want + 256).contains(&g.rss_kib()), "{g:?}");
    assert_eq!(g.anon_huge_kib(), 0, "{g:?}");
    assert_eq!(g.before[1].value, None);
    assert!(g.before[0].value.is_some(), "{g:?}");
    assert!(g.text().contains("+64."), "{}", g.text());
    // Read after its growth, then ended: it counts as last read.
    l.refresh();
    drop(grower);
    let gone = l.gains();
    assert_eq!(gone.ended, 1, "{gone:?}");
    assert_eq!(gone.rss_kib(), g.rss_kib(), "{gone:?} against {g:?}");
    drop(idle);
}

/// Regression: `thp run --pid P` ignored SIGINT for 30-42 s while it
/// measured the page-walk cost at start-up. Now `thp run` and `dedup run`
/// end within a second of SIGINT in each phase: while the walk cost is
/// measured (the signal sent as soon as the command says nothing yet),
/// and while it steps; each time with 130 and nothing left registered.
#[test]
fn agents_end_within_a_second_of_sigint_in_every_phase() {
    use std::io::BufRead;
    if let Some(why) = thp_agent_missing(false) {
        pagewise_testkit::skip!("{why}");
        return;
    }
    // dedup run takes KSM: one at a time with the other tests that do.
    let Some(_ksm) = ksm_agents_one_at_a_time() else {
        return;
    };
    let mut target = Command::new("sleep").arg("120").spawn().unwrap();
    let pid = target.id().to_string();
    let cases: [(&str, &[&str], Option<&str>); 3] = [
        (
            "thp run, measuring the walk cost",
            &["thp", "run", "--pid", &pid],
            Some("measuring"),
        ),
        (
            "thp run, stepping",
            &[
                "thp",
                "run",
                "--json",
                "--pid",
                &pid,
                "--walk-ns",
                "30",
                "--interval-ms",
                "400",
                "--window-ms",
                "100",
            ],
            Some("{"),
        ),
        (
            "dedup run, stepping",
            &[
                "dedup",
                "run",
                "--json",
                "--pid",
                &pid,
                "--interval-ms",
                "400",
                "--window-ms",
                "100",
            ],
            Some("{"),
        ),
    ];
    for (what, args, after) in cases {
        // A step is a JSON line on stdout; the measurement is said on
        // stderr.
        let stepping = word_is_json(after);
        let mut c = Command::new(BIN)
            .args(args)
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let cpid = c.id() as i32;
        let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
        let mut err = std::io::BufReader::new(c.stderr.take().unwrap());
        let mut said = String::new();
        if let Some(word) = after {
            // The phase reached: the command said it is watching.
            loop {
                let l = if stepping {
                    pagewise_testkit::line_within(&mut out, cpid)
                } else {
                    pagewise_testkit::line_within(&mut err, cpid)
                }
                .unwrap_or_default();
                said += &l;
                said += "\n";
                if l.contains(word) || l.is_empty() {
                    break;
                }
            }
            assert!(said.contains(word), "{what}: never said {word:?}: {said}");
        }
        let asked = std::time::Instant::now();
        pagewise_sys::process::kill(cpid, libc::SIGINT).unwrap();
        let st = c.wait().unwrap();
        let took = asked.elapsed();
        let mut rest = String::new();
        for l in err.lines().map_while(|l| l.ok()) {
            rest += &l;
            rest += "\n";
        }
        assert_eq!(st.code(), Some(130), "{what}: {said}{rest}");
        assert!(
            took < std::time::Duration::from_millis(1500),
            "{what}: ended {took:?} after SIGINT: {said}{rest}"
        );
        assert_eq!(
            pagewise_testkit::userfaultfds(target.id() as i32),
            0,
            "{what}"
        );
        println!("ok   {what}: ended {took:?} after SIGINT");
    }
    let _ = target.kill();
    let _ = target.wait();
}

fn word_is_json(w: Option<&str>) -> bool {
    w == Some("{")
}

/// Regression: `thp run --pid` on a program that `mremap`s its 16 MiB
/// buffer over and over made the program's `mremap` fail with `EFAULT`
/// about 1.5 s after it attached: registering a 2 MiB region split the
/// mapping, and the kernel refuses an `mremap` that spans two. Now a
/// mapping is registered whole and only the regions are protected: the
/// program's every `mremap` succeeds and every page reads back what it
/// wrote, and while the agent runs no piece of the buffer appears in its
/// mappings. The buffer is on 2 MiB bounds and then a page off them.
#[test]
fn thp_run_never_splits_a_mapping_its_program_mremaps() {
    let p = pagewise::probe::get();
    if !p.madv_collapse || !p.process_madvise {
        pagewise_testkit::skip!("{} / {}", p.why("madv_collapse"), p.why("process_madvise"));
        return;
    }
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    for mode in ["", "unaligned"] {
        let args = ["thp", "run", "--walk-ns", "30", "--steps", "8"];
        let (said, _) = mremap_loop_under(&args, mode);
        println!("ok   thp run, {mode:9} buffer: {said}");
    }
}

/// Regression: `dedup run --pid` on a program that grows, shrinks and
/// moves a buffer of 16 MiB and a page with `mremap` made 10,099 of its
/// 10,345 `mremap`s fail with `EFAULT`: registering runs of 2 MiB regions
/// for the write watch split the mapping, and so did making one region
/// mergeable. Now the watch registers whole mappings, and a program seen
/// moving or resizing a mapping has its memory made mergeable only as
/// whole mappings (said once): no `mremap` refused, no page wrong, no
/// piece of the buffer in its mappings.
#[test]
fn dedup_run_never_splits_a_mapping_its_program_mremaps() {
    let Some(_ksm) = ksm_agents_one_at_a_time() else {
        return;
    };
    let p = pagewise::probe::get();
    if !p.ksm || pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!("needs KSM ({}) and root to start ksmd", p.why("ksm"));
        return;
    }
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    for mode in ["", "unaligned"] {
        let args = ["dedup", "run", "--full-scan-ms", "200", "--steps", "16"];
        let (said, err) = mremap_loop_under(&args, mode);
        assert_eq!(
            err.matches("whole mappings only for pid").count(),
            1,
            "said once: {err}"
        );
        println!("ok   dedup run, {mode:9} buffer: {said}; whole mappings only, said once");
    }
}

/// Runs `mremap_loop MODE` under the agent `args` (`--pid` and the pace
/// added) to its end, sampling the program's mappings all along; checks
/// that no `mremap` failed, no page read wrong and no piece of the buffer
/// (an anonymous mapping of 2 MiB or more, under 16 MiB) was seen.
/// Returns the program's last line and the agent's error output.
fn mremap_loop_under(args: &[&str], mode: &str) -> (String, String) {
    let mut t = pagewise_testkit::Piped::start(Command::new(c_program("mremap_loop")).arg(mode));
    let pid: i32 = t.line().strip_prefix("ready ").unwrap().parse().unwrap();
    let mut agent = Command::new(BIN)
        .args(args)
        .args(["--pid", &pid.to_string()])
        .args(["--interval-ms", "300", "--window-ms", "100"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut pieces = Vec::new();
    let mut samples = 0;
    while agent.try_wait().unwrap().is_none() {
        let maps = pagewise_mech::procfs::maps(Some(pid)).unwrap();
        samples += 1;
        for m in maps.iter().filter(|m| m.path.is_empty()) {
            let len = m.end - m.start;
            if (2 << 20..16 << 20).contains(&len) {
                pieces.push(format!("{:#x}-{:#x}", m.start, m.end));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = agent.wait_with_output().unwrap();
    let err =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{args:?}: {:?}: {err}", out.status);
    use std::io::Write;
    writeln!(t.input, "end").unwrap();
    let said = t.line();
    let f: Vec<&str> = said.split_whitespace().collect();
    assert_eq!(f.first(), Some(&"mremaps"), "{said}");
    assert_eq!(
        (f[3], f[5]),
        ("0", "0"),
        "{args:?} {mode}: no mremap refused, no page wrong: {said}\n{err}"
    );
    assert!(
        pieces.is_empty(),
        "{args:?} {mode}: pieces of the buffer seen in {samples} samples: {pieces:?}"
    );
    (
        format!("{said}; {samples} samples of its mappings, no piece"),
        err,
    )
}

/// Why `thp run` cannot run here (no `MADV_COLLAPSE` or `process_madvise`,
/// or, with `coverage`, no uffd-wp from outside), or `None`.
fn thp_agent_missing(coverage: bool) -> Option<String> {
    let p = pagewise::probe::get();
    if !p.madv_collapse || !p.process_madvise {
        return Some(format!(
            "{} / {}",
            p.why("madv_collapse"),
            p.why("process_madvise")
        ));
    }
    if coverage {
        if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
            return Some(why.to_string());
        }
    }
    None
}
