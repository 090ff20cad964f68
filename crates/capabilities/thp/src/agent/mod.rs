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
//!   from outside ([`pagewise_mech::access::WriteCoverage`]). A process it cannot
//!   trace is ranked by utilisation and the step says why. Processes of a
//!   far-memory instance are served page by page and hold no huge pages:
//!   the far-memory sampler is not a source here.
//! - **Benefit** of promoting a region: its coverage × the cost of a page
//!   walk on this machine ([`pagewise_mech::walk_cost::WalkCost::walk_ns`]): each distinct page
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
//! `madvise(MADV_DONTNEED)` on the runs that are still zero ([`pagewise_mech::inject`]);
//! then it runs on. Nothing of the process can write while it is stopped,
//! so no write is lost: a page written after it was read is not given back.
//! The huge page is split by this; the pages given back read as zeros again
//! when touched. A region that fills up again becomes a candidate for
//! promotion like any other; while memory is tight, only one with more
//! than `512 - zero_pages` pages resident (a promotion must not bring back
//! what recovery gives back), and khugepaged is held to the same rule
//! ([`Recovery::tune_khugepaged`]). Memory counts as tight per process:
//! [`Pressure::LimitAbove`] reads the process's own memory cgroup.

mod recovery;
mod step;

use pagewise_mech::access::WriteCoverage;
use pagewise_mech::agent::{self, Metric, Targets};
use pagewise_mech::procfs;
use pagewise_mech::settings::SettingGuard;
use pagewise_mech::{Error, Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Which regions are promoted first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Policy {
    /// HawkEye: highest coverage × walk cost first, fairly across processes.
    Coverage,
    /// khugepaged's order: process by process, by address.
    AddressOrder,
    /// Ingens-like: regions whose resident share is at least this, fullest
    /// first.
    Utilisation(f64),
}

/// Whether this process may collapse huge pages in others
/// (`process_madvise(MADV_COLLAPSE)` needs `CAP_SYS_NICE`): without it,
/// every promotion the agent tries is refused.
pub fn may_collapse_in_others() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    pagewise_mech::procfs::has_capability(CAP_SYS_NICE)
}

impl Policy {
    /// The policy `s` names: `coverage`, `address` or `utilisation:F`
    /// (F a share, 0 to 1); what is wrong with it where it names none.
    pub fn parse(s: &str) -> std::result::Result<Policy, String> {
        match s {
            "coverage" => Ok(Policy::Coverage),
            "address" => Ok(Policy::AddressOrder),
            _ => match s.strip_prefix("utilisation:").map(str::parse::<f64>) {
                Some(Ok(f)) if (0.0..=1.0).contains(&f) => Ok(Policy::Utilisation(f)),
                Some(_) => Err(format!("policy {s}: the threshold is a share, 0 to 1")),
                None => Err(format!("policy {s}: coverage, address or utilisation:F")),
            },
        }
    }
}

/// Limits on what the agent does.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Budget {
    /// Huge pages promoted in all (`None`: no limit).
    pub total: Option<u64>,
    /// Huge pages per second.
    pub per_second: f64,
    /// Share of one CPU the collapses of one step may take (of the interval).
    pub cpu_share: f64,
}

