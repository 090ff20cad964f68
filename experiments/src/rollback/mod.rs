//! Rollback of another process in place (`pagewise_snap::ProcessSnapshots`).
//!
//! (a) **Snapshot fuzzing / model-checking loop.** A target holding `MiB`
//! of initialised state (its own program, [`target`]) handles an input that
//! writes `k` pages, then is reset. Per reset: pagewise's rollback against
//! an AFL-style fork server (a parent holding the same state forks a child
//! per input and waits for it to exit) and against re-exec + reload (a new
//! process loading the state from a file, once per input), with base pages
//! and with THP. After every reset a sample of pages read through
//! `/proc/PID/mem` must equal the snapshot, and the target's answer to
//! each input must equal its answer the first time (and the fork server's
//! to the same input); all pages are compared at the end of each point.
//!
//! (b) **SimGrid's restore in another process.** Cycles of input (x % of
//! the pages written, with their write-protect faults), take and restore.

pub(crate) mod floor;
pub mod lazy;
pub mod redis;
pub mod target;

use crate::svg::{Chart, Series};
use crate::Machine;
use anyhow::{bail, Context, Result};
use pagewise_snap::{ProcessSnapshots, RestoreOptions, SnapId};
use serde::Serialize;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// The experiments' sizes.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// State sizes, MiB.
    pub sizes_mib: Vec<usize>,
    /// Pages written per input.
    pub ks: Vec<usize>,
    /// Resets per point.
    pub reps: usize,
    /// Runs with THP too.
    pub thp: bool,
    /// Re-exec + reload runs per point (at the largest size only).
    pub reload_reps: usize,
    /// (b): shares of the pages written per cycle, %.
    pub cycle_percents: Vec<f64>,
    /// (b): cycles per point.
    pub cycle_reps: usize,
    /// (c): Redis test resets.
    pub redis: redis::RedisConfig,
    /// (d): lazy restore from a store.
    pub lazy: lazy::LazyConfig,
    /// Which experiments: any of `a`, `b`, `c` and `d`.
    pub parts: String,
}

impl Config {
    /// A short run (64 and 256 MiB).
    pub fn quick() -> Self {
        Config {
            sizes_mib: vec![64, 256],
            ks: vec![16, 256, 4096],
            reps: 30,
            thp: false,
            reload_reps: 2,
            cycle_percents: vec![1.0],
            cycle_reps: 10,
            redis: redis::RedisConfig {
                keys: 20_000,
                ops: 2_000,
                reps: 5,
                slow_reps: 2,
                sample: 200,
            },
            lazy: lazy::LazyConfig {
                mibs: vec![64],
                reps: 3,
                touches: 1000,
                work: 1000,
            },
            parts: "abcd".into(),
        }
    }
    /// The experiment (64 MiB and 1 GiB, base pages and THP).
    pub fn full() -> Self {
        Config {
            sizes_mib: vec![64, 1024],
            ks: vec![16, 256, 4096],
            reps: 200,
            thp: true,
            reload_reps: 5,
            cycle_percents: vec![0.1, 1.0, 10.0],
            cycle_reps: 50,
            redis: redis::RedisConfig {
                keys: 1_000_000,
                ops: 10_000,
                reps: 20,
                slow_reps: 5,
                sample: 1000,
            },
            lazy: lazy::LazyConfig {
                mibs: vec![256, 1024, 4096],
                reps: 5,
                touches: 5000,
                work: 1000,
            },
            parts: "abcd".into(),
        }
    }
}

/// Median and spread of one measure, ms.
pub type Ms = crate::Spread;

