//! `pagewise dedup`: the deduplication agent (SmartMD's split, keep and
//! rebuild of huge pages, driving KSM).

use anyhow::Result;
use pagewise::agent::gains::{Gains, Ledger};
use pagewise::agent::Agent as _;
use pagewise::dedup::{Action, Agent, Options, Policy, Step, Thresholds};
use pagewise::shim::Inside;
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Let KSM merge the cold, duplicate-rich memory of processes, keeping
    /// hot huge pages whole.
    ///
    /// Each interval the agent notes which 2 MiB regions each process
    /// wrote since the step before (from outside, one fault per region,
    /// served by a thread of the agent at any time: huge pages stay huge),
    /// keeps an access frequency per region (+1 written, -1 not), and
    /// estimates each region's share of duplicate pages with SmartMD's
    /// counting Bloom filter across all the processes given (a region not
    /// written since it was last read is known unchanged: one page in 16
    /// is read again per step). A cold region with many duplicates is made
    /// mergeable (the process calls madvise itself: through the preload
    /// shim for a command started here, else stopped for a moment under
    /// ptrace); KSM then splits its huge page and merges its pages. A hot region stays
    /// whole; a merged region that turns hot is unmerged and collapsed into
    /// a huge page again. The thresholds follow memory utilisation (the
    /// processes' memory cgroup against its limit, or the machine's). ksmd
    /// is started and paced, and KSM's smart scan turned off (it would skip
    /// for many passes a page scanned before its twin was made mergeable);
    /// every KSM setting is put back, and every
    /// region made mergeable is unmerged, when the agent ends (also on
    /// SIGINT/SIGTERM). Needs root (ksmd's settings; the write faults).
    Run(Box<RunArgs>),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Milliseconds between steps.
    #[arg(long, default_value_t = 2000)]
    interval_ms: u64,
    /// Shortest span, in milliseconds, over which a step counts writes (a
    /// step comes at least this long after the one before).
    #[arg(long, default_value_t = 500)]
    window_ms: u64,
    /// smartmd (cold and duplicate-rich regions), ksm-everywhere (every
    /// region), no-splitting (regions of base pages only) or ingens-like
    /// (base pages and cold huge pages, whatever their duplicates).
    #[arg(long, default_value = "smartmd")]
    policy: String,
    /// Fixed thresholds instead of ones that follow memory utilisation:
    /// COLD,HOT,REPETITION (cold: frequency at most COLD; hot: at least
    /// HOT; split when at least REPETITION of the pages are duplicates,
    /// 0 to 1), e.g. 0,2,0.5.
    #[arg(long, value_name = "COLD,HOT,REPETITION")]
    thresholds: Option<String>,
    /// Read every page of every region each step (no 25 % sampling).
    #[arg(long)]
    no_sample: bool,
    /// Count duplicates exactly too, to report the Bloom filter's error.
    #[arg(long)]
    exact: bool,
    /// Pace ksmd so that one pass over the mergeable pages takes this many
    /// milliseconds (0: leave ksmd as it is, and do not start it).
    #[arg(long, default_value_t = 10_000)]
    full_scan_ms: u64,
    /// Let a region found written step after step rest unwatched for 1,
    /// 2, 4, ... up to this many steps, its frequency kept (it stays hot,
    /// never merged meanwhile): the protection a hot region costs each
    /// step is most of what watching costs (0: every region every step).
    #[arg(long, default_value_t = 0)]
    hot_backoff: u8,
    /// Make memory mergeable only as whole mappings: a mapping once every
    /// region of it is to be merged. One 2 MiB region made mergeable
    /// splits its mapping, and an `mremap` spanning the pieces fails
    /// (`EFAULT`); the agent does this by itself for a process once it
    /// sees it move a mapping; this asks it from the start, for programs
    /// that resize their buffers rarely
    #[arg(long)]
    whole_mappings: bool,
    /// Leave the regions made mergeable merged at the end.
    #[arg(long)]
    keep_merged: bool,
    #[command(flatten)]
    watch: crate::agent_loop::Watch,
}

pub fn run(a: Args) -> Result<i32> {
    match a.sub {
        Sub::Run(r) => run_agent(*r),
    }
}

