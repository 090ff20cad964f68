//! Rollback of another process in place (`pagewise_snap::ProcessSnapshots`)
//! against ground truth: after every restore the target's memory, read
//! through `/proc/PID/mem`, equals the snapshot page for page; the target
//! (`tests/c/rollback.c`) checks its own callee-saved and vector registers
//! and a thread-local across every read it makes, and answers the same
//! input with the same output as in the run the snapshot was taken in;
//! layout changes of every kind are put back; workers writing while the
//! snapshot is taken and restored keep consistent hash chains.

use pagewise_testkit::targets as common;

use common::can_ptrace;
use pagewise_snap::{ProcessSnapshots, RestoreOptions, SnapId};
use pagewise_testkit::Piped;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C target, built once; `None` (skip printed) without a C compiler or
/// where ptrace is not allowed.
fn target() -> Option<PathBuf> {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/rollback.c");
    match pagewise_testkit::c_program(&src, Path::new(env!("CARGO_TARGET_TMPDIR")), &["-pthread"]) {
        Ok(p) => Some(p),
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            None
        }
    }
}

/// A running target (`tests/c/rollback.c`), killed when dropped.
struct Target {
    /// The main thread's rseq area, which the kernel writes whenever the
    /// thread runs (the CPU it runs on): not compared.
    rseq: Option<u64>,
    p: Piped,
}

impl std::ops::Deref for Target {
    type Target = Piped;
    fn deref(&self) -> &Piped {
        &self.p
    }
}

impl std::ops::DerefMut for Target {
    fn deref_mut(&mut self) -> &mut Piped {
        &mut self.p
    }
}

impl Target {
    /// Its standard error is `/dev/null`, not the test's: a shared file
    /// whose offset other tests move would be a descriptor put back.
    fn start(path: &Path, args: &[&str]) -> Target {
        let mut p = Piped::start(
            Command::new(path)
                .args(args)
                .stderr(std::process::Stdio::null()),
        );
        let l = p.line();
        assert!(l.starts_with("ready"), "the target said {l:?}");
        let rseq = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("rseq=0x"))
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        Target { rseq, p }
    }

    fn settle(&self) {
        self.p.settle_in_read();
    }
}

/// Every page of snapshot `id`, compared with the target's memory read
/// through `/proc/PID/mem`: the number of pages compared.
fn assert_memory_is(h: &ProcessSnapshots, id: SnapId, t: &Target) -> u64 {
    assert_memory_is_but(h, id, t, &[])
}

/// [`assert_memory_is`] but for the mappings a memory-only restore left to
/// the threads running on them (`skip`, from its report: at most a stack
/// and a thread-control block's mapping per thread).
fn assert_memory_is_but(h: &ProcessSnapshots, id: SnapId, t: &Target, skip: &[[u64; 2]]) -> u64 {
    let pid = t.pid();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut want = vec![0u8; 1 << 20];
    let mut have = vec![0u8; 1 << 20];
    let mut pages = 0;
    for r in h.regions(id).unwrap() {
        if skip.iter().any(|&[a, b]| a < r.end() && b > r.start) {
            continue;
        }
        let mut at = r.start;
        while at < r.end() {
            let n = ((r.end() - at) as usize).min(want.len());
            h.read(id, at, &mut want[..n]).unwrap();
            mem.read_exact_at(&mut have[..n], at)
                .unwrap_or_else(|e| panic!("reading {at:#x}+{n:#x} of the target: {e}"));
            if let Some(rs) = t.rseq.filter(|&a| a >= at && a + 32 <= at + n as u64) {
                let o = (rs - at) as usize;
                have[o..o + 32].copy_from_slice(&want[o..o + 32]);
            }
            if want[..n] != have[..n] {
                let p = (0..n)
                    .step_by(4096)
                    .find(|&p| want[p..p + 4096] != have[p..p + 4096])
                    .unwrap();
                let diffs: Vec<usize> = (p..p + 4096).filter(|&i| want[i] != have[i]).collect();
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
                panic!(
                    "page {:#x} differs from snapshot {id} at {} bytes from +{:#x} (want {:02x?}, have {:02x?}); region {r:?}\n{maps}",
                    at + p as u64,
                    diffs.len(),
                    diffs[0] - p,
                    &want[diffs[0]..(diffs[0] + 16).min(p + 4096)],
                    &have[diffs[0]..(diffs[0] + 16).min(p + 4096)],
                );
            }
            pages += (n / 4096) as u64;
            at += n as u64;
        }
    }
    pages
}

