//! Dirty tracking against ground truth: every test keeps a shadow copy of the
//! tracked memory, copies into it only the pages a collection reports (as a
//! migrator or checkpointer would), and then requires the shadow to equal the
//! live memory byte for byte. A lost write makes them differ. Reported pages
//! whose content had not changed are counted as false positives and printed.
//!
//! Each case runs for every backend; a backend this kernel lacks is skipped
//! with the probe's reason.

use pagewise_testkit::targets as common;
mod outside;

use common::for_each_backend;
use pagewise::PAGE_SIZE;
use pagewise_mech::procfs;
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_track::{BackendKind, Collection, DirtyTracker};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const MIB: usize = 1 << 20;
/// Tests that change system-wide knobs (KSM, swap) run one at a time.
static GLOBAL_KNOBS: Mutex<()> = Mutex::new(());

struct Shadow<'a> {
    mem: &'a AnonMemory,
    copy: Vec<u8>,
    false_positives: u64,
    reported: u64,
}

impl<'a> Shadow<'a> {
    fn new(mem: &'a AnonMemory) -> Self {
        Shadow {
            mem,
            copy: mem.snapshot(),
            false_positives: 0,
            reported: 0,
        }
    }

    /// Applies a collection to the shadow; returns the false positives in it.
    fn apply(&mut self, c: &Collection) -> u64 {
        let base = self.mem.addr();
        let mut fp = 0;
        let mut page = [0u8; PAGE_SIZE];
        for r in &c.ranges {
            assert!(
                r.start >= base && r.end() <= base + self.mem.len() as u64,
                "range {r:?} outside the region"
            );
            for i in 0..r.pages {
                let off = (r.start - base) as usize + i as usize * PAGE_SIZE;
                self.mem.read_into(off, &mut page);
                if self.copy[off..off + PAGE_SIZE] == page {
                    fp += 1;
                }
                self.copy[off..off + PAGE_SIZE].copy_from_slice(&page);
            }
        }
        self.false_positives += fp;
        self.reported += c.stats.pages_dirty;
        fp
    }

    /// Tells the shadow that `[off, off+len)` was discarded (reads as zeros now).
    /// Used only where a backend cannot see a discard (see `sees_discards`).
    fn discarded(&mut self, off: usize, len: usize) {
        self.copy[off..off + len].fill(0);
    }

    /// Asserts that the shadow equals the live memory; names the first lost page.
    fn assert_equal(&self, what: &str) {
        let live = self.mem.snapshot();
        if let Some(off) = live.iter().zip(&self.copy).position(|(a, b)| a != b) {
            let page = off / PAGE_SIZE;
            let lost = (0..self.mem.pages())
                .filter(|p| {
                    live[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]
                        != self.copy[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]
                })
                .count();
            panic!("{what}: lost writes on {lost} pages, first page {page} (offset {off:#x})");
        }
    }

    fn collect_and_check(&mut self, t: &mut DirtyTracker, what: &str) -> Collection {
        let c = t.collect().expect("collect");
        self.apply(&c);
        self.assert_equal(what);
        c
    }
}

/// `MADV_DONTNEED` changes content without a write. `uffd-wp` (the zapped PTE
/// loses its marker) and `hash` (the content changed) report it; `mprotect`
/// cannot, as no fault happens: its consumers must learn of discards
/// themselves. Later writes to the zapped pages are seen by every backend.
fn sees_discards(kind: BackendKind) -> bool {
    kind != BackendKind::Mprotect
}

fn report_fp(name: &str, kind: BackendKind, s: &Shadow) {
    println!(
        "     {name} [{kind}]: {} pages reported, {} false positives",
        s.reported, s.false_positives
    );
}

