//! Deduplication with mixed pages (SmartMD, from user space): each step the
//! agent measures, per 2 MiB region of the processes it watches, how often
//! the region is written and how many of its pages have a duplicate, and
//! chooses where KSM may merge:
//!
//! - **split and merge**: a cold huge page with many duplicates is made
//!   mergeable (`MADV_MERGEABLE` on exactly that region); KSM splits it when
//!   it merges its first page. A region of base pages with duplicates that
//!   is not hot is made mergeable as well.
//! - **keep**: a hot region, or one with few duplicates, is left alone.
//! - **rebuild**: a region made mergeable that turns hot again is unmerged
//!   (`MADV_UNMERGEABLE`, which unshares its pages) and collapsed into a
//!   huge page again (`MADV_COLLAPSE`, refused while KSM pages are in it).
//!
//! **Access frequency** is SmartMD's counter per region, 0 to
//! [`FREQ_MAX`]: +1 when the region was accessed since the last step, −1
//! when not. Accesses are writes, seen from outside by
//! [`crate::mech::access::RegionWrites`], all the time: a region is
//! write-protected until its first write, which is noted and lifts the
//! protection until the next step (one fault per region and step, a huge
//! page stays huge; a region not written costs nothing). A region only
//! read looks cold. A new region starts hot ([`FREQ_MAX`]): it counts as
//! cold only once it has gone unwritten for a few steps, so nothing is
//! split before it has been watched. The protection of a region made
//! mergeable is renewed one step in [`MERGED_WATCH_EVERY`] whether or not
//! a write was reported.
//!
//! **Repetition rate** is the share of a region's resident pages labelled
//! duplicate by SmartMD's counting Bloom filter ([`crate::mech::bloom`]) over
//! every watched process (zero-filled pages, which KSM merges too, count as
//! duplicates). The agent keeps each page's digest. Every region is
//! protected again before it is read, so a write after a read is always
//! seen: a region read before and not written since is known unchanged and
//! has only one page in [`REFRESH_LANES`] read again per step (for a write
//! no fault reports, a device's), where SmartMD, not knowing which pages
//! changed, reads a quarter of them (the agent does so too for a process
//! whose writes it cannot watch). A page newly in memory is read. Only
//! pages in memory are read (reading a swapped page would bring it back;
//! it keeps its digest), and a hot region is not read at all: it is kept
//! whatever its rate, and read in full once it cools down. With
//! [`Options::exact`] the exact count is made beside it and the filter's
//! error reported. A region made mergeable is not read again (reading
//! another process's memory with `process_vm_readv` pins its pages, and
//! the kernel unshares a KSM page pinned: the read would undo the merge);
//! its digests stay as they were read.
//!
//! **Thresholds** adapt to memory utilisation (the processes' memory cgroup
//! against its limit, or the machine's): the fuller memory is, the more
//! regions count as cold, the fewer duplicates make a region worth
//! splitting, and the hotter a split region must be to be rebuilt
//! ([`Thresholds::adapted`]).
//!
//! KSM may act only on memory a process made mergeable itself: the agent
//! makes the process call `madvise` ([`Inside`]): through its preload shim
//! for a program started under pagewise ([`Agent::add_with`]; nothing is
//! stopped), else while it is stopped under ptrace
//! ([`crate::mech::inject::madvise_in`]); and `process_madvise(MADV_COLLAPSE)`
//! rebuilds from outside. ksmd is started if it was not and its pace
//! (`pages_to_scan`) follows the pages made mergeable so that one pass
//! over them takes [`Options::full_scan`]; every KSM setting is put back
//! when the agent is dropped, and with [`Agent::end`] the regions it made
//! mergeable are unmerged.
//!
//! Three other policies are here for comparison ([`Policy`]): KSM
//! everywhere, no splitting, and Ingens-like (by access frequency only).

use crate::mech::access::RegionWrites;
use crate::mech::hash::{page_digest, zero_page_digest, PageDigest};
use crate::mech::inject::Inside;
use crate::mech::procfs;
use crate::mech::walk::PageWalker;
use crate::{Error, Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::process;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The highest access frequency.
pub const FREQ_MAX: u8 = 4;
/// A region made mergeable is watched for writes one step in this many
/// (its frequency moves only then): after KSM splits it, write-protecting
/// it takes 512 page-table entries instead of one, the agent's largest
/// cost, and it is watched only to see it turn hot.
pub const MERGED_WATCH_EVERY: u64 = 4;
/// A region not written since it was read has one page in this many read
/// again per step.
pub const REFRESH_LANES: usize = 16;
const PAGES: usize = HUGE_PAGE_SIZE / PAGE_SIZE;
/// KSM's settings.
pub const KSM_DIR: &str = "/sys/kernel/mm/ksm";

/// Which regions KSM may merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// SmartMD: cold regions with many duplicates, rebuilt when hot.
    SmartMd,
    /// Every region: KSM splits any huge page with a duplicate page.
    KsmEverywhere,
    /// Only regions of base pages; huge pages are never split.
    NoSplitting,
    /// Ingens-like: regions of base pages and cold huge pages, whatever
    /// their duplicates; rebuilt when hot.
    IngensLike,
}

