//! `pagewise bench dedup-redis`: SmartMD's comparison on real programs:
//! four `redis-server` instances (THP `always`, `--disable-thp no`) in one
//! memory cgroup, each loaded with the same table (`tbl:N`, values of
//! [`VALUE_LEN`] bytes, identical in every instance: the data sets overlap)
//! and data of its own (`own:N`, values unique to the instance), then
//! driven by `redis-benchmark`, one per instance at once: GETs of the hot
//! tenth of the table, then SETs of small keys (`key:N`, a value of
//! [`SET_LEN`] bytes). Each scheme of [`crate::dedup::SCHEMES`] runs on fresh servers.
//!
//! Reported per scheme: memory saved (KSM's `pages_sharing`, and the
//! servers' `ksm_merging_pages`), what the cgroup holds, huge-page memory,
//! GET and SET throughput (the median of the rounds of the second half,
//! with their lowest and highest), CPU of ksmd and the agent. Afterwards
//! every value is read back from every server and compared with what was
//! written: a lost or wrong value fails the benchmark.
//!
//! Every setting changed (THP's mode, KSM's, the cgroup) is put back at
//! the end, on error, and on SIGINT/SIGTERM.

use crate::redis::{free_port, value, Client};
use crate::Machine;
use anyhow::{bail, Context, Result};
use pagewise_agent::settings::SettingGuard;
use pagewise_agent::{drive, Agent as _, Cadence};
use pagewise_dedup::Agent;
use pagewise_testkit::host as procfs;
use pagewise_testkit::host::MemoryCgroup;
use serde::Serialize;
use std::ops::ControlFlow;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a table or own value. With Redis's 5-byte string header this
/// is jemalloc's 12 KiB size class, whose regions are three whole pages:
/// each value starts on a page, at the same offset in every instance, so
/// that its pages are the same in every instance. (From 16 KiB up,
/// jemalloc places each allocation at a random multiple of 64 bytes into
/// its first page, "cache-oblivious" placement: identical values then
/// seldom make identical pages in two instances.)
pub const VALUE_LEN: usize = 12_000;
/// Bytes of the values the SETs write.
pub const SET_LEN: usize = 512;
/// Keys the SETs write.
const SET_KEYS: u64 = 10_000;
const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
const MIB: f64 = (1 << 20) as f64;

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Servers.
    pub servers: usize,
    /// Table keys, the same in every server.
    pub table_keys: u64,
    /// Keys of each server's own.
    pub own_keys: u64,
    /// The hot share of the table that the GETs read.
    pub hot_share: f64,
    /// Seconds each scheme runs.
    pub seconds: u64,
    /// GETs per server and round (SETs: a quarter of it).
    pub requests: u64,
    /// The agent's interval, ms.
    pub interval_ms: u64,
    /// The access window, ms.
    pub window_ms: u64,
    /// ksmd's pace: one pass over the mergeable pages in this time, ms.
    pub full_scan_ms: u64,
    /// The schemes to run (all when empty).
    pub schemes: Vec<String>,
}

impl Config {
    /// A short run (CI): 64 MiB per server.
    pub fn quick() -> Self {
        Config {
            servers: 4,
            table_keys: 3000,
            own_keys: 1000,
            hot_share: 0.1,
            seconds: 20,
            requests: 20_000,
            interval_ms: 1000,
            window_ms: 250,
            full_scan_ms: 3000,
            schemes: Vec::new(),
        }
    }

    /// The full experiment: 256 MiB per server.
    pub fn full() -> Self {
        Config {
            table_keys: 12_000,
            own_keys: 4000,
            seconds: 60,
            full_scan_ms: 5000,
            ..Config::quick()
        }
    }

    fn hot_keys(&self) -> u64 {
        ((self.table_keys as f64 * self.hot_share) as u64).max(1)
    }
}

