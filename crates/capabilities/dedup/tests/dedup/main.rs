//! The deduplication agent against ground truth: a process with four huge
//! pages of known content — two cold and identical, one hot and full of the
//! same pages, one cold and unique — has exactly the two cold identical
//! ones made mergeable and merged by KSM, the hot and the unique one kept
//! huge; when one merged region turns hot it is unmerged and rebuilt into a
//! huge page; at the end nothing it made mergeable stays so, KSM's settings
//! are back, and no write of the process is lost (every page checked
//! against the content it must hold).

use pagewise_testkit::targets as common;

use pagewise::{HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_dedup::{Action, Agent, Options, Policy, Thresholds};
use pagewise_mech::agent::Agent as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const K: u64 = 0x5a5a_1234_9876_abcd;
/// Where the target's regions are: below every other mapping.
const LOW: u64 = 0x1200_0000_0000;
const REGIONS: usize = 4;
/// The region written from the start.
const HOT: usize = 2;
/// The region written from phase 2 on.
const LATE: usize = 0;
/// Pages written per pass in a written region: every 64th.
const STRIDE: usize = 64;

/// The content of page `p` of region `r`: regions 0, 1 and 2 hold the
/// same pages, region 3 pages of its own.
fn fill(r: usize, p: usize, page: &mut [u8]) {
    let mut x = if r == 3 {
        1_000_003 + p as u64
    } else {
        1 + p as u64
    };
    for w in page.chunks_exact_mut(8) {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_ne_bytes());
    }
}

/// `ctl[0]`: passes completed; `ctl[1]` = 1 stops the child; `ctl[2]` = 1
/// starts phase 2; `ctl[3]`: 1 once its regions are huge, 2 if the
/// collapse was refused.
struct Target {
    pid: i32,
    ctl: *mut AtomicU64,
}

impl Target {
    /// A target whose regions are huge pages, or `None`, said, where the
    /// kernel refused the collapse.
    fn start_huge() -> Option<Target> {
        let t = Target::start();
        if t.ctl(3) != 1 {
            pagewise_testkit::claim_not_happened!(
                "madv_collapse",
                "the target's regions could not be made huge (MADV_COLLAPSE refused)"
            );
            return None;
        }
        Some(t)
    }