#[test]
fn random_writes_are_reported_exactly() {
    for_each_backend("random_writes", &[], |kind| {
        let mem = AnonMemory::new(16 * MIB).unwrap();
        mem.write_pass(1, 1);
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        let mut rng = Rng::new(7);
        for round in 0..5u8 {
            let mut written = std::collections::BTreeSet::new();
            for _ in 0..500 {
                let p = rng.below(mem.pages() as u64) as usize;
                let off = p * PAGE_SIZE + rng.below(PAGE_SIZE as u64) as usize;
                mem.write_byte(off, mem.read_byte(off).wrapping_add(1 + round));
                written.insert(p);
            }
            let c = s.collect_and_check(&mut t, "random writes");
            let mut reported = std::collections::BTreeSet::new();
            for r in &c.ranges {
                for i in 0..r.pages {
                    reported.insert(((r.start - mem.addr()) / PAGE_SIZE as u64 + i) as usize);
                }
            }
            // Writes change content here, so every backend must be exact.
            assert!(
                written.is_subset(&reported),
                "{kind}: a written page was not reported"
            );
            assert_eq!(
                reported.len(),
                written.len(),
                "{kind}: over-reported on plain 4 KiB writes"
            );
            assert_eq!(c.stats.ranges as usize, c.ranges.len());
        }
        // Nothing written: nothing reported.
        let c = t.collect().unwrap();
        assert!(
            c.ranges.is_empty(),
            "{kind}: reported {:?} with no writes",
            c.ranges
        );
        report_fp("random_writes", kind, &s);
    });
}

#[test]
fn unpopulated_memory_first_touch_is_reported() {
    for_each_backend("first_touch", &[], |kind| {
        let mem = AnonMemory::new(8 * MIB).unwrap();
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        for p in (0..mem.pages()).step_by(3) {
            mem.write_byte(p * PAGE_SIZE + 5, 9);
        }
        s.collect_and_check(&mut t, "first touch");
        report_fp("first_touch", kind, &s);
    });
}

/// Two tracked regions that touch: a write on each side of the boundary is
/// reported as one range, and both pages must be tracked again afterwards.
#[test]
fn adjacent_regions_stay_tracked_across_the_boundary() {
    for_each_backend("adjacent_regions", &[], |kind| {
        let mem = AnonMemory::new(16 * PAGE_SIZE).unwrap();
        let whole = mem.region();
        let half = 8 * PAGE_SIZE as u64;
        let lower = pagewise::Region::new(whole.start, half).unwrap();
        let upper = pagewise::Region::new(whole.start + half, half).unwrap();
        let mut t = DirtyTracker::new(&[upper, lower], kind).unwrap();
        let page = |p: u64| pagewise::PageRange {
            start: whole.start + p * PAGE_SIZE as u64,
            pages: 1,
        };
        for round in 0..3u8 {
            mem.write_byte(7 * PAGE_SIZE, round + 1);
            mem.write_byte(8 * PAGE_SIZE, round + 1);
            let c = t.collect().unwrap();
            let want = pagewise::PageRange {
                start: page(7).start,
                pages: 2,
            };
            assert_eq!(c.ranges, vec![want], "{kind} round {round}: both sides");
            mem.write_byte(8 * PAGE_SIZE + 1, round + 1);
            assert_eq!(
                t.collect().unwrap().ranges,
                vec![page(8)],
                "{kind} round {round}: upper alone"
            );
        }
    });
}

/// A peek reports what a collection would, and leaves it for the collection.
#[test]
fn peek_leaves_writes_for_the_next_collection() {
    for_each_backend("peek", &[], |kind| {
        let mem = AnonMemory::new(64 * PAGE_SIZE).unwrap();
        mem.write_pass(1, 1);
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let page = |p: usize| pagewise::PageRange {
            start: mem.addr() + (p * PAGE_SIZE) as u64,
            pages: 1,
        };
        mem.write_byte(3 * PAGE_SIZE, 2);
        mem.write_byte(40 * PAGE_SIZE, 2);
        let Some(first) = t.peek().unwrap() else {
            println!("     peek [{kind}]: not offered (collections only)");
            return;
        };
        assert_eq!(first.ranges, vec![page(3), page(40)], "{kind}: peek");
        // Peeked pages stay written: writing them again changes nothing, a new page adds.
        mem.write_byte(3 * PAGE_SIZE + 1, 3);
        mem.write_byte(9 * PAGE_SIZE, 3);
        let second = t.peek().unwrap().unwrap();
        assert_eq!(
            second.ranges,
            vec![page(3), page(9), page(40)],
            "{kind}: second peek"
        );
        assert_eq!(
            t.collect().unwrap().ranges,
            second.ranges,
            "{kind}: collect after peeks"
        );
        assert!(
            t.collect().unwrap().ranges.is_empty(),
            "{kind}: nothing since"
        );
        assert!(
            t.peek().unwrap().unwrap().ranges.is_empty(),
            "{kind}: nothing to peek"
        );
        println!("     peek [{kind}]: exact");
    });
}

