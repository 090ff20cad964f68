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
//! [`pagewise_mech::access::RegionWrites`], all the time: a region is
//! write-protected until its first write, which is noted and lifts the
//! protection until the next step (one fault per region and step, a huge
//! page stays huge; a region not written costs nothing). A region only
//! read looks cold. A new region starts hot ([`FREQ_MAX`]): it counts as
//! cold only once it has gone unwritten for a few steps, so nothing is
//! split before it has been watched. The protection of a region made
//! mergeable is renewed one step in `MERGED_WATCH_EVERY` whether or not
//! a write was reported.
//!
//! **Repetition rate** is the share of a region's resident pages labelled
//! duplicate by SmartMD's counting Bloom filter ([`pagewise_mech::bloom`]) over
//! every watched process (zero-filled pages, which KSM merges too, count as
//! duplicates). The agent keeps each page's digest. Every region is
//! protected again before it is read, so a write after a read is always
//! seen: a region read before and not written since is known unchanged and
//! has only one page in `REFRESH_LANES` read again per step (for a write
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
//! (`Thresholds::adapted`).
//!
//! KSM may act only on memory a process made mergeable itself: the agent
//! makes the process call `madvise` ([`Inside`](pagewise_mech::inject::Inside)): through its preload shim
//! for a program started under pagewise ([`Agent::add_with`]; nothing is
//! stopped), else while it is stopped under ptrace
//! ([`pagewise_mech::inject::madvise_in`]); and `process_madvise(MADV_COLLAPSE)`
//! rebuilds from outside. ksmd is started if it was not and its pace
//! (`pages_to_scan`) follows the pages made mergeable so that one pass
//! over them takes [`Options::full_scan`]; every KSM setting is put back
//! when the agent is dropped, and with [`Agent::end`](pagewise_mech::agent::Agent::end) the regions it made
//! mergeable are unmerged.
//!
//! Three other policies are here for comparison ([`Policy`]): KSM
//! everywhere, no splitting, and Ingens-like (by access frequency only).

#![forbid(unsafe_code)]

#[macro_use]
extern crate pagewise_mech;

mod agent;
mod journal;
pub use agent::Agent;
pub use journal::recover_advice;

use pagewise_mech::{HUGE_PAGE_SIZE, PAGE_SIZE};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The highest access frequency.
pub const FREQ_MAX: u8 = 4;
/// A region made mergeable is watched for writes one step in this many
/// (its frequency moves only then): after KSM splits it, write-protecting
/// it takes 512 page-table entries instead of one, the agent's largest
/// cost, and it is watched only to see it turn hot.
pub(crate) const MERGED_WATCH_EVERY: u64 = 4;
/// A region not written since it was read has one page in this many read
/// again per step.
pub(crate) const REFRESH_LANES: usize = 16;
const PAGES: usize = HUGE_PAGE_SIZE / PAGE_SIZE;
/// KSM's settings.
pub const KSM_DIR: &str = "/sys/kernel/mm/ksm";

/// Which regions KSM may merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Thresholds {
    /// Cold: access frequency at most this.
    pub cold_max: u8,
    /// Hot: access frequency at least this.
    pub hot_min: u8,
    /// Worth splitting: repetition rate at least this (0 to 1).
    pub repetition: f64,
}

setters!(Thresholds {
    cold_max: u8,
    hot_min: u8,
    repetition: f64,
});

impl Thresholds {
    /// SmartMD's adaptation to memory utilisation `u` (0 to 1): up to half
    /// full, only regions not accessed for a while are cold (frequency 0),
    /// a region needs half its pages duplicate, and frequency 2 makes it
    /// hot; from there to 90 % full, linearly, up to frequency 2 is cold,
    /// a tenth of pages duplicate is enough, and only frequency 4 is hot.
    pub(crate) fn adapted(u: f64) -> Thresholds {
        let s = ((u - 0.5) / 0.4).clamp(0.0, 1.0);
        Thresholds {
            cold_max: (2.0 * s).round() as u8,
            hot_min: 2 + (2.0 * s).round() as u8,
            repetition: 0.5 - 0.4 * s,
        }
    }
}

