//! SimGrid's experiments, side by side:
//!
//! - (a) state-space exploration: a depth-first search over the states of a
//!   random-walk model on a heap, a snapshot at each state and a restore on
//!   each backtrack, plus a cache of recently visited states (as a model
//!   checker keeps for state comparison). Full-copy snapshots ("simple")
//!   against the page store ("same-page-merging"): time and peak RSS;
//! - (b) snapshot + restore cycles on a region with 0.1 %, 1 % and 10 % of
//!   its pages dirtied per cycle, against a `fork()` per cycle (the fuzzers'
//!   baseline: the child dirties the pages and exits, the parent stays
//!   pristine), a full `memcpy` out and back, and the floor of any
//!   snapshot of the pages written on this kernel (their faults, two
//!   walks, a copy out and a copy back, none of the store's work);
//! - (c) `pagewise snapshot --pid` against `criu dump` on the same process
//!   (in [`super::dump`]).
//!
//! Every variant checks its result: the search visits the same states with
//! the same checksums, and every restore is compared with the base contents.

use super::{median, Machine};
use pagewise::{Error, Result, PAGE_SIZE};
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_snap::{SnapshotOptions, Snapshots};
use pagewise_testkit::host as procfs;
use serde::Serialize;
use std::collections::VecDeque;
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// (a) heap size in MiB.
    pub dfs_heap_mib: usize,
    /// (a) search depth.
    pub dfs_depth: u32,
    /// (a) successors per state.
    pub dfs_branching: u32,
    /// (a) pages a transition writes.
    pub dfs_pages_per_step: usize,
    /// (a) visited states kept for comparison (besides the search stack).
    pub dfs_visited_cache: usize,
    /// (b) region size in MiB.
    pub cycle_mib: usize,
    /// (b) dirtied percentages, in tenths of a percent.
    pub cycle_permille: Vec<u32>,
    /// (b) cycles per point for the page store (fork and memcpy run fewer).
    pub cycles: usize,
    /// (c) heap of the process snapshotted by pagewise and by CRIU, MiB.
    pub dump_heap_mib: usize,
    /// Which experiments to run: any of `a`, `b`, `c`.
    pub parts: String,
}

impl Config {
    /// The full experiment (a few minutes here).
    pub fn full() -> Self {
        Config {
            dfs_heap_mib: 256,
            dfs_depth: 5,
            dfs_branching: 3,
            dfs_pages_per_step: 8,
            dfs_visited_cache: 16,
            cycle_mib: 1024,
            cycle_permille: vec![1, 10, 100],
            cycles: 200,
            dump_heap_mib: 256,
            parts: "abc".into(),
        }
    }

    /// A short run for CI and `pagewise bench snap` without `--full`.
    pub fn quick() -> Self {
        Config {
            dfs_heap_mib: 64,
            dfs_depth: 4,
            dfs_branching: 3,
            dfs_pages_per_step: 8,
            dfs_visited_cache: 8,
            cycle_mib: 256,
            cycle_permille: vec![1, 10, 100],
            cycles: 50,
            dump_heap_mib: 32,
            parts: "abc".into(),
        }
    }
}

/// One (a) variant.
#[derive(Debug, Clone, Serialize)]
pub struct DfsRow {
    /// `full-copy` or `page-store`.
    pub variant: String,
    /// States visited.
    pub states: u64,
    /// Restores (backtracks) made.
    pub restores: u64,
    /// Wall time, s.
    pub seconds: f64,
    /// Peak RSS of the process during the search, MiB.
    pub peak_rss_mib: f64,
    /// Peak RSS above the heap itself, MiB (what the snapshots cost).
    pub snapshot_mib: f64,
    /// Checksum over every visited state (equal across variants).
    pub checksum: u64,
}

/// One (b) point.
#[derive(Debug, Clone, Serialize)]
pub struct CycleRow {
    /// `page-store`, `page-store restore-only`, `fork`, `memcpy` or
    /// `floor`.
    pub variant: String,
    /// Pages dirtied per cycle, in tenths of a percent of the region.
    pub permille: u32,
    /// Pages dirtied per cycle.
    pub pages_dirtied: u64,
    /// Cycles measured.
    pub cycles: u64,
    /// Median cycle time, ms.
    pub cycle_ms: f64,
    /// Cycles per second (from the median).
    pub cycles_per_s: f64,
    /// `cycles_per_s` over fork's at the same point.
    pub ratio_to_fork: f64,
    /// Page store only: median time of each part of the cycle, ms.
    pub phases: Option<Phases>,
}

