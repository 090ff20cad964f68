//! `pagewise bench sparse`: the snapshot commands on sparse processes, at
//! the cost of their data. CRIU's `maps03` shape (10 GiB mapped, 2 pages
//! written) and a 64 GiB `PROT_NONE` reservation with 1 GiB made writable
//! (2 pages written), against the floor: the same program holding only
//! its 2 pages, measured in the same run. Each command is the tool itself
//! as a user runs it: its wall time and its own peak memory (GNU time),
//! against item 3's bounds of issue 61 (50 ms, 64 MiB). Every snapshot is
//! checked against the target (its 2 pages and nothing else in the
//! mapping), and every restore puts back a page written since.

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

const TARGET_C: &str = include_str!("../c/sparse_target.c");
const SHAPES: [&str; 3] = ["maps03", "reservation", "floor"];
const COMMANDS: [&str; 6] = [
    "snapshot",
    "snapshot --every-ms",
    "snapshot --live",
    "snapshot restore",
    "snapshot inspect",
    "inspect",
];
/// The bounds: each command at most this long, ms, and this much of
/// pagewise's own memory, MiB.
const BOUND_MS: f64 = 50.0;
const BOUND_MIB: f64 = 64.0;

#[derive(clap::Args)]
/// The experiment's arguments.
pub struct Args {
    /// Runs of every command on every shape, interleaved.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Ten runs.
    #[arg(long)]
    full: bool,
    #[command(flatten)]
    output: crate::report::Output,
}

#[derive(Serialize)]
struct Row {
    shape: &'static str,
    command: &'static str,
    /// Wall time of the command (for `--every-ms`: one snapshot's, as it
    /// reports it), ms.
    ms: crate::Spread,
    /// pagewise's own peak resident memory, MiB.
    peak_mib: crate::Spread,
    /// The medians over the floor's.
    ms_over_floor: f64,
    mib_over_floor: f64,
    /// Within both bounds at the median.
    met: bool,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    runs: usize,
    bound_ms: f64,
    bound_mib: f64,
    rows: Vec<Row>,
    /// Every snapshot held the target's 2 pages and zeros elsewhere in
    /// the mapping; every restore put back the page written since.
    verified: bool,
}

/// A target of one shape: its writable part and the two pages written.
struct Target {
    child: Child,
    addr: u64,
    len: u64,
    pages: [u64; 2],
}

