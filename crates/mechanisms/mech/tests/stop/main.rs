//! Stopping another process (`pagewise_mech::stop`), which snapshots and the
//! soft-dirty backend rely on to lose no write: while a [`Stopped`] guard
//! lives, no thread of the target runs (counters written by every thread
//! stand still); dropped, the target runs again; a target its user had
//! stopped stays stopped; a missing process is a clear error.

use pagewise_testkit::targets as common;

use common::{can_ptrace, fds};
use pagewise_mech::stop::Stopped;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A child with four threads, each incrementing its own counter in a shared
/// anonymous mapping as fast as it can; the mapping is inherited.
struct Spinner {
    pid: i32,
    counters: *const std::sync::atomic::AtomicU64,
}

impl Spinner {
    fn start() -> Spinner {
        // SAFETY: a fresh shared anonymous mapping of one page.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let counters = p as *const std::sync::atomic::AtomicU64;
        // SAFETY: the child calls only pthread_create (glibc's fork leaves
        // the allocator's locks free in the child) and spins on atomics in
        // the shared page; it never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            extern "C" fn spin(arg: *mut libc::c_void) -> *mut libc::c_void {
                let c = arg as *const std::sync::atomic::AtomicU64;
                loop {
                    // SAFETY: a counter inside the shared page.
                    unsafe { (*c).fetch_add(1, std::sync::atomic::Ordering::Relaxed) };
                }
            }
            for i in 1..4 {
                let mut t: libc::pthread_t = 0;
                // SAFETY: starting a thread on a plain extern "C" function.
                unsafe {
                    libc::pthread_create(&mut t, std::ptr::null(), spin, counters.add(i) as *mut _)
                };
            }
            spin(counters as *mut _);
        }
        Spinner { pid, counters }
    }

    fn counts(&self) -> [u64; 4] {
        // SAFETY: the shared page holds four counters.
        std::array::from_fn(|i| unsafe {
            (*self.counters.add(i)).load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// Waits until every counter has moved past `from` (a liveness bound
    /// of a minute: a thread that never runs is a failure).
    fn wait_all_advance(&self, from: [u64; 4]) {
        let t0 = std::time::Instant::now();
        loop {
            let now = self.counts();
            if (0..4).all(|i| now[i] > from[i]) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "a thread did not run: {from:?} -> {now:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap();
        stat[stat.rfind(')').unwrap() + 2..].chars().next().unwrap()
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

#[test]
fn every_thread_stands_still_while_stopped() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let s = Spinner::start();
    // Every thread runs before the stop (waited for, not timed).
    s.wait_all_advance(s.counts());
    let stopped = Stopped::new(s.pid).unwrap();
    assert_eq!(stopped.threads(), 4);
    let a = s.counts();
    std::thread::sleep(Duration::from_millis(200));
    let b = s.counts();
    assert_eq!(a, b, "a thread ran while the process was stopped");
    drop(stopped);
    // And every one runs again after it.
    s.wait_all_advance(b);
}

/// A process its user stopped (SIGSTOP) is not resumed by pagewise.
#[test]
fn a_process_stopped_by_its_user_stays_stopped() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let s = Spinner::start();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: our own child.
    unsafe { libc::kill(s.pid, libc::SIGSTOP) };
    let t0 = std::time::Instant::now();
    while s.state() != 'T' && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.state(), 'T');
    let stopped = Stopped::new(s.pid).unwrap();
    drop(stopped);
    std::thread::sleep(Duration::from_millis(200));
    let a = s.counts();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.counts(), a, "the process ran after pagewise let it go");
    assert_eq!(s.state(), 'T', "the process is no longer stopped");
    // SAFETY: our own child.
    unsafe { libc::kill(s.pid, libc::SIGCONT) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(s.counts()[0] > a[0], "SIGCONT did not resume it");
}

#[test]
fn missing_processes_are_clear_errors() {
    let e = Stopped::new(999_999_999).unwrap_err();
    assert!(
        matches!(e, pagewise::MechError::NoSuchProcess(999_999_999)),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("no process with pid 999999999"), "{e}");
    // A process that exited (a zombie until reaped).
    let mut c = Command::new("true").stdout(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let e = Stopped::new(c.id() as i32).unwrap_err();
    assert!(
        matches!(
            e,
            pagewise::MechError::NoSuchProcess(_) | pagewise::MechError::ProcessExited(_)
        ),
        "{e:?}"
    );
    let _ = c.wait();
}

/// System calls made inside a stopped process return what they would there,
/// leave no descriptor behind, and the process runs on as before: spinning
/// threads keep counting, and a thread asleep in `nanosleep` (interrupted
/// by the stop) finishes its sleep and exits normally.
#[test]
fn system_calls_inside_another_process() {
    use pagewise_mech::inject::Remote;
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let s = Spinner::start();
    std::thread::sleep(Duration::from_millis(100));
    let fds_before = fds(s.pid);
    let stopped = Stopped::new(s.pid).unwrap();
    let r = Remote::new(&stopped).unwrap();
    assert_eq!(r.syscall(libc::SYS_getpid, [0; 6]).unwrap(), s.pid as i64);
    let fd = r
        .syscall(
            libc::SYS_userfaultfd,
            [(libc::O_CLOEXEC | libc::O_NONBLOCK) as u64, 0, 0, 0, 0, 0],
        )
        .unwrap();
    assert!(fd >= 0, "userfaultfd in the target: {fd}");
    assert!(fds(s.pid).contains(&fd.to_string()));
    let mine = r.take_fd(fd as i32).unwrap();
    let link = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&mine)
    ))
    .unwrap();
    assert!(link.to_string_lossy().contains("userfaultfd"), "{link:?}");
    assert_eq!(fds(s.pid), fds_before, "no descriptor left in the target");
    // A failing call gives its errno.
    assert_eq!(
        r.syscall(libc::SYS_close, [9999, 0, 0, 0, 0, 0]).unwrap(),
        -(libc::EBADF as i64)
    );
    drop(stopped);
    let a = s.counts();
    std::thread::sleep(Duration::from_millis(100));
    let b = s.counts();
    assert!(
        (0..4).all(|i| b[i] > a[i]),
        "every thread runs on: {a:?} {b:?}"
    );

    // A process asleep in a system call: the sleep restarts and completes.
    let mut sleeper = Command::new("sleep").arg("0.5").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = std::time::Instant::now();
    {
        let stopped = Stopped::new(sleeper.id() as i32).unwrap();
        let r = Remote::new(&stopped).unwrap();
        assert_eq!(
            r.syscall(libc::SYS_getppid, [0; 6]).unwrap(),
            std::process::id() as i64
        );
    }
    let st = sleeper.wait().unwrap();
    assert!(st.success(), "sleep ended with {st:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "the interrupted sleep was cut short: {:?}",
        t0.elapsed()
    );
}

