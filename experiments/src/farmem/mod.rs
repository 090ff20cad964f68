//! DiME's validation experiments that need no application:
//!
//! - (a) Table 5.1: 2000 pages touched in order, then the last x of them,
//!   1000 local pages, FIFO — remote fetches against x;
//! - (b) the two-page test: one local page, two pages accessed alternately
//!   1000 times each — faults;
//! - (c) delay accuracy: configured one-way latency 0 … 10 000 ns, unlimited
//!   bandwidth; the mean time each fault adds, measured by the faulting
//!   thread against the same accesses to plain memory, beside the modelled
//!   fetch time (twice the latency);
//! - (f) overhead: the floor, a fault's cost at latency 0 (DiME: 4.85 µs in
//!   the kernel).
//!
//! The Redis experiments (d) and (e) run a real server under `farmem run`.

mod fault_paths;

use fault_paths::least_path;
pub use fault_paths::{measure_fault_paths, FaultPaths};

use super::Machine;
use pagewise::{Error, Result, PAGE_SIZE};
use pagewise_farmem::link::LinkConfig;
use pagewise_farmem::{calibrate, policy, Calibration, Config, FarMemory, FaultPath};
use pagewise_mech::workload::AnonMemory;
use pagewise_sys::uffd;
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct FarmemConfig {
    /// (c) one-way latencies, ns.
    pub latencies_ns: Vec<u64>,
    /// (c) faults measured per latency.
    pub faults_per_point: usize,
    /// (c) repetitions per latency (the median is reported).
    pub repeats: usize,
    /// Fault paths measured.
    pub paths: Vec<FaultPath>,
    /// Also with the other vCPU busy (a CPU-bound process pinned to it).
    pub busy: bool,
}

impl FarmemConfig {
    /// The full experiment.
    pub fn full() -> Self {
        FarmemConfig {
            // DiME's range, and beyond it to where the model clears this VM's floor.
            latencies_ns: vec![
                0, 250, 500, 1000, 2000, 3000, 5000, 7500, 10_000, 25_000, 50_000, 100_000,
            ],
            faults_per_point: 4000,
            repeats: 5,
            paths: vec![FaultPath::Thread, FaultPath::Inline],
            busy: true,
        }
    }
    /// A short run for CI.
    pub fn quick() -> Self {
        FarmemConfig {
            latencies_ns: vec![0, 1000, 5000, 10_000],
            faults_per_point: 1000,
            repeats: 3,
            paths: vec![FaultPath::Thread, FaultPath::Inline],
            busy: false,
        }
    }
}

/// (a) one row.
#[derive(Debug, Clone, Serialize)]
pub struct TableRow {
    /// Last pages touched again.
    pub x: u64,
    /// Remote fetches counted.
    pub fetches: u64,
    /// What FIFO must give: 2000 for x <= 1000, 2000 + x above.
    pub expected: u64,
}

/// (c) one latency.
#[derive(Debug, Clone, Serialize)]
pub struct DelayRow {
    /// Configured one-way latency, ns.
    pub latency_ns: u64,
    /// Modelled time of a fetch (2 x latency), ns.
    pub modelled_ns: u64,
    /// Measured mean added time per fault, ns (median of the repeats).
    pub measured_ns: f64,
    /// The lowest and highest of the repeats, ns.
    pub spread_ns: (f64, f64),
    /// `measured - modelled`, ns.
    pub error_ns: f64,
    /// Whether the model is at or above the floor (where the goal applies).
    pub above_floor: bool,
    /// Whether the error is within ±5 % or ±300 ns, whichever is larger.
    pub within_goal: bool,
}

/// Whether the machine's other CPUs were idle or busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Load {
    /// Nothing else running.
    Idle,
    /// A CPU-bound process pinned to the last CPU.
    Busy,
}