/// One round of load on every server.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Since the scheme started, s.
    pub t_s: f64,
    /// Memory saved (`pages_sharing`), MiB.
    pub saved_mib: f64,
    /// What the cgroup holds, MiB.
    pub usage_mib: f64,
    /// GETs per second of all servers in the round.
    pub get_per_s: f64,
    /// SETs per second of all servers in the round.
    pub set_per_s: f64,
}

/// One scheme's run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scheme.
    pub scheme: String,
    /// Memory saved at the end (`pages_sharing`), MiB.
    pub saved_mib: f64,
    /// The servers' `ksm_merging_pages`, summed, MiB.
    pub merging_mib: f64,
    /// What the cgroup holds after loading, MiB.
    pub loaded_mib: f64,
    /// What it holds at the end, MiB.
    pub usage_mib: f64,
    /// The servers' huge-page memory after loading, MiB.
    pub huge_loaded_mib: f64,
    /// At the end, MiB.
    pub huge_end_mib: f64,
    /// GETs per second: the median round of the second half.
    pub get_per_s: f64,
    /// Its lowest round.
    pub get_min: f64,
    /// Its highest round.
    pub get_max: f64,
    /// SETs per second: the median round of the second half.
    pub set_per_s: f64,
    /// ksmd's CPU time, ms.
    pub ksmd_cpu_ms: f64,
    /// The agent's CPU time, ms.
    pub agent_cpu_ms: f64,
    /// Regions made mergeable.
    pub merged: u64,
    /// Huge pages made mergeable.
    pub split: u64,
    /// Regions rebuilt.
    pub rebuilt: u64,
    /// Values read back and found as written, of those checked.
    pub values_ok: u64,
    /// Values checked.
    pub values_checked: u64,
    /// Samples over time.
    pub samples: Vec<Sample>,
}

/// The results.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where.
    pub machine: Machine,
    /// Sizes.
    pub config: Config,
    /// One per scheme.
    pub rows: Vec<Row>,
}

/// Why the experiment cannot run here, or `None`.
pub fn unavailable() -> Option<String> {
    if let Some(why) = crate::dedup::unavailable() {
        return Some(why);
    }
    for cmd in ["redis-server", "redis-benchmark"] {
        if !crate::redis::which(cmd) {
            return Some(format!(
                "{cmd} is not installed (scripts/setup.sh installs it)"
            ));
        }
    }
    crate::thp_redis::unavailable()
}

fn key(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}:{i:012}").into_bytes()
}

/// The value of table key `i`, or of server `own`'s key `i`.
fn expected(own: Option<usize>, i: u64) -> Vec<u8> {
    value(own.map_or(i, |o| ((o as u64 + 1) << 40) | i), VALUE_LEN)
}

fn load(port: u16, own: usize, cfg: &Config) -> Result<()> {
    let mut c = Client::connect(port)?;
    for (prefix, n, who) in [
        ("tbl", cfg.table_keys, None),
        ("own", cfg.own_keys, Some(own)),
    ] {
        for from in (0..n).step_by(100) {
            let kv: Vec<(Vec<u8>, Vec<u8>)> = (from..(from + 100).min(n))
                .map(|i| (key(prefix, i), expected(who, i)))
                .collect();
            let cmds: Vec<Vec<&[u8]>> = kv.iter().map(|(k, v)| vec![&b"SET"[..], k, v]).collect();
            c.pipeline(&cmds)?;
        }
    }
    Ok(())
}

