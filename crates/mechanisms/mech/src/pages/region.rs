//! Page-aligned address ranges and coalesced range lists.
//!
//! Every capability speaks of memory as `Region`s (what is tracked or
//! snapshotted) and `PageRange`s (runs of pages, such as dirty pages). Merging and
//! clipping range lists live here and nowhere else.

use crate::{Error, Result, PAGE_SIZE};
use serde::Serialize;

/// A page-aligned, non-empty range of virtual addresses `[start, start+len)`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
pub struct Region {
    /// Start address, page-aligned.
    pub start: u64,
    /// Length in bytes, a non-zero multiple of the page size.
    pub len: u64,
}

impl Region {
    /// Checks alignment and builds a region.
    pub fn new(start: u64, len: u64) -> Result<Self> {
        let ps = PAGE_SIZE as u64;
        if len == 0 || !start.is_multiple_of(ps) || !len.is_multiple_of(ps) {
            return Err(Error::Unaligned { start, len });
        }
        if start.checked_add(len).is_none() {
            return Err(Error::RangeOverflow { start, len });
        }
        Ok(Region { start, len })
    }

    /// Where `[addr, addr+len)` lies in this region: its offset from the
    /// start, or `None` when any byte of it lies outside (or `addr + len`
    /// overflows). The one check for ranges that come from another party
    /// (a network peer, a file, a tracked program).
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.checked_add(len)?;
        if addr < self.start || end > self.end() {
            return None;
        }
        usize::try_from(addr - self.start).ok()
    }

    /// Exclusive end address.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }

    /// Number of pages.
    pub fn pages(&self) -> u64 {
        self.len / PAGE_SIZE as u64
    }

    /// Whether `addr` lies inside.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr < self.end()
    }
}

/// A run of `pages` pages starting at `start`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
pub struct PageRange {
    /// First page's address.
    pub start: u64,
    /// Number of pages.
    pub pages: u64,
}

impl PageRange {
    /// A run from another party's numbers: `None` unless `start` is
    /// page-aligned, `pages` is not zero and the run ends below the top of
    /// the address space (overflow-checked).
    pub fn checked(start: u64, pages: u64) -> Option<PageRange> {
        let len = pages.checked_mul(PAGE_SIZE as u64)?;
        Region::new(start, len).ok()?;
        Some(PageRange { start, pages })
    }

    /// Exclusive end address.
    pub fn end(&self) -> u64 {
        self.start + self.pages * PAGE_SIZE as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.pages * PAGE_SIZE as u64
    }
    /// Whether the range holds no page.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }
}

/// `regions`, sorted by address; an error if two of them overlap.
pub fn sorted_disjoint(regions: &[Region]) -> Result<Vec<Region>> {
    let mut sorted = regions.to_vec();
    sorted.sort();
    for w in sorted.windows(2) {
        if w[0].end() > w[1].start {
            return Err(Error::Overlap {
                a_start: w[0].start,
                a_len: w[0].len,
                b_start: w[1].start,
                b_len: w[1].len,
            });
        }
    }
    Ok(sorted)
}

/// Appends `[start, end)` to a sorted list, merging it with the last range when
/// they touch. Callers push in ascending address order.
pub fn push_coalesced(out: &mut Vec<PageRange>, start: u64, end: u64) {
    if end <= start {
        return;
    }
    let pages = (end - start) / PAGE_SIZE as u64;
    if let Some(last) = out.last_mut() {
        if last.end() == start {
            last.pages += pages;
            return;
        }
    }
    out.push(PageRange { start, pages });
}

/// Sorts and coalesces an arbitrary list of ranges (overlaps allowed).
pub fn normalize(ranges: &mut Vec<PageRange>) {
    ranges.sort_unstable();
    let mut out: Vec<PageRange> = Vec::with_capacity(ranges.len());
    for r in ranges.iter() {
        if r.pages == 0 {
            continue;
        }
        if let Some(last) = out.last_mut() {
            if r.start <= last.end() {
                let end = last.end().max(r.end());
                last.pages = (end - last.start) / PAGE_SIZE as u64;
                continue;
            }
        }
        out.push(*r);
    }
    *ranges = out;
}

/// Total pages in a list of ranges.
pub fn total_pages(ranges: &[PageRange]) -> u64 {
    ranges.iter().map(|r| r.pages).sum()
}

/// The union of two sorted, coalesced range lists, itself sorted and coalesced.
pub fn union_sorted(a: &[PageRange], b: &[PageRange]) -> Vec<PageRange> {
    if a.is_empty() {
        return b.to_vec();
    }
    if b.is_empty() {
        return a.to_vec();
    }
    let mut out: Vec<PageRange> = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = if j >= b.len() || (i < a.len() && a[i].start <= b[j].start) {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        match out.last_mut() {
            Some(last) if next.start <= last.end() => {
                let end = last.end().max(next.end());
                last.pages = (end - last.start) / PAGE_SIZE as u64;
            }
            _ => out.push(next),
        }
    }
    out
}

