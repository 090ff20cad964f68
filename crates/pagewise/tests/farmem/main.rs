//! Far-memory emulation against ground truth: DiME's exact fault counts,
//! writes under eviction checked against shadow copies, faults inside system
//! calls, the link model's exact sums, and live reconfiguration.

#[path = "../common/mod.rs"]
mod common;

use pagewise::farmem::link::LinkConfig;
use pagewise::farmem::{policy, Calibration, Config, FarMemory, FaultPath, Hooks, Stats};
use pagewise::workload::{AnonMemory, Rng};
use pagewise::PAGE_SIZE;
use std::sync::Arc;

thread_local! {
    /// The fault path the running test uses.
    static PATH: std::cell::Cell<FaultPath> = const { std::cell::Cell::new(FaultPath::Thread) };
}

/// `FarMemory::new` on the running test's fault path.
fn new_fm(
    regions: &[pagewise::Region],
    config: Config,
    policy: Box<dyn policy::Policy>,
    cal: Calibration,
) -> pagewise::Result<FarMemory> {
    let hooks = Hooks {
        fault_path: PATH.with(|p| p.get()),
        ..Hooks::default()
    };
    let fm = FarMemory::new_with(regions, config, policy, cal, hooks)?;
    assert_eq!(
        fm.fault_path(),
        PATH.with(|p| p.get()),
        "the engine runs the path asked for"
    );
    Ok(fm)
}

fn fm_path() -> FaultPath {
    PATH.with(|p| p.get())
}

/// Runs `test` on fault path `path` (see `per_fault_path!`).
fn on_path(path: &str, name: &str, test: fn()) {
    let sigbus = pagewise::probe::get().uffd_has(pagewise_sys::uffd::feature::SIGBUS);
    if !pagewise_testkit::fault_path_runs(path, name, sigbus) {
        return;
    }
    PATH.with(|p| p.set(path.parse().expect("a fault path")));
    test();
}

// Every test runs on both fault paths: `NAME::thread` and `NAME::inline`.
pagewise_testkit::per_fault_path!(
    super::on_path;
    dime_table_5_1_exact_fetches,
    dime_two_page_test_exact_faults,
    writes_under_eviction_are_never_lost,
    faults_inside_system_calls,
    contents_survive_and_the_model_adds_up,
    live_budget_change,
    bad_configuration_is_refused,
    placements_pinned_local_and_always_remote,
    dropped_pages_read_as_zeros,
    unmapped_part_is_forgotten,
    policy_plugin_lifo,
    bad_policy_plugins_are_refused,
    clock_second_chance_exact,
    learning_policies_keep_the_hot_page,
    region_added_while_in_use,
    trace_of_the_two_page_test,
    a_range_found_after_it_changed_is_emulated_where_it_is_still_anonymous,
    memory_types_other_than_private_anonymous_are_refused,
    a_region_with_a_shared_page_keeps_every_byte,
);

/// Whether userfaultfd works here; prints the reason when not.
fn uffd_or_skip(test: &str) -> bool {
    match pagewise::probe::get().uffd_access {
        Some(_) => true,
        None => {
            pagewise_testkit::skip!(
                "{test}: userfaultfd is not available to this user on this kernel"
            );
            false
        }
    }
}

fn config(local_pages: usize, latency_ns: u64) -> Config {
    Config {
        local_pages,
        link: LinkConfig {
            latency_ns,
            bandwidth_bps: 0,
        },
    }
}

fn fifo() -> Box<dyn policy::Policy> {
    Box::new(policy::Fifo::default())
}

