//! The durable store against ground truth: what is loaded back equals what
//! was saved, byte for byte; damaged stores give errors, never wrong data;
//! a save killed at any moment leaves every earlier snapshot loadable
//! ([`writers`]); snapshots of another process are exact ([`process`]).

mod process;
mod sparse;
mod writers;

use super::assert_same;
use pagewise::{Region, PAGE_SIZE};
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_snap::{DiskStore, SnapshotOptions, Snapshots};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

const P: usize = PAGE_SIZE;

/// A fresh directory under the temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "pagewise-test-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fills `mem` with a mix of zero, repeated and distinct pages derived from `seed`.
fn fill(mem: &AnonMemory, seed: u64) {
    let mut rng = Rng::new(seed);
    for p in 0..mem.pages() {
        match rng.below(4) {
            0 => mem.fill_page(p, 0),
            1 => mem.fill_page(p, (rng.below(3) + 1) as u8),
            _ => {
                mem.fill_page(p, 0x5a);
                for _ in 0..8 {
                    let off = rng.below(P as u64) as usize;
                    mem.write_byte(p * P + off, rng.next_u64() as u8);
                }
            }
        }
    }
}

fn distinct_nonzero(copies: &[Vec<u8>]) -> u64 {
    let mut set = HashSet::new();
    for c in copies {
        for page in c.chunks(P) {
            if page.iter().any(|&b| b != 0) {
                set.insert(page.to_vec());
            }
        }
    }
    set.len() as u64
}

#[test]
fn save_load_round_trip_into_other_memory() {
    let dir = TempDir::new("roundtrip");
    let a = AnonMemory::new(3 << 20).unwrap();
    let b = AnonMemory::new(1 << 20).unwrap();
    let mut s = Snapshots::new(&[a.region(), b.region()], SnapshotOptions::default()).unwrap();
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let live = |x: &AnonMemory, y: &AnonMemory| {
        let (first, second) = if x.addr() < y.addr() { (x, y) } else { (y, x) };
        let mut v = first.snapshot();
        v.extend(second.snapshot());
        v
    };
    let mut saved: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for round in 0..4u64 {
        fill(&a, 100 + round);
        fill(&b, 200 + round % 2);
        let id = s.take().unwrap();
        let st = s.save(id, &mut disk, &format!("round {round}")).unwrap();
        assert_eq!(st.pages, (a.pages() + b.pages()) as u64);
        saved.insert(st.id, live(&a, &b));
    }
    // Saving the same snapshot again stores no new page.
    let last = s.list().last().unwrap().id;
    let again = s.save(last, &mut disk, "again").unwrap();
    assert_eq!(again.pages_new, 0);
    saved.insert(again.id, saved.values().last().unwrap().clone());
    let copies: Vec<Vec<u8>> = saved.values().cloned().collect();
    let stats = disk.stats().unwrap();
    assert_eq!(stats.snapshots, saved.len() as u64);
    assert_eq!(
        stats.unique_pages,
        distinct_nonzero(&copies),
        "each page stored once"
    );
    let zeros: u64 = copies
        .iter()
        .flat_map(|c| c.chunks(P))
        .filter(|p| p.iter().all(|&x| x == 0))
        .count() as u64;
    assert_eq!(stats.zero_pages, zeros);
    println!(
        "     store: {} snapshots, {} unique pages, {} bytes on disk for {} bytes ({:.1}x)",
        stats.snapshots,
        stats.unique_pages,
        stats.bytes_on_disk,
        stats.bytes_represented,
        stats.dedup_ratio
    );
    drop(disk);

    // A fresh memory of the same shape, elsewhere: load and restore each snapshot.
    let disk = DiskStore::open(&dir.0).unwrap();
    // Two regions of the saved sizes, in address order, inside one fresh mapping.
    let sizes: Vec<u64> = disk
        .load(1)
        .unwrap()
        .regions
        .iter()
        .map(|r| r.len)
        .collect();
    let big = AnonMemory::new((sizes[0] + sizes[1]) as usize + (1 << 20)).unwrap();
    let first = Region::new(big.addr(), sizes[0]).unwrap();
    let second = Region::new(big.addr() + sizes[0] + (1 << 20), sizes[1]).unwrap();
    let fresh_live = || {
        let mut v = vec![0u8; sizes[0] as usize];
        big.read_into(0, &mut v);
        let mut w = vec![0u8; sizes[1] as usize];
        big.read_into((sizes[0] + (1 << 20)) as usize, &mut w);
        v.extend(w);
        v
    };
    let mut s2 = Snapshots::new(&[first, second], SnapshotOptions::default()).unwrap();
    for (&id, want) in &saved {
        let local = s2.load(&disk, id).unwrap();
        s2.restore(local).unwrap();
        assert_same(&format!("load of snapshot {id}"), &fresh_live(), want);
    }
    drop(s2);
    // restore_into writes into any regions of the same shape.
    for (&id, want) in &saved {
        big.fill_page(0, 0xee);
        // SAFETY: both regions lie in `big`, owned, mapped and not borrowed.
        unsafe { disk.restore_into(id, &[first, second]).unwrap() };
        assert_same(
            &format!("restore_into of snapshot {id}"),
            &fresh_live(),
            want,
        );
    }
    // Wrong shape is refused.
    let small = AnonMemory::new(1 << 20).unwrap();
    // SAFETY: owned, mapped, not borrowed.
    let e = unsafe { disk.restore_into(1, &[small.region()]) }.unwrap_err();
    assert!(
        matches!(
            &e,
            pagewise_snap::Error::Store(pagewise_snap::StoreError::ShapeMismatch { id: 1, want, .. })
                if *want == vec![small.region().len]
        ),
        "{e}"
    );
    // Diff between stored snapshots equals the page-by-page difference.
    let ids: Vec<u64> = saved.keys().copied().collect();
    let d = disk.diff(ids[0], ids[1]).unwrap();
    let want: u64 = saved[&ids[0]]
        .chunks(P)
        .zip(saved[&ids[1]].chunks(P))
        .filter(|(x, y)| x != y)
        .count() as u64;
    assert_eq!(d.iter().map(|r| r.pages).sum::<u64>(), want);
}

