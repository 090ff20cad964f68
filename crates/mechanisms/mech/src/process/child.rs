//! A child process's start and end: tied to the thread that starts it,
//! bounded waits, a polite stop, and the exit code a tool that ran it
//! reports as its own.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// Sets up `c` so that the program is sent SIGTERM if the thread that
/// starts it ends (killed with its process, or simply done) before the
/// program: every program pagewise starts is tied so, and none is left
/// running on its own when pagewise is killed. The tie is to the starting
/// *thread* (`PR_SET_PDEATHSIG`): start programs from a thread that lives
/// as long as they should. A set-user-ID program clears it at `exec`.
pub fn tie(c: &mut Command) {
    pagewise_sys::process::die_with_parent(c, libc::SIGTERM);
}

/// Waits up to `within` for `child` to end on its own; its status, or `None`
/// if it is still running.
pub fn wait_for(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if t0.elapsed() >= within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits up to `within` for `child` to exit (after it was asked to), then
/// kills it; reaps it either way and gives its status.
pub fn wait_or_kill(child: &mut Child, within: Duration) -> ExitStatus {
    if let Some(st) = wait_for(child, within) {
        return st;
    }
    let _ = child.kill();
    child.wait().unwrap_or_else(|_| {
        use std::os::unix::process::ExitStatusExt;
        ExitStatus::from_raw(libc::SIGKILL)
    })
}

/// Sends `child` signal `sig`, waits up to `within`, then kills it; its
/// status.
pub fn signal_then_kill(child: &mut Child, sig: i32, within: Duration) -> ExitStatus {
    let _ = pagewise_sys::process::kill(child.id() as i32, sig);
    wait_or_kill(child, within)
}

/// Asks `child` to stop (SIGTERM), waits up to `within`, then kills it.
pub fn stop(child: &mut Child, within: Duration) -> ExitStatus {
    signal_then_kill(child, libc::SIGTERM, within)
}

/// The status a tool that ran a command reports as its own, like `time` and
/// `strace`: the command's exit code, or 128 + the signal that killed it.
pub fn exit_code(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}
