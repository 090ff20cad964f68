//! One step of the agent, as its phases: the regions found again, their
//! access frequency, the thresholds, their repetition rate, the decisions,
//! the acts, ksmd's pace, and the report.

use super::{
    Action, Agent, Policy, ProcessState, RegionState, Step, Thresholds, FREQ_MAX,
    MERGED_WATCH_EVERY, PAGES,
};
use pagewise_mech::agent::StepClock;
use pagewise_mech::{procfs, Region, Result, HUGE_PAGE_SIZE};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// Why the writes of a process that holds a userfaultfd of its own are not
/// watched ([`procfs::owns_userfaultfd`]).
pub(crate) const HOLDS_USERFAULTFD: &str =
    "it holds a userfaultfd of its own: watching its writes would register its memory with \
     pagewise's first, and a mapping it registers itself would then be refused (EBUSY)";

/// The regions each process wrote since the last step (only those whose
/// writes are watched), and how many regions that makes.
struct Written {
    by_pid: HashMap<i32, BTreeSet<u64>>,
    regions: u64,
    /// The processes seen moving or resizing a mapping since the last
    /// step, and how many times.
    moved: Vec<(i32, u64)>,
}

/// What the decisions of a step are: per target, the regions to make
/// mergeable and those to rebuild; and the regions kept, by reason.
#[derive(Default)]
struct Decisions {
    plans: Vec<(usize, Vec<u64>, Vec<u64>)>,
    kept_hot: u64,
    kept_few: u64,
}

impl Agent {
    /// Measures, decides and acts once (the access window included).
    pub(super) fn step_once(&mut self) -> Result<Step> {
        let clock = StepClock::start(self.servers_cpu_ms());
        let mut actions = Vec::new();
        self.scan += 1;
        self.discover(&mut actions);
        let written = self.frequency(&mut actions);
        for &(pid, n) in &written.moved {
            if let Some(i) = self.targets.all().iter().position(|t| t.pid == pid) {
                let why = format!(
                    "it moved or resized a mapping ({n} times since the last step): \
                     one 2 MiB region made mergeable splits its mapping, and an mremap \
                     spanning the pieces fails"
                );
                self.merge_whole_only(i, why, &mut actions);
            }
        }
        let (utilisation, utilisation_of, th) = self.thresholds();
        let filter = if self.opts.policy == Policy::SmartMd {
            self.repetition(&written.by_pid, th.hot_min, &mut actions)
        } else {
            Default::default()
        };
        let d = self.decide(&written, &th, &mut actions);
        for (i, merge, rebuild) in &d.plans {
            self.merge(*i, merge, &mut actions);
            self.rebuild(*i, rebuild, &mut actions);
        }
        let ksm = self.pace(&mut actions);
        // The agent's CPU: this thread's and the fault-serving threads'.
        let cpu_ms = clock.cpu_ms(self.servers_cpu_ms());
        self.counters.steps += 1;
        self.counters.cpu_ms += cpu_ms;
        self.counters.pages_read += filter.pages_read;
        let all = || self.targets.live().flat_map(|t| t.state.regions.values());
        let processes = self
            .targets
            .live()
            .map(|t| ProcessState {
                process: t.named(),
                regions: t.state.regions.len() as u64,
                mergeable: t.state.regions.values().filter(|s| s.mergeable).count() as u64,
            })
            .collect();
        Ok(Step {
            t_ms: self.started.elapsed().as_millis() as u64,
            utilisation,
            utilisation_of,
            thresholds: th,
            regions: all().count() as u64,
            huge: all().filter(|s| s.huge).count() as u64,
            mergeable: all().filter(|s| s.mergeable).count() as u64,
            kept_hot: d.kept_hot,
            kept_few_duplicates: d.kept_few,
            written: written.regions,
            processes,
            filter,
            ksm,
            actions,
            cpu_ms,
            step_ms: clock.elapsed_ms(),
        })
    }

    /// CPU time of the threads serving write faults, ms.
    fn servers_cpu_ms(&self) -> f64 {
        self.targets
            .all()
            .iter()
            .filter_map(|t| t.state.writes.as_ref().ok())
            .map(|w| w.server_cpu().as_secs_f64() * 1e3)
            .sum()
    }

