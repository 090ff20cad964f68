//! `pagewise bench dedup`: SmartMD's trade-off between memory saved by
//! deduplication and access performance, on the stand-in for its four
//! virtual machines: four forked processes whose memory is all huge pages,
//! three quarters of it the same "table" in each (identical pages across
//! the processes) and a quarter data of their own. Each process updates
//! random words (`x ^= v`, GUPS-like: nearly every update misses the TLB
//! with base pages) of a hot set: the first eighth of its table and the
//! first quarter of its own data. Everything else is cold.
//!
//! Five schemes, one after the other, each on fresh processes, with ksmd
//! paced by the agent in the same way (one pass over the mergeable pages
//! in [`Config::full_scan_ms`]):
//!
//! - `none`: no deduplication;
//! - `ksm-everywhere`: every region mergeable; KSM splits every huge page
//!   in which it merges a page, the hot ones too;
//! - `no-splitting`: only regions of base pages (here none);
//! - `ingens-like`: cold huge pages, whatever their duplicates;
//! - `smartmd`: pagewise's agent (cold and duplicate-rich, rebuilt when hot).
//!
//! Reported per scheme: memory saved (KSM's `pages_sharing`, the pages that
//! no longer take memory), throughput (updates per second of the four
//! processes over the second half of the run), CPU (ksmd and the agent),
//! and for smartmd the counting Bloom filter's error against the exact
//! count. Each process undoes its updates at the end and checks every word
//! of its memory: a lost or torn write fails the benchmark.

use crate::thp::{next, spawn_worker, Child};
use crate::Machine;
use pagewise::dedup::{Agent, Options, Policy};
use pagewise::workload::AnonMemory;
use pagewise::{procfs, Error, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use serde::Serialize;
use std::time::{Duration, Instant};

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Processes.
    pub processes: usize,
    /// 2 MiB regions of each process.
    pub regions: usize,
    /// Seconds each scheme runs.
    pub seconds: u64,
    /// Updates per round of a process.
    pub updates_per_round: u64,
    /// The agent's interval and window, ms.
    pub interval_ms: u64,
    /// The access window, ms.
    pub window_ms: u64,
    /// ksmd's pace: one pass over the mergeable pages in this time, ms.
    pub full_scan_ms: u64,
    /// The schemes to run (all of [`SCHEMES`] when empty).
    pub schemes: Vec<String>,
}

impl Config {
    /// A short run (CI).
    pub fn quick() -> Self {
        Config {
            processes: 4,
            regions: 32,
            seconds: 16,
            updates_per_round: 100_000,
            interval_ms: 1000,
            window_ms: 250,
            full_scan_ms: 3000,
            schemes: Vec::new(),
        }
    }

    /// The full experiment.
    pub fn full() -> Self {
        Config {
            processes: 4,
            regions: 128,
            seconds: 60,
            updates_per_round: 400_000,
            interval_ms: 1000,
            window_ms: 250,
            full_scan_ms: 5000,
            schemes: Vec::new(),
        }
    }

    fn table_regions(&self) -> usize {
        self.regions * 3 / 4
    }
    fn hot_table(&self) -> usize {
        (self.table_regions() / 8).max(1)
    }
    fn hot_own(&self) -> usize {
        ((self.regions - self.table_regions()) / 4).max(1)
    }
}

/// The schemes, in the order they run.
pub const SCHEMES: [&str; 5] = [
    "none",
    "ksm-everywhere",
    "no-splitting",
    "ingens-like",
    "smartmd",
];

/// One sample of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Since the scheme started, s.
    pub t_s: f64,
    /// Memory saved, MiB.
    pub saved_mib: f64,
    /// Updates per second of all processes since the last sample.
    pub updates_per_s: f64,
    /// Regions still huge, of all processes.
    pub huge: u64,
}

/// One scheme's run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scheme.
    pub scheme: String,
    /// Memory saved at the end, MiB.
    pub saved_mib: f64,
    /// Updates per second over the second half.
    pub updates_per_s: f64,
    /// Regions huge at the end, of all processes.
    pub huge_end: u64,
    /// ksmd's CPU time during the run, ms.
    pub ksmd_cpu_ms: f64,
    /// The agent's CPU time during the run, ms.
    pub agent_cpu_ms: f64,
    /// Regions made mergeable, of which huge pages, and rebuilt.
    pub merged: u64,
    /// Huge pages made mergeable.
    pub split: u64,
    /// Regions rebuilt.
    pub rebuilt: u64,
    /// The filter's false-positive rate and its labels against the exact
    /// count (smartmd): `[looked up, labelled, exact]`.
    pub filter: Option<(f64, [u64; 3])>,
    /// Every process found its memory as it wrote it.
    pub verified: bool,
    /// Samples over time.
    pub samples: Vec<Sample>,
}

