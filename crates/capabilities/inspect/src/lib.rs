//! What a process's memory holds, per mapping and per 2 MiB region: the
//! ground HawkEye and SmartMD decide on.
//!
//! For each process: every mapping's resident, swapped and huge-page-mapped
//! pages (`PAGEMAP_SCAN` categories); for anonymous memory also the contents
//! of every resident page, read once (`process_vm_readv`): zero-filled pages
//! inside huge pages (HawkEye's bloat) and outside them, and pages whose
//! contents another page also has, within a process and across the
//! processes given (exact, by 128-bit digest). A 2 MiB region's
//! repetition rate (SmartMD) is the share of its resident pages whose
//! contents occur elsewhere too.
//!
//! Definitions of the summary:
//! - `rss_bytes`: resident pages (anonymous and file), not counting pages
//!   mapped to the shared zero page;
//! - `thp_bytes`: anonymous resident bytes mapped by PMD huge pages;
//! - `bloat_bytes`: zero-filled base pages inside those huge pages;
//! - `zero_bytes`: every zero-filled resident anonymous base page;
//! - `duplicate_bytes`: what merging identical non-zero anonymous pages
//!   would free (each group of n identical pages frees n − 1).
//!
//! Beside the exact count, SmartMD's counting Bloom filter ([`pagewise_mech::bloom`])
//! labels the same pages from 3 bytes per page; [`BloomReport`] gives its
//! labels against the exact ones. With sampling, as SmartMD does for huge
//! pages it has checked before, only every 4th base page of a region is
//! looked up and the region's rate is estimated from those.

#![forbid(unsafe_code)]

#[macro_use]
extern crate pagewise_mech;

use pagewise_mech::procfs;
use pagewise_mech::remote;
use pagewise_mech::walk::PageWalker;
use pagewise_mech::{Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::pagemap::{category as cat, PageRegion};
use serde::Serialize;
use std::collections::HashMap;

/// One 2 MiB-aligned region (or the part of it a mapping covers).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RegionReport {
    /// Process.
    pub pid: i32,
    /// Start (2 MiB-aligned unless the mapping starts inside it).
    pub start: u64,
    /// Length covered by the mapping.
    pub len: u64,
    /// The mapping's path (empty for anonymous memory).
    pub path: String,
    /// Anonymous (private, not file-backed).
    pub anon: bool,
    /// Resident base pages.
    pub resident_pages: u64,
    /// Of them, anonymous pages: those of an anonymous mapping, and the
    /// pages of a private file mapping the process wrote (copies of its
    /// own), as the kernel counts `Anonymous:` in smaps.
    pub anon_pages: u64,
    /// Base pages mapped by a PMD huge page.
    pub huge_pages: u64,
    /// Swapped-out pages.
    pub swapped_pages: u64,
    /// Zero-filled resident pages (anonymous only).
    pub zero_pages: u64,
    /// Zero-filled pages inside huge pages.
    pub bloat_pages: u64,
    /// Resident non-zero pages whose contents another page also has.
    pub duplicate_pages: u64,
    /// `duplicate_pages / resident_pages`.
    pub repetition_rate: f64,
    /// The same rate as the counting Bloom filter estimates it.
    pub bloom_repetition_rate: f64,
    /// Distinct base pages touched in the coverage window (when measured).
    pub touched_pages: Option<u64>,
    /// Distinct base pages touched per second: the region's access
    /// coverage over the window.
    pub access_rate: Option<f64>,
    /// What promoting it to a huge page would save, ns per second: each
    /// distinct base page touched takes at least one page walk, each
    /// costing [`pagewise_mech::walk_cost::WalkCost::walk_ns`] (a lower bound; 0 when it
    /// is a huge page already).
    pub promotion_benefit_ns_per_s: Option<f64>,
    #[serde(skip)]
    bloom: BloomCount,
}

/// Pages looked up in the Bloom filter, and those it labelled duplicate.
#[derive(Debug, Clone, Copy, Default)]
struct BloomCount {
    looked_up: u64,
    labelled: u64,
}

/// How to inspect.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct Options {
    /// Look up only every 4th base page of a region in the Bloom filter
    /// (SmartMD's 25 % sampling) and estimate from those.
    pub bloom_sample: bool,
}

setters!(Options { bloom_sample: bool });

