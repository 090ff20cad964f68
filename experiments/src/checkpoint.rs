//! `pagewise bench checkpoint`: LDT's incremental checkpointing, experiment
//! (b). A real `redis-server` on loopback holding a data set (`--prefill`
//! keys of 1 KiB, made with `DEBUG POPULATE`) under `redis-benchmark` load
//! (SET and GET runs in turn, random keys over a hot set of `--keys`),
//! checkpointed every second into a store while the load runs:
//!
//! - `live`: pre-copy checkpoints ([`Checkpointer`]): each starts from the
//!   pages written since the last (uffd-wp from outside), copies while Redis
//!   runs, and stops it only for the last few pages;
//! - `incremental`: stop, collect the uffd-wp tracker, read what was written,
//!   resume ([`Incremental`]);
//! - `hash`: stop, read everything, resume (the store's content addresses
//!   find what changed: what a tool without dirty tracking does);
//! - `none`: no checkpoints, first and last (the baseline is their mean).
//!
//! In every mode a first, full checkpoint is taken before the load starts
//! (the base); the figures are those of the checkpoints under load.
//!
//! Per mode: Redis's throughput against the baseline, the time Redis was
//! stopped per checkpoint, the bytes read from it per checkpoint. One more
//! live checkpoint, once the load is over, is compared page for page with
//! Redis's memory at its stop.
//! And whether CRIU can do the same here (`criu check --feature
//! mem_dirty_track`): where it cannot, the reason is reported.

use crate::redis::{free_port, redis_args, redis_benchmark, wait_ready, which, Server};
use anyhow::{bail, Context, Result};
use pagewise_snap::live::{Checkpointer, LiveOptions, ProcessSource, StoreSeries};
use pagewise_snap::remote::{snapshot_process, Incremental};
use pagewise_snap::DiskStore;
use serde::Serialize;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
/// The experiment's arguments.
pub struct Args {
    /// Seconds of load per mode.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Checkpoint interval, ms.
    #[arg(long, default_value_t = 1000)]
    every_ms: u64,
    /// Keys of the data set, made before the load (values of 1 KiB).
    #[arg(long, default_value_t = 1_000_000)]
    prefill: u64,
    /// Keys the load reads and writes (values of 1 KiB): the hot set.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Modes, in order (none runs first and last whatever is asked).
    #[arg(long, value_delimiter = ',', default_value = "live,incremental,hash")]
    modes: Vec<String>,
    /// Downtime budget of the live checkpoints, ms.
    #[arg(long, default_value_t = 5.0)]
    max_downtime_ms: f64,
    #[command(flatten)]
    output: crate::report::Output,
}

/// One checkpoint.
#[derive(Serialize, Clone, Copy)]
struct Point {
    /// Time Redis was stopped, ms.
    stopped_ms: f64,
    /// Bytes read from Redis.
    bytes_read: u64,
    /// The whole checkpoint, ms.
    total_ms: f64,
    /// Until the process ran on (live: the passes and the stop), ms.
    copy_ms: f64,
    /// Passes (live).
    passes: usize,
}

#[derive(Serialize, Clone)]
struct Run {
    mode: String,
    set_rps: f64,
    get_rps: f64,
    mean_rps: f64,
    ratio_to_none: f64,
    checkpoints: Vec<Point>,
    median_stopped_ms: f64,
    max_stopped_ms: f64,
    mean_bytes_read: f64,
    /// Pages of the last live checkpoint that differ from Redis's memory at
    /// its stop (must be 0; live only).
    wrong_pages: Option<u64>,
    /// Redis's memory (writable mappings), MiB.
    redis_mib: f64,
}

#[derive(Serialize)]
struct Report {
    machine: crate::Machine,
    redis_version: String,
    load: String,
    every_ms: u64,
    seconds: u64,
    runs: Vec<Run>,
    baseline_rps: f64,
    criu: String,
}

