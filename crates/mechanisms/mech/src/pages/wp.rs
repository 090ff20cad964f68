//! Userfaultfd write-protect on the caller's memory or another process's:
//! one userfaultfd in asynchronous write-protect mode, read and re-armed by
//! `PAGEMAP_SCAN` in one atomic walk. Dirty tracking (`track`'s `uffd-wp`
//! backend) and access coverage ([`crate::access`]) both stand on it.
//!
//! Set-up: a userfaultfd with `UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED`,
//! each region registered in `UFFDIO_REGISTER_MODE_WP` and write-protected. A
//! write to a protected page is resolved by the kernel itself (no handler
//! thread): it clears the PTE's uffd-wp bit, which `PAGEMAP_SCAN` reports as
//! `PAGE_IS_WRITTEN`. A scan with `PM_SCAN_WP_MATCHING` reports the written
//! pages and re-protects them under the page-table lock, so a write either
//! happens before the walk reaches its PTE (reported now) or faults again
//! after it (reported next time).
//!
//! Interference (each tested against a shadow copy): a write to a THP splits
//! it and is tracked per base page; swapped-out PTEs keep their uffd-wp bit;
//! KSM and `fork` COW go through the write-protect fault; a page zapped by
//! `MADV_DONTNEED` loses its marker and is reported as written (a false
//! positive that also tells a consumer the content changed to zeros).

use crate::probe;
use crate::region::{push_coalesced, PageRange, Region};
use crate::{Error, Result};
use pagewise_sys::{pagemap, uffd};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

/// Region-vector capacity of one `PAGEMAP_SCAN` call.
const SCAN_VEC: usize = 4096;

/// A userfaultfd in asynchronous write-protect mode and the pagemap to scan it.
#[derive(Debug)]
pub struct UffdWp {
    uffd: OwnedFd,
    pagemap: File,
    buf: Vec<pagemap::PageRegion>,
    /// The process tracked from outside, if not this one.
    pid: Option<i32>,
    /// Protect what memory holds of a range only (see
    /// [`open_in_sparse`](Self::open_in_sparse)).
    sparse: bool,
}

impl UffdWp {
    /// Opens a userfaultfd with WP_ASYNC and WP_UNPOPULATED and `/proc/self/pagemap`.
    pub fn open() -> Result<Self> {
        let p = probe::get();
        let access = p.uffd_access.ok_or_else(|| Error::Unsupported {
            feature: "userfaultfd",
            why: p.why("userfaultfd"),
        })?;
        let flags = libc::O_CLOEXEC
            | libc::O_NONBLOCK
            | if access.user_mode_only {
                uffd::UFFD_USER_MODE_ONLY
            } else {
                0
            };
        let fd = if access.syscall {
            uffd::userfaultfd(flags)
        } else {
            uffd::userfaultfd_from_device(flags)
        }
        .map_err(|e| Error::os("opening a userfaultfd", e))?;
        let want = uffd::feature::WP_ASYNC | uffd::feature::WP_UNPOPULATED;
        uffd::api(fd.as_fd(), want)
            .map_err(|e| Error::os("UFFDIO_API with WP_ASYNC|WP_UNPOPULATED", e))?;
        let pagemap = File::open("/proc/self/pagemap")
            .map_err(|e| Error::os("opening /proc/self/pagemap", e))?;
        Ok(UffdWp {
            uffd: fd,
            pagemap,
            buf: vec![pagemap::PageRegion::default(); SCAN_VEC],
            pid: None,
            sparse: false,
        })
    }

    /// For a process tracked from outside: an error when the memory this
    /// userfaultfd tracks is gone. The pagemap file opened with it reads
    /// that memory only: once the process has replaced its program (exec)
    /// or exited, a read of it returns nothing, where a live one returns an
    /// entry for any address.
    pub fn check_memory(&self) -> Result<()> {
        let Some(pid) = self.pid else {
            return Ok(());
        };
        let mut entry = [0u8; 8];
        match std::os::unix::fs::FileExt::read_at(&self.pagemap, &mut entry, 0) {
            Ok(8) => Ok(()),
            Ok(_) | Err(_) if crate::procfs::is_alive(pid) => Err(Error::ProgramReplaced(pid)),
            _ => Err(Error::ProcessExited(pid)),
        }
    }

    /// A userfaultfd over the memory of process `pid`, made inside it: the
    /// process is stopped for a moment, makes the `userfaultfd` call itself
    /// ([`crate::inject`]), and its descriptor is moved here (taken with
    /// `pidfd_getfd`, closed there). A userfaultfd acts on the memory of
    /// the process that created it, wherever it is held; `PAGEMAP_SCAN` then
    /// runs on `/proc/PID/pagemap`. Refused, with the reason, for a process
    /// with a seccomp filter (the call could be refused, or kill it), one
    /// that is traced already (a process has one tracer), one that is
    /// stopped, and where ptrace is not allowed.
    pub fn open_in(pid: i32) -> Result<Self> {
        Self::open_in_mode(pid, false)
    }

