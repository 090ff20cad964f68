//! `pagewise thp`: the huge-page agent (HawkEye's promotion by access
//! coverage, fairly across processes, under a budget).

use anyhow::{Context, Result};
use pagewise::agent::gains::{Gains, Ledger};
use pagewise::thp::agent::{Action, Agent, Budget, Options, Policy, Pressure, Recovery, Step};
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Promote the 2 MiB regions of processes to huge pages by benefit.
    ///
    /// Each interval the agent measures, over a window, which pages of each
    /// not-yet-huge 2 MiB region the processes write (from outside: they are
    /// stopped for a moment once, when first watched), ranks the regions by
    /// coverage x the page-walk cost measured on this machine, and collapses
    /// the best ones (process_madvise(MADV_COLLAPSE), CAP_SYS_NICE), giving
    /// the next huge page to the process that stands to gain most, within
    /// the budget. With --recover-bloat it gives back the zero-filled pages
    /// of huge pages when memory is tight, and lowers khugepaged's
    /// max_ptes_none meanwhile (put back after, also on SIGINT/SIGTERM).
    /// SIGINT or SIGTERM ends it between steps, leaving nothing registered
    /// in the processes.
    Run(Box<RunArgs>),
    /// Run a command with huge pages zeroed ahead of where its memory grows.
    ///
    /// A thread inside the program (through the preload shim) faults huge
    /// pages in ahead of the last 2 MiB holding data in each mapping that
    /// takes huge pages (THP `always`, or `MADV_HUGEPAGE`), so the program's
    /// first touch of a new 2 MiB does not wait while the kernel zeroes it.
    /// Costs up to --ahead huge pages of memory per growing mapping.
    Prezero(PrezeroArgs),
}

#[derive(clap::Args)]
struct PrezeroArgs {
    /// Huge pages kept faulted in ahead of each growing mapping.
    #[arg(long, default_value_t = 4)]
    ahead: u64,
    /// Most huge pages faulted in per second.
    #[arg(long, default_value_t = 4000.0)]
    rate: f64,
    /// Say what the thread did as one JSON object on stdout (the program's
    /// stdout then goes to stderr).
    #[arg(long)]
    json: bool,
    /// The command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Milliseconds between steps.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Milliseconds of the coverage window inside a step.
    #[arg(long, default_value_t = 200)]
    window_ms: u64,
    /// Promotion order: coverage (HawkEye), address (khugepaged's order), or
    /// utilisation:F (Ingens-like: regions at least F resident, fullest first).
    #[arg(long, default_value = "coverage")]
    policy: String,
    /// Huge pages to promote in all.
    #[arg(long)]
    budget_total: Option<u64>,
    /// Huge pages per second.
    #[arg(long, default_value_t = 16.0)]
    budget_per_s: f64,
    /// Share of one CPU the collapses of a step may take.
    #[arg(long, default_value_t = 0.1)]
    cpu_share: f64,
    /// The page-walk cost to rank by, ns (measured at start if not given).
    #[arg(long)]
    walk_ns: Option<f64>,
    /// Most candidates whose coverage a step measures, those measured
    /// longest ago first, the others keeping their last figure (default:
    /// all): each is write-protected for the window, most of a step's cost.
    #[arg(long)]
    measure_per_step: Option<usize>,
    /// Give back the zero-filled base pages of huge pages when memory is
    /// tight (the process is stopped for it, each time, for a moment).
    #[arg(long)]
    recover_bloat: bool,
    /// With --recover-bloat: when memory counts as tight: always,
    /// available-below:MIB (MemAvailable), stall-above:PCT (memory
    /// pressure, some avg10), or limit-above:PCT (the process's memory
    /// cgroup charged above PCT % of its limit). Default: MemAvailable
    /// below a tenth of memory.
    #[arg(long, value_name = "WHEN", requires = "recover_bloat")]
    pressure: Option<String>,
    /// With --recover-bloat: zero-filled pages (of 512) a huge page must
    /// hold to give them back.
    #[arg(long, default_value_t = 256, requires = "recover_bloat",
          value_parser = clap::value_parser!(u64).range(1..=512))]
    zero_pages: u64,
    /// With --recover-bloat: leave khugepaged's max_ptes_none alone (by
    /// default it is lowered to ZERO_PAGES - 1 while memory is tight, so
    /// that khugepaged does not fill again what was given back, and put
    /// back after).
    #[arg(long, requires = "recover_bloat")]
    keep_khugepaged: bool,
    /// With --recover-bloat: seconds after memory was last tight during
    /// which the agent still acts as if it were (max_ptes_none stays
    /// lowered, sparse regions are not promoted), so that what a recovery
    /// gave back is not filled again at once.
    #[arg(long, default_value_t = 60.0, requires = "recover_bloat")]
    hold_s: f64,
    #[command(flatten)]
    watch: crate::agent_loop::Watch,
}

pub fn run(a: Args) -> Result<i32> {
    match a.sub {
        Sub::Run(r) => run_agent(*r),
        Sub::Prezero(p) => prezero(p),
    }
}

