//! `pagewise bench thp-redis-get`: a real Redis whose speed depends on the
//! TLB. A `redis-server` holds a large key space (`key:000000000000` ..,
//! the names `redis-benchmark -r` asks for, each with a value of its own),
//! and `redis-benchmark` sends GETs of random keys, pipelined, in rounds;
//! every GET finds its key (Redis's `keyspace_misses` stays 0). A random
//! GET touches the hash table, the key and its value at random places of
//! the whole memory: nearly every one misses the TLB with base pages.
//!
//! Ways, each on a fresh server loaded under it:
//! - the kernel's own policies ([`ThpPolicy`]), no agent: THP `never`,
//!   `madvise` (Redis asks for nothing: base pages), `always`, `always`
//!   with the shrinker, 64 KiB mTHP;
//! - `pagewise`: THP `madvise`, the machine's setting, and the huge-page
//!   agent (coverage policy, no budget of huge pages, half a CPU at most
//!   for its collapses) promoting the regions Redis writes (a GET writes
//!   the value's access time, so the pages GETs touch are written).
//!
//! Measured per round: GETs per second (redis-benchmark's own figure),
//! Redis's resident memory and its memory in huge pages; per run the median
//! of the second half of the rounds (the agent has promoted by then), the
//! memory at the end, and the agent's CPU. After the rounds every value is
//! read back and compared: a lost or wrong value fails the benchmark.

use crate::kernel::ThpPolicy;
use crate::redis::{free_port, redis_benchmark, value, which, Client};
use crate::thp_redis::{check, load, start_redis};
use crate::Machine;
use anyhow::{bail, Context, Result};
use pagewise_agent::{drive, Cadence};
use pagewise_thp::agent::{Action, Agent, Policy};
use serde::Serialize;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Keys loaded.
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Rounds of GETs per run.
    pub rounds: usize,
    /// GETs per round.
    pub requests_per_round: u64,
    /// redis-benchmark's pipeline depth (`-P`).
    pub pipeline: u32,
    /// redis-benchmark's connections (`-c`).
    pub clients: u32,
    /// Runs per way (fresh servers).
    pub repeats: usize,
    /// The agent's interval, ms.
    pub interval_ms: u64,
}

impl Config {
    /// A short run.
    pub fn quick() -> Self {
        Config {
            keys: 300_000,
            value_bytes: 256,
            rounds: 4,
            requests_per_round: 100_000,
            pipeline: 16,
            clients: 8,
            repeats: 1,
            interval_ms: 1000,
        }
    }
    /// The experiment.
    pub fn full() -> Self {
        Config {
            keys: 2_000_000,
            rounds: 10,
            requests_per_round: 600_000,
            repeats: 5,
            ..Self::quick()
        }
    }
}

/// One way of running Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The kernel alone.
    Kernel(ThpPolicy),
    /// THP `madvise` and the huge-page agent.
    Pagewise,
}

impl Way {
    /// Every way, in the order they run.
    pub fn all() -> Vec<Way> {
        let mut v: Vec<Way> = ThpPolicy::ALL.into_iter().map(Way::Kernel).collect();
        v.push(Way::Pagewise);
        v
    }

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Way::Kernel(p) => p.name(),
            Way::Pagewise => "pagewise",
        }
    }

    fn policy(self) -> ThpPolicy {
        match self {
            Way::Kernel(p) => p,
            Way::Pagewise => ThpPolicy::Madvise,
        }
    }
}

/// One round of GETs.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// Seconds since the load ended.
    pub t_s: f64,
    /// GETs per second (redis-benchmark's figure).
    pub get_per_s: f64,
    /// Redis's resident memory after the round, MiB.
    pub rss_mib: f64,
    /// Of it, in 2 MiB pages.
    pub huge_mib: f64,
}

/// One run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The way.
    pub way: String,
    /// Run number.
    pub repeat: usize,
    /// Seconds to load the keys.
    pub load_s: f64,
    /// The rounds.
    pub rounds: Vec<Round>,
    /// Median GETs per second of the second half of the rounds.
    pub get_per_s: f64,
    /// Resident memory at the end, MiB.
    pub rss_mib: f64,
    /// In 2 MiB pages at the end, MiB.
    pub huge_mib: f64,
    /// 64 KiB huge pages faulted in on the machine during the run.
    pub mthp_64k_faults: u64,
    /// Huge pages the agent made.
    pub promoted: u64,
    /// The agent's CPU time, s.
    pub agent_cpu_s: f64,
    /// GETs that found no key (Redis's `keyspace_misses`).
    pub misses: u64,
    /// Values read back as written.
    pub verified: u64,
    /// Values lost or wrong.
    pub lost: u64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where.
    pub machine: Machine,
    /// Settings.
    pub config: Config,
    /// Page-walk cost measured, ns (the agent's ranking).
    pub walk_ns: f64,
    /// Runs.
    pub rows: Vec<Row>,
    /// Ways this kernel cannot run, with why.
    pub skipped: Vec<String>,
    /// The THP knobs no way changes, as the machine had them.
    pub thp_knobs: Vec<String>,
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i:012}").into_bytes()
}

