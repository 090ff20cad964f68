//! Stopping another process (`pagewise::stop`), which snapshots and the
//! soft-dirty backend rely on to lose no write: while a [`Stopped`] guard
//! lives, no thread of the target runs (counters written by every thread
//! stand still); dropped, the target runs again; a target its user had
//! stopped stays stopped; a missing process is a clear error.

use pagewise::stop::Stopped;
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

fn can_ptrace() -> Option<String> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
    // SAFETY: geteuid has no preconditions.
    if scope.trim() == "3" || (scope.trim() == "2" && unsafe { libc::geteuid() } != 0) {
        return Some(format!(
            "ptrace is restricted here (kernel.yama.ptrace_scope = {})",
            scope.trim()
        ));
    }
    None
}

#[test]
fn every_thread_stands_still_while_stopped() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let s = Spinner::start();
    std::thread::sleep(Duration::from_millis(200));
    let before = s.counts();
    assert!(
        before.iter().all(|&c| c > 0),
        "the threads never ran: {before:?}"
    );
    let stopped = Stopped::new(s.pid).unwrap();
    assert_eq!(stopped.threads(), 4);
    let a = s.counts();
    std::thread::sleep(Duration::from_millis(200));
    let b = s.counts();
    assert_eq!(a, b, "a thread ran while the process was stopped");
    drop(stopped);
    std::thread::sleep(Duration::from_millis(200));
    let c = s.counts();
    for i in 0..4 {
        assert!(c[i] > b[i], "thread {i} did not run again: {b:?} -> {c:?}");
    }
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
        matches!(e, pagewise::Error::NoSuchProcess(999_999_999)),
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
            pagewise::Error::NoSuchProcess(_) | pagewise::Error::ProcessExited(_)
        ),
        "{e:?}"
    );
    let _ = c.wait();
}
