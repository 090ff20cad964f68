//! Acting inside another process: a system call made by one of its threads,
//! stopped under `ptrace` ([`Stopped`]), then put back exactly as it was;
//! or, in a program pagewise started, made by the preload shim on request
//! ([`shim`], [`Inside`]). The one place pagewise executes anything in
//! another process.
//!
//! The technique is CRIU's "parasite" (compel) reduced to one instruction:
//! the thread's registers are saved; its instruction pointer is set to a
//! `syscall` instruction that already exists in the target (a `syscall;
//! ret` of its C library, else one in its vDSO), the call's number and
//! arguments go into the registers, `orig_rax` is set to -1 so that the
//! kernel does not take the call for the restart of one the thread was
//! interrupted in (a thread held inside a call's entry is first taken
//! out of it, see `entry`); the thread runs to the call's exit (`PTRACE_SYSCALL`),
//! the result is read from `rax`, the thread is brought back to a stop in
//! the signal code, and every register is put back. A thread that was
//! stopped inside a system call then restarts it as it would have.
//!
//! Should pagewise die during a call, the thread puts itself back: a
//! signal frame written below its stack pointer beforehand holds its
//! registers, extended state and mask, and the call returns into the
//! target's `rt_sigreturn` trampoline (see `way_back`). No single step
//! is used, so no trap is ever left pending. The bytes under the frame
//! are put back after each call; an array a call needs in the target
//! ([`Remote::madvise_many`]) gets a scratch mapping of its own, unmapped
//! before the target runs again.
//!
//! x86-64 only; elsewhere [`Remote::new`] answers `Unsupported`.

use crate::procfs;
use crate::stop::{Refusal, Stopped};
use crate::{Error, Result};

mod advice;
mod check;
mod entry;
mod give;
pub mod shim;
pub mod uffd_lending;
mod way_back;

pub(crate) use advice::collapse_retried;
pub use advice::{collapse, madvise_in, Inside, COLLAPSE_TRIES};

/// Whether process `pid` can be made to make `call` for `feature`: refused,
/// with the reason, for a process under seccomp filters that this process
/// can neither suspend nor read (see [`crate::seccomp`]), one another
/// tracer holds (a process has one), and
/// one that is stopped (job control or a debugger: it would not run the
/// call until it runs again).
pub fn check_target(pid: i32, feature: &'static str, call: &str) -> Result<()> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| Error::for_pid(pid, "reading its status", e))?;
    crate::seccomp::check_status(pid, &status, feature, call)?;
    let tracer = procfs::status_field(&status, "TracerPid").unwrap_or(0);
    if tracer != 0 {
        return Err(Refusal::Traced {
            feature,
            pid,
            tracer,
        }
        .into());
    }
    let state =
        procfs::process_state(pid).map_err(|e| Error::for_pid(pid, "reading its state", e))?;
    if matches!(state.as_deref(), Some("T" | "t")) {
        return Err(Refusal::JobStopped {
            feature,
            pid,
            call: call.to_string(),
        }
        .into());
    }
    Ok(())
}

/// The error of a call made inside process `pid` that answered `rc`
/// (a negative errno), saying `what` it was.
pub fn failed(pid: i32, what: impl Into<String>, rc: i64) -> Error {
    Error::for_pid(
        pid,
        what.into(),
        std::io::Error::from_raw_os_error(-rc as i32),
    )
}

/// System calls made inside a stopped process (see the module).
#[derive(Debug)]
pub struct Remote<'a> {
    stopped: &'a Stopped,
    tid: i32,
    syscall_at: u64,
    /// The way back should pagewise die during a call (`way_back`).
    way_back: Option<way_back::Trampoline>,
    /// Whether a call has completed in the thread since the stop: its way
    /// back through the signal code has put back any mask a `ppoll`-like
    /// call had swapped in, so its mask may be set from here on.
    stepped: std::cell::Cell<bool>,
    /// How the thread's seccomp filters are stepped around.
    seccomp: crate::seccomp::Inside,
}