/// Every value read back: (as written, lost or wrong).
fn verify(c: &mut Client, cfg: &Config, stop: &AtomicBool) -> Result<(u64, u64)> {
    let (mut ok, mut lost) = (0, 0);
    let mut i = 0;
    while i < cfg.keys {
        check(stop)?;
        let k = (cfg.keys - i).min(1000);
        let keys: Vec<Vec<u8>> = (i..i + k).map(key).collect();
        let cmds: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"GET"[..], k]).collect();
        for (j, got) in (i..).zip(c.pipeline(&cmds)?) {
            if got == Some(value(j, cfg.value_bytes)) {
                ok += 1;
            } else {
                lost += 1;
            }
        }
        i += k;
    }
    Ok((ok, lost))
}

/// A field of Redis's `INFO stats`.
fn info_stat(c: &mut Client, field: &str) -> Result<u64> {
    let r = c.pipeline(&[vec![&b"INFO"[..], b"stats"]])?;
    let text = String::from_utf8_lossy(r[0].as_deref().unwrap_or_default()).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:"))?.trim().parse().ok())
        .with_context(|| format!("no {field} in INFO stats"))
}

type AgentThread = std::thread::JoinHandle<pagewise::Result<(u64, f64)>>;

/// The agent in a thread of its own until `done`: huge pages promoted and
/// its CPU time, s.
fn spawn_agent(
    cfg: &Config,
    pid: i32,
    walk_ns: f64,
    done: &Arc<AtomicBool>,
) -> Result<AgentThread> {
    let opts = crate::thp_redis::on_redis(cfg.interval_ms, Policy::Coverage, walk_ns);
    let mut a = Agent::new(&[pid], opts)?;
    let done = done.clone();
    let interval = Duration::from_millis(cfg.interval_ms);
    Ok(std::thread::spawn(move || {
        let cpu0 = pagewise_sys::process::thread_cpu_ns();
        let mut promoted = 0;
        drive(
            &mut a,
            &Cadence::default().interval(interval),
            &*done,
            None,
            |_, step| {
                promoted += step
                    .actions
                    .iter()
                    .filter(|a| matches!(a, Action::Promoted { .. }))
                    .count() as u64;
                Ok::<_, pagewise::Error>(ControlFlow::Continue(()))
            },
        )?;
        let cpu = (pagewise_sys::process::thread_cpu_ns() - cpu0) as f64 / 1e9;
        Ok((promoted, cpu))
    }))
}