    /// The regions of each process found again, their states carried over.
    fn discover(&mut self, actions: &mut Vec<Action>) {
        let found = self.targets.regions(|pid, e| {
            actions.push(Action::Gone {
                pid,
                why: e.to_string(),
            })
        });
        for (i, rs) in found {
            let t = &mut self.targets[i];
            let mut next = BTreeMap::new();
            for r in rs {
                let start = r.region.start;
                // The shim's own memory is never the program's.
                if t.state.inside.is_own_memory(start, r.region.len) {
                    continue;
                }
                // A region with nothing in memory is left out until it has
                // some, unless it is known already: one swapped out whole
                // keeps its state (above all whether it was made
                // mergeable, to be unmerged at the end).
                if r.resident == 0 && !t.state.regions.contains_key(&start) {
                    continue;
                }
                let mut s = t.state.regions.remove(&start).unwrap_or(RegionState {
                    freq: FREQ_MAX,
                    watched: false,
                    pause: 0,
                    rest: 0,
                    mergeable: false,
                    huge: r.huge,
                    digests: vec![None; PAGES],
                    read: false,
                    rate: None,
                });
                s.huge = r.huge;
                next.insert(start, s);
            }
            t.state.regions = next;
        }
    }

    /// Access frequency: the writes since the last step (at least
    /// `window` ago), then every region watched again before anything is
    /// read, so that a write after a read is always seen.
    fn frequency(&mut self, actions: &mut Vec<Action>) -> Written {
        let mut written = Written {
            by_pid: HashMap::new(),
            regions: 0,
            moved: Vec::new(),
        };
        if !self.opts.policy.needs_frequency() {
            return written;
        }
        if let Some(last) = self.last_take {
            std::thread::sleep(self.opts.window.saturating_sub(last.elapsed()));
        }
        self.last_take = Some(Instant::now());
        let again_turn = self.scan.is_multiple_of(MERGED_WATCH_EVERY);
        let backoff = self.opts.hot_backoff;
        for t in self.targets.live_mut() {
            let pid = t.pid;
            let no_coverage = |why: String| Action::NoCoverage { pid, why };
            if t.state.writes.is_ok() && procfs::owns_userfaultfd(pid) {
                // It made a userfaultfd since: the watch's registrations
                // would make the program's own fail. Closed (and so lifted)
                // now; what was read of each region is no longer known to
                // be current.
                t.state.writes = Err(HOLDS_USERFAULTFD.into());
                for s in t.state.regions.values_mut() {
                    s.read = false;
                    s.watched = false;
                }
            }
            let w = match t.state.writes.as_mut() {
                Ok(w) => w,
                Err(why) => {
                    actions.push(no_coverage(why.clone()));
                    continue;
                }
            };
            let taken = match w.take() {
                Ok(x) => x,
                Err(e) => {
                    actions.push(no_coverage(e.to_string()));
                    continue;
                }
            };
            if taken.resized > 0 && !t.state.whole {
                written.moved.push((pid, taken.resized));
            }
            for (&start, s) in t.state.regions.iter_mut() {
                if taken.forgets(start) {
                    // Unmapped, moved or dropped: what was read is gone,
                    // and whether it was written is not known.
                    s.digests.fill(None);
                    s.read = false;
                } else if taken.unwatched.contains(&start) {
                    // Its watch was lifted with its mapping's, for another
                    // region's collapse: whether it was written is not
                    // known, and what was read of it may be stale.
                    s.read = false;
                } else if s.watched {
                    if taken.written.contains(&start) {
                        written.regions += 1;
                        s.freq = (s.freq + 1).min(FREQ_MAX);
                        if backoff > 0 && s.freq == FREQ_MAX && !s.mergeable {
                            s.pause = s.pause.saturating_mul(2).clamp(1, backoff);
                            s.rest = s.pause;
                        }
                    } else {
                        s.freq = s.freq.saturating_sub(1);
                        s.pause = 0;
                    }
                }
            }
            // A region resting (hot, in back-off) is left unprotected, its
            // frequency as it was, until its rest is over.
            let mut resting = BTreeSet::new();
            for (&start, s) in t.state.regions.iter_mut() {
                if s.rest > 0 {
                    s.rest -= 1;
                    // Its writes go unseen: what was read of it is no
                    // longer known to be current.
                    s.read = false;
                    resting.insert(start);
                }
            }
            let rs: Vec<Region> = t
                .state
                .regions
                .keys()
                .filter(|s| !resting.contains(s))
                .map(|&start| Region {
                    start,
                    len: HUGE_PAGE_SIZE as u64,
                })
                .collect();
            // A merged region's protection is renewed one step in
            // MERGED_WATCH_EVERY, whether or not a write was reported.
            let again: BTreeSet<u64> = t
                .state
                .regions
                .iter()
                .filter(|(_, s)| again_turn && s.mergeable)
                .map(|(&a, _)| a)
                .collect();
            match w.watch(&rs, &again) {
                Ok(()) => {
                    for (start, s) in t.state.regions.iter_mut() {
                        s.watched = !resting.contains(start);
                    }
                    written.by_pid.insert(pid, taken.written);
                }
                Err(e) => actions.push(no_coverage(e.to_string())),
            }
        }
        written
    }

