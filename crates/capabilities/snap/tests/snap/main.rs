//! Snapshots against ground truth: a model keeps a full copy of memory for
//! every snapshot. After every restore the live memory must equal the copy
//! byte for byte; reads, diffs and the store's unique-page count must equal
//! what the copies say. With `uffd-wp` the work done is checked exactly too:
//! a take reads exactly the pages written since the last take or restore, and
//! a restore writes exactly the pages that differ.

use pagewise_testkit::targets as common;
mod criu;
mod disk;
mod lazy;
mod live;
mod wire;

use common::for_each_backend;
use pagewise::{PageRange, Region, PAGE_SIZE};
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_snap::{SnapId, SnapshotOptions, Snapshots};
use pagewise_track::BackendKind;
use std::collections::{BTreeMap, BTreeSet, HashSet};

const P: usize = PAGE_SIZE;

/// Live memory (several regions) and the model's copies.
struct Model {
    mems: Vec<AnonMemory>,
    snaps: BTreeMap<SnapId, Vec<u8>>,
    /// Contents at the last take or restore.
    reference: Option<Vec<u8>>,
    /// Global page indices written since the last take or restore.
    touched: BTreeSet<usize>,
    /// Whether the last take or restore was a restore.
    after_restore: bool,
    /// Pages written since the tracker last re-protected them (`uffd-wp`): a
    /// take right after a restore leaves them so, and the next take or
    /// restore reads or writes them again.
    unarmed: BTreeSet<usize>,
    rng: std::cell::RefCell<Rng>,
}

impl Model {
    fn new(pages: &[usize], seed: u64) -> Self {
        let mems: Vec<AnonMemory> = pages
            .iter()
            .map(|&n| AnonMemory::new(n * P).unwrap())
            .collect();
        Model {
            mems,
            snaps: BTreeMap::new(),
            reference: None,
            touched: BTreeSet::new(),
            after_restore: false,
            unarmed: BTreeSet::new(),
            rng: std::cell::RefCell::new(Rng::new(seed)),
        }
    }

    fn below(&self, n: u64) -> u64 {
        self.rng.borrow_mut().below(n)
    }

    fn regions(&self) -> Vec<Region> {
        let mut r: Vec<Region> = self.mems.iter().map(|m| m.region()).collect();
        r.sort();
        r
    }

    /// Memories in address order (as `Snapshots` orders regions).
    fn ordered(&self) -> Vec<&AnonMemory> {
        let mut m: Vec<&AnonMemory> = self.mems.iter().collect();
        m.sort_by_key(|m| m.addr());
        m
    }

    fn total_pages(&self) -> usize {
        self.mems.iter().map(|m| m.pages()).sum()
    }

    fn live(&self) -> Vec<u8> {
        self.ordered().iter().flat_map(|m| m.snapshot()).collect()
    }

    /// (memory, page) of global page `g`, and its address.
    fn locate(&self, mut g: usize) -> (&AnonMemory, usize) {
        for m in self.ordered() {
            if g < m.pages() {
                return (m, g);
            }
            g -= m.pages();
        }
        panic!("page {g} out of range")
    }

    fn addr_of(&self, g: usize) -> u64 {
        let (m, p) = self.locate(g);
        m.addr() + (p * P) as u64
    }

    /// Global page index of an address.
    fn global(&self, addr: u64) -> usize {
        let mut g = 0;
        for m in self.ordered() {
            if m.region().contains(addr) {
                return g + ((addr - m.addr()) as usize) / P;
            }
            g += m.pages();
        }
        panic!("address {addr:#x} outside the regions")
    }