/// DiME's Table 5.1: 2000 pages touched in order, then the last x of them,
/// with 1000 local pages and FIFO: 2000 fetches for x <= 1000, 2000 + x above.
fn dime_table_5_1_exact_fetches() {
    if !uffd_or_skip("dime_table_5_1") {
        return;
    }
    for x in (0..=2000).step_by(100) {
        let mem = AnonMemory::new(2000 * PAGE_SIZE).unwrap();
        let fm = new_fm(&[mem.region()], config(1000, 0), fifo(), Calibration::NONE).unwrap();
        for p in 0..2000 {
            mem.write_byte(p * PAGE_SIZE, 1);
        }
        for p in 2000 - x..2000 {
            assert_eq!(mem.read_byte(p * PAGE_SIZE), 1);
        }
        let st = fm.stop().unwrap();
        let want = if x <= 1000 { 2000 } else { 2000 + x as u64 };
        assert_eq!(st.remote_fetches, want, "x = {x}");
        assert_eq!(st.page_fault_count, want, "x = {x}");
        assert_eq!(st.evictions, want - 1000, "x = {x}");
        // Every page was written once, from zero: exactly one write-back each
        // the first time it leaves; a page fetched back and evicted again is clean.
        assert!(st.writebacks <= st.evictions);
        for p in 0..2000 {
            assert_eq!(mem.read_byte(p * PAGE_SIZE), 1, "page {p} after stop");
        }
    }
}

/// DiME's two-page test: one local page, two pages accessed alternately 1000
/// times each: exactly 2000 faults.
fn dime_two_page_test_exact_faults() {
    if !uffd_or_skip("dime_two_page") {
        return;
    }
    let mem = AnonMemory::new(1000 * PAGE_SIZE).unwrap();
    let fm = new_fm(&[mem.region()], config(1, 0), fifo(), Calibration::NONE).unwrap();
    for i in 0..1000u32 {
        mem.write_byte(7, i as u8);
        mem.write_byte(500 * PAGE_SIZE + 9, i as u8);
    }
    let st = fm.stop().unwrap();
    assert_eq!(st.page_fault_count, 2000);
    assert_eq!(st.evictions, 1999);
    // Every fault was served where the path says.
    let inline = if fm_path() == FaultPath::Inline {
        2000
    } else {
        0
    };
    assert_eq!(st.inline_faults, inline);
    assert_eq!(mem.read_byte(7), (999 % 256) as u8);
    assert_eq!(mem.read_byte(500 * PAGE_SIZE + 9), (999 % 256) as u8);
}

