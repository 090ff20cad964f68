//! The repetition rate of each region (see the module docs): the pages due
//! this step are read and fingerprinted, then SmartMD's counting Bloom
//! filter labels every page whose digest is kept.

use super::{Action, Agent, FilterReport, RegionState, PAGES, REFRESH_LANES};
use pagewise_mech::bloom::CountingBloom;
use pagewise_mech::hash::{page_digest, zero_page_digest, PageDigest};
use pagewise_mech::walk::PageWalker;
use pagewise_mech::{Region, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::pagemap::{category, PageRegion};
use std::collections::{BTreeSet, HashMap};

/// Reads the regions of one process (with the step's buffers).
struct Reader<'a> {
    pid: i32,
    walker: &'a mut PageWalker,
    present: &'a mut Vec<PageRegion>,
    buf: &'a mut [u8],
    /// The step's number: which lane of pages is read again.
    scan: u64,
    /// Read only a lane of the pages of a region known unchanged.
    sample: bool,
    /// The regions written since the last step, where writes are watched.
    written: Option<&'a BTreeSet<u64>>,
}

impl Agent {
    /// Reads the pages due (see the module), then labels every resident
    /// page of every watched process with the counting Bloom filter.
    /// Regions at least `hot_min` are not read: hot, they are kept
    /// whatever their rate, and are read in full once they cool down.
    pub(super) fn repetition(
        &mut self,
        written: &HashMap<i32, BTreeSet<u64>>,
        hot_min: u8,
        actions: &mut Vec<Action>,
    ) -> FilterReport {
        let mut rep = FilterReport::default();
        let (scan, sample) = (self.scan, self.opts.sample);
        let mut buf = vec![0u8; HUGE_PAGE_SIZE];
        let mut present = Vec::new();
        for t in self.targets.live_mut() {
            let pid = t.pid;
            let (walker, state) = match t.walker_and_state() {
                Ok(w) => w,
                Err(e) => {
                    actions.push(Action::Failed {
                        pid,
                        what: "reading its page map".into(),
                        why: e.to_string(),
                    });
                    continue;
                }
            };
            let mut reader = Reader {
                pid,
                walker,
                present: &mut present,
                buf: &mut buf,
                scan,
                sample,
                written: written.get(&pid),
            };
            for (&start, s) in state.regions.iter_mut() {
                // A region made mergeable is not read again: its rate no
                // longer decides anything, and a read by process_vm_readv
                // pins the pages, which unshares a page KSM merged.
                if s.mergeable {
                    continue;
                }
                if reader.written.is_some() && s.freq >= hot_min {
                    s.read = false;
                    continue;
                }
                rep.pages_read += reader.read(start, s).unwrap_or(0);
            }
        }
        self.label(&mut rep);
        rep
    }

    /// Labels every page whose digest is kept with the counting Bloom
    /// filter over all of them (and, with [`super::Options::exact`],
    /// counts exactly beside it), and sets each region's rate.
    fn label(&mut self, rep: &mut FilterReport) {
        let zero = zero_page_digest();
        let digests = || {
            self.targets
                .live()
                .flat_map(|t| t.state.regions.values())
                .flat_map(|s| s.digests.iter().flatten())
                .filter(|&&d| d != zero)
        };
        let n = digests().count();
        let mut bloom = CountingBloom::for_pages(n);
        for &d in digests() {
            bloom.insert(d);
        }
        rep.filter_bytes = bloom.packed_bytes();
        let counts: Option<HashMap<PageDigest, u32>> = self.opts.exact.then(|| {
            let mut m = HashMap::with_capacity(n);
            for &d in digests() {
                *m.entry(d).or_insert(0) += 1;
            }
            m
        });
        let (mut exact, mut fp) = (0u64, 0u64);
        for t in self.targets.live_mut() {
            for s in t.state.regions.values_mut() {
                let (mut resident, mut dup) = (0u64, 0u64);
                for d in s.digests.iter().flatten() {
                    resident += 1;
                    if *d == zero {
                        dup += 1;
                        continue;
                    }
                    rep.looked_up += 1;
                    let labelled = bloom.probably_duplicate(*d);
                    if labelled {
                        dup += 1;
                        rep.labelled += 1;
                    }
                    if let Some(c) = &counts {
                        let real = c.get(d).copied().unwrap_or(0) >= 2;
                        exact += u64::from(real);
                        fp += u64::from(labelled && !real);
                    }
                }
                s.rate = (resident > 0).then(|| dup as f64 / resident as f64);
            }
        }
        if counts.is_some() {
            rep.exact = Some(exact);
            rep.false_positive_rate = Some(fp as f64 / rep.looked_up.max(1) as f64);
        }
    }
}

impl Reader<'_> {
    /// Which pages of region `start` are in memory and which swapped out.
    /// Only pages in memory are read: reading a swapped page would bring
    /// it back. A swapped page keeps its digest.
    fn where_pages(&mut self, start: u64) -> Option<([bool; PAGES], [bool; PAGES])> {
        let r = Region {
            start,
            len: HUGE_PAGE_SIZE as u64,
        };
        let both = category::PRESENT | category::SWAPPED;
        self.walker.categories(r, both, both, self.present).ok()?;
        let (mut resident, mut swapped) = ([false; PAGES], [false; PAGES]);
        for run in self.present.iter() {
            let (from, to) = (
                (run.start - start) as usize / PAGE_SIZE,
                (run.end - start) as usize / PAGE_SIZE,
            );
            let to_set = if run.categories & category::PRESENT != 0 {
                &mut resident
            } else {
                &mut swapped
            };
            to_set[from..to].iter_mut().for_each(|r| *r = true);
        }
        Some((resident, swapped))
    }

    /// Reads the pages of region `start` due this step and keeps their
    /// digests in `s`; how many were read (`None`: the region could not be
    /// read, and keeps what it had).
    fn read(&mut self, start: u64, s: &mut RegionState) -> Option<u64> {
        let (resident, swapped) = self.where_pages(start)?;
        // A region written since its last read is read whole. One not
        // written is known unchanged where writes are watched: one page in
        // REFRESH_LANES is read again per step, for a write no fault
        // reports (a device's). Where they are not, a quarter is, as
        // SmartMD reads the pages it cannot tell unchanged.
        let w = self.written;
        let full = !self.sample || !s.read || w.is_some_and(|w| w.contains(&start));
        let lanes = if w.is_some() { REFRESH_LANES } else { 4 };
        let lane = (self.scan % lanes as u64) as usize;
        // A page in memory with no digest is new (populated without a
        // write fault) or back from swap: read it too.
        let wanted: Vec<usize> = (0..PAGES)
            .filter(|&p| resident[p] && (full || p % lanes == lane || s.digests[p].is_none()))
            .collect();
        let ok = if wanted.len() == PAGES {
            pagewise_mech::remote::read(self.pid, start, self.buf).is_ok()
        } else {
            let mut parts: Vec<(u64, &mut [u8])> = self
                .buf
                .chunks_exact_mut(PAGE_SIZE)
                .enumerate()
                .filter(|(p, _)| wanted.binary_search(p).is_ok())
                .map(|(p, b)| (start + (p * PAGE_SIZE) as u64, b))
                .collect();
            pagewise_mech::remote::read_many(self.pid, &mut parts).is_ok()
        };
        if !ok {
            return None;
        }
        for (p, d) in s.digests.iter_mut().enumerate() {
            if !resident[p] && !swapped[p] {
                *d = None;
            }
        }
        for &p in &wanted {
            s.digests[p] = Some(page_digest(&self.buf[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]));
        }
        s.read = true;
        Some(wanted.len() as u64)
    }
}