/// Where a page-store cycle's time goes (medians, ms).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Phases {
    /// The program's writes (a write-protect fault on each page's first write).
    pub write_ms: f64,
    /// `take`.
    pub take_ms: f64,
    /// `restore(base)`.
    pub restore_ms: f64,
    /// `drop_snapshot`.
    pub drop_ms: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where.
    pub machine: Machine,
    /// What.
    pub config: Config,
    /// The dirty-tracking backend the page store used.
    pub backend: String,
    /// (a).
    pub dfs: Vec<DfsRow>,
    /// (a) page store's peak RSS over full copies' (snapshot memory only).
    pub dfs_memory_ratio: f64,
    /// (a) page store's time over full copies'.
    pub dfs_time_ratio: f64,
    /// (b).
    pub cycles: Vec<CycleRow>,
    /// (c).
    pub dump: Option<super::dump::DumpReport>,
}

/// A heap whose every page is distinct: page `i` starts with `i`.
fn distinct_heap(mib: usize) -> Result<AnonMemory> {
    let mem = AnonMemory::new(mib << 20)?;
    for p in 0..mem.pages() {
        for (k, b) in (p as u64).to_le_bytes().iter().enumerate() {
            mem.write_byte(p * PAGE_SIZE + k, *b);
        }
        mem.write_byte(p * PAGE_SIZE + 100, 0x5a);
    }
    Ok(mem)
}

/// The model's transition: state `id`, choice `c` writes some pages and
/// "runs" (reads a few pages). Returns a checksum of what it read.
fn step(mem: &AnonMemory, id: u64, c: u32, pages: usize) -> u64 {
    let mut rng = Rng::new(id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (c as u64 + 1));
    let n = mem.pages() as u64;
    let mut sum = 0u64;
    for _ in 0..pages {
        let p = rng.below(n) as usize;
        let off = p * PAGE_SIZE + 256 + rng.below(PAGE_SIZE as u64 - 512) as usize;
        for k in 0..64 {
            mem.write_byte(off + k, (id as u8) ^ (k as u8) ^ c as u8);
        }
        let q = rng.below(n) as usize;
        for k in (0..PAGE_SIZE).step_by(64) {
            sum = sum
                .wrapping_mul(31)
                .wrapping_add(mem.read_byte(q * PAGE_SIZE + k) as u64);
        }
    }
    sum
}

/// The two ways of keeping states.
trait StateKeeper {
    type Snap;
    fn take(&mut self, mem: &AnonMemory) -> Result<Self::Snap>;
    fn restore(&mut self, mem: &AnonMemory, s: &Self::Snap) -> Result<()>;
    fn drop_snap(&mut self, s: Self::Snap) -> Result<()>;
}

struct FullCopy;

impl StateKeeper for FullCopy {
    type Snap = Vec<u8>;
    fn take(&mut self, mem: &AnonMemory) -> Result<Vec<u8>> {
        Ok(mem.snapshot())
    }
    fn restore(&mut self, mem: &AnonMemory, s: &Vec<u8>) -> Result<()> {
        mem.write_at(0, s);
        Ok(())
    }
    fn drop_snap(&mut self, _s: Vec<u8>) -> Result<()> {
        Ok(())
    }
}

impl StateKeeper for Snapshots {
    type Snap = pagewise_snap::SnapId;
    fn take(&mut self, _mem: &AnonMemory) -> Result<Self::Snap> {
        Ok(Snapshots::take(self)?)
    }
    fn restore(&mut self, _mem: &AnonMemory, s: &Self::Snap) -> Result<()> {
        Snapshots::restore(self, *s)?;
        Ok(())
    }
    fn drop_snap(&mut self, s: Self::Snap) -> Result<()> {
        Ok(self.drop_snapshot(s)?)
    }
}

struct Dfs<'a, K: StateKeeper> {
    mem: &'a AnonMemory,
    keeper: K,
    cfg: &'a Config,
    visited: VecDeque<K::Snap>,
    states: u64,
    restores: u64,
    checksum: u64,
}

