//! Replacement policies against exact fault counts: a plugin built and
//! loaded (bad ones refused), CLOCK's second chance, the learning policies
//! keeping the hot page, and the trace of DiME's two-page test.

use super::*;

/// Builds `examples/policy_lifo.c` into a shared object with the system's C
/// compiler; `None` (with the reason printed) when there is none.
fn build_lifo_plugin() -> Option<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pagewise-lifo-{}-{}.so",
        std::process::id(),
        fm_path()
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match std::process::Command::new(&cc)
        .args([
            "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
        ])
        .arg(&out)
        .arg(root.join("examples/policy_lifo.c"))
        .arg(format!("-I{}", root.join("include").display()))
        .status()
    {
        Ok(s) if s.success() => Some(out),
        Ok(s) => panic!("{cc} failed on examples/policy_lifo.c: {s}"),
        Err(e) => {
            pagewise_testkit::skip!("no C compiler ({cc}: {e})");
            None
        }
    }
}

/// A policy loaded from a shared object decides the evictions: LIFO's exact
/// counts, unlike FIFO's.
fn policy_plugin_lifo() {
    if !uffd_or_skip("policy_plugin") {
        return;
    }
    let Some(so) = build_lifo_plugin() else {
        return;
    };
    // SAFETY: the plugin is this repository's example, which follows the ABI.
    let lifo = unsafe { policy::Plugin::load(so.to_str().unwrap(), "capacity=64") }.unwrap();
    assert_eq!(policy::Policy::name(&lifo), "lifo");
    let mem = AnonMemory::new(10 * PAGE_SIZE).unwrap();
    let fm = new_fm(
        &[mem.region()],
        config(4, 0),
        Box::new(lifo),
        Calibration::NONE,
    )
    .unwrap();
    for p in 0..4 {
        mem.write_byte(p * PAGE_SIZE, 1); // 4 fetches: 0 1 2 3 local
    }
    mem.write_byte(4 * PAGE_SIZE, 1); // evicts 3, the newest: 0 1 2 4
    mem.write_byte(3 * PAGE_SIZE + 1, 2); // evicts 4: 0 1 2 3
    for p in 0..4 {
        mem.write_byte(p * PAGE_SIZE + 2, 3); // all local: no fault
    }
    let st = fm.stop().unwrap();
    assert_eq!(st.page_fault_count, 6, "{st:?}");
    assert_eq!(st.evictions, 2);
    assert_eq!(mem.read_byte(4 * PAGE_SIZE), 1);
    assert_eq!(mem.read_byte(3 * PAGE_SIZE + 1), 2);
    std::fs::remove_file(&so).unwrap();
}

fn bad_policy_plugins_are_refused() {
    // SAFETY: loading fails before any code of the object runs.
    let e = unsafe { policy::Plugin::load("/nonexistent/policy.so", "") }.unwrap_err();
    assert!(
        matches!(&e, pagewise_farmem::Error::Plugin { path, .. } if path == "/nonexistent/policy.so"),
        "{e:?}"
    );
    // A shared object without the entry point.
    let libc_path = "libc.so.6";
    // SAFETY: libc is already loaded; dlopen only adds a reference.
    let e = unsafe { policy::Plugin::load(libc_path, "") }.unwrap_err();
    assert!(
        matches!(&e, pagewise_farmem::Error::Plugin { what, .. } if what.contains("pw_policy_plugin")),
        "{e:?}"
    );
}

/// CLOCK gives a page used again a second chance, learned by parking it:
/// exact fetches, evictions and soft faults of a hand-worked trace.
fn clock_second_chance_exact() {
    if !uffd_or_skip("clock") {
        return;
    }
    let mem = AnonMemory::new(8 * PAGE_SIZE).unwrap();
    let clock = policy::by_name("clock", 0).unwrap();
    let fm = new_fm(&[mem.region()], config(3, 0), clock, Calibration::NONE).unwrap();
    let touch = |p: usize| mem.write_byte(p * PAGE_SIZE, p as u8 + 1);
    for p in 0..3 {
        touch(p);
    }
    // Full: the hand clears 0, 1, 2 (parking 1 and 2) and evicts 0.
    touch(3);
    let st = fm.stats();
    assert_eq!(
        (st.remote_fetches, st.evictions, st.parks),
        (4, 1, 2),
        "{st:?}"
    );
    // Page 1 is used again: a soft fault sets its bit.
    touch(1);
    assert_eq!(fm.stats().soft_faults, 1);
    assert_eq!(fm.stats().remote_fetches, 4);
    // Next victim: 1 has its bit (cleared and parked again), 2 has not: 2 goes.
    touch(4);
    let st = fm.stats();
    assert_eq!(
        (st.remote_fetches, st.evictions, st.parks),
        (5, 2, 3),
        "{st:?}"
    );
    touch(1); // parked, still local: a soft fault
    assert_eq!(fm.stats().remote_fetches, 5);
    assert_eq!(fm.stats().soft_faults, 2);
    touch(2); // evicted: a fetch
    assert_eq!(fm.stats().remote_fetches, 6);
    let st = fm.stop().unwrap();
    for p in 0..5 {
        assert_eq!(mem.read_byte(p * PAGE_SIZE), p as u8 + 1);
    }
    assert_eq!(st.page_fault_count, 6);
}

