//! (d) **Lazy restore from a store** (`pagewise_snap::LazyRestore`, the
//! VMM case). Memory of `MiB` (seven pages in eight of distinct data, one
//! zero) is saved in a store; then, per repeat, it is scribbled over and
//! put back three ways:
//!
//! - **eager**: every page read from the store into place before the
//!   program goes on (the store's own page reads, all up front);
//! - **lazy, on demand**: [`LazyRestore::start`] with no background fill
//!   and no staging, then `touches` pages in random order, each touch timed
//!   (its first-touch latency: the store read and a copy on the fault's
//!   path), then `finish`;
//! - **lazy, staged**: the same with staging (no background fill): the
//!   first useful work at once, then, once the stager has read every page
//!   ahead, `touches` fresh pages timed (the fault answered by a copy
//!   from staging, no store read),
//!   then `finish`;
//! - **lazy, background**: the same with the background fill, until every
//!   page is in.
//!
//! Time to first useful work is from the start of the restore until
//! `work` random pages were read (a request served). The first-touch
//! latency is set against the far-memory floor of the same fault path in
//! the same run: first touches of fresh pages under a far-memory instance
//! at latency 0 on the handler thread, timed the same way. With the store
//! in the page cache, then cold (its pack dropped from the page cache with
//! `POSIX_FADV_DONTNEED`, which touches no system setting).

use super::Ms;
use crate::svg::{Chart, Series};
use anyhow::{ensure, Context, Result};
use pagewise::PAGE_SIZE;
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_snap::{DiskStore, LazyOptions, LazyRestore};
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::time::Instant;

/// One store state of (d).
#[derive(Debug, Clone, Serialize)]
pub struct LazyRow {
    /// `page cache` or `cold`.
    pub store: String,
    /// The CPUs the benchmark and its threads ran on: `all`, or `one`
    /// (the toucher, the lazy server and far memory's handler on one CPU,
    /// so that no wake-up crosses CPUs).
    pub cpus: String,
    /// Memory, MiB.
    pub mib: usize,
    /// Repeats.
    pub reps: usize,
    /// Eager restore of everything, ms.
    pub eager: Ms,
    /// `LazyRestore::start`, ms.
    pub lazy_start: Ms,
    /// Time to first useful work (`work` pages read), eager, ms.
    pub first_work_eager: Ms,
    /// The same, lazy (on demand), ms.
    pub first_work_lazy: Ms,
    /// Lazy first touch, median per repeat, µs.
    pub touch_p50_us: Ms,
    /// Lazy first touch, 99th percentile per repeat, µs.
    pub touch_p99_us: Ms,
    /// Lazy with the background fill: from the start until every page is
    /// in, ms.
    pub background_complete: Ms,
    /// Far memory's first touch at latency 0 (the floor of the fault
    /// path), median per repeat, µs.
    pub floor_p50_us: Ms,
    /// Its 99th percentile, µs.
    pub floor_p99_us: Ms,
    /// The server's part of a first touch (from reading the fault to the
    /// page mapped), median per repeat, µs.
    pub service_p50_us: Ms,
    /// Lazy first touch over the floor (medians).
    pub x_floor: f64,
    /// Time to first useful work, lazy with staging (the stager racing
    /// the work), ms.
    pub first_work_staged: Ms,
    /// From the start until every page was staged, ms.
    pub staged_all: Ms,
    /// First touch of a staged page (copied from its slot), median per
    /// repeat, µs.
    pub staged_touch_p50_us: Ms,
    /// Its 99th percentile, µs.
    pub staged_touch_p99_us: Ms,
    /// The server's part of a first touch in the staged run (its first
    /// useful work's faults included), median per repeat, µs.
    pub staged_service_p50_us: Ms,
    /// Staged first touch over the floor (medians).
    pub staged_x_floor: f64,
    /// Pages compared with the saved copy after every restore.
    pub pages_checked: u64,
}

/// Sizes of (d).
#[derive(Debug, Clone, Serialize)]
pub struct LazyConfig {
    /// Memory sizes, MiB (the cold store and the one-CPU run at the
    /// largest only).
    pub mibs: Vec<usize>,
    /// Repeats per store state.
    pub reps: usize,
    /// Timed first touches per repeat.
    pub touches: usize,
    /// Pages read as the first useful work.
    pub work: usize,
}

