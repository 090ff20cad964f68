//! What memory a system call hands to the kernel (x86-64), so that the
//! inline path can hold it first (see [`super::inline`]): for each call
//! the preload shim traps, the buffers, structures and strings among its
//! arguments, and what those structures point at in turn (the `iovec`s of
//! a `readv`, the buffers of a `msghdr`, the strings of `execve`'s argv).
//!
//! An outer structure is held (and so local) before it is read for the
//! pointers inside it. A structure is read where the program said it is;
//! a pointer the program got wrong, which the kernel would have answered
//! with `EFAULT`, may fault here instead.

// The C library's names of system calls are lower case.
#![allow(non_upper_case_globals)]

use super::inline::{self, Held};
use libc::*;

/// The system calls [`hold_for`] knows: the shim traps these.
pub const KNOWN: &[c_long] = &[
    SYS_read,
    SYS_write,
    SYS_pread64,
    SYS_pwrite64,
    SYS_readv,
    SYS_writev,
    SYS_preadv,
    SYS_pwritev,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_open,
    SYS_openat,
    SYS_openat2,
    SYS_creat,
    SYS_stat,
    SYS_lstat,
    SYS_fstat,
    SYS_newfstatat,
    SYS_statx,
    SYS_statfs,
    SYS_fstatfs,
    SYS_access,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_poll,
    SYS_ppoll,
    SYS_select,
    SYS_pselect6,
    SYS_epoll_wait,
    SYS_epoll_pwait,
    SYS_epoll_pwait2,
    SYS_epoll_ctl,
    SYS_futex,
    SYS_ioctl,
    SYS_pipe,
    SYS_pipe2,
    SYS_socketpair,
    SYS_nanosleep,
    SYS_clock_nanosleep,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_gettimeofday,
    SYS_time,
    SYS_sendfile,
    SYS_splice,
    SYS_copy_file_range,
    SYS_connect,
    SYS_bind,
    SYS_accept,
    SYS_accept4,
    SYS_getsockname,
    SYS_getpeername,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_sendmmsg,
    SYS_recvmmsg,
    SYS_setsockopt,
    SYS_getsockopt,
    SYS_wait4,
    SYS_waitid,
    SYS_uname,
    SYS_fcntl,
    SYS_getdents,
    SYS_getdents64,
    SYS_getcwd,
    SYS_chdir,
    SYS_rename,
    SYS_renameat,
    SYS_renameat2,
    SYS_mkdir,
    SYS_mkdirat,
    SYS_rmdir,
    SYS_link,
    SYS_linkat,
    SYS_unlink,
    SYS_unlinkat,
    SYS_symlink,
    SYS_symlinkat,
    SYS_readlink,
    SYS_readlinkat,
    SYS_chmod,
    SYS_fchmodat,
    SYS_chown,
    SYS_lchown,
    SYS_fchownat,
    SYS_truncate,
    SYS_utimensat,
    SYS_getrlimit,
    SYS_setrlimit,
    SYS_prlimit64,
    SYS_getrusage,
    SYS_sysinfo,
    SYS_times,
    SYS_getrandom,
    SYS_sched_getaffinity,
    SYS_sched_setaffinity,
    SYS_rt_sigtimedwait,
    SYS_rt_sigsuspend,
    SYS_rt_sigpending,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    SYS_timer_settime,
    SYS_timer_gettime,
    SYS_signalfd,
    SYS_signalfd4,
    SYS_inotify_add_watch,
    SYS_memfd_create,
    SYS_execve,
    SYS_execveat,
    SYS_getxattr,
    SYS_lgetxattr,
    SYS_fgetxattr,
    SYS_setxattr,
    SYS_lsetxattr,
    SYS_fsetxattr,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_flistxattr,
    SYS_mincore,
    SYS_prctl,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
];

