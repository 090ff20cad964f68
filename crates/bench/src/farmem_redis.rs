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

use crate::redis::{
    bulk, free_port, redis_benchmark, reply, server_args, value, wait_ready_within, which,
    Server as RedisServer,
};
use crate::svg::{Chart, Series};
use anyhow::{bail, Context, Result};
use pagewise::mech::cgroup::{MemoryCgroup, ZramSwap};
use serde::Serialize;
use std::io::{BufReader, Write};
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
    fault_path: pagewise::farmem::FaultPath,
    #[command(flatten)]
    output: crate::cli::Output,
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
    fault_path: pagewise::farmem::FaultPath,
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
    fn name(self) -> &'static str {
        match self {
            App::Redis => "redis",
            App::Memcached => "memcached",
        }
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
            App::Redis => ("redis-server".into(), server_args(port)),
            App::Memcached => {
                let mut a: Vec<String> = [
                    "-l",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-U",
                    "0",
                    "-m",
                    "1024",
                    "-t",
                    "4",
                    "-A",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if pagewise_sys::process::geteuid() == 0 {
                    // memcached refuses to run as root unless told whom to be.
                    a.extend(["-u".to_string(), "root".to_string()]);
                }
                ("memcached".into(), a)
            }
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

    /// Appends a request storing key `k` with its value.
    fn put(self, buf: &mut Vec<u8>, k: u64, len: usize) {
        match self {
            App::Redis => {
                buf.extend_from_slice(b"*3\r\n");
                bulk(buf, b"SET");
                bulk(buf, key(k).as_bytes());
                bulk(buf, &value(k, len));
            }
            App::Memcached => {
                buf.extend_from_slice(format!("set {} 0 0 {len}\r\n", key(k)).as_bytes());
                buf.extend_from_slice(&value(k, len));
                buf.extend_from_slice(b"\r\n");
            }
        }
    }

    /// Reads the answer to one [`App::put`].
    fn stored(self, r: &mut BufReader<TcpStream>) -> Result<()> {
        match self {
            App::Redis => {
                if reply(r)?.as_deref() != Some(b"OK") {
                    bail!("SET failed");
                }
            }
            App::Memcached => {
                let mut line = String::new();
                std::io::BufRead::read_line(r, &mut line)?;
                if line != "STORED\r\n" {
                    bail!("memcached answered {line:?} to a set");
                }
            }
        }
        Ok(())
    }

    /// Appends a request reading key `k`.
    fn get(self, buf: &mut Vec<u8>, k: u64) {
        match self {
            App::Redis => {
                buf.extend_from_slice(b"*2\r\n");
                bulk(buf, b"GET");
                bulk(buf, key(k).as_bytes());
            }
            App::Memcached => buf.extend_from_slice(format!("get {}\r\n", key(k)).as_bytes()),
        }
    }

    /// Reads the answer to one [`App::get`]: the value, `None` when the
    /// key is missing.
    fn got(self, r: &mut BufReader<TcpStream>) -> Result<Option<Vec<u8>>> {
        use std::io::{BufRead, Read};
        if self == App::Redis {
            return reply(r);
        }
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line == "END\r\n" {
            return Ok(None);
        }
        let n: usize = line
            .split_whitespace()
            .nth(3)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("memcached answered {line:?} to a get"))?;
        let mut v = vec![0u8; n + 2];
        r.read_exact(&mut v)?;
        v.truncate(n);
        line.clear();
        r.read_line(&mut line)?;
        if line != "END\r\n" {
            bail!("memcached answered {line:?} after a value");
        }
        Ok(Some(v))
    }
}

/// memaslap, under the name this system gives it.
fn memaslap() -> Option<&'static str> {
    ["memcaslap", "memaslap"].into_iter().find(|c| which(c))
}

