//! The huge-page agent against ground truth: a process whose four 2 MiB
//! regions are written at known, different coverage; with a budget of two
//! huge pages, the coverage policy promotes exactly the two most written
//! regions and the address-order policy the first two; a collapse loses no
//! write of the running process (every page's self-checking word is intact
//! and at least as new as the last pass the process completed).

#[path = "../common/mod.rs"]
mod common;

use pagewise::thp::agent::{Action, Agent, Budget, Options, Policy};
use pagewise::workload::AnonMemory;
use pagewise::{HUGE_PAGE_SIZE, PAGE_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const K: u64 = 0x5a5a_1234_9876_abcd;
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
    fn start() -> Target {
        let mem = AnonMemory::new(4 * HUGE_PAGE_SIZE).unwrap();
        // Populated by base pages (THP in `madvise` mode and no advice:
        // faults take base pages; a collapse is still allowed), before the
        // child starts. Under THP `always` the regions may start huge: the
        // test says so and skips.
        mem.write_pass(16, 0);
        let base = mem.addr();
        // SAFETY: a fresh shared anonymous page.
        let ctl = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut AtomicU64;
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
        std::mem::forget(mem);
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
        let stopped = pagewise::stop::Stopped::new(self.pid).unwrap();
        let done = self.passes();
        let mut b = vec![0u8; 4 * HUGE_PAGE_SIZE];
        pagewise::walk::read_remote(self.pid, self.base, &mut b).unwrap();
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
        let mut w = pagewise::walk::PageWalker::new(Some(self.pid)).unwrap();
        let mut runs = Vec::new();
        (0..4)
            .map(|r| {
                let reg = pagewise::Region::new(
                    self.base + (r * HUGE_PAGE_SIZE) as u64,
                    HUGE_PAGE_SIZE as u64,
                )
                .unwrap();
                w.categories(
                    reg,
                    pagewise_sys::pagemap::category::HUGE,
                    pagewise_sys::pagemap::category::HUGE,
                    &mut runs,
                )
                .unwrap();
                !runs.is_empty()
            })
            .collect()
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
    let p = pagewise::probe::get();
    for (ok, what) in [
        (p.madv_collapse, "madv_collapse"),
        (p.process_madvise, "process_madvise"),
    ] {
        if !ok {
            pagewise_testkit::skip!("{}", p.why(what));
            return false;
        }
    }
    if let Err(why) = pagewise::track::BackendKind::UffdWp.available_for_pid() {
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
        let opts = Options {
            interval: Duration::from_millis(500),
            window: Duration::from_millis(200),
            policy,
            budget: Budget {
                total: Some(2),
                per_second: 100.0,
                cpu_share: 1.0,
            },
            walk_ns: 30.0,
        };
        let mut agent = Agent::new(&[t.pid], opts).unwrap();
        let step = agent.step().unwrap();
        let failed: Vec<&Action> = step
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Failed { .. }))
            .collect();
        if !failed.is_empty() {
            pagewise_testkit::skip!("{policy:?}: the kernel refused a collapse: {failed:?}");
            return;
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
        assert_eq!(t.huge(), want, "{policy:?}: regions mapped by huge pages");
        if policy == Policy::Coverage {
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
        assert!(agent.metrics().contains("pagewise_thp_promoted_total 2"));
    }
}
