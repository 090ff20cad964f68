//! Stopping another process briefly: every thread is seized with `ptrace`
//! and interrupted, and resumes when the [`Stopped`] guard is dropped. The
//! one place pagewise stops a process (snapshots of another process use it).
//!
//! `PTRACE_SEIZE` + `PTRACE_INTERRUPT` neither sends the process a signal nor
//! shows in its job control, unlike `SIGSTOP`; a program that is already
//! traced (by a debugger) cannot be seized and gets a clear error.

use crate::{procfs, Error, Result};
use pagewise_sys::process;

/// All threads of a process, stopped until this is dropped.
#[derive(Debug)]
pub struct Stopped {
    pid: i32,
    tids: Vec<i32>,
}

impl Stopped {
    /// Stops every thread of `pid`, including threads created meanwhile.
    pub fn new(pid: i32) -> Result<Self> {
        if !procfs::is_alive(pid) {
            return Err(Error::NoSuchProcess(pid));
        }
        let mut s = Stopped {
            pid,
            tids: Vec::new(),
        };
        // Threads may be created while we seize: repeat until none is new.
        loop {
            let mut new = 0;
            for tid in procfs::tasks(pid)? {
                if s.tids.contains(&tid) {
                    continue;
                }
                match process::ptrace_seize(tid) {
                    Ok(()) => {}
                    // The thread exited meanwhile.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                        return Err(Error::PermissionDenied {
                            pid,
                            what: format!(
                                "ptrace seize of thread {tid} (is it already traced by a debugger, or init?)"
                            ),
                        })
                    }
                    Err(e) => {
                        return Err(Error::for_pid(
                            pid,
                            format!("ptrace seize of thread {tid}"),
                            e,
                        ))
                    }
                }
                s.tids.push(tid);
                new += 1;
                process::ptrace_interrupt(tid).map_err(|e| {
                    Error::for_pid(pid, format!("ptrace interrupt of thread {tid}"), e)
                })?;
                let stopped = process::wait_stopped(tid).map_err(|e| {
                    Error::for_pid(pid, format!("waiting for thread {tid} to stop"), e)
                })?;
                if !stopped {
                    s.tids.retain(|&t| t != tid);
                }
            }
            if new == 0 {
                break;
            }
        }
        if s.tids.is_empty() {
            return Err(Error::ProcessExited(pid));
        }
        Ok(s)
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Threads stopped.
    pub fn threads(&self) -> usize {
        self.tids.len()
    }

    /// The stopped threads' ids.
    pub fn tids(&self) -> &[i32] {
        &self.tids
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &tid in &self.tids {
            // A thread that exited meanwhile cannot be detached; nothing to do.
            let _ = process::ptrace_detach(tid);
        }
    }
}
