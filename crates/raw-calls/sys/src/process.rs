//! Reaching another process: `pidfd_open`, `process_vm_readv`, `process_madvise`.
//!
//! # References
//! - `pidfd_open(2)`, `process_vm_readv(2)`, `process_madvise(2)`

use crate::{cvt, cvt_int};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(2)`.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel returned a new fd that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `process_vm_readv(2)` of one remote range into `buf`.
/// Returns the number of bytes read (short when part of the range is unmapped).
pub fn process_vm_read(pid: libc::pid_t, remote: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let rem = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which is writable for its length; the
    // remote iovec is only interpreted by the kernel in the other process.
    let n = cvt(unsafe { libc::process_vm_readv(pid, &local, 1, &rem, 1, 0) as libc::c_long })?;
    Ok(n as usize)
}

/// `process_vm_writev(2)` of `buf` to one remote range. Returns the number
/// of bytes written (short when part of the range is unmapped).
///
/// # Safety
/// The kernel writes the memory of process `pid`: where that is the
/// caller's own (its pid, or a process sharing its memory), nothing may rely
/// on the range's contents (no live Rust reference into it), as for a
/// write through a raw pointer.
pub unsafe fn process_vm_write(pid: libc::pid_t, remote: u64, buf: &[u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let rem = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, readable for its length (the kernel
    // only reads it); the remote iovec is interpreted in the other process.
    let n = cvt(unsafe { libc::process_vm_writev(pid, &local, 1, &rem, 1, 0) as libc::c_long })?;
    Ok(n as usize)
}

/// The process itself, for `process_madvise` and other pidfd calls made
/// by a process on itself (Linux 6.14+; `PIDFD_SELF_THREAD_GROUP`).
pub const PIDFD_SELF_PROCESS: i32 = -10001;

/// Iovecs naming ranges (address, bytes) of another process: only the
/// kernel interprets them, in that process.
fn remote_iovecs(ranges: impl Iterator<Item = (u64, usize)>) -> Vec<libc::iovec> {
    ranges
        .map(|(a, l)| libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: l,
        })
        .collect()
}

/// `process_vm_readv(2)` with several remote ranges into one contiguous buffer.
pub fn process_vm_readv(
    pid: libc::pid_t,
    remote: &[(u64, usize)],
    buf: &mut [u8],
) -> io::Result<usize> {
    let total: usize = remote.iter().map(|r| r.1).sum();
    assert!(total <= buf.len(), "buffer too small for the remote ranges");
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: total,
    };
    let iovs = remote_iovecs(remote.iter().copied());
    // SAFETY: `local` describes the first `total` bytes of `buf`; the remote
    // iovecs are only interpreted by the kernel in the other process.
    let n = cvt(unsafe {
        libc::process_vm_readv(
            pid,
            &local,
            1,
            iovs.as_ptr(),
            iovs.len() as libc::c_ulong,
            0,
        ) as libc::c_long
    })?;
    Ok(n as usize)
}

/// `process_vm_readv(2)` of several remote ranges, each into its own buffer
/// of the same length (at most `IOV_MAX`, 1024, of them). Returns the bytes
/// read: fewer than asked when a remote range is not mapped (the parts
/// before it are whole).
pub fn process_vm_readv_scatter(
    pid: libc::pid_t,
    parts: &mut [(u64, &mut [u8])],
) -> io::Result<usize> {
    assert!(parts.len() <= 1024, "more than IOV_MAX parts");
    let local: Vec<libc::iovec> = parts
        .iter_mut()
        .map(|(_, b)| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let remote = remote_iovecs(parts.iter().map(|(a, b)| (*a, b.len())));
    // SAFETY: each local iovec describes a distinct writable buffer borrowed
    // mutably for the call; the remote iovecs are only interpreted by the
    // kernel in the other process.
    let n = cvt(unsafe {
        libc::process_vm_readv(
            pid,
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        ) as libc::c_long
    })?;
    Ok(n as usize)
}

/// `process_vm_writev(2)` of `local` buffers (at most `IOV_MAX`, 1024)
/// gathered, in order, into the `remote` ranges (at most 1024; their
/// lengths add up to the buffers'). Returns the bytes written: fewer than
/// asked when a remote range is not mapped or not writable (the parts
/// before it are whole).
///
/// # Safety
/// The kernel writes the memory of process `pid`: where that is the
/// caller's own (its pid, or a process sharing its memory), nothing may rely
/// on the range's contents (no live Rust reference into it), as for a
/// write through a raw pointer.
pub unsafe fn process_vm_writev_gather(
    pid: libc::pid_t,
    local: &[&[u8]],
    remote: &[(u64, usize)],
) -> io::Result<usize> {
    assert!(local.len() <= 1024, "more than IOV_MAX local parts");
    assert!(remote.len() <= 1024, "more than IOV_MAX remote parts");
    let lv: Vec<libc::iovec> = local
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let rv = remote_iovecs(remote.iter().copied());
    // SAFETY: each local iovec describes a buffer borrowed for the call,
    // which the kernel only reads; the remote iovecs are only interpreted
    // by the kernel in the other process.
    let n = cvt(unsafe {
        libc::process_vm_writev(
            pid,
            lv.as_ptr(),
            lv.len() as libc::c_ulong,
            rv.as_ptr(),
            rv.len() as libc::c_ulong,
            0,
        ) as libc::c_long
    })?;
    Ok(n as usize)
}

/// `process_madvise(2)` with the given remote ranges.
pub fn process_madvise(
    pidfd: RawFd,
    ranges: &[(u64, usize)],
    advice: libc::c_int,
) -> io::Result<usize> {
    let iovs = remote_iovecs(ranges.iter().copied());
    // SAFETY: `iovs` is a valid array of iovecs that outlives the call; the
    // kernel interprets the addresses in the target process.
    let n = cvt(unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            pidfd,
            iovs.as_ptr(),
            iovs.len(),
            advice,
            0,
        )
    })?;
    Ok(n as usize)
}

/// `kill(pid, 0)`: whether the process exists (and we may signal it).
pub fn process_exists(pid: libc::pid_t) -> io::Result<()> {
    // SAFETY: signal 0 performs only the existence and permission checks.
    cvt_int(unsafe { libc::kill(pid, 0) })?;
    Ok(())
}

/// Runs `child` in a forked child process that exits with its return value
/// (through `_exit`, without running destructors), and waits for it.
/// Returns the child's exit status as `waitpid` reports it.
///
/// # Safety
/// The caller is single-threaded, or `child` allocates nothing and takes no
/// lock: after `fork` only the calling thread exists in the child, and a
/// lock another thread held stays held there for ever.
pub unsafe fn fork_and_wait(child: impl FnOnce() -> i32) -> io::Result<i32> {
    // SAFETY: the caller keeps fork_child's contract, which is ours.
    wait_child(unsafe { fork_child(child) }?)
}

/// Like [`fork_and_wait`] without the wait: returns the child's pid at once.
/// The caller reaps it with [`wait_child`].
///
/// # Safety
/// As [`fork_and_wait`].
pub unsafe fn fork_child(child: impl FnOnce() -> i32) -> io::Result<libc::pid_t> {
    // SAFETY: the child runs only `child`, which the caller vouches for, and
    // leaves through _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = child();
        // SAFETY: _exit ends the child at once, running no atexit handlers
        // or destructors that belong to the parent's state.
        unsafe { libc::_exit(code) };
    }
    Ok(pid)
}

/// Sets `FD_CLOEXEC` on `fd`: it is closed in programs this process execs.
pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_SETFD takes an int and touches no memory of ours.
    cvt_int(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) })?;
    Ok(())
}

/// Waits for child `pid` to end; returns its status as `waitpid` reports it.
pub fn wait_child(pid: libc::pid_t) -> io::Result<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// `ptrace(PTRACE_SEIZE)` of one thread: attach without stopping it.
/// With `PTRACE_O_TRACESYSGOOD`: a syscall stop shows as [`SYSCALL_STOP`].
pub fn ptrace_seize(tid: libc::pid_t) -> io::Result<()> {
    crate::launch::ptrace_seize_with(tid, base_options(tid))
}

/// Processes (thread-group ids) whose `SECCOMP_RET_TRACE` calls this
/// process wants to see (see [`report_seccomp_stops`]).
static SECCOMP_STOPS: std::sync::Mutex<Vec<libc::pid_t>> = std::sync::Mutex::new(Vec::new());

/// From now on (`on`) or no longer, every thread of process `pid` that
/// [`ptrace_seize`] attaches, and every option set by
/// [`ptrace_set_suspend_seccomp`], adds `PTRACE_O_TRACESECCOMP`: a call its
/// filter answers with `SECCOMP_RET_TRACE` stops for the tracer
/// (`PTRACE_EVENT_SECCOMP`) instead of failing with `ENOSYS`. For a
/// process whose filter the tracer installed for itself.
pub fn report_seccomp_stops(pid: libc::pid_t, on: bool) {
    let mut list = SECCOMP_STOPS.lock().unwrap_or_else(|p| p.into_inner());
    list.retain(|&p| p != pid);
    if on {
        list.push(pid);
    }
}

/// The options every seize and option change sets on thread `tid`.
fn base_options(tid: libc::pid_t) -> libc::c_int {
    let list = SECCOMP_STOPS.lock().unwrap_or_else(|p| p.into_inner());
    if list.is_empty() {
        return libc::PTRACE_O_TRACESYSGOOD;
    }
    let tgid = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:").map(|v| v.trim().parse().ok()))?
        });
    match tgid {
        Some(t) if list.contains(&t) => libc::PTRACE_O_TRACESYSGOOD | libc::PTRACE_O_TRACESECCOMP,
        _ => libc::PTRACE_O_TRACESYSGOOD,
    }
}

/// `PTRACE_O_SUSPEND_SECCOMP` (`linux/ptrace.h`, newer than the system
/// headers): while set on a tracee, its seccomp filters do not apply to its
/// system calls. Needs CAP_SYS_ADMIN and a tracer under no filter itself.
pub const PTRACE_O_SUSPEND_SECCOMP: libc::c_int = 1 << 21;

/// `ptrace(PTRACE_SETOPTIONS)` of a seized thread: [`ptrace_seize`]'s
/// options, plus [`PTRACE_O_SUSPEND_SECCOMP`] when
/// `suspend_seccomp`.
pub fn ptrace_set_suspend_seccomp(tid: libc::pid_t, suspend_seccomp: bool) -> io::Result<()> {
    let mut options = base_options(tid);
    if suspend_seccomp {
        options |= PTRACE_O_SUSPEND_SECCOMP;
    }
    // SAFETY: PTRACE_SETOPTIONS takes a tid and its options in `data`; addr 0.
    cvt_int(unsafe {
        libc::ptrace(libc::PTRACE_SETOPTIONS, tid, 0usize, options as usize) as libc::c_int
    })
    .map(|_| ())
}

/// `PTRACE_SECCOMP_GET_FILTER` (`linux/ptrace.h`).
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;

/// One classic BPF instruction of a seccomp filter (`struct sock_filter`).
pub type BpfInsn = libc::sock_filter;

const _: () = assert!(std::mem::size_of::<BpfInsn>() == 8);

/// The `index`th seccomp filter of stopped tracee `tid` (0: the one
/// installed last), its instructions; `None` past the last filter
/// (`ENOENT`). Needs what [`PTRACE_O_SUSPEND_SECCOMP`] needs (`EACCES`
/// otherwise).
pub fn ptrace_seccomp_filter(tid: libc::pid_t, index: usize) -> io::Result<Option<Vec<BpfInsn>>> {
    // SAFETY: with data NULL the kernel writes nothing and returns the
    // filter's instruction count.
    let n = unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER,
            tid,
            index,
            std::ptr::null_mut::<BpfInsn>(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    let zero = BpfInsn {
        code: 0,
        jt: 0,
        jf: 0,
        k: 0,
    };
    let mut prog = vec![zero; n as usize];
    // SAFETY: the kernel writes at most the count it just gave, and `prog`
    // holds that many instructions. (A filter never changes once installed.)
    let m = unsafe { libc::ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, prog.as_mut_ptr()) };
    if m < 0 {
        return Err(io::Error::last_os_error());
    }
    prog.truncate(m as usize);
    Ok(Some(prog))
}

/// The stop signal of a syscall-entry or syscall-exit stop of a thread
/// seized by [`ptrace_seize`] (`SIGTRAP | 0x80`).
pub const SYSCALL_STOP: libc::c_int = libc::SIGTRAP | 0x80;

/// `ptrace(PTRACE_SYSCALL)`: resume a stopped thread until the next entry
/// to or exit from a system call.
pub fn ptrace_syscall(tid: libc::pid_t) -> io::Result<()> {
    crate::launch::ptrace_syscall_signal(tid, 0)
}

/// `ptrace(PTRACE_INTERRUPT)`: stop a seized thread; wait for it with [`wait_stopped`].
pub fn ptrace_interrupt(tid: libc::pid_t) -> io::Result<()> {
    // SAFETY: as above; the thread was seized by this thread.
    cvt_int(unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) as libc::c_int })
        .map(|_| ())
}

/// `ptrace(PTRACE_DETACH)`: let a seized thread go (it resumes).
pub fn ptrace_detach(tid: libc::pid_t) -> io::Result<()> {
    // SAFETY: as above; data 0 delivers no signal.
    cvt_int(unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, 0usize) as libc::c_int })
        .map(|_| ())
}

/// `PTRACE_LISTEN`: a seized thread in a group-stop (its process stopped
/// by a signal) stays stopped, and its tracer learns when it is continued.
pub fn ptrace_listen(tid: libc::pid_t) -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt_int(unsafe { libc::ptrace(PTRACE_LISTEN, tid, 0usize, 0usize) as libc::c_int }).map(|_| ())
}

/// `PTRACE_LISTEN` (`linux/ptrace.h`).
const PTRACE_LISTEN: libc::c_uint = 0x4208;

/// `KCMP_FILE`.
const KCMP_FILE: libc::c_int = 0;

/// `kcmp(2)` with `KCMP_FILE`: whether descriptor `fd_a` of process `a` and
/// `fd_b` of `b` are one open file description.
pub fn same_open_file(
    a: libc::pid_t,
    fd_a: RawFd,
    b: libc::pid_t,
    fd_b: RawFd,
) -> io::Result<bool> {
    // SAFETY: integer arguments only.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILE, fd_a, fd_b) };
    Ok(cvt(r)? == 0)
}

/// Waits until traced thread `tid` stops. `Ok(false)` if it exited instead.
pub fn wait_stopped(tid: libc::pid_t) -> io::Result<bool> {
    loop {
        let mut status = 0;
        // SAFETY: waits for a thread this thread traces; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        if r == tid {
            if libc::WIFSTOPPED(status) {
                return Ok(true);
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Ok(false);
            }
            continue;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// `kill(2)`: sends `sig` to process `pid`.
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    cvt(unsafe { libc::kill(pid, sig) } as libc::c_long).map(drop)
}

/// `geteuid(2)`: the effective user id of this process.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `getrandom(2)` into `buf`; returns how many bytes were filled.
pub fn getrandom(buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    cvt(n as libc::c_long).map(|n| n as usize)
}

/// `write(2)` of `buf` to `fd`, straight to the descriptor (no buffering
/// and no lock of Rust's standard streams); async-signal-safe.
pub fn write_fd(fd: std::os::fd::RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of its length.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    cvt(n as libc::c_long).map(|n| n as usize)
}

/// The process at the other end of a connected Unix socket, as the
/// kernel recorded it when the connection was made (`SO_PEERCRED`): its
/// pid in this process's pid namespace (0 where it has none here) and its
/// effective uid.
pub fn peer_credentials(sock: std::os::fd::BorrowedFd<'_>) -> io::Result<(libc::pid_t, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` says the
    // size of `cred`; `sock` is open for the call.
    cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    } as libc::c_long)?;
    Ok((cred.pid, cred.uid))
}

