//! What a stopped process's threads hold besides memory, read at a
//! snapshot and put back by a rollback: the general registers (with the
//! `fs`/`gs` bases), the whole extended state (`XSAVE`: x87, SSE, AVX and
//! beyond), the signal mask and the alternate signal stack.
//!
//! **A thread caught inside a system call** is recorded rewound to make the
//! call again: a call the stop interrupted (`-ERESTARTSYS`,
//! `-ERESTARTNOINTR`, `-ERESTARTNOHAND`, `-ERESTART_RESTARTBLOCK`, or an
//! `EINTR` only the stop caused, see [`pagewise_mech::stop`]) has its
//! instruction pointer back on the `syscall` and its number back in `rax`.
//! The kernel's own restart state (a `nanosleep`'s remaining time, a timed
//! `futex`'s address) lives in the thread, not in its registers, and cannot
//! be saved: restored as caught, a `nanosleep` would return at once. What
//! remains: a relative timeout starts again in full. Every recorded state
//! has `orig_rax` at -1, so that the kernel takes no step back on its own.
//!
//! **The signal mask** of a thread leaving `ppoll`, `pselect6`,
//! `rt_sigsuspend` or `epoll_pwait` is the call's, not its own: the thread
//! first makes a harmless call (`getpid`) in the target, whose way back
//! puts its own mask back, then the mask is read.
//!
//! **The rseq area** of a thread (where the kernel writes the CPU it runs
//! on) is memory like any other to a snapshot; the kernel writes it again
//! as soon as the thread runs. Where it is is recorded
//! ([`ThreadState::rseq`]), so that a comparison can leave it out.
//!
//! **Pending signals** are not recorded nor put back: a signal pending at a
//! snapshot is delivered once, in the run that follows it.
//!
//! x86-64 only.

use crate::{Error, Result};
use pagewise_mech::inject::Remote;
use pagewise_mech::remote::{read_exact, write_exact};
use pagewise_mech::stop::Stopped;
use pagewise_sys::process::{self as p, Regs};

/// The bytes of a `stack_t` (`ss_sp`, `ss_flags` and padding, `ss_size`).
pub(crate) const STACK_T: usize = 24;

/// Room for the largest `XSAVE` area (with AMX tiles, about 11 KiB).
const XSTATE_MAX: usize = 16 << 10;

/// A thread's alternate signal stack (`sigaltstack(2)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AltStack {
    /// Its base.
    pub sp: u64,
    /// `SS_DISABLE`, `SS_ONSTACK`, `SS_AUTODISARM`.
    pub flags: i32,
    /// Its size.
    pub size: u64,
}

impl AltStack {
    fn from_bytes(b: &[u8; STACK_T]) -> Self {
        let word = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        AltStack {
            sp: word(0),
            flags: i32::from_ne_bytes(b[8..12].try_into().expect("4 bytes")),
            size: word(16),
        }
    }

    /// As `sigaltstack` reads it. `SS_ONSTACK` (a thread caught running on
    /// it) is not a mode one may set: the stack is set enabled.
    fn to_bytes(self) -> [u8; STACK_T] {
        let mut b = [0u8; STACK_T];
        b[0..8].copy_from_slice(&self.sp.to_ne_bytes());
        let flags = self.flags & !libc::SS_ONSTACK;
        b[8..12].copy_from_slice(&flags.to_ne_bytes());
        b[16..24].copy_from_slice(&self.size.to_ne_bytes());
        b
    }
}

/// One thread's state, as recorded.
#[derive(Clone)]
pub struct ThreadState {
    /// The thread.
    pub tid: i32,
    /// General registers, `fs_base` and `gs_base`; `orig_rax` is -1.
    pub regs: Regs,
    /// The `XSAVE` area (`NT_X86_XSTATE`).
    pub xstate: Vec<u8>,
    /// Blocked signals (bit `n - 1` for signal `n`).
    pub sigmask: u64,
    /// The alternate signal stack.
    pub altstack: AltStack,
    /// The system call the thread was rewound to make again, if any.
    pub rewound: Option<i64>,
    /// Its rseq area (address, bytes), which the kernel writes (the CPU
    /// the thread runs on) whenever the thread runs.
    pub rseq: Option<(u64, u32)>,
}

impl std::fmt::Debug for ThreadState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadState")
            .field("tid", &self.tid)
            .field("rip", &format_args!("{:#x}", self.regs.rip))
            .field("rsp", &format_args!("{:#x}", self.regs.rsp))
            .field("sigmask", &format_args!("{:#x}", self.sigmask))
            .field("altstack", &self.altstack)
            .field("rewound", &self.rewound)
            .finish_non_exhaustive()
    }
}

