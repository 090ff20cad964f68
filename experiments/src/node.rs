//! `pagewise bench node`: the node agent's cost (`pagewise agent`) with N
//! podman containers watched, against the same agent watching none, in
//! the same run: its share of one CPU, the series it serves per container,
//! how soon `/healthz` and `/metrics` answer after it starts, how soon every
//! container's processes are watched, and whether SIGTERM put KSM's
//! settings back. Each container runs a small tenant (16 MiB, half of it the
//! same in every container, a few pages written every 10 ms). Goals: at
//! most 1 % of one CPU with 50 containers, at most 50 series per container,
//! metrics within 1 s of start-up.

use anyhow::{bail, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
/// The experiment's arguments.
pub struct Args {
    /// The full experiment (50 containers, 60 s watched, 3 repeats).
    #[arg(long)]
    full: bool,
    /// Containers watched (default 4, or 50 with --full).
    #[arg(long)]
    containers: Option<usize>,
    /// Seconds the agent's CPU time is measured over, once every
    /// container is watched (default 10, or 60 with --full).
    #[arg(long)]
    seconds: Option<u64>,
    /// Runs of each case (default 1, or 3 with --full).
    #[arg(long)]
    repeats: Option<usize>,
    #[command(flatten)]
    output: crate::report::Output,
}

/// The tenant each container runs.
const TENANT: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t len = 16 << 20, page = 4096;
    unsigned seed = argc > 1 ? (unsigned)atoi(argv[1]) : 1;
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    for (size_t p = 0; p < len / page; p++)
        memset(m + p * page, p < len / page / 2 ? (int)(p % 251) : (int)((p * 7 + seed) % 253), page);
    printf("ready\n");
    fflush(stdout);
    struct timespec t = {0, 10 * 1000 * 1000};
    for (unsigned long i = 0;; i++) {
        for (int k = 0; k < 4; k++)
            m[((i * 4 + k) * 2654435761u % (len / page)) * page + 8] ^= 1;
        nanosleep(&t, NULL);
    }
}
"#;

#[derive(Serialize)]
struct Run {
    /// Containers selected (0: the agent watching none).
    containers: usize,
    /// Processes the agent watched.
    processes: f64,
    /// The agent's CPU time over the measured seconds, % of one CPU.
    cpu_percent: f64,
    /// Series it served per container (the most of any container).
    series_per_container: usize,
    /// Every series in all.
    series: usize,
    /// From its start to the first `/healthz` and `/metrics` answer, ms.
    first_answer_ms: f64,
    /// From its start until every container's processes were watched, ms.
    all_watched_ms: f64,
    /// KSM's `run` as before the agent, after its SIGTERM.
    settings_put_back: bool,
}

#[derive(Serialize)]
struct Summary {
    containers: usize,
    /// Median, lowest and highest of the runs.
    cpu_percent: (f64, f64, f64),
    first_answer_ms: (f64, f64, f64),
    all_watched_ms: (f64, f64, f64),
    series_per_container: usize,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    seconds: u64,
    runs: Vec<Run>,
    cases: Vec<Summary>,
}

/// The tenant, compiled into `dir`.
fn tenant(dir: &Path) -> Result<()> {
    crate::compile_c(dir, "tenant", TENANT, &["-O"])?;
    Ok(())
}

/// The containers, running the tenant; removed when dropped.
struct Tenants {
    names: Vec<String>,
    pipes: Vec<pagewise_testkit::Piped>,
}

impl Drop for Tenants {
    fn drop(&mut self) {
        for n in &self.names {
            drop(pagewise_testkit::container::Removed(n.clone()));
        }
        self.pipes.clear();
    }
}

fn start_tenants(n: usize, dir: &Path, bar: &mut dyn FnMut(&str)) -> Result<Tenants> {
    let mut t = Tenants {
        names: Vec::new(),
        pipes: Vec::new(),
    };
    for i in 0..n {
        bar(&format!("starting container {} of {n}", i + 1));
        let name = format!("pagewise-bench-node-{}-{i}", std::process::id());
        t.names.push(name.clone());
        let seed = (i + 1).to_string();
        let mut c =
            pagewise_testkit::container::podman_run(dir, &name, dir, &[], "/t/tenant", &[&seed]);
        let mut p = pagewise_testkit::Piped::start(&mut c);
        let l = p.line();
        if l != "ready" {
            bail!("container {name} said {l:?}");
        }
        t.pipes.push(p);
    }
    Ok(t)
}

/// One run of the agent over `containers` of the tenants (0: none).
fn one(containers: usize, seconds: u64, dir: &Path) -> Result<Run> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let select = match containers {
        0 => "[[select]]\ncontainer = \"no-container-has-this-name\"\n".to_string(),
        _ => "[[select]]\nall_containers = true\nhuge_pages = 8\n".to_string(),
    };
    let cfg = dir.join(format!("agent-{port}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "interval_ms = 2000\nwindow_ms = 200\nlisten = \"127.0.0.1:{port}\"\n\
             [thp]\nwalk_ns = 30.0\n{select}"
        ),
    )?;
    let ksm_run = std::fs::read_to_string("/sys/kernel/mm/ksm/run").unwrap_or_default();
    let t0 = Instant::now();
    let mut agent: Child = Command::new(crate::pagewise_tool()?)
        .args(["agent", "--config"])
        .arg(&cfg)
        .stderr(Stdio::null())
        .spawn()?;
    let pid = agent.id() as i32;
    let r = measure(port, pid, containers, seconds, t0);
    let _ = pagewise_sys::process::kill(pid, libc::SIGTERM);
    let st = agent.wait()?;
    let _ = std::fs::remove_file(&cfg);
    let mut run = r?;
    run.settings_put_back = st.code() == Some(143)
        && std::fs::read_to_string("/sys/kernel/mm/ksm/run").unwrap_or_default() == ksm_run;
    Ok(run)
}