fn one(cfg: &Config, way: Way, repeat: usize, walk_ns: f64, stop: &AtomicBool) -> Result<Row> {
    let applied = way.policy().apply()?;
    let faults = crate::kernel::mthp_64k_faults();
    let port = free_port()?;
    let mut server = start_redis(None, port)?;
    let pid = server.child.id() as i32;
    let mut c = Client::connect(port)?;
    c.timeout(Duration::from_secs(60))?;
    let t = Instant::now();
    let set = |j: u64| vec![b"SET".to_vec(), key(j), value(j, cfg.value_bytes)];
    if let (_, _, Some(e)) = load(&mut c, cfg.keys, 1000, &set, stop) {
        return Err(e);
    }
    let load_s = t.elapsed().as_secs_f64();
    let done = Arc::new(AtomicBool::new(false));
    let agent = match way {
        Way::Pagewise => Some(spawn_agent(cfg, pid, walk_ns, &done)?),
        Way::Kernel(_) => None,
    };
    let (keys, n) = (cfg.keys.to_string(), cfg.requests_per_round.to_string());
    let (pipe, clients) = (cfg.pipeline.to_string(), cfg.clients.to_string());
    let t0 = Instant::now();
    let mut rounds = Vec::new();
    let mut failed = None;
    for _ in 0..cfg.rounds {
        if let Err(e) = check(stop) {
            failed = Some(e);
            break;
        }
        let args = [
            "-t", "get", "-r", &keys, "-n", &n, "-P", &pipe, "-c", &clients,
        ];
        match redis_benchmark(port, &args, &["GET"]) {
            Ok(r) => {
                let held = pagewise_testkit::host::resident(pid).unwrap_or_default();
                rounds.push(Round {
                    t_s: t0.elapsed().as_secs_f64(),
                    get_per_s: r[0],
                    rss_mib: held.rss_kib as f64 / 1024.0,
                    huge_mib: held.anon_huge_kib as f64 / 1024.0,
                });
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    done.store(true, Ordering::SeqCst);
    let (promoted, agent_cpu_s) = match agent {
        Some(h) => h
            .join()
            .expect("agent thread")
            .map_err(|e| anyhow::anyhow!("the agent failed: {e}"))?,
        None => (0, 0.0),
    };
    if let Some(e) = failed {
        return Err(e);
    }
    let misses = info_stat(&mut c, "keyspace_misses")?;
    let (verified, lost) = verify(&mut c, cfg, stop)?;
    server.shutdown();
    drop(applied);
    let mut second: Vec<f64> = rounds[rounds.len() / 2..]
        .iter()
        .map(|r| r.get_per_s)
        .collect();
    let last = rounds.last().cloned();
    Ok(Row {
        way: way.name().to_string(),
        repeat,
        load_s,
        get_per_s: crate::median(&mut second),
        rss_mib: last.as_ref().map_or(0.0, |r| r.rss_mib),
        huge_mib: last.as_ref().map_or(0.0, |r| r.huge_mib),
        mthp_64k_faults: crate::kernel::mthp_64k_faults().saturating_sub(faults),
        rounds,
        promoted,
        agent_cpu_s,
        misses,
        verified,
        lost,
    })
}

/// Why the experiment cannot run here, or `None`.
pub fn unavailable() -> Option<String> {
    if !which("redis-server") || !which("redis-benchmark") {
        return Some(
            "redis-server and redis-benchmark are needed (scripts/setup.sh installs them)".into(),
        );
    }
    let p = pagewise_mech::probe::get();
    (!p.madv_collapse || !p.process_madvise)
        .then(|| format!("{} / {}", p.why("madv_collapse"), p.why("process_madvise")))
}

/// Runs the experiment: run by run, every way in turn.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if cfg.rounds == 0 {
        bail!("at least one round of GETs");
    }
    let stop = pagewise_sys::signal::stop_flag()?;
    progress("measuring a page walk's cost");
    let walk_ns = pagewise_thp::calibrate_walk_cost(64 << 20, 1 << 20)?
        .walk_ns
        .unwrap_or(30.0)
        .max(1.0);
    let (mut ways, mut skipped) = (Vec::new(), Vec::new());
    for w in Way::all() {
        match w.policy().missing() {
            Some(why) => skipped.push(format!("{}: {why}", w.name())),
            None => ways.push(w),
        }
    }
    let mut rows = Vec::new();
    for repeat in 0..cfg.repeats {
        for &way in &ways {
            progress(&format!("{}, run {}", way.name(), repeat + 1));
            rows.push(one(cfg, way, repeat, walk_ns, &stop)?);
        }
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        walk_ns,
        rows,
        skipped,
        thp_knobs: crate::kernel::thp_knobs(),
    })
}

impl Report {
    /// Median (min, max) of `f` over the runs of `way`.
    pub fn stat(&self, way: &str, f: fn(&Row) -> f64) -> (f64, f64, f64) {
        crate::median_min_max(self.rows.iter().filter(|r| r.way == way).map(f).collect())
    }

