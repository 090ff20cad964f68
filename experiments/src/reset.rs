//! Resets at fuzzing speed (`pagewise_snap::ResetSession`).
//!
//! A target holding `MiB` of initialised state (the rollback experiments'
//! own program, [`crate::rollback::target`]) handles an input that writes
//! `k` pages, then is reset. Per point, in one run: a reset session (the
//! process held for the whole run), a one-shot restore of the same
//! snapshot (`ProcessSnapshots::restore`: stopped, put back, let go), and
//! an AFL-style fork server (a parent holding the same state forks a child
//! per input and waits for it). Resets: median, 99th percentile, lowest
//! and highest; resets a second at the median.
//!
//! Each point runs in two placements, every variant alike: as the
//! scheduler places the processes (`spread`), and with the benchmark and
//! its targets held to one CPU (`one CPU`, the targets inherit it). The
//! machine's floor is measured beside them: a one-byte round trip over two
//! pipes between two processes held to two CPUs, and to one, the child
//! idle for 300 µs before each (on a VM an
//! idle CPU woken by another costs tens of microseconds; every reset wakes
//! the target twice).
//!
//! The reset made inside the program (`inside`, [`crate::reset_inside`])
//! runs beside them on a target of its own that checks itself; its
//! figures are the shim's histogram of resets, and the goals are stated
//! on it.
//!
//! Checked: every answer of a reset target equals its first answer to the
//! same input and the fork server's; after every reset a sample of pages
//! read through `/proc/PID/mem` equals the snapshot; every page at the end
//! of a point; a session's reset that took the whole path is counted (none
//! is expected: the layout and descriptors do not change).

use crate::rollback::{check, Target};
use crate::svg::{Chart, Series};
use anyhow::{bail, Result};
use pagewise_snap::{ProcessSnapshots, ResetPhases, ResetSession, RestoreOptions};
use serde::Serialize;
use std::time::Instant;

/// The experiment's sizes.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// State sizes, MiB.
    pub sizes_mib: Vec<usize>,
    /// Pages written per input.
    pub ks: Vec<usize>,
    /// Resets per point and variant.
    pub reps: usize,
}

impl Config {
    /// A smoke run (64 MiB, 16 pages).
    pub fn quick() -> Self {
        Config {
            sizes_mib: vec![64],
            ks: vec![16],
            reps: 200,
        }
    }

    /// The experiment: 64 MiB and 1 GiB, 16 and 64 pages.
    pub fn full() -> Self {
        Config {
            sizes_mib: vec![64, 1024],
            ks: vec![16, 64],
            reps: 2000,
        }
    }
}

/// A distribution, microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Dist {
    /// Median.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Lowest.
    pub min: f64,
    /// Highest.
    pub max: f64,
}

impl Dist {
    pub(crate) fn of(mut v: Vec<f64>) -> Dist {
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Dist {
            median: crate::median(&mut v.clone()),
            p99: at(0.99),
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

/// One point of one variant.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `session`, `restore` or `fork server`.
    pub variant: String,
    /// `spread` or `one CPU`.
    pub placement: String,
    /// State, MiB.
    pub mib: usize,
    /// Pages written per input.
    pub k: usize,
    /// Resets measured.
    pub reps: usize,
    /// One reset (the fork server: its whole cycle, which it cannot
    /// separate), µs.
    pub reset_us: Dist,
    /// One input and its reset, µs.
    pub cycle_us: Dist,
    /// Resets a second at the median reset.
    pub resets_per_s: f64,
    /// Session: median phases, µs.
    pub phases: Option<ResetPhases>,
    /// Session: resets that took the whole path of a restore.
    pub full_resets: u64,
    /// Pages compared with the snapshot (through `/proc/PID/mem`; inside:
    /// by the target itself, against its pattern).
    pub pages_checked: u64,
    /// Inside: from the control word to the pid told, as a fuzzer waits
    /// for a reset, µs.
    pub asked_us: Option<Dist>,
    /// Inside: the state collapsed into huge pages at the point, MiB.
    pub collapsed_mib: Option<f64>,
    /// Inside: how long the point took at start-up, and the collapse's
    /// part of it, ms.
    pub point_ms: Option<(f64, f64)>,
}

/// Everything one run measured (its provenance is added as it is
/// written: [`crate::report::Output`]).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The sizes.
    pub config: Config,
    /// Every point.
    pub rows: Vec<Row>,
    /// The machine's floor: a pipe round trip between two processes on two
    /// CPUs and on one, µs.
    pub round_trip: Vec<(String, Dist)>,
    /// How a reset finds the pages written, three ways
    /// ([`crate::reset_walk`]).
    pub walk: Vec<crate::reset_walk::WalkRow>,
    /// The kernel's floor of a reset inside the program, per size
    /// (`experiments/c/afl_floor.c`).
    pub floors: Vec<Floor>,
}

/// The floor of a reset made inside the program of `mib` MiB writing `k`
/// pages: one `PAGEMAP_SCAN` of the state, the `k` pages protected again
/// one by one and copied back (medians, µs; the program's faults and the
/// traps are its run's, not the reset's).
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// State, MiB.
    pub mib: usize,
    /// Pages written.
    pub k: usize,
    /// The walk.
    pub walk_us: f64,
    /// Protecting again.
    pub protect_us: f64,
    /// Copying back.
    pub copy_us: f64,
    /// Their sum.
    pub reset_us: f64,
}