/// Takes ownership of descriptor `fd` of this process, which another party
/// made for it (a privileged helper that made a call inside this process),
/// after checking that it is open.
///
/// # Safety
/// Nothing else in this process owns `fd` or will close it.
pub unsafe fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_GETFD) takes no pointer and changes nothing.
    cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) } as libc::c_long)?;
    // SAFETY: open (just checked), and the caller vouches that nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Clears `FD_CLOEXEC` on `fd`, so that it survives an `exec`;
/// async-signal-safe (for `pre_exec`).
pub fn clear_cloexec(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_SETFD) takes no pointer.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } as libc::c_long).map(drop)
}

/// `flock(2)` with `LOCK_EX | LOCK_NB`: takes the exclusive lock of the
/// open file `fd` or fails at once (`EWOULDBLOCK`) when another holds it.
pub fn flock_exclusive_nonblocking(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock takes no pointer; `fd` is open for the call.
    cvt(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } as libc::c_long)
        .map(drop)
}

/// Registers `f` to run when the process exits normally (`atexit(3)`).
pub fn at_exit(f: extern "C" fn()) -> io::Result<()> {
    // SAFETY: registers a plain function pointer, valid for the whole run.
    if unsafe { libc::atexit(f) } != 0 {
        return Err(io::Error::other("atexit: no room for another handler"));
    }
    Ok(())
}