/// The registers `r` of thread `tid` as a restore must put them back: a
/// call the stop interrupted is rewound (see the module); the call number,
/// if so.
fn rewound(pid: i32, tid: i32, r: &mut Regs) -> Option<i64> {
    let nr = r.orig_rax as i64;
    let rax = r.rax as i64;
    let interrupted = nr >= 0
        && r.rip >= 2
        && (pagewise_mech::inject::RESTART.contains(&rax)
            || pagewise_mech::stop::stop_caused_eintr(pid, tid, r));
    let mut insn = [0u8; 2];
    let again = interrupted
        && matches!(p::process_vm_read(pid, r.rip - 2, &mut insn), Ok(2))
        && insn == [0x0f, 0x05];
    if again {
        r.rip -= 2;
        r.rax = r.orig_rax;
    }
    r.orig_rax = u64::MAX;
    again.then_some(nr)
}

/// Reads the state of every thread of `stopped`. The calls it makes use
/// bytes of each thread's own stack, below its red zone, put back after
/// ([`Remote::stack_scratch`]).
pub(crate) fn capture(stopped: &Stopped, remote: &Remote<'_>) -> Result<Vec<ThreadState>> {
    let pid = stopped.pid();
    let os = |what: String, e| Error::for_pid(pid, what, e);
    let mut out = Vec::with_capacity(stopped.tids().len());
    let mut buf = vec![0u8; XSTATE_MAX];
    for &tid in stopped.tids() {
        let mut regs =
            p::ptrace_getregs(tid).map_err(|e| os(format!("PTRACE_GETREGS of {tid}"), e))?;
        let inside = remote.in_thread(tid)?;
        if pagewise_mech::inject::leaves_mask_swap(&regs) {
            // Its way back from this call puts its own mask back.
            inside.syscall(libc::SYS_getpid, [0; 6])?;
        }
        let sigmask =
            p::ptrace_getsigmask(tid).map_err(|e| os(format!("PTRACE_GETSIGMASK of {tid}"), e))?;
        let n = p::ptrace_getregset(tid, p::NT_X86_XSTATE, &mut buf)
            .map_err(|e| os(format!("PTRACE_GETREGSET(NT_X86_XSTATE) of {tid}"), e))?;
        let scratch = inside.stack_scratch()?;
        let mut keep = [0u8; STACK_T];
        read_exact(pid, scratch, &mut keep)?;
        let rc = inside.syscall(libc::SYS_sigaltstack, [0, scratch, 0, 0, 0, 0])?;
        if rc < 0 {
            return Err(os(
                format!("sigaltstack() made by thread {tid}"),
                std::io::Error::from_raw_os_error(-rc as i32),
            ));
        }
        let mut ss = [0u8; STACK_T];
        read_exact(pid, scratch, &mut ss)?;
        write_exact(pid, scratch, &keep)?;
        let rewound = rewound(pid, tid, &mut regs);
        // Older kernels do not say: nothing known.
        let rseq = p::ptrace_rseq_area(tid).ok().flatten();
        out.push(ThreadState {
            rseq,
            tid,
            regs,
            xstate: buf[..n].to_vec(),
            sigmask,
            altstack: AltStack::from_bytes(&ss),
            rewound,
        });
    }
    Ok(out)
}

/// Puts `states` back into the threads of `stopped` (the same set:
/// checked by the caller). `scratch` is an address of `STACK_T` writable
/// bytes in the target that the calls may use and that the caller writes
/// afterwards. The registers go last: every call made inside the target
/// before them puts the thread's registers back as it found them.
pub fn put_back(
    stopped: &Stopped,
    remote: &Remote<'_>,
    states: &[ThreadState],
    scratch: u64,
) -> Result<()> {
    let pid = stopped.pid();
    let os = |what: String, e| Error::for_pid(pid, what, e);
    for s in states {
        let inside = remote.in_thread(s.tid)?;
        write_exact(pid, scratch, &s.altstack.to_bytes())?;
        let rc = inside.syscall_off_stack(libc::SYS_sigaltstack, [scratch, 0, 0, 0, 0, 0])?;
        if rc < 0 {
            return Err(os(
                format!("sigaltstack() made by thread {}", s.tid),
                std::io::Error::from_raw_os_error(-rc as i32),
            ));
        }
    }
    put_back_registers(pid, states)
}

/// Puts back the registers, the `XSAVE` area and the signal mask of every
/// thread of `states` (of process `pid`, stopped): what [`put_back`] does
/// without a call inside the process (the alternate signal stacks stay).
pub(crate) fn put_back_registers(pid: i32, states: &[ThreadState]) -> Result<()> {
    let os = |what: String, e| Error::for_pid(pid, what, e);
    for s in states {
        let tid = s.tid;
        p::ptrace_setregset(tid, p::NT_X86_XSTATE, &s.xstate)
            .map_err(|e| os(format!("PTRACE_SETREGSET(NT_X86_XSTATE) of {tid}"), e))?;
        p::ptrace_setregs(tid, &s.regs).map_err(|e| os(format!("PTRACE_SETREGS of {tid}"), e))?;
        p::ptrace_setsigmask(tid, s.sigmask)
            .map_err(|e| os(format!("PTRACE_SETSIGMASK of {tid}"), e))?;
    }
    Ok(())
}
