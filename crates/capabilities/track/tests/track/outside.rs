//! Tracking another process from outside (`uffd-wp` made inside it under
//! ptrace, `hash` where that cannot be), against a shadow copy of its
//! memory read with `process_vm_readv`: no write lost, no trace left.

use super::*;

/// Whether uffd-wp from outside can run here; if not, says why as a skip.
fn outside_possible() -> bool {
    match BackendKind::UffdWp.available_for_pid() {
        Ok(()) => true,
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            false
        }
    }
}

/// uffd-wp from outside, against ground truth: two threads of another
/// process write random pages while it is tracked; a shadow copy updated
/// only with the reported pages (read from the process) equals the memory
/// once the process is stopped and collected a last time.
#[test]
fn uffd_wp_from_outside_loses_no_write() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    let w = common::Writer::start(2048);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut t = DirtyTracker::for_process(w.pid, BackendKind::UffdWp).unwrap();
    assert_eq!(t.backend(), BackendKind::UffdWp);
    let mut shadow = w.read_all();
    let base = w.region.start;
    let mut reported = 0u64;
    let update = |c: &Collection, shadow: &mut Vec<u8>| -> u64 {
        let mut n = 0;
        for r in &c.ranges {
            let (s, e) = (r.start.max(base), (r.start + r.len()).min(w.region.end()));
            if s >= e {
                continue;
            }
            let off = (s - base) as usize;
            let got =
                pagewise_mech::remote::read(w.pid, s, &mut shadow[off..off + (e - s) as usize])
                    .unwrap();
            assert_eq!(got as u64, e - s);
            n += (e - s) / PAGE_SIZE as u64;
        }
        n
    };
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(15));
        t.sync_process_mappings(Some(w.pid), false).unwrap();
        let c = t.collect().unwrap();
        reported += update(&c, &mut shadow);
    }
    let stopped = pagewise_mech::stop::Stopped::new(w.pid).unwrap();
    let c = t.collect().unwrap();
    reported += update(&c, &mut shadow);
    let live = w.read_all();
    drop(stopped);
    let differ = (0..live.len() / PAGE_SIZE)
        .filter(|p| {
            live[p * PAGE_SIZE..(p + 1) * PAGE_SIZE] != shadow[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]
        })
        .count();
    assert_eq!(differ, 0, "{differ} pages written but never reported");
    assert!(
        reported > 0,
        "nothing was written: the test checked nothing"
    );
    println!(
        "     uffd-wp from outside: {reported} pages reported over 21 collections, shadow matches"
    );
}

/// Detaching leaves no trace: the same descriptors, no range registered
/// for uffd-wp, and the process runs on (or stays stopped if its user had
/// stopped it).
#[test]
fn uffd_wp_from_outside_leaves_no_trace() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    let fds = |pid: i32| {
        let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let uw = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/smaps"))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "uw"))
            .count()
    };
    let state = |pid: i32| {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        s[s.rfind(')').unwrap() + 2..].chars().next().unwrap()
    };
    let w = common::Writer::start(256);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let before = fds(w.pid);
    let mut t = DirtyTracker::for_process(w.pid, BackendKind::UffdWp).unwrap();
    assert!(
        uw(w.pid) > 0,
        "no range registered while tracking: the test checks nothing"
    );
    t.collect().unwrap();
    drop(t);
    assert_eq!(fds(w.pid), before, "descriptors after detach");
    assert_eq!(uw(w.pid), 0, "a range left registered for uffd-wp");
    let a = w.read_all();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_ne!(a, w.read_all(), "the process does not run on");
    // Stopped by its user: stays stopped.
    // SAFETY: our own child.
    unsafe { libc::kill(w.pid, libc::SIGSTOP) };
    assert!(wait_for("the child stopped", 5, || state(w.pid) == 'T'));
    // It cannot make the userfaultfd call: refused, and `auto` falls back.
    let e = DirtyTracker::for_process(w.pid, BackendKind::UffdWp).unwrap_err();
    assert!(
        matches!(
            e,
            pagewise_track::Error::Mech(pagewise::MechError::Refused(pagewise_mech::stop::Refusal::JobStopped { pid, .. })) if pid == w.pid
        ),
        "{e:?}"
    );
    let t = DirtyTracker::for_process(w.pid, BackendKind::Auto).unwrap();
    assert_ne!(t.backend(), BackendKind::UffdWp);
    assert!(
        t.note().is_some_and(|n| n.contains("stopped")),
        "{:?}",
        t.note()
    );
    drop(t);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(state(w.pid), 'T', "a process its user stopped was resumed");
    // SAFETY: our own child.
    unsafe { libc::kill(w.pid, libc::SIGCONT) };
}

