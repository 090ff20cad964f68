//! pagewise's commands, run on the host as root, against programs in podman
//! containers started with the runtime's defaults (the seccomp profile
//! `/usr/share/containers/seccomp.json`, which refuses `userfaultfd`; no
//! CAP_SYS_PTRACE): each does what it does on a bare process, none refused
//! and none falling back; afterwards the program's filter count is the same
//! and it holds no userfaultfd; the program's own checks pass. And
//! `farmem run` inside such a container names the filter as the cause of
//! its refusal, not `vm.unprivileged_userfaultfd`.

#[macro_use]
mod support;
use pagewise_testkit::container::{podman_missing, podman_run, Container, Removed};
use support::*;

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The seccomp filters and userfaultfds process `pid` holds.
fn filters_and_ufds(pid: i32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let n = pagewise_mech::procfs::status_field(&status, "Seccomp_filters").unwrap();
    (n, pagewise_testkit::userfaultfds(pid))
}

fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn track_snapshot_restore_and_thp_act_on_a_default_container() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = rollback_target() else {
        return;
    };
    let dir = path.parent().unwrap();
    let program = path.file_name().unwrap().to_str().unwrap();
    // As root inside, and as a user without privileges (what most images
    // run as): the same commands, the same results.
    for user in [None, Some("1000:1000")] {
        let more: Vec<String> = user
            .map(|u| vec!["--user".to_string(), u.to_string()])
            .unwrap_or_default();
        let mut c = Container::start_with(tmp(), dir, program, &[], &more);
        let status = std::fs::read_to_string(format!("/proc/{}/status", c.pid)).unwrap();
        let uid = pagewise_mech::procfs::status_field(&status, "Uid").unwrap();
        assert_eq!(uid, if user.is_some() { 1000 } else { 0 }, "its user");
        println!("---- the program in a default container as uid {uid}");
        every_command_acts_on(&mut c);
    }
}