    /// Writes `k` random pages in varied ways (bytes, patterns that repeat, zeros, copies).
    fn write_some(&mut self, k: usize, allow_discard: bool) {
        let n = self.total_pages();
        for _ in 0..k {
            let g = self.below(n as u64) as usize;
            let (m, p) = self.locate(g);
            match self.below(if allow_discard { 6 } else { 5 }) {
                0 | 1 => {
                    let off = self.below(P as u64 - 8) as usize;
                    let v = self.below(256) as u8;
                    m.write_byte(p * P + off, v);
                    m.write_byte(p * P + off + 7, v.wrapping_add(1));
                }
                2 => m.fill_page(p, (self.below(4) + 1) as u8),
                3 => m.fill_page(p, 0),
                4 => {
                    let src = self.below(m.pages() as u64) as usize;
                    let mut buf = [0u8; P];
                    m.read_page(src, &mut buf);
                    for (i, b) in buf.iter().enumerate() {
                        m.write_byte(p * P + i, *b);
                    }
                }
                _ => {
                    m.madvise(p * P, P, libc::MADV_DONTNEED).unwrap();
                }
            }
            self.touched.insert(g);
            self.unarmed.insert(g);
        }
    }

    /// Distinct non-zero page contents over the live snapshots and the reference.
    fn distinct_pages(&self) -> u64 {
        let mut set: HashSet<&[u8]> = HashSet::new();
        for c in self.snaps.values().chain(self.reference.iter()) {
            for page in c.chunks(P) {
                if page.iter().any(|&b| b != 0) {
                    set.insert(page);
                }
            }
        }
        set.len() as u64
    }

    fn page_diff(&self, a: &[u8], b: &[u8]) -> Vec<PageRange> {
        let mut out: Vec<PageRange> = Vec::new();
        for g in 0..self.total_pages() {
            if a[g * P..(g + 1) * P] != b[g * P..(g + 1) * P] {
                let addr = self.addr_of(g);
                match out.last_mut() {
                    Some(l) if l.end() == addr => l.pages += 1,
                    _ => out.push(PageRange {
                        start: addr,
                        pages: 1,
                    }),
                }
            }
        }
        out
    }
}

fn assert_same(what: &str, live: &[u8], want: &[u8]) {
    if let Some(off) = live.iter().zip(want).position(|(a, b)| a != b) {
        let bad = live
            .chunks(P)
            .zip(want.chunks(P))
            .filter(|(a, b)| a != b)
            .count();
        panic!(
            "{what}: {bad} pages differ, first at byte {off:#x} (page {})",
            off / P
        );
    }
}