/// Where a `syscall` instruction (`0f 05`) is in `pid`'s vDSO.
fn find_syscall_instruction(pid: i32) -> Result<u64> {
    let maps = procfs::maps(Some(pid))?;
    // A process in `exit` lists its mappings short (its memory gone), or none.
    let Some(vdso) = maps.iter().find(|m| m.path == "[vdso]") else {
        if procfs::is_ending(pid) {
            return Err(Error::ProcessExited(pid));
        }
        return Err(Error::Unsupported {
            feature: "system calls inside another process",
            why: format!("process {pid} has no vDSO to borrow a syscall instruction from"),
        });
    };
    let mut text = vec![0u8; vdso.len() as usize];
    let n = pagewise_sys::process::process_vm_read(pid, vdso.start, &mut text)
        .map_err(|e| Error::for_pid(pid, "reading the vDSO", e))?;
    text[..n]
        .windows(2)
        .position(|w| w == [0x0f, 0x05])
        .map(|i| vdso.start + i as u64)
        .ok_or_else(|| Error::Unsupported {
            feature: "system calls inside another process",
            why: format!("no syscall instruction in the vDSO of process {pid}"),
        })
}

/// Bytes of [`Remote::stack_scratch`].
pub const STACK_SCRATCH: u64 = way_back::SCRATCH - 16;

/// The moments of a call at which [`die_here`] may end pagewise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The call prepared, nothing set in the thread.
    Set = 0,
    /// The call's registers set.
    Registers = 1,
    /// Its signals blocked.
    Blocked = 2,
    /// Stopped at the call's entry.
    Entered = 3,
    /// Stopped at its exit.
    Exited = 4,
    /// Back in the signal code, the call's registers still set.
    Ran = 5,
    /// The mask put back.
    Mask = 6,
    /// The registers put back, the stack under the frame not yet.
    Back = 7,
}

/// For tests of pagewise's own death during a call: with
/// `PAGEWISE_DIE_IN_CALL=N:P` in its environment, pagewise kills itself
/// (SIGKILL) at phase `P` (0–7, see [`Phase`]) of the `N`th call (from 1)
/// it makes inside another process. Unset, nothing happens.
fn die_here(phase: Phase) {
    static AT: std::sync::OnceLock<Option<(u64, u8)>> = std::sync::OnceLock::new();
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Some((n, at)) = *AT.get_or_init(|| {
        let v = std::env::var("PAGEWISE_DIE_IN_CALL").ok()?;
        let (n, p) = v.split_once(':')?;
        Some((n.parse().ok()?, p.parse().ok()?))
    }) else {
        return;
    };
    let call = if phase == Phase::Set {
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    } else {
        CALLS.load(std::sync::atomic::Ordering::Relaxed)
    };
    if call == n && phase as u8 == at {
        let _ = pagewise_sys::process::kill(std::process::id() as i32, libc::SIGKILL);
    }
}

/// The code segment of 64-bit user code on x86-64 (`__USER_CS`); 32-bit
/// (compat) code runs with 0x23.
#[cfg(target_arch = "x86_64")]
const USER_CS_64: u64 = 0x33;

/// System calls that swap in a signal mask of their own and leave it to
/// the way back to user mode to put the thread's back when interrupted;
/// `PTRACE_SETSIGMASK` would cancel that.
#[cfg(target_arch = "x86_64")]
const SWAPS_MASK: &[i64] = &[
    libc::SYS_rt_sigsuspend,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    333, // io_pgetevents
    libc::SYS_io_uring_enter,
];

/// Whether a thread stopped with registers `r` may be leaving a call of
/// `SWAPS_MASK`, interrupted (its mask then is the call's, not its own).
#[cfg(target_arch = "x86_64")]
pub fn leaves_mask_swap(r: &pagewise_sys::process::Regs) -> bool {
    SWAPS_MASK.contains(&(r.orig_rax as i64)) && (r.rax as i64) < 0
}

