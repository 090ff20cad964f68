//! `pagewise agent --config FILE`: the node agent. One long-running
//! service that applies the huge-page and dedup agents to the containers
//! its configuration selects ([`crate::node`]), with a budget of huge
//! pages per container; serves `/metrics` (Prometheus text, every metric
//! with its help and type, processes labelled with their pid, pid inside,
//! container, runtime and pod) and `/healthz` from start-up; reports what
//! KSM saves each process by the kernel's own accounting
//! (`/proc/PID/ksm_stat`) and the huge pages each holds; on SIGTERM or
//! SIGINT takes back its advice, puts back every system setting it
//! changed (journaled first, so a killed agent is repaired by the next
//! run), and says so.

use crate::node::{Config, SelectedProcess, Selection};
use crate::stop::Stop;
use anyhow::Result;
use pagewise::agent::{self as agents, Agent as _, Metric};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(after_help = "The configuration (TOML), with its defaults:

  interval_ms = 2000          # a step of both agents every interval
  window_ms = 200             # each agent's measuring window in a step
  listen = \"127.0.0.1:9464\"   # /metrics and /healthz, answered from start-up
  # listen_public = true      # needed to listen beyond loopback
  # metrics_file = \"/run/pagewise/agent.prom\"

  [thp]                       # huge pages where they pay (as thp run)
  enabled = true
  policy = \"coverage\"         # or address, utilisation:F
  budget_per_second = 16.0
  cpu_share = 0.1
  measure_per_step = 64       # candidates whose coverage a step measures (0: all)
  # walk_ns = 30.0            # measured at start-up if not given

  [dedup]                     # KSM where it costs no hot huge page (as dedup run)
  enabled = true
  policy = \"smartmd\"
  hot_backoff = 8             # steps a region hot step after step may rest unwatched
  whole_mappings = false      # merge whole mappings only (programs that mremap)

  [[select]]                  # every process in a container
  all_containers = true       # or: container = \"ID|NAME\", cgroup = \"PATH\"
  huge_pages = 64             # huge pages each container may be given
  thp = true
  dedup = true

Processes are followed as they come; each is taken by the first [[select]]
that selects it. SIGTERM or SIGINT ends the agent, which puts back what it
changed and says so.")]
pub struct Args {
    /// The configuration file (TOML; its keys below).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Check the configuration, say what it selects now, and exit.
    #[arg(long)]
    check: bool,
    /// One JSON object per step on stdout.
    #[arg(long)]
    json: bool,
    /// Stop after this many steps (default: until SIGTERM or SIGINT).
    #[arg(long)]
    steps: Option<u64>,
}

/// `agent --json`: one object a step.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Line<'a> {
    /// Since the agent started, ms.
    pub t_ms: u64,
    /// Processes watched.
    pub processes: usize,
    /// Containers they are in.
    pub containers: usize,
    /// The huge-page agent's step, where it stepped.
    pub thp: Option<&'a pagewise::thp::agent::Step>,
    /// The dedup agent's step, where it stepped.
    pub dedup: Option<&'a pagewise::dedup::Step>,
}
impl crate::json::Printed for Line<'_> {}

/// The two agents, each where it runs.
struct Agents {
    thp: Option<pagewise::thp::agent::Agent>,
    dedup: Option<pagewise::dedup::Agent>,
    /// The dedup agent's options and why it does not run yet, while what
    /// it needs (KSM) is held by another pagewise: it is made as soon as
    /// that is free, the huge-page agent running meanwhile.
    dedup_waiting: Option<(pagewise::dedup::Options, String)>,
}

/// Steps between two tries to make the dedup agent while KSM is held.
const DEDUP_RETRY_STEPS: u64 = 5;