/// Calls refused on the inline path, from any code: the kernel uses their
/// buffers later, from its own threads or at completion (io_uring, Linux
/// AIO), where a page not local meets `EFAULT` and no hold for the call
/// can cover it. Refused with `ENOSYS`, as on a kernel without them, so a
/// program takes its fallback instead of meeting `EFAULT` (the handler
/// thread path serves them).
pub const REFUSED_INLINE: &[c_long] = &[SYS_io_uring_setup, SYS_io_setup];

/// Holds what `nr` with arguments `a` hands to the kernel; release it with
/// [`inline::release`] after the call.
/// Holds what `nr` with arguments `a` hands to the kernel; release it with
/// [`inline::release`] after the call.
pub fn hold_for(nr: c_long, a: &[u64; 6]) -> Held {
    let mut h = Holding::default();
    let _ = hold_files(&mut h, nr, a)
        || hold_io(&mut h, nr, a)
        || hold_net(&mut h, nr, a)
        || hold_process(&mut h, nr, a);
    h.done()
}

/// [`hold_for`] for paths, file status, links and extended attributes, and `execve`; whether `nr` is one of them.
fn hold_files(h: &mut Holding, nr: c_long, a: &[u64; 6]) -> bool {
    let p = |i: usize| a[i];
    match nr {
        SYS_open | SYS_creat | SYS_chdir | SYS_mkdir | SYS_rmdir | SYS_unlink | SYS_chmod
        | SYS_chown | SYS_lchown | SYS_truncate | SYS_access | SYS_memfd_create => h.cstr(p(0)),
        SYS_openat
        | SYS_mkdirat
        | SYS_unlinkat
        | SYS_fchmodat
        | SYS_fchownat
        | SYS_faccessat
        | SYS_faccessat2
        | SYS_inotify_add_watch => h.cstr(p(1)),
        SYS_openat2 => {
            h.cstr(p(1));
            h.range(p(2), p(3));
        }
        SYS_stat | SYS_lstat => {
            h.cstr(p(0));
            h.range(p(1), 144);
        }
        SYS_fstat => h.range(p(1), 144),
        SYS_newfstatat => {
            h.cstr(p(1));
            h.range(p(2), 144);
        }
        SYS_statx => {
            h.cstr(p(1));
            h.range(p(4), 256);
        }
        SYS_statfs => {
            h.cstr(p(0));
            h.range(p(1), 120);
        }
        SYS_fstatfs => h.range(p(1), 120),
        SYS_rename | SYS_link | SYS_symlink => {
            h.cstr(p(0));
            h.cstr(p(1));
        }
        SYS_renameat | SYS_renameat2 | SYS_linkat => {
            h.cstr(p(1));
            h.cstr(p(3));
        }
        SYS_symlinkat => {
            h.cstr(p(0));
            h.cstr(p(2));
        }
        SYS_readlink => {
            h.cstr(p(0));
            h.range(p(1), p(2));
        }
        SYS_readlinkat => {
            h.cstr(p(1));
            h.range(p(2), p(3));
        }
        SYS_utimensat => {
            h.cstr(p(1));
            h.range(p(2), 32);
        }
        SYS_execve => {
            h.cstr(p(0));
            h.cstr_array(p(1));
            h.cstr_array(p(2));
        }
        SYS_execveat => {
            h.cstr(p(1));
            h.cstr_array(p(2));
            h.cstr_array(p(3));
        }
        SYS_getxattr | SYS_lgetxattr | SYS_setxattr | SYS_lsetxattr => {
            h.cstr(p(0));
            h.cstr(p(1));
            h.range(p(2), p(3));
        }
        SYS_fgetxattr | SYS_fsetxattr => {
            h.cstr(p(1));
            h.range(p(2), p(3));
        }
        SYS_listxattr | SYS_llistxattr => {
            h.cstr(p(0));
            h.range(p(1), p(2));
        }
        SYS_flistxattr => h.range(p(1), p(2)),
        _ => return false,
    }
    true
}