/// Registers handlers around `fork` (`pthread_atfork(3)`).
///
/// # Safety
/// `child` runs in the child of a possibly threaded process, where only
/// the forking thread exists: it must not allocate or take a lock another
/// thread may have held.
pub unsafe fn at_fork(
    prepare: extern "C" fn(),
    parent: extern "C" fn(),
    child: extern "C" fn(),
) -> io::Result<()> {
    // SAFETY: plain function pointers; the caller vouches for `child`.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// The address of the calling thread's `errno` (in its static TLS block).
pub fn errno_location() -> *mut libc::c_int {
    // SAFETY: __errno_location has no preconditions.
    unsafe { libc::__errno_location() }
}

/// The registers of a stopped traced thread (x86-64: `user_regs_struct`).
#[cfg(target_arch = "x86_64")]
pub type Regs = libc::user_regs_struct;

/// Registers all zero (`Regs` is plain integers), to fill in.
#[cfg(target_arch = "x86_64")]
pub fn zeroed_regs() -> Regs {
    // SAFETY: user_regs_struct is plain integers; all zero is valid.
    unsafe { std::mem::zeroed() }
}

/// `ptrace(PTRACE_GETREGS)`: the registers of a stopped traced thread.
#[cfg(target_arch = "x86_64")]
pub fn ptrace_getregs(tid: libc::pid_t) -> io::Result<Regs> {
    // SAFETY: a zeroed user_regs_struct is valid storage for the kernel to fill.
    let mut r: Regs = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct to `data`.
    cvt_int(unsafe {
        libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut r as *mut Regs) as libc::c_int
    })?;
    Ok(r)
}

