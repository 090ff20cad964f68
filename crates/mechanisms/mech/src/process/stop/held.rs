//! A process held for a session of many stops ([`Held`]): every thread is
//! seized once and stays attached; each stop interrupts the threads and
//! each resume continues them, with none of a first stop's checks (the
//! listing of threads, `vfork`s, processes sharing the memory) repeated.
//!
//! While the process runs between two stops, a signal sent to it stops
//! the thread that takes it until the holder hands it over: at the next
//! stop, or at [`Held::hand_over_signals`], which a holder that waits calls (it hands
//! over every such signal at once, as it came). A stop signal puts the
//! process in its group-stop as it would without pagewise, and it stays
//! there (`PTRACE_LISTEN`) until something continues it.

use super::{rewind_eintr, seize_more, settle, Stopped, DEFAULT_IGNORED, STOP_WAIT};
use crate::{Error, Result};
use pagewise_sys::launch;
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
    /// Threads interrupted by a stop that failed before their own stop
    /// came: not interrupted again (a second interrupt would stop the
    /// thread once more after it is continued); their stop is taken by
    /// the next stop, [`Held::hand_over_signals`] or [`Held::wait_end`].
    pending: Vec<i32>,
    /// A thread stopped at the end of a run whose other threads did not
    /// all stop in time ([`Held::wait_end`] failed): held at its end, not
    /// interrupted; the next `wait_end` stops the others and returns the
    /// end, the next stop takes the process as it is.
    at_end: Option<(i32, RunEnd)>,
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
            pending: Vec::new(),
            at_end: None,
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

    /// The held threads that run while the process does: all but one held
    /// at its end (see [`wait_end`](Self::wait_end)).
    fn running_tids(&self) -> Vec<i32> {
        let ended = self.at_end.map(|(t, _)| t);
        self.all_tids().filter(|&t| Some(t) != ended).collect()
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
        self.halt(self.running_tids())?;
        self.at_end = None;
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
    pub fn hand_over_signals(&mut self) -> Result<usize> {
        if !self.running {
            return Ok(0);
        }
        let pid = self.pid();
        let mut handed = 0;
        for tid in self.running_tids() {
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
                        self.pending.retain(|&t| t != tid);
                        process::ptrace_cont(tid, 0).map_err(|e| os("PTRACE_CONT", e))?
                    }
                }
            }
        }
        Ok(handed)
    }
}

/// How a run of a held process ended ([`Held::wait_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// A thread called `exit_group` with this code, and stopped there for
    /// the holder (a filter answered the call with `SECCOMP_RET_TRACE`,
    /// see [`super::launch`]): the process is whole, held stopped.
    Exit(i32),
    /// A signal that would end the process (its default action, not
    /// caught, not ignored) stopped a thread on its way: held stopped,
    /// the signal not delivered.
    Signal(i32),
    /// The process ended all the same (killed with `SIGKILL`, say): its
    /// raw wait status.
    Ended(i32),
    /// Still running at the deadline.
    TimedOut,
}

