//! `pagewise page-server` against CRIU itself (v4.2, built by
//! `scripts/setup.sh`): `criu dump --page-server` sends a running
//! process's pages to it, twice, with the process changing a known set of
//! pages between the dumps. Ground truth is the process's memory, read
//! from /proc/PID/mem while it waits: every page stored is the page at its
//! address, both known regions are stored whole, and the second dump adds
//! exactly the pages that changed.

mod support;

use pagewise::snap::DiskStore;
use pagewise::PAGE_SIZE;
use std::io::BufReader;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use support::*;

/// The target's known regions, from its "ready" line.
struct Target {
    child: std::process::Child,
    out: std::path::PathBuf,
    pid: i32,
    a: (u64, u64),
    b: (u64, u64),
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child killed if the test ends first (its error stream is the test's:
/// left running, it would hold `cargo test` open).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the target in a session of its own with its streams on files,
/// as CRIU wants a process it dumps without `--shell-job`.
fn start_target(dir: &std::path::Path) -> Target {
    let prog = c_program("criu_target");
    let out = dir.join("target.out");
    let file = std::fs::File::create(&out).unwrap();
    let child = Command::new("setsid")
        .arg(prog)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    pagewise_testkit::wait_in_file(&out, "ready", 1, || {});
    let text = std::fs::read_to_string(&out).unwrap();
    let w: Vec<u64> = text
        .split_whitespace()
        .skip(1)
        .take(5)
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(w[0], u64::from(child.id()), "setsid ran the target itself");
    Target {
        child,
        out,
        pid: w[0] as i32,
        a: (w[1], w[2]),
        b: (w[3], w[4]),
    }
}

/// `criu dump` of `pid` into the page server at `port`, leaving it running.
fn dump(criu: &std::path::Path, pid: i32, images: &std::path::Path, port: &str) {
    std::fs::create_dir_all(images).unwrap();
    let st = Command::new(criu)
        .args([
            "dump",
            "-t",
            &pid.to_string(),
            "--leave-running",
            "--page-server",
        ])
        .args([
            "--address",
            "127.0.0.1",
            "--port",
            port,
            "-v4",
            "-o",
            "dump.log",
            "-D",
        ])
        .arg(images)
        .status()
        .unwrap();
    let log = std::fs::read_to_string(images.join("dump.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    assert!(st.success(), "criu dump: {st}; its log ends: {tail:#?}");
}

/// Every page of snapshot `id` against the process's memory now: the
/// pages that differ (address), and the addresses stored.
fn against_memory(store: &DiskStore, id: u64, pid: i32) -> (Vec<u64>, Vec<(u64, u64)>) {
    let snap = store.load(id).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let (mut stored, mut live) = (vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]);
    let mut differ = Vec::new();
    let mut at = Vec::new();
    for i in 0..snap.pages() {
        let addr = snap.address_of(i).unwrap();
        store
            .read_page(snap.entries[i as usize], &mut stored)
            .unwrap();
        mem.read_exact_at(&mut live, addr).unwrap();
        if stored != live {
            differ.push(addr);
        }
        at.push((addr, snap.entries[i as usize]));
    }
    (differ, at)
}

/// Sends signal `sig` (its name) to `pid`; a SIGSTOP is waited for
/// (10 s at most) until the process is stopped, not only sent.
fn signal(pid: i32, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
    if sig == "STOP" {
        let t0 = std::time::Instant::now();
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(") ").map_or("", |(_, r)| r);
            after.chars().next().unwrap_or('?')
        };
        while state() != 'T' {
            assert!(
                t0.elapsed().as_secs() < 10,
                "process {pid} not stopped 10 s after SIGSTOP (state {})",
                state()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// The lines of /proc/PID/maps holding `addrs`.
fn mappings_of(pid: i32, addrs: &[u64]) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter(|l| {
            let r = l.split_whitespace().next().unwrap_or("");
            let (s, e) = r.split_once('-').unwrap_or(("0", "0"));
            let (s, e) = (
                u64::from_str_radix(s, 16).unwrap_or(0),
                u64::from_str_radix(e, 16).unwrap_or(0),
            );
            addrs.iter().any(|&a| s <= a && a < e)
        })
        .map(str::to_string)
        .collect()
}

fn covers(at: &[(u64, u64)], (start, len): (u64, u64)) -> bool {
    (start..start + len)
        .step_by(PAGE_SIZE)
        .all(|p| at.iter().any(|&(a, _)| a == p))
}

#[test]
fn criu_dumps_into_the_page_server_page_for_page() {
    let criu = match pagewise_testkit::criu::criu4() {
        Ok(c) => c,
        Err(why) => return pagewise_testkit::skip!("{why}"),
    };
    let dir = temp_dir("criu");
    std::fs::create_dir_all(&dir).unwrap();
    let store_dir = dir.join("store");
    let mut ps = Reaped(
        Command::new(BIN)
            .args([
                "page-server",
                "--listen",
                "127.0.0.1:0",
                "--json",
                "--store",
            ])
            .arg(&store_dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(ps.0.stdout.take().unwrap());
    let first = pagewise_testkit::line_within(&mut out, ps.0.id() as i32).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    let port = v["listening"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let t = start_target(&dir);

    // The first dump: every page stored is the page at its address. The
    // target is stopped (SIGSTOP) for each dump and its comparison: a
    // running one writes its own thread block as it goes on waiting.
    signal(t.pid, "STOP");
    dump(&criu, t.pid, &dir.join("img-1"), &port);
    let line = pagewise_testkit::line_within(&mut out, ps.0.id() as i32).unwrap_or_default();
    let got: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(got["broken"], serde_json::Value::Null, "{got}");
    assert_eq!(got["closed"], true);
    assert_eq!(got["dialect"], "v42");
    let task = got["pagemaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "task" && p["id"] == t.pid)
        .unwrap_or_else(|| panic!("no pagemap of task {}: {got}", t.pid))
        .clone();
    let first_snap = task["snapshot"].as_u64().unwrap();
    let store = DiskStore::open(&store_dir).unwrap();
    let (differ, at1) = against_memory(&store, first_snap, t.pid);
    assert!(
        differ.is_empty(),
        "pages stored unlike the process's: {differ:x?} in {:#?}",
        mappings_of(t.pid, &differ)
    );
    assert!(
        covers(&at1, t.a) && covers(&at1, t.b),
        "both known regions stored whole"
    );
    assert_eq!(task["present_pages"], at1.len());
    drop(store);

    // The process changes every 100th page of A; the second dump adds
    // exactly those pages to the store among A's.
    signal(t.pid, "CONT");
    signal(t.pid, "USR1");
    pagewise_testkit::wait_in_file(&t.out, "changed", 1, || {});
    signal(t.pid, "STOP");
    let changed = (t.a.1 / PAGE_SIZE as u64).div_ceil(100);
    dump(&criu, t.pid, &dir.join("img-2"), &port);
    let line = pagewise_testkit::line_within(&mut out, ps.0.id() as i32).unwrap_or_default();
    let got: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(got["closed"], true, "{got}");
    assert_eq!(got["dump"], 2);
    let second_snap = got["pagemaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "task")
        .unwrap()["snapshot"]
        .as_u64()
        .unwrap();
    let store = DiskStore::open(&store_dir).unwrap();
    let (differ, at2) = against_memory(&store, second_snap, t.pid);
    assert!(
        differ.is_empty(),
        "pages stored unlike the process's: {differ:x?} in {:#?}",
        mappings_of(t.pid, &differ)
    );
    let before: std::collections::HashSet<u64> = at1.iter().map(|&(_, e)| e).collect();
    let (a0, alen) = t.a;
    let new_in_a = at2
        .iter()
        .filter(|&&(addr, e)| addr >= a0 && addr < a0 + alen && !before.contains(&e))
        .count() as u64;
    assert_eq!(new_in_a, changed, "pages of A the second dump added");
    assert!(
        std::fs::read_to_string(store_dir.join("criu/dump-2.json"))
            .unwrap()
            .contains("\"closed\": true"),
        "the dump's pagemap is kept beside the store"
    );

    // SIGTERM ends the server cleanly.
    signal(ps.0.id() as i32, "TERM");
    let end = ps.0.wait().unwrap();
    assert_eq!(end.code(), Some(0), "page-server after SIGTERM: {end}");
}

/// A dump of one page, sent as CRIU v4.2 sends it, by `python3` run as
/// `uid` (through `setpriv`) to the page server at `port`.
fn send_as(uid: u32, port: &str) -> std::process::ExitStatus {
    let script = format!(
        "import socket, struct\n\
         h = lambda op, fl, n, v, d: struct.pack('=IIQQQ', fl << 16 | op, 0, n, v, d)\n\
         c = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n\
         d = 77 << 8 | 1\n\
         c.sendall(h(4, 0, 0, 0, d)); c.recv(1)\n\
         c.sendall(h(6, 4, 1, 0x10000, d) + b'x' * 4096 + h(0x1023, 0, 0, 0, 0)); c.recv(4)\n"
    );
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
        ])
        .args(["/usr/bin/python3", "-c", &script])
        .stderr(Stdio::null())
        .status()
        .unwrap()
}

#[test]
fn another_user_cannot_dump_into_the_page_server() {
    if as_nobody().is_none() {
        return pagewise_testkit::skip!("needs root and setpriv to act as another user");
    }
    let dir = temp_dir("criu-nobody");
    let store_dir = dir.join("store");
    let mut ps = Reaped(
        Command::new(BIN)
            .args([
                "page-server",
                "--listen",
                "127.0.0.1:0",
                "--json",
                "--store",
            ])
            .arg(&store_dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(ps.0.stdout.take().unwrap());
    let first = pagewise_testkit::line_within(&mut out, ps.0.id() as i32).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    let port = v["listening"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    // User nobody is refused before a byte of its dump is read...
    let st = send_as(65534, &port);
    assert!(
        !matches!(st.code(), Some(126 | 127)),
        "python3 as nobody: {st}"
    );
    let line = pagewise_testkit::line_within(&mut out, ps.0.id() as i32).unwrap_or_default();
    let got: serde_json::Value = serde_json::from_str(&line).unwrap();
    let why = got["broken"].as_str().unwrap_or_default();
    assert!(why.contains("user 65534"), "nobody's dump: {got}");
    assert_eq!(got["pagemaps"].as_array().map(Vec::len), Some(0));
    // ...and root's is kept, whole.
    assert!(send_as(0, &port).success());
    let line = pagewise_testkit::line_within(&mut out, ps.0.id() as i32).unwrap_or_default();
    let got: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(got["closed"], true, "root's dump: {got}");
    assert_eq!(got["present_pages"], 1);
    let store = DiskStore::open(&store_dir).unwrap();
    assert_eq!(
        store.ids().unwrap().len(),
        1,
        "only root's dump is in the store"
    );
    // SIGTERM ends it; its status says a session was refused.
    signal(ps.0.id() as i32, "TERM");
    assert_eq!(ps.0.wait().unwrap().code(), Some(1));
}
