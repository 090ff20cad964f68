//! Bloat recovery for a process in a memory cgroup near its limit: the
//! pressure seen in the group, khugepaged put back, and the pages given
//! back uncharged at once.

use super::*;

/// A forked child that, once moved into a memory cgroup, writes `mib` MiB
/// and waits to be killed (it is, when this is dropped).
struct Charged {
    pid: i32,
    /// Where its memory starts (2 MiB-aligned).
    base: u64,
}

impl Charged {
    /// `mib` MiB written page by page, or (`sparse`) in huge pages of which
    /// only the first base page is written: the rest is bloat.
    fn start(cg: &pagewise_mech::cgroup::MemoryCgroup, mib: usize, sparse: bool) -> Charged {
        use std::io::{Read, Write};
        let (mut go_r, mut go_w) = std::io::pipe().unwrap();
        let (mut done_r, mut done_w) = std::io::pipe().unwrap();
        // SAFETY: the child only reads and writes pipes, maps and writes
        // memory, and sleeps: no allocation, no lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            {
                use std::os::fd::AsRawFd;
                common::close_inherited(&[go_r.as_raw_fd(), done_w.as_raw_fd()]);
            }
            let mut b = [0u8; 1];
            let _ = go_r.read_exact(&mut b);
            let len = mib << 20;
            let map = pagewise_sys::mem::mmap_anonymous(len + HUGE_PAGE_SIZE).unwrap();
            let p = (map as usize).next_multiple_of(HUGE_PAGE_SIZE) as *mut u8;
            let step = if sparse {
                // SAFETY: advice on the mapping just made.
                unsafe { libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE) };
                HUGE_PAGE_SIZE
            } else {
                PAGE_SIZE
            };
            for off in (0..len).step_by(step) {
                // SAFETY: inside the mapping just made.
                unsafe { std::ptr::write_volatile(p.add(off), 1) };
            }
            let _ = done_w.write_all(&(p as u64).to_ne_bytes());
            loop {
                // SAFETY: waits for the signal that kills it.
                unsafe { libc::pause() };
            }
        }
        let mut c = Charged { pid, base: 0 };
        cg.add(pid).unwrap();
        go_w.write_all(&[1]).unwrap();
        let mut b = [0u8; 8];
        done_r.read_exact(&mut b).unwrap();
        c.base = u64::from_ne_bytes(b);
        c
    }
}

impl Drop for Charged {
    fn drop(&mut self) {
        let _ = pagewise_sys::process::kill(self.pid, libc::SIGKILL);
        let _ = pagewise_sys::process::wait_child(self.pid);
    }
}

/// A memory cgroup of this test run with a limit; `None` (the test said it
/// skips, and why) where none can be made.
fn cgroup(what: &str, limit: u64) -> Option<pagewise_mech::cgroup::MemoryCgroup> {
    let name = format!("pagewise-test-{what}-{}", std::process::id());
    match pagewise_mech::cgroup::MemoryCgroup::create(&name, limit) {
        Ok(c) => Some(c),
        Err(e) => {
            pagewise_testkit::skip!("no memory cgroup to make: {e}");
            None
        }
    }
}

