//! `pagewise bench farmem-redis` and `farmem-memcached`: DiME's experiments
//! (d) and (e) on a real server run by `pagewise farmem run` on loopback:
//! `redis-server` loaded by `redis-benchmark`, or `memcached` loaded by
//! `memaslap` (Debian's libmemcached-tools calls it `memcaslap`).
//!
//! Every run: start the server (emulated or not), load the data set with
//! distinct values through a client of our own (keys `key:%012d`, the
//! names redis-benchmark's `-r` asks for), drive the load generator
//! (Redis: GETs over the whole key space; Memcached: memaslap's 90 % get,
//! 10 % set over keys of its own), then read back a sample of our keys and
//! check every value byte for byte. A wrong or missing value fails the
//! benchmark.
//!
//! (d) GET throughput against the local budget (percent of the pages
//! holding data) and against latency (DiME's Figures 5.2 and 5.3);
//! (e) isolation (DiME's Table 5.4): one emulated Redis alone; two in
//! separate instances; two sharing one instance (its budget, a percentage
//! of both data sets, is twice one's); one emulated beside one that is not.

mod report;
mod server;

use crate::redis::{
    free_port, redis_args, redis_benchmark, wait_ready_within, which, Server as RedisServer,
};
use anyhow::{bail, Context, Result};
use pagewise_testkit::host::{MemoryCgroup, ZramSwap};
use pagewise_testkit::servers::{fill, memcached_args, verify, Kv};
use serde::Serialize;
use server::*;
use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(clap::Args)]
/// The experiment's arguments.
pub struct Args {
    /// The full experiment (more keys, requests and points; a few minutes).
    #[arg(long)]
    full: bool,
    /// Which thread serves the emulated server's faults (Redis or Memcached).
    #[arg(long, default_value = "inline")]
    fault_path: pagewise_farmem::FaultPath,
    #[command(flatten)]
    output: crate::report::Output,
}

struct Scale {
    app: App,
    /// The data set, bytes: the largest resident set of a server not
    /// emulated (the system-wide emulator's limits are percentages of it).
    data_bytes: std::sync::atomic::AtomicU64,
    /// Runs per point; the point is the run with the median throughput.
    repeats: usize,
    keys: u64,
    value_bytes: usize,
    requests: u64,
    percents: Vec<u64>,
    latencies: Vec<u64>,
    fixed_latency: u64,
    fixed_percent: u64,
}

/// How a Redis runs.
#[derive(Clone, Debug, Serialize)]
struct Emulation {
    instance: String,
    local_percent: u64,
    latency_ns: u64,
    fault_path: pagewise_farmem::FaultPath,
    /// The system-wide emulator instead of pagewise: the server in a memory
    /// cgroup limited to `local_percent` of the data set (two servers of the
    /// same `instance` share one group, with twice the limit), swapping to
    /// zram; no delay is injected (see the module docs).
    system: bool,
}

/// The server under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum App {
    /// `redis-server`, loaded by `redis-benchmark` (GET).
    Redis,
    /// `memcached`, loaded by `memaslap` (90 % get, 10 % set).
    Memcached,
}

impl App {
    /// How its clients speak to it.
    fn kv(self) -> Kv {
        match self {
            App::Redis => Kv::Redis,
            App::Memcached => Kv::Memcached,
        }
    }

    fn name(self) -> &'static str {
        self.kv().name()
    }

    /// What its throughput counts.
    fn unit(self) -> &'static str {
        match self {
            App::Redis => "GET/s",
            App::Memcached => "ops/s",
        }
    }

    /// The server's command line on `port`.
    fn server(self, port: u16) -> (String, Vec<String>) {
        match self {
            App::Redis => ("redis-server".into(), redis_args(port)),
            App::Memcached => ("memcached".into(), memcached_args(port)),
        }
    }

    /// The programs it needs, and how to get them.
    fn check_installed(self) -> Result<()> {
        match self {
            App::Redis if !which("redis-server") || !which("redis-benchmark") => bail!(
                "redis-server and redis-benchmark are needed: run scripts/setup.sh (installs Debian's redis-server and redis-tools)"
            ),
            App::Memcached if !which("memcached") || memaslap().is_none() => bail!(
                "memcached and memaslap are needed: run scripts/setup.sh (installs Debian's memcached and libmemcached-tools)"
            ),
            _ => Ok(()),
        }
    }

    fn load(self, port: u16, keys: u64, requests: u64, len: usize) -> Result<f64> {
        match self {
            App::Redis => get_rps(port, keys, requests),
            App::Memcached => mc_load(port, requests, len),
        }
    }
}

