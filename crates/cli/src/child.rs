//! Child processes the CLI starts.

use std::process::Child;
use std::time::{Duration, Instant};

/// Waits up to `within` for `child` to exit (after it was asked to), then
/// kills it; reaps it either way.
pub(crate) fn wait_or_kill(child: &mut Child, within: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The status a tool that ran a command reports as its own, like `time` and
/// `strace`: the command's exit code, or 128 + the signal that killed it.
pub(crate) fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Waits up to `within` for `child` to end on its own; its status, or `None`
/// if it is still running.
pub(crate) fn wait_for(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
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