/// `ptrace(PTRACE_SETREGS)`: sets the registers of a stopped traced thread.
/// (What the thread then executes is the caller's to choose: it runs in
/// another process, whose memory safety this one cannot break.)
#[cfg(target_arch = "x86_64")]
pub fn ptrace_setregs(tid: libc::pid_t, r: &Regs) -> io::Result<()> {
    // SAFETY: PTRACE_SETREGS reads one user_regs_struct from `data`.
    cvt_int(unsafe {
        libc::ptrace(libc::PTRACE_SETREGS, tid, 0usize, r as *const Regs) as libc::c_int
    })
    .map(|_| ())
}

/// `NT_X86_XSTATE`: the regset of a thread's whole extended state (x87,
/// SSE, AVX and beyond: the `XSAVE` area).
pub const NT_X86_XSTATE: libc::c_int = 0x202;

/// Where state component `i` of the `XSAVE` area lies in the standard
/// (uncompacted) format `NT_X86_XSTATE` reads and writes: its offset and
/// size in bytes, as this CPU says (`CPUID` leaf 0xD, sub-leaf `i`);
/// `None` for the legacy components 0 and 1 (the first 512 bytes) and for
/// a component this CPU does not have.
pub fn xsave_component(i: u32) -> Option<(usize, usize)> {
    if !(2..63).contains(&i) {
        return None;
    }
    let r = std::arch::x86_64::__cpuid_count(0xd, i);
    (r.eax != 0).then_some((r.ebx as usize, r.eax as usize))
}

