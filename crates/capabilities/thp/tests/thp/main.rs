//! The huge-page agent against ground truth: a process whose four 2 MiB
//! regions are written at known, different coverage; with a budget of two
//! huge pages, the coverage policy promotes exactly the two most written
//! regions and the address-order policy the first two; a collapse loses no
//! write of the running process (every page's self-checking word is intact
//! and at least as new as the last pass the process completed).

mod cgroup;
use pagewise_testkit::targets as common;

use pagewise::{HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_mech::agent::Agent as _;
use pagewise_mech::workload::AnonMemory;
use pagewise_thp::agent::{Action, Agent, Budget, Options, Policy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const K: u64 = 0x5a5a_1234_9876_abcd;
/// Where a target's regions are (see `Target::start`).
const LOW: u64 = 0x1000_0000_0000;
/// Pages written per pass in regions 0..4: none, 8, all 512, 64.
const STRIDE: [usize; 4] = [0, 64, 1, 8];

/// A forked child writing its four regions at the coverage of `STRIDE`,
/// pass after pass; `ctl[0]` counts the passes it completed, `ctl[1]` = 1
/// stops it.
struct Target {
    pid: i32,
    base: u64,
    ctl: *mut AtomicU64,
}

impl Target {
    /// A target whose regions are base pages, or `None`, said, where they
    /// were huge pages from the start.
    fn start_in_base_pages() -> Option<Target> {
        let t = Target::start();
        if t.huge() != [false; 4] {
            pagewise_testkit::skip!(
                "the target's regions were huge pages from the start (THP `always`?)"
            );
            return None;
        }
        Some(t)
    }

    fn start() -> Target {
        // At a fixed address below the heap and every other mapping of
        // this process, so that the regions are the first in address order
        // (the child inherits other tests' memory too).
        let base = LOW;
        let len = 4 * HUGE_PAGE_SIZE;
        // SAFETY: a new private mapping at an address nothing else holds
        // (MAP_FIXED_NOREPLACE fails otherwise).
        let at = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(at as u64, base, "mapping the target's regions at {base:#x}");
        // Populated by base pages (THP in `madvise` mode and no advice:
        // faults take base pages; a collapse is still allowed), before the
        // child starts. Under THP `always` the regions may start huge: the
        // test says so and skips.
        for off in (0..len).step_by(PAGE_SIZE) {
            // SAFETY: inside the mapping just made.
            unsafe { std::ptr::write_volatile((base as usize + off) as *mut u8, 0) };
        }
        let ctl = pagewise_sys::mem::mmap_shared_anonymous(PAGE_SIZE).unwrap() as *mut AtomicU64;
        // SAFETY: the child writes its own memory and the shared page, sleeps
        // and exits: no allocation, no lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            common::close_inherited(&[]);
            // SAFETY: the control page is mapped for the child's life.
            let (done, stop) = unsafe { (&*ctl, &*ctl.add(1)) };
            let mut pass = 1u64;
            while stop.load(Ordering::Relaxed) == 0 {
                for (r, &stride) in STRIDE.iter().enumerate() {
                    if stride == 0 {
                        continue;
                    }
                    for p in (0..512).step_by(stride) {
                        let w0 = ((r as u64) << 48) | ((p as u64) << 32) | pass;
                        let at = base as usize + r * HUGE_PAGE_SIZE + p * PAGE_SIZE;
                        // SAFETY: inside the child's region.
                        unsafe {
                            std::ptr::write_volatile(at as *mut u64, w0);
                            std::ptr::write_volatile((at + 8) as *mut u64, w0 ^ K);
                        }
                    }
                }
                done.store(pass, Ordering::SeqCst);
                pass += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
            // SAFETY: ends the child.
            unsafe { libc::_exit(0) };
        }
        // The child has its copy; this process's goes, so that the children
        // of later tests do not inherit it.
        // SAFETY: the mapping made above; nothing of this process uses it.
        unsafe { libc::munmap(base as *mut libc::c_void, len) };
        let t = Target { pid, base, ctl };
        let t0 = std::time::Instant::now();
        while t.passes() < 2 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        t
    }

    fn passes(&self) -> u64 {
        // SAFETY: the shared control page lives as long as the test.
        unsafe { (*self.ctl).load(Ordering::SeqCst) }
    }

    /// Stops the child and checks every page: written pages hold a
    /// consistent word for their place, no older than the last completed
    /// pass; others still hold the fill. Returns the pages checked.
    fn check(&self) -> u64 {
        let stopped = pagewise_mech::stop::Stopped::new(self.pid).unwrap();
        let done = self.passes();
        let mut b = vec![0u8; 4 * HUGE_PAGE_SIZE];
        pagewise_mech::remote::read(self.pid, self.base, &mut b).unwrap();
        drop(stopped);
        let mut n = 0;
        for (r, &stride) in STRIDE.iter().enumerate() {
            for p in 0..512usize {
                let at = r * HUGE_PAGE_SIZE + p * PAGE_SIZE;
                let w0 = u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
                let w1 = u64::from_ne_bytes(b[at + 8..at + 16].try_into().unwrap());
                if stride != 0 && p % stride == 0 {
                    assert_eq!(w1, w0 ^ K, "region {r} page {p}: torn or lost write");
                    assert_eq!(
                        w0 >> 32,
                        ((r as u64) << 16) | p as u64,
                        "region {r} page {p}: another page's data"
                    );
                    assert!(
                        w0 & 0xffff_ffff >= done,
                        "region {r} page {p}: pass {} after {done} completed: a write lost",
                        w0 & 0xffff_ffff
                    );
                } else {
                    assert_eq!(
                        (w0, w1),
                        (0, 0),
                        "region {r} page {p}: changed though never written"
                    );
                }
                n += 1;
            }
        }
        n
    }

    /// Which of the four regions are mapped by a huge page.
    fn huge(&self) -> Vec<bool> {
        common::huge_regions(self.pid, self.base, 4)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // SAFETY: the control page, then our own child.
        unsafe {
            (*self.ctl.add(1)).store(1, Ordering::SeqCst);
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

fn available() -> bool {
    let p = pagewise_mech::probe::get();
    for (ok, what) in [
        (p.madv_collapse, "madv_collapse"),
        (p.process_madvise, "process_madvise"),
    ] {
        if !ok {
            pagewise_testkit::skip!("{}", p.why(what));
            return false;
        }
    }
    if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return false;
    }
    true
}

fn promoted(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Promoted { start, .. } => Some(*start),
            _ => None,
        })
        .collect()
}

/// Budget of two huge pages: coverage order promotes the all-written and
/// the 64-page regions, address order the first two; no write lost, and the
/// budget is said to be what stopped the rest.
#[test]
fn promotes_by_coverage_within_the_budget_and_loses_no_write() {
    let _one = common::one_target_at_a_time();
    if !available() {
        return;
    }
    for (policy, want) in [
        (Policy::Coverage, [false, false, true, true]),
        (Policy::AddressOrder, [true, true, false, false]),
    ] {
        let t = Target::start();
        assert!(t.passes() >= 2, "the target did not run");
        if t.huge() != [false; 4] {
            pagewise_testkit::skip!(
                "{policy:?}: the target's regions were huge pages from the start (THP `always`?)"
            );
            return;
        }
        let opts = Options::default()
            .interval(Duration::from_millis(500))
            .window(Duration::from_millis(200))
            .policy(policy)
            .budget(
                Budget::default()
                    .total(Some(2))
                    .per_second(100.0)
                    .cpu_share(1.0),
            )
            .walk_ns(30.0)
            .recovery(None);
        let mut agent = Agent::new(&[t.pid], opts).unwrap();
        let passes_before = t.passes();
        let step = agent.step().unwrap();
        let passes = t.passes() - passes_before;
        let failed: Vec<&Action> = step
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Failed { .. }))
            .collect();
        if !failed.is_empty() {
            pagewise_testkit::claim_not_happened!(
                "madv_collapse",
                "{policy:?}: the huge-page agent's collapse was refused by the kernel: {failed:?}"
            );
            return;
        }
        // The step's CPU budget counts the time collapses take: on a loaded
        // machine one collapse can take seconds and spend it.
        let spent = step.actions.iter().find_map(|a| match a {
            Action::Skipped { why, .. } if why.contains("CPU budget") => Some(why.clone()),
            _ => None,
        });
        if let Some(why) = spent {
            pagewise_testkit::not_happened!(
                "{policy:?}: the collapses took the step's CPU budget ({why}): {:?}",
                step.actions
            );
            assert_eq!(t.check(), 2048, "a write lost");
            continue;
        }
        let got = promoted(&step.actions);
        let region = |s: u64| (s - t.base) / HUGE_PAGE_SIZE as u64;
        println!(
            "     {policy:?}: promoted regions {:?}; candidates {:?}",
            got.iter().map(|&s| region(s)).collect::<Vec<_>>(),
            step.candidates
                .iter()
                .map(|c| (region(c.start), c.touched))
                .collect::<Vec<_>>()
        );
        assert_eq!(got.len(), 2, "{policy:?}: {:?}", step.actions);
        // The coverage measured is what the target wrote in the window:
        // a figure only when the target made whole passes in it (on a
        // loaded machine it may not have been given the CPU).
        if policy == Policy::Coverage && passes < 3 {
            pagewise_testkit::not_happened!(
                "the target made {passes} passes during the step (3 needed to cover a region in the window): the choice by coverage not checked"
            );
        } else {
            assert_eq!(t.huge(), want, "{policy:?}: regions mapped by huge pages");
        }
        if policy == Policy::Coverage && passes >= 3 {
            let touched: Vec<Option<u64>> = (0..4u64)
                .map(|r| {
                    step.candidates
                        .iter()
                        .find(|c| region(c.start) == r)
                        .and_then(|c| c.touched)
                })
                .collect();
            assert!(
                touched[2] >= Some(500),
                "the all-written region's coverage: {touched:?}"
            );
            assert!(
                touched[3] >= Some(60) && touched[3] < touched[2],
                "{touched:?}"
            );
        }
        assert!(
            step.actions
                .iter()
                .any(|a| matches!(a, Action::Skipped { why, .. } if why.contains("total budget"))),
            "{policy:?}: the budget's refusal not reported: {:?}",
            step.actions
        );
        // A second step promotes nothing more (the total is spent).
        let step = agent.step().unwrap();
        assert!(promoted(&step.actions).is_empty());
        std::thread::sleep(Duration::from_millis(100));
        let n = t.check();
        assert_eq!(n, 2048);
        assert!(pagewise_agent::exposition(&agent).contains("pagewise_thp_promoted_total 2.0"));
    }
}

