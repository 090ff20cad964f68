//! `pagewise bench dedup`: SmartMD's trade-off between memory saved by
//! deduplication and access performance, on the stand-in for its four
//! virtual machines: four forked processes, three quarters of whose
//! memory is the same "table" in each (identical pages across the
//! processes) and a quarter data of their own. All of it is in huge pages
//! but every eighth region of the table, which THP did not back (base
//! pages: what no splitting can merge).
//!
//! Each process runs rounds of random operations on its hot set, the
//! first sixteenth of its table and the first quarter of its own data
//! (SmartMD found that most hot huge pages have few duplicates): reads
//! anywhere in a hot region (GUPS-like: with base pages nearly every read
//! misses the TLB), and one operation in sixteen a write (`x ^= v`) to one
//! of every sixteenth page of the region. The pages of a hot table region
//! that are only read stay duplicates, so KSM merges them and splits the
//! huge page; a scheme that keeps hot regions whole keeps reading them
//! through one TLB entry. Everything else is cold.
//!
//! Seven schemes, one after the other, each on fresh processes, with ksmd
//! paced by the agent in the same way (one pass over the mergeable pages
//! in [`Config::full_scan_ms`]) but where the kernel's advisor paces it:
//!
//! - `none`: no deduplication;
//! - `ksm-everywhere`: every region mergeable; KSM splits every huge page
//!   in which it merges a page, the hot ones too;
//! - `ksm-advisor` and `ksm-advisor-tuned`: the same, with ksmd paced by
//!   the kernel's advisor (`advisor_mode` scan-time; Linux 6.9+) at its
//!   default target of 200 s a pass and at the run's own pace, smart scan
//!   on (the kernel's defaults);
//! - `no-splitting`: only regions of base pages;
//! - `ingens-like`: base pages and cold huge pages, whatever their
//!   duplicates;
//! - `smartmd`: pagewise's agent (cold and duplicate-rich, rebuilt when hot).
//!
//! Reported per scheme: memory saved (KSM's `pages_sharing`, the pages that
//! no longer take memory), throughput (operations per second of the four
//! processes over the second half of the run), CPU (ksmd and the agent),
//! and for smartmd the counting Bloom filter's error against the exact
//! count. Each process undoes its writes at the end and checks every word
//! of its memory: a lost or torn write fails the benchmark.

mod report;
mod schemes;

pub use schemes::{check_schemes, SCHEMES};
pub(crate) use schemes::{scheme_options, scheme_unavailable};

use crate::thp::{next, spawn_worker, stop_and_check_each, Child};
use crate::Machine;
use pagewise::{Error, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_agent::{drive, Cadence, Deadline, Interrupt, Uninterrupted};
use pagewise_dedup::{Agent, Policy};
use pagewise_mech::workload::AnonMemory;
use pagewise_testkit::host as procfs;
use pagewise_testkit::host as cgroup;
use serde::Serialize;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Operations per round of a process.
    pub ops_per_round: u64,
    /// Pages of the whole memory read per round, in order (the warm sweep
    /// that touches cold data now and then).
    pub sweep_pages: usize,
    /// The agent's interval and window, ms.
    pub interval_ms: u64,
    /// The access window, ms.
    pub window_ms: u64,
    /// ksmd's pace: one pass over the mergeable pages in this time, ms.
    pub full_scan_ms: u64,
    /// Overcommitment levels (SmartMD's 0.8, 1.1, 1.4): the processes'
    /// memory against the limit of their memory cgroup. Each level runs
    /// every scheme; above 1, zram swap takes what does not fit.
    pub levels: Vec<f64>,
    /// Runs of every scheme at every level (the order of the schemes turns
    /// by one each time).
    pub repeats: usize,
    /// The schemes to run (all of [`SCHEMES`] when empty).
    pub schemes: Vec<String>,
    /// Where every step of the agent goes, one JSON object per line
    /// (scheme, level, repeat and the step with its decisions).
    pub log: Option<std::path::PathBuf>,
}

impl Config {
    /// A short run (CI): one level where the memory fits.
    pub fn quick() -> Self {
        Config {
            processes: 4,
            regions: 64,
            seconds: 16,
            ops_per_round: 100_000,
            sweep_pages: 100,
            interval_ms: 1000,
            window_ms: 250,
            full_scan_ms: 3000,
            levels: vec![0.8],
            repeats: 1,
            schemes: Vec::new(),
            log: None,
        }
    }

