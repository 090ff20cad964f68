//! Stopping another process briefly: every thread is seized with `ptrace`
//! and interrupted, and resumes when the [`Stopped`] guard is dropped. The
//! one place pagewise stops a process (snapshots of another process and
//! every call made inside one use it).
//!
//! `PTRACE_SEIZE` + `PTRACE_INTERRUPT` neither sends the process a signal nor
//! shows in its job control, unlike `SIGSTOP`; a program that is already
//! traced (by a debugger) cannot be seized and gets a clear error.
//!
//! What the target keeps:
//! - **Its signals.** A signal that a thread takes on its way into the stop
//!   (it arrived between the seize and the interrupt) is delivered as it
//!   came, with its siginfo, before the thread stands still: nothing is
//!   discarded.
//! - **Its system calls' results.** A thread blocked in a call that Linux
//!   ends with `EINTR` after any stop, whatever `SA_RESTART` says
//!   (`signal(7)`: `epoll_wait`, `semop`, `sigtimedwait`, socket calls with
//!   a timeout), and that has no signal to take, is rewound when it is let
//!   go to make the same call again (instruction pointer back over the
//!   `syscall`, the call's number back in `rax`): the program never sees
//!   the `EINTR`. What remains: a relative timeout starts again in full.
//! - **Bounded waits.** A thread that does not stop within the limit (a
//!   `vfork` parent waits for its child uninterruptibly) is not waited for
//!   forever: a `vfork` in progress is waited out up to the limit, then
//!   refused with the reason; a thread that began one between the check and
//!   the interrupt is left seized and let go as soon as it stops (by the
//!   next stop made from the same thread, or when this process ends).

mod held;
pub mod launch;

pub use crate::error::Refusal;
use crate::procfs;
use crate::{Error, Result};
pub use held::{Held, RunEnd};
use pagewise_sys::process::{self, TraceStop};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long [`Stopped::new`] waits for one thread to stop, and for a
/// `vfork` in progress to end.
pub const STOP_WAIT: Duration = Duration::from_secs(3);

/// Signals handed back on the way into one stop before it gives up (a
/// process flooded with signals still stops after this many).
const MAX_HANDED_BACK: u32 = 10_000;

/// How many times [`STOP_WAIT`] (or the wait given) a process's threads
/// are chased while it keeps making new ones.
const GROWING_LIMIT: u32 = 10;

/// Threads seized whose stop never came in time: (tracer thread, pid, tid),
/// let go by [`release_stragglers`] once they stop.
static STRAGGLERS: Mutex<Vec<(i32, i32, i32)>> = Mutex::new(Vec::new());

/// The calling thread's id (ptrace belongs to the tracer thread).
fn gettid() -> i32 {
    process::gettid()
}

/// Lets go of the threads an earlier stop from this thread seized but
/// could not wait for (see the module), now that they have stopped.
pub fn release_stragglers() {
    let me = gettid();
    let mut s = STRAGGLERS.lock().unwrap_or_else(|e| e.into_inner());
    s.retain(|&(tracer, _, tid)| {
        if tracer != me {
            return true;
        }
        match process::wait_traced_until(tid, Instant::now()) {
            Ok(Some(TraceStop::Stopped { .. })) => {
                let _ = process::ptrace_detach(tid);
                false
            }
            Ok(None) => true,
            // Gone, or no longer ours.
            _ => false,
        }
    });
}

/// Lets go of thread `tid`, seized by mistake (a thread of another
/// process that took a listed thread's id): stopped, as a seized thread
/// must be to be let go, and let go at once; left to
/// [`release_stragglers`] if it does not stop in time.
fn let_go_of_stranger(tid: i32) {
    if process::ptrace_interrupt(tid).is_err() {
        return;
    }
    match settle(tid, tid, Instant::now() + STOP_WAIT) {
        Ok(true) => {
            let _ = process::ptrace_detach(tid);
        }
        Ok(false) => {}
        Err(_) => STRAGGLERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((gettid(), tid, tid)),
    }
}

/// Whether a thread of `pid` left seized by an earlier stop is still
/// waiting to be let go.
fn straggler_of(pid: i32) -> Option<i32> {
    let s = STRAGGLERS.lock().unwrap_or_else(|e| e.into_inner());
    s.iter().find(|&&(_, p, _)| p == pid).map(|&(_, _, t)| t)
}