/// Reads every value back: (found as written, checked).
fn verify(port: u16, own: usize, cfg: &Config) -> Result<(u64, u64)> {
    let mut c = Client::connect(port)?;
    let (mut ok, mut n) = (0, 0);
    let set_value = set_value();
    for (prefix, count, who) in [
        ("tbl", cfg.table_keys, Some(None)),
        ("own", cfg.own_keys, Some(Some(own))),
        ("key", SET_KEYS, None),
    ] {
        for from in (0..count).step_by(100) {
            let keys: Vec<(u64, Vec<u8>)> = (from..(from + 100).min(count))
                .map(|i| (i, key(prefix, i)))
                .collect();
            let cmds: Vec<Vec<&[u8]>> = keys.iter().map(|(_, k)| vec![&b"GET"[..], k]).collect();
            for ((i, _), got) in keys.iter().zip(c.pipeline(&cmds)?) {
                match (who, got) {
                    // The SETs' keys: those written hold redis-benchmark's value.
                    (None, None) => {}
                    (None, Some(v)) => {
                        n += 1;
                        ok += u64::from(v == set_value);
                    }
                    (Some(w), got) => {
                        n += 1;
                        ok += u64::from(got.as_deref() == Some(&expected(w, *i)[..]));
                    }
                }
            }
        }
    }
    Ok((ok, n))
}

/// The value the SETs write (`redis-benchmark` would write random bytes of
/// its own, which could not be checked).
fn set_value() -> Vec<u8> {
    value(u64::MAX, SET_LEN)
}

/// One `redis-benchmark` against `port` (CSV): its requests per second.
fn bench(port: u16, args: &[String]) -> Result<std::process::Child> {
    Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-c",
            "20",
            "--csv",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-benchmark")
}

fn rps_of(child: std::process::Child) -> Result<f64> {
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.split(',').nth(1))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .with_context(|| format!("no result in redis-benchmark's output: {text}"))
}

/// One round: GETs of the hot table on every server at once, then SETs.
fn round(ports: &[u16], cfg: &Config) -> Result<(f64, f64)> {
    let gets = [
        "-n".into(),
        cfg.requests.to_string(),
        "-r".into(),
        cfg.hot_keys().to_string(),
        "GET".into(),
        "tbl:__rand_int__".into(),
    ];
    let sets = [
        "-n".into(),
        (cfg.requests / 4).to_string(),
        "-r".into(),
        SET_KEYS.to_string(),
        "SET".into(),
        "key:__rand_int__".into(),
        String::from_utf8(set_value()).expect("hex digits"),
    ];
    let mut out = [0.0; 2];
    for (k, args) in [&gets[..], &sets[..]].into_iter().enumerate() {
        let children: Vec<_> = ports
            .iter()
            .map(|&p| bench(p, args))
            .collect::<Result<_>>()?;
        for c in children {
            out[k] += rps_of(c)?;
        }
    }
    Ok((out[0], out[1]))
}

fn huge_mib(pids: &[i32]) -> f64 {
    pids.iter()
        .filter_map(|&p| procfs::resident(p).ok())
        .map(|r| r.anon_huge_kib as f64 / 1024.0)
        .sum()
}

