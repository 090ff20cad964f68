//! The huge-page agent (HawkEye's promotion, from user space): each step it
//! measures the access coverage of the 2 MiB regions of the processes it
//! watches that are not huge pages yet, and promotes the regions with the
//! highest benefit first with `process_madvise(MADV_COLLAPSE)`, under a
//! budget, fairly across processes.
//!
//! - **Candidates**: 2 MiB-aligned regions wholly inside a private anonymous
//!   writable mapping, with at least one resident page and not mapped by a
//!   huge page (`PAGEMAP_SCAN`).
//! - **Coverage**: pages touched per second in each candidate, measured
//!   over a window: by idle page tracking where the kernel has it (reads
//!   and writes, nothing inside the processes); otherwise pages written,
//!   from outside ([`crate::mech::access::WriteCoverage`]). A process it cannot
//!   trace is ranked by utilisation and the step says why. Processes of a
//!   far-memory instance are served page by page and hold no huge pages:
//!   the far-memory sampler is not a source here.
//! - **Benefit** of promoting a region: its coverage × the cost of a page
//!   walk on this machine ([`super::WalkCost::walk_ns`]): each distinct page
//!   touched per second takes at least one walk that a huge page would
//!   save. A lower bound, as in the inspector.
//! - **Fairness**: the next huge page goes to the process whose remaining
//!   candidates promise the most (the sum of their benefits: its estimated
//!   page-walk overhead, HawkEye's measure without its PMU), and within it
//!   to the region with the highest benefit.
//! - **Budget**: huge pages in all, per second (a step may spend what the
//!   time since the last step earned, up to one interval's worth), and a
//!   share of one CPU for the collapses of one step.
//!
//! Two other policies are here for comparison: [`Policy::AddressOrder`]
//! (as khugepaged: process by process, regions in address order) and
//! [`Policy::Utilisation`] (Ingens-like: a region whose resident share passes
//! a threshold, fullest first).
//!
//! A collapse copies the region's pages into a huge page under the
//! kernel's locks; the program's writes are never lost (the tests check it
//! against a self-checking writer).
//!
//! **Bloat recovery** ([`Recovery`]): when memory is tight (available memory
//! below a threshold, or memory pressure stall above one, or always), huge
//! pages of the watched processes holding at least a threshold of
//! zero-filled base pages give those pages back. The process is stopped
//! (every thread, under ptrace), the candidate pages are read again while
//! it is stopped, and the process itself is made to call
//! `madvise(MADV_DONTNEED)` on the runs that are still zero ([`crate::mech::inject`]);
//! then it runs on. Nothing of the process can write while it is stopped,
//! so no write is lost: a page written after it was read is not given back.
//! The huge page is split by this; the pages given back read as zeros again
//! when touched. A region that fills up again becomes a candidate for
//! promotion like any other; while memory is tight, only one with more
//! than `512 - zero_pages` pages resident (a promotion must not bring back
//! what recovery gives back), and khugepaged is held to the same rule
//! ([`Recovery::tune_khugepaged`]). Memory counts as tight per process:
//! [`Pressure::LimitAbove`] reads the process's own memory cgroup.

use crate::mech::access::WriteCoverage;
use crate::mech::procfs;
use crate::mech::walk::PageWalker;
use crate::{Error, Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::process;
use serde::Serialize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Which regions are promoted first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// HawkEye: highest coverage × walk cost first, fairly across processes.
    Coverage,
    /// khugepaged's order: process by process, by address.
    AddressOrder,
    /// Ingens-like: regions whose resident share is at least this, fullest
    /// first.
    Utilisation(f64),
}

/// Limits on what the agent does.
#[derive(Debug, Clone, Serialize)]
pub struct Budget {
    /// Huge pages promoted in all (`None`: no limit).
    pub total: Option<u64>,
    /// Huge pages per second.
    pub per_second: f64,
    /// Share of one CPU the collapses of one step may take (of the interval).
    pub cpu_share: f64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            total: None,
            per_second: 16.0,
            cpu_share: 0.1,
        }
    }
}

/// When memory counts as tight, for bloat recovery.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pressure {
    /// Every step (for tests and experiments).
    Always,
    /// `MemAvailable` (`/proc/meminfo`) below this many bytes.
    AvailableBelow(u64),
    /// The memory pressure stall (`/proc/pressure/memory`, `some avg10`)
    /// above this share, %.
    StallAbove(f64),
    /// The process's memory cgroup charged above this share of its limit,
    /// % (never for a process whose cgroup has no limit).
    LimitAbove(f64),
}

