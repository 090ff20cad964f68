//! A program that serves the faults of its own memory and registers it
//! late (`tests/c/late_uffd.c`): reading that memory from outside hands
//! its handler no event, and nothing pagewise does to the process first
//! takes the memory the program registers afterwards.

use super::{can_ptrace, target, Target};
use pagewise_track::{BackendKind, DirtyTracker};
use std::io::Write;

const PAGE: u64 = pagewise::PAGE_SIZE as u64;
/// Pages of its region OWN (4 MiB), and of PLAIN.
const OWN_PAGES: u64 = 1024;
const PLAIN_PAGES: u64 = 64;

/// The program, started with `args`, and its regions' addresses.
fn start(args: &[&str]) -> Option<(Target, u64, u64)> {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return None;
    }
    let path = target("late_uffd", &["-pthread"])?;
    let t = Target::start(&path, args, true);
    let a: Vec<u64> = t
        .ready
        .split_whitespace()
        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
        .collect();
    Some((t, a[0], a[1]))
}

impl Target {
    /// Sends `line` and checks the answer: `want`, not a "FAIL" of its
    /// handler or of its registration.
    fn ask(&mut self, line: &str, want: &str) {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        let got = self.line();
        assert_eq!(got, want, "the program's answer to {line:?}");
    }
}

/// The pages of `[base, base + n pages)` a collection reported.
fn reported(c: &pagewise_track::Collection, base: u64, n: u64) -> u64 {
    (0..n)
        .filter(|i| {
            let a = base + i * PAGE;
            c.ranges.iter().any(|r| r.start <= a && a < r.end())
        })
        .count() as u64
}

/// Every page of the region the program serves itself read from outside,
/// whole and in parts, before and after it evicts half of it: the pages
/// in memory read as written, those not in memory as zeros, and its
/// handler (which fails the program on any fault it did not cause) sees
/// none of it. Before reads of pages not in memory went through
/// `/proc/PID/mem`, the first such read was a read fault in its handler:
/// "FAIL: event 18 flags 0".
#[test]
fn reading_memory_it_serves_itself_gives_its_handler_no_fault() {
    let Some((mut t, _, own)) = start(&[]) else {
        return;
    };
    let pid = t.pid();
    t.ask("register", "registered");
    let served = pagewise_mech::procfs::uffd_served(Some(pid)).unwrap();
    assert_eq!(
        served,
        [(own, own + OWN_PAGES * PAGE)],
        "the kernel's verdict (smaps um): what the program registered"
    );
    let mut whole = vec![0xffu8; (OWN_PAGES * PAGE) as usize];
    let n = pagewise_mech::remote::read(pid, own, &mut whole).unwrap();
    assert_eq!(n, whole.len(), "bytes read of the registered region");
    let half = whole.len() / 2;
    assert!(whole[..half].iter().all(|&b| b == 1), "the written half");
    assert!(
        whole[half..].iter().all(|&b| b == 0),
        "the half never touched"
    );
    t.ask("evict", "evicted");
    // In parts: one page of the evicted half, two of the untouched one.
    let (mut a, mut b, mut c) = ([0xffu8; 4096], [0xffu8; 4096], [0xffu8; 4096]);
    let mut parts: Vec<(u64, &mut [u8])> = vec![
        (own + 3 * PAGE, &mut a[..]),
        (own + 700 * PAGE, &mut b[..]),
        (own + 1023 * PAGE, &mut c[..]),
    ];
    pagewise_mech::remote::read_many(pid, &mut parts).unwrap();
    assert!(
        [a, b, c].iter().all(|p| p.iter().all(|&x| x == 0)),
        "pages not in memory read as zeros"
    );
    let n = pagewise_mech::remote::read(pid, own, &mut whole).unwrap();
    assert_eq!(n, whole.len(), "bytes read after the eviction");
    assert!(whole.iter().all(|&b| b == 0), "the whole region after it");
    // Its handler is alive and has had only its own faults: the writes
    // of the evicted pages are served, and read back as it served them.
    t.ask("8", "ok");
    let mut p = [0u8; 4096];
    pagewise_mech::remote::read(pid, own + 7 * PAGE, &mut p).unwrap();
    assert_eq!(p[0], 0x5b, "a page its handler served, then written");
    assert!(p[1..].iter().all(|&b| b == 0x5a), "the rest as served");
}