/// `n` bytes of process `pid` at `at`.
fn remote_bytes(pid: i32, at: u64, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    assert_eq!(pagewise_mech::remote::read(pid, at, &mut b).unwrap(), n);
    b
}

/// A shadow copy of a scripted child's region, updated only with the pages
/// a tracker reports (read from the child).
struct OutsideShadow {
    base: u64,
    end: u64,
    shadow: Vec<u8>,
}

impl OutsideShadow {
    fn new(s: &common::Scripted) -> Self {
        OutsideShadow {
            base: s.region.start,
            end: s.region.end(),
            shadow: remote_bytes(s.pid, s.region.start, s.region.len as usize),
        }
    }

    /// Collects, updates the shadow with the reported pages of the region,
    /// and checks it equals the region (the child idles in its read); the
    /// pages of the region reported.
    fn check(&mut self, s: &common::Scripted, t: &mut DirtyTracker, what: &str) -> u64 {
        let (base, end) = (self.base, self.end);
        t.sync_process_mappings(Some(s.pid), false).unwrap();
        let c = t.collect().unwrap();
        let mut ours = 0;
        for r in &c.ranges {
            let (a, b) = (r.start.max(base), (r.start + r.len()).min(end));
            if a < b {
                let off = (a - base) as usize;
                self.shadow[off..off + (b - a) as usize].copy_from_slice(&remote_bytes(
                    s.pid,
                    a,
                    (b - a) as usize,
                ));
                ours += (b - a) / PAGE_SIZE as u64;
            }
        }
        let live = remote_bytes(s.pid, base, (end - base) as usize);
        let lost = (0..live.len() / PAGE_SIZE)
            .filter(|p| {
                live[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]
                    != self.shadow[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]
            })
            .count();
        assert_eq!(lost, 0, "{what}: {lost} written pages not reported");
        println!(
            "     {what}: {ours} pages of the region reported, {} in all",
            c.stats.pages_dirty
        );
        ours
    }
}

/// uffd-wp from outside while the program changes the protection of its
/// pages (read-only and back, inaccessible and back): writes before and
/// after are all reported.
#[test]
fn uffd_wp_from_outside_program_calling_mprotect() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    let mut s = common::Scripted::start(256);
    let mut t = DirtyTracker::for_process(s.pid, BackendKind::UffdWp).unwrap();
    let mut sh = OutsideShadow::new(&s);
    s.tell(b'w', 21 | (0x50 << 16));
    s.tell(b'p', 20 | (16 << 16));
    s.tell(b'w', 25 | (0x51 << 16));
    assert!(sh.check(&s, &mut t, "read-only and back, then a write") >= 2);
    s.tell(b'n', 40 | (8 << 16));
    s.tell(b'w', 44 | (0x52 << 16));
    s.tell(b'w', 200 | (0x53 << 16));
    assert!(sh.check(&s, &mut t, "inaccessible and back, then writes") >= 2);
    s.tell(b'w', 22 | (0x54 << 16));
    assert!(sh.check(&s, &mut t, "a write to a page it had made read-only") >= 1);
}