/// (a), (b), (c) and the floor on one fault path under one load.
#[derive(Debug, Clone, Serialize)]
pub struct PathRun {
    /// Which thread served the faults.
    pub path: FaultPath,
    /// The other CPU idle or busy.
    pub load: Load,
    /// The calibration the engine ran with.
    pub calibration: Calibration,
    /// (a) every count exact (idle only; `None` under load).
    pub table_5_1_exact: Option<bool>,
    /// (b) faults counted (idle only).
    pub two_page_faults: Option<u64>,
    /// (c).
    pub delay: Vec<DelayRow>,
    /// (f) the floor, measured as (c)'s point at latency 0, ns (median).
    pub floor_ns: f64,
    /// Its lowest and highest repeat, ns.
    pub floor_spread_ns: (f64, f64),
    /// Inline only: the least a fault with an eviction can cost from user
    /// space, on the floor's pattern (a bare `SIGBUS` handler making the
    /// same two page moves and nothing else), measured after each of the
    /// floor's repeats: median, lowest and highest, ns. The floor beyond it
    /// is the engine's own.
    pub least_ns: Option<(f64, (f64, f64))>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FarmemReport {
    /// Where.
    pub machine: Machine,
    /// What.
    pub config: FarmemConfig,
    /// (a) on the handler-thread path, idle.
    pub table_5_1: Vec<TableRow>,
    /// Each path and load.
    pub runs: Vec<PathRun>,
    /// (f) the fault paths, raw.
    pub fault_paths: FaultPaths,
}

/// Keeps the last CPU busy until dropped: a forked child pinned there,
/// spinning (killed with its parent; never longer than ten minutes).
pub struct Spinner(libc::pid_t);

impl Spinner {
    /// Starts the spinner, pinned to the last CPU.
    pub fn start() -> Result<Spinner> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu = cpus - 1;
        // SAFETY: the child pins itself, spins on the clock and exits: no
        // allocation, no lock.
        let pid = unsafe {
            pagewise_sys::process::fork_child(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                let t0 = Instant::now();
                let mut x = 0u64;
                while t0.elapsed() < std::time::Duration::from_secs(600) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
                0
            })
        }
        .map_err(|e| Error::os("fork of the spinner", e))?;
        // Let it settle on its CPU.
        std::thread::sleep(std::time::Duration::from_millis(100));
        Ok(Spinner(pid))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = pagewise_sys::process::kill(self.0, libc::SIGKILL);
        let _ = pagewise_sys::process::wait_child(self.0);
    }
}

fn fifo() -> Box<dyn policy::Policy> {
    Box::new(policy::Fifo::default())
}

fn cfg(local_pages: usize, latency_ns: u64) -> Config {
    Config::default()
        .local_pages(local_pages)
        .link(LinkConfig::default().latency_ns(latency_ns))
}

/// An engine over `mem` on `path`, FIFO.
fn new_fm(mem: &AnonMemory, c: Config, cal: Calibration, path: FaultPath) -> Result<FarMemory> {
    let hooks = pagewise_farmem::Hooks::default().fault_path(path);
    let fm = FarMemory::new_with(&[mem.region()], c, fifo(), cal, hooks)?;
    if fm.fault_path() != path {
        return Err(pagewise::Error::from(pagewise::MechError::Unsupported {
            feature: "the inline fault path",
            why: "the kernel lacks UFFD_FEATURE_SIGBUS".into(),
        }));
    }
    Ok(fm)
}

/// (a): fetches against x.
pub fn table_5_1(path: FaultPath) -> Result<Vec<TableRow>> {
    let mut rows = Vec::new();
    for x in (0..=2000u64).step_by(100) {
        let mem = AnonMemory::new(2000 * PAGE_SIZE)?;
        let fm = new_fm(&mem, cfg(1000, 0), Calibration::NONE, path)?;
        for p in 0..2000 {
            mem.write_byte(p * PAGE_SIZE, 1);
        }
        for p in (2000 - x as usize)..2000 {
            mem.write_byte(p * PAGE_SIZE + 1, 2);
        }
        let st = fm.stop()?;
        rows.push(TableRow {
            x,
            fetches: st.remote_fetches,
            expected: if x <= 1000 { 2000 } else { 2000 + x },
        });
    }
    Ok(rows)
}