/// The target's layout (without the kernel's special mappings), as text.
fn layout(pid: i32) -> Vec<String> {
    pagewise_snap::layout::read(Some(pid))
        .unwrap()
        .iter()
        .map(|v| {
            format!(
                "{:x}-{:x} {} {} {:?}",
                v.start, v.end, v.prot, v.shared, v.backing
            )
        })
        .collect()
}

/// Snapshots taken and restored in random orders: after each restore
/// memory equals the snapshot page for page, the registers the target
/// checks are right, and the target answers the same command as it did
/// right after the snapshot was taken.
#[test]
fn rollbacks_in_random_order_match_the_snapshot_and_the_first_run() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    let pid = t.pid();
    let mut h = ProcessSnapshots::open(pid).unwrap();
    assert_eq!(h.note(), None, "calls can be made inside the target here");
    t.settle();
    let first = h.take().unwrap();
    if let Some(rseq) = t.rseq {
        // The rseq area the target reports is the one the kernel knows.
        assert_eq!(h.threads(first).unwrap()[0].rseq.map(|r| r.0), Some(rseq));
    }
    // Per snapshot: the command sent right after it, and its answer.
    let mut snaps: Vec<(SnapId, String, String)> = Vec::new();
    let mut rng = pagewise_mech::workload::Rng::new(0x5eed);
    for round in 0..24u64 {
        t.settle();
        if snaps.is_empty() || rng.below(3) == 0 {
            let id = h.take().unwrap();
            let cmd = format!("w {} {}", 1 + rng.below(64), round);
            let answer = t.ask(&cmd);
            assert!(answer.contains("bad=0"), "{answer}");
            snaps.push((id, cmd, answer));
        } else {
            let (id, cmd, answer) = snaps[rng.below(snaps.len() as u64) as usize].clone();
            let report = h.restore(id, RestoreOptions::default()).unwrap();
            assert_eq!(report.threads, 1);
            let pages = assert_memory_is(&h, id, &t);
            assert!(pages > 4096, "compared {pages} pages");
            assert_eq!(
                t.ask(&cmd),
                answer,
                "replay of {cmd:?} after restoring {id}"
            );
        }
        // Writes between snapshots.
        let cmd = format!("w {} {}", rng.below(300), 1000 + round);
        t.ask(&cmd);
    }
    println!("ok   {} snapshots, 24 rounds", snaps.len());
}

/// Every kind of layout change is put back (munmap, mmap, mremap grow,
/// shrink and move, mprotect, brk) and memory equals the snapshot.
#[test]
fn layout_changes_of_every_kind_are_put_back() {
    let Some(path) = target() else { return };
    for change in ["m", "u", "g", "s", "v", "p", "b", "b", "g"] {
        let mut t = Target::start(&path, &[]);
        let pid = t.pid();
        t.ask("w 16 1");
        let mut h = ProcessSnapshots::open(pid).unwrap();
        t.settle();
        let id = h.take().unwrap();
        let before = layout(pid);
        let first = t.ask("c");
        h.restore(id, RestoreOptions::default()).unwrap();
        t.settle();
        assert_memory_is(&h, id, &t);
        t.ask(change);
        t.ask("w 7 2");
        t.settle();
        assert_ne!(layout(pid), before, "{change:?} changed the layout");
        let report = h.restore(id, RestoreOptions::default()).unwrap();
        // The break is put back by brk() alone, not counted.
        assert!(
            report.layout_calls > 0 || change == "b",
            "{change:?}: {report:?}"
        );
        assert_eq!(layout(pid), before, "the layout after {change:?}");
        assert_memory_is(&h, id, &t);
        assert_eq!(t.ask("c"), first, "the answer after undoing {change:?}");
        println!("ok   {change}: {} layout calls", report.layout_calls);
    }
}

