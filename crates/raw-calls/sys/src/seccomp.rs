//! Seeing a program's memory system calls as they happen: a seccomp filter
//! that turns `mmap`, `mprotect`, `brk` and `mremap` made by the C library
//! into `SIGSYS` (`SECCOMP_RET_TRAP`), so that a handler can make the call
//! itself ([`raw_syscall`]) and act on its result before the program sees it. x86-64 only; elsewhere [`trap_memory_syscalls`] answers
//! `EOPNOTSUPP`.
//!
//! References: `seccomp(2)`, `Documentation/userspace-api/seccomp_filter.rst`.

use std::io;

/// The memory system calls the filter traps.
pub const TRAPPED: [libc::c_long; 4] = [
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_brk,
    libc::SYS_mremap,
];

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl pagewise_raw_syscall",
    ".hidden pagewise_raw_syscall",
    ".type pagewise_raw_syscall,@function",
    "pagewise_raw_syscall:",
    "mov rax, rdi",
    "mov rdi, rsi",
    "mov rsi, rdx",
    "mov rdx, rcx",
    "mov r10, r8",
    "mov r8, r9",
    "mov r9, [rsp+8]",
    "syscall",
    "ret",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn pagewise_raw_syscall(nr: i64, a: u64, b: u64, c: u64, d: u64, e: u64, f: u64) -> i64;
}

/// Makes system call `nr` with `args` from pagewise's own code, which the
/// filter lets through. Returns the kernel's raw answer (`-errno` on failure).
///
/// # Safety
/// As for the system call itself: the arguments must be valid for it.
#[cfg(target_arch = "x86_64")]
pub unsafe fn raw_syscall(nr: libc::c_long, args: [u64; 6]) -> i64 {
    // SAFETY: the stub follows the C calling convention and the kernel's
    // system-call convention; the caller vouches for the arguments.
    unsafe { pagewise_raw_syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) }
}