/// SmartMD's counting Bloom filter against the exact count.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct BloomReport {
    /// Counters (8 per page read).
    pub entries: u64,
    /// Bits per counter.
    pub counter_bits: u32,
    /// Hash functions.
    pub hashes: u32,
    /// The counters' memory packed at 3 bits, bytes.
    pub memory_bytes: u64,
    /// Percentage of base pages looked up (100, or 25 when sampling).
    pub sample_percent: u32,
    /// Non-zero pages the filter labels duplicate (estimated from the
    /// sample when sampling).
    pub duplicate_pages: u64,
    /// Non-zero pages that have a duplicate, counted exactly.
    pub exact_duplicate_pages: u64,
    /// `(duplicate_pages − exact) / exact`: 0 when both are 0, `None`
    /// when only the exact count is 0.
    pub relative_error: Option<f64>,
    /// Largest difference of one region's repetition rate from the exact
    /// rate.
    pub max_region_rate_error: f64,
}

/// The whole inspection.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Report {
    /// The processes inspected.
    pub pids: Vec<i32>,
    /// Resident bytes.
    pub rss_bytes: u64,
    /// Resident anonymous bytes.
    pub anon_bytes: u64,
    /// Resident file-backed bytes.
    pub file_bytes: u64,
    /// Swapped-out bytes.
    pub swapped_bytes: u64,
    /// Anonymous bytes mapped by PMD huge pages.
    pub thp_bytes: u64,
    /// Zero-filled base pages inside huge pages, bytes.
    pub bloat_bytes: u64,
    /// Zero-filled resident anonymous base pages, bytes.
    pub zero_bytes: u64,
    /// Bytes merging identical non-zero anonymous pages would free.
    pub duplicate_bytes: u64,
    /// Of those, between pages of different processes.
    pub cross_process_duplicate_bytes: u64,
    /// Anonymous pages whose contents were read.
    pub pages_read: u64,
    /// What KSM merges now, bytes (`ksm_merging_pages` of every process;
    /// `None` where the kernel has no `ksm_stat`): against
    /// `duplicate_bytes` + `zero_bytes`, what it would save.
    pub ksm_merging_bytes: Option<u64>,
    /// SmartMD's counting Bloom filter against the exact count.
    pub bloom: BloomReport,
    /// Access coverage, or why there is none.
    pub coverage: CoverageSummary,
    /// The machine's page-walk cost, when regions were ranked by it.
    pub walk_cost: Option<pagewise_mech::walk_cost::WalkCost>,
    /// Every 2 MiB region holding memory.
    pub regions: Vec<RegionReport>,
}

/// How access coverage was measured ([`pagewise_mech::access`]).
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct CoverageSummary {
    /// How (`None`: not measured, see `unavailable`).
    pub method: Option<pagewise_mech::access::Method>,
    /// Why it was not measured.
    pub unavailable: Option<String>,
    /// The window, ms (the longest of the processes').
    pub window_ms: f64,
    /// Distinct bytes touched in the window.
    pub touched_bytes: u64,
    /// Bytes watched (the memory the method could see).
    pub watched_bytes: u64,
}

impl Report {
    /// Adds coverage measured by `method` to the regions it covers.
    pub fn add_coverage(
        &mut self,
        method: pagewise_mech::access::Method,
        cov: &[pagewise_mech::access::CoverageReport],
    ) {
        let mask = !(HUGE_PAGE_SIZE as u64 - 1);
        let mut at: HashMap<(i32, u64), usize> = HashMap::new();
        for (i, r) in self.regions.iter().enumerate() {
            at.entry((r.pid, r.start & mask)).or_insert(i);
        }
        let c = &mut self.coverage;
        c.method = Some(method);
        c.unavailable = None;
        for rep in cov {
            let secs = rep.window_ns as f64 / 1e9;
            c.window_ms = c.window_ms.max(rep.window_ns as f64 / 1e6);
            for &[start, watched, _, touched] in &rep.regions {
                c.watched_bytes += watched * PAGE_SIZE as u64;
                c.touched_bytes += touched * PAGE_SIZE as u64;
                if let Some(&i) = at.get(&(rep.pid, start)) {
                    let r = &mut self.regions[i];
                    let t = r.touched_pages.unwrap_or(0) + touched;
                    r.touched_pages = Some(t);
                    r.access_rate = Some(t as f64 / secs.max(1e-9));
                }
            }
        }
    }