/// How the agent runs.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
    /// Let the kernel's KSM advisor pace ksmd instead (`advisor_mode`
    /// `scan-time`, Linux 6.9+), aiming at one pass over the mergeable
    /// pages in this long (`advisor_target_scan_time`, whole seconds, at
    /// least 1; the kernel's default is 200 s): ksmd is started and
    /// [`full_scan`](Self::full_scan) is not used. `None`: the agent paces
    /// it, where `full_scan` asks.
    pub advisor: Option<Duration>,
    /// Regions rebuilt at most per step (each a collapse).
    pub rebuilds_per_step: usize,
    /// What to set KSM's `smart_scan` to while the agent runs (`None`:
    /// leave it). Smart scan skips, for up to 8 passes, a page that did
    /// not merge; when regions are made mergeable one after another, a
    /// page scanned before its twin was made mergeable is then skipped
    /// long after the twin arrives. Only where the agent starts ksmd
    /// ([`full_scan`](Self::full_scan) or [`advisor`](Self::advisor)), and
    /// for every policy alike, so that the comparison policies run ksmd as
    /// the SmartMD policy does.
    pub smart_scan: Option<bool>,
    /// A region found written in step after step, its frequency at
    /// [`FREQ_MAX`], is left unprotected for 1, 2, 4, ... up to this many
    /// steps before it is watched again (its frequency kept, so it stays
    /// hot meanwhile; found unwritten, it is watched every step again):
    /// the protection a hot region costs each step, lifted at its next
    /// write, is most of what watching costs. 0: every region every step.
    pub hot_backoff: u8,
    /// Make memory mergeable only as whole mappings, in every process: a
    /// mapping once every region of it is to be merged, and unmerged whole
    /// when one turns hot. `MADV_MERGEABLE` on one 2 MiB region splits
    /// its mapping in up to three, and the kernel refuses (`EFAULT`) an
    /// `mremap` that spans two: a program that grows or shrinks a buffer
    /// in place would fail. The agent does this by itself for a process
    /// once it sees it move a mapping (see [`Action::WholeMappings`]);
    /// this asks it from the start, for programs that resize rarely.
    pub whole_mappings: bool,
}

setters!(Options {
    window: Duration,
    policy: Policy,
    sample: bool,
    exact: bool,
    thresholds: Option<Thresholds>,
    full_scan: Option<Duration>,
    advisor: Option<Duration>,
    rebuilds_per_step: usize,
    smart_scan: Option<bool>,
    hot_backoff: u8,
    whole_mappings: bool,
});

impl Default for Options {
    fn default() -> Self {
        Options {
            window: Duration::from_millis(500),
            policy: Policy::SmartMd,
            sample: true,
            exact: false,
            thresholds: None,
            full_scan: Some(Duration::from_secs(10)),
            advisor: None,
            rebuilds_per_step: 32,
            smart_scan: Some(false),
            hot_backoff: 0,
            whole_mappings: false,
        }
    }
}

/// What the agent did, and why.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(tag = "action", rename_all = "kebab-case")]
#[non_exhaustive]
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
    /// From now on, this process's memory is made mergeable only as
    /// whole mappings (see [`Options::whole_mappings`]); the regions made
    /// mergeable one by one before are unmerged, which makes their
    /// mappings whole again.
    WholeMappings {
        /// Process.
        pid: i32,
        /// Why.
        why: String,
        /// Regions unmerged.
        unmerged: u64,
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
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
    /// Each watched process: its pids and container, its regions.
    pub processes: Vec<ProcessState>,
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

/// One watched process in a step.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessState {
    /// The process: its pid, pid inside and container.
    #[serde(flatten)]
    pub process: pagewise_mech::agent::Named,
    /// Its regions watched.
    pub regions: u64,
    /// Of them, made mergeable by the agent.
    pub mergeable: u64,
}

/// Counters since the agent started (for metrics).
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