/// `thp prezero -- CMD`: the program runs with the pre-zeroing thread in
/// it; what the thread did is said when it ends.
fn prezero(p: PrezeroArgs) -> Result<i32> {
    use pagewise::thp::prezero::{start_prezeroed, PrezeroOptions};
    if p.ahead == 0 || p.rate.is_nan() || p.rate <= 0.0 {
        crate::usage!("--ahead and --rate must be above 0");
    }
    let stop = crate::stop::Stop::take()?;
    let opts = PrezeroOptions::default().ahead(p.ahead).rate(p.rate);
    let t0 = Instant::now();
    let mut z = start_prezeroed(&p.command, &opts, |c| {
        crate::stop::program_output(c, p.json)
    })?;
    let st = stop.wait(&mut z.child)?;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let code = stop.exit_code(st);
    let report = z.report(Duration::from_secs(2));
    if p.json {
        let r = report.as_ref().ok();
        let v = PrezeroOutput {
            command: &p.command,
            status: code,
            wall_ms,
            ahead: p.ahead,
            rate: p.rate,
            reported: r.is_some(),
            populated: r.map(|r| r.populated),
            populated_bytes: r.map(|r| r.populated * pagewise::HUGE_PAGE_SIZE as u64),
            scans: r.map(|r| r.scans),
            cpu_ms: r.map(|r| r.cpu_ms),
        };
        println!("{}", crate::json::line(&v)?);
        return Ok(code);
    }
    match report {
        Ok(r) => eprintln!(
            "pagewise: {} ended ({st}) after {:.0} ms: {} huge pages pre-zeroed ahead ({} MiB), \
             {} looks, the thread's CPU {:.1} ms ({:.2} % of one CPU)",
            p.command[0],
            wall_ms,
            r.populated,
            r.populated * 2,
            r.scans,
            r.cpu_ms,
            r.cpu_ms / wall_ms.max(1.0) * 100.0
        ),
        Err(e) => eprintln!(
            "pagewise: {} ended ({st}) after {wall_ms:.0} ms without a pre-zeroing report \
             (killed, ended with _exit, or it did not load the shim: statically linked or \
             setuid): {e}",
            p.command[0]
        ),
    }
    Ok(code)
}

pub(crate) fn policy_of(s: &str) -> Result<Policy> {
    match Policy::parse(s) {
        Ok(p) => Ok(p),
        Err(why) => crate::usage!("{why}"),
    }
}

fn pressure_of(s: Option<&str>) -> Result<Pressure> {
    let Some(s) = s else {
        return Ok(Pressure::available_below_a_tenth()?);
    };
    if s == "always" {
        return Ok(Pressure::Always);
    }
    if let Some(m) = s.strip_prefix("available-below:") {
        let mib: u64 = m.parse().with_context(|| format!("--pressure {s}"))?;
        return Ok(Pressure::AvailableBelow(mib << 20));
    }
    if let Some(p) = s.strip_prefix("stall-above:") {
        let pct: f64 = p.parse().with_context(|| format!("--pressure {s}"))?;
        return Ok(Pressure::StallAbove(pct));
    }
    if let Some(p) = s.strip_prefix("limit-above:") {
        let pct: f64 = p.parse().with_context(|| format!("--pressure {s}"))?;
        return Ok(Pressure::LimitAbove(pct));
    }
    crate::usage!("--pressure {s}: always, available-below:MIB, stall-above:PCT or limit-above:PCT")
}

fn run_agent(a: RunArgs) -> Result<i32> {
    let policy = policy_of(&a.policy)?;
    // Said up front: without it every collapse would be refused, one by one.
    if !pagewise::thp::agent::may_collapse_in_others() {
        return Err(crate::exit::NotPermitted(
            "thp run collapses huge pages in other processes with \
             process_madvise(MADV_COLLAPSE), which needs CAP_SYS_NICE: run it as root \
             or give it that capability"
                .into(),
        )
        .into());
    }
    let stop = crate::stop::Stop::take()?;
    let (pids, child) = crate::agent_loop::start(&a.watch, a.interval_ms, a.window_ms)?;
    let walk_ns = match a.walk_ns {
        Some(w) => w,
        None => match crate::agent_loop::walk_cost(&stop) {
            Some(w) => w,
            None => return crate::agent_loop::end_before_start(&stop, child),
        },
    };
    let opts = Options::default()
        .interval(Duration::from_millis(a.interval_ms))
        .window(Duration::from_millis(a.window_ms))
        .policy(policy)
        .budget(
            Budget::default()
                .total(a.budget_total)
                .per_second(a.budget_per_s)
                .cpu_share(a.cpu_share),
        )
        .walk_ns(walk_ns)
        .coverage_per_step(a.measure_per_step)
        .recovery(if a.recover_bloat {
            Some(
                Recovery::default()
                    .when(pressure_of(a.pressure.as_deref())?)
                    .zero_pages(a.zero_pages)
                    .tune_khugepaged(!a.keep_khugepaged)
                    .hold(Duration::from_secs_f64(a.hold_s.max(0.0))),
            )
        } else {
            None
        });
    // The machine's settings are read before the agent changes any.
    let mut ledger = Ledger::new(&pagewise::agent::gains::THP_SETTINGS);
    let mut agent = Agent::new(&pids, opts)?;
    if !a.watch.json {
        let held: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
        println!(
            "watching {}; policy {}; page walk {walk_ns:.1} ns; every {} ms (SIGINT or SIGTERM ends)",
            crate::agent_loop::watching(&a.watch, &held),
            a.policy,
            a.interval_ms
        );
    }
    let t0 = Instant::now();
    let status = crate::agent_loop::drive(
        &a.watch,
        Duration::from_millis(a.interval_ms),
        &stop,
        (child, &mut ledger),
        &mut agent,
        |step| report(step, a.watch.json),
    )?;
    let gains = ledger.gains();
    let c = agent.counters();
    if !a.watch.json {
        println!(
            "{} steps: {} promoted, {} refused by the kernel, {} passed over for the budget; the agent's CPU {:.1} ms ({:.2} % of one CPU)",
            c.steps,
            c.promoted,
            c.failed,
            c.skipped_budget,
            c.cpu_ms,
            c.cpu_ms / (t0.elapsed().as_secs_f64() * 1e3).max(1.0) * 100.0
        );
    }
    crate::agent_loop::say_gains(&gains, a.watch.json, &RunLine::Gained { gained: &gains })?;
    drop(agent);
    crate::agent_loop::say_put_back();
    Ok(status)
}