    /// As [`open_in`](Self::open_in), protecting what memory holds of a
    /// range at its registration (its present and swapped pages) and
    /// scanning those only, leaving the holes as they are. In
    /// asynchronous mode the kernel counts a hole without a marker as
    /// written: `UFFDIO_WRITEPROTECT` of a whole range, or a scan that
    /// re-protects what is written, puts a marker in every hole, filling
    /// the target's page tables and making every later walk visit each
    /// entry (10 GiB mapped with 2 pages written: 2,621,440 markers and
    /// 20 MiB of page tables). Here the holes cost nothing. A page written
    /// in a hole is reported as written as before (its fresh entry has no
    /// protection); a page the program gives back (`MADV_DONTNEED`) is
    /// not: the caller learns of it by walking what memory holds.
    pub fn open_in_sparse(pid: i32) -> Result<Self> {
        let mut wp = Self::open_in(pid)?;
        wp.sparse = true;
        Ok(wp)
    }

    /// As [`open_in`](Self::open_in), in synchronous write-protect mode: a
    /// write to a protected page stops the writing thread until this side
    /// answers (reads the message from a descriptor of
    /// [`try_clone_fd`](Self::try_clone_fd), then lifts the protection).
    /// It also reports `munmap`, `mremap` and `MADV_DONTNEED`/`MADV_REMOVE`
    /// of registered ranges, each of which waits until the event is read:
    /// the descriptor must be served for as long as anything is
    /// registered.
    /// Unlike the asynchronous mode, a write to a protected huge page does
    /// not split it. The descriptor is made without `UFFD_USER_MODE_ONLY`
    /// (otherwise a system call writing a protected buffer would fail with
    /// `EFAULT`), which the kernel allows a process with `CAP_SYS_PTRACE`
    /// or under `vm.unprivileged_userfaultfd = 1`: for a process without
    /// it (in a container), it is made through `/dev/userfaultfd`, lent to
    /// the process for the one call (see
    /// [`crate::inject::uffd_lending::userfaultfd_inside`]); the machine's setting
    /// is never changed.
    pub(crate) fn open_in_sync(pid: i32) -> Result<Self> {
        Self::open_in_mode(pid, true)
    }

    /// `n` userfaultfds over the memory of process `pid` as
    /// [`open_in`](Self::open_in) makes one, with one stop for all of
    /// them: for a user that closes one after each use (closing a
    /// userfaultfd unregisters every mapping registered with it, each
    /// whole, where an `UFFDIO_UNREGISTER` of a range read a moment before
    /// could split a mapping the program has since grown).
    pub(crate) fn open_many_in(pid: i32, n: usize) -> Result<Vec<Self>> {
        Self::made_in(pid, false, n)
    }

    fn open_in_mode(pid: i32, sync: bool) -> Result<Self> {
        Self::made_in(pid, sync, 1)?
            .pop()
            .ok_or(Error::ProcessExited(pid))
    }

    /// `n` userfaultfds made inside `pid` in one stop (see
    /// [`open_in`](Self::open_in)), synchronous or asynchronous.
    fn made_in(pid: i32, sync: bool, n: usize) -> Result<Vec<Self>> {
        let p = probe::get();
        if p.uffd_access.is_none() {
            return Err(Error::Unsupported {
                feature: "userfaultfd",
                why: p.why("userfaultfd"),
            });
        }
        crate::inject::check_target(pid, "uffd-wp from outside", "the userfaultfd call")?;
        let fds = {
            let stopped = crate::stop::Stopped::new(pid)?;
            let remote = crate::inject::Remote::new(&stopped)?;
            let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64
                | if sync {
                    0
                } else {
                    uffd::UFFD_USER_MODE_ONLY as u64
                };
            let mut fds = Vec::with_capacity(n);
            for _ in 0..n {
                let fd = crate::inject::uffd_lending::userfaultfd_inside(
                    &remote,
                    flags,
                    "write tracking from outside (uffd-wp)",
                )?;
                fds.push(remote.take_fd(fd)?);
            }
            fds
        };
        let (want, what) = if sync {
            (
                uffd::feature::EVENT_UNMAP
                    | uffd::feature::EVENT_REMOVE
                    | uffd::feature::EVENT_REMAP,
                "UFFDIO_API with EVENT_UNMAP|EVENT_REMOVE|EVENT_REMAP",
            )
        } else {
            (
                uffd::feature::WP_ASYNC | uffd::feature::WP_UNPOPULATED,
                "UFFDIO_API with WP_ASYNC|WP_UNPOPULATED",
            )
        };
        let mut out = Vec::with_capacity(n);
        for fd in fds {
            uffd::api(fd.as_fd(), want).map_err(|e| Error::os(what, e))?;
            let path = format!("/proc/{pid}/pagemap");
            let pagemap =
                File::open(&path).map_err(|e| Error::for_pid(pid, format!("opening {path}"), e))?;
            out.push(UffdWp {
                uffd: fd,
                pagemap,
                buf: vec![pagemap::PageRegion::default(); SCAN_VEC],
                pid: Some(pid),
                sparse: false,
            });
        }
        Ok(out)
    }

