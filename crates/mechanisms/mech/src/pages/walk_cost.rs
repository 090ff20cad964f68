//! What a TLB miss costs on this machine, measured without hardware
//! counters: dependent random loads over 4 KiB pages and over huge pages
//! ([`calibrate_walk_cost`]). The inspector combines it with access coverage
//! to rank regions by the benefit of promoting them to huge pages.

use crate::anon::{AnonMemory, Rng};
use crate::{Error, Result, HUGE_PAGE_SIZE};
use pagewise_sys::mem;
use serde::Serialize;
use std::io::Read;
use std::time::Instant;

/// What a random memory access costs over 4 KiB pages and over huge pages.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct WalkCost {
    /// Size of the buffer accessed.
    pub bytes: u64,
    /// Dependent random 8-byte loads timed per page size (the median of 5
    /// runs, the two sizes in turn).
    pub accesses: u64,
    /// ns per access over 4 KiB pages.
    pub ns_per_access_4k: f64,
    /// ns per access over 2 MiB pages (`None` when no huge page could be
    /// made: THP disabled, or `MADV_COLLAPSE` refused).
    pub ns_per_access_2m: Option<f64>,
    /// The difference: what a TLB miss's page walk adds to an access that
    /// misses the caches anyway (at least 0).
    pub walk_ns: Option<f64>,
    /// Data-TLB read misses per access over 4 KiB and 2 MiB pages, where
    /// the machine has hardware counters.
    pub dtlb_misses_per_access_4k: Option<f64>,
    /// As above, 2 MiB pages.
    pub dtlb_misses_per_access_2m: Option<f64>,
    /// Where the miss counts come from, or why there are none.
    pub counters: String,
}

/// Dependent random loads over `mem`; returns (ns per access, dTLB misses
/// per access when counted).
fn chase(mem: &AnonMemory, accesses: u64, counter: Option<&std::fs::File>) -> (f64, Option<f64>) {
    let words = (mem.len() / 8) as u64;
    let mut rng = Rng::new(0x7a1c);
    let mut v = 0u64;
    let read = |c: Option<&std::fs::File>| {
        c.and_then(|mut f| {
            let mut b = [0u8; 8];
            f.read_exact(&mut b).ok().map(|_| u64::from_ne_bytes(b))
        })
    };
    let m0 = read(counter);
    let t = Instant::now();
    for _ in 0..accesses {
        // Each address depends on the value loaded before: no overlap.
        let i = (rng.next_u64() ^ (v & 1)) % words;
        v = mem.read_word(i as usize);
    }
    let ns = t.elapsed().as_nanos() as f64 / accesses as f64;
    let m1 = read(counter);
    std::hint::black_box(v);
    let misses = match (m0, m1) {
        (Some(a), Some(b)) => Some((b - a) as f64 / accesses as f64),
        _ => None,
    };
    (ns, misses)
}

/// Times `accesses` dependent random loads over `bytes` of memory mapped
/// with 4 KiB pages, then with huge pages (see [`WalkCost`]).
pub fn calibrate_walk_cost(bytes: usize, accesses: u64) -> Result<WalkCost> {
    if accesses == 0 || bytes == 0 {
        return Err(Error::NothingToMeasure);
    }
    let bytes = bytes.div_ceil(HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE;
    let p = crate::probe::get();
    let (counter, counters) = if p.perf_hw {
        match mem::perf_event_open(mem::PERF_TYPE_HW_CACHE, mem::PERF_DTLB_READ_MISSES, true) {
            Ok(fd) => (
                Some(std::fs::File::from(fd)),
                "perf dTLB-load-misses".to_string(),
            ),
            Err(e) => (None, format!("perf dTLB-load-misses: {e}")),
        }
    } else {
        (None, p.why("perf_hw_counters"))
    };
    let small = AnonMemory::new(bytes)?;
    let _ = small.madvise(0, bytes, libc::MADV_NOHUGEPAGE);
    small.write_pass(1, 1);
    let huge = AnonMemory::new(bytes)?;
    let huge_ok = huge.madvise(0, bytes, libc::MADV_HUGEPAGE).is_ok();
    huge.write_pass(1, 1);
    let collapsed = huge_ok
        && crate::inject::collapse_retried(|| huge.madvise(0, bytes, mem::MADV_COLLAPSE)).is_ok();
    // The two sizes in turn, RUNS times each, and the median of each: a
    // run that another program's burst slowed is not taken for the cost
    // (the best of three, measured one size after the other, gave 2,255
    // ns on a loaded machine).
    const RUNS: usize = 5;
    let (mut fours, mut twos) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    for _ in 0..RUNS {
        fours.push(chase(&small, accesses, counter.as_ref()));
        if collapsed {
            twos.push(chase(&huge, accesses, counter.as_ref()));
        }
    }
    let median = |v: &mut Vec<(f64, Option<f64>)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v.get(v.len() / 2).copied()
    };
    let (ns4, miss4) = median(&mut fours).expect("RUNS runs");
    let (ns2, miss2) = match median(&mut twos) {
        Some((n, m)) => (Some(n), m),
        None => (None, None),
    };
    Ok(WalkCost {
        bytes: bytes as u64,
        accesses,
        ns_per_access_4k: ns4,
        ns_per_access_2m: ns2,
        walk_ns: ns2.map(|n| (ns4 - n).max(0.0)),
        dtlb_misses_per_access_4k: miss4,
        dtlb_misses_per_access_2m: miss2,
        counters,
    })
}