/// Workers writing all the time while snapshots are taken and restored:
/// every restore puts memory and every thread's registers back at one
/// instant, so their hash chains stay whole, and the main thread's
/// registers check out.
#[test]
fn threads_writing_while_taken_and_restored_stay_consistent() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &["threads", "3"]);
    let pid = t.pid();
    let mut h = ProcessSnapshots::open(pid).unwrap();
    let mut ids = Vec::new();
    for round in 0..12 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if round % 3 == 0 {
            ids.push(h.take().unwrap());
            assert_eq!(h.threads(*ids.last().unwrap()).unwrap().len(), 4);
        } else {
            let id = ids[round % ids.len()];
            let r = h.restore(id, RestoreOptions::default()).unwrap();
            assert_eq!(r.threads, 4);
        }
        let a = t.ask("c");
        assert!(
            a.contains("bad=0") && a.contains("chains=ok"),
            "round {round}: {a}"
        );
    }
}

/// A process that ended is one clear error, and a snapshot id that does
/// not exist another.
#[test]
fn a_target_gone_or_an_unknown_snapshot_is_a_clear_error() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    let id = h.take().unwrap();
    let e = h.restore(id + 7, RestoreOptions::default()).unwrap_err();
    assert!(
        matches!(e, pagewise_snap::Error::NoSnapshot { id: i } if i == id + 7),
        "{e}"
    );
    t.child.kill().unwrap();
    t.child.wait().unwrap();
    let e = h.restore(id, RestoreOptions::default()).unwrap_err();
    assert_eq!(e.class(), pagewise::ErrorClass::Gone, "{e}");
}

/// A memory-only restore of snapshot `id` that is refused, and changed
/// nothing: the target answers with its registers and memory as they go.
fn memory_only_refused(
    h: &mut ProcessSnapshots,
    id: SnapId,
    t: &mut Target,
) -> pagewise_snap::Error {
    let e = h
        .restore(id, RestoreOptions::default().memory_only(true))
        .unwrap_err();
    assert!(
        t.ask("c").contains("bad=0"),
        "refused before anything changed: {e}"
    );
    e
}