impl Pressure {
    /// Whether it holds now for process `pid`, and what was read.
    pub fn holds(&self, pid: i32) -> Result<(bool, String)> {
        match *self {
            Pressure::LimitAbove(pct) => {
                let Some(dir) = crate::mech::cgroup::memory_cgroup_dir(Some(pid))? else {
                    return Ok((false, "no memory cgroup".into()));
                };
                let u = crate::mech::cgroup::memory_use(&dir)?;
                Ok(match u.limit {
                    Some(l) => (
                        u.usage as f64 > l as f64 * pct / 100.0,
                        format!("cgroup {} MiB of its {} MiB limit", u.usage >> 20, l >> 20),
                    ),
                    None => (false, "its memory cgroup has no limit".into()),
                })
            }
            Pressure::Always => Ok((true, "always".into())),
            Pressure::AvailableBelow(b) => {
                let t = procfs::read_trimmed("/proc/meminfo")
                    .map_err(|e| Error::os("reading /proc/meminfo", e))?;
                let avail =
                    procfs::status_field(&t, "MemAvailable").unwrap_or(u64::MAX / 1024) * 1024;
                Ok((avail < b, format!("MemAvailable {} MiB", avail >> 20)))
            }
            Pressure::StallAbove(pct) => {
                let t = procfs::read_trimmed("/proc/pressure/memory")
                    .map_err(|e| Error::os("reading /proc/pressure/memory", e))?;
                let some = t
                    .lines()
                    .find(|l| l.starts_with("some"))
                    .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("avg10=")))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
                Ok((some > pct, format!("memory stall {some:.2} % (avg10)")))
            }
        }
    }
}

/// Bloat recovery (see the module).
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    /// When to recover.
    pub when: Pressure,
    /// Zero-filled base pages (of 512) a huge page must hold to give them back.
    pub zero_pages: u64,
    /// While memory is tight, lower khugepaged's `max_ptes_none` to
    /// `zero_pages - 1` (where it is higher), so that khugepaged does not
    /// fill again with zeros what was just given back, and the kernel's own
    /// shrinker of underused huge pages (which uses the same threshold)
    /// splits such huge pages too. Put back once memory has not been
    /// tight for `hold`, and when the agent ends.
    pub tune_khugepaged: bool,
    /// How long after memory was last tight the agent still acts as if it
    /// were for promotion and khugepaged (so that a recovery that relieves
    /// the pressure is not undone at once).
    pub hold: Duration,
}

/// khugepaged's threshold of missing pages in a region it collapses (and
/// the THP shrinker's threshold of zero-filled pages).
pub const MAX_PTES_NONE: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_none";

/// How the agent runs.
#[derive(Debug, Clone, Serialize)]
pub struct Options {
    /// Time between steps.
    pub interval: Duration,
    /// The coverage window inside a step.
    pub window: Duration,
    /// Promotion order.
    pub policy: Policy,
    /// Limits.
    pub budget: Budget,
    /// What a page walk costs here, ns (from [`super::calibrate_walk_cost`]).
    pub walk_ns: f64,
    /// Bloat recovery, if wanted.
    pub recovery: Option<Recovery>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            interval: Duration::from_secs(1),
            window: Duration::from_millis(200),
            policy: Policy::Coverage,
            budget: Budget::default(),
            walk_ns: 30.0,
            recovery: None,
        }
    }
}

/// A region that could be promoted, as the last step measured it.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    /// Process.
    pub pid: i32,
    /// Start (2 MiB-aligned).
    pub start: u64,
    /// Resident base pages.
    pub resident: u64,
    /// Pages written in the window (`None` when coverage was not measured).
    pub touched: Option<u64>,
    /// Pages written per second.
    pub rate: Option<f64>,
    /// What promoting it saves, ns per second (coverage × walk cost).
    pub benefit_ns_per_s: Option<f64>,
}