/// [`hold_for`] for reads and writes, polling, `ioctl`, pipes and `fcntl`; whether `nr` is one of them.
fn hold_io(h: &mut Holding, nr: c_long, a: &[u64; 6]) -> bool {
    let p = |i: usize| a[i];
    match nr {
        SYS_read | SYS_write | SYS_pread64 | SYS_pwrite64 | SYS_getdents | SYS_getdents64 => {
            h.range(p(1), p(2))
        }
        SYS_getrandom | SYS_getcwd => h.range(p(0), p(1)),
        SYS_readv | SYS_writev | SYS_preadv | SYS_pwritev | SYS_preadv2 | SYS_pwritev2 => {
            h.iovecs(p(1), p(2))
        }
        SYS_poll => h.range(p(0), p(1).saturating_mul(8)),
        SYS_ppoll => {
            h.range(p(0), p(1).saturating_mul(8));
            h.range(p(2), 16);
            h.range(p(3), 8);
        }
        SYS_select => {
            let bytes = p(0).div_ceil(8);
            for i in 1..4 {
                h.range(p(i), bytes);
            }
            h.range(p(4), 16);
        }
        SYS_pselect6 => {
            let bytes = p(0).div_ceil(8);
            for i in 1..4 {
                h.range(p(i), bytes);
            }
            h.range(p(4), 16);
            h.range(p(5), 16);
            if let Some(sig) = h.read::<u64>(p(5)) {
                h.range(sig, 8);
            }
        }
        SYS_epoll_wait => h.range(p(1), p(2).saturating_mul(12)),
        SYS_epoll_pwait => {
            h.range(p(1), p(2).saturating_mul(12));
            h.range(p(4), 8);
        }
        SYS_epoll_pwait2 => {
            h.range(p(1), p(2).saturating_mul(12));
            h.range(p(3), 16);
            h.range(p(4), 8);
        }
        SYS_epoll_ctl => h.range(p(3), 12),
        SYS_ioctl => {
            // The size the request encodes, or a word for the old requests
            // that encode none.
            let size = (p(1) >> 16) & 0x3fff;
            h.range(p(2), if size == 0 { 8 } else { size });
        }
        SYS_pipe | SYS_pipe2 => h.range(p(0), 8),
        SYS_sendfile => h.range(p(2), 8),
        SYS_splice | SYS_copy_file_range => {
            h.range(p(1), 8);
            h.range(p(3), 8);
        }
        SYS_fcntl => match p(1) as c_int {
            F_GETLK | F_SETLK | F_SETLKW | F_OFD_GETLK | F_OFD_SETLK | F_OFD_SETLKW => {
                h.range(p(2), 32)
            }
            // F_SETOWN_EX, F_GETOWN_EX (missing from the 6.1 headers).
            15 | 16 => h.range(p(2), 8),
            _ => {}
        },
        SYS_mincore => h.range(p(2), p(1).div_ceil(pagewise_mech::PAGE_SIZE as u64)),
        _ => return false,
    }
    true
}

/// [`hold_for`] for sockets: addresses, messages and options; whether `nr` is one of them.
fn hold_net(h: &mut Holding, nr: c_long, a: &[u64; 6]) -> bool {
    let p = |i: usize| a[i];
    match nr {
        SYS_socketpair => h.range(p(3), 8),
        SYS_connect | SYS_bind => h.range(p(1), p(2)),
        SYS_accept | SYS_accept4 | SYS_getsockname | SYS_getpeername => h.sockaddr_out(p(1), p(2)),
        SYS_sendto => {
            h.range(p(1), p(2));
            h.range(p(4), p(5));
        }
        SYS_recvfrom => {
            h.range(p(1), p(2));
            h.sockaddr_out(p(4), p(5));
        }
        SYS_sendmsg | SYS_recvmsg => h.msghdr(p(1)),
        SYS_sendmmsg | SYS_recvmmsg => {
            // struct mmsghdr: a msghdr (56 bytes) and a length, 64 in all.
            let n = p(2).min(1024);
            h.range(p(1), n * 64);
            for i in 0..n {
                h.msghdr(p(1) + i * 64);
            }
            if nr == SYS_recvmmsg {
                h.range(p(4), 16);
            }
        }
        SYS_setsockopt => h.range(p(3), p(4)),
        SYS_getsockopt => {
            h.range(p(4), 4);
            let len = h.read::<u32>(p(4)).unwrap_or(0);
            h.range(p(3), len as u64);
        }
        _ => return false,
    }
    true
}

