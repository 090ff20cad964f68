//! The node agent (`pagewise agent --config FILE`): one long-running
//! service that applies the huge-page and dedup agents to the processes of
//! the containers and cgroups its [`Config`] selects, with a budget of huge
//! pages per container. It is an [`Agent`] made of the two, stepped by the
//! one loop ([`crate::run`]) as `thp run` and `dedup run` step theirs:
//!
//! - processes are followed as they come: the node's processes are read
//!   again for newcomers when a task began or ended (the kernel's census
//!   of tasks, not a listing of `/proc`), and every 15 steps
//!   all the same (a process moved into a container's cgroup after it
//!   started); each is taken by the first selection that selects it;
//! - while another pagewise holds KSM the dedup agent waits (said in its
//!   notes and as `pagewise_node_agent_running{agent="dedup"} 0`), tried
//!   again every 5 steps, the huge-page agent running
//!   meanwhile, rather than the node agent exiting (a DaemonSet would
//!   restart it for ever);
//! - its metrics are its own (see `metrics.rs`: that it is up, its steps
//!   and CPU time, per process what KSM saves it by the kernel's
//!   accounting and the huge pages it holds, per container the huge pages
//!   given against its budget) and both agents';
//! - [`answer`] serves them from start-up on, before the agents are made;
//! - [`Agent::end`] takes back the advice of both; dropping it puts back
//!   every system setting they changed (journaled first, so a killed agent
//!   is repaired by the next run).

mod config;
mod kube;
mod metrics;
mod select;

pub use config::{Config, DedupConfig, Select, ThpConfig};
use select::group_of;
pub use select::{SelectedProcess, Selection};

use crate::endpoint::{Endpoint, Published};
use metrics::FiguresCache;
use pagewise_dedup as dedup;
use pagewise_mech::agent::{Agent, Metric};
use pagewise_mech::container::Member;
use pagewise_mech::procfs::{self, TaskCensus};
use pagewise_mech::ErrorClass;
use pagewise_thp::agent as thp;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Steps between two reads of the node's processes for newcomers when no
/// task began or ended.
const LOOK_EVERY: u64 = 15;
/// Steps between two tries to make the dedup agent while KSM is held.
const DEDUP_RETRY_STEPS: u64 = 5;

/// One step of the node agent (`agent --json`: one object a step).
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Step {
    /// Since the agent started, ms.
    pub t_ms: u64,
    /// Processes watched.
    pub processes: usize,
    /// Containers they are in.
    pub containers: usize,
    /// The huge-page agent's step, where it stepped.
    pub thp: Option<thp::Step>,
    /// The dedup agent's step, where it stepped.
    pub dedup: Option<dedup::Step>,
}

/// What the node agent took back as it ended: each agent's actions.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Taken {
    /// The huge-page agent's.
    Thp(thp::Action),
    /// The dedup agent's.
    Dedup(dedup::Action),
}

/// The node agent: both agents over the processes its configuration
/// selects.
#[allow(missing_debug_implementations)]
pub struct Node {
    selection: Selection,
    thp: Option<thp::Agent>,
    dedup: Option<dedup::Agent>,
    /// The dedup agent's options and why it does not run yet, while what
    /// it needs (KSM) is held by another pagewise.
    dedup_waiting: Option<(dedup::Options, String)>,
    known: Vec<SelectedProcess>,
    steps: u64,
    t0: Instant,
    figures: std::cell::RefCell<FiguresCache>,
    tasks: Option<TaskCensus>,
    last_census: Option<(u64, u64)>,
    notes: Vec<String>,
    /// Each process's series as well as each container's.
    per_process: bool,
    /// The namespaces and pods that opted out, as the API server says.
    kube: kube::Watch,
}

/// Serves the node agent's metrics at `config.listen` from now on (its
/// health too: healthy while the loop steps, and for its start-up);
/// `t0` is when the agent started. The loop publishes to what it returns
/// ([`crate::Cadence::published`]).
pub fn answer(config: &Config, t0: Instant) -> pagewise_mech::Result<(Published, Endpoint)> {
    let first = metrics::node_metrics(&[], (0, t0), &[], &mut FiguresCache::default());
    let published = Published::new(
        Duration::from_millis(config.interval_ms),
        crate::served(&crate::render(&[(Node::NAME, first)])),
    );
    let endpoint = Endpoint::start(&config.listen, published.clone())?;
    Ok((published, endpoint))
}

