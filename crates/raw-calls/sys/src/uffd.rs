//! userfaultfd: creation, the API handshake, registration, write-protect,
//! fault messages and their resolution (move, zero page, wake).
//!
//! # References
//! - `userfaultfd(2)`, `ioctl_userfaultfd(2)`
//! - `include/uapi/linux/userfaultfd.h` (Linux 6.18)

use crate::{cvt, cvt_int, ioc, IOC_NONE, IOC_READ, IOC_WRITE};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `UFFD_API`: the only API version the kernel speaks.
pub const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY`: only handle faults from user mode (needs no privilege).
pub const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// Feature bits reported and requested through `UFFDIO_API`.
pub mod feature {
    /// Write-protect faults are reported with a flag.
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    /// The child of `fork` inherits the registration (a new uffd is delivered).
    pub const EVENT_FORK: u64 = 1 << 1;
    /// `mremap` events.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// `madvise(MADV_DONTNEED/REMOVE)` events.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// Missing-page handling on hugetlbfs.
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    /// Missing-page handling on shmem.
    pub const MISSING_SHMEM: u64 = 1 << 5;
    /// `munmap` events.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Faults raise SIGBUS in the faulting thread instead of queueing an event.
    pub const SIGBUS: u64 = 1 << 7;
    /// The faulting thread's id is reported.
    pub const THREAD_ID: u64 = 1 << 8;
    /// Minor faults on hugetlbfs.
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    /// Minor faults on shmem.
    pub const MINOR_SHMEM: u64 = 1 << 10;
    /// The exact fault address is reported.
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    /// Write-protect on hugetlbfs and shmem.
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    /// Write-protect markers on unpopulated (never touched) pages.
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    /// `UFFDIO_POISON`.
    pub const POISON: u64 = 1 << 14;
    /// Asynchronous write-protect: the kernel resolves WP faults itself.
    pub const WP_ASYNC: u64 = 1 << 15;
    /// `UFFDIO_MOVE`.
    pub const MOVE: u64 = 1 << 16;

    /// Every feature pagewise knows by name, for reports.
    pub const NAMED: &[(&str, u64)] = &[
        ("WP", PAGEFAULT_FLAG_WP),
        ("WP_ASYNC", WP_ASYNC),
        ("WP_UNPOPULATED", WP_UNPOPULATED),
        ("WP_HUGETLBFS_SHMEM", WP_HUGETLBFS_SHMEM),
        ("MINOR_SHMEM", MINOR_SHMEM),
        ("MINOR_HUGETLBFS", MINOR_HUGETLBFS),
        ("SIGBUS", SIGBUS),
        ("EVENT_FORK", EVENT_FORK),
        ("EVENT_REMAP", EVENT_REMAP),
        ("EVENT_REMOVE", EVENT_REMOVE),
        ("EVENT_UNMAP", EVENT_UNMAP),
        ("MOVE", MOVE),
        ("THREAD_ID", THREAD_ID),
        ("EXACT_ADDRESS", EXACT_ADDRESS),
        ("POISON", POISON),
    ];
}

/// `UFFDIO_REGISTER_MODE_MISSING`.
pub const REGISTER_MODE_MISSING: u64 = 1;
/// `UFFDIO_REGISTER_MODE_WP`.
pub const REGISTER_MODE_WP: u64 = 2;
/// `UFFDIO_REGISTER_MODE_MINOR`.
pub const REGISTER_MODE_MINOR: u64 = 4;
/// `UFFDIO_WRITEPROTECT_MODE_WP`.
pub const WRITEPROTECT_MODE_WP: u64 = 1;
/// `UFFDIO_WRITEPROTECT_MODE_DONTWAKE`.
pub const WRITEPROTECT_MODE_DONTWAKE: u64 = 2;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioApi {
    /// Must be [`UFFD_API`].
    pub api: u64,
    /// Requested features in, supported features out.
    pub features: u64,
    /// Supported ioctls (out).
    pub ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRange {
    /// Page-aligned start address.
    pub start: u64,
    /// Page-aligned length in bytes.
    pub len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRegister {
    /// The range to register.
    pub range: UffdioRange,
    /// `REGISTER_MODE_*` bits.
    pub mode: u64,
    /// Ioctls available on the range (out).
    pub ioctls: u64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioWriteprotect {
    /// The range to (un)protect.
    pub range: UffdioRange,
    /// `WRITEPROTECT_MODE_*` bits.
    pub mode: u64,
}

/// `struct uffd_msg`: one event read from a userfaultfd. The union of the
/// kernel's header is `arg`, read through the accessors.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdMsg {
    /// `UFFD_EVENT_*`.
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// The event's arguments.
    pub arg: [u64; 3],
}

impl UffdMsg {
    /// Page fault: the faulting address (page-aligned unless `EXACT_ADDRESS`).
    pub fn pf_address(&self) -> u64 {
        self.arg[1]
    }
    /// Page fault: its flags (`PAGEFAULT_FLAG_WRITE`, ...).
    pub fn pf_flags(&self) -> u64 {
        self.arg[0]
    }
    /// Page fault with `THREAD_ID`: the faulting thread.
    pub fn pf_tid(&self) -> u32 {
        self.arg[2] as u32
    }
    /// `UFFD_EVENT_REMOVE`/`UNMAP`: the range `[start, end)`.
    pub fn range(&self) -> (u64, u64) {
        (self.arg[0], self.arg[1])
    }
    /// `UFFD_EVENT_FORK`: the child's userfaultfd.
    pub fn fork_fd(&self) -> RawFd {
        self.arg[0] as u32 as RawFd
    }
    /// `UFFD_EVENT_REMAP`: `(from, to, len)`.
    pub fn remap(&self) -> (u64, u64, u64) {
        (self.arg[0], self.arg[1], self.arg[2])
    }
}

/// `UFFD_EVENT_*` values of [`UffdMsg::event`].
pub mod event {
    /// A page fault.
    pub const PAGEFAULT: u8 = 0x12;
    /// The process forked (`EVENT_FORK`).
    pub const FORK: u8 = 0x13;
    /// `mremap` moved a range (`EVENT_REMAP`).
    pub const REMAP: u8 = 0x14;
    /// `madvise(MADV_DONTNEED/REMOVE)` dropped a range (`EVENT_REMOVE`).
    pub const REMOVE: u8 = 0x15;
    /// `munmap` (`EVENT_UNMAP`).
    pub const UNMAP: u8 = 0x16;
}

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioCopy {
    /// Where the copy is mapped.
    pub dst: u64,
    /// What is copied.
    pub src: u64,
    /// Bytes.
    pub len: u64,
    /// `COPY_MODE_DONTWAKE`, `COPY_MODE_WP`.
    pub mode: u64,
    /// Bytes copied, or a negative errno (out).
    pub copy: i64,
}

/// `struct uffdio_zeropage`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioZeropage {
    /// The range to map the zero page into.
    pub range: UffdioRange,
    /// `ZEROPAGE_MODE_DONTWAKE`.
    pub mode: u64,
    /// Bytes mapped, or a negative errno (out).
    pub zeropage: i64,
}

/// `struct uffdio_move`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioMove {
    /// Destination address (registered with the userfaultfd used).
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Length.
    pub len: u64,
    /// `MOVE_MODE_*`.
    pub mode: u64,
    /// Bytes moved, or a negative errno (out).
    pub moved: i64,
}

/// `UFFDIO_COPY_MODE_DONTWAKE`: do not wake the faulting threads.
pub const COPY_MODE_DONTWAKE: u64 = 1;
/// `UFFDIO_MOVE_MODE_DONTWAKE`: do not wake the faulting threads.
pub const MOVE_MODE_DONTWAKE: u64 = 1;
/// `UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES`: skip unmapped source pages.
pub const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;

const _: () = assert!(std::mem::size_of::<UffdioMove>() == 40);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioZeropage>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioRange>() == 16);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);

const UFFDIO: u64 = 0xAA;
/// `UFFDIO_API`.
pub const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x3F, 24);
/// `UFFDIO_REGISTER`.
pub const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x00, 32);
/// `UFFDIO_UNREGISTER`.
pub const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, UFFDIO, 0x01, 16);
/// `UFFDIO_WRITEPROTECT`.
pub const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x06, 24);
/// `UFFDIO_WAKE`.
pub const UFFDIO_WAKE: u64 = ioc(IOC_READ, UFFDIO, 0x02, 16);
/// `UFFDIO_ZEROPAGE`.
pub const UFFDIO_ZEROPAGE: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x04, 32);
/// A page fault message's flag: the fault is a write.
pub const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;

/// `UFFDIO_COPY`.
pub const UFFDIO_COPY: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x03, 40);
/// `UFFDIO_MOVE` (Linux 6.8+).
pub const UFFDIO_MOVE: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x05, 40);
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`.
pub const USERFAULTFD_IOC_NEW: u64 = ioc(IOC_NONE, UFFDIO, 0x00, 0);