impl Agents {
    /// Makes the dedup agent if it waits and what it needs is free now;
    /// it then watches every process `known` gives it.
    fn retry_dedup(&mut self, known: &[SelectedProcess]) {
        let Some((opts, _)) = &self.dedup_waiting else {
            return;
        };
        match pagewise::dedup::Agent::new(&[], opts.clone()) {
            Ok(mut d) => {
                eprintln!("pagewise: dedup: KSM is free now; the dedup agent runs");
                for k in known.iter().filter(|k| k.dedup) {
                    let pid = k.member.pid;
                    if let Err(e) = d.add(pid) {
                        eprintln!("pagewise: pid {pid}: no dedup: {e}");
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
    /// log): `pagewise_node_agent_running{agent}`.
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

pub fn run(a: Args) -> Result<i32> {
    let stop = Stop::take()?;
    let c = Config::read(&a.config)?;
    let sel = Selection::new(&c);
    if a.check {
        for ch in sel.chosen() {
            println!("{}", describe(&ch));
        }
        return Ok(0);
    }
    let t0 = Instant::now();
    // Answering first: /healthz and /metrics from start-up on, before the
    // agents are made (the walk cost is measured, KSM claimed).
    let mut sampled = FiguresCache::default();
    let interval = Duration::from_millis(c.interval_ms);
    let served = agents::Published::new(
        interval,
        node_text(&[], 0, t0, &[], &mut sampled, Vec::new()),
    );
    let _endpoint = agents::Endpoint::start(&c.listen, served.clone())?;
    if !a.json {
        eprintln!(
            "pagewise: agent answering at http://{}/metrics and /healthz",
            c.listen
        );
    }
    let Some(mut ag) = make_agents(&c, &stop)? else {
        eprintln!("pagewise: agent stopped before its first step");
        crate::agent_loop::say_put_back();
        return Ok(stop.status().unwrap_or(0));
    };
    let mut known: Vec<SelectedProcess> = Vec::new();
    let mut steps = 0u64;
    let mut last_census = None;
    let tasks = pagewise::process::TaskCensus::open().ok();
    while a.steps.is_none_or(|n| steps < n) {
        if stop.sleep((t0 + interval * steps as u32).saturating_duration_since(Instant::now())) {
            break;
        }
        // The node's processes are read again for newcomers when a task
        // began or ended (the kernel's census of tasks, not a listing of
        // /proc), and every LOOK_EVERY steps all the same (a process moved
        // into a container's cgroup after it started).
        let census = tasks.as_ref().and_then(|t| t.read());
        let look = census.is_none() || census != last_census || steps.is_multiple_of(LOOK_EVERY);
        if look {
            follow(&sel, &mut known, &mut ag, !a.json);
            last_census = census;
        }
        let thp = match ag.thp.as_mut().filter(|t| t.watching()) {
            Some(t) => Some(t.step()?),
            None => None,
        };
        let dedup = match ag.dedup.as_mut().filter(|d| d.watching()) {
            Some(d) => Some(d.step()?),
            None => None,
        };
        steps += 1;
        if ag.dedup_waiting.is_some() && steps.is_multiple_of(DEDUP_RETRY_STEPS) {
            ag.retry_dedup(&known);
        }
        if look {
            known.retain(|k| pagewise::process::is_alive(k.member.pid));
        }
        let groups = ag.thp.as_ref().map(|t| t.groups()).unwrap_or_default();
        let mut text = node_text(&known, steps, t0, &groups, &mut sampled, ag.running());
        if let Some(t) = &ag.thp {
            text += &t.metrics();
        }
        if let Some(d) = &ag.dedup {
            text += &d.metrics();
        }
        if let Some(f) = &c.metrics_file {
            pagewise::system::replace(f, text.as_bytes())?;
        }
        served.stepped(text);
        if a.json {
            let line = Line {
                t_ms: t0.elapsed().as_millis() as u64,
                processes: known.len(),
                containers: containers(&known).len(),
                thp: thp.as_ref(),
                dedup: dedup.as_ref(),
            };
            println!("{}", crate::json::line(&line)?);
        }
    }
    // What must not outlive the agent is taken back; settings are put
    // back as the agents are dropped.
    if let Some(d) = ag.dedup.as_mut() {
        d.end();
    }
    if let Some(t) = ag.thp.as_mut() {
        t.end();
    }
    drop(ag);
    eprintln!("pagewise: agent stopped after {steps} steps");
    crate::agent_loop::say_put_back();
    Ok(stop.status().unwrap_or(0))
}

/// The agents the configuration asks for.
fn make_agents(c: &Config, stop: &Stop) -> Result<Option<Agents>> {
    let mut waiting = None;
    let thp = match c.thp.enabled {
        false => None,
        true => {
            let policy = crate::cmd_thp::policy_of(&c.thp.policy)?;
            let walk_ns = match c.thp.walk_ns {
                Some(w) => w,
                None => match crate::agent_loop::walk_cost(stop) {
                    Some(w) => w,
                    None => return Ok(None),
                },
            };
            let opts = pagewise::thp::agent::Options::default()
                .interval(Duration::from_millis(c.interval_ms))
                .window(Duration::from_millis(c.window_ms))
                .policy(policy)
                .budget(
                    pagewise::thp::agent::Budget::default()
                        .per_second(c.thp.budget_per_second)
                        .cpu_share(c.thp.cpu_share),
                )
                .walk_ns(walk_ns)
                .recovery(None)
                .coverage_per_step((c.thp.measure_per_step > 0).then_some(c.thp.measure_per_step));
            Some(pagewise::thp::agent::Agent::new(&[], opts)?)
        }
    };
    let dedup = match c.dedup.enabled {
        false => None,
        true => {
            let Some(policy) = pagewise::dedup::Policy::parse(&c.dedup.policy) else {
                crate::usage!(
                    "[dedup] policy = {:?}: smartmd, ksm-everywhere, no-splitting or ingens-like",
                    c.dedup.policy
                );
            };
            let opts = pagewise::dedup::Options::default()
                .window(Duration::from_millis(c.window_ms))
                .policy(policy)
                .hot_backoff(c.dedup.hot_backoff)
                .whole_mappings(c.dedup.whole_mappings);
            match pagewise::dedup::Agent::new(&[], opts.clone()) {
                Ok(d) => Some(d),
                // Another pagewise holds KSM: the huge-page agent runs
                // alone meanwhile, rather than the node agent exiting (a
                // DaemonSet would restart it for ever).
                Err(e) if e.class() == pagewise::ErrorClass::Busy => {
                    eprintln!(
                        "pagewise: dedup: {e}; the dedup agent waits for it, the others run \
                         meanwhile"
                    );
                    waiting = Some((opts, e.to_string()));
                    None
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    Ok(Some(Agents {
        thp,
        dedup,
        dedup_waiting: waiting,
    }))
}

/// Watches the processes selected now that are not yet watched; one that
/// cannot be is said and left.
fn follow(sel: &Selection, known: &mut Vec<SelectedProcess>, ag: &mut Agents, say: bool) {
    for ch in sel.chosen() {
        if known.iter().any(|k| k.member.pid == ch.member.pid) {
            continue;
        }
        let pid = ch.member.pid;
        if let (Some(t), true) = (ag.thp.as_mut(), ch.thp) {
            let r = match &ch.group {
                Some((g, budget)) => t.add_in_group(pid, g, *budget),
                None => t.add(pid),
            };
            if let Err(e) = r {
                eprintln!("pagewise: pid {pid}: no huge pages: {e}");
            }
        }
        if let (Some(d), true) = (ag.dedup.as_mut(), ch.dedup) {
            if let Err(e) = d.add(pid) {
                eprintln!("pagewise: pid {pid}: no dedup: {e}");
            }
        }
        if say {
            eprintln!("pagewise: watching {}", describe(&ch));
        }
        known.push(ch);
    }
}

/// `pid 4242 (9 inside) in podman 6148a47bde33: thp (budget 64), dedup`.
fn describe(ch: &SelectedProcess) -> String {
    let m = &ch.member;
    let inside = match m.ns_pid {
        Some(n) if n != m.pid => format!(" ({n} inside)"),
        _ => String::new(),
    };
    let of = match &m.container {
        Some(c) => format!(" in {}", crate::node::group_of(c)),
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

/// The containers the processes are in, each once.
fn containers(known: &[SelectedProcess]) -> Vec<&pagewise::process::container::ContainerRef> {
    let mut out: Vec<&pagewise::process::container::ContainerRef> = Vec::new();
    for c in known.iter().filter_map(|k| k.member.container.as_ref()) {
        if !out.iter().any(|o| o.id == c.id) {
            out.push(c);
        }
    }
    out
}

/// Steps between two reads of the node's processes for newcomers when no
/// task began or ended (one moved into a container's cgroup meanwhile).
const LOOK_EVERY: u64 = 15;
/// Steps between two reads of each process's `ksm_stat` and
/// `smaps_rollup` (the latter walks all its page tables): a scrape every
/// 30 s or so needs no fresher figures.
const SAMPLE_EVERY: u64 = 5;

/// A process's KSM figures (merging pages, profit) and huge pages.
type Figures = (Option<(u64, i64)>, Option<u64>);

/// Each watched process's [`Figures`], as last read, and the step they
/// were read at.
#[derive(Default)]
struct FiguresCache {
    at: u64,
    per: std::collections::HashMap<i32, Figures>,
}

impl FiguresCache {
    /// Process `pid`'s figures: read again every [`SAMPLE_EVERY`] steps
    /// (and for a process not read yet).
    fn figures_of(&mut self, pid: i32, steps: u64) -> Figures {
        if steps >= self.at + SAMPLE_EVERY {
            self.at = steps;
            self.per.clear();
        }
        *self.per.entry(pid).or_insert_with(|| {
            (
                pagewise::process::ksm_stat(pid).map(|s| (s.merging_pages, s.process_profit)),
                pagewise::process::resident(pid)
                    .ok()
                    .map(|r| r.anon_huge_kib / 2048),
            )
        })
    }
}

/// The node agent's own metrics: that it is up, its steps and CPU time,
/// what it watches, and per process what KSM saves it (the kernel's
/// `ksm_stat`) and the huge pages it holds (both read every
/// [`SAMPLE_EVERY`] steps); per container the huge pages given under its
/// budget.
fn node_text(
    known: &[SelectedProcess],
    steps: u64,
    t0: Instant,
    groups: &[(String, u64, u64)],
    sampled: &mut FiguresCache,
    running: Vec<Metric>,
) -> String {
    let cpu = pagewise::process::cpu_time(std::process::id() as i32)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut m = vec![
        Metric::gauge("up", "The node agent is running.", 1.0),
        Metric::counter("steps_total", "Steps of both agents taken.", steps as f64),
        Metric::counter(
            "cpu_seconds_total",
            "CPU time of the node agent's process (user and system).",
            cpu,
        ),
        Metric::gauge(
            "uptime_seconds",
            "Time since the agent started.",
            t0.elapsed().as_secs_f64(),
        ),
        Metric::gauge(
            "processes",
            "Processes watched and still there.",
            known.len() as f64,
        ),
        Metric::gauge(
            "containers",
            "Containers those processes are in.",
            containers(known).len() as f64,
        ),
    ];
    for k in known {
        let mm = &k.member;
        let labels = || agents::process_labels(mm.pid, mm.ns_pid, mm.container.as_ref());
        let (ksm, huge) = sampled.figures_of(mm.pid, steps);
        if let Some((merging, profit)) = ksm {
            m.push(Metric::labelled(
                "ksm_merging_pages",
                "Pages of the process merged by KSM (ksm_stat's ksm_merging_pages).",
                labels(),
                merging as f64,
            ));
            m.push(Metric::labelled(
                "ksm_profit_bytes",
                "What KSM saves the process less its own cost (ksm_stat's ksm_process_profit).",
                labels(),
                profit as f64,
            ));
        }
        if let Some(h) = huge {
            m.push(Metric::labelled(
                "anon_huge_pages",
                "Anonymous memory of the process mapped by 2 MiB pages (smaps_rollup's AnonHugePages).",
                labels(),
                h as f64,
            ));
        }
    }
    for c in containers(known) {
        let name = crate::node::group_of(c);
        if let Some((_, given, budget)) = groups.iter().find(|(g, _, _)| *g == name) {
            let labels = agents::container_labels(c);
            m.push(Metric::labelled(
                "container_huge_pages_given",
                "Huge pages the agent gave the container's processes.",
                labels.clone(),
                *given as f64,
            ));
            m.push(Metric::labelled(
                "container_huge_page_budget",
                "Huge pages the container's processes may be given in all.",
                labels,
                *budget as f64,
            ));
        }
    }
    m.extend(running);
    Metric::render("node", &m)
}