#[test]
fn consumers_do_not_steal_each_others_writes() {
    for_each_backend("two_consumers", &[], |kind| {
        let mem = AnonMemory::new(8 * MIB).unwrap();
        mem.write_pass(1, 1);
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let fast = DirtyTracker::DEFAULT;
        let slow = t.add_consumer();
        let third = t.add_consumer();
        let mut s_fast = Shadow::new(&mem);
        let mut s_slow = Shadow::new(&mem);
        let mut s_third = Shadow::new(&mem);
        let mut rng = Rng::new(42);
        for step in 1..=40u32 {
            for _ in 0..50 {
                let p = rng.below(mem.pages() as u64) as usize;
                mem.write_byte(
                    p * PAGE_SIZE + (step as usize % PAGE_SIZE),
                    step as u8 ^ p as u8 ^ 0x5a,
                );
            }
            // The fast consumer collects every step (the migrator, 100 ms)...
            let c = t.collect_for(fast).unwrap();
            s_fast.apply(&c);
            s_fast.assert_equal("fast consumer");
            // ... the slow one every 10 steps (the checkpointer, 1 s) ...
            if step % 10 == 0 {
                let c = t.collect_for(slow).unwrap();
                s_slow.apply(&c);
                s_slow.assert_equal("slow consumer");
            }
            // ... and a third at irregular times.
            if step % 7 == 3 {
                let c = t.collect_for(third).unwrap();
                s_third.apply(&c);
                s_third.assert_equal("third consumer");
            }
        }
        assert!(s_slow.reported > 0 && s_fast.reported > 0);
        t.remove_consumer(third);
        assert!(
            t.collect_for(third).is_err(),
            "a removed consumer must be refused"
        );
        report_fp("two_consumers(slow)", kind, &s_slow);
    });
}