/// One run of the node agent of `config`, as the tool and the bindings
/// make it: its endpoint answers from the start; then `walk_ns` says what
/// a page walk costs (see [`Config::walk_ns_known`]; `None`: interrupted,
/// the run ends before its first step); the agents are made and `on`
/// hears of them once (`None`) and of each step after; it steps until
/// `steps`, `interrupt` or `on` ends it; the agents are ended and their
/// settings put back before it returns, whatever happened. Returns the
/// steps made (`None`: ended before the agents were made).
pub fn run<E: From<pagewise_mech::Error>>(
    config: &Config,
    steps: Option<u64>,
    interrupt: &dyn crate::Interrupt,
    walk_ns: impl FnOnce(&Config) -> Option<f64>,
    mut on: impl FnMut(&mut Node, Option<Step>) -> Result<ControlFlow<()>, E>,
) -> Result<Option<u64>, E> {
    let t0 = Instant::now();
    let (published, _endpoint) = answer(config, t0)?;
    let Some(walk) = walk_ns(config) else {
        return Ok(None);
    };
    let mut node = Node::new(config, walk, t0)?;
    let cadence = crate::Cadence::default()
        .interval(Duration::from_millis(config.interval_ms))
        .steps(steps)
        .metrics_file(config.metrics_file.clone())
        .published(Some(published));
    let ended = match on(&mut node, None) {
        Ok(ControlFlow::Break(())) => Ok(crate::Ended::ReportDone),
        Ok(ControlFlow::Continue(())) => {
            crate::drive(&mut node, &cadence, interrupt, None, |n, s| on(n, Some(s)))
        }
        Err(e) => Err(e),
    };
    node.end();
    let made = node.steps();
    drop(node);
    ended.map(|_| Some(made))
}

/// Runs the node agent of `config` for `steps` steps, for the bindings
/// ([`run`], never interrupted): each step is handed to `on_step`.
/// `walk_ns` is what a page walk costs here (else as
/// [`Config::walk_ns_known`] says, else measured: [`crate::walk_cost`]).
/// Returns the steps made.
pub fn run_steps(
    config: &Config,
    steps: u64,
    walk_ns: Option<f64>,
    mut on_step: impl FnMut(&Step),
) -> pagewise_mech::Result<u64> {
    let walk = |c: &Config| {
        Some(c.walk_ns_known(walk_ns).unwrap_or_else(|| {
            crate::walk_cost::measure(&crate::Uninterrupted)
                .ns()
                .unwrap_or(crate::walk_cost::WALK_DEFAULT_NS)
        }))
    };
    let made = run(config, Some(steps), &crate::Uninterrupted, walk, |_, s| {
        if let Some(s) = s {
            on_step(&s);
        }
        Ok::<_, pagewise_mech::Error>(ControlFlow::Continue(()))
    })?;
    Ok(made.unwrap_or(0))
}