/// uffd-wp from outside over huge pages: the program's region is collapsed
/// before tracking (a range armed for tracking may not be collapsed), then
/// written, then a huge page is split (part of it dropped) and written
/// around: every write reported.
#[test]
fn uffd_wp_from_outside_thp_collapse_and_split() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    if let Err(why) = thp_available() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let mut s = common::Scripted::start(1024);
    if s.tell(b'h', 0) == 0 {
        pagewise_testkit::claim_not_happened!(
            "madv_collapse",
            "MADV_COLLAPSE of the program's fresh 4 MiB refused by the kernel"
        );
        return;
    }
    let huge = anon_huge_kib_of(s.pid, s.region.start);
    if huge == 0 {
        pagewise_testkit::not_happened!(
            "MADV_COLLAPSE succeeded but no huge page backs the program's region"
        );
        return;
    }
    let mut t = DirtyTracker::for_process(s.pid, BackendKind::UffdWp).unwrap();
    let mut sh = OutsideShadow::new(&s);
    s.tell(b'w', 5 | (0x61 << 16));
    s.tell(b'w', 600 | (0x62 << 16));
    assert!(sh.check(&s, &mut t, "writes into huge pages") >= 2);
    s.tell(b'd', (512 + 8) | (4 << 16));
    s.tell(b'w', (512 + 9) | (0x63 << 16));
    s.tell(b'w', (512 + 200) | (0x64 << 16));
    assert!(sh.check(&s, &mut t, "after a split") >= 2);
    println!(
        "     thp from outside: {huge} KiB of huge pages tracked, {} KiB after the split",
        anon_huge_kib_of(s.pid, s.region.start)
    );
}

/// uffd-wp from outside over pages KSM merged: no write reported while
/// nothing is written, then writes to merged pages (which break the
/// sharing) all reported.
#[test]
fn uffd_wp_from_outside_ksm() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    let p = pagewise_mech::probe::get();
    if !p.ksm {
        pagewise_testkit::skip!("{}", p.why("ksm"));
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
    // Its pages are alike (one byte 3 at the start): KSM merges them.
    let mut s = common::Scripted::start(1024);
    s.tell(b'k', 0);
    let merging = |pid: i32| procfs::ksm_stat(pid).map_or(0, |k| k.merging_pages);
    if !wait_for("KSM merging", 30, || merging(s.pid) >= 100) {
        pagewise_testkit::not_happened!(
            "ksmd merged fewer than 100 of the program's 1024 like pages within 30 s"
        );
        return;
    }
    let merged = merging(s.pid);
    let mut t = DirtyTracker::for_process(s.pid, BackendKind::UffdWp).unwrap();
    let mut sh = OutsideShadow::new(&s);
    sh.check(&s, &mut t, "KSM pages, nothing written");
    for p in (0..1024u64).step_by(37) {
        s.tell(b'w', p | (0x71 << 16));
    }
    assert!(sh.check(&s, &mut t, "writes to KSM pages") >= 28);
    println!("     ksm from outside: {merged} pages merged when tracking began");
}

/// A process another tracer holds (a debugger), or one whose seccomp
/// filter refuses userfaultfd when pagewise is told to respect it: uffd-wp
/// from outside is refused with that reason, `auto` falls back to `hash`
/// and says why, and `hash` reports exactly the pages the program writes.
/// (With the filter suspended, uffd-wp works.)
#[test]
fn a_traced_or_seccomp_target_falls_back_to_hash() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    for case in ["traced", "seccomp"] {
        let mut s = common::Scripted::start(256);
        let mut tracer = None;
        if case == "traced" {
            let target = s.pid;
            // SAFETY: the child makes two system calls and waits to be killed.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                common::close_inherited(&[]);
                // SAFETY: plain system calls in the child.
                unsafe {
                    if libc::ptrace(libc::PTRACE_SEIZE, target, 0, 0) != 0 {
                        libc::_exit(1);
                    }
                    loop {
                        libc::pause();
                    }
                }
            }
            tracer = Some(KillOnDrop(pid));
            assert!(wait_for("the tracer attached", 30, || {
                std::fs::read_to_string(format!("/proc/{target}/status"))
                    .ok()
                    .and_then(|st| procfs::status_field(&st, "TracerPid"))
                    == Some(pid as u64)
            }));
        } else {
            s.tell(b's', 0);
            // Suspended around pagewise's own calls, the filter refuses
            // nothing (where this process may suspend it); respected, it
            // refuses the userfaultfd call.
            match pagewise_mech::seccomp::tracer_limit() {
                None => {
                    let t = DirtyTracker::for_process(s.pid, BackendKind::UffdWp).unwrap();
                    assert_eq!(t.backend(), BackendKind::UffdWp);
                }
                Some(why) => println!("skip uffd-wp under a suspended filter: {why}"),
            }
            pagewise_mech::seccomp::set_thread_policy(Some(
                pagewise_mech::seccomp::Policy::Respect,
            ));
        }
        let e = DirtyTracker::for_process(s.pid, BackendKind::UffdWp).unwrap_err();
        use pagewise_mech::Refusal;
        let refused_for_it = match &e {
            pagewise_track::Error::Mech(pagewise::MechError::Refused(r)) => match r {
                Refusal::Traced { pid, .. } => case == "traced" && *pid == s.pid,
                Refusal::Seccomp { pid, .. } => case == "seccomp" && *pid == s.pid,
                _ => false,
            },
            _ => false,
        };
        assert!(refused_for_it, "{case}: {e:?}");
        let mut t = DirtyTracker::for_process(s.pid, BackendKind::Auto).unwrap();
        assert_eq!(t.backend(), BackendKind::Hash, "{case}");
        assert!(
            t.note().is_some_and(|n| n.contains(case)),
            "{case}: {:?}",
            t.note()
        );
        let mut sh = OutsideShadow::new(&s);
        for p in [7u64, 8, 130] {
            s.tell(b'w', p | (0x81 << 16));
        }
        assert_eq!(
            sh.check(&s, &mut t, &format!("{case}, hash from outside")),
            3
        );
        drop(tracer);
    }
    pagewise_mech::seccomp::set_thread_policy(None);
}