/// (b): faults of the two-page test.
pub fn two_pages(path: FaultPath) -> Result<u64> {
    let mem = AnonMemory::new(1000 * PAGE_SIZE)?;
    let fm = new_fm(&mem, cfg(1, 0), Calibration::NONE, path)?;
    for i in 0..1000u32 {
        mem.write_byte(0, i as u8);
        mem.write_byte(999 * PAGE_SIZE, i as u8);
    }
    Ok(fm.stop()?.page_fault_count)
}

/// Mean time one access adds under emulation at `latency_ns`, ns: `n` pages
/// alternating through a one-page budget, against the same accesses to
/// plain memory.
fn added_per_fault(
    n: usize,
    latency_ns: u64,
    calibration: Calibration,
    path: FaultPath,
) -> Result<f64> {
    // 32 pages in turn with one local page: every access is a fetch. More
    // pages than the engine lends one instruction (16): with two, the
    // writing instruction came back to a page it had fetched, both were
    // lent and the faults stopped after five, so the floor was those five's
    // cost (×4.3 the least an inline fault costs, against ×1.2).
    const SPAN: usize = 32;
    let touch = |mem: &AnonMemory| {
        let t0 = Instant::now();
        for i in 0..n {
            mem.write_byte((i % SPAN) * PAGE_SIZE, i as u8);
        }
        t0.elapsed().as_nanos() as f64
    };
    let plain = AnonMemory::new(SPAN * PAGE_SIZE)?;
    let base = touch(&plain);
    let mem = AnonMemory::new(SPAN * PAGE_SIZE)?;
    let fm = new_fm(&mem, cfg(1, latency_ns), calibration, path)?;
    let t = touch(&mem);
    let st = fm.stop()?;
    Ok((t - base) / st.page_fault_count.max(1) as f64)
}

/// (a), (b) (idle only), (c) and the floor on `path` under `load`.
fn path_run(
    c: &FarmemConfig,
    path: FaultPath,
    load: Load,
    progress: &mut dyn FnMut(&str),
) -> Result<PathRun> {
    let tag = format!("{path}, {load:?}").to_lowercase();
    progress(&format!("[{tag}] calibrating the floor"));
    let calibration = calibrate(2000, path)?;
    let (table_5_1_exact, two_page_faults) = if load == Load::Idle {
        progress(&format!("[{tag}] (a) DiME's Table 5.1"));
        let exact = table_5_1(path)?.iter().all(|r| r.fetches == r.expected);
        progress(&format!("[{tag}] (b) two-page test"));
        (Some(exact), Some(two_pages(path)?))
    } else {
        (None, None)
    };
    let mut delay = Vec::new();
    let mut least = Vec::new();
    for &l in &c.latencies_ns {
        progress(&format!("[{tag}] (c) latency {l} ns"));
        let mut v = Vec::new();
        for _ in 0..c.repeats {
            v.push(added_per_fault(c.faults_per_point, l, calibration, path)?);
            if l == 0 && path == FaultPath::Inline && least_here() {
                least.push(least_path(c.faults_per_point)?);
            }
        }
        let (measured, lo, hi) = super::median_min_max(v);
        let modelled = 2 * l;
        let err = measured - modelled as f64;
        delay.push(DelayRow {
            latency_ns: l,
            modelled_ns: modelled,
            measured_ns: measured,
            spread_ns: (lo, hi),
            error_ns: err,
            above_floor: modelled >= calibration.floor_ns,
            within_goal: err.abs() <= (0.05 * modelled as f64).max(300.0),
        });
    }
    let (floor_ns, floor_spread_ns) = delay
        .iter()
        .find(|d| d.latency_ns == 0)
        .map_or((f64::NAN, (f64::NAN, f64::NAN)), |d| {
            (d.measured_ns, d.spread_ns)
        });
    Ok(PathRun {
        path,
        load,
        calibration,
        table_5_1_exact,
        two_page_faults,
        delay,
        floor_ns,
        floor_spread_ns,
        least_ns: (!least.is_empty()).then(|| {
            let (m, lo, hi) = super::median_min_max(least);
            (m, (lo, hi))
        }),
    })
}