impl Policy {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            Policy::SmartMd => "smartmd",
            Policy::KsmEverywhere => "ksm-everywhere",
            Policy::NoSplitting => "no-splitting",
            Policy::IngensLike => "ingens-like",
        }
    }

    /// The policy of a name of [`Policy::name`].
    pub fn parse(s: &str) -> Option<Policy> {
        [
            Policy::SmartMd,
            Policy::KsmEverywhere,
            Policy::NoSplitting,
            Policy::IngensLike,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }

    fn needs_frequency(self) -> bool {
        matches!(self, Policy::SmartMd | Policy::IngensLike)
    }
}

/// When a region counts as cold, hot and duplicate-rich.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Thresholds {
    /// Cold: access frequency at most this.
    pub cold_max: u8,
    /// Hot: access frequency at least this.
    pub hot_min: u8,
    /// Worth splitting: repetition rate at least this (0 to 1).
    pub repetition: f64,
}

impl Thresholds {
    /// SmartMD's adaptation to memory utilisation `u` (0 to 1): up to half
    /// full, only regions not accessed for a while are cold (frequency 0),
    /// a region needs half its pages duplicate, and frequency 2 makes it
    /// hot; from there to 90 % full, linearly, up to frequency 2 is cold,
    /// a tenth of pages duplicate is enough, and only frequency 4 is hot.
    pub fn adapted(u: f64) -> Thresholds {
        let s = ((u - 0.5) / 0.4).clamp(0.0, 1.0);
        Thresholds {
            cold_max: (2.0 * s).round() as u8,
            hot_min: 2 + (2.0 * s).round() as u8,
            repetition: 0.5 - 0.4 * s,
        }
    }
}

/// How the agent runs.
#[derive(Debug, Clone, Serialize)]
pub struct Options {
    /// The shortest time over which a step counts writes: each step counts
    /// those since the one before, and waits until this long has passed
    /// since it (the caller sets the time between steps).
    pub window: Duration,
    /// Which regions may be merged.
    pub policy: Policy,
    /// Read only a quarter of the pages of a region unchanged since it was
    /// last read (SmartMD's sampling).
    pub sample: bool,
    /// Also count duplicates exactly, to report the filter's error.
    pub exact: bool,
    /// Fixed thresholds instead of adapted ones.
    pub thresholds: Option<Thresholds>,
    /// Drive ksmd: start it, and set `pages_to_scan` so that one pass over
    /// the mergeable pages takes this long (`None`: leave ksmd as it is).
    pub full_scan: Option<Duration>,
    /// Regions rebuilt at most per step (each a collapse).
    pub rebuilds_per_step: usize,
    /// What to set KSM's `smart_scan` to while the agent runs (`None`:
    /// leave it). Smart scan skips, for up to 8 passes, a page that did
    /// not merge; when regions are made mergeable one after another, a
    /// page scanned before its twin was made mergeable is then skipped
    /// long after the twin arrives. Only with [`Policy::SmartMd`] and
    /// [`full_scan`](Self::full_scan): the comparison policies run ksmd as
    /// the kernel has it.
    pub smart_scan: Option<bool>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            window: Duration::from_millis(500),
            policy: Policy::SmartMd,
            sample: true,
            exact: false,
            thresholds: None,
            full_scan: Some(Duration::from_secs(10)),
            rebuilds_per_step: 32,
            smart_scan: Some(false),
        }
    }
}

/// What the agent did, and why.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// Made mergeable (a huge page: split and merge).
    Merge {
        /// Process.
        pid: i32,
        /// Region start.
        start: u64,
        /// It was a huge page.
        huge: bool,
        /// Its access frequency.
        freq: u8,
        /// Its repetition rate (`None` where the policy does not read it).
        rate: Option<f64>,
        /// Why.
        why: String,
    },
    /// Unmerged and collapsed into a huge page again.
    Rebuilt {
        /// Process.
        pid: i32,
        /// Region start.
        start: u64,
        /// Its access frequency.
        freq: u8,
        /// Whether the collapse made a huge page (the kernel may refuse).
        huge: bool,
        /// Why not, when not.
        why: Option<String>,
    },
    /// Something asked of a process failed.
    Failed {
        /// Process.
        pid: i32,
        /// What.
        what: String,
        /// The error.
        why: String,
    },
    /// The process is gone.
    Gone {
        /// Process.
        pid: i32,
        /// What happened.
        why: String,
    },
    /// Access frequency of this process is not measured.
    NoCoverage {
        /// Process.
        pid: i32,
        /// Why.
        why: String,
    },
    /// A KSM setting changed.
    Tuned {
        /// The file.
        knob: String,
        /// Its value now.
        to: String,
    },
    /// Regions made mergeable by the agent, unmerged at its end.
    Unmerged {
        /// Process.
        pid: i32,
        /// Regions.
        regions: u64,
    },
}