/// The kernel's own restart codes (`-ERESTARTSYS` … `-ERESTART_RESTARTBLOCK`):
/// a call that returns one was interrupted before it did anything.
#[cfg(target_arch = "x86_64")]
pub const RESTART: std::ops::RangeInclusive<i64> = -516..=-512;

/// How long one call made in a target may take before it is interrupted.
const CALL_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Signals handed back before one call is given up.
const MAX_TRIES: u32 = 200;

/// How one single-stepped call ended.
#[cfg(target_arch = "x86_64")]
enum Step {
    /// It ran: its raw result.
    Done(i64),
    /// A signal was taken before it ran (the thread is in that signal's
    /// delivery stop).
    Signal(libc::c_int),
}

impl<'a> Remote<'a> {
    /// Prepares system calls in `stopped`. Refused for a process with a
    /// thread in 32-bit (compat) mode, or whose mode cannot be read: a
    /// `syscall` borrowed from a 32-bit vDSO enters the 32-bit table, so
    /// every call would be another. The calls are made by a thread not
    /// leaving a mask-swapping call where there is one.
    pub fn new(stopped: &'a Stopped) -> Result<Self> {
        if !cfg!(target_arch = "x86_64") {
            return Err(Refusal::NotX86_64.into());
        }
        let pid = stopped.pid();
        let first = *stopped.tids().first().ok_or(Error::ProcessExited(pid))?;
        let tid = Self::check_threads(stopped)?.unwrap_or(first);
        Ok(Remote {
            stopped,
            tid,
            syscall_at: find_syscall_instruction(pid)?,
            way_back: way_back::find(pid),
            stepped: std::cell::Cell::new(false),
            seccomp: crate::seccomp::inside(pid, tid)?,
        })
    }

    /// The same calls made by thread `tid` of the stopped process (for
    /// what is the thread's own: its alternate signal stack).
    pub fn in_thread(&self, tid: i32) -> Result<Self> {
        if !self.stopped.tids().contains(&tid) {
            return Err(Error::NotStopped {
                pid: self.stopped.pid(),
                tid,
            });
        }
        Ok(Remote {
            stopped: self.stopped,
            tid,
            syscall_at: self.syscall_at,
            way_back: self.way_back,
            stepped: std::cell::Cell::new(false),
            seccomp: crate::seccomp::inside(self.stopped.pid(), tid)?,
        })
    }

    /// The thread that makes the calls.
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// An address of [`STACK_SCRATCH`] bytes that calls of this thread may
    /// use for their arguments: in its stack, below its red zone, where no
    /// code of the thread keeps anything (the kernel itself writes signal
    /// frames there), so that what a call leaves there harms nothing should
    /// pagewise die before putting the bytes back; the frame that puts the
    /// thread back lies below.
    pub fn stack_scratch(&self) -> Result<u64> {
        let pid = self.stopped.pid();
        let tid = self.tid;
        let r = pagewise_sys::process::ptrace_getregs(tid)
            .map_err(|e| Error::for_pid(pid, format!("PTRACE_GETREGS of thread {tid}"), e))?;
        r.rsp
            .checked_sub(way_back::RED_ZONE + STACK_SCRATCH)
            .map(|a| a & !15)
            .ok_or(Error::NoStack {
                pid,
                tid,
                rsp: r.rsp,
            })
    }