impl Row {
    /// Total CPU, % of one CPU over the run.
    pub fn cpu_pct(&self, seconds: u64) -> f64 {
        (self.ksmd_cpu_ms + self.agent_cpu_ms) / (seconds as f64 * 10.0)
    }
}

/// The results.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where.
    pub machine: Machine,
    /// Sizes.
    pub config: Config,
    /// One per scheme.
    pub rows: Vec<Row>,
}

/// Why the experiment cannot run here, or `None`.
pub fn unavailable() -> Option<String> {
    let p = pagewise::probe::get();
    if !p.ksm {
        return Some(p.why("ksm"));
    }
    if !p.madv_collapse {
        return Some(p.why("madv_collapse"));
    }
    if pagewise_sys::process::geteuid() != 0 {
        return Some("needs root (ksmd's settings)".into());
    }
    None
}

/// The word at index `i` of page `page` (of the table, or of process `own`'s data).
fn word(own: Option<usize>, page: usize, i: usize) -> u64 {
    let mut x = (page as u64) << 20 | i as u64 | own.map_or(0, |o| (o as u64 + 1) << 52);
    next(&mut x) | 1
}

fn fill(mem: &AnonMemory, cfg: &Config, own: usize) {
    let table_pages = cfg.table_regions() * HUGE_PAGE_SIZE / PAGE_SIZE;
    let words = PAGE_SIZE / 8;
    for page in 0..mem.len() / PAGE_SIZE {
        let who = (page >= table_pages).then_some(own);
        for i in 0..words {
            // SAFETY: inside `mem`.
            unsafe {
                std::ptr::write(
                    (mem.addr() as usize + page * PAGE_SIZE + i * 8) as *mut u64,
                    word(who, page, i),
                )
            };
        }
    }
}