    /// The full experiment.
    pub fn full() -> Self {
        Config {
            processes: 4,
            regions: 128,
            seconds: 60,
            ops_per_round: 400_000,
            sweep_pages: 400,
            interval_ms: 1000,
            window_ms: 250,
            full_scan_ms: 5000,
            levels: vec![0.8, 1.1, 1.4],
            repeats: 2,
            schemes: Vec::new(),
            log: None,
        }
    }

    /// Bytes of all processes' memory.
    fn demand(&self) -> u64 {
        (self.processes * self.regions * HUGE_PAGE_SIZE) as u64
    }
    fn table_regions(&self) -> usize {
        self.regions * 3 / 4
    }
    fn hot_table(&self) -> usize {
        (self.table_regions() / 16).max(1)
    }
    fn hot_own(&self) -> usize {
        ((self.regions - self.table_regions()) / 4).max(1)
    }
}

/// One sample of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Since the scheme started, s.
    pub t_s: f64,
    /// Memory saved (KSM's `pages_sharing`), MiB.
    pub saved_mib: f64,
    /// What the processes' memory cgroup holds, MiB.
    pub usage_mib: f64,
    /// Swapped out, MiB.
    pub swap_mib: f64,
    /// Operations per second of all processes since the last sample.
    pub ops_per_s: f64,
    /// Operations per second of the processes' own CPU time (user and
    /// system) since the last sample: what each operation costs them,
    /// whatever else ran on the CPUs (ksmd, the agent, the VM's noise).
    pub ops_per_cpu_s: f64,
    /// Regions still huge, of all processes.
    pub huge: u64,
}

/// One run of a scheme at one overcommitment level.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scheme.
    pub scheme: String,
    /// Overcommitment level.
    pub level: f64,
    /// Which repeat.
    pub repeat: usize,
    /// Memory saved at the end (KSM's `pages_sharing`), MiB.
    pub saved_mib: f64,
    /// Pages of the processes merged at the end (`ksm_merging_pages` of
    /// `/proc/PID/ksm_stat`, summed), MiB.
    pub merging_mib: f64,
    /// What their memory cgroup holds at the end, MiB.
    pub usage_mib: f64,
    /// Swapped out at the end, MiB.
    pub swap_mib: f64,
    /// Operations per second: the median of the samples of the second
    /// half of the run, and their lowest and highest.
    pub ops_per_s: f64,
    /// The lowest sample of the second half.
    pub ops_min: f64,
    /// The highest sample of the second half.
    pub ops_max: f64,
    /// Operations per second of the processes' CPU time: the median of
    /// the samples of the second half.
    pub ops_per_cpu_s: f64,
    /// Regions huge at the end, of all processes.
    pub huge_end: u64,
    /// ksmd's CPU time during the run, ms.
    pub ksmd_cpu_ms: f64,
    /// The agent's CPU time during the run, ms.
    pub agent_cpu_ms: f64,
    /// Regions made mergeable.
    pub merged: u64,
    /// Huge pages made mergeable.
    pub split: u64,
    /// Regions rebuilt.
    pub rebuilt: u64,
    /// The filter's false-positive rate and its labels against the exact
    /// count (smartmd): `[looked up, labelled, exact]`.
    pub filter: Option<(f64, [u64; 3])>,
    /// Processes the OOM killer ended (the memory did not fit).
    pub oom_killed: u64,
    /// Every process that was not killed found its memory as it wrote it.
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
    /// One per scheme, level and repeat.
    pub rows: Vec<Row>,
    /// Schemes this kernel cannot run, each with why.
    pub skipped: Vec<String>,
}

/// Why the experiment cannot run here, or `None`.
pub fn unavailable() -> Option<String> {
    let p = pagewise_mech::probe::get();
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
            mem.write_word(page * words + i, word(who, page, i));
        }
    }
}

/// Whether region `r` of the table is kept in base pages (every eighth,
/// none of the hot ones): memory that THP did not back, the only part
/// that no splitting merges.
fn base_region(cfg: &Config, r: usize) -> bool {
    r < cfg.table_regions() && r >= cfg.hot_table() && r % 8 == 7
}

