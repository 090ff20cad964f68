//! userfaultfd: creation, the API handshake, registration and write-protect.
//!
//! # References
//! - `userfaultfd(2)`, `ioctl_userfaultfd(2)`
//! - `include/uapi/linux/userfaultfd.h` (Linux 6.18)

use crate::{cvt, cvt_int, ioc, IOC_NONE, IOC_READ, IOC_WRITE};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

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
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`.
pub const USERFAULTFD_IOC_NEW: u64 = ioc(IOC_NONE, UFFDIO, 0x00, 0);

const _: () = assert!(UFFDIO_API == 0xC018_AA3F);
const _: () = assert!(UFFDIO_REGISTER == 0xC020_AA00);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_AA01);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xC018_AA06);

/// How a userfaultfd was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UffdSource {
    /// The `userfaultfd(2)` system call.
    Syscall,
    /// `ioctl(USERFAULTFD_IOC_NEW)` on `/dev/userfaultfd`.
    Device,
}

/// Creates a userfaultfd with the `userfaultfd(2)` system call.
///
/// `flags` are `O_CLOEXEC`, `O_NONBLOCK` and [`UFFD_USER_MODE_ONLY`].
pub fn userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes one integer argument and returns a new fd or -1.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
    // SAFETY: the kernel just returned this fd to us; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
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
pub fn api(fd: RawFd, features: u64) -> io::Result<UffdioApi> {
    let mut arg = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: `arg` is a valid, writable `struct uffdio_api` that outlives the call.
    cvt_int(unsafe { libc::ioctl(fd, UFFDIO_API as libc::c_ulong, &mut arg) })?;
    Ok(arg)
}

/// `ioctl(UFFDIO_REGISTER)` over `[start, start+len)` with `mode`.
pub fn register(fd: RawFd, start: u64, len: u64, mode: u64) -> io::Result<UffdioRegister> {
    let mut arg = UffdioRegister {
        range: UffdioRange { start, len },
        mode,
        ioctls: 0,
    };
    // SAFETY: `arg` is a valid, writable `struct uffdio_register` that outlives the call.
    cvt_int(unsafe { libc::ioctl(fd, UFFDIO_REGISTER as libc::c_ulong, &mut arg) })?;
    Ok(arg)
}

/// `ioctl(UFFDIO_UNREGISTER)` over `[start, start+len)`.
pub fn unregister(fd: RawFd, start: u64, len: u64) -> io::Result<()> {
    let mut arg = UffdioRange { start, len };
    // SAFETY: `arg` is a valid `struct uffdio_range` that outlives the call.
    cvt_int(unsafe { libc::ioctl(fd, UFFDIO_UNREGISTER as libc::c_ulong, &mut arg) })?;
    Ok(())
}

/// `ioctl(UFFDIO_WRITEPROTECT)`: protect (`protect == true`) or unprotect a range.
pub fn writeprotect(fd: RawFd, start: u64, len: u64, protect: bool) -> io::Result<()> {
    let mut arg = UffdioWriteprotect {
        range: UffdioRange { start, len },
        mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
    };
    // SAFETY: `arg` is a valid `struct uffdio_writeprotect` that outlives the call.
    cvt_int(unsafe { libc::ioctl(fd, UFFDIO_WRITEPROTECT as libc::c_ulong, &mut arg) })?;
    Ok(())
}