/// `ptrace(PTRACE_GETREGSET)` of regset `kind` into `buf`: the bytes the
/// kernel filled (at most `buf.len()`).
pub fn ptrace_getregset(tid: libc::pid_t, kind: libc::c_int, buf: &mut [u8]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: PTRACE_GETREGSET writes at most `iov_len` bytes to `iov_base`
    // (`buf`, borrowed mutably) and stores the length written in `iov`.
    cvt_int(unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            kind as usize,
            &mut iov as *mut libc::iovec,
        ) as libc::c_int
    })?;
    Ok(iov.iov_len)
}

/// `ptrace(PTRACE_SETREGSET)` of regset `kind` from `buf` (as
/// [`ptrace_getregset`] returned it).
pub fn ptrace_setregset(tid: libc::pid_t, kind: libc::c_int, buf: &[u8]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: PTRACE_SETREGSET reads at most `iov_len` bytes from
    // `iov_base` (`buf`, which it does not write).
    cvt_int(unsafe {
        libc::ptrace(
            libc::PTRACE_SETREGSET,
            tid,
            kind as usize,
            &mut iov as *mut libc::iovec,
        ) as libc::c_int
    })
    .map(|_| ())
}

/// `PTRACE_GET_RSEQ_CONFIGURATION` (Linux 5.13).
const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;