/// `thp run --json`: one object a step of the agent, then one at the end.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum RunLine<'a> {
    /// One step of the agent.
    Step(&'a Step),
    /// At the end: the watched processes from when each was first watched
    /// (under the machine's settings before the agent) to the end.
    Gained {
        /// What they held, and the settings before.
        gained: &'a Gains,
    },
}
impl crate::json::Printed for RunLine<'_> {}

/// `thp prezero --json`: the program's run and what the pre-zeroing thread
/// did (its counts only when the shim reported them).
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct PrezeroOutput<'a> {
    /// The command run.
    pub command: &'a [String],
    /// Its exit status.
    pub status: i32,
    /// How long it ran.
    pub wall_ms: f64,
    /// Huge pages kept faulted in ahead of each growing mapping.
    pub ahead: u64,
    /// Most huge pages made ready per second.
    pub rate: f64,
    /// Whether the shim sent its report.
    pub reported: bool,
    /// Huge pages the thread faulted in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub populated: Option<u64>,
    /// The same in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub populated_bytes: Option<u64>,
    /// Scans of the program's mappings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scans: Option<u64>,
    /// CPU time of the thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<f64>,
}
impl crate::json::Printed for PrezeroOutput<'_> {}

fn report(step: &Step, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", crate::json::line(&RunLine::Step(step))?)?;
        return Ok(());
    }
    for p in &step.processes {
        write!(
            out,
            "{:>7.1}s pid {}: {} huge, {} candidates, {} promoted so far",
            step.t_ms as f64 / 1e3,
            p.process.pid,
            p.huge_regions,
            p.candidates,
            p.promoted
        )?;
        if p.expected_ns_per_s > 0.0 {
            write!(out, ", walks worth {:.1} µs/s", p.expected_ns_per_s / 1e3)?;
        }
        writeln!(out)?;
    }
    for act in &step.actions {
        match act {
            Action::Promoted {
                pid,
                start,
                benefit_ns_per_s,
                resident,
                ms,
            } => writeln!(
                out,
                "          promoted pid {pid} {start:#x} ({resident} pages resident{}) in {ms:.2} ms",
                benefit_ns_per_s.map_or(String::new(), |b| format!(", saves {:.1} µs/s", b / 1e3))
            )?,
            Action::Failed { pid, start, why } => {
                writeln!(out, "          refused  pid {pid} {start:#x}: {why}")?
            }
            Action::Skipped { pid, regions, why } => {
                writeln!(out, "          skipped  pid {pid}: {regions} regions: {why}")?
            }
            Action::Gone { pid, why } => writeln!(out, "          gone     pid {pid}: {why}")?,
            Action::Recovered {
                pid,
                start,
                zero_pages,
                stopped_ms,
                pressure,
            } => writeln!(
                out,
                "          recovered pid {pid} {start:#x}: {zero_pages} zero pages given back (stopped {stopped_ms:.2} ms; {pressure})"
            )?,
            Action::Tuned { knob, from, to } => {
                writeln!(out, "          memory tight: {knob} {from} -> {to}")?
            }
            Action::NotTuned { knob, why } => {
                writeln!(out, "          could not change {knob}: {why}")?
            }
            Action::PutBack { knob, to } => {
                writeln!(out, "          memory no longer tight: {knob} back to {to}")?
            }
            Action::NotRecovered { pid, why } => {
                writeln!(out, "          no recovery in pid {pid}: {why}")?
            }
            Action::NoCoverage { pid, why } => {
                writeln!(out, "          no coverage for pid {pid} (ranked by utilisation): {why}")?
            }
            other => writeln!(out, "          {other:?}")?,
        }
    }
    Ok(())
}