    /// Checks that every thread runs 64-bit code; a thread not leaving a
    /// mask-swapping call, if any.
    #[cfg(target_arch = "x86_64")]
    fn check_threads(stopped: &Stopped) -> Result<Option<i32>> {
        let pid = stopped.pid();
        let mut calm = None;
        for &t in stopped.tids() {
            // A held thread is gone (ESRCH) only if the process was killed
            // meanwhile: it is gone, not of an unknown mode.
            let r = pagewise_sys::process::ptrace_getregs(t).map_err(|e| {
                if e.raw_os_error() == Some(libc::ESRCH) {
                    return Error::ProcessExited(pid);
                }
                Error::from(Refusal::ModeUnknown {
                    pid,
                    tid: t,
                    why: e.to_string(),
                })
            })?;
            if r.cs != USER_CS_64 {
                return Err(Refusal::Compat32 {
                    pid,
                    tid: t,
                    cs: r.cs,
                }
                .into());
            }
            if calm.is_none() && !leaves_mask_swap(&r) {
                calm = Some(t);
            }
        }
        Ok(calm)
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn check_threads(_stopped: &Stopped) -> Result<Option<i32>> {
        Ok(None)
    }

    /// Makes system call `nr` with `args` in the target; its raw result
    /// (a negative errno on failure).
    ///
    /// The thread's signals are blocked for the call (all but `SIGTRAP`;
    /// `PTRACE_SETSIGMASK`) and its mask put back
    /// after, so that none is taken meanwhile. A signal taken anyway (a
    /// stop signal, or any where the mask cannot be set) before the call
    /// ran is handed back as it came, on the thread's own registers, and
    /// the call tried again (at most `MAX_TRIES` times). A result is used
    /// only once the step's trap shows the instruction pointer just past
    /// the `syscall`: the call ran.
    #[cfg(target_arch = "x86_64")]
    pub fn syscall(&self, nr: libc::c_long, args: [u64; 6]) -> Result<i64> {
        self.call(nr, args, false)
    }

    /// As [`Remote::syscall`], with the stack pointer at 0 for the call:
    /// for `sigaltstack`, which refuses to change the alternate stack of a
    /// thread whose stack pointer is on it (the thread's own is put back
    /// after, as every register).
    #[cfg(target_arch = "x86_64")]
    pub fn syscall_off_stack(&self, nr: libc::c_long, args: [u64; 6]) -> Result<i64> {
        self.call(nr, args, true)
    }

    #[cfg(target_arch = "x86_64")]
    fn call(&self, nr: libc::c_long, args: [u64; 6], off_stack: bool) -> Result<i64> {
        use pagewise_sys::process as p;
        let pid = self.stopped.pid();
        let tid = self.tid;
        let os = |what: &str, e| Error::for_pid(pid, format!("{what} of thread {tid}"), e);
        let suspend = matches!(self.seccomp, crate::seccomp::Inside::Suspended);
        // The address the call is made from, as filters see it.
        let ip = match self.way_back {
            Some(t) if !off_stack => t.syscall_ret,
            _ => self.syscall_at,
        } + 2;
        self.seccomp.check_call(pid, nr, args, ip)?;
        for _ in 0..MAX_TRIES {
            // A thread held inside its own call's entry is first taken out
            // of it, to make that call again when it goes on; once a call
            // of ours has completed in it, it is not (no need to ask).
            let inside = (!self.stepped.get()).then(|| entry::at_entry(tid));
            if let Some(seccomp_stop) = inside.flatten() {
                if !seccomp_stop && !suspend {
                    // Its filters see call -1 as it leaves.
                    self.seccomp.check_call(pid, -1, [0; 6], ip)?;
                }
                entry::leave(pid, tid, seccomp_stop, suspend)?;
            }
            let saved = p::ptrace_getregs(tid).map_err(|e| os("PTRACE_GETREGS", e))?;
            if saved.cs != USER_CS_64 {
                return Err(Refusal::SwitchedTo32 { pid, tid }.into());
            }
            let mask = p::ptrace_getsigmask(tid).map_err(|e| os("PTRACE_GETSIGMASK", e))?;
            let block = self.stepped.get() || !leaves_mask_swap(&saved);
            let mut call = saved;
            call.rax = nr as u64;
            call.orig_rax = u64::MAX;
            (call.rdi, call.rsi, call.rdx, call.r10, call.r8, call.r9) =
                (args[0], args[1], args[2], args[3], args[4], args[5]);
            // The way back, should pagewise die during the call (see
            // `way_back`); none for a call off the stack.
            let frame = match self.way_back {
                Some(t) if !off_stack => {
                    way_back::Frame::write(pid, tid, t, &saved, mask).map(|f| (t.syscall_ret, f))
                }
                _ => None,
            };
            match &frame {
                Some((at, f)) => (call.rip, call.rsp) = (*at, f.at),
                None => {
                    call.rip = self.syscall_at;
                    if off_stack {
                        call.rsp = 0;
                    }
                }
            }
            // The call's registers first, then the mask: a thread let go in
            // between makes the call on its own mask and comes back.
            die_here(Phase::Set);
            let step = p::ptrace_setregs(tid, &call)
                .map_err(|e| os("PTRACE_SETREGS", e))
                .and_then(|()| {
                    die_here(Phase::Registers);
                    if block {
                        // All but SIGTRAP, unless the thread blocks it
                        // itself: one pending then stays so (else it came
                        // before every try, and the call never ran).
                        let trap = pagewise_sys::signal::bit(libc::SIGTRAP);
                        let all = !trap | (mask & trap);
                        p::ptrace_setsigmask(tid, all).map_err(|e| os("PTRACE_SETSIGMASK", e))?;
                    }
                    die_here(Phase::Blocked);
                    // The thread's filters do not apply to this one call
                    // (see `crate::seccomp`): set just before it, cleared
                    // just after.
                    if suspend {
                        p::ptrace_set_suspend_seccomp(tid, true)
                            .map_err(|e| os("PTRACE_O_SUSPEND_SECCOMP", e))?;
                    }
                    self.step(&call)
                });
            // The filters, the mask and every register back, whatever
            // happened, in the reverse order; then the bytes under the frame.
            die_here(Phase::Ran);
            let put_back = (if suspend {
                p::ptrace_set_suspend_seccomp(tid, false)
                    .map_err(|e| os("PTRACE_O_SUSPEND_SECCOMP (clearing)", e))
            } else {
                Ok(())
            })
            .and_then(|()| {
                if block {
                    p::ptrace_setsigmask(tid, mask)
                        .map_err(|e| os("PTRACE_SETSIGMASK (restoring)", e))
                } else {
                    Ok(())
                }
            })
            .and_then(|()| {
                die_here(Phase::Mask);
                p::ptrace_setregs(tid, &saved).map_err(|e| os("PTRACE_SETREGS (restoring)", e))
            })
            .and_then(|()| {
                die_here(Phase::Back);
                match frame {
                    Some((_, f)) => f.put_back(pid),
                    None => Ok(()),
                }
            });
            let step = step?;
            put_back?;
            match step {
                Step::Done(rax) => {
                    self.stepped.set(true);
                    return Ok(rax);
                }
                Step::Signal(sig) => {
                    // Delivered now, on the thread's own registers, as it
                    // would have been had the thread not been stopped; the
                    // interrupt stops it again before it runs.
                    p::ptrace_interrupt(tid).map_err(|e| os("PTRACE_INTERRUPT", e))?;
                    p::ptrace_cont(tid, sig).map_err(|e| os("PTRACE_CONT", e))?;
                    let deadline = std::time::Instant::now() + crate::stop::STOP_WAIT;
                    if !crate::stop::settle(pid, tid, deadline)? {
                        return Err(Error::ProcessExited(pid));
                    }
                }
            }
        }
        Err(Refusal::Signals {
            pid,
            tries: MAX_TRIES,
        }
        .into())
    }

    /// Runs the `syscall` that `call` set up (`PTRACE_SYSCALL`: stopped at
    /// its entry and its exit, never single-stepped, so nothing is left
    /// pending should pagewise die) until it has run or a signal came
    /// first; once it has run, brings the thread to a stop in the signal
    /// code before it returns to its own code, where putting its registers
    /// back restarts a call it was interrupted in as the kernel would.
    #[cfg(target_arch = "x86_64")]
    fn step(&self, call: &pagewise_sys::process::Regs) -> Result<Step> {
        use pagewise_sys::process::{self as p, TraceStop};
        let pid = self.stopped.pid();
        let tid = self.tid;
        let os = |what: &str, e| Error::for_pid(pid, format!("{what} of thread {tid}"), e);
        let mut deadline = std::time::Instant::now() + CALL_WAIT;
        let mut interrupted = false;
        let mut entered = false;
        loop {
            p::ptrace_syscall(tid).map_err(|e| os("PTRACE_SYSCALL", e))?;
            let stop = loop {
                match p::wait_traced_until(tid, deadline)
                    .map_err(|e| os("waiting for the call", e))?
                {
                    Some(s) => break s,
                    None if !interrupted => {
                        // A call that blocks: interrupt it (it returns
                        // EINTR or a restart code, taken as its result).
                        p::ptrace_interrupt(tid).map_err(|e| os("PTRACE_INTERRUPT", e))?;
                        interrupted = true;
                        deadline = std::time::Instant::now() + crate::stop::STOP_WAIT;
                    }
                    None => return Err(Refusal::NoReturn { pid, tid }.into()),
                }
            };
            let (sig, event) = match stop {
                TraceStop::Gone => return Err(Error::ProcessExited(pid)),
                TraceStop::Stopped { sig, event } => (sig, event),
            };
            if event == p::PTRACE_EVENT_STOP {
                // An interrupt or a group stop, before the call ran; the
                // next resume runs it, or takes a signal first.
                continue;
            }
            // The kernel says which stop this is where it can (an exit is
            // never taken for the entry); else the first is the entry.
            let entry = sig == p::SYSCALL_STOP
                && match pagewise_sys::launch::ptrace_syscall_info(tid) {
                    Ok(pagewise_sys::launch::SyscallStop::Entry { .. }) => true,
                    Ok(pagewise_sys::launch::SyscallStop::Exit { .. }) => false,
                    _ => !entered,
                };
            if entry && !entered {
                entered = true;
                die_here(Phase::Entered);
                continue;
            }
            let r = p::ptrace_getregs(tid).map_err(|e| os("PTRACE_GETREGS", e))?;
            // A result is the call's only at its exit stop, the thread just
            // past the `syscall` with the call's number (a filter's kill
            // leaves the number in `rax`, and no exit stop).
            let exited = r.rip == call.rip + 2 && r.orig_rax == call.rax;
            if sig == p::SYSCALL_STOP && exited {
                die_here(Phase::Exited);
                let rax = r.rax as i64;
                if RESTART.contains(&rax) && !interrupted {
                    p::ptrace_setregs(tid, call).map_err(|e| os("PTRACE_SETREGS", e))?;
                    entered = false;
                    continue;
                }
                // To the stop in the signal code (the interrupt makes the
                // way back to user mode take it).
                p::ptrace_interrupt(tid).map_err(|e| os("PTRACE_INTERRUPT", e))?;
                p::ptrace_cont(tid, 0).map_err(|e| os("PTRACE_CONT", e))?;
                let deadline = std::time::Instant::now() + crate::stop::STOP_WAIT;
                if !crate::stop::settle(pid, tid, deadline)? {
                    return Err(Error::ProcessExited(pid));
                }
                return Ok(Step::Done(if RESTART.contains(&rax) {
                    -(libc::EINTR as i64)
                } else {
                    rax
                }));
            }
            if r.rip == call.rip && !entered {
                return Ok(Step::Signal(sig));
            }
            return Err(Refusal::StrangeStop {
                pid,
                tid,
                sig,
                rip: r.rip,
            }
            .into());
        }
    }

    /// Not available on this architecture.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn syscall(&self, _nr: libc::c_long, _args: [u64; 6]) -> Result<i64> {
        Err(Refusal::NotX86_64.into())
    }