    /// Registers `r` for write-protect tracking; with `protect`, also protects it
    /// now so that only later writes are reported.
    pub fn register(&self, r: Region, protect: bool) -> Result<()> {
        uffd::register(self.uffd.as_fd(), r.start, r.len, uffd::REGISTER_MODE_WP).map_err(|e| {
            Error::os(
                format!("UFFDIO_REGISTER(WP) of {:#x}+{:#x}", r.start, r.len),
                e,
            )
        })?;
        match (protect, self.sparse) {
            (true, false) => self.protect(r)?,
            (true, true) => self.protect_populated(r)?,
            (false, _) => {}
        }
        Ok(())
    }

    /// Write-protects the present and swapped pages of `r`. A page
    /// populated meanwhile stays unprotected: reported as written.
    fn protect_populated(&self, r: Region) -> Result<()> {
        let mut runs = Vec::new();
        crate::walk::PageWalker::new(self.pid)?.populated(r, &mut runs)?;
        for (a, b) in runs {
            self.protect(Region::new(a, b - a)?)?;
        }
        Ok(())
    }

    /// The userfaultfd and the pagemap file, for a caller that makes its
    /// own `UFFDIO_WRITEPROTECT` and `PAGEMAP_SCAN` calls (a reset inside
    /// the program, from a signal handler, with buffers of its own).
    pub fn descriptors(&self) -> (std::os::fd::BorrowedFd<'_>, std::os::fd::BorrowedFd<'_>) {
        (self.uffd.as_fd(), self.pagemap.as_fd())
    }

    /// A second descriptor of the same userfaultfd, for a thread serving it.
    pub(crate) fn try_clone_fd(&self) -> Result<OwnedFd> {
        self.uffd
            .try_clone()
            .map_err(|e| Error::os("duplicating a userfaultfd", e))
    }

    /// Write-protects `r` (registered).
    pub fn protect(&self, r: Region) -> Result<()> {
        uffd::writeprotect(self.uffd.as_fd(), r.start, r.len, true).map_err(|e| {
            Error::os(
                format!("UFFDIO_WRITEPROTECT of {:#x}+{:#x}", r.start, r.len),
                e,
            )
        })
    }

    /// Unregisters `r`. An already unmapped range is not an error.
    pub fn unregister(&self, r: Region) -> Result<()> {
        match uffd::unregister(self.uffd.as_fd(), r.start, r.len) {
            Ok(()) => Ok(()),
            Err(e)
                if e.raw_os_error() == Some(libc::EINVAL)
                    || e.raw_os_error() == Some(libc::ENOMEM) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::os(
                format!("UFFDIO_UNREGISTER of {:#x}+{:#x}", r.start, r.len),
                e,
            )),
        }
    }

    /// Reports the written pages of `[start, end)` and, with `rearm`,
    /// re-protects them (without, they stay written and the next scan reports
    /// them again). With `strict`, a part of the range that is not registered
    /// is an error; otherwise it is skipped.
    pub fn scan_written(
        &mut self,
        start: u64,
        end: u64,
        strict: bool,
        rearm: bool,
        out: &mut Vec<PageRange>,
    ) -> Result<()> {
        let mut addr = start;
        while addr < end {
            let mut arg = pagemap::PmScanArg {
                flags: if rearm {
                    pagemap::PM_SCAN_WP_MATCHING
                } else {
                    0
                } | if strict {
                    pagemap::PM_SCAN_CHECK_WPASYNC
                } else {
                    0
                },
                start: addr,
                end,
                category_mask: pagemap::category::WRITTEN,
                // Sparse: what memory holds only. An unprotected hole
                // counts as written, and a scan that re-protects it puts
                // a marker there.
                category_anyof_mask: if self.sparse {
                    pagemap::category::PRESENT | pagemap::category::SWAPPED
                } else {
                    0
                },
                return_mask: pagemap::category::WRITTEN,
                ..Default::default()
            };
            let n = pagemap::pagemap_scan(self.pagemap.as_fd(), &mut arg, &mut self.buf)
                .map_err(|e| Error::os(format!("PAGEMAP_SCAN of {addr:#x}..{end:#x}"), e))?;
            for r in &self.buf[..n] {
                push_coalesced(out, r.start, r.end);
            }
            match pagemap::next_scan_start(addr, &arg, &self.buf[..n]) {
                Some(next) => addr = next,
                None => break,
            }
        }
        Ok(())
    }
}