/// Threads write random bytes into their own pages while the engine evicts
/// with a budget far below the working set; after stopping, memory equals
/// each thread's shadow byte for byte.
fn writes_under_eviction_are_never_lost() {
    if !uffd_or_skip("writes_under_eviction") {
        return;
    }
    const PAGES: usize = 256;
    const THREADS: usize = 3;
    for name in ["fifo", "random", "clock", "lru"] {
        let pol = policy::by_name(name, 9).unwrap();
        let mem = Arc::new(AnonMemory::new(PAGES * PAGE_SIZE).unwrap());
        let fm = new_fm(&[mem.region()], config(8, 0), pol, Calibration::NONE).unwrap();
        let shadows: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let mem = mem.clone();
                    s.spawn(move || {
                        let mut shadow = vec![0u8; PAGES * PAGE_SIZE];
                        let mut rng = Rng::new(100 + t as u64);
                        for _ in 0..4000 {
                            // Thread t owns the pages p with p % THREADS == t.
                            let p = rng.below((PAGES / THREADS) as u64) as usize * THREADS + t;
                            let off = p * PAGE_SIZE + rng.below(PAGE_SIZE as u64) as usize;
                            let v = rng.below(255) as u8 + 1;
                            mem.write_byte(off, v);
                            shadow[off] = v;
                        }
                        shadow
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let st: Stats = fm.stop().unwrap();
        let live = mem.snapshot();
        for p in 0..PAGES {
            let want = &shadows[p % THREADS][p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
            assert!(
                live[p * PAGE_SIZE..(p + 1) * PAGE_SIZE] == *want,
                "{name}: page {p} lost a write"
            );
        }
        assert!(
            st.evictions > 1000,
            "{name}: the budget forced evictions ({st:?})"
        );
        println!(
            "     {name}: {} faults, {} evictions, {} write-backs",
            st.page_fault_count, st.evictions, st.writebacks
        );
    }
}

/// A `read()` into a buffer whose pages are remote: the kernel's copy faults
/// and waits for the handler (thread path), or the buffer is held first
/// (inline path: 16 pages held with a budget of 2, over budget while held).
fn faults_inside_system_calls() {
    if !uffd_or_skip("faults_in_syscalls") {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pagewise-farmem-read-{}-{}",
        std::process::id(),
        fm_path()
    ));
    let data: Vec<u8> = (0..16 * PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&dir, &data).unwrap();
    let mem = AnonMemory::new(16 * PAGE_SIZE).unwrap();
    let fm = new_fm(&[mem.region()], config(2, 0), fifo(), Calibration::NONE).unwrap();
    let file = std::fs::File::open(&dir).unwrap();
    use std::os::unix::fs::FileExt;
    // SAFETY: the buffer is this test's own mapping, 16 pages long.
    let buf = unsafe { std::slice::from_raw_parts_mut(mem.as_ptr(), 16 * PAGE_SIZE) };
    // On the inline path memory handed to the kernel is held first (a
    // no-op on the thread path).
    let held = fm.hold(mem.region());
    file.read_exact_at(buf, 0).unwrap();
    drop(held);
    let st = fm.stop().unwrap();
    std::fs::remove_file(&dir).unwrap();
    assert_eq!(mem.snapshot(), data);
    assert!(st.page_fault_count >= 16, "{st:?}");
}

/// Populated memory becomes remote and comes back intact at stop; the link
/// model's sums are exact for sequential faults.
fn contents_survive_and_the_model_adds_up() {
    if !uffd_or_skip("contents_and_model") {
        return;
    }
    let mem = AnonMemory::new(64 * PAGE_SIZE).unwrap();
    for p in 0..64 {
        mem.fill_page(p, p as u8 + 1);
    }
    let want = mem.snapshot();
    let cfg = Config {
        local_pages: 4,
        link: LinkConfig {
            latency_ns: 2000,
            bandwidth_bps: 10_000_000_000,
        },
    };
    let cal = Calibration {
        floor_ns: 5000,
        unseen_ns: 100,
        faults: 1,
    };
    let fm = new_fm(&[mem.region()], cfg, fifo(), cal).unwrap();
    for p in 0..64 {
        assert_eq!(mem.read_byte(p * PAGE_SIZE + 3), p as u8 + 1);
    }
    let st = fm.stop().unwrap();
    assert_eq!(mem.snapshot(), want);
    assert_eq!(st.page_fault_count, 64);
    assert_eq!(st.writebacks, 0, "pages only read are clean");
    // Sequential faults never queue: each costs exactly 2 x latency + transfer.
    assert_eq!(
        st.modelled_delay_ns,
        64 * cfg.link.fetch_ns(PAGE_SIZE as u64)
    );
    assert!(st.injected_delay_ns > 0);
    // The one timing check of the suite, one-sided: what faults took in
    // all (the engine's own time counts toward the model; it waits for
    // the rest) plus the part of each it cannot see is never less than
    // the model asked for. Load only lengthens faults, so only an
    // emulation that delays too little can fail it.
    assert!(
        st.handler_ns + st.page_fault_count * st.unseen_ns >= st.modelled_delay_ns,
        "faults took {} ns (of which {} ns injected) for a model of {} ns over {} faults, \
         {} ns unseen each",
        st.handler_ns,
        st.injected_delay_ns,
        st.modelled_delay_ns,
        st.page_fault_count,
        st.unseen_ns
    );
}

/// A smaller budget evicts at once; a larger one lets more pages stay.
fn live_budget_change() {
    if !uffd_or_skip("live_budget") {
        return;
    }
    let mem = AnonMemory::new(100 * PAGE_SIZE).unwrap();
    let mut fm = new_fm(&[mem.region()], config(50, 0), fifo(), Calibration::NONE).unwrap();
    for p in 0..50 {
        mem.write_byte(p * PAGE_SIZE, 5);
    }
    assert_eq!(fm.stats().local_pages_now, 50);
    fm.set(config(10, 0)).unwrap();
    let t0 = std::time::Instant::now();
    while fm.stats().local_pages_now != 10 && t0.elapsed().as_secs() < 5 {
        std::thread::yield_now();
    }
    assert_eq!(fm.stats().local_pages_now, 10);
    assert_eq!(fm.stats().evictions, 40);
    // The 10 newest pages (FIFO) are local: touching them costs nothing.
    for p in 40..50 {
        mem.write_byte(p * PAGE_SIZE + 1, 6);
    }
    assert_eq!(fm.stats().page_fault_count, 50);
    let st = fm.stop().unwrap();
    assert_eq!(st.page_fault_count, 50);
    for p in 0..50 {
        assert_eq!(mem.read_byte(p * PAGE_SIZE), 5);
    }
}

fn bad_configuration_is_refused() {
    let mem = AnonMemory::new(4 * PAGE_SIZE).unwrap();
    let e = new_fm(&[mem.region()], config(0, 0), fifo(), Calibration::NONE).unwrap_err();
    assert!(matches!(e, pagewise::Error::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("local_pages"), "{e}");
    let e = new_fm(&[], config(1, 0), fifo(), Calibration::NONE).unwrap_err();
    assert!(matches!(e, pagewise::Error::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("no region"), "{e}");
}

/// Pinned pages cost no fetch and never leave; always-remote pages are
/// fetched on every fault and take no budget.
fn placements_pinned_local_and_always_remote() {
    use pagewise::farmem::Placement;
    use pagewise::Region;
    if !uffd_or_skip("placements") {
        return;
    }
    let mem = AnonMemory::new(100 * PAGE_SIZE).unwrap();
    let mut fm = new_fm(&[mem.region()], config(5, 0), fifo(), Calibration::NONE).unwrap();
    let range = |p: usize, n: usize| {
        Region::new(mem.addr() + (p * PAGE_SIZE) as u64, (n * PAGE_SIZE) as u64).unwrap()
    };
    fm.place(range(0, 10), Placement::PinnedLocal).unwrap();
    fm.place(range(90, 10), Placement::AlwaysRemote).unwrap();
    // Pinned: first touches are not fetches, and the 10 pages stay while 50
    // other pages stream through a budget of 5.
    for p in 0..10 {
        mem.write_byte(p * PAGE_SIZE, 1);
    }
    for p in 10..60 {
        mem.write_byte(p * PAGE_SIZE, 2);
    }
    for p in 0..10 {
        mem.write_byte(p * PAGE_SIZE + 1, 3);
    }
    let st = fm.stats();
    assert_eq!(st.remote_fetches, 50, "{st:?}");
    assert_eq!(st.evictions, 45);
    assert_eq!(st.local_pages_now, 5, "pinned pages take no budget");
    // Always remote: pages 90 and 91 alternately, 20 times each: every
    // touch is a fetch (each visit is evicted at the next fault).
    for _ in 0..20 {
        mem.write_byte(90 * PAGE_SIZE, 4);
        mem.write_byte(91 * PAGE_SIZE, 4);
    }
    let st2 = fm.stats();
    assert_eq!(st2.remote_fetches - st.remote_fetches, 40, "{st2:?}");
    assert_eq!(st2.local_pages_now, 5, "always-remote pages take no budget");
    let st = fm.stop().unwrap();
    for p in 0..10 {
        assert_eq!(mem.read_byte(p * PAGE_SIZE + 1), 3);
    }
    assert_eq!(mem.read_byte(90 * PAGE_SIZE), 4);
    assert_eq!(mem.read_byte(91 * PAGE_SIZE), 4);
    assert!(st.writebacks >= 45);
}

/// The program drops pages (`MADV_DONTNEED`), local and remote alike: they
/// read as zeros afterwards, never as the engine's old copy.
fn dropped_pages_read_as_zeros() {
    if !uffd_or_skip("dropped_pages") {
        return;
    }
    let mem = AnonMemory::new(64 * PAGE_SIZE).unwrap();
    for p in 0..64 {
        mem.fill_page(p, p as u8 + 1);
    }
    let fm = new_fm(&[mem.region()], config(8, 0), fifo(), Calibration::NONE).unwrap();
    // Pages 8..16 local, 0..8 fetched and evicted again (remote, in staging).
    for p in 0..16 {
        assert_eq!(mem.read_byte(p * PAGE_SIZE), p as u8 + 1);
    }
    mem.madvise(4 * PAGE_SIZE, 8 * PAGE_SIZE, libc::MADV_DONTNEED)
        .unwrap();
    for p in 0..64 {
        let want = if (4..12).contains(&p) { 0 } else { p as u8 + 1 };
        assert_eq!(mem.read_byte(p * PAGE_SIZE + 9), want, "page {p}");
    }
    let st = fm.stop().unwrap();
    for p in 0..64 {
        let want = if (4..12).contains(&p) { 0 } else { p as u8 + 1 };
        assert_eq!(
            mem.read_byte(p * PAGE_SIZE + 100),
            want,
            "page {p} after stop"
        );
    }
    assert!(st.local_pages_now <= 8, "{st:?}");
}

/// The program unmaps part of an emulated region: the engine forgets it and
/// goes on serving the rest.
fn unmapped_part_is_forgotten() {
    if !uffd_or_skip("unmapped_part") {
        return;
    }
    let mem = AnonMemory::new(32 * PAGE_SIZE).unwrap();
    for p in 0..32 {
        mem.fill_page(p, 7);
    }
    let fm = new_fm(&[mem.region()], config(4, 0), fifo(), Calibration::NONE).unwrap();
    for p in 0..32 {
        assert_eq!(mem.read_byte(p * PAGE_SIZE), 7);
    }
    // SAFETY: the last 8 pages of the test's own mapping; nothing refers to them.
    unsafe {
        pagewise_sys::mem::munmap(mem.as_ptr().add(24 * PAGE_SIZE), 8 * PAGE_SIZE).unwrap();
    }
    for p in 0..24 {
        mem.write_byte(p * PAGE_SIZE + 1, 8);
    }
    let st = fm.stop().unwrap();
    for p in 0..24 {
        assert_eq!(mem.read_byte(p * PAGE_SIZE), 7);
        assert_eq!(mem.read_byte(p * PAGE_SIZE + 1), 8);
    }
    assert!(st.local_pages_now <= 4, "{st:?}");
}

/// Builds `examples/policy_lifo.c` into a shared object with the system's C
/// compiler; `None` (with the reason printed) when there is none.
fn build_lifo_plugin() -> Option<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
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
        matches!(&e, pagewise::Error::Plugin { path, .. } if path == "/nonexistent/policy.so"),
        "{e:?}"
    );
    // A shared object without the entry point.
    let libc_path = "libc.so.6";
    // SAFETY: libc is already loaded; dlopen only adds a reference.
    let e = unsafe { policy::Plugin::load(libc_path, "") }.unwrap_err();
    assert!(
        matches!(&e, pagewise::Error::Plugin { what, .. } if what.contains("pw_policy_plugin")),
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

/// A region added while threads write to it: no write is lost, and its
/// pages are remote from then on.
fn region_added_while_in_use() {
    if !uffd_or_skip("region_added") {
        return;
    }
    const PAGES: usize = 128;
    let first = AnonMemory::new(16 * PAGE_SIZE).unwrap();
    let mem = Arc::new(AnonMemory::new(PAGES * PAGE_SIZE).unwrap());
    for p in 0..PAGES {
        mem.fill_page(p, 1);
    }
    let mut fm = new_fm(&[first.region()], config(8, 0), fifo(), Calibration::NONE).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shadows: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let (mem, stop) = (mem.clone(), stop.clone());
                s.spawn(move || {
                    let mut shadow = vec![1u8; PAGES * PAGE_SIZE];
                    let mut rng = Rng::new(7 + t);
                    // Write until the region was added, then 2000 times more.
                    let mut after = 0;
                    while after < 2000 {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            after += 1;
                        }
                        let p = rng.below((PAGES / 2) as u64) as usize * 2 + t as usize;
                        let off = p * PAGE_SIZE + rng.below(PAGE_SIZE as u64) as usize;
                        let v = rng.below(250) as u8 + 2;
                        mem.write_byte(off, v);
                        shadow[off] = v;
                    }
                    shadow
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(5));
        fm.add(mem.region()).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(fm.regions().len(), 2);
    let st = fm.stop().unwrap();
    let live = mem.snapshot();
    for p in 0..PAGES {
        let want = &shadows[p % 2][p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
        assert!(
            live[p * PAGE_SIZE..(p + 1) * PAGE_SIZE] == *want,
            "page {p} lost a write"
        );
    }
    assert!(st.remote_fetches > 0, "{st:?}");
    // Adding an overlapping region is refused.
    let mut fm = new_fm(&[first.region()], config(8, 0), fifo(), Calibration::NONE).unwrap();
    assert!(fm.add(first.region()).is_err());
    fm.stop().unwrap();
}

/// The trace records every fetch and eviction, in order, with addresses.
fn trace_of_the_two_page_test() {
    use pagewise::farmem::TraceKind;
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

/// Regression: a range the program mapped, found by the engine only after
/// the program had given part of it back (a heap the C library trimmed), was
/// refused whole when another kind of mapping had taken its place ("not
/// emulating …: UFFDIO_REGISTER … Invalid argument", as `git` showed): the
/// part still private anonymous memory is emulated, the rest left alone
/// without a word.
fn a_range_found_after_it_changed_is_emulated_where_it_is_still_anonymous() {
    if !uffd_or_skip("found_after_shrink") {
        return;
    }
    let base = AnonMemory::new(4 * PAGE_SIZE).unwrap();
    let late = AnonMemory::new(64 * PAGE_SIZE).unwrap();
    let found = late.region();
    // Before the engine hears of the range, its second half is given back
    // and a private file mapping takes its place (which no userfaultfd may
    // serve in missing mode).
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    // SAFETY: replaces the last 32 pages of the test's own mapping, which
    // nothing refers to, with a read-only private mapping of a file.
    let p = unsafe {
        libc::mmap(
            late.as_ptr().add(32 * PAGE_SIZE).cast(),
            32 * PAGE_SIZE,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let told = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = told.clone();
    let hooks = pagewise::farmem::Hooks {
        discover: Some(Box::new(move |out: &mut Vec<pagewise::Region>| {
            if !t.swap(true, std::sync::atomic::Ordering::AcqRel) {
                out.push(found);
            }
        })),
        fault_path: PATH.with(|p| p.get()),
        ..Default::default()
    };
    let fm = FarMemory::new_with(
        &[base.region()],
        config(1000, 0),
        fifo(),
        Calibration::NONE,
        hooks,
    )
    .unwrap();
    // The program registers what it maps before the engine looks (the shim
    // does this in its system-call trap).
    pagewise_sys::uffd::register(
        fm.uffd(),
        late.addr(),
        32 * PAGE_SIZE as u64,
        pagewise_sys::uffd::REGISTER_MODE_MISSING,
    )
    .unwrap();
    use std::io::Write;
    fm.waker().unwrap().write_all(b"d").unwrap();
    let t0 = std::time::Instant::now();
    while !told.load(std::sync::atomic::Ordering::Acquire) && t0.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let before = fm.stats().page_fault_count;
    for p in 0..32 {
        late.write_byte(p * PAGE_SIZE, p as u8 + 1);
    }
    let st = fm.stop().unwrap();
    assert_eq!(
        st.page_fault_count - before,
        32,
        "the half still mapped was not emulated"
    );
    for p in 0..32 {
        assert_eq!(late.read_byte(p * PAGE_SIZE), p as u8 + 1);
    }
}

/// Far-memory emulation works on private anonymous memory and refuses every
/// other kind by name (it moves pages with UFFDIO_MOVE, which only private
/// anonymous pages allow).
fn memory_types_other_than_private_anonymous_are_refused() {
    use pagewise::mech::procfs::MemoryKind as K;
    if !uffd_or_skip("memory_types_other_than_private_anonymous_are_refused") {
        return;
    }
    let ok = common::Mapped::new(K::PrivateAnonymous, 16).unwrap();
    let fm = new_fm(&[ok.region()], config(4, 0), fifo(), Calibration::NONE).unwrap();
    assert_eq!(
        ok.byte(5 * PAGE_SIZE + 9),
        5 | 1,
        "private anonymous memory is served"
    );
    drop(fm);
    for kind in [K::Shared, K::FilePrivate, K::Hugetlb] {
        let m = match common::Mapped::new(kind, 16) {
            Ok(m) => m,
            Err(why) => {
                pagewise_testkit::skip!("[{}] {why}", kind.name());
                continue;
            }
        };
        let e = new_fm(&[m.region()], config(4, 0), fifo(), Calibration::NONE).unwrap_err();
        assert!(
            matches!(e, pagewise::Error::MemoryType(_)),
            "{}: {e:?}",
            kind.name()
        );
        assert!(e.to_string().contains(kind.name()), "{e}");
        // Untouched: every byte as written.
        for i in 0..16 {
            assert_eq!(m.byte(i * PAGE_SIZE + 9), (i as u8) | 1);
        }
    }
}

/// Inline path: buffers held for the kernel stay local while other threads
/// fault and evict through a budget of 4 pages: 300 `pread()`s into
/// 3-page buffers (the budget cannot hold them all) succeed, and every
/// byte read equals the file's; the writers' bytes equal their shadows.
#[test]
fn held_buffers_survive_eviction_inside_system_calls() {
    if !uffd_or_skip("held_buffers") {
        return;
    }
    if !pagewise::probe::get().uffd_has(pagewise_sys::uffd::feature::SIGBUS) {
        pagewise_testkit::skip!("held_buffers: the kernel lacks UFFD_FEATURE_SIGBUS");
        return;
    }
    use std::os::unix::fs::FileExt;
    let file_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pagewise-farmem-held-{}", std::process::id()));
    let data: Vec<u8> = (0..64 * PAGE_SIZE).map(|i| (i * 13 % 253) as u8).collect();
    std::fs::write(&file_path, &data).unwrap();
    const PAGES: usize = 96;
    let mem = Arc::new(AnonMemory::new(PAGES * PAGE_SIZE).unwrap());
    PATH.with(|p| p.set(FaultPath::Inline));
    let fm = new_fm(&[mem.region()], config(4, 0), fifo(), Calibration::NONE).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shadow = std::thread::scope(|s| {
        // A writer over pages 0..32.
        let writer = {
            let (mem, stop) = (mem.clone(), stop.clone());
            s.spawn(move || {
                let mut shadow = vec![0u8; 32 * PAGE_SIZE];
                let mut rng = Rng::new(5);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let off = rng.below((32 * PAGE_SIZE) as u64) as usize;
                    let v = rng.below(255) as u8 + 1;
                    mem.write_byte(off, v);
                    shadow[off] = v;
                }
                shadow
            })
        };
        // The writer stops also when a check below fails.
        struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _stop_writer = StopOnDrop(stop.clone());
        let file = std::fs::File::open(&file_path).unwrap();
        let mut rng = Rng::new(6);
        for i in 0..300 {
            // A 3-page buffer at a random place of pages 32..96, misaligned.
            let page = 32 + rng.below(60) as usize;
            let off = page * PAGE_SIZE + 100;
            let len = 2 * PAGE_SIZE + 500;
            let at = rng.below((60 * PAGE_SIZE) as u64);
            let range =
                pagewise::Region::new(mem.addr() + (page * PAGE_SIZE) as u64, 3 * PAGE_SIZE as u64)
                    .unwrap();
            let held = fm.hold(range);
            // SAFETY: the buffer lies inside the test's own mapping.
            let buf = unsafe { std::slice::from_raw_parts_mut(mem.as_ptr().add(off), len) };
            let n = file
                .read_at(buf, at)
                .unwrap_or_else(|e| panic!("read {i}: {e}"));
            drop(held);
            assert_eq!(n, len, "read {i}");
            let mut got = vec![0u8; len];
            mem.read_into(off, &mut got);
            assert!(
                got[..] == data[at as usize..at as usize + len],
                "read {i}: bytes differ"
            );
        }
        drop(_stop_writer);
        writer.join().unwrap()
    });
    let st = fm.stop().unwrap();
    std::fs::remove_file(&file_path).unwrap();
    let live = mem.snapshot();
    assert!(
        live[..32 * PAGE_SIZE] == shadow[..],
        "a writer's byte was lost"
    );
    assert!(st.evictions > 300, "the budget forced evictions ({st:?})");
    assert!(st.inline_faults > 300, "faults were served inline ({st:?})");
    println!(
        "     {} faults inline, {} evictions, 300 reads into held buffers",
        st.inline_faults, st.evictions
    );
}

/// A region whose middle page is shared with another process (a forked
/// child still holds it, so `UFFDIO_MOVE` refuses it with `EBUSY` after the
/// pages before it moved): the region is emulated around that page, none
/// of the pages that reached staging is dropped, and every byte reads and
/// writes back as in a shadow copy under eviction.
fn a_region_with_a_shared_page_keeps_every_byte() {
    if !uffd_or_skip("shared_page") {
        return;
    }
    if std::env::var_os("PAGEWISE_FARMEM_ALONE").is_none() {
        // fork(2) shares every page of the process, the other tests' too:
        // this test runs alone in a process of its own.
        let name = format!(
            "a_region_with_a_shared_page_keeps_every_byte::{}",
            fm_path()
        );
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &name, "--test-threads=1", "--nocapture"])
            .env("PAGEWISE_FARMEM_ALONE", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{name} alone:\n{text}"
        );
        // What the run alone could not check is said here too.
        for line in text.lines().filter(|l| l.starts_with("SKIP ")) {
            let why = line.split_once(": ").map_or(line, |(_, why)| why);
            pagewise_testkit::skip!("{why}");
        }
        return;
    }
    const PAGES: usize = 64;
    const SHARED: usize = 40;
    let mem = AnonMemory::new(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        mem.fill_page(p, p as u8 + 1);
    }
    // SAFETY: the child only waits in pause(2) until it is killed.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork");
    if child == 0 {
        loop {
            // SAFETY: pause(2) only waits for a signal.
            unsafe { libc::pause() };
        }
    }
    // Every page but one gets its own copy again; that one stays shared.
    for p in (0..PAGES).filter(|&p| p != SHARED) {
        mem.fill_page(p, p as u8 + 101);
    }
    let mut shadow = mem.snapshot();
    let fm = new_fm(&[mem.region()], config(8, 0), fifo(), Calibration::NONE);
    // The precondition: the pages before the shared one went to staging,
    // the shared one stayed where it was (mincore(2) tells which pages are
    // mapped, without touching them).
    let mut resident = vec![0u8; PAGES];
    // SAFETY: mincore(2) of the mapping `mem` owns, into a vector of one
    // byte per page.
    let rc = unsafe {
        libc::mincore(
            mem.addr() as *mut libc::c_void,
            PAGES * PAGE_SIZE,
            resident.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore");
    if fm.is_ok() && !(resident[0] & 1 == 0 && resident[SHARED] & 1 == 1) {
        pagewise_testkit::not_happened!(
            "the partial move to staging did not happen (first page mapped: {}, shared page mapped: {}): the kernel moved the shared page or refused the first",
            resident[0] & 1,
            resident[SHARED] & 1
        );
    }
    // SAFETY: kill(2) and waitpid(2) of the child forked above.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    let fm = fm.expect("a region with one shared page is emulated");
    let mut rng = Rng::new(11);
    for _ in 0..4000 {
        let off = rng.below((PAGES * PAGE_SIZE) as u64) as usize;
        if rng.below(2) == 0 {
            let v = rng.below(256) as u8;
            mem.write_byte(off, v);
            shadow[off] = v;
        } else {
            assert_eq!(
                mem.read_byte(off),
                shadow[off],
                "byte {off} under emulation"
            );
        }
    }
    let st = fm.stop().unwrap();
    assert_eq!(mem.snapshot(), shadow, "memory after the engine stopped");
    assert!(
        st.remote_fetches > 0,
        "nothing was fetched: the region was not emulated ({st:?})"
    );
}