/// The random model run: takes, restores, drops, reads and diffs, checked after each step.
fn run_model(kind: BackendKind, steps: usize, seed: u64) {
    // Three regions, one of them not a whole number of chunks.
    let mut m = Model::new(&[512, 300, 1024], seed);
    let exact = kind == BackendKind::UffdWp;
    let discards = kind != BackendKind::Mprotect;
    // Half the pages populated before the first snapshot.
    m.write_some(m.total_pages() / 2, false);
    let mut s = Snapshots::new(&m.regions(), SnapshotOptions::default().backend(kind)).unwrap();
    assert_eq!(s.backend(), kind);
    let (mut takes, mut restores, mut written) = (0, 0, 0u64);
    for step in 0..steps {
        let op = if m.snaps.is_empty() { 0 } else { m.below(10) };
        match op {
            0..=2 => {
                let id = s.take().unwrap();
                let live = m.live();
                let info = s.list().into_iter().find(|i| i.id == id).unwrap();
                let read: BTreeSet<usize> = m.touched.union(&m.unarmed).copied().collect();
                if exact && m.reference.is_some() {
                    assert_eq!(
                        info.take.pages_read,
                        read.len() as u64,
                        "step {step}: a take reads exactly the written pages (and those left open)"
                    );
                }
                if !m.after_restore {
                    m.unarmed.clear();
                }
                m.after_restore = false;
                m.snaps.insert(id, live.clone());
                m.reference = Some(live);
                m.touched.clear();
                takes += 1;
            }
            3..=4 => {
                let ids: Vec<SnapId> = m.snaps.keys().copied().collect();
                let id = ids[m.below(ids.len() as u64) as usize];
                let want = m.snaps[&id].clone();
                let live = m.live();
                let st = s.restore(id).unwrap();
                assert_same(
                    &format!("step {step}: restore of snapshot {id}"),
                    &m.live(),
                    &want,
                );
                assert_eq!(st.foreign_writes, 0);
                if exact {
                    let reference = m.reference.as_ref().unwrap();
                    let must: BTreeSet<usize> = (0..m.total_pages())
                        .filter(|&g| {
                            m.touched.contains(&g)
                                || m.unarmed.contains(&g)
                                || reference[g * P..(g + 1) * P] != want[g * P..(g + 1) * P]
                        })
                        .collect();
                    assert_eq!(
                        st.pages_written,
                        must.len() as u64,
                        "step {step}: a restore writes exactly the pages that may differ"
                    );
                }
                // Never fewer than the pages whose content really differed.
                let really = m.page_diff(&live, &want);
                assert!(st.pages_written >= really.iter().map(|r| r.pages).sum::<u64>());
                written += st.pages_written;
                m.reference = Some(want);
                m.touched.clear();
                m.unarmed.clear();
                m.after_restore = true;
                restores += 1;
            }
            5 => {
                // Keep between 3 and 24 snapshots alive.
                while m.snaps.len() > 3 {
                    let ids: Vec<SnapId> = m.snaps.keys().copied().collect();
                    let id = ids[m.below(ids.len() as u64) as usize];
                    s.drop_snapshot(id).unwrap();
                    m.snaps.remove(&id);
                    if m.snaps.len() <= 24 {
                        break;
                    }
                }
            }
            6 => {
                // Software MMU: reads across page and chunk boundaries.
                let ids: Vec<SnapId> = m.snaps.keys().copied().collect();
                let id = ids[m.below(ids.len() as u64) as usize];
                let mem = m.ordered()[m.below(m.mems.len() as u64) as usize];
                let off = m.below(mem.len() as u64 - 1) as usize;
                let len = (m.below(3 * P as u64) as usize + 1).min(mem.len() - off);
                let mut buf = vec![0u8; len];
                s.read(id, mem.addr() + off as u64, &mut buf).unwrap();
                let g = m.global(mem.addr() + off as u64);
                let start = g * P + off % P;
                assert_eq!(buf, &m.snaps[&id][start..start + len], "step {step}: read");
            }
            7 => {
                let ids: Vec<SnapId> = m.snaps.keys().copied().collect();
                let a = ids[m.below(ids.len() as u64) as usize];
                let b = ids[m.below(ids.len() as u64) as usize];
                assert_eq!(
                    s.diff(a, b).unwrap(),
                    m.page_diff(&m.snaps[&a], &m.snaps[&b]),
                    "step {step}: diff {a} {b}"
                );
                assert_eq!(
                    s.diff_live(a).unwrap(),
                    m.page_diff(&m.snaps[&a], &m.live()),
                    "step {step}: diff of {a} against live memory"
                );
                // Its collection re-protects the unarmed pages and keeps them
                // for the next take or restore, which cannot know whether
                // they were written again.
                let unarmed = std::mem::take(&mut m.unarmed);
                m.touched.extend(unarmed);
            }
            _ => {
                let k = m.below(40) as usize + 1;
                m.write_some(k, discards);
            }
        }
        if step % 10 == 0 || step + 1 == steps {
            assert_eq!(
                s.store().stats().unique_pages,
                m.distinct_pages(),
                "step {step}: unique pages"
            );
        }
    }
    let st = s.store().stats();
    println!(
        "     model [{kind}]: {takes} takes, {restores} restores ({written} pages written), {} snapshots live, {} unique pages, {} KiB saved",
        m.snaps.len(),
        st.unique_pages,
        st.bytes_saved / 1024
    );
    assert!(takes > 0 && restores > 0);
}

#[test]
fn random_model_is_byte_exact() {
    for_each_backend("snapshot model", &[], |kind| run_model(kind, 400, 7));
}

#[test]
fn random_model_other_seeds() {
    for seed in [11, 12, 13] {
        run_model(BackendKind::Auto.resolve_in_process(), 250, seed);
    }
}