impl<K: StateKeeper> Dfs<'_, K> {
    fn explore(&mut self, id: u64, depth: u32) -> Result<()> {
        self.states += 1;
        let here = self.keeper.take(self.mem)?;
        // State comparison reads the state's first page.
        self.checksum = self
            .checksum
            .wrapping_mul(1_000_003)
            .wrapping_add(self.mem.read_byte(256) as u64 + id);
        if depth < self.cfg.dfs_depth {
            for c in 0..self.cfg.dfs_branching {
                if c > 0 {
                    self.keeper.restore(self.mem, &here)?;
                    self.restores += 1;
                }
                let s = step(self.mem, id, c, self.cfg.dfs_pages_per_step);
                self.checksum = self.checksum.wrapping_add(s);
                self.explore(id * self.cfg.dfs_branching as u64 + c as u64 + 1, depth + 1)?;
            }
            self.keeper.restore(self.mem, &here)?;
            self.restores += 1;
        }
        // Keep the state in the visited cache; evict the oldest.
        self.visited.push_back(here);
        if self.visited.len() > self.cfg.dfs_visited_cache {
            let old = self.visited.pop_front().expect("non-empty");
            self.keeper.drop_snap(old)?;
        }
        Ok(())
    }
}

fn run_dfs<K: StateKeeper>(
    variant: &str,
    cfg: &Config,
    make: impl FnOnce(&AnonMemory) -> Result<K>,
) -> Result<DfsRow> {
    let mem = distinct_heap(cfg.dfs_heap_mib)?;
    let keeper = make(&mem)?;
    procfs::reset_peak_rss()?;
    let base_rss = procfs::peak_rss_kib()?;
    let t0 = Instant::now();
    let mut d = Dfs {
        mem: &mem,
        keeper,
        cfg,
        visited: VecDeque::new(),
        states: 0,
        restores: 0,
        checksum: 0,
    };
    d.explore(0, 0)?;
    let seconds = t0.elapsed().as_secs_f64();
    let peak = procfs::peak_rss_kib()?;
    Ok(DfsRow {
        variant: variant.into(),
        states: d.states,
        restores: d.restores,
        seconds,
        peak_rss_mib: peak as f64 / 1024.0,
        snapshot_mib: peak.saturating_sub(base_rss) as f64 / 1024.0,
        checksum: d.checksum,
    })
}

