//! Writers of a durable store that die or race: a save killed at any
//! point leaves the earlier snapshots loadable, one writer at a time,
//! concurrent appends keep every snapshot, two creators leave one store.

use super::*;
use pagewise_snap::StoreError;

/// Child half of `killed_saves_leave_earlier_snapshots_loadable`, which
/// runs it (with `--ignored`) in a process of its own: saves snapshots into
/// the store named by `PAGEWISE_CRASH_DIR` until killed.
#[test]
#[ignore = "the child half of killed_saves_leave_earlier_snapshots_loadable, which runs it"]
fn crash_child_writer() {
    let dir = std::env::var("PAGEWISE_CRASH_DIR")
        .expect("run by killed_saves_leave_earlier_snapshots_loadable, which names the store");
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
                "--ignored",
                &crate::common::test_path(module_path!(), "crash_child_writer"),
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

/// Regression: two writers took the same next id. Now the second is refused
/// while the first holds the store.
#[test]
fn one_writer_at_a_time() {
    let dir = TempDir::new("two-writers");
    small_store(&dir.0, 1, 3);
    let first = DiskStore::create(&dir.0, true).unwrap();
    let e = DiskStore::create(&dir.0, true).unwrap_err();
    assert!(
        matches!(e, pagewise_snap::Error::Store(StoreError::Locked { .. })),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("being written by another process"), "{e}");
    // Readers are not held up.
    assert_eq!(DiskStore::open(&dir.0).unwrap().ids().unwrap(), vec![1]);
    drop(first);
    assert_eq!(append_one(&dir.0, 5).unwrap(), 2);
}

/// Writers in several threads, each saving when it gets the store: every
/// snapshot saved loads with exactly its pages, ids never repeat.
#[test]
fn concurrent_appends_keep_every_snapshot() {
    let dir = TempDir::new("concurrent");
    small_store(&dir.0, 1, 11);
    let saved = std::sync::Mutex::new(BTreeMap::new());
    let refused = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let (dir, saved, refused) = (&dir.0, &saved, &refused);
            sc.spawn(move || {
                for k in 0..6u64 {
                    let seed = 1000 + t * 100 + k;
                    match append_one(dir, seed) {
                        Ok(id) => {
                            let mem = AnonMemory::new(24 * P).unwrap();
                            fill(&mem, seed);
                            let bytes = (0..24 * P).map(|i| mem.read_byte(i)).collect::<Vec<u8>>();
                            assert!(
                                saved.lock().unwrap().insert(id, bytes).is_none(),
                                "id {id} twice"
                            );
                        }
                        Err(e) => {
                            assert!(
                                matches!(e, pagewise_snap::Error::Store(StoreError::Locked { .. })),
                                "{e:?}"
                            );
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let got = read_everything(&dir.0).unwrap();
    let saved = saved.into_inner().unwrap();
    for (id, bytes) in &saved {
        assert!(
            got.get(id) == Some(bytes),
            "snapshot {id} does not hold what was saved"
        );
    }
    assert_eq!(got.len(), saved.len() + 1);
    println!(
        "     {} saves by 4 writers, {} refused while another held the store",
        saved.len(),
        refused.into_inner()
    );
}

/// Two writers creating one new store at once: one complete store results;
/// each writer either has it open or is told another writes it; nobody
/// finds it corrupt, then or later.
#[test]
fn two_creators_of_one_store_leave_one_complete_store() {
    for round in 0..20 {
        let dir = TempDir::new(&format!("two-creators-{round}"));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (d, b) = (dir.0.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    DiskStore::create(&d, true).map(drop)
                })
            })
            .collect();
        let mut opened = 0;
        for t in threads {
            match t.join().unwrap() {
                Ok(()) => opened += 1,
                Err(pagewise_snap::Error::Store(StoreError::Locked { .. })) => {}
                Err(e) => panic!("round {round}: a creator failed: {e}"),
            }
        }
        assert!(opened >= 1, "round {round}: nobody had the store");
        let s = DiskStore::create(&dir.0, true).unwrap();
        assert!(s.ids().unwrap().is_empty());
        // This store's half-made copies only: other tests create stores
        // beside it meanwhile.
        let mine = format!(
            ".{}.creating-",
            dir.0.file_name().unwrap().to_string_lossy()
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.0.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
            .collect();
        assert!(leftovers.is_empty(), "half-made stores left: {leftovers:?}");
    }
}

/// A save given up halfway (its writer dropped unfinished, as a server
/// does when its peer breaks off) leaves the store as it was: the next
/// save neither refers to the pages the given-up one wrote nor keeps them,
/// so the store's pack is that of a store that never heard of it.
#[test]
fn a_save_given_up_is_not_kept() {
    let pages = |fill: u8| -> Vec<Vec<u8>> {
        (0..8u64)
            .map(|i| {
                let mut p = vec![fill; P];
                p[..8].copy_from_slice(&i.to_le_bytes());
                p
            })
            .collect()
    };
    let r = Region::new(0x10000, 8 * P as u64).unwrap();
    let save = |store: &mut DiskStore, fill: u8| {
        let mut w = store.writer(&[r], None, "kept").unwrap();
        for p in pages(fill) {
            w.push(&p).unwrap();
        }
        w.finish().unwrap()
    };
    let given_up = TempDir::new("given-up");
    let mut store = DiskStore::create(&given_up.0, true).unwrap();
    {
        let mut w = store.writer(&[r], None, "given up").unwrap();
        for p in pages(7).iter().take(5) {
            w.push(p).unwrap();
        }
    }
    // The same pages as the given-up save, and others: all stored anew.
    let kept = save(&mut store, 7);
    assert_eq!(
        kept.pages_new, 8,
        "no page of the given-up save is referred to"
    );
    let clean = TempDir::new("never-given-up");
    let mut other = DiskStore::create(&clean.0, true).unwrap();
    save(&mut other, 7);
    assert_eq!(
        store.stats().unwrap().pack_bytes,
        other.stats().unwrap().pack_bytes,
        "the given-up save's records are not kept"
    );
    drop(store);
    let store = DiskStore::open(&given_up.0).unwrap();
    assert_eq!(store.ids().unwrap(), [kept.id]);
    let snap = store.load(kept.id).unwrap();
    let mut buf = vec![0u8; P];
    for (i, want) in pages(7).iter().enumerate() {
        store.read_page(snap.entries[i], &mut buf).unwrap();
        assert!(buf == *want, "page {i} of the kept save");
    }
}
