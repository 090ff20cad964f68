//! The `pagewise` command end to end: real processes, checked against a known
//! layout (the hidden `workload --write-first K` writes exactly the first K
//! pages of a region it prints), and bad input getting one clear line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_pagewise");
const PAGE: u64 = 4096;

fn shim() -> Option<std::path::PathBuf> {
    pagewise_testkit::ensure_preload_shim(BIN).ok()
}

/// The workload with a known layout: after 700 ms it writes exactly the first
/// 300 pages of a 16 MiB region, whose address and length it prints first.
const KNOWN_WORKLOAD: &[&str] = &[
    "workload",
    "--mib",
    "16",
    "--write-first",
    "300",
    "--delay-ms",
    "700",
    "--seconds",
    "3",
];

/// Parses the workload's first line, `0xADDR LEN`.
fn region_line(line: &str) -> (u64, u64) {
    let mut it = line.split_whitespace();
    let addr = u64::from_str_radix(it.next().unwrap().trim_start_matches("0x"), 16).unwrap();
    let len = it.next().unwrap().parse().unwrap();
    (addr, len)
}

/// Pages reported inside `[addr, addr+len)` over all JSON lines, as a set.
fn pages_in(lines: &[serde_json::Value], addr: u64, len: u64) -> std::collections::BTreeSet<u64> {
    let mut s = std::collections::BTreeSet::new();
    for l in lines {
        for r in l["ranges"].as_array().expect("ranges array") {
            let (start, n) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
            for i in 0..n {
                let a = start + i * PAGE;
                if a >= addr && a < addr + len {
                    s.insert((a - addr) / PAGE);
                }
            }
        }
    }
    s
}

/// Starts the hidden workload; returns it with the region it printed.
fn spawn_workload(args: &[&str]) -> (std::process::Child, u64, u64) {
    let mut wl = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(wl.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    let (addr, len) = region_line(&first);
    (wl, addr, len)
}

/// The JSON lines of a command that must have succeeded (else its stderr
/// is the failure).
fn ok_json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&out.stdout)
}

