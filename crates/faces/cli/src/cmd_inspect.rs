//! `pagewise inspect`: residency, huge pages, bloat, duplicates and access
//! coverage of processes.

use anyhow::{bail, Context, Result};
use pagewise::access::{self, Method};
use pagewise::agent::child;
use pagewise::farmem::instance::Instance;
use pagewise::farmem::{FarmemOptions, FarmemRun};
use pagewise::inspect::{inspect, Options, RegionReport, Report};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  pagewise inspect --pid 4242                     what its memory holds
  pagewise inspect --pid 4242 --pid 4243 --json   duplicates across both, as JSON
  pagewise inspect --coverage-ms 2000 --heatmap m.svg -- ./server --port 7000
      start ./server under pagewise, wait --after-ms, watch which pages it
      touches for 2 s, inspect it, draw the regions, then stop it
  pagewise inspect --ready-file /run/srv.pid --after-ms 60000 -- ./srv
      inspect ./srv once it has written its pid file (at most 60 s)

Access coverage needs idle page tracking (root, CONFIG_IDLE_PAGE_TRACKING)
for --pid, or a program started under pagewise (-- CMD, or `pagewise farmem
run`), where the far-memory engine inside it samples every page.")]
pub struct Args {
    /// Process to inspect (repeat for several: duplicates are counted
    /// within and across them).
    #[arg(long = "pid")]
    pids: Vec<i32>,
    #[command(flatten)]
    groups: crate::groups::Groups,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// List every 2 MiB region holding memory (in the JSON too).
    #[arg(long)]
    regions: bool,
    /// Look up only every 4th base page of a region in the counting Bloom
    /// filter (SmartMD's 25 % sampling); the exact count is unaffected.
    #[arg(long)]
    bloom_sample: bool,
    /// Measure access coverage over a window of MS milliseconds (default
    /// 1000 with -- CMD; 0 turns it off).
    #[arg(long = "coverage-ms", alias = "coverage", value_name = "MS")]
    coverage: Option<u64>,
    /// With -- CMD: let it run MS milliseconds before inspecting.
    #[arg(
        long = "after-ms",
        alias = "after",
        value_name = "MS",
        default_value_t = 1000
    )]
    after: u64,
    /// With -- CMD: inspect as soon as the command has made FILE (its own
    /// sign that it is ready: a pid file, a file it writes once loaded),
    /// waiting at most --after-ms; an error if it has not by then.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// Draw every 2 MiB region (shade: access coverage, or repetition rate
    /// without coverage; outline: huge page) into FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    heatmap: Option<PathBuf>,
    /// How many hottest regions the summary lists.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Start this command under pagewise, inspect it after --after-ms, then
    /// stop it (SIGTERM).
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// A command started under the far-memory engine for sampling: stopped
/// and its instance removed when dropped.
struct Started {
    child: std::process::Child,
    run: Option<FarmemRun>,
}

impl Started {
    fn instance(&self) -> &Instance {
        self.run.as_ref().expect("present until dropped").instance()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        child::stop(&mut self.child, Duration::from_secs(5));
        if let Some(run) = self.run.take() {
            run.remove();
        }
    }
}

fn start(cmd: &[String], json: bool) -> Result<Started> {
    // Latency 0, no budget to speak of: the engine only watches.
    let run = FarmemRun::watch_only("inspect")?;
    // The handler thread: nothing to hold for the kernel, fewer calls
    // trapped, for an engine that only watches.
    let opts = FarmemOptions::default().fault_path(pagewise::farmem::FaultPath::Thread);
    let mut c = run.command(cmd, &opts)?;
    crate::stop::program_output(&mut c, json);
    let child = c.spawn();
    match child {
        Ok(child) => Ok(Started {
            child,
            run: Some(run),
        }),
        Err(e) => {
            run.remove();
            Err(e).with_context(|| format!("starting {}", cmd[0]))
        }
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1} %", 100.0 * part as f64 / whole as f64)
    }
}

/// `inspect --json`: the report, and the regions to act on first.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Output<'a> {
    /// The report (its regions only with `--regions`).
    #[serde(flatten)]
    pub report: &'a Report,
    /// The regions written most often, most first.
    pub hottest: Vec<RegionReport>,
    /// The regions to promote to huge pages first.
    pub promote_first: Vec<RegionReport>,
}
impl crate::json::Printed for Output<'_> {}