#[test]
fn threads_writing_during_collections_lose_nothing() {
    for_each_backend("concurrent_writers", &[], |kind| {
        let mem = Arc::new(AnonMemory::new(32 * MIB).unwrap());
        mem.write_pass(1, 1);
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let mem = Arc::clone(&mem);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut rng = Rng::new(100 + w);
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let p = rng.below(mem.pages() as u64) as usize;
                        // Writers own disjoint byte lanes so the final content is well defined.
                        mem.write_byte(
                            p * PAGE_SIZE + w as usize * 8 + (n as usize % 8),
                            (n % 251) as u8 + 1,
                        );
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        for _ in 0..30 {
            let c = t.collect().unwrap();
            s.apply(&c);
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        stop.store(true, Ordering::Relaxed);
        let writes: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
        s.collect_and_check(&mut t, "after concurrent writers");
        println!(
            "     concurrent_writers [{kind}]: {writes} writes by 2 threads during 30 collections"
        );
        report_fp("concurrent_writers", kind, &s);
    });
}

#[test]
fn dontneed_then_write() {
    for_each_backend("dontneed", &[], |kind| {
        let mem = AnonMemory::new(8 * MIB).unwrap();
        mem.write_pass(PAGE_SIZE, 3);
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        // Zap 64 pages; write half of them again. The zapped-but-not-rewritten
        // ones now read as zeros: a consumer of content must be told too.
        mem.madvise(100 * PAGE_SIZE, 64 * PAGE_SIZE, libc::MADV_DONTNEED)
            .unwrap();
        if !sees_discards(kind) {
            s.discarded(100 * PAGE_SIZE, 64 * PAGE_SIZE);
        }
        for p in (100..164).step_by(2) {
            mem.write_byte(p * PAGE_SIZE + 1, 77);
        }
        s.collect_and_check(&mut t, "MADV_DONTNEED then write");
        // A whole 2 MiB-aligned block, so page tables may be freed too.
        mem.madvise(2 * MIB, 2 * MIB, libc::MADV_DONTNEED).unwrap();
        if !sees_discards(kind) {
            s.discarded(2 * MIB, 2 * MIB);
        }
        mem.write_byte(2 * MIB + 7 * PAGE_SIZE, 5);
        s.collect_and_check(&mut t, "MADV_DONTNEED of 2 MiB then write");
        mem.write_byte(2 * MIB + 9 * PAGE_SIZE, 6);
        s.collect_and_check(&mut t, "write after re-arm");
        report_fp("dontneed", kind, &s);
    });
}

#[test]
fn program_changing_protections() {
    for_each_backend("mprotect_by_program", &[BackendKind::Mprotect], |kind| {
        let mem = AnonMemory::new(4 * MIB).unwrap();
        mem.write_pass(1, 1);
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        mem.write_byte(3 * PAGE_SIZE, 8);
        // The program changes its own protections, as a program may; no
        // access happens while they are taken away.
        let protect = |at: u64, len: usize, prot: libc::c_int| {
            // SAFETY: `mem` is raw memory of this test, not accessed until
            // its protection is given back.
            unsafe { pagewise_sys::mem::mprotect(at, len, prot) }.unwrap()
        };
        protect(mem.addr(), mem.len(), libc::PROT_READ);
        protect(mem.addr(), mem.len(), libc::PROT_READ | libc::PROT_WRITE);
        mem.write_byte(10 * PAGE_SIZE, 8);
        s.collect_and_check(&mut t, "after RO/RW cycle");
        let sub = mem.addr() + 64 * PAGE_SIZE as u64;
        protect(sub, 16 * PAGE_SIZE, libc::PROT_NONE);
        protect(sub, 16 * PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE);
        mem.write_byte(70 * PAGE_SIZE, 4);
        mem.write_byte(90 * PAGE_SIZE, 4);
        s.collect_and_check(&mut t, "after PROT_NONE cycle on a subrange");
        report_fp("mprotect_by_program", kind, &s);
    });
}

fn thp_available() -> Result<(), String> {
    let p = pagewise_mech::probe::get();
    if p.thp_mode.is_empty() || p.thp_mode == "never" {
        return Err(format!("THP not enabled: {}", p.why("thp")));
    }
    if !p.madv_collapse {
        return Err(p.why("madv_collapse"));
    }
    Ok(())
}

#[test]
fn thp_collapse_and_split() {
    if let Err(why) = thp_available() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    for_each_backend("thp", &[], |kind| {
        let mem = AnonMemory::new(8 * MIB).unwrap();
        mem.madvise(0, mem.len(), libc::MADV_HUGEPAGE).unwrap();
        mem.write_pass(PAGE_SIZE, 1);
        // Collapsed before tracking starts (a range armed for tracking may
        // not be collapsed: uffd-wp and mprotect ranges are refused), so
        // that tracking meets huge pages for real.
        if let Err(e) = mem.madvise(0, mem.len(), pagewise_sys::mem::MADV_COLLAPSE) {
            pagewise_testkit::claim_not_happened!(
                "madv_collapse",
                "[{kind}] MADV_COLLAPSE of the fresh range refused: {e}"
            );
            return;
        }
        let huge = anon_huge_kib(mem.addr());
        if huge == 0 {
            pagewise_testkit::not_happened!(
                "[{kind}] MADV_COLLAPSE succeeded but no huge page backs the range"
            );
            return;
        }
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        mem.write_byte(5 * PAGE_SIZE, 2);
        mem.write_byte(600 * PAGE_SIZE, 3);
        s.collect_and_check(&mut t, "writes into huge pages");
        mem.write_byte(2 * MIB + 33 * PAGE_SIZE, 4);
        s.collect_and_check(&mut t, "a write into another huge page");
        // Split by zapping part of a huge page, then write around it.
        mem.madvise(4 * MIB + 8 * PAGE_SIZE, 4 * PAGE_SIZE, libc::MADV_DONTNEED)
            .unwrap();
        if !sees_discards(kind) {
            s.discarded(4 * MIB + 8 * PAGE_SIZE, 4 * PAGE_SIZE);
        }
        mem.write_byte(4 * MIB + 9 * PAGE_SIZE, 5);
        mem.write_byte(4 * MIB + 200 * PAGE_SIZE, 6);
        s.collect_and_check(&mut t, "after a split");
        println!(
            "     thp [{kind}]: tracked {huge} KiB of huge pages, then {} KiB after the split",
            anon_huge_kib(mem.addr())
        );
        report_fp("thp", kind, &s);
    });
}

/// `AnonHugePages` of the mapping holding `addr` in this process, KiB.
fn anon_huge_kib(addr: u64) -> u64 {
    anon_huge_kib_of(std::process::id() as i32, addr)
}

#[test]
fn fork_child_writes_are_not_the_parents() {
    for_each_backend("fork", &[], |kind| {
        let mem = AnonMemory::new(4 * MIB).unwrap();
        mem.write_pass(1, 1);
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        mem.write_byte(PAGE_SIZE, 2);
        // SAFETY: the child only writes to memory and calls _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            for p in 0..mem.pages() {
                mem.write_byte(p * PAGE_SIZE + 2, 0xEE);
            }
            // SAFETY: _exit is always safe to call.
            unsafe { libc::_exit(0) };
        }
        mem.write_byte(20 * PAGE_SIZE, 3);
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child failed: {status:#x}"
        );
        mem.write_byte(30 * PAGE_SIZE, 4);
        let c = s.collect_and_check(&mut t, "parent after fork");
        assert!(
            mem.read_byte(2) != 0xEE,
            "the child's write leaked into the parent"
        );
        println!(
            "     fork [{kind}]: {} pages reported for 3 parent writes",
            c.stats.pages_dirty
        );
        report_fp("fork", kind, &s);
    });
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while t0.elapsed().as_secs() < secs {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    println!("     {what}: not reached within {secs} s");
    false
}