/// One round of updates to the hot set.
fn round(base: usize, cfg: &Config, r: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (r.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    let hot = cfg.hot_table() + cfg.hot_own();
    let words = HUGE_PAGE_SIZE / 8;
    for _ in 0..cfg.updates_per_round {
        let a = next(&mut x);
        let b = next(&mut x);
        let k = (a as usize) % hot;
        let region = if k < cfg.hot_table() {
            k
        } else {
            cfg.table_regions() + (k - cfg.hot_table())
        };
        let at = base + region * HUGE_PAGE_SIZE + ((b >> 8) as usize % words) * 8;
        // SAFETY: inside the child's regions.
        unsafe {
            let p = at as *mut u64;
            std::ptr::write_volatile(p, std::ptr::read_volatile(p) ^ b);
        }
    }
}

fn start(cfg: &Config, own: usize) -> Result<Child> {
    let mem = AnonMemory::new(cfg.regions * HUGE_PAGE_SIZE)?;
    let _ = mem.madvise(0, mem.len(), libc::MADV_HUGEPAGE);
    fill(&mem, cfg, own);
    let _ = mem.madvise(0, mem.len(), pagewise_sys::mem::MADV_COLLAPSE);
    let base = mem.addr() as usize;
    let (c1, c2) = (cfg.clone(), cfg.clone());
    spawn_worker(
        mem,
        None,
        move |r| round(base, &c1, r),
        move |rounds| {
            for k in 0..rounds {
                round(base, &c2, k);
            }
            let table_pages = c2.table_regions() * HUGE_PAGE_SIZE / PAGE_SIZE;
            (0..c2.regions * HUGE_PAGE_SIZE / PAGE_SIZE).all(|page| {
                let who = (page >= table_pages).then_some(own);
                (0..PAGE_SIZE / 8).all(|i| {
                    // SAFETY: inside the child's regions.
                    let v =
                        unsafe { std::ptr::read((base + page * PAGE_SIZE + i * 8) as *const u64) };
                    v == word(who, page, i)
                })
            })
        },
    )
}

fn huge_regions(children: &[Child], regions: usize) -> u64 {
    let h = pagewise_sys::pagemap::category::HUGE;
    let mut runs = Vec::new();
    children
        .iter()
        .map(|c| {
            let Ok(mut w) = pagewise::walk::PageWalker::new(Some(c.pid)) else {
                return 0;
            };
            (0..regions)
                .filter(|&r| {
                    pagewise::Region::new(
                        c.base + (r * HUGE_PAGE_SIZE) as u64,
                        HUGE_PAGE_SIZE as u64,
                    )
                    .and_then(|reg| w.categories(reg, h, h, &mut runs))
                    .is_ok()
                        && !runs.is_empty()
                })
                .count() as u64
        })
        .sum()
}

fn ksm_sharing_mib() -> f64 {
    procfs::read_trimmed(format!("{}/pages_sharing", pagewise::dedup::KSM_DIR))
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        * PAGE_SIZE as f64
        / (1 << 20) as f64
}

fn run_scheme(cfg: &Config, scheme: &str, progress: &mut dyn FnMut(&str)) -> Result<Row> {
    let children: Vec<Child> = (0..cfg.processes)
        .map(|i| start(cfg, i))
        .collect::<Result<_>>()?;
    let pids: Vec<i32> = children.iter().map(|c| c.pid).collect();
    let mut agent = match Policy::parse(scheme) {
        Some(policy) => Some(Agent::new(
            &pids,
            Options {
                window: Duration::from_millis(cfg.window_ms),
                policy,
                exact: policy == Policy::SmartMd,
                full_scan: Some(Duration::from_millis(cfg.full_scan_ms)),
                ..Options::default()
            },
        )?),
        None => None,
    };
    let ksmd = procfs::kernel_thread("ksmd");
    let ksmd0 = ksmd.and_then(|k| procfs::cpu_time(k).ok());
    let updates = |cs: &[Child]| -> u64 { cs.iter().map(|c| c.rounds()).sum::<u64>() };
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let (mut last_t, mut last_u) = (0.0, updates(&children));
    let mut half = None;
    let mut filter = None;
    let mut n = 0u32;
    while t0.elapsed() < Duration::from_secs(cfg.seconds) {
        n += 1;
        if let Some(a) = agent.as_mut() {
            let s = a.step()?;
            if let Some(e) = s.filter.exact {
                filter = Some((
                    s.filter.false_positive_rate.unwrap_or(0.0),
                    [s.filter.looked_up, s.filter.labelled, e],
                ));
            }
        }
        let due = t0 + Duration::from_millis(cfg.interval_ms) * n;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let t = t0.elapsed().as_secs_f64();
        let u = updates(&children);
        samples.push(Sample {
            t_s: t,
            saved_mib: ksm_sharing_mib(),
            updates_per_s: (u - last_u) as f64 * cfg.updates_per_round as f64 / (t - last_t),
            huge: huge_regions(&children, cfg.regions),
        });
        if half.is_none() && t >= cfg.seconds as f64 / 2.0 {
            half = Some((t, u));
        }
        (last_t, last_u) = (t, u);
    }
    let (ht, hu) = half.unwrap_or((0.0, 0));
    let updates_per_s =
        (last_u - hu) as f64 * cfg.updates_per_round as f64 / (last_t - ht).max(1e-3);
    let ksmd_cpu_ms = match (ksmd, ksmd0) {
        (Some(k), Some(c0)) => procfs::cpu_time(k)
            .map(|c| c.saturating_sub(c0).as_secs_f64() * 1e3)
            .unwrap_or(0.0),
        _ => 0.0,
    };
    let saved_mib = ksm_sharing_mib();
    let huge_end = huge_regions(&children, cfg.regions);
    let c = agent.as_ref().map(|a| a.counters()).unwrap_or_default();
    progress(&format!("{scheme}: checking the processes' memory"));
    let tc = Instant::now();
    let verified = children.iter().all(|c| c.stop_and_check());
    progress(&format!(
        "{scheme}: checked in {:.1} s",
        tc.elapsed().as_secs_f64()
    ));
    drop(children);
    drop(agent);
    Ok(Row {
        scheme: scheme.into(),
        saved_mib,
        updates_per_s,
        huge_end,
        ksmd_cpu_ms,
        agent_cpu_ms: c.cpu_ms,
        merged: c.merged,
        split: c.split,
        rebuilt: c.rebuilt,
        filter,
        verified,
        samples,
    })
}

/// Runs every scheme.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if let Some(why) = unavailable() {
        return Err(Error::Unsupported {
            feature: "the dedup experiment",
            why,
        });
    }
    let mut rows = Vec::new();
    for scheme in SCHEMES {
        if !cfg.schemes.is_empty() && !cfg.schemes.iter().any(|s| s == scheme) {
            continue;
        }
        progress(&format!("{scheme}: {} s", cfg.seconds));
        rows.push(run_scheme(cfg, scheme, progress)?);
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        rows,
    })
}