#[derive(Serialize)]
struct Report {
    machine: crate::Machine,
    app: App,
    server_version: String,
    command: String,
    fault_path: pagewise_farmem::FaultPath,
    keys: u64,
    value_bytes: usize,
    requests: u64,
    baseline_get_rps: f64,
    overhead: Vec<Point>,
    /// The data set (the largest resident set not emulated), bytes.
    data_bytes: u64,
    /// pagewise at latency 0, against local memory (beside `system`).
    local_0: Vec<Point>,
    /// The system-wide emulator against local memory.
    system: Vec<Point>,
    system_isolation: Vec<Point>,
    /// Why the system-wide emulator did not run, if it did not.
    system_unavailable: Option<String>,
    by_local: Vec<Point>,
    by_latency: Vec<Point>,
    isolation: Vec<Point>,
    falls_with_less_local: bool,
    falls_with_more_latency: bool,
}

/// Whether `ys` never rises by more than `tol` (relative) from one point to
/// the next: "falls steadily" within noise.
fn falls(ys: &[f64], tol: f64) -> bool {
    ys.windows(2).all(|w| w[1] <= w[0] * (1.0 + tol))
}

/// Runs the experiment; the process's exit code.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    run_app(App::Redis, a, quiet)
}

impl Scale {
    /// The points of the experiment, short or `full`.
    fn new(app: App, full: bool) -> Scale {
        if full {
            Scale {
                app,
                data_bytes: Default::default(),
                repeats: 3,
                keys: 40_000,
                value_bytes: 1024,
                requests: 100_000,
                percents: vec![100, 75, 50, 25, 10],
                latencies: vec![0, 10_000, 25_000, 50_000, 100_000],
                // Well above this VM's floor, so that a miss costs what the
                // link says rather than what waking a thread happens to cost.
                fixed_latency: 25_000,
                fixed_percent: 50,
            }
        } else {
            Scale {
                app,
                data_bytes: Default::default(),
                repeats: 1,
                keys: 5_000,
                value_bytes: 1024,
                requests: 5_000,
                percents: vec![100, 50, 10],
                latencies: vec![0, 25_000],
                fixed_latency: 25_000,
                fixed_percent: 50,
            }
        }
    }
}

/// One run of the experiment: its scale, scratch directory and fault path.
struct Experiment<'a> {
    s: &'a Scale,
    tmp: &'a std::path::Path,
    fault_path: pagewise_farmem::FaultPath,
}

/// The system-wide emulator's points and pagewise's at latency 0 beside
/// them, or why it did not run.
#[derive(Default)]
struct SystemWide {
    local_0: Vec<Point>,
    system: Vec<Point>,
    isolation: Vec<Point>,
    unavailable: Option<String>,
}

impl Experiment<'_> {
    /// A server emulated by pagewise in instance `name`: `p` % local, `l` ns.
    fn em(&self, name: &str, p: u64, l: u64) -> Option<Emulation> {
        Some(Emulation {
            instance: format!("bench-{}-{name}", std::process::id()),
            local_percent: p,
            latency_ns: l,
            fault_path: self.fault_path,
            system: false,
        })
    }

    /// A server under the system-wide emulator: a cgroup limited to `p` %
    /// of the data set, swapping to zram.
    fn sys(&self, name: &str, p: u64) -> Option<Emulation> {
        Some(Emulation {
            instance: format!("sys-{name}"),
            local_percent: p,
            latency_ns: 0,
            fault_path: self.fault_path,
            system: true,
        })
    }

    /// The servers `ems` side by side, each its points.
    fn together(&self, series: &str, ems: &[Option<Emulation>]) -> Result<Vec<Point>> {
        run_together(series, ems, self.s, self.tmp)
    }

    /// (d): throughput against local memory, then against latency.
    fn by_local_and_latency(
        &self,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(Vec<Point>, Vec<Point>)> {
        let s = self.s;
        let mut by_local = Vec::new();
        for &p in &s.percents {
            progress(&format!("(d) local {p} % at {} ns", s.fixed_latency));
            let em = self.em(&format!("p{p}"), p, s.fixed_latency);
            by_local.extend(self.together("local", &[em])?);
        }
        let mut by_latency = Vec::new();
        for &l in &s.latencies {
            progress(&format!(
                "(d) latency {l} ns at {} % local",
                s.fixed_percent
            ));
            let em = self.em(&format!("l{l}"), s.fixed_percent, l);
            by_latency.extend(self.together("latency", &[em])?);
        }
        Ok((by_local, by_latency))
    }

    /// (e): one alone, two in separate instances, two sharing one, two not
    /// emulated, one beside one not.
    fn isolation(&self, progress: &mut dyn FnMut(&str)) -> Result<Vec<Point>> {
        let (fp, fl) = (self.s.fixed_percent, self.s.fixed_latency);
        let mut out = Vec::new();
        progress("(e) alone");
        out.extend(self.together("alone", &[self.em("alone", fp, fl)])?);
        progress("(e) two in separate instances");
        let two = [self.em("sep-a", fp, fl), self.em("sep-b", fp, fl)];
        out.extend(self.together("separate", &two)?);
        progress("(e) two sharing one instance");
        let two = [self.em("shared", fp, fl), self.em("shared", fp, fl)];
        out.extend(self.together("shared", &two)?);
        progress("(e) control: two not emulated, side by side");
        out.extend(self.together("two-plain", &[None, None])?);
        progress("(e) one emulated beside one not");
        out.extend(self.together("beside", &[self.em("beside", fp, fl), None])?);
        Ok(out)
    }

    /// DiME's comparison with a system-wide emulator (Gao et al., OSDI'16,
    /// which delays the kernel's own paging): the closest this kernel has
    /// is Linux swapping to zram inside a memory cgroup of the same local
    /// memory. Nothing here can delay a swap-in (no dm-delay, no loadable
    /// modules; zram has no latency setting; blk-throttle caps rates
    /// only), so both sides run at latency 0: zram's own cost against
    /// pagewise's floor.
    fn system_wide(&self, progress: &mut dyn FnMut(&str), full: bool) -> Result<SystemWide> {
        let s = self.s;
        let fp = s.fixed_percent;
        let mut out = SystemWide::default();
        for &p in &s.percents {
            progress(&format!("(d) pagewise, local {p} % at 0 ns"));
            let em = self.em(&format!("z{p}"), p, 0);
            out.local_0.extend(self.together("local-0", &[em])?);
        }
        let bytes = s.data_bytes.load(std::sync::atomic::Ordering::Relaxed);
        let _zram = match ZramSwap::setup((bytes * 4).max(1 << 30)) {
            Err(e) => {
                out.unavailable = Some(e.to_string());
                return Ok(out);
            }
            Ok(z) => z,
        };
        for &p in &s.percents {
            progress(&format!("(d) system-wide: cgroup at {p} %, zram swap"));
            let sys = self.sys(&format!("p{p}"), p);
            out.system.extend(self.together("system", &[sys])?);
        }
        if full {
            progress("(e) system-wide: two sharing one cgroup");
            let two = [self.sys("shared", fp), self.sys("shared", fp)];
            out.isolation.extend(self.together("system-shared", &two)?);
            progress("(e) system-wide: two in separate cgroups");
            let two = [self.sys("sep-a", fp), self.sys("sep-b", fp)];
            out.isolation
                .extend(self.together("system-separate", &two)?);
            progress("(e) system-wide: one beside one not limited");
            let two = [self.sys("beside", fp), None];
            out.isolation.extend(self.together("system-beside", &two)?);
        }
        Ok(out)
    }
}

