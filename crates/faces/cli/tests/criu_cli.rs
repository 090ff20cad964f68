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
/// as CRIU wants a process it dumps without `--shell-job`; on CPU 0 alone
/// with `pinned` (the kernel writes the CPU a thread runs on into its
/// `rseq` area: two dumps of one process then agree on it).
fn start_target(dir: &std::path::Path, pinned: bool) -> Target {
    start_target_with(dir, pinned, &[])
}

/// [`start_target`] with arguments for the program.
fn start_target_with(dir: &std::path::Path, pinned: bool, args: &[&str]) -> Target {
    let prog = c_program("criu_target");
    let out = dir.join("target.out");
    let file = std::fs::File::create(&out).unwrap();
    let mut c = Command::new("taskset");
    c.args(["-c", if pinned { "0" } else { "0-1023" }]);
    let child = c
        .arg("setsid")
        .arg(prog)
        .args(args)
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
    assert_eq!(
        w[0],
        u64::from(child.id()),
        "taskset and setsid ran the target itself"
    );
    Target {
        child,
        out,
        pid: w[0] as i32,
        a: (w[1], w[2]),
        b: (w[3], w[4]),
    }
}

/// `criu dump` of `pid` into pagewise's or CRIU's page server at `port`,
/// with `extra` options (`--leave-running`), verbose into its log.
fn dump(criu: &std::path::Path, pid: i32, images: &std::path::Path, port: u16, extra: &[&str]) {
    let extra = [extra, &["-v4"]].concat();
    if let Err(why) =
        pagewise_testkit::criu::dump_to_page_server(criu, pid as u32, images, port, &extra)
    {
        panic!("{why}");
    }
}