#[test]
fn not_a_store_and_read_only() {
    let dir = TempDir::new("notastore");
    std::fs::create_dir_all(&dir.0).unwrap();
    std::fs::write(dir.0.join("something"), b"x").unwrap();
    let e = DiskStore::open(&dir.0).unwrap_err();
    assert!(
        matches!(&e, pagewise_snap::Error::Store(pagewise_snap::StoreError::NotAStore { dir: d, .. }) if *d == dir.0),
        "{e:?}"
    );

    let e = DiskStore::create(&dir.0, true).unwrap_err();
    assert!(
        matches!(&e, pagewise_snap::Error::Store(pagewise_snap::StoreError::NotAStore { dir: d, .. }) if *d == dir.0),
        "{e:?}"
    );
    let fresh = TempDir::new("ro");
    DiskStore::create(&fresh.0, true).unwrap();
    let mut ro = DiskStore::open(&fresh.0).unwrap();
    let r = Region::new(4096, 4096).unwrap();
    assert!(ro
        .writer(&[r], None, "")
        .unwrap_err()
        .to_string()
        .contains("read-only"));
    assert!(ro
        .load(1)
        .unwrap_err()
        .to_string()
        .contains("no snapshot 1"));
}

/// Copies every file of a store directory.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Loads every snapshot and every page; `Err` on any error.
fn read_everything(dir: &Path) -> pagewise::Result<BTreeMap<u64, Vec<u8>>> {
    let disk = DiskStore::open(dir)?;
    let mut out = BTreeMap::new();
    for s in disk.list()? {
        let mut bytes = vec![0u8; s.entries.len() * P];
        for (i, &e) in s.entries.iter().enumerate() {
            disk.read_page(e, &mut bytes[i * P..(i + 1) * P])?;
        }
        out.insert(s.id, bytes);
    }
    Ok(out)
}