/// The load: SET and GET runs of `chunk` requests in turn until `seconds`
/// have passed; the mean requests/s of each.
fn load(port: u16, keys: u64, seconds: u64) -> Result<(f64, f64)> {
    let t0 = Instant::now();
    let (mut set, mut get) = (Vec::new(), Vec::new());
    let keys = keys.to_string();
    let mut i = 0;
    while t0.elapsed() < Duration::from_secs(seconds) || set.is_empty() || get.is_empty() {
        let t = if i % 2 == 0 { "SET" } else { "GET" };
        let r = redis_benchmark(
            port,
            &[
                "-t",
                &t.to_lowercase(),
                "-n",
                "100000",
                "-r",
                &keys,
                "-d",
                "1024",
                "-c",
                "50",
            ],
            &[t],
        )?;
        if i % 2 == 0 { &mut set } else { &mut get }.push(r[0]);
        i += 1;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Ok((mean(&set), mean(&get)))
}

/// `DEBUG POPULATE n data 1024`: n keys `data:0`.. of 1 KiB each.
fn populate(port: u16, n: u64) -> Result<()> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    let (n, prefix) = (n.to_string(), "data");
    let mut cmd = String::from("*5\r\n");
    for a in ["DEBUG", "POPULATE", &n, prefix, "1024"] {
        cmd += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(cmd.as_bytes())?;
    let mut reply = [0u8; 64];
    let k = s.read(&mut reply)?;
    let reply = String::from_utf8_lossy(&reply[..k]);
    if !reply.starts_with("+OK") {
        bail!("DEBUG POPULATE answered {}", reply.trim());
    }
    Ok(())
}

fn writable_bytes(pid: i32) -> u64 {
    pagewise_mech::procfs::writable(Some(pid))
        .map(|m| m.iter().map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// Checkpoints `pid` every `every` in `mode` until `stop`; the points and,
/// for live, the wrong pages of the last checkpoint.
fn checkpoints(
    pid: i32,
    mode: &str,
    every: Duration,
    budget_ms: f64,
    dir: &std::path::Path,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<()>,
) -> Result<(Vec<Point>, Option<u64>)> {
    let _ = std::fs::remove_dir_all(dir);
    let mut store = DiskStore::create(dir, false)?;
    let mut points = Vec::new();
    let mut wrong = None;
    let mut due = Instant::now();
    // The first checkpoint (a full copy in every mode) is the base, taken
    // before the load starts; the points are the checkpoints under load.
    let mut base = true;
    let mut started = |points: &mut Vec<Point>, due: &mut Instant| {
        if std::mem::take(&mut base) {
            points.clear();
            let _ = ready.send(());
            *due = Instant::now();
        }
    };
    let wait = |due: Instant| {
        while Instant::now() < due && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    match mode {
        "live" => {
            let opts = LiveOptions::default()
                .max_downtime_ms(budget_ms)
                .max_passes(10)
                .throttle(false);
            let mut cp = Checkpointer::new(ProcessSource::new(pid)?, opts);
            let mut series = StoreSeries::new(&mut store);
            while !stop.load(Ordering::Relaxed) {
                wait(due);
                due += every;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = cp.checkpoint(&mut series, "", &mut |_| {}, &mut || {})?;
                points.push(Point {
                    stopped_ms: r.downtime_ms,
                    bytes_read: r.bytes_copied,
                    total_ms: r.total_ms,
                    copy_ms: r.copy_ms,
                    passes: r.passes.len() + 1,
                });
                started(&mut points, &mut due);
            }
            // Once the load is over, one more checkpoint, compared page for
            // page with the memory at its stop (reading that memory while
            // Redis is stopped would weigh on the figures under load).
            let mut truth = Vec::new();
            let r = cp.checkpoint(&mut series, "", &mut |_| {}, &mut || {
                truth = crate::live::fingerprints(pid).unwrap_or_default();
            })?;
            wrong = Some(crate::live::wrong_pages(series.store, r.save.id, &truth)?);
        }
        "incremental" | "hash" => {
            // Stopped for the whole read: of what was written (uffd-wp
            // from outside), or of everything.
            let mut inc = if mode == "incremental" {
                Some(Incremental::new(pid)?)
            } else {
                None
            };
            while !stop.load(Ordering::Relaxed) {
                wait(due);
                due += every;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let s = match inc.as_mut() {
                    Some(inc) => inc.snapshot(&mut store, "")?,
                    None => snapshot_process(pid, &mut store, "")?,
                };
                points.push(Point {
                    stopped_ms: s.stopped_ms,
                    bytes_read: s.pages_read * pagewise::PAGE_SIZE as u64,
                    total_ms: s.total_ms,
                    copy_ms: s.stopped_ms,
                    passes: 1,
                });
                started(&mut points, &mut due);
            }
        }
        other => bail!("mode {other}: live, incremental, hash or none"),
    }
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Ok((points, wrong))
}

fn one_run(mode: &str, a: &Args, scratch: &std::path::Path) -> Result<Run> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .args(redis_args(port))
        .args(["--enable-debug-command", "local"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server")?;
    let server = Server { child, port };
    wait_ready(port)?;
    let pid = server.child.id() as i32;
    // The data set, then every key of the hot set once.
    populate(port, a.prefill)?;
    let keys = a.keys.to_string();
    redis_benchmark(
        port,
        &[
            "-t", "set", "-n", &keys, "-r", &keys, "-d", "1024", "-c", "50",
        ],
        &["SET"],
    )?;
    let redis_mib = writable_bytes(pid) as f64 / 1048576.0;
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let cps = if mode == "none" {
        None
    } else {
        let (stop, mode, dir) = (
            stop.clone(),
            mode.to_string(),
            scratch.join(format!("checkpoint-{mode}")),
        );
        let (every, budget) = (Duration::from_millis(a.every_ms), a.max_downtime_ms);
        Some(std::thread::spawn(move || {
            checkpoints(pid, &mode, every, budget, &dir, &stop, ready_tx)
        }))
    };
    if cps.is_some() {
        // The base checkpoint first (or the thread's failure).
        let _ = ready.recv();
    }
    let r = load(port, a.keys, a.seconds);
    stop.store(true, Ordering::Relaxed);
    let (points, wrong) = match cps {
        Some(h) => h
            .join()
            .map_err(|_| anyhow::anyhow!("the checkpoint thread panicked"))??,
        None => (Vec::new(), None),
    };
    drop(server);
    let (set, get) = r?;
    let mut stopped: Vec<f64> = points.iter().map(|p| p.stopped_ms).collect();
    Ok(Run {
        mode: mode.to_string(),
        set_rps: set,
        get_rps: get,
        mean_rps: (set + get) / 2.0,
        ratio_to_none: f64::NAN,
        median_stopped_ms: if stopped.is_empty() {
            0.0
        } else {
            crate::median(&mut stopped)
        },
        max_stopped_ms: stopped.iter().cloned().fold(0.0, f64::max),
        mean_bytes_read: if points.is_empty() {
            0.0
        } else {
            points.iter().map(|p| p.bytes_read as f64).sum::<f64>() / points.len() as f64
        },
        checkpoints: points,
        wrong_pages: wrong,
        redis_mib,
    })
}

/// Whether a CRIU here can track memory between dumps, and if not, why.
fn criu_status() -> String {
    if !which("criu") {
        return "criu is not installed (scripts/setup.sh installs Debian's)".into();
    }
    let version = Command::new("criu")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default();
    match Command::new("criu")
        .args(["check", "--feature", "mem_dirty_track"])
        .output()
    {
        Ok(o) if o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("OFF") => {
            format!("criu {version}: memory tracking available (not run by this benchmark)")
        }
        Ok(o) => format!(
            "skipped: criu {version} cannot track memory here (`criu check --feature mem_dirty_track`: {})",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .chain(String::from_utf8_lossy(&o.stdout).lines())
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" / ")
        ),
        Err(e) => format!("skipped: running criu: {e}"),
    }
}

/// Runs the experiment; the process's exit code.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    if !which("redis-server") || !which("redis-benchmark") {
        bail!("redis-server and redis-benchmark are needed: run scripts/setup.sh (installs Debian's redis-server and redis-tools)");
    }
    if a.modes.iter().any(|m| m == "live" || m == "incremental") {
        if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
            bail!("uffd-wp from outside is not available here: {why}");
        }
    }
    let version = Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let scratch =
        std::env::temp_dir().join(format!("pagewise-bench-checkpoint-{}", std::process::id()));
    let mut p = crate::report::progress(quiet);
    let mut runs = Vec::new();
    let mut order = vec!["none".to_string()];
    order.extend(a.modes.iter().filter(|m| *m != "none").cloned());
    order.push("none".into());
    for m in &order {
        p(&format!("{m}: {} s of load", a.seconds));
        runs.push(one_run(m, &a, &scratch)?);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if !quiet {
        eprintln!();
    }
    let (base, nones) = crate::redis::baseline(&mut runs, |r| {
        (r.mode == "none", r.mean_rps, &mut r.ratio_to_none)
    });
    let report = Report {
        machine: crate::Machine::this(),
        redis_version: version,
        load: format!(
            "DEBUG POPULATE {} data 1024, then redis-benchmark -t set (then get) -n 100000 -r {} -d 1024 -c 50, in turn, for {} s",
            a.prefill, a.keys, a.seconds
        ),
        every_ms: a.every_ms,
        seconds: a.seconds,
        runs,
        baseline_rps: base,
        criu: criu_status(),
    };
    let hash_bytes = report
        .runs
        .iter()
        .find(|r| r.mode == "hash")
        .map(|r| r.mean_bytes_read);
    let mut summary = format!(
        "pagewise bench checkpoint — {}\n{}\nload: {}\ncheckpoint every {} ms; baseline {:.0} req/s (mean of the first and last runs without checkpoints: {})\n\n{:>12} {:>9} {:>9} {:>9} {:>7} {:>6} {:>12} {:>12} {:>14} {:>10} {:>6}\n",
        report.machine,
        report.redis_version,
        report.load,
        a.every_ms,
        base,
        nones.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", "),
        "mode", "SET/s", "GET/s", "mean/s", "ratio", "ckpts", "stopped ms", "max stop ms", "MiB read/ckpt", "vs hash", "wrong"
    );
    for r in &report.runs {
        summary += &format!(
            "{:>12} {:>9.0} {:>9.0} {:>9.0} {:>7.3} {:>6} {:>12.2} {:>12.2} {:>14.2} {:>10} {:>6}\n",
            r.mode,
            r.set_rps,
            r.get_rps,
            r.mean_rps,
            r.ratio_to_none,
            r.checkpoints.len(),
            r.median_stopped_ms,
            r.max_stopped_ms,
            r.mean_bytes_read / 1048576.0,
            match hash_bytes {
                Some(h) if r.mean_bytes_read > 0.0 => format!("{:.1}x less", h / r.mean_bytes_read),
                _ => "-".into(),
            },
            r.wrong_pages.map_or("-".into(), |w| w.to_string())
        );
    }
    summary += &format!(
        "\nRedis's writable memory: {:.0} MiB. stopped ms: the median per checkpoint.\nCRIU: {}\ngoals: throughput with 1 s checkpoints at least 0.95x; stopped at most 5 ms per checkpoint; at least 10x fewer bytes read than hash.\n",
        report.runs.first().map_or(0.0, |r| r.redis_mib),
        report.criu
    );
    let series = report
        .runs
        .iter()
        .filter(|r| !r.checkpoints.is_empty())
        .map(|r| crate::svg::Series {
            label: r.mode.clone(),
            points: r
                .checkpoints
                .iter()
                .enumerate()
                .map(|(i, p)| ((i + 1) as f64, p.stopped_ms.max(1e-3)))
                .collect(),
        })
        .collect();
    let chart = crate::svg::Chart {
        title: "(b) redis-server checkpointed every second: time stopped per checkpoint".into(),
        x_label: "checkpoint".into(),
        y_label: "ms stopped".into(),
        log_x: false,
        log_y: true,
        series,
    };
    let wrong: u64 = report.runs.iter().filter_map(|r| r.wrong_pages).sum();
    let rc = a
        .output
        .emit(&report, summary, vec![("checkpoint.svg".into(), chart)])?;
    if wrong > 0 {
        bail!("{wrong} pages of the last live checkpoint differ from Redis's memory at its stop");
    }
    Ok(rc)
}