    /// Says why coverage was not measured.
    pub fn no_coverage(&mut self, why: String) {
        self.coverage = CoverageSummary {
            unavailable: Some(why),
            ..CoverageSummary::default()
        };
    }

    /// Sets each region's promotion benefit from the machine's walk cost.
    pub fn rank_promotion(&mut self, cost: &pagewise_mech::walk_cost::WalkCost) {
        let Some(walk) = cost.walk_ns else { return };
        for r in &mut self.regions {
            if let Some(rate) = r.access_rate {
                let small = r.resident_pages.saturating_sub(r.huge_pages) as f64
                    / r.resident_pages.max(1) as f64;
                r.promotion_benefit_ns_per_s = Some(rate * walk * small);
            }
        }
    }

    /// The `n` regions touching the most distinct pages per second.
    pub fn hottest(&self, n: usize) -> Vec<&RegionReport> {
        let mut v: Vec<&RegionReport> = self
            .regions
            .iter()
            .filter(|r| r.access_rate.is_some_and(|a| a > 0.0))
            .collect();
        v.sort_by(|a, b| {
            b.access_rate
                .unwrap_or(0.0)
                .total_cmp(&a.access_rate.unwrap_or(0.0))
        });
        v.truncate(n);
        v
    }

    /// The `n` regions promotion would help most.
    pub fn promote_first(&self, n: usize) -> Vec<&RegionReport> {
        let mut v: Vec<&RegionReport> = self
            .regions
            .iter()
            .filter(|r| r.promotion_benefit_ns_per_s.is_some_and(|b| b > 0.0))
            .collect();
        v.sort_by(|a, b| {
            let k = |r: &RegionReport| r.promotion_benefit_ns_per_s.unwrap_or(0.0);
            k(b).total_cmp(&k(a))
        });
        v.truncate(n);
        v
    }
}

/// Inspects `pids`; `progress(done, total)` is called as pages are read.
pub fn inspect(pids: &[i32], opts: Options, progress: &mut dyn FnMut(u64, u64)) -> Result<Report> {
    // Each process once, whatever the caller listed.
    let mut unique: Vec<i32> = Vec::with_capacity(pids.len());
    for &p in pids {
        procfs::check_target(p)?;
        if !unique.contains(&p) {
            unique.push(p);
        }
    }
    let pids = &unique[..];
    let mut out = Report::empty(pids, &opts);
    let mut found = Found::default();
    for &pid in pids {
        found.walk(pid)?;
    }
    let mut pages = found.read(&opts, progress)?;
    let mut all = found.regions;
    out.pages_read = found.done;
    out.label(&pages, &mut all);
    out.count_duplicates(&mut pages, &mut all);
    out.sum_regions(&mut all);
    for &pid in pids {
        if let Some(k) = procfs::ksm_stat(pid) {
            *out.ksm_merging_bytes.get_or_insert(0) += k.merging_pages * PAGE_SIZE as u64;
        }
    }
    out.regions = all
        .into_iter()
        .filter(|r| r.resident_pages + r.swapped_pages > 0)
        .collect();
    Ok(out)
}

/// The digest of a non-zero anonymous page read, its region's index, and
/// whether it is in the Bloom filter's sample.
type PageSeen = (pagewise_mech::hash::PageDigest, u32, bool);

/// What the walk of the processes found: a report per 2 MiB piece of each
/// mapping, and the runs of resident anonymous pages to read.
#[derive(Default)]
struct Found {
    regions: Vec<RegionReport>,
    /// `(pid, region index, start, end, huge)`.
    plans: Vec<(i32, usize, u64, u64, bool)>,
    /// Pages to read in all.
    total: u64,
    /// Pages read so far.
    done: u64,
}

