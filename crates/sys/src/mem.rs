//! Mapping and protecting memory: `mmap`, `munmap`, `mprotect`, `madvise`, `prctl`.
//!
//! # References
//! - `mmap(2)`, `mprotect(2)`, `madvise(2)`, `prctl(2)`

use crate::{cvt, cvt_int};
use std::io;

/// `MADV_COLD`.
pub const MADV_COLD: libc::c_int = 20;
/// `MADV_PAGEOUT`.
pub const MADV_PAGEOUT: libc::c_int = 21;
/// `MADV_COLLAPSE`: synchronously collapse a range into huge pages.
pub const MADV_COLLAPSE: libc::c_int = 25;
/// `PR_SET_MEMORY_MERGE`: make every mapping of the process KSM-mergeable.
pub const PR_SET_MEMORY_MERGE: libc::c_int = 67;
/// `PR_GET_MEMORY_MERGE`.
pub const PR_GET_MEMORY_MERGE: libc::c_int = 68;

/// Maps `len` bytes of private anonymous read-write memory.
pub fn mmap_anonymous(len: usize) -> io::Result<*mut u8> {
    mmap_anonymous_flags(len, 0)
}

/// Maps `len` bytes of shared anonymous read-write memory (shared with the
/// children this process forks later).
pub fn mmap_shared_anonymous(len: usize) -> io::Result<*mut u8> {
    // SAFETY: a new shared anonymous mapping at a kernel-chosen address
    // touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// [`mmap_anonymous`] with extra `MAP_*` flags (such as `MAP_NORESERVE`).
pub fn mmap_anonymous_flags(len: usize, flags: libc::c_int) -> io::Result<*mut u8> {
    // SAFETY: an anonymous private mapping at a kernel-chosen address touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p as *mut u8)
    }
}

/// Unmaps `[addr, addr+len)`.
///
/// # Safety
/// No live Rust reference may point into the range.
pub unsafe fn munmap(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees nothing borrows the range.
    cvt_int(unsafe { libc::munmap(addr as *mut libc::c_void, len) })?;
    Ok(())
}

/// `mprotect(2)`. Safe because it changes no memory contents; a wrong
/// protection is reported by the kernel as a fault, which callers handle.
pub fn mprotect(addr: u64, len: usize, prot: libc::c_int) -> io::Result<()> {
    // SAFETY: mprotect only changes page permissions; it never dereferences memory.
    cvt_int(unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) })?;
    Ok(())
}

/// `mprotect(2)` for use inside a signal handler: returns the raw result.
pub fn mprotect_raw(addr: u64, len: usize, prot: libc::c_int) -> libc::c_int {
    // SAFETY: as in `mprotect`; the raw syscall is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as libc::c_int }
}

/// `madvise(2)`.
///
/// # Safety
/// Advice such as `MADV_DONTNEED` discards contents: the caller must hold no
/// Rust reference into the range that relies on them.
pub unsafe fn madvise(addr: u64, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller accepts the advice's effect on the range's contents.
    cvt_int(unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) })?;
    Ok(())
}

/// `prctl(option, arg2, 0, 0, 0)`; returns the call's non-negative result.
pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the prctl options used by pagewise take integers only.
    cvt_int(unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
}

/// Reads the `RLIMIT`-free system page size, for sanity checks.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n <= 0 {
        crate::PAGE_SIZE
    } else {
        n as usize
    }
}

/// `struct perf_event_attr` in its first published size (`PERF_ATTR_SIZE_VER0`),
/// which every kernel accepts.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PerfEventAttrV0 {
    /// `PERF_TYPE_*`.
    pub type_: u32,
    /// `sizeof` this struct.
    pub size: u32,
    /// Event selector.
    pub config: u64,
    /// Sample period or frequency.
    pub sample_period: u64,
    /// `PERF_SAMPLE_*`.
    pub sample_type: u64,
    /// `PERF_FORMAT_*`.
    pub read_format: u64,
    /// The bit field: disabled (bit 0), exclude_kernel (bit 5), exclude_hv (bit 6), ...
    pub flags: u64,
    /// Wakeup events or watermark.
    pub wakeup: u32,
    /// Breakpoint type.
    pub bp_type: u32,
    /// Breakpoint address or config1.
    pub config1: u64,
}
const _: () = assert!(std::mem::size_of::<PerfEventAttrV0>() == 64);