/// A cap on the candidates measured a step: with room for two of the
/// target's four, the first step measures regions 0 and 1 (never measured,
/// in order), the second 2 and 3 (measured longest ago: never), the third
/// 0 and 1 again; a candidate not measured in a step keeps what it
/// measured last (never measured: untouched). The writes are those of
/// `STRIDE`, so each measured figure is known: 0, 8, 512 and 64 pages
/// (regions 2 and 3, had they been measured in the first step, would show
/// 512 and 64 there).
#[test]
fn a_cap_on_coverage_measures_the_longest_unmeasured_first() {
    let _one = common::one_target_at_a_time();
    if !available() {
        return;
    }
    let Some(t) = Target::start_in_base_pages() else {
        return;
    };
    let opts = Options::default()
        .interval(Duration::from_millis(500))
        .window(Duration::from_millis(200))
        .policy(Policy::Coverage)
        .budget(Budget::default().total(Some(0)))
        .walk_ns(30.0)
        .recovery(None)
        .coverage_per_step(Some(2));
    let mut agent = Agent::new(&[t.pid], opts).unwrap();
    let region = |s: u64| (s - t.base) / HUGE_PAGE_SIZE as u64;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let before = t.passes();
        let step = agent.step().unwrap();
        let passes = t.passes() - before;
        let touched: Vec<Option<u64>> = (0..4u64)
            .map(|r| {
                step.candidates
                    .iter()
                    .find(|c| region(c.start) == r)
                    .and_then(|c| c.touched)
            })
            .collect();
        if passes < 3 {
            pagewise_testkit::not_happened!(
                "the target made {passes} passes during a step (3 needed to cover a region in the window): the figures not checked"
            );
            return;
        }
        seen.push(touched);
    }
    println!("     coverage per step: {seen:?}");
    // A candidate with nothing touched is not listed (it has no benefit).
    assert_eq!(seen[0], [None, Some(8), None, None], "step 1");
    assert_eq!(seen[1], [None, Some(8), Some(512), Some(64)], "step 2");
    assert_eq!(seen[2], seen[1], "step 3");
    assert_eq!(t.check(), 2048, "a write lost");
}