/// A process holding a userfaultfd it has not used yet: `track` (auto)
/// hashes it instead of registering its memory, held and live snapshots
/// refuse it with the reason, and the program's own registration then
/// succeeds; every page it writes is reported. Before, the tracker's
/// uffd-wp took the memory first and the program's `UFFDIO_REGISTER`
/// failed: "FAIL: register: 16 (Device or resource busy)".
#[test]
fn memory_of_a_program_holding_a_userfaultfd_is_left_to_it() {
    let Some((mut t, plain, own)) = start(&[]) else {
        return;
    };
    let pid = t.pid();
    assert!(pagewise_mech::procfs::owns_userfaultfd(pid));
    let mut tr = DirtyTracker::for_process(pid, BackendKind::Auto).unwrap();
    let note = tr.note().unwrap_or_default().to_string();
    assert!(note.contains("holds a userfaultfd"), "note: {note:?}");
    assert_ne!(tr.backend(), BackendKind::UffdWp, "{note}");
    match pagewise_snap::ProcessSnapshots::open(pid) {
        Err(pagewise_snap::Error::HoldsUserfaultfd { pid: p }) => assert_eq!(p, pid),
        other => panic!("a held session: {other:?}"),
    }
    tr.collect().unwrap();
    t.ask("register", "registered");
    t.ask("20", "ok");
    let c = tr.collect().unwrap();
    assert_eq!(
        reported(&c, plain, PLAIN_PAGES),
        20,
        "pages written in PLAIN"
    );
    assert_eq!(reported(&c, own, OWN_PAGES), 20, "pages written in OWN");
    t.ask("1", "ok");
}

/// A process that makes its userfaultfd while tracked with uffd-wp: the
/// next collection lets its memory go (said in the tracker's note) and
/// hashes it from then on, so the program's registration after it
/// succeeds; no write is lost across the change. Before, the program's
/// registration failed with EBUSY.
#[test]
fn a_tracker_lets_go_of_a_program_that_makes_a_userfaultfd() {
    if let Err(why) = BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let Some((mut t, plain, own)) = start(&["later"]) else {
        return;
    };
    let pid = t.pid();
    // A userfaultfd not set up (UFFDIO_API) registers nothing: not the
    // program's own yet. A pagewise killed while it made its own inside
    // leaves one such; before this was told apart, the target of such a
    // kill was never tracked with uffd-wp again.
    t.ask("bare", "bare");
    assert!(!pagewise_mech::procfs::owns_userfaultfd(pid));
    let mut tr = DirtyTracker::for_process(pid, BackendKind::Auto).unwrap();
    assert_eq!(tr.backend(), BackendKind::UffdWp, "{:?}", tr.note());
    tr.collect().unwrap();
    t.ask("make", "made");
    // Written after the userfaultfd was made, before the tracker saw it.
    t.ask("5", "ok");
    let c = tr.collect().unwrap();
    let note = tr.note().unwrap_or_default().to_string();
    assert!(note.contains("userfaultfd of its own"), "note: {note:?}");
    assert_eq!(
        reported(&c, plain, PLAIN_PAGES),
        5,
        "PLAIN, across the change"
    );
    assert_eq!(reported(&c, own, OWN_PAGES), 5, "OWN, across the change");
    t.ask("register", "registered");
    t.ask("12", "ok");
    let c = tr.collect().unwrap();
    assert_eq!(reported(&c, plain, PLAIN_PAGES), 12, "PLAIN, hashed");
    assert_eq!(reported(&c, own, OWN_PAGES), 12, "OWN, hashed");
}

/// An agent's regions of a process leave out what it serves itself from
/// the step after it registers it, however late: the two 2 MiB regions
/// of OWN are found before its registration and not after (the kernel's
/// verdict: smaps `um` on OWN). Before, what a process served was read
/// once, when the agent first looked, and a later registration was never
/// seen: the agent went on reading and acting there.
#[test]
fn agents_see_a_registration_made_late() {
    if !pagewise_mech::probe::get().pagemap_scan {
        pagewise_testkit::skip!("the kernel has no PAGEMAP_SCAN (Linux 6.7+)");
        return;
    }
    let Some((mut t, _, own)) = start(&[]) else {
        return;
    };
    let pid = t.pid();
    let mut targets: pagewise_mech::agent::Targets<()> = Default::default();
    targets.add(pid, |_| Ok(())).unwrap();
    let of_own = |targets: &mut pagewise_mech::agent::Targets<()>| -> usize {
        let found = targets.regions(|p, e| panic!("pid {p} taken for gone: {e}"));
        found
            .iter()
            .flat_map(|(_, rs)| rs)
            .filter(|r| own <= r.region.start && r.region.start < own + OWN_PAGES * PAGE)
            .count()
    };
    assert_eq!(
        of_own(&mut targets),
        2,
        "regions of OWN before its registration"
    );
    t.ask("register", "registered");
    assert_eq!(
        pagewise_mech::procfs::uffd_served(Some(pid)).unwrap(),
        [(own, own + OWN_PAGES * PAGE)],
        "the kernel's verdict: OWN registered"
    );
    assert_eq!(of_own(&mut targets), 0, "regions of OWN after it");
    t.ask("1", "ok");
}
