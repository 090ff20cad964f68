//! `pagewise snapshot` and `receive` end to end: a running process's
//! known layout stored, inspected and diffed; live migration to a
//! receiver; bad input and failed snapshots leaving no store.

#[macro_use]
mod support;
use support::*;

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

#[test]
fn snapshot_pid_stores_the_known_layout() {
    let dir = temp_dir("snap");
    let when = temp_dir("snap-when");
    let args = known_workload_when(&when);
    let (mut wl, addr, len) = spawn_workload(&args);
    let pid = wl.id().to_string();
    // One snapshot before the workload's writes, one after: the second
    // command adds to the store the first made.
    let snapshot = || {
        let out = Command::new(BIN)
            .args(["snapshot", "--pid", &pid, "--out"])
            .arg(&dir)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out.stdout)
    };
    let mut lines = snapshot();
    written(&mut wl, &when);
    lines.extend(snapshot());
    std::fs::remove_file(&when).unwrap();
    let status = wl.wait().unwrap();
    assert!(
        status.success(),
        "the snapshotted process ran on and exited normally"
    );
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
    let out = ok(Command::new(BIN)
        .args(["snapshot", "diff"])
        .arg(&dir)
        .args(["1", "2", "--json"]));
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
    let when = temp_dir("receive-when");
    let args = known_workload_when(&when);
    let (mut wl, start, len) = spawn_workload(&args);
    written(&mut wl, &when);
    let out = ok(Command::new(BIN)
        .args(["snapshot", "--live", "--json", "--label", "moved", "--pid"])
        .arg(wl.id().to_string())
        .args(["--to", &addr]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["handover_ms"].as_f64().unwrap() >= report["downtime_ms"].as_f64().unwrap());
    let conn = pagewise_testkit::line_within(&mut rx_out, rx.id() as i32).unwrap_or_default();
    let conn: serde_json::Value = serde_json::from_str(&conn).unwrap();
    assert!(conn["broken"].is_null(), "{conn}");
    assert_eq!(conn["saved"][0]["id"], report["save"]["id"]);
    std::fs::remove_file(&when).unwrap();
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
    let broken = pagewise_testkit::line_within(&mut rx_out, rx.id() as i32).unwrap_or_default();
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
    ok(Command::new(BIN)
        .args(["snapshot", "--live", "--json", "--pid"])
        .arg(wl.id().to_string())
        .args(["--to", &addr]));
    let _ = wl.kill();
    let _ = wl.wait();
    // It ends by itself now.
    let st = rx.wait().unwrap();
    assert!(st.success(), "{st:?}");
}

/// Each connection `receive` serves runs on a thread under a seccomp filter
/// of pagewise's own (Receiver::confine_thread); the accepting thread is
/// not under it.
#[test]
fn receive_serves_each_peer_on_a_confined_thread() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let dir = temp_dir("receive-confined");
    let (mut rx, _out, addr) = start_receiver(&dir, &[]);
    let pid = rx.id() as i32;
    // An idle peer: its thread waits for its first byte.
    let peer = std::net::TcpStream::connect(&addr).unwrap();
    // The thread confines itself first thing: until it is seen under the
    // filter, 10 s at most.
    let t0 = std::time::Instant::now();
    loop {
        let mode = thread_seccomp(pid, "pagewise-receiv");
        if mode.as_deref() == Some("2") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the connection's thread (pagewise-receive) was not seen under a filter \
             within 10 s (its Seccomp: {mode:?})"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        thread_seccomp(pid, "pagewise").as_deref(),
        Some("0"),
        "the main thread is not"
    );
    drop(peer);
    let _ = rx.kill();
    let _ = rx.wait();
}
