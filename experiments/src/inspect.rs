//! `pagewise bench inspect`: the inspector's cost against reading the same
//! memory once at this machine's bandwidth, with the target's slowdown, on
//! the known layout (whose figures every run checks exactly).

use anyhow::{bail, Context, Result};
use pagewise_inspect::{inspect, Options};
use pagewise_mech::workload::{AnonMemory, LayoutTruth};
use serde::Serialize;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
/// The experiment's arguments.
pub struct Args {
    /// The full experiment (256 MiB, 1 GiB and 4 GiB targets; a few minutes).
    #[arg(long)]
    full: bool,
    #[command(flatten)]
    output: crate::report::Output,
}

#[derive(Serialize)]
struct Point {
    bytes: u64,
    inspect_s: f64,
    read_once_s: f64,
    /// inspect_s / read_once_s (goal: at most 1.5).
    ratio: f64,
    pages_read: u64,
    /// The target's passes over its hot regions per second, before and
    /// during the scan.
    target_rate_before: f64,
    target_rate_during: f64,
    /// before / during.
    target_slowdown: f64,
    /// Every exact figure matched the layout.
    exact: bool,
    bloom_relative_error: Option<f64>,
    bloom_sampled_relative_error: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    read_bandwidth_gb_s: f64,
    points: Vec<Point>,
}

/// Memory read bandwidth of one thread, GB/s: 1 GiB read once
/// ([`crate::read_once_s`], the median of 3).
fn read_bandwidth() -> Result<f64> {
    let len = 1usize << 30;
    let m = AnonMemory::new(len)?;
    m.write_pass(1, 1);
    Ok(len as f64 / crate::read_once_s(&m, 3) / 1e9)
}

struct Target {
    child: Child,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn passes(p: &Path) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(p)
        .and_then(|f| f.read_exact_at(&mut b, 0))
        .map(|_| u64::from_ne_bytes(b))
        .unwrap_or(0)
}

fn rate(p: &Path, d: Duration) -> f64 {
    let (a, t) = (passes(p), Instant::now());
    std::thread::sleep(d);
    (passes(p) - a) as f64 / t.elapsed().as_secs_f64()
}