const _: () = assert!(UFFDIO_API == 0xC018_AA3F);
const _: () = assert!(UFFDIO_COPY == 0xC028_AA03);
const _: () = assert!(std::mem::size_of::<UffdioCopy>() == 40);
const _: () = assert!(UFFDIO_REGISTER == 0xC020_AA00);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_AA01);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xC018_AA06);
const _: () = assert!(UFFDIO_WAKE == 0x8010_AA02);
const _: () = assert!(UFFDIO_ZEROPAGE == 0xC020_AA04);
const _: () = assert!(UFFDIO_MOVE == 0xC028_AA05);

/// How a userfaultfd was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UffdSource {
    /// The `userfaultfd(2)` system call.
    Syscall,
    /// `ioctl(USERFAULTFD_IOC_NEW)` on `/dev/userfaultfd`.
    Device,
}

/// Where this process gets a userfaultfd the kernel refuses to make for it
/// (a container's seccomp profile answers the call `EPERM` or `ENOSYS`):
/// a function that has one made inside the process by a privileged helper
/// (the preload shim of a containerised program asks the host's
/// `pagewise farmem serve`). Set once; see [`set_maker`].
static MAKER: std::sync::OnceLock<fn(libc::c_int) -> io::Result<OwnedFd>> =
    std::sync::OnceLock::new();

