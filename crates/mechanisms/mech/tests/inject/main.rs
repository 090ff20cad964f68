//! Acting inside processes pagewise did not start, without damaging them
//! (`pagewise_mech::stop`, `pagewise_mech::inject`): a target flooded with signals
//! loses none and every call made in it runs once; a 32-bit target is
//! refused before any call; a vforking target neither freezes nor holds
//! the tool; calls blocked in the target do not see an EINTR the stop
//! caused.

use pagewise_testkit::targets as common;
mod late_uffd;

use common::{can_ptrace, fds};
use pagewise_mech::inject::Remote;
use pagewise_mech::stop::Stopped;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A C target of `tests/c`, built with `flags`; `None` (skip printed)
/// without a C compiler.
fn target(name: &str, flags: &[&str]) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    match pagewise_testkit::c_program(&src, Path::new(env!("CARGO_TARGET_TMPDIR")), flags) {
        Ok(p) => Some(p),
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            None
        }
    }
}

/// A running target, killed when dropped.
struct Target {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    /// What followed "ready" on its first line.
    ready: String,
}

impl Target {
    fn start(path: &Path, args: &[&str], wait_ready: bool) -> Target {
        let mut child = Command::new(path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the target");
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut t = Target {
            child,
            out,
            ready: String::new(),
        };
        if wait_ready {
            let l = t.line();
            assert!(l.starts_with("ready"), "the target said {l:?}");
            t.ready = l["ready".len()..].trim().to_string();
        }
        t
    }
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    fn line(&mut self) -> String {
        let pid = self.pid();
        pagewise_testkit::line_within(&mut self.out, pid).unwrap_or_default()
    }
    fn signal(&self, sig: i32) {
        // SAFETY: kill of our own child.
        unsafe { libc::kill(self.pid(), sig) };
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Calls made in a target that takes a SIGALRM every 100 µs and a queued
/// real-time signal every few tens of µs: every call runs (never given up),
/// runs once (a userfaultfd made in it is a userfaultfd, and no descriptor
/// of the target is closed in its place), and the target receives every
/// queued signal exactly once, each with its own value.
#[test]
fn a_target_flooded_with_signals_loses_none() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target("sigstorm", &[]) else {
        return;
    };
    let mut t = Target::start(&path, &["100"], true);
    let pid = t.pid();
    let fds_before = fds(pid);
    const SENT: u32 = 3000;
    let sender = std::thread::spawn(move || {
        let mut sum = 0u64;
        for i in 1..=SENT {
            let v = libc::sigval {
                sival_ptr: i as usize as *mut libc::c_void,
            };
            // SAFETY: sigqueue to our own child with an integer value.
            let r = unsafe { libc::sigqueue(pid, libc::SIGRTMIN(), v) };
            assert_eq!(r, 0, "sigqueue: {}", std::io::Error::last_os_error());
            sum += i as u64;
            std::thread::sleep(Duration::from_micros(30));
        }
        sum
    });
    let mut calls = 0;
    let mut rounds = 0;
    while !sender.is_finished() || rounds < 50 {
        let stopped = Stopped::new(pid).unwrap();
        let r = Remote::new(&stopped).unwrap();
        assert_eq!(r.syscall(libc::SYS_getpid, [0; 6]).unwrap(), pid as i64);
        let fd = r
            .syscall(
                libc::SYS_userfaultfd,
                [(libc::O_CLOEXEC | libc::O_NONBLOCK) as u64, 0, 0, 0, 0, 0],
            )
            .unwrap();
        assert!(fd >= 0, "userfaultfd made in the target: {fd}");
        let mine = r.take_fd(fd as i32).unwrap();
        let link = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&mine)
        ))
        .unwrap();
        assert!(
            link.to_string_lossy().contains("userfaultfd"),
            "the call did not run as a userfaultfd: fd {fd} is {link:?}"
        );
        calls += 3;
        rounds += 1;
        drop(stopped);
    }
    let sum = sender.join().unwrap();
    assert_eq!(fds(pid), fds_before, "a descriptor of the target changed");
    // Let the queue drain, then ask for the counts.
    std::thread::sleep(Duration::from_millis(100));
    t.signal(libc::SIGUSR2);
    let counts = t.line();
    let v: Vec<u64> = counts
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(v.len(), 3, "{counts:?}");
    assert_eq!(
        (v[0], v[1]),
        (SENT as u64, sum),
        "queued real-time signals received (count, sum of values) over {rounds} stops"
    );
    assert!(v[2] > 0, "the interval timer never fired: {counts}");
    println!(
        "     {rounds} stops, {calls} calls, {SENT} queued signals all received, {} alarms",
        v[2]
    );
}