fn one(
    cfg: &Config,
    scheme: &str,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<Row> {
    let cg = MemoryCgroup::create(
        &format!("pagewise-dedup-redis-{}-{scheme}", std::process::id()),
        8 << 30,
    )?;
    let mut servers = Vec::new();
    for _ in 0..cfg.servers {
        servers.push(crate::thp_redis::start_redis(Some(&cg), free_port()?)?);
    }
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    let pids: Vec<i32> = servers.iter().map(|s| s.child.id() as i32).collect();
    progress(&format!("{scheme}: loading {} servers", cfg.servers));
    for (i, &p) in ports.iter().enumerate() {
        load(p, i, cfg)?;
    }
    let usage = || cg.usage().map_or(0.0, |u| u.usage as f64 / MIB);
    let (loaded_mib, huge_loaded_mib) = (usage(), huge_mib(&pids));
    let done = Arc::new(AtomicBool::new(false));
    let agent = match crate::dedup::scheme_options(
        scheme,
        Duration::from_millis(cfg.window_ms),
        Duration::from_millis(cfg.full_scan_ms),
    ) {
        Some(opts) => {
            let mut a = Agent::new(&pids, opts)?;
            let (done, interval) = (done.clone(), Duration::from_millis(cfg.interval_ms));
            Some(std::thread::spawn(move || {
                let cadence = Cadence::default().interval(interval);
                let ended = drive(&mut a, &cadence, &*done, None, |_, _| {
                    Ok::<_, pagewise::Error>(ControlFlow::Continue(()))
                });
                // Unmerged before the values are read back, as the
                // command does at its end; KSM's settings come back when
                // the agent is dropped.
                a.end();
                ended.map(|_| a.counters())
            }))
        }
        None => None,
    };
    let ksmd = crate::dedup::KsmdClock::start();
    progress(&format!("{scheme}: {} s of load", cfg.seconds));
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut result = Ok(());
    while t0.elapsed() < Duration::from_secs(cfg.seconds) {
        if stop.load(Ordering::SeqCst) {
            result = Err(anyhow::anyhow!(
                "bench dedup-redis interrupted: every setting put back"
            ));
            break;
        }
        match round(&ports, cfg) {
            Ok((get_per_s, set_per_s)) => samples.push(Sample {
                t_s: t0.elapsed().as_secs_f64(),
                saved_mib: crate::dedup::ksm_sharing_mib(),
                usage_mib: usage(),
                get_per_s,
                set_per_s,
            }),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let merging_mib = crate::dedup::merging_mib(&pids);
    let (saved_mib, usage_mib, huge_end_mib) =
        (crate::dedup::ksm_sharing_mib(), usage(), huge_mib(&pids));
    done.store(true, Ordering::SeqCst);
    let counters = match agent {
        Some(h) => h
            .join()
            .expect("agent thread")
            .map_err(|e| anyhow::anyhow!("the {scheme} agent failed: {e}"))?,
        None => Default::default(),
    };
    let ksmd_cpu_ms = ksmd.ms();
    result?;
    progress(&format!("{scheme}: reading every value back"));
    let (mut values_ok, mut values_checked) = (0, 0);
    for (i, &p) in ports.iter().enumerate() {
        let (ok, n) = verify(p, i, cfg)?;
        values_ok += ok;
        values_checked += n;
    }
    for s in &mut servers {
        s.shutdown();
    }
    let half: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t_s >= cfg.seconds as f64 / 2.0)
        .collect();
    let (get_per_s, get_min, get_max) =
        crate::median_min_max(half.iter().map(|s| s.get_per_s).collect());
    let set_per_s = crate::median(&mut half.iter().map(|s| s.set_per_s).collect::<Vec<_>>());
    Ok(Row {
        scheme: scheme.into(),
        saved_mib,
        merging_mib,
        loaded_mib,
        usage_mib,
        huge_loaded_mib,
        huge_end_mib,
        get_per_s,
        get_min,
        get_max,
        set_per_s,
        ksmd_cpu_ms,
        agent_cpu_ms: counters.cpu_ms,
        merged: counters.merged,
        split: counters.split,
        rebuilt: counters.rebuilt,
        values_ok,
        values_checked,
        samples,
    })
}

/// Runs every scheme.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if let Some(why) = unavailable() {
        bail!("bench dedup-redis cannot run here: {why}");
    }
    let stop = pagewise_sys::signal::stop_flag()?;
    let _thp = SettingGuard::set(THP, "always").with_context(|| format!("setting {THP}"))?;
    let mut rows = Vec::new();
    for scheme in crate::dedup::SCHEMES {
        if !cfg.schemes.is_empty() && !cfg.schemes.iter().any(|s| s == scheme) {
            continue;
        }
        // A scheme this kernel cannot run (the advisor's) is said, not run.
        if let Some(why) = crate::dedup::scheme_unavailable(scheme) {
            progress(&format!("not run: {why}"));
            continue;
        }
        rows.push(one(cfg, scheme, &stop, progress)?);
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        rows,
    })
}