    /// The table and the goal.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "pagewise bench thp-redis-get — {}\nredis-server with {} keys of {} B; {} rounds of {} random GETs (redis-benchmark -P {} -c {}); page walk {:.1} ns; THP knobs as the machine has them: {}\n\n{:>26} {:>4} {:>8} {:>12} {:>10} {:>10} {:>9} {:>9} {:>7} {:>9}\n",
            self.machine, c.keys, c.value_bytes, c.rounds, c.requests_per_round, c.pipeline, c.clients,
            self.walk_ns, self.thp_knobs.join(" "),
            "way", "run", "load s", "GET/s", "RSS MiB", "huge MiB", "promoted", "agent s", "misses", "lost"
        );
        for r in &self.rows {
            s += &format!(
                "{:>26} {:>4} {:>8.1} {:>12.0} {:>10.1} {:>10.1} {:>9} {:>9.2} {:>7} {:>9}\n",
                r.way,
                r.repeat + 1,
                r.load_s,
                r.get_per_s,
                r.rss_mib,
                r.huge_mib,
                r.promoted,
                r.agent_cpu_s,
                r.misses,
                r.lost
            );
        }
        let ways = crate::in_order(self.rows.iter().map(|r| r.way.as_str()));
        s += &format!(
            "\nmedian (min–max) over {} runs: GET/s of the second half of the rounds; memory at the end\n",
            c.repeats
        );
        for w in &ways {
            let (g, gl, gh) = self.stat(w, |r| r.get_per_s);
            let (m, ml, mh) = self.stat(w, |r| r.rss_mib);
            let (h, ..) = self.stat(w, |r| r.huge_mib);
            s += &format!(
                "  {w:>26}: {g:.0} ({gl:.0}–{gh:.0}) GET/s, {m:.0} ({ml:.0}–{mh:.0}) MiB resident, {h:.0} MiB in huge pages\n"
            );
        }
        for why in &self.skipped {
            s += &format!("  skipped: {why}\n");
        }
        s += &self.goal();
        s
    }

    /// The best kernel setting (the highest median GET/s), or `None`.
    pub fn best_kernel(&self) -> Option<&str> {
        crate::in_order(self.rows.iter().map(|r| r.way.as_str()))
            .into_iter()
            .filter(|w| *w != "pagewise")
            .max_by(|a, b| {
                self.stat(a, |r| r.get_per_s)
                    .0
                    .total_cmp(&self.stat(b, |r| r.get_per_s).0)
            })
    }

    fn goal(&self) -> String {
        let Some(best) = self.best_kernel() else {
            return String::new();
        };
        if !self.rows.iter().any(|r| r.way == "pagewise") {
            return String::new();
        }
        let (pg, pgl, pgh) = self.stat("pagewise", |r| r.get_per_s);
        let (bg, bgl, bgh) = self.stat(best, |r| r.get_per_s);
        let (pm, pml, pmh) = self.stat("pagewise", |r| r.rss_mib);
        let (bm, bml, bmh) = self.stat(best, |r| r.rss_mib);
        // One run has no spread: nothing is apart.
        let runs = self.rows.iter().filter(|r| r.way == "pagewise").count();
        let apart = |lo1: f64, hi1: f64, lo2: f64, hi2: f64| runs > 1 && (hi1 < lo2 || hi2 < lo1);
        let faster = (pg / bg - 1.0) * 100.0;
        let smaller = (1.0 - pm / bm) * 100.0;
        let met = (faster >= 3.0 && apart(pgl, pgh, bgl, bgh))
            || (smaller >= 5.0 && apart(pml, pmh, bml, bmh) && pgl >= bgl);
        format!(
            "\nagainst the best kernel setting ({best}): pagewise {faster:+.1} % GET/s (spreads {}), resident memory {:+.1} % (spreads {}); goal +3 % throughput at equal memory or equal throughput with 5 % less memory, spreads apart over at least five runs: {}\n",
            if apart(pgl, pgh, bgl, bgh) { "apart" } else { "overlap or one run" },
            -smaller,
            if apart(pml, pmh, bml, bmh) { "apart" } else { "overlap or one run" },
            crate::met(met)
        )
    }

    /// GET/s against resident memory, per way (the medians), and GET/s
    /// over the rounds of the first run of each way.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let ways = crate::in_order(self.rows.iter().map(|r| r.way.as_str()));
        let series = ways
            .iter()
            .map(|w| crate::svg::Series {
                label: w.to_string(),
                points: vec![(
                    self.stat(w, |r| r.rss_mib).0,
                    self.stat(w, |r| r.get_per_s).0,
                )],
            })
            .collect();
        let rounds = ways
            .iter()
            .filter_map(|w| self.rows.iter().find(|r| r.way == *w))
            .map(|r| crate::svg::Series {
                label: r.way.clone(),
                points: r.rounds.iter().map(|x| (x.t_s, x.get_per_s)).collect(),
            })
            .collect();
        vec![
            (
                "thp-redis-get.svg".into(),
                crate::svg::Chart {
                    title: "Redis random GETs: throughput against memory (medians)".into(),
                    x_label: "resident MiB".into(),
                    y_label: "GET/s".into(),
                    log_x: false,
                    log_y: false,
                    series,
                },
            ),
            (
                "thp-redis-get-rounds.svg".into(),
                crate::svg::Chart {
                    title: "GET/s over the rounds (first run of each way)".into(),
                    x_label: "s since the load".into(),
                    y_label: "GET/s".into(),
                    log_x: false,
                    log_y: false,
                    series: rounds,
                },
            ),
        ]
    }
}