#[test]
fn damaged_stores_never_give_wrong_data() {
    // A small store: 3 snapshots of 24 pages.
    let dir = TempDir::new("fuzz-src");
    let mem = AnonMemory::new(24 * P).unwrap();
    let mut s = Snapshots::new(&[mem.region()], SnapshotOptions::default()).unwrap();
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    for round in 0..3 {
        fill(&mem, 7 + round);
        let id = s.take().unwrap();
        s.save(id, &mut disk, "fuzz").unwrap();
    }
    drop(disk);
    let good = read_everything(&dir.0).unwrap();
    assert_eq!(good.len(), 3);
    let files: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };
    let mut rng = Rng::new(99);
    let (mut detected, mut harmless) = (0, 0);
    let work = TempDir::new("fuzz-work");
    for iter in 0..1500 {
        let _ = std::fs::remove_dir_all(&work.0);
        copy_dir(&dir.0, &work.0);
        let victim = &files[rng.below(files.len() as u64) as usize];
        let path = work.0.join(victim.file_name().unwrap());
        let mut bytes = std::fs::read(&path).unwrap();
        let what = match rng.below(5) {
            0 if !bytes.is_empty() => {
                let i = rng.below(bytes.len() as u64) as usize;
                bytes[i] ^= 1 << rng.below(8);
                format!("bit flip at {i}")
            }
            1 if !bytes.is_empty() => {
                let i = rng.below(bytes.len() as u64) as usize;
                bytes.truncate(i);
                format!("truncated to {i}")
            }
            2 if !bytes.is_empty() => {
                let i = rng.below(bytes.len() as u64) as usize;
                let n = (rng.below(16) as usize + 1).min(bytes.len() - i);
                for b in &mut bytes[i..i + n] {
                    *b = rng.next_u64() as u8;
                }
                format!("{n} random bytes at {i}")
            }
            3 => {
                bytes.extend((0..rng.below(64) + 1).map(|_| rng.next_u64() as u8));
                "garbage appended".to_string()
            }
            _ => {
                // Overwrite a 4- or 8-byte field with an extreme value.
                let i = rng.below(bytes.len().max(1) as u64) as usize;
                let v = [0u8, 0xff][rng.below(2) as usize];
                for b in bytes.iter_mut().skip(i).take(8) {
                    *b = v;
                }
                format!("field at {i} set to {v:#x}")
            }
        };
        std::fs::write(&path, &bytes).unwrap();
        match read_everything(&work.0) {
            Err(_) => detected += 1,
            Ok(got) => {
                // Whatever loads must be exactly what was saved.
                for (id, data) in &got {
                    assert_eq!(
                        Some(data),
                        good.get(id),
                        "iteration {iter}: {} {what}: snapshot {id} loaded with wrong data",
                        victim.display()
                    );
                }
                harmless += 1;
            }
        }
    }
    println!("     fuzz: 1500 damaged stores, {detected} refused with an error, {harmless} loaded intact");
    assert!(detected > 1000);
}

/// A store of `rounds` snapshots of 24 pages; what each holds.
fn small_store(dir: &Path, rounds: u64, seed: u64) -> BTreeMap<u64, Vec<u8>> {
    let mem = AnonMemory::new(24 * P).unwrap();
    let mut s = Snapshots::new(&[mem.region()], SnapshotOptions::default()).unwrap();
    let mut disk = DiskStore::create(dir, true).unwrap();
    for round in 0..rounds {
        fill(&mem, seed + round);
        let id = s.take().unwrap();
        s.save(id, &mut disk, "small").unwrap();
    }
    drop(disk);
    read_everything(dir).unwrap()
}

/// Saves one more snapshot of fresh contents into the store at `dir`.
fn append_one(dir: &Path, seed: u64) -> pagewise_snap::Result<u64> {
    let mem = AnonMemory::new(24 * P).unwrap();
    fill(&mem, seed);
    let mut s = Snapshots::new(&[mem.region()], SnapshotOptions::default()).unwrap();
    let mut disk = DiskStore::create(dir, true)?;
    let id = s.take()?;
    Ok(s.save(id, &mut disk, "appended")?.id)
}