const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_TRAP: u32 = 0x0003_0000;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JGT_K: u16 = 0x25;
const BPF_RET_K: u16 = 0x06;
const BPF_JA: u16 = 0x05;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Installs the filter on the calling thread (and the threads it creates
/// from now on): the [`TRAPPED`] calls made from code in `[start, end)` (the
/// C library's text) raise `SIGSYS`; calls from anywhere else, such as
/// [`raw_syscall`] or a new program's loader after `execve` (the filter
/// stays, the C library moves), go through. Sets `no_new_privs`, which
/// seccomp requires. Install the `SIGSYS` handler first.
pub fn trap_memory_syscalls(start: u64, end: u64) -> io::Result<()> {
    trap_syscalls(start, end, &TRAPPED, &[], &[])
}

/// [`trap_memory_syscalls`] for any set of calls `nrs`, the calls
/// `everywhere` from any code at all (a library making its own system
/// calls, as liburing does), and the calls `when` = `(nr, i, value)` from
/// `[start, end)` whose argument `i` (its low 32 bits) is `value` (one
/// `ioctl` request, not every `ioctl`; a number goes in `nrs` or in
/// `when`, not both). The filter tests the number against
/// `everywhere` (a test each), then `when` (one or two tests each), then
/// the runs of consecutive numbers of `nrs` (in order, a test or two per
/// run), then the instruction pointer.
pub fn trap_syscalls(
    start: u64,
    end: u64,
    nrs: &[libc::c_long],
    everywhere: &[libc::c_long],
    when: &[(libc::c_long, usize, u32)],
) -> io::Result<()> {
    if start >= end || end - start > 1 << 32 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = nrs;
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    #[cfg(target_arch = "x86_64")]
    {
        let mut sorted: Vec<u32> = nrs.iter().map(|&n| n as u32).collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for n in sorted {
            match runs.last_mut() {
                Some((_, hi)) if *hi + 1 == n => *hi = n,
                _ => runs.push((n, n)),
            }
        }
        // Two instructions per run; the match block follows the last run,
        // and a jump reaches at most 255 instructions ahead.
        if runs.is_empty() || runs.len() * 2 + 1 > 255 {
            return Err(io::Error::from_raw_os_error(libc::E2BIG));
        }
        // seccomp_data: nr at 0, arch at 4, instruction_pointer at 8 (low
        // half) and 12 (high half).
        let mut prog = vec![
            stmt(BPF_LD_W_ABS, 4),
            jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
            stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
            stmt(BPF_LD_W_ABS, 0),
        ];
        for &nr in everywhere {
            prog.push(jump(BPF_JEQ_K, nr as u32, 0, 1));
            prog.push(stmt(BPF_RET_K, SECCOMP_RET_TRAP));
        }
        // Run i (of n) starts at 2i after this point; "allow" sits at 2n,
        // the match block at 2n + 1.
        let n = runs.len();
        // Each `when` rule: not its number, the next rule (the number
        // still loaded); its number, its argument loaded and compared:
        // equal, the match block; not, allowed.
        let rules = when.len();
        for (j, &(nr, i, value)) in when.iter().enumerate() {
            if i > 5 {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            prog.push(jump(BPF_JEQ_K, nr as u32, 0, 4));
            // seccomp_data: args from 16, 8 bytes each, low half first.
            prog.push(stmt(BPF_LD_W_ABS, 16 + 8 * i as u32));
            prog.push(jump(BPF_JEQ_K, value, 1, 0));
            prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
            // From after this jump to the match block: the rules left,
            // the runs and "allow".
            let to_match = 5 * (rules - j - 1) + 2 * n + 1;
            prog.push(stmt(BPF_JA, to_match as u32));
        }
        for (i, &(lo, hi)) in runs.iter().enumerate() {
            let here = 2 * i;
            // nr > hi: the next run; else nr >= lo: a match, else allow.
            prog.push(jump(BPF_JGT_K, hi, 1, 0));
            let to_allow = (2 * n - (here + 2)) as u8;
            let to_match = (2 * n + 1 - (here + 2)) as u8;
            prog.push(jump(BPF_JGE_K, lo, to_match, to_allow));
            // A miss on "nr > hi" for the last run falls into "allow".
        }
        // The JGT of run i jumps over one instruction to run i+1 when the
        // number is above it; past the last run, that lands on "allow".
        prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
        // The range in pieces that each lie in one 4 GiB window (the high
        // halves equal): trap when the IP is inside one.
        let mut pieces = Vec::new();
        let mut s = start;
        while s < end {
            let window_end = ((s >> 32) + 1) << 32;
            let e = end.min(window_end);
            pieces.push((s, e));
            s = e;
        }
        for (s, e) in pieces {
            prog.extend([
                stmt(BPF_LD_W_ABS, 12),
                jump(BPF_JEQ_K, (s >> 32) as u32, 0, 4),
                stmt(BPF_LD_W_ABS, 8),
                jump(BPF_JGE_K, s as u32, 0, 2),
                jump(BPF_JGT_K, (e - 1) as u32, 1, 0),
                stmt(BPF_RET_K, SECCOMP_RET_TRAP),
            ]);
        }
        prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
        install(&mut prog)
    }
}

/// Sets the calling thread's `no_new_privs` and installs filter `prog` on
/// it (and the threads it starts from then on).
fn install(prog: &mut [libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at a well-formed filter that outlives the
    // call (the kernel copies it).
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const BPF_LD_W_ABS_ARCH: u32 = 4;

/// The calls every thread of pagewise makes whatever its work: memory,
/// futexes, starting a thread of its own (which inherits a filter),
/// signal masks and the alternate stack, its ids, clocks and sleeps,
/// randomness, reading and writing descriptors it holds, and its end. A
/// confined thread's list is these and those of its work.
pub const THREAD_CALLS: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_brk,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_restart_syscall,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_prctl,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// Confines the calling thread, and the threads it starts from then on,
/// to the system calls `allowed`: any other is refused with `EPERM`, and a
/// call of another architecture's table (x32, i386) ends the process.
/// The filter is the thread's own: the process's other threads are not
/// under it (no `SECCOMP_FILTER_FLAG_TSYNC`). Sets the thread's
/// `no_new_privs`, which a process without CAP_SYS_ADMIN needs for a
/// filter (and which only ever takes away).
///
/// The filter is written for x86-64: on another architecture the thread
/// is left as it is and `Ok(false)` says so, the one rule for every
/// thread of pagewise's that confines itself (a service that refused to
/// run there would protect nothing); `Ok(true)`: confined.
pub fn confine_thread(allowed: &[libc::c_long]) -> io::Result<bool> {
    if !cfg!(target_arch = "x86_64") {
        return Ok(false);
    }
    if allowed.len() > 200 {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let mut prog = vec![
        stmt(BPF_LD_W_ABS, BPF_LD_W_ABS_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, 0),
        // x32 calls (bit 30) are another table.
        jump(BPF_JGE_K, 0x4000_0000, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
    ];
    let n = allowed.len();
    for (i, &nr) in allowed.iter().enumerate() {
        // Equal: jump over the rest of the list and the refusal to the
        // ALLOW at the end.
        let to_allow = (n - i) as u8;
        prog.push(jump(BPF_JEQ_K, nr as u32, to_allow, 0));
    }
    prog.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    install(&mut prog).map(|()| true)
}

/// A trapped call as the `SIGSYS` handler sees it.
#[derive(Debug, Clone, Copy)]
pub struct Trapped {
    /// The system call number.
    pub nr: libc::c_long,
    /// Its six arguments.
    pub args: [u64; 6],
}

/// Reads the trapped call from a `SIGSYS` handler's arguments.
///
/// # Safety
/// `info` and `ctx` must be the handler's own arguments for a `SIGSYS`
/// raised by seccomp.
#[cfg(target_arch = "x86_64")]
pub unsafe fn trapped(info: *const libc::siginfo_t, ctx: *const libc::c_void) -> Trapped {
    // SAFETY: for SIGSYS, si_syscall sits after si_call_addr, 24 bytes into
    // siginfo_t (x86-64); `ctx` is the ucontext_t the kernel saved.
    unsafe {
        let nr = *((info as *const u8).add(24) as *const libc::c_int) as libc::c_long;
        let g = &(*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs;
        let r = |i: libc::c_int| g[i as usize] as u64;
        Trapped {
            nr,
            args: [
                r(libc::REG_RDI),
                r(libc::REG_RSI),
                r(libc::REG_RDX),
                r(libc::REG_R10),
                r(libc::REG_R8),
                r(libc::REG_R9),
            ],
        }
    }
}

/// Sets what the trapped call returns to the program.
///
/// # Safety
/// As for [`trapped`].
#[cfg(target_arch = "x86_64")]
pub unsafe fn set_result(ctx: *mut libc::c_void, ret: i64) {
    // SAFETY: `ctx` is the ucontext_t the kernel restores on return.
    unsafe {
        (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RAX as usize] = ret;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A confined thread makes what it is allowed and is refused the rest;
    /// the other threads are not confined.
    #[test]
    fn a_confined_thread_is_refused_what_its_list_lacks() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let t = std::thread::spawn(|| {
            let allowed = [
                libc::SYS_getpid,
                libc::SYS_futex,
                libc::SYS_exit,
                libc::SYS_munmap,
                libc::SYS_madvise,
                libc::SYS_rt_sigprocmask,
                libc::SYS_sigaltstack,
                libc::SYS_write,
            ];
            confine_thread(&allowed).unwrap();
            // SAFETY: getpid takes nothing.
            let pid = unsafe { libc::syscall(libc::SYS_getpid) };
            // SAFETY: a valid path and flags; refused before it is read.
            let open = unsafe { libc::open(c"/etc/hostname".as_ptr(), libc::O_RDONLY) };
            let err = io::Error::last_os_error().raw_os_error();
            (pid, open, err)
        });
        let (pid, open, err) = t.join().unwrap();
        assert_eq!(pid, std::process::id() as i64);
        assert_eq!((open, err), (-1, Some(libc::EPERM)), "openat refused");
        let here = std::fs::File::open("/proc/self/status");
        assert!(here.is_ok(), "this thread is not confined");
    }
}