impl Found {
    /// Walks the page tables of every readable mapping of `pid`.
    fn walk(&mut self, pid: i32) -> Result<()> {
        let maps = procfs::maps(Some(pid))?;
        // Mappings the program serves the faults of itself (its own
        // userfaultfd, not pagewise's shim's): counted from the page
        // tables, never read, since a read that faults there is an event
        // its handler does not expect.
        let served = procfs::self_served(pid).unwrap_or_default();
        let mut walker = PageWalker::new(Some(pid))?;
        let mut runs = Vec::new();
        for m in maps
            .iter()
            .filter(|m| m.read && !m.is_special() && !m.is_staging())
        {
            let Ok(r) = Region::new(m.start, m.len()) else {
                continue;
            };
            walker.categories(
                r,
                cat::PRESENT | cat::SWAPPED,
                cat::PRESENT | cat::SWAPPED | cat::HUGE | cat::PFNZERO | cat::FILE,
                &mut runs,
            )?;
            let mut a = m.start;
            while a < m.end {
                let next = ((a / HUGE_PAGE_SIZE as u64) + 1) * HUGE_PAGE_SIZE as u64;
                let e = next.min(m.end);
                let read = !served.iter().any(|&(s, t)| s < m.end && m.start < t);
                self.count(pid, m, a, e, &runs, read);
                a = e;
            }
        }
        Ok(())
    }

    /// Counts the pages of `[a, e)` of mapping `m` (inside one 2 MiB
    /// region) from the page-table `runs`, and plans the reading of its
    /// resident anonymous pages.
    fn count(
        &mut self,
        pid: i32,
        m: &procfs::Mapping,
        a: u64,
        e: u64,
        runs: &[PageRegion],
        read: bool,
    ) {
        let ri = self.regions.len();
        let anon = m.is_anonymous();
        let mut rep = RegionReport {
            pid,
            start: a,
            len: e - a,
            path: m.path.clone(),
            anon,
            resident_pages: 0,
            anon_pages: 0,
            huge_pages: 0,
            swapped_pages: 0,
            zero_pages: 0,
            bloat_pages: 0,
            duplicate_pages: 0,
            repetition_rate: 0.0,
            bloom_repetition_rate: 0.0,
            touched_pages: None,
            access_rate: None,
            promotion_benefit_ns_per_s: None,
            bloom: BloomCount::default(),
        };
        for pr in runs.iter().filter(|p| p.start < e && a < p.end) {
            let (s, t) = (pr.start.max(a), pr.end.min(e));
            let n = (t - s) / PAGE_SIZE as u64;
            if pr.categories & cat::SWAPPED != 0 {
                rep.swapped_pages += n;
                continue;
            }
            if pr.categories & cat::PFNZERO != 0 {
                // The shared zero page: reads as zeros, holds no memory.
                continue;
            }
            rep.resident_pages += n;
            if pr.categories & cat::FILE == 0 {
                rep.anon_pages += n;
            }
            let huge = pr.categories & cat::HUGE != 0;
            if huge {
                rep.huge_pages += n;
            }
            if anon && read {
                self.plans.push((pid, ri, s, t, huge));
                self.total += n;
            }
        }
        self.regions.push(rep);
    }

    /// Reads every resident anonymous page once: zero pages are counted
    /// (and bloat, in a huge page), the others' digests returned.
    fn read(
        &mut self,
        opts: &Options,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Vec<PageSeen>> {
        // A base page is looked up in the filter when it is in the sample.
        let sampled = |addr: u64| !opts.bloom_sample || (addr / PAGE_SIZE as u64).is_multiple_of(4);
        let mut pages = Vec::new();
        let mut buf = vec![0u8; 256 * PAGE_SIZE];
        for &(pid, ri, s, t, huge) in &self.plans {
            let mut a = s;
            while a < t {
                let len = ((t - a) as usize).min(buf.len());
                // Pages unmapped meanwhile read as zeros.
                remote::read(pid, a, &mut buf[..len])?;
                for (k, page) in buf[..len].chunks_exact(PAGE_SIZE).enumerate() {
                    let rep = &mut self.regions[ri];
                    let look = sampled(a + (k * PAGE_SIZE) as u64);
                    if look {
                        rep.bloom.looked_up += 1;
                    }
                    if page == pagewise_mech::hash::ZERO_PAGE {
                        rep.zero_pages += 1;
                        if huge {
                            rep.bloat_pages += 1;
                        }
                    } else {
                        pages.push((pagewise_mech::hash::page_digest(page), ri as u32, look));
                    }
                }
                self.done += (len / PAGE_SIZE) as u64;
                progress(self.done, self.total);
                a += len as u64;
            }
        }
        Ok(pages)
    }
}

impl Report {
    /// A report of `pids` with nothing counted yet.
    fn empty(pids: &[i32], opts: &Options) -> Report {
        Report {
            pids: pids.to_vec(),
            rss_bytes: 0,
            anon_bytes: 0,
            file_bytes: 0,
            swapped_bytes: 0,
            thp_bytes: 0,
            bloat_bytes: 0,
            zero_bytes: 0,
            duplicate_bytes: 0,
            cross_process_duplicate_bytes: 0,
            pages_read: 0,
            ksm_merging_bytes: None,
            bloom: BloomReport {
                entries: 0,
                counter_bits: pagewise_mech::bloom::COUNTER_BITS,
                hashes: pagewise_mech::bloom::HASHES as u32,
                memory_bytes: 0,
                sample_percent: if opts.bloom_sample { 25 } else { 100 },
                duplicate_pages: 0,
                exact_duplicate_pages: 0,
                relative_error: Some(0.0),
                max_region_rate_error: 0.0,
            },
            coverage: CoverageSummary::default(),
            walk_cost: None,
            regions: Vec::new(),
        }
    }

