//! Built-in workloads shared by tests, benchmarks and `pagewise demo`: the
//! write patterns of the LDT experiments and a known layout for the
//! inspector, over owned anonymous memory ([`AnonMemory`]).

pub use crate::anon::{AnonMemory, Rng};
use crate::{Result, PAGE_SIZE};
use pagewise_sys::mem;

/// A known memory layout for checking the inspector: `regions` 2 MiB
/// regions, asked to be huge pages, in which page `i` is zero-filled when
/// `i % 10 < 3` (30 %), one of a group of 8 identical pages when `i % 10`
/// is 3 or 4 (20 %), and unique otherwise; every 10th region is hot
/// ([`Layout::touch_hot`] reads every page of them), the rest cold.
#[non_exhaustive]
pub struct Layout {
    /// The memory.
    pub mem: AnonMemory,
    /// Whether `MADV_COLLAPSE` made every region a huge page.
    pub collapsed: bool,
}

/// What a [`Layout`] holds, as the inspector must find it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct LayoutTruth {
    /// Start of the memory.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Whether every region is a huge page.
    pub collapsed: bool,
    /// Resident pages (all of them).
    pub pages: u64,
    /// Zero-filled pages.
    pub zero_pages: u64,
    /// Non-zero pages with a duplicate.
    pub duplicate_pages: u64,
    /// Groups of identical pages (merging frees `duplicate_pages − groups`).
    pub groups: u64,
    /// Start of every hot region.
    pub hot: Vec<u64>,
}

impl Layout {
    /// Builds the layout over `regions` regions (contents from `seed`).
    pub fn build(regions: usize, seed: u64) -> Result<Self> {
        let mem = AnonMemory::new(regions * crate::HUGE_PAGE_SIZE)?;
        let huge = mem.madvise(0, mem.len(), libc::MADV_HUGEPAGE).is_ok();
        let mut rng = Rng::new(seed);
        let mut page = vec![0u8; PAGE_SIZE];
        for i in 0..mem.pages() {
            match i % 10 {
                // Written, so resident, then zero again.
                0..=2 => {
                    mem.fill_page(i, 1);
                    mem.fill_page(i, 0);
                }
                // Groups of 8 identical pages: the 40-page block's id.
                3 | 4 => {
                    let mut g = Rng::new(seed ^ 0xd0b1_e000_0000 ^ (i / 40) as u64);
                    for w in page.chunks_exact_mut(8) {
                        w.copy_from_slice(&g.next_u64().to_le_bytes());
                    }
                    mem.write_at(i * PAGE_SIZE, &page);
                }
                _ => {
                    for w in page.chunks_exact_mut(8) {
                        w.copy_from_slice(&rng.next_u64().to_le_bytes());
                    }
                    mem.write_at(i * PAGE_SIZE, &page);
                }
            }
        }
        // Pages just written may not be on an LRU list yet, which the
        // kernel answers with EAGAIN: retried, as every collapse is.
        let collapsed = huge
            && crate::inject::collapse_retried(|| mem.madvise(0, mem.len(), mem::MADV_COLLAPSE))
                .is_ok();
        Ok(Layout { mem, collapsed })
    }

    /// What it holds.
    pub fn truth(&self) -> LayoutTruth {
        let n = self.mem.pages();
        let regions = self.mem.len() / crate::HUGE_PAGE_SIZE;
        LayoutTruth {
            addr: self.mem.addr(),
            len: self.mem.len() as u64,
            collapsed: self.collapsed,
            pages: n as u64,
            zero_pages: (0..n).filter(|i| i % 10 < 3).count() as u64,
            duplicate_pages: (0..n).filter(|i| matches!(i % 10, 3 | 4)).count() as u64,
            groups: n.div_ceil(40) as u64,
            hot: (0..regions)
                .filter(|r| r % 10 == 0)
                .map(|r| self.mem.addr() + (r * crate::HUGE_PAGE_SIZE) as u64)
                .collect(),
        }
    }

    /// Reads one byte of every page of every hot region (contents unchanged).
    pub fn touch_hot(&self) -> u64 {
        let mut sum = 0u64;
        let regions = self.mem.len() / crate::HUGE_PAGE_SIZE;
        for r in (0..regions).filter(|r| r % 10 == 0) {
            for p in 0..crate::HUGE_PAGE_SIZE / PAGE_SIZE {
                sum += self
                    .mem
                    .read_byte(r * crate::HUGE_PAGE_SIZE + p * PAGE_SIZE + 7)
                    as u64;
            }
        }
        sum
    }
}