/// Whether the least inline fault can be measured here.
fn least_here() -> bool {
    pagewise_mech::probe::get().uffd_has(uffd::feature::SIGBUS | uffd::feature::MOVE)
}

/// Runs (a), (b), (c) and (f) on every path, idle and (if asked) busy.
pub fn run(c: &FarmemConfig, progress: &mut dyn FnMut(&str)) -> Result<FarmemReport> {
    progress("(a) DiME's Table 5.1");
    let table_5_1 = table_5_1(FaultPath::Thread)?;
    let inline_here = pagewise_mech::probe::get().uffd_has(uffd::feature::SIGBUS);
    let paths: Vec<FaultPath> = c
        .paths
        .iter()
        .copied()
        .filter(|&p| p == FaultPath::Thread || inline_here)
        .collect();
    let mut runs = Vec::new();
    for &path in &paths {
        runs.push(path_run(c, path, Load::Idle, progress)?);
    }
    if c.busy {
        let _spin = Spinner::start()?;
        for &path in &paths {
            runs.push(path_run(c, path, Load::Busy, progress)?);
        }
    }
    progress("(f) fault paths");
    let fault_paths = measure_fault_paths(4000)?;
    Ok(FarmemReport {
        machine: Machine::this(),
        config: c.clone(),
        table_5_1,
        runs,
        fault_paths,
    })
}

impl FarmemReport {
    /// Plots: (a) fetches against x, (c) measured against modelled.
    pub fn charts(&self) -> Vec<(String, super::svg::Chart)> {
        use super::svg::{Chart, Series};
        vec![
            (
                "table_5_1.svg".into(),
                Chart {
                    title: "(a) DiME Table 5.1: 2000 pages, 1000 local, FIFO".into(),
                    x_label: "last pages touched again (x)".into(),
                    y_label: "remote fetches".into(),
                    log_x: false,
                    log_y: false,
                    series: vec![
                        Series {
                            label: "measured".into(),
                            points: self
                                .table_5_1
                                .iter()
                                .map(|r| (r.x as f64, r.fetches as f64))
                                .collect(),
                        },
                        Series {
                            label: "expected".into(),
                            points: self
                                .table_5_1
                                .iter()
                                .map(|r| (r.x as f64, r.expected as f64))
                                .collect(),
                        },
                    ],
                },
            ),
            (
                "delay.svg".into(),
                Chart {
                    title: "(c) time added per fault against the model".into(),
                    x_label: "configured one-way latency (ns)".into(),
                    y_label: "ns per fault".into(),
                    log_x: false,
                    log_y: false,
                    series: self
                        .runs
                        .iter()
                        .map(|r| Series {
                            label: format!("{}, {:?}", r.path, r.load).to_lowercase(),
                            points: r
                                .delay
                                .iter()
                                .map(|d| (d.latency_ns as f64, d.measured_ns))
                                .collect(),
                        })
                        .chain(self.runs.first().map(|r| {
                            Series {
                                label: "modelled (2 x latency)".into(),
                                points: r
                                    .delay
                                    .iter()
                                    .map(|d| (d.latency_ns as f64, d.modelled_ns as f64))
                                    .collect(),
                            }
                        }))
                        .collect(),
                },
            ),
        ]
    }