/// [`hold_for`] for time, waits, limits, signals, futexes and process memory; whether `nr` is one of them.
fn hold_process(h: &mut Holding, nr: c_long, a: &[u64; 6]) -> bool {
    let p = |i: usize| a[i];
    match nr {
        SYS_futex => {
            h.range(p(0), 4);
            let op = (p(1) as c_int) & FUTEX_CMD_MASK;
            match op {
                FUTEX_WAIT
                | FUTEX_WAIT_BITSET
                | FUTEX_LOCK_PI
                | FUTEX_LOCK_PI2
                | FUTEX_WAIT_REQUEUE_PI => h.range(p(3), 16),
                _ => {}
            }
            match op {
                FUTEX_REQUEUE
                | FUTEX_CMP_REQUEUE
                | FUTEX_WAKE_OP
                | FUTEX_CMP_REQUEUE_PI
                | FUTEX_WAIT_REQUEUE_PI => h.range(p(4), 4),
                _ => {}
            }
        }
        SYS_nanosleep => {
            h.range(p(0), 16);
            h.range(p(1), 16);
        }
        SYS_clock_nanosleep => {
            h.range(p(2), 16);
            h.range(p(3), 16);
        }
        SYS_clock_gettime | SYS_clock_getres => h.range(p(1), 16),
        SYS_gettimeofday => {
            h.range(p(0), 16);
            h.range(p(1), 8);
        }
        SYS_time => h.range(p(0), 8),
        SYS_wait4 => {
            h.range(p(1), 4);
            h.range(p(3), 144);
        }
        SYS_waitid => {
            h.range(p(2), 128);
            h.range(p(4), 144);
        }
        SYS_uname => h.range(p(0), 390),
        SYS_getrlimit | SYS_setrlimit => h.range(p(1), 16),
        SYS_prlimit64 => {
            h.range(p(2), 16);
            h.range(p(3), 16);
        }
        SYS_getrusage => h.range(p(1), 144),
        SYS_sysinfo => h.range(p(0), 112),
        SYS_times => h.range(p(0), 32),
        SYS_sched_getaffinity | SYS_sched_setaffinity => h.range(p(2), p(1)),
        SYS_rt_sigtimedwait => {
            h.range(p(0), 8);
            h.range(p(1), 128);
            h.range(p(2), 16);
        }
        SYS_rt_sigsuspend | SYS_rt_sigpending => h.range(p(0), 8),
        SYS_timerfd_settime | SYS_timer_settime => {
            h.range(p(2), 32);
            h.range(p(3), 32);
        }
        SYS_timerfd_gettime | SYS_timer_gettime => h.range(p(1), 32),
        SYS_signalfd | SYS_signalfd4 => h.range(p(1), 8),
        SYS_prctl => match p(0) as c_int {
            PR_SET_NAME | PR_GET_NAME => h.range(p(1), 16),
            _ => {}
        },
        SYS_process_vm_readv | SYS_process_vm_writev => {
            // The local buffers are this process's; the remote iovec array
            // is read from here too, and where the "remote" process is this
            // one, so are the buffers it names.
            h.iovecs(p(1), p(2));
            // getpid is async-signal-safe.
            if p(0) as i64 == i64::from(std::process::id()) {
                h.iovecs(p(3), p(4));
            } else {
                h.range(p(3), p(4).saturating_mul(16));
            }
        }
        _ => return false,
    }
    true
}