impl Held {
    /// While it runs: waits until the run ends (see [`RunEnd`]), at most
    /// until `deadline` (`None`: as long as it takes, blocked in the
    /// kernel's wait when the process has one thread). Signals that do not
    /// end it are handed over as they come, and a stop signal leaves it in
    /// its group-stop (the caller's deadline, or a fuzzer's timeout, ends
    /// that). At an end, every other thread is stopped too; where one does
    /// not stop in time, the error is returned, the others run on and the
    /// end is held: the next call stops them and returns it.
    pub fn wait_end(&mut self, deadline: Option<Instant>) -> Result<RunEnd> {
        let pid = self.pid();
        if !self.running {
            return Err(Error::for_pid(
                pid,
                "waiting for the end of a run of a stopped process",
                std::io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        if let Some((tid, end)) = self.at_end {
            self.stop_others(tid)?;
            self.at_end = None;
            return Ok(end);
        }
        let os = |what: &str, tid: i32, e| Error::for_pid(pid, format!("{what} of {tid}"), e);
        let mut spins = 0u32;
        loop {
            let tids: Vec<i32> = self.all_tids().collect();
            let block = deadline.is_none() && tids.len() == 1;
            let mut got = None;
            for &tid in &tids {
                let flags = libc::__WALL | if block { 0 } else { libc::WNOHANG };
                let (r, st) = launch::wait_raw(tid, flags).map_err(|e| os("waiting", tid, e))?;
                if r == tid {
                    got = Some((tid, st));
                    break;
                }
            }
            let Some((tid, st)) = got else {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(RunEnd::TimedOut);
                }
                spins += 1;
                if spins < 200 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                continue;
            };
            if !libc::WIFSTOPPED(st) {
                self.stopped.tids.retain(|&t| t != tid);
                self.stopped.sharers.retain(|&t| t != tid);
                if tid == pid || self.stopped.tids.is_empty() {
                    self.stopped.tids.clear();
                    self.running = false;
                    self.at_end = None;
                    return Ok(RunEnd::Ended(st));
                }
                continue;
            }
            let (sig, event) = (libc::WSTOPSIG(st), (st >> 16) & 0xff);
            let end = if event == launch::PTRACE_EVENT_SECCOMP {
                match launch::ptrace_syscall_info(tid) {
                    Ok(launch::SyscallStop::Seccomp { nr, args }) if nr == libc::SYS_exit_group => {
                        Some(RunEnd::Exit(args[0] as i32))
                    }
                    _ => None,
                }
            } else if event == 0 && sig != process::SYSCALL_STOP {
                if self.ends_process(sig) {
                    Some(RunEnd::Signal(sig))
                } else {
                    process::ptrace_cont(tid, sig).map_err(|e| os("PTRACE_CONT", tid, e))?;
                    continue;
                }
            } else if event == process::PTRACE_EVENT_STOP && STOP_SIGNALS.contains(&sig) {
                process::ptrace_listen(tid).map_err(|e| os("PTRACE_LISTEN", tid, e))?;
                continue;
            } else {
                None
            };
            match end {
                Some(end) => {
                    self.at_end = Some((tid, end));
                    self.stop_others(tid)?;
                    self.at_end = None;
                    return Ok(end);
                }
                None => {
                    self.pending.retain(|&t| t != tid);
                    process::ptrace_cont(tid, 0).map_err(|e| os("PTRACE_CONT", tid, e))?
                }
            }
        }
    }

    /// Whether `sig`, delivered now, would end the process.
    fn ends_process(&self, sig: libc::c_int) -> bool {
        // Those whose default action is to do nothing, or to stop.
        if DEFAULT_IGNORED & pagewise_sys::signal::bit(sig) != 0 || STOP_SIGNALS.contains(&sig) {
            return false;
        }
        match crate::procfs::thread_signals(self.pid(), self.pid()) {
            Ok(s) => (s.caught | s.ignored) & pagewise_sys::signal::bit(sig) == 0,
            Err(_) => true,
        }
    }

    /// Stops every thread but `tid` (stopped already); held stopped.
    fn stop_others(&mut self, tid: i32) -> Result<()> {
        self.halt(self.all_tids().filter(|&t| t != tid).collect())
    }

    /// Interrupts `others` and waits for each (at most [`STOP_WAIT`],
    /// signals on the way handed over as they came); held stopped, the
    /// threads that ended dropped. Where a thread does not stop in time,
    /// the others are still awaited, then those stopped run on and the
    /// process stays running, held: the late threads' stops are taken
    /// later (see `pending`).
    fn halt(&mut self, others: Vec<i32>) -> Result<()> {
        let pid = self.pid();
        for &t in &others {
            if self.pending.contains(&t) {
                continue;
            }
            if let Err(e) = process::ptrace_interrupt(t) {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(Error::for_pid(pid, format!("PTRACE_INTERRUPT of {t}"), e));
                }
            }
        }
        let deadline = Instant::now() + STOP_WAIT;
        let mut gone = Vec::new();
        let mut halted = Vec::new();
        let mut failed = None;
        self.pending.retain(|t| !others.contains(t));
        for &t in &others {
            let owner = if self.stopped.tids.contains(&t) {
                pid
            } else {
                t
            };
            match settle(owner, t, deadline) {
                Ok(true) => halted.push(t),
                Ok(false) => gone.push(t),
                Err(e) => {
                    self.pending.push(t);
                    failed.get_or_insert(e);
                }
            }
        }
        self.stopped.tids.retain(|t| !gone.contains(t));
        self.stopped.sharers.retain(|t| !gone.contains(t));
        if let Some(e) = failed {
            for &t in &halted {
                rewind_eintr(pid, t);
                let _ = process::ptrace_cont(t, 0);
            }
            return Err(e);
        }
        self.running = false;
        Ok(())
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