    /// A plain-text summary with the goals.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "machine: {}", self.machine);
        let exact = self.table_5_1.iter().all(|r| r.fetches == r.expected);
        let _ = writeln!(
            s,
            "\n(a) Table 5.1 (2000 pages, 1000 local, FIFO; handler thread): {}",
            if exact {
                "every count exact"
            } else {
                "COUNTS DIFFER"
            }
        );
        let _ = writeln!(s, "{:>6} {:>9} {:>9}", "x", "fetches", "expected");
        for r in &self.table_5_1 {
            let _ = writeln!(s, "{:>6} {:>9} {:>9}", r.x, r.fetches, r.expected);
        }
        for r in &self.runs {
            let _ = writeln!(
                s,
                "\n== fault path {}, other CPU {} ==",
                r.path,
                match r.load {
                    Load::Idle => "idle",
                    Load::Busy => "busy (a CPU-bound process pinned to it)",
                }
            );
            let _ = writeln!(
                s,
                "calibration: floor {} ns per fault, {} ns of it unseen by the engine",
                r.calibration.floor_ns, r.calibration.unseen_ns
            );
            if let (Some(e), Some(f)) = (r.table_5_1_exact, r.two_page_faults) {
                let _ = writeln!(
                    s,
                    "(a) Table 5.1: {}; (b) two-page test: {f} faults (expected 2000)",
                    if e {
                        "every count exact"
                    } else {
                        "COUNTS DIFFER"
                    }
                );
            }
            let _ = writeln!(
                s,
                "(c) delay accuracy (unlimited bandwidth; medians of the repeats, min-max)"
            );
            let _ = writeln!(
                s,
                "{:>11} {:>12} {:>12} {:>19} {:>9} {:>7} {:>7}",
                "latency ns",
                "modelled ns",
                "measured ns",
                "spread ns",
                "error ns",
                "floor<",
                "goal"
            );
            for d in &r.delay {
                let _ = writeln!(
                    s,
                    "{:>11} {:>12} {:>12.0} {:>19} {:>9.0} {:>7} {:>7}",
                    d.latency_ns,
                    d.modelled_ns,
                    d.measured_ns,
                    format!("{:.0}-{:.0}", d.spread_ns.0, d.spread_ns.1),
                    d.error_ns,
                    if d.above_floor { "yes" } else { "no" },
                    if d.latency_ns < 1000 {
                        "-"
                    } else if d.within_goal {
                        "met"
                    } else {
                        "MISSED"
                    }
                );
            }
            let _ = writeln!(
                s,
                "(f) floor: {:.0} ns per fault at latency 0 (repeats {:.0}-{:.0}; goal <= 4850 ns, DiME's in the kernel; aim <= 3000 ns)",
                r.floor_ns, r.floor_spread_ns.0, r.floor_spread_ns.1
            );
            if let Some((least, (lo, hi))) = r.least_ns {
                let _ = writeln!(
                    s,
                    "    the least inline fault with an eviction (a bare SIGBUS handler making the same two page moves, nothing else): {least:.0} ns (repeats {lo:.0}-{hi:.0}); the engine's own: {:.0} ns; DiME's 4850 ns is {} from user space here",
                    r.floor_ns - least,
                    if least > 4850.0 {
                        "out of reach (the least alone exceeds it)"
                    } else {
                        "within the least's reach"
                    }
                );
            }
        }
        for path in [FaultPath::Thread, FaultPath::Inline] {
            let idle = self
                .runs
                .iter()
                .find(|r| r.path == path && r.load == Load::Idle);
            let busy = self
                .runs
                .iter()
                .find(|r| r.path == path && r.load == Load::Busy);
            if let (Some(i), Some(b)) = (idle, busy) {
                let _ = writeln!(
                    s,
                    "\nsteadiness, {path}: floor busy/idle = {:.2} (goal <= 2)",
                    b.floor_ns / i.floor_ns
                );
            }
        }
        let f = &self.fault_paths;
        let _ = writeln!(
            s,
            "\nfault paths, raw (first touch, read, mapped with the zero page, no eviction): plain {:.0} ns; handler thread {:.0} ns (+{:.0}); bare SIGBUS handler {}; inline engine {}",
            f.plain_ns,
            f.thread_ns,
            f.thread_ns - f.plain_ns,
            match f.sigbus_ns {
                Some(v) => format!("{v:.0} ns (+{:.0})", v - f.plain_ns),
                None => "unavailable (no UFFD_FEATURE_SIGBUS)".into(),
            },
            match f.inline_ns {
                Some(v) => format!("{v:.0} ns (+{:.0})", v - f.plain_ns),
                None => "unavailable".into(),
            }
        );
        let _ = writeln!(
            s,
            "a system call doing nothing (getppid): {:.0} ns",
            f.syscall_ns
        );
        s
    }
}
