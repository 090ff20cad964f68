//! CPU accounting: what an agent's own work costs, so that it can keep to
//! a CPU budget and report it.

use pagewise_sys::process;

/// CPU time of the calling thread, ms.
pub fn thread_cpu_ms() -> f64 {
    process::thread_cpu_ns() as f64 / 1e6
}