fn thresholds_of(s: &str) -> Result<Thresholds> {
    let p: Vec<&str> = s.split(',').collect();
    let bad = || {
        anyhow::Error::new(crate::exit::Usage(format!(
            "--thresholds {s}: COLD,HOT,REPETITION, e.g. 0,2,0.5"
        )))
    };
    if p.len() != 3 {
        return Err(bad());
    }
    let t = Thresholds::default()
        .cold_max(p[0].parse().map_err(|_| bad())?)
        .hot_min(p[1].parse().map_err(|_| bad())?)
        .repetition(p[2].parse().map_err(|_| bad())?);
    if t.cold_max >= t.hot_min || t.hot_min > pagewise::dedup::FREQ_MAX {
        crate::usage!(
            "--thresholds {s}: COLD must be below HOT, and HOT at most {}",
            pagewise::dedup::FREQ_MAX
        );
    }
    if !(0.0..=1.0).contains(&t.repetition) {
        crate::usage!("--thresholds {s}: REPETITION is a share, 0 to 1");
    }
    Ok(t)
}

fn run_agent(a: RunArgs) -> Result<i32> {
    let Some(policy) = Policy::parse(&a.policy) else {
        crate::usage!(
            "--policy {}: smartmd, ksm-everywhere, no-splitting or ingens-like",
            a.policy
        );
    };
    let thresholds = a.thresholds.as_deref().map(thresholds_of).transpose()?;
    let stop = crate::stop::Stop::take()?;
    let pids = crate::agent_loop::check(&a.watch, a.interval_ms, a.window_ms)?;
    let opts = Options::default()
        .window(Duration::from_millis(a.window_ms))
        .policy(policy)
        .sample(!a.no_sample)
        .exact(a.exact)
        .thresholds(thresholds)
        .full_scan((a.full_scan_ms > 0).then(|| Duration::from_millis(a.full_scan_ms)))
        .hot_backoff(a.hot_backoff)
        .whole_mappings(a.whole_mappings);
    // The machine's settings are read before the agent changes any.
    let mut ledger = Ledger::new(&pagewise::agent::gains::KSM_SETTINGS);
    // The agent first: a command is not started where it cannot run.
    let mut agent = Agent::new(&pids, opts)?;
    // A command is started under the shim, which makes the calls asked of
    // it without the program being stopped; where it cannot (a statically
    // linked program), under ptrace like any other.
    let started = match a.watch.command.is_empty() {
        true => None,
        false => Some(pagewise::shim::start_advised(&a.watch.command, |c| {
            crate::stop::program_output(c, a.watch.json)
        })?),
    };
    let child = match started {
        None => None,
        Some((mut c, shim)) => {
            let pid = c.id() as i32;
            let inside = match shim {
                Ok(s) => Inside::Shim(s),
                Err(why) => {
                    eprintln!(
                        "pagewise: {}: {why}; its advice is made under ptrace",
                        a.watch.command[0]
                    );
                    Inside::Ptrace
                }
            };
            if let Err(e) = agent.add_with(pid, inside) {
                pagewise::agent::child::stop(&mut c, Duration::from_secs(5));
                return Err(e.into());
            }
            Some(c)
        }
    };
    if a.watch.json {
        let watching: Vec<_> = agent
            .inside()
            .into_iter()
            .map(|(pid, inside)| Watched { pid, inside })
            .collect();
        let first = Line::Watching {
            watching,
            policy: policy.name(),
        };
        println!("{}", crate::json::line(&first)?);
    } else {
        let how: Vec<String> = agent
            .inside()
            .iter()
            .map(|(p, how)| format!("{p} ({how})"))
            .collect();
        println!(
            "watching {}; policy {}; every {} ms (SIGINT or SIGTERM ends)",
            crate::agent_loop::watching(&a.watch, &how),
            policy.name(),
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
    // Taken before the agent's regions are unmerged: what it gained while
    // it ran.
    let gains = ledger.gains();
    if !a.keep_merged {
        for act in agent.end() {
            if a.watch.json {
                println!("{}", crate::json::line(&Line::End { end: &act })?);
            } else {
                action(&mut std::io::stdout().lock(), &act)?;
            }
        }
    }
    let c = agent.counters();
    let wall_ms = (t0.elapsed().as_secs_f64() * 1e3).max(1.0);
    if !a.watch.json {
        println!(
            "{} steps: {} regions made mergeable ({} huge pages split), {} rebuilt, {} requests failed; CPU: the agent {:.1} ms ({:.2} % of one CPU), ksmd {:.1} ms ({:.2} %)",
            c.steps,
            c.merged,
            c.split,
            c.rebuilt,
            c.failed,
            c.cpu_ms,
            c.cpu_ms / wall_ms * 100.0,
            c.ksmd_cpu_ms,
            c.ksmd_cpu_ms / wall_ms * 100.0
        );
    }
    crate::agent_loop::say_gains(&gains, a.watch.json, &Line::Gained { gained: &gains })?;
    // KSM's settings are put back here.
    drop(agent);
    crate::agent_loop::say_put_back();
    Ok(status)
}

/// `dedup run --json`: one object a line.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Line<'a> {
    /// First: the processes watched and the policy.
    Watching {
        /// Each process, and how pagewise acts inside it.
        watching: Vec<Watched>,
        /// The policy's name.
        policy: &'a str,
    },
    /// One step of the agent.
    Step(&'a Step),
    /// At the end: the watched processes from when each was first watched
    /// (under the machine's settings before the agent) to the end of its
    /// steps, before its regions were unmerged.
    Gained {
        /// What they held, and the settings before.
        gained: &'a Gains,
    },
    /// At the end, once per region: what was put back.
    End {
        /// The action.
        end: &'a Action,
    },
}
impl crate::json::Printed for Line<'_> {}

/// A process the agent watches.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Watched {
    /// Its pid.
    pub pid: i32,
    /// How pagewise acts inside it (`shim`, `ptrace`, ...).
    pub inside: &'static str,
}

fn report(step: &Step, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", crate::json::line(&Line::Step(step))?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>7.1}s {} regions ({} huge, {} mergeable, {} written); kept {} hot, {} with few duplicates; thresholds cold<={} hot>={} repetition>={:.2} at {:.0} % memory use; KSM sharing {} pages",
        step.t_ms as f64 / 1e3,
        step.regions,
        step.huge,
        step.mergeable,
        step.written,
        step.kept_hot,
        step.kept_few_duplicates,
        step.thresholds.cold_max,
        step.thresholds.hot_min,
        step.thresholds.repetition,
        step.utilisation * 100.0,
        step.ksm.pages_sharing
    )?;
    for act in &step.actions {
        action(&mut out, act)?;
    }
    Ok(())
}

