//! Raw Linux system calls and ioctls used by pagewise.
//!
//! This crate is the only place in pagewise that talks to the kernel through
//! `unsafe` code. Every wrapper is thin, named after the call it makes, and
//! returns `std::io::Error` built from `errno`. Kernel structures that the
//! Linux 6.1 headers (and therefore the `libc` crate) lack are defined here
//! with compile-time size checks against the kernel ABI.
//!
//! # When a wrapper is `unsafe`
//!
//! A wrapper is an `unsafe fn`, with a `# Safety` section, exactly when a
//! caller could break the memory safety of its own process through it in a
//! way the wrapper cannot check: unmapping or remapping memory that Rust
//! code may still reference (`munmap`), running code in a state Rust does not
//! model (a signal handler, the child of `fork` in a threaded program), or
//! taking a raw pointer or structure it must trust (`restore` of a
//! `sigaction`). Everything else is safe, including calls that change the
//! *contents* of memory that stays mapped, as another process could
//! (`UFFDIO_MOVE` into a registered range, `MADV_DONTNEED`,
//! `process_vm_readv`), and calls on other processes.
//!
//! # References
//! - `userfaultfd(2)`, `ioctl_userfaultfd(2)`, `Documentation/admin-guide/mm/userfaultfd.rst`
//! - `Documentation/admin-guide/mm/pagemap.rst` (`PAGEMAP_SCAN`)
//! - `process_vm_readv(2)`, `process_madvise(2)`, `pidfd_open(2)`, `madvise(2)`, `mprotect(2)`

#![warn(missing_docs)]

pub mod dl;
pub mod futex;
pub mod launch;
pub mod mem;
pub mod pagemap;
pub mod process;
pub mod seccomp;
pub mod signal;
pub mod socket;
pub mod tls;
pub mod uffd;

use std::io;

/// The base page size this code assumes (x86-64 and most arm64 kernels).
pub const PAGE_SIZE: usize = 4096;
/// Size of a PMD-mapped transparent huge page.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Builds an ioctl request number the way `<asm-generic/ioctl.h>` does.
pub const fn ioc(dir: u64, ty: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (ty << 8) | nr
}
/// `_IOC_NONE`.
pub const IOC_NONE: u64 = 0;
/// `_IOC_WRITE`.
pub const IOC_WRITE: u64 = 1;
/// `_IOC_READ`.
pub const IOC_READ: u64 = 2;

/// Converts a raw `-1`-on-error return into a `Result`.
pub(crate) fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Converts a raw `c_int` return into a `Result`.
pub(crate) fn cvt_int(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}