/// `perf_event_open(2)` for one hardware counter (`PERF_TYPE_HARDWARE`) on the
/// calling thread, user mode only, created disabled. Returns the fd.
pub fn perf_event_open_hw(config: u64) -> io::Result<std::os::fd::OwnedFd> {
    perf_event_open(0, config, false)
}

/// `PERF_TYPE_HW_CACHE`.
pub const PERF_TYPE_HW_CACHE: u32 = 3;
/// `PERF_TYPE_HW_CACHE` config of data-TLB read misses:
/// `PERF_COUNT_HW_CACHE_DTLB | OP_READ (0) << 8 | RESULT_MISS << 16`.
pub const PERF_DTLB_READ_MISSES: u64 = 3 | (1 << 16);

/// `perf_event_open(2)` for one counter of type `type_` on the calling
/// thread, user mode only, counting from now when `enabled`. Returns the fd;
/// an 8-byte `read` gives the count.
pub fn perf_event_open(type_: u32, config: u64, enabled: bool) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let attr = PerfEventAttrV0 {
        type_,
        size: 64,
        config,
        flags: u64::from(!enabled) | (1 << 5) | (1 << 6),
        ..Default::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it declares; pid 0 and
    // cpu -1 select the calling thread on any CPU.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttrV0,
            0,
            -1,
            -1,
            0,
        )
    })?;
    // SAFETY: the kernel returned a new fd that we now own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// `PR_SET_VMA` (Linux 5.17).
pub const PR_SET_VMA: libc::c_int = 0x5356_4d41;
/// `PR_SET_VMA_ANON_NAME`.
pub const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;

/// The calling thread's stack mapping: `(start, len)`.
pub fn own_stack() -> io::Result<(u64, usize)> {
    // SAFETY: pthread_getattr_np fills `attr` for the calling thread, which
    // pthread_attr_getstack reads and pthread_attr_destroy frees.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        let rc = libc::pthread_getattr_np(libc::pthread_self(), &mut attr);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut len);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok((addr as u64, len))
    }
}

/// Names the calling thread's stack mapping (see [`name_anon`]); an error
/// where the kernel names no mappings or the stack cannot be found.
pub fn name_own_stack(name: &std::ffi::CStr) -> io::Result<()> {
    let (addr, len) = own_stack()?;
    name_anon(addr, len, name)
}

/// Names the anonymous mapping `[addr, addr+len)`: `/proc/PID/maps` shows
/// it as `[anon:NAME]` (kernels with `CONFIG_ANON_VMA_NAME`; an error
/// elsewhere, which callers may ignore).
pub fn name_anon(addr: u64, len: usize, name: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: PR_SET_VMA only labels the range; the kernel copies the name.
    cvt(unsafe {
        libc::prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            addr as libc::c_ulong,
            len as libc::c_ulong,
            name.as_ptr() as libc::c_ulong,
        )
    } as libc::c_long)?;
    Ok(())
}

/// `mmap(2)` of the first `len` bytes of the open file `fd`, shared
/// (`MAP_SHARED`), readable and, with `writable`, writable. The caller
/// unmaps it with [`munmap`]; using the memory is its own business.
pub fn mmap_shared_file(
    fd: std::os::fd::BorrowedFd<'_>,
    len: usize,
    writable: bool,
) -> io::Result<*mut u8> {
    use std::os::fd::AsRawFd;
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a new mapping chosen by the kernel: it replaces nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}
