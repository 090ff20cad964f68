//! `/proc/PID/pagemap`: 64-bit entries and the `PAGEMAP_SCAN` ioctl; `clear_refs`.
//!
//! # References
//! - `Documentation/admin-guide/mm/pagemap.rst`
//! - `include/uapi/linux/fs.h` (`struct pm_scan_arg`, `struct page_region`, Linux 6.18)

use crate::{cvt_int, ioc, IOC_READ, IOC_WRITE};
use std::io;

/// Bits of a 64-bit pagemap entry.
pub mod entry {
    /// Bits 0-54: page frame number (zero without `CAP_SYS_ADMIN`).
    pub const PFN_MASK: u64 = (1 << 55) - 1;
    /// Bit 55: the page is soft-dirty.
    pub const SOFT_DIRTY: u64 = 1 << 55;
    /// Bit 56: the page is exclusively mapped.
    pub const EXCLUSIVE: u64 = 1 << 56;
    /// Bit 57: the PTE is uffd write-protected.
    pub const UFFD_WP: u64 = 1 << 57;
    /// Bit 58: the entry is a guard region.
    pub const GUARD: u64 = 1 << 58;
    /// Bit 61: file page or shared anonymous page.
    pub const FILE: u64 = 1 << 61;
    /// Bit 62: the page is swapped.
    pub const SWAPPED: u64 = 1 << 62;
    /// Bit 63: the page is present.
    pub const PRESENT: u64 = 1 << 63;
}

/// Page categories of `PAGEMAP_SCAN`.
pub mod category {
    /// The range is registered for asynchronous uffd write-protect.
    pub const WPALLOWED: u64 = 1 << 0;
    /// The page was written since it was last write-protected.
    pub const WRITTEN: u64 = 1 << 1;
    /// File-backed page.
    pub const FILE: u64 = 1 << 2;
    /// Present page.
    pub const PRESENT: u64 = 1 << 3;
    /// Swapped page.
    pub const SWAPPED: u64 = 1 << 4;
    /// The shared zero page.
    pub const PFNZERO: u64 = 1 << 5;
    /// Mapped by a huge page (PMD or hugetlb).
    pub const HUGE: u64 = 1 << 6;
    /// Soft-dirty page.
    pub const SOFT_DIRTY: u64 = 1 << 7;
}

/// `PM_SCAN_WP_MATCHING`: write-protect the matching pages in the same walk.
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// `PM_SCAN_CHECK_WPASYNC`: fail unless the range is registered with WP_ASYNC.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// `struct page_region`: one run of pages with the same categories.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PageRegion {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// The categories of the run, masked by `return_mask`.
    pub categories: u64,
}

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PmScanArg {
    /// `sizeof(struct pm_scan_arg)`.
    pub size: u64,
    /// `PM_SCAN_*` flags.
    pub flags: u64,
    /// Start of the range to walk.
    pub start: u64,
    /// End of the range to walk.
    pub end: u64,
    /// Where the walk stopped (out).
    pub walk_end: u64,
    /// Address of the output `struct page_region` array.
    pub vec: u64,
    /// Length of the output array.
    pub vec_len: u64,
    /// Stop after this many matching pages (0: no limit).
    pub max_pages: u64,
    /// Categories whose sense is inverted.
    pub category_inverted: u64,
    /// All of these categories must match.
    pub category_mask: u64,
    /// At least one of these must match.
    pub category_anyof_mask: u64,
    /// Categories reported in the output.
    pub return_mask: u64,
}

const _: () = assert!(std::mem::size_of::<PageRegion>() == 24);
const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

/// `PAGEMAP_SCAN` = `_IOWR('f', 16, struct pm_scan_arg)`.
pub const PAGEMAP_SCAN: u64 = ioc(IOC_READ | IOC_WRITE, b'f' as u64, 16, 96);
const _: () = assert!(PAGEMAP_SCAN == 0xC060_6610);

/// `ioctl(PAGEMAP_SCAN)` on an open pagemap file.
///
/// Returns the number of regions the kernel filled in `out`; `arg.walk_end`
/// tells where the walk stopped (it stops early when `out` is full).
pub fn pagemap_scan(
    pagemap_fd: std::os::fd::BorrowedFd<'_>,
    arg: &mut PmScanArg,
    out: &mut [PageRegion],
) -> io::Result<usize> {
    arg.size = std::mem::size_of::<PmScanArg>() as u64;
    arg.vec = out.as_mut_ptr() as u64;
    arg.vec_len = out.len() as u64;
    // SAFETY: `arg` is a valid `struct pm_scan_arg`; `vec`/`vec_len` describe
    // `out`, which is writable and outlives the call.
    let n = cvt_int(unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&pagemap_fd),
            PAGEMAP_SCAN as libc::c_ulong,
            arg as *mut PmScanArg,
        )
    })?;
    Ok(n as usize)
}

/// Where the next `PAGEMAP_SCAN` of a walk that began this one at `from`
/// starts, given the runs it returned: past both `walk_end` and the end of
/// the last run (after a full vector `walk_end` can lie before that end,
/// and a walk resumed there reports a run twice); `None` when the walk made
/// no progress.
pub fn next_scan_start(from: u64, arg: &PmScanArg, returned: &[PageRegion]) -> Option<u64> {
    let next = returned
        .last()
        .map_or(arg.walk_end, |r| r.end.max(arg.walk_end));
    (next > from).then_some(next)
}

/// Reads pagemap entries for `out.len()` pages starting at virtual address `addr`.
pub fn read_entries(
    pagemap_fd: std::os::fd::BorrowedFd<'_>,
    addr: u64,
    out: &mut [u64],
) -> io::Result<()> {
    let offset = (addr / crate::PAGE_SIZE as u64) * 8;
    let bytes = out.len() * 8;
    let mut done = 0usize;
    while done < bytes {
        // SAFETY: the destination is the unfilled tail of `out`, which is writable
        // for `bytes - done` bytes.
        let n = unsafe {
            libc::pread(
                std::os::fd::AsRawFd::as_raw_fd(&pagemap_fd),
                (out.as_mut_ptr() as *mut u8).add(done) as *mut libc::c_void,
                bytes - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "short pagemap read",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// `clear_refs` value that clears the soft-dirty bits of a process.
pub const CLEAR_REFS_SOFT_DIRTY: &str = "4";

/// `clear_refs` value that resets the peak RSS (`VmHWM`) to the current RSS.
pub const CLEAR_REFS_PEAK_RSS: &str = "5";
