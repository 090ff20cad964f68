//! Walking a process's page tables: the one place pagewise asks which
//! pages of a range are populated (`PAGEMAP_SCAN`), and the 2 MiB regions
//! of a process. Reading and writing its pages is [`crate::remote`].

use crate::{probe, procfs};
use crate::{Error, Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::pagemap;
use std::fs::File;
use std::os::fd::AsFd;

/// Finds populated runs of pages in the calling process or another one.
#[derive(Debug)]
pub struct PageWalker {
    pid: Option<i32>,
    pagemap: Option<File>,
    scan_vec: Vec<pagemap::PageRegion>,
}

impl PageWalker {
    /// A walker over process `pid` (`None`: the calling process). Without
    /// `PAGEMAP_SCAN` every page counts as populated.
    pub fn new(pid: Option<i32>) -> Result<Self> {
        let pagemap = if probe::get().pagemap_scan {
            let path = procfs::proc_dir(pid).join("pagemap");
            Some(
                File::open(&path)
                    .map_err(|e| Error::at(pid, format!("opening {}", path.display()), e))?,
            )
        } else {
            None
        };
        Ok(PageWalker {
            pid,
            pagemap,
            scan_vec: vec![pagemap::PageRegion::default(); 1024],
        })
    }

    /// Replaces `out` with the populated (present or swapped) runs `[a, b)` of
    /// `r`, ascending and coalesced. Pages outside them read as zeros.
    pub fn populated(&mut self, r: Region, out: &mut Vec<(u64, u64)>) -> Result<()> {
        out.clear();
        if self.pagemap.is_none() {
            out.push((r.start, r.end()));
            return Ok(());
        }
        let any = pagemap::category::PRESENT | pagemap::category::SWAPPED;
        let mut runs = Vec::new();
        self.categories(r, any, any, &mut runs)?;
        for pr in runs {
            match out.last_mut() {
                Some(last) if last.1 == pr.start => last.1 = pr.end,
                _ => out.push((pr.start, pr.end)),
            }
        }
        Ok(())
    }

    /// Replaces `out` with the runs of `r` in any of the `anyof`
    /// categories (`pagemap::category`), each with its categories masked by
    /// `report`, ascending. `Unsupported` without `PAGEMAP_SCAN`.
    pub fn categories(
        &mut self,
        r: Region,
        anyof: u64,
        report: u64,
        out: &mut Vec<pagemap::PageRegion>,
    ) -> Result<()> {
        out.clear();
        let Some(pm) = &self.pagemap else {
            return Err(Error::Unsupported {
                feature: "PAGEMAP_SCAN",
                why: "the kernel has no PAGEMAP_SCAN ioctl (Linux 6.7+)".into(),
            });
        };
        let mut addr = r.start;
        while addr < r.end() {
            let mut arg = pagemap::PmScanArg {
                start: addr,
                end: r.end(),
                category_anyof_mask: anyof,
                return_mask: report,
                ..Default::default()
            };
            let n = pagemap::pagemap_scan(pm.as_fd(), &mut arg, &mut self.scan_vec)
                .map_err(|e| Error::at(self.pid, format!("PAGEMAP_SCAN of {addr:#x}"), e))?;
            out.extend_from_slice(&self.scan_vec[..n]);
            match pagemap::next_scan_start(addr, &arg, &self.scan_vec[..n]) {
                Some(next) => addr = next,
                None => break,
            }
        }
        Ok(())
    }
}

/// A 2 MiB region of a process wholly inside a private anonymous writable
/// mapping (see [`huge_regions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HugeRegion {
    /// The region.
    pub region: Region,
    /// Its pages in memory.
    pub resident: u64,
    /// Mapped by a huge page.
    pub huge: bool,
}

/// The 2 MiB regions of `pid` wholly inside private anonymous writable
/// mappings.
pub fn huge_regions(pid: i32, walker: &mut PageWalker) -> Result<Vec<HugeRegion>> {
    let huge = HUGE_PAGE_SIZE as u64;
    let mut out = Vec::new();
    let mut runs = Vec::new();
    for m in procfs::writable_anonymous(Some(pid))? {
        // pagewise's own memory in the process (the shim's heap, a staging
        // mapping) is never the program's to split, merge or collapse.
        if m.kind() != procfs::MemoryKind::PrivateAnonymous || m.is_pagewise() {
            continue;
        }
        let (mut a, end) = (m.start.div_ceil(huge) * huge, m.end / huge * huge);
        while a < end {
            let r = Region::new(a, huge)?;
            walker.categories(
                r,
                pagemap::category::PRESENT,
                pagemap::category::PRESENT | pagemap::category::HUGE,
                &mut runs,
            )?;
            let resident: u64 = runs
                .iter()
                .map(|p| (p.end - p.start) / PAGE_SIZE as u64)
                .sum();
            out.push(HugeRegion {
                region: r,
                resident,
                huge: runs
                    .iter()
                    .any(|p| p.categories & pagemap::category::HUGE != 0),
            });
            a += huge;
        }
    }
    Ok(out)
}