/// What the agent did with a region, or to a process.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// Collapsed into a huge page.
    Promoted {
        /// Process.
        pid: i32,
        /// Region start.
        start: u64,
        /// Its benefit, ns per second (coverage policy).
        benefit_ns_per_s: Option<f64>,
        /// Resident pages before.
        resident: u64,
        /// Time the collapse took, ms.
        ms: f64,
    },
    /// The kernel refused the collapse.
    Failed {
        /// Process.
        pid: i32,
        /// Region start.
        start: u64,
        /// The kernel's answer.
        why: String,
    },
    /// Not promoted in this step, and why (the budget, no benefit).
    Skipped {
        /// Process.
        pid: i32,
        /// Regions passed over.
        regions: u64,
        /// Why.
        why: String,
    },
    /// The process is gone (exited, or replaced its program).
    Gone {
        /// Process.
        pid: i32,
        /// What happened.
        why: String,
    },
    /// Zero-filled base pages of a huge page given back.
    Recovered {
        /// Process.
        pid: i32,
        /// Region start.
        start: u64,
        /// Pages given back.
        zero_pages: u64,
        /// The longest time the process was stopped in this step's
        /// recovery ([`REGIONS_PER_STOP`] regions a stop), ms.
        stopped_ms: f64,
        /// Why memory counted as tight.
        pressure: String,
    },
    /// A system setting changed while memory is tight.
    Tuned {
        /// The file.
        knob: String,
        /// Its value before.
        from: String,
        /// Its value now.
        to: String,
    },
    /// A system setting that could not be changed.
    NotTuned {
        /// The file.
        knob: String,
        /// Why.
        why: String,
    },
    /// A system setting put back.
    PutBack {
        /// The file.
        knob: String,
        /// Its value again.
        to: String,
    },
    /// Bloat could not be recovered in this process.
    NotRecovered {
        /// Process.
        pid: i32,
        /// Why.
        why: String,
    },
    /// Coverage of this process could not be measured this step.
    NoCoverage {
        /// Process.
        pid: i32,
        /// Why.
        why: String,
    },
}

/// What one step measured and did.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Since the agent started, ms.
    pub t_ms: u64,
    /// Per process: regions already huge, candidates.
    pub processes: Vec<ProcessState>,
    /// The candidates, best first in the policy's order.
    pub candidates: Vec<Candidate>,
    /// What was done.
    pub actions: Vec<Action>,
    /// Time the step took, ms (the coverage window included).
    pub step_ms: f64,
    /// CPU time the agent's thread used in the step, ms.
    pub cpu_ms: f64,
}

/// One process as a step saw it.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessState {
    /// Process.
    pub pid: i32,
    /// Regions mapped by a huge page.
    pub huge_regions: u64,
    /// Candidates for promotion.
    pub candidates: u64,
    /// Huge pages this agent promoted in it so far.
    pub promoted: u64,
    /// The sum of its candidates' benefits, ns per second.
    pub expected_ns_per_s: f64,
}

/// Counters since the agent started (for metrics).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counters {
    /// Steps taken.
    pub steps: u64,
    /// Huge pages promoted.
    pub promoted: u64,
    /// Collapses the kernel refused.
    pub failed: u64,
    /// Candidates passed over for the budget.
    pub skipped_budget: u64,
    /// CPU time of the agent's steps, ms.
    pub cpu_ms: f64,
    /// Time in collapses, ms.
    pub collapse_ms: f64,
    /// Zero-filled pages given back.
    pub recovered_pages: u64,
}

/// A process as a step saw it: its target's index, its candidates
/// (region, resident pages), its regions already huge.
type Seen = (usize, Vec<(Region, u64)>, u64);

struct Target {
    pid: i32,
    pidfd: OwnedFd,
    coverage: std::result::Result<WriteCoverage, String>,
    promoted: u64,
    gone: bool,
}

/// The agent: the processes it watches and what it has done.
pub struct Agent {
    targets: Vec<Target>,
    opts: Options,
    started: Instant,
    last_step: Option<Instant>,
    /// Huge pages earned by time and not spent yet.
    allowance: f64,
    counters: Counters,
    /// `max_ptes_none` while it is lowered (see [`Recovery::tune_khugepaged`]).
    khugepaged: Option<crate::mech::settings::SettingGuard>,
    /// When memory was last tight for a watched process.
    last_tight: Option<Instant>,
    /// Coverage by idle page tracking (where the kernel has it), not from
    /// inside the processes.
    idle_pages: bool,
}

/// Pages touched in each of `cands` by a coverage report.
fn touched_in(rep: &crate::mech::access::CoverageReport, cands: &[(Region, u64)]) -> Vec<u64> {
    let by: std::collections::HashMap<u64, u64> =
        rep.regions.iter().map(|r| (r[0], r[3])).collect();
    cands
        .iter()
        .map(|c| by.get(&c.0.start).copied().unwrap_or(0))
        .collect()
}

/// Zero-filled runs of pages in `buf` (at `start`): `(address, pages)`.
fn zero_runs(start: u64, buf: &[u8]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (k, p) in buf.chunks_exact(PAGE_SIZE).enumerate() {
        if p.iter().all(|&b| b == 0) {
            let a = start + (k * PAGE_SIZE) as u64;
            match runs.last_mut() {
                Some(r) if r.0 + r.1 * PAGE_SIZE as u64 == a => r.1 += 1,
                _ => runs.push((a, 1)),
            }
        }
    }
    runs
}