/// (a): the same search with full copies and with the page store.
pub fn dfs(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Vec<DfsRow>> {
    progress("(a) search with full-copy snapshots");
    let full = run_dfs("full-copy", cfg, |_| Ok(FullCopy))?;
    progress("(a) search with the page store");
    let store = run_dfs("page-store", cfg, |m| {
        Ok(Snapshots::new(&[m.region()], SnapshotOptions::default())?)
    })?;
    if full.checksum != store.checksum || full.states != store.states {
        return Err(crate::check_failed(format!(
            "the searches disagree: full copies saw {} states (checksum {:#x}), the page store {} ({:#x})",
            full.states, full.checksum, store.states, store.checksum
        )));
    }
    Ok(vec![full, store])
}

fn dirty_pages(rng: &mut Rng, pages: usize, k: usize) -> Vec<usize> {
    (0..k).map(|_| rng.below(pages as u64) as usize).collect()
}

fn dirty(mem: &AnonMemory, pages: &[usize], v: u8) {
    for &p in pages {
        for k in 0..8 {
            mem.write_byte(p * PAGE_SIZE + 8 + k, v);
        }
    }
}

fn check_base(mem: &AnonMemory, pages: &[usize], what: &str) -> Result<()> {
    for &p in pages {
        for k in 0..8 {
            if mem.read_byte(p * PAGE_SIZE + 8 + k) != 0 {
                return Err(crate::check_failed(format!(
                    "{what}: page {p} not restored to its base contents"
                )));
            }
        }
    }
    Ok(())
}

/// The floor of a cycle in the calling process on this kernel: what any
/// snapshot of the pages written costs at the least, with none of the
/// page store's work (no digest, no index, no table). On a region of its
/// own with the same contents, the pages written (each with its
/// write-protect fault, as the program pays them under tracking), one
/// walk that finds them, each copied out to a buffer of its own, each
/// copied back from a copy of the base (cold, as the store's pages
/// are), and one walk that protects them again.
struct Floor {
    mem: AnonMemory,
    wp: pagewise_mech::wp::UffdWp,
    base: Vec<u8>,
    out: Vec<u8>,
    found: Vec<pagewise_mech::region::PageRange>,
}

impl Floor {
    fn new(mib: usize) -> Result<Floor> {
        let mem = distinct_heap(mib)?;
        let wp = pagewise_mech::wp::UffdWp::open()?;
        wp.register(mem.region(), true)?;
        let base = mem.snapshot();
        Ok(Floor {
            mem,
            wp,
            base,
            out: Vec::new(),
            found: Vec::new(),
        })
    }

    /// `cycles` cycles of `k` pages: the time of each, ms.
    fn cycles(&mut self, rng: &mut Rng, k: usize, cycles: usize) -> Result<Vec<f64>> {
        let (start, end) = (self.mem.addr(), self.mem.addr() + self.mem.len() as u64);
        self.out.resize(k * PAGE_SIZE, 0);
        let mut t = Vec::with_capacity(cycles);
        for c in 0..cycles {
            let pages = dirty_pages(rng, self.mem.pages(), k);
            let t0 = Instant::now();
            dirty(&self.mem, &pages, (c % 250) as u8 + 1);
            self.found.clear();
            self.wp
                .scan_written(start, end, true, false, &mut self.found)?;
            let mut i = 0;
            for r in &self.found {
                for p in 0..r.pages as usize {
                    let off = (r.start - start) as usize + p * PAGE_SIZE;
                    let slot = i % k;
                    self.mem
                        .read_into(off, &mut self.out[slot * PAGE_SIZE..(slot + 1) * PAGE_SIZE]);
                    i += 1;
                }
            }
            for r in &self.found {
                let off = (r.start - start) as usize;
                let len = r.pages as usize * PAGE_SIZE;
                self.mem.write_at(off, &self.base[off..off + len]);
            }
            self.wp
                .scan_written(start, end, true, true, &mut Vec::new())?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            check_base(&self.mem, &pages, "floor")?;
            let mut distinct = pages.clone();
            distinct.sort_unstable();
            distinct.dedup();
            if i != distinct.len() {
                return Err(crate::check_failed(format!(
                    "floor: the walk found {i} pages written, not {}",
                    distinct.len()
                )));
            }
        }
        Ok(t)
    }
}

/// (b): cycles per second for each variant and dirtied fraction.
pub fn cycles(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<(Vec<CycleRow>, String)> {
    let mem = distinct_heap(cfg.cycle_mib)?;
    let n = mem.pages();
    let mut rows = Vec::new();
    let mut s = Snapshots::new(&[mem.region()], SnapshotOptions::default())?;
    let backend = s.backend().name().to_string();
    let base = s.take()?;
    let mut rng = Rng::new(42);
    let mut shadow: Vec<u8> = Vec::new();
    for &pm in &cfg.cycle_permille {
        let k = (n * pm as usize / 1000).max(1);
        let mut point = Vec::new();
        // Page store: dirty, take, restore the base, drop.
        progress(&format!("(b) page store, {:.1} % dirty", pm as f64 / 10.0));
        let mut t = Vec::new();
        let mut ph: [Vec<f64>; 4] = Default::default();
        for c in 0..cfg.cycles {
            let pages = dirty_pages(&mut rng, n, k);
            let t0 = Instant::now();
            dirty(&mem, &pages, (c % 250) as u8 + 1);
            let t1 = Instant::now();
            let id = s.take()?;
            let t2 = Instant::now();
            s.restore(base)?;
            let t3 = Instant::now();
            s.drop_snapshot(id)?;
            let t4 = Instant::now();
            t.push((t4 - t0).as_secs_f64() * 1e3);
            for (v, (a, b)) in ph.iter_mut().zip([(t0, t1), (t1, t2), (t2, t3), (t3, t4)]) {
                v.push((b - a).as_secs_f64() * 1e3);
            }
            check_base(&mem, &pages, "page store")?;
        }
        let [mut w, mut tk, mut rs, mut dr] = ph;
        let phases = Phases {
            write_ms: median(&mut w),
            take_ms: median(&mut tk),
            restore_ms: median(&mut rs),
            drop_ms: median(&mut dr),
        };
        point.push(("page-store", t));
        // Restore only: the fuzzer's reset.
        progress(&format!(
            "(b) page store restore-only, {:.1} % dirty",
            pm as f64 / 10.0
        ));
        let mut t = Vec::new();
        for c in 0..cfg.cycles {
            let pages = dirty_pages(&mut rng, n, k);
            let t0 = Instant::now();
            dirty(&mem, &pages, (c % 250) as u8 + 1);
            s.restore(base)?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            check_base(&mem, &pages, "page store restore-only")?;
        }
        point.push(("page-store restore-only", t));
        // fork per cycle: the child dirties and exits.
        progress(&format!("(b) fork, {:.1} % dirty", pm as f64 / 10.0));
        let mut t = Vec::new();
        for c in 0..(cfg.cycles / 4).max(5) {
            let pages = dirty_pages(&mut rng, n, k);
            let t0 = Instant::now();
            // SAFETY: the child only writes bytes into memory it owns (its
            // copy of ours): no allocation, no lock.
            let status = unsafe {
                pagewise_sys::process::fork_and_wait(|| {
                    dirty(&mem, &pages, (c % 250) as u8 + 1);
                    0
                })
            }
            .map_err(|e| Error::os("fork", e))?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            if status != 0 {
                return Err(crate::check_failed(format!(
                    "forked child failed: {status}"
                )));
            }
            check_base(&mem, &pages, "fork")?;
        }
        point.push(("fork", t));
        // memcpy out and back.
        progress(&format!("(b) memcpy, {:.1} % dirty", pm as f64 / 10.0));
        let base_copy = mem.snapshot();
        let mut t = Vec::new();
        for c in 0..(cfg.cycles / 20).max(3) {
            let pages = dirty_pages(&mut rng, n, k);
            let t0 = Instant::now();
            dirty(&mem, &pages, (c % 250) as u8 + 1);
            shadow.resize(mem.len(), 0);
            mem.read_into(0, &mut shadow);
            FullCopy.restore(&mem, &base_copy)?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            check_base(&mem, &pages, "memcpy")?;
        }
        drop(base_copy);
        point.push(("memcpy", t));
        // Its memory made after the fork ran and dropped before the next
        // one: a fork copies the page tables of all this process holds.
        progress(&format!("(b) floor, {:.1} % dirty", pm as f64 / 10.0));
        let mut floor = Floor::new(cfg.cycle_mib)?;
        point.push(("floor", floor.cycles(&mut rng, k, cfg.cycles)?));
        drop(floor);
        // The page store's tracker saw the memcpy restores: resync it.
        s.restore(base)?;
        let fork_rate = point
            .iter_mut()
            .find(|(v, _)| *v == "fork")
            .map(|(_, t)| 1e3 / median(t))
            .unwrap_or(f64::NAN);
        for (variant, mut t) in point {
            let cycles = t.len() as u64;
            let ms = median(&mut t);
            rows.push(CycleRow {
                variant: variant.into(),
                permille: pm,
                pages_dirtied: k as u64,
                cycles,
                cycle_ms: ms,
                cycles_per_s: 1e3 / ms,
                ratio_to_fork: (1e3 / ms) / fork_rate,
                phases: (variant == "page-store").then_some(phases),
            });
        }
    }
    Ok((rows, backend))
}

/// Runs the experiments of `cfg.parts`: (a), (b) and (c).
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if cfg.parts.is_empty() || cfg.parts.chars().any(|c| !"abc".contains(c)) {
        return Err(crate::check_failed(format!(
            "parts {:?}: give any of a, b and c",
            cfg.parts
        )));
    }
    // (c) first: its target is forked from this process and inherits its
    // memory, which (a) and (b) would leave large.
    let dump = match cfg.parts.contains('c') {
        true => Some(super::dump::run(cfg.dump_heap_mib, progress)?),
        false => None,
    };
    let dfs = match cfg.parts.contains('a') {
        true => dfs(cfg, progress)?,
        false => Vec::new(),
    };
    let (cycles, backend) = match cfg.parts.contains('b') {
        true => cycles(cfg, progress)?,
        false => (Vec::new(), String::new()),
    };
    let ratio = |f: fn(&DfsRow) -> f64| match dfs.as_slice() {
        [full, store] => f(store) / f(full),
        _ => f64::NAN,
    };
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        backend,
        dfs_memory_ratio: ratio(|r| r.snapshot_mib),
        dfs_time_ratio: ratio(|r| r.seconds),
        dfs,
        cycles,
        dump,
    })
}

