//! A target in a podman container started with the runtime's defaults
//! (its seccomp profile, `/usr/share/containers/seccomp.json`, which
//! refuses `userfaultfd`; its capabilities, without CAP_SYS_PTRACE): the
//! rollback target runs from the host's `/usr`, mounted read-only into an
//! empty root, so no image is needed. From the host, as root: tracked with
//! uffd-wp, restored in full, advised mergeable for KSM; afterwards its
//! filter is the same, instruction for instruction, and it holds no
//! userfaultfd.

use super::*;
use pagewise_mech::seccomp::Filters;
use pagewise_testkit::container::{podman_missing, Container};

fn filters(pid: i32) -> Filters {
    let stopped = pagewise_mech::stop::Stopped::new(pid).unwrap();
    Filters::read(stopped.tids()[0]).unwrap()
}

#[test]
fn a_default_podman_container_is_tracked_restored_and_advised() {
    let Some(path) = target() else { return };
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = path.parent().unwrap();
    let program = path.file_name().unwrap().to_str().unwrap();
    let mut c = Container::start(Path::new(env!("CARGO_TARGET_TMPDIR")), dir, program, &[]);
    let pid = c.pid;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k| pagewise_mech::procfs::status_field(&status, k).unwrap();
    assert_eq!(field("Seccomp"), 2, "under the profile's filter");
    let caps = pagewise_mech::procfs::status_hex(&status, "CapEff").unwrap();
    assert_eq!(caps & (1 << 19), 0, "without CAP_SYS_PTRACE");
    let before = filters(pid);
    assert!(
        !before.verdict(libc::SYS_userfaultfd, [0; 6], 0).allows(),
        "the profile refuses userfaultfd"
    );

    // Tracked with uffd-wp from outside: the pages written are reported.
    let mut t = pagewise_track::DirtyTracker::for_process(pid, pagewise_track::BackendKind::UffdWp)
        .unwrap();
    let _ = t.collect().unwrap();
    assert!(c.p.ask("w 16 1").contains("bad=0"));
    pagewise_testkit::settle_in_read(pid);
    let dirty = t.collect().unwrap();
    let n = dirty.stats.pages_dirty;
    assert!(n >= 16, "{n} pages reported");
    drop(t);

    // Restored in full: layout and registers.
    let mut h = ProcessSnapshots::open(pid).unwrap();
    assert_eq!(h.note(), None, "a full handle");
    pagewise_testkit::settle_in_read(pid);
    let id = h.take().unwrap();
    let shape = layout(pid);
    let first = c.p.ask("c");
    c.p.ask("m");
    c.p.ask("b");
    c.p.ask("w 40 9");
    pagewise_testkit::settle_in_read(pid);
    let r = h.restore(id, RestoreOptions::default()).unwrap();
    assert!(r.layout_calls > 0, "{r:?}");
    assert_eq!(layout(pid), shape, "the layout put back");
    assert_eq!(c.p.ask("c"), first, "the same answer, registers checked");
    drop(h);

    // Advised mergeable from inside (what the dedup agent does).
    let maps = pagewise_mech::procfs::maps(Some(pid)).unwrap();
    let big = maps.iter().max_by_key(|m| m.end - m.start).unwrap();
    let advised = pagewise_mech::inject::madvise_in(
        pid,
        &[(big.start, big.end - big.start)],
        libc::MADV_MERGEABLE,
        "the test",
    )
    .unwrap();
    assert_eq!(advised, vec![big.end - big.start]);
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let flags = smaps
        .split("\n")
        .skip_while(|l| !l.starts_with(&format!("{:x}-", big.start)))
        .find(|l| l.starts_with("VmFlags:"))
        .unwrap()
        .to_string();
    assert!(flags.contains(" mg"), "{flags}");

    assert_eq!(filters(pid), before, "the filter as it was");
    assert_eq!(
        pagewise_testkit::userfaultfds(pid),
        0,
        "no userfaultfd left"
    );
    assert!(c.p.ask("w 3 3").contains("bad=0"));
}