/// Of each hot region's pages, every `WRITE_STRIDE`-th is written; the
/// others are only read.
const WRITE_STRIDE: usize = 16;
/// One operation in `WRITE_EVERY` is a write.
const WRITE_EVERY: u64 = 16;

/// One round of operations on the hot set: random reads of whole hot
/// regions, and one in [`WRITE_EVERY`] a write (`x ^= v`) to a random
/// word of the pages written. With `reads: false`, the writes alone (to
/// undo a round).
fn round(mem: &AnonMemory, cfg: &Config, r: u64, reads: bool) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (r.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    let hot = cfg.hot_table() + cfg.hot_own();
    let words = HUGE_PAGE_SIZE / 8;
    let written_pages = HUGE_PAGE_SIZE / PAGE_SIZE / WRITE_STRIDE;
    let mut sum = 0u64;
    for _ in 0..cfg.ops_per_round {
        let a = next(&mut x);
        let b = next(&mut x);
        let k = (a as usize) % hot;
        let region = if k < cfg.hot_table() {
            k
        } else {
            cfg.table_regions() + (k - cfg.hot_table())
        };
        let at = region * HUGE_PAGE_SIZE / 8;
        if (a >> 40).is_multiple_of(WRITE_EVERY) {
            let page = (b as usize % written_pages) * WRITE_STRIDE;
            let w = at + page * PAGE_SIZE / 8 + (b >> 32) as usize % (PAGE_SIZE / 8);
            mem.write_word(w, mem.read_word(w) ^ b);
        } else if reads {
            sum = sum.wrapping_add(mem.read_word(at + (b >> 8) as usize % words));
        }
    }
    if reads {
        let pages = cfg.regions * HUGE_PAGE_SIZE / PAGE_SIZE;
        let from = (r as usize).wrapping_mul(cfg.sweep_pages);
        for k in 0..cfg.sweep_pages {
            let page = from.wrapping_add(k) % pages;
            sum = sum.wrapping_add(mem.read_word(page * PAGE_SIZE / 8));
        }
    }
    std::hint::black_box(sum);
}