/// Gives back the zero-filled base pages of the huge `regions` of `pid`
/// that hold at least `threshold` of them (see the module): the regions
/// read first while it runs (to choose), then the pages found zero read
/// again while it is stopped, and only those still zero given back, by the
/// process itself, [`REGIONS_PER_STOP`] regions a stop. Returns the pages
/// given back per region and the longest time it was stopped.
fn recover(pid: i32, regions: &[Region], threshold: u64) -> Result<(Vec<(u64, u64)>, f64)> {
    let mut buf = vec![0u8; HUGE_PAGE_SIZE];
    let mut chosen = Vec::new();
    for r in regions {
        crate::mech::walk::read_remote(pid, r.start, &mut buf)?;
        let runs = zero_runs(r.start, &buf);
        if runs.iter().map(|z| z.1).sum::<u64>() >= threshold.max(1) {
            chosen.push((r.start, runs));
        }
    }
    if chosen.is_empty() {
        return Ok((Vec::new(), 0.0));
    }
    crate::mech::inject::check_target(pid, "bloat recovery", "the madvise call")?;
    // A few regions per stop: the process is never stopped for long.
    let mut done = Vec::new();
    let mut longest = 0.0f64;
    for part in chosen.chunks(REGIONS_PER_STOP) {
        let (d, ms) = give_back(pid, part)?;
        done.extend(d);
        longest = longest.max(ms);
    }
    Ok((done, longest))
}

/// Regions of one process given back in one stop.
pub const REGIONS_PER_STOP: usize = 32;

/// Stops `pid`, reads again the zero runs of `chosen` (region, runs found
/// zero while it ran), gives back those still zero, lets it run, and splits
/// the huge pages. The pages given back per region and the time stopped.
fn give_back(pid: i32, chosen: &[(u64, Vec<(u64, u64)>)]) -> Result<(Vec<(u64, u64)>, f64)> {
    // The buffer for the second read, written once before the stop, so
    // that taking its pages is not part of the time the process is stopped.
    let largest = chosen
        .iter()
        .map(|c| c.1.iter().map(|z| z.1).sum::<u64>())
        .max()
        .unwrap_or(0);
    let mut again = vec![1u8; largest as usize * PAGE_SIZE];
    let t = Instant::now();
    let stopped = crate::mech::stop::Stopped::new(pid)?;
    let remote = crate::mech::inject::Remote::new(&stopped)?;
    // Read again what was zero, now that nothing of the process runs: a
    // page written since the first read is not zero any more, and stays.
    let mut runs = Vec::new();
    let mut owner = Vec::new();
    for (i, (_, first)) in chosen.iter().enumerate() {
        {
            let mut parts = Vec::with_capacity(first.len());
            let mut rest = again.as_mut_slice();
            for &(a, n) in first {
                let (head, tail) = rest.split_at_mut(n as usize * PAGE_SIZE);
                parts.push((a, head));
                rest = tail;
            }
            crate::mech::walk::read_remote_many(pid, &mut parts)?;
        }
        let mut off = 0;
        for &(a, n) in first {
            for (a, m) in zero_runs(a, &again[off..off + n as usize * PAGE_SIZE]) {
                runs.push((a, m * PAGE_SIZE as u64));
                owner.push(i);
            }
            off += n as usize * PAGE_SIZE;
        }
    }
    let given = remote.madvise_many(&runs, libc::MADV_DONTNEED)?;
    drop(stopped);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let mut done: Vec<(u64, u64)> = chosen.iter().map(|c| (c.0, 0)).collect();
    for (k, bytes) in given.iter().enumerate() {
        done[owner[k]].1 += bytes / PAGE_SIZE as u64;
    }
    // The pages given back leave their huge page mapped in part: the kernel
    // frees them (and uncharges them from the cgroup) only when it splits
    // the huge page, under memory reclaim. MADV_COLD on one page still
    // mapped splits it now; it only moves that page to the inactive list.
    let mut live = Vec::new();
    for (i, (start, _)) in chosen.iter().enumerate() {
        if done[i].1 == 0 {
            continue;
        }
        let mine: Vec<(u64, u64)> = (0..runs.len())
            .filter(|&k| owner[k] == i && given[k] > 0)
            .map(|k| runs[k])
            .collect();
        let page = (0..512u64)
            .map(|p| start + p * PAGE_SIZE as u64)
            .find(|&a| !mine.iter().any(|&(r, n)| a >= r && a < r + n));
        if let Some(a) = page {
            live.push((a, PAGE_SIZE));
        }
    }
    if !live.is_empty() {
        if let Ok(pidfd) = process::pidfd_open(pid) {
            for batch in live.chunks(1024) {
                // Best effort: a refusal leaves the pages to the kernel's
                // deferred split.
                let _ = process::process_madvise(pidfd.as_raw_fd(), batch, libc::MADV_COLD);
            }
        }
    }
    Ok((done, ms))
}