#[test]
fn unpopulated_memory_and_discards() {
    for_each_backend("discards", &[BackendKind::Mprotect], |kind| {
        let mem = AnonMemory::new(4 << 20).unwrap();
        let mut s =
            Snapshots::new(&[mem.region()], SnapshotOptions::default().backend(kind)).unwrap();
        // Nothing populated: the first snapshot is all zero pages and stores nothing.
        let empty = s.take().unwrap();
        assert_eq!(s.store().stats().unique_pages, 0);
        assert_eq!(s.list()[0].zero_pages, mem.pages() as u64);
        mem.write_pass(PAGE_SIZE, 9);
        let full = s.take().unwrap();
        assert_eq!(s.store().stats().unique_pages, 1, "all pages are equal");
        // Discard half the memory: the snapshot must see the zeros.
        mem.madvise(0, 2 << 20, libc::MADV_DONTNEED).unwrap();
        let half = s.take().unwrap();
        let shadow_half = mem.snapshot();
        s.restore(full).unwrap();
        assert!(mem.snapshot().iter().all(|&b| b == 9));
        s.restore(half).unwrap();
        assert_same("restore after discard", &mem.snapshot(), &shadow_half);
        s.restore(empty).unwrap();
        assert!(mem.snapshot().iter().all(|&b| b == 0));
        s.drop_snapshot(full).unwrap();
        s.drop_snapshot(half).unwrap();
        // Only the reference (all zeros now) remains: nothing stored.
        assert_eq!(s.store().stats().unique_pages, 0);
    });
}

#[test]
fn bad_input_is_refused() {
    let mem = AnonMemory::new(1 << 20).unwrap();
    assert!(Snapshots::new(&[], SnapshotOptions::default()).is_err());
    let r = mem.region();
    let overlap = Region::new(r.start + P as u64, P as u64).unwrap();
    let e = Snapshots::new(&[r, overlap], SnapshotOptions::default()).unwrap_err();
    assert!(
        matches!(
            e.mech(),
            Some(pagewise::MechError::Overlap { b_start, .. }) if *b_start == overlap.start
        ),
        "{e}"
    );
    // An address nothing is mapped at (just past the 2 MiB-aligned mapping's end
    // is not guaranteed free, so use the null page).
    let e = Snapshots::new(
        &[Region::new(0, P as u64).unwrap()],
        SnapshotOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e.mech(),
            Some(pagewise::MechError::NotWritable {
                at: 0,
                mapped: false,
                ..
            })
        ),
        "{e:?}"
    );
    let mut s = Snapshots::new(&[r], SnapshotOptions::default()).unwrap();
    assert!(s
        .restore(1)
        .unwrap_err()
        .to_string()
        .contains("no snapshot 1"));
    let id = s.take().unwrap();
    let mut buf = [0u8; 16];
    assert!(
        s.read(id, r.end() - 8, &mut buf).is_err(),
        "read past the region"
    );
    assert!(
        s.read(id, 4096, &mut buf).is_err(),
        "read outside every region"
    );
    assert!(s.diff(id, 99).is_err());
    assert!(s.drop_snapshot(99).is_err());
}

/// Snapshots work on private memory, anonymous or file-backed (byte-exact
/// restore checked), and refuse shared memory and hugetlb by name.
#[test]
fn memory_types() {
    use pagewise_mech::procfs::MemoryKind as K;
    for kind in [K::PrivateAnonymous, K::FilePrivate] {
        let m = common::Mapped::new(kind, 32).unwrap();
        let mut s = Snapshots::new(&[m.region()], SnapshotOptions::default()).unwrap();
        let base = s.take().unwrap();
        for i in (0..32).step_by(3) {
            m.set(i * P + 100, 0xEE);
        }
        s.restore(base).unwrap();
        for i in 0..32 {
            assert_eq!(
                m.byte(i * P + 9),
                (i as u8) | 1,
                "{}: page {i}",
                kind.name()
            );
            assert_eq!(m.byte(i * P + 100), 0, "{}: page {i} restored", kind.name());
        }
    }
    for kind in [K::Shared, K::Hugetlb] {
        let m = match common::Mapped::new(kind, 32) {
            Ok(m) => m,
            Err(why) => {
                pagewise_testkit::skip!("[{}] {why}", kind.name());
                continue;
            }
        };
        let e = Snapshots::new(&[m.region()], SnapshotOptions::default()).unwrap_err();
        assert!(
            matches!(
                e.mech(),
                Some(pagewise::MechError::MemoryType { kind: k, .. }) if *k == kind.name()
            ),
            "{}: {e:?}",
            kind.name()
        );
    }
}
