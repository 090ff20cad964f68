//! One step of the agent, as its phases: the budget earned, the regions
//! found again, bloat recovery, coverage over one window, the candidates
//! with their benefit in the policy's order, the promotions under the
//! budget, and the report.

use super::{Action, Agent, Candidate, Policy, ProcessState, Seen, Step};
use pagewise_mech::access::CoverageReport;
use pagewise_mech::agent::StepClock;
use pagewise_mech::{Region, Result, HUGE_PAGE_SIZE};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// Pages touched in each candidate of a process, where measured.
type Touched = Vec<Option<Vec<u64>>>;

impl Agent {
    /// Measures, decides and promotes once (the coverage window included).
    pub(super) fn step_once(&mut self) -> Result<Step> {
        let clock = StepClock::start(0.0);
        let mut actions = Vec::new();
        self.earn();
        let (mut per, huge) = self.discover(&mut actions);
        self.recover_bloat(&huge, &mut per, &mut actions);
        let touched = self.coverage(&per, &mut actions);
        let mut lists = self.candidates(&per, &touched);
        let order = self.order(&mut lists);
        let mut processes: Vec<ProcessState> = per
            .iter()
            .zip(&lists)
            .map(|((i, _, huge), l)| ProcessState {
                process: self.targets[*i].named(),
                huge_regions: *huge,
                candidates: l.len() as u64,
                promoted: self.targets[*i].state.promoted,
                expected_ns_per_s: l.iter().filter_map(|c| c.benefit_ns_per_s).sum(),
            })
            .collect();
        self.promote(&order, &mut processes, &mut actions);
        let cpu_ms = clock.cpu_ms(0.0);
        self.counters.steps += 1;
        self.counters.cpu_ms += cpu_ms;
        let mut candidates: Vec<Candidate> = order;
        candidates.truncate(64);
        Ok(Step {
            t_ms: self.started.elapsed().as_millis() as u64,
            processes,
            candidates,
            actions,
            step_ms: clock.elapsed_ms(),
            cpu_ms,
        })
    }

    /// The budget earned since the last step, up to one interval's worth.
    fn earn(&mut self) {
        let now = Instant::now();
        let per_second = self.opts.budget.per_second;
        let earned = match self.last_step {
            Some(t) => now.duration_since(t).as_secs_f64() * per_second,
            None => self.opts.interval.as_secs_f64() * per_second,
        };
        let cap = (self.opts.interval.as_secs_f64() * per_second).max(1.0);
        self.allowance = (self.allowance + earned).min(cap);
        self.last_step = Some(now);
    }

    /// What each process holds: per process, its candidates (regions not
    /// huge with pages in memory) and how many regions are huge; and, per
    /// target, its huge regions (for bloat recovery).
    fn discover(&mut self, actions: &mut Vec<Action>) -> (Vec<Seen>, Vec<(usize, Vec<Region>)>) {
        let found = self.targets.regions(|pid, e| {
            actions.push(Action::Gone {
                pid,
                why: e.to_string(),
            })
        });
        let mut per = Vec::new();
        let mut huge_regions = Vec::new();
        for (i, rs) in found {
            huge_regions.push((i, rs.iter().filter(|r| r.huge).map(|r| r.region).collect()));
            let huge = rs.iter().filter(|r| r.huge).count() as u64;
            let cands = rs
                .into_iter()
                .filter(|r| !r.huge && r.resident > 0)
                .map(|r| (r.region, r.resident))
                .collect();
            per.push((i, cands, huge));
        }
        (per, huge_regions)
    }

    /// Coverage over one window for every process at once: by idle page
    /// tracking where the kernel has it, else writes from outside.
    fn coverage(&mut self, per: &[Seen], actions: &mut Vec<Action>) -> Touched {
        match self.opts.policy {
            Policy::Coverage if self.idle_pages => self.coverage_idle(per, actions),
            Policy::Coverage => self.coverage_written(per, actions),
            _ => vec![None; per.len()],
        }
    }