/// `remote::read` of more than `process_vm_readv` moves in one call (about
/// 2 GiB): the bytes past 2 GiB are the process's, not zeros.
#[test]
fn reading_more_than_2_gib_of_another_process() {
    const LEN: usize = (2 << 30) + (256 << 20);
    // SAFETY: a fresh private anonymous mapping, left unpopulated but for
    // the marker pages (reads of the rest map the zero page).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let marks = [0usize, 1 << 30, (2 << 30) + 4096, LEN - 4096];
    for (i, &m) in marks.iter().enumerate() {
        // SAFETY: inside the mapping.
        unsafe { *(p as *mut u8).add(m + 7) = 0xA0 + i as u8 };
    }
    // Read our own memory through the same path as another process's.
    let me = std::process::id() as i32;
    let mut buf = vec![0u8; LEN];
    let n = pagewise_mech::remote::read(me, p as u64, &mut buf).unwrap();
    assert_eq!(n, LEN, "a short read");
    for (i, &m) in marks.iter().enumerate() {
        assert_eq!(buf[m + 7], 0xA0 + i as u8, "the byte at {m:#x}");
    }
    drop(buf);
    // SAFETY: our own mapping, no longer referenced.
    unsafe { libc::munmap(p, LEN) };
}

/// `madvise` made by another process itself, on ranges of its own: KSM is
/// allowed on exactly the ranges asked for (`mg` in smaps), then taken back;
/// the process's threads run on.
#[test]
fn madvise_inside_another_process() {
    use pagewise_mech::inject::madvise_in;
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    // One mapping of 48 pages the child inherits; advice on its first and
    // last 16 pages splits it in three.
    let page = 4096usize;
    // SAFETY: a fresh private anonymous mapping of 3 x 16 pages.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            48 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let a = base as u64;
    let (b, c) = (a + 16 * page as u64, a + 32 * page as u64);
    let s = Spinner::start();
    // SAFETY: this process's copy goes; the child keeps its own.
    unsafe { libc::munmap(base, 48 * page) };
    std::thread::sleep(Duration::from_millis(50));
    let mergeable = |pid| pagewise_mech::procfs::with_vm_flag(Some(pid), &["mg"]).unwrap();
    assert!(mergeable(s.pid).is_empty(), "nothing mergeable at first");
    let len = 16 * page as u64;
    let done = madvise_in(s.pid, &[(a, len), (c, len)], libc::MADV_MERGEABLE, "test").unwrap();
    assert_eq!(done, vec![len, len]);
    let m = mergeable(s.pid);
    assert_eq!(
        m,
        vec![(a, b), (c, c + len)],
        "exactly the ranges asked for"
    );
    let done = madvise_in(s.pid, &[(a, len), (c, len)], libc::MADV_UNMERGEABLE, "test").unwrap();
    assert_eq!(done, vec![len, len]);
    assert!(mergeable(s.pid).is_empty(), "taken back");
    let x = s.counts();
    std::thread::sleep(Duration::from_millis(100));
    let y = s.counts();
    assert!(
        (0..4).all(|i| y[i] > x[i]),
        "every thread runs on: {x:?} {y:?}"
    );
}