/// Holds gathered for one call: ranges wait in a fixed buffer (no
/// allocation: this runs in signal handlers) and are held together when a
/// structure must be read, or at the end.
struct Holding {
    held: Held,
    pending: [(u64, u64); PENDING],
    n: usize,
}

const PENDING: usize = 64;

impl Default for Holding {
    fn default() -> Self {
        Holding {
            held: Held::default(),
            pending: [(0, 0); PENDING],
            n: 0,
        }
    }
}

impl Holding {
    fn range(&mut self, start: u64, len: u64) {
        if start == 0 || len == 0 || !inline::may_be_emulated(start, len) {
            return;
        }
        if self.n == PENDING {
            self.pending.sort_unstable();
            self.n = inline::coalesce(&mut self.pending, self.n, PENDING / 2);
        }
        self.pending[self.n] = (start, len);
        self.n += 1;
    }

    /// Holds what is pending.
    fn flush(&mut self) {
        if self.n == 0 {
            return;
        }
        let v = &mut self.pending[..self.n];
        v.sort_unstable();
        let n = inline::coalesce(v, self.n, self.held.room());
        self.held.merge(inline::hold(&v[..n]));
        self.n = 0;
    }

    /// Everything held.
    fn done(mut self) -> Held {
        self.flush();
        self.held
    }

    /// A value the program handed over (held first), or `None` for a null
    /// pointer.
    fn read<T: Copy>(&mut self, at: u64) -> Option<T> {
        if at == 0 {
            return None;
        }
        self.range(at, std::mem::size_of::<T>() as u64);
        self.flush();
        // SAFETY: the program handed this address to the kernel for a `T`;
        // it is held (local) if emulated. See the module docs for a wrong one.
        Some(unsafe { std::ptr::read_unaligned(at as *const T) })
    }

    /// An array of `n` `struct iovec` and the buffers it names.
    fn iovecs(&mut self, at: u64, n: u64) {
        let n = n.min(1024);
        self.range(at, n * 16);
        for i in 0..n {
            if let Some([base, len]) = self.read::<[u64; 2]>(at + i * 16) {
                self.range(base, len);
            }
        }
    }

    /// A `struct msghdr` and what it names: the address, the iovecs and
    /// their buffers, the control data.
    fn msghdr(&mut self, at: u64) {
        // name, namelen (u32 + pad), iov, iovlen, control, controllen, flags.
        let Some(m) = self.read::<[u64; 7]>(at) else {
            return;
        };
        self.range(m[0], m[1] & 0xffff_ffff);
        self.iovecs(m[2], m[3]);
        self.range(m[4], m[5]);
    }

    /// An address the kernel writes (`accept`, `recvfrom`): its length
    /// word, and the address up to the length it holds.
    fn sockaddr_out(&mut self, addr: u64, len_at: u64) {
        let len = self.read::<u32>(len_at).unwrap_or(0);
        self.range(addr, len as u64);
    }

    /// A NUL-terminated string, held page by page up to its end.
    fn cstr(&mut self, at: u64) {
        if at == 0 || !inline::may_be_emulated(at, 1 << 17) {
            return;
        }
        let ps = pagewise_mech::PAGE_SIZE as u64;
        let mut p = at;
        // At most 32 pages (the kernel's longest argument string).
        for _ in 0..32 {
            let end = (p & !(ps - 1)) + ps;
            self.range(p, end - p);
            self.flush();
            // SAFETY: the string's bytes up to the end of this page, held
            // (local) if emulated; the program handed over the string.
            let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, (end - p) as usize) };
            if bytes.contains(&0) {
                return;
            }
            p = end;
        }
    }

    /// A NULL-terminated array of strings (`argv`, `envp`).
    fn cstr_array(&mut self, at: u64) {
        if at == 0 {
            return;
        }
        for i in 0..(1u64 << 20) {
            match self.read::<u64>(at + i * 8) {
                Some(0) | None => return,
                Some(s) => self.cstr(s),
            }
        }
    }
}