/// Sets the maker [`userfaultfd`] turns to when the call is refused with
/// `EPERM` or `ENOSYS`; false if one was set already.
pub fn set_maker(f: fn(libc::c_int) -> io::Result<OwnedFd>) -> bool {
    MAKER.set(f).is_ok()
}

/// Creates a userfaultfd with the `userfaultfd(2)` system call (or, where
/// the call is refused `EPERM` or `ENOSYS` and a maker is set, through
/// [the maker](set_maker)).
///
/// `flags` are `O_CLOEXEC`, `O_NONBLOCK` and [`UFFD_USER_MODE_ONLY`].
pub fn userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes one integer argument and returns a new fd or -1.
    let fd = match cvt(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) }) {
        Ok(fd) => fd,
        Err(e) => {
            return match (e.raw_os_error(), MAKER.get()) {
                (Some(libc::EPERM | libc::ENOSYS), Some(make)) => make(flags),
                _ => Err(e),
            }
        }
    };
    // SAFETY: the kernel just returned this fd to us; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `ioctl(fd, req, arg)` made without the C library
/// ([`crate::futex::syscall`]): a seccomp trap of the C library's calls
/// never sees the engine's ioctls, which may run inside a signal handler.
///
/// # Safety
/// `arg` points at the structure `req` takes, valid for the call.
unsafe fn raw_ioctl<T>(fd: RawFd, req: u64, arg: *mut T) -> io::Result<i64> {
    // SAFETY: the caller vouches for `arg`.
    let r =
        unsafe { crate::futex::syscall(libc::SYS_ioctl, [fd as u64, req, arg as u64, 0, 0, 0]) };
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r as i32))
    } else {
        Ok(r)
    }
}