/// `pagewise page-server --listen 127.0.0.1:0 --json --store STORE` with
/// `extra` options: the server, its output after the first line, and the
/// port it listens on.
fn start_page_server(
    store: &std::path::Path,
    extra: &[&str],
) -> (Reaped, BufReader<std::process::ChildStdout>, u16) {
    let mut ps = Reaped(
        Command::new(BIN)
            .args(["page-server", "--listen", "127.0.0.1:0", "--json"])
            .args(extra)
            .arg("--store")
            .arg(store)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(ps.0.stdout.take().unwrap());
    let v = next_line(&mut out, &ps);
    let port = v["listening"].as_str().unwrap().rsplit(':').next().unwrap();
    let port = port.parse().unwrap();
    (ps, out, port)
}

/// The next JSON object the page server `ps` printed (bounded wait).
fn next_line(out: &mut BufReader<std::process::ChildStdout>, ps: &Reaped) -> serde_json::Value {
    let line = pagewise_testkit::line_within(out, ps.0.id() as i32).unwrap_or_default();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// `criu restore -d` from `images` with `extra` options, verbose into its
/// log; the process it restored, killed at the end.
fn restore(
    criu: &std::path::Path,
    images: &std::path::Path,
    extra: &[&str],
    pid: i32,
) -> pagewise_testkit::criu::Restored {
    let extra = [extra, &["-v4"]].concat();
    pagewise_testkit::criu::restore(criu, images, &extra, pid as u32)
        .unwrap_or_else(|why| panic!("{why}"))
        .0
}

/// Checks a process restored from dump 1 of the store at `store_dir`
/// (stopped) against the dump's pages (`pages`, its pages image): every
/// page as dumped. The kernel writes a thread's `struct rseq` (32 bytes,
/// 32-aligned: the CPU it runs on, its concurrency id) as it runs: the
/// restored thread's may differ there, in one such window of one page,
/// and nowhere else.
fn assert_restored_as_dumped(pid: i32, store_dir: &std::path::Path, pages: &[u8]) {
    let store = DiskStore::open(store_dir).unwrap();
    let snap = store.load(1).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut live = vec![0u8; PAGE_SIZE];
    let (mut differ, mut rseq_like) = (Vec::new(), 0);
    for i in 0..snap.pages() {
        let addr = snap.address_of(i).unwrap();
        mem.read_exact_at(&mut live, addr).unwrap();
        let dumped = &pages[i as usize * PAGE_SIZE..(i as usize + 1) * PAGE_SIZE];
        match one_rseq_window(&live, dumped) {
            Some(true) => rseq_like += 1,
            Some(false) => differ.push(addr),
            None => {}
        }
    }
    assert!(
        differ.is_empty() && rseq_like <= 1,
        "pages of the restored process unlike the dump's: {differ:x?} in {:#?} \
         ({rseq_like} differing in one 32-byte window)",
        mappings_of(pid, &differ)
    );
}

/// How page `live` differs from `dumped`: not at all (`None`), within one
/// 32-byte aligned window alone, as the kernel's writes to a thread's
/// `struct rseq` do (`Some(true)`), or otherwise.
fn one_rseq_window(live: &[u8], dumped: &[u8]) -> Option<bool> {
    let first = live.iter().zip(dumped).position(|(x, y)| x != y)?;
    let last = PAGE_SIZE
        - 1
        - live
            .iter()
            .rev()
            .zip(dumped.iter().rev())
            .position(|(x, y)| x != y)?;
    Some(first / 32 == last / 32)
}

/// Every page of snapshot `id` against the process's memory now: the
/// pages that differ (address), and the addresses stored. One page that
/// differs only in one 32-byte window is not counted: the kernel writes a
/// thread's `rseq` area (the CPU it runs on) whenever it returns to the
/// thread, and CRIU makes the stopped target run its parasite's cure
/// after it has read the pages.
fn against_memory(store: &DiskStore, id: u64, pid: i32) -> (Vec<u64>, Vec<(u64, u64)>) {
    let snap = store.load(id).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let (mut stored, mut live) = (vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]);
    let (mut differ, mut rseq_like) = (Vec::new(), Vec::new());
    let mut at = Vec::new();
    for i in 0..snap.pages() {
        let addr = snap.address_of(i).unwrap();
        store
            .read_page(snap.entries[i as usize], &mut stored)
            .unwrap();
        mem.read_exact_at(&mut live, addr).unwrap();
        match one_rseq_window(&live, &stored) {
            Some(false) => differ.push(addr),
            Some(true) => rseq_like.push(addr),
            None => {}
        }
        at.push((addr, snap.entries[i as usize]));
    }
    if rseq_like.len() > 1 {
        differ.extend(rseq_like);
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
    let dir = Scratch::new("criu");
    let store_dir = dir.join("store");
    let (mut ps, mut out, port) = start_page_server(&store_dir, &[]);
    let t = start_target(&dir, false);

    // The first dump: every page stored is the page at its address. The
    // target is stopped (SIGSTOP) for each dump and its comparison: a
    // running one writes its own thread block as it goes on waiting.
    signal(t.pid, "STOP");
    dump(&criu, t.pid, &dir.join("img-1"), port, &["--leave-running"]);
    let got = next_line(&mut out, &ps);
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
    dump(&criu, t.pid, &dir.join("img-2"), port, &["--leave-running"]);
    let got = next_line(&mut out, &ps);
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
fn send_as(uid: u32, port: u16) -> std::process::ExitStatus {
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
    let dir = Scratch::new("criu-nobody");
    let store_dir = dir.join("store");
    let (mut ps, mut out, port) = start_page_server(&store_dir, &[]);
    // User nobody is refused before a byte of its dump is read...
    let st = send_as(65534, port);
    assert!(
        !matches!(st.code(), Some(126 | 127)),
        "python3 as nobody: {st}"
    );
    let got = next_line(&mut out, &ps);
    let why = got["broken"].as_str().unwrap_or_default();
    assert!(why.contains("user 65534"), "nobody's dump: {got}");
    assert_eq!(got["pagemaps"].as_array().map(Vec::len), Some(0));
    // ...and root's is kept, whole.
    assert!(send_as(0, port).success());
    let got = next_line(&mut out, &ps);
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

/// The pages images pagewise exports are those CRIU's own page server
/// writes for the same dump, byte for byte; and `criu restore` brings
/// the process back from them, its memory as dumped, running.
#[test]
fn criu_restores_from_the_images_pagewise_exports() {
    let criu = match pagewise_testkit::criu::criu4() {
        Ok(c) => c,
        Err(why) => return pagewise_testkit::skip!("{why}"),
    };
    let dir = Scratch::new("criu-export");
    let t = start_target(&dir, true);
    signal(t.pid, "STOP");
    // CRIU's own page server, one session, into own/.
    let port = pagewise_testkit::servers::free_port().unwrap();
    let own = dir.join("own");
    std::fs::create_dir_all(&own).unwrap();
    let mut theirs = Reaped(
        Command::new(&criu)
            .args(["page-server", "--port", &port.to_string(), "-D"])
            .arg(&own)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    pagewise_testkit::criu::wait_listening(port).unwrap_or_else(|why| panic!("{why}"));
    dump(
        &criu,
        t.pid,
        &dir.join("own-img"),
        port,
        &["--leave-running"],
    );
    assert!(theirs.0.wait().unwrap().success(), "criu page-server");
    // pagewise's, then its export.
    let store_dir = dir.join("store");
    let (mut ps, _out, pw_port) = start_page_server(&store_dir, &["--once"]);
    let images = dir.join("img");
    dump(&criu, t.pid, &images, pw_port, &["--leave-running"]);
    assert_eq!(ps.0.wait().unwrap().code(), Some(0));
    let exported = dir.join("exported");
    let o = ok(Command::new(BIN)
        .args(["criu", "export", "--json"])
        .arg(&store_dir)
        .arg("1")
        .arg(&exported));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let files: Vec<String> = e["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        files,
        [
            format!("pagemap-{}.img", t.pid),
            "pages-65537.img".to_string()
        ]
    );
    for f in &files {
        let (a, b) = (
            std::fs::read(own.join(f)).unwrap(),
            std::fs::read(exported.join(f)).unwrap(),
        );
        let first_diff = a.iter().zip(&b).position(|(x, y)| x != y);
        assert!(
            a.len() == b.len() && first_diff.is_none(),
            "{f}: {} bytes from CRIU's page server, {} exported; first difference at {first_diff:?}",
            a.len(),
            b.len()
        );
    }
    // The original gone, CRIU restores it from the dump's images and the
    // exported pages: its memory is the dump's, and it runs on.
    for f in &files {
        std::fs::copy(exported.join(f), images.join(f)).unwrap();
    }
    let pages = std::fs::read(images.join("pages-65537.img")).unwrap();
    let pid = t.pid;
    let out_file = t.out.clone();
    drop(t);
    let restored = restore(&criu, &images, &[], pid);
    signal(pid, "STOP");
    assert_restored_as_dumped(pid, &store_dir, &pages);
    signal(pid, "CONT");
    signal(pid, "USR1");
    pagewise_testkit::wait_in_file(&out_file, "changed", 1, || {});
    drop(restored);
}

/// `criu restore --lazy-pages` fetches the pages the dump marked lazy
/// from `pagewise page-server --lazy` (through `criu lazy-pages
/// --page-server`): each is served once, and the restored process's
/// memory is the dump's.
#[test]
fn criu_restores_lazily_from_the_page_server() {
    lazy_restore(false);
}

/// [`criu_restores_lazily_from_the_page_server`] with the pages fetched
/// over CRIU's TLS: `page-server --tls --lazy 1` and `criu lazy-pages
/// --tls` with a certificate of the server's authority.
#[test]
fn criu_restores_lazily_over_tls() {
    lazy_restore(true);
}

/// A dump's lazy restore served by `page-server --lazy`, over TLS with
/// `tls` (see the two tests).
fn lazy_restore(tls: bool) {
    let criu = match pagewise_testkit::criu::criu4() {
        Ok(c) => c,
        Err(why) => return pagewise_testkit::skip!("{why}"),
    };
    if tls && Command::new("openssl").arg("version").output().is_err() {
        return pagewise_testkit::skip!("no openssl to make certificates with");
    }
    let dir = Scratch::new(if tls { "criu-lazy-tls" } else { "criu-lazy" });
    let (server_tls, daemon_tls) = match tls {
        true => pki(&dir),
        false => (Vec::new(), Vec::new()),
    };
    let t = start_target(&dir, true);
    let store_dir = dir.join("store");
    // The dump ends the process (no --leave-running).
    let (mut ps, _out, port) = start_page_server(&store_dir, &["--once"]);
    let images = dir.join("img");
    signal(t.pid, "STOP");
    let pid = t.pid;
    let out_file = t.out.clone();
    dump(&criu, pid, &images, port, &[]);
    assert_eq!(ps.0.wait().unwrap().code(), Some(0));
    drop(t);
    ok(Command::new(BIN)
        .args(["criu", "export"])
        .arg(&store_dir)
        .arg("1")
        .arg(&images));
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store_dir.join("criu/dump-1.json")).unwrap())
            .unwrap();
    let lazy_pages: u64 = rec["pagemaps"][0]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["flags"].as_u64().unwrap() & 6 == 6)
        .map(|r| r["nr_pages"].as_u64().unwrap())
        .sum();
    assert!(
        lazy_pages >= 3072,
        "the known regions are lazy: {lazy_pages} pages"
    );
    // pagewise serves dump 1's lazy pages; CRIU's daemon fetches them.
    let server_args: Vec<&str> = ["--once", "--lazy", "1"]
        .into_iter()
        .chain(server_tls.iter().map(|s| s.as_str()))
        .collect();
    let (ps, mut out, port) = start_page_server(&store_dir, &server_args);
    let mut daemon = Reaped(
        Command::new(&criu)
            .args([
                "lazy-pages",
                "--page-server",
                "--address",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args(&daemon_tls)
            .args(["-v4", "-o", "lazy.log", "-D"])
            .arg(&images)
            .spawn()
            .unwrap(),
    );
    let sock = images.join("lazy-pages.socket");
    let t0 = std::time::Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed().as_secs() < 10,
            "criu lazy-pages made no {} in 10 s",
            sock.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let restored = restore(&criu, &images, &["--lazy-pages"], pid);
    // The daemon ends once every lazy page is in (it fetches the rest in
    // the background); bounded.
    let t0 = std::time::Instant::now();
    let end = loop {
        if let Some(st) = daemon.0.try_wait().unwrap() {
            break st;
        }
        let log = std::fs::read_to_string(images.join("lazy.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        assert!(
            t0.elapsed().as_secs() < 60,
            "criu lazy-pages still running after 60 s: {tail:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(end.success(), "criu lazy-pages: {end}");
    let got = next_line(&mut out, &ps);
    assert_eq!(got["broken"], serde_json::Value::Null, "{got}");
    assert_eq!(
        got["served_pages"], lazy_pages,
        "every lazy page served once: {got}"
    );
    // The restored memory is the dump's (but the rseq window).
    signal(pid, "STOP");
    let pages = std::fs::read(images.join("pages-65537.img")).unwrap();
    assert_restored_as_dumped(pid, &store_dir, &pages);
    signal(pid, "CONT");
    signal(pid, "USR1");
    pagewise_testkit::wait_in_file(&out_file, "changed", 1, || {});
    drop(restored);
    drop(ps);
}

/// The pages of a CRIU dump's images (`pagemap-PID.img` and the pages
/// image it names, as CRIU wrote them): address to bytes.
fn dumped_pages(images: &std::path::Path, pid: i32) -> std::collections::BTreeMap<u64, Vec<u8>> {
    let pm = std::fs::read(images.join(format!("pagemap-{pid}.img"))).unwrap();
    // Two magics, then u32-sized protobuf messages: the head (pages_id),
    // then (vaddr = 1, nr_pages = 5, flags = 4) per run.
    let mut msgs = Vec::new();
    let mut at = 8;
    while at < pm.len() {
        let n = u32::from_ne_bytes(pm[at..at + 4].try_into().unwrap()) as usize;
        msgs.push(&pm[at + 4..at + 4 + n]);
        at += 4 + n;
    }
    let fields = |m: &[u8]| {
        let mut out = std::collections::HashMap::new();
        let mut i = 0;
        let varint = |i: &mut usize| {
            let (mut v, mut s) = (0u64, 0);
            loop {
                let b = m[*i];
                *i += 1;
                v |= u64::from(b & 0x7f) << s;
                s += 7;
                if b & 0x80 == 0 {
                    return v;
                }
            }
        };
        while i < m.len() {
            let k = varint(&mut i);
            assert_eq!(k & 7, 0, "pagemap fields are varints");
            out.insert(k >> 3, varint(&mut i));
        }
        out
    };
    let pages_id = fields(msgs[0])[&1];
    let pages = std::fs::read(images.join(format!("pages-{pages_id}.img"))).unwrap();
    let mut out = std::collections::BTreeMap::new();
    let mut off = 0;
    for m in &msgs[1..] {
        let f = fields(m);
        if f.get(&4).copied().unwrap_or(4) & 4 == 0 {
            continue;
        }
        for i in 0..f[&5] {
            out.insert(
                f[&1] + i * PAGE_SIZE as u64,
                pages[off..off + PAGE_SIZE].to_vec(),
            );
            off += PAGE_SIZE;
        }
    }
    assert_eq!(
        off,
        pages.len(),
        "the pages image holds the pagemap's pages"
    );
    out
}

/// `pagewise snapshot restore --criu DIR --pid P` puts a later CRIU dump
/// into the process `criu restore` made of an earlier one, in place: it
/// writes the pages that differ between the dumps (the target changed 21
/// known pages between them, and a few of its own: its output buffer and
/// its stack), and afterwards every dumped page reads as the later dump
/// has it. Its thread is put back as the later dump caught it: asked for
/// a round again, it makes round 2 (its round counter is main's local;
/// the restored process was at round 0), and its stack's pointer to the
/// last page it rewrote (which the earlier dump's stack has pointing at
/// page 0) is the later dump's. Into a process whose mappings are not the
/// dump's it is refused, naming the first difference; so is another
/// user's attempt on root's process.
#[test]
fn a_later_criu_dump_is_put_in_place_into_a_restored_process() {
    let criu = match pagewise_testkit::criu::criu4() {
        Ok(c) => c,
        Err(why) => return pagewise_testkit::skip!("{why}"),
    };
    let dir = Scratch::new("criu-in-place");
    let (pid, out_file, out_then, d1, d2) = dump_twice(&criu, &dir, &["keep-pointer"]);
    let (pages1, pages2) = (dumped_pages(&d1, pid), dumped_pages(&d2, pid));
    // Refused into another process: its mappings are not the dump's.
    std::fs::create_dir_all(dir.join("other")).unwrap();
    let other = start_target(&dir.join("other"), true);
    in_place_refused(
        Command::new(BIN),
        &d2,
        other.pid,
        &["--task", &pid.to_string()],
        "its mappings are not those of the CRIU dump",
    );
    drop(other);
    std::fs::write(&out_file, &out_then).unwrap();
    let restored = restore(&criu, &d1, &[], pid);
    // Another user may not put a dump into root's process, even with the
    // images readable: refused before a page is written (the count of
    // pages written below is exact).
    let st = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "chmod -R a+rX {}", dir.display());
    let mut nobody = Command::new("setpriv");
    nobody.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
    in_place_refused(nobody, &d2, pid, &[], "ermi");
    let o = ok(Command::new(BIN)
        .args(["snapshot", "restore", "--json", "--criu"])
        .arg(&d2)
        .args(["--pid", &pid.to_string()]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &v["restored"];
    assert_eq!(
        r["threads"].as_u64(),
        Some(1),
        "its one thread put back: {v}"
    );
    // Ground truth: the pages that differ between the two dumps.
    let changed = pages2
        .iter()
        .filter(|(a, p)| pages1.get(*a) != Some(*p))
        .count() as u64;
    assert!(changed >= 21, "the target changed 21 pages of A: {changed}");
    let written = r["pages_written"].as_u64().unwrap();
    assert_eq!(
        r["pages_compared"].as_u64().unwrap(),
        pages2.len() as u64,
        "every dumped page compared: {v}"
    );
    // The restored process may differ from the first dump in its rseq
    // area (one page, see assert_restored_as_dumped).
    assert!(
        written == changed || written == changed + 1,
        "{written} pages written, {changed} differ between the dumps: {v}"
    );
    signal(pid, "STOP");
    let (differ, rseq_like) = unlike(pid, &pages2, &|_| false);
    assert!(
        differ.is_empty() && rseq_like <= 1,
        "pages unlike the later dump's: {differ:x?} in {:#?} ({rseq_like} differing in one \
         32-byte window; {v})",
        mappings_of(pid, &differ),
    );
    signal(pid, "CONT");
    // Asked again, the thread goes on from the later dump: round 2, and
    // the page it says it rewrote last holds round 2's tag.
    signal(pid, "USR1");
    pagewise_testkit::wait_in_file(&out_file, "changed", 1, || {});
    let text = std::fs::read_to_string(&out_file).unwrap();
    let line = text.lines().rfind(|l| l.starts_with("changed")).unwrap();
    assert!(
        line.contains(" round 2 "),
        "the round after the later dump's 1: {line:?}"
    );
    let last = line.rsplit_once("at 0x").unwrap().1.trim_end_matches(')');
    let last = u64::from_str_radix(last, 16).unwrap();
    let mut tag = [0u8; 8];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap()
        .read_exact_at(&mut tag, last)
        .unwrap();
    assert_eq!(
        u64::from_ne_bytes(tag),
        0xc0ffee02,
        "the last page rewritten ({last:#x}) holds round 2's tag: {line:?}"
    );
    drop(restored);
}

/// The target (with `args`) dumped into `dir/d1`, made to change its
/// known pages, dumped into `dir/d2`, then killed: its pid, its output
/// file and what that held at the first dump (CRIU restores only a
/// process whose open files are as they were), and the two dumps.
fn dump_twice(
    criu: &std::path::Path,
    dir: &std::path::Path,
    args: &[&str],
) -> (
    i32,
    std::path::PathBuf,
    Vec<u8>,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    std::fs::create_dir_all(dir).unwrap();
    let t = start_target_with(dir, true, args);
    let (d1, d2) = (dir.join("d1"), dir.join("d2"));
    let dump_dir = |d: &std::path::Path| {
        pagewise_testkit::criu::dump_to_dir(criu, t.pid as u32, d, &["--leave-running", "-v4"])
            .unwrap_or_else(|why| panic!("{why}"))
    };
    dump_dir(&d1);
    let out_then = std::fs::read(&t.out).unwrap();
    signal(t.pid, "USR1");
    pagewise_testkit::wait_in_file(&t.out, "changed", 1, || {});
    dump_dir(&d2);
    (t.pid, t.out.clone(), out_then, d1, d2)
}

/// `c` (pagewise, or a command that runs it) with `snapshot restore
/// --criu DIR --pid PID` and `extra`: it must fail, saying `why`.
fn in_place_refused(mut c: Command, dir: &std::path::Path, pid: i32, extra: &[&str], why: &str) {
    let o = c
        .args(["snapshot", "restore", "--criu"])
        .arg(dir)
        .args(["--pid", &pid.to_string()])
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains(why),
        "snapshot restore --criu {} --pid {pid} {extra:?}: {} (wanted a refusal saying {why:?}) {err}",
        dir.display(),
        o.status
    );
}

/// The pages of `pages` (address to bytes) outside `skip` that process
/// `pid` holds otherwise: those that differ, and how many differ only in
/// one 32-byte window (a thread's `rseq` area, see `one_rseq_window`).
fn unlike(
    pid: i32,
    pages: &std::collections::BTreeMap<u64, Vec<u8>>,
    skip: &dyn Fn(u64) -> bool,
) -> (Vec<u64>, usize) {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let (mut live, mut differ, mut rseq_like) = (vec![0u8; PAGE_SIZE], Vec::new(), 0);
    for (a, p) in pages.iter().filter(|(a, _)| !skip(**a)) {
        mem.read_exact_at(&mut live, *a).unwrap();
        match one_rseq_window(&live, p) {
            Some(true) => rseq_like += 1,
            Some(false) => differ.push(*a),
            None => {}
        }
    }
    (differ, rseq_like)
}

/// `openssl` with `args` in `dir`; it must succeed.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running openssl");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// An authority `NAME-ca.pem` (and its key) in `dir`, and certificates
/// signed by it for each of `leaves` (file stem, extensions), each with
/// its key `STEM.key`.
fn authority(dir: &std::path::Path, name: &str, leaves: &[(&str, &str)]) {
    // `openssl req` making a P-256 key into the file that follows.
    const NEW_KEY: [&str; 7] = [
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
    ];
    let (ca, ca_key) = (format!("{name}-ca.pem"), format!("{name}-ca.key"));
    let subject = format!("/CN={name} CA");
    let ca_args = [
        ca_key.as_str(),
        "-x509",
        "-out",
        &ca,
        "-days",
        "2",
        "-subj",
        &subject,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ];
    openssl(dir, &[&NEW_KEY[..], &ca_args[..]].concat());
    for (stem, ext) in leaves {
        let (csr, key, pem, exts) = (
            format!("{stem}.csr"),
            format!("{stem}.key"),
            format!("{stem}.pem"),
            format!("{stem}.ext"),
        );
        std::fs::write(dir.join(&exts), ext).unwrap();
        let subject = format!("/CN={stem}");
        let leaf_args = [key.as_str(), "-out", &csr, "-subj", &subject];
        openssl(dir, &[&NEW_KEY[..], &leaf_args[..]].concat());
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &exts,
            ],
        );
    }
}

/// Certificates for TLS in `dir/pki` (see [`authority`]): the options of
/// `page-server` (its authority, certificate and key) and those of CRIU
/// (the same authority, a client certificate it signed); a second
/// authority signs `intruder.pem`.
fn pki(dir: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let leaf = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n";
    let server = format!("{leaf}extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n");
    let client = format!("{leaf}extendedKeyUsage=clientAuth\n");
    authority(&pki, "good", &[("server", &server), ("client", &client)]);
    authority(&pki, "rogue", &[("intruder", &client)]);
    let p = |f: &str| pki.join(f).display().to_string();
    let opts = |cert: &str, key: &str| {
        vec![
            "--tls".to_string(),
            "--tls-cacert".into(),
            p("good-ca.pem"),
            "--tls-cert".into(),
            p(cert),
            "--tls-key".into(),
            p(key),
        ]
    };
    (
        opts("server.pem", "server.key"),
        opts("client.pem", "client.key"),
    )
}

/// `pagewise page-server --tls` speaks CRIU's TLS: `criu dump --tls` with
/// a certificate signed by the server's authority dumps into it (every
/// stored page is the process's, both known regions whole); one signed
/// by another authority, or a dump without TLS, is refused at the
/// handshake and stores nothing. The server's own certificate is the one
/// CRIU checks against the address it dials (127.0.0.1).
#[test]
fn criu_dumps_over_tls_into_the_page_server() {
    let criu = match pagewise_testkit::criu::criu4() {
        Ok(c) => c,
        Err(why) => return pagewise_testkit::skip!("{why}"),
    };
    if Command::new("openssl").arg("version").output().is_err() {
        return pagewise_testkit::skip!("no openssl to make certificates with");
    }
    let dir = Scratch::new("criu-tls");
    let (server_tls, _) = pki(&dir);
    let p = |f: &str| dir.join("pki").join(f).display().to_string();
    let store_dir = dir.join("store");
    let server_args: Vec<&str> = server_tls.iter().map(|s| s.as_str()).collect();
    let (ps, mut out, port) = start_page_server(&store_dir, &server_args);
    let t = start_target(&dir, false);
    signal(t.pid, "STOP");
    let tls = |ca: &str, cert: &str, key: &str| {
        vec![
            "--leave-running".to_string(),
            "--tls".into(),
            "--tls-cacert".into(),
            p(ca),
            "--tls-cert".into(),
            p(cert),
            "--tls-key".into(),
            p(key),
        ]
    };
    let dump_with = |images: &str, extra: &[String]| {
        let extra: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
        pagewise_testkit::criu::dump_to_page_server(
            &criu,
            t.pid as u32,
            &dir.join(images),
            port,
            &[&extra[..], &["-v4"]].concat(),
        )
    };
    // Another authority's certificate: refused at the handshake.
    let rogue = dump_with(
        "img-rogue",
        &tls("good-ca.pem", "intruder.pem", "intruder.key"),
    );
    assert!(
        rogue.is_err(),
        "a dump with another authority's certificate went through"
    );
    let got = next_line(&mut out, &ps);
    let why = got["broken"].as_str().unwrap_or_default();
    assert!(why.contains("TLS handshake failed"), "{got}");
    assert_eq!(
        got["pagemaps"].as_array().map(|a| a.len()),
        Some(0),
        "{got}"
    );
    // Without TLS: refused at the handshake too.
    let plain = dump_with("img-plain", &["--leave-running".to_string()]);
    assert!(plain.is_err(), "a dump without TLS went through");
    let got = next_line(&mut out, &ps);
    assert!(
        got["broken"]
            .as_str()
            .unwrap_or_default()
            .contains("TLS handshake failed"),
        "{got}"
    );
    // The authority's own: every page stored is the process's.
    if let Err(why) = dump_with("img-1", &tls("good-ca.pem", "client.pem", "client.key")) {
        panic!("a dump over TLS: {why}");
    }
    let got = next_line(&mut out, &ps);
    assert_eq!(got["broken"], serde_json::Value::Null, "{got}");
    assert_eq!(got["closed"], true, "{got}");
    assert_eq!(got["dump"], 1, "the refused sessions kept no dump: {got}");
    let snap = got["pagemaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "task" && p["id"] == t.pid)
        .unwrap_or_else(|| panic!("no pagemap of task {}: {got}", t.pid))["snapshot"]
        .as_u64()
        .unwrap();
    let store = DiskStore::open(&store_dir).unwrap();
    let (differ, at) = against_memory(&store, snap, t.pid);
    assert!(
        differ.is_empty(),
        "pages stored unlike the process's: {differ:x?}"
    );
    assert!(
        covers(&at, t.a) && covers(&at, t.b),
        "both known regions stored whole"
    );
    signal(t.pid, "CONT");
    signal(ps.0.id() as i32, "TERM");
}
