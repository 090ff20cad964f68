//! A process held for a session of many stops ([`Held`]): every thread is
//! seized once and stays attached; each stop interrupts the threads and
//! each resume continues them, with none of a first stop's checks (the
//! listing of threads, `vfork`s, processes sharing the memory) repeated.
//!
//! While the process runs between two stops, a signal sent to it stops
//! the thread that takes it until the holder hands it over: at the next
//! stop, or at [`Held::pump`], which a holder that waits calls (it hands
//! over every such signal at once, as it came). A stop signal puts the
//! process in its group-stop as it would without pagewise, and it stays
//! there (`PTRACE_LISTEN`) until something continues it.

use super::{rewind_eintr, seize_more, settle, Stopped, STOP_WAIT};
use crate::{Error, Result};
use pagewise_sys::process::{self, TraceStop};
use std::time::Instant;

/// Signals whose default action stops the process.
const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGSTOP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// A process seized for a session: stopped, or running and still held
/// (see the module). Let go (detached, running) when dropped.
#[derive(Debug)]
pub struct Held {
    stopped: Stopped,
    running: bool,
    /// Its `/proc/PID/stat`, read again at every stop for the thread
    /// count.
    stat: std::fs::File,
    buf: Vec<u8>,
}

impl Held {
    /// Seizes and stops every thread of `pid` (as [`Stopped::new`]); held
    /// stopped.
    pub fn new(pid: i32) -> Result<Held> {
        let stopped = Stopped::new(pid)?;
        let stat = std::fs::File::open(format!("/proc/{pid}/stat"))
            .map_err(|e| Error::for_pid(pid, "opening /proc/PID/stat", e))?;
        Ok(Held {
            stopped,
            running: false,
            stat,
            buf: Vec::with_capacity(1024),
        })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.stopped.pid
    }

    /// Its threads, stopped: `None` while it runs.
    pub fn stopped(&self) -> Option<&Stopped> {
        (!self.running).then_some(&self.stopped)
    }

    fn all_tids(&self) -> impl Iterator<Item = i32> + '_ {
        self.stopped
            .tids
            .iter()
            .chain(&self.stopped.sharers)
            .copied()
    }

    /// Lets every thread run on, still held. A thread whose blocked call
    /// the stop ended with `EINTR` makes it again (see [`super`]), unless
    /// `rewound` says its registers were set by the holder.
    pub fn resume(&mut self, rewound: bool) -> Result<()> {
        if self.running {
            return Ok(());
        }
        let pid = self.pid();
        for tid in self.all_tids().collect::<Vec<_>>() {
            if !rewound {
                rewind_eintr(pid, tid);
            }
            match process::ptrace_cont(tid, 0) {
                Ok(()) => {}
                // Ended meanwhile (killed): the next stop finds it gone.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(Error::for_pid(pid, format!("PTRACE_CONT of {tid}"), e)),
            }
        }
        self.running = true;
        Ok(())
    }

    /// Stops every thread again (each interrupted, then waited for at most
    /// [`STOP_WAIT`], signals on the way handed over as they came).
    /// `Ok(false)` when the process now has threads the holder does not
    /// hold (made since the last stop): the caller decides
    /// ([`hold_new_threads`](Self::hold_new_threads)). A thread
    /// that ended is dropped from the held; the process having ended is
    /// [`Error::ProcessExited`].
    pub fn stop(&mut self) -> Result<bool> {
        if !self.running {
            return Ok(self.thread_count()? == self.stopped.tids.len());
        }
        let pid = self.pid();
        let tids: Vec<i32> = self.all_tids().collect();
        for &tid in &tids {
            if let Err(e) = process::ptrace_interrupt(tid) {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(Error::for_pid(pid, format!("PTRACE_INTERRUPT of {tid}"), e));
                }
            }
        }
        let deadline = Instant::now() + STOP_WAIT;
        let mut gone = Vec::new();
        for &tid in &tids {
            let owner = if self.stopped.tids.contains(&tid) {
                pid
            } else {
                tid
            };
            if !settle(owner, tid, deadline)? {
                gone.push(tid);
            }
        }
        self.stopped.tids.retain(|t| !gone.contains(t));
        self.stopped.sharers.retain(|t| !gone.contains(t));
        self.running = false;
        if self.stopped.tids.is_empty() {
            return Err(Error::ProcessExited(pid));
        }
        Ok(self.thread_count()? == self.stopped.tids.len())
    }

    /// Stopped: seizes and stops the threads made since the last stop
    /// (held from now on).
    pub fn hold_new_threads(&mut self) -> Result<()> {
        if self.running {
            self.stop()?;
        }
        let pid = self.pid();
        let known = self.stopped.tids.len();
        seize_more(
            pid,
            pid,
            &mut self.stopped.tids,
            known,
            STOP_WAIT,
            Vec::new(),
        )
    }

    /// The kernel's count of the process's threads (`/proc/PID/stat`
    /// field 20).
    fn thread_count(&mut self) -> Result<usize> {
        use std::os::unix::fs::FileExt;
        let pid = self.pid();
        self.buf.resize(4096, 0);
        let n = self
            .stat
            .read_at(&mut self.buf, 0)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ESRCH) => Error::ProcessExited(pid),
                _ => Error::for_pid(pid, "reading /proc/PID/stat", e),
            })?;
        let text = std::str::from_utf8(&self.buf[..n]).unwrap_or("");
        crate::procfs::stat_field(text, 20)
            .map(|t| t as usize)
            .ok_or_else(|| {
                Error::for_pid(
                    pid,
                    "reading the thread count of /proc/PID/stat",
                    std::io::Error::from(std::io::ErrorKind::InvalidData),
                )
            })
    }

    /// While it runs: hands over, without waiting, every signal that has
    /// stopped a thread on its way (see the module); how many.
    pub fn pump(&mut self) -> Result<usize> {
        if !self.running {
            return Ok(0);
        }
        let pid = self.pid();
        let mut handed = 0;
        for tid in self.all_tids().collect::<Vec<_>>() {
            let os = |what: &str, e| Error::for_pid(pid, format!("{what} of {tid}"), e);
            loop {
                match process::wait_traced_until(tid, Instant::now())
                    .map_err(|e| os("waiting", e))?
                {
                    None | Some(TraceStop::Gone) => break,
                    Some(TraceStop::Stopped { sig, event: 0 }) if sig != process::SYSCALL_STOP => {
                        process::ptrace_cont(tid, sig).map_err(|e| os("PTRACE_CONT", e))?;
                        handed += 1;
                    }
                    // Its group-stop: stopped, as without pagewise.
                    Some(TraceStop::Stopped { sig, event })
                        if event == process::PTRACE_EVENT_STOP && STOP_SIGNALS.contains(&sig) =>
                    {
                        process::ptrace_listen(tid).map_err(|e| os("PTRACE_LISTEN", e))?;
                        break;
                    }
                    Some(TraceStop::Stopped { .. }) => {
                        process::ptrace_cont(tid, 0).map_err(|e| os("PTRACE_CONT", e))?
                    }
                }
            }
        }
        Ok(handed)
    }
}

impl Drop for Held {
    /// Stopped again if it runs (a thread can only be let go stopped),
    /// then let go as every [`Stopped`] is.
    fn drop(&mut self) {
        if self.running {
            let _ = self.stop();
        }
    }
}