pub fn run(a: Args) -> Result<i32> {
    if a.pids.is_empty() && a.cmd.is_empty() && !a.groups.given() {
        crate::usage!(
            "give a process (--pid PID), a container (--container ID|NAME), a cgroup (--cgroup PATH) or a command to start (-- CMD)"
        );
    }
    let (pids, started) = targets(&a)?;
    let window = a
        .coverage
        .unwrap_or(if started.is_some() { 1000 } else { 0 });
    // Contents first, as the program has them: the sampler serves memory
    // page by page while its window is open, which splits huge pages.
    let opts = Options::default().bloom_sample(a.bloom_sample);
    let reading = crate::progress::bar(0, "reading anonymous pages", "pages");
    let mut rep: Report = inspect(&pids, opts, &mut |done, total| {
        reading.set_length(total);
        reading.set_position(done);
    })?;
    reading.finish_and_clear();
    add_coverage(&mut rep, &pids, started.as_ref(), window)?;
    drop(started);
    if let Some(path) = &a.heatmap {
        std::fs::write(path, heatmap(&rep).render())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let hottest: Vec<RegionReport> = rep.hottest(a.top).into_iter().cloned().collect();
    let promote: Vec<RegionReport> = rep.promote_first(a.top).into_iter().cloned().collect();
    if !a.regions {
        rep.regions.clear();
    }
    if a.json {
        let v = Output {
            report: &rep,
            hottest,
            promote_first: promote,
        };
        println!("{}", crate::json::line(&v)?);
        return Ok(0);
    }
    print_summary(&rep);
    print_lists(&a, &rep, &hottest, &promote);
    Ok(0)
}

/// The processes to inspect: those given (each once), and the command's
/// (every live member of its run) once it has run for `--after` ms.
fn targets(a: &Args) -> Result<(Vec<i32>, Option<Started>)> {
    let mut given = a.pids.clone();
    a.groups.add_to(&mut given)?;
    let mut pids: Vec<i32> = Vec::new();
    for &p in &given {
        pagewise::process::check_target(p)?;
        if !pids.contains(&p) {
            pids.push(p);
        }
    }
    let mut started = None;
    if !a.cmd.is_empty() {
        let s = start(&a.cmd, a.json)?;
        let when = match &a.ready_file {
            Some(f) => format!("once it makes {} (at most {} ms)", f.display(), a.after),
            None => format!("in {} ms", a.after),
        };
        let wait = crate::progress::spinner(format!(
            "started {} (pid {}); inspecting {when}",
            a.cmd[0],
            s.child.id()
        ));
        let made = wait_ready(a.ready_file.as_deref(), Duration::from_millis(a.after));
        wait.finish_and_clear();
        if let (Some(f), false) = (&a.ready_file, made) {
            bail!(
                "{} did not make {} within {} ms (--ready-file; --after-ms sets the wait)",
                a.cmd[0],
                f.display(),
                a.after
            );
        }
        let live: Vec<i32> = s
            .instance()
            .members()
            .iter()
            .filter(|m| m.live)
            .map(|m| m.pid)
            .collect();
        if live.is_empty() {
            bail!(
                "{} exited (or never started under pagewise) within {} ms: nothing to inspect",
                a.cmd[0],
                a.after
            );
        }
        for p in live {
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
        started = Some(s);
    }
    Ok((pids, started))
}

/// Waits `most`, or until `file` exists where one is named; whether it
/// does (true without one).
fn wait_ready(file: Option<&std::path::Path>, most: Duration) -> bool {
    let Some(file) = file else {
        std::thread::sleep(most);
        return true;
    };
    let until = std::time::Instant::now() + most;
    loop {
        if file.exists() {
            return true;
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(10)));
    }
}

/// Access coverage over `window` ms (0: none asked), by the far-memory
/// sampler where every process is under pagewise, else idle page
/// tracking; with it, the regions ranked by the benefit of promotion.
fn add_coverage(
    rep: &mut Report,
    pids: &[i32],
    started: Option<&Started>,
    window: u64,
) -> Result<()> {
    let mut coverage: Option<(Method, Vec<access::CoverageReport>)> = None;
    let mut no_coverage = String::from("not asked for (--coverage-ms MS)");
    if window > 0 {
        let w = Duration::from_millis(window);
        let timeout = Duration::from_secs(60);
        let mut sampled: Vec<Instance> = match started {
            Some(s) => vec![Instance::open(
                s.instance().name(),
                pagewise::farmem::instance::Access::Control,
            )?],
            None => pids
                .iter()
                .filter_map(|&p| pagewise::farmem::sampler::of(p))
                .collect(),
        };
        // One window per instance, however many of its members were given.
        let mut seen = std::collections::HashSet::new();
        sampled.retain(|i| seen.insert(i.name().to_string()));
        let all_sampled = pids.iter().all(|&p| {
            sampled
                .iter()
                .any(|i| i.members().iter().any(|m| m.live && m.pid == p))
        });
        if all_sampled {
            let watching = crate::progress::spinner(format!("watching accesses for {window} ms"));
            let mut all = Vec::new();
            for i in &sampled {
                all.extend(pagewise::farmem::sampler::sample(i, w, timeout)?);
            }
            watching.finish_and_clear();
            coverage = Some((Method::Sampler, all));
        } else if access::idle_page_unavailable().is_none() {
            let watching = crate::progress::spinner(format!(
                "watching accesses for {window} ms (idle page tracking)"
            ));
            coverage = Some((Method::IdlePage, access::idle_pages(pids, w)?));
            watching.finish_and_clear();
        } else {
            no_coverage = format!(
                "unavailable: this kernel has no idle page tracking ({}) and no DAMON, and not every process was started under pagewise (-- CMD, or `pagewise farmem run`)",
                access::idle_page_unavailable().unwrap_or_default()
            );
        }
    }
    match coverage {
        Some((m, c)) => {
            rep.add_coverage(m, &c);
            let calibrating = crate::progress::spinner("calibrating the cost of a page walk");
            let cost = pagewise::thp::calibrate_walk_cost(256 << 20, 1 << 20)?;
            calibrating.finish_and_clear();
            rep.rank_promotion(&cost);
            rep.walk_cost = Some(cost);
        }
        None => rep.no_coverage(no_coverage),
    }
    Ok(())
}

/// The totals of the report, one line each.
fn print_summary(rep: &Report) {
    let pids: Vec<String> = rep.pids.iter().map(|p| p.to_string()).collect();
    println!("process {}", pids.join(", "));
    println!(
        "  resident        {:>12}  (anonymous {}, file {}; swapped {})",
        mib(rep.rss_bytes),
        mib(rep.anon_bytes),
        mib(rep.file_bytes),
        mib(rep.swapped_bytes)
    );
    println!(
        "  huge pages      {:>12}  ({} of anonymous)",
        mib(rep.thp_bytes),
        share(rep.thp_bytes, rep.anon_bytes)
    );
    println!(
        "  bloat           {:>12}  (zero-filled base pages inside huge pages)",
        mib(rep.bloat_bytes)
    );
    println!(
        "  zero pages      {:>12}  ({} of anonymous)",
        mib(rep.zero_bytes),
        share(rep.zero_bytes, rep.anon_bytes)
    );
    println!("  duplicates      {:>12}  (freed by merging identical non-zero pages; {} across processes)", mib(rep.duplicate_bytes), mib(rep.cross_process_duplicate_bytes));
    match rep.ksm_merging_bytes {
        Some(k) => println!(
            "  KSM merges now  {:>12}  (would save up to {} with zero pages)",
            mib(k),
            mib(rep.duplicate_bytes + rep.zero_bytes)
        ),
        None => println!(
            "  KSM merges now  {:>12}  (this kernel has no /proc/PID/ksm_stat)",
            "-"
        ),
    }
    match (&rep.coverage.method, &rep.coverage.unavailable) {
        (Some(m), _) => println!(
            "  touched         {:>12}  (distinct, in {:.0} ms, of {} watched; {})",
            mib(rep.coverage.touched_bytes),
            rep.coverage.window_ms,
            mib(rep.coverage.watched_bytes),
            match m {
                Method::Sampler => "sampled by the far-memory engine inside the process",
                Method::IdlePage => "idle page tracking",
                Method::Writes => "pages written, tracked from outside",
                _ => "measured",
            }
        ),
        (None, Some(why)) => println!("  access coverage {:>12}  ({why})", "-"),
        (None, None) => {}
    }
    let b = &rep.bloom;
    println!(
        "  Bloom filter    {:>12}  (SmartMD's: {} pages labelled duplicate against {} exact, error {}; {} % looked up)",
        mib(b.memory_bytes),
        b.duplicate_pages,
        b.exact_duplicate_pages,
        b.relative_error
            .map(|e| format!("{:+.2} %", 100.0 * e))
            .unwrap_or_else(|| "-".into()),
        b.sample_percent
    );
    if let Some(c) = &rep.walk_cost {
        match c.walk_ns {
            Some(w) => println!(
                "  page walk       {:>9.1} ns  (random access {:.1} ns over 4 KiB pages, {:.1} ns over huge pages)",
                w,
                c.ns_per_access_4k,
                c.ns_per_access_2m.unwrap_or(0.0)
            ),
            None => println!(
                "  page walk       {:>12}  (no huge page could be made to compare)",
                "-"
            ),
        }
    }
}

/// The hottest regions, those to promote first, and with `--regions`
/// every region.
fn print_lists(a: &Args, rep: &Report, hottest: &[RegionReport], promote: &[RegionReport]) {
    if !hottest.is_empty() {
        println!();
        println!("hottest regions (distinct base pages touched per second):");
        for r in hottest {
            println!(
                "  {:>8} {:>#16x} {:>10.0}/s  {:>3} of 512 touched  {:>3} huge  {}",
                r.pid,
                r.start,
                r.access_rate.unwrap_or(0.0),
                r.touched_pages.unwrap_or(0),
                r.huge_pages,
                r.path
            );
        }
    }
    if !promote.is_empty() {
        println!();
        println!("promote first (page walks a huge page would save, at least):");
        for r in promote {
            println!(
                "  {:>8} {:>#16x} {:>10.2} ms/s  {}",
                r.pid,
                r.start,
                r.promotion_benefit_ns_per_s.unwrap_or(0.0) / 1e6,
                r.path
            );
        }
    }
    if a.regions {
        println!();
        println!(
            "{:>8} {:>18} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}  path",
            "pid", "region", "resident", "huge", "zero", "bloat", "rep%", "bloom%", "touched"
        );
        for r in &rep.regions {
            println!(
                "{:>8} {:>#18x} {:>9} {:>6} {:>6} {:>6} {:>6.1} {:>6.1} {:>7}  {}",
                r.pid,
                r.start,
                r.resident_pages,
                r.huge_pages,
                r.zero_pages,
                r.bloat_pages,
                100.0 * r.repetition_rate,
                100.0 * r.bloom_repetition_rate,
                r.touched_pages
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.path
            );
        }
    }
}

/// One row per process and 64 regions of 2 MiB (128 MiB), in address
/// order; gaps between mappings are not drawn.
fn heatmap(rep: &Report) -> crate::heatmap::Heatmap {
    use crate::heatmap::{Cell, Heatmap};
    let covered = rep.coverage.method.is_some();
    let mut rows: Vec<(String, Vec<Cell>)> = Vec::new();
    for &pid in &rep.pids {
        let mut regs: Vec<&RegionReport> = rep.regions.iter().filter(|r| r.pid == pid).collect();
        regs.sort_by_key(|r| r.start);
        for chunk in regs.chunks(64) {
            let cells = chunk
                .iter()
                .map(|r| Cell {
                    value: if covered {
                        r.touched_pages.map(|t| t as f64 / 512.0)
                    } else if r.anon {
                        Some(r.repetition_rate)
                    } else {
                        None
                    },
                    outlined: r.huge_pages > 0 && r.huge_pages == r.resident_pages,
                    tooltip: format!(
                        "{:#x} {}: {} resident, {} huge, {} zero, {} duplicate, {} touched",
                        r.start,
                        r.path,
                        r.resident_pages,
                        r.huge_pages,
                        r.zero_pages,
                        r.duplicate_pages,
                        r.touched_pages
                            .map(|t| t.to_string())
                            .unwrap_or_else(|| "-".into())
                    ),
                })
                .collect();
            rows.push((format!("{pid} {:#x}", chunk[0].start), cells));
        }
    }
    let pids: Vec<String> = rep.pids.iter().map(|p| p.to_string()).collect();
    Heatmap {
        title: format!("pagewise inspect: process {}", pids.join(", ")),
        legend: if covered {
            format!(
                "shade: base pages touched of 512 in {:.0} ms; black outline: huge page; grey: not watched",
                rep.coverage.window_ms
            )
        } else {
            "shade: repetition rate (duplicate pages); black outline: huge page; grey: file-backed"
                .into()
        },
        rows,
    }
}