fn action(out: &mut impl Write, act: &Action) -> Result<()> {
    match act {
        Action::Merge {
            pid,
            start,
            huge,
            why,
            ..
        } => writeln!(
            out,
            "          {} pid {pid} {start:#x}: {why}",
            if *huge { "split+merge" } else { "merge" }
        )?,
        Action::Rebuilt {
            pid,
            start,
            freq,
            huge,
            why,
        } => writeln!(
            out,
            "          rebuild pid {pid} {start:#x} (frequency {freq}): {}",
            if *huge {
                "huge again".to_string()
            } else {
                why.clone().unwrap_or_default()
            }
        )?,
        Action::Failed { pid, what, why } => {
            writeln!(out, "          failed pid {pid}: {what}: {why}")?
        }
        Action::Gone { pid, why } => writeln!(out, "          gone pid {pid}: {why}")?,
        Action::NoCoverage { pid, why } => writeln!(
            out,
            "          no access frequency for pid {pid} (its huge pages are kept): {why}"
        )?,
        Action::Tuned { knob, to } => writeln!(out, "          {knob} = {to}")?,
        Action::WholeMappings { pid, why, unmerged } => writeln!(
            out,
            "          whole mappings only for pid {pid} from now on ({unmerged} regions unmerged): {why}"
        )?,
        Action::Unmerged { pid, regions } => writeln!(
            out,
            "          end: {regions} regions of pid {pid} unmerged"
        )?,
        other => writeln!(out, "          {other:?}")?,
    }
    Ok(())
}