fn floor(work: &std::path::Path, mib: usize, k: usize) -> Result<Floor> {
    let v = crate::afl::measure_floor(mib, k, work)?;
    let f = |key: &str| {
        v[key]
            .as_f64()
            .ok_or_else(|| anyhow::anyhow!("afl_floor gave no {key}: {v}"))
    };
    let (walk_us, protect_us, copy_us) = (f("walk_us")?, f("protect_us")?, f("copy_us")?);
    Ok(Floor {
        mib,
        k,
        walk_us,
        protect_us,
        copy_us,
        reset_us: walk_us + protect_us + copy_us,
    })
}

/// Inputs cycle through this many seeds: each is answered more than once.
const SEEDS: u64 = 8;

fn us(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Answers to the seeds, the first time each was asked.
type Firsts = Vec<Option<u64>>;

fn same_answer(first: &mut Firsts, seed: u64, a: u64, who: &str) -> Result<()> {
    match first[seed as usize] {
        None => first[seed as usize] = Some(a),
        Some(f) if f != a => bail!("{who}: input {seed} answered {a:#x}, {f:#x} the first time"),
        Some(_) => {}
    }
    Ok(())
}

fn row(variant: &str, mib: usize, k: usize, reset: Vec<f64>, cycle: Vec<f64>) -> Row {
    let reset_us = Dist::of(reset);
    Row {
        variant: variant.into(),
        placement: String::new(),
        mib,
        k,
        reps: cycle.len(),
        reset_us,
        cycle_us: Dist::of(cycle),
        resets_per_s: 1e6 / reset_us.median,
        phases: None,
        full_resets: 0,
        pages_checked: 0,
        asked_us: None,
        collapsed_mib: None,
        point_ms: None,
    }
}

/// The session at one point.
fn session(cfg: &Config, mib: usize, k: usize, first: &mut Firsts) -> Result<Row> {
    let mut t = Target::start(mib, false, &["serve"])?;
    let pid = t.pid();
    let mut s = ResetSession::open(pid)?;
    let (mut reset, mut cycle, mut phases) = (Vec::new(), Vec::new(), Vec::new());
    let (mut full, mut checked) = (0, 0);
    for rep in 0..cfg.reps {
        let seed = rep as u64 % SEEDS;
        let t0 = Instant::now();
        let a = t.input(k, seed)?;
        let t1 = Instant::now();
        let r = s.reset()?;
        let t2 = Instant::now();
        same_answer(first, seed, a, "session")?;
        if r.full.is_some() {
            full += 1;
        }
        reset.push(us(t2 - t1));
        cycle.push(us(t2 - t0));
        phases.push(r.phases);
        // Not every reset: reading pages through /proc/PID/mem faults the
        // target's page tables in and out of the measured path.
        if rep % 16 == 0 {
            checked += check(s.snapshots(), s.point(), pid, Some((8, rep as u64)))?;
        }
    }
    checked += check(s.snapshots(), s.point(), pid, None)?;
    let mut r = row("session", mib, k, reset, cycle);
    r.phases = Some(median_phases(&phases));
    r.full_resets = full;
    r.pages_checked = checked;
    Ok(r)
}

/// A one-shot restore of the same snapshot at one point.
fn restore(cfg: &Config, mib: usize, k: usize, first: &mut Firsts) -> Result<Row> {
    let mut t = Target::start(mib, false, &["serve"])?;
    let pid = t.pid();
    let mut h = ProcessSnapshots::open(pid)?;
    let id = h.take()?;
    let (mut reset, mut cycle) = (Vec::new(), Vec::new());
    for rep in 0..cfg.reps {
        let seed = rep as u64 % SEEDS;
        let t0 = Instant::now();
        let a = t.input(k, seed)?;
        let t1 = Instant::now();
        h.restore(id, RestoreOptions::default())?;
        let t2 = Instant::now();
        same_answer(first, seed, a, "restore")?;
        reset.push(us(t2 - t1));
        cycle.push(us(t2 - t0));
    }
    let mut r = row("restore", mib, k, reset, cycle);
    r.pages_checked = check(&h, id, pid, None)?;
    Ok(r)
}

/// The fork server at one point.
fn fork(cfg: &Config, mib: usize, k: usize, first: &mut Firsts) -> Result<Row> {
    let mut t = Target::start(mib, false, &["fork"])?;
    let mut cycle = Vec::new();
    for rep in 0..cfg.reps {
        let seed = rep as u64 % SEEDS;
        let t0 = Instant::now();
        let a = t.input(k, seed)?;
        cycle.push(us(t0.elapsed()));
        same_answer(first, seed, a, "fork server")?;
    }
    Ok(row("fork server", mib, k, cycle.clone(), cycle))
}

fn median_phases(phases: &[ResetPhases]) -> ResetPhases {
    let mid = |f: fn(&ResetPhases) -> f64| -> f64 {
        crate::median(&mut phases.iter().map(f).collect::<Vec<_>>())
    };
    let mut ph = ResetPhases::default();
    ph.stop_us = mid(|p| p.stop_us);
    ph.check_us = mid(|p| p.check_us);
    ph.threads_us = mid(|p| p.threads_us);
    ph.walk_us = mid(|p| p.walk_us);
    ph.copy_us = mid(|p| p.copy_us);
    ph.resume_us = mid(|p| p.resume_us);
    ph
}

/// Runs the experiment.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let work =
        std::env::temp_dir().join(format!("pagewise-bench-reset-bin-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let r = run_with(cfg, &work, progress);
    let _ = std::fs::remove_dir_all(&work);
    r
}

fn run_with(
    cfg: &Config,
    work: &std::path::Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    let target = crate::reset_inside::build(work)?;
    let mut floors = Vec::new();
    for &mib in &cfg.sizes_mib {
        progress(&format!("{mib} MiB: the floor of a reset inside"));
        floors.push(floor(work, mib, cfg.ks[0])?);
    }
    let mut rows = Vec::new();
    let round_trip = vec![
        ("two CPUs".to_string(), pipe_round_trip(cfg.reps, false)?),
        ("one CPU".to_string(), pipe_round_trip(cfg.reps, true)?),
    ];
    for placement in ["spread", "one CPU"] {
        let _pinned = match placement {
            "one CPU" => Some(crate::rollback::lazy::Pinned::to_this_cpu()?),
            _ => None,
        };
        for &mib in &cfg.sizes_mib {
            for &k in &cfg.ks {
                let mut first: Firsts = vec![None; SEEDS as usize];
                let at = format!("{mib} MiB k={k} ({placement})");
                progress(&format!("{at}: session"));
                let mut point = vec![session(cfg, mib, k, &mut first)?];
                progress(&format!("{at}: inside"));
                point.push(crate::reset_inside::inside(&target, cfg.reps, mib, k)?);
                progress(&format!("{at}: restore"));
                point.push(restore(cfg, mib, k, &mut first)?);
                progress(&format!("{at}: fork server"));
                point.push(fork(cfg, mib, k, &mut first)?);
                for mut r in point {
                    r.placement = placement.into();
                    rows.push(r);
                }
            }
        }
    }
    let mut walk = Vec::new();
    for &mib in &cfg.sizes_mib {
        progress(&format!("{mib} MiB: finding the pages written"));
        walk.push(crate::reset_walk::walk(mib, cfg.ks[0], cfg.reps)?);
    }
    Ok(Report {
        config: cfg.clone(),
        rows,
        round_trip,
        walk,
        floors,
    })
}

/// A one-byte round trip over two pipes between this thread and a child
/// (`cat`) idle for 300 µs before each, `n` times, µs: with the child held
/// to another CPU than this thread's (`two CPUs`) or to the same one (`one
/// CPU`).
fn pipe_round_trip(n: usize, same_cpu: bool) -> Result<Dist> {
    use std::io::{Read, Write};
    let _here = crate::rollback::lazy::Pinned::to_this_cpu()?;
    // SAFETY: no argument; returns the CPU or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as i32;
    let there = if same_cpu || cpus < 2 {
        cpu
    } else {
        (cpu + 1) % cpus
    };
    let mut child = std::process::Command::new("taskset")
        .args(["-c", &there.to_string(), "cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let (mut to, mut from) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
    );
    let mut v = Vec::with_capacity(n);
    let mut b = [0u8; 1];
    for i in 0..n.max(10) + 10 {
        // The child idle for a while first, as a target is between resets
        // (this thread busy meanwhile, as a caller is).
        let idle = Instant::now();
        while idle.elapsed() < std::time::Duration::from_micros(300) {
            std::hint::spin_loop();
        }
        let t = Instant::now();
        to.write_all(b"x")?;
        from.read_exact(&mut b)?;
        // The first few while the child starts.
        if i >= 10 {
            v.push(us(t.elapsed()));
        }
    }
    drop(to);
    child.wait()?;
    Ok(Dist::of(v))
}

impl Report {
    /// The table, as text.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "resets, µs: median p99 [min..max]; x fork = the fork server's median over this one's"
        );
        let _ = writeln!(
            s,
            "{:<12} {:<8} {:>5} {:>4} {:>8} {:>8} {:>21} {:>9} {:>7}  phases µs (stop check threads walk copy resume)",
            "variant", "placed", "MiB", "k", "median", "p99", "[min..max]", "resets/s", "x fork"
        );
        for r in &self.rows {
            let fork = self.rows.iter().find(|f| {
                f.variant == "fork server"
                    && f.placement == r.placement
                    && f.mib == r.mib
                    && f.k == r.k
            });
            let x = match fork {
                Some(f) if r.variant != "fork server" => {
                    format!("{:.1}", f.reset_us.median / r.reset_us.median)
                }
                _ => "-".into(),
            };
            let ph = match (r.phases, r.asked_us) {
                (Some(p), Some(a)) => format!(
                    "  walk {:.0} copy {:.0} (means); asked {:.1} p99 {:.1}; {:.0} MiB huge at the point ({:.1} ms of {:.1})",
                    p.walk_us,
                    p.copy_us,
                    a.median,
                    a.p99,
                    r.collapsed_mib.unwrap_or(0.0),
                    r.point_ms.map_or(0.0, |p| p.1),
                    r.point_ms.map_or(0.0, |p| p.0),
                ),
                (Some(p), None) => format!(
                    "  {:.0} {:.0} {:.0} {:.0} {:.0} {:.0}",
                    p.stop_us, p.check_us, p.threads_us, p.walk_us, p.copy_us, p.resume_us
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "{:<12} {:<8} {:>5} {:>4} {:>8.1} {:>8.1} {:>21} {:>9.0} {:>7}{ph}",
                r.variant,
                r.placement,
                r.mib,
                r.k,
                r.reset_us.median,
                r.reset_us.p99,
                format!("[{:.1}..{:.1}]", r.reset_us.min, r.reset_us.max),
                r.resets_per_s,
                x
            );
        }
        s += &self.goals();
        let _ = writeln!(
            s,
            "\nfinding the pages written, µs: median p99; sync = the input's time over async's"
        );
        for w in &self.walk {
            let _ = writeln!(
                s,
                "{:>5} MiB k={:<3} whole range {:.1} p99 {:.1}; written ranges only {:.1} p99 {:.1}; input async {:.1}, sync {:.1} (+{:.1})",
                w.mib,
                w.k,
                w.whole_range.median,
                w.whole_range.p99,
                w.written_only.median,
                w.written_only.p99,
                w.input_async.median,
                w.input_sync.median,
                w.sync_extra_us
            );
            match (&w.huge, &w.huge_skipped) {
                (Some(h), _) => {
                    let _ = writeln!(
                        s,
                        "{:>5} MiB in huge pages: whole range {:.1} p99 {:.1} (the same pages every input; {} MiB still huge), {:.1} p99 {:.1} (other pages; {} MiB still huge)",
                        w.mib,
                        h.hot.median,
                        h.hot.p99,
                        h.huge_left_mib.0,
                        h.scattered.median,
                        h.scattered.p99,
                        h.huge_left_mib.1
                    );
                }
                (None, why) => {
                    let _ = writeln!(
                        s,
                        "{:>5} MiB in huge pages: not measured ({})",
                        w.mib,
                        why.as_deref().unwrap_or("no reason")
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            "\nthe machine's floor: a pipe round trip between two processes, µs"
        );
        for (placement, d) in &self.round_trip {
            let _ = writeln!(
                s,
                "{placement:<8} median {:.1} p99 {:.1} [{:.1}..{:.1}]",
                d.median, d.p99, d.min, d.max
            );
        }
        s
    }

    /// The reset goals, each with its figure and whether it is
    /// met (the reset made inside the program), beside the floor of a
    /// reset of the same state in base pages measured in the same run
    /// (the state collapsed into huge pages at the point walks less).
    fn goals(&self) -> String {
        use std::fmt::Write;
        let mut s = String::from("\ngoals (a reset writing 16 pages; inside the program):\n");
        let find = |placement: &str, mib: usize| {
            self.rows.iter().find(|r| {
                r.variant == "inside" && r.placement == placement && r.mib == mib && r.k == 16
            })
        };
        let floor = |mib: usize| self.floors.iter().find(|f| f.mib == mib && f.k == 16);
        let mut line = |what: &str,
                        figure: Option<(f64, &Dist)>,
                        goal: f64,
                        floor: Option<&Floor>| {
            let _ = match figure {
                Some((x, d)) => {
                    let met = crate::met(x <= goal);
                    let floor = floor
                        .map(|f| {
                            format!(
                                "; floor in base pages {:.1} µs (one walk {:.1}, protect {:.1}, copy {:.1}: afl_floor), the goal x{:.2} of it",
                                f.reset_us,
                                f.walk_us,
                                f.protect_us,
                                f.copy_us,
                                goal / f.reset_us
                            )
                        })
                        .unwrap_or_default();
                    writeln!(
                        s,
                        "  {what:<34} {x:>7.1} µs [{:.1}..{:.1}], goal <= {goal}: {met} (x{:.2} of the goal){floor}",
                        d.min,
                        d.max,
                        x / goal
                    )
                }
                None => writeln!(s, "  {what:<34} not measured in this run"),
            };
        };
        let one64 = find("one CPU", 64);
        line(
            "64 MiB, one CPU, median",
            one64.map(|r| (r.reset_us.median, &r.reset_us)),
            30.0,
            floor(64),
        );
        line(
            "64 MiB, one CPU, 99th percentile",
            one64.map(|r| (r.reset_us.p99, &r.reset_us)),
            60.0,
            None,
        );
        let spread64 = find("spread", 64);
        line(
            "64 MiB, spread, median",
            spread64.map(|r| (r.reset_us.median, &r.reset_us)),
            50.0,
            None,
        );
        let one1g = find("one CPU", 1024);
        line(
            "1 GiB, one CPU, median",
            one1g.map(|r| (r.reset_us.median, &r.reset_us)),
            100.0,
            floor(1024),
        );
        s
    }

    /// Median reset against the state's size, per variant and k.
    pub fn charts(&self) -> Vec<(String, Chart)> {
        let mut series: Vec<Series> = Vec::new();
        for r in &self.rows {
            let label = format!("{} k={} ({})", r.variant, r.k, r.placement);
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.points.push((r.mib as f64, r.reset_us.median)),
                None => series.push(Series {
                    label,
                    points: vec![(r.mib as f64, r.reset_us.median)],
                }),
            }
        }
        vec![(
            "resets.svg".into(),
            Chart {
                title: "Reset of a process after an input writing k pages (median)".into(),
                x_label: "state (MiB)".into(),
                y_label: "reset (µs)".into(),
                log_x: true,
                log_y: true,
                series,
            },
        )]
    }
}