/// A group's budget (a container's): the process of group `c1`, allowed
/// one huge page, gets one in address order though the agent's own budget
/// allows more, the rest said to be passed over for the group's budget;
/// with the group's budget raised to three, the next step gives it two
/// more, and exactly the first three regions are huge pages.
#[test]
fn a_groups_budget_caps_its_processes() {
    let _one = common::one_target_at_a_time();
    if !available() {
        return;
    }
    let Some(t) = Target::start_in_base_pages() else {
        return;
    };
    let opts = Options::default()
        .interval(Duration::from_millis(500))
        .window(Duration::from_millis(100))
        .policy(Policy::AddressOrder)
        .budget(
            Budget::default()
                .total(None)
                .per_second(100.0)
                .cpu_share(1.0),
        )
        .walk_ns(30.0)
        .recovery(None);
    let mut agent = Agent::new(&[], opts).unwrap();
    agent.add_in_group(t.pid, "c1", 1).unwrap();
    let step = agent.step().unwrap();
    if step
        .actions
        .iter()
        .any(|a| matches!(a, Action::Failed { .. }))
    {
        pagewise_testkit::claim_not_happened!(
            "madv_collapse",
            "the huge-page agent's collapse was refused by the kernel: {:?}",
            step.actions
        );
        return;
    }
    assert_eq!(promoted(&step.actions).len(), 1, "{:?}", step.actions);
    assert!(
        step.actions
            .iter()
            .any(|a| matches!(a, Action::Skipped { why, .. }
            if why == "the budget of 1 huge pages of c1 is spent")),
        "{:?}",
        step.actions
    );
    assert_eq!(agent.groups(), vec![("c1".to_string(), 1, 1)]);
    agent.add_in_group(t.pid, "c1", 3).unwrap();
    let step = agent.step().unwrap();
    assert_eq!(promoted(&step.actions).len(), 2, "{:?}", step.actions);
    assert_eq!(agent.groups(), vec![("c1".to_string(), 3, 3)]);
    assert_eq!(t.huge(), [true, true, true, false]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(t.check(), 2048, "a write lost");
}

/// Bloat recovery under concurrent writers: a process whose four huge
/// pages hold mostly zero pages, two threads writing into the pages that
/// start zero all the while. The agent gives back the zero pages (stopping
/// the process for it); the regions are split, the memory drops, and every
/// value the threads wrote is still there (the process checks its own
/// memory against what it wrote).
#[test]
fn bloat_recovery_loses_no_write_of_concurrent_writers() {
    let _one = common::one_target_at_a_time();
    if !available() {
        return;
    }
    // Mapped here, first touched in the child (a huge page shared with this
    // process after fork would be split by the child's first write).
    let mem = AnonMemory::new(4 * HUGE_PAGE_SIZE).unwrap();
    if mem.madvise(0, mem.len(), 14 /* MADV_HUGEPAGE */).is_err() {
        pagewise_testkit::not_happened!("MADV_HUGEPAGE refused");
        return;
    }
    let base = mem.addr() as usize;
    // A shared page: [0] stop, [1] result (1 ok, 2 lost), [2] writes done,
    // [3] writers started.
    let ctl = pagewise_sys::mem::mmap_shared_anonymous(PAGE_SIZE).unwrap() as usize;
    struct Arg {
        base: usize,
        ctl: usize,
        slot: usize,
        shadow: *mut u64,
    }
    extern "C" fn writer(a: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: an Arg that outlives the thread.
        let a = unsafe { &*(a as *const Arg) };
        // SAFETY: the shared control page outlives the thread.
        let c = |i: usize| unsafe { &*((a.ctl as *const AtomicU64).add(i)) };
        let mut x = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(a.slot as u64 + 1);
        let mut seq = 0u64;
        while c(0).load(Ordering::Relaxed) == 0 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Only every 4th page: the others stay zero for good.
            let page = ((x >> 8) as usize % 512) * 4;
            seq += 1;
            // SAFETY: inside the region; the shadow has 2048 entries.
            unsafe {
                std::ptr::write_volatile(
                    (a.base + page * PAGE_SIZE + 64 + a.slot * 8) as *mut u64,
                    seq,
                );
                *a.shadow.add(page) = seq;
            }
            c(2).fetch_add(1, Ordering::Relaxed);
            // Slowly: many of those pages are still zero when the agent
            // gives zero pages back, and are written after.
            std::thread::sleep(Duration::from_micros(50));
        }
        std::ptr::null_mut()
    }
    // SAFETY: the child starts threads that write its memory and checks it
    // with no allocation, then exits through _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        common::close_inherited(&[]);
        // One byte per region: each fault takes a whole zeroed huge page.
        for r in 0..4 {
            // SAFETY: inside the child's region.
            unsafe { std::ptr::write_volatile((base + r * HUGE_PAGE_SIZE + 8) as *mut u8, 1) };
        }
        let shadows: Vec<usize> = (0..2)
            .map(|_| {
                // SAFETY: a fresh private mapping for the shadow.
                unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        2048 * 8,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    ) as usize
                }
            })
            .collect();
        let args: Vec<Arg> = (0..2)
            .map(|slot| Arg {
                base,
                ctl,
                slot,
                shadow: shadows[slot] as *mut u64,
            })
            .collect();
        let mut t: [libc::pthread_t; 2] = [0; 2];
        for (i, th) in t.iter_mut().enumerate() {
            // SAFETY: starting a thread on a plain extern "C" function.
            unsafe {
                libc::pthread_create(
                    th,
                    std::ptr::null(),
                    writer,
                    &args[i] as *const Arg as *mut _,
                )
            };
        }
        // SAFETY: the shared control page.
        unsafe { (*((ctl as *const AtomicU64).add(3))).store(1, Ordering::SeqCst) };
        for th in t {
            // SAFETY: our own threads.
            unsafe { libc::pthread_join(th, std::ptr::null_mut()) };
        }
        let mut ok = true;
        for (slot, &sh) in shadows.iter().enumerate() {
            for page in 0..2048 {
                // SAFETY: the region and the shadow, both ours.
                let (m, want) = unsafe {
                    (
                        std::ptr::read_volatile(
                            (base + page * PAGE_SIZE + 64 + slot * 8) as *const u64,
                        ),
                        *(sh as *const u64).add(page),
                    )
                };
                ok &= m == want;
            }
        }
        // SAFETY: the shared control page.
        unsafe {
            (*((ctl as *const AtomicU64).add(1))).store(if ok { 1 } else { 2 }, Ordering::SeqCst)
        };
        // SAFETY: ends the child.
        unsafe { libc::_exit(0) };
    }
    // The child has its copy; this process's goes (see Target::start).
    drop(mem);
    // SAFETY: the shared control page stays mapped for the test.
    let c = |i: usize| unsafe { &*((ctl as *const AtomicU64).add(i)) };
    let huge = |pid: i32| {
        common::huge_regions(pid, base as u64, 4)
            .iter()
            .filter(|h| **h)
            .count()
    };
    // Killed however the test ends (a failed assertion included), so that
    // its threads do not outlive the test.
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            // SAFETY: our own child; reaping twice is harmless.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }
    let reap = Reap(pid);
    let kill = || drop(Reap(pid));
    let t0 = std::time::Instant::now();
    while c(3).load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(10));
    let mut st = 0;
    // SAFETY: our own child; does not block.
    if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
        panic!("the child ended at once: status {st:#x}");
    }
    // The kernel may not find a huge page for every region.
    let h = huge(pid);
    if h == 0 {
        kill();
        pagewise_testkit::skip!("none of the child's regions is a huge page: no bloat to recover");
        return;
    }
    let opts = recovery_only(
        pagewise_thp::agent::Recovery::default()
            .when(pagewise_thp::agent::Pressure::Always)
            .zero_pages(256)
            .tune_khugepaged(false)
            .hold(Duration::ZERO),
    );
    let mut agent = Agent::new(&[pid], opts).unwrap();
    let writes_before = c(2).load(Ordering::Relaxed);
    let step = agent.step().unwrap();
    let recovered: Vec<u64> = step
        .actions
        .iter()
        .filter_map(|a| match a {
            // Only the test's regions: the child also holds huge pages of
            // other tests running in this process when it forked.
            Action::Recovered {
                zero_pages, start, ..
            } if *start >= base as u64 && *start < (base + 4 * HUGE_PAGE_SIZE) as u64 => {
                Some(*zero_pages)
            }
            _ => None,
        })
        .collect();
    println!(
        "     recovered {recovered:?} zero pages; {:?}",
        step.actions
            .iter()
            .filter(|a| !matches!(a, Action::Recovered { .. }))
            .collect::<Vec<_>>()
    );
    assert_eq!(recovered.len(), h, "{:?}", step.actions);
    assert!(
        recovered.iter().all(|&n| n >= 384),
        "at least the 384 pages never written, per region: {recovered:?}"
    );
    // The pages the threads write that were still zero were given back
    // too, and are written after: the case that could lose a write.
    let pending: u64 = recovered.iter().map(|n| n - 384).sum();
    assert!(
        pending > 0,
        "no page the threads write was still zero at the recovery: the race was not exercised"
    );
    println!("     {pending} pages the threads write were given back while still zero");
    assert_eq!(
        huge(pid),
        0,
        "regions still huge after their zero pages were given back"
    );
    std::thread::sleep(Duration::from_millis(200));
    c(0).store(1, Ordering::SeqCst);
    let t0 = std::time::Instant::now();
    while c(1).load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let writes = c(2).load(Ordering::Relaxed);
    let result = c(1).load(Ordering::SeqCst);
    drop(reap);
    assert!(
        writes > writes_before,
        "the writers did not write after the recovery: nothing checked"
    );
    assert_eq!(
        result, 1,
        "the process found a write lost ({writes} writes)"
    );
    assert!(agent.counters().recovered_pages >= h as u64 * 384);
}