/// A tracer child, killed and reaped when dropped: declared after the
/// target, it goes first, so that a failed check ends in its report
/// rather than in the target's reaping, which waits for as long as the
/// tracer holds it.
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// A tracked process that replaces its program (exec): the next collection
/// ends tracking with one clear error saying so, and the ones after give
/// the same, with no range left registered in the new program.
#[test]
fn uffd_wp_from_outside_exec_is_a_clear_end() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    let mut s = common::Scripted::start(64);
    let mut t = DirtyTracker::for_process(s.pid, BackendKind::UffdWp).unwrap();
    s.tell(b'w', 3 | (0x42 << 16));
    t.sync_process_mappings(Some(s.pid), false).unwrap();
    assert!(t.collect().unwrap().stats.pages_dirty >= 1);
    s.send(b'e', 0);
    let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    assert!(wait_for("the exec", 5, || exe(s.pid).ends_with("sleep")));
    for i in 0..2 {
        let e = t
            .sync_process_mappings(Some(s.pid), false)
            .and_then(|_| t.collect().map(|_| ()))
            .unwrap_err();
        assert!(
            matches!(e, pagewise_track::Error::Mech(pagewise::MechError::ProgramReplaced(p)) if p == s.pid),
            "collection {i} after exec: {e:?}"
        );
    }
    let uw = std::fs::read_to_string(format!("/proc/{}/smaps", s.pid))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "uw"))
        .count();
    assert_eq!(uw, 0, "ranges registered in the new program");
    drop(t);
}

/// uffd-wp from outside through the cases the in-process tracker is tested
/// on: writes, MADV_DONTNEED then write, a fork whose child writes (not the
/// parent's write), a new mapping written; after each step a shadow copy
/// updated with the reported pages equals the memory. Then the process
/// exits: a clear end.
#[test]
fn uffd_wp_from_outside_follows_the_process() {
    let _one = common::one_target_at_a_time();
    if !outside_possible() {
        return;
    }
    let mut s = common::Scripted::start(256);
    let mut t = DirtyTracker::for_process(s.pid, BackendKind::UffdWp).unwrap();
    let base = s.region.start;
    let read = remote_bytes;
    let mut sh = OutsideShadow::new(&s);
    let mut check = |s: &mut common::Scripted, t: &mut DirtyTracker, what: &str| -> u64 {
        sh.check(s, t, what)
    };
    for p in [3u64, 4, 100, 255] {
        s.tell(b'w', p | (0x42 << 16));
    }
    assert!(check(&mut s, &mut t, "writes") >= 4);
    s.tell(b'd', 10 | (20 << 16));
    check(&mut s, &mut t, "MADV_DONTNEED of 20 pages");
    s.tell(b'w', 12 | (0x43 << 16));
    assert!(check(&mut s, &mut t, "write after DONTNEED") >= 1);
    s.tell(b'f', 50);
    check(&mut s, &mut t, "fork, the child writes page 50");
    assert_ne!(
        read(s.pid, base + 50 * PAGE_SIZE as u64, PAGE_SIZE)[80],
        0xCC,
        "the forked child's write showed in the parent"
    );
    s.tell(b'm', 8);
    let c = {
        t.sync_process_mappings(Some(s.pid), false).unwrap();
        t.collect().unwrap()
    };
    assert!(
        c.stats.pages_dirty >= 8,
        "a new mapping's 8 written pages: {}",
        c.stats.pages_dirty
    );
    // Exit: the next collection says the process is gone.
    let _ = std::io::Write::write_all(&mut s.cmd, &[b'x'; 9]);
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(s.pid, &mut status, 0) };
    let e = t
        .sync_process_mappings(Some(s.pid), false)
        .and_then(|_| t.collect().map(|_| ()));
    assert!(
        matches!(
            e,
            Err(pagewise_track::Error::Mech(
                pagewise::MechError::ProcessExited(_)
            ))
        ),
        "after exit: {e:?}"
    );
}

