//! The merging agent ([`Agent`]): the processes it watches, the state of
//! their regions, and its step, whose phases are a file each (`step`:
//! the step in order; `sample`: which regions are hot and which pages
//! repeat; `act`: merging and splitting, each with its reason; `ksm`:
//! KSM's settings and figures).

mod act;
mod ksm;
mod sample;
mod step;

use crate::journal::AdviceJournal;
use crate::{
    Action, Counters, FilterReport, KsmReport, Options, Policy, ProcessState, Step, Thresholds,
    FREQ_MAX, KSM_DIR, MERGED_WATCH_EVERY, PAGES, REFRESH_LANES,
};
use ksm::{ksm_value, Ksm};
use pagewise_mech::access::RegionWrites;
use pagewise_mech::agent::{self, Metric, Targets};
use pagewise_mech::hash::PageDigest;
use pagewise_mech::inject::Inside;
use pagewise_mech::{Error, Result};
use std::collections::BTreeMap;
use std::time::Instant;

struct RegionState {
    freq: u8,
    /// Watched for writes since the last step's count.
    watched: bool,
    /// Steps of back-off it is in (see [`Options::hot_backoff`]), and
    /// those left before it is watched again.
    pause: u8,
    rest: u8,
    mergeable: bool,
    huge: bool,
    /// Per page: its digest, `None` when not resident or not read yet.
    digests: Vec<Option<PageDigest>>,
    read: bool,
    rate: Option<f64>,
}

/// The agent's state of one watched process.
struct Process {
    inside: Inside,
    /// The regions made mergeable, journaled before the call: taken back
    /// by the next pagewise command if the agent dies first.
    journal: AdviceJournal,
    writes: std::result::Result<RegionWrites, String>,
    regions: BTreeMap<u64, RegionState>,
    /// Whether its memory is made mergeable only as whole mappings.
    whole: bool,
    /// The mappings made mergeable whole, `(start, length)` as they were.
    merged_whole: Vec<(u64, u64)>,
}

/// The agent: the processes it watches and the state of their regions.
pub struct Agent {
    targets: Targets<Process>,
    opts: Options,
    started: Instant,
    /// When the writes were last counted.
    last_take: Option<Instant>,
    scan: u64,
    ksm: Ksm,
    counters: Counters,
    /// How full memory is, the first process's memory cgroup kept.
    utilisation: pagewise_mech::cgroup::Utilisation,
}

impl Agent {
    /// An agent over `pids` (each must exist). Starts ksmd when
    /// [`Options::full_scan`] asks (root).
    pub fn new(pids: &[i32], opts: Options) -> Result<Agent> {
        let p = pagewise_mech::probe::get();
        if !p.ksm {
            return Err(Error::Unsupported {
                feature: "KSM",
                why: p.why("ksm"),
            });
        }
        let ksm = Ksm::claim(&opts)?;
        let mut a = Agent {
            targets: Targets::default(),
            opts,
            started: Instant::now(),
            last_take: None,
            scan: 0,
            ksm,
            counters: Counters::default(),
            utilisation: Default::default(),
        };
        for &pid in pids {
            a.add_with(pid, Inside::Ptrace)?;
        }
        Ok(a)
    }

    /// Watches one more process, which makes the calls asked of it
    /// through `inside` (its shim, for a program started under pagewise;
    /// [`agent::Agent::add`] makes them under ptrace).
    pub fn add_with(&mut self, pid: i32, inside: Inside) -> Result<()> {
        let frequency = self.opts.policy.needs_frequency();
        let whole = self.opts.whole_mappings;
        self.targets.add(pid, |pid| {
            Ok(Process {
                inside,
                journal: AdviceJournal::new(pid, libc::MADV_UNMERGEABLE)?,
                writes: if frequency {
                    if pagewise_mech::procfs::owns_userfaultfd(pid) {
                        Err(step::HOLDS_USERFAULTFD.into())
                    } else {
                        RegionWrites::new(pid).map_err(|e| e.to_string())
                    }
                } else {
                    Err("the policy does not use access frequency".into())
                },
                regions: BTreeMap::new(),
                whole,
                merged_whole: Vec::new(),
            })
        })
    }

    /// How each watched process is made to call `madvise` itself: `shim`
    /// or `ptrace`.
    pub fn inside(&self) -> Vec<(i32, &'static str)> {
        self.targets
            .all()
            .iter()
            .map(|t| (t.pid, t.state.inside.name()))
            .collect()
    }

    /// The counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Turns the exact count of duplicates beside the filter on or off
    /// from the next step (it costs CPU the agent does not otherwise need:
    /// a benchmark turns it on for one step to measure the filter's error).
    pub fn set_exact(&mut self, on: bool) {
        self.opts.exact = on;
    }
}

impl agent::Agent for Agent {
    type Step = Step;
    type Action = Action;
    const NAME: &'static str = "dedup";

    /// Watches one more process; what it must call itself is made under
    /// ptrace.
    fn add(&mut self, pid: i32) -> Result<()> {
        self.add_with(pid, Inside::Ptrace)
    }

    fn watching(&self) -> bool {
        self.targets.watching()
    }

    fn step(&mut self) -> Result<Step> {
        self.step_once()
    }

    /// The regions the agent made mergeable are unmerged in every process
    /// still there (their pages unshared), so that the processes are left
    /// as they were found. KSM's settings are put back when the agent is
    /// dropped.
    fn end(&mut self) -> Vec<Action> {
        self.unmerge_all()
    }

    fn metric_values(&self) -> Vec<Metric> {
        let c = &self.counters;
        let mut m = vec![
            Metric::counter("steps_total", "Steps the agent has taken.", c.steps as f64),
            Metric::counter(
                "merged_regions_total",
                "2 MiB regions made mergeable.",
                c.merged as f64,
            ),
            Metric::counter(
                "split_regions_total",
                "Huge pages made mergeable (split by KSM as it merges).",
                c.split as f64,
            ),
            Metric::counter(
                "rebuilt_regions_total",
                "Regions unmerged and collapsed into huge pages again.",
                c.rebuilt as f64,
            ),
            Metric::counter(
                "failed_total",
                "Requests to a process that failed.",
                c.failed as f64,
            ),
            Metric::counter(
                "pages_read_total",
                "Pages read and hashed for the repetition rate.",
                c.pages_read as f64,
            ),
            Metric::counter(
                "cpu_seconds_total",
                "CPU time of the agent.",
                c.cpu_ms / 1e3,
            ),
            Metric::counter(
                "ksmd_cpu_seconds_total",
                "CPU time of ksmd while the agent ran.",
                c.ksmd_cpu_ms / 1e3,
            ),
            Metric::gauge(
                "ksm_sharing_bytes",
                "Memory merged by KSM, system-wide (pages_sharing), bytes.",
                (ksm_value("pages_sharing") * pagewise_sys::mem::page_size() as u64) as f64,
            ),
        ];
        for t in self.targets.live() {
            let merged = t.state.regions.values().filter(|r| r.mergeable).count();
            m.push(Metric::of_process(
                "mergeable_bytes",
                "Memory of the process advised mergeable (its 2 MiB regions), bytes.",
                t,
                (merged * pagewise_mech::HUGE_PAGE_SIZE) as f64,
            ));
        }
        m
    }
}