/// `struct ptrace_rseq_configuration`.
#[repr(C)]
#[derive(Default)]
struct RseqConfiguration {
    rseq_abi_pointer: u64,
    rseq_abi_size: u32,
    signature: u32,
    flags: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<RseqConfiguration>() == 24);

/// `ptrace(PTRACE_GET_RSEQ_CONFIGURATION)`: where a stopped traced thread's
/// rseq area is and its size (`None` where it registered none).
pub fn ptrace_rseq_area(tid: libc::pid_t) -> io::Result<Option<(u64, u32)>> {
    let mut c = RseqConfiguration::default();
    // SAFETY: the request writes at most `addr` (24) bytes to `data`, a
    // local of that size.
    cvt_int(unsafe {
        libc::ptrace(
            PTRACE_GET_RSEQ_CONFIGURATION,
            tid,
            std::mem::size_of::<RseqConfiguration>(),
            &mut c as *mut RseqConfiguration,
        ) as libc::c_int
    })?;
    Ok((c.rseq_abi_pointer != 0).then_some((c.rseq_abi_pointer, c.rseq_abi_size)))
}

/// `ptrace(PTRACE_SINGLESTEP)` with no signal: the stopped thread executes
/// one instruction and stops again (`SIGTRAP`).
pub fn ptrace_singlestep(tid: libc::pid_t) -> io::Result<()> {
    // SAFETY: integer arguments only; data 0 delivers no signal.
    cvt_int(unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, tid, 0usize, 0usize) as libc::c_int })
        .map(|_| ())
}

/// How a traced thread stopped or ended (see [`wait_traced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceStop {
    /// Stopped; the signal of the stop (`SIGTRAP` for a step or an event
    /// stop, with `event` the `PTRACE_EVENT_*` number or 0).
    Stopped {
        /// The stop's signal.
        sig: libc::c_int,
        /// `PTRACE_EVENT_*`, 0 for none.
        event: libc::c_int,
    },
    /// It exited or was killed.
    Gone,
}

/// Waits until traced thread `tid` stops or ends.
pub fn wait_traced(tid: libc::pid_t) -> io::Result<TraceStop> {
    loop {
        let mut status = 0;
        // SAFETY: waits for a thread this thread traces; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        if r == tid {
            if libc::WIFSTOPPED(status) {
                return Ok(TraceStop::Stopped {
                    sig: libc::WSTOPSIG(status),
                    event: (status >> 16) & 0xff,
                });
            }
            return Ok(TraceStop::Gone);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// `pidfd_getfd(2)`: a duplicate, in this process, of descriptor `fd` of the
/// process `pidfd` refers to (close-on-exec).
pub fn pidfd_getfd(pidfd: std::os::fd::BorrowedFd<'_>, fd: RawFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: integer arguments only.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let fd = cvt(r)? as RawFd;
    // SAFETY: a new descriptor that this process owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// CPU time the calling thread has used, ns (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is valid storage for the result.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of CPU times
/// in `/proc/PID/stat`.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 {
        n as u64
    } else {
        100
    }
}

/// `PTRACE_GETSIGMASK` (Linux 3.11).
const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
/// `PTRACE_SETSIGMASK`.
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;
/// `PTRACE_EVENT_STOP`: the stop of `PTRACE_INTERRUPT` or of a group stop
/// under `PTRACE_SEIZE` (the `event` of [`TraceStop::Stopped`]).
pub const PTRACE_EVENT_STOP: libc::c_int = 128;

/// `ptrace(PTRACE_GETSIGMASK)`: the signal mask of a stopped traced thread
/// (bit `n - 1` for signal `n`).
pub fn ptrace_getsigmask(tid: libc::pid_t) -> io::Result<u64> {
    let mut m = 0u64;
    // SAFETY: PTRACE_GETSIGMASK writes `addr` (8) bytes to `data`, an 8-byte local.
    cvt_int(unsafe {
        libc::ptrace(PTRACE_GETSIGMASK, tid, 8usize, &mut m as *mut u64) as libc::c_int
    })?;
    Ok(m)
}

/// `ptrace(PTRACE_SETSIGMASK)`: sets the signal mask of a stopped traced
/// thread (the kernel leaves `SIGKILL` and `SIGSTOP` unblocked). It also
/// drops the thread's pending restore of a mask saved by `ppoll`,
/// `pselect6`, `rt_sigsuspend` or `epoll_pwait`: set it only where no such
/// call is being left.
pub fn ptrace_setsigmask(tid: libc::pid_t, mask: u64) -> io::Result<()> {
    // SAFETY: PTRACE_SETSIGMASK reads `addr` (8) bytes from `data`, an 8-byte local.
    cvt_int(unsafe {
        libc::ptrace(PTRACE_SETSIGMASK, tid, 8usize, &mask as *const u64) as libc::c_int
    })
    .map(|_| ())
}

/// `ptrace(PTRACE_CONT)` delivering `sig` (0 for none): from a
/// signal-delivery stop, `sig` is delivered with the siginfo it came with.
pub fn ptrace_cont(tid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt_int(unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0usize, sig as usize) as libc::c_int })
        .map(|_| ())
}