    /// Idle page tracking: reads and writes, every process at once,
    /// nothing inside them.
    fn coverage_idle(&self, per: &[Seen], actions: &mut Vec<Action>) -> Touched {
        let mut touched = vec![None; per.len()];
        let pids: Vec<i32> = per.iter().map(|p| self.targets[p.0].pid).collect();
        match pagewise_mech::access::idle_pages(&pids, self.opts.window) {
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
        touched
    }

    /// Writes from outside: every process's candidates write-protected
    /// (at most [`coverage_per_step`](super::Options::coverage_per_step)
    /// of them, those measured longest ago first), one window, then the
    /// pages written; a candidate not measured now keeps what it touched
    /// when it was.
    fn coverage_written(&mut self, per: &[Seen], actions: &mut Vec<Action>) -> Touched {
        let now = self.counters.steps + 1;
        let picked = self.pick_measured(per);
        let mut touched = vec![None; per.len()];
        let mut armed = vec![false; per.len()];
        let mut failed = vec![false; per.len()];
        for (k, (i, cands, _)) in per.iter().enumerate() {
            let t = &mut self.targets[*i];
            if let Ok(c) = t.state.coverage.as_mut() {
                let rs: Vec<Region> = picked[k].iter().map(|&j| cands[j].0).collect();
                if rs.is_empty() {
                    continue;
                }
                match c.start(&rs) {
                    Ok(()) => armed[k] = true,
                    Err(e) => {
                        failed[k] = true;
                        actions.push(Action::NoCoverage {
                            pid: t.pid,
                            why: e.to_string(),
                        })
                    }
                }
            }
        }
        if armed.iter().any(|a| *a) {
            std::thread::sleep(self.opts.window);
        }
        for (k, (i, cands, _)) in per.iter().enumerate() {
            let t = &mut self.targets[*i];
            let pid = t.pid;
            let measured = &mut t.state.measured;
            match t.state.coverage.as_mut() {
                Ok(_) if failed[k] => {}
                Ok(c) => {
                    if armed[k] {
                        match c.finish() {
                            Ok(rep) => {
                                let now_cands: Vec<(Region, u64)> =
                                    picked[k].iter().map(|&j| cands[j]).collect();
                                let got = touched_in(&rep, &now_cands);
                                for (c, n) in now_cands.iter().zip(got) {
                                    measured.insert(c.0.start, (now, n));
                                }
                            }
                            Err(e) => {
                                actions.push(Action::NoCoverage {
                                    pid,
                                    why: e.to_string(),
                                });
                                continue;
                            }
                        }
                    }
                    measured.retain(|start, _| cands.iter().any(|c| c.0.start == *start));
                    touched[k] = Some(
                        cands
                            .iter()
                            .map(|c| measured.get(&c.0.start).map_or(0, |m| m.1))
                            .collect(),
                    );
                }
                Err(why) => actions.push(Action::NoCoverage {
                    pid,
                    why: why.clone(),
                }),
            }
        }
        touched
    }

    /// Per process (as `per`), the candidates whose coverage this step
    /// measures: all, or the `coverage_per_step` measured longest ago (a
    /// candidate never measured first).
    fn pick_measured(&self, per: &[Seen]) -> Vec<Vec<usize>> {
        let all = || -> Vec<Vec<usize>> {
            per.iter()
                .map(|(_, cands, _)| (0..cands.len()).collect())
                .collect()
        };
        let Some(cap) = self.opts.coverage_per_step else {
            return all();
        };
        let mut order: Vec<(u64, usize, usize)> = Vec::new();
        for (k, (i, cands, _)) in per.iter().enumerate() {
            let measured = &self.targets[*i].state.measured;
            for (j, c) in cands.iter().enumerate() {
                let last = measured.get(&c.0.start).map_or(0, |m| m.0);
                order.push((last, k, j));
            }
        }
        if order.len() <= cap {
            return all();
        }
        order.sort_unstable();
        let mut picked = vec![Vec::new(); per.len()];
        for &(_, k, j) in order.iter().take(cap) {
            picked[k].push(j);
        }
        for p in &mut picked {
            p.sort_unstable();
        }
        picked
    }

    /// Every candidate of every process with its benefit.
    fn candidates(&self, per: &[Seen], touched: &Touched) -> Vec<Vec<Candidate>> {
        let window_s = self.opts.window.as_secs_f64().max(1e-3);
        per.iter()
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
            .collect()
    }

    /// Why no more can be promoted now, if so: the total budget, the rate
    /// budget, or the step's CPU budget is spent.
    fn budget_spent(&self, spent_ms: f64) -> Option<String> {
        let cpu_budget_ms = self.opts.interval.as_secs_f64() * 1e3 * self.opts.budget.cpu_share;
        let left_total = self
            .opts
            .budget
            .total
            .map_or(u64::MAX, |t| t.saturating_sub(self.counters.promoted));
        if left_total == 0 {
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
        }
    }

    /// Promotes the candidates in `order` under the budget; those passed
    /// over are said once per process.
    fn promote(
        &mut self,
        order: &[Candidate],
        processes: &mut [ProcessState],
        actions: &mut Vec<Action>,
    ) {
        let mut spent_ms = 0.0;
        let mut skipped: BTreeMap<i32, (u64, String)> = BTreeMap::new();
        for c in order {
            if let Some(why) = self.budget_spent(spent_ms) {
                skipped.entry(c.pid).or_insert((0, why)).0 += 1;
                self.counters.skipped_budget += 1;
                continue;
            }
            let Some(t) = self.targets.all_mut().iter_mut().find(|t| t.pid == c.pid) else {
                continue;
            };
            let group = t.state.group.clone();
            if let Some((name, g)) = group
                .as_ref()
                .and_then(|n| self.groups.get(n).map(|g| (n, *g)))
                .filter(|(_, g)| g.promoted >= g.budget)
            {
                let why = format!("the budget of {} huge pages of {name} is spent", g.budget);
                skipped.entry(c.pid).or_insert((0, why)).0 += 1;
                self.counters.skipped_budget += 1;
                continue;
            }
            let tc = Instant::now();
            let r = t.collapse(c.start, HUGE_PAGE_SIZE);
            let ms = tc.elapsed().as_secs_f64() * 1e3;
            spent_ms += ms;
            self.counters.collapse_ms += ms;
            match r {
                Ok(()) => {
                    self.allowance -= 1.0;
                    self.counters.promoted += 1;
                    t.state.promoted += 1;
                    if let Some(g) = group.as_ref().and_then(|n| self.groups.get_mut(n)) {
                        g.promoted += 1;
                    }
                    if let Some(p) = processes.iter_mut().find(|p| p.process.pid == c.pid) {
                        p.promoted = t.state.promoted;
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
                    t.gone |= e.raw_os_error() == Some(libc::ESRCH);
                    actions.push(Action::Failed {
                        pid: c.pid,
                        start: c.start,
                        why: format!("process_madvise(MADV_COLLAPSE): {e}"),
                    });
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
    }
}

/// Pages touched in each of `cands` by a coverage report.
fn touched_in(rep: &CoverageReport, cands: &[(Region, u64)]) -> Vec<u64> {
    let by: HashMap<u64, u64> = rep.regions.iter().map(|r| (r[0], r[3])).collect();
    cands
        .iter()
        .map(|c| by.get(&c.0.start).copied().unwrap_or(0))
        .collect()
}
