//! Targets under seccomp filters that answer ERRNO, KILL_PROCESS, TRAP or
//! USER_NOTIF (never answered) to every call pagewise makes inside a
//! process (`rollback.c seccomp ACTION`): tracked with uffd-wp and
//! restored in full (layout, registers) with the filters suspended around
//! pagewise's own calls; afterwards the filters are the same, instruction
//! for instruction, and the target holds no descriptor pagewise made.
//! Told to respect the filters, pagewise evaluates them and falls back to
//! what needs no call inside, naming the call and the filters' answer.

use super::*;
use pagewise_mech::seccomp::{self, Action, Filters, Policy};
use pagewise_testkit::userfaultfds;

/// The filters of `pid`'s main thread, read while it is stopped, and its
/// `Seccomp_filters` count.
fn filters(pid: i32) -> (Filters, u64) {
    let stopped = pagewise_mech::stop::Stopped::new(pid).unwrap();
    let f = Filters::read(stopped.tids()[0]).unwrap();
    drop(stopped);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let n = pagewise_mech::procfs::status_field(&status, "Seccomp_filters").unwrap();
    (f, n)
}

/// Whether this test process can suspend a target's filters; the reason
/// (printed as a skip) where not.
fn can_suspend() -> bool {
    match seccomp::tracer_limit() {
        None => true,
        Some(why) => {
            pagewise_testkit::skip!("{why}");
            false
        }
    }
}

#[test]
fn filtered_targets_are_tracked_and_restored_in_full() {
    let Some(path) = target() else { return };
    if !can_suspend() {
        return;
    }
    for action in ["errno", "kill", "trap", "notif"] {
        let mut t = Target::start(&path, &["seccomp", action]);
        let pid = t.pid();
        let before = filters(pid);
        assert_eq!(before.0.len(), 1, "{action}: the target's one filter");
        assert!(
            !before.0.verdict(libc::SYS_userfaultfd, [0; 6], 0).allows(),
            "{action}: the filter refuses userfaultfd"
        );
        t.ask("w 16 1");
        let mut h = ProcessSnapshots::open(pid).unwrap();
        assert_eq!(h.note(), None, "{action}: a full handle");
        t.settle();
        let id = h.take().unwrap();
        let shape = layout(pid);
        let first = t.ask("c");
        assert!(first.contains("bad=0"), "{action}: {first}");
        // A mapping made and a break grown: undone by munmap and brk
        // inside the target, munmap being one its filter refuses.
        t.ask("m");
        t.ask("b");
        t.ask("w 40 9");
        t.settle();
        let r = h.restore(id, RestoreOptions::default()).unwrap();
        assert!(!r.compared, "{action}: tracked, not compared: {r:?}");
        assert!(r.layout_calls > 0, "{action}: {r:?}");
        assert_eq!(layout(pid), shape, "{action}: the layout put back");
        assert_memory_is(&h, id, &t);
        assert_eq!(
            t.ask("c"),
            first,
            "{action}: the same answer, registers checked"
        );
        drop(h);
        assert_eq!(filters(pid), before, "{action}: the filter as it was");
        assert_eq!(userfaultfds(pid), 0, "{action}: no userfaultfd left");
        let last = t.ask("w 3 3");
        assert!(last.contains("bad=0"), "{action}: alive and well: {last}");
        println!("ok   {action}: tracked with uffd-wp, restored in full, filter unchanged");
    }
}