impl Report {
    fn row(&self, scheme: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.scheme == scheme)
    }

    /// The table.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mib = ((c.regions * HUGE_PAGE_SIZE) >> 20) as u64;
        let mut s = format!(
            "pagewise bench dedup — {}\nSmartMD's trade-off: {} processes of {} MiB in huge pages, {} MiB of it the same table in each; hot: {} + {} regions of 2 MiB per process; {} s per scheme; ksmd paced to one pass in {} ms\n\n{:>15} {:>10} {:>9} {:>12} {:>9} {:>8} {:>9} {:>9} {:>7} {:>7} {:>9}\n",
            self.machine,
            c.processes,
            mib,
            c.table_regions() * 2,
            c.hot_table(),
            c.hot_own(),
            c.seconds,
            c.full_scan_ms,
            "scheme", "saved MiB", "of KSM", "updates/s", "of no-spl", "huge", "ksmd ms", "agent ms", "CPU %", "split", "verified"
        );
        let ksm = self.row("ksm-everywhere").map_or(0.0, |r| r.saved_mib);
        let nosplit = self.row("no-splitting").map_or(0.0, |r| r.updates_per_s);
        for r in &self.rows {
            s += &format!(
                "{:>15} {:>10.1} {:>8.1}% {:>12.0} {:>8.1}% {:>8} {:>9.0} {:>9.0} {:>7.1} {:>7} {:>9}\n",
                r.scheme,
                r.saved_mib,
                r.saved_mib / ksm.max(1e-9) * 100.0,
                r.updates_per_s,
                r.updates_per_s / nosplit.max(1e-9) * 100.0,
                r.huge_end,
                r.ksmd_cpu_ms,
                r.agent_cpu_ms,
                r.cpu_pct(c.seconds),
                r.split,
                r.verified
            );
        }
        if let Some((fp, [looked, labelled, exact])) = self.row("smartmd").and_then(|r| r.filter) {
            s += &format!(
                "\nsmartmd's counting Bloom filter: {looked} pages looked up, {labelled} labelled duplicate, {exact} with a duplicate in fact; false positives {:.3} % of those looked up\n",
                fp * 100.0
            );
        }
        s
    }

    /// SmartMD's trade-off (saving against throughput) and both over time.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let per = |f: fn(&Sample) -> f64| -> Vec<crate::svg::Series> {
            self.rows
                .iter()
                .map(|r| crate::svg::Series {
                    label: r.scheme.clone(),
                    points: r.samples.iter().map(|s| (s.t_s, f(s))).collect(),
                })
                .collect()
        };
        vec![
            (
                "dedup-tradeoff.svg".into(),
                crate::svg::Chart {
                    title: "memory saved against throughput, per scheme".into(),
                    x_label: "memory saved (MiB)".into(),
                    y_label: "updates per second (millions)".into(),
                    log_x: false,
                    log_y: false,
                    series: self
                        .rows
                        .iter()
                        .map(|r| crate::svg::Series {
                            label: r.scheme.clone(),
                            points: vec![(r.saved_mib, r.updates_per_s / 1e6)],
                        })
                        .collect(),
                },
            ),
            (
                "dedup-saved.svg".into(),
                crate::svg::Chart {
                    title: "memory saved over time".into(),
                    x_label: "time (s)".into(),
                    y_label: "memory saved (MiB)".into(),
                    log_x: false,
                    log_y: false,
                    series: per(|s| s.saved_mib),
                },
            ),
            (
                "dedup-throughput.svg".into(),
                crate::svg::Chart {
                    title: "throughput over time".into(),
                    x_label: "time (s)".into(),
                    y_label: "updates per second (millions)".into(),
                    log_x: false,
                    log_y: false,
                    series: per(|s| s.updates_per_s / 1e6),
                },
            ),
        ]
    }
}
