//! Rollback of another running process, in place.
//! `cargo run --release -p pagewise --example rollback` (it may ptrace its child)

fn main() -> pagewise::Result<()> {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .map_err(|e| pagewise::Error::os("starting sleep", e))?;
    let pid = child.id() as i32;
    std::thread::sleep(std::time::Duration::from_millis(100));
    let dir =
        std::env::temp_dir().join(format!("pagewise-rollback-example-{}", std::process::id()));
    let store = dir.join("s.d");
    let result = (|| -> pagewise::Result<()> {
        // ANCHOR: rollback
        use pagewise::snap::{DiskStore, ProcessSnapshots, RestoreOptions};
        let mut h = ProcessSnapshots::open(pid)?; // uffd-wp from outside starts now
        let base = h.take()?; // memory, layout, threads
                              /* ... the process runs an input ... */
        let r = h.restore(base, RestoreOptions::default())?; // only the pages written since
        println!(
            "{} pages, {} µs walking",
            r.stats.pages_written, r.phases.walk_us
        );
        h.save(base, &mut DiskStore::create(&store, true)?, "base")?;
        // ANCHOR_END: rollback
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