/// Dirty tracking from outside (uffd-wp made inside the target) of a
/// target flooded with signals starts every time.
#[test]
fn tracking_a_target_flooded_with_signals_starts_every_time() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    use pagewise_track::{BackendKind, DirtyTracker};
    if let Err(why) = BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target("sigstorm", &[]) else {
        return;
    };
    let mut t = Target::start(&path, &["100"], true);
    for i in 0..30 {
        let mut tr = DirtyTracker::for_process(t.pid(), BackendKind::UffdWp)
            .unwrap_or_else(|e| panic!("start {i}: {e}"));
        let c = tr.collect().unwrap();
        drop(c);
    }
    t.signal(libc::SIGUSR2);
    let counts = t.line();
    assert_eq!(counts.split_whitespace().count(), 3, "{counts}");
}

/// A 32-bit process is refused before a single call is made in it, by
/// every way in: the calls of `Remote`, `madvise` made inside, uffd-wp
/// from outside.
#[test]
fn a_32_bit_target_is_refused_before_any_call() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target(
        "compat32",
        &["-m32", "-nostdlib", "-static", "-fno-pie", "-no-pie"],
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("pagewise-compat32-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = Command::new(&path).current_dir(&dir).spawn().unwrap();
    let pid = c.id() as i32;
    /// Kills the target however the test ends (it never exits by itself).
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _reap = Reap(c);
    std::thread::sleep(Duration::from_millis(50));
    let fds_before = fds(pid);
    {
        let stopped = Stopped::new(pid).unwrap();
        let e = Remote::new(&stopped).unwrap_err().to_string();
        assert!(e.contains("32-bit"), "{e}");
    }
    let e =
        pagewise_mech::inject::madvise_in(pid, &[(0x10000, 4096)], libc::MADV_MERGEABLE, "test")
            .unwrap_err()
            .to_string();
    assert!(e.contains("32-bit"), "{e}");
    if pagewise_track::BackendKind::UffdWp
        .available_for_pid()
        .is_ok()
    {
        let e = match pagewise_track::DirtyTracker::for_process(
            pid,
            pagewise_track::BackendKind::UffdWp,
        ) {
            Ok(_) => panic!("uffd-wp tracking of a 32-bit process was not refused"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("32-bit"), "{e}");
    }
    assert_eq!(fds(pid), fds_before, "a descriptor of the target changed");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "files appeared in its directory: {left:?}");
    assert!(pagewise_mech::procfs::is_alive(pid), "the target died");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A target whose main thread waits for a vforked child: the stop is
/// refused with the reason within its limit (not held for the child's
/// life), and the target, let go, finishes its vfork when the child ends.
#[test]
fn a_vforking_target_is_waited_out_then_refused() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target("vforker", &["-pthread"]) else {
        return;
    };
    let mut t = Target::start(&path, &["3600"], true);
    let pid = t.pid();
    // Wait for the vfork itself: the child appears.
    let t0 = Instant::now();
    let child = loop {
        let kids =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(k) = kids.split_whitespace().next() {
            break k.parse::<i32>().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no vfork happened");
        std::thread::sleep(Duration::from_millis(5));
    };
    /// Kills the vforked child (our grandchild) however the test ends.
    struct KillChild(i32);
    impl Drop for KillChild {
        fn drop(&mut self) {
            // SAFETY: kill of a process this test's target started.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _child = KillChild(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = Stopped::within(pid, Duration::from_millis(500)).map(|_| ());
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    // A liveness bound, not a timing claim: the refusal comes within the
    // limit; a stop that hangs would never send.
    let r = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the stop of a vforking target hung");
    let e = r.expect_err("a vforking target was stopped");
    assert!(e.contains("vfork"), "{e}");
    // The target was not left stopped: once the child ends, it goes on.
    // SAFETY: kill of our grandchild.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert_eq!(t.line(), "done 1");
}

/// Threads blocked in `epoll_wait`, `sigtimedwait` and `semop` see no
/// EINTR from stops and calls made in their process: each returns what
/// it waited for.
#[test]
fn blocked_calls_see_no_eintr_from_a_stop() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target("eintr", &["-pthread"]) else {
        return;
    };
    let mut t = Target::start(&path, &[], true);
    let pid = t.pid();
    // Wait until the three threads are blocked in their calls.
    let t0 = Instant::now();
    loop {
        let tids = pagewise_mech::procfs::tasks(pid).unwrap();
        let blocked = tids
            .iter()
            .filter(|&&tid| tid != pid)
            .filter(|&&tid| {
                matches!(pagewise_mech::procfs::thread_syscall(pid, tid), Ok(Some((nr, _)))
                    if [libc::SYS_epoll_wait, libc::SYS_epoll_pwait, libc::SYS_rt_sigtimedwait,
                        libc::SYS_semop, libc::SYS_semtimedop].contains(&nr))
            })
            .count();
        if blocked == 3 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the threads never blocked"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..3 {
        let stopped = Stopped::new(pid).unwrap();
        let r = Remote::new(&stopped).unwrap();
        assert_eq!(r.syscall(libc::SYS_getpid, [0; 6]).unwrap(), pid as i64);
        drop(stopped);
        std::thread::sleep(Duration::from_millis(20));
    }
    t.child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut got: Vec<String> = (0..3).map(|_| t.line()).collect();
    got.sort();
    assert_eq!(
        got,
        ["epoll 1 0", "semop 0 0", "sigtimedwait 10 0"],
        "what the blocked calls returned (an EINTR shows as -1 4)"
    );
}

/// Tracking from outside with uffd-wp a target that registered a region
/// with a userfaultfd of its own: that region is hashed instead (said in
/// the tracker's note) and every page written in it is reported, as in a
/// plain region beside it.
#[test]
fn a_target_with_its_own_userfaultfd_loses_no_write() {
    use pagewise_track::{BackendKind, DirtyTracker};
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    if let Err(why) = BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target("own_uffd", &[]) else {
        return;
    };
    let mut t = Target::start(&path, &[], true);
    let addrs: Vec<u64> = t
        .ready
        .split_whitespace()
        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
        .collect();
    let (own, plain) = (addrs[0], addrs[1]);
    let page = pagewise::PAGE_SIZE as u64;
    let mut tr = DirtyTracker::for_process(t.pid(), BackendKind::UffdWp).unwrap();
    let note = tr.note().map(str::to_string).unwrap_or_default();
    assert!(note.contains("another userfaultfd"), "note: {note:?}");
    tr.collect().unwrap();
    const WRITTEN: u64 = 51;
    t.child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(format!("{WRITTEN}\n").as_bytes())
        .unwrap();
    assert_eq!(t.line(), "ok");
    let c = tr.collect().unwrap();
    let reported = |base: u64| {
        (0..WRITTEN)
            .filter(|i| {
                let a = base + i * page;
                c.ranges.iter().any(|r| r.start <= a && a < r.end())
            })
            .count() as u64
    };
    assert_eq!(
        reported(plain),
        WRITTEN,
        "pages written in the plain region and reported"
    );
    assert_eq!(
        reported(own),
        WRITTEN,
        "pages written in the region under the program's own userfaultfd and reported"
    );
}

/// A process that shares the target's memory without being one of its
/// threads (`clone(CLONE_VM)`) is stopped with it: while the target is
/// stopped, neither writes.
#[test]
fn a_clone_vm_sibling_stands_still_with_the_target() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target("clone_vm", &[]) else {
        return;
    };
    let t = Target::start(&path, &[], true);
    let f: Vec<&str> = t.ready.split_whitespace().collect();
    let addr = u64::from_str_radix(f[0].trim_start_matches("0x"), 16).unwrap();
    let sibling: i32 = f[1].parse().unwrap();
    /// Kills the sibling (our grandchild), however the test ends.
    struct Kill(i32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: kill of a process this test started.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _sibling = Kill(sibling);
    let pid = t.pid();
    let counts = || {
        let mut b = [0u8; 16];
        assert_eq!(
            pagewise_sys::process::process_vm_read(pid, addr, &mut b).unwrap(),
            16
        );
        [
            u64::from_ne_bytes(b[..8].try_into().unwrap()),
            u64::from_ne_bytes(b[8..].try_into().unwrap()),
        ]
    };
    // Both run before the stop (waited for, not timed).
    let a = counts();
    let t0 = Instant::now();
    while {
        let b = counts();
        b[0] == a[0] || b[1] == a[1]
    } {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the writers never ran"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(pagewise_mech::stop::memory_sharers(pid), vec![sibling]);
    let stopped = Stopped::new(pid).unwrap();
    assert!(
        !stopped.sharer_tids().is_empty(),
        "the sibling was not stopped"
    );
    let x = counts();
    std::thread::sleep(Duration::from_millis(50));
    let y = counts();
    assert_eq!(
        x, y,
        "a writer ran while the target was stopped (target, sibling)"
    );
    drop(stopped);
    let t0 = Instant::now();
    while {
        let z = counts();
        z[0] == y[0] || z[1] == y[1]
    } {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "a writer did not run again after the stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A process that has just been killed (a zombie, its memory gone) is
/// "exited", not a process without a vDSO.
#[test]
fn a_process_just_killed_is_said_to_have_exited() {
    let mut c = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = c.id() as i32;
    c.kill().unwrap();
    // Not reaped yet: a zombie until wait.
    let t0 = Instant::now();
    while pagewise_mech::procfs::is_alive(pid) {
        assert!(t0.elapsed() < Duration::from_secs(30), "it never died");
        std::thread::sleep(Duration::from_millis(2));
    }
    let e =
        pagewise_mech::inject::madvise_in(pid, &[(0x10000, 4096)], libc::MADV_MERGEABLE, "test")
            .unwrap_err();
    assert!(
        matches!(
            e,
            pagewise::MechError::NoSuchProcess(_) | pagewise::MechError::ProcessExited(_)
        ),
        "{e}"
    );
    let _ = c.wait();
}

/// A process without memory (a kernel thread here; a process in `exit`
/// whose memory is released is alike) shares it with none, though `kcmp`
/// finds all such alike, and is said to be ending.
#[test]
fn a_process_without_memory_shares_it_with_none() {
    let kernel_thread = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&p| !pagewise_mech::procfs::has_memory(p) && pagewise_mech::procfs::is_alive(p));
    let Some(k) = kernel_thread else {
        pagewise_testkit::skip!("no kernel thread is visible in this pid namespace");
        return;
    };
    assert!(pagewise_mech::procfs::is_ending(k));
    assert_eq!(pagewise_mech::stop::memory_sharers(k), Vec::<i32>::new());
    println!("ok   kernel thread {k}: no memory, no sharers, said to be ending");
}

/// A shim's hello naming memory that wraps the top of the address space is
/// refused, and the check of a range against the shim's memory cannot
/// overflow.
#[test]
fn a_shim_hello_past_the_top_of_memory_is_refused() {
    use pagewise_mech::inject::shim;
    let hello = |start: u64, len: u64| {
        let mut b = Vec::new();
        for v in [shim::MAGIC, shim::VERSION, 1, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&start.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        let (mut a, s) = std::os::unix::net::UnixStream::pair().unwrap();
        a.write_all(&b).unwrap();
        shim::ShimAdvice::hello(s, Duration::from_secs(5))
    };
    let e = hello(u64::MAX - 4095, 8192).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    let ok = hello(u64::MAX - 16383, 8192).unwrap();
    let inside = pagewise_mech::inject::Inside::Shim(ok);
    assert!(inside.is_own_memory(u64::MAX - 12287, u64::MAX));
    assert!(!inside.is_own_memory(u64::MAX - 4095, u64::MAX));
    assert!(!inside.is_own_memory(0x1000, 0x1000));
}

/// A process serving its own page faults (a userfaultfd of its own) is
/// refused by every kind of snapshot alike — plain, live, held for
/// rollback — before anything is read, and keeps working.
#[test]
fn every_snapshot_refuses_a_process_serving_its_own_faults() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some(path) = target("own_uffd", &[]) else {
        return;
    };
    let mut t = Target::start(&path, &[], true);
    let pid = t.pid();
    let refused = |what: &str, r: pagewise_snap::Result<()>| match r {
        Err(pagewise_snap::Error::ServesOwnFaults { pid: p, mappings }) => {
            assert_eq!(p, pid, "{what}");
            assert!(mappings > 0, "{what}: its userfaultfd covers no mapping");
        }
        other => panic!("{what}: {other:?}"),
    };
    let dir = std::env::temp_dir().join(format!("pagewise-own-uffd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut disk = pagewise_snap::DiskStore::create(&dir, true).unwrap();
    refused(
        "snapshot",
        pagewise_snap::remote::snapshot_process(pid, &mut disk, "x").map(|_| ()),
    );
    refused(
        "held for rollback",
        pagewise_snap::ProcessSnapshots::open(pid).map(|_| ()),
    );
    let mut dest = pagewise_snap::live::StoreSeries::new(&mut disk);
    refused(
        "live",
        pagewise_snap::live::live_snapshot(
            pid,
            &mut dest,
            "x",
            &pagewise_snap::live::LiveOptions::default(),
            &mut |_| {},
            &mut || {},
        )
        .map(|_| ()),
    );
    // Its own handler still serves it.
    t.child.stdin.as_mut().unwrap().write_all(b"7\n").unwrap();
    assert_eq!(t.line(), "ok");
    let _ = std::fs::remove_dir_all(&dir);
}
