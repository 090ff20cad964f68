//! Whether the server a phase lost its connection to was ended by its
//! cgroup's OOM killer.

use pagewise_testkit::host::MemoryCgroup;
use std::time::{Duration, Instant};

/// Whether `pid` has ended. After a failed request (`failed`), an OOM kill
/// resets the connection before the process is seen to end: the cgroup's
/// count says so, or the process ends within 2 s.
pub(super) fn ended(pid: i32, cg: &MemoryCgroup, failed: bool) -> bool {
    let t0 = Instant::now();
    loop {
        if !pagewise_mech::procfs::is_alive(pid) || (failed && cg.oom_kills() > 0) {
            return true;
        }
        if !failed || t0.elapsed() >= Duration::from_secs(2) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