impl Agent {
    /// An agent over `pids` (each must exist; coverage is set up per
    /// process, and a process whose coverage cannot be measured is ranked
    /// by utilisation with the reason in each step).
    pub fn new(pids: &[i32], opts: Options) -> Result<Agent> {
        let p = crate::mech::probe::get();
        if !p.process_madvise {
            return Err(Error::Unsupported {
                feature: "process_madvise",
                why: p.why("process_madvise"),
            });
        }
        if !p.madv_collapse {
            return Err(Error::Unsupported {
                feature: "MADV_COLLAPSE",
                why: p.why("madv_collapse"),
            });
        }
        let mut a = Agent {
            targets: Vec::new(),
            opts,
            started: Instant::now(),
            last_step: None,
            allowance: 0.0,
            counters: Counters::default(),
            khugepaged: None,
            last_tight: None,
            idle_pages: crate::mech::access::idle_page_unavailable().is_none(),
        };
        for &pid in pids {
            a.add(pid)?;
        }
        Ok(a)
    }

    /// Watches one more process.
    pub fn add(&mut self, pid: i32) -> Result<()> {
        procfs::check_target(pid)?;
        let pidfd = process::pidfd_open(pid).map_err(|e| Error::for_pid(pid, "pidfd_open", e))?;
        let coverage = if self.idle_pages {
            Err("idle page tracking measures coverage".into())
        } else if self.opts.policy == Policy::Coverage {
            WriteCoverage::new(pid).map_err(|e| e.to_string())
        } else {
            Err("the policy does not use coverage".into())
        };
        self.targets.push(Target {
            pid,
            pidfd,
            coverage,
            promoted: 0,
            gone: false,
        });
        Ok(())
    }