/// Operations/s of `requests` memaslap operations (90 % get, 10 % set,
/// values of `len` bytes, 2 threads, 16 connections, a window of 2000 keys
/// each).
fn mc_load(port: u16, requests: u64, len: usize) -> Result<f64> {
    let bin = memaslap().context("memaslap is not installed")?;
    let out = Command::new(bin)
        .args([
            "-s",
            &format!("127.0.0.1:{port}"),
            "-T",
            "2",
            "-c",
            "16",
            "-w",
            "2k",
        ])
        .args(["-x", &requests.to_string(), "-X", &len.to_string()])
        .output()
        .with_context(|| format!("running {bin}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.split("TPS: ").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
        .with_context(|| format!("{bin} printed no TPS: {text}"))
}

/// The major faults (page-ins: swap-ins from zram) and resident set of
/// process `pid` (`/proc/PID/stat`, `smaps_rollup`).
fn faults_and_rss(pid: i32) -> (u64, u64) {
    let majflt = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| {
            let after = t.rsplit_once(')')?.1.to_string();
            after.split_whitespace().nth(9)?.parse().ok()
        })
        .unwrap_or(0);
    let rss = pagewise::mech::procfs::resident(pid).map_or(0, |r| r.rss_kib);
    (majflt, rss)
}

/// A server (emulated or not) and where its far-memory statistics go.
struct Server {
    redis: RedisServer,
    app: App,
    stats: Option<PathBuf>,
}

impl Server {
    fn start(
        app: App,
        em: Option<&Emulation>,
        stats: Option<PathBuf>,
        cg: Option<&MemoryCgroup>,
    ) -> Result<Server> {
        let port = free_port()?;
        let (prog, args) = app.server(port);
        let mut c = match em {
            None => {
                let mut c = Command::new(&prog);
                c.args(&args);
                c
            }
            Some(e) if e.system => {
                let mut c = Command::new(&prog);
                c.args(&args);
                crate::thp_redis::join_cgroup_at_exec(
                    &mut c,
                    cg.context("a system-wide emulation without its cgroup")?,
                )?;
                c
            }
            Some(e) => {
                let mut c = Command::new(crate::pagewise_tool()?);
                c.args(["farmem", "run", "--instance", &e.instance]);
                c.args([
                    "--local-percent",
                    &e.local_percent.to_string(),
                    "--latency-ns",
                    &e.latency_ns.to_string(),
                    "--fault-path",
                    &e.fault_path.to_string(),
                ]);
                if let Some(s) = &stats {
                    c.arg("--stats-json").arg(s);
                }
                c.arg("--").arg(&prog).args(&args);
                c
            }
        };
        // A process group of its own: if it must be killed, redis-server
        // under `farmem run` goes with it.
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        let child = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {prog}"))?;
        let s = Server {
            redis: RedisServer { child, port },
            app,
            stats,
        };
        // Emulated with a tenth of its memory local, it can take a while.
        wait_ready_within(port, std::time::Duration::from_secs(60))?;
        Ok(s)
    }

    /// Shuts the server down and returns its far-memory statistics.
    fn stop(mut self) -> Result<Option<serde_json::Value>> {
        if self.app == App::Memcached {
            // Its own shutdown (`-A`): the process exits, and `farmem run`
            // writes its statistics.
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.redis.port)) {
                let _ = s.write_all(b"shutdown\r\n");
            }
            pagewise::mech::child::wait_or_kill(
                &mut self.redis.child,
                std::time::Duration::from_secs(10),
            );
        }
        self.redis.shutdown();
        match &self.stats {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                Ok(Some(serde_json::from_str(&text)?))
            }
            None => Ok(None),
        }
    }
}

fn key(i: u64) -> String {
    format!("key:{i:012}")
}

/// Stores keys `0..keys` with their values, pipelined in batches.
pub fn fill(app: App, port: u16, keys: u64, len: usize) -> Result<()> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut i = 0;
    while i < keys {
        let n = (keys - i).min(256);
        let mut buf = Vec::new();
        for k in i..i + n {
            app.put(&mut buf, k, len);
        }
        w.write_all(&buf)?;
        for _ in 0..n {
            app.stored(&mut r)?;
        }
        i += n;
    }
    Ok(())
}

/// Reads back every `keys/samples`-th key: all must hold their value.
pub fn verify(app: App, port: u16, keys: u64, len: usize, samples: u64) -> Result<u64> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let step = (keys / samples).max(1);
    let mut checked = 0;
    let mut k = 0;
    while k < keys {
        let mut buf = Vec::new();
        app.get(&mut buf, k);
        w.write_all(&buf)?;
        match app.got(&mut r)? {
            Some(v) if v == value(k, len) => checked += 1,
            Some(_) => bail!("{} returned a wrong value for {}", app.name(), key(k)),
            None => bail!("{} lost {}", app.name(), key(k)),
        }
        k += step;
    }
    Ok(checked)
}