fn start(cfg: &Config, own: usize) -> Result<Child> {
    let mem = AnonMemory::new(cfg.regions * HUGE_PAGE_SIZE)?;
    let _ = mem.madvise(0, mem.len(), libc::MADV_HUGEPAGE);
    for r in (0..cfg.regions).filter(|&r| base_region(cfg, r)) {
        let _ = mem.madvise(r * HUGE_PAGE_SIZE, HUGE_PAGE_SIZE, libc::MADV_NOHUGEPAGE);
    }
    fill(&mem, cfg, own);
    for r in (0..cfg.regions).filter(|&r| !base_region(cfg, r)) {
        let _ = mem.madvise(
            r * HUGE_PAGE_SIZE,
            HUGE_PAGE_SIZE,
            pagewise_sys::mem::MADV_COLLAPSE,
        );
    }
    let (c1, c2) = (cfg.clone(), cfg.clone());
    spawn_worker(
        mem,
        None,
        move |m, r| round(m, &c1, r, true),
        move |m, rounds| {
            for k in 0..rounds {
                round(m, &c2, k, false);
            }
            let table_pages = c2.table_regions() * HUGE_PAGE_SIZE / PAGE_SIZE;
            (0..c2.regions * HUGE_PAGE_SIZE / PAGE_SIZE).all(|page| {
                let who = (page >= table_pages).then_some(own);
                (0..PAGE_SIZE / 8)
                    .all(|i| m.read_word(page * PAGE_SIZE / 8 + i) == word(who, page, i))
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
            let Ok(mut w) = pagewise_mech::walk::PageWalker::new(Some(c.pid)) else {
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

/// Memory KSM saves now (`pages_sharing`), MiB.
pub(crate) fn ksm_sharing_mib() -> f64 {
    procfs::read_trimmed(format!("{}/pages_sharing", pagewise_dedup::KSM_DIR))
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        * PAGE_SIZE as f64
        / (1 << 20) as f64
}

const MIB: f64 = (1 << 20) as f64;

/// ksmd's CPU time from now on.
pub(crate) struct KsmdClock(Option<(i32, Duration)>);

impl KsmdClock {
    pub(crate) fn start() -> KsmdClock {
        KsmdClock(procfs::kernel_thread("ksmd").and_then(|k| Some((k, procfs::cpu_time(k).ok()?))))
    }

    /// ms of CPU since [`KsmdClock::start`] (0 without a ksmd thread).
    pub(crate) fn ms(&self) -> f64 {
        self.0.map_or(0.0, |(k, c0)| {
            procfs::cpu_time(k).map_or(0.0, |c| c.saturating_sub(c0).as_secs_f64() * 1e3)
        })
    }
}

/// The pages of `pids` that KSM merged (`ksm_merging_pages` of
/// `/proc/PID/ksm_stat`, summed), MiB.
pub(crate) fn merging_mib(pids: &[i32]) -> f64 {
    pids.iter()
        .filter_map(|&p| procfs::ksm_stat(p))
        .map(|k| k.merging_pages as f64 * PAGE_SIZE as f64 / MIB)
        .sum()
}

/// This process in the memory cgroup `to` until dropped, then back in the
/// group it came from: what it allocates meanwhile (the processes it forks
/// and fills) is charged to `to`.
struct InGroup {
    back: std::path::PathBuf,
}

impl InGroup {
    fn join(to: &cgroup::MemoryCgroup) -> Result<InGroup> {
        let back = cgroup::memory_cgroup_dir(None)?
            .ok_or_else(|| crate::check_failed("finding this process's memory cgroup"))?;
        to.add(std::process::id() as i32)?;
        Ok(InGroup { back })
    }
}

impl Drop for InGroup {
    fn drop(&mut self) {
        let procs = self.back.join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, std::process::id().to_string()) {
            eprintln!(
                "pagewise: could not move back into {}: {e}",
                procs.display()
            );
        }
    }
}

/// One run of a scheme at an overcommitment level.
struct SchemeRun<'a> {
    cfg: &'a Config,
    scheme: &'a str,
    level: f64,
    repeat: usize,
    swap: Option<&'a cgroup::ZramSwap>,
    stop: &'a AtomicBool,
}

/// What a run saw while it lasted: a sample per interval, and the Bloom
/// filter against the exact count in the agent's last step.
struct Measured {
    samples: Vec<Sample>,
    filter: Option<(f64, [u64; 3])>,
}

fn run_scheme(
    cfg: &Config,
    scheme: &str,
    level: f64,
    repeat: usize,
    swap: Option<&cgroup::ZramSwap>,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<Row> {
    let run = SchemeRun {
        cfg,
        scheme,
        level,
        repeat,
        swap,
        stop,
    };
    // The processes' memory is charged to a group of their own, without a
    // limit while they fill it, then limited to the level's share.
    let cg = cgroup::MemoryCgroup::create(
        &format!("pagewise-bench-dedup-{}", std::process::id()),
        2 * cfg.demand(),
    )?;
    let children: Vec<Child> = {
        let _in = InGroup::join(&cg)?;
        (0..cfg.processes)
            .map(|i| start(cfg, i))
            .collect::<Result<_>>()?
    };
    let pids: Vec<i32> = children.iter().map(|c| c.pid).collect();
    let window = Duration::from_millis(cfg.window_ms);
    let mut agent = match scheme_options(scheme, window, Duration::from_millis(cfg.full_scan_ms)) {
        Some(opts) => Some(Agent::new(&pids, opts)?),
        None => None,
    };
    let ksmd = KsmdClock::start();
    // The deduplication runs as memory fills up: its first step (the
    // agent reads every page once) comes before the limit. Where memory is
    // swapped out before the agent has read it, the agent knows the
    // content of neither copy of a duplicate and merges little of it.
    if let Some(a) = agent.as_mut() {
        let once = Cadence::default().steps(Some(1));
        drive(a, &once, &Uninterrupted, None, |_, _| {
            Ok::<_, Error>(ControlFlow::Continue(()))
        })?;
    }
    progress(&format!(
        "{scheme} at {level}: memory limited to {:.0} MiB",
        cfg_limit_mib(cfg, level)
    ));
    cg.set_limit((cfg_limit_mib(cfg, level) * MIB) as u64)?;
    let Measured { samples, filter } = run.measure(&cg, &children, &mut agent)?;
    let second_half: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t_s >= cfg.seconds as f64 / 2.0)
        .collect();
    let (ops_per_s, ops_min, ops_max) =
        crate::median_min_max(second_half.iter().map(|s| s.ops_per_s).collect());
    let ops_per_cpu_s = crate::median(
        &mut second_half
            .iter()
            .map(|s| s.ops_per_cpu_s)
            .collect::<Vec<_>>(),
    );
    let ksmd_cpu_ms = ksmd.ms();
    let merging_mib = merging_mib(&pids);
    let (saved_mib, usage_mib, swap_mib) = (ksm_sharing_mib(), run.usage(&cg), run.swapped());
    let huge_end = huge_regions(&children, cfg.regions);
    let c = agent.as_ref().map(|a| a.counters()).unwrap_or_default();
    let (killed, verified) = run.check(&cg, &children, progress)?;
    drop(children);
    drop(agent);
    Ok(Row {
        scheme: scheme.into(),
        level,
        repeat,
        saved_mib,
        merging_mib,
        usage_mib,
        swap_mib,
        ops_per_s,
        ops_min,
        ops_max,
        ops_per_cpu_s,
        huge_end,
        ksmd_cpu_ms,
        agent_cpu_ms: c.cpu_ms,
        merged: c.merged,
        split: c.split,
        rebuilt: c.rebuilt,
        filter,
        oom_killed: killed,
        verified,
        samples,
    })
}

impl SchemeRun<'_> {
    /// Swap in use, MiB.
    fn swapped(&self) -> f64 {
        self.swap.map_or(0.0, |z| z.used() as f64 / MIB)
    }

    /// What the group charges, MiB.
    fn usage(&self, cg: &cgroup::MemoryCgroup) -> f64 {
        cg.usage().map_or(0.0, |u| u.usage as f64 / MIB)
    }

    /// Steps the agent (if any) every interval for the run's length, and
    /// samples the memory saved and used and the processes' speed.
    fn measure(
        &self,
        cg: &cgroup::MemoryCgroup,
        children: &[Child],
        agent: &mut Option<Agent>,
    ) -> Result<Measured> {
        let (cfg, scheme, level, repeat) = (self.cfg, self.scheme, self.level, self.repeat);
        let rounds = |cs: &[Child]| -> u64 { cs.iter().map(|c| c.rounds()).sum::<u64>() };
        let t0 = Instant::now();
        let mut samples: Vec<Sample> = Vec::new();
        let cpu = |cs: &[Child]| -> f64 {
            cs.iter()
                .filter_map(|c| procfs::cpu_time(c.pid).ok())
                .map(|d| d.as_secs_f64())
                .sum()
        };
        let (mut last_t, mut last_r, mut last_cpu) = (0.0, rounds(children), cpu(children));
        let (interval, run_for) = (
            Duration::from_millis(cfg.interval_ms),
            Duration::from_secs(cfg.seconds),
        );
        // The n-th sample, due at n intervals.
        let mut sample = |n: u32| {
            let due = t0 + interval * n;
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let t = t0.elapsed().as_secs_f64();
            let (r, c) = (rounds(children), cpu(children));
            let ops = (r - last_r) as f64 * cfg.ops_per_round as f64;
            samples.push(Sample {
                t_s: t,
                saved_mib: ksm_sharing_mib(),
                usage_mib: self.usage(cg),
                swap_mib: self.swapped(),
                ops_per_s: ops / (t - last_t),
                ops_per_cpu_s: ops / (c - last_cpu).max(1e-6),
                huge: huge_regions(children, cfg.regions),
            });
            (last_t, last_r, last_cpu) = (t, r, c);
        };
        // The exact count beside the filter only in the last step: it is
        // for the report, not for the agent's decisions or its CPU.
        let last_step =
            |a: &Agent| t0.elapsed() + interval >= run_for && a.options().policy == Policy::SmartMd;
        let mut filter = None;
        let mut n = 0u32;
        let ends = (self.stop, Deadline(t0 + run_for));
        match agent.as_mut() {
            Some(a) => {
                a.set_exact(last_step(a));
                // Back to back: each report sleeps until its sample is due.
                drive(a, &Cadence::default(), &ends, None, |a, s| {
                    if let Some(log) = &cfg.log {
                        log_step(log, scheme, level, repeat, &s)?;
                    }
                    if let Some(e) = s.filter.exact {
                        filter = Some((
                            s.filter.false_positive_rate.unwrap_or(0.0),
                            [s.filter.looked_up, s.filter.labelled, e],
                        ));
                    }
                    n += 1;
                    sample(n);
                    a.set_exact(last_step(a));
                    Ok::<_, Error>(ControlFlow::Continue(()))
                })?;
            }
            None => {
                while !ends.requested() {
                    n += 1;
                    sample(n);
                }
            }
        }
        if self.stop.load(Ordering::SeqCst) {
            // The processes are killed, the group removed and KSM's
            // settings put back as `children`, `cg` and `agent` are dropped.
            return Err(crate::check_failed(
                "bench dedup interrupted: KSM's settings put back",
            ));
        }
        Ok(Measured { samples, filter })
    }

    /// Stops every process and has it check its memory, with the limit
    /// lifted (the check reads every page at once, which the run never
    /// does): the processes the OOM killer ended, and whether every other
    /// found its memory as it wrote it.
    fn check(
        &self,
        cg: &cgroup::MemoryCgroup,
        children: &[Child],
        progress: &mut dyn FnMut(&str),
    ) -> Result<(u64, bool)> {
        let (cfg, scheme, level) = (self.cfg, self.scheme, self.level);
        let oom_kills = cg.oom_kills();
        cg.set_limit(2 * cfg.demand())?;
        progress(&format!(
            "{scheme} at {level}: checking the processes' memory"
        ));
        let tc = Instant::now();
        // Undoing the writes takes a sixteenth of the run per process (more
        // when their memory is swapped).
        let answers = stop_and_check_each(
            children,
            Duration::from_secs(60 + 2 * cfg.seconds * cfg.processes as u64),
        );
        // A process the OOM killer ended has nothing to check; any other
        // without a good answer lost a write.
        let killed = answers.iter().filter(|a| a.is_none()).count() as u64;
        let verified = answers.iter().all(|a| *a != Some(false)) && killed <= oom_kills;
        progress(&format!(
            "{scheme} at {level}: checked in {:.1} s",
            tc.elapsed().as_secs_f64()
        ));
        Ok((killed, verified))
    }
}

fn log_step(
    log: &std::path::Path,
    scheme: &str,
    level: f64,
    repeat: usize,
    step: &pagewise_dedup::Step,
) -> Result<()> {
    use std::io::Write;
    let line =
        serde_json::json!({ "scheme": scheme, "level": level, "repeat": repeat, "step": step });
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| writeln!(f, "{line}"))
        .map_err(|e| Error::os(format!("writing {}", log.display()), e))
}

/// Runs every scheme at every level.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if let Some(why) = unavailable() {
        return Err(pagewise::Error::from(pagewise::MechError::Unsupported {
            feature: "the dedup experiment",
            why,
        }));
    }
    let stop =
        pagewise_sys::signal::stop_flag().map_err(|e| Error::os("taking SIGINT and SIGTERM", e))?;
    // What does not fit under the limit goes to swap on zram.
    let swap = if cfg.levels.iter().any(|&l| l > 1.0) {
        Some(cgroup::ZramSwap::setup(cfg.demand())?)
    } else {
        None
    };
    // The advisor's schemes need a kernel that has it (6.9+): said, not run.
    let mut skipped = Vec::new();
    let schemes: Vec<&str> = SCHEMES
        .into_iter()
        .filter(|s| cfg.schemes.is_empty() || cfg.schemes.iter().any(|c| c == s))
        .filter(|s| match scheme_unavailable(s) {
            Some(why) => {
                skipped.push(why);
                false
            }
            None => true,
        })
        .collect();
    let mut rows = Vec::new();
    for &level in &cfg.levels {
        for repeat in 0..cfg.repeats {
            for k in 0..schemes.len() {
                let scheme = schemes[(k + repeat) % schemes.len()];
                progress(&format!(
                    "{scheme} at {level} (run {} of {}): {} s",
                    repeat + 1,
                    cfg.repeats,
                    cfg.seconds
                ));
                rows.push(run_scheme(
                    cfg,
                    scheme,
                    level,
                    repeat,
                    swap.as_ref(),
                    &stop,
                    progress,
                )?);
            }
        }
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        rows,
        skipped,
    })
}

fn cfg_limit_mib(c: &Config, level: f64) -> f64 {
    c.demand() as f64 / level / MIB
}