    /// Memory utilisation and the thresholds it sets (or the fixed ones).
    fn thresholds(&mut self) -> (f64, String, Thresholds) {
        let first = self.targets.live().next().map(|t| t.pid);
        let (utilisation, utilisation_of) = self
            .utilisation
            .read(first)
            .unwrap_or_else(|e| (0.0, format!("unknown: {e}")));
        let th = self
            .opts
            .thresholds
            .unwrap_or_else(|| Thresholds::adapted(utilisation));
        (utilisation, utilisation_of, th)
    }

    /// The regions to make mergeable (each an action with its reason) and
    /// to rebuild, per the policy.
    fn decide(&self, written: &Written, th: &Thresholds, actions: &mut Vec<Action>) -> Decisions {
        let mut d = Decisions::default();
        let policy = self.opts.policy;
        for (i, t) in self.targets.all().iter().enumerate().filter(|t| !t.1.gone) {
            let measured = written.by_pid.contains_key(&t.pid);
            let (mut merge, mut rebuild) = (Vec::new(), Vec::new());
            for (&start, s) in &t.state.regions {
                let hot = measured && s.freq >= th.hot_min;
                let cold = measured && s.freq <= th.cold_max;
                if s.mergeable {
                    if hot && policy.needs_frequency() {
                        rebuild.push(start);
                    }
                    continue;
                }
                match choose(policy, s, hot, cold, th) {
                    Choice::Merge(why) => {
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
                    Choice::KeepHot => d.kept_hot += 1,
                    Choice::KeepFew => d.kept_few += 1,
                    Choice::Leave => {}
                }
            }
            rebuild.truncate(self.opts.rebuilds_per_step);
            d.plans.push((i, merge, rebuild));
        }
        d
    }
}

/// What the policy makes of a region not made mergeable yet.
enum Choice {
    /// Make it mergeable, for this reason.
    Merge(String),
    /// Keep it: hot.
    KeepHot,
    /// Keep it: few duplicates.
    KeepFew,
    /// Leave it, not counted (a comparison policy's no).
    Leave,
}

/// The policy's choice for region `s`, hot or cold as measured.
fn choose(policy: Policy, s: &RegionState, hot: bool, cold: bool, th: &Thresholds) -> Choice {
    let merge_if = |go: bool, why: String| {
        if go {
            Choice::Merge(why)
        } else {
            Choice::Leave
        }
    };
    match policy {
        Policy::KsmEverywhere => Choice::Merge("every region".to_string()),
        Policy::NoSplitting => merge_if(!s.huge, "base pages".to_string()),
        Policy::IngensLike if !s.huge => Choice::Merge("base pages".to_string()),
        Policy::IngensLike => merge_if(cold, format!("cold (frequency {})", s.freq)),
        Policy::SmartMd => {
            let rate = s.rate.unwrap_or(0.0);
            if hot {
                Choice::KeepHot
            } else if s.huge && cold && rate >= th.repetition {
                Choice::Merge(format!(
                    "cold (frequency {}) and {:.0} % of its pages duplicate",
                    s.freq,
                    rate * 100.0
                ))
            } else if !s.huge && rate > 0.0 {
                Choice::Merge(format!(
                    "base pages, {:.0} % of them duplicate, not hot",
                    rate * 100.0
                ))
            } else if !s.huge || cold {
                Choice::KeepFew
            } else {
                Choice::KeepHot
            }
        }
    }
}
