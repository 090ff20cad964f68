//! Regions as the program changes them: added while in use, found after
//! they changed, memory of other types refused, buffers held inside system
//! calls, and a region holding a page shared with another mapping.

use super::*;

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
    let hooks = pagewise_farmem::Hooks::default()
        .discover(move |out: &mut Vec<pagewise::Region>| {
            if !t.swap(true, std::sync::atomic::Ordering::AcqRel) {
                out.push(found);
            }
        })
        .fault_path(PATH.with(|p| p.get()));
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
    // SAFETY: the engine's userfaultfd, open while `fm` runs.
    let uffd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fm.uffd()) };
    pagewise_sys::uffd::register(
        uffd,
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
    use pagewise_mech::procfs::MemoryKind as K;
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
            matches!(
                e,
                pagewise_farmem::Error::Mech(pagewise::MechError::MemoryType { kind: k, .. })
                    if k == kind.name()
            ),
            "{}: {e:?}",
            kind.name()
        );
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
    if !pagewise_mech::probe::get().uffd_has(pagewise_sys::uffd::feature::SIGBUS) {
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
    // fork(2) shares every page of the process, the other tests' too: this
    // test runs alone in a process of its own.
    let name = format!(
        "a_region_with_a_shared_page_keeps_every_byte::{}",
        fm_path()
    );
    if crate::common::ran_alone(module_path!(), &name) {
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

// Every test runs on both fault paths: `NAME::thread` and `NAME::inline`.
pagewise_testkit::per_fault_path!(
    super::on_path;
    region_added_while_in_use,
    a_range_found_after_it_changed_is_emulated_where_it_is_still_anonymous,
    memory_types_other_than_private_anonymous_are_refused,
    a_region_with_a_shared_page_keeps_every_byte,
);