/// A thread made since the snapshot, or one ended since, is refused with
/// the thread named; memory-only puts memory and layout back all the same
/// where the threads' own memory points at nothing it changes (a thread
/// made and ended before the snapshot: the C library's per-thread malloc
/// state was made then), and is refused where the main thread's first
/// `malloc` (for its first thread) came after the snapshot: its
/// thread-local cache would point into the heap put back as before it.
#[test]
fn a_changed_thread_set_is_refused_unless_memory_only() {
    use pagewise_snap::RollbackRefusal;
    let Some(path) = target() else { return };
    // Made since, the main thread's malloc state made since too.
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    t.settle();
    let id = h.take().unwrap();
    t.ask("t");
    t.ask("w 40 2");
    t.settle();
    let e = memory_only_refused(&mut h, id, &mut t);
    assert!(
        matches!(&e, pagewise_snap::Error::Rollback(RollbackRefusal::ThreadMemoryDiverged { tid, .. }) if *tid == t.pid()),
        "the main thread's malloc state points into the heap: {e:?}"
    );
    // Made since, the thread made and ended once before the snapshot.
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    t.ask("t");
    t.ask("x");
    t.ask("w 8 1");
    t.settle();
    let id = h.take().unwrap();
    let first = t.ask("c");
    t.ask("t");
    t.ask("w 40 2");
    t.settle();
    match h.restore(id, RestoreOptions::default()) {
        Err(pagewise_snap::Error::Rollback(RollbackRefusal::ThreadsChanged {
            made,
            ended,
            ..
        })) => {
            assert_eq!(
                (made.len(), ended.len()),
                (1, 0),
                "made {made:?} ended {ended:?}"
            );
        }
        other => panic!("a thread made since: {other:?}"),
    }
    // Refused before anything changed: the target answers as it would.
    assert!(t.ask("c").contains("line="));
    t.settle();
    // The new thread's own memory points at the C library's thread lists,
    // which the restore would put back as they were without it.
    let e = memory_only_refused(&mut h, id, &mut t);
    assert!(
        matches!(
            &e,
            pagewise_snap::Error::Rollback(RollbackRefusal::ThreadMemoryDiverged { .. })
        ),
        "a thread made since keeps memory pointing at what the restore changes: {e:?}"
    );
    // Ended since.
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    t.ask("t");
    t.settle();
    let id = h.take().unwrap();
    t.ask("x");
    t.settle();
    let e = h.restore(id, RestoreOptions::default()).unwrap_err();
    assert!(
        matches!(&e, pagewise_snap::Error::Rollback(RollbackRefusal::ThreadsChanged { made, ended, .. }) if made.is_empty() && ended.len() == 1),
        "{e:?}"
    );
    assert!(e.to_string().contains("--memory-only"), "{e}");
    let r = h
        .restore(id, RestoreOptions::default().memory_only(true))
        .unwrap();
    assert_eq!(r.threads, 0);
    assert!((1..=4).contains(&r.thread_areas.len()), "{r:?}");
    assert_memory_is_but(&h, id, &t, &r.thread_areas);
    // Its registers are its own, not the snapshot's: it answers on (its
    // register check counts the lines it read against memory put back).
    assert!(t.ask("c").contains("line="), "the target runs on");
    let _ = first;
}