fn json_lines(out: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

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
    let (mut wl, addr, len) = spawn_workload(KNOWN_WORKLOAD);
    let pid = wl.id().to_string();
    let out = Command::new(BIN)
        .args([
            "track",
            "--pid",
            &pid,
            "--backend",
            "hash",
            "--interval",
            "300",
            "--count",
            "6",
            "--json",
        ])
        .output()
        .unwrap();
    let _ = wl.wait();
    let lines = ok_json_lines(&out);
    assert_eq!(lines.len(), 6);
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
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text
        .lines()
        .find(|l| l.starts_with("0x"))
        .expect("workload prints its region");
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

/// A fresh directory name under the temporary directory (removed by the caller).
/// `snapshot --pid` of a 4 MiB workload that writes nothing into `store`;
/// waits for the workload (2 s) to end.
fn snapshot_small_workload(store: &std::path::Path) -> std::process::Output {
    let (mut wl, _, _) = spawn_workload(&[
        "workload",
        "--mib",
        "4",
        "--seconds",
        "2",
        "--pages-per-sec",
        "0",
    ]);
    let out = Command::new(BIN)
        .args(["snapshot", "--pid", &wl.id().to_string(), "--out"])
        .arg(store)
        .output()
        .unwrap();
    let _ = wl.wait();
    out
}

/// Snapshot `id` of `disk` holds the known workload's region `[addr,
/// addr+len)` as it is after `written` of its writes: every page holds 1 at
/// offset 0, the first `written` also 0xA5 at offset 100.
fn assert_known_layout(
    disk: &pagewise::snap::DiskStore,
    id: u64,
    addr: u64,
    len: u64,
    written: u64,
) {
    let s = disk.load(id).unwrap();
    let mut page = vec![0u8; PAGE as usize];
    let mut base = 0u64;
    let mut found = false;
    for r in &s.regions {
        if r.start <= addr && addr + len <= r.start + r.len {
            found = true;
            let i0 = base + (addr - r.start) / PAGE;
            for p in 0..len / PAGE {
                disk.read_page(s.entries[(i0 + p) as usize], &mut page)
                    .unwrap();
                let mut want = vec![0u8; PAGE as usize];
                want[0] = 1;
                if p < written {
                    want[100] = 0xA5;
                }
                assert_eq!(page, want, "snapshot {id}, page {p} of the region");
            }
        }
        base += r.len / PAGE;
    }
    assert!(found, "snapshot {id} holds the workload's region");
}

/// Compiles the C program `tests/c/NAME.c` into `dir`.
fn c_program(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let exe = dir.join(name);
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let st = Command::new("cc")
        .args(["-O", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(st.success(), "compiling {}", src.display());
    exe
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pagewise-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

#[test]
fn snapshot_pid_stores_the_known_layout() {
    let dir = temp_dir("snap");
    let (mut wl, addr, len) = spawn_workload(KNOWN_WORKLOAD);
    let pid = wl.id().to_string();
    // One snapshot before the workload's writes (at 700 ms), one after.
    let out = Command::new(BIN)
        .args(["snapshot", "--pid", &pid, "--out"])
        .arg(&dir)
        .args(["--every", "1300", "--count", "2", "--json"])
        .output()
        .unwrap();
    let status = wl.wait().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        status.success(),
        "the snapshotted process ran on and exited normally"
    );
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 2);
    assert!(
        lines[1]["save"]["pages_new"].as_u64().unwrap()
            < lines[0]["save"]["pages_new"].as_u64().unwrap()
    );

    // Ground truth from the store itself: every page of the region holds 1 at
    // offset 0; after the writes the first 300 also hold 0xA5 at offset 100.
    let disk = pagewise::snap::DiskStore::open(&dir).unwrap();
    for (id, written) in [(1u64, 0u64), (2, 300)] {
        assert_known_layout(&disk, id, addr, len, written);
    }

    // diff: exactly the 300 written pages inside the region.
    let out = Command::new(BIN)
        .args(["snapshot", "diff"])
        .arg(&dir)
        .args(["1", "2", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got = pages_in(&[v], addr, len);
    assert_eq!(
        got,
        (0..300).collect(),
        "diff names exactly the written pages"
    );

    // inspect --json has the documented fields, with the exact counts.
    let out = Command::new(BIN)
        .args(["snapshot", "inspect"])
        .arg(&dir)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["snapshots"], 2);
    for k in [
        "unique_pages",
        "zero_pages",
        "referenced_pages",
        "bytes_on_disk",
    ] {
        assert!(v[k].is_u64(), "inspect lacks {k}: {v}");
    }
    let pages: u64 = v["snapshot_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pages"].as_u64().unwrap())
        .sum();
    assert_eq!(
        pages,
        v["referenced_pages"].as_u64().unwrap() + v["zero_pages"].as_u64().unwrap()
    );
    // A person's view too.
    let out = Command::new(BIN)
        .args(["snapshot", "inspect"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("dedup ratio"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn snapshot_bad_input_gets_one_clear_line() {
    let dir = temp_dir("snapbad");
    let check = |args: &[&str], want: &str| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    };
    let d = dir.to_str().unwrap();
    check(
        &["snapshot", "--pid", "999999999", "--out", d],
        "no process with pid 999999999",
    );
    check(&["snapshot", "--pid", "1"], "--out");
    // A directory that is not a store.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    check(
        &["snapshot", "inspect", d],
        "is not a pagewise snapshot store",
    );
    check(
        &["snapshot", "--pid", "1", "--out", d],
        "is not a pagewise snapshot store",
    );
    // A corrupt store: a snapshot index with a flipped byte.
    let store = temp_dir("snapcorrupt");
    let out = snapshot_small_workload(&store);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let idx = store.join("snap-0000000001.idx");
    let mut bytes = std::fs::read(&idx).unwrap();
    bytes[60] ^= 0x40;
    std::fs::write(&idx, bytes).unwrap();
    let s = store.to_str().unwrap();
    check(&["snapshot", "inspect", s], "corrupt");
    check(&["snapshot", "diff", s, "1", "1"], "corrupt");
    check(&["snapshot", "diff", s, "7", "8"], "no snapshot 7");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&store);
}

/// Regression: a `snapshot --pid` that failed left an empty store behind.
#[test]
fn failed_snapshot_leaves_no_store() {
    let dir = temp_dir("snapfailed").join("store");
    // A kernel thread: there is no user memory to snapshot.
    let out = Command::new(BIN)
        .args(["snapshot", "--pid", "2", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "snapshot of a kernel thread succeeded"
    );
    assert!(!dir.exists(), "{} was left behind", dir.display());
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
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
    let mut first = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
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

/// Regression: `snapshot inspect` counted zero pages as references in its
/// line and not in its JSON. Both now count references to stored pages
/// (non-zero entries) and zero pages apart, and agree.
#[test]
fn snapshot_inspect_line_and_json_agree() {
    let store = temp_dir("inspectagree");
    let out = snapshot_small_workload(&store);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let human = Command::new(BIN)
        .args(["snapshot", "inspect"])
        .arg(&store)
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout).into_owned();
    let json = Command::new(BIN)
        .args(["snapshot", "inspect", "--json"])
        .arg(&store)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let last = human.lines().last().unwrap();
    let want = format!(
        "{} references to stored pages and {} zero pages",
        v["referenced_pages"], v["zero_pages"]
    );
    assert!(last.contains(&want), "{last:?} against {want:?}");
    assert!(
        v["zero_pages"].as_u64().unwrap() > 0 && v["referenced_pages"].as_u64().unwrap() > 0,
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&store);
}

/// `snapshot --live --to` a `receive` on loopback: the receiver's store
/// holds the known layout exactly (every page of the region holds 1 at
/// offset 0, the first 300 also 0xA5 at offset 100); `receive` reports the
/// connection in JSON and ends cleanly on SIGTERM, its store intact.
#[test]
fn live_migration_to_a_receiver_stores_the_known_layout() {
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = temp_dir("receive");
    let (mut rx, mut rx_out, addr) = start_receiver(&dir, &[]);
    let (mut wl, start, len) = spawn_workload(KNOWN_WORKLOAD);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let out = Command::new(BIN)
        .args(["snapshot", "--live", "--json", "--label", "moved", "--pid"])
        .arg(wl.id().to_string())
        .args(["--to", &addr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["handover_ms"].as_f64().unwrap() >= report["downtime_ms"].as_f64().unwrap());
    let mut conn = String::new();
    rx_out.read_line(&mut conn).unwrap();
    let conn: serde_json::Value = serde_json::from_str(&conn).unwrap();
    assert!(conn["broken"].is_null(), "{conn}");
    assert_eq!(conn["saved"][0]["id"], report["save"]["id"]);
    assert!(wl.wait().unwrap().success());
    // SIGTERM: the receiver ends, status 0.
    pagewise_sys::process::kill(rx.id() as i32, libc::SIGTERM).unwrap();
    let st = rx.wait().unwrap();
    assert!(st.success(), "receive ended with {st}");
    let disk = pagewise::snap::DiskStore::open(&dir).unwrap();
    let ids = disk.ids().unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(disk.load(ids[0]).unwrap().label, "moved");
    assert_known_layout(&disk, ids[0], start, len, 300);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `thp run` on a running workload: JSON steps whose promotions add up to
/// the total budget (each region then mapped by a huge page), the metrics
/// file saying the same; without `--steps` it ends on SIGTERM with status 0
/// and leaves no range registered in the process.
#[test]
fn thp_run_promotes_within_the_budget_and_ends_on_sigterm() {
    let p = pagewise::probe::get();
    if !p.madv_collapse || !p.process_madvise {
        pagewise_testkit::skip!("{} / {}", p.why("madv_collapse"), p.why("process_madvise"));
        return;
    }
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
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
    let steps = ok_json_lines(&out);
    assert_eq!(steps.len(), 2);
    let mut promoted = Vec::new();
    for s in &steps {
        for a in s["actions"].as_array().unwrap() {
            match a["action"].as_str().unwrap() {
                "promoted" => promoted.push(a["start"].as_u64().unwrap()),
                "failed" => {
                    pagewise_testkit::not_happened!("the kernel refused a collapse: {a}");
                    let _ = wl.kill();
                    return;
                }
                _ => {}
            }
        }
    }
    assert_eq!(promoted.len(), 3, "{steps:?}");
    let mut w = pagewise::mech::walk::PageWalker::new(Some(wl.id() as i32)).unwrap();
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
    assert!(st.success(), "thp run ended with {st}: {text}");
    assert!(text.contains("steps:"), "{text}");
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
    let exe = c_program(&dir, "prezero_grow");
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
    let pre = resident(
        &Command::new(BIN)
            .args(["thp", "prezero", "--ahead", "3", "--"])
            .arg(&exe)
            .output()
            .unwrap(),
    );
    if plain != 1 {
        pagewise_testkit::skip!("without pagewise {plain} regions were resident (THP `always` with khugepaged?): nothing to compare");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    assert_eq!(pre, 4, "the first region and 3 ahead");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dedup run -- CMD` on a self-checking program with eight huge pages (four
/// cold and identical, two hot, two cold and unique): the program's advice
/// is made by its shim (it is never stopped), exactly the four cold
/// identical ones are split and merged, KSM shares their pages, the
/// program's output is that of a run without pagewise, the tool's exit
/// status is the program's, and KSM's settings are as before.
#[test]
fn dedup_run_merges_cold_duplicates_and_changes_no_output() {
    let _ksm = ksm_agents_one_at_a_time();
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
    let exe = c_program(&dir, "dedup_target");
    let plain = Command::new(&exe).arg("1").output().unwrap();
    assert!(plain.status.success());
    if !String::from_utf8_lossy(&plain.stderr).contains("huge 1") {
        pagewise_testkit::not_happened!(
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
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let program: Vec<&str> = text.lines().filter(|l| !l.starts_with('{')).collect();
    assert_eq!(
        program,
        String::from_utf8_lossy(&plain.stdout)
            .lines()
            .collect::<Vec<_>>(),
        "the program's output changed"
    );
    let watching: serde_json::Value = text
        .lines()
        .find(|l| l.starts_with("{\"policy\"") || l.starts_with("{\"watching\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("the line saying what is watched");
    assert_eq!(
        watching["watching"][0]["inside"], "shim",
        "the program's advice not made by its shim: {watching}"
    );
    let steps: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with("{\"t_ms\""))
        .map(|l| serde_json::from_str(l).unwrap())
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
    if sharing < 2048 {
        pagewise_testkit::not_happened!(
            "ksmd merged {sharing} of the program's 2048 identical pages within the run's steps"
        );
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
    let _ksm = ksm_agents_one_at_a_time();
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
    let journal = pagewise::mech::settings::journal_dir().join("%sys%kernel%mm%ksm%run");
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
/// `dedup run` take turns.
fn ksm_agents_one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
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

/// `receive` beyond loopback needs a key; with `--once` it ends after the
/// first complete migration, not after a first connection that breaks off.
#[test]
fn receive_needs_a_key_beyond_loopback_and_once_waits_for_a_complete_migration() {
    let dir = temp_dir("receive-once");
    let out = Command::new(BIN)
        .args(["receive", "--listen", "0.0.0.0:0", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--key"), "{err}");
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let (mut rx, mut rx_out, addr) = start_receiver(&dir, &["--once"]);
    // A connection that breaks off at once.
    drop(std::net::TcpStream::connect(&addr).unwrap());
    let mut broken = String::new();
    rx_out.read_line(&mut broken).unwrap();
    assert!(broken.contains("broken"), "{broken}");
    assert!(
        rx.try_wait().unwrap().is_none() || {
            // It may not have looked yet; give it the time to say it ended.
            std::thread::sleep(std::time::Duration::from_millis(200));
            rx.try_wait().unwrap().is_none()
        },
        "receive --once ended after a broken connection"
    );
    let (mut wl, _, _) = spawn_workload(KNOWN_WORKLOAD);
    let out = Command::new(BIN)
        .args(["snapshot", "--live", "--json", "--pid"])
        .arg(wl.id().to_string())
        .args(["--to", &addr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = wl.kill();
    let _ = wl.wait();
    // It ends by itself now.
    let st = rx.wait().unwrap();
    assert!(st.success(), "{st:?}");
}

/// `receive --json` on a free loopback port saving into `dir`, with
/// `extra` flags: the process, its output after the first line, and the
/// address it listens on.
fn start_receiver(
    dir: &std::path::Path,
    extra: &[&str],
) -> (
    std::process::Child,
    BufReader<std::process::ChildStdout>,
    String,
) {
    let mut rx = Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--json"])
        .args(extra)
        .arg("--out")
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(rx.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    let addr = v["listening"].as_str().unwrap().to_string();
    (rx, out, addr)
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
    let _ksm = ksm_agents_one_at_a_time();
    let dir = temp_dir("dedup-advice");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = c_program(&dir, "dedup_target");
    let mut target = Command::new(&exe)
        .arg("60")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(target.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    if !first.contains("huge 1") {
        pagewise_testkit::not_happened!("the program's regions could not be made huge: {first}");
        let _ = target.kill();
        let _ = target.wait();
        return;
    }
    let pid = target.id() as i32;
    let mergeable = || pagewise::mech::procfs::with_vm_flag(Some(pid), &["mg"]).unwrap();
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
            pagewise_testkit::not_happened!("the agent made nothing mergeable in 30 s");
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
