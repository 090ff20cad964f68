//! `pagewise bench redis`: LDT's experiment (d). A real `redis-server` on
//! loopback, loaded by `redis-benchmark` (SET then GET, random keys), untracked
//! and tracked by `pagewise track` at 1, 5 and 10 s intervals with `uffd-wp`
//! (inside, through the preload shim) and `hash` (from outside). The untracked
//! run is made first and last; its mean is the baseline.

use crate::svg::{Chart, Series};
use anyhow::{bail, Context, Result};
pub(crate) use pagewise_testkit::servers::{
    free_port, redis_args, value, wait_ready_within, Client,
};
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[derive(clap::Args)]
/// The experiment's arguments.
pub struct Args {
    /// Requests per redis-benchmark test (SET and GET each).
    #[arg(long, default_value_t = 1_000_000)]
    requests: u64,
    /// Tracking intervals in seconds.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    intervals: Vec<u64>,
    /// Backends to run tracked (uffd-wp, hash, soft-dirty).
    #[arg(long, value_delimiter = ',', default_value = "uffd-wp,hash")]
    backends: Vec<String>,
    #[command(flatten)]
    output: crate::report::Output,
}

#[derive(Serialize, Clone)]
struct Run {
    backend: String,
    interval_s: u64,
    set_rps: f64,
    get_rps: f64,
    mean_rps: f64,
    ratio_to_none: f64,
    collections: u64,
    mean_collect_ms: f64,
    mean_dirty_pages: f64,
}

#[derive(Serialize)]
struct Report {
    machine: crate::Machine,
    redis_version: String,
    command: String,
    runs: Vec<Run>,
    baseline_rps: f64,
}

pub(crate) fn which(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The baseline of runs made first and last without the thing measured:
/// the mean of their throughputs (returned, with them); every run's ratio
/// to it is set. `of` gives, per run, whether it is a baseline run, its
/// throughput and where its ratio goes.
pub(crate) fn baseline<R>(
    runs: &mut [R],
    of: impl Fn(&mut R) -> (bool, f64, &mut f64),
) -> (f64, Vec<f64>) {
    let nones: Vec<f64> = runs
        .iter_mut()
        .map(&of)
        .filter(|(none, _, _)| *none)
        .map(|(_, rps, _)| rps)
        .collect();
    let base = nones.iter().sum::<f64>() / nones.len() as f64;
    for r in runs.iter_mut() {
        let (_, rps, ratio) = of(r);
        *ratio = rps / base;
    }
    (base, nones)
}

pub(crate) fn wait_ready(port: u16) -> Result<()> {
    Ok(wait_ready_within(port, Duration::from_secs(10))?)
}

/// Runs `redis-benchmark` against 127.0.0.1:`port` with `args` (CSV
/// output added); returns the requests/s of test `name` for each name asked.
pub(crate) fn redis_benchmark(port: u16, args: &[&str], names: &[&str]) -> Result<Vec<f64>> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .arg("--csv")
        .output()
        .context("running redis-benchmark")?;
    if !out.status.success() {
        bail!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    names
        .iter()
        .map(|name| {
            text.lines()
                .find(|l| l.starts_with(&format!("\"{name}\"")))
                .and_then(|l| l.split(',').nth(1))
                .and_then(|v| v.trim_matches('"').parse().ok())
                .with_context(|| format!("no {name} line in redis-benchmark output: {text}"))
        })
        .collect()
}

/// A bounded `redis-benchmark` of SET and GET (`requests` each, 50
/// clients, values of 1 KiB on random keys) against 127.0.0.1:`port`:
/// requests a second of each.
pub(crate) fn load(port: u16, requests: u64) -> Result<(f64, f64)> {
    let n = requests.to_string();
    let r = redis_benchmark(
        port,
        &[
            "-t", "set,get", "-n", &n, "-r", "100000", "-d", "1024", "-c", "50",
        ],
        &["SET", "GET"],
    )?;
    Ok((r[0], r[1]))
}

/// The server (or the `pagewise` command running it). Dropping it asks Redis
/// to shut down, so that a tracker in between sees its command exit, and kills
/// what is left after 10 s.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) port: u16,
}