#[test]
fn ksm_merging() {
    let p = pagewise_mech::probe::get();
    if !p.ksm || !p.memory_merge {
        pagewise_testkit::skip!("{} / {}", p.why("ksm"), p.why("ksm.memory_merge"));
        return;
    }
    if unsafe_geteuid() != 0 {
        pagewise_testkit::skip!("needs root to start ksmd (/sys/kernel/mm/ksm/run)");
        return;
    }
    let _g = GLOBAL_KNOBS.lock().unwrap_or_else(|e| e.into_inner());
    let _run = pagewise_mech::settings::SettingGuard::set("/sys/kernel/mm/ksm/run", "1").unwrap();
    let _sleep =
        pagewise_mech::settings::SettingGuard::set("/sys/kernel/mm/ksm/sleep_millisecs", "0")
            .unwrap();
    let _scan =
        pagewise_mech::settings::SettingGuard::set("/sys/kernel/mm/ksm/pages_to_scan", "10000")
            .unwrap();
    let merge = pagewise_sys::mem::prctl(pagewise_sys::mem::PR_GET_MEMORY_MERGE, 0).unwrap();
    pagewise_sys::mem::prctl(pagewise_sys::mem::PR_SET_MEMORY_MERGE, 1).unwrap();
    let merging = || {
        std::fs::read_to_string("/proc/self/ksm_merging_pages")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    for_each_backend("ksm", &[], |kind| {
        let mem = AnonMemory::new(4 * MIB).unwrap();
        mem.madvise(0, mem.len(), libc::MADV_MERGEABLE).unwrap();
        let before = merging();
        mem.write_pass(PAGE_SIZE, 0x42); // identical pages: KSM merges them
                                         // Merged before tracking starts, so that tracking meets KSM pages
                                         // (whose first write breaks the sharing) for real.
        if !wait_for("KSM merging", 30, || merging() >= before + 100) {
            // ksmd runs (the test set it going): a merge that did not come
            // in time is a precondition that did not happen (a loaded
            // machine), not a missing feature.
            pagewise_testkit::not_happened!(
                "[{kind}] ksmd merged fewer than 100 of 1024 identical pages within 30 s"
            );
            return;
        }
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        let merged = merging() - before;
        s.collect_and_check(&mut t, "after KSM merged (no writes)");
        for p in (0..mem.pages()).step_by(5) {
            mem.write_byte(p * PAGE_SIZE + 9, 0x43);
        }
        s.collect_and_check(&mut t, "writes to KSM pages");
        println!("     ksm [{kind}]: {merged} pages merged when tracking began");
        report_fp("ksm", kind, &s);
    });
    pagewise_sys::mem::prctl(
        pagewise_sys::mem::PR_SET_MEMORY_MERGE,
        merge as libc::c_ulong,
    )
    .unwrap();
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[test]
fn pageout_to_swap_and_back() {
    let _g = GLOBAL_KNOBS.lock().unwrap_or_else(|e| e.into_inner());
    let swap = match pagewise_mech::cgroup::ZramSwap::setup(256 << 20) {
        Ok(s) => s,
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            return;
        }
    };
    for_each_backend("pageout", &[], |kind| {
        let mem = AnonMemory::new(8 * MIB).unwrap();
        let mut rng = Rng::new(3);
        for p in 0..mem.pages() {
            mem.fill_page(p, rng.below(250) as u8 + 1);
        }
        let mut t = DirtyTracker::new(&[mem.region()], kind).unwrap();
        let mut s = Shadow::new(&mem);
        mem.write_byte(7 * PAGE_SIZE, 1);
        let out = mem.madvise(0, mem.len(), pagewise_sys::mem::MADV_PAGEOUT);
        let swapped = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| procfs::status_field(&t, "VmSwap"))
            .unwrap_or(0);
        if swapped == 0 {
            pagewise_testkit::skip!(
                "[{kind}] nothing reached swap (MADV_PAGEOUT: {:?}, VmSwap 0 kB)",
                out.map_err(|e| e.to_string())
            );
            return;
        }
        s.collect_and_check(&mut t, "after MADV_PAGEOUT");
        for p in (0..mem.pages()).step_by(11) {
            mem.write_byte(p * PAGE_SIZE + 3, 0xAB);
        }
        s.collect_and_check(&mut t, "writes to swapped pages");
        println!(
            "     pageout [{kind}]: MADV_PAGEOUT {:?}, VmSwap {swapped} kB",
            out.map_err(|e| e.to_string())
        );
        report_fp("pageout", kind, &s);
    });
    drop(swap);
}

