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

/// A new memory file (`memfd_create(2)`, close-on-exec) of `len` bytes
/// of zeros, named `name` (as `/proc/PID/fd` shows it): memory that two
/// processes share by mapping it ([`mmap_shared_file`]).
pub fn memfd(name: &std::ffi::CStr, len: u64) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a valid C string and flags.
    let fd = cvt_int(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: the kernel just gave this process the descriptor, which
    // nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate of a descriptor this function owns.
    cvt_int(unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), len as libc::off_t) })?;
    Ok(fd)
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

/// `mprotect(2)`.
///
/// # Safety
/// A protection taken away makes the next access to the range fault: the
/// caller must hold no Rust reference into the range that will be used
/// before the protection is given back, or handle the fault (a tracker's
/// `SIGSEGV` handler does).
pub unsafe fn mprotect(addr: u64, len: usize, prot: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller guarantees what the range's users meet.
    cvt_int(unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) })?;
    Ok(())
}

/// `mprotect(2)` for use inside a signal handler: returns the raw result.
///
/// # Safety
/// As for [`mprotect`].
pub unsafe fn mprotect_raw(addr: u64, len: usize, prot: libc::c_int) -> libc::c_int {
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

/// Advice that changes no byte of the memory it is given (only where and
/// how the kernel keeps it), which [`advise`] takes from safe code.
pub const HARMLESS_ADVICE: [libc::c_int; 10] = [
    libc::MADV_NORMAL,
    libc::MADV_WILLNEED,
    libc::MADV_MERGEABLE,
    libc::MADV_UNMERGEABLE,
    libc::MADV_HUGEPAGE,
    libc::MADV_NOHUGEPAGE,
    MADV_COLD,
    MADV_PAGEOUT,
    MADV_COLLAPSE,
    MADV_POPULATE_WRITE,
];

/// `MADV_POPULATE_WRITE` (Linux 5.14): fault the range in writable, as a
/// write would, without changing a byte.
pub const MADV_POPULATE_WRITE: libc::c_int = 23;

/// `madvise(addr, len, advice)` for advice of [`HARMLESS_ADVICE`] only:
/// it changes no byte of memory, so a range this process holds references
/// into is no concern (the kernel refuses a range that is not mapped).
/// Other advice is refused with `EINVAL` without a call.
pub fn advise(addr: u64, len: usize, advice: libc::c_int) -> io::Result<()> {
    if !HARMLESS_ADVICE.contains(&advice) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: the advice changes no byte of the range (see HARMLESS_ADVICE);
    // an address that is not mapped is the kernel's to refuse.
    unsafe { madvise(addr, len, advice) }
}

/// An owned private anonymous mapping, unmapped on drop, whose start is
/// aligned to `align` (a power of two; 2 MiB lets huge pages back it).
/// Its bytes are reached only by copies and volatile word access through
/// `&self`: no Rust reference into it is ever handed out, so other threads
/// (and the kernel) may write it at any time, and discarding its contents
/// ([`OwnedMapping::madvise`] with `MADV_DONTNEED`) is sound.
#[derive(Debug)]
pub struct OwnedMapping {
    map: *mut u8,
    map_len: usize,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it is reached
// only through raw pointers in bounds-checked copies and volatile accesses.
unsafe impl Send for OwnedMapping {}
// SAFETY: as above: shared access never makes a Rust reference into it.
unsafe impl Sync for OwnedMapping {}

impl OwnedMapping {
    /// Maps `len` bytes (a whole number of pages), aligned to `align`,
    /// with the extra `mmap` flags `flags` (`MAP_NORESERVE`, ...).
    pub fn new(len: usize, align: usize, flags: libc::c_int) -> io::Result<Self> {
        if !align.is_power_of_two() || !len.is_multiple_of(page_size()) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let map_len = len
            .checked_add(align)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let map = mmap_anonymous_flags(map_len, flags)?;
        let start = (map as usize).div_ceil(align) * align;
        Ok(OwnedMapping {
            map,
            map_len,
            ptr: start as *mut u8,
            len,
        })
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The whole mapping behind it, alignment slack included: `(start, end)`.
    pub fn mapping(&self) -> (u64, u64) {
        (self.map as u64, self.map as u64 + self.map_len as u64)
    }
    /// Raw pointer to the first byte (for calls that take an address).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "{off:#x}+{len:#x} outside a mapping of {:#x} bytes",
            self.len
        );
    }

    /// Copies `buf.len()` bytes at offset `off` into `buf`.
    pub fn read_into(&self, off: usize, buf: &mut [u8]) {
        self.check(off, buf.len());
        // SAFETY: in bounds (checked); `buf` is a Rust borrow, not this
        // memory. Racing writers may tear the copy; callers that check it
        // stop them first.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) }
    }

    /// Copies `bytes` into the memory at offset `off`.
    pub fn write_at(&self, off: usize, bytes: &[u8]) {
        self.check(off, bytes.len());
        // SAFETY: in bounds (checked); `bytes` does not overlap this memory
        // (no Rust reference into it is ever made).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) }
    }

    /// Sets `len` bytes at offset `off` to `v`.
    pub fn fill(&self, off: usize, len: usize, v: u8) {
        self.check(off, len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(self.ptr.add(off), v, len) }
    }

    /// Reads the byte at offset `off` (volatile: it really happens).
    #[inline]
    pub fn read_byte(&self, off: usize) -> u8 {
        self.check(off, 1);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::read_volatile(self.ptr.add(off)) }
    }

    /// Writes the byte at offset `off` (volatile: never elided).
    #[inline]
    pub fn write_byte(&self, off: usize, v: u8) {
        self.check(off, 1);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_volatile(self.ptr.add(off), v) }
    }

    /// Reads the 8-byte word `i` (at offset `8 i`; volatile).
    #[inline]
    pub fn read_word(&self, i: usize) -> u64 {
        self.check(i.saturating_mul(8), 8);
        // SAFETY: in bounds (checked) and 8-aligned (the mapping is
        // page-aligned).
        unsafe { std::ptr::read_volatile((self.ptr as *const u64).add(i)) }
    }

    /// Writes the 8-byte word `i` (at offset `8 i`; volatile).
    #[inline]
    pub fn write_word(&self, i: usize, v: u64) {
        self.check(i.saturating_mul(8), 8);
        // SAFETY: in bounds (checked) and 8-aligned.
        unsafe { std::ptr::write_volatile((self.ptr as *mut u64).add(i), v) }
    }

    /// `madvise` of `[off, off+len)` with any advice: discarding the
    /// contents (`MADV_DONTNEED`) is sound here, as no Rust reference into
    /// this memory exists.
    pub fn madvise(&self, off: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
        self.check(off, len);
        // SAFETY: the range is this value's own memory, which no Rust
        // reference covers; the advice may change its bytes, as any write.
        unsafe { madvise(self.addr() + off as u64, len, advice) }
    }
}