impl Server {
    /// Asks Redis to shut down and waits up to 10 s for the process to
    /// exit; then kills it. Does nothing once it has exited.
    pub(crate) fn shutdown(&mut self) {
        use std::io::Write;
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = s.write_all(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n");
        }
        pagewise_agent::child::wait_or_kill(&mut self.child, Duration::from_secs(10));
        // A server started through another command in a process group of
        // its own (`pagewise farmem run -- redis-server`): whatever of the
        // group is left goes too. Without a group of its own, there is no
        // group of that id and this does nothing.
        let _ = pagewise_sys::process::kill(-(self.child.id() as i32), libc::SIGKILL);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn one_run(backend: Option<&str>, interval: u64, requests: u64) -> Result<Run> {
    let port = free_port()?;
    let server_args = redis_args(port);
    let mut cmd = match backend {
        None => {
            let mut c = Command::new("redis-server");
            c.args(&server_args);
            c
        }
        Some(b) => {
            let mut c = Command::new(crate::pagewise_tool()?);
            c.args([
                "track",
                "--json",
                "--backend",
                b,
                "--interval-ms",
                &(interval * 1000).to_string(),
                "--",
                "redis-server",
            ])
            .args(&server_args);
            c
        }
    };
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server")?;
    let mut server = Server { child, port };
    let stdout = server.child.stdout.take().expect("piped stdout");
    let lines = std::thread::spawn(move || {
        let mut v = Vec::new();
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(j) = serde_json::from_str::<serde_json::Value>(&l) {
                v.push((
                    j["collect_ns"].as_f64().unwrap_or(0.0),
                    j["dirty_pages"].as_f64().unwrap_or(0.0),
                ));
            }
        }
        v
    });
    wait_ready(port)?;
    let (set, get) = load(port, requests)?;
    drop(server);
    let v = lines.join().unwrap_or_default();
    let n = v.len() as u64;
    Ok(Run {
        backend: backend.unwrap_or("none").to_string(),
        interval_s: if backend.is_some() { interval } else { 0 },
        set_rps: set,
        get_rps: get,
        mean_rps: (set + get) / 2.0,
        ratio_to_none: f64::NAN,
        collections: n,
        mean_collect_ms: if n > 0 {
            v.iter().map(|x| x.0).sum::<f64>() / n as f64 / 1e6
        } else {
            0.0
        },
        mean_dirty_pages: if n > 0 {
            v.iter().map(|x| x.1).sum::<f64>() / n as f64
        } else {
            0.0
        },
    })
}

/// Runs the experiment; the process's exit code.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    if !which("redis-server") || !which("redis-benchmark") {
        bail!("redis-server and redis-benchmark are needed: run scripts/setup.sh (installs Debian's redis-server and redis-tools)");
    }
    let version = Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut p = crate::report::progress(quiet);
    let mut runs = Vec::new();
    p("untracked (first)");
    runs.push(one_run(None, 0, a.requests)?);
    for b in &a.backends {
        for &i in &a.intervals {
            p(&format!("{b} every {i} s"));
            runs.push(one_run(Some(b), i, a.requests)?);
        }
    }
    p("untracked (last)");
    runs.push(one_run(None, 0, a.requests)?);
    eprintln!();
    let (base, nones) = baseline(&mut runs, |r| {
        (r.backend == "none", r.mean_rps, &mut r.ratio_to_none)
    });
    let report = Report {
        machine: crate::Machine::this(),
        redis_version: version,
        command: format!(
            "redis-benchmark -t set,get -n {} -r 100000 -d 1024 -c 50 --csv",
            a.requests
        ),
        runs,
        baseline_rps: base,
    };
    let mut summary = format!(
        "machine: {} ({} CPUs), Linux {}\n{}\nload: {}\nuntracked baseline: {:.0} req/s (mean of the first and last untracked runs: {})\n\n{:>10} {:>9} {:>10} {:>10} {:>10} {:>8} {:>6} {:>10} {:>12}\n",
        report.machine.cpu,
        report.machine.cpus,
        report.machine.kernel,
        report.redis_version,
        report.command,
        base,
        nones.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", "),
        "backend", "interval", "SET/s", "GET/s", "mean/s", "ratio", "colls", "collect ms", "dirty pages"
    );
    for r in &report.runs {
        summary.push_str(&format!(
            "{:>10} {:>8}s {:>10.0} {:>10.0} {:>10.0} {:>8.3} {:>6} {:>10.2} {:>12.0}\n",
            r.backend,
            r.interval_s,
            r.set_rps,
            r.get_rps,
            r.mean_rps,
            r.ratio_to_none,
            r.collections,
            r.mean_collect_ms,
            r.mean_dirty_pages
        ));
    }
    let mut series: Vec<Series> = a
        .backends
        .iter()
        .map(|b| Series {
            label: b.clone(),
            points: report
                .runs
                .iter()
                .filter(|r| &r.backend == b)
                .map(|r| (r.interval_s as f64, r.mean_rps))
                .collect(),
        })
        .collect();
    let (lo, hi) = (
        *a.intervals.iter().min().unwrap_or(&1) as f64,
        *a.intervals.iter().max().unwrap_or(&10) as f64,
    );
    series.push(Series {
        label: "untracked".into(),
        points: vec![(lo, base), (hi, base)],
    });
    let chart = Chart {
        title: "(d) redis-server under tracking: mean of SET and GET req/s".into(),
        x_label: "tracking interval (s)".into(),
        y_label: "requests/s".into(),
        log_x: false,
        log_y: false,
        series,
    };
    a.output
        .emit(&report, summary, vec![("redis.svg".into(), chart)])
}