#[test]
fn several_regions_and_bad_input() {
    for_each_backend("regions", &[], |kind| {
        let a = AnonMemory::new(2 * MIB).unwrap();
        let b = AnonMemory::new(2 * MIB).unwrap();
        a.write_pass(1, 1);
        b.write_pass(1, 1);
        let mut t = DirtyTracker::new(&[b.region(), a.region()], kind).unwrap();
        a.write_byte(PAGE_SIZE * 3, 2);
        b.write_byte(PAGE_SIZE * 4, 2);
        let c = t.collect().unwrap();
        let addrs: Vec<u64> = c.ranges.iter().map(|r| r.start).collect();
        let mut want = vec![
            a.addr() + 3 * PAGE_SIZE as u64,
            b.addr() + 4 * PAGE_SIZE as u64,
        ];
        want.sort();
        assert_eq!(addrs, want, "{kind}");
        assert!(
            c.ranges.windows(2).all(|w| w[0].end() < w[1].start),
            "ranges sorted and coalesced"
        );
        assert_eq!(c.stats.pages_scanned as usize, a.pages() + b.pages());
    });
    assert!(pagewise::Region::new(4097, 4096).is_err());
    let a = AnonMemory::new(MIB).unwrap();
    let r = a.region();
    let err = DirtyTracker::new(&[r, r], BackendKind::Hash).unwrap_err();
    assert!(
        matches!(
            err,
            pagewise_track::Error::Mech(pagewise::MechError::Overlap { a_start, b_start, .. })
                if a_start == r.start && b_start == r.start
        ),
        "{err}"
    );
}