setters!(Budget {
    total: Option<u64>,
    per_second: f64,
    cpu_share: f64,
});

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
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
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
    /// `MemAvailable` below a tenth of `MemTotal` (`/proc/meminfo`): the
    /// default of [`Recovery`] and of `thp run --recover-bloat`.
    pub fn available_below_a_tenth() -> Result<Pressure> {
        let t = pagewise_mech::procfs::read_trimmed("/proc/meminfo")
            .map_err(|e| Error::os("reading /proc/meminfo", e))?;
        let total = pagewise_mech::procfs::status_field(&t, "MemTotal").unwrap_or(0) * 1024;
        Ok(Pressure::AvailableBelow(total / 10))
    }

    /// Whether it holds now for process `pid`, and what was read.
    pub fn holds(&self, pid: i32) -> Result<(bool, String)> {
        match *self {
            Pressure::LimitAbove(pct) => {
                let Some(dir) = pagewise_mech::cgroup::memory_cgroup_dir(Some(pid))? else {
                    return Ok((false, "no memory cgroup".into()));
                };
                let u = pagewise_mech::cgroup::memory_use(&dir)?;
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
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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

impl Default for Recovery {
    /// Memory counts as tight when less than a tenth of it is available,
    /// huge pages with at least half their pages zero give them back,
    /// khugepaged is held to the same rule for a minute after.
    fn default() -> Self {
        Recovery {
            when: Pressure::available_below_a_tenth().unwrap_or(Pressure::AvailableBelow(0)),
            zero_pages: 256,
            tune_khugepaged: true,
            hold: Duration::from_secs(60),
        }
    }
}

setters!(Recovery {
    when: Pressure,
    zero_pages: u64,
    tune_khugepaged: bool,
    hold: Duration,
});

/// khugepaged's threshold of missing pages in a region it collapses (and
/// the THP shrinker's threshold of zero-filled pages).
pub const MAX_PTES_NONE: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_none";

/// How the agent runs.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
    /// Most candidates whose coverage a step measures (`None`: all of
    /// them), those measured longest ago first; the others keep what they
    /// measured last (a candidate never measured counts as untouched until
    /// it is). Each measured candidate is write-protected for the window,
    /// which is most of what a step costs: a node agent watching many
    /// processes bounds it so.
    pub coverage_per_step: Option<usize>,
}

setters!(Options {
    interval: Duration,
    window: Duration,
    policy: Policy,
    budget: Budget,
    walk_ns: f64,
    recovery: Option<Recovery>,
    coverage_per_step: Option<usize>,
});

impl Default for Options {
    fn default() -> Self {
        Options {
            interval: Duration::from_secs(1),
            window: Duration::from_millis(200),
            policy: Policy::Coverage,
            budget: Budget::default(),
            walk_ns: 30.0,
            recovery: None,
            coverage_per_step: None,
        }
    }
}

/// A region that could be promoted, as the last step measured it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(tag = "action", rename_all = "kebab-case")]
#[non_exhaustive]
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
        /// recovery (at most 32 regions a stop), ms.
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
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessState {
    /// The process: its pid, pid inside and container.
    #[serde(flatten)]
    pub process: pagewise_mech::agent::Named,
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
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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

/// The agent's state of one watched process.
struct Process {
    coverage: std::result::Result<WriteCoverage, String>,
    /// Per candidate (its start): the step its coverage was last measured
    /// at, and the pages it touched then.
    measured: HashMap<u64, (u64, u64)>,
    /// Huge pages promoted in it.
    promoted: u64,
    /// The group (a container, a pod) whose budget it draws on, if any.
    group: Option<String>,
}

/// A group of processes with a budget of its own (see
/// [`Agent::add_in_group`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    /// Huge pages its processes may be given in all.
    budget: u64,
    /// Huge pages its processes were given.
    promoted: u64,
}

/// The agent: the processes it watches and what it has done.
pub struct Agent {
    targets: Targets<Process>,
    opts: Options,
    started: Instant,
    last_step: Option<Instant>,
    /// Huge pages earned by time and not spent yet.
    allowance: f64,
    counters: Counters,
    /// `max_ptes_none` while it is lowered (see [`Recovery::tune_khugepaged`]).
    khugepaged: Option<SettingGuard>,
    /// When memory was last tight for a watched process.
    last_tight: Option<Instant>,
    /// Coverage by idle page tracking (where the kernel has it), not from
    /// inside the processes.
    idle_pages: bool,
    /// Groups with a budget of their own, by name.
    groups: BTreeMap<String, Group>,
}

impl Agent {
    /// An agent over `pids` (each must exist; coverage is set up per
    /// process, and a process whose coverage cannot be measured is ranked
    /// by utilisation with the reason in each step).
    pub fn new(pids: &[i32], opts: Options) -> Result<Agent> {
        let p = pagewise_mech::probe::get();
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
            targets: Targets::default(),
            opts,
            started: Instant::now(),
            last_step: None,
            allowance: 0.0,
            counters: Counters::default(),
            khugepaged: None,
            last_tight: None,
            idle_pages: pagewise_mech::access::idle_page_unavailable().is_none(),
            groups: BTreeMap::new(),
        };
        for &pid in pids {
            agent::Agent::add(&mut a, pid)?;
        }
        Ok(a)
    }

    /// The counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Watches `pid` (unless it is already) as one of group `group` (a
    /// container, a pod), whose processes may be given `budget` huge pages
    /// in all, besides the agent's own budget (the group's budget is set
    /// anew each time).
    pub fn add_in_group(&mut self, pid: i32, group: &str, budget: u64) -> Result<()> {
        if !self.targets.live().any(|t| t.pid == pid) {
            agent::Agent::add(self, pid)?;
        }
        let g = self.groups.entry(group.to_string()).or_insert(Group {
            budget,
            promoted: 0,
        });
        g.budget = budget;
        if let Some(t) = self.targets.live_mut().find(|t| t.pid == pid) {
            t.state.group = Some(group.to_string());
        }
        Ok(())
    }

    /// Stops watching `pid` (a process to be left alone from now on):
    /// whether it was watched. Its huge pages stay (as at the agent's
    /// end), and count in its group's budget.
    pub fn release(&mut self, pid: i32) -> bool {
        self.targets.release(pid).is_some()
    }

    /// Each group's huge pages given and budget, by name.
    pub fn groups(&self) -> Vec<(String, u64, u64)> {
        self.groups
            .iter()
            .map(|(k, g)| (k.clone(), g.promoted, g.budget))
            .collect()
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
}

impl agent::Agent for Agent {
    type Step = Step;
    type Action = Action;
    const NAME: &'static str = "thp";

    fn add(&mut self, pid: i32) -> Result<()> {
        let coverage = if self.idle_pages {
            Err("idle page tracking measures coverage".into())
        } else if self.opts.policy == Policy::Coverage {
            Ok(())
        } else {
            Err("the policy does not use coverage".into())
        };
        self.targets.add(pid, |pid| {
            Ok(Process {
                coverage: coverage
                    .and_then(|()| WriteCoverage::new(pid).map_err(|e| e.to_string())),
                measured: HashMap::new(),
                promoted: 0,
                group: None,
            })
        })
    }

    fn watching(&self) -> bool {
        self.targets.watching()
    }

    fn step(&mut self) -> Result<Step> {
        self.step_once()
    }

    /// Nothing it did must be taken back (a huge page stays one);
    /// khugepaged's setting is put back when the agent is dropped.
    fn end(&mut self) -> Vec<Action> {
        Vec::new()
    }

    fn metric_values(&self) -> Vec<Metric> {
        let c = &self.counters;
        let mut m = vec![
            Metric::counter("steps_total", "Steps the agent has taken.", c.steps as f64),
            Metric::counter(
                "promoted_total",
                "Huge pages promoted (MADV_COLLAPSE).",
                c.promoted as f64,
            ),
            Metric::counter(
                "failed_total",
                "Collapses the kernel refused.",
                c.failed as f64,
            ),
            Metric::counter(
                "skipped_budget_total",
                "Candidates passed over because the budget was spent.",
                c.skipped_budget as f64,
            ),
            Metric::counter(
                "cpu_seconds_total",
                "CPU time of the agent's steps.",
                c.cpu_ms / 1e3,
            ),
            Metric::counter(
                "collapse_seconds_total",
                "Time spent in collapses.",
                c.collapse_ms / 1e3,
            ),
            Metric::gauge(
                "watched_processes",
                "Processes watched and still there.",
                self.targets.live().count() as f64,
            ),
        ];
        for t in self.targets.all() {
            m.push(Metric::of_process(
                "promoted_bytes",
                "Memory of the process promoted to 2 MiB pages, bytes.",
                t,
                (t.state.promoted * HUGE_PAGE_SIZE as u64) as f64,
            ));
        }
        m
    }
}
