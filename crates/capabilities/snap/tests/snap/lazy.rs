//! Lazy restore against ground truth: after [`LazyRestore::start`] every
//! page read equals the saved copy (or what the program wrote or dropped
//! since), under concurrent readers and writers; the counts of faults and
//! copies are exact; drops, unmaps and moves made meanwhile are followed.

use super::disk::TempDir;
use pagewise::PAGE_SIZE;
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_snap::{DiskStore, LazyOptions, LazyRestore};
use std::sync::atomic::{AtomicBool, Ordering};

const P: usize = PAGE_SIZE;

fn uffd_or_skip(test: &str) -> bool {
    if pagewise_mech::probe::get().uffd_access.is_some() {
        return true;
    }
    pagewise_testkit::skip!("{test}: userfaultfd is not available to this user on this kernel");
    false
}

/// Memory of `pages` pages where every fifth page is zero and the others
/// hold a pattern of their index; saved as snapshot 1 of a new store, then
/// scribbled over. Returns the memory, the saved copy and the store.
fn saved(name: &str, pages: usize) -> (AnonMemory, Vec<u8>, TempDir) {
    let mem = AnonMemory::new(pages * P).unwrap();
    for p in 0..pages {
        if p % 5 != 0 {
            let bytes: Vec<u8> = (0..P).map(|i| ((p * 131 + i * 7) % 251) as u8).collect();
            mem.write_at(p * P, &bytes);
        }
    }
    let want = mem.snapshot();
    let dir = TempDir::new(name);
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let mut w = disk.writer(&[mem.region()], None, name).unwrap();
    for p in 0..pages {
        w.push(&want[p * P..(p + 1) * P]).unwrap();
    }
    w.finish().unwrap();
    mem.write_pass(PAGE_SIZE, 0xee);
    (mem, want, dir)
}

fn nonzero(pages: usize) -> u64 {
    (0..pages).filter(|p| p % 5 != 0).count() as u64
}

fn page_differs(mem: &AnonMemory, want: &[u8], p: usize) -> bool {
    let mut got = [0u8; P];
    mem.read_page(p, &mut got);
    got[..] != want[p * P..(p + 1) * P]
}