fn measure(port: u16, pid: i32, containers: usize, seconds: u64, t0: Instant) -> Result<Run> {
    let deadline = t0 + Duration::from_secs(30);
    while pagewise_testkit::http_get(port, "/healthz").is_none()
        || pagewise_testkit::http_get(port, "/metrics").is_none()
    {
        if Instant::now() > deadline {
            bail!("the agent never answered");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let first_answer_ms = t0.elapsed().as_secs_f64() * 1e3;
    // Every container watched (the tenant is one process in each).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = pagewise_testkit::http_get(port, "/metrics").unwrap_or_default();
        let watched =
            pagewise_testkit::metric_value(&text, "pagewise_node_containers").unwrap_or(0.0);
        if watched as usize >= containers
            && pagewise_testkit::metric_value(&text, "pagewise_node_steps_total") >= Some(1.0)
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("{watched} of {containers} containers watched after 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let all_watched_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cpu0 = pagewise_testkit::host::cpu_time(pid)?;
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let cpu = pagewise_testkit::host::cpu_time(pid)? - cpu0;
    let cpu_percent = cpu.as_secs_f64() / w0.elapsed().as_secs_f64() * 100.0;
    let text = pagewise_testkit::http_get(port, "/metrics").unwrap_or_default();
    let mut per = std::collections::BTreeMap::new();
    let mut series = 0;
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        series += 1;
        if let Some(c) = l.split("container=\"").nth(1) {
            *per.entry(c.chars().take(12).collect::<String>())
                .or_insert(0usize) += 1;
        }
    }
    Ok(Run {
        containers,
        processes: pagewise_testkit::metric_value(&text, "pagewise_node_processes").unwrap_or(0.0),
        cpu_percent,
        series_per_container: per.values().copied().max().unwrap_or(0),
        series,
        first_answer_ms,
        all_watched_ms,
        settings_put_back: false,
    })
}

/// Runs the experiment; the exit code.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    if let Some(why) = pagewise_testkit::container::podman_missing() {
        bail!("{why}");
    }
    let n = a.containers.unwrap_or(if a.full { 50 } else { 4 });
    let seconds = a.seconds.unwrap_or(if a.full { 60 } else { 10 });
    let repeats = a.repeats.unwrap_or(if a.full { 3 } else { 1 }).max(1);
    let mut bar = crate::report::progress(quiet);
    let dir: PathBuf = std::env::temp_dir().join(format!("pw-bench-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    tenant(&dir)?;
    let tenants = start_tenants(n, &dir, &mut bar)?;
    let mut runs = Vec::new();
    for r in 0..repeats {
        for c in [0, n] {
            bar(&format!(
                "run {} of {repeats}: the agent over {c} containers",
                r + 1
            ));
            runs.push(one(c, seconds, &dir)?);
        }
    }
    drop(tenants);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!();
    let mut cases = Vec::new();
    for c in [0, n] {
        let of = |f: fn(&Run) -> f64| {
            crate::median_min_max(runs.iter().filter(|r| r.containers == c).map(f).collect())
        };
        cases.push(Summary {
            containers: c,
            cpu_percent: of(|r| r.cpu_percent),
            first_answer_ms: of(|r| r.first_answer_ms),
            all_watched_ms: of(|r| r.all_watched_ms),
            series_per_container: runs
                .iter()
                .filter(|r| r.containers == c)
                .map(|r| r.series_per_container)
                .max()
                .unwrap_or(0),
        });
    }
    let machine = crate::Machine::this().to_string();
    let mut summary = format!(
        "pagewise bench node — {machine}\nthe node agent (2 s steps, 200 ms windows) over N podman containers, each a 16 MiB tenant; CPU over {seconds} s once all are watched; median (min-max) of {repeats}\n\n{:>10} {:>22} {:>22} {:>22} {:>12}\n",
        "containers", "CPU % of one", "first answer ms", "all watched ms", "series/ctr"
    );
    let f = |(m, lo, hi): (f64, f64, f64), p: usize| format!("{m:.*} ({lo:.*}-{hi:.*})", p, p, p);
    for s in &cases {
        summary += &format!(
            "{:>10} {:>22} {:>22} {:>22} {:>12}\n",
            s.containers,
            f(s.cpu_percent, 2),
            f(s.first_answer_ms, 0),
            f(s.all_watched_ms, 0),
            s.series_per_container
        );
    }
    let put_back = runs.iter().all(|r| r.settings_put_back);
    summary += &format!(
        "\ngoals: at most 1 % of one CPU with 50 containers, at most 50 series per container, metrics within 1 s of start-up; SIGTERM put KSM's settings back in every run: {}\n",
        if put_back { "yes" } else { "NO" }
    );
    let report = Report {
        machine,
        seconds,
        runs,
        cases,
    };
    let rc = a.output.emit(&report, summary, Vec::new())?;
    if !put_back {
        bail!("a run did not put KSM's settings back after SIGTERM");
    }
    Ok(rc)
}