/// Keeps only the parts of `ranges` (sorted) that lie inside `regions` (sorted).
pub fn clip_to(ranges: &[PageRange], regions: &[Region]) -> Vec<PageRange> {
    let mut out = Vec::new();
    for r in ranges {
        let first = regions.partition_point(|g| g.end() <= r.start);
        for g in &regions[first..] {
            if g.start >= r.end() {
                break;
            }
            push_coalesced(&mut out, r.start.max(g.start), r.end().min(g.end()));
        }
    }
    out
}

/// The parts of `a` (sorted) not in `b` (sorted, coalesced), page by page.
pub fn subtract_sorted(a: &[PageRange], b: &[PageRange]) -> Vec<PageRange> {
    let mut out = Vec::new();
    let mut j = 0;
    for r in a {
        let mut addr = r.start;
        while addr < r.end() {
            while j < b.len() && b[j].end() <= addr {
                j += 1;
            }
            let covered = j < b.len() && b[j].start <= addr;
            if !covered {
                push_coalesced(&mut out, addr, addr + PAGE_SIZE as u64);
            }
            addr += PAGE_SIZE as u64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    const P: u64 = PAGE_SIZE as u64;

    #[test]
    fn a_range_past_the_top_is_named_so() {
        let e = Region::new(u64::MAX - 4095, 8192).unwrap_err().to_string();
        assert!(e.contains("past the top of the address space"), "{e}");
        let e = Region::new(0x1001, 4096).unwrap_err().to_string();
        assert!(e.contains("not page-aligned"), "{e}");
        let r = Region::new(0x10000, 0x2000).unwrap();
        assert_eq!(r.offset_of(0x11000, 0x1000), Some(0x1000));
        assert_eq!(r.offset_of(0x11000, 0x1001), None);
        assert_eq!(r.offset_of(0xf000, 0x1000), None);
        assert_eq!(r.offset_of(0x11000, u64::MAX), None);
        assert_eq!(PageRange::checked(u64::MAX - 4095, 2), None);
        assert_eq!(PageRange::checked(0x1000, u64::MAX), None);
    }

    #[test]
    fn coalesces_adjacent_and_overlapping() {
        let mut v = vec![
            PageRange {
                start: 5 * P,
                pages: 2,
            },
            PageRange { start: 0, pages: 1 },
            PageRange { start: P, pages: 1 },
            PageRange {
                start: 6 * P,
                pages: 3,
            },
        ];
        normalize(&mut v);
        assert_eq!(
            v,
            vec![
                PageRange { start: 0, pages: 2 },
                PageRange {
                    start: 5 * P,
                    pages: 4
                }
            ]
        );
    }

    #[test]
    fn union_merges_sorted_lists() {
        let a = vec![
            PageRange { start: 0, pages: 2 },
            PageRange {
                start: 10 * P,
                pages: 1,
            },
        ];
        let b = vec![
            PageRange {
                start: 2 * P,
                pages: 1,
            },
            PageRange {
                start: 8 * P,
                pages: 3,
            },
            PageRange {
                start: 20 * P,
                pages: 1,
            },
        ];
        assert_eq!(
            union_sorted(&a, &b),
            vec![
                PageRange { start: 0, pages: 3 },
                PageRange {
                    start: 8 * P,
                    pages: 3
                },
                PageRange {
                    start: 20 * P,
                    pages: 1
                }
            ]
        );
        let mut both: Vec<_> = a.iter().chain(b.iter()).copied().collect();
        normalize(&mut both);
        assert_eq!(union_sorted(&a, &b), both);
    }

    #[test]
    fn clips_to_regions() {
        let regs = [
            Region::new(4 * P, 4 * P).unwrap(),
            Region::new(20 * P, 2 * P).unwrap(),
        ];
        let r = vec![PageRange {
            start: 0,
            pages: 30,
        }];
        assert_eq!(
            clip_to(&r, &regs),
            vec![
                PageRange {
                    start: 4 * P,
                    pages: 4
                },
                PageRange {
                    start: 20 * P,
                    pages: 2
                }
            ]
        );
    }

    #[test]
    fn rejects_unaligned() {
        assert!(Region::new(1, P).is_err());
        assert!(Region::new(0, 0).is_err());
        assert!(Region::new(0, P + 1).is_err());
    }

    #[test]
    fn subtract_pages() {
        let a = [PageRange {
            start: 0,
            pages: 10,
        }];
        let b = [
            PageRange { start: P, pages: 2 },
            PageRange {
                start: 5 * P,
                pages: 1,
            },
        ];
        assert_eq!(
            subtract_sorted(&a, &b),
            vec![
                PageRange { start: 0, pages: 1 },
                PageRange {
                    start: 3 * P,
                    pages: 2
                },
                PageRange {
                    start: 6 * P,
                    pages: 4
                }
            ]
        );
    }
}