fn pct(v: &mut [f64], q: usize) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * q / 100).min(v.len() - 1)]
}

/// Word `w` of page `p` of the saved memory (every eighth page zero).
fn word(p: usize, w: usize) -> u64 {
    if p % 8 == 7 {
        0
    } else {
        // splitmix64 of the word's place: no page compresses.
        let mut z = ((p as u64) << 12 | w as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn fill(mem: &AnonMemory) {
    let words = PAGE_SIZE / 8;
    for p in 0..mem.pages() {
        for w in 0..words {
            mem.write_word(p * words + w, word(p, w));
        }
    }
}

/// Pages of `mem` that differ from the saved copy: all of them, or every
/// 61st.
fn wrong_pages(mem: &AnonMemory, all: bool) -> (u64, u64) {
    let words = PAGE_SIZE / 8;
    let (mut checked, mut wrong) = (0, 0);
    for p in (0..mem.pages()).step_by(if all { 1 } else { 61 }) {
        checked += 1;
        if (0..words).any(|w| mem.read_word(p * words + w) != word(p, w)) {
            wrong += 1;
        }
    }
    (checked, wrong)
}

/// `n` distinct random pages of `pages`.
fn random_pages(pages: usize, n: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    let mut seen = std::collections::HashSet::new();
    let mut v = Vec::with_capacity(n);
    while v.len() < n.min(pages) {
        let p = rng.below(pages as u64) as usize;
        if seen.insert(p) {
            v.push(p);
        }
    }
    v
}

/// Each touch of `pages` timed, µs.
fn timed_touches(mem: &AnonMemory, pages: &[usize]) -> Vec<f64> {
    pages
        .iter()
        .map(|&p| {
            let t0 = Instant::now();
            mem.read_byte(p * PAGE_SIZE + 8);
            t0.elapsed().as_nanos() as f64 / 1000.0
        })
        .collect()
}

fn drop_cache(dir: &std::path::Path) -> Result<()> {
    let f = std::fs::File::open(dir.join("pages.pack")).context("opening the store's pack")?;
    // SAFETY: plain advice on a file descriptor this function owns.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    ensure!(r == 0, "posix_fadvise(DONTNEED) of the pack: error {r}");
    Ok(())
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// (d) at every size: the store in the page cache, then (at the largest)
/// on one CPU and cold.
pub fn run(c: &LazyConfig, progress: &mut dyn FnMut(&str)) -> Result<Vec<LazyRow>> {
    let largest = c.mibs.iter().copied().max().unwrap_or(0);
    let mut rows = Vec::new();
    for &mib in &c.mibs {
        rows.extend(at_size(c, mib, mib == largest, progress)?);
    }
    Ok(rows)
}

fn at_size(
    c: &LazyConfig,
    mib: usize,
    largest: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<LazyRow>> {
    let len = mib << 20;
    let mem = AnonMemory::new(len)?;
    let pages = mem.pages();
    progress(&format!("(d) filling and saving {mib} MiB"));
    fill(&mem);
    let dir = std::env::temp_dir().join(format!("pagewise-bench-lazy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _cleanup = Cleanup(dir.clone());
    {
        let mut disk = DiskStore::create(&dir, false)?;
        let mut w = disk.writer(&[mem.region()], None, "lazy")?;
        let mut page = vec![0u8; PAGE_SIZE];
        for p in 0..pages {
            mem.read_into(p * PAGE_SIZE, &mut page);
            w.push(&page)?;
        }
        w.finish()?;
    }
    let mut rows = Vec::new();
    let all = [(false, false), (false, true), (true, false)];
    for &(cold, one_cpu) in if largest { &all[..] } else { &all[..1] } {
        let store = if cold { "cold" } else { "page cache" };
        let cpus = if one_cpu { "one" } else { "all" };
        let mut r = Runs::default();
        let pinned = one_cpu.then(Pinned::to_this_cpu).transpose()?;
        for rep in 0..c.reps {
            progress(&format!(
                "(d) {mib} MiB, {store}, {cpus} CPUs, repeat {}/{}",
                rep + 1,
                c.reps
            ));
            one_repeat(c, &mem, &dir, cold, rep as u64, &mut r)?;
        }
        drop(pinned);
        let floor = Ms::of(r.floor_p50.clone()).median;
        let x_floor = Ms::of(r.p50.clone()).median / floor;
        let staged_x_floor = Ms::of(r.staged_p50.clone()).median / floor;
        rows.push(LazyRow {
            store: store.into(),
            cpus: cpus.into(),
            mib,
            reps: c.reps,
            eager: Ms::of(r.eager),
            lazy_start: Ms::of(r.start),
            first_work_eager: Ms::of(r.work_eager),
            first_work_lazy: Ms::of(r.work_lazy),
            touch_p50_us: Ms::of(r.p50),
            touch_p99_us: Ms::of(r.p99),
            background_complete: Ms::of(r.complete),
            floor_p50_us: Ms::of(r.floor_p50),
            floor_p99_us: Ms::of(r.floor_p99),
            service_p50_us: Ms::of(r.service_p50),
            x_floor,
            first_work_staged: Ms::of(r.work_staged),
            staged_all: Ms::of(r.staged_all),
            staged_touch_p50_us: Ms::of(r.staged_p50),
            staged_touch_p99_us: Ms::of(r.staged_p99),
            staged_service_p50_us: Ms::of(r.staged_service_p50),
            staged_x_floor,
            pages_checked: r.checked,
        });
    }
    Ok(rows)
}

/// Time to first useful work and to every page in, against the size.
pub fn chart(rows: &[LazyRow]) -> Option<(String, Chart)> {
    let main: Vec<&LazyRow> = rows
        .iter()
        .filter(|r| r.store == "page cache" && r.cpus == "all")
        .collect();
    if main.len() < 2 {
        return None;
    }
    let series = |label: &str, f: &dyn Fn(&LazyRow) -> f64| Series {
        label: label.into(),
        points: main.iter().map(|r| (r.mib as f64, f(r))).collect(),
    };
    Some((
        "lazy.svg".into(),
        Chart {
            title: "Restore from a store in the page cache (median)".into(),
            x_label: "memory (MiB)".into(),
            y_label: "ms".into(),
            log_x: true,
            log_y: true,
            series: vec![
                series("eager: first useful work", &|r| r.first_work_eager.median),
                series("lazy: first useful work", &|r| r.first_work_lazy.median),
                series("lazy + background: every page in", &|r| {
                    r.background_complete.median
                }),
            ],
        },
    ))
}

#[derive(Default)]
struct Runs {
    eager: Vec<f64>,
    start: Vec<f64>,
    work_eager: Vec<f64>,
    work_lazy: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    complete: Vec<f64>,
    floor_p50: Vec<f64>,
    floor_p99: Vec<f64>,
    service_p50: Vec<f64>,
    work_staged: Vec<f64>,
    staged_all: Vec<f64>,
    staged_p50: Vec<f64>,
    staged_p99: Vec<f64>,
    staged_service_p50: Vec<f64>,
    checked: u64,
}

/// The calling thread (and the threads it starts) held to the CPU it runs
/// on; its former CPU set put back when dropped.
pub(crate) struct Pinned(libc::cpu_set_t);

impl Pinned {
    pub(crate) fn to_this_cpu() -> Result<Pinned> {
        // SAFETY: cpu_set_t is plain data; an all-zero set is valid.
        let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `old` is a writable cpu_set_t of `size` bytes.
        let r = unsafe { libc::sched_getaffinity(0, size, &mut old) };
        ensure!(
            r == 0,
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: no argument; returns the CPU or -1.
        let cpu = unsafe { libc::sched_getcpu() };
        ensure!(
            cpu >= 0,
            "sched_getcpu: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: as above.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is a CPU number the kernel gave, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu as usize, &mut one) };
        // SAFETY: `one` is a valid cpu_set_t of `size` bytes.
        let r = unsafe { libc::sched_setaffinity(0, size, &one) };
        ensure!(
            r == 0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
        Ok(Pinned(old))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: the set read at creation, of its own size.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0);
        }
    }
}

/// A directory removed when dropped.
pub(super) struct Cleanup(pub(super) std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn one_repeat(
    c: &LazyConfig,
    mem: &AnonMemory,
    dir: &std::path::Path,
    cold: bool,
    seed: u64,
    r: &mut Runs,
) -> Result<()> {
    let pages = mem.pages();
    let work = random_pages(pages, c.work, 100 + seed);
    let touches = random_pages(pages, c.touches, 200 + seed);
    let check = |r: &mut Runs, all: bool, what: &str| -> Result<()> {
        let (checked, wrong) = wrong_pages(mem, all);
        ensure!(
            wrong == 0,
            "{what}: {wrong} of {checked} pages differ from the saved copy"
        );
        r.checked += checked;
        Ok(())
    };

    // Eager: every page from the store, then the work.
    mem.write_pass(1, 0xee);
    if cold {
        drop_cache(dir)?;
    }
    let disk = DiskStore::open(dir)?;
    let snap = disk.load(1)?;
    let t0 = Instant::now();
    // SAFETY: the benchmark's own mapping, `pages` pages long; no other
    // thread uses it.
    let all = unsafe { std::slice::from_raw_parts_mut(mem.as_ptr(), pages * PAGE_SIZE) };
    for (p, &e) in snap.entries.iter().enumerate() {
        disk.read_page(e, &mut all[p * PAGE_SIZE..(p + 1) * PAGE_SIZE])?;
    }
    r.eager.push(ms(t0));
    timed_touches(mem, &work);
    r.work_eager.push(ms(t0));
    check(r, false, "eager restore")?;

    // Lazy, on demand: start, the work, timed first touches, finish.
    mem.write_pass(1, 0xee);
    if cold {
        drop_cache(dir)?;
    }
    let disk = DiskStore::open(dir)?;
    let t0 = Instant::now();
    let opts = LazyOptions::default().background(false).stage(false);
    let lazy = LazyRestore::start(disk, 1, &[mem.region()], opts)?;
    r.start.push(ms(t0));
    timed_touches(mem, &work);
    r.work_lazy.push(ms(t0));
    let fresh: Vec<usize> = touches
        .iter()
        .copied()
        .filter(|p| !work.contains(p) && p % 8 != 7)
        .collect();
    let mut lat = timed_touches(mem, &fresh);
    r.p50.push(pct(&mut lat, 50));
    r.p99.push(pct(&mut lat, 99));
    let st = lazy.finish()?;
    r.service_p50.push(st.service_p50_ns as f64 / 1000.0);
    ensure!(st.complete, "lazy restore did not complete: {st:?}");
    check(r, seed == 0, "lazy restore")?;

    // Lazy, staged: the work at once, then, every page staged, timed
    // first touches.
    mem.write_pass(1, 0xee);
    if cold {
        drop_cache(dir)?;
    }
    let disk = DiskStore::open(dir)?;
    let t0 = Instant::now();
    let opts = LazyOptions::default().background(false).stage(true);
    let lazy = LazyRestore::start(disk, 1, &[mem.region()], opts)?;
    timed_touches(mem, &work);
    r.work_staged.push(ms(t0));
    let deadline = Instant::now() + std::time::Duration::from_secs(600);
    let want = lazy.stats();
    let want = want.pages - want.zero_pages;
    loop {
        let st = lazy.stats();
        // Pages the work brought in before the stager got to them are
        // not staged.
        if st.staged + (st.copied - st.from_staging) >= want {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the stager did not stage every page in 600 s: {st:?}"
        );
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    r.staged_all.push(ms(t0));
    let before = lazy.stats();
    let mut lat = timed_touches(mem, &fresh);
    let after = lazy.stats();
    ensure!(
        after.faults_staged - before.faults_staged == fresh.len() as u64,
        "{} of {} staged first touches were answered from staging",
        after.faults_staged - before.faults_staged,
        fresh.len()
    );
    r.staged_p50.push(pct(&mut lat, 50));
    r.staged_p99.push(pct(&mut lat, 99));
    let st = lazy.finish()?;
    r.staged_service_p50.push(st.service_p50_ns as f64 / 1000.0);
    ensure!(st.complete, "staged lazy restore did not complete: {st:?}");
    check(r, false, "staged lazy restore")?;

    // Lazy with the background fill, until complete.
    mem.write_pass(1, 0xee);
    if cold {
        drop_cache(dir)?;
    }
    let disk = DiskStore::open(dir)?;
    let t0 = Instant::now();
    let lazy = LazyRestore::start(disk, 1, &[mem.region()], LazyOptions::default())?;
    let deadline = Instant::now() + std::time::Duration::from_secs(600);
    let done = loop {
        let st = lazy.stats();
        if st.complete || Instant::now() > deadline {
            break st.complete;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    ensure!(done, "the background fill did not complete in 600 s");
    r.complete.push(ms(t0));
    lazy.finish()?;
    check(r, false, "lazy restore with background fill")?;

    // The far-memory floor: first touches of fresh pages at latency 0.
    let n = fresh.len().max(1);
    let fm_mem = AnonMemory::new(n * PAGE_SIZE)?;
    let fm = pagewise_farmem::at_latency_zero(&fm_mem, n, pagewise_farmem::FaultPath::Thread)?;
    let order = random_pages(n, n, 300 + seed);
    let mut lat = timed_touches(&fm_mem, &order);
    let fst = fm.stop()?;
    ensure!(
        fst.page_fault_count as usize == n,
        "far memory served {} faults for {n} first touches",
        fst.page_fault_count
    );
    r.floor_p50.push(pct(&mut lat, 50));
    r.floor_p99.push(pct(&mut lat, 99));
    Ok(())
}

/// (d)'s table.
pub fn summary(s: &mut String, rows: &[LazyRow]) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "\n(d) lazy restore from a store: median [min..max]; touch = one first touch, \
         floor = far memory's first touch at latency 0 on the same fault path"
    );
    let _ = writeln!(
        s,
        "{:<11} {:>4} {:>5} {:>24} {:>24} {:>24} {:>24} {:>22} {:>22} {:>22} {:>24} {:>22} {:>7}",
        "store",
        "CPUs",
        "MiB",
        "eager ms",
        "lazy start ms",
        "1st work eager ms",
        "1st work lazy ms",
        "touch p50 us",
        "touch p99 us",
        "server p50 us",
        "background done ms",
        "floor p50 us",
        "x floor"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<11} {:>4} {:>5} {:>24} {:>24} {:>24} {:>24} {:>22} {:>22} {:>22} {:>24} {:>22} {:>7.2}",
            r.store,
            r.cpus,
            r.mib,
            super::fmt_ms(&r.eager),
            super::fmt_ms(&r.lazy_start),
            super::fmt_ms(&r.first_work_eager),
            super::fmt_ms(&r.first_work_lazy),
            super::fmt_ms(&r.touch_p50_us),
            super::fmt_ms(&r.touch_p99_us),
            super::fmt_ms(&r.service_p50_us),
            super::fmt_ms(&r.background_complete),
            super::fmt_ms(&r.floor_p50_us),
            r.x_floor
        );
    }
    let _ = writeln!(
        s,
        "\n(d) lazy restore with staging (no background fill): median [min..max]; \
         staged touch = first touch of a page staged ahead (copied from staging)"
    );
    let _ = writeln!(
        s,
        "{:<11} {:>4} {:>5} {:>24} {:>24} {:>22} {:>22} {:>22} {:>22} {:>7}",
        "store",
        "CPUs",
        "MiB",
        "1st work staged ms",
        "all staged ms",
        "staged touch p50 us",
        "staged touch p99 us",
        "server p50 us",
        "floor p50 us",
        "x floor"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<11} {:>4} {:>5} {:>24} {:>24} {:>22} {:>22} {:>22} {:>22} {:>7.2}",
            r.store,
            r.cpus,
            r.mib,
            super::fmt_ms(&r.first_work_staged),
            super::fmt_ms(&r.staged_all),
            super::fmt_ms(&r.staged_touch_p50_us),
            super::fmt_ms(&r.staged_touch_p99_us),
            super::fmt_ms(&r.staged_service_p50_us),
            super::fmt_ms(&r.floor_p50_us),
            r.staged_x_floor
        );
    }
}