/// Creates a userfaultfd through `/dev/userfaultfd` (`USERFAULTFD_IOC_NEW`).
pub fn userfaultfd_from_device(flags: libc::c_int) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")?;
    use std::os::fd::AsRawFd;
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its integer argument and
    // returns a new fd or -1; `dev` is a valid open fd.
    let fd = cvt_int(unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            USERFAULTFD_IOC_NEW as libc::c_ulong,
            flags as libc::c_ulong,
        )
    })?;
    // SAFETY: the kernel just returned this fd to us; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates a userfaultfd, by system call first and then through the device.
pub fn open(flags: libc::c_int) -> io::Result<(OwnedFd, UffdSource)> {
    match userfaultfd(flags) {
        Ok(fd) => Ok((fd, UffdSource::Syscall)),
        Err(sys_err) => match userfaultfd_from_device(flags) {
            Ok(fd) => Ok((fd, UffdSource::Device)),
            Err(_) => Err(sys_err),
        },
    }
}

/// `ioctl(UFFDIO_API)`: the handshake. Returns the kernel's answer.
///
/// Called with `features == 0`, the answer lists every supported feature.
pub fn api(fd: BorrowedFd<'_>, features: u64) -> io::Result<UffdioApi> {
    let mut arg = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: `arg` is a valid, writable `struct uffdio_api` that outlives the call.
    unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_API, &mut arg) }?;
    Ok(arg)
}

/// `ioctl(UFFDIO_REGISTER)` over `[start, start+len)` with `mode`.
pub fn register(fd: BorrowedFd<'_>, start: u64, len: u64, mode: u64) -> io::Result<UffdioRegister> {
    let mut arg = UffdioRegister {
        range: UffdioRange { start, len },
        mode,
        ioctls: 0,
    };
    // SAFETY: `arg` is a valid, writable `struct uffdio_register` that outlives the call.
    unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_REGISTER, &mut arg) }?;
    Ok(arg)
}

/// `ioctl(UFFDIO_UNREGISTER)` over `[start, start+len)`.
pub fn unregister(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut arg = UffdioRange { start, len };
    // SAFETY: `arg` is a valid `struct uffdio_range` that outlives the call.
    unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_UNREGISTER, &mut arg) }?;
    Ok(())
}

/// `ioctl(UFFDIO_WRITEPROTECT)`: protect (`protect == true`) or unprotect a range.
pub fn writeprotect(fd: BorrowedFd<'_>, start: u64, len: u64, protect: bool) -> io::Result<()> {
    let mut arg = UffdioWriteprotect {
        range: UffdioRange { start, len },
        mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
    };
    // SAFETY: `arg` is a valid `struct uffdio_writeprotect` that outlives the call.
    unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut arg) }?;
    Ok(())
}

/// Reads one message from a userfaultfd (blocking unless it is `O_NONBLOCK`).
pub fn read_msg(fd: BorrowedFd<'_>) -> io::Result<UffdMsg> {
    let mut msg = UffdMsg::default();
    loop {
        // SAFETY: `msg` is a valid, writable buffer of exactly one `struct uffd_msg`.
        let n = unsafe {
            crate::futex::syscall(
                libc::SYS_read,
                [
                    fd.as_raw_fd() as u64,
                    &mut msg as *mut UffdMsg as u64,
                    std::mem::size_of::<UffdMsg>() as u64,
                    0,
                    0,
                    0,
                ],
            )
        };
        if n == std::mem::size_of::<UffdMsg>() as i64 {
            return Ok(msg);
        }
        if n < 0 {
            let e = io::Error::from_raw_os_error(-n as i32);
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short read of a userfaultfd message",
        ));
    }
}

