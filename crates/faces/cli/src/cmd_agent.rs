//! `pagewise agent --config FILE`: the node agent
//! (`pagewise::agent::node`), stepped by the one loop of the agents until
//! SIGTERM or SIGINT. This face reads its configuration, serves its
//! metrics from start-up, measures the page-walk cost where it is not
//! given, says what the agent notes, prints a step a line with `--json`,
//! and at the end says what it put back.

use crate::stop::Stop;
use anyhow::Result;
use pagewise::agent::node::{self, Config, Node, Selection};
use std::path::PathBuf;

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
  all_containers = true       # or: container = \"ID|NAME\", cgroup = \"PATH\",
                              #   namespace = \"NS\" (a Kubernetes namespace's pods)
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

impl crate::json::Printed for node::Step {}

pub fn run(a: Args) -> Result<i32> {
    let stop = Stop::take()?;
    let c = Config::read(&a.config)?;
    if a.check {
        // What the configuration selects; the API server is not asked.
        for ch in Selection::new(&c).chosen(|_| false) {
            println!("{}", node::describe(&ch));
        }
        return Ok(0);
    }
    // The endpoint answers from start-up on, before the agents are made
    // (the walk cost is measured, KSM claimed).
    let walk = |c: &Config| {
        c.walk_ns_known(None)
            .or_else(|| crate::agent_loop::walk_cost(&stop))
    };
    let made = node::run(&c, a.steps, &stop, walk, |n, step| {
        match step {
            None if !a.json => eprintln!(
                "pagewise: agent answering at http://{}/metrics and /healthz",
                c.listen
            ),
            Some(step) if a.json => println!("{}", crate::json::line(&step)?),
            _ => {}
        }
        say_notes(n, a.json);
        Ok::<_, anyhow::Error>(std::ops::ControlFlow::Continue(()))
    })?;
    // The agents were ended and their settings put back.
    match made {
        Some(steps) => eprintln!("pagewise: agent stopped after {steps} steps"),
        None => eprintln!("pagewise: agent stopped before its first step"),
    }
    crate::agent_loop::say_put_back();
    Ok(stop.status().unwrap_or(0))
}

/// Says on standard error what the agent noted (with `--json`, the
/// processes it watches are left unsaid: the step lines count them).
fn say_notes(n: &mut Node, json: bool) {
    for note in n.take_notes() {
        if !(json && note.starts_with("watching ")) {
            eprintln!("pagewise: {note}");
        }
    }
}
