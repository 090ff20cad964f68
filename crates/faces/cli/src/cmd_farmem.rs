//! `pagewise farmem`: far-memory emulation (DiME) of unmodified programs.

use anyhow::{Context, Result};
use pagewise::farmem::instance::{Access, Instance, Settings};
use pagewise::farmem::{self, FaultPath};
use pagewise::farmem::{FarmemOptions, FarmemRun};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Run a command with part of its memory "remote": every access to a
    /// remote page pays the link's delay, and a policy decides what stays local.
    ///
    /// The command's heap and anonymous mappings (thread stacks with
    /// --stacks) are emulated through the preload shim; its output and
    /// behaviour are unchanged. Processes it starts join the same instance.
    /// Example: `pagewise farmem run --local-pages 1000 --latency-ns 5000
    /// --bandwidth-bps 1250000000 --stats-json s.json -- ./prog`.
    Run(RunArgs),
    /// List the instances running on this machine with their settings,
    /// counters and member processes (also `farmem list`).
    #[command(visible_alias = "list")]
    Ls(LsArgs),
    /// Change a running instance at once (its owner or root):
    /// `pagewise farmem set ID latency_ns=2000 bandwidth_bps=0
    /// local_npages=5000`, or `local_percent=P`; `latency=2us` and
    /// `bandwidth=10GB/s` say their unit (a bare number there is refused)
    Set(SetArgs),
    /// Serve an instance to programs in containers: their preload shim
    /// joins it through the instance's directory, mounted, and the
    /// userfaultfds their runtime's seccomp profile refuses them are made
    /// inside them from here (their filters left as they were); members
    /// are listed by host pid. Prints the `podman run` arguments to use;
    /// runs until SIGTERM or SIGINT. Example: `pagewise farmem serve
    /// --instance web --local-pages 1000 --latency-ns 5000`.
    Serve(super::cmd_farmem_serve::ServeArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Instance to run in: joined when it exists (its settings apply; change
    /// them with `farmem set`), created otherwise. Default: a new instance
    /// of this run alone, removed at the end.
    #[arg(long)]
    instance: Option<String>,
    #[command(flatten)]
    settings: SettingsArgs,
    #[command(flatten)]
    program: ProgramArgs,
    /// Write the statistics of this run's processes as JSON to this file.
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// Say the run's summary as one JSON object on stdout, the same object
    /// --stats-json writes; the program's stdout then goes to stderr.
    #[arg(long)]
    json: bool,
    /// Write a trace of (time, address, kind) events, kind one of fetch,
    /// evict, writeback and soft, one JSON object per line, to FILE.PID for
    /// each process.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

/// An instance's settings, as `farmem run` and `farmem serve` take them.
#[derive(clap::Args)]
pub struct SettingsArgs {
    /// Pages that may be local at once (across the instance's processes).
    #[arg(long, conflicts_with = "local_percent")]
    pub local_pages: Option<u64>,
    /// Local budget as a percentage of the pages holding data (1-100), and
    /// at least 256 pages (a program starting up holds little data).
    #[arg(long)]
    pub local_percent: Option<u64>,
    /// One-way latency of the link, ns; a fetch costs twice this plus the
    /// page's transmission time.
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Bandwidth of the link, bytes/s (0: unlimited).
    #[arg(long, default_value_t = 0)]
    pub bandwidth_bps: u64,
}

/// How a member runs, as `farmem run` and `farmem serve` take it.
#[derive(clap::Args)]
pub struct ProgramArgs {
    /// Replacement policy: fifo (DiME's), random, clock, lru, or the path of
    /// a plugin (see include/pagewise.h, pw_policy_ops).
    #[arg(long, default_value = "fifo")]
    policy: String,
    /// Argument string passed to a plugin policy.
    #[arg(long, default_value = "")]
    policy_args: String,
    /// Load a plugin policy into pagewise itself first, to check that it
    /// loads and initialises with --policy-args before the program starts.
    /// pagewise then runs the plugin's code with its own privileges (often
    /// root): give it only for a plugin you trust as you trust pagewise.
    /// Without it the plugin is checked as a file (an ELF object, owned by
    /// root or by you, writable by no one else) and first loaded by the
    /// program, with the program's privileges.
    #[arg(long)]
    load_plugin_here: bool,
    /// Emulate thread stacks too (faults then take the handler thread).
    #[arg(long)]
    stacks: bool,
    /// Which thread serves a fault. `inline` (the default): the faulting
    /// thread itself, in a SIGBUS handler — no sleep and no wake-up, so a
    /// lower and steadier cost per fault (the one that meets DiME's
    /// accuracy goals); memory the program hands to the kernel is fetched
    /// and held before each system call; an instruction that needs more
    /// pages than the budget gets them lent, so budgets go down to one
    /// page; io_uring and Linux AIO set-up are refused with ENOSYS, so
    /// that the program falls back to plain calls. `thread`: the engine's
    /// handler thread serves faults while the faulting thread sleeps; use
    /// it for a program that needs io_uring or Linux AIO, or that hands the
    /// kernel memory through a call pagewise does not know (a driver's
    /// ioctl with pointers inside its structure); --stacks implies it. Falls back to `thread` where the
    /// kernel lacks UFFD_FEATURE_SIGBUS; the summary says which path
    /// served faults.
    #[arg(long, env = "PAGEWISE_FARMEM_FAULT_PATH", default_value = "inline")]
    fault_path: FaultPath,
}

impl SettingsArgs {
    /// The settings asked for; `None` to join `instance` as it is. Refused
    /// when neither a budget is given nor the instance exists.
    pub fn want(&self, instance: Option<&str>) -> Result<Option<Settings>> {
        let want = match (self.local_pages, self.local_percent) {
            (Some(0), _) => crate::usage!("--local-pages must be at least 1"),
            (Some(n), _) => Some((n, 0)),
            (None, Some(p)) if (1..=100).contains(&p) => Some((0, p)),
            (None, Some(p)) => crate::usage!("--local-percent {p}: use 1..=100"),
            (None, None) => None,
        };
        let exists = instance.is_some_and(pagewise::farmem::instance::exists);
        if want.is_none() && !exists {
            crate::usage!("give the local budget: --local-pages N or --local-percent P");
        }
        Ok(want.map(|(local_pages, local_percent)| {
            Settings::default()
                .latency_ns(self.latency_ns)
                .bandwidth_bps(self.bandwidth_bps)
                .local_pages(local_pages)
                .local_percent(local_percent)
        }))
    }
}

impl ProgramArgs {
    /// The options, the policy checked first.
    pub fn options(&self) -> Result<FarmemOptions> {
        check_policy(&self.policy, &self.policy_args, self.load_plugin_here)?;
        Ok(FarmemOptions::default()
            .policy(self.policy.clone())
            .policy_args(self.policy_args.clone())
            .stacks(self.stacks)
            .fault_path(self.fault_path))
    }
}

#[derive(clap::Args)]
struct LsArgs {
    /// Print one JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct SetArgs {
    /// The instance.
    id: String,
    /// key=value pairs: latency_ns, bandwidth_bps, local_npages, local_percent.
    #[arg(required = true)]
    pairs: Vec<String>,
}

pub fn run(a: Args) -> Result<i32> {
    match a.cmd {
        Sub::Run(r) => run_cmd(r),
        Sub::Ls(l) => ls(l),
        Sub::Set(s) => set(s),
        Sub::Serve(s) => super::cmd_farmem_serve::serve(s),
    }
}

fn run_cmd(a: RunArgs) -> Result<i32> {
    let opts = a.program.options()?;
    // Output paths are checked before the program runs, not after.
    for (flag, path) in [("--trace", &a.trace), ("--stats-json", &a.stats_json)] {
        if let Some(p) = path {
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            if !parent.is_dir() {
                crate::usage!(
                    "{flag} {}: {} is not a directory",
                    p.display(),
                    parent.display()
                );
            }
        }
    }
    let want = a.settings.want(a.instance.as_deref())?;
    let run = FarmemRun::join_or_create(a.instance.as_deref(), "run", want)?;
    let opts = opts.trace(a.trace.clone());
    let stop = crate::stop::Stop::take()?;
    let mut cmd = run.command(&a.cmd, &opts)?;
    crate::stop::program_output(&mut cmd, a.json);
    let status = match cmd.spawn() {
        Ok(mut c) => stop.wait(&mut c)?,
        Err(e) => {
            // Nothing ran: no summary, and no instance left behind.
            run.finish();
            return Err(anyhow::Error::new(e).context(format!("running {}", a.cmd[0])));
        }
    };
    // A member killed before it could leave leaves now.
    run.reap_dead_members();
    let rep = run.report();
    if rep.members.is_empty() && rep.stats.page_fault_count == 0 && !a.json {
        eprintln!(
            "pagewise farmem: no process of {} joined the instance, so nothing was emulated: \
             a statically linked or setuid program ignores the preload shim",
            a.cmd[0]
        );
    }
    if let Some(p) = &a.stats_json {
        std::fs::write(p, crate::json::pretty(&RunOutput(&rep))? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        println!("{}", crate::json::line(&RunOutput(&rep))?);
        run.finish();
        return Ok(stop.exit_code(status));
    }
    say_summary(&rep, a.settings.latency_ns);
    run.finish();
    Ok(stop.exit_code(status))
}

/// The one-line summary of an instance's run on stderr, with what it
/// means where a figure needs saying.
pub fn say_summary(rep: &pagewise::farmem::Report, latency_ns: u64) {
    eprintln!(
        "pagewise farmem: instance {}: {} faults ({}), {} fetches, {} evictions ({} written back), {:.1} ms injected, floor {} ns",
        rep.instance_id,
        rep.stats.page_fault_count,
        if rep.stats.page_fault_count == 0 {
            "none to serve"
        } else if rep.stats.inline_faults > 0 {
            "served in the faulting threads"
        } else {
            "served by the handler threads"
        },
        rep.stats.remote_fetches,
        rep.stats.evictions,
        rep.stats.writebacks,
        rep.stats.injected_delay_ns as f64 / 1e6,
        rep.stats.floor_ns
    );
    if latency_ns > 0 && rep.stats.floor_ns > 0 && latency_ns <= rep.stats.floor_ns {
        eprintln!(
            "pagewise farmem: --latency-ns {} is at or below this machine's floor ({} ns: what serving a fault costs here already), so no delay is added ({:.1} ms injected); a fetch takes the floor",
            latency_ns, rep.stats.floor_ns, rep.stats.injected_delay_ns as f64 / 1e6
        );
    }
    if rep.stats.overshoot_pages > 0 {
        eprintln!(
            "pagewise farmem: the budget was exceeded by up to {} pages ({})",
            rep.stats.overshoot_pages,
            if rep.stats.inline_faults == 0 {
                "on the handler-thread path each process keeps at least 4 pages, and pages the kernel holds during a call stay local".to_string()
            } else {
                format!(
                    "{} faults of instructions that needed more pages at once than the budget were served with those pages lent; pages held for the kernel during a call stay local too",
                    rep.stats.lent_faults
                )
            }
        );
    }
}

/// `farmem run --json` (and `--stats-json`): the instance's report at the
/// end.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct RunOutput<'a>(pub &'a pagewise::farmem::Report);
impl crate::json::Printed for RunOutput<'_> {}

/// `farmem ls --json`: an object, so that it carries the schema as every
/// other output.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Instances {
    /// Each live instance, as `farmem run --json` reports one.
    pub instances: Vec<pagewise::farmem::Report>,
}
impl crate::json::Printed for Instances {}

fn ls(a: LsArgs) -> Result<i32> {
    Instance::sweep();
    let all: Vec<pagewise::farmem::Report> = Instance::list()?
        .iter()
        .filter(|i| !i.is_stale())
        .map(|i| i.report(None))
        .collect();
    if a.json {
        println!("{}", crate::json::line(&Instances { instances: all })?);
        return Ok(0);
    }
    if all.is_empty() {
        println!("no far-memory instances (start one with `pagewise farmem run`)");
        return Ok(0);
    }
    println!(
        "{:<16} {:>10} {:>14} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12}  pids",
        "instance_id",
        "latency_ns",
        "bandwidth_bps",
        "local_npages",
        "local_now",
        "faults",
        "fetches",
        "evictions",
        "injected_ms"
    );
    for r in &all {
        let budget = if r.local_npages > 0 {
            r.local_npages.to_string()
        } else {
            format!("{}%", r.local_percent)
        };
        println!(
            "{:<16} {:>10} {:>14} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12.1}  {}",
            r.instance_id,
            r.latency_ns,
            r.bandwidth_bps,
            budget,
            r.stats.local_pages_now,
            r.stats.page_fault_count,
            r.stats.remote_fetches,
            r.stats.evictions,
            r.stats.injected_delay_ns as f64 / 1e6,
            r.pids
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    Ok(0)
}

fn set(a: SetArgs) -> Result<i32> {
    let mut pairs = Vec::new();
    for p in &a.pairs {
        pairs.push(setting(p)?);
    }
    let inst = Instance::open(&a.id, Access::Control)?;
    let s = inst.set(&pairs)?;
    println!(
        "{}: latency_ns={} bandwidth_bps={} local_npages={} local_percent={}",
        a.id, s.latency_ns, s.bandwidth_bps, s.local_pages, s.local_percent
    );
    Ok(0)
}

/// One `key=value` of `farmem set`. The keys with their unit in the name
/// (`latency_ns`, `bandwidth_bps`, `local_npages`, `local_percent`) take a
/// whole number; the short `latency` and `bandwidth` must say their unit
/// (`latency=5us`, `bandwidth=10GB/s`): a bare number is refused, not
/// taken as nanoseconds or bytes per second.
fn setting(p: &str) -> Result<(String, u64)> {
    let (k, v) = p
        .split_once('=')
        .with_context(|| format!("{p:?}: use key=value"))?;
    let whole = |v: &str| -> Result<u64> {
        v.parse()
            .with_context(|| format!("{p:?}: the value must be a whole number"))
    };
    let with_unit = |v: &str, units: &[(&str, u64)], hint: &str| -> Result<u64> {
        for &(u, mult) in units {
            if let Some(n) = v.strip_suffix(u) {
                if let Ok(n) = n.parse::<u64>() {
                    return n
                        .checked_mul(mult)
                        .with_context(|| format!("{p:?}: too large"));
                }
            }
        }
        crate::usage!("{p:?}: say the unit ({hint})")
    };
    Ok(match k {
        "latency" => (
            "latency_ns".into(),
            with_unit(
                v,
                &[
                    ("ns", 1),
                    ("us", 1_000),
                    ("µs", 1_000),
                    ("ms", 1_000_000),
                    ("s", 1_000_000_000),
                ],
                "latency=5us, or latency_ns=5000",
            )?,
        ),
        "bandwidth" => (
            "bandwidth_bps".into(),
            with_unit(
                v,
                &[
                    ("GB/s", 1_000_000_000),
                    ("MB/s", 1_000_000),
                    ("kB/s", 1_000),
                    ("B/s", 1),
                ],
                "bandwidth=10GB/s, or bandwidth_bps=10000000000",
            )?,
        ),
        _ => (k.to_string(), whole(v)?),
    })
}

/// Refuses a policy the program could not run with, before it starts: a
/// built-in name exactly, or a plugin: a file that may be one (see
/// [`check_plugin_file`]), or, with `--load-plugin-here`, one that loads
/// and initialises here.
fn check_policy(name: &str, args: &str, load_here: bool) -> Result<()> {
    if name.contains('/') {
        check_plugin_file(name)?;
        if load_here {
            // SAFETY: the user asked for the plugin to be run in pagewise
            // itself (--load-plugin-here), trusting it as pagewise; it
            // follows the C ABI of include/pagewise.h.
            unsafe { farmem::policy::Plugin::load(name, args) }?;
        }
        return Ok(());
    }
    if !farmem::policy::NAMES.contains(&name) {
        crate::usage!(
            "unknown policy {name:?}: use one of {} or the path of a plugin (a name with a '/')",
            farmem::policy::NAMES.join(", ")
        );
    }
    Ok(())
}

/// Checks, without loading it, that `path` may be a policy plugin: a
/// regular file starting as an ELF object, owned by root or by the user
/// pagewise runs as, and writable by neither its group nor others (a
/// plugin another user could change is refused).
fn check_plugin_file(path: &str) -> Result<()> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).with_context(|| format!("policy plugin {path}"))?;
    if !m.is_file() {
        crate::usage!("policy plugin {path} is not a regular file");
    }
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic));
    if read.is_err() || magic != *b"\x7fELF" {
        crate::usage!("policy plugin {path} is not an ELF shared object");
    }
    // The effective user: /proc/self belongs to it.
    let me = std::fs::metadata("/proc/self").map(|p| p.uid()).ok();
    if m.uid() != 0 && Some(m.uid()) != me {
        crate::usage!(
            "policy plugin {path} belongs to user {}, neither root nor you: refused",
            m.uid()
        );
    }
    if m.mode() & 0o022 != 0 {
        crate::usage!(
            "policy plugin {path} is writable by its group or others (mode {:o}): refused",
            m.mode() & 0o7777
        );
    }
    Ok(())
}