/// GET requests/s over the key space, by redis-benchmark.
fn get_rps(port: u16, keys: u64, requests: u64) -> Result<f64> {
    let (n, r) = (requests.to_string(), keys.to_string());
    let rps = redis_benchmark(
        port,
        &["-t", "get", "-n", &n, "-r", &r, "-c", "10"],
        &["GET"],
    )?;
    Ok(rps[0])
}

#[derive(Serialize, Clone)]
struct Point {
    /// Which experiment and series.
    series: String,
    local_percent: Option<u64>,
    latency_ns: Option<u64>,
    get_rps: f64,
    verified_keys: u64,
    page_fault_count: u64,
    remote_fetches: u64,
    evictions: u64,
    writebacks: u64,
    injected_delay_ns: u64,
    data_pages: u64,
    /// The server's major faults (the system-wide emulator's swap-ins).
    major_faults: u64,
    /// The server's resident set at the end, KiB (not under pagewise).
    rss_kib: u64,
    /// Killed by its memory cgroup's OOM killer (the system-wide
    /// emulator): no throughput, nothing verified.
    oom_killed: bool,
}

/// The memory cgroup of system-wide emulation `e`, made for this run when
/// it is the first server of its group: limited to `e.local_percent` of
/// the data set for each server of `servers` in the group.
fn system_group<'g>(
    groups: &'g mut Vec<(String, MemoryCgroup)>,
    e: &Emulation,
    s: &Scale,
    servers: &[Option<Emulation>],
) -> Result<&'g MemoryCgroup> {
    if let Some(i) = groups.iter().position(|(n, _)| *n == e.instance) {
        return Ok(&groups[i].1);
    }
    let members = servers
        .iter()
        .flatten()
        .filter(|o| o.system && o.instance == e.instance)
        .count() as u64;
    let data = s.data_bytes.load(std::sync::atomic::Ordering::Relaxed);
    if data == 0 {
        bail!("the data set's size is not known yet (the baseline runs first)");
    }
    let limit = (data * e.local_percent / 100 * members).max(4 << 20);
    let cg = MemoryCgroup::create(
        &format!("pagewise-farmem-{}-{}", e.instance, std::process::id()),
        limit,
    )?;
    groups.push((e.instance.clone(), cg));
    Ok(&groups.last().expect("just pushed").1)
}

/// [`run_once`] `s.repeats` times; for each server the run with the median
/// throughput.
fn run_together(
    label: &str,
    servers: &[Option<Emulation>],
    s: &Scale,
    dir: &std::path::Path,
) -> Result<Vec<Point>> {
    let mut runs = Vec::new();
    for _ in 0..s.repeats {
        runs.push(run_once(label, servers, s, dir)?);
    }
    let mut out = Vec::new();
    for i in 0..servers.len() {
        let mut col: Vec<Point> = runs.iter().map(|r| r[i].clone()).collect();
        col.sort_by(|a, b| a.get_rps.total_cmp(&b.get_rps));
        out.push(col[col.len() / 2].clone());
    }
    Ok(out)
}