/// A process that nothing can be done inside (a seccomp filter that
/// refuses pagewise's calls, which pagewise is told to respect): the
/// handle opens and says why, a full restore is refused, and a
/// memory-only restore compares every page and puts memory back.
#[test]
fn a_seccomp_target_is_restored_memory_only_by_comparison() {
    let Some(path) = target() else { return };
    pagewise_mech::seccomp::set_thread_policy(Some(pagewise_mech::seccomp::Policy::Respect));
    let mut t = Target::start(&path, &["seccomp", "errno"]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    let note = h.note().expect("a note for a seccomp target").to_string();
    assert!(note.contains("seccomp"), "{note}");
    t.settle();
    let id = h.take().unwrap();
    assert!(h.threads(id).unwrap().is_empty());
    let first = t.ask("w 20 5");
    let e = h.restore(id, RestoreOptions::default()).unwrap_err();
    assert!(
        matches!(&e, pagewise_snap::Error::Rollback(pagewise_snap::RollbackRefusal::MemoryOnly { pid, .. }) if *pid == t.pid()),
        "{e:?}"
    );
    assert!(e.to_string().contains("--memory-only"), "{e}");
    t.ask("w 30 6");
    t.settle();
    let r = h
        .restore(id, RestoreOptions::default().memory_only(true))
        .unwrap();
    // The kernel may merge the 16 MiB buffer with the loader's mapping
    // beside it, which holds the main thread's TLS: a memory-only restore
    // then leaves the whole of it alone, as the thread's.
    if r.thread_areas.iter().any(|&[a, b]| b - a >= 16 << 20) {
        pagewise_testkit::not_happened!(
            "the target's buffer shares a mapping with its main thread's TLS (merged by the kernel): left alone by a memory-only restore: {:?}",
            r.thread_areas
        );
        return;
    }
    assert!(r.compared && r.stats.pages_written >= 20, "{r:?}");
    assert_memory_is_but(&h, id, &t, &r.thread_areas);
    // Registers are not put back: the target reads on from where it was,
    // but its state is the snapshot's: the same input, the same digest.
    let again = t.ask("w 20 5");
    assert_eq!(
        again.split(' ').nth(1),
        first.split(' ').nth(1),
        "{again} / {first}"
    );
}

/// A thread caught in a nanosleep is recorded rewound: after a restore it
/// sleeps the whole 300 ms again instead of returning at once.
#[test]
fn a_sleep_caught_by_the_snapshot_sleeps_in_full_after_a_restore() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    writeln!(t.input, "n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let id = h.take().unwrap();
    let rewound = h.threads(id).unwrap()[0].rewound;
    assert!(
        rewound == Some(libc::SYS_nanosleep) || rewound == Some(libc::SYS_clock_nanosleep),
        "the sleeping thread's call: {rewound:?}"
    );
    let first = t.line();
    let r = h.restore(id, RestoreOptions::default()).unwrap();
    assert_eq!(r.threads, 1);
    let second = t.line();
    let slept = |l: &str| -> u64 {
        l.split("slept=")
            .nth(1)
            .and_then(|v| v.split(' ').next()?.parse().ok())
            .unwrap()
    };
    assert!(slept(&first) >= 300, "{first}");
    // Measured from the start the snapshot holds: at least the 100 ms
    // before it and the 300 ms sleep made again.
    assert!(slept(&second) >= 400, "{second}");
    assert!(second.contains("bad=0"), "{second}");
}

/// The target killed while a restore runs: one clear error, no hang.
#[test]
fn a_target_killed_during_a_restore_is_one_clear_error() {
    let Some(path) = target() else { return };
    let mut rng = pagewise_mech::workload::Rng::new(7);
    let mut outcomes = [0u32; 2];
    for round in 0..12 {
        let mut t = Target::start(&path, &[]);
        let mut h = ProcessSnapshots::open(t.pid()).unwrap();
        t.settle();
        let id = h.take().unwrap();
        t.ask("w 4096 9");
        t.settle();
        let pid = t.pid();
        let delay = std::time::Duration::from_micros(rng.below(3000));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: kill of a child of this test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        let t0 = std::time::Instant::now();
        let r = h.restore(id, RestoreOptions::default());
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "round {round} hung"
        );
        killer.join().unwrap();
        match r {
            Ok(_) => outcomes[0] += 1,
            Err(e) => {
                assert_eq!(
                    e.class(),
                    pagewise::ErrorClass::Gone,
                    "round {round}: {e:?}"
                );
                outcomes[1] += 1;
            }
        }
        let _ = t.child.wait();
    }
    println!(
        "ok   restores done before the kill: {}, ended by it: {}",
        outcomes[0], outcomes[1]
    );
    if outcomes[1] == 0 {
        pagewise_testkit::not_happened!("no kill landed during a restore");
    }
}