/// The counting Bloom filter against the exact count, in one step.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FilterReport {
    /// Resident non-zero pages looked up.
    pub looked_up: u64,
    /// Of them, labelled duplicate by the filter.
    pub labelled: u64,
    /// Of them, with a duplicate in fact (with [`Options::exact`]).
    pub exact: Option<u64>,
    /// Labelled without a duplicate, of those looked up (exact only).
    pub false_positive_rate: Option<f64>,
    /// Pages read and hashed in the step.
    pub pages_read: u64,
    /// Bytes the filter's counters take.
    pub filter_bytes: u64,
}

/// KSM as a step saw it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KsmReport {
    /// `pages_shared`: KSM pages in use.
    pub pages_shared: u64,
    /// `pages_sharing`: pages merged into them (the saving).
    pub pages_sharing: u64,
    /// `pages_to_scan` now.
    pub pages_to_scan: u64,
    /// Per watched process: `ksm_merging_pages` (`/proc/PID/ksm_stat`).
    pub merging_pages: BTreeMap<i32, u64>,
    /// ksmd's CPU time in the step, ms (`None`: no ksmd thread found).
    pub ksmd_cpu_ms: Option<f64>,
}

/// What one step measured and did.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Since the agent started, ms.
    pub t_ms: u64,
    /// Memory utilisation that set the thresholds, 0 to 1.
    pub utilisation: f64,
    /// What it was read from.
    pub utilisation_of: String,
    /// The thresholds used.
    pub thresholds: Thresholds,
    /// Regions watched.
    pub regions: u64,
    /// Of them, mapped by a huge page.
    pub huge: u64,
    /// Of them, made mergeable by the agent.
    pub mergeable: u64,
    /// Regions kept because hot.
    pub kept_hot: u64,
    /// Regions kept because they have few duplicates.
    pub kept_few_duplicates: u64,
    /// Regions written in the window.
    pub written: u64,
    /// The filter.
    pub filter: FilterReport,
    /// KSM.
    pub ksm: KsmReport,
    /// What was done.
    pub actions: Vec<Action>,
    /// The agent's CPU time in the step, ms: its own thread's and those
    /// of the threads serving write faults.
    pub cpu_ms: f64,
    /// The step's duration, ms (the window included).
    pub step_ms: f64,
}

/// Counters since the agent started (for metrics).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counters {
    /// Steps taken.
    pub steps: u64,
    /// Regions made mergeable.
    pub merged: u64,
    /// Of them, huge pages (split and merge).
    pub split: u64,
    /// Regions rebuilt into huge pages.
    pub rebuilt: u64,
    /// Requests to a process that failed.
    pub failed: u64,
    /// Pages read and hashed.
    pub pages_read: u64,
    /// The agent's CPU time, ms.
    pub cpu_ms: f64,
    /// ksmd's CPU time while the agent ran, ms.
    pub ksmd_cpu_ms: f64,
}

struct RegionState {
    freq: u8,
    /// Watched for writes since the last step's count.
    watched: bool,
    mergeable: bool,
    huge: bool,
    /// Per page: its digest, `None` when not resident or not read yet.
    digests: Vec<Option<PageDigest>>,
    read: bool,
    rate: Option<f64>,
}

struct Target {
    pid: i32,
    pidfd: OwnedFd,
    inside: Inside,
    /// The regions made mergeable, journaled before the call: taken back
    /// by the next pagewise command if the agent dies first.
    journal: crate::mech::settings::AdviceJournal,
    writes: std::result::Result<RegionWrites, String>,
    regions: BTreeMap<u64, RegionState>,
    gone: bool,
}

/// ksmd started and paced by the agent; its settings put back on drop.
struct Ksm {
    run: Option<crate::mech::settings::SettingGuard>,
    pages_to_scan: Option<crate::mech::settings::SettingGuard>,
    smart_scan: Option<crate::mech::settings::SettingGuard>,
    ksmd: Option<i32>,
    ksmd_cpu: Option<Duration>,
}