#[test]
fn respected_filters_are_evaluated_and_named() {
    let Some(path) = target() else { return };
    if !can_suspend() {
        return;
    }
    seccomp::set_thread_policy(Some(Policy::Respect));
    // A filter that allows everything: every call passes the evaluation.
    let mut t = Target::start(&path, &["seccomp"]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    assert_eq!(h.note(), None, "an allowing filter: a full handle");
    t.settle();
    let id = h.take().unwrap();
    let first = t.ask("c");
    t.ask("m");
    t.ask("w 20 4");
    t.settle();
    h.restore(id, RestoreOptions::default()).unwrap();
    assert_eq!(t.ask("c"), first);
    drop(h);
    // One that answers ERRNO to userfaultfd: the call is not made, and
    // the refusal names it and the answer.
    let t = Target::start(&path, &["seccomp", "errno"]);
    let e = pagewise_mech::wp::UffdWp::open_in(t.pid()).unwrap_err();
    match &e {
        pagewise::MechError::Refused(pagewise_mech::Refusal::Seccomp {
            pid, call, answer, ..
        }) => {
            assert_eq!(*pid, t.pid());
            assert_eq!(call, "the userfaultfd call");
            assert_eq!(*answer, Some(Action::Errno(1)));
        }
        e => panic!("{e:?}"),
    }
    assert!(e.to_string().contains("ERRNO"), "{e}");
    seccomp::set_thread_policy(None);
}

/// Respected filters that refuse `userfaultfd` alone: the writes are not
/// tracked, and the rest is put back in full (a break grown, a mapping
/// made, pages written, the registers), every page compared; each call
/// the restore made was allowed by the filter, which it is afterwards as
/// it was.
#[test]
fn respected_filters_that_refuse_userfaultfd_alone_leave_out_only_the_tracking() {
    let Some(path) = target() else { return };
    if !can_suspend() {
        return;
    }
    seccomp::set_thread_policy(Some(Policy::Respect));
    let mut t = Target::start(&path, &["seccomp", "uffd"]);
    let pid = t.pid();
    let before = filters(pid);
    t.ask("w 16 1");
    let mut h = ProcessSnapshots::open(pid).unwrap();
    assert_eq!(h.note(), None, "calls can be made inside: {:?}", h.note());
    let why = h.untracked().expect("the tracking is left out");
    assert!(
        why.contains("userfaultfd") && why.contains("ERRNO"),
        "{why}"
    );
    t.settle();
    let id = h.take().unwrap();
    let shape = layout(pid);
    let first = t.ask("c");
    assert!(first.contains("bad=0"), "{first}");
    t.ask("b");
    t.ask("m");
    t.ask("w 20 4");
    t.settle();
    assert_ne!(layout(pid), shape, "precondition: the layout changed");
    let r = h.restore(id, RestoreOptions::default()).unwrap();
    assert!(r.compared, "every page compared: {r:?}");
    assert_eq!(r.threads, 1, "the registers put back: {r:?}");
    assert!(r.layout_calls >= 1, "the mapping undone by a call: {r:?}");
    assert_eq!(layout(pid), shape, "the layout put back");
    assert_memory_is(&h, id, &t);
    assert_eq!(t.ask("c"), first, "the answer after the restore");
    drop(h);
    let after = filters(pid);
    assert_eq!(after.1, before.1, "the filter count");
    assert!(
        after.0 == before.0,
        "the filters, instruction for instruction"
    );
    assert_eq!(userfaultfds(pid), 0, "no userfaultfd left in the target");
    seccomp::set_thread_policy(None);
}

/// A process as a container runs one: not root, without CAP_SYS_PTRACE,
/// under a filter that kills it for userfaultfd. The write-frequency
/// watcher's userfaultfd (which handles faults the kernel takes too, so
/// the kernel asks CAP_SYS_PTRACE of the process or
/// `vm.unprivileged_userfaultfd = 1`) is made with the filter suspended
/// through `/dev/userfaultfd`, lent to the process for the one call; the
/// machine's setting is never touched; the writes the process makes are
/// reported, and its filter is as it was, with no descriptor left.
#[test]
fn a_process_without_privileges_under_a_filter_is_watched_for_writes() {
    use std::os::unix::process::CommandExt;
    const SETTING: &str = "/proc/sys/vm/unprivileged_userfaultfd";
    let Some(path) = target() else { return };
    if !can_suspend() {
        return;
    }
    if pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!("needs root to start a target as another user");
        return;
    }
    let setting = std::fs::read_to_string(SETTING).unwrap();
    let mut t = Target {
        rseq: None,
        p: Piped::start(
            Command::new(&path)
                .args(["seccomp", "kill"])
                .uid(65534)
                .gid(65534),
        ),
    };
    assert!(t.line().starts_with("ready"));
    let pid = t.pid();
    let before = filters(pid);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let caps = pagewise_mech::procfs::status_hex(&status, "CapEff").unwrap();
    assert_eq!(caps & (1 << 19), 0, "the target lacks CAP_SYS_PTRACE");
    // The 16 MiB buffer is the target's largest mapping.
    let maps = pagewise_mech::procfs::maps(Some(pid)).unwrap();
    let big = maps.iter().max_by_key(|m| m.end - m.start).unwrap();
    let regions: Vec<pagewise::Region> = (big.start..big.end)
        .step_by(pagewise::HUGE_PAGE_SIZE)
        .filter(|a| a % pagewise::HUGE_PAGE_SIZE as u64 == 0)
        .filter(|a| a + pagewise::HUGE_PAGE_SIZE as u64 <= big.end)
        .map(|a| pagewise::Region {
            start: a,
            len: pagewise::HUGE_PAGE_SIZE as u64,
        })
        .collect();
    assert!(!regions.is_empty());
    let mut w = pagewise_mech::access::RegionWrites::new(pid).unwrap();
    assert!(
        !pagewise_mech::settings::take_put_back()
            .iter()
            .any(|s| s.starts_with(SETTING)),
        "the machine's setting was not lent"
    );
    assert_eq!(
        std::fs::read_to_string(SETTING).unwrap(),
        setting,
        "the setting as it was"
    );
    assert_eq!(
        pagewise_testkit::fds_on(pid, "/dev/userfaultfd"),
        0,
        "the device lent for the call is not left in it"
    );
    w.watch(&regions, &Default::default()).unwrap();
    assert!(w.take().unwrap().written.is_empty(), "nothing written yet");
    let answer = t.ask("w 64 3");
    assert!(answer.contains("bad=0"), "{answer}");
    let written = w.take().unwrap().written;
    assert!(!written.is_empty(), "the writes are reported");
    assert!(written
        .iter()
        .all(|a| regions.iter().any(|r| r.start == *a)));
    drop(w);
    assert_eq!(filters(pid), before, "the filter as it was");
    assert_eq!(userfaultfds(pid), 0, "no userfaultfd left");
    assert!(t.ask("w 3 3").contains("bad=0"));
}