    /// Lowers `max_ptes_none` while memory is `tight` (or was, within the
    /// hold), puts it back when it is not.
    fn tune_khugepaged(&mut self, tight: bool, zero_pages: u64, actions: &mut Vec<Action>) {
        let want = zero_pages.clamp(1, 512) - 1;
        match (&self.khugepaged, tight) {
            (None, true) => {
                let now: Option<u64> = procfs::read_trimmed(MAX_PTES_NONE)
                    .ok()
                    .and_then(|v| v.parse().ok());
                if now.is_some_and(|n| n > want) {
                    match crate::mech::settings::SettingGuard::set(MAX_PTES_NONE, &want.to_string())
                    {
                        Ok(g) => {
                            actions.push(Action::Tuned {
                                knob: MAX_PTES_NONE.into(),
                                from: g.old().to_string(),
                                to: want.to_string(),
                            });
                            self.khugepaged = Some(g);
                        }
                        Err(e) => actions.push(Action::NotTuned {
                            knob: MAX_PTES_NONE.into(),
                            why: e.to_string(),
                        }),
                    }
                }
            }
            (Some(g), false) => {
                let to = g.old().to_string();
                self.khugepaged = None;
                actions.push(Action::PutBack {
                    knob: MAX_PTES_NONE.into(),
                    to,
                });
            }
            _ => {}
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Whether any watched process is still there.
    pub fn watching(&self) -> bool {
        self.targets.iter().any(|t| !t.gone)
    }

    /// Measures, decides and promotes once (the coverage window included).
    pub fn step(&mut self) -> Result<Step> {
        let t0 = Instant::now();
        let cpu0 = crate::mech::cpu::thread_cpu_ms();
        let mut actions = Vec::new();
        // Budget earned since the last step, up to one interval's worth.
        let now = Instant::now();
        let earned = match self.last_step {
            Some(t) => now.duration_since(t).as_secs_f64() * self.opts.budget.per_second,
            None => self.opts.interval.as_secs_f64() * self.opts.budget.per_second,
        };
        let cap = (self.opts.interval.as_secs_f64() * self.opts.budget.per_second).max(1.0);
        self.allowance = (self.allowance + earned).min(cap);
        self.last_step = Some(now);
        // What each process holds.
        // Per process: its target's index, its candidates (region,
        // resident pages), its regions already huge.
        let mut per: Vec<Seen> = Vec::new();
        let mut huge_regions: Vec<(usize, Vec<Region>)> = Vec::new();
        for (i, t) in self.targets.iter_mut().enumerate() {
            if t.gone {
                continue;
            }
            let regions = PageWalker::new(Some(t.pid))
                .and_then(|mut w| crate::mech::walk::huge_regions(t.pid, &mut w));
            match regions {
                Ok(rs) => {
                    huge_regions.push((i, rs.iter().filter(|r| r.2).map(|r| r.0).collect()));
                    let huge = rs.iter().filter(|r| r.2).count() as u64;
                    let cands = rs
                        .into_iter()
                        .filter(|r| !r.2 && r.1 > 0)
                        .map(|r| (r.0, r.1))
                        .collect();
                    per.push((i, cands, huge));
                }
                Err(e) => {
                    t.gone = true;
                    actions.push(Action::Gone {
                        pid: t.pid,
                        why: e.to_string(),
                    });
                }
            }
        }
        // Bloat recovery, when memory is tight.
        let mut tight_pids = Vec::new();
        if let Some(rec) = self.opts.recovery.clone() {
            let mut any_tight = false;
            for (i, regions) in &huge_regions {
                let pid = self.targets[*i].pid;
                let (tight, pressure) = match rec.when.holds(pid) {
                    Ok(h) => h,
                    Err(e) => {
                        actions.push(Action::NotRecovered {
                            pid,
                            why: format!("memory pressure unknown: {e}"),
                        });
                        continue;
                    }
                };
                if !tight {
                    continue;
                }
                any_tight = true;
                tight_pids.push(pid);
                match recover(pid, regions, rec.zero_pages) {
                    Ok((done, ms)) => {
                        for (start, n) in done {
                            self.counters.recovered_pages += n;
                            actions.push(Action::Recovered {
                                pid,
                                start,
                                zero_pages: n,
                                stopped_ms: ms,
                                pressure: pressure.clone(),
                            });
                        }
                    }
                    Err(e) => actions.push(Action::NotRecovered {
                        pid,
                        why: e.to_string(),
                    }),
                }
            }
            if any_tight {
                self.last_tight = Some(Instant::now());
            }
            let held = self.last_tight.is_some_and(|t| t.elapsed() < rec.hold);
            if rec.tune_khugepaged {
                self.tune_khugepaged(any_tight || held, rec.zero_pages, &mut actions);
            }
            // While memory is tight (or was, within the hold), a promotion
            // must not bring back what recovery gives back: a candidate
            // needs more than 512 - zero_pages resident pages.
            let least = 512 - rec.zero_pages.clamp(1, 512) + 1;
            for (i, cands, _) in per.iter_mut() {
                let pid = self.targets[*i].pid;
                if !held && !tight_pids.contains(&pid) {
                    continue;
                }
                let before = cands.len();
                cands.retain(|c| c.1 >= least);
                if cands.len() < before {
                    actions.push(Action::Skipped {
                        pid,
                        regions: (before - cands.len()) as u64,
                        why: format!("memory is tight: fewer than {least} of 512 pages resident"),
                    });
                }
            }
        }
        // Coverage over one window for every process at once.
        let mut touched: Vec<Option<Vec<u64>>> = vec![None; per.len()];
        let by_idle = self.opts.policy == Policy::Coverage && self.idle_pages;
        if by_idle {
            // Idle page tracking: reads and writes, every process at once,
            // nothing inside them.
            let pids: Vec<i32> = per.iter().map(|p| self.targets[p.0].pid).collect();
            match crate::mech::access::idle_pages(&pids, self.opts.window) {
                Ok(reps) => {
                    for (k, (i, cands, _)) in per.iter().enumerate() {
                        let pid = self.targets[*i].pid;
                        if let Some(rep) = reps.iter().find(|r| r.pid == pid) {
                            touched[k] = Some(touched_in(rep, cands));
                        }
                    }
                }
                Err(e) => {
                    for &pid in &pids {
                        actions.push(Action::NoCoverage {
                            pid,
                            why: e.to_string(),
                        });
                    }
                }
            }
        } else if self.opts.policy == Policy::Coverage {
            let mut armed = vec![false; per.len()];
            for (k, (i, cands, _)) in per.iter().enumerate() {
                let t = &mut self.targets[*i];
                if let Ok(c) = t.coverage.as_mut() {
                    let rs: Vec<Region> = cands.iter().map(|c| c.0).collect();
                    match c.start(&rs) {
                        Ok(()) => armed[k] = true,
                        Err(e) => actions.push(Action::NoCoverage {
                            pid: t.pid,
                            why: e.to_string(),
                        }),
                    }
                }
            }
            if armed.iter().any(|a| *a) {
                std::thread::sleep(self.opts.window);
            }
            for (k, (i, cands, _)) in per.iter().enumerate() {
                let t = &mut self.targets[*i];
                match t.coverage.as_mut() {
                    Ok(c) if armed[k] => match c.finish() {
                        Ok(rep) => {
                            touched[k] = Some(touched_in(&rep, cands));
                        }
                        Err(e) => actions.push(Action::NoCoverage {
                            pid: t.pid,
                            why: e.to_string(),
                        }),
                    },
                    Ok(_) => {}
                    Err(why) => actions.push(Action::NoCoverage {
                        pid: t.pid,
                        why: why.clone(),
                    }),
                }
            }
        }
        let window_s = self.opts.window.as_secs_f64().max(1e-3);
        // Candidates with their benefit.
        let mut lists: Vec<Vec<Candidate>> = per
            .iter()
            .enumerate()
            .map(|(k, (i, cands, _))| {
                let pid = self.targets[*i].pid;
                cands
                    .iter()
                    .enumerate()
                    .map(|(j, (r, resident))| {
                        let t = touched[k].as_ref().map(|v| v[j]);
                        let rate = t.map(|t| t as f64 / window_s);
                        Candidate {
                            pid,
                            start: r.start,
                            resident: *resident,
                            touched: t,
                            rate,
                            benefit_ns_per_s: rate.map(|r| r * self.opts.walk_ns),
                        }
                    })
                    .collect()
            })
            .collect();
        let order = self.order(&mut lists);
        let mut processes: Vec<ProcessState> = per
            .iter()
            .zip(&lists)
            .map(|((i, _, huge), l)| ProcessState {
                pid: self.targets[*i].pid,
                huge_regions: *huge,
                candidates: l.len() as u64,
                promoted: self.targets[*i].promoted,
                expected_ns_per_s: l.iter().filter_map(|c| c.benefit_ns_per_s).sum(),
            })
            .collect();
        // Promote in that order, under the budget.
        let cpu_budget_ms = self.opts.interval.as_secs_f64() * 1e3 * self.opts.budget.cpu_share;
        let mut spent_ms = 0.0;
        let mut skipped: std::collections::BTreeMap<i32, (u64, String)> = Default::default();
        for c in &order {
            let left_total = self
                .opts
                .budget
                .total
                .map_or(u64::MAX, |t| t.saturating_sub(self.counters.promoted));
            let why = if left_total == 0 {
                Some("the total budget of huge pages is spent".to_string())
            } else if self.allowance < 1.0 {
                Some(format!(
                    "the budget of {} huge pages per second is spent for now",
                    self.opts.budget.per_second
                ))
            } else if spent_ms > cpu_budget_ms {
                Some(format!(
                    "the CPU budget of the step ({cpu_budget_ms:.1} ms) is spent"
                ))
            } else {
                None
            };
            if let Some(why) = why {
                let e = skipped.entry(c.pid).or_insert((0, why));
                e.0 += 1;
                self.counters.skipped_budget += 1;
                continue;
            }
            let Some(t) = self.targets.iter_mut().find(|t| t.pid == c.pid) else {
                continue;
            };
            let tc = Instant::now();
            let r = crate::mech::inject::collapse(t.pidfd.as_raw_fd(), c.start, HUGE_PAGE_SIZE);
            let ms = tc.elapsed().as_secs_f64() * 1e3;
            spent_ms += ms;
            self.counters.collapse_ms += ms;
            match r {
                Ok(_) => {
                    self.allowance -= 1.0;
                    self.counters.promoted += 1;
                    t.promoted += 1;
                    if let Some(p) = processes.iter_mut().find(|p| p.pid == c.pid) {
                        p.promoted = t.promoted;
                    }
                    actions.push(Action::Promoted {
                        pid: c.pid,
                        start: c.start,
                        benefit_ns_per_s: c.benefit_ns_per_s,
                        resident: c.resident,
                        ms,
                    });
                }
                Err(e) => {
                    self.counters.failed += 1;
                    let gone = e.raw_os_error() == Some(libc::ESRCH);
                    actions.push(Action::Failed {
                        pid: c.pid,
                        start: c.start,
                        why: format!("process_madvise(MADV_COLLAPSE): {e}"),
                    });
                    if gone {
                        t.gone = true;
                    }
                }
            }
        }
        for (pid, (n, why)) in skipped {
            actions.push(Action::Skipped {
                pid,
                regions: n,
                why,
            });
        }
        let cpu_ms = crate::mech::cpu::thread_cpu_ms() - cpu0;
        self.counters.steps += 1;
        self.counters.cpu_ms += cpu_ms;
        let mut candidates: Vec<Candidate> = order;
        candidates.truncate(64);
        Ok(Step {
            t_ms: self.started.elapsed().as_millis() as u64,
            processes,
            candidates,
            actions,
            step_ms: t0.elapsed().as_secs_f64() * 1e3,
            cpu_ms,
        })
    }

    /// The candidates to promote, in the policy's order (those that would
    /// gain nothing are left out).
    fn order(&self, lists: &mut [Vec<Candidate>]) -> Vec<Candidate> {
        match self.opts.policy {
            Policy::AddressOrder => {
                let mut all: Vec<Candidate> = lists.iter().flatten().cloned().collect();
                all.sort_by_key(|c| (c.pid, c.start));
                all
            }
            Policy::Utilisation(threshold) => {
                let full = (HUGE_PAGE_SIZE / PAGE_SIZE) as f64;
                let mut all: Vec<Candidate> = lists
                    .iter()
                    .flatten()
                    .filter(|c| c.resident as f64 / full >= threshold)
                    .cloned()
                    .collect();
                all.sort_by(|a, b| b.resident.cmp(&a.resident).then(a.start.cmp(&b.start)));
                all
            }
            Policy::Coverage => {
                // Each process's candidates, best first; those measured with
                // no write in the window gain nothing and are left out; a
                // process without coverage is ranked by utilisation after
                // every measured one.
                for l in lists.iter_mut() {
                    l.retain(|c| c.benefit_ns_per_s.is_none_or(|b| b > 0.0));
                    l.sort_by(|a, b| {
                        b.benefit_ns_per_s
                            .unwrap_or(0.0)
                            .total_cmp(&a.benefit_ns_per_s.unwrap_or(0.0))
                            .then(b.resident.cmp(&a.resident))
                    });
                }
                let mut left: Vec<f64> = lists
                    .iter()
                    .map(|l| l.iter().filter_map(|c| c.benefit_ns_per_s).sum())
                    .collect();
                let mut next = vec![0usize; lists.len()];
                let mut out = Vec::new();
                loop {
                    // The process whose remaining candidates promise the most.
                    let best = (0..lists.len())
                        .filter(|&k| next[k] < lists[k].len())
                        .max_by(|&a, &b| left[a].total_cmp(&left[b]).then(b.cmp(&a)));
                    let Some(k) = best else { break };
                    let c = lists[k][next[k]].clone();
                    next[k] += 1;
                    left[k] -= c.benefit_ns_per_s.unwrap_or(0.0);
                    out.push(c);
                }
                out
            }
        }
    }

    /// The counters in the Prometheus text format.
    pub fn metrics(&self) -> String {
        let c = &self.counters;
        let mut s = String::new();
        let mut put = |name: &str, kind: &str, help: &str, v: f64| {
            crate::mech::metrics::prometheus_metric(
                &mut s,
                &format!("pagewise_thp_{name}"),
                kind,
                help,
                v,
            )
        };
        put(
            "steps_total",
            "counter",
            "Steps the agent has taken.",
            c.steps as f64,
        );
        put(
            "promoted_total",
            "counter",
            "Huge pages promoted (MADV_COLLAPSE).",
            c.promoted as f64,
        );
        put(
            "failed_total",
            "counter",
            "Collapses the kernel refused.",
            c.failed as f64,
        );
        put(
            "skipped_budget_total",
            "counter",
            "Candidates passed over because the budget was spent.",
            c.skipped_budget as f64,
        );
        put(
            "cpu_seconds_total",
            "counter",
            "CPU time of the agent's steps.",
            c.cpu_ms / 1e3,
        );
        put(
            "collapse_seconds_total",
            "counter",
            "Time spent in collapses.",
            c.collapse_ms / 1e3,
        );
        put(
            "watched_processes",
            "gauge",
            "Processes watched and still there.",
            self.targets.iter().filter(|t| !t.gone).count() as f64,
        );
        for t in &self.targets {
            s += &format!(
                "pagewise_thp_promoted{{pid=\"{}\"}} {}\n",
                t.pid, t.promoted
            );
        }
        s
    }
}