    /// SmartMD's counting Bloom filter, sized for every page read: every
    /// non-zero page is counted in, then the sample is looked up.
    fn label(&mut self, pages: &[PageSeen], all: &mut [RegionReport]) {
        let mut bloom = pagewise_mech::bloom::CountingBloom::for_pages(self.pages_read as usize);
        for p in pages {
            bloom.insert(p.0);
        }
        for p in pages.iter().filter(|p| p.2) {
            if bloom.probably_duplicate(p.0) {
                all[p.1 as usize].bloom.labelled += 1;
            }
        }
        self.bloom.entries = bloom.entries() as u64;
        self.bloom.memory_bytes = bloom.packed_bytes();
    }

    /// Duplicates: identical digests grouped; merging within each process
    /// first, what is left is shared across processes.
    fn count_duplicates(&mut self, pages: &mut [PageSeen], all: &mut [RegionReport]) {
        pages.sort_unstable_by_key(|p| p.0);
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j].0 == pages[i].0 {
                j += 1;
            }
            if j - i > 1 {
                self.duplicate_bytes += ((j - i - 1) * PAGE_SIZE) as u64;
                let mut per_pid: HashMap<i32, u64> = HashMap::new();
                for p in &pages[i..j] {
                    all[p.1 as usize].duplicate_pages += 1;
                    *per_pid.entry(all[p.1 as usize].pid).or_default() += 1;
                }
                self.cross_process_duplicate_bytes += ((per_pid.len() - 1) * PAGE_SIZE) as u64;
            }
            i = j;
        }
    }

    /// The totals over every region, their rates, and the filter's error.
    fn sum_regions(&mut self, all: &mut [RegionReport]) {
        let b = PAGE_SIZE as u64;
        for r in all.iter_mut() {
            self.rss_bytes += r.resident_pages * b;
            self.anon_bytes += r.anon_pages * b;
            self.file_bytes += (r.resident_pages - r.anon_pages) * b;
            if r.anon {
                self.thp_bytes += r.huge_pages * b;
            }
            self.swapped_bytes += r.swapped_pages * b;
            self.bloat_bytes += r.bloat_pages * b;
            self.zero_bytes += r.zero_pages * b;
            if r.resident_pages > 0 {
                r.repetition_rate = r.duplicate_pages as f64 / r.resident_pages as f64;
            }
            if r.bloom.looked_up > 0 {
                r.bloom_repetition_rate = r.bloom.labelled as f64 / r.bloom.looked_up as f64;
                // Scaled from the sample to the region's non-zero pages read.
                self.bloom.duplicate_pages += (r.bloom_repetition_rate * r.resident_pages as f64)
                    .round()
                    .min((r.resident_pages - r.zero_pages) as f64)
                    as u64;
                self.bloom.max_region_rate_error = self
                    .bloom
                    .max_region_rate_error
                    .max((r.bloom_repetition_rate - r.repetition_rate).abs());
            }
            if r.anon {
                self.bloom.exact_duplicate_pages += r.duplicate_pages;
            }
        }
        let (b, e) = (self.bloom.duplicate_pages, self.bloom.exact_duplicate_pages);
        self.bloom.relative_error = match (b, e) {
            (0, 0) => Some(0.0),
            (_, 0) => None,
            _ => Some((b as f64 - e as f64) / e as f64),
        };
    }
}
