//! `pagewise`: the command-line face of the pagewise library.

mod agent_loop;
mod cmd_afl;
mod cmd_agent;
mod cmd_bench;
mod cmd_criu;
mod cmd_dedup;
mod cmd_demo;
mod cmd_farmem;
mod cmd_farmem_serve;
mod cmd_generate;
mod cmd_inspect;
mod cmd_page_server;
mod cmd_probe;
mod cmd_receive;
mod cmd_report;
mod cmd_rollback;
mod cmd_snapshot;
mod cmd_thp;
mod cmd_track;
mod cmd_workload;
mod exit;
mod groups;
mod heatmap;
mod json;
mod progress;
mod serve_session;
mod stop;

use clap::{Parser, Subcommand};

#[derive(Parser)]
/// Page-level memory management from user space, on a stock Linux kernel:
/// which pages a process writes (LDT), snapshots of it (SimGrid), how it
/// runs on far memory (DiME), and what its memory holds (HawkEye, SmartMD).
#[command(name = "pagewise", version, long_about = None, after_help = exit::HELP)]
struct Cli {
    /// No progress bars or spinners (they appear only on a terminal anyway).
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Never suspend a target's seccomp filters: make a call inside a
    /// filtered process only where its filters allow it (read and
    /// evaluated), and fall back or refuse, naming the call, where they do
    /// not. By default the filters are suspended for pagewise's own calls
    /// alone (PTRACE_O_SUSPEND_SECCOMP, with CAP_SYS_ADMIN) and left as they
    /// were. Also PAGEWISE_SECCOMP=respect.
    #[arg(long, global = true)]
    respect_seccomp: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Say which kernel features pagewise can use here, and why not where it cannot.
    Probe(cmd_probe::Args),
    /// Report which pages a process writes, every interval.
    ///
    /// Watch a running process with --pid, or start one after `--`. A command
    /// started by pagewise is tracked from inside through the preload shim with
    /// `uffd-wp` when the kernel has it. A running process is tracked with
    /// `uffd-wp` too: pagewise stops it for a moment and has it open the
    /// userfaultfd (ptrace), with its seccomp filters, if any, suspended for
    /// that one call; where that cannot be (filters pagewise may not suspend
    /// or that refuse the call, ptrace not allowed, the process stopped),
    /// `auto` says why and uses `hash`.
    Track(cmd_track::Args),
    /// Snapshot another process into a deduplicated, durable store; inspect and diff stores.
    ///
    /// `pagewise snapshot --pid PID --out DIR [--every-ms MS --count N]` stops the
    /// process briefly for each snapshot. Each distinct page is stored once,
    /// compressed, across all snapshots of the store.
    Snapshot(cmd_snapshot::Args),
    /// Receive migrated memory: the other end of `snapshot --live --to HOST:PORT`.
    ///
    /// `pagewise receive --listen ADDR --out DIR` keeps the copy each sender
    /// streams, checks every page's digest, and saves each complete copy as
    /// one snapshot of the store DIR. A connection that breaks leaves the
    /// store at its last complete snapshot.
    Receive(cmd_receive::Args),
    /// A page server CRIU dumps into, keeping its pages in a store.
    ///
    /// `pagewise page-server --store DIR` listens on loopback (port 27027
    /// by default, CRIU's own); `criu dump --page-server --address
    /// 127.0.0.1 --port 27027` then sends it every page of the dump, and
    /// each distinct page is stored once across dumps, processes and
    /// containers. Each pagemap of a dump becomes a snapshot of DIR; the
    /// dump's own pagemap is kept in DIR/criu/dump-N.json.
    PageServer(cmd_page_server::Args),
    /// CRIU's own images out of the dumps `page-server` keeps.
    ///
    /// `pagewise criu export STORE DUMP DIR` writes a dump's pagemap and
    /// pages images, byte for byte what CRIU's own page server writes, for
    /// `criu restore` to read beside the dump's other images.
    Criu(cmd_criu::Args),
    /// Emulate far memory (DiME) for unmodified programs: run, list, set live.
    ///
    /// `pagewise farmem run --local-pages N --latency-ns L --bandwidth-bps B
    /// -- CMD` runs CMD with at most N of its pages local; `farmem ls` lists
    /// running instances; `farmem set ID key=value` changes one at once.
    Farmem(cmd_farmem::Args),
    /// What a process's memory holds: residency, huge pages, zero-filled
    /// bloat, duplicate pages and access coverage, per 2 MiB region.
    ///
    /// `pagewise inspect --pid PID [--pid PID ...]` or `pagewise inspect --
    /// CMD` reads every resident anonymous page once; `--coverage-ms MS`
    /// measures which pages are touched, `--heatmap FILE.svg` draws it.
    Inspect(cmd_inspect::Args),
    /// The huge-page agent (HawkEye): promote 2 MiB regions by access coverage.
    ///
    /// `pagewise thp run --pid PID [--budget-total N] [--json]` measures which
    /// regions the process writes most and collapses them into huge pages
    /// first, fairly across the processes given, within a budget.
    Thp(cmd_thp::Args),
    /// The deduplication agent (SmartMD): KSM where it costs no huge page in use.
    ///
    /// `pagewise dedup run --pid PID [--pid PID ...] [--json]` measures each
    /// 2 MiB region's write frequency and duplicate pages, makes cold
    /// duplicate-rich regions mergeable for KSM, keeps hot ones huge, and
    /// rebuilds split regions that turn hot.
    Dedup(cmd_dedup::Args),
    /// The node agent: huge pages and dedup for the containers a
    /// configuration selects, as one long-running service.
    ///
    /// `pagewise agent --config FILE` follows the selected containers'
    /// processes as they come, applies both agents with a budget of huge
    /// pages per container, serves /metrics and /healthz from start-up, and
    /// puts back what it changed on SIGTERM.
    Agent(cmd_agent::Args),
    /// Turn what the tools recorded into one HTML page of plots (no network
    /// needed), or a Chrome/Perfetto trace of far-memory runs.
    ///
    /// `pagewise report FILE... --out report.html` reads a track --json
    /// stream, farmem run --trace files, a thp run or dedup run --json log
    /// and an inspect --json report; `--chrome-trace FILE` writes the
    /// far-memory traces for ui.perfetto.dev or chrome://tracing.
    Report(cmd_report::Args),
    /// Run the benchmarks of a capability and print ratios against the baselines.
    ///
    /// The benchmarks are a program of their own, `pagewise-bench`, which
    /// this runs with the arguments given (`pagewise bench --help` lists
    /// the experiments).
    #[command(disable_help_flag = true)]
    Bench {
        /// The experiment and its options (see `pagewise-bench --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// One-step tour: track a built-in workload with every available backend.
    Demo(cmd_demo::DemoArgs),
    /// Built-in self-checking workloads: a program of known behaviour to
    /// try the other commands on (the README's examples use it).
    Workload(cmd_workload::Args),
    /// Write the man pages or the shell completions (for packaging).
    #[command(hide = true)]
    Generate(cmd_generate::Args),
}

fn main() {
    // Output piped into `head` ends quietly when the reader goes away.
    let _ = pagewise::agent::stop::default_sigpipe();
    let cli = Cli::parse();
    progress::set_quiet(cli.quiet);
    if cli.respect_seccomp || std::env::var("PAGEWISE_SECCOMP").is_ok_and(|v| v == "respect") {
        pagewise::process::set_seccomp_policy(pagewise::process::SeccompPolicy::Respect);
    }
    // Settings a killed pagewise left changed are put back first (and said).
    pagewise::agent::settings::recover();
    let r = match cli.cmd {
        Cmd::Probe(a) => cmd_probe::run(a),
        Cmd::Track(a) => cmd_track::run(a),
        Cmd::Snapshot(a) => cmd_snapshot::run(a),
        Cmd::Receive(a) => cmd_receive::run(a),
        Cmd::PageServer(a) => cmd_page_server::run(a),
        Cmd::Criu(a) => cmd_criu::run(a),
        Cmd::Farmem(a) => cmd_farmem::run(a),
        Cmd::Inspect(a) => cmd_inspect::run(a),
        Cmd::Thp(a) => cmd_thp::run(a),
        Cmd::Dedup(a) => cmd_dedup::run(a),
        Cmd::Agent(a) => cmd_agent::run(a),
        Cmd::Bench { args } => cmd_bench::run(args, cli.quiet),
        Cmd::Demo(a) => cmd_demo::demo(a),
        Cmd::Report(a) => cmd_report::run(a),
        Cmd::Workload(a) => cmd_workload::run(a),
        Cmd::Generate(a) => cmd_generate::run::<Cli>(a),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pagewise: {}", message(&e));
            std::process::exit(exit::code_of(&e));
        }
    }
}

/// The error and its causes in one line, each said once: a library error
/// already ends with the system's answer that is also its cause.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