    fn start() -> Target {
        let ctl = pagewise_sys::mem::mmap_shared_anonymous(PAGE_SIZE).unwrap() as *mut AtomicU64;
        // SAFETY: the child maps, fills and writes its own memory and the
        // shared page, sleeps and exits: no allocation, no lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            common::close_inherited(&[]);
            // SAFETY: the control page is mapped for the child's life.
            let c = |i: usize| unsafe { &*ctl.add(i) };
            let len = REGIONS * HUGE_PAGE_SIZE;
            // SAFETY: a new private mapping at an address nothing else holds.
            let at = unsafe {
                libc::mmap(
                    LOW as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if at as u64 != LOW {
                c(3).store(2, Ordering::SeqCst);
                // SAFETY: ends the child.
                unsafe { libc::_exit(1) };
            }
            // SAFETY: the mapping just made, its whole length.
            let mem = unsafe { std::slice::from_raw_parts_mut(LOW as *mut u8, len) };
            for r in 0..REGIONS {
                for p in 0..512 {
                    let o = r * HUGE_PAGE_SIZE + p * PAGE_SIZE;
                    fill(r, p, &mut mem[o..o + PAGE_SIZE]);
                }
            }
            // SAFETY: advice on the mapping just made.
            let huge = unsafe {
                libc::madvise(at, len, libc::MADV_HUGEPAGE) == 0
                    && libc::madvise(at, len, pagewise_sys::mem::MADV_COLLAPSE) == 0
            };
            c(3).store(if huge { 1 } else { 2 }, Ordering::SeqCst);
            let mut pass = 1u64;
            while c(1).load(Ordering::Relaxed) == 0 {
                let late = c(2).load(Ordering::Relaxed) == 1;
                for r in [HOT, LATE] {
                    if r == LATE && !late {
                        continue;
                    }
                    for p in (0..512).step_by(STRIDE) {
                        let w0 = ((r as u64) << 48) | ((p as u64) << 32) | pass;
                        let at = LOW as usize + r * HUGE_PAGE_SIZE + p * PAGE_SIZE;
                        // SAFETY: inside the child's region.
                        unsafe {
                            std::ptr::write_volatile(at as *mut u64, w0);
                            std::ptr::write_volatile((at + 8) as *mut u64, w0 ^ K);
                        }
                    }
                }
                c(0).store(pass, Ordering::SeqCst);
                pass += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            // SAFETY: ends the child.
            unsafe { libc::_exit(0) };
        }
        let t = Target { pid, ctl };
        let t0 = Instant::now();
        while t.ctl(3) == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        t
    }

    fn ctl(&self, i: usize) -> u64 {
        // SAFETY: the shared control page lives as long as the test.
        unsafe { (*self.ctl.add(i)).load(Ordering::SeqCst) }
    }

    fn set(&self, i: usize, v: u64) {
        // SAFETY: as above.
        unsafe { (*self.ctl.add(i)).store(v, Ordering::SeqCst) }
    }

    /// Stops the child and checks every page against what it must hold.
    fn check(&self, late_written: bool) -> u64 {
        let stopped = pagewise_mech::stop::Stopped::new(self.pid).unwrap();
        let done = self.ctl(0);
        let mut b = vec![0u8; REGIONS * HUGE_PAGE_SIZE];
        pagewise_mech::remote::read(self.pid, LOW, &mut b).unwrap();
        drop(stopped);
        let mut want = vec![0u8; PAGE_SIZE];
        let mut n = 0;
        for r in 0..REGIONS {
            for p in 0..512 {
                let o = r * HUGE_PAGE_SIZE + p * PAGE_SIZE;
                let page = &b[o..o + PAGE_SIZE];
                fill(r, p, &mut want);
                let written = p % STRIDE == 0 && (r == HOT || (r == LATE && late_written));
                let from = if written {
                    let w0 = u64::from_ne_bytes(page[..8].try_into().unwrap());
                    let w1 = u64::from_ne_bytes(page[8..16].try_into().unwrap());
                    assert_eq!(w1, w0 ^ K, "region {r} page {p}: torn or lost write");
                    assert_eq!(
                        w0 >> 32,
                        ((r as u64) << 16) | p as u64,
                        "region {r} page {p}"
                    );
                    assert!(
                        w0 & 0xffff_ffff >= done,
                        "region {r} page {p}: pass {} after {done} completed: a write lost",
                        w0 & 0xffff_ffff
                    );
                    16
                } else {
                    0
                };
                assert!(
                    page[from..] == want[from..],
                    "region {r} page {p}: content changed"
                );
                n += 1;
            }
        }
        n
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.set(1, 1);
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

fn huge_regions(pid: i32) -> Vec<bool> {
    common::huge_regions(pid, LOW, REGIONS)
}

/// Pages of region `r` of process `pid` that are KSM pages (the page's
/// `KPF_KSM` flag in `/proc/kpageflags`, found by its frame in the page map).
fn ksm_pages(pid: i32, r: usize) -> usize {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;
    const KPF_KSM: u64 = 1 << 21;
    let pm = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut e = vec![0u64; 512];
    pagewise_sys::pagemap::read_entries(pm.as_fd(), region(r), &mut e).unwrap();
    let flags = std::fs::File::open("/proc/kpageflags").unwrap();
    e.iter()
        .filter(|&&x| x & pagewise_sys::pagemap::entry::PRESENT != 0)
        .filter(|&&x| {
            let pfn = x & pagewise_sys::pagemap::entry::PFN_MASK;
            let mut b = [0u8; 8];
            flags.read_exact_at(&mut b, pfn * 8).is_ok() && u64::from_ne_bytes(b) & KPF_KSM != 0
        })
        .count()
}

/// Which of the regions are mergeable (smaps `mg`).
fn mergeable(pid: i32) -> Vec<bool> {
    let mg = pagewise_mech::procfs::with_vm_flag(Some(pid), &["mg"]).unwrap();
    (0..REGIONS)
        .map(|r| {
            let a = LOW + (r * HUGE_PAGE_SIZE) as u64;
            mg.iter().any(|&(s, e)| s <= a && a < e)
        })
        .collect()
}

fn available() -> bool {
    let p = pagewise_mech::probe::get();
    for (ok, what) in [
        (p.ksm, "ksm"),
        (p.madv_collapse, "madv_collapse"),
        (p.process_madvise, "process_madvise"),
    ] {
        if !ok {
            pagewise_testkit::skip!("{}", p.why(what));
            return false;
        }
    }
    if pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!(
            "needs root to start ksmd and to watch writes without splitting huge pages"
        );
        return false;
    }
    if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return false;
    }
    // Another pagewise (an agent running on this machine) may hold KSM:
    // waited for, a minute at most, then said.
    if let Err(e) =
        pagewise_mech::settings::wait_until_free("/sys/kernel/mm/ksm/run", Duration::from_secs(60))
    {
        pagewise_testkit::not_happened!("{e}");
        return false;
    }
    true
}

/// The target's regions made mergeable (the memory it inherited from the
/// test process is left out).
fn merged(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Merge { start, .. } if (region(0)..region(REGIONS)).contains(start) => {
                Some(*start)
            }
            _ => None,
        })
        .collect()
}

fn region(r: usize) -> u64 {
    LOW + (r * HUGE_PAGE_SIZE) as u64
}

