//! Starting a program for a tracer and following its system calls: a child
//! made to stop itself before `execve` (so that a tracer seizes it before
//! the program runs one instruction), a seccomp filter that hands its
//! `exit_group` to the tracer instead of ending it, and the kernel's own
//! account of the call a thread stopped at (`PTRACE_GET_SYSCALL_INFO`).
//!
//! References: `ptrace(2)` (`PTRACE_GET_SYSCALL_INFO`, `PTRACE_EVENT_SECCOMP`,
//! `PTRACE_O_TRACESECCOMP`), `seccomp(2)` (`SECCOMP_RET_TRACE`).

use crate::{cvt, cvt_int};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;

/// `PTRACE_GET_SYSCALL_INFO` (Linux 5.3; `linux/ptrace.h`).
const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;

/// `PTRACE_EVENT_SECCOMP`: the stop of a call a filter answered with
/// `SECCOMP_RET_TRACE`.
pub const PTRACE_EVENT_SECCOMP: libc::c_int = 7;

/// `struct ptrace_syscall_info` (`linux/ptrace.h`): `op`, padding, `arch`,
/// the instruction and stack pointers, then one of `entry` (`nr`, six
/// arguments), `exit` (`rval`, `is_error`) or `seccomp` (`nr`, six
/// arguments, `ret_data`).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawSyscallInfo {
    op: u8,
    pad: [u8; 3],
    arch: u32,
    instruction_pointer: u64,
    stack_pointer: u64,
    /// `entry.nr` / `exit.rval` / `seccomp.nr`.
    nr_or_rval: u64,
    /// `entry.args` / `exit.is_error` (first byte) / `seccomp.args`.
    args: [u64; 6],
    /// `seccomp.ret_data`, then the union's padding.
    ret_data: u32,
    tail: u32,
}

const _: () = assert!(std::mem::size_of::<RawSyscallInfo>() == 88);

/// Where a thread stopped in a system call was, as the kernel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallStop {
    /// Entering call `nr` with `args`.
    Entry {
        /// The call's number.
        nr: i64,
        /// Its arguments.
        args: [u64; 6],
    },
    /// Leaving a call with `rval` (`-errno` for a failure).
    Exit {
        /// What the call returns.
        rval: i64,
    },
    /// At a `SECCOMP_RET_TRACE` stop for call `nr` with `args`.
    Seccomp {
        /// The call's number.
        nr: i64,
        /// Its arguments.
        args: [u64; 6],
    },
    /// Not stopped in a system call.
    None,
}

/// `ptrace(PTRACE_GET_SYSCALL_INFO)` of a stopped thread.
pub fn ptrace_syscall_info(tid: libc::pid_t) -> io::Result<SyscallStop> {
    let mut raw = RawSyscallInfo {
        op: 0,
        pad: [0; 3],
        arch: 0,
        instruction_pointer: 0,
        stack_pointer: 0,
        nr_or_rval: 0,
        args: [0; 6],
        ret_data: 0,
        tail: 0,
    };
    // SAFETY: the kernel writes at most `addr` bytes (the structure's
    // size) into `raw`, which is that large and lives across the call.
    cvt(unsafe {
        libc::ptrace(
            PTRACE_GET_SYSCALL_INFO,
            tid,
            std::mem::size_of::<RawSyscallInfo>(),
            &mut raw as *mut RawSyscallInfo,
        )
    })?;
    Ok(match raw.op {
        1 => SyscallStop::Entry {
            nr: raw.nr_or_rval as i64,
            args: raw.args,
        },
        2 => SyscallStop::Exit {
            rval: raw.nr_or_rval as i64,
        },
        3 => SyscallStop::Seccomp {
            nr: raw.nr_or_rval as i64,
            args: raw.args,
        },
        _ => SyscallStop::None,
    })
}

/// `ptrace(PTRACE_SEIZE)` of one thread with `options` (`PTRACE_O_*`).
pub fn ptrace_seize_with(tid: libc::pid_t, options: libc::c_int) -> io::Result<()> {
    // SAFETY: PTRACE_SEIZE takes a tid and its options in `data`; addr 0.
    cvt_int(unsafe {
        libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, options as usize) as libc::c_int
    })
    .map(|_| ())
}

