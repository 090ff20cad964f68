//! A thread held inside the entry of a system call of its own: at a
//! `PTRACE_SYSCALL` entry stop, or at the stop of a filter's
//! `SECCOMP_RET_TRACE` (a reset session holds a run's end at its
//! `exit_group` so). The kernel runs the thread's pending call when it
//! goes on, whatever the registers then say: a call made by setting them
//! there is run in place of the pending one, and its stops are one behind
//! (the pending call's exit comes first). So the thread is first taken
//! out of the call as the kernel takes a thread out of a call it will
//! restart: the call skipped (`orig_rax` -1), the instruction pointer
//! back on its `syscall` and the call's number in `rax`, the thread
//! brought to an interrupt stop before it runs one instruction. It makes
//! its call again when it goes on, with the same arguments; should
//! pagewise die in between, it goes on so by itself.

use crate::{Error, Result};
use pagewise_sys::launch::{self as l, SyscallStop};
use pagewise_sys::process as p;

/// Whether thread `tid` is stopped inside the entry of a call: `Some`
/// with whether it is a filter's stop (`false`: a `PTRACE_SYSCALL` entry
/// stop). A kernel without `PTRACE_GET_SYSCALL_INFO` (before 5.3) says
/// nothing: `None`, as for any other stop.
pub(super) fn at_entry(tid: i32) -> Option<bool> {
    match l::ptrace_syscall_info(tid) {
        Ok(SyscallStop::Entry { .. }) => Some(false),
        Ok(SyscallStop::Seccomp { .. }) => Some(true),
        _ => None,
    }
}

/// Takes thread `tid` of `pid`, stopped inside the entry of its call
/// (`seccomp_stop`: at a filter's stop), out of it (see the module).
/// `suspend`: the thread's filters may be suspended for the moment (they
/// would see call -1 after an entry stop; after a filter's stop the
/// kernel skips a call -1 before asking them again).
pub(super) fn leave(pid: i32, tid: i32, seccomp_stop: bool, suspend: bool) -> Result<()> {
    let os = |what: &str, e| Error::for_pid(pid, format!("{what} of thread {tid}"), e);
    let r = p::ptrace_getregs(tid).map_err(|e| os("PTRACE_GETREGS", e))?;
    let mut out = r;
    out.orig_rax = u64::MAX;
    out.rax = r.orig_rax;
    out.rip = r.rip.wrapping_sub(2);
    p::ptrace_setregs(tid, &out).map_err(|e| os("PTRACE_SETREGS", e))?;
    let suspend = suspend && !seccomp_stop;
    if suspend {
        p::ptrace_set_suspend_seccomp(tid, true).map_err(|e| os("PTRACE_O_SUSPEND_SECCOMP", e))?;
    }
    let settled = p::ptrace_interrupt(tid)
        .map_err(|e| os("PTRACE_INTERRUPT", e))
        .and_then(|()| p::ptrace_cont(tid, 0).map_err(|e| os("PTRACE_CONT", e)))
        .and_then(|()| {
            let deadline = std::time::Instant::now() + crate::stop::STOP_WAIT;
            crate::stop::settle(pid, tid, deadline)
        });
    if suspend {
        p::ptrace_set_suspend_seccomp(tid, false)
            .map_err(|e| os("PTRACE_O_SUSPEND_SECCOMP (clearing)", e))?;
    }
    if !settled? {
        return Err(Error::ProcessExited(pid));
    }
    Ok(())
}