/// Runs `servers` at once (each: its emulation or none), fills and loads
/// them concurrently, verifies them; one point per server.
fn run_once(
    label: &str,
    servers: &[Option<Emulation>],
    s: &Scale,
    dir: &std::path::Path,
) -> Result<Vec<Point>> {
    let mut groups: Vec<(String, MemoryCgroup)> = Vec::new();
    let mut started = Vec::new();
    for (i, em) in servers.iter().enumerate() {
        let stats = em
            .as_ref()
            .filter(|e| !e.system)
            .map(|_| dir.join(format!("stats-{}-{i}.json", std::process::id())));
        if let Some(p) = &stats {
            let _ = std::fs::remove_file(p);
        }
        let cg = match em {
            Some(e) if e.system => Some(system_group(&mut groups, e, s, servers)?),
            _ => None,
        };
        started.push(Server::start(s.app, em.as_ref(), stats, cg)?);
    }
    let results: Vec<Result<(f64, u64)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = started
            .iter()
            .map(|srv| {
                let port = srv.redis.port;
                sc.spawn(move || -> Result<(f64, u64)> {
                    fill(s.app, port, s.keys, s.value_bytes)?;
                    let rps = s.app.load(port, s.keys, s.requests, s.value_bytes)?;
                    let ok = verify(s.app, port, s.keys, s.value_bytes, 200)?;
                    Ok((rps, ok))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| bail!("load thread panicked")))
            .collect()
    });
    let mut out = Vec::new();
    for ((srv, em), r) in started.into_iter().zip(servers).zip(results) {
        // A server the system-wide emulator's cgroup killed for want of
        // memory is a result, not a failure of the benchmark.
        let oom = em.as_ref().filter(|e| e.system).map_or(0, |e| {
            groups
                .iter()
                .find(|(n, _)| *n == e.instance)
                .map_or(0, |(_, g)| g.oom_kills())
        });
        let (rps, ok) = match r {
            Ok(v) => v,
            Err(_) if oom > 0 => (0.0, 0),
            Err(e) => return Err(e),
        };
        // The server itself: the child, unless pagewise runs it.
        let (major_faults, rss_kib) = match em {
            Some(e) if !e.system => (0, 0),
            _ => faults_and_rss(srv.redis.child.id() as i32),
        };
        if em.is_none() {
            s.data_bytes
                .fetch_max(rss_kib << 10, std::sync::atomic::Ordering::Relaxed);
        }
        let st = if oom > 0 { None } else { srv.stop()? };
        let g = |k: &str| st.as_ref().and_then(|v| v[k].as_u64()).unwrap_or(0);
        out.push(Point {
            series: label.to_string(),
            local_percent: em.as_ref().map(|e| e.local_percent),
            latency_ns: em.as_ref().map(|e| e.latency_ns),
            get_rps: rps,
            verified_keys: ok,
            page_fault_count: g("page_fault_count"),
            remote_fetches: g("remote_fetches"),
            evictions: g("evictions"),
            writebacks: g("writebacks"),
            injected_delay_ns: g("injected_delay_ns"),
            data_pages: g("data_pages"),
            major_faults,
            rss_kib,
            oom_killed: oom > 0,
        });
    }
    Ok(out)
}

