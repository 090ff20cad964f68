//! The `uffd-wp` backend: asynchronous userfaultfd write-protect, read and
//! re-armed by `PAGEMAP_SCAN` in one atomic walk.
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

use super::{Backend, BackendKind, CollectStats};
use crate::region::{push_coalesced, PageRange, Region};
use crate::{probe, Error, Result};
use pagewise_sys::{pagemap, uffd};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};

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
        uffd::api(fd.as_raw_fd(), want)
            .map_err(|e| Error::os("UFFDIO_API with WP_ASYNC|WP_UNPOPULATED", e))?;
        let pagemap = File::open("/proc/self/pagemap")
            .map_err(|e| Error::os("opening /proc/self/pagemap", e))?;
        Ok(UffdWp {
            uffd: fd,
            pagemap,
            buf: vec![pagemap::PageRegion::default(); SCAN_VEC],
            pid: None,
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
    /// or under `vm.unprivileged_userfaultfd = 1`; elsewhere it is refused.
    pub fn open_in_sync(pid: i32) -> Result<Self> {
        Self::open_in_mode(pid, true)
    }

    fn open_in_mode(pid: i32, sync: bool) -> Result<Self> {
        let p = probe::get();
        if p.uffd_access.is_none() {
            return Err(Error::Unsupported {
                feature: "userfaultfd",
                why: p.why("userfaultfd"),
            });
        }
        crate::inject::check_target(pid, "uffd-wp from outside", "the userfaultfd call")?;
        let fd = {
            let stopped = crate::stop::Stopped::new(pid)?;
            let remote = crate::inject::Remote::new(&stopped)?;
            let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64
                | if sync {
                    0
                } else {
                    uffd::UFFD_USER_MODE_ONLY as u64
                };
            let fd = remote.syscall(libc::SYS_userfaultfd, [flags, 0, 0, 0, 0, 0])?;
            if fd < 0 {
                return Err(Error::for_pid(
                    pid,
                    "userfaultfd() made inside it",
                    std::io::Error::from_raw_os_error(-fd as i32),
                ));
            }
            remote.take_fd(fd as i32)?
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
        uffd::api(fd.as_raw_fd(), want).map_err(|e| Error::os(what, e))?;
        let path = format!("/proc/{pid}/pagemap");
        let pagemap =
            File::open(&path).map_err(|e| Error::for_pid(pid, format!("opening {path}"), e))?;
        Ok(UffdWp {
            uffd: fd,
            pagemap,
            buf: vec![pagemap::PageRegion::default(); SCAN_VEC],
            pid: Some(pid),
        })
    }

    /// Registers `r` for write-protect tracking; with `protect`, also protects it
    /// now so that only later writes are reported.
    pub fn register(&self, r: Region, protect: bool) -> Result<()> {
        uffd::register(
            self.uffd.as_raw_fd(),
            r.start,
            r.len,
            uffd::REGISTER_MODE_WP,
        )
        .map_err(|e| {
            Error::os(
                format!("UFFDIO_REGISTER(WP) of {:#x}+{:#x}", r.start, r.len),
                e,
            )
        })?;
        if protect {
            self.protect(r)?;
        }
        Ok(())
    }

    /// A second descriptor of the same userfaultfd, for a thread serving it.
    pub fn try_clone_fd(&self) -> Result<OwnedFd> {
        self.uffd
            .try_clone()
            .map_err(|e| Error::os("duplicating a userfaultfd", e))
    }

    /// Write-protects `r` (registered).
    pub fn protect(&self, r: Region) -> Result<()> {
        uffd::writeprotect(self.uffd.as_raw_fd(), r.start, r.len, true).map_err(|e| {
            Error::os(
                format!("UFFDIO_WRITEPROTECT of {:#x}+{:#x}", r.start, r.len),
                e,
            )
        })
    }

    /// Unregisters `r`. An already unmapped range is not an error.
    pub fn unregister(&self, r: Region) -> Result<()> {
        match uffd::unregister(self.uffd.as_raw_fd(), r.start, r.len) {
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
                return_mask: pagemap::category::WRITTEN,
                ..Default::default()
            };
            let n = pagemap::pagemap_scan(self.pagemap.as_raw_fd(), &mut arg, &mut self.buf)
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

/// The `uffd-wp` backend over explicit regions.
///
/// Whole-process tracking (lenient) meets mappings that another userfaultfd
/// already holds, such as one the program registered itself: the kernel
/// refuses a second registration (`EBUSY`). Those are tracked by content
/// hashing instead ([`super::hash::HashBackend`]), said once in
/// [`Backend::note`], so that no write to them goes unreported.
pub struct UffdWpBackend {
    wp: UffdWp,
    regions: Vec<Region>,
    /// Fail when a region is no longer registered (explicit regions), rather
    /// than skip it (whole-process tracking, where mappings change).
    strict: bool,
    /// Whose memory, for the fallback.
    target: super::Target,
    /// Regions another userfaultfd holds, hashed instead.
    fallback: Option<super::hash::HashBackend>,
    note: Option<String>,
}

impl std::fmt::Debug for UffdWpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UffdWpBackend")
            .field("wp", &self.wp)
            .field("regions", &self.regions)
            .field("strict", &self.strict)
            .field("note", &self.note)
            .finish_non_exhaustive()
    }
}

impl UffdWpBackend {
    pub(crate) fn new() -> Result<Self> {
        Ok(UffdWpBackend {
            wp: UffdWp::open()?,
            regions: Vec::new(),
            strict: true,
            target: super::Target::SelfProcess,
            fallback: None,
            note: None,
        })
    }
    pub(crate) fn new_lenient() -> Result<Self> {
        let mut b = Self::new()?;
        b.strict = false;
        Ok(b)
    }
    /// Tracks process `pid` from outside (see [`UffdWp::open_in`]).
    pub(crate) fn for_process(pid: i32) -> Result<Self> {
        Ok(UffdWpBackend {
            wp: UffdWp::open_in(pid)?,
            regions: Vec::new(),
            strict: false,
            target: super::Target::Pid(pid),
            fallback: None,
            note: None,
        })
    }

    /// Tracks `region` by hashing: another userfaultfd holds it.
    fn add_fallback(&mut self, region: Region, baseline: bool) -> Result<()> {
        if self.fallback.is_none() {
            self.fallback = Some(super::hash::HashBackend::new(self.target)?);
        }
        if self.note.is_none() {
            self.note = Some(format!(
                "{:#x}..{:#x} (and any like it) is registered with another userfaultfd \
                 (the program's own): tracked by hashing its pages instead of uffd-wp",
                region.start,
                region.end()
            ));
        }
        self.fallback
            .as_mut()
            .expect("made above")
            .add_region(region, baseline)
    }

    fn in_fallback(&self, region: &Region) -> bool {
        self.fallback
            .as_ref()
            .is_some_and(|f| f.regions().contains(region))
    }
}

impl Drop for UffdWpBackend {
    fn drop(&mut self) {
        // Nothing left registered or protected (closing the descriptor
        // would also do it; saying it costs nothing).
        for r in std::mem::take(&mut self.regions) {
            let _ = self.wp.unregister(r);
        }
    }
}

impl Backend for UffdWpBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::UffdWp
    }

    fn scan(&mut self, out: &mut Vec<PageRange>, stats: &mut CollectStats) -> Result<()> {
        self.wp.check_memory()?;
        for r in &self.regions {
            self.wp
                .scan_written(r.start, r.end(), self.strict, true, out)?;
        }
        if let Some(f) = self.fallback.as_mut() {
            f.scan(out, stats)?;
            crate::region::normalize(out);
        }
        Ok(())
    }

    fn peek(&mut self, out: &mut Vec<PageRange>, stats: &mut CollectStats) -> Result<bool> {
        self.wp.check_memory()?;
        let mut mine = Vec::new();
        for r in &self.regions {
            self.wp
                .scan_written(r.start, r.end(), self.strict, false, &mut mine)?;
        }
        if let Some(f) = self.fallback.as_mut() {
            if !f.regions().is_empty() && !f.peek(&mut mine, stats)? {
                return Ok(false);
            }
            crate::region::normalize(&mut mine);
        }
        out.extend(mine);
        Ok(true)
    }

    fn add_region(&mut self, region: Region, baseline: bool) -> Result<()> {
        self.wp.check_memory()?;
        match self.wp.register(region, baseline) {
            Ok(()) => {}
            Err(Error::Os { source, .. })
                if !self.strict && source.raw_os_error() == Some(libc::EBUSY) =>
            {
                return self.add_fallback(region, baseline);
            }
            Err(e) => return Err(e),
        }
        let i = self.regions.partition_point(|r| r.start < region.start);
        self.regions.insert(i, region);
        Ok(())
    }

    fn remove_region(&mut self, region: Region) -> Result<()> {
        if self.in_fallback(&region) {
            return self
                .fallback
                .as_mut()
                .expect("in_fallback")
                .remove_region(region);
        }
        self.wp.unregister(region)?;
        self.regions.retain(|r| *r != region);
        Ok(())
    }

    fn regions(&self) -> Vec<Region> {
        let mut v = self.regions.clone();
        if let Some(f) = &self.fallback {
            v.extend(f.regions());
            v.sort_by_key(|r| r.start);
        }
        v
    }

    fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
}
