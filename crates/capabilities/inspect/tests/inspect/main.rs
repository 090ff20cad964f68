//! The inspector against a known layout: 16 huge pages' worth of memory in
//! which, page by page, 30 % are zero-filled, 20 % repeat in groups of 8
//! identical pages, and the rest are unique. Every count must be exact.

use pagewise::PAGE_SIZE;
use pagewise_inspect::{inspect, Options};

#[test]
fn known_layout_counted_exactly() {
    let p = pagewise_mech::probe::get();
    if !p.pagemap_scan {
        pagewise_testkit::skip!("{}", p.why("pagemap_scan"));
        return;
    }
    const HUGE: usize = 16;
    let layout = pagewise_mech::workload::Layout::build(HUGE, 0x5eed).unwrap();
    let t = layout.truth();
    let mem = &layout.mem;
    let collapsed = layout.collapsed;
    let me = std::process::id() as i32;
    let opts = Options::default().bloom_sample(false);
    let rep = inspect(&[me], opts, &mut |_, _| {}).unwrap();
    let mine: Vec<_> = rep
        .regions
        .iter()
        .filter(|r| r.start >= mem.addr() && r.start < mem.addr() + mem.len() as u64)
        .collect();
    assert_eq!(mine.len(), HUGE, "one report per 2 MiB region");
    let sum =
        |f: fn(&pagewise_inspect::RegionReport) -> u64| mine.iter().map(|r| f(r)).sum::<u64>();
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
        pagewise_testkit::claim_not_happened!(
            "madv_collapse",
            "huge-page part: MADV_COLLAPSE unavailable or refused"
        );
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
    let sampled = inspect(&[me], Options::default().bloom_sample(true), &mut |_, _| {}).unwrap();
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

/// Another process whose memory is fragmented past one `PAGEMAP_SCAN`
/// vector (8,192 pages written, every third one dropped: 2,731 runs): the
/// anonymous memory inspect counts is the kernel's own figure, the sum of
/// `Anonymous:` in its smaps (a walk resumed at `walk_end` counted runs
/// twice: 34.1 MiB where the kernel said 32.1).
#[test]
fn fragmented_process_counts_as_the_kernel_does() {
    let p = pagewise_mech::probe::get();
    if !p.pagemap_scan {
        pagewise_testkit::skip!("{}", p.why("pagemap_scan"));
        return;
    }
    const PAGES: usize = 8192;
    let mut fds = [0; 2];
    // SAFETY: a pipe into a local array of two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (r, w) = (fds[0], fds[1]);
    // SAFETY: the child makes system calls only (no allocation, no lock),
    // then waits to be killed.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above; its own new mapping.
        unsafe {
            let len = PAGES * PAGE_SIZE;
            let m = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            if m as *mut libc::c_void == libc::MAP_FAILED {
                libc::_exit(1);
            }
            libc::madvise(m as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE);
            for i in 0..PAGES {
                *m.add(i * PAGE_SIZE) = 1 + (i % 251) as u8;
            }
            for i in (0..PAGES).step_by(3) {
                libc::madvise(
                    m.add(i * PAGE_SIZE) as *mut libc::c_void,
                    PAGE_SIZE,
                    libc::MADV_DONTNEED,
                );
            }
            libc::write(w, b"r".as_ptr() as *const libc::c_void, 1);
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: our end of the pipe; the child's write end is closed here.
    unsafe { libc::close(w) };
    let mut b = [0u8; 1];
    // SAFETY: one byte into a local buffer.
    let n = unsafe { libc::read(r, b.as_mut_ptr() as *mut libc::c_void, 1) };
    assert_eq!(n, 1, "the child did not get ready");
    let kernel_kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("Anonymous:"))
        .filter_map(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .sum();
    let rep = inspect(
        &[pid],
        Options::default().bloom_sample(true),
        &mut |_, _| {},
    );
    // SAFETY: our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        libc::close(r);
    }
    let rep = rep.unwrap();
    assert!(
        kernel_kib * 1024 >= (PAGES - PAGES.div_ceil(3)) as u64 * PAGE_SIZE as u64,
        "the child's written pages are in smaps: {kernel_kib} KiB"
    );
    assert_eq!(
        rep.anon_bytes,
        kernel_kib * 1024,
        "inspect's anonymous bytes against smaps' Anonymous sum"
    );
}