impl Drop for OwnedMapping {
    fn drop(&mut self) {
        // SAFETY: the whole mapping is this value's; nothing refers into it.
        let _ = unsafe { munmap(self.map, self.map_len) };
    }
}

/// Counters in a shared anonymous mapping (`MAP_SHARED`): a process and
/// the children it forks see the same values. Unmapped on drop.
#[derive(Debug)]
pub struct SharedAtomics {
    ptr: *mut std::sync::atomic::AtomicU64,
    n: usize,
}

// SAFETY: the mapping holds atomics only, reached through `&AtomicU64`.
unsafe impl Send for SharedAtomics {}
// SAFETY: as above: atomics are safe to share.
unsafe impl Sync for SharedAtomics {}

impl SharedAtomics {
    /// `n` counters, all 0.
    pub fn new(n: usize) -> io::Result<Self> {
        let bytes = (n.max(1) * 8).div_ceil(page_size()) * page_size();
        let ptr = mmap_shared_anonymous(bytes)? as *mut std::sync::atomic::AtomicU64;
        Ok(SharedAtomics { ptr, n })
    }

    /// Counter `i` (`i < n`).
    pub fn at(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(i < self.n, "counter {i} of {}", self.n);
        // SAFETY: in bounds (checked) of a zero-filled, page-aligned shared
        // mapping that lives as long as `self`; AtomicU64 has the layout of
        // u64 and zero is a valid value.
        unsafe { &*self.ptr.add(i) }
    }
}

impl Drop for SharedAtomics {
    fn drop(&mut self) {
        let bytes = (self.n.max(1) * 8).div_ceil(page_size()) * page_size();
        // SAFETY: the mapping is this value's; the references `at` handed
        // out borrow `self` and are gone.
        let _ = unsafe { munmap(self.ptr as *mut u8, bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owned_mapping_is_reached_in_bounds_only() {
        let m = OwnedMapping::new(2 * page_size(), 1 << 21, 0).unwrap();
        assert_eq!(m.addr() % (1 << 21), 0);
        m.write_word(3, 0xdead_beef);
        assert_eq!(m.read_word(3), 0xdead_beef);
        m.write_at(100, b"pagewise");
        let mut b = [0u8; 8];
        m.read_into(100, &mut b);
        assert_eq!(&b, b"pagewise");
        m.fill(0, page_size(), 7);
        assert_eq!(m.read_byte(page_size() - 1), 7);
        m.madvise(0, page_size(), libc::MADV_DONTNEED).unwrap();
        assert_eq!(m.read_byte(0), 0, "discarded pages read as zeros");
        let out = std::panic::catch_unwind(|| m.read_word(2 * page_size() / 8));
        assert!(out.is_err(), "a word past the end is refused");
        let wraps = std::panic::catch_unwind(|| m.read_into(usize::MAX, &mut [0u8; 2]));
        assert!(wraps.is_err(), "a range that wraps is refused");
    }

    #[test]
    fn only_harmless_advice_is_taken_from_safe_code() {
        let m = OwnedMapping::new(page_size(), page_size(), 0).unwrap();
        m.write_byte(0, 9);
        let e = advise(m.addr(), page_size(), libc::MADV_DONTNEED).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(m.read_byte(0), 9, "the refused advice changed nothing");
        advise(m.addr(), page_size(), libc::MADV_NOHUGEPAGE).unwrap();
        assert_eq!(m.read_byte(0), 9);
    }

    #[test]
    fn shared_counters_are_in_bounds() {
        let c = SharedAtomics::new(3).unwrap();
        c.at(2).store(5, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(c.at(2).load(std::sync::atomic::Ordering::SeqCst), 5);
        assert!(
            std::panic::catch_unwind(|| c.at(3).load(std::sync::atomic::Ordering::SeqCst)).is_err()
        );
    }
}