impl Node {
    /// The agents `config` asks for, started at `t0`; `walk_ns` is what a
    /// page walk costs here ([`Config::walk_ns_known`], else measured by
    /// the caller: [`crate::walk_cost::measure`]).
    pub(crate) fn new(config: &Config, walk_ns: f64, t0: Instant) -> pagewise_mech::Result<Node> {
        let mut notes = Vec::new();
        let mut waiting = None;
        let thp = match config.thp.enabled {
            false => None,
            true => {
                let c = &config.thp;
                let policy = thp::Policy::parse(&c.policy).unwrap_or(thp::Policy::Coverage);
                let opts = thp::Options::default()
                    .interval(Duration::from_millis(config.interval_ms))
                    .window(Duration::from_millis(config.window_ms))
                    .policy(policy)
                    .budget(
                        thp::Budget::default()
                            .per_second(c.budget_per_second)
                            .cpu_share(c.cpu_share),
                    )
                    .walk_ns(walk_ns)
                    .recovery(None)
                    .coverage_per_step((c.measure_per_step > 0).then_some(c.measure_per_step));
                Some(thp::Agent::new(&[], opts)?)
            }
        };
        let dedup = match config.dedup.enabled {
            false => None,
            true => {
                let c = &config.dedup;
                let opts = dedup::Options::default()
                    .window(Duration::from_millis(config.window_ms))
                    .policy(dedup::Policy::parse(&c.policy).unwrap_or(dedup::Policy::SmartMd))
                    .hot_backoff(c.hot_backoff)
                    .whole_mappings(c.whole_mappings);
                match dedup::Agent::new(&[], opts.clone()) {
                    Ok(d) => Some(d),
                    Err(e) if e.class() == ErrorClass::Busy => {
                        notes.push(format!(
                            "dedup: {e}; the dedup agent waits for it, the others run meanwhile"
                        ));
                        waiting = Some((opts, e.to_string()));
                        None
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let kube = kube::Watch::new(config.kubernetes_api, &mut notes);
        Ok(Node {
            kube,
            selection: Selection::new(config),
            thp,
            dedup,
            dedup_waiting: waiting,
            known: Vec::new(),
            steps: 0,
            t0,
            figures: Default::default(),
            tasks: TaskCensus::open().ok(),
            last_census: None,
            notes,
            per_process: config.per_process_metrics,
        })
    }

    /// What happened since last asked, one line each: processes watched
    /// and those that could not be, the dedup agent waiting or running.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Steps taken.
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }

    /// Watches the processes selected now that are not yet watched; one
    /// that cannot be is noted and left.
    fn follow(&mut self) {
        self.kube.refresh(&mut self.notes);
        self.release_opted_out();
        let kube = &self.kube;
        for ch in self.selection.chosen(|m| kube.leaves(m)) {
            if self.known.iter().any(|k| k.member.pid == ch.member.pid) {
                continue;
            }
            let pid = ch.member.pid;
            if let (Some(t), true) = (self.thp.as_mut(), ch.thp) {
                let r = match &ch.group {
                    Some((g, budget)) => t.add_in_group(pid, g, *budget),
                    None => t.add(pid),
                };
                if let Err(e) = r {
                    self.notes.push(format!("pid {pid}: no huge pages: {e}"));
                }
            }
            if let (Some(d), true) = (self.dedup.as_mut(), ch.dedup) {
                if let Err(e) = d.add(pid) {
                    self.notes.push(format!("pid {pid}: no dedup: {e}"));
                }
            }
            self.notes.push(format!("watching {}", describe(&ch)));
            self.known.push(ch);
        }
    }

    /// Leaves alone from now on each process watched whose pod (or its
    /// namespace) opted out since it was taken: the dedup agent unmerges
    /// what it made mergeable there, the huge-page agent stops (its huge
    /// pages stay), and its series go.
    fn release_opted_out(&mut self) {
        let kube = &self.kube;
        let (out, keep): (Vec<SelectedProcess>, Vec<SelectedProcess>) =
            std::mem::take(&mut self.known)
                .into_iter()
                .partition(|k| kube.leaves(&k.member));
        self.known = keep;
        for k in out {
            let pid = k.member.pid;
            if let Some(t) = self.thp.as_mut() {
                t.release(pid);
            }
            let mut undone = String::new();
            if let Some(d) = self.dedup.as_mut() {
                for a in d.release(pid) {
                    undone += &match a {
                        dedup::Action::Unmerged { regions, .. } => {
                            format!("; {regions} region(s) unmerged")
                        }
                        dedup::Action::Failed { why, .. } => format!("; unmerging failed: {why}"),
                        other => format!("; {other:?}"),
                    };
                }
            }
            self.notes.push(format!(
                "left alone now (opted out): {}{undone}",
                describe(&k)
            ));
        }
    }

    /// Makes the dedup agent if it waits and what it needs is free now;
    /// it then watches every process known that it may act on.
    fn retry_dedup(&mut self) {
        let Some((opts, _)) = &self.dedup_waiting else {
            return;
        };
        match dedup::Agent::new(&[], opts.clone()) {
            Ok(mut d) => {
                self.notes
                    .push("dedup: KSM is free now; the dedup agent runs".into());
                for k in self.known.iter().filter(|k| k.dedup) {
                    let pid = k.member.pid;
                    if let Err(e) = d.add(pid) {
                        self.notes.push(format!("pid {pid}: no dedup: {e}"));
                    }
                }
                self.dedup = Some(d);
                self.dedup_waiting = None;
            }
            Err(e) => {
                if let Some(w) = self.dedup_waiting.as_mut() {
                    w.1 = e.to_string();
                }
            }
        }
    }

    /// Whether each agent runs now, as metrics (with the reason in the
    /// notes): `pagewise_node_agent_running{agent}`.
    fn running(&self) -> Vec<Metric> {
        let run = |name: &str, on: bool| {
            Metric::labelled(
                "agent_running",
                "Whether an agent the configuration enables runs now (0: it waits for \
                 what it needs, said in the log).",
                vec![("agent", name.to_string())],
                if on { 1.0 } else { 0.0 },
            )
        };
        let mut m = Vec::new();
        if self.thp.is_some() {
            m.push(run("thp", true));
        }
        if self.dedup.is_some() || self.dedup_waiting.is_some() {
            m.push(run("dedup", self.dedup.is_some()));
        }
        m
    }
}

impl Agent for Node {
    type Step = Step;
    type Action = Taken;
    const NAME: &'static str = "node";

    /// Watches one more process with both agents, in no group.
    fn add(&mut self, pid: i32) -> pagewise_mech::Result<()> {
        if let Some(t) = self.thp.as_mut() {
            t.add(pid)?;
        }
        if let Some(d) = self.dedup.as_mut() {
            d.add(pid)?;
        }
        self.known.push(SelectedProcess {
            member: Member::of(pid),
            group: None,
            thp: self.thp.is_some(),
            dedup: self.dedup.is_some(),
        });
        Ok(())
    }

    /// The node agent watches the node: it runs until it is interrupted
    /// or its steps are done, whatever runs meanwhile.
    fn watching(&self) -> bool {
        true
    }

    fn step(&mut self) -> pagewise_mech::Result<Step> {
        let census = self.tasks.as_ref().and_then(|t| t.read());
        let look =
            census.is_none() || census != self.last_census || self.steps.is_multiple_of(LOOK_EVERY);
        if look {
            self.follow();
            self.last_census = census;
        }
        let thp = match self.thp.as_mut().filter(|t| t.watching()) {
            Some(t) => Some(t.step()?),
            None => None,
        };
        let dedup = match self.dedup.as_mut().filter(|d| d.watching()) {
            Some(d) => Some(d.step()?),
            None => None,
        };
        self.steps += 1;
        if self.dedup_waiting.is_some() && self.steps.is_multiple_of(DEDUP_RETRY_STEPS) {
            self.retry_dedup();
        }
        if look {
            self.known.retain(|k| procfs::is_alive(k.member.pid));
        }
        Ok(Step {
            t_ms: self.t0.elapsed().as_millis() as u64,
            processes: self.known.len(),
            containers: metrics::containers(&self.known).len(),
            thp,
            dedup,
        })
    }

    fn end(&mut self) -> Vec<Taken> {
        let mut taken: Vec<Taken> = Vec::new();
        if let Some(d) = self.dedup.as_mut() {
            taken.extend(d.end().into_iter().map(Taken::Dedup));
        }
        if let Some(t) = self.thp.as_mut() {
            taken.extend(t.end().into_iter().map(Taken::Thp));
        }
        taken
    }

    fn metric_values(&self) -> Vec<Metric> {
        let groups = self.thp.as_ref().map(|t| t.groups()).unwrap_or_default();
        // The figures are kept between reads (see `metrics.rs`).
        let mut figures = self.figures.borrow_mut();
        let mut m =
            metrics::node_metrics(&self.known, (self.steps, self.t0), &groups, &mut figures);
        m.extend(self.running());
        m.extend(self.kube.metric());
        m
    }

    /// Its own, the huge-page agent's and the dedup agent's; a process's
    /// series folded into its container's unless the configuration asks
    /// for them ([`Config::per_process_metrics`]).
    fn metric_groups(&self) -> Vec<(&'static str, Vec<Metric>)> {
        let mut g = vec![(Node::NAME, self.metric_values())];
        if let Some(t) = &self.thp {
            g.push((thp::Agent::NAME, t.metric_values()));
        }
        if let Some(d) = &self.dedup {
            g.push((dedup::Agent::NAME, d.metric_values()));
        }
        if !self.per_process {
            for (_, m) in g.iter_mut() {
                *m = crate::per_container(std::mem::take(m));
            }
        }
        g
    }
}

/// `pid 4242 (9 inside) in podman 6148a47bde33: thp (budget 64), dedup`.
pub fn describe(ch: &SelectedProcess) -> String {
    let m = &ch.member;
    let inside = match m.ns_pid {
        Some(n) if n != m.pid => format!(" ({n} inside)"),
        _ => String::new(),
    };
    let of = match &m.container {
        Some(c) => format!(" in {}", group_of(c)),
        None => String::new(),
    };
    let mut what = Vec::new();
    if ch.thp {
        what.push(match &ch.group {
            Some((_, b)) => format!("thp (budget {b})"),
            None => "thp".to_string(),
        });
    }
    if ch.dedup {
        what.push("dedup".to_string());
    }
    format!("pid {}{inside}{of}: {}", m.pid, what.join(", "))
}
