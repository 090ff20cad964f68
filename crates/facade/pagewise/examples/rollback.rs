//! Rollback of another running process, in place.
//! `cargo run --release -p pagewise --example rollback` (it may ptrace its child)

fn main() -> pagewise::Result<()> {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        // Not this program's output: a restore puts the offsets of the
        // target's files back, and an open file shared with this program
        // would have its offset put back under it.
        .stdout(std::process::Stdio::null())
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
        drop(h);
        // ANCHOR: session
        use pagewise::snap::ResetSession;
        let mut s = ResetSession::open(pid)?; // held from now on; its point taken
        for _ in 0..3 {
            /* ... the process runs an input ... */
            let r = s.reset()?; // back at the point: only the pages written since
            assert_eq!(r.full, None, "the quick path: nothing but memory changed");
            println!(
                "reset: {} pages in {} µs",
                r.pages_written,
                r.elapsed_ns / 1000
            );
        }
        // ANCHOR_END: session
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