/// `ptrace(PTRACE_DETACH)` of a stopped thread, which runs on.
pub fn ptrace_detach_running(tid: libc::pid_t) -> io::Result<()> {
    // SAFETY: integer arguments only; data 0 delivers no signal.
    cvt_int(unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, 0usize) as libc::c_int })
        .map(|_| ())
}

/// `waitpid(pid, flags)` with `EINTR` retried: the pid that changed state
/// (0 with `WNOHANG` when none did) and its raw status.
pub fn wait_raw(pid: libc::pid_t, flags: libc::c_int) -> io::Result<(libc::pid_t, libc::c_int)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; the rest are integers.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r >= 0 {
            return Ok((r, status));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_TRACE: u32 = 0x7ff0_0000;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;

/// A seccomp filter that answers `exit_group` with `SECCOMP_RET_TRACE` and
/// allows every other call: a tracer with `PTRACE_O_TRACESECCOMP` sees the
/// process about to end, still whole, and may skip the call.
pub fn exit_group_filter() -> Vec<libc::sock_filter> {
    let ins = |code, k, jt, jf| libc::sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data: nr at 0, arch at 4.
        ins(BPF_LD_W_ABS, 4, 0, 0),
        ins(BPF_JEQ_K, AUDIT_ARCH_X86_64, 0, 3),
        ins(BPF_LD_W_ABS, 0, 0, 0),
        ins(BPF_JEQ_K, libc::SYS_exit_group as u32, 0, 1),
        ins(BPF_RET_K, SECCOMP_RET_TRACE, 0, 0),
        ins(BPF_RET_K, SECCOMP_RET_ALLOW, 0, 0),
    ]
}

/// Starts `path` with `argv` and this process's environment in a child
/// that first closes `close`, dies with the calling thread
/// (`PR_SET_PDEATHSIG` `SIGKILL`), installs `filter` if given (setting
/// `no_new_privs` only if the kernel asks for it) and stops itself
/// (`SIGSTOP`) before `execve`: a tracer seizes it there. The child's pid.
pub fn spawn_stopped(
    path: &CStr,
    argv: &[CString],
    close: &[RawFd],
    filter: Option<&[libc::sock_filter]>,
) -> io::Result<libc::pid_t> {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let mut prog = filter.map(|f| f.to_vec()).unwrap_or_default();
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?,
        filter: prog.as_mut_ptr(),
    };
    let want_filter = filter.is_some();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the child makes only async-signal-safe calls on memory
    // prepared before the fork (`ptrs`, `fprog`, `close`) and never
    // returns: it ends in `execve` or `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: as above; every call takes integers or the prepared
        // pointers, and the child leaves by `_exit` on any failure.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                || libc::getppid() != parent
            {
                libc::_exit(126);
            }
            for &fd in close {
                libc::close(fd);
            }
            if want_filter {
                let set = || {
                    libc::syscall(
                        libc::SYS_seccomp,
                        libc::SECCOMP_SET_MODE_FILTER,
                        0,
                        &fprog as *const libc::sock_fprog,
                    )
                };
                if set() != 0
                    && (libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || set() != 0)
                {
                    libc::_exit(126);
                }
            }
            libc::raise(libc::SIGSTOP);
            extern "C" {
                static environ: *const *const libc::c_char;
            }
            libc::execve(path.as_ptr(), ptrs.as_ptr(), environ);
            libc::_exit(127);
        }
    }
    Ok(pid)
}

/// `ptrace(PTRACE_SYSCALL)` delivering `sig` (0 for none): the thread runs
/// to its next system-call entry or exit.
pub fn ptrace_syscall_signal(tid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt_int(unsafe { libc::ptrace(libc::PTRACE_SYSCALL, tid, 0usize, sig as usize) as libc::c_int })
        .map(|_| ())
}