/// `ioctl(UFFDIO_ZEROPAGE)`: maps the zero page into the missing pages of a range and wakes.
///
/// # Safety
/// The kernel fills `[start, start+len)` of the process that registered
/// `fd`: where that is the caller's own memory, nothing may rely on the
/// range's contents (no live Rust reference into it), as for a write.
pub unsafe fn zeropage(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut arg = UffdioZeropage {
        range: UffdioRange { start, len },
        mode: 0,
        zeropage: 0,
    };
    // SAFETY: `arg` is a valid `struct uffdio_zeropage` that outlives the call.
    unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_ZEROPAGE, &mut arg) }?;
    Ok(())
}

/// `ioctl(UFFDIO_WAKE)`: wakes the threads waiting on faults in a range.
pub fn wake(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut arg = UffdioRange { start, len };
    // SAFETY: `arg` is a valid `struct uffdio_range` that outlives the call.
    unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_WAKE, &mut arg) }?;
    Ok(())
}

/// Waits until one of `fds` is readable (or `timeout_ms` passes; -1 waits
/// for ever). Returns a bit per fd, bit `i` set when `fds[i]` is readable or
/// hung up.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<u64> {
    assert!(fds.len() <= 64, "at most 64 fds");
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `p` is a valid array of `p.len()` pollfd structures.
        let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        let mut bits = 0u64;
        for (i, q) in p.iter().enumerate() {
            if q.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                bits |= 1 << i;
            }
        }
        return Ok(bits);
    }
}

/// `ioctl(UFFDIO_COPY)`: maps a new page at `dst` holding `len` bytes
/// copied from `src` (page-aligned), and wakes the faulting threads.
///
/// # Safety
/// The kernel writes `[dst, dst+len)` of the process that registered `fd`:
/// where that is the caller's own memory, nothing may rely on the range's
/// contents (no live Rust reference into it). `src` must be readable for
/// `len` bytes.
pub unsafe fn copy(fd: BorrowedFd<'_>, dst: u64, src: u64, len: u64) -> io::Result<()> {
    // SAFETY: the caller's guarantees are `copy_mode`'s.
    unsafe { copy_mode(fd, dst, src, len, 0) }
}

/// [`copy`] with `COPY_MODE_*` bits (`COPY_MODE_DONTWAKE`: wake no one).
///
/// # Safety
/// As for [`copy`].
pub unsafe fn copy_mode(
    fd: BorrowedFd<'_>,
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
) -> io::Result<()> {
    let mut arg = UffdioCopy {
        dst,
        src,
        len,
        mode,
        copy: 0,
    };
    // SAFETY: `arg` is a valid `struct uffdio_copy` that outlives the call;
    // the kernel checks both ranges.
    unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_COPY, &mut arg) }?;
    Ok(())
}

/// `ioctl(UFFDIO_MOVE)`: moves the pages of `[src, src+len)` to `[dst, dst+len)`
/// (which must be registered with `fd` and unmapped) without copying; the
/// source is left unmapped. A write racing the move lands before it (and
/// moves with the page) or faults after it.
///
/// A move that stopped part way goes on from there; `EAGAIN` with nothing
/// moved means the address space is changing under an event not read yet:
/// the caller must read its events before trying again.
///
/// # Safety
/// The kernel takes the pages of `[src, src+len)` away and puts them at
/// `[dst, dst+len)` of the process that registered `fd`: where those are
/// the caller's own memory, nothing may rely on either range's contents
/// (no live Rust reference into them).
pub unsafe fn move_pages(
    fd: BorrowedFd<'_>,
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
) -> io::Result<()> {
    let mut done = 0u64;
    loop {
        let mut arg = UffdioMove {
            dst: dst + done,
            src: src + done,
            len: len - done,
            mode,
            moved: 0,
        };
        // SAFETY: `arg` is a valid `struct uffdio_move` that outlives the
        // call; the kernel checks both ranges against the caller's mappings.
        match unsafe { raw_ioctl(fd.as_raw_fd(), UFFDIO_MOVE, &mut arg) } {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && arg.moved > 0 => {
                done += arg.moved as u64;
                if done >= len {
                    return Ok(());
                }
            }
            Err(e) => return Err(e),
        }
    }
}