/// Waits until traced thread `tid` stops or ends, at most until
/// `deadline`: `Ok(None)` when it did neither by then. Polls (a thread
/// stuck in an uninterruptible wait, such as a `vfork` parent, must not
/// hold the caller).
pub fn wait_traced_until(
    tid: libc::pid_t,
    deadline: std::time::Instant,
) -> io::Result<Option<TraceStop>> {
    let mut nap = std::time::Duration::from_micros(20);
    let mut spins = 0u32;
    loop {
        let mut status = 0;
        // SAFETY: waits for a thread this thread traces; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            if libc::WIFSTOPPED(status) {
                return Ok(Some(TraceStop::Stopped {
                    sig: libc::WSTOPSIG(status),
                    event: (status >> 16) & 0xff,
                }));
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Ok(Some(TraceStop::Gone));
            }
            continue;
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
            continue;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        // A step or an interrupt stops a thread within microseconds: yield
        // at first, then sleep longer and longer.
        if spins < 200 {
            spins += 1;
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(std::time::Duration::from_millis(5));
    }
}

/// `KCMP_VM`: whether two processes share one address space.
const KCMP_VM: libc::c_int = 1;

/// `kcmp(2)` with `KCMP_VM`: whether processes `a` and `b` share their
/// memory (one `mm`), as after `clone(CLONE_VM)` without `CLONE_THREAD`.
pub fn share_memory(a: libc::pid_t, b: libc::pid_t) -> io::Result<bool> {
    // SAFETY: integer arguments only.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0, 0) };
    Ok(cvt(r)? == 0)
}

/// The calling thread's id.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// `sched_yield(2)`: lets another runnable thread run (async-signal-safe).
pub fn sched_yield() {
    // SAFETY: no preconditions; it cannot fail on Linux.
    unsafe { libc::sched_yield() };
}

/// Sends all of `buf` on the socket `fd` with `MSG_NOSIGNAL`: a peer that
/// has gone away is an `EPIPE` error, never a SIGPIPE to this process (the
/// shim writes from inside a program whose SIGPIPE is its own).
pub fn send_all_nosignal(fd: std::os::fd::BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for reading `buf.len()` bytes.
        let n = unsafe {
            libc::send(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Sets up `c` so that the child is sent `sig` when the thread that starts
/// it ends (`PR_SET_PDEATHSIG`): a program started by a tool that is
/// killed is not left running on its own. A child whose parent ended
/// between the fork and the `prctl` is sent `sig` at once (its parent is no
/// longer `parent`). The signal goes with the *thread* that forked, so
/// start children from a thread that lives as long as they should.
pub fn die_with_parent(c: &mut std::process::Command, sig: libc::c_int) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid(2) takes nothing and cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure makes only prctl(2), getppid(2) and kill(2)
    // calls, all async-signal-safe, and allocates nothing.
    unsafe {
        c.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), sig);
            }
            Ok(())
        });
    }
}

/// Sets up `c` so that the child keeps `fd` open across its `exec`
/// (clears `FD_CLOEXEC` in the child, between fork and exec: one `fcntl`,
/// async-signal-safe).
pub fn keep_fd_across_exec(c: &mut std::process::Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure makes only fcntl(2) calls, which are
    // async-signal-safe, on an fd number; it allocates nothing.
    unsafe {
        c.pre_exec(move || clear_cloexec(fd));
    }
}
