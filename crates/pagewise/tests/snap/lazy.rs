//! Lazy restore against ground truth: after [`LazyRestore::start`] every
//! page read equals the saved copy (or what the program wrote or dropped
//! since), under concurrent readers and writers; the counts of faults and
//! copies are exact; drops, unmaps and moves made meanwhile are followed.

use super::disk::TempDir;
use pagewise::snap::{DiskStore, LazyOptions, LazyRestore};
use pagewise::workload::{AnonMemory, Rng};
use pagewise::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, Ordering};

const P: usize = PAGE_SIZE;

fn uffd_or_skip(test: &str) -> bool {
    if pagewise::probe::get().uffd_access.is_some() {
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
    let bad = AtomicBool::new(false);
    let written: Vec<Vec<(usize, u8)>> = std::thread::scope(|s| {
        for r in 0..2u64 {
            let (mem, want, bad) = (&mem, &want, &bad);
            s.spawn(move || {
                let mut rng = Rng::new(10 + r);
                for _ in 0..3000 {
                    let p = rng.below(pages as u64) as usize;
                    // Pages p % 8 < 2 belong to the writers.
                    if p % 8 >= 2 && page_differs(mem, want, p) {
                        bad.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
        let writers: Vec<_> = (0..2usize)
            .map(|w| {
                let mem = &mem;
                s.spawn(move || {
                    let mut rng = Rng::new(20 + w as u64);
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
    let st = lazy.finish().unwrap();
    assert!(
        !bad.load(Ordering::Relaxed),
        "a reader saw a page unlike the saved one"
    );
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