/// One (a) point.
#[derive(Debug, Clone, Serialize)]
pub struct ResetRow {
    /// `rollback`, `fork server` or `re-exec + reload`.
    pub variant: String,
    /// State, MiB.
    pub mib: usize,
    /// THP (`MADV_HUGEPAGE` on the state).
    pub thp: bool,
    /// Pages written per input.
    pub k: usize,
    /// Resets measured.
    pub reps: usize,
    /// One reset (rollback: the restore; others: the cycle less the
    /// target's input, which they cannot separate: the cycle), ms.
    pub reset: Ms,
    /// One input and its reset, ms.
    pub cycle: Ms,
    /// Rollback: the median share of the reset spent finding written
    /// pages (the page-table walk), %.
    pub walk_share_pct: Option<f64>,
    /// Rollback: median phases of a reset, µs.
    pub phases: Option<pagewise_snap::RestorePhases>,
    /// Pages compared with the snapshot through `/proc/PID/mem`.
    pub pages_checked: u64,
}

/// One (b) point.
#[derive(Debug, Clone, Serialize)]
pub struct CycleRow {
    /// State, MiB.
    pub mib: usize,
    /// Pages written per cycle, %.
    pub percent: f64,
    /// Pages written per cycle.
    pub pages: usize,
    /// The input (the target's writes, with their write-protect faults).
    pub input: Ms,
    /// The take.
    pub take: Ms,
    /// The restore.
    pub restore: Ms,
    /// The whole cycle.
    pub cycle: Ms,
    /// A fork server's cycle on the same input.
    pub fork_cycle: Ms,
    /// Fork's cycle over ours (medians).
    pub x_fork: f64,
    /// The floor of the cycle's copies: `process_vm_readv` then
    /// `process_vm_writev` of the same pages in the target, in batches of
    /// 1024 (what a take and a restore must copy, and nothing else), ms.
    pub floor_vm: Ms,
    /// A plain copy of as many pages scattered over memory of the same
    /// size, out and back, in this process, ms.
    pub floor_copy: Ms,
    /// The cycle over `floor_vm` (medians).
    pub x_floor_vm: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// The git commit of the tool, if known.
    pub commit: Option<String>,
    /// The command line.
    pub command: String,
    /// Load average over the run's first minute, at its start and end.
    pub load: (f64, f64),
    /// The sizes.
    pub config: Config,
    /// (a).
    pub resets: Vec<ResetRow>,
    /// (b).
    pub cycles: Vec<CycleRow>,
    /// (c).
    pub redis: Vec<redis::RedisRow>,
    /// (d).
    pub lazy: Vec<lazy::LazyRow>,
}

/// A running target, ended when dropped.
pub(crate) struct Target {
    child: Child,
}