/// A hot page used between every new page of a stream stays local under
/// CLOCK and the LRU approximation, but not under FIFO. Both learning
/// policies lose it once: until the hand first passes, every page looks
/// just used (its use while mapped is invisible), so the first sweep clears
/// and parks all four and evicts the hot page, which comes back and is
/// then seen on every use: 50 cold fetches + 2 hot ones.
fn learning_policies_keep_the_hot_page() {
    if !uffd_or_skip("learning_policies") {
        return;
    }
    for name in ["clock", "lru", "fifo"] {
        let mem = AnonMemory::new(64 * PAGE_SIZE).unwrap();
        let fm = new_fm(
            &[mem.region()],
            config(4, 0),
            policy::by_name(name, 0).unwrap(),
            Calibration::NONE,
        )
        .unwrap();
        for p in 1..=50 {
            mem.write_byte(0, p as u8); // the hot page
            mem.write_byte(p * PAGE_SIZE, 1); // a new cold page
        }
        let st = fm.stop().unwrap();
        println!(
            "     {name}: {} fetches, {} soft faults, {} parks",
            st.remote_fetches, st.soft_faults, st.parks
        );
        if name == "fifo" {
            // Every fourth round pushes the hot page out.
            assert!(st.remote_fetches > 60, "{name}: {st:?}");
        } else {
            assert_eq!(st.remote_fetches, 52, "{name}: {st:?}");
            assert!(st.soft_faults > 0, "{name}: {st:?}");
        }
        assert_eq!(mem.read_byte(0), 50);
    }
}

/// The trace records every fetch and eviction, in order, with addresses.
fn trace_of_the_two_page_test() {
    use pagewise_farmem::TraceKind;
    if !uffd_or_skip("trace") {
        return;
    }
    let mem = AnonMemory::new(4 * PAGE_SIZE).unwrap();
    let mut fm = new_fm(&[mem.region()], config(1, 0), fifo(), Calibration::NONE).unwrap();
    fm.trace(1000);
    for i in 0..100u8 {
        // Never the value already there: every visit changes the page.
        mem.write_byte(0, i + 1);
        mem.write_byte(2 * PAGE_SIZE, i + 1);
    }
    let (events, dropped) = fm.take_trace();
    fm.stop().unwrap();
    assert_eq!(dropped, 0);
    let fetches: Vec<u64> = events
        .iter()
        .filter(|e| e.kind == TraceKind::Fetch)
        .map(|e| e.addr)
        .collect();
    assert_eq!(fetches.len(), 200);
    let (a, b) = (mem.addr(), mem.addr() + 2 * PAGE_SIZE as u64);
    for (k, &addr) in fetches.iter().enumerate() {
        assert_eq!(addr, if k % 2 == 0 { a } else { b }, "fetch {k}");
    }
    let evictions = events
        .iter()
        .filter(|e| matches!(e.kind, TraceKind::Evict | TraceKind::Writeback))
        .count();
    assert_eq!(evictions, 199);
    // Every page left changed (each was written since its fetch).
    assert!(events.iter().all(|e| e.kind != TraceKind::Evict));
    assert!(events.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
}

// Every test runs on both fault paths: `NAME::thread` and `NAME::inline`.
pagewise_testkit::per_fault_path!(
    super::on_path;
    policy_plugin_lifo,
    bad_policy_plugins_are_refused,
    clock_second_chance_exact,
    learning_policies_keep_the_hot_page,
    trace_of_the_two_page_test,
);
