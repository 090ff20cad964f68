//! Dirty tracking of the caller's own memory, with two consumers.
//! `cargo run --release -p pagewise --example track`

use pagewise::workload::AnonMemory;
use pagewise::PAGE_SIZE;

fn main() -> pagewise::Result<()> {
    // Any page-aligned, mapped, writable region works; `AnonMemory` maps one.
    let mem = AnonMemory::new(256 * PAGE_SIZE)?;
    let region = mem.region(); // or pagewise::Region::new(addr, len)?
                               // ANCHOR: track
    use pagewise::track::{BackendKind, DirtyTracker};
    let mut t = DirtyTracker::new(&[region], BackendKind::Auto)?;
    let checkpointer = t.add_consumer(); // a second, independent consumer
    mem.write_byte(3 * PAGE_SIZE, 1); // ... the program writes ...
    mem.write_byte(100 * PAGE_SIZE, 1);
    let c = t.collect()?; // default consumer: dirty since its last collect
    for r in &c.ranges {
        println!("written: {:#x}..{:#x}", r.start, r.end());
    }
    let c2 = t.collect_for(checkpointer)?; // still sees every write since *its* last collect
                                           // ANCHOR_END: track
    assert_eq!(c.stats.pages_dirty, 2, "{:?}", c.ranges);
    assert_eq!(c2.stats.pages_dirty, 2);
    println!(
        "{} backend: {} pages written, seen by both consumers",
        t.backend(),
        c.stats.pages_dirty
    );
    Ok(())
}