/// track, snapshot (once, --every-ms, --live), restore in full and thp run
/// on the program of container `c`, each as on a bare process; its
/// filters as they were and no userfaultfd left after them, its own check
/// passing.
fn every_command_acts_on(c: &mut Container) {
    let pid = c.pid.to_string();
    let (filters, _) = filters_and_ufds(c.pid);
    assert!(
        filters >= 1,
        "the container's program runs under the profile"
    );

    // track: uffd-wp, not the hash fallback.
    let out = Command::new(BIN)
        .args([
            "track",
            "--pid",
            &pid,
            "--json",
            "--interval-ms",
            "200",
            "--count",
            "2",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "track: {err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "track: {lines:?}");
    for l in &lines {
        assert_eq!(l["backend"], "uffd-wp", "track fell back: {l} {err}");
    }
    println!("ok   track --pid: uffd-wp");

    // snapshot, then snapshot restore in full (layout and registers).
    let store = temp_dir("container-store");
    c.p.ask("w 16 1");
    pagewise_testkit::settle_in_read(c.pid);
    let out = Command::new(BIN)
        .args(["snapshot", "--pid", &pid, "--out"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "snapshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = c.p.ask("c");
    c.p.ask("m");
    c.p.ask("w 40 9");
    pagewise_testkit::settle_in_read(c.pid);
    let out = Command::new(BIN)
        .args(["snapshot", "restore", "--pid", &pid, "--json"])
        .arg(&store)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "snapshot restore: {err}");
    let r = &json_lines(&out)[0]["restored"]["report"];
    // Registers put back (one thread), the mapping made since unmapped
    // inside the program, no thread's memory left alone (not memory-only).
    assert_eq!(r["threads"], 1, "a full restore: {r}");
    assert!(r["layout_calls"].as_u64() >= Some(1), "{r}");
    assert_eq!(r["thread_areas"], serde_json::json!([]), "{r}");
    assert_eq!(c.p.ask("c"), first, "the same answer, registers checked");
    println!("ok   snapshot --pid, snapshot restore: in full");

    // Periodic and live snapshots (tracked between takes).
    for (what, args) in [
        ("--every-ms", &["--every-ms", "100", "--count", "3"][..]),
        ("--live", &["--live"][..]),
    ] {
        let store = temp_dir("container-more");
        let out = Command::new(BIN)
            .args(["snapshot", "--pid", &pid, "--json"])
            .args(args)
            .arg("--out")
            .arg(&store)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "snapshot {what}: {err}");
        assert!(!err.contains("seccomp"), "snapshot {what}: {err}");
        assert!(!json_lines(&out).is_empty(), "snapshot {what}");
        let _ = std::fs::remove_dir_all(&store);
        println!("ok   snapshot --pid {what}");
    }

    // Live migration: pre-copied while it runs, to a receiver on loopback.
    let dir = temp_dir("container-receive");
    let (mut rx, mut rx_out, addr) = start_receiver(&dir, &["--once"]);
    let out = Command::new(BIN)
        .args(["snapshot", "--live", "--json", "--pid", &pid, "--to", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "snapshot --live --to: {err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let conn = pagewise_testkit::line_within(&mut rx_out, rx.id() as i32).unwrap_or_default();
    let conn: serde_json::Value = serde_json::from_str(&conn).unwrap();
    assert_eq!(conn["saved"][0]["id"], report["save"]["id"], "{conn}");
    assert!(rx.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
    println!("ok   snapshot --pid --live --to: received");

    // thp run: coverage measured (nothing written: nothing promoted).
    let out = Command::new(BIN)
        .args(["thp", "run", "--pid", &pid, "--steps", "2", "--json"])
        .args(["--interval-ms", "300", "--window-ms", "100"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "thp run: {err}");
    for l in json_lines(&out) {
        for a in l["actions"].as_array().into_iter().flatten() {
            assert_ne!(a["action"], "no-coverage", "thp run without coverage: {a}");
        }
        for p in l["processes"].as_array().into_iter().flatten() {
            assert_eq!(p["promoted"], 0, "an idle program promoted: {l}");
        }
    }
    println!("ok   thp run --pid: coverage measured");

    assert_eq!(
        filters_and_ufds(c.pid),
        (filters, 0),
        "filters as they were, no userfaultfd left"
    );
    assert!(c.p.ask("w 3 3").contains("bad=0"));
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn dedup_merges_a_default_container_from_the_host() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let exe = c_program("dedup_target");
    let native = Command::new(&exe).arg("6").output().unwrap();
    assert!(native.status.success());
    let dir = exe.parent().unwrap();
    let name = format!("pagewise-test-{}-dedup", std::process::id());
    let mut run = podman_run(tmp(), &name, dir, &[], "/t/dedup_target", &["6"]);
    let child = run
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _gone = Removed(name.clone());
    // The container's program, once it runs.
    let mut pid = 0;
    for _ in 0..100 {
        let out = Command::new("podman")
            .args(["inspect", "--format", "{{.State.Pid}}", &name])
            .output()
            .unwrap();
        pid = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0);
        if pid > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(pid > 0, "the container never ran");
    let (filters, _) = filters_and_ufds(pid);
    let out = Command::new(BIN)
        .args([
            "dedup",
            "run",
            "--pid",
            &pid.to_string(),
            "--json",
            "--steps",
            "6",
        ])
        .args(["--interval-ms", "400", "--window-ms", "150"])
        .args(["--thresholds", "0,2,0.5", "--full-scan-ms", "300"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dedup run: {err}");
    let lines = json_lines(&out);
    assert_eq!(lines[0]["watching"][0]["inside"], "ptrace", "{}", lines[0]);
    let merged: usize = lines
        .iter()
        .flat_map(|s| s["actions"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["action"] == "merge")
        .count();
    assert!(
        merged >= 4,
        "the four cold identical regions made mergeable: {lines:?} {err}"
    );
    assert!(!err.contains("seccomp"), "a refusal: {err}");
    // Each step names the process by its host pid, its pid inside and its
    // container, with what the agent made mergeable of it.
    let last = lines
        .iter()
        .rev()
        .find_map(|l| l["processes"].as_array().and_then(|p| p.first()))
        .unwrap_or_else(|| panic!("no step names its processes: {lines:?}"));
    assert_eq!(last["pid"], pid, "{last}");
    assert!(
        last["ns_pid"].as_i64().is_some_and(|n| n != pid as i64),
        "{last}"
    );
    assert_eq!(last["container"]["runtime"], "podman", "{last}");
    assert!(last["mergeable"].as_u64() >= Some(4), "{last}");
    assert_eq!(
        filters_and_ufds(pid),
        (filters, 0),
        "filters as they were, no userfaultfd left"
    );
    let done = child.wait_with_output().unwrap();
    assert!(done.status.success());
    assert_eq!(
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&native.stdout),
        "the program's own check, in the container under the agent and natively"
    );
    println!("ok   dedup run --pid: {merged} regions made mergeable from outside");
}

#[test]
fn farmem_run_in_a_default_container_names_the_filter() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let bin = Path::new(BIN);
    let name = format!("pagewise-test-{}-farmem", std::process::id());
    let _gone = Removed(name.clone());
    let out = podman_run(
        tmp(),
        &name,
        bin.parent().unwrap(),
        &[("PAGEWISE_FARMEM_DIR", "/tmp/farmem")],
        "/t/pagewise",
        &["farmem", "run", "--local-pages", "64", "--", "/bin/true"],
    )
    .stdin(std::process::Stdio::null())
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "farmem run in a default container: {err}"
    );
    assert!(err.contains("seccomp filter"), "the cause named: {err}");
    assert!(
        !err.contains("unprivileged_userfaultfd"),
        "a wrong cause named: {err}"
    );
}

/// A pagewise that runs under a seccomp filter itself may neither suspend
/// nor read a target's filters: `--backend uffd-wp` is refused with that
/// reason, and `auto` falls back to `hash` saying it.
#[test]
fn a_filtered_tracer_says_why_it_cannot_step_around_a_filter() {
    need_support!();
    let Some(path) = rollback_target() else {
        return;
    };
    // A filter that refuses nothing (an empty list): pagewise under one.
    let wrap = c_program("refuse_calls");
    let mut t = pagewise_testkit::Piped::start(Command::new(&path).args(["seccomp", "errno"]));
    assert!(t.line().starts_with("ready"));
    let pid = t.pid().to_string();
    let track = |backend: &str| {
        Command::new(&wrap)
            .args(["", BIN])
            .args([
                "track",
                "--pid",
                &pid,
                "--json",
                "--count",
                "1",
                "--interval-ms",
                "100",
            ])
            .args(["--backend", backend])
            .output()
            .unwrap()
    };
    let out = track("uffd-wp");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("seccomp") && err.contains("pagewise runs under a seccomp filter itself"),
        "{err}"
    );
    let out = track("auto");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(json_lines(&out)[0]["backend"], "hash", "{err}");
    assert!(
        err.contains("pagewise runs under a seccomp filter itself"),
        "{err}"
    );
    assert!(t.ask("w 3 3").contains("bad=0"));
}

/// A container of three processes selected whole: by name, by an id
/// prefix and by its cgroup (the kernel's path, and the directory of the
/// memory hierarchy), every process found once, each named by its host pid
/// and its pid inside; a name no container has is bad input.
#[test]
fn a_container_is_selected_whole_by_name_id_or_cgroup() {
    need_support!();
    let Some((name, _gone, _p)) = shell("group", "sleep 60 & sleep 60 & echo ready; wait") else {
        return;
    };
    let out = Command::new("podman")
        .args(["inspect", "--format", "{{.Id}} {{.State.Pid}}", &name])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (id, init) = text.trim().split_once(' ').unwrap();
    let init: i32 = init.parse().unwrap();
    // The shell and its two sleeps: the shell's children on the host.
    let mut want = vec![init];
    for _ in 0..100 {
        want = vec![init];
        want.extend(
            std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .map(|c| c.parse::<i32>().unwrap()),
        );
        if want.len() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    want.sort();
    assert_eq!(want.len(), 3, "the shell and its two sleeps: {want:?}");
    let kernel_path = format!("/libpod_parent/libpod-{id}");
    let mut selectors = vec![
        vec!["--container".to_string(), name.clone()],
        vec!["--container".to_string(), id[..12].to_string()],
    ];
    let own = std::fs::read_to_string(format!("/proc/{init}/cgroup")).unwrap();
    if own.contains(&kernel_path) {
        selectors.push(vec!["--cgroup".to_string(), kernel_path.clone()]);
        if Path::new("/sys/fs/cgroup/memory")
            .join(&kernel_path[1..])
            .is_dir()
        {
            selectors.push(vec![
                "--cgroup".to_string(),
                format!("/sys/fs/cgroup/memory{kernel_path}"),
            ]);
        }
    }
    for sel in &selectors {
        let out = Command::new(BIN)
            .args(["inspect", "--json"])
            .args(sel)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{sel:?}: {err}");
        let mut pids: Vec<i32> = json_lines(&out)[0]["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap() as i32)
            .collect();
        pids.sort();
        assert_eq!(pids, want, "{sel:?}: {err}");
        assert!(
            err.contains(&format!("{init} (1 inside)")),
            "{sel:?}: {err}"
        );
        println!("ok   inspect {}", sel.join(" "));
    }
    let out = Command::new(BIN)
        .args(["inspect", "--container", "no-such-container-anywhere"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An agent given a container follows its processes as they come: one
/// started 4 s after the container (after the agent's start) is watched
/// from the next step on.
#[test]
fn an_agent_follows_a_containers_new_processes() {
    need_support!();
    let Some((name, _gone, mut p)) = shell(
        "follow",
        "echo ready; sleep 4; sleep 30 & echo started; wait",
    ) else {
        return;
    };
    let prom = temp_dir("follow-metrics");
    let out = Command::new(BIN)
        .args([
            "thp",
            "run",
            "--container",
            &name,
            "--json",
            "--steps",
            "16",
        ])
        .args(["--interval-ms", "400", "--window-ms", "100", "--metrics"])
        .arg(&prom)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(p.line(), "started");
    let followed: Vec<i32> = err
        .lines()
        .filter_map(|l| l.strip_prefix("pagewise: following pid "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    // The process started later: the shell's child now.
    let out2 = Command::new("podman")
        .args(["inspect", "--format", "{{.State.Pid}}", &name])
        .output()
        .unwrap();
    let init: i32 = String::from_utf8_lossy(&out2.stdout)
        .trim()
        .parse()
        .unwrap();
    let later: i32 = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .unwrap()
        .split_whitespace()
        .next()
        .expect("the shell's child")
        .parse()
        .unwrap();
    assert!(followed.contains(&later), "{later} followed: {err}");
    let lines = json_lines(&out);
    let watched_later = lines.iter().any(|l| {
        l["processes"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["pid"] == later))
    });
    assert!(
        watched_later,
        "the new process is in a later step: {lines:?}"
    );
    // Each process named by its pid inside and its container, in the
    // steps and in the metrics' labels.
    let id = String::from_utf8_lossy(
        &ok(Command::new("podman").args(["inspect", "--format", "{{.Id}}", &name])).stdout,
    )
    .trim()
    .to_string();
    // Every step (the last line says what was gained).
    for l in lines.iter().filter(|l| l.get("t_ms").is_some()) {
        for p in l["processes"].as_array().unwrap() {
            assert_eq!(p["container"]["id"], id.as_str(), "{p}");
            assert_eq!(p["container"]["runtime"], "podman", "{p}");
        }
    }
    let text = std::fs::read_to_string(&prom).unwrap();
    let inside = pagewise_testkit::host::ns_pid(later).unwrap();
    let series = format!(
        "pagewise_thp_promoted_bytes{{pid=\"{later}\",ns_pid=\"{inside}\",container=\"{name}\",container_id=\"podman://{id}\"}}",
    );
    assert!(text.contains(&series), "{series} in {text}");
    assert!(
        text.contains("# TYPE pagewise_thp_promoted_bytes gauge"),
        "{text}"
    );
    let _ = std::fs::remove_file(&prom);
}

/// `track --container` follows the container's processes as they come:
/// one started a second after tracking began has lines of its own, named
/// by its pid inside, from the collection after it appeared.
#[test]
fn track_follows_a_containers_new_processes() {
    need_support!();
    let Some((name, _gone, mut p)) = shell(
        "track-follow",
        "echo ready; sleep 1; sleep 30 & echo started; wait",
    ) else {
        return;
    };
    let out = Command::new(BIN)
        .args(["track", "--container", &name, "--json"])
        .args(["--interval-ms", "300", "--count", "8"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(p.line(), "started");
    let lines = json_lines(&out);
    let first: Vec<i64> = lines
        .iter()
        .filter(|l| l["t_ms"].as_u64().unwrap() < 400)
        .map(|l| l["pid"].as_i64().unwrap())
        .collect();
    let later: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| !first.contains(&l["pid"].as_i64().unwrap()))
        .collect();
    assert!(
        !later.is_empty(),
        "no line of a later process: {lines:?} {err}"
    );
    let pid = later[0]["pid"].as_i64().unwrap();
    assert!(later[0]["ns_pid"].as_i64().unwrap() > 1, "{}", later[0]);
    assert!(
        err.contains(&format!("following pid {pid} (")),
        "the new process said: {err}"
    );
    println!(
        "ok   track --container followed pid {pid} ({} lines of it)",
        later.len()
    );
}

/// A container named after `tag` running the shell `script`, which says
/// `ready` first; `None` (a skip said) without podman.
fn shell(tag: &str, script: &str) -> Option<(String, Removed, pagewise_testkit::Piped)> {
    pagewise_testkit::container::shell(tmp(), tag, script)
}
