//! The durable store against ground truth: what is loaded back equals what
//! was saved, byte for byte; damaged stores give errors, never wrong data;
//! a save killed at any moment leaves every earlier snapshot loadable.

use super::assert_same;
use pagewise::snap::{DiskStore, SnapshotOptions, Snapshots};
use pagewise::workload::{AnonMemory, Rng};
use pagewise::{Region, PAGE_SIZE};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

const P: usize = PAGE_SIZE;

/// A fresh directory under the temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
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
    assert!(e.to_string().contains("sizes"), "{e}");
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
        e.to_string().contains("not a pagewise snapshot store"),
        "{e}"
    );
    let e = DiskStore::create(&dir.0, true).unwrap_err();
    assert!(
        e.to_string().contains("not a pagewise snapshot store"),
        "{e}"
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

/// Child half of the crash test: saves snapshots into the store named by
/// `PAGEWISE_CRASH_DIR` until killed. Does nothing in a normal test run.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var("PAGEWISE_CRASH_DIR") else {
        return;
    };
    let mem = AnonMemory::new(8 << 20).unwrap();
    let mut s = Snapshots::new(&[mem.region()], SnapshotOptions::default()).unwrap();
    let mut disk = DiskStore::create(&dir, true).unwrap();
    for round in 0.. {
        // Every page new each round, so each save appends 2048 records.
        crash_pattern(&mem, round);
        let id = s.take().unwrap();
        s.save(id, &mut disk, &round.to_string()).unwrap();
        s.drop_snapshot(id).unwrap();
    }
}

fn crash_pattern(mem: &AnonMemory, round: u64) {
    for p in 0..mem.pages() {
        mem.fill_page(p, (round % 200) as u8 + 1);
        mem.write_byte(p * P, (p % 256) as u8);
        mem.write_byte(p * P + 1, (p / 256) as u8);
        mem.write_byte(p * P + 2, (round % 256) as u8);
    }
}

#[test]
fn killed_saves_leave_earlier_snapshots_loadable() {
    let dir = TempDir::new("crash");
    let exe = std::env::current_exe().unwrap();
    let expected = AnonMemory::new(8 << 20).unwrap();
    let mut rng = Rng::new(5);
    let mut total = 0;
    for attempt in 0..4 {
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "disk::crash_child_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PAGEWISE_CRASH_DIR", &dir.0)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(150 + rng.below(400)));
        child.kill().unwrap();
        child.wait().unwrap();
        // Whatever is there must load, and each snapshot must hold its round's pattern.
        let got = read_everything(&dir.0)
            .unwrap_or_else(|e| panic!("attempt {attempt}: store unreadable after a kill: {e}"));
        let disk = DiskStore::open(&dir.0).unwrap();
        for (id, data) in &got {
            let label: u64 = disk.load(*id).unwrap().label.parse().unwrap();
            crash_pattern(&expected, label);
            assert_same(
                &format!("snapshot {id} (round {label})"),
                data,
                &expected.snapshot(),
            );
        }
        total = got.len();
        // A writer opening it afterwards recovers and can save.
        let mut w = DiskStore::create(&dir.0, true).unwrap();
        let mut s = Snapshots::new(&[expected.region()], SnapshotOptions::default()).unwrap();
        crash_pattern(&expected, 999);
        let id = s.take().unwrap();
        s.save(id, &mut w, "999").unwrap();
    }
    println!("     crash: 4 kills, {total} snapshots intact");
    assert!(total > 4, "the child saved something before each kill");
}
