//! What the agents' commands (`thp run`, `dedup run`) share: their flags,
//! starting the command to watch, and the library's drive of an agent
//! (`pagewise::agent::drive`: a step per interval until SIGINT/SIGTERM,
//! the watched processes are gone or the steps are done, the counters in
//! the Prometheus text format to a file or over HTTP) ended as the tool's
//! conventions say.

use anyhow::{Context, Result};
use pagewise::agent::gains::{Gains, Ledger};
use pagewise::agent::{self, Agent, Cadence, Ended};
use std::path::PathBuf;
use std::time::Duration;

/// What the agents' commands take alike: what to watch, how long, and
/// where the output goes.
#[derive(clap::Args)]
pub struct Watch {
    /// A process to watch (repeat for more).
    #[arg(long = "pid")]
    pub pids: Vec<i32>,
    #[command(flatten)]
    pub groups: crate::groups::Groups,
    /// Stop after this many steps.
    #[arg(long)]
    pub steps: Option<u64>,
    /// One JSON object per step on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write the counters in the Prometheus text format to FILE after each
    /// step (for node_exporter's textfile collector).
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
    /// Serve the counters in the Prometheus text format over HTTP at ADDR
    /// (loopback, e.g. 127.0.0.1:9101; another address needs
    /// --metrics-public).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Allow --metrics-listen on an address other than loopback: the
    /// counters name the watched processes (pids, command lines) to anyone
    /// who can reach it.
    #[arg(long)]
    pub metrics_public: bool,
    /// A command to start and watch (ends when it exits, with its status).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Checks the interval and the window inside it, and returns the pids to
/// watch given with `--pid`.
pub fn check(w: &Watch, interval_ms: u64, window_ms: u64) -> Result<Vec<i32>> {
    if w.pids.is_empty() && w.command.is_empty() && !w.groups.given() {
        crate::usage!(
            "give --pid PID, --container ID|NAME or --cgroup PATH (each repeatable), or -- CMD"
        );
    }
    if interval_ms == 0 || window_ms >= interval_ms {
        crate::usage!("--window-ms must be shorter than --interval-ms, which must be above 0");
    }
    if let (Some(addr), false) = (&w.metrics_listen, w.metrics_public) {
        use std::net::ToSocketAddrs;
        let all: Vec<_> = addr
            .to_socket_addrs()
            .with_context(|| format!("--metrics-listen {addr}"))?
            .collect();
        if all.is_empty() || all.iter().any(|a| !a.ip().is_loopback()) {
            crate::usage!(
                "--metrics-listen {addr} is not a loopback address: the counters name the \
                 watched processes; add --metrics-public to serve them there"
            );
        }
    }
    // A container's or cgroup's processes are said (and a selector that
    // holds none refused) now, and watched from `drive` on, where they are
    // followed as they come: those that end in between are left out.
    w.groups.add_to(&mut Vec::new())?;
    Ok(w.pids.clone())
}

/// As [`check`], then starts the command (if any) as it is; the pids to
/// watch, the command's among them.
pub fn start(
    w: &Watch,
    interval_ms: u64,
    window_ms: u64,
) -> Result<(Vec<i32>, Option<std::process::Child>)> {
    let mut pids = check(w, interval_ms, window_ms)?;
    if w.command.is_empty() {
        return Ok((pids, None));
    }
    let mut c = std::process::Command::new(&w.command[0]);
    c.args(&w.command[1..]);
    pagewise::agent::child::tie(&mut c);
    crate::stop::program_output(&mut c, w.json);
    let c = c
        .spawn()
        .with_context(|| format!("starting {}", w.command[0]))?;
    pids.push(c.id() as i32);
    Ok((pids, Some(c)))
}

/// Steps `agent` every `interval` through the library's
/// [`drive`](pagewise::agent::drive), each step handed to `report` and
/// its counters published, until SIGINT/SIGTERM, the end of the watched
/// processes or of `--steps`; returns the exit status: the command's when
/// it ended, else 0. On SIGINT/SIGTERM the command is stopped. Each
/// process watched is noted in `ledger` as it comes. The caller then ends
/// the agent and drops it (which puts its settings back).
pub fn drive<A: Agent>(
    w: &Watch,
    interval: Duration,
    stop: &crate::stop::Stop,
    (mut child, ledger): (Option<std::process::Child>, &mut Ledger),
    agent: &mut A,
    mut report: impl FnMut(&A::Step) -> Result<()>,
) -> Result<i32> {
    let cadence = Cadence::default()
        .interval(interval)
        .steps(w.steps)
        .metrics_file(w.metrics.clone())
        .metrics_listen(w.metrics_listen.clone());
    // A container's or cgroup's processes are followed as they come: each
    // new one is watched from the next step on.
    let mut known = w.pids.clone();
    for pid in known
        .iter()
        .copied()
        .chain(child.as_ref().map(|c| c.id() as i32))
    {
        ledger.watch(pid);
    }
    follow(w, &mut known, false, (agent, &mut *ledger));
    let ended = agent::drive(agent, &cadence, stop, child.as_mut(), |agent, step| {
        report(&step)?;
        ledger.refresh();
        follow(w, &mut known, true, (agent, &mut *ledger));
        Ok::<_, anyhow::Error>(std::ops::ControlFlow::Continue(()))
    })?;
    if let Some(code) = stop.status() {
        // SIGINT/SIGTERM: the command ended as the convention says.
        if let Some(mut c) = child {
            stop.end(&mut c);
        }
        return Ok(code);
    }
    Ok(match ended {
        Ended::ProgramExited(st) => pagewise::agent::child::exit_code(st),
        _ => 0,
    })
}

/// Watches the processes of `w`'s containers and cgroups that `known`
/// does not hold yet (saying each with `say`); one that ended in between
/// is left out, said.
fn follow<A: Agent>(
    w: &Watch,
    known: &mut Vec<i32>,
    say: bool,
    (agent, ledger): (&mut A, &mut Ledger),
) {
    if !w.groups.given() {
        return;
    }
    for pid in w.groups.newcomers(known, say) {
        match agent.add(pid) {
            Ok(()) => ledger.watch(pid),
            Err(e) => eprintln!("pagewise: pid {pid} not watched: {e}"),
        }
    }
}

/// Says what the watched processes gained against the machine's settings
/// before the agent: a line on stdout, or `line`, the command's JSON object
/// holding them.
pub fn say_gains(gains: &Gains, json: bool, line: &impl crate::json::Printed) -> Result<()> {
    if json {
        println!("{}", crate::json::line(line)?);
    } else {
        println!("{}", gains.text());
    }
    Ok(())
}

/// Says, on standard error, which system settings were put back as the
/// command ends (nothing where none was changed).
pub fn say_put_back() {
    let mut back = pagewise::agent::settings::take_put_back();
    // A setting lent for each call made inside a process (and given back
    // at once) is said once.
    let mut seen = Vec::new();
    back.retain(|b| {
        let first = !seen.contains(b);
        seen.push(b.clone());
        first
    });
    if !back.is_empty() {
        eprintln!("pagewise: settings put back: {}", back.join(", "));
    }
}

/// The page-walk cost, measured at start-up (`pagewise::agent::walk_cost`,
/// bounded), said on standard error: `None` when SIGINT or SIGTERM came
/// meanwhile, which is answered at once (the caller ends).
pub fn walk_cost(stop: &crate::stop::Stop) -> Option<f64> {
    use pagewise::agent::walk_cost::{measure, WalkCost, WALK_DEFAULT_NS, WALK_WITHIN};
    eprintln!(
        "pagewise: measuring what a page walk costs here (at most {} s; --walk-ns skips it)",
        WALK_WITHIN.as_secs()
    );
    let cost = measure(stop);
    match &cost {
        WalkCost::Measured {
            walk_ns,
            ns_per_access_4k,
            ns_per_access_2m,
        } => eprintln!(
            "pagewise: a page walk costs {walk_ns:.1} ns here (random loads: \
             {ns_per_access_4k:.1} ns over 4 KiB pages, {:.1} ns over 2 MiB pages, medians of \
             5 runs)",
            ns_per_access_2m.unwrap_or(f64::NAN)
        ),
        WalkCost::Default(why) => eprintln!(
            "pagewise: the page-walk cost could not be measured here ({why}); ranking with \
             {WALK_DEFAULT_NS} ns"
        ),
        _ => {}
    }
    cost.ns()
}

/// SIGINT or SIGTERM before the first step: the command started (if any)
/// is stopped as [`drive`] stops it; the exit status the convention says.
pub fn end_before_start(
    stop: &crate::stop::Stop,
    child: Option<std::process::Child>,
) -> Result<i32> {
    if let Some(mut c) = child {
        stop.end(&mut c);
    }
    eprintln!("pagewise: stopped before the first step");
    Ok(stop.status().unwrap_or(0))
}

/// What an agent watches, said at its start: the processes it holds now
/// (`held`: each as it is to be said) and the containers and cgroups whose
/// processes it follows as they come.
pub fn watching(w: &Watch, held: &[String]) -> String {
    watching_of(&w.groups.containers, &w.groups.cgroups, held)
}

fn watching_of(containers: &[String], cgroups: &[String], held: &[String]) -> String {
    let groups: Vec<String> = containers
        .iter()
        .map(|c| format!("container {c}"))
        .chain(cgroups.iter().map(|c| format!("cgroup {c}")))
        .collect();
    let mut said = match held.len() {
        0 => String::new(),
        1 => format!("1 process ({})", held[0]),
        n => format!("{n} processes ({})", held.join(", ")),
    };
    if !groups.is_empty() {
        if !said.is_empty() {
            said += " and ";
        }
        said += &format!("the processes of {} as they come", groups.join(", "));
    }
    if said.is_empty() {
        said = "no process".into();
    }
    said
}

#[cfg(test)]
mod tests {
    use super::watching_of;

    /// Regression: `thp run --container C` said "watching 0 process(es)"
    /// and `dedup run --container C` "watching ;".
    #[test]
    fn what_an_agent_watches_is_said_with_its_containers() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            watching_of(&s(&["web"]), &[], &[]),
            "the processes of container web as they come"
        );
        assert_eq!(watching_of(&[], &[], &s(&["42"])), "1 process (42)");
        assert_eq!(
            watching_of(&[], &s(&["/a.slice"]), &s(&["1", "2"])),
            "2 processes (1, 2) and the processes of cgroup /a.slice as they come"
        );
        assert_eq!(watching_of(&[], &[], &[]), "no process");
    }
}