/// Pre-zeroing: in a mapping that takes huge pages and grows forward, the
/// thread faults in the regions ahead of the last one touched (they read as
/// zeros); while the program writes into those very regions as the thread
/// works, every write stays.
#[test]
fn prezeroing_runs_ahead_and_loses_no_write() {
    // Its memory would be inherited by another test's target.
    let _one = common::one_target_at_a_time();
    use pagewise_thp::prezero::{PrezeroOptions, Prezeroer};
    let mem = AnonMemory::new(32 * HUGE_PAGE_SIZE).unwrap();
    if mem.madvise(0, mem.len(), 14 /* MADV_HUGEPAGE */).is_err() {
        pagewise_testkit::not_happened!("MADV_HUGEPAGE refused");
        return;
    }
    mem.write_byte(0, 1);
    let present = |r: usize| {
        let mut w = pagewise_mech::walk::PageWalker::new(None).unwrap();
        let mut runs = Vec::new();
        let reg = pagewise::Region::new(
            mem.addr() + (r * HUGE_PAGE_SIZE) as u64,
            HUGE_PAGE_SIZE as u64,
        )
        .unwrap();
        let p = pagewise_sys::pagemap::category::PRESENT;
        w.categories(reg, p, p, &mut runs).unwrap();
        runs.iter()
            .map(|x| (x.end - x.start) / PAGE_SIZE as u64)
            .sum::<u64>()
    };
    let h = pagewise_sys::pagemap::category::HUGE;
    let mut runs = Vec::new();
    pagewise_mech::walk::PageWalker::new(None)
        .unwrap()
        .categories(mem.region(), h, h, &mut runs)
        .unwrap();
    if runs.is_empty() {
        pagewise_testkit::not_happened!("the first touch did not take a huge page");
        return;
    }
    let p = Prezeroer::start(
        PrezeroOptions::default()
            .ahead(3)
            .rate(10_000.0)
            .scan(Duration::from_micros(200)),
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    while present(3) < 512 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        [present(1), present(2), present(3)],
        [512; 3],
        "the 3 regions ahead were not faulted in"
    );
    assert_eq!(present(4), 0, "more than 3 regions ahead");
    for r in 1..4 {
        for page in 0..512 {
            assert_eq!(
                mem.read_byte(r * HUGE_PAGE_SIZE + page * PAGE_SIZE + 7),
                0,
                "a pre-zeroed page is not zero"
            );
        }
    }
    // Grow while the thread works ahead: every byte written stays.
    for r in 1..32 {
        for page in 0..512 {
            mem.write_byte(
                r * HUGE_PAGE_SIZE + page * PAGE_SIZE + 7,
                (r * 7 + page) as u8 | 1,
            );
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    let st = p.stats();
    drop(p);
    for r in 1..32 {
        for page in 0..512 {
            assert_eq!(
                mem.read_byte(r * HUGE_PAGE_SIZE + page * PAGE_SIZE + 7),
                (r * 7 + page) as u8 | 1,
                "region {r} page {page}: a write lost"
            );
        }
    }
    println!(
        "     pre-zeroing: {} huge pages faulted in ahead in {} looks",
        st.populated, st.scans
    );
    assert!(st.populated >= 3);
}

/// An agent that only recovers bloat (address order, no huge page to
/// promote: no coverage is measured).
fn recovery_only(recovery: pagewise_thp::agent::Recovery) -> Options {
    Options::default()
        .interval(Duration::from_millis(100))
        .window(Duration::from_millis(10))
        .policy(Policy::AddressOrder)
        .budget(
            Budget::default()
                .total(Some(0))
                .per_second(0.0)
                .cpu_share(0.0),
        )
        .walk_ns(30.0)
        .recovery(Some(recovery))
}
