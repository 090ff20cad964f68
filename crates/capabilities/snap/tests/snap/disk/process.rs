//! Snapshots of another process into a durable store: incremental ones
//! exact against the process's memory, and live checkpoints holding the
//! memory at the stop, or saying they could not converge.

use super::*;

/// Incremental snapshots of a running process (uffd-wp from outside) hold,
/// page for page, what the process held at each snapshot, while reading
/// only the pages written since the previous one; between snapshots the
/// process writes, drops pages (MADV_DONTNEED), forks a writing child and
/// maps new memory.
#[test]
fn incremental_snapshots_of_a_process_are_exact() {
    let _one = crate::common::one_target_at_a_time();
    use pagewise_snap::remote::Incremental;
    if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = TempDir::new("incremental");
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let mut s = crate::common::Scripted::start(512);
    let mut inc = Incremental::new(s.pid).unwrap();
    let check = |disk: &DiskStore, id: u64, pid: i32| {
        let snap = disk.load(id).unwrap();
        let mut stored = vec![0u8; P];
        let mut live = vec![0u8; P];
        let mut wrong = 0;
        // Not compared: shared mappings the child inherited from this test
        // process, which other tests write.
        let shared: Vec<(u64, u64)> = pagewise_mech::procfs::maps(Some(pid))
            .unwrap()
            .iter()
            .filter(|m| m.shared)
            .map(|m| (m.start, m.end))
            .collect();
        // What memory holds of the anonymous mappings (the kernel's
        // word): a page it does not hold reads as zeros, and is not read
        // (a read would fault the zero page in, which a tracker of what
        // memory holds reports as written next time).
        let mut walker = pagewise_mech::walk::PageWalker::new(Some(pid)).unwrap();
        let mut held = Vec::new();
        for m in pagewise_mech::procfs::writable(Some(pid)).unwrap() {
            let r = Region::new(m.start, m.len()).unwrap();
            if m.inode == 0 {
                let mut runs = Vec::new();
                walker.populated(r, &mut runs).unwrap();
                held.extend(runs);
            } else {
                held.push((r.start, r.end()));
            }
        }
        for i in 0..snap.pages() {
            let addr = snap.address_of(i).unwrap();
            if shared.iter().any(|&(a, b)| addr >= a && addr < b) {
                continue;
            }
            let e = snap.entries[i as usize];
            if e == 0 {
                stored.fill(0);
            } else {
                disk.read_page(e, &mut stored).unwrap();
            }
            // A page unmapped meanwhile reads as zeros, as it was stored.
            let n = if held.iter().any(|&(a, b)| a <= addr && addr < b) {
                pagewise_mech::remote::read(pid, addr, &mut live).unwrap()
            } else {
                live.fill(0);
                P
            };
            if n == P && stored != live {
                wrong += 1;
            }
        }
        wrong
    };
    let steps: [(&str, u8, u64); 5] = [
        ("first", b'w', 1 | (7 << 16)),
        ("writes", b'w', 300 | (9 << 16)),
        ("MADV_DONTNEED of 40 pages", b'd', 100 | (40 << 16)),
        ("fork, the child writes", b'f', 20),
        ("new mapping", b'm', 16),
    ];
    let mut read = Vec::new();
    let state = |pid: i32| {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        st[st.rfind(')').unwrap() + 2..].chars().next().unwrap()
    };
    for (what, op, arg) in steps {
        s.tell(op, arg);
        // Held stopped (job control) from before the snapshot until the
        // comparison: the memory compared is the memory snapshotted.
        // SAFETY: our own child.
        unsafe { libc::kill(s.pid, libc::SIGSTOP) };
        let t0 = std::time::Instant::now();
        while state(s.pid) != 'T' {
            assert!(
                t0.elapsed().as_secs() < 5,
                "{what}: the child never stopped"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let r = inc.snapshot(&mut disk, what).unwrap();
        let wrong = check(&disk, r.save.id, s.pid);
        // SAFETY: our own child.
        unsafe { libc::kill(s.pid, libc::SIGCONT) };
        assert_eq!(wrong, 0, "{what}: stored pages differ from the process");
        read.push(r.pages_read);
        println!("     {what}: {} pages, {} read", r.save.pages, r.pages_read);
    }
    let first = read[0];
    assert!(
        read[1..].iter().all(|&n| n < first / 4),
        "later snapshots read nearly everything again: {read:?}"
    );
}

/// A live checkpoint of a process whose two threads write random pages all
/// the while holds exactly its memory at the moment it was stopped (read
/// from the process then), page for page; the passes before the stop copy
/// less and less, and the process runs on afterwards.
#[test]
fn live_checkpoint_holds_the_memory_at_the_stop() {
    let _one = crate::common::one_target_at_a_time();
    use pagewise_snap::live::{live_snapshot, LiveOptions, StoreSeries};
    if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = TempDir::new("live");
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let w = crate::common::Writer::start(4096);
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut at_stop: Vec<(Region, Vec<u8>)> = Vec::new();
    let pid = w.pid;
    let opts = LiveOptions::default()
        .max_downtime_ms(20.0)
        .max_passes(10)
        .throttle(false);
    let r = live_snapshot(
        pid,
        &mut StoreSeries::new(&mut disk),
        "live",
        &opts,
        &mut |_| {},
        &mut || {
            at_stop = private_memory(pid);
        },
    )
    .unwrap();
    let wrong = pages_differing(&disk, r.save.id, &at_stop);
    println!(
        "     live: {} passes {:?}, {} pages at the stop, downtime {:.2} ms, converged {}",
        r.passes.len(),
        r.passes.iter().map(|p| p.pages).collect::<Vec<_>>(),
        r.final_pages,
        r.downtime_ms,
        r.converged
    );
    assert_eq!(
        wrong, 0,
        "{wrong} stored pages differ from the memory at the stop"
    );
    assert!(r.passes.len() >= 2 && r.passes[0].pages > r.final_pages);
    let a = w.read_all();
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert_ne!(a, w.read_all(), "the process does not run on");
}

/// A process that writes faster than a tiny budget allows: the passes stop
/// at `max_passes` and say they did not converge; with `throttle` the
/// process is held stopped for a growing share of the passes. Either way the
/// snapshot holds the memory at the stop exactly.
#[test]
fn live_checkpoint_that_cannot_converge() {
    let _one = crate::common::one_target_at_a_time();
    use pagewise_snap::live::{live_snapshot, LiveOptions, StoreSeries};
    if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    for throttle in [false, true] {
        let dir = TempDir::new("live-throttle");
        let mut disk = DiskStore::create(&dir.0, true).unwrap();
        let w = crate::common::Writer::start(2048);
        w.wait_for_writes(4);
        let pid = w.pid;
        let mut truth: Vec<(Region, Vec<u8>)> = Vec::new();
        let opts = LiveOptions::default()
            .max_downtime_ms(0.001)
            .max_passes(4)
            .throttle(throttle);
        // After each pass the writer writes again before the next one, so
        // no pass can find nothing written: the checkpoint cannot converge.
        let r = live_snapshot(
            pid,
            &mut StoreSeries::new(&mut disk),
            "",
            &opts,
            &mut |_| w.wait_for_writes(1),
            &mut || {
                truth = private_memory(pid);
            },
        )
        .unwrap();
        assert!(!r.converged, "converged although written after every pass");
        assert_eq!(r.passes.len(), 4);
        assert!(
            r.dirty_rate_bps > 0.0,
            "did not converge, yet nothing was written"
        );
        assert!(r.copy_rate_bps > 0.0);
        if throttle && !r.converged {
            assert!(
                r.passes.iter().any(|p| p.throttle > 0.0),
                "the process was never held: {:?}",
                r.passes
            );
        }
        let wrong = pages_differing(&disk, r.save.id, &truth);
        assert_eq!(
            wrong, 0,
            "throttle {throttle}: {wrong} pages differ from the memory at the stop"
        );
        println!(
            "     throttle {throttle}: passes {:?}, held {:?}, downtime {:.2} ms",
            r.passes.iter().map(|p| p.pages).collect::<Vec<_>>(),
            r.passes.iter().map(|p| p.throttle).collect::<Vec<_>>(),
            r.downtime_ms
        );
    }
}