fn ksm_value(name: &str) -> u64 {
    procfs::read_trimmed(format!("{KSM_DIR}/{name}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The agent: the processes it watches and the state of their regions.
pub struct Agent {
    targets: Vec<Target>,
    opts: Options,
    started: Instant,
    /// When the writes were last counted.
    last_take: Option<Instant>,
    scan: u64,
    ksm: Ksm,
    counters: Counters,
}

impl Agent {
    /// An agent over `pids` (each must exist). Starts ksmd when
    /// [`Options::full_scan`] asks (root).
    pub fn new(pids: &[i32], opts: Options) -> Result<Agent> {
        let p = crate::mech::probe::get();
        if !p.ksm {
            return Err(Error::Unsupported {
                feature: "KSM",
                why: p.why("ksm"),
            });
        }
        let mut ksm = Ksm {
            run: None,
            pages_to_scan: None,
            smart_scan: None,
            ksmd: procfs::kernel_thread("ksmd"),
            ksmd_cpu: None,
        };
        // The agent drives ksmd: it holds its settings for its whole run
        // (journaled, put back at the end; a second agent is refused).
        if opts.full_scan.is_some() {
            let run = crate::mech::settings::SettingGuard::claim(format!("{KSM_DIR}/run"))?;
            if ksm_value("run") != 1 {
                run.write("1")?;
            }
            ksm.run = Some(run);
            ksm.pages_to_scan = Some(crate::mech::settings::SettingGuard::claim(format!(
                "{KSM_DIR}/pages_to_scan"
            ))?);
        }
        // A kernel without smart scan (before 6.7) has no such file: there
        // is nothing to set.
        let smart = format!("{KSM_DIR}/smart_scan");
        let smart_md = opts.policy == Policy::SmartMd;
        if let (Some(on), Some(_), true) = (opts.smart_scan, opts.full_scan, smart_md) {
            let want = if on { "1" } else { "0" };
            if std::path::Path::new(&smart).exists() {
                let g = crate::mech::settings::SettingGuard::claim(&smart)?;
                if procfs::read_trimmed(&smart).ok().as_deref() != Some(want) {
                    g.write(want)?;
                }
                ksm.smart_scan = Some(g);
            }
        }
        ksm.ksmd_cpu = ksm.ksmd.and_then(|k| procfs::cpu_time(k).ok());
        let mut a = Agent {
            targets: Vec::new(),
            opts,
            started: Instant::now(),
            last_take: None,
            scan: 0,
            ksm,
            counters: Counters::default(),
        };
        for &pid in pids {
            a.add(pid)?;
        }
        Ok(a)
    }

    /// Watches one more process; what it must call itself is made under
    /// ptrace.
    pub fn add(&mut self, pid: i32) -> Result<()> {
        self.add_with(pid, Inside::Ptrace)
    }

    /// Watches one more process, which makes the calls asked of it
    /// through `inside` (its shim, for a program started under pagewise).
    pub fn add_with(&mut self, pid: i32, inside: Inside) -> Result<()> {
        procfs::check_target(pid)?;
        let pidfd = process::pidfd_open(pid).map_err(|e| Error::for_pid(pid, "pidfd_open", e))?;
        let writes = if self.opts.policy.needs_frequency() {
            RegionWrites::new(pid).map_err(|e| e.to_string())
        } else {
            Err("the policy does not use access frequency".into())
        };
        let journal = crate::mech::settings::AdviceJournal::new(pid, libc::MADV_UNMERGEABLE)?;
        self.targets.push(Target {
            pid,
            pidfd,
            inside,
            journal,
            writes,
            regions: BTreeMap::new(),
            gone: false,
        });
        Ok(())
    }

    /// How each watched process is made to call `madvise` itself: `shim`
    /// or `ptrace`.
    pub fn inside(&self) -> Vec<(i32, &'static str)> {
        self.targets
            .iter()
            .map(|t| (t.pid, t.inside.name()))
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

    /// Whether any watched process is still there.
    pub fn watching(&self) -> bool {
        self.targets.iter().any(|t| !t.gone)
    }

    /// Measures, decides and acts once (the access window included).
    pub fn step(&mut self) -> Result<Step> {
        let t0 = Instant::now();
        let servers = |ts: &[Target]| -> f64 {
            ts.iter()
                .filter_map(|t| t.writes.as_ref().ok())
                .map(|w| w.server_cpu().as_secs_f64() * 1e3)
                .sum()
        };
        let cpu0 = crate::mech::cpu::thread_cpu_ms() + servers(&self.targets);
        let mut actions = Vec::new();
        self.scan += 1;
        // The regions of each process, their states carried over.
        for t in self.targets.iter_mut().filter(|t| !t.gone) {
            let rs = PageWalker::new(Some(t.pid))
                .and_then(|mut w| crate::mech::walk::huge_regions(t.pid, &mut w));
            match rs {
                Ok(rs) => {
                    let mut next = BTreeMap::new();
                    for (r, resident, huge) in rs {
                        // The shim's own memory is never the program's.
                        if t.inside.is_own_memory(r.start, r.len) {
                            continue;
                        }
                        // A region with nothing in memory is left out until
                        // it has some, unless it is known already: one swapped
                        // out whole keeps its state (above all whether it was
                        // made mergeable, to be unmerged at the end).
                        if resident == 0 && !t.regions.contains_key(&r.start) {
                            continue;
                        }
                        let mut s = t.regions.remove(&r.start).unwrap_or(RegionState {
                            freq: FREQ_MAX,
                            watched: false,
                            mergeable: false,
                            huge,
                            digests: vec![None; PAGES],
                            read: false,
                            rate: None,
                        });
                        s.huge = huge;
                        next.insert(r.start, s);
                    }
                    t.regions = next;
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
        // Access frequency: the writes since the last step (at least
        // `window` ago), then every region watched again before anything
        // is read, so that a write after a read is always seen.
        let mut written: HashMap<i32, BTreeSet<u64>> = HashMap::new();
        let mut n_written = 0;
        if self.opts.policy.needs_frequency() {
            if let Some(last) = self.last_take {
                std::thread::sleep(self.opts.window.saturating_sub(last.elapsed()));
            }
            self.last_take = Some(Instant::now());
            let again_turn = self.scan.is_multiple_of(MERGED_WATCH_EVERY);
            for t in self.targets.iter_mut().filter(|t| !t.gone) {
                let pid = t.pid;
                let w = match t.writes.as_mut() {
                    Ok(w) => w,
                    Err(why) => {
                        actions.push(Action::NoCoverage {
                            pid,
                            why: why.clone(),
                        });
                        continue;
                    }
                };
                let taken = match w.take() {
                    Ok(x) => x,
                    Err(e) => {
                        actions.push(Action::NoCoverage {
                            pid,
                            why: e.to_string(),
                        });
                        continue;
                    }
                };
                for (&start, s) in t.regions.iter_mut() {
                    if taken.forgets(start) {
                        // Unmapped, moved or dropped: what was read is gone,
                        // and whether it was written is not known.
                        s.digests.fill(None);
                        s.read = false;
                    } else if s.watched {
                        if taken.written.contains(&start) {
                            n_written += 1;
                            s.freq = (s.freq + 1).min(FREQ_MAX);
                        } else {
                            s.freq = s.freq.saturating_sub(1);
                        }
                    }
                }
                let rs: Vec<Region> = t
                    .regions
                    .keys()
                    .map(|&start| Region {
                        start,
                        len: HUGE_PAGE_SIZE as u64,
                    })
                    .collect();
                // A merged region's protection is renewed one step in
                // MERGED_WATCH_EVERY, whether or not a write was reported.
                let again: BTreeSet<u64> = t
                    .regions
                    .iter()
                    .filter(|(_, s)| again_turn && s.mergeable)
                    .map(|(&a, _)| a)
                    .collect();
                match w.watch(&rs, &again) {
                    Ok(()) => {
                        t.regions.values_mut().for_each(|s| s.watched = true);
                        written.insert(pid, taken.written);
                    }
                    Err(e) => actions.push(Action::NoCoverage {
                        pid,
                        why: e.to_string(),
                    }),
                }
            }
        }
        // Thresholds.
        let first = self.targets.iter().find(|t| !t.gone).map(|t| t.pid);
        let (utilisation, utilisation_of) = crate::mech::cgroup::memory_utilisation(first)
            .unwrap_or_else(|e| (0.0, format!("unknown: {e}")));
        let th = self
            .opts
            .thresholds
            .unwrap_or_else(|| Thresholds::adapted(utilisation));
        // Repetition rates.
        let filter = if self.opts.policy == Policy::SmartMd {
            self.repetition(&written, th.hot_min, &mut actions)
        } else {
            FilterReport::default()
        };
        // Decisions.
        let (mut kept_hot, mut kept_few) = (0, 0);
        let policy = self.opts.policy;
        let mut plans: Vec<(usize, Vec<u64>, Vec<u64>)> = Vec::new();
        for (i, t) in self.targets.iter().enumerate().filter(|t| !t.1.gone) {
            let measured = written.contains_key(&t.pid);
            let (mut merge, mut rebuild) = (Vec::new(), Vec::new());
            for (&start, s) in &t.regions {
                let hot = measured && s.freq >= th.hot_min;
                let cold = measured && s.freq <= th.cold_max;
                if s.mergeable {
                    if hot && policy.needs_frequency() {
                        rebuild.push(start);
                    }
                    continue;
                }
                let (go, why) = match policy {
                    Policy::KsmEverywhere => (true, "every region".to_string()),
                    Policy::NoSplitting => (!s.huge, "base pages".to_string()),
                    Policy::IngensLike => {
                        if !s.huge {
                            (true, "base pages".to_string())
                        } else {
                            (cold, format!("cold (frequency {})", s.freq))
                        }
                    }
                    Policy::SmartMd => {
                        let rate = s.rate.unwrap_or(0.0);
                        if hot {
                            kept_hot += 1;
                            (false, String::new())
                        } else if s.huge && cold && rate >= th.repetition {
                            (
                                true,
                                format!(
                                    "cold (frequency {}) and {:.0} % of its pages duplicate",
                                    s.freq,
                                    rate * 100.0
                                ),
                            )
                        } else if !s.huge && rate > 0.0 {
                            (
                                true,
                                format!(
                                    "base pages, {:.0} % of them duplicate, not hot",
                                    rate * 100.0
                                ),
                            )
                        } else {
                            if !s.huge || cold {
                                kept_few += 1;
                            } else {
                                kept_hot += 1;
                            }
                            (false, String::new())
                        }
                    }
                };
                if go {
                    merge.push(start);
                    actions.push(Action::Merge {
                        pid: t.pid,
                        start,
                        huge: s.huge,
                        freq: s.freq,
                        rate: s.rate,
                        why,
                    });
                }
            }
            rebuild.truncate(self.opts.rebuilds_per_step);
            plans.push((i, merge, rebuild));
        }
        // Acting.
        for (i, merge, rebuild) in plans {
            self.merge(i, &merge, &mut actions);
            self.rebuild(i, &rebuild, &mut actions);
        }
        let ksm = self.pace(&mut actions);
        // The agent's CPU: this thread's and the fault-serving threads'.
        let cpu_ms = (crate::mech::cpu::thread_cpu_ms() + servers(&self.targets) - cpu0).max(0.0);
        self.counters.steps += 1;
        self.counters.cpu_ms += cpu_ms;
        self.counters.pages_read += filter.pages_read;
        let all = || {
            self.targets
                .iter()
                .filter(|t| !t.gone)
                .flat_map(|t| t.regions.values())
        };
        Ok(Step {
            t_ms: self.started.elapsed().as_millis() as u64,
            utilisation,
            utilisation_of,
            thresholds: th,
            regions: all().count() as u64,
            huge: all().filter(|s| s.huge).count() as u64,
            mergeable: all().filter(|s| s.mergeable).count() as u64,
            kept_hot,
            kept_few_duplicates: kept_few,
            written: n_written,
            filter,
            ksm,
            actions,
            cpu_ms,
            step_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Reads the pages due (see the module), then labels every resident
    /// page of every watched process with the counting Bloom filter.
    /// Regions at least `hot_min` are not read: hot, they are kept
    /// whatever their rate, and are read in full once they cool down.
    fn repetition(
        &mut self,
        written: &HashMap<i32, BTreeSet<u64>>,
        hot_min: u8,
        actions: &mut Vec<Action>,
    ) -> FilterReport {
        let mut rep = FilterReport::default();
        let zero = zero_page_digest();
        let lane = (self.scan % 4) as usize;
        let mut buf = vec![0u8; HUGE_PAGE_SIZE];
        let mut present = Vec::new();
        for t in self.targets.iter_mut().filter(|t| !t.gone) {
            let mut walker = match PageWalker::new(Some(t.pid)) {
                Ok(w) => w,
                Err(e) => {
                    actions.push(Action::Failed {
                        pid: t.pid,
                        what: "reading its page map".into(),
                        why: e.to_string(),
                    });
                    continue;
                }
            };
            let w = written.get(&t.pid);
            let measured = w.is_some();
            for (&start, s) in t.regions.iter_mut() {
                // A region made mergeable is not read again: its rate no
                // longer decides anything, and a read by process_vm_readv
                // pins the pages, which unshares a page KSM merged.
                if s.mergeable {
                    continue;
                }
                if measured && s.freq >= hot_min {
                    s.read = false;
                    continue;
                }
                let r = Region {
                    start,
                    len: HUGE_PAGE_SIZE as u64,
                };
                // Only pages in memory are read: reading a swapped page
                // would bring it back. A swapped page keeps its digest.
                let both = pagewise_sys::pagemap::category::PRESENT
                    | pagewise_sys::pagemap::category::SWAPPED;
                if walker.categories(r, both, both, &mut present).is_err() {
                    continue;
                }
                let (mut resident, mut swapped) = ([false; PAGES], [false; PAGES]);
                for run in &present {
                    let (from, to) = (
                        (run.start - start) as usize / PAGE_SIZE,
                        (run.end - start) as usize / PAGE_SIZE,
                    );
                    let in_memory = run.categories & pagewise_sys::pagemap::category::PRESENT != 0;
                    let to_set = if in_memory {
                        &mut resident
                    } else {
                        &mut swapped
                    };
                    to_set[from..to].iter_mut().for_each(|r| *r = true);
                }
                // A region written since its last read is read whole. One
                // not written is known unchanged where writes are watched:
                // one page in REFRESH_LANES is read again per step, for a
                // write no fault reports (a device's). Where they are not,
                // a quarter is, as SmartMD reads the pages it cannot tell
                // unchanged.
                let full = !self.opts.sample || !s.read || w.is_some_and(|w| w.contains(&start));
                let (lanes, lane) = if measured {
                    (REFRESH_LANES, (self.scan % REFRESH_LANES as u64) as usize)
                } else {
                    (4, lane)
                };
                // A page in memory with no digest is new (populated
                // without a write fault) or back from swap: read it too.
                let wanted: Vec<usize> = (0..PAGES)
                    .filter(|&p| {
                        resident[p] && (full || p % lanes == lane || s.digests[p].is_none())
                    })
                    .collect();
                let ok = if wanted.len() == PAGES {
                    crate::mech::walk::read_remote(t.pid, start, &mut buf).is_ok()
                } else {
                    let mut parts: Vec<(u64, &mut [u8])> = buf
                        .chunks_exact_mut(PAGE_SIZE)
                        .enumerate()
                        .filter(|(p, _)| wanted.binary_search(p).is_ok())
                        .map(|(p, b)| (start + (p * PAGE_SIZE) as u64, b))
                        .collect();
                    crate::mech::walk::read_remote_many(t.pid, &mut parts).is_ok()
                };
                if !ok {
                    continue;
                }
                for (p, d) in s.digests.iter_mut().enumerate() {
                    if !resident[p] && !swapped[p] {
                        *d = None;
                    }
                }
                for &p in &wanted {
                    s.digests[p] = Some(page_digest(&buf[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]));
                }
                rep.pages_read += wanted.len() as u64;
                s.read = true;
            }
        }
        // The filter over every digest kept.
        let digests = || {
            self.targets
                .iter()
                .filter(|t| !t.gone)
                .flat_map(|t| t.regions.values())
                .flat_map(|s| s.digests.iter().flatten())
                .filter(|&&d| d != zero)
        };
        let n = digests().count();
        let mut bloom = crate::mech::bloom::CountingBloom::for_pages(n);
        for &d in digests() {
            bloom.insert(d);
        }
        rep.filter_bytes = bloom.packed_bytes();
        let counts: Option<HashMap<PageDigest, u32>> = self.opts.exact.then(|| {
            let mut m = HashMap::with_capacity(n);
            for &d in digests() {
                *m.entry(d).or_insert(0) += 1;
            }
            m
        });
        let (mut exact, mut fp) = (0u64, 0u64);
        for t in self.targets.iter_mut().filter(|t| !t.gone) {
            for s in t.regions.values_mut() {
                let (mut resident, mut dup) = (0u64, 0u64);
                for d in s.digests.iter().flatten() {
                    resident += 1;
                    if *d == zero {
                        dup += 1;
                        continue;
                    }
                    rep.looked_up += 1;
                    let labelled = bloom.probably_duplicate(*d);
                    if labelled {
                        dup += 1;
                        rep.labelled += 1;
                    }
                    if let Some(c) = &counts {
                        let real = c.get(d).copied().unwrap_or(0) >= 2;
                        exact += u64::from(real);
                        fp += u64::from(labelled && !real);
                    }
                }
                s.rate = (resident > 0).then(|| dup as f64 / resident as f64);
            }
        }
        if counts.is_some() {
            rep.exact = Some(exact);
            rep.false_positive_rate = Some(fp as f64 / rep.looked_up.max(1) as f64);
        }
        rep
    }

    /// Makes regions `starts` of target `i` mergeable.
    fn merge(&mut self, i: usize, starts: &[u64], actions: &mut Vec<Action>) {
        if starts.is_empty() {
            return;
        }
        let t = &mut self.targets[i];
        let ranges: Vec<(u64, u64)> = starts.iter().map(|&s| (s, HUGE_PAGE_SIZE as u64)).collect();
        if let Err(e) = t.journal.given(&ranges) {
            self.counters.failed += 1;
            actions.push(Action::Failed {
                pid: t.pid,
                what: "journaling madvise(MADV_MERGEABLE)".into(),
                why: e.to_string(),
            });
            return;
        }
        match t
            .inside
            .madvise(t.pid, &ranges, libc::MADV_MERGEABLE, "dedup")
        {
            Ok(done) => {
                for (&s, &n) in starts.iter().zip(&done) {
                    if n == 0 {
                        continue;
                    }
                    if let Some(r) = t.regions.get_mut(&s) {
                        r.mergeable = true;
                        self.counters.merged += 1;
                        self.counters.split += u64::from(r.huge);
                    }
                }
            }
            Err(e) => {
                self.counters.failed += 1;
                actions.push(Action::Failed {
                    pid: t.pid,
                    what: "madvise(MADV_MERGEABLE)".into(),
                    why: e.to_string(),
                })
            }
        }
    }

    /// Unmerges regions `starts` of target `i` and collapses them.
    fn rebuild(&mut self, i: usize, starts: &[u64], actions: &mut Vec<Action>) {
        if starts.is_empty() {
            return;
        }
        let t = &mut self.targets[i];
        let ranges: Vec<(u64, u64)> = starts.iter().map(|&s| (s, HUGE_PAGE_SIZE as u64)).collect();
        if let Err(e) = t
            .inside
            .madvise(t.pid, &ranges, libc::MADV_UNMERGEABLE, "dedup")
        {
            self.counters.failed += 1;
            actions.push(Action::Failed {
                pid: t.pid,
                what: "madvise(MADV_UNMERGEABLE)".into(),
                why: e.to_string(),
            });
            return;
        }
        let _ = t.journal.taken_back(&ranges);
        for &s in starts {
            // The kernel does not collapse a range holding a
            // write-protected page: the region leaves the write watch,
            // and is watched again (not yet measured) from the next step.
            if let Ok(w) = t.writes.as_mut() {
                w.release(Region {
                    start: s,
                    len: HUGE_PAGE_SIZE as u64,
                });
            }
            if let Some(st) = t.regions.get_mut(&s) {
                st.watched = false;
            }
            let r = crate::mech::inject::collapse(t.pidfd.as_raw_fd(), s, HUGE_PAGE_SIZE);
            let Some(st) = t.regions.get_mut(&s) else {
                continue;
            };
            st.mergeable = false;
            st.huge = r.is_ok();
            self.counters.rebuilt += u64::from(r.is_ok());
            actions.push(Action::Rebuilt {
                pid: t.pid,
                start: s,
                freq: st.freq,
                huge: r.is_ok(),
                why: r
                    .err()
                    .map(|e| format!("process_madvise(MADV_COLLAPSE): {e}")),
            });
        }
    }

    /// Sets ksmd's pace from the pages made mergeable; reads KSM's state.
    fn pace(&mut self, actions: &mut Vec<Action>) -> KsmReport {
        if let Some(full) = self.opts.full_scan {
            let pages: u64 = self
                .targets
                .iter()
                .filter(|t| !t.gone)
                .flat_map(|t| t.regions.values())
                .filter(|s| s.mergeable)
                .count() as u64
                * PAGES as u64;
            let sleep_ms = ksm_value("sleep_millisecs").max(1);
            let want = (pages * sleep_ms / full.as_millis().max(1) as u64).clamp(100, 20_000);
            let now = ksm_value("pages_to_scan");
            if now != want {
                let path = format!("{KSM_DIR}/pages_to_scan");
                let r = match &self.ksm.pages_to_scan {
                    Some(g) => g.write(&want.to_string()),
                    None => crate::mech::settings::SettingGuard::set(&path, &want.to_string())
                        .map(|g| self.ksm.pages_to_scan = Some(g)),
                };
                match r {
                    Ok(()) => actions.push(Action::Tuned {
                        knob: path,
                        to: want.to_string(),
                    }),
                    Err(e) => actions.push(Action::Failed {
                        pid: 0,
                        what: format!("setting {path}"),
                        why: e.to_string(),
                    }),
                }
            }
        }
        let ksmd_cpu_ms = self.ksm.ksmd.and_then(|k| {
            let now = procfs::cpu_time(k).ok()?;
            let before = self.ksm.ksmd_cpu.replace(now)?;
            Some(now.saturating_sub(before).as_secs_f64() * 1e3)
        });
        self.counters.ksmd_cpu_ms += ksmd_cpu_ms.unwrap_or(0.0);
        KsmReport {
            pages_shared: ksm_value("pages_shared"),
            pages_sharing: ksm_value("pages_sharing"),
            pages_to_scan: ksm_value("pages_to_scan"),
            merging_pages: self
                .targets
                .iter()
                .filter(|t| !t.gone)
                .map(|t| {
                    (
                        t.pid,
                        procfs::ksm_stat(t.pid).map_or(0, |k| k.merging_pages),
                    )
                })
                .collect(),
            ksmd_cpu_ms,
        }
    }

    /// Ends: the regions the agent made mergeable are unmerged in every
    /// process still there (their pages unshared), so that the processes
    /// are left as they were found. KSM's settings are put back when the
    /// agent is dropped.
    pub fn end(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        for t in self.targets.iter_mut().filter(|t| !t.gone) {
            let starts: Vec<u64> = t
                .regions
                .iter()
                .filter(|r| r.1.mergeable)
                .map(|r| *r.0)
                .collect();
            if starts.is_empty() || !procfs::is_alive(t.pid) {
                continue;
            }
            let ranges: Vec<(u64, u64)> =
                starts.iter().map(|&s| (s, HUGE_PAGE_SIZE as u64)).collect();
            match t
                .inside
                .madvise(t.pid, &ranges, libc::MADV_UNMERGEABLE, "dedup")
            {
                Ok(_) => {
                    let _ = t.journal.taken_back(&ranges);
                    for s in &starts {
                        if let Some(r) = t.regions.get_mut(s) {
                            r.mergeable = false;
                        }
                    }
                    actions.push(Action::Unmerged {
                        pid: t.pid,
                        regions: starts.len() as u64,
                    })
                }
                Err(e) => actions.push(Action::Failed {
                    pid: t.pid,
                    what: "madvise(MADV_UNMERGEABLE) at the end".into(),
                    why: e.to_string(),
                }),
            }
        }
        actions
    }

    /// The counters in the Prometheus text format.
    pub fn metrics(&self) -> String {
        let c = &self.counters;
        let mut s = String::new();
        let mut put = |name: &str, kind: &str, help: &str, v: f64| {
            crate::mech::metrics::prometheus_metric(
                &mut s,
                &format!("pagewise_dedup_{name}"),
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
            "merged_regions_total",
            "counter",
            "2 MiB regions made mergeable.",
            c.merged as f64,
        );
        put(
            "split_regions_total",
            "counter",
            "Huge pages made mergeable (split by KSM as it merges).",
            c.split as f64,
        );
        put(
            "rebuilt_regions_total",
            "counter",
            "Regions unmerged and collapsed into huge pages again.",
            c.rebuilt as f64,
        );
        put(
            "failed_total",
            "counter",
            "Requests to a process that failed.",
            c.failed as f64,
        );
        put(
            "pages_read_total",
            "counter",
            "Pages read and hashed for the repetition rate.",
            c.pages_read as f64,
        );
        put(
            "cpu_seconds_total",
            "counter",
            "CPU time of the agent.",
            c.cpu_ms / 1e3,
        );
        put(
            "ksmd_cpu_seconds_total",
            "counter",
            "CPU time of ksmd while the agent ran.",
            c.ksmd_cpu_ms / 1e3,
        );
        put(
            "ksm_pages_sharing",
            "gauge",
            "Pages merged by KSM (system-wide).",
            ksm_value("pages_sharing") as f64,
        );
        for t in self.targets.iter().filter(|t| !t.gone) {
            s += &format!(
                "pagewise_dedup_mergeable_regions{{pid=\"{}\"}} {}\n",
                t.pid,
                t.regions.values().filter(|r| r.mergeable).count()
            );
        }
        s
    }
}