/// Memory counts as tight by the process's own cgroup limit (40 MiB
/// charged of 64: above 50 %, not above 90 %); while it is, khugepaged's
/// `max_ptes_none` is lowered to the recovery threshold, and put back when
/// the agent ends.
#[test]
fn a_cgroup_near_its_limit_is_pressure_and_khugepaged_is_put_back() {
    // Its memory would be inherited by another test's target.
    let _one = common::one_target_at_a_time();
    use pagewise_thp::agent::{Pressure, Recovery, MAX_PTES_NONE};
    if !available() {
        return;
    }
    let Some(cg) = cgroup("limit", 64 << 20) else {
        return;
    };
    let child = Charged::start(&cg, 40, false);
    let used = cg.usage().unwrap();
    assert_eq!(used.limit, Some(64 << 20));
    assert!(
        used.usage >= 40 << 20,
        "the child's 40 MiB are charged to its group: {used:?}"
    );
    let (tight, what) = Pressure::LimitAbove(50.0).holds(child.pid).unwrap();
    assert!(tight, "{what}");
    assert!(what.contains("of its 64 MiB limit"), "{what}");
    assert!(!Pressure::LimitAbove(90.0).holds(child.pid).unwrap().0);
    // This process's own group has no limit here, or one far above.
    let me = std::process::id() as i32;
    assert!(!Pressure::LimitAbove(99.0).holds(me).unwrap().0);

    let before = pagewise_mech::procfs::read_trimmed(MAX_PTES_NONE).unwrap();
    let opts = recovery_only(
        Recovery::default()
            .when(Pressure::LimitAbove(50.0))
            .zero_pages(64)
            .tune_khugepaged(true)
            .hold(Duration::from_secs(60)),
    );
    let mut agent = Agent::new(&[child.pid], opts).unwrap();
    let step = agent.step().unwrap();
    let tuned = step
        .actions
        .iter()
        .any(|a| matches!(a, Action::Tuned { to, .. } if to == "63"));
    if before.parse::<u64>().unwrap() > 63 {
        assert!(tuned, "max_ptes_none lowered: {:?}", step.actions);
        assert_eq!(
            pagewise_mech::procfs::read_trimmed(MAX_PTES_NONE).unwrap(),
            "63"
        );
    } else {
        assert!(!tuned, "already at {before}: left alone");
    }
    drop(agent);
    assert_eq!(
        pagewise_mech::procfs::read_trimmed(MAX_PTES_NONE).unwrap(),
        before
    );
    drop(child);
}

/// Bloat recovery gives the memory back to the cgroup at once: a child
/// holds 16 huge pages with one page written in each; under pressure of
/// its cgroup's limit the agent gives back the 511 zero pages of each, and
/// the cgroup's charge falls by about as much, without waiting for reclaim.
#[test]
fn recovered_bloat_is_uncharged_from_the_cgroup_at_once() {
    use pagewise_thp::agent::{Pressure, Recovery};
    let _one = common::one_target_at_a_time();
    if !available() {
        return;
    }
    let Some(cg) = cgroup("bloat", 256 << 20) else {
        return;
    };
    let child = Charged::start(&cg, 32, true);
    let held = pagewise_mech::procfs::resident(child.pid).unwrap();
    if held.anon_huge_kib < 16 * 2048 {
        pagewise_testkit::skip!(
            "the kernel gave the child {} KiB of huge pages, not 32 MiB (THP disabled or no free huge page)",
            held.anon_huge_kib
        );
        return;
    }
    let before = cg.usage().unwrap().usage;
    for r in 0..16u64 {
        let mut b = [0u8; PAGE_SIZE];
        pagewise_mech::remote::read(child.pid, child.base + r * HUGE_PAGE_SIZE as u64, &mut b)
            .unwrap();
        assert_eq!(b[0], 1, "region {r} before recovery: the written page");
    }
    let opts = recovery_only(
        Recovery::default()
            .when(Pressure::LimitAbove(5.0))
            .zero_pages(256)
            .tune_khugepaged(false)
            .hold(Duration::ZERO),
    );
    let mut agent = Agent::new(&[child.pid], opts).unwrap();
    let step = agent.step().unwrap();
    let given: u64 = step
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Recovered { zero_pages, .. } => Some(*zero_pages),
            _ => None,
        })
        .sum();
    assert_eq!(given, 16 * 511, "{:?}", step.actions);
    // The written pages are still there.
    for r in 0..16u64 {
        let mut b = [0u8; PAGE_SIZE];
        pagewise_mech::remote::read(child.pid, child.base + r * HUGE_PAGE_SIZE as u64, &mut b)
            .unwrap();
        assert_eq!(b[0], 1, "region {r}: the written page");
    }
    let after = cg.usage().unwrap().usage;
    let freed = before.saturating_sub(after);
    println!(
        "     {given} zero pages given back ({} KiB); the cgroup's charge fell by {} KiB",
        given * 4,
        freed >> 10
    );
    assert!(
        freed >= given * PAGE_SIZE as u64 * 9 / 10,
        "charged {before} before, {after} after: {freed} bytes freed of {}",
        given * PAGE_SIZE as u64
    );
}