/// Runs the experiment on `app`; the process's exit code.
pub fn run_app(app: App, a: Args, quiet: bool) -> Result<i32> {
    app.check_installed()?;
    let s = Scale::new(app, a.full);
    let tmp = std::env::temp_dir().join(format!("pagewise-farmem-redis-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let mut progress = crate::report::progress(quiet);
    let ex = Experiment {
        s: &s,
        tmp: &tmp,
        fault_path: a.fault_path,
    };
    progress(&format!("baseline: {} alone, not emulated", app.name()));
    let base = ex.together("baseline", &[None])?;
    let baseline = base[0].get_rps;
    // What emulation itself costs: everything local, latency 0 (a first
    // touch still faults, at the floor's cost).
    progress("(d) overhead: local 100 % at 0 ns");
    let overhead = ex.together("overhead", &[ex.em("overhead", 100, 0)])?;
    let (by_local, by_latency) = ex.by_local_and_latency(&mut progress)?;
    let isolation = if a.full {
        ex.isolation(&mut progress)?
    } else {
        Vec::new()
    };
    let sw = ex.system_wide(&mut progress, a.full)?;
    let _ = std::fs::remove_dir_all(&tmp);
    let version = Command::new(app.server(0).0)
        .arg(if app == App::Redis { "--version" } else { "-V" })
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let ys = |v: &[Point]| v.iter().map(|p| p.get_rps).collect::<Vec<_>>();
    let report = Report {
        machine: crate::Machine::this(),
        app,
        server_version: version,
        command: format!(
            "pagewise bench farmem-{}{} --fault-path {}",
            app.name(),
            if a.full { " --full" } else { "" },
            a.fault_path
        ),
        fault_path: a.fault_path,
        keys: s.keys,
        value_bytes: s.value_bytes,
        requests: s.requests,
        baseline_get_rps: baseline,
        falls_with_less_local: falls(&ys(&by_local), 0.10),
        falls_with_more_latency: falls(&ys(&by_latency), 0.10),
        overhead,
        data_bytes: s.data_bytes.load(std::sync::atomic::Ordering::Relaxed),
        local_0: sw.local_0,
        system: sw.system,
        system_isolation: sw.isolation,
        system_unavailable: sw.unavailable,
        by_local,
        by_latency,
        isolation,
    };
    let text = report.summary(s.repeats)?;
    let charts = report.charts(s.fixed_percent, s.fixed_latency);
    a.output.emit(&report, text, charts)
}
