//! The inspector against a known layout: 16 huge pages' worth of memory in
//! which, page by page, 30 % are zero-filled, 20 % repeat in groups of 8
//! identical pages, and the rest are unique. Every count must be exact.

use pagewise::inspect::{inspect, Options};
use pagewise::PAGE_SIZE;

#[test]
fn known_layout_counted_exactly() {
    let p = pagewise::probe::get();
    if !p.pagemap_scan {
        pagewise_testkit::skip!("{}", p.why("pagemap_scan"));
        return;
    }
    const HUGE: usize = 16;
    let layout = pagewise::workload::Layout::build(HUGE, 0x5eed).unwrap();
    let t = layout.truth();
    let mem = &layout.mem;
    let collapsed = layout.collapsed;
    let me = std::process::id() as i32;
    let opts = Options {
        bloom_sample: false,
    };
    let rep = inspect(&[me], opts, &mut |_, _| {}).unwrap();
    let mine: Vec<_> = rep
        .regions
        .iter()
        .filter(|r| r.start >= mem.addr() && r.start < mem.addr() + mem.len() as u64)
        .collect();
    assert_eq!(mine.len(), HUGE, "one report per 2 MiB region");
    let sum =
        |f: fn(&pagewise::inspect::RegionReport) -> u64| mine.iter().map(|r| f(r)).sum::<u64>();
    let (n, zeros, dups, groups) = (t.pages, t.zero_pages, t.duplicate_pages, t.groups);
    assert_eq!(sum(|r| r.resident_pages), n);
    assert_eq!(sum(|r| r.zero_pages), zeros);
    assert_eq!(sum(|r| r.duplicate_pages), dups);
    for r in &mine {
        assert!((r.repetition_rate - 0.2).abs() < 0.01, "{r:?}");
    }
    if collapsed {
        assert_eq!(sum(|r| r.huge_pages), n, "all collapsed");
        assert_eq!(sum(|r| r.bloat_pages), zeros);
    } else {
        pagewise_testkit::not_happened!("huge-page part: MADV_COLLAPSE unavailable or refused");
    }
    // The summary counts these pages too (and the rest of this process).
    assert!(rep.zero_bytes >= zeros * PAGE_SIZE as u64);
    assert!(rep.duplicate_bytes >= (dups - groups) * PAGE_SIZE as u64);
    assert!(rep.rss_bytes >= n * PAGE_SIZE as u64);
    if collapsed {
        assert!(rep.thp_bytes >= n * PAGE_SIZE as u64);
        assert!(rep.bloat_bytes >= zeros * PAGE_SIZE as u64);
    }
    // The counting Bloom filter never misses a duplicate, and its false
    // positives stay few: each region's rate within 3 points of 0.2.
    for r in &mine {
        assert!(r.bloom_repetition_rate >= r.repetition_rate, "{r:?}");
        assert!(r.bloom_repetition_rate - r.repetition_rate < 0.03, "{r:?}");
    }
    let b = &rep.bloom;
    assert_eq!(b.hashes, 3);
    assert_eq!(b.entries, 8 * rep.pages_read);
    assert!(b.duplicate_pages >= b.exact_duplicate_pages);
    assert!(b.relative_error.unwrap() < 0.1, "{b:?}");
    eprintln!("bloom: {b:?}");
    // Sampling a quarter of the pages estimates each region's rate from
    // 128 lookups: within 0.1 of the exact 0.2.
    let sampled = inspect(&[me], Options { bloom_sample: true }, &mut |_, _| {}).unwrap();
    assert_eq!(sampled.bloom.sample_percent, 25);
    for r in sampled
        .regions
        .iter()
        .filter(|r| r.start >= mem.addr() && r.start < mem.addr() + mem.len() as u64)
    {
        assert!((r.bloom_repetition_rate - 0.2).abs() < 0.1, "sampled {r:?}");
    }
    eprintln!("bloom, 25 % sampled: {:?}", sampled.bloom);
}