impl Report {
    /// The table.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "pagewise bench dedup-redis — {}\n{} redis-server (THP always), each with the same {} table values and {} of its own of {VALUE_LEN} bytes ({:.0} MiB of values each); load: redis-benchmark GETs of the hottest {} table keys and SETs of {SET_LEN}-byte values, on every server at once; {} s per scheme; ksmd paced to one pass in {} ms\n\n{:>15} {:>9} {:>7} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9} {:>21} {:>10} {:>8} {:>8} {:>6} {:>6} {:>13}\n",
            self.machine,
            c.servers,
            c.table_keys,
            c.own_keys,
            ((c.table_keys + c.own_keys) as usize * VALUE_LEN) as f64 / MIB,
            c.hot_keys(),
            c.seconds,
            c.full_scan_ms,
            "scheme", "saved MiB", "of KSM", "merging", "loaded MiB", "held MiB", "huge MiB", "GET/s", "of no-spl", "spread", "SET/s", "ksmd ms", "agent ms", "CPU %", "split", "values ok"
        );
        let row = |name: &str| self.rows.iter().find(|r| r.scheme == name);
        let ksm = row("ksm-everywhere").map_or(0.0, |r| r.saved_mib);
        let nosplit = row("no-splitting").map_or(0.0, |r| r.get_per_s);
        for r in &self.rows {
            s += &format!(
                "{:>15} {:>9.1} {:>7} {:>9.1} {:>10.0} {:>9.0} {:>4.0}→{:<4.0} {:>10.0} {:>9} {:>10.0}-{:<10.0} {:>10.0} {:>8.0} {:>8.0} {:>6.1} {:>6} {:>6}/{:<6}\n",
                r.scheme,
                r.saved_mib,
                crate::pct(r.saved_mib, ksm),
                r.merging_mib,
                r.loaded_mib,
                r.usage_mib,
                r.huge_loaded_mib,
                r.huge_end_mib,
                r.get_per_s,
                crate::pct(r.get_per_s, nosplit),
                r.get_min,
                r.get_max,
                r.set_per_s,
                r.ksmd_cpu_ms,
                r.agent_cpu_ms,
                (r.ksmd_cpu_ms + r.agent_cpu_ms) / (c.seconds as f64 * 10.0),
                r.split,
                r.values_ok,
                r.values_checked
            );
        }
        s
    }

    /// Saving against GET throughput; both over time.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let per = |f: fn(&Sample) -> f64| -> Vec<crate::svg::Series> {
            self.rows
                .iter()
                .map(|r| crate::svg::Series {
                    label: r.scheme.clone(),
                    points: r.samples.iter().map(|s| (s.t_s, f(s))).collect(),
                })
                .collect()
        };
        let chart = |title: &str, x: &str, y: &str, series| crate::svg::Chart {
            title: title.into(),
            x_label: x.into(),
            y_label: y.into(),
            log_x: false,
            log_y: false,
            series,
        };
        vec![
            (
                "dedup-redis-tradeoff.svg".into(),
                chart(
                    "Redis: memory saved against GET throughput, per scheme",
                    "memory saved (MiB)",
                    "GETs per second (thousands, all servers)",
                    self.rows
                        .iter()
                        .map(|r| crate::svg::Series {
                            label: r.scheme.clone(),
                            points: vec![(r.saved_mib, r.get_per_s / 1e3)],
                        })
                        .collect(),
                ),
            ),
            (
                "dedup-redis-saved.svg".into(),
                chart(
                    "Redis: memory saved over time",
                    "time (s)",
                    "memory saved (MiB)",
                    per(|s| s.saved_mib),
                ),
            ),
            (
                "dedup-redis-throughput.svg".into(),
                chart(
                    "Redis: GET throughput over time",
                    "time (s)",
                    "GETs per second (thousands, all servers)",
                    per(|s| s.get_per_s / 1e3),
                ),
            ),
        ]
    }
}