/// A snapshot saved to a store (format 3: with its layout and threads) and
/// loaded back restores as taken, layout and registers included; loading
/// it into another process is refused; a snapshot saved without its
/// threads (a seccomp target: nothing can be read inside it) restores
/// memory alone.
#[test]
fn a_stored_snapshot_restores_as_taken_and_only_into_its_process() {
    let Some(path) = target() else { return };
    let dir = std::env::temp_dir().join(format!("pagewise-rollback-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut t = Target::start(&path, &[]);
    let pid = t.pid();
    let mut h = ProcessSnapshots::open(pid).unwrap();
    t.ask("w 12 3");
    t.settle();
    let id = h.take().unwrap();
    let mut disk = pagewise_snap::DiskStore::create(&dir, true).unwrap();
    let saved = h.save(id, &mut disk, "before").unwrap();
    let first = t.ask("w 50 4");
    t.ask("m");
    t.ask("b");
    t.settle();
    // A fresh handle, as a later run would have.
    drop(h);
    let mut h = ProcessSnapshots::open(pid).unwrap();
    let loaded = h.load(&disk, saved.id, false).unwrap();
    let r = h.restore(loaded, RestoreOptions::default()).unwrap();
    assert_eq!(r.threads, 1, "{r:?}");
    assert!(
        r.layout_calls > 0,
        "the mapping made since is unmapped: {r:?}"
    );
    t.settle();
    assert_memory_is(&h, loaded, &t);
    assert_eq!(
        t.ask("w 50 4"),
        first,
        "the same input after restoring from the store"
    );
    // Into another process: refused, with the reason.
    let other = Target::start(&path, &[]);
    let mut h2 = ProcessSnapshots::open(other.pid()).unwrap();
    let e = h2.load(&disk, saved.id, false).unwrap_err();
    assert!(
        matches!(
            e,
            pagewise_snap::Error::Rollback(pagewise_snap::RollbackRefusal::AnotherProcess { .. })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("--another-process"), "{e}");
    // Without threads or layout (nothing can be read inside a target whose
    // seccomp filter refuses the calls, respected): memory alone.
    pagewise_mech::seccomp::set_thread_policy(Some(pagewise_mech::seccomp::Policy::Respect));
    let mut s = Target::start(&path, &["seccomp", "errno"]);
    s.ask("w 9 9");
    s.settle();
    let plain = pagewise_snap::remote::snapshot_process(s.pid(), &mut disk, "plain").unwrap();
    assert!(disk.load(plain.save.id).unwrap().record.is_empty());
    let answer = s.ask("w 30 1");
    s.settle();
    let mut hs = ProcessSnapshots::open(s.pid()).unwrap();
    let ls = hs.load(&disk, plain.save.id, false).unwrap();
    let e = hs.restore(ls, RestoreOptions::default()).unwrap_err();
    assert!(
        matches!(&e, pagewise_snap::Error::Rollback(pagewise_snap::RollbackRefusal::MemoryOnly { pid, .. }) if *pid == s.pid()),
        "{e:?}"
    );
    assert!(e.to_string().contains("--memory-only"), "{e}");
    let r = hs
        .restore(ls, RestoreOptions::default().memory_only(true))
        .unwrap();
    assert_memory_is_but(&hs, ls, &s, &r.thread_areas);
    let again = s.ask("w 30 1");
    assert_eq!(again.split(' ').nth(1), answer.split(' ').nth(1));
    drop(disk);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Pages dropped with `MADV_DONTNEED` change (they read as zero) without a
/// write: a restore puts them back, and a take after it reads them.
#[test]
fn pages_dropped_without_a_write_are_put_back() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    t.settle();
    let id = h.take().unwrap();
    let first = t.ask("c");
    h.restore(id, RestoreOptions::default()).unwrap();
    t.ask("d");
    t.settle();
    let r = h.restore(id, RestoreOptions::default()).unwrap();
    assert!(r.stats.pages_written >= 64, "{r:?}");
    t.settle();
    assert_memory_is(&h, id, &t);
    assert_eq!(t.ask("c"), first);
    // Dropped, then taken: the snapshot holds zero pages there.
    t.ask("d");
    t.settle();
    let dropped = h.take().unwrap();
    h.restore(id, RestoreOptions::default()).unwrap();
    h.restore(dropped, RestoreOptions::default()).unwrap();
    t.settle();
    assert_memory_is(&h, dropped, &t);
}

mod container;
mod fds;
mod pools;
mod seccomp;
mod session;

/// A restore from a store compares only what memory holds of a sparse
/// mapping: a page the process never populated reads as zeros and is not
/// read (reading it would fault the zero page in, at every address of the
/// mapping). One restore tracks nothing, so it sets no write protection
/// at the holes either. Ground truth: the five pages memory holds are the
/// only ones compared, exactly the pages written since are written back
/// (two written in holes, one changed), the mapping holds those five
/// pages and nothing more afterwards (PAGEMAP_SCAN), and every page reads
/// as the snapshot's.
#[test]
fn a_restore_from_a_store_leaves_a_sparse_mapping_sparse() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let _one = common::one_target_at_a_time();
    const PAGES: u64 = 32768; // 128 MiB
    const PAGE: usize = pagewise_mech::PAGE_SIZE;
    let mut s = common::Scripted::start(PAGES as usize);
    s.tell(b'd', PAGES << 16); // every page let go: none populated
    let kept = [5u64, 9000, 30000];
    for p in kept {
        s.tell(b'w', p | (0x11 << 16));
    }
    let dir = std::env::temp_dir().join(format!("pagewise-sparse-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut disk = pagewise_snap::DiskStore::create(&dir, true).unwrap();
    let saved = pagewise_snap::remote::snapshot_process(s.pid, &mut disk, "sparse").unwrap();
    // Since: two pages written in holes, one of the snapshot's changed.
    s.tell(b'w', 100 | (0x22 << 16));
    s.tell(b'w', 20000 | (0x23 << 16));
    s.tell(b'w', 9000 | (0x33 << 16));
    let populated = |pid: i32| -> u64 {
        let mut runs = Vec::new();
        pagewise_mech::walk::PageWalker::new(Some(pid))
            .unwrap()
            .populated(s.region, &mut runs)
            .unwrap();
        runs.iter().map(|&(a, b)| (b - a) / PAGE as u64).sum()
    };
    assert_eq!(populated(s.pid), 5, "the mapping's populated pages before");
    let mut h = ProcessSnapshots::open_for_one_restore(s.pid).unwrap();
    let id = h.load(&disk, saved.save.id, false).unwrap();
    let r = h
        .restore(id, RestoreOptions::default().memory_only(true))
        .unwrap();
    // The five pages memory holds, and none of the 32763 holes, were
    // read (every one before: reading a hole faults the zero page in);
    // the rest of the process (its heap, stacks and the libraries' data)
    // holds a few dozen.
    assert!(
        r.stats.pages_compared < 5 + 1024,
        "{} pages compared for a mapping of {PAGES} pages with 5 populated: {r:?}",
        r.stats.pages_compared
    );
    assert_eq!(r.stats.pages_written, 3, "{r:?}");
    // Nothing else of the mapping was touched: no zero page faulted in by
    // a read, no write protection set on its holes (which the kernel
    // shows as swap entries) by a handle that tracks.
    assert_eq!(
        populated(s.pid),
        5,
        "pages of the mapping populated or write-protected by the restore"
    );
    let mut all = vec![0u8; (PAGES as usize) * PAGE];
    pagewise_mech::remote::read(s.pid, s.region.start, &mut all).unwrap();
    for (p, page) in all.chunks_exact(PAGE).enumerate() {
        let want = if kept.contains(&(p as u64)) { 0x11 } else { 0 };
        assert!(
            page.iter()
                .enumerate()
                .all(|(k, &b)| b == if k == 64 { want } else { 0 }),
            "page {p} does not read as the snapshot's (byte 64 is {:#x})",
            page[64]
        );
    }
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A take reads a file's private mapping whole: a page of it never
/// touched holds the file's contents, not zeros, though memory holds
/// nothing there. The target's `.data` table (4 MiB, every int 7) is
/// untouched at the take; one int written since is put back as 7, read
/// through `/proc/PID/mem` (as zeros, the restore would write 0 there).
#[test]
fn a_file_mappings_untouched_pages_are_taken_as_the_file_holds_them() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/data_table.c");
    let bin = match pagewise_testkit::c_program(&src, Path::new(env!("CARGO_TARGET_TMPDIR")), &[]) {
        Ok(p) => p,
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            return;
        }
    };
    let mut t = Piped::start(&mut Command::new(&bin));
    let table = u64::from_str_radix(t.ask("a").trim_start_matches("0x"), 16).unwrap();
    let at = table + 4 * (1 << 19);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    let id = h.take().unwrap();
    assert_eq!(t.ask(&format!("w {} -1", 1 << 19)), "ok");
    let r = h.restore(id, RestoreOptions::default()).unwrap();
    let mem = std::fs::File::open(format!("/proc/{}/mem", t.pid())).unwrap();
    let mut b = [0u8; 4];
    mem.read_exact_at(&mut b, at).unwrap();
    assert_eq!(
        i32::from_ne_bytes(b),
        7,
        "the int written since, after the restore ({r:?})"
    );
    assert_eq!(t.ask(&format!("r {}", 1 << 19)), "7");
}

/// A take of a handle reads what memory holds of a sparse anonymous
/// mapping, walked before the mapping is write-protected (protection
/// marks every page, holes too, and a walk after it would read them all).
/// Ground truth: 3 pages written in 128 MiB let go; read in all, those 3
/// and what the rest of the process holds (walked before the take), not
/// the 32,765 holes; and a restore after writes in the holes puts them
/// back to zeros.
#[test]
fn a_take_reads_only_what_memory_holds_of_a_sparse_mapping() {
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let _one = common::one_target_at_a_time();
    const PAGES: u64 = 32768;
    let mut s = common::Scripted::start(PAGES as usize);
    s.tell(b'd', PAGES << 16);
    for p in [1u64, 16000, 32000] {
        s.tell(b'w', p | (0x44 << 16));
    }
    // What the rest of the process holds (the test process's mappings it
    // inherited among them): a file's private mapping whole, what memory
    // holds of the others.
    let mut walker = pagewise_mech::walk::PageWalker::new(Some(s.pid)).unwrap();
    let mut runs = Vec::new();
    let mut others = 0u64;
    for m in pagewise_mech::procfs::writable(Some(s.pid)).unwrap() {
        let r = pagewise_mech::Region::new(m.start, m.len()).unwrap();
        if r.start <= s.region.start && s.region.end() <= r.end() {
            walker.populated(r, &mut runs).unwrap();
            let theirs: u64 = runs
                .iter()
                .filter(|&&(a, b)| b <= s.region.start || a >= s.region.end())
                .map(|&(a, b)| (b - a) / 4096)
                .sum();
            others += theirs;
        } else if m.inode != 0 {
            others += r.pages();
        } else {
            walker.populated(r, &mut runs).unwrap();
            others += runs.iter().map(|&(a, b)| (b - a) / 4096).sum::<u64>();
        }
    }
    let mut h = ProcessSnapshots::open(s.pid).unwrap();
    let id = h.take().unwrap();
    let took = h.take_stats(id).unwrap();
    // A few pages of slack: the stopped process's stack and the like.
    assert!(
        took.pages_read <= 3 + others + 64,
        "{} pages read for a mapping of {PAGES} pages with 3 populated, the rest of the process holding {others}: {took:?}",
        took.pages_read
    );
    s.tell(b'w', 7 | (0x55 << 16));
    s.tell(b'w', 16000 | (0x56 << 16));
    let r = h
        .restore(id, RestoreOptions::default().memory_only(true))
        .unwrap();
    assert_eq!(r.stats.pages_written, 2, "{r:?}");
    let mem = std::fs::File::open(format!("/proc/{}/mem", s.pid)).unwrap();
    let mut page = vec![0u8; 4096];
    for (p, want) in [(1u64, 0x44u8), (7, 0), (16000, 0x44), (32000, 0x44)] {
        mem.read_exact_at(&mut page, s.region.start + p * 4096)
            .unwrap();
        assert!(
            page.iter()
                .enumerate()
                .all(|(k, &b)| b == if k == 64 { want } else { 0 }),
            "page {p} after the restore: byte 64 is {:#x}, want {want:#x}",
            page[64]
        );
    }
}
