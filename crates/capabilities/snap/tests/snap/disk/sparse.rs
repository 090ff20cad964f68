//! Snapshots of a sparse process at the cost of what its memory holds:
//! 10 GiB mapped (CRIU's `maps03` shape) with 8,192 pages ever written,
//! by two threads that write and give pages back (`MADV_DONTNEED`) all
//! the while. Incremental snapshots and live checkpoints hold, page for
//! page, what the process held at their stop, read only what memory
//! holds, and leave its holes as they were (no write-protection marker
//! in one: the kernel's own walk counts at most the slots).

use super::*;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};

const SLOTS: u64 = 8192;
const LEN: u64 = 10 << 30;
const SPACING: u64 = LEN / SLOTS;

/// The C program, running: its mapping and the address of its count of
/// operations.
struct Churn {
    child: Child,
    map: u64,
    ops: u64,
}

impl Churn {
    fn start() -> Result<Self, String> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/sparse_churn.c");
        let bin = pagewise_testkit::c_program(
            &src,
            Path::new(env!("CARGO_TARGET_TMPDIR")),
            &["-pthread"],
        )?;
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting sparse_churn: {e}"))?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        let mut it = line.split_whitespace();
        let (map, ops) = (hex(it.next().unwrap()), hex(it.next().unwrap()));
        Ok(Churn { child, map, ops })
    }

    /// Started and past its first 10,000 operations, or a SKIP with the
    /// reason (no uffd-wp from outside, no C compiler).
    fn started() -> Option<Self> {
        let t = pagewise_track::BackendKind::UffdWp
            .available_for_pid()
            .and_then(|()| Churn::start());
        match t {
            Ok(t) => {
                t.churn(10_000);
                Some(t)
            }
            Err(why) => {
                pagewise_testkit::skip!("{why}");
                None
            }
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn ops(&self) -> u64 {
        // Whole pages are read.
        let mut page = vec![0u8; P];
        let at = (self.ops % P as u64) as usize;
        pagewise_mech::remote::read(self.pid(), self.ops - at as u64, &mut page).unwrap();
        u64::from_ne_bytes(page[at..at + 8].try_into().unwrap())
    }

    /// Waits until the writers made `n` more operations.
    fn churn(&self, n: u64) {
        let (from, t0) = (self.ops(), std::time::Instant::now());
        while self.ops() < from + n {
            assert!(
                t0.elapsed().as_secs() < 20,
                "the writers made {} operations in 20 s, {n} awaited",
                self.ops() - from
            );
            std::thread::yield_now();
        }
    }

    /// The pages of the mapping memory holds, in the kernel's word
    /// (`PAGEMAP_SCAN`: present or swapped; a write-protection marker in a
    /// hole counts as swapped).
    fn populated(&self) -> u64 {
        let mut runs = Vec::new();
        pagewise_mech::walk::PageWalker::new(Some(self.pid()))
            .unwrap()
            .populated(Region::new(self.map, LEN).unwrap(), &mut runs)
            .unwrap();
        runs.iter().map(|&(a, b)| (b - a) / P as u64).sum()
    }

    /// Stops the process (job control) and waits until it is stopped.
    fn hold(&self, stop: bool) {
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: our own child.
        unsafe { libc::kill(self.pid(), sig) };
        let t0 = std::time::Instant::now();
        let state = || {
            let st = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
            st[st.rfind(')').unwrap() + 2..].starts_with('T')
        };
        while stop && !state() {
            assert!(t0.elapsed().as_secs() < 5, "the target never stopped");
            std::thread::yield_now();
        }
    }

    /// The slots' pages as the process holds them now.
    fn slots(&self) -> Vec<Vec<u8>> {
        (0..SLOTS)
            .map(|s| {
                let mut p = vec![0u8; P];
                pagewise_mech::remote::read(self.pid(), self.map + s * SPACING, &mut p).unwrap();
                p
            })
            .collect()
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pages of the mapping in snapshot `id` that differ from `slots` (a
/// slot's page) or from zeros (anywhere else).
fn wrong_in_snapshot(disk: &DiskStore, id: u64, map: u64, slots: &[Vec<u8>]) -> (u64, u64) {
    let snap = disk.load(id).unwrap();
    let mut first = 0usize;
    let r = snap
        .regions
        .iter()
        .find(|r| {
            let hit = r.start == map;
            if !hit {
                first += r.pages() as usize;
            }
            hit
        })
        .expect("the mapping in the snapshot");
    assert_eq!(r.len, LEN, "the mapping's size in the snapshot");
    let (mut wrong_slots, mut wrong_holes) = (0, 0);
    let mut page = vec![0u8; P];
    for (i, &e) in snap.entries[first..first + r.pages() as usize]
        .iter()
        .enumerate()
    {
        let addr = r.start + (i * P) as u64;
        let slot = (addr - map).is_multiple_of(SPACING);
        if !slot {
            wrong_holes += (e != 0) as u64;
            continue;
        }
        disk.read_page(e, &mut page).unwrap();
        wrong_slots += (page != slots[((addr - map) / SPACING) as usize]) as u64;
    }
    (wrong_slots, wrong_holes)
}

/// Incremental snapshots while two threads write and give back pages:
/// each exact at its stop, each reading at most the slots and what the
/// rest of the process holds, its holes left as they were.
#[test]
fn incremental_snapshots_of_a_sparse_process_read_what_it_holds() {
    let _one = crate::common::one_target_at_a_time();
    let Some(t) = Churn::started() else {
        return;
    };
    let dir = TempDir::new("sparse-incremental");
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let mut inc = pagewise_snap::remote::Incremental::new(t.pid()).unwrap();
    let mut given_back = 0;
    for round in 0..5 {
        t.churn(20_000);
        t.hold(true);
        let s = inc.snapshot(&mut disk, "sparse").unwrap();
        let slots = t.slots();
        given_back += slots.iter().filter(|p| p.iter().all(|&b| b == 0)).count();
        let (ws, wh) = wrong_in_snapshot(&disk, s.save.id, t.map, &slots);
        t.hold(false);
        assert_eq!((ws, wh), (0, 0), "round {round}: (slots, holes) differing");
        // The slots, and what the rest of the process holds (its stacks,
        // heap and libraries' data: a few thousand pages at most).
        assert!(
            s.pages_read <= SLOTS + 4096,
            "round {round}: {} pages read",
            s.pages_read
        );
        println!(
            "     round {round}: {} pages read, {} ms stopped",
            s.pages_read, s.stopped_ms
        );
    }
    assert!(given_back > 0, "no slot was given back at any snapshot");
    let held = t.populated();
    assert!(
        held <= SLOTS,
        "the kernel counts {held} pages held in a mapping of {SLOTS} written pages: holes marked"
    );
}

/// Live checkpoints (passes while the threads run, the rest at the stop)
/// hold the process's memory at the stop, page for page, with what was
/// given back since as zeros; the copy reads what memory holds.
#[test]
fn live_checkpoints_of_a_sparse_process_hold_it_at_the_stop() {
    let _one = crate::common::one_target_at_a_time();
    use pagewise_snap::live::{Checkpointer, LiveOptions, ProcessSource, StoreSeries};
    let Some(t) = Churn::started() else {
        return;
    };
    let dir = TempDir::new("sparse-live");
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let mut series = StoreSeries::new(&mut disk);
    let opts = LiveOptions::default()
        .max_downtime_ms(20.0)
        .max_passes(8)
        .throttle(false);
    let mut c = Checkpointer::new(ProcessSource::new(t.pid()).unwrap(), opts);
    let mut saved = Vec::new();
    for round in 0..3 {
        t.churn(20_000);
        let mut at_stop = Vec::new();
        let r = c
            .checkpoint(&mut series, "sparse", &mut |_| {}, &mut || {
                at_stop = t.slots()
            })
            .unwrap();
        // Each pass at most the slots and the rest of the process (not
        // the 2,621,440 pages of the mapping).
        let passes = r.passes.len() as u64 + 1;
        assert!(
            r.bytes_copied / P as u64 <= passes * (SLOTS + 4096),
            "round {round}: {} pages copied in {passes} passes",
            r.bytes_copied / P as u64
        );
        saved.push((r.save.id, at_stop));
    }
    drop(c);
    drop(series);
    for (round, (id, slots)) in saved.iter().enumerate() {
        let (ws, wh) = wrong_in_snapshot(&disk, *id, t.map, slots);
        assert_eq!((ws, wh), (0, 0), "round {round}: (slots, holes) differing");
    }
    let held = t.populated();
    assert!(
        held <= SLOTS,
        "the kernel counts {held} pages held in a mapping of {SLOTS} written pages: holes marked"
    );
}