/// Regression: after the last record of the pack was truncated or flipped,
/// the next writer took it for an interrupted save, cut it off and wrote
/// new records at its offset: the snapshots using it then loaded other
/// pages with no error. Now the writer refuses, and nothing changes.
#[test]
fn appending_to_a_damaged_store_is_refused() {
    for damage in ["truncate", "flip"] {
        let dir = TempDir::new("append-damaged");
        let good = small_store(&dir.0, 2, 40);
        let pack = dir.0.join("pages.pack");
        let mut bytes = std::fs::read(&pack).unwrap();
        match damage {
            "truncate" => bytes.truncate(bytes.len() - 5),
            _ => {
                let n = bytes.len();
                bytes[n - 100] ^= 0x10;
            }
        }
        std::fs::write(&pack, &bytes).unwrap();
        assert!(
            read_everything(&dir.0).is_err(),
            "{damage}: the damage went unseen"
        );
        let e = append_one(&dir.0, 99).unwrap_err().to_string();
        assert!(
            e.contains("refusing to append") || e.contains("holds"),
            "{damage}: {e}"
        );
        assert_eq!(
            std::fs::read(&pack).unwrap(),
            bytes,
            "{damage}: the pack changed"
        );
        // Whatever still loads is what was saved.
        let disk = DiskStore::open(&dir.0);
        if let Ok(disk) = disk {
            for (id, data) in &good {
                if let Ok(s) = disk.load(*id) {
                    let mut page = vec![0u8; P];
                    for (i, &e) in s.entries.iter().enumerate() {
                        if disk.read_page(e, &mut page).is_ok() {
                            assert_eq!(
                                &page[..],
                                &data[i * P..(i + 1) * P],
                                "{damage}: snapshot {id}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Regression: a pack or an index copied from another store (of the same
/// process) loaded the other store's pages with no error.
#[test]
fn files_from_another_store_are_refused() {
    let a = TempDir::new("store-a");
    let b = TempDir::new("store-b");
    small_store(&a.0, 2, 1);
    small_store(&b.0, 2, 50);
    for file in ["pages.pack", "snap-0000000002.idx", "MANIFEST"] {
        let work = TempDir::new("mixed");
        copy_dir(&a.0, &work.0);
        std::fs::copy(b.0.join(file), work.0.join(file)).unwrap();
        let e = read_everything(&work.0).expect_err(file).to_string();
        assert!(
            e.contains("another store") || e.contains("manifest"),
            "{file}: {e}"
        );
    }
}

/// Regression: a deleted index went unnoticed; a stray or renamed one was
/// listed twice, answered for the wrong id or wrapped the next id to 0.
#[test]
fn missing_extra_and_renamed_indexes_are_errors() {
    let src = TempDir::new("manifest-src");
    let good = small_store(&src.0, 2, 7);
    fn idx(id: u64) -> String {
        format!("snap-{id:010}.idx")
    }
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        (
            "deleted",
            Box::new(|d: &Path| std::fs::remove_file(d.join(idx(1))).unwrap()),
        ),
        (
            "short name",
            Box::new(|d: &Path| {
                std::fs::copy(d.join(idx(1)), d.join("snap-1.idx")).unwrap();
            }),
        ),
        (
            "signed name",
            Box::new(|d: &Path| {
                std::fs::copy(d.join(idx(1)), d.join("snap-+5.idx")).unwrap();
            }),
        ),
        (
            "copy under another id",
            Box::new(|d: &Path| {
                std::fs::copy(d.join(idx(1)), d.join(idx(7))).unwrap();
            }),
        ),
        (
            "largest id",
            Box::new(|d: &Path| {
                std::fs::copy(d.join(idx(1)), d.join("snap-18446744073709551615.idx")).unwrap();
            }),
        ),
        (
            "swapped",
            Box::new(|d: &Path| {
                std::fs::rename(d.join(idx(1)), d.join("t")).unwrap();
                std::fs::rename(d.join(idx(2)), d.join(idx(1))).unwrap();
                std::fs::rename(d.join("t"), d.join(idx(2))).unwrap();
            }),
        ),
        (
            "index renamed to the next id",
            Box::new(|d: &Path| std::fs::rename(d.join(idx(2)), d.join(idx(3))).unwrap()),
        ),
    ];
    for (what, damage) in cases {
        let work = TempDir::new("manifest");
        copy_dir(&src.0, &work.0);
        damage(&work.0);
        let r = read_everything(&work.0);
        assert!(
            r.is_err(),
            "{what}: loaded {:?} snapshots",
            r.map(|m| m.len())
        );
        // A writer neither (ids never wrap, nothing is listed twice), but
        // for swapped indexes of one size, which only reading them finds
        // (of two sizes, the writer finds them too): appending then
        // changes nothing that was saved.
        if what == "swapped" {
            if append_one(&work.0, 3).is_ok() {
                assert!(
                    read_everything(&work.0).is_err(),
                    "swapped, after an append"
                );
            }
        } else if let Ok(id) = append_one(&work.0, 3) {
            panic!(
                "{what}: appended snapshot {id} to a store whose files do not match its manifest"
            );
        }
    }
    // The index an interrupted save leaves (the next id's) is ignored by
    // readers and removed by the next writer.
    let work = TempDir::new("manifest-next");
    copy_dir(&src.0, &work.0);
    std::fs::copy(work.0.join(idx(1)), work.0.join(idx(3))).unwrap();
    assert_eq!(read_everything(&work.0).unwrap(), good);
    assert_eq!(append_one(&work.0, 9).unwrap(), 3);
    let after = read_everything(&work.0).unwrap();
    assert_eq!(after.len(), 3);
    assert_eq!(after.get(&1), good.get(&1));
}

/// Regression: a FIFO in place of a store file blocked `snapshot inspect`
/// and `diff` forever. Every store file must be a regular file.
#[test]
fn a_fifo_in_place_of_a_store_file_is_an_error() {
    let src = TempDir::new("fifo-src");
    small_store(&src.0, 1, 2);
    for file in ["pages.pack", "MANIFEST", "STORE", "snap-0000000001.idx"] {
        let work = TempDir::new("fifo");
        copy_dir(&src.0, &work.0);
        let path = work.0.join(file);
        std::fs::remove_file(&path).unwrap();
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = work.0.clone();
        std::thread::spawn(move || {
            let _ = tx.send(
                read_everything(&dir)
                    .map(|m| m.len())
                    .map_err(|e| e.to_string()),
            );
        });
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(Err(e)) => assert!(e.contains("not a regular file"), "{file}: {e}"),
            Ok(Ok(n)) => panic!("{file}: a FIFO store file loaded {n} snapshots"),
            Err(_) => panic!("{file}: reading a store with a FIFO in it blocked"),
        }
    }
}

/// Regression: garbage after the last record made a readable store
/// unappendable. It is what an interrupted save leaves: dropped.
#[test]
fn garbage_after_the_last_record_is_dropped() {
    let dir = TempDir::new("garbage");
    let good = small_store(&dir.0, 2, 21);
    let pack = dir.0.join("pages.pack");
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes.extend((0..777u32).map(|i| (i * 31) as u8));
    std::fs::write(&pack, &bytes).unwrap();
    assert_eq!(read_everything(&dir.0).unwrap(), good);
    assert_eq!(append_one(&dir.0, 77).unwrap(), 3);
    let after = read_everything(&dir.0).unwrap();
    assert_eq!(after.get(&1), good.get(&1));
    assert_eq!(after.get(&2), good.get(&2));
}

/// Regression: stores were world-readable although they hold raw memory.
#[test]
fn stores_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("perms");
    small_store(&dir.0, 1, 4);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.0), 0o700, "the store directory");
    for e in std::fs::read_dir(&dir.0).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
}

/// Random damage, then an append: a writer either refuses or appends
/// without changing what any saved snapshot loads.
#[test]
fn damaged_stores_are_never_appended_over() {
    let src = TempDir::new("fuzz-append-src");
    let good = small_store(&src.0, 3, 61);
    let files: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&src.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };
    let mut rng = Rng::new(17);
    let (mut refused, mut appended) = (0, 0);
    for iter in 0..300 {
        let work = TempDir::new("fuzz-append");
        copy_dir(&src.0, &work.0);
        let victim = &files[rng.below(files.len() as u64) as usize];
        let path = work.0.join(victim.file_name().unwrap());
        let mut bytes = std::fs::read(&path).unwrap();
        if !bytes.is_empty() && rng.below(2) == 0 {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
        } else {
            let i = rng.below(bytes.len() as u64 + 1) as usize;
            bytes.truncate(i);
        }
        std::fs::write(&path, &bytes).unwrap();
        match append_one(&work.0, 500 + iter) {
            Err(_) => refused += 1,
            Ok(_) => {
                appended += 1;
                if let Ok(got) = read_everything(&work.0) {
                    for (id, data) in &good {
                        assert_eq!(
                            got.get(id),
                            Some(data),
                            "iteration {iter}: {}: snapshot {id}",
                            victim.display()
                        );
                    }
                }
            }
        }
    }
    println!(
        "     300 damaged stores: {refused} refused an append, {appended} appended without harm"
    );
    assert!(refused > 0);
}

/// A store made by another user — the directory, or one file in one's own
/// directory — is refused for writing and for reading, before a byte of
/// memory goes into it: root's snapshot must not land where another user
/// reads it.
#[test]
fn another_users_store_is_refused() {
    use std::os::unix::fs::chown;
    if pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!("needs root to make files of another user");
        return;
    }
    let nobody = 65534;
    let dir = TempDir::new("other-user");
    drop(DiskStore::create(&dir.0, true).unwrap());
    // Their directory (as a user would make it in a shared place).
    chown(&dir.0, Some(nobody), Some(nobody)).unwrap();
    for e in std::fs::read_dir(&dir.0).unwrap() {
        chown(e.unwrap().path(), Some(nobody), Some(nobody)).unwrap();
    }
    let e = DiskStore::create(&dir.0, true).unwrap_err();
    assert!(
        matches!(
            e,
            pagewise_snap::Error::Store(pagewise_snap::StoreError::NotOwned { owner: 65534, .. })
        ),
        "{e}"
    );
    let e = DiskStore::open(&dir.0).unwrap_err();
    assert!(
        matches!(
            e,
            pagewise_snap::Error::Store(pagewise_snap::StoreError::NotOwned { owner: 65534, .. })
        ),
        "{e}"
    );
    // Our directory, their pack.
    chown(&dir.0, Some(0), Some(0)).unwrap();
    for e in std::fs::read_dir(&dir.0).unwrap() {
        let p = e.unwrap().path();
        if !p.ends_with("pages.pack") {
            chown(&p, Some(0), Some(0)).unwrap();
        }
    }
    let e = DiskStore::create(&dir.0, true).unwrap_err();
    assert!(
        matches!(
            &e,
            pagewise_snap::Error::Store(pagewise_snap::StoreError::NotOwned { path, owner: 65534, .. })
                if path.ends_with("pages.pack")
        ),
        "{e}"
    );
    // A directory others may write.
    chown(dir.0.join("pages.pack"), Some(0), Some(0)).unwrap();
    drop(DiskStore::create(&dir.0, true).unwrap());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = DiskStore::create(&dir.0, true).unwrap_err();
    assert!(
        matches!(
            &e,
            pagewise_snap::Error::Store(pagewise_snap::StoreError::WritableByOthers { path, .. })
                if *path == dir.0
        ),
        "{e}"
    );
}

/// The private writable mappings of `pid` and their bytes (shared ones,
/// inherited from this test process, are written by other tests).
pub fn private_memory(pid: i32) -> Vec<(Region, Vec<u8>)> {
    let mut out = Vec::new();
    for m in pagewise_mech::procfs::writable(Some(pid)).unwrap() {
        if m.shared {
            continue;
        }
        let r = Region::new(m.start, m.len()).unwrap();
        let mut b = vec![0u8; r.len as usize];
        // Of anonymous memory, what it holds (the kernel's walk): a hole
        // reads as zeros, and reading it would fault the zero page in,
        // which a tracker of what memory holds reports as written.
        let mut runs = vec![(r.start, r.end())];
        if m.inode == 0 {
            pagewise_mech::walk::PageWalker::new(Some(pid))
                .unwrap()
                .populated(r, &mut runs)
                .unwrap();
        }
        for (a, e) in runs {
            let at = (a - r.start) as usize;
            pagewise_mech::remote::read(pid, a, &mut b[at..at + (e - a) as usize]).unwrap();
        }
        out.push((r, b));
    }
    out
}

/// Pages of snapshot `id` whose stored bytes differ from `truth` (regions
/// `truth` lacks are not compared).
pub fn pages_differing(disk: &DiskStore, id: u64, truth: &[(Region, Vec<u8>)]) -> usize {
    let snap = disk.load(id).unwrap();
    let (mut i, mut wrong, mut page) = (0usize, 0, vec![0u8; P]);
    for reg in &snap.regions {
        let Some((_, t)) = truth.iter().find(|(a, _)| a == reg) else {
            i += reg.pages() as usize;
            continue;
        };
        for k in 0..reg.pages() as usize {
            let e = snap.entries[i];
            if e == 0 {
                page.fill(0);
            } else {
                disk.read_page(e, &mut page).unwrap();
            }
            wrong += (page[..] != t[k * P..(k + 1) * P]) as usize;
            i += 1;
        }
    }
    wrong
}

/// A sparse snapshot's index costs what its data does (index version 5:
/// a run of zero pages is one word): 64 MiB with 3 pages written is a
/// few hundred bytes (8 per page before), and reads back page for page.
/// An index that claims 2^32 pages in a few words (its region table and
/// one run rewritten, its checksums made good) is loaded or refused as
/// corrupt, never an abort of the reader.
#[test]
fn a_sparse_snapshot_is_indexed_at_the_cost_of_its_data() {
    const PAGES: u64 = 16384;
    let dir = TempDir::new("sparse-index");
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let r = Region::new(0x7000_0000_0000, PAGES * P as u64).unwrap();
    let mut buf = vec![0u8; r.len as usize];
    let written = [3usize, 9000, 16000];
    for (k, &p) in written.iter().enumerate() {
        buf[p * P + 7] = k as u8 + 1;
    }
    let saved = disk.save(&[(r, buf)], None, "sparse", None).unwrap();
    assert!(
        saved.index_bytes < 400,
        "{} bytes of index for 3 pages written in {PAGES}",
        saved.index_bytes
    );
    let snap = disk.load(saved.id).unwrap();
    assert_eq!(snap.pages(), PAGES);
    assert_eq!(snap.zero_pages(), PAGES - 3);
    let mut page = vec![0u8; P];
    for (k, &p) in written.iter().enumerate() {
        disk.read_page(snap.entries[p], &mut page).unwrap();
        assert_eq!(page[7], k as u8 + 1, "page {p}");
    }
    drop(disk);
    // The forged index: the region 2^32 pages long, the last run to match.
    let idx = dir.0.join(format!("snap-{:010}.idx", saved.id));
    let mut b = std::fs::read(&idx).unwrap();
    let body = b.len() - 8;
    let label = u32::from_le_bytes(b[40..44].try_into().unwrap()) as usize;
    let record = u32::from_le_bytes(b[44..48].try_into().unwrap()) as usize;
    let regions = 64 + label + record;
    let huge: u64 = 1 << 32;
    b[regions + 8..regions + 16].copy_from_slice(&(huge * P as u64).to_le_bytes());
    let last = u64::from_le_bytes(b[body - 8..body].try_into().unwrap());
    assert_ne!(
        last & (1 << 63),
        0,
        "the index ends with a run of zero pages"
    );
    b[body - 8..body].copy_from_slice(&(last + huge - PAGES).to_le_bytes());
    let sum = pagewise_mech::hash::checksum(&b[..body]);
    b[body..].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(&idx, &b).unwrap();
    let manifest = dir.0.join("MANIFEST");
    let mut m = std::fs::read(&manifest).unwrap();
    let end = m.len() - 8;
    m[end - 8..end].copy_from_slice(&pagewise_mech::hash::checksum(&b).to_le_bytes());
    let sum = pagewise_mech::hash::checksum(&m[..end]);
    m[end..].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(&manifest, &m).unwrap();
    let disk = DiskStore::open(&dir.0).unwrap();
    match disk.load(saved.id) {
        Ok(s) => assert_eq!(s.pages(), huge),
        Err(e) => assert!(
            e.to_string().contains("more than this machine can hold"),
            "{e}"
        ),
    }
}
