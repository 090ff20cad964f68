//! Lazy restore of own memory from a store: pages come back on first touch.
//! `cargo run --release -p pagewise --example lazy_restore`

use pagewise::snap::{DiskStore, SnapshotOptions, Snapshots};
use pagewise::workload::AnonMemory;
use pagewise::PAGE_SIZE;

fn main() -> pagewise::Result<()> {
    let mem = AnonMemory::new(1024 * PAGE_SIZE)?;
    for p in 0..1024 {
        mem.fill_page(p, (p % 251) as u8 + 1);
    }
    let region = mem.region();
    let dir = std::env::temp_dir().join(format!("pagewise-lazy-example-{}", std::process::id()));
    let mut disk = DiskStore::create(dir.join("s.d"), true)?;
    let mut s = Snapshots::new(&[region], SnapshotOptions::default())?;
    let taken = s.take()?;
    let id = s.save(taken, &mut disk, "before")?.id;
    drop(s);
    mem.write_pass(PAGE_SIZE, 0); // the memory is lost
                                  // ANCHOR: lazy
    use pagewise::snap::{LazyOptions, LazyRestore};
    let lazy = LazyRestore::start(
        DiskStore::open(dir.join("s.d"))?,
        id,
        &[region],
        LazyOptions::default(),
    )?;
    assert_eq!(mem.read_byte(5 * PAGE_SIZE), 6); // the program runs: first touches are served from the store
    let st = lazy.finish()?; // every page in; stops serving
    println!(
        "{} faults, first touch served in {} ns (median)",
        st.faults, st.service_p50_ns
    );
    // ANCHOR_END: lazy
    assert!((0..1024).all(|p| mem.read_byte(p * PAGE_SIZE) == (p % 251) as u8 + 1));
    println!("all 1024 pages as saved");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