impl Target {
    pub(crate) fn start(mib: usize, thp: bool, mode: &[&str]) -> Result<Target> {
        let exe = std::env::current_exe().context("finding the benchmark's own program")?;
        let child = Command::new(exe)
            .arg("__rollback-target")
            .arg(mib.to_string())
            .arg(if thp { "thp" } else { "base" })
            .args(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the target")?;
        let mut t = Target { child };
        let ready = t.answer()?;
        if ready != target::READY {
            bail!("the target said {ready:#x} instead of ready");
        }
        Ok(t)
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn answer(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.child
            .stdout
            .as_mut()
            .expect("piped")
            .read_exact(&mut b)
            .context("reading the target's answer")?;
        Ok(u64::from_le_bytes(b))
    }

    /// Sends one input and waits for its answer.
    pub(crate) fn input(&mut self, k: usize, seed: u64) -> Result<u64> {
        let mut req = [0u8; 16];
        req[..8].copy_from_slice(&(k as u64).to_le_bytes());
        req[8..].copy_from_slice(&seed.to_le_bytes());
        let inp = self.child.stdin.as_mut().expect("piped");
        inp.write_all(&req).context("sending an input")?;
        inp.flush()?;
        self.answer()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Inputs cycle through this many seeds: each is answered more than once.
const SEEDS: u64 = 8;

/// Compares `pages` pages of snapshot `id` (every page when `None`)
/// with the target's memory, but for the threads' rseq areas; the number
/// compared.
pub(crate) fn check(
    h: &ProcessSnapshots,
    id: SnapId,
    pid: i32,
    sample: Option<(usize, u64)>,
) -> Result<u64> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let regions = h.regions(id)?;
    let ps = pagewise::PAGE_SIZE;
    let mut want = vec![0u8; ps];
    let mut have = vec![0u8; ps];
    let total: u64 = regions.iter().map(|r| r.pages()).sum();
    // The threads' rseq areas are the kernel's to write whenever they run.
    let rseq: Vec<(u64, u32)> = h.threads(id)?.iter().filter_map(|t| t.rseq).collect();
    let mut compare = |addr: u64| -> Result<()> {
        h.read(id, addr, &mut want)?;
        mem.read_exact_at(&mut have, addr)
            .with_context(|| format!("reading {addr:#x} of the target"))?;
        for &(a, n) in &rseq {
            if a >= addr && a + n as u64 <= addr + ps as u64 {
                let o = (a - addr) as usize;
                have[o..o + n as usize].copy_from_slice(&want[o..o + n as usize]);
            }
        }
        if want != have {
            let diff: Vec<usize> = (0..ps).filter(|&i| want[i] != have[i]).collect();
            bail!(
                "page {addr:#x} of the target differs from the snapshot after a reset: {} bytes from +{:#x}",
                diff.len(),
                diff[0]
            );
        }
        Ok(())
    };
    let page_at = |mut i: u64| -> u64 {
        for r in &regions {
            if i < r.pages() {
                return r.start + i * ps as u64;
            }
            i -= r.pages();
        }
        unreachable!("index below the total")
    };
    match sample {
        Some((n, seed)) => {
            let mut rng = pagewise_mech::workload::Rng::new(seed);
            for _ in 0..n {
                compare(page_at(rng.below(total)))?;
            }
            Ok(n as u64)
        }
        None => {
            for i in 0..total {
                compare(page_at(i))?;
            }
            Ok(total)
        }
    }
}

/// (a) for one size and page kind: rollback and the fork server at every
/// `k`; re-exec + reload where asked.
fn resets(
    cfg: &Config,
    mib: usize,
    thp: bool,
    reload: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<ResetRow>> {
    let mut rows = Vec::new();
    let mut t = Target::start(mib, thp, &["serve"])?;
    let pid = t.pid();
    let mut h = ProcessSnapshots::open(pid)?;
    let id = h.take()?;
    let mut fork = Target::start(mib, thp, &["fork"])?;
    for &k in &cfg.ks {
        progress(&format!(
            "(a) {mib} MiB{} k={k}: rollback",
            if thp { " THP" } else { "" }
        ));
        let mut first: Vec<Option<u64>> = vec![None; SEEDS as usize];
        let (mut reset, mut cycle, mut walk_share) = (Vec::new(), Vec::new(), Vec::new());
        let mut phases = Vec::new();
        let mut checked = 0;
        for rep in 0..cfg.reps {
            let seed = rep as u64 % SEEDS;
            let t0 = Instant::now();
            let a = t.input(k, seed)?;
            let t1 = Instant::now();
            let r = h.restore(id, RestoreOptions::default())?;
            let t2 = Instant::now();
            match first[seed as usize] {
                None => first[seed as usize] = Some(a),
                Some(f) if f != a => {
                    bail!("input {seed} answered {a:#x} after a reset, {f:#x} before")
                }
                Some(_) => {}
            }
            let reset_ms = (t2 - t1).as_secs_f64() * 1e3;
            reset.push(reset_ms);
            cycle.push((t2 - t0).as_secs_f64() * 1e3);
            walk_share.push(r.phases.walk_us / 1e3 / reset_ms * 100.0);
            phases.push(r.phases);
            checked += check(&h, id, pid, Some((8, rep as u64)))?;
        }
        checked += check(&h, id, pid, None)?;
        let ph = median_phases(&phases);
        rows.push(ResetRow {
            variant: "rollback".into(),
            mib,
            thp,
            k,
            reps: cfg.reps,
            reset: Ms::of(reset),
            cycle: Ms::of(cycle),
            walk_share_pct: Some(crate::median(&mut walk_share)),
            phases: Some(ph),
            pages_checked: checked,
        });
        progress(&format!(
            "(a) {mib} MiB{} k={k}: fork server",
            if thp { " THP" } else { "" }
        ));
        let mut cycle = Vec::new();
        for rep in 0..cfg.reps {
            let seed = rep as u64 % SEEDS;
            let t0 = Instant::now();
            let a = fork.input(k, seed)?;
            cycle.push(t0.elapsed().as_secs_f64() * 1e3);
            if Some(a) != first[seed as usize] {
                bail!(
                    "the fork server answered input {seed} otherwise than the rolled-back target"
                );
            }
        }
        let c = Ms::of(cycle);
        rows.push(ResetRow {
            variant: "fork server".into(),
            mib,
            thp,
            k,
            reps: cfg.reps,
            reset: c,
            cycle: c,
            walk_share_pct: None,
            phases: None,
            pages_checked: 0,
        });
        if reload {
            progress(&format!("(a) {mib} MiB k={k}: re-exec + reload"));
            rows.push(reexec(cfg, mib, thp, k, &first)?);
        }
    }
    Ok(rows)
}

/// Re-exec + reload: a new target per input, loading its state from a
/// file (in the page cache after the first).
fn reexec(
    cfg: &Config,
    mib: usize,
    thp: bool,
    k: usize,
    first: &[Option<u64>],
) -> Result<ResetRow> {
    let dir = std::env::temp_dir().join(format!("pagewise-rollback-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("state-{mib}"));
    if !file.exists() {
        let mut v = vec![0u8; mib << 20];
        target::fill(&mut v);
        std::fs::write(&file, &v)?;
    }
    let mut cycle = Vec::new();
    for rep in 0..cfg.reload_reps {
        let seed = rep as u64 % SEEDS;
        let t0 = Instant::now();
        let mut t = Target::start(mib, thp, &["reload", file.to_str().unwrap_or_default()])?;
        let a = t.input(k, seed)?;
        let _ = t.child.wait();
        cycle.push(t0.elapsed().as_secs_f64() * 1e3);
        if first[seed as usize].is_some_and(|f| f != a) {
            bail!("the reloaded target answered input {seed} otherwise");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let c = Ms::of(cycle);
    Ok(ResetRow {
        variant: "re-exec + reload".into(),
        mib,
        thp,
        k,
        reps: cfg.reload_reps,
        reset: c,
        cycle: c,
        walk_share_pct: None,
        phases: None,
        pages_checked: 0,
    })
}

/// (b) for one size: input, take and restore per cycle, and the fork
/// server's cycle on the same inputs.
fn cycles(cfg: &Config, mib: usize, progress: &mut dyn FnMut(&str)) -> Result<Vec<CycleRow>> {
    let mut rows = Vec::new();
    let pages = (mib << 20) / pagewise::PAGE_SIZE;
    let mut t = Target::start(mib, false, &["serve"])?;
    let mut fork = Target::start(mib, false, &["fork"])?;
    let mut h = ProcessSnapshots::open(t.pid())?;
    let base = h.take()?;
    for &pct in &cfg.cycle_percents {
        progress(&format!("(b) {mib} MiB, {pct} % written per cycle"));
        let k = ((pages as f64 * pct / 100.0).round() as usize).max(1);
        let (mut input, mut take, mut restore, mut cycle, mut fcycle) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rep in 0..cfg.cycle_reps {
            let seed = rep as u64 % SEEDS;
            let t0 = Instant::now();
            t.input(k, seed)?;
            let t1 = Instant::now();
            let s = h.take()?;
            let t2 = Instant::now();
            h.restore(base, RestoreOptions::default())?;
            let t3 = Instant::now();
            h.drop_snapshot(s)?;
            input.push((t1 - t0).as_secs_f64() * 1e3);
            take.push((t2 - t1).as_secs_f64() * 1e3);
            restore.push((t3 - t2).as_secs_f64() * 1e3);
            cycle.push((t3 - t0).as_secs_f64() * 1e3);
            let f0 = Instant::now();
            fork.input(k, seed)?;
            fcycle.push(f0.elapsed().as_secs_f64() * 1e3);
        }
        check(&h, base, t.pid(), None)?;
        progress(&format!("(b) {mib} MiB, {pct} %: the floor of the copies"));
        let (floor_vm, floor_copy) = floor::cycle(t.pid(), mib, k, cfg.cycle_reps)?;
        let (cycle, fork_cycle) = (Ms::of(cycle), Ms::of(fcycle));
        rows.push(CycleRow {
            mib,
            percent: pct,
            pages: k,
            input: Ms::of(input),
            take: Ms::of(take),
            restore: Ms::of(restore),
            x_fork: fork_cycle.median / cycle.median,
            x_floor_vm: cycle.median / floor_vm.median,
            cycle,
            fork_cycle,
            floor_vm,
            floor_copy,
        });
    }
    Ok(rows)
}

/// Runs the experiments.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let load0 = crate::provenance::load();
    let mut resets_rows = Vec::new();
    let mut cycle_rows = Vec::new();
    if cfg.parts.contains('a') {
        let largest = cfg.sizes_mib.iter().copied().max().unwrap_or(0);
        for &mib in &cfg.sizes_mib {
            resets_rows.extend(resets(cfg, mib, false, mib == largest, progress)?);
            if cfg.thp {
                resets_rows.extend(resets(cfg, mib, true, false, progress)?);
            }
        }
    }
    if cfg.parts.contains('b') {
        let largest = cfg.sizes_mib.iter().copied().max().unwrap_or(64);
        cycle_rows.extend(cycles(cfg, largest, progress)?);
    }
    let redis_rows = if cfg.parts.contains('c') {
        redis::run(&cfg.redis, progress)?
    } else {
        Vec::new()
    };
    let lazy_rows = if cfg.parts.contains('d') {
        lazy::run(&cfg.lazy, progress)?
    } else {
        Vec::new()
    };
    Ok(Report {
        machine: Machine::this(),
        commit: option_env!("PAGEWISE_COMMIT")
            .map(str::to_string)
            .or_else(crate::provenance::commit),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        load: (load0, crate::provenance::load()),
        config: cfg.clone(),
        resets: resets_rows,
        cycles: cycle_rows,
        redis: redis_rows,
        lazy: lazy_rows,
    })
}

impl Report {
    /// The tables, as text.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "machine: {}; commit {}; load {:.2} -> {:.2}\ncommand: {}",
            self.machine,
            self.commit.as_deref().unwrap_or("unknown"),
            self.load.0,
            self.load.1,
            self.command
        );
        if !self.resets.is_empty() {
            let _ = writeln!(
                s,
                "\n(a) resets: median [min..max] ms; x = fork server's reset over rollback's"
            );
            let _ = writeln!(
                s,
                "{:<18} {:>5} {:>4} {:>5} {:>26} {:>26} {:>7} {:>8}",
                "variant", "MiB", "THP", "k", "reset ms", "cycle ms", "walk %", "x"
            );
            for r in &self.resets {
                let fork = self.resets.iter().find(|f| {
                    f.variant == "fork server" && f.mib == r.mib && f.thp == r.thp && f.k == r.k
                });
                let x = match (r.variant.as_str(), fork) {
                    ("rollback", Some(f)) => format!("{:.1}", f.reset.median / r.reset.median),
                    _ => "-".into(),
                };
                let _ = writeln!(
                    s,
                    "{:<18} {:>5} {:>4} {:>5} {:>26} {:>26} {:>7} {:>8}",
                    r.variant,
                    r.mib,
                    if r.thp { "yes" } else { "no" },
                    r.k,
                    fmt_ms(&r.reset),
                    fmt_ms(&r.cycle),
                    r.walk_share_pct
                        .map(|w| format!("{w:.0}"))
                        .unwrap_or("-".into()),
                    x
                );
            }
        }
        if !self.cycles.is_empty() {
            let _ = writeln!(
                s,
                "\n(b) take + restore cycles in another process: median [min..max] ms"
            );
            let _ = writeln!(
                s,
                "{:>5} {:>6} {:>7} {:>22} {:>22} {:>22} {:>22} {:>22} {:>7} {:>22} {:>22} {:>7}",
                "MiB",
                "%",
                "pages",
                "input",
                "take",
                "restore",
                "cycle",
                "fork cycle",
                "x fork",
                "floor readv+writev",
                "floor memcpy",
                "x floor"
            );
            for r in &self.cycles {
                let _ = writeln!(
                    s,
                    "{:>5} {:>6} {:>7} {:>22} {:>22} {:>22} {:>22} {:>22} {:>7.1} {:>22} {:>22} {:>7.1}",
                    r.mib,
                    r.percent,
                    r.pages,
                    fmt_ms(&r.input),
                    fmt_ms(&r.take),
                    fmt_ms(&r.restore),
                    fmt_ms(&r.cycle),
                    fmt_ms(&r.fork_cycle),
                    r.x_fork,
                    fmt_ms(&r.floor_vm),
                    fmt_ms(&r.floor_copy),
                    r.x_floor_vm
                );
            }
            // The goal is stated for 1 GiB.
            let goal = self
                .cycles
                .iter()
                .find(|r| r.percent == 1.0 && r.mib == 1024);
            if let Some(r) = goal {
                // Any take and restore pays the target's writes (its input)
                // and the copies at the least.
                let floor = r.input.median + r.floor_vm.median;
                let _ = writeln!(
                    s,
                    "goal at 1 % of {} MiB: cycle {:.3} ms (<= 8 ms: {}), {:.2}x fork (>= 2.5x: {}); \
                     floor, same run: input {:.3} + readv+writev {:.3} = {:.3} ms (the goal is {:.2}x the floor, the cycle {:.2}x)",
                    r.mib,
                    r.cycle.median,
                    crate::met(r.cycle.median <= 8.0),
                    r.x_fork,
                    crate::met(r.x_fork >= 2.5),
                    r.input.median,
                    r.floor_vm.median,
                    floor,
                    8.0 / floor,
                    r.cycle.median / floor
                );
            }
        }
        redis::summary(&mut s, &self.redis);
        if !self.lazy.is_empty() {
            lazy::summary(&mut s, &self.lazy);
        }
        s
    }

    /// Reset time against k, per variant and size.
    pub fn charts(&self) -> Vec<(String, Chart)> {
        let mut series: Vec<Series> = Vec::new();
        for r in &self.resets {
            let label = format!(
                "{} {} MiB{}",
                r.variant,
                r.mib,
                if r.thp { " THP" } else { "" }
            );
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.points.push((r.k as f64, r.reset.median)),
                None => series.push(Series {
                    label,
                    points: vec![(r.k as f64, r.reset.median)],
                }),
            }
        }
        series.retain(|s| !s.label.starts_with("re-exec"));
        let mut charts: Vec<(String, Chart)> = lazy::chart(&self.lazy).into_iter().collect();
        if series.is_empty() {
            return charts;
        }
        charts.push((
            "resets.svg".into(),
            Chart {
                title: "Reset after an input writing k pages (median)".into(),
                x_label: "pages written per input (k)".into(),
                y_label: "reset (ms)".into(),
                log_x: true,
                log_y: true,
                series,
            },
        ));
        charts
    }
}

/// The median of every phase over `phases`.
fn median_phases(phases: &[pagewise_snap::RestorePhases]) -> pagewise_snap::RestorePhases {
    let mid = |f: fn(&pagewise_snap::RestorePhases) -> f64| -> f64 {
        crate::median(&mut phases.iter().map(f).collect::<Vec<_>>())
    };
    let mut ph = pagewise_snap::RestorePhases::default();
    ph.stop_us = mid(|p| p.stop_us);
    ph.layout_us = mid(|p| p.layout_us);
    ph.threads_us = mid(|p| p.threads_us);
    ph.walk_us = mid(|p| p.walk_us);
    ph.copy_us = mid(|p| p.copy_us);
    ph.resume_us = mid(|p| p.resume_us);
    ph
}

fn fmt_ms(m: &Ms) -> String {
    format!("{:.3} [{:.3}..{:.3}]", m.median, m.min, m.max)
}