#[derive(Serialize)]
struct Report {
    machine: crate::Machine,
    app: App,
    server_version: String,
    command: String,
    fault_path: pagewise::farmem::FaultPath,
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

/// Runs the experiment on `app`; the process's exit code.
pub fn run_app(app: App, a: Args, quiet: bool) -> Result<i32> {
    app.check_installed()?;
    let s = if a.full {
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
    };
    let tmp = std::env::temp_dir().join(format!("pagewise-farmem-redis-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let mut progress = crate::cli::progress(quiet);
    let me = std::process::id();
    let em = |name: &str, p: u64, l: u64| {
        Some(Emulation {
            instance: format!("bench-{me}-{name}"),
            local_percent: p,
            latency_ns: l,
            fault_path: a.fault_path,
            system: false,
        })
    };
    // The system-wide emulator: a cgroup limited to p % of the data set,
    // swapping to zram.
    let sys = |name: &str, p: u64| {
        Some(Emulation {
            instance: format!("sys-{name}"),
            local_percent: p,
            latency_ns: 0,
            fault_path: a.fault_path,
            system: true,
        })
    };
    progress(&format!("baseline: {} alone, not emulated", app.name()));
    let base = run_together("baseline", &[None], &s, &tmp)?;
    let baseline = base[0].get_rps;
    // What emulation itself costs: everything local, latency 0 (a first
    // touch still faults, at the floor's cost).
    progress("(d) overhead: local 100 % at 0 ns");
    let overhead = run_together("overhead", &[em("overhead", 100, 0)], &s, &tmp)?;
    let mut by_local = Vec::new();
    for &p in &s.percents {
        progress(&format!("(d) local {p} % at {} ns", s.fixed_latency));
        by_local.extend(run_together(
            "local",
            &[em(&format!("p{p}"), p, s.fixed_latency)],
            &s,
            &tmp,
        )?);
    }
    let mut by_latency = Vec::new();
    for &l in &s.latencies {
        progress(&format!(
            "(d) latency {l} ns at {} % local",
            s.fixed_percent
        ));
        by_latency.extend(run_together(
            "latency",
            &[em(&format!("l{l}"), s.fixed_percent, l)],
            &s,
            &tmp,
        )?);
    }
    let (fp, fl) = (s.fixed_percent, s.fixed_latency);
    let mut isolation = Vec::new();
    if a.full {
        progress("(e) alone");
        isolation.extend(run_together("alone", &[em("alone", fp, fl)], &s, &tmp)?);
        progress("(e) two in separate instances");
        isolation.extend(run_together(
            "separate",
            &[em("sep-a", fp, fl), em("sep-b", fp, fl)],
            &s,
            &tmp,
        )?);
        progress("(e) two sharing one instance");
        isolation.extend(run_together(
            "shared",
            &[em("shared", fp, fl), em("shared", fp, fl)],
            &s,
            &tmp,
        )?);
        progress("(e) control: two not emulated, side by side");
        isolation.extend(run_together("two-plain", &[None, None], &s, &tmp)?);
        progress("(e) one emulated beside one not");
        isolation.extend(run_together(
            "beside",
            &[em("beside", fp, fl), None],
            &s,
            &tmp,
        )?);
    }
    // DiME's comparison with a system-wide emulator (Gao et al., OSDI'16,
    // which delays the kernel's own paging): the closest this kernel has is
    // Linux swapping to zram inside a memory cgroup of the same local
    // memory. Nothing here can delay a swap-in (no dm-delay, no loadable
    // modules; zram has no latency setting; blk-throttle caps rates only),
    // so both sides run at latency 0: zram's own cost against pagewise's
    // floor.
    let mut system = Vec::new();
    let mut local_0 = Vec::new();
    let mut system_isolation = Vec::new();
    let mut system_unavailable = None;
    {
        for &p in &s.percents {
            progress(&format!("(d) pagewise, local {p} % at 0 ns"));
            local_0.extend(run_together(
                "local-0",
                &[em(&format!("z{p}"), p, 0)],
                &s,
                &tmp,
            )?);
        }
        let bytes = s.data_bytes.load(std::sync::atomic::Ordering::Relaxed);
        match ZramSwap::setup((bytes * 4).max(1 << 30)) {
            Err(e) => system_unavailable = Some(e.to_string()),
            Ok(_zram) => {
                for &p in &s.percents {
                    progress(&format!("(d) system-wide: cgroup at {p} %, zram swap"));
                    system.extend(run_together(
                        "system",
                        &[sys(&format!("p{p}"), p)],
                        &s,
                        &tmp,
                    )?);
                }
                if a.full {
                    progress("(e) system-wide: two sharing one cgroup");
                    system_isolation.extend(run_together(
                        "system-shared",
                        &[sys("shared", fp), sys("shared", fp)],
                        &s,
                        &tmp,
                    )?);
                    progress("(e) system-wide: two in separate cgroups");
                    system_isolation.extend(run_together(
                        "system-separate",
                        &[sys("sep-a", fp), sys("sep-b", fp)],
                        &s,
                        &tmp,
                    )?);
                    progress("(e) system-wide: one beside one not limited");
                    system_isolation.extend(run_together(
                        "system-beside",
                        &[sys("beside", fp), None],
                        &s,
                        &tmp,
                    )?);
                }
            }
        }
    }
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
        local_0,
        system,
        system_isolation,
        system_unavailable,
        by_local,
        by_latency,
        isolation,
    };
    let mut text = String::new();
    use std::fmt::Write as _;
    writeln!(
        text,
        "{} ({} keys x {} B, {} requests per point)",
        report.command, s.keys, s.value_bytes, s.requests
    )?;
    writeln!(
        text,
        "baseline (not emulated): {:.0} {}",
        baseline,
        app.unit()
    )?;
    writeln!(
        text,
        "{:<15} {:>7} {:>9} {:>10} {:>8} {:>9} {:>9} {:>9}",
        "series",
        "local%",
        "lat_ns",
        app.unit(),
        "x base",
        "faults",
        "evicts",
        "verified"
    )?;
    for p in report
        .overhead
        .iter()
        .chain(&report.by_local)
        .chain(&report.by_latency)
        .chain(&report.isolation)
        .chain(&report.local_0)
        .chain(&report.system)
        .chain(&report.system_isolation)
    {
        writeln!(
            text,
            "{:<15} {:>7} {:>9} {:>10.0} {:>8.3} {:>9} {:>9} {:>9}",
            p.series,
            p.local_percent.map_or("-".into(), |v| v.to_string()),
            p.latency_ns.map_or("-".into(), |v| v.to_string()),
            p.get_rps,
            p.get_rps / baseline,
            p.page_fault_count + p.major_faults,
            p.evictions,
            if p.oom_killed {
                "OOM-KILLED".to_string()
            } else {
                p.verified_keys.to_string()
            }
        )?;
    }
    writeln!(text, "(each point: the median of {} runs; faults: pagewise's, or the server's major faults (swap-ins) under the system-wide emulator)", s.repeats)?;
    if let Some(why) = &report.system_unavailable {
        writeln!(
            text,
            "system-wide emulator (zram swap in a memory cgroup): not run: {why}"
        )?;
    } else {
        writeln!(
            text,
            "system-wide emulator: a memory cgroup limited to local% of the data set ({:.0} MiB), swapping to zram; no delay injected (nothing on this kernel can delay a swap-in); compare with local-0",
            report.data_bytes as f64 / (1 << 20) as f64
        )?;
    }
    writeln!(
        text,
        "throughput falls as local memory shrinks: {}; as latency grows: {} (10 % noise allowed)",
        report.falls_with_less_local, report.falls_with_more_latency
    )?;
    let pts =
        |v: &[Point], x: fn(&Point) -> f64| v.iter().map(|p| (x(p), p.get_rps)).collect::<Vec<_>>();
    let by_local = Chart {
        title: format!(
            "(d) {} {} against local memory ({fl} ns latency)",
            app.name(),
            app.unit()
        ),
        x_label: "local memory (% of pages holding data)".into(),
        y_label: app.unit().into(),
        log_x: false,
        log_y: false,
        series: vec![
            Series {
                label: "emulated".into(),
                points: pts(&report.by_local, |p| p.local_percent.unwrap_or(0) as f64),
            },
            Series {
                label: "emulated, latency 0".into(),
                points: pts(&report.local_0, |p| p.local_percent.unwrap_or(0) as f64),
            },
            Series {
                label: "system-wide (zram swap, cgroup)".into(),
                points: pts(&report.system, |p| p.local_percent.unwrap_or(0) as f64),
            },
            Series {
                label: "not emulated".into(),
                points: vec![(10.0, baseline), (100.0, baseline)],
            },
        ],
    };
    let faults = |v: &[Point]| {
        v.iter()
            .map(|p| {
                (
                    p.local_percent.unwrap_or(0) as f64,
                    (p.page_fault_count + p.major_faults) as f64,
                )
            })
            .collect::<Vec<_>>()
    };
    let faults_chart = Chart {
        title: format!(
            "{} faults against local memory (DiME Fig. 5.4a/5.5a)",
            app.name()
        ),
        x_label: "local memory (% of the data set)".into(),
        y_label: "faults per run".into(),
        log_x: false,
        log_y: true,
        series: vec![
            Series {
                label: format!("emulated, {fl} ns"),
                points: faults(&report.by_local),
            },
            Series {
                label: "emulated, latency 0".into(),
                points: faults(&report.local_0),
            },
            Series {
                label: "system-wide (major faults)".into(),
                points: faults(&report.system),
            },
        ],
    };
    let by_latency = Chart {
        title: format!(
            "(d) {} {} against latency ({fp} % local)",
            app.name(),
            app.unit()
        ),
        x_label: "one-way latency (ns)".into(),
        y_label: app.unit().into(),
        log_x: false,
        log_y: false,
        series: vec![Series {
            label: "emulated".into(),
            points: pts(&report.by_latency, |p| p.latency_ns.unwrap_or(0) as f64),
        }],
    };
    let charts = vec![
        (format!("{}_local.svg", app.name()), by_local),
        (format!("{}_faults.svg", app.name()), faults_chart),
        (format!("{}_latency.svg", app.name()), by_latency),
    ];
    a.output.emit(&report, text, charts)
}
