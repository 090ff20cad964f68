//! Snapshots of the caller's own memory: take, restore, read, diff, save.
//! `cargo run --release -p pagewise --example snapshots`

use pagewise::workload::AnonMemory;
use pagewise::PAGE_SIZE;

fn main() -> pagewise::Result<()> {
    let heap = AnonMemory::new(64 * PAGE_SIZE)?;
    heap.fill_page(0, 7);
    let heap_region = heap.region();
    let addr = heap_region.start;
    let dir = std::env::temp_dir().join(format!("pagewise-example-{}", std::process::id()));
    let store = dir.join("store.d");
    // ANCHOR: snapshots
    use pagewise::snap::{DiskStore, SnapshotOptions, Snapshots};
    let mut s = Snapshots::new(&[heap_region], SnapshotOptions::default())?;
    let base = s.take()?; // reads every populated page
    heap.fill_page(0, 9); // ... the program runs ...
    let step = s.take()?; // reads only the pages written since `base`
    s.restore(base)?; // writes only the pages that differ, byte-exact
    let mut buf = [0u8; 64];
    s.read(step, addr, &mut buf)?; // software MMU: bytes as they were in `step`
    let changed = s.diff(base, step)?; // page ranges that differ
    let mut disk = DiskStore::create(&store, true)?;
    s.save(step, &mut disk, "after step")?; // pages stored once across snapshots, lz4, checksummed
                                            // ANCHOR_END: snapshots
    assert_eq!(heap.read_byte(0), 7, "restored to base");
    assert_eq!(buf[0], 9, "step as it was");
    assert_eq!(changed.len(), 1);
    println!(
        "restored, read and diffed: {} range changed; saved to {}",
        changed.len(),
        store.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