    /// Not available on this architecture.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn syscall_off_stack(&self, _nr: libc::c_long, _args: [u64; 6]) -> Result<i64> {
        Err(Refusal::NotX86_64.into())
    }

    /// `madvise(advice)` on each of `runs` (address, bytes) in the target;
    /// the bytes advised per run (0 where the kernel refused it). One
    /// `process_madvise` on itself per 1,024 runs, from a scratch page
    /// mapped in the target for the call and unmapped after (Linux 6.14+);
    /// on a kernel that refuses that, one `madvise` per run.
    pub fn madvise_many(&self, runs: &[(u64, u64)], advice: i32) -> Result<Vec<u64>> {
        const IOV: usize = 1024;
        let pid = self.stopped.pid();
        let mut done = vec![0u64; runs.len()];
        let mut next = 0;
        let len = (IOV * 16) as u64;
        let scratch = self.syscall(
            libc::SYS_mmap,
            [
                0,
                len,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        )?;
        if scratch > 0 {
            let at = scratch as u64;
            while next < runs.len() {
                let batch = &runs[next..(next + IOV).min(runs.len())];
                let iov: Vec<u8> = batch
                    .iter()
                    .flat_map(|&(a, n)| a.to_ne_bytes().into_iter().chain(n.to_ne_bytes()))
                    .collect();
                let wrote = crate::remote::write(pid, at, &iov, "writing the advice's ranges")?;
                if wrote != iov.len() {
                    break;
                }
                let rc = self.syscall(
                    libc::SYS_process_madvise,
                    [
                        pagewise_sys::process::PIDFD_SELF_PROCESS as i64 as u64,
                        at,
                        batch.len() as u64,
                        advice as u64,
                        0,
                        0,
                    ],
                )?;
                if rc < 0 {
                    // Not on this kernel (or a run it refuses): one call per
                    // run from here.
                    break;
                }
                // Advised in order, up to the first run refused.
                let mut left = rc as u64;
                for (k, &(_, n)) in batch.iter().enumerate() {
                    let d = left.min(n);
                    done[next + k] = d;
                    left -= d;
                }
                let whole = batch.iter().map(|r| r.1).sum::<u64>() == rc as u64;
                next += batch.len();
                if !whole {
                    break;
                }
            }
            self.syscall(libc::SYS_munmap, [at, len, 0, 0, 0, 0])?;
        }
        for (k, &(a, n)) in runs.iter().enumerate().skip(next) {
            if done[k] == 0 && self.syscall(libc::SYS_madvise, [a, n, advice as u64, 0, 0, 0])? == 0
            {
                done[k] = n;
            }
        }
        Ok(done)
    }

    /// `openat(AT_FDCWD, path, flags)` inside the target, the path written
    /// to a scratch page mapped for the call and unmapped after; its raw
    /// result (the descriptor, or a negative errno). The path is the
    /// target's own (its root and working directory).
    pub fn open(&self, path: &[u8], flags: i32) -> Result<i64> {
        let pid = self.stopped.pid();
        let mut name = path.to_vec();
        name.push(0);
        if name.len() > crate::PAGE_SIZE || path.contains(&0) {
            return Err(Error::BadPath {
                path: path.to_vec(),
            });
        }
        let page = self.scratch_page()?;
        let opened =
            crate::remote::write(pid, page, &name, "writing a path into it").and_then(|_| {
                self.syscall(
                    libc::SYS_openat,
                    [libc::AT_FDCWD as i64 as u64, page, flags as u64, 0, 0, 0],
                )
            });
        self.syscall(
            libc::SYS_munmap,
            [page, crate::PAGE_SIZE as u64, 0, 0, 0, 0],
        )?;
        opened
    }
}
