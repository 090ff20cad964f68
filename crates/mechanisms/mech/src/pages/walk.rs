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
/// mappings. One `PAGEMAP_SCAN` a mapping, its runs shared out among its
/// regions.
pub fn huge_regions(pid: i32, walker: &mut PageWalker) -> Result<Vec<HugeRegion>> {
    huge_regions_in(&procfs::writable_anonymous(Some(pid))?, walker)
}

/// [`huge_regions`] of the writable anonymous mappings `maps` (as
/// [`procfs::writable_anonymous`] gives them), through `walker`.
pub(crate) fn huge_regions_in(
    maps: &[procfs::Mapping],
    walker: &mut PageWalker,
) -> Result<Vec<HugeRegion>> {
    let huge = HUGE_PAGE_SIZE as u64;
    let mut out = Vec::new();
    let mut runs = Vec::new();
    for m in maps {
        // pagewise's own memory in the process (the shim's heap, a staging
        // mapping) is never the program's to split, merge or collapse.
        if m.kind() != procfs::MemoryKind::PrivateAnonymous || m.is_pagewise() {
            continue;
        }
        let (first, end) = (m.start.div_ceil(huge) * huge, m.end / huge * huge);
        if first >= end {
            continue;
        }
        walker.categories(
            Region::new(first, end - first)?,
            pagemap::category::PRESENT,
            pagemap::category::PRESENT | pagemap::category::HUGE,
            &mut runs,
        )?;
        let mut next = runs.iter().peekable();
        let mut a = first;
        while a < end {
            let r = Region::new(a, huge)?;
            let (mut resident, mut is_huge) = (0, false);
            // The runs are ascending: those before this region are done
            // with, one reaching past it is looked at again for the next.
            while let Some(p) = next.peek() {
                let (lo, hi) = (p.start.max(a), p.end.min(a + huge));
                if lo < hi {
                    resident += (hi - lo) / PAGE_SIZE as u64;
                    is_huge |= p.categories & pagemap::category::HUGE != 0;
                }
                if p.end > a + huge {
                    break;
                }
                next.next();
            }
            out.push(HugeRegion {
                region: r,
                resident,
                huge: is_huge,
            });
            a += huge;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_sys::mem::OwnedMapping;

    /// Each 2 MiB region's resident pages, from one scan of its mapping,
    /// are exactly the pages written: runs that cross a region's edge are
    /// shared between the two, a region with none reads 0.
    #[test]
    fn huge_regions_count_each_regions_pages_from_one_scan() {
        if !crate::probe::get().pagemap_scan {
            pagewise_testkit::report_skip("the kernel has no PAGEMAP_SCAN (Linux 6.7+)");
            return;
        }
        let huge = HUGE_PAGE_SIZE;
        let m = OwnedMapping::new(4 * huge, huge, 0).unwrap();
        // No huge page may come: the counts are of 4 KiB pages.
        m.madvise(0, 4 * huge, libc::MADV_NOHUGEPAGE).unwrap();
        let per = huge / PAGE_SIZE;
        let mut written = [0u64; 4];
        let mut touch = |region: usize, pages: std::ops::Range<usize>| {
            for p in pages {
                m.write_byte(region * huge + p * PAGE_SIZE, 1);
                written[region] += 1;
            }
        };
        touch(0, 0..10);
        // Region 2 whole and region 3's first pages: one run across the edge.
        touch(2, 0..per);
        touch(3, 0..3);
        touch(3, per - 3..per);
        let pid = std::process::id() as i32;
        let mut w = PageWalker::new(Some(pid)).unwrap();
        let found: Vec<HugeRegion> = huge_regions(pid, &mut w)
            .unwrap()
            .into_iter()
            .filter(|r| r.region.start >= m.addr() && r.region.start < m.addr() + 4 * huge as u64)
            .collect();
        let starts: Vec<u64> = found.iter().map(|r| r.region.start).collect();
        let want: Vec<u64> = (0..4).map(|i| m.addr() + (i * huge) as u64).collect();
        assert_eq!(starts, want, "the mapping's four regions, in order");
        let resident: Vec<u64> = found.iter().map(|r| r.resident).collect();
        assert_eq!(resident, written.to_vec(), "pages in memory per region");
        assert!(found.iter().all(|r| !r.huge), "no region is mapped huge");
        println!("ok   resident pages per region {resident:?}, as written");
    }
}
