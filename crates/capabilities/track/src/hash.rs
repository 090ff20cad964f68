//! The `hash` backend: no faults at all. Each collection fingerprints every
//! populated page (see [`pagewise_mech::hash`]) and reports those whose fingerprint
//! changed; pages that are not populated hold zeros and are not read.
//!
//! It watches the calling process by reading memory in place, and any other
//! process (that the caller may ptrace-read) through `process_vm_readv`.
//! `PAGEMAP_SCAN`, where the kernel has it, finds the populated pages in one
//! call. A write that races the read changes the fingerprint again and is
//! reported by the next collection; the only change it cannot see is one that
//! leaves the page's bytes as they were, which no consumer of content can
//! tell apart either (and a fingerprint collision, about 2^-64 per page).

use super::{Backend, BackendKind, CollectStats, Target};
use crate::Result;
use pagewise_mech::hash::{zero_page_hash, PageHash};
use pagewise_mech::region::{push_coalesced, PageRange, Region};
use pagewise_mech::walk::PageWalker;
use pagewise_mech::PAGE_SIZE;

/// Bytes read from another process per `process_vm_readv`.
const REMOTE_CHUNK: usize = 1 << 20;

struct Watched {
    region: Region,
    hashes: Vec<PageHash>,
    /// Not yet fingerprinted: every populated page is reported at the next scan.
    unseen: bool,
}

/// Fingerprint-based tracking.
pub struct HashBackend {
    target: Target,
    walker: PageWalker,
    watched: Vec<Watched>,
    buf: Vec<u8>,
    populated: Vec<(u64, u64)>,
    fresh: Vec<PageHash>,
}

impl HashBackend {
    pub(crate) fn new(target: Target) -> Result<Self> {
        Ok(HashBackend {
            target,
            walker: PageWalker::new(target.pid())?,
            watched: Vec::new(),
            buf: match target {
                Target::SelfProcess => Vec::new(),
                Target::Pid(_) => vec![0; REMOTE_CHUNK],
            },
            populated: Vec::new(),
            fresh: Vec::new(),
        })
    }

    /// Scans one watched region, appending its changed pages to `out`.
    fn scan_watched(
        &mut self,
        wi: usize,
        out: &mut Vec<PageRange>,
        stats: &mut CollectStats,
    ) -> Result<()> {
        let zero = zero_page_hash();
        let mut fresh = std::mem::take(&mut self.fresh);
        {
            let region = self.watched[wi].region;
            self.find_populated(region)?;
            let populated = std::mem::take(&mut self.populated);
            let unseen = self.watched[wi].unseen;
            let mut cursor = region.start;
            let page = PAGE_SIZE as u64;
            for &(a, b) in populated
                .iter()
                .chain(std::iter::once(&(region.end(), region.end())))
            {
                // Unpopulated gap [cursor, a): zeros now.
                let hashes = &mut self.watched[wi].hashes;
                let mut p = cursor;
                while p < a {
                    let idx = ((p - region.start) / page) as usize;
                    if hashes[idx] != zero || unseen {
                        if hashes[idx] != zero {
                            push_coalesced(out, p, p + page);
                        }
                        hashes[idx] = zero;
                    }
                    p += page;
                }
                if a >= b {
                    cursor = b.max(cursor);
                    continue;
                }
                let n = ((b - a) / page) as usize;
                fresh.resize(n, 0);
                self.hash_range(a, b, &mut fresh)?;
                stats.pages_hashed += n as u64;
                let i0 = ((a - region.start) / page) as usize;
                let hashes = &mut self.watched[wi].hashes;
                for (k, h) in fresh.iter().enumerate() {
                    if unseen || hashes[i0 + k] != *h {
                        let addr = a + k as u64 * page;
                        push_coalesced(out, addr, addr + page);
                        hashes[i0 + k] = *h;
                    }
                }
                cursor = b;
            }
            self.populated = populated;
            self.watched[wi].unseen = false;
        }
        self.fresh = fresh;
        Ok(())
    }

    /// Fills `self.populated` with the populated (present or swapped) runs of `r`.
    fn find_populated(&mut self, r: Region) -> Result<()> {
        Ok(self.walker.populated(r, &mut self.populated)?)
    }

    /// Fingerprints pages `[a, b)` of the target into `out`.
    fn hash_range(&mut self, a: u64, b: u64, out: &mut [PageHash]) -> Result<()> {
        match self.target {
            Target::SelfProcess => {
                // SAFETY: `[a, b)` lies in a region the caller registered and keeps
                // mapped while collecting. The bytes are only read, as plain data;
                // concurrent writers may change them, which at worst yields a
                // fingerprint that differs from the final content, so the page is
                // reported again at the next collection.
                let bytes = unsafe { std::slice::from_raw_parts(a as *const u8, (b - a) as usize) };
                pagewise_mech::hash::hash_pages(bytes, out);
                Ok(())
            }
            Target::Pid(pid) => {
                let mut addr = a;
                let mut i = 0;
                while addr < b {
                    let len = ((b - addr) as usize).min(REMOTE_CHUNK);
                    // A short read means the rest was unmapped meanwhile: it reads as zeros.
                    pagewise_mech::remote::read(pid, addr, &mut self.buf[..len])?;
                    let want = len / PAGE_SIZE;
                    pagewise_mech::hash::hash_pages(&self.buf[..len], &mut out[i..i + want]);
                    i += want;
                    addr += len as u64;
                }
                Ok(())
            }
        }
    }
}

impl Backend for HashBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Hash
    }

    fn scan(&mut self, out: &mut Vec<PageRange>, stats: &mut CollectStats) -> Result<()> {
        for wi in 0..self.watched.len() {
            self.scan_watched(wi, out, stats)?;
        }
        Ok(())
    }

    fn add_region(&mut self, region: Region, baseline: bool) -> Result<()> {
        let i = self
            .watched
            .partition_point(|w| w.region.start < region.start);
        self.watched.insert(
            i,
            Watched {
                region,
                hashes: vec![zero_page_hash(); region.pages() as usize],
                unseen: true,
            },
        );
        if baseline {
            // Fingerprint now; what this first pass reports is not a write.
            self.scan_watched(i, &mut Vec::new(), &mut CollectStats::default())?;
        }
        Ok(())
    }

    fn remove_region(&mut self, region: Region) -> Result<()> {
        self.watched.retain(|w| w.region != region);
        Ok(())
    }

    fn regions(&self) -> Vec<Region> {
        self.watched.iter().map(|w| w.region).collect()
    }
}
