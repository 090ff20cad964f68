//! The C library's busiest calls that hand memory to the kernel, wrapped
//! for the inline fault path: a server makes several for each request
//! (`epoll_wait`, `read`, `write`, `sendmsg`, ...), and the seccomp trap
//! that catches every other such call costs a signal each time. Here the
//! call is made directly with its memory held
//! (`pagewise::farmem::in_process::held_call`). Off the inline path each wrapper hands over to the C
//! library's own function.
//!
//! Made directly, these calls are not cancellation points
//! (`pthread_cancel` of a thread blocked in one waits for the call to
//! return).

use pagewise::farmem::in_process::inline_path;
use std::sync::atomic::AtomicUsize;

/// Makes call `nr` with its memory held; the C library's convention for
/// the result (-1 and `errno`).
fn held_call(nr: libc::c_long, a: [u64; 6]) -> i64 {
    // SAFETY: the program's own call with its own arguments.
    let r = unsafe { pagewise::farmem::in_process::held_call(nr, a) };
    if r < 0 {
        // SAFETY: this thread's errno.
        unsafe { *pagewise_sys::process::errno_location() = -r as i32 };
        -1
    } else {
        r
    }
}

/// Every wrapper's C library function, looked up once at start-up
/// ([`resolve_all`]): a lookup walks the loader's own tables, and a thread
/// serving far-memory faults that looked one up later would wait on a
/// fault only it can serve.
static REAL: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

/// Looks up every wrapped function now, before any memory is served.
pub fn resolve_all() {
    for (name, cache) in NAMES.iter().zip(&REAL) {
        crate::forwarded(name, cache);
    }
}

/// Whether `a` and `b` hold the same bytes (each wrapper's index is
/// checked against its name when compiled).
const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

macro_rules! wrap {
    ($i:literal $(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $nr:expr, [$($a:expr),*]) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As for the C library's function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            const _: () = assert!(same(NAMES[$i].to_bytes(), stringify!($name).as_bytes()));
            if inline_path() {
                let mut a = [0u64; 6];
                let v = [$($a as u64),*];
                a[..v.len()].copy_from_slice(&v);
                return held_call($nr, a) as $ret;
            }
            let f = crate::forwarded(NAMES[$i], &REAL[$i]);
            if f == 0 {
                // SAFETY: this thread's errno.
                unsafe { *pagewise_sys::process::errno_location() = libc::ENOSYS };
                return -1 as $ret;
            }
            // SAFETY: the next definition of this very function.
            let real: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
            // SAFETY: the caller's own arguments.
            unsafe { real($($arg),*) }
        }
    };
}

/// The wrapped functions, in the order of the `wrap!`s below.
const NAMES: [&std::ffi::CStr; 19] = [
    c"read",
    c"write",
    c"pread",
    c"pread64",
    c"pwrite",
    c"pwrite64",
    c"readv",
    c"writev",
    c"recv",
    c"recvfrom",
    c"send",
    c"sendto",
    c"recvmsg",
    c"sendmsg",
    c"epoll_wait",
    c"epoll_ctl",
    c"poll",
    c"__read_chk",
    c"__recv_chk",
];

type Sz = libc::size_t;
type SSz = libc::ssize_t;
type Ptr = *mut libc::c_void;
type CPtr = *const libc::c_void;
type Int = libc::c_int;

wrap!(0 /// `read(2)`.
    read(fd: Int, buf: Ptr, n: Sz) -> SSz = libc::SYS_read, [fd, buf, n]);
wrap!(1 /// `write(2)`.
    write(fd: Int, buf: CPtr, n: Sz) -> SSz = libc::SYS_write, [fd, buf, n]);
wrap!(2 /// `pread(2)`.
    pread(fd: Int, buf: Ptr, n: Sz, off: libc::off_t) -> SSz = libc::SYS_pread64, [fd, buf, n, off]);
wrap!(3 /// `pread64(2)`.
    pread64(fd: Int, buf: Ptr, n: Sz, off: libc::off_t) -> SSz = libc::SYS_pread64, [fd, buf, n, off]);
wrap!(4 /// `pwrite(2)`.
    pwrite(fd: Int, buf: CPtr, n: Sz, off: libc::off_t) -> SSz = libc::SYS_pwrite64, [fd, buf, n, off]);
wrap!(5 /// `pwrite64(2)`.
    pwrite64(fd: Int, buf: CPtr, n: Sz, off: libc::off_t) -> SSz = libc::SYS_pwrite64, [fd, buf, n, off]);
wrap!(6 /// `readv(2)`.
    readv(fd: Int, iov: *const libc::iovec, n: Int) -> SSz = libc::SYS_readv, [fd, iov, n]);
wrap!(7 /// `writev(2)`.
    writev(fd: Int, iov: *const libc::iovec, n: Int) -> SSz = libc::SYS_writev, [fd, iov, n]);
wrap!(8 /// `recv(2)`.
    recv(fd: Int, buf: Ptr, n: Sz, flags: Int) -> SSz = libc::SYS_recvfrom, [fd, buf, n, flags, 0, 0]);
wrap!(9 /// `recvfrom(2)`.
    recvfrom(fd: Int, buf: Ptr, n: Sz, flags: Int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> SSz
        = libc::SYS_recvfrom, [fd, buf, n, flags, addr, len]);
wrap!(10 /// `send(2)`.
    send(fd: Int, buf: CPtr, n: Sz, flags: Int) -> SSz = libc::SYS_sendto, [fd, buf, n, flags, 0, 0]);
wrap!(11 /// `sendto(2)`.
    sendto(fd: Int, buf: CPtr, n: Sz, flags: Int, addr: *const libc::sockaddr, len: libc::socklen_t) -> SSz
        = libc::SYS_sendto, [fd, buf, n, flags, addr, len]);
wrap!(12 /// `recvmsg(2)`.
    recvmsg(fd: Int, msg: *mut libc::msghdr, flags: Int) -> SSz = libc::SYS_recvmsg, [fd, msg, flags]);
wrap!(13 /// `sendmsg(2)`.
    sendmsg(fd: Int, msg: *const libc::msghdr, flags: Int) -> SSz = libc::SYS_sendmsg, [fd, msg, flags]);
wrap!(14 /// `epoll_wait(2)`.
    epoll_wait(ep: Int, ev: *mut libc::epoll_event, n: Int, timeout: Int) -> Int
        = libc::SYS_epoll_wait, [ep, ev, n, timeout]);
wrap!(15 /// `epoll_ctl(2)`.
    epoll_ctl(ep: Int, op: Int, fd: Int, ev: *mut libc::epoll_event) -> Int
        = libc::SYS_epoll_ctl, [ep, op, fd, ev]);
wrap!(16 /// `poll(2)`.
    poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: Int) -> Int = libc::SYS_poll, [fds, n, timeout]);
wrap!(17 /// `__read_chk` (a fortified `read`).
    __read_chk(fd: Int, buf: Ptr, n: Sz, _buflen: Sz) -> SSz = libc::SYS_read, [fd, buf, n]);
wrap!(18 /// `__recv_chk` (a fortified `recv`).
    __recv_chk(fd: Int, buf: Ptr, n: Sz, _buflen: Sz, flags: Int) -> SSz = libc::SYS_recvfrom, [fd, buf, n, flags, 0, 0]);