impl Target {
    fn start(bin: &Path, shape: &str) -> Result<Target> {
        let mut child = Command::new(bin)
            .arg(shape)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the sparse target")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("its stdout")?).read_line(&mut line)?;
        let f: Vec<&str> = line.split_whitespace().collect();
        ensure!(f.len() == 4, "the target said {line:?}");
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16);
        Ok(Target {
            child,
            addr: hex(f[0])?,
            len: hex(f[1])?,
            pages: [f[2].parse()?, f[3].parse()?],
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the tool with `args` under GNU time: its wall time, ms, its peak
/// memory, MiB, and its standard output. (A parent's `wait4` cannot say:
/// a child's peak counts the memory its parent had before the exec.)
fn tool(args: &[&str]) -> Result<(f64, f64, String)> {
    let me = crate::pagewise_tool()?;
    let base = std::env::temp_dir().join(format!("pw-bench-sparse-{}", std::process::id()));
    let (out, peak) = (base.with_extension("out"), base.with_extension("peak"));
    let t0 = Instant::now();
    let status = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&peak)
        .arg(me)
        .args(args)
        .arg("--quiet")
        .stdout(std::fs::File::create(&out)?)
        .status()
        .context("running /usr/bin/time (GNU time; scripts/setup.sh installs it)")?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let text = std::fs::read_to_string(&out)?;
    let kib: f64 = std::fs::read_to_string(&peak)?
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .context("GNU time's report")?;
    let _ = (std::fs::remove_file(&out), std::fs::remove_file(&peak));
    ensure!(
        status.success(),
        "pagewise {} ended with {status}",
        args.join(" ")
    );
    Ok((ms, kib / 1024.0, text))
}

/// The last snapshot of the store at `dir` holds the target's two pages
/// and zeros elsewhere in its writable part.
fn snapshot_holds(dir: &Path, t: &Target) -> Result<bool> {
    let disk = pagewise_snap::DiskStore::open(dir)?;
    let id = *disk.ids()?.last().context("no snapshot in the store")?;
    let s = disk.load(id)?;
    let mut first = 0usize;
    let Some(r) = s.regions.iter().find(|r| {
        let hit = r.start <= t.addr && t.addr + t.len <= r.end();
        if !hit {
            first += r.pages() as usize;
        }
        hit
    }) else {
        return Ok(false);
    };
    let base = first + ((t.addr - r.start) / 4096) as usize;
    let entries = &s.entries[base..base + (t.len / 4096) as usize];
    let mut page = vec![0u8; 4096];
    for (k, &p) in t.pages.iter().enumerate() {
        disk.read_page(entries[p as usize], &mut page)?;
        if page[64] != 0x11 * (k as u8 + 1) {
            return Ok(false);
        }
    }
    let others = entries
        .iter()
        .enumerate()
        .filter(|&(i, &e)| e != 0 && !t.pages.contains(&(i as u64)))
        .count();
    Ok(others == 0)
}

/// One run of every command on `t`: (command, ms, MiB), and whether
/// every check held.
fn run_commands(t: &Target, dir: &Path) -> Result<(Vec<(f64, f64)>, bool)> {
    let _ = std::fs::remove_dir_all(dir);
    let pid = t.pid().to_string();
    let d = dir.to_str().context("a UTF-8 temporary directory")?;
    let mut out = Vec::new();
    let mut ok = true;
    let (ms, mib, _) = tool(&["snapshot", "--pid", &pid, "--out", d, "--json"])?;
    ok &= snapshot_holds(dir, t)?;
    out.push((ms, mib));
    let (_, mib, text) = tool(&[
        "snapshot",
        "--pid",
        &pid,
        "--out",
        d,
        "--every-ms",
        "20",
        "--count",
        "3",
        "--json",
    ])?;
    ok &= snapshot_holds(dir, t)?;
    let each: Vec<f64> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["total_ms"].as_f64())
        .collect();
    ensure!(each.len() == 3, "--every-ms printed {text:?}");
    out.push((crate::Spread::of(each).median, mib));
    let (ms, mib, _) = tool(&["snapshot", "--pid", &pid, "--out", d, "--live", "--json"])?;
    ok &= snapshot_holds(dir, t)?;
    out.push((ms, mib));
    // A page written since, put back by the restore.
    let at = t.addr + t.pages[1] * 4096;
    pagewise_mech::remote::write_exact(t.pid(), at, &[0x5a; 4096])?;
    // The first snapshot: the one that holds the layout and threads.
    let (ms, mib, _) = tool(&["snapshot", "restore", "--pid", &pid, d, "1", "--json"])?;
    let mut back = vec![0u8; 4096];
    pagewise_mech::remote::read(t.pid(), at, &mut back)?;
    ok &= back[64] == 0x22 && back.iter().enumerate().all(|(i, &b)| i == 64 || b == 0);
    out.push((ms, mib));
    let (ms, mib, _) = tool(&["snapshot", "inspect", d, "--json"])?;
    out.push((ms, mib));
    let (ms, mib, _) = tool(&["inspect", "--pid", &pid, "--json"])?;
    out.push((ms, mib));
    Ok((out, ok))
}

/// Runs the experiment; the process's exit code.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    if !pagewise_mech::probe::get().pagemap_scan {
        bail!(
            "sparse snapshots need PAGEMAP_SCAN: {}",
            pagewise_mech::probe::get().why("pagemap_scan")
        );
    }
    let runs = if a.full { 10 } else { a.runs.max(1) };
    let mut bar = crate::report::progress(quiet);
    let work = std::env::temp_dir().join(format!("pw-bench-sparse-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let bin = crate::compile_c(&work, "sparse_target", TARGET_C, &["-O2"])?;
    let r = measure(&bin, &work, runs, &mut bar);
    let _ = std::fs::remove_dir_all(&work);
    let (samples, verified) = r?;
    eprintln!();
    let report = report(samples, runs, verified);
    let summary = summary(&report, a.full, runs);
    let rc = a.output.emit(&report, summary, vec![])?;
    if !report.verified {
        bail!("a snapshot or a restore did not hold the target's memory");
    }
    Ok(rc)
}

/// `[shape][command]` → the runs' (ms, MiB), and whether every check held.
type Samples = Vec<Vec<Vec<(f64, f64)>>>;

fn measure(
    bin: &Path,
    work: &Path,
    runs: usize,
    bar: &mut dyn FnMut(&str),
) -> Result<(Samples, bool)> {
    let targets: Vec<Target> = SHAPES
        .iter()
        .map(|s| Target::start(bin, s))
        .collect::<Result<_>>()?;
    let mut samples: Samples = vec![vec![Vec::new(); COMMANDS.len()]; SHAPES.len()];
    let mut verified = true;
    for run in 0..runs {
        for (s, t) in targets.iter().enumerate() {
            bar(&format!("run {}/{runs}: {}", run + 1, SHAPES[s]));
            let dir: PathBuf = work.join(format!("store-{s}"));
            let (v, ok) = run_commands(t, &dir)?;
            verified &= ok;
            for (c, x) in v.into_iter().enumerate() {
                samples[s][c].push(x);
            }
        }
    }
    Ok((samples, verified))
}

fn report(samples: Samples, runs: usize, verified: bool) -> Report {
    let floor = SHAPES.len() - 1;
    let spread =
        |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| crate::Spread::of(v.iter().map(f).collect());
    let mut rows = Vec::new();
    for (s, shape) in SHAPES.iter().enumerate() {
        for (c, command) in COMMANDS.iter().enumerate() {
            let ms = spread(&samples[s][c], |x| x.0);
            let mib = spread(&samples[s][c], |x| x.1);
            let fms = spread(&samples[floor][c], |x| x.0).median;
            let fmib = spread(&samples[floor][c], |x| x.1).median;
            rows.push(Row {
                shape,
                command,
                met: ms.median <= BOUND_MS && mib.median <= BOUND_MIB,
                ms_over_floor: ms.median / fms.max(1e-9),
                mib_over_floor: mib.median / fmib.max(1e-9),
                ms,
                peak_mib: mib,
            });
        }
    }
    Report {
        machine: crate::Machine::this().to_string(),
        runs,
        bound_ms: BOUND_MS,
        bound_mib: BOUND_MIB,
        rows,
        verified,
    }
}

fn summary(r: &Report, full: bool, runs: usize) -> String {
    let mut s = format!(
        "pagewise bench sparse{} — {}\n{runs} runs of each command, interleaved; medians (lowest–highest)\n\n{:<12} {:<20} {:>24} {:>8} {:>22} {:>8} {:>5}\n",
        if full { " --full" } else { "" },
        r.machine,
        "shape",
        "command",
        "ms",
        "/floor",
        "peak MiB",
        "/floor",
        "met"
    );
    for x in &r.rows {
        s += &format!(
            "{:<12} {:<20} {:>9.1} ({:>5.1}–{:>6.1}) {:>7.2}× {:>8.1} ({:>5.1}–{:>5.1}) {:>7.2}× {:>5}\n",
            x.shape,
            x.command,
            x.ms.median,
            x.ms.min,
            x.ms.max,
            x.ms_over_floor,
            x.peak_mib.median,
            x.peak_mib.min,
            x.peak_mib.max,
            x.mib_over_floor,
            if x.met { "yes" } else { "NO" }
        );
    }
    s += &format!(
        "\nbounds: each command at most {} ms and {} MiB of pagewise's own memory (the medians); \
         --every-ms: one snapshot's time as it reports it, the whole command's memory.\n\
         floor: the same program holding only its 2 pages (the commands' fixed cost).\n\
         checked: every snapshot holds the 2 pages and zeros elsewhere: {}\n",
        r.bound_ms,
        r.bound_mib,
        if r.verified { "yes" } else { "NO" }
    );
    s
}