impl Report {
    /// (b) as a plot: cycles per second against the dirtied fraction.
    pub fn charts(&self) -> Vec<(String, super::svg::Chart)> {
        use super::svg::{Chart, Series};
        let mut variants: Vec<String> = Vec::new();
        for r in &self.cycles {
            if !variants.contains(&r.variant) {
                variants.push(r.variant.clone());
            }
        }
        let series = variants
            .iter()
            .map(|v| Series {
                label: v.clone(),
                points: self
                    .cycles
                    .iter()
                    .filter(|r| &r.variant == v)
                    .map(|r| (r.permille as f64 / 10.0, r.cycles_per_s))
                    .collect(),
            })
            .collect();
        vec![(
            "cycles.svg".into(),
            Chart {
                title: format!(
                    "(b) snapshot + restore cycles per second, {} MiB region",
                    self.config.cycle_mib
                ),
                x_label: "pages dirtied per cycle (%)".into(),
                y_label: "cycles per second".into(),
                log_x: false,
                log_y: true,
                series,
            },
        )]
    }

    /// A plain-text summary with the goals.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "machine: {}; page store tracker: {}",
            self.machine, self.backend
        );
        let c = &self.config;
        if !self.dfs.is_empty() {
            let _ = writeln!(
                s,
                "\n(a) depth-first search: {} MiB heap, depth {}, branching {}, {} pages written per step, {} visited states kept",
                c.dfs_heap_mib, c.dfs_depth, c.dfs_branching, c.dfs_pages_per_step, c.dfs_visited_cache
            );
            let _ = writeln!(
                s,
                "{:<12} {:>7} {:>9} {:>9} {:>14} {:>16}",
                "variant", "states", "restores", "time (s)", "peak RSS (MiB)", "snapshots (MiB)"
            );
            for r in &self.dfs {
                let _ = writeln!(
                    s,
                    "{:<12} {:>7} {:>9} {:>9.2} {:>14.1} {:>16.1}",
                    r.variant, r.states, r.restores, r.seconds, r.peak_rss_mib, r.snapshot_mib
                );
            }
            let _ = writeln!(
                s,
                "page store / full copies: snapshot memory {:.3}x ({:.1} % less; goal >= 80 % less), time {:.3}x (goal <= 1.15x)",
                self.dfs_memory_ratio,
                (1.0 - self.dfs_memory_ratio) * 100.0,
                self.dfs_time_ratio
            );
        }
        if !self.cycles.is_empty() {
            let _ = writeln!(s, "\n(b) cycles on a {} MiB region (median)", c.cycle_mib);
            let _ = writeln!(
                s,
                "{:<24} {:>7} {:>8} {:>7} {:>10} {:>10} {:>9}",
                "variant", "dirty %", "pages", "cycles", "cycle ms", "cycles/s", "x fork"
            );
            for r in &self.cycles {
                let _ = writeln!(
                    s,
                    "{:<24} {:>7.1} {:>8} {:>7} {:>10.3} {:>10.1} {:>9.2}",
                    r.variant,
                    r.permille as f64 / 10.0,
                    r.pages_dirtied,
                    r.cycles,
                    r.cycle_ms,
                    r.cycles_per_s,
                    r.ratio_to_fork
                );
            }
            for r in &self.cycles {
                if let Some(p) = r.phases {
                    let _ = writeln!(
                        s,
                        "page store at {:.1} %: write {:.3} ms + take {:.3} ms + restore {:.3} ms + drop {:.3} ms (medians)",
                        r.permille as f64 / 10.0,
                        p.write_ms,
                        p.take_ms,
                        p.restore_ms,
                        p.drop_ms
                    );
                }
            }
            // The goal is stated for 1 GiB.
            let goal = self
                .cycles
                .iter()
                .find(|r| r.variant == "page-store" && r.permille == 10);
            if let (Some(r), 1024) = (goal, c.cycle_mib) {
                let _ = writeln!(
                    s,
                    "goal at 1 %: cycle {:.3} ms (<= 5 ms: {}), {:.1}x fork (>= 10x: {})",
                    r.cycle_ms,
                    crate::met(r.cycle_ms <= 5.0),
                    r.ratio_to_fork,
                    crate::met(r.ratio_to_fork >= 10.0)
                );
                if let Some(f) = self
                    .cycles
                    .iter()
                    .find(|f| f.variant == "floor" && f.permille == 10)
                {
                    let _ = writeln!(
                        s,
                        "floor at 1 %, same run: {:.3} ms (the goal is {:.2}x the floor; the page store {:.2}x)",
                        f.cycle_ms,
                        5.0 / f.cycle_ms,
                        r.cycle_ms / f.cycle_ms
                    );
                }
            }
        }
        if let Some(d) = &self.dump {
            s += &d.summary();
        }
        s
    }
}