/// Two readers check random pages no one writes (pages `p % 8 >= 2`) while
/// two writers write half pages of their own (`p % 8` 0 and 1), seeded by
/// `seed`: what each writer wrote, in order, and whether a reader saw a
/// page unlike the saved copy.
fn readers_and_writers(
    mem: &AnonMemory,
    want: &[u8],
    pages: usize,
    seed: u64,
) -> (Vec<Vec<(usize, u8)>>, bool) {
    let bad = AtomicBool::new(false);
    let written = std::thread::scope(|s| {
        for r in 0..2u64 {
            let bad = &bad;
            s.spawn(move || {
                let mut rng = Rng::new(seed + r);
                for _ in 0..3000 {
                    let p = rng.below(pages as u64) as usize;
                    if p % 8 >= 2 && page_differs(mem, want, p) {
                        bad.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
        let writers: Vec<_> = (0..2usize)
            .map(|w| {
                s.spawn(move || {
                    let mut rng = Rng::new(seed + 10 + w as u64);
                    let mut mine = Vec::new();
                    for k in 0..2000 {
                        let p = (rng.below(pages as u64 / 8) as usize) * 8 + w;
                        let v = (k % 200) as u8 + 1;
                        // Half a page: the rest must stay as saved.
                        mem.write_at(p * P, &vec![v; P / 2]);
                        mine.push((p, v));
                    }
                    mine
                })
            })
            .collect();
        writers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (written, bad.load(Ordering::Relaxed))
}

/// Two readers check pages no one writes while two writers write their own
/// pages; the background fill runs all along. At the end the memory is
/// the saved copy with the writers' last values.
#[test]
fn lazy_restore_is_byte_exact_under_concurrent_readers_and_writers() {
    if !uffd_or_skip("lazy_concurrent") {
        return;
    }
    let pages = 4096;
    let (mem, mut want, dir) = saved("lazy-concurrent", pages);
    let disk = DiskStore::open(&dir.0).unwrap();
    let lazy = LazyRestore::start(disk, 1, &[mem.region()], LazyOptions::default()).unwrap();
    let (written, bad) = readers_and_writers(&mem, &want, pages, 10);
    let st = lazy.finish().unwrap();
    assert!(!bad, "a reader saw a page unlike the saved one");
    for mine in written {
        for (p, v) in mine {
            want[p * P..p * P + P / 2].fill(v);
        }
    }
    super::assert_same("memory after the lazy restore", &mem.snapshot(), &want);
    assert!(st.complete, "{st:?}");
    if st.faults == 0 {
        pagewise_testkit::not_happened!(
            "lazy_concurrent: the background fill brought every page in before any thread \
             touched one, so no touch raced it"
        );
    }
    assert_eq!(
        st.copied,
        nonzero(pages),
        "every non-zero page copied once: {st:?}"
    );
    assert_eq!(st.pages, pages as u64);
    assert_eq!(st.dropped, 0);
}

/// With no background fill, one thread's touches are counted exactly: a
/// fault and a copy per non-zero page touched, a fault and no copy per zero
/// page; `finish` copies the rest.
#[test]
fn lazy_restore_counts_first_touches_exactly() {
    if !uffd_or_skip("lazy_counts") {
        return;
    }
    let pages = 1000;
    let (mem, want, dir) = saved("lazy-counts", pages);
    let disk = DiskStore::open(&dir.0).unwrap();
    let opts = LazyOptions::default().background(false);
    let lazy = disk.restore_lazy(1, &[mem.region()], opts).unwrap();
    let touched: Vec<usize> = (0..pages).step_by(7).collect();
    for &p in &touched {
        assert!(
            !page_differs(&mem, &want, p),
            "page {p} after its first touch"
        );
        // A second touch of the same page is no fault.
        assert_eq!(mem.read_byte(p * P + 1), want[p * P + 1]);
    }
    let st = lazy.stats();
    let touched_nonzero = touched.iter().filter(|p| *p % 5 != 0).count() as u64;
    assert_eq!(st.faults, touched.len() as u64, "{st:?}");
    assert_eq!(st.copied, touched_nonzero, "{st:?}");
    assert_eq!(st.background, 0, "{st:?}");
    assert!(!st.complete);
    assert!(st.service_p50_ns > 0 && st.service_p50_ns <= st.service_max_ns);
    let st = lazy.finish().unwrap();
    assert_eq!(st.copied, nonzero(pages), "{st:?}");
    assert_eq!(st.background, nonzero(pages) - touched_nonzero, "{st:?}");
    assert_eq!(
        st.faults,
        touched.len() as u64,
        "finish faults nothing: {st:?}"
    );
    super::assert_same("memory after finish", &mem.snapshot(), &want);
}

/// Pages dropped (`MADV_DONTNEED`) or unmapped before they came in are
/// not brought in (zeros, as without pagewise); pages moved by `mremap`
/// come in at their new place.
#[test]
fn lazy_restore_follows_drops_unmaps_and_moves() {
    if !uffd_or_skip("lazy_moves") {
        return;
    }
    let pages = 256;
    let (mem, want, dir) = saved("lazy-moves", pages);
    let disk = DiskStore::open(&dir.0).unwrap();
    let opts = LazyOptions::default().background(false);
    let lazy = LazyRestore::start(disk, 1, &[mem.region()], opts).unwrap();
    // Dropped before any touch: reads as zeros.
    mem.madvise(0, 16 * P, libc::MADV_DONTNEED).unwrap();
    // Unmapped.
    let base = mem.addr();
    let tail = (base + (240 * P) as u64) as *mut libc::c_void;
    // SAFETY: the last 16 pages of this test's own mapping, not used again.
    let unmapped = unsafe { libc::munmap(tail, 16 * P) };
    assert_eq!(unmapped, 0);
    // Pages 64..128 moved elsewhere.
    let spot = AnonMemory::reserve(64 * P).unwrap();
    // SAFETY: moves 64 pages of this test's own mapping over a reserved
    // spot of the same size it owns.
    let moved = unsafe {
        libc::mremap(
            (base + (64 * P) as u64) as *mut libc::c_void,
            64 * P,
            64 * P,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            spot.as_ptr() as *mut libc::c_void,
        )
    };
    assert_eq!(moved as u64, spot.addr(), "mremap");
    for p in 0..16 {
        let mut got = [1u8; P];
        mem.read_page(p, &mut got);
        assert!(
            got.iter().all(|&b| b == 0),
            "dropped page {p} reads as zeros"
        );
    }
    for k in 0..64 {
        let mut got = [0u8; P];
        spot.read_page(k, &mut got);
        let p = 64 + k;
        assert!(
            got[..] == want[p * P..(p + 1) * P],
            "page {p}, moved, holds what was saved"
        );
    }
    let st = lazy.finish().unwrap();
    let dropped = (0..16).chain(240..256).filter(|p| p % 5 != 0).count() as u64;
    assert_eq!(st.dropped, dropped, "{st:?}");
    for p in (16..64).chain(128..240) {
        assert!(!page_differs(&mem, &want, p), "page {p} after finish");
    }
}

/// Lazy restore works on private anonymous memory only; the other kinds are
/// refused by name, before anything is dropped.
#[test]
fn lazy_restore_refuses_other_memory_types() {
    use pagewise_mech::procfs::MemoryKind as K;
    if !uffd_or_skip("lazy_memory_types") {
        return;
    }
    let (_mem, _want, dir) = saved("lazy-types", 32);
    for kind in [K::Shared, K::FilePrivate, K::Hugetlb] {
        let m = match super::common::Mapped::new(kind, 32) {
            Ok(m) => m,
            Err(why) => {
                pagewise_testkit::skip!("[{}] {why}", kind.name());
                continue;
            }
        };
        let before: Vec<u8> = (0..32).map(|i| m.byte(i * P + 9)).collect();
        let disk = DiskStore::open(&dir.0).unwrap();
        let e = LazyRestore::start(disk, 1, &[m.region()], LazyOptions::default()).unwrap_err();
        assert!(
            matches!(
                e.mech(),
                Some(pagewise::MechError::MemoryType { kind: k, .. }) if *k == kind.name()
            ),
            "{}: {e:?}",
            kind.name()
        );
        let after: Vec<u8> = (0..32).map(|i| m.byte(i * P + 9)).collect();
        assert_eq!(before, after, "{}: left as it was", kind.name());
    }
}

/// A lazy restore of `mem` from the store in `dir`, with staging and no
/// background fill.
fn start_staged(mem: &AnonMemory, dir: &TempDir) -> LazyRestore {
    let disk = DiskStore::open(&dir.0).unwrap();
    let opts = LazyOptions::default().background(false).stage(true);
    LazyRestore::start(disk, 1, &[mem.region()], opts).unwrap()
}

/// Waits (up to `secs`) until the stager has staged at least `pages`;
/// whether it did.
fn wait_staged(test: &str, lazy: &LazyRestore, pages: u64, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let st = lazy.stats();
        assert!(st.staging, "{test}: staging asked for: {st:?}");
        if st.staged >= pages {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// Starts a lazy restore with staging and no background fill, and waits
/// (up to 20 s) until every non-zero page is staged; `None` (said) if the
/// stager did not get there.
fn staged_fully(test: &str, mem: &AnonMemory, dir: &TempDir, pages: usize) -> Option<LazyRestore> {
    let lazy = start_staged(mem, dir);
    if wait_staged(test, &lazy, nonzero(pages), 20) {
        return Some(lazy);
    }
    pagewise_testkit::not_happened!(
        "{test}: the stager staged {} of {} pages in 20 s",
        lazy.stats().staged,
        nonzero(pages)
    );
    None
}

/// With every page staged ahead, first touches are answered from staging,
/// not by store reads, and counted exactly: a fault and a copy from staging
/// per non-zero page touched; `finish` copies the rest from staging; the
/// memory is the saved copy.
#[test]
fn lazy_restore_from_staging_moves_each_page_once() {
    if !uffd_or_skip("lazy_staged_counts") {
        return;
    }
    let pages = 1000;
    let (mem, want, dir) = saved("lazy-staged-counts", pages);
    let Some(lazy) = staged_fully("lazy_staged_counts", &mem, &dir, pages) else {
        return;
    };
    let touched: Vec<usize> = (0..pages).step_by(7).collect();
    for &p in &touched {
        assert!(
            !page_differs(&mem, &want, p),
            "page {p} after its first touch"
        );
    }
    let st = lazy.stats();
    let touched_nonzero = touched.iter().filter(|p| *p % 5 != 0).count() as u64;
    assert_eq!(st.faults, touched.len() as u64, "{st:?}");
    assert_eq!(
        st.faults_staged, touched_nonzero,
        "every touched page was staged: {st:?}"
    );
    assert_eq!(
        (st.copied, st.from_staging),
        (touched_nonzero, touched_nonzero),
        "{st:?}"
    );
    let st = lazy.finish().unwrap();
    assert_eq!(
        (st.copied, st.from_staging),
        (nonzero(pages), nonzero(pages)),
        "{st:?}"
    );
    assert_eq!(st.staged, nonzero(pages), "each page staged once: {st:?}");
    super::assert_same("memory after finish", &mem.snapshot(), &want);
}

/// Staging under two readers and two writers, the stager racing the
/// faults (an eighth of the pages staged when they start): the memory ends as the saved copy with
/// the writers' last values, and every non-zero page came in once, from
/// staging or from the store.
#[test]
fn lazy_restore_with_staging_is_byte_exact_under_concurrent_writers() {
    if !uffd_or_skip("lazy_staged_concurrent") {
        return;
    }
    let pages = 8192;
    let (mem, mut want, dir) = saved("lazy-staged-concurrent", pages);
    let lazy = start_staged(&mem, &dir);
    // Some pages staged before the threads start (the stager, at the
    // lowest priority, may get little CPU once they run), not all: faults
    // of both kinds race.
    wait_staged("lazy_staged_concurrent", &lazy, nonzero(pages) / 8, 10);
    let (written, bad) = readers_and_writers(&mem, &want, pages, 30);
    let st = lazy.finish().unwrap();
    assert!(!bad, "a reader saw a page unlike the saved one");
    for mine in written {
        for (p, v) in mine {
            want[p * P..p * P + P / 2].fill(v);
        }
    }
    super::assert_same("memory after the lazy restore", &mem.snapshot(), &want);
    assert_eq!(
        st.copied,
        nonzero(pages),
        "every non-zero page once: {st:?}"
    );
    assert!(
        st.from_staging <= st.staged && st.staged <= nonzero(pages),
        "{st:?}"
    );
    if st.faults_staged == 0 || st.faults_staged == st.faults {
        pagewise_testkit::not_happened!(
            "lazy_staged_concurrent: the touches found {} of {} faults staged: no mix of \
             staged and unstaged faults raced",
            st.faults_staged,
            st.faults
        );
    }
}

/// A child forked after staging shares the staging area copy-on-write
/// (and sleeps meanwhile): the parent's first touches are still answered
/// from staging, with what was saved.
#[test]
fn lazy_restore_copies_staged_pages_a_child_shares() {
    if !uffd_or_skip("lazy_staged_fork") {
        return;
    }
    let pages = 256;
    let (mem, want, dir) = saved("lazy-staged-fork", pages);
    let Some(lazy) = staged_fully("lazy_staged_fork", &mem, &dir, pages) else {
        return;
    };
    // SAFETY: the child calls only async-signal-safe functions (sleep,
    // _exit) before it ends.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        // Its copies of the test process's descriptors go first: held for
        // its 30 s, a store's lock taken by a test running beside this one
        // stayed held after that test let it go (one_writer_at_a_time
        // then found its store locked).
        super::common::close_inherited(&[]);
        // SAFETY: async-signal-safe calls only, in the forked child.
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    for p in 0..pages {
        assert!(
            !page_differs(&mem, &want, p),
            "page {p} after its first touch"
        );
    }
    // SAFETY: our own child, which waits to be ended.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    let st = lazy.finish().unwrap();
    assert_eq!(st.copied, nonzero(pages), "{st:?}");
    assert_eq!(st.faults_staged, nonzero(pages), "{st:?}");
    super::assert_same("memory after finish", &mem.snapshot(), &want);
}