#[test]
fn smartmd_splits_cold_duplicates_keeps_hot_and_rebuilds() {
    if !available() {
        return;
    }
    let _one = common::one_target_at_a_time();
    let run_before = std::fs::read_to_string("/sys/kernel/mm/ksm/run").unwrap();
    let scan_before = std::fs::read_to_string("/sys/kernel/mm/ksm/pages_to_scan").unwrap();
    // Absent before Linux 6.7.
    let smart_scan = || std::fs::read_to_string("/sys/kernel/mm/ksm/smart_scan").ok();
    let smart_before = smart_scan();
    let Some(t) = Target::start_huge() else {
        return;
    };
    assert_eq!(huge_regions(t.pid), vec![true; REGIONS], "set-up");
    let opts = Options::default()
        .window(Duration::from_millis(150))
        .thresholds(Some(
            Thresholds::default().cold_max(0).hot_min(2).repetition(0.5),
        ))
        .full_scan(Some(Duration::from_millis(500)))
        .exact(true);
    let mut agent = Agent::new(&[t.pid], opts).unwrap();
    if smart_before.is_some() {
        assert_eq!(
            smart_scan().as_deref(),
            Some("0\n"),
            "smart scan off while the agent runs"
        );
    }
    // Phase 1: the cold identical regions are made mergeable and merged.
    let mut all = Vec::new();
    let mut last = None;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        let s = agent.step().unwrap();
        all.extend(s.actions.clone());
        last = Some(s);
        if ksm_pages(t.pid, 0) + ksm_pages(t.pid, 1) == 1024 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = last.unwrap();
    assert_eq!(
        merged(&all),
        vec![region(0), region(1)],
        "made mergeable: {:?}",
        all
    );
    // The filter found the duplicates: those of the cold regions 0 and 1
    // (identical) always, and those of region 2 too while it is not yet
    // known to be hot (a step looks up cold regions only, and how soon the
    // hot region is known depends on the machine's pace); region 3 (unique)
    // has none, and false positives are rare.
    let exact = s.filter.exact.unwrap();
    let with_hot = (3 * 512 - 512 / STRIDE) as u64;
    assert!(
        exact == 1024 || exact >= with_hot,
        "{exact} pages with a duplicate: {:?}",
        s.filter
    );
    assert!(
        s.filter.false_positive_rate.unwrap() < 0.05,
        "{:?}",
        s.filter
    );
    let merging = ksm_pages(t.pid, 0) + ksm_pages(t.pid, 1);
    assert_eq!(
        merging, 1024,
        "KSM pages of the 1024 identical ones, 30 s on: {s:?}"
    );
    assert!(s.ksm.merging_pages[&t.pid] >= 1024, "ksm_stat: {s:?}");
    assert_eq!(
        (ksm_pages(t.pid, HOT), ksm_pages(t.pid, 3)),
        (0, 0),
        "the kept regions were merged"
    );
    assert_eq!(mergeable(t.pid), vec![true, true, false, false]);
    let huge = huge_regions(t.pid);
    assert_eq!(
        (huge[HOT], huge[3]),
        (true, true),
        "the hot and the unique region stay huge"
    );
    assert!(
        !huge[0] && !huge[1],
        "KSM split the merged huge pages: {huge:?}"
    );
    t.check(false);
    // Phase 2: region 0 turns hot and is rebuilt.
    t.set(2, 1);
    let mut rebuilt = None;
    let t0 = Instant::now();
    while rebuilt.is_none() && t0.elapsed() < Duration::from_secs(30) {
        let s = agent.step().unwrap();
        rebuilt = s.actions.iter().find_map(|a| match a {
            Action::Rebuilt {
                start, huge, why, ..
            } => Some((*start, *huge, why.clone())),
            _ => None,
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    let (start, huge, why) = rebuilt.expect("region 0 rebuilt within 30 s of turning hot");
    assert_eq!(start, region(LATE));
    // The agent retries a collapse the kernel says to retry (EAGAIN); a
    // refusal that outlasts the retries is the kernel's, not the agent's.
    let refused_for_now = why
        .as_deref()
        .is_some_and(|w| w.contains(&std::io::Error::from_raw_os_error(libc::EAGAIN).to_string()));
    if refused_for_now {
        pagewise_testkit::not_happened!(
            "the kernel refused the collapse after unmerging {} times (EAGAIN): {why:?}",
            pagewise_mech::inject::COLLAPSE_TRIES
        );
    } else {
        assert!(huge, "the collapse after unmerging was refused: {why:?}");
        assert!(huge_regions(t.pid)[LATE], "region 0 is huge again");
    }
    assert_eq!(mergeable(t.pid), vec![false, true, false, false]);
    let n = t.check(true);
    assert_eq!(n, (REGIONS * 512) as u64);
    // Released (its pod opted out): nothing left mergeable, and the
    // agent no longer watches it; the end then has nothing to unmerge,
    // and puts KSM's settings back.
    let released = agent.release(t.pid);
    assert!(
        released
            .iter()
            .any(|a| matches!(a, Action::Unmerged { regions, .. } if *regions >= 1)),
        "{released:?}"
    );
    assert_eq!(mergeable(t.pid), vec![false; REGIONS]);
    assert!(!agent.watching(), "the released process is still watched");
    let end = agent.end();
    assert!(
        !end.iter().any(|a| matches!(a, Action::Unmerged { .. })),
        "the end unmerged a released process: {end:?}"
    );
    drop(agent);
    assert_eq!(
        std::fs::read_to_string("/sys/kernel/mm/ksm/run").unwrap(),
        run_before
    );
    assert_eq!(
        std::fs::read_to_string("/sys/kernel/mm/ksm/pages_to_scan").unwrap(),
        scan_before
    );
    assert_eq!(smart_scan(), smart_before);
    t.check(true);
    assert_eq!(Policy::parse("smartmd"), Some(Policy::SmartMd));
}

/// A region written step after step rests unwatched for 1, 2, then 4
/// steps (`hot_backoff` 4) and is never merged meanwhile: the regions
/// found written, step by step, follow that pattern exactly (every region
/// written in every window does: the hot region, and any other the child
/// writes all the time), where without the back-off every step finds
/// them; the hot region is made mergeable in neither run.
#[test]
fn a_region_hot_step_after_step_rests_and_is_never_merged() {
    if !available() {
        return;
    }
    let _one = common::one_target_at_a_time();
    let Some(t) = Target::start_huge() else {
        return;
    };
    for (backoff, pattern) in [
        (0u8, vec![1u64; 11]),
        (4, vec![1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1]),
    ] {
        let opts = Options::default()
            .window(Duration::from_millis(100))
            .policy(Policy::SmartMd)
            .thresholds(Some(
                Thresholds::default().cold_max(0).hot_min(2).repetition(0.5),
            ))
            .hot_backoff(backoff);
        let mut agent = Agent::new(&[t.pid], opts).unwrap();
        let mut written = Vec::new();
        let mut actions = Vec::new();
        for _ in 0..12 {
            let s = agent.step().unwrap();
            written.push(s.written);
            actions.extend(s.actions);
        }
        // The first step only starts watching.
        let got = &written[1..];
        let h = got[0];
        println!("     hot_backoff {backoff}: regions found written per step {got:?}");
        assert!(h >= 1, "the hot region found written: {written:?}");
        let want: Vec<u64> = pattern.iter().map(|p| p * h).collect();
        assert_eq!(got, want, "hot_backoff {backoff}");
        assert!(
            !merged(&actions).contains(&region(HOT)),
            "hot_backoff {backoff}: the hot region made mergeable: {actions:?}"
        );
        agent.end();
    }
    t.check(false);
}

/// The comparison policies choose as they say, on the same known layout:
/// KSM everywhere every region at once; no splitting none (all four are
/// huge pages); Ingens-like the three cold ones, duplicates or not, and
/// never the hot one. No write lost under any. Under Ingens-like, the
/// unique region made mergeable (KSM merges none of it) is then swapped
/// out whole, and the agent still unmerges it at the end.
#[test]
fn comparison_policies_choose_as_they_say() {
    if !available() {
        return;
    }
    let _one = common::one_target_at_a_time();
    for (policy, want) in [
        (Policy::KsmEverywhere, vec![0, 1, 2, 3]),
        (Policy::NoSplitting, vec![]),
        (Policy::IngensLike, vec![0, 1, 3]),
    ] {
        let Some(t) = Target::start_huge() else {
            return;
        };
        let opts = Options::default()
            .window(Duration::from_millis(150))
            .policy(policy)
            .thresholds(Some(
                Thresholds::default().cold_max(0).hot_min(2).repetition(0.5),
            ));
        let mut agent = Agent::new(&[t.pid], opts).unwrap();
        let mut all = Vec::new();
        // A region starts hot: four unwritten windows make it cold.
        for _ in 0..6 {
            all.extend(agent.step().unwrap().actions);
        }
        let want: Vec<u64> = want.into_iter().map(region).collect();
        assert_eq!(merged(&all), want, "{policy:?}: {all:?}");
        let flags = mergeable(t.pid);
        for (r, &f) in flags.iter().enumerate() {
            assert_eq!(f, want.contains(&region(r)), "{policy:?} region {r}");
        }
        if policy == Policy::IngensLike {
            swapped_out_whole_stays_known(&t, &mut agent);
        }
        agent.end();
        assert_eq!(mergeable(t.pid), vec![false; REGIONS], "{policy:?}");
        drop(agent);
        t.check(false);
    }
}

/// With the kernel's advisor pacing ksmd (`advisor_mode` scan-time, a 2 s
/// target, smart scan on as the kernel ships it): ksmd runs at the
/// advisor's pace (`pages_to_scan` no longer its value before), merges the
/// regions made mergeable, and every setting (the advisor's mode and
/// target, `pages_to_scan`, `run`, `smart_scan`) reads as before once the
/// agent is dropped; no write of the target is lost.
#[test]
fn the_kernels_advisor_paces_ksmd_and_every_setting_is_put_back() {
    if !available() {
        return;
    }
    let ksm = |f: &str| pagewise_agent::settings::current(format!("/sys/kernel/mm/ksm/{f}"));
    if ksm("advisor_mode").is_err() {
        pagewise_testkit::skip!(
            "this kernel has no KSM advisor (/sys/kernel/mm/ksm/advisor_mode, Linux 6.9+)"
        );
        return;
    }
    let _one = common::one_target_at_a_time();
    let files = [
        "advisor_mode",
        "advisor_target_scan_time",
        "pages_to_scan",
        "run",
        "smart_scan",
    ];
    let before: Vec<String> = files.iter().map(|f| ksm(f).unwrap()).collect();
    let t = Target::start();
    let opts = Options::default()
        .window(Duration::from_millis(150))
        .policy(Policy::KsmEverywhere)
        .advisor(Some(Duration::from_secs(2)))
        .smart_scan(Some(true))
        .thresholds(Some(
            Thresholds::default().cold_max(0).hot_min(2).repetition(0.5),
        ));
    let mut agent = Agent::new(&[t.pid], opts).unwrap();
    assert_eq!(ksm("advisor_mode").unwrap(), "scan-time");
    assert_eq!(ksm("advisor_target_scan_time").unwrap(), "2");
    assert_eq!(ksm("run").unwrap(), "1");
    if ksm("smart_scan").is_ok() {
        assert_eq!(ksm("smart_scan").unwrap(), "1");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut merging = 0;
    while merging == 0 && Instant::now() < deadline {
        agent.step().unwrap();
        merging = pagewise_mech::procfs::ksm_stat(t.pid).map_or(0, |k| k.merging_pages);
    }
    let paced = ksm("pages_to_scan").unwrap();
    agent.end();
    drop(agent);
    let after: Vec<String> = files.iter().map(|f| ksm(f).unwrap()).collect();
    assert_eq!(after, before, "{files:?} put back");
    t.check(false);
    if merging == 0 {
        pagewise_testkit::not_happened!(
            "KSM merged none of the target's pages in 30 s under the advisor"
        );
        return;
    }
    println!(
        "ok   the advisor paced ksmd ({} pages a scan, {} before), {merging} pages merged; {files:?} back as {before:?}",
        paced, before[2]
    );
}

/// The shim's advice thread, served here on a socketpair: advice that
/// changes no byte is made (the range shows `mg` in smaps, then not),
/// advice that could (`MADV_DONTNEED`) is refused for every range and the
/// memory keeps its contents, and a closed connection ends the thread.
#[test]
fn shim_advice_takes_only_harmless_advice() {
    use pagewise_mech::inject::shim::{note_own_memory, serve, ShimAdvice};
    let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    // The shim's own memory, named in its hello, reaches the agent as is.
    let own = (0x7f00_0000_0000u64, 1u64 << 30);
    note_own_memory(own.0, own.1);
    let server = std::thread::spawn(move || serve(theirs));
    let mut shim = ShimAdvice::hello(mine, Duration::from_secs(5)).unwrap();
    assert_eq!(shim.pid(), std::process::id() as i32);
    assert_eq!(
        shim.own_memory(),
        &[own],
        "the shim's own memory in its hello"
    );
    let inside = pagewise_mech::inject::Inside::Ptrace;
    assert!(
        !inside.is_own_memory(own.0, 4096),
        "ptrace names no own memory"
    );
    let mem = pagewise_mech::workload::AnonMemory::new(4 * PAGE_SIZE).unwrap();
    for p in 0..4 {
        // SAFETY: inside `mem`.
        unsafe { *((mem.addr() as usize + p * PAGE_SIZE) as *mut u8) = 7 + p as u8 };
    }
    let ranges = [
        (mem.addr(), 2 * PAGE_SIZE as u64),
        (mem.addr() + 2 * PAGE_SIZE as u64, 2 * PAGE_SIZE as u64),
    ];
    let mg = || {
        pagewise_mech::procfs::with_vm_flag(None, &["mg"])
            .unwrap()
            .iter()
            .any(|&(s, e)| s <= mem.addr() && mem.addr() < e)
    };
    let p = pagewise_mech::probe::get();
    if p.ksm {
        assert_eq!(
            shim.madvise(&ranges, libc::MADV_MERGEABLE).unwrap(),
            vec![2 * PAGE_SIZE as u64; 2]
        );
        assert!(mg(), "MADV_MERGEABLE made by the shim did not take");
        assert_eq!(
            shim.madvise(&ranges, libc::MADV_UNMERGEABLE).unwrap(),
            vec![2 * PAGE_SIZE as u64; 2]
        );
        assert!(!mg(), "MADV_UNMERGEABLE made by the shim did not take");
    } else {
        pagewise_testkit::skip!("MADV_MERGEABLE through the shim: {}", p.why("ksm"));
    }
    assert_eq!(
        shim.madvise(&ranges, libc::MADV_DONTNEED).unwrap(),
        vec![0, 0],
        "MADV_DONTNEED was not refused"
    );
    for p in 0..4 {
        // SAFETY: inside `mem`.
        let v = unsafe { *((mem.addr() as usize + p * PAGE_SIZE) as *const u8) };
        assert_eq!(v, 7 + p as u8, "page {p} lost its contents");
    }
    drop(shim);
    server.join().unwrap();
}

/// Region 3 (made mergeable, none of it merged) is swapped out whole with
/// `process_madvise(MADV_PAGEOUT)` to zram; the agent steps on with it
/// out of memory. Skipped, with the reason, where zram swap cannot be
/// set up or nothing reached it.
fn swapped_out_whole_stays_known(t: &Target, agent: &mut Agent) {
    let swap = match pagewise_mech::cgroup::ZramSwap::setup(64 << 20) {
        Ok(s) => s,
        Err(why) => {
            pagewise_testkit::skip!("a mergeable region swapped out whole: {why}");
            return;
        }
    };
    let pidfd = pagewise_sys::process::pidfd_open(t.pid).unwrap();
    let _ = pagewise_sys::process::process_madvise(
        std::os::fd::AsRawFd::as_raw_fd(&pidfd),
        &[(region(3), HUGE_PAGE_SIZE)],
        libc::MADV_PAGEOUT,
    );
    let mut runs = Vec::new();
    let present = pagewise_mech::walk::PageWalker::new(Some(t.pid))
        .unwrap()
        .categories(
            pagewise::Region::new(region(3), HUGE_PAGE_SIZE as u64).unwrap(),
            pagewise_sys::pagemap::category::PRESENT,
            pagewise_sys::pagemap::category::PRESENT,
            &mut runs,
        )
        .map(|()| runs.len())
        .unwrap();
    if present != 0 || swap.used() == 0 {
        pagewise_testkit::not_happened!(
            "a mergeable region swapped out whole: MADV_PAGEOUT left {present} runs of it in memory ({} bytes swapped)",
            swap.used()
        );
        return;
    }
    for _ in 0..2 {
        agent.step().unwrap();
    }
    assert!(mergeable(t.pid)[3], "region 3 is still mergeable while out");
    // `end` must still know region 3: the caller checks it is unmerged.
    t.check(false);
}

/// The continuous write watch against the writes a child makes on command
/// (ground truth: the child's own commands, and its memory read back): a
/// write between two takes is reported once, in its region only, whether
/// the child or the kernel on its behalf (`read` from a pipe) makes it; a
/// region not written stays unreported; a written region is watched again
/// after `watch`; `MADV_DONTNEED` and `munmap` are reported as forgotten;
/// every value written is in memory.
#[test]
fn region_writes_reports_every_write_between_takes() {
    use pagewise_mech::access::RegionWrites;
    if pagewise_sys::process::geteuid() != 0 || pagewise_mech::probe::get().uffd_access.is_none() {
        pagewise_testkit::skip!("needs root and userfaultfd to watch another process's writes");
        return;
    }
    const AT: u64 = 0x1300_0000_0000;
    const N: usize = 4;
    let ctl = pagewise_sys::mem::mmap_shared_anonymous(PAGE_SIZE).unwrap() as *mut AtomicU64;
    let mut pipe = [0i32; 2];
    // SAFETY: a two-element array for the descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child maps its memory and obeys commands on the shared
    // page: no allocation, no lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        common::close_inherited(&[pipe[0]]);
        // SAFETY: the control page is mapped for the child's life.
        let c = |i: usize| unsafe { &*ctl.add(i) };
        // SAFETY: a new private mapping at an address nothing else holds.
        let at = unsafe {
            libc::mmap(
                AT as *mut libc::c_void,
                N * HUGE_PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if at as u64 != AT {
            // SAFETY: ends the child.
            unsafe { libc::_exit(1) };
        }
        // Every page populated: a write to a page not yet populated is
        // not reported (there is nothing to protect).
        for r in 0..N {
            for p in 0..512 {
                let at = AT as usize + r * HUGE_PAGE_SIZE + p * PAGE_SIZE;
                // SAFETY: inside the mapping.
                unsafe { std::ptr::write_volatile(at as *mut u64, 1) };
            }
        }
        c(5).store(1, Ordering::SeqCst);
        // Commands: ctl[0] = sequence, ctl[1] = what (1 write, 2 read from
        // the pipe, 3 MADV_DONTNEED, 4 munmap, 9 exit), ctl[3] = region,
        // ctl[4] = value; ctl[2] = the sequence done; ctl[5] = 1 once ready.
        let mut done = 0;
        loop {
            let seq = c(0).load(Ordering::SeqCst);
            if seq == done {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let r = c(3).load(Ordering::SeqCst) as usize;
            let v = c(4).load(Ordering::SeqCst);
            let p = (AT as usize + r * HUGE_PAGE_SIZE + 5 * PAGE_SIZE) as *mut u64;
            // SAFETY: each inside the child's mapping.
            unsafe {
                match c(1).load(Ordering::SeqCst) {
                    1 => std::ptr::write_volatile(p, v),
                    2 => {
                        libc::read(pipe[0], p as *mut libc::c_void, 8);
                    }
                    3 => {
                        libc::madvise(p as *mut libc::c_void, PAGE_SIZE, libc::MADV_DONTNEED);
                    }
                    4 => {
                        libc::munmap(p as *mut libc::c_void, PAGE_SIZE);
                    }
                    _ => libc::_exit(0),
                }
            }
            done = seq;
            c(2).store(seq, Ordering::SeqCst);
        }
    }
    let _kill = common::KillOnDrop(pid);
    // SAFETY: the control page lives as long as the test.
    let c = |i: usize| unsafe { &*ctl.add(i) };
    let t0 = Instant::now();
    while c(5).load(Ordering::SeqCst) != 1 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(c(5).load(Ordering::SeqCst), 1, "the child did not start");
    let mut seq = 0;
    let mut command = |what: u64, r: usize, v: u64| {
        seq += 1;
        c(1).store(what, Ordering::SeqCst);
        c(3).store(r as u64, Ordering::SeqCst);
        c(4).store(v, Ordering::SeqCst);
        c(0).store(seq, Ordering::SeqCst);
        let t0 = Instant::now();
        while c(2).load(Ordering::SeqCst) != seq {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "command {what} not done"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let region = |r: usize| AT + (r * HUGE_PAGE_SIZE) as u64;
    let regions: Vec<pagewise::Region> = (0..N)
        .map(|r| pagewise::Region {
            start: region(r),
            len: HUGE_PAGE_SIZE as u64,
        })
        .collect();
    let none = std::collections::BTreeSet::new();
    let mut w = RegionWrites::new(pid).unwrap();
    w.watch(&regions, &none).unwrap();
    let set = |v: &[usize]| {
        v.iter()
            .map(|&r| region(r))
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(w.take().unwrap().written, set(&[]), "nothing written yet");
    w.watch(&regions, &none).unwrap();
    command(1, 1, 11);
    command(1, 1, 12);
    assert_eq!(
        w.take().unwrap().written,
        set(&[1]),
        "two writes to region 1"
    );
    w.watch(&regions, &none).unwrap();
    assert_eq!(w.take().unwrap().written, set(&[]), "no write since");
    w.watch(&regions, &none).unwrap();
    command(1, 1, 13);
    command(1, 2, 21);
    let bytes = [0x33u8; 8];
    // SAFETY: writes 8 bytes from a local to the pipe.
    let sent = unsafe { libc::write(pipe[1], bytes.as_ptr().cast(), 8) };
    assert_eq!(sent, 8);
    command(2, 0, 0);
    assert_eq!(
        w.take().unwrap().written,
        set(&[0, 1, 2]),
        "region 1 again after watch, region 2, and region 0 written by the kernel"
    );
    w.watch(&regions, &none).unwrap();
    command(3, 3, 0);
    let taken = w.take().unwrap();
    assert!(taken.written.is_empty(), "{taken:?}");
    assert!(
        taken.forgets(region(3)) && !taken.forgets(region(2)),
        "{taken:?}"
    );
    w.watch(&regions, &none).unwrap();
    // The values are in memory.
    let mut word = vec![0u8; PAGE_SIZE];
    let value = |r: usize, page: &mut Vec<u8>| {
        pagewise_mech::remote::read(pid, region(r) + 5 * PAGE_SIZE as u64, page).unwrap();
        u64::from_ne_bytes(page[..8].try_into().unwrap())
    };
    assert_eq!(value(0, &mut word), 0x3333_3333_3333_3333);
    assert_eq!(value(1, &mut word), 13);
    assert_eq!(value(2, &mut word), 21);
    assert_eq!(value(3, &mut word), 0, "dropped");
    command(4, 2, 0);
    let taken = w.take().unwrap();
    assert!(taken.forgets(region(2)), "munmap: {taken:?}");
    drop(w);
    // Unwatched, the child goes on writing without anyone serving it.
    command(1, 1, 14);
    assert_eq!(value(1, &mut word), 14);
}

/// Regression: watching registered runs of 2 MiB regions, which split a
/// mapping not on 2 MiB bounds (and `release` unregistered one region,
/// splitting it again): the program's `mremap` of its buffer then spans
/// two mappings and fails with `EFAULT` (`dedup run` on a program moving a
/// buffer of 16 MiB and a page: 10,099 of 10,345 failed). The child's
/// mapping is a page off 2 MiB at both ends; its mappings (count and
/// bounds, from `/proc/PID/maps`) must read as before after each watch,
/// after a write is served, after a release and after the end, and a
/// region whose protection a release lifted is reported unwatched.
#[test]
fn region_writes_never_splits_the_mapping_it_watches() {
    use pagewise_mech::access::RegionWrites;
    if pagewise_sys::process::geteuid() != 0 || pagewise_mech::probe::get().uffd_access.is_none() {
        pagewise_testkit::skip!("needs root and userfaultfd to watch another process's writes");
        return;
    }
    const AT: u64 = 0x1400_0000_0000 - PAGE_SIZE as u64;
    const N: usize = 4;
    const LEN: usize = N * HUGE_PAGE_SIZE + 2 * PAGE_SIZE;
    let ctl = pagewise_sys::mem::mmap_shared_anonymous(PAGE_SIZE).unwrap() as *mut AtomicU64;
    // SAFETY: the child maps its memory and writes it on command from the
    // shared page: no allocation, no lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        common::close_inherited(&[]);
        // SAFETY: the control page is mapped for the child's life.
        let c = |i: usize| unsafe { &*ctl.add(i) };
        // SAFETY: a new private mapping at an address nothing else holds.
        let at = unsafe {
            libc::mmap(
                AT as *mut libc::c_void,
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if at as u64 != AT {
            // SAFETY: ends the child.
            unsafe { libc::_exit(1) };
        }
        for p in (0..LEN).step_by(PAGE_SIZE) {
            // SAFETY: inside the mapping.
            unsafe { std::ptr::write_volatile((AT as usize + p) as *mut u64, 1) };
        }
        c(1).store(1, Ordering::SeqCst);
        // ctl[0]: a sequence; each new one writes region ctl[2] and says
        // it done in ctl[3].
        let mut done = 0;
        loop {
            let seq = c(0).load(Ordering::SeqCst);
            if seq != done {
                let r = c(2).load(Ordering::SeqCst) as usize;
                let p = AT as usize + PAGE_SIZE + r * HUGE_PAGE_SIZE;
                // SAFETY: inside the mapping.
                unsafe { std::ptr::write_volatile(p as *mut u64, seq) };
                done = seq;
                c(3).store(seq, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let _kill = common::KillOnDrop(pid);
    // SAFETY: the control page lives as long as the test.
    let c = |i: usize| unsafe { &*ctl.add(i) };
    let t0 = Instant::now();
    while c(1).load(Ordering::SeqCst) != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the child did not start"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // How many mappings the child has, and those over its buffer.
    let maps = || -> (usize, Vec<(u64, u64)>) {
        let all = pagewise_mech::procfs::maps(Some(pid)).unwrap();
        let over = all
            .iter()
            .filter(|m| m.start < AT + LEN as u64 && AT < m.end)
            .map(|m| (m.start, m.end))
            .collect();
        (all.len(), over)
    };
    let before = maps();
    assert_eq!(before.1, vec![(AT, AT + LEN as u64)], "{before:x?}");
    let region = |r: usize| AT + PAGE_SIZE as u64 + (r * HUGE_PAGE_SIZE) as u64;
    let regions: Vec<pagewise::Region> = (0..N)
        .map(|r| pagewise::Region {
            start: region(r),
            len: HUGE_PAGE_SIZE as u64,
        })
        .collect();
    let none = std::collections::BTreeSet::new();
    let mut seq = 0;
    let mut write = |r: usize| {
        seq += 1;
        c(2).store(r as u64, Ordering::SeqCst);
        c(0).store(seq, Ordering::SeqCst);
        let t0 = Instant::now();
        while c(3).load(Ordering::SeqCst) != seq {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the child's write {seq} to region {r} was not served"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let mut w = RegionWrites::new(pid).unwrap();
    w.watch(&regions, &none).unwrap();
    assert_eq!(maps(), before, "after the first watch");
    write(1);
    let taken = w.take().unwrap();
    assert!(taken.written.contains(&region(1)), "{taken:?}");
    w.watch(&regions, &none).unwrap();
    assert_eq!(maps(), before, "after a write was served and watched again");
    w.release(regions[2]);
    assert_eq!(maps(), before, "after a release");
    let taken = w.take().unwrap();
    let unwatched: Vec<u64> = taken.unwatched.iter().copied().collect();
    assert_eq!(
        unwatched,
        vec![region(0), region(1), region(3)],
        "the other regions of the mapping, their watch lifted with it"
    );
    w.watch(&regions, &none).unwrap();
    write(3);
    assert!(w.take().unwrap().written.contains(&region(3)));
    drop(w);
    assert_eq!(maps(), before, "after the end");
    write(0);
    println!(
        "ok   {} mappings as before through watch, write, release and end",
        before.0
    );
}

/// With [`Options::whole_mappings`], memory is made mergeable only as
/// whole mappings, so the target's mappings read as before (count and
/// bounds, `/proc/PID/maps`) at every step: under KSM everywhere its
/// whole mapping is made mergeable (every region flagged `mg` by the
/// kernel) and unmerged at the end; under SmartMD, where region 2 is hot
/// and region 3 unique, nothing of the mapping is (per region, regions 0
/// and 1 would be, splitting it in two).
#[test]
fn whole_mappings_are_merged_whole_or_not_at_all() {
    if !available() {
        return;
    }
    let _one = common::one_target_at_a_time();
    for (policy, want) in [
        (Policy::KsmEverywhere, vec![true; REGIONS]),
        (Policy::SmartMd, vec![false; REGIONS]),
    ] {
        let Some(t) = Target::start_huge() else {
            return;
        };
        let maps = || -> (usize, Vec<(u64, u64)>) {
            let all = pagewise_mech::procfs::maps(Some(t.pid)).unwrap();
            let over = all
                .iter()
                .filter(|m| m.start < region(REGIONS) && LOW < m.end)
                .map(|m| (m.start, m.end))
                .collect();
            (all.len(), over)
        };
        let before = maps();
        assert_eq!(before.1, vec![(LOW, region(REGIONS))], "{policy:?}");
        let opts = Options::default()
            .window(Duration::from_millis(150))
            .policy(policy)
            .whole_mappings(true)
            .thresholds(Some(
                Thresholds::default().cold_max(0).hot_min(2).repetition(0.5),
            ));
        let mut agent = Agent::new(&[t.pid], opts).unwrap();
        let mut all = Vec::new();
        // A region starts hot: four unwritten windows make it cold.
        for i in 0..6 {
            all.extend(agent.step().unwrap().actions);
            assert_eq!(maps(), before, "{policy:?}: after step {i}: {all:?}");
        }
        assert_eq!(mergeable(t.pid), want, "{policy:?}: {all:?}");
        agent.end();
        assert_eq!(maps(), before, "{policy:?}: after the end");
        assert_eq!(mergeable(t.pid), vec![false; REGIONS], "{policy:?}");
        drop(agent);
        t.check(false);
        println!(
            "ok   {policy:?}: mergeable {want:?}, {} mappings as before",
            before.0
        );
    }
}

/// A program that serves the faults of its own memory and registers it
/// late (`tests/c/late_uffd.c`, 4 MiB on 2 MiB bounds, half written),
/// under SmartMD: while it holds a userfaultfd, from the start or made
/// after the agent began, the agent watches none of its writes (said, with
/// the reason), so its own registration succeeds; then it evicts what it
/// serves and writes it again while the agent steps, and its handler (which
/// fails the program on any fault it did not cause) sees only its own.
/// Before, the write watch had taken the mapping first: "FAIL: register:
/// 16 (Device or resource busy)".
#[test]
fn a_program_that_serves_its_own_faults_keeps_its_memory_to_itself() {
    if !available() {
        return;
    }
    let _one = common::one_target_at_a_time();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../mechanisms/mech/tests/c/late_uffd.c");
    let bin = match pagewise_testkit::c_program(
        &src,
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        &["-pthread"],
    ) {
        Ok(b) => b,
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            return;
        }
    };
    for args in [&[][..], &["later"][..]] {
        let mut p = pagewise_testkit::Piped::start(std::process::Command::new(&bin).args(args));
        let ready = p.line();
        assert!(ready.starts_with("ready"), "{args:?}: {ready:?}");
        let opts = Options::default()
            .window(Duration::from_millis(50))
            .policy(Policy::SmartMd)
            .thresholds(Some(Thresholds::default().cold_max(0).hot_min(2)));
        let mut agent = Agent::new(&[p.pid()], opts).unwrap();
        let mut actions = Vec::new();
        let mut step = |agent: &mut Agent| actions.extend(agent.step().unwrap().actions);
        step(&mut agent);
        if args == ["later"] {
            step(&mut agent);
            assert_eq!(p.ask("make"), "made", "{args:?}");
        }
        step(&mut agent);
        assert_eq!(p.ask("register"), "registered", "{args:?}");
        for round in 0..3 {
            step(&mut agent);
            assert_eq!(p.ask("evict"), "evicted", "{args:?} round {round}");
            step(&mut agent);
            assert_eq!(p.ask("40"), "ok", "{args:?} round {round}");
        }
        agent.end();
        assert_eq!(p.ask("1"), "ok", "{args:?}: after the end");
        let said = actions.iter().any(|a| {
            matches!(a, Action::NoCoverage { why, .. } if why.contains("userfaultfd of its own"))
        });
        assert!(
            said,
            "{args:?}: the reason its writes go unwatched: {actions:?}"
        );
    }
}