/// Fragmented memory: more runs than one `PAGEMAP_SCAN` vector holds
/// (every other page present, then every other page written). Each run is
/// reported once, in order, and the pages add up to the exact count (a
/// walk resumed at `walk_end` reported runs twice).
#[test]
fn fragmented_memory_is_walked_once() {
    let p = pagewise_mech::probe::get();
    if !p.pagemap_scan {
        pagewise_testkit::skip!("{}", p.why("pagemap_scan"));
        return;
    }
    const PAGES: usize = 20_000;
    let m =
        common::Mapped::new(pagewise_mech::procfs::MemoryKind::PrivateAnonymous, PAGES).unwrap();
    // Mapped fills every page; drop every other one.
    for i in (1..PAGES).step_by(2) {
        // SAFETY: a page of our own mapping, whose contents we do not need.
        let r = unsafe {
            libc::madvise(
                (m.addr as usize + i * PAGE_SIZE) as *mut libc::c_void,
                PAGE_SIZE,
                libc::MADV_DONTNEED,
            )
        };
        assert_eq!(r, 0);
    }
    let region = pagewise::Region::new(m.addr, (PAGES * PAGE_SIZE) as u64).unwrap();
    let mut w = pagewise_mech::walk::PageWalker::new(None).unwrap();
    let mut runs = Vec::new();
    let present = pagewise_sys::pagemap::category::PRESENT;
    w.categories(region, present, present, &mut runs).unwrap();
    assert_eq!(runs.len(), PAGES / 2, "runs of present pages");
    assert!(
        runs.windows(2).all(|r| r[0].end <= r[1].start),
        "a run reported twice or out of order"
    );
    let pages: u64 = runs
        .iter()
        .map(|r| (r.end - r.start) / PAGE_SIZE as u64)
        .sum();
    assert_eq!(pages, (PAGES / 2) as u64);
    if pagewise_track::BackendKind::UffdWp
        .available_in_process()
        .is_err()
    {
        pagewise_testkit::skip!("uffd-wp: the written-page scan half");
        return;
    }
    let mut t = DirtyTracker::new(&[region], BackendKind::UffdWp).unwrap();
    for i in (0..PAGES).step_by(2) {
        // SAFETY: a byte of our own mapping.
        unsafe { *((m.addr as usize + i * PAGE_SIZE) as *mut u8) ^= 1 };
    }
    let c = t.collect().unwrap();
    assert_eq!(c.ranges.len(), PAGES / 2, "runs of written pages");
    assert_eq!(
        pagewise_mech::region::total_pages(&c.ranges),
        (PAGES / 2) as u64
    );
}

/// The targets these tests fork hold none of the test process's
/// descriptors once started: a userfaultfd another test thread holds, seen
/// in a fresh child's table until it has closed what it inherited, would
/// read as the target's own and turn `Auto` to hash for that reason (seen
/// in 32 to 50 of 50 starts before `Scripted::start` waited for it).
#[test]
fn a_started_target_holds_no_userfaultfd_of_ours() {
    let _one = common::one_target_at_a_time();
    let ours = match pagewise_mech::wp::UffdWp::open() {
        Ok(w) => w,
        Err(e) => {
            println!("skip: no userfaultfd in this process to leak ({e})");
            return;
        }
    };
    let held = (0..20)
        .filter(|_| {
            let s = common::Scripted::start(4);
            pagewise_mech::procfs::owns_userfaultfd(s.pid)
        })
        .count();
    drop(ours);
    assert_eq!(
        held, 0,
        "started targets seen holding this process's userfaultfd"
    );
}
