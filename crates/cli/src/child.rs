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