fn point(bytes: u64, bw: f64, dir: &Path, bar: &mut dyn FnMut(&str)) -> Result<Point> {
    let regions = (bytes >> 21) as usize;
    let truth = dir.join(format!("truth-{regions}"));
    let counter = dir.join(format!("passes-{regions}"));
    let me = crate::pagewise_tool()?;
    let child = Command::new(me)
        .args([
            "workload",
            "--layout",
            &regions.to_string(),
            "--seconds",
            "900",
        ])
        .arg("--truth")
        .arg(&truth)
        .arg("--passes")
        .arg(&counter)
        .spawn()
        .context("starting the layout target")?;
    let mut target = Target { child };
    bar(&format!("building a {} MiB layout", bytes >> 20));
    let t0 = Instant::now();
    while !truth.exists() {
        if t0.elapsed() > Duration::from_secs(600) || target.child.try_wait()?.is_some() {
            bail!("the layout target did not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let t: LayoutTruth = serde_json::from_slice(&std::fs::read(&truth)?)?;
    std::thread::sleep(Duration::from_millis(300));
    let before = rate(&counter, Duration::from_secs(1));
    let pid = target.child.id() as i32;
    bar(&format!("inspecting {} MiB", bytes >> 20));
    let p0 = passes(&counter);
    let t1 = Instant::now();
    let rep = inspect(&[pid], Options::default(), &mut |_, _| {})?;
    let secs = t1.elapsed().as_secs_f64();
    let during = (passes(&counter) - p0) as f64 / secs;
    let sampled = inspect(
        &[pid],
        Options::default().bloom_sample(true),
        &mut |_, _| {},
    )?;
    drop(target);
    let mine: Vec<_> = rep
        .regions
        .iter()
        .filter(|r| r.start >= t.addr && r.start < t.addr + t.len)
        .collect();
    let sum =
        |f: fn(&pagewise_inspect::RegionReport) -> u64| mine.iter().map(|r| f(r)).sum::<u64>();
    let exact = sum(|r| r.resident_pages) == t.pages
        && sum(|r| r.zero_pages) == t.zero_pages
        && sum(|r| r.duplicate_pages) == t.duplicate_pages
        && (!t.collapsed
            || (sum(|r| r.huge_pages) == t.pages && sum(|r| r.bloat_pages) == t.zero_pages));
    let read_once = bytes as f64 / (bw * 1e9);
    Ok(Point {
        bytes,
        inspect_s: secs,
        read_once_s: read_once,
        ratio: secs / read_once,
        pages_read: rep.pages_read,
        target_rate_before: before,
        target_rate_during: during,
        target_slowdown: before / during.max(1e-9),
        exact,
        bloom_relative_error: rep.bloom.relative_error,
        bloom_sampled_relative_error: sampled.bloom.relative_error,
    })
}

/// Runs the experiment; the process's exit code.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    if !pagewise_mech::probe::get().pagemap_scan {
        bail!(
            "the inspector needs PAGEMAP_SCAN: {}",
            pagewise_mech::probe::get().why("pagemap_scan")
        );
    }
    let mut bar = crate::report::progress(quiet);
    bar("measuring memory read bandwidth");
    let bw = read_bandwidth()?;
    let dir = std::env::temp_dir().join(format!("pw-bench-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sizes: Vec<u64> = if a.full {
        vec![256 << 20, 1 << 30, 4 << 30]
    } else {
        vec![128 << 20]
    };
    let mut points = Vec::new();
    for s in sizes {
        let r = point(s, bw, &dir, &mut bar);
        let p = match r {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        points.push(p);
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!();
    let machine = crate::Machine::this().to_string();
    let mut summary = format!(
        "pagewise bench inspect{} — {machine}\nread bandwidth (one thread): {bw:.2} GB/s\n\n{:>9} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9}\n",
        if a.full { " --full" } else { "" },
        "size", "inspect", "read once", "ratio", "tgt/s", "tgt/s scan", "slowdown", "exact", "bloom err", "25% err"
    );
    let pct = |e: Option<f64>| {
        e.map(|e| format!("{:+.2}%", 100.0 * e))
            .unwrap_or("-".into())
    };
    for p in &points {
        summary += &format!(
            "{:>6} MiB {:>8.3} s {:>8.3} s {:>6.2}x {:>9.0} {:>10.0} {:>8.2}x {:>6} {:>9} {:>9}\n",
            p.bytes >> 20,
            p.inspect_s,
            p.read_once_s,
            p.ratio,
            p.target_rate_before,
            p.target_rate_during,
            p.target_slowdown,
            if p.exact { "yes" } else { "NO" },
            pct(p.bloom_relative_error),
            pct(p.bloom_sampled_relative_error)
        );
    }
    summary += "\nratio: inspection time / (size / read bandwidth); goal at most 1.5.\n";
    let chart = crate::svg::Chart {
        title: "pagewise inspect: time against reading the memory once".into(),
        x_label: "target size (MiB)".into(),
        y_label: "seconds".into(),
        log_x: true,
        log_y: true,
        series: vec![
            crate::svg::Series {
                label: "inspect".into(),
                points: points
                    .iter()
                    .map(|p| ((p.bytes >> 20) as f64, p.inspect_s))
                    .collect(),
            },
            crate::svg::Series {
                label: "read once".into(),
                points: points
                    .iter()
                    .map(|p| ((p.bytes >> 20) as f64, p.read_once_s))
                    .collect(),
            },
            crate::svg::Series {
                label: "1.5 x read once".into(),
                points: points
                    .iter()
                    .map(|p| ((p.bytes >> 20) as f64, 1.5 * p.read_once_s))
                    .collect(),
            },
        ],
    };
    let failed = points.iter().any(|p| !p.exact);
    let report = Report {
        machine,
        read_bandwidth_gb_s: bw,
        points,
    };
    let rc = a
        .output
        .emit(&report, summary, vec![("cost.svg".into(), chart)])?;
    if failed {
        bail!("the inspector's figures did not match the layout");
    }
    Ok(rc)
}