#[test]
fn soft_dirty_refusal_is_clear_when_missing() {
    match BackendKind::SoftDirty.available_in_process() {
        Ok(()) => pagewise_testkit::skip!("this kernel has soft-dirty"),
        Err(why) => {
            let a = AnonMemory::new(MIB).unwrap();
            let err = DirtyTracker::new(&[a.region()], BackendKind::SoftDirty)
                .unwrap_err()
                .to_string();
            assert!(err.contains("soft-dirty") && err.contains(&why), "{err}");
            println!("ok   soft-dirty refused: {err}");
        }
    }
}

/// Each backend either tracks shared and file-backed private memory exactly
/// (every written page reported) or refuses it by name; hugetlb likewise
/// where configured.
#[test]
fn memory_types() {
    use pagewise_mech::procfs::MemoryKind as K;
    for_each_backend("memory types", &[], |kind| {
        for mk in [K::Shared, K::FilePrivate, K::Hugetlb] {
            let m = match common::Mapped::new(mk, 64) {
                Ok(m) => m,
                Err(why) => {
                    pagewise_testkit::skip!("[{kind}] [{}] {why}", mk.name());
                    continue;
                }
            };
            let mut t = match DirtyTracker::new(&[m.region()], kind) {
                Ok(t) => t,
                Err(e) => {
                    assert!(
                        matches!(
                            e,
                            pagewise_track::Error::Mech(pagewise::MechError::MemoryType {
                                kind: k,
                                ..
                            }) if k == mk.name()
                        ),
                        "[{kind}] {}: refused without saying why: {e:?}",
                        mk.name()
                    );
                    println!("     [{kind}] {}: refused: {e}", mk.name());
                    continue;
                }
            };
            let written = [3usize, 7, 8, 40];
            for &p in &written {
                m.set(p * PAGE_SIZE + 200, 0x5A);
            }
            let c = t.collect().unwrap();
            let reported: std::collections::BTreeSet<usize> = c
                .ranges
                .iter()
                .flat_map(|r| {
                    let first = ((r.start - m.addr) / PAGE_SIZE as u64) as usize;
                    first..first + r.pages as usize
                })
                .collect();
            for p in written {
                assert!(
                    reported.contains(&p),
                    "[{kind}] {}: the write to page {p} was not reported ({reported:?})",
                    mk.name()
                );
            }
            println!(
                "     [{kind}] {}: {} pages reported for {} written",
                mk.name(),
                reported.len(),
                written.len()
            );
        }
    });
}

/// `AnonHugePages` of process `pid` over the mapping holding `addr`, KiB.
fn anon_huge_kib_of(pid: i32, addr: u64) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some(m) = procfs::parse_maps(line).first() {
            inside = m.start <= addr && addr < m.end;
        } else if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
    }
    0
}

/// A second tracker over memory a first one holds is refused with the
/// reason (a tracker or snapshot set of this process holds it), not a bare
/// EBUSY; once the first is dropped, the second is made.
#[test]
fn a_second_tracker_over_the_same_memory_says_who_holds_it() {
    if let Err(why) = BackendKind::UffdWp.available_in_process() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let mem = AnonMemory::new(16 * PAGE_SIZE).unwrap();
    let first = DirtyTracker::new(&[mem.region()], BackendKind::UffdWp).unwrap();
    let e = DirtyTracker::new(&[mem.region()], BackendKind::UffdWp).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    let r = mem.region();
    assert!(
        matches!(e, pagewise_track::Error::HeldElsewhere { start, end } if start == r.start && end == r.end()),
        "{e}"
    );
    drop(first);
    DirtyTracker::new(&[mem.region()], BackendKind::UffdWp).unwrap();
}
