//! `pagewise bench` and `pagewise demo`.

use anyhow::{bail, Context, Result};
use pagewise_bench::track as bt;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// LDT's experiments (a) write-only, (b) read/write timeline, (c) collection
    /// time, for every available backend and no tracking. Short by default.
    Track {
        /// The full experiment (64 MiB..4 GiB, 1 GiB timeline for 10 s; ~5 minutes).
        #[arg(long)]
        full: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Write report.json, summary.txt and SVG plots into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// SimGrid's experiments: (a) a depth-first state-space search with full-copy
    /// snapshots against the page store (time, peak RSS); (b) snapshot + restore
    /// cycles against fork() and memcpy; (c) `pagewise snapshot --pid` against
    /// `criu dump` on the same process (skipped with the reason where CRIU
    /// cannot run). Short by default.
    Snap {
        /// The full experiment (256 MiB search heap, 1 GiB cycles, 256 MiB
        /// process; a few minutes).
        #[arg(long)]
        full: bool,
        /// Run only these experiments: any of a, b and c (for example `--only bc`).
        #[arg(long, default_value = "abc")]
        only: String,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Write report.json, summary.txt and SVG plots into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// DiME's validation: (a) Table 5.1 fetch counts, (b) the two-page test,
    /// (c) delay accuracy against the configured latency, (f) the cost of a
    /// fault at latency 0. Short by default.
    Farmem {
        /// The full experiment (twelve latencies, five repeats; about a minute).
        #[arg(long)]
        full: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Write report.json, summary.txt and SVG plots into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// LDT's experiment (d): a real redis-server loaded by redis-benchmark,
    /// untracked and tracked every 1, 5 and 10 s.
    Redis(crate::cmd_redis::Args),
    /// DiME's experiments (d) and (e): a real redis-server under `pagewise
    /// farmem run`, GET throughput against local memory and latency, and
    /// isolation between instances (with --full); every run checks a sample
    /// of keys and values.
    FarmemRedis(crate::cmd_farmem_redis::Args),
    /// The inspector's cost: time to inspect a process holding the known
    /// layout (128 MiB; 256 MiB, 1 GiB and 4 GiB with --full) against
    /// reading that memory once at this machine's bandwidth, the target's
    /// slowdown during the scan, and every exact figure checked.
    Inspect(crate::cmd_inspect_bench::Args),
}

/// Progress on stderr: one updating line on a terminal, plain lines otherwise.
pub fn progress() -> impl FnMut(&str) {
    let tty = std::io::stderr().is_terminal();
    let t0 = std::time::Instant::now();
    let mut n = 0u32;
    move |msg: &str| {
        n += 1;
        let mut e = std::io::stderr();
        if tty {
            let _ = write!(
                e,
                "\r\x1b[K[{n:>3}] {:>6.1}s {msg}",
                t0.elapsed().as_secs_f64()
            );
        } else {
            let _ = writeln!(e, "[{n:>3}] {:>6.1}s {msg}", t0.elapsed().as_secs_f64());
        }
        let _ = e.flush();
    }
}

pub fn run(a: Args) -> Result<i32> {
    match a.what {
        What::Track { full, json, out } => {
            let cfg = if full {
                bt::Config::full()
            } else {
                bt::Config::quick()
            };
            let report = bt::run(&cfg, &mut progress())?;
            eprintln!();
            emit(&report, report.summary(), report.charts(), json, out)
        }
        What::Snap {
            full,
            only,
            json,
            out,
        } => {
            use pagewise_bench::snap as bs;
            let mut cfg = if full {
                bs::Config::full()
            } else {
                bs::Config::quick()
            };
            cfg.parts = only;
            let report = bs::run(&cfg, &mut progress())?;
            eprintln!();
            emit(&report, report.summary(), report.charts(), json, out)
        }
        What::Farmem { full, json, out } => {
            use pagewise_bench::farmem as bf;
            let cfg = if full {
                bf::FarmemConfig::full()
            } else {
                bf::FarmemConfig::quick()
            };
            let report = bf::run(&cfg, &mut progress())?;
            eprintln!();
            emit(&report, report.summary(), report.charts(), json, out)
        }
        What::Redis(r) => crate::cmd_redis::run(r),
        What::FarmemRedis(r) => crate::cmd_farmem_redis::run(r),
        What::Inspect(r) => crate::cmd_inspect_bench::run(r),
    }
}

/// Prints a report (JSON or its summary) and writes it with its plots into `out`.
pub(crate) fn emit(
    report: &impl serde::Serialize,
    summary: String,
    charts: Vec<(String, pagewise_bench::svg::Chart)>,
    json: bool,
    out: Option<PathBuf>,
) -> Result<i32> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{summary}");
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(
            dir.join("report.json"),
            serde_json::to_string_pretty(report)?,
        )?;
        std::fs::write(dir.join("summary.txt"), summary)?;
        for (name, chart) in charts {
            std::fs::write(dir.join(&name), chart.render())?;
        }
        eprintln!("pagewise: wrote {}", dir.display());
    }
    Ok(0)
}

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Size of the demo's memory in MiB.
    #[arg(long, default_value_t = 256)]
    mib: usize,
}

/// Tracks a writer thread over `mib` MiB with every available backend and
/// checks each collection against a shadow copy.
pub fn demo(a: DemoArgs) -> Result<i32> {
    use pagewise::track::{BackendKind, DirtyTracker};
    use pagewise::workload::{AnonMemory, Rng};
    use pagewise::PAGE_SIZE;
    if a.mib == 0 {
        bail!("--mib must be at least 1");
    }
    println!("pagewise demo: a program writes random pages of {} MiB; each backend reports what changed,", a.mib);
    println!(
        "and every report is checked against a shadow copy (a lost write would fail the demo).\n"
    );
    for k in BackendKind::ALL {
        if let Err(why) = k.available_in_process() {
            println!("{:<10} skipped: {why}", k.name());
            continue;
        }
        let mem = AnonMemory::new(a.mib << 20)?;
        mem.write_pass(1, 1);
        let mut shadow = mem.snapshot();
        let mut t = DirtyTracker::new(&[mem.region()], k)?;
        let mut rng = Rng::new(9);
        let mut total_ms = 0.0;
        let mut reported = 0;
        for round in 0..5u64 {
            for _ in 0..(mem.pages() / 20) {
                let p = rng.below(mem.pages() as u64) as usize;
                mem.write_byte(
                    p * PAGE_SIZE + (round as usize) * 8,
                    (round as u8).wrapping_add(p as u8) | 1,
                );
            }
            let c = t.collect()?;
            total_ms += c.stats.elapsed_ns as f64 / 1e6;
            reported += c.stats.pages_dirty;
            for r in &c.ranges {
                let off = (r.start - mem.addr()) as usize;
                mem.read_into(off, &mut shadow[off..off + r.len() as usize]);
            }
            if mem.snapshot() != shadow {
                bail!("{k}: a write was lost in round {round}");
            }
        }
        println!(
            "{:<10} 5 collections: {:>7} dirty pages reported, mean collection {:>8.3} ms, shadow copy matches",
            k.name(),
            reported,
            total_ms / 5.0
        );
    }
    println!("\nNext: `pagewise probe`, `pagewise track -- CMD`, `pagewise bench track`.");
    Ok(0)
}