/// `CLONE_VFORK`.
const CLONE_VFORK: u64 = 0x4000;

/// Whether thread `tid` of `pid` is waiting for a child it vforked.
fn in_vfork(pid: i32, tid: i32) -> bool {
    let Ok(Some((nr, args))) = procfs::thread_syscall(pid, tid) else {
        return false;
    };
    match nr {
        libc::SYS_vfork => true,
        libc::SYS_clone => args[0] & CLONE_VFORK != 0,
        libc::SYS_clone3 => {
            // The flags are the first field of `struct clone_args`.
            let mut f = [0u8; 8];
            matches!(process::process_vm_read(pid, args[0], &mut f), Ok(8))
                && u64::from_ne_bytes(f) & CLONE_VFORK != 0
        }
        _ => false,
    }
}

/// Waits, up to `deadline`, until no thread of `pid` is waiting for a
/// vforked child; refused with the reason after.
fn wait_out_vfork(pid: i32, deadline: Instant) -> Result<()> {
    loop {
        let busy = procfs::tasks(pid)?.into_iter().find(|&t| in_vfork(pid, t));
        let Some(tid) = busy else { return Ok(()) };
        if Instant::now() >= deadline {
            return Err(Refusal::InVfork { pid, tid }.into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How much longer than its wait a thread that is runnable (state `R`),
/// or waits for anything but a vforked child, is awaited: it stops as soon
/// as it runs, which a machine crowded with runnable threads can take
/// seconds to let it do. A vfork parent is not.
const RUNNABLE_GRACE: Duration = Duration::from_secs(30);

/// Waits until seized thread `tid` stands in the stop its interrupt asked
/// for (`PTRACE_EVENT_STOP`), delivering on the way every signal it takes
/// (with its own siginfo: continued from its signal-delivery stop with the
/// same signal; the interrupt still pending stops it right after).
/// `Ok(false)` if the thread ended; [`Refusal::NotStopping`] if it did not stop by
/// `deadline` (by [`RUNNABLE_GRACE`] later unless it is a vfork parent). Callers
/// issue the interrupt first.
pub(crate) fn settle(pid: i32, tid: i32, deadline: Instant) -> Result<bool> {
    let os = |what: &str, e| Error::for_pid(pid, format!("{what} of thread {tid}"), e);
    let last = deadline + RUNNABLE_GRACE;
    let mut deadline = deadline;
    for _ in 0..MAX_HANDED_BACK {
        match process::wait_traced_until(tid, deadline)
            .map_err(|e| os("waiting for the stop", e))?
        {
            // Runnable, or in a short uninterruptible wait (a lock that
            // hundreds of threads of the process want, say): it stops once
            // it gets a CPU. A vfork parent waits for its child, for ever
            // perhaps.
            None if Instant::now() < last
                && (procfs::thread_runnable(tid) || !in_vfork(pid, tid)) =>
            {
                deadline = (Instant::now() + Duration::from_millis(100)).min(last);
            }
            None => return Err(Refusal::NotStopping { pid, tid }.into()),
            Some(TraceStop::Gone) => return Ok(false),
            Some(TraceStop::Stopped { event, .. }) if event == process::PTRACE_EVENT_STOP => {
                return Ok(true)
            }
            // A signal-delivery stop: the signal goes on as it came.
            Some(TraceStop::Stopped { sig, event: 0 }) if sig != process::SYSCALL_STOP => {
                process::ptrace_cont(tid, sig).map_err(|e| os("PTRACE_CONT", e))?
            }
            Some(TraceStop::Stopped { .. }) => {
                process::ptrace_cont(tid, 0).map_err(|e| os("PTRACE_CONT", e))?
            }
        }
    }
    Err(Refusal::SignalStorm {
        pid,
        tid,
        n: MAX_HANDED_BACK,
    }
    .into())
}

/// All threads of a process, and of every process sharing its memory,
/// stopped until this is dropped.
#[derive(Debug)]
pub struct Stopped {
    pid: i32,
    tids: Vec<i32>,
    /// Threads of other processes that share its memory (`CLONE_VM`).
    sharers: Vec<i32>,
}

/// The other processes that share `pid`'s memory (`kcmp(KCMP_VM)`). Only
/// `clone(CLONE_VM)` makes one, so the candidates are the process's
/// parent, its parent's other children (`CLONE_PARENT`) and its own
/// children, then the children of every sharer found; where the kernel
/// does not list children, every process this one may inspect.
pub fn memory_sharers(pid: i32) -> Vec<i32> {
    let me = std::process::id() as i32;
    // `kcmp` finds two processes without memory alike (a kernel thread and
    // a process in `exit` whose memory is released): only one with memory
    // shares it.
    if !procfs::has_memory(pid) {
        return Vec::new();
    }
    let shares = |p: i32| {
        p != pid
            && p != me
            && process::share_memory(pid, p).unwrap_or(false)
            && procfs::has_memory(p)
    };
    let tree = (|| {
        let parent = procfs::parent(pid)?;
        let mut todo = procfs::children(pid)?;
        if parent > 1 {
            todo.push(parent);
        }
        todo.extend(procfs::children(parent)?);
        Some(todo)
    })();
    let mut out: Vec<i32> = match tree {
        Some(mut todo) => {
            let mut found = Vec::new();
            let mut seen = std::collections::BTreeSet::new();
            while let Some(p) = todo.pop() {
                if !seen.insert(p) || !shares(p) {
                    continue;
                }
                found.push(p);
                todo.extend(procfs::children(p).unwrap_or_default());
            }
            found
        }
        None => {
            let Ok(dir) = std::fs::read_dir("/proc") else {
                return Vec::new();
            };
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .filter(|&p| shares(p))
                .collect()
        }
    };
    out.sort_unstable();
    out
}

/// The error of a refused `PTRACE_SEIZE` of thread `tid` of `owner`.
fn seize_error(pid: i32, owner: i32, tid: i32, e: std::io::Error) -> Error {
    if e.raw_os_error() != Some(libc::EPERM) {
        return Error::for_pid(pid, format!("ptrace seize of thread {tid}"), e);
    }
    // Another tracer (a debugger, strace): say so, whoever we are.
    let status =
        std::fs::read_to_string(format!("/proc/{owner}/task/{tid}/status")).unwrap_or_default();
    let tracer = procfs::status_field(&status, "TracerPid").unwrap_or(0);
    if tracer != 0 && tracer != std::process::id() as u64 {
        return Refusal::Traced {
            feature: "pagewise",
            pid: owner,
            tracer,
        }
        .into();
    }
    Error::PermissionDenied {
        pid,
        what: if owner == pid {
            format!("ptrace seize of thread {tid} (is it already traced by a debugger, or init?)")
        } else {
            format!("ptrace seize of thread {tid} of process {owner}, which shares its memory")
        },
    }
}

/// Seizes and stops every thread of process `owner` (repeating until no
/// new thread appears), adding them to `tids`; `pid` is the process the
/// stop is for, named in errors.
///
/// `interrupted`: threads of `owner` already seized and interrupted (while
/// its cgroup was frozen, see [`StoppedGroup`]), waited for first.
fn seize_all(
    pid: i32,
    owner: i32,
    tids: &mut Vec<i32>,
    limit: Duration,
    mut interrupted: Vec<i32>,
) -> Result<()> {
    seize_more(pid, owner, tids, 0, limit, std::mem::take(&mut interrupted))
}

/// As [`seize_all`], `known` threads of `owner` at the start of `tids`
/// being held stopped already.
fn seize_more(
    pid: i32,
    owner: i32,
    tids: &mut Vec<i32>,
    known: usize,
    limit: Duration,
    mut interrupted: Vec<i32>,
) -> Result<()> {
    let t0 = Instant::now();
    // When a listing last found a thread not held: a pool whose threads
    // each start a successor and end keeps a few running ahead of the
    // listings for a while (a listing walked while a thread ends stops
    // short), and is caught as long as listings keep finding threads.
    let mut found_at = t0;
    // Threads of `owner` held.
    let mut held = known + interrupted.len();
    loop {
        let mut new = interrupted.len();
        // Threads listed that are ending: they cannot be seized (EPERM),
        // run no more code, and still count until they are gone.
        let mut ending = Vec::new();
        tids.extend_from_slice(&interrupted);
        let mut seized = std::mem::take(&mut interrupted);
        let threads = match procfs::tasks(owner) {
            Ok(t) => t,
            // A sharer that ended meanwhile.
            Err(_) if owner != pid => return Ok(()),
            Err(e) => return Err(e),
        };
        // An error stops the listing; the threads seized so far are
        // waited for first (a thread seized but not stopped cannot be let
        // go), then it is returned.
        let mut failure = None;
        for tid in threads {
            // Ended since the listing, its id taken by another process's
            // thread (checked again once seized).
            if tids.contains(&tid) || !procfs::thread_of(owner, tid) {
                continue;
            }
            match process::ptrace_seize(tid) {
                Ok(()) => {}
                // The thread exited meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                // A thread on its way out (a zombie) cannot be seized.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) && procfs::thread_ending(tid) => {
                    ending.push(tid);
                    continue;
                }
                Err(e) => {
                    failure = Some(seize_error(pid, owner, tid, e));
                    break;
                }
            }
            // Its id freed and taken by another process's thread between
            // the listing and the seize (thread ids wrap around within
            // seconds where threads churn): not ours, let go. Seized, it
            // keeps its id until let go.
            if !procfs::thread_of(owner, tid) {
                let_go_of_stranger(tid);
                continue;
            }
            tids.push(tid);
            new += 1;
            held += 1;
            // Interrupted now, waited for below: every thread of the
            // listing stops at once, not one after another.
            if let Err(e) = process::ptrace_interrupt(tid) {
                failure = Some(Error::for_pid(
                    pid,
                    format!("ptrace interrupt of thread {tid}"),
                    e,
                ));
            }
            seized.push(tid);
            if failure.is_some() {
                break;
            }
        }
        let deadline = Instant::now() + limit;
        for (k, &tid) in seized.iter().enumerate() {
            match settle(owner, tid, deadline) {
                Ok(true) => {}
                Ok(false) => {
                    tids.retain(|&t| t != tid);
                    held -= 1;
                }
                Err(e) => {
                    // Seized but not stopped: it cannot be detached until
                    // it stops (see the module); nor can those not yet
                    // waited for.
                    let mut s = STRAGGLERS.lock().unwrap_or_else(|e| e.into_inner());
                    for &t in &seized[k..] {
                        tids.retain(|&x| x != t);
                        s.push((gettid(), pid, t));
                    }
                    return Err(e);
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if new > 0 {
            found_at = Instant::now();
            if t0.elapsed() <= limit * GROWING_LIMIT {
                continue;
            }
        }
        // A listing made while threads end can miss threads that run on
        // (the kernel lists a directory by position): done only once the
        // kernel's count has no thread besides those held and those ending.
        let Some(counted) = procfs::thread_count(owner) else {
            return Ok(());
        };
        // Only the ending threads still there once the count was read are
        // in it: one released meanwhile must not stand for a thread the
        // listing missed, which would run on unheld.
        let ending = ending.iter().filter(|&&t| procfs::thread_zombie(t)).count();
        if counted <= held + ending {
            return Ok(());
        }
        // Given up when no listing found a thread for `limit` though the
        // count says there are more, or after `GROWING_LIMIT` times `limit`
        // in all.
        if found_at.elapsed() > limit || t0.elapsed() > limit * GROWING_LIMIT {
            return Err(Refusal::ThreadsUncounted {
                pid: owner,
                held,
                counted,
                ms: t0.elapsed().as_millis() as u64,
            }
            .into());
        }
        std::thread::yield_now();
    }
}

impl Stopped {
    /// Stops every thread of `pid`, including threads created meanwhile;
    /// waits at most [`STOP_WAIT`] for each.
    pub fn new(pid: i32) -> Result<Self> {
        Self::within(pid, STOP_WAIT)
    }

    /// As [`Stopped::new`], waiting at most `limit` for a thread to stop
    /// (and for a `vfork` in progress to end).
    pub fn within(pid: i32, limit: Duration) -> Result<Self> {
        Self::after_interrupt(pid, limit, Vec::new())
    }

    /// As [`Stopped::within`], `interrupted` being threads of `pid` seized
    /// and interrupted already (and not waited for).
    fn after_interrupt(pid: i32, limit: Duration, interrupted: Vec<i32>) -> Result<Self> {
        release_stragglers();
        // Threads interrupted already are waited for whatever else holds.
        if interrupted.is_empty() {
            if !procfs::is_alive(pid) {
                return Err(Error::NoSuchProcess(pid));
            }
            if let Some(tid) = straggler_of(pid) {
                return Err(Refusal::Straggler { pid, tid }.into());
            }
            wait_out_vfork(pid, Instant::now() + limit)?;
        }
        let mut s = Stopped {
            pid,
            tids: Vec::new(),
            sharers: Vec::new(),
        };
        seize_all(pid, pid, &mut s.tids, limit, interrupted)?;
        if s.tids.is_empty() {
            return Err(Error::ProcessExited(pid));
        }
        // Processes that share its memory without being its threads
        // (clone(CLONE_VM) without CLONE_THREAD) write the same pages.
        for other in memory_sharers(pid) {
            wait_out_vfork(other, Instant::now() + limit)?;
            seize_all(pid, other, &mut s.sharers, limit, Vec::new())?;
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

    /// The stopped threads' ids (of the process itself).
    pub fn tids(&self) -> &[i32] {
        &self.tids
    }

    /// The stopped threads of other processes that share its memory.
    pub fn sharer_tids(&self) -> &[i32] {
        &self.sharers
    }
}

/// x86-64 system calls that Linux ends with `EINTR` after a stop even
/// with `SA_RESTART` (`signal(7)`), and the reads and writes that do so on
/// a socket with a timeout: rewound at the end of a stop (see the module).
#[cfg(target_arch = "x86_64")]
const EINTR_AFTER_STOP: &[i64] = &[
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_sendmmsg,
    libc::SYS_accept,
    libc::SYS_accept4,
];

/// Signals whose default action is to do nothing (they interrupt no call
/// unless caught): SIGCHLD, SIGCONT, SIGURG, SIGWINCH.
const DEFAULT_IGNORED: u64 = pagewise_sys::signal::bit(libc::SIGCHLD)
    | pagewise_sys::signal::bit(libc::SIGCONT)
    | pagewise_sys::signal::bit(libc::SIGURG)
    | pagewise_sys::signal::bit(libc::SIGWINCH);

/// Rewinds thread `tid` if the stop made its blocked call fail with
/// `EINTR` and it has no signal to take (see the module). Best effort: a
/// thread that cannot be read is left as it is.
#[cfg(target_arch = "x86_64")]
pub(crate) fn rewind_eintr(pid: i32, tid: i32) -> bool {
    let Ok(mut r) = process::ptrace_getregs(tid) else {
        return false;
    };
    if !stop_caused_eintr(pid, tid, &r) {
        return false;
    }
    r.rip -= 2;
    r.rax = r.orig_rax;
    process::ptrace_setregs(tid, &r).is_ok()
}

/// Whether thread `tid`, stopped with registers `r`, is returning `EINTR`
/// from a blocked call that only the stop interrupted (see the module).
#[cfg(target_arch = "x86_64")]
pub fn stop_caused_eintr(pid: i32, tid: i32, r: &process::Regs) -> bool {
    let is_syscall_return = r.cs == 0x33
        && r.rax as i64 == -(libc::EINTR as i64)
        && EINTR_AFTER_STOP.contains(&(r.orig_rax as i64))
        // At a system call's return the kernel's `rcx` is the return
        // address; a signal handler's entry has moved `rip` away from it.
        && r.rcx == r.rip
        && r.rip >= 2;
    if !is_syscall_return {
        return false;
    }
    let mut insn = [0u8; 2];
    if !matches!(process::process_vm_read(pid, r.rip - 2, &mut insn), Ok(2)) || insn != [0x0f, 0x05]
    {
        return false;
    }
    let Ok(sigs) = procfs::thread_signals(pid, tid) else {
        return false;
    };
    let inert = sigs.ignored | (DEFAULT_IGNORED & !sigs.caught);
    // A signal to take interrupts it anyway: the EINTR is the program's.
    sigs.deliverable() & !inert == 0
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn rewind_eintr(_pid: i32, _tid: i32) -> bool {
    false
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &tid in &self.sharers {
            // /proc/TID/task/TID names any thread.
            rewind_eintr(tid, tid);
            let _ = process::ptrace_detach(tid);
        }
        for &tid in &self.tids {
            rewind_eintr(self.pid, tid);
            // A thread that exited meanwhile cannot be detached; nothing to do.
            let _ = process::ptrace_detach(tid);
        }
    }
}

/// Every process of a group (a container, a cgroup) stopped at one
/// instant, until this is dropped: a consistent state of all of them
/// (what one wrote to memory they share, the others see).
///
/// Where one cgroup holds exactly the group's processes, it is frozen
/// ([`crate::freezer`]), its processes listed (none can fork or exit while
/// frozen), every thread of each seized and interrupted, and the cgroup
/// thawed: each thread stops at once, before it runs a single
/// instruction of its own. Otherwise the processes are stopped one after
/// another, each held until all are, and listed again until no process
/// appeared meanwhile: also one instant's state (the moment the last
/// stopped; those stopped earlier did nothing since).
#[derive(Debug)]
pub struct StoppedGroup {
    members: Vec<Stopped>,
    frozen: Option<std::path::PathBuf>,
}

/// Most listings of a group that is not frozen before it is refused as
/// growing faster than it can be stopped.
const GROUP_ROUNDS: usize = 32;

impl StoppedGroup {
    /// Stops every process `list` names (it is asked again, see the
    /// type); waits at most `limit` for each thread and for the freezer.
    pub fn new(list: &dyn Fn() -> Result<Vec<i32>>, limit: Duration) -> Result<Self> {
        let first = list()?;
        if let Some(f) = crate::freezer::Freezer::holding_exactly(&first) {
            let frozen = f.freeze(limit)?;
            let pids = list()?;
            let mut interrupted = Vec::new();
            let mut failure = None;
            for &pid in &pids {
                let mut mine = Vec::new();
                for tid in procfs::tasks(pid).unwrap_or_default() {
                    match process::ptrace_seize(tid).and_then(|()| {
                        mine.push(tid);
                        process::ptrace_interrupt(tid)
                    }) {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                        Err(e) => {
                            failure.get_or_insert(seize_error(pid, pid, tid, e));
                            break;
                        }
                    }
                }
                interrupted.push((pid, mine));
                if failure.is_some() {
                    break;
                }
            }
            let dir = frozen.dir().to_path_buf();
            drop(frozen);
            // Waited for (and let go when dropped) whatever happened.
            let mut members = Vec::new();
            for (pid, tids) in interrupted {
                match Stopped::after_interrupt(pid, limit, tids) {
                    Ok(s) => members.push(s),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            return Ok(StoppedGroup {
                members,
                frozen: Some(dir),
            });
        }
        let mut members: Vec<Stopped> = Vec::new();
        let mut pids = first;
        for _ in 0..GROUP_ROUNDS {
            let mut new = 0;
            for pid in pids {
                if members
                    .iter()
                    .any(|m| m.pid == pid || m.sharers.contains(&pid))
                {
                    continue;
                }
                match Stopped::within(pid, limit) {
                    Ok(s) => {
                        members.push(s);
                        new += 1;
                    }
                    // Gone meanwhile: not in the group any more.
                    Err(Error::NoSuchProcess(_) | Error::ProcessExited(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            if new == 0 {
                members.sort_by_key(|m| m.pid);
                return Ok(StoppedGroup {
                    members,
                    frozen: None,
                });
            }
            pids = list()?;
        }
        Err(Refusal::GroupGrowing {
            held: members.len(),
            rounds: GROUP_ROUNDS,
        }
        .into())
    }

    /// The processes stopped, in pid order.
    pub fn members(&self) -> &[Stopped] {
        &self.members
    }

    /// The cgroup frozen to stop them at one instant, if one was.
    pub fn frozen(&self) -> Option<&std::path::Path> {
        self.frozen.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread seized by mistake (another process's, which took a listed
    /// id) is let go running, its tracer none, its state as before.
    #[test]
    fn a_stranger_seized_by_mistake_is_let_go_running() {
        if let Some(why) = pagewise_testkit::can_ptrace() {
            pagewise_testkit::skip!("{why}");
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("starting sleep");
        let pid = child.id() as i32;
        process::ptrace_seize(pid).unwrap();
        assert!(!procfs::thread_of(std::process::id() as i32, pid));
        let_go_of_stranger(pid);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert_eq!(procfs::status_field(&status, "TracerPid"), Some(0));
        let state = procfs::process_state(pid).unwrap();
        assert!(
            matches!(state.as_deref(), Some("S" | "R")),
            "the stranger is {state:?}"
        );
        assert!(child.try_wait().unwrap().is_none(), "the stranger ended");
        let _ = child.kill();
        let _ = child.wait();
    }
}
