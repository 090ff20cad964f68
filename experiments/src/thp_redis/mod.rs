//! `pagewise bench thp-redis`: HawkEye's experiment (a), memory bloat, on a
//! real `redis-server` (THP allowed: `--disable-thp no`) in a memory cgroup
//! with a limit and no swap:
//!
//! - **P1** inserts small values (4,000 bytes: jemalloc packs them densely,
//!   and THP `always` maps them with huge pages);
//! - **P2** deletes 80 % of the keys, chosen at random: jemalloc gives the
//!   freed pages back (`MADV_DONTNEED`, after its 10 s decay), and every
//!   huge page still holds some live values, so it is split and its freed
//!   pages returned; then khugepaged collapses those regions again and
//!   fills the holes with zeros (`max_ptes_none` 511): that is the bloat;
//! - **P3** inserts large values (128 KiB): jemalloc cannot fit them into
//!   the small holes P2 left, so it takes new memory, and the bloat in the
//!   holes is memory P3 cannot have.
//!
//! Policies, each on a fresh server and cgroup ([`Way`]):
//! - the kernel's own, with no agent: THP `never`, `madvise`, `always`
//!   (khugepaged with its default thresholds), `always-shrinker` (the THP
//!   shrinker on, `max_ptes_none` 409) and `mthp-64k` (64 KiB pages only);
//! - `ingens`: THP `madvise` (Redis does not advise: base pages at fault,
//!   khugepaged leaves it alone) and the agent promoting regions at least
//!   90 % resident (Ingens's utilisation threshold), no recovery;
//! - `pagewise`: THP `always`, khugepaged as in `always`, and `pagewise thp`
//!   (coverage policy) recovering bloat when the cgroup is charged above a
//!   share of its limit.
//!
//! khugepaged scans faster than its default in every run (see [`Config`]),
//! so that P2's collapses happen in seconds rather than minutes; its
//! thresholds are the default ones.
//!
//! Measured: the cgroup's charge, Redis's RSS and huge-page memory over
//! time; whether P3 completes or the OOM killer ends Redis; the bloat
//! (zero-filled pages inside huge pages, by the inspector) before P3 and
//! how much of it the agent gave back, and how fast; SET throughput of P1
//! and P3 and GET throughput afterwards. Every value is read back and
//! compared after P3: a lost or wrong value fails the benchmark.
//!
//! Every system setting changed (THP mode, khugepaged's pace, the
//! agent's `max_ptes_none`, the cgroup) is put back at the end, on error,
//! and on SIGINT/SIGTERM.

mod oom;
mod recovery;
mod report;
mod ways;

pub(crate) use ways::on_redis;
pub use ways::Way;

use crate::redis::{free_port, redis_args, value, wait_ready, which, Client};
use crate::svg::{Chart, Series};
use crate::Machine;
use anyhow::{bail, Context, Result};
use pagewise_agent::settings::SettingGuard;
use pagewise_agent::{drive, Cadence};
use pagewise_testkit::host::MemoryCgroup;
use pagewise_thp::agent::{Action, Agent};
use serde::Serialize;
use std::ops::ControlFlow;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
/// Kernel counters reported per run: huge pages split because they were
/// underused (the THP shrinker), split in all, queued for a deferred
/// split, collapsed by khugepaged.
pub const VMSTAT: [&str; 4] = [
    "thp_underused_split_page",
    "thp_split_page",
    "thp_deferred_split_page",
    "thp_collapse_alloc",
];
const KHUGEPAGED: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged";

/// The experiment's size and settings.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Keys inserted in P1.
    pub p1_keys: u64,
    /// Bytes per P1 value.
    pub p1_bytes: usize,
    /// Share of P1's keys deleted in P2.
    pub delete_share: f64,
    /// Keys inserted in P3.
    pub p3_keys: u64,
    /// Bytes per P3 value.
    pub p3_bytes: usize,
    /// The cgroup's limit, MiB.
    pub limit_mib: u64,
    /// P2's pause: at least this long (jemalloc's decay is 10 s)...
    pub settle_min_s: u64,
    /// ...and until Redis's huge-page memory has not changed for 3 s, or
    /// this long.
    pub settle_max_s: u64,
    /// The agent's interval, ms.
    pub interval_ms: u64,
    /// pagewise: memory is tight above this share of the limit, %.
    pub pressure_pct: f64,
    /// pagewise: zero-filled pages (of 512) a huge page must hold to be
    /// recovered.
    pub zero_pages: u64,
    /// khugepaged's `pages_to_scan` in every run (default 4096).
    pub khugepaged_pages: u64,
    /// khugepaged's `scan_sleep_millisecs` in every run (default 10000).
    pub khugepaged_sleep_ms: u64,
    /// Seconds of GET load after P3.
    pub get_seconds: f64,
    /// Runs per way, the ways in turn run by run.
    pub repeats: usize,
}

impl Config {
    /// A short run (about a minute per policy).
    pub fn quick() -> Self {
        Config {
            p1_keys: 100_000,
            p1_bytes: 4000,
            delete_share: 0.8,
            p3_keys: 2_500,
            p3_bytes: 128 << 10,
            limit_mib: 700,
            settle_min_s: 12,
            settle_max_s: 30,
            interval_ms: 250,
            pressure_pct: 80.0,
            zero_pages: 64,
            khugepaged_pages: 65536,
            khugepaged_sleep_ms: 100,
            get_seconds: 2.0,
            repeats: 1,
        }
    }
    /// The experiment (twice the data).
    pub fn full() -> Self {
        Config {
            p1_keys: 200_000,
            p3_keys: 5_000,
            limit_mib: 1300,
            settle_max_s: 60,
            get_seconds: 5.0,
            repeats: 5,
            ..Self::quick()
        }
    }
}

/// One sample of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Since the server started, s.
    pub t_s: f64,
    /// The phase then.
    pub phase: String,
    /// The cgroup's charge, MiB.
    pub cgroup_mib: f64,
    /// Redis's RSS, MiB.
    pub rss_mib: f64,
    /// Of it, in huge pages, MiB.
    pub huge_mib: f64,
}

/// One policy's run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Policy.
    pub way: String,
    /// Which run of the way (from 0).
    pub repeat: usize,
    /// P3 inserted every key and Redis was alive after it.
    pub p3_completed: bool,
    /// P3's keys acknowledged.
    pub p3_inserted: u64,
    /// Kills by the OOM killer in the cgroup.
    pub oom_kills: u64,
    /// Highest charge of the cgroup, MiB.
    pub peak_mib: f64,
    /// Charge at the end of P2's pause, MiB.
    pub after_p2_mib: f64,
    /// Charge at the end of P3 (or when Redis died), MiB.
    pub end_mib: f64,
    /// Zero-filled pages inside huge pages before P3, MiB.
    pub bloat_before_p3_mib: f64,
    /// Zero-filled pages the agent gave back, MiB (all the run, the zero
    /// pages of huge pages made during P3 included).
    pub recovered_mib: f64,
    /// Of them, pages of the bloat measured before P3, MiB.
    pub recovered_of_bloat_mib: f64,
    /// Of the bloat before P3, the share given back within 10 s of memory
    /// first counting as tight.
    pub recovered_in_10s: Option<f64>,
    /// Time from memory first counting as tight to 90 % of the bloat
    /// given back, s.
    pub t90_s: Option<f64>,
    /// Longest stop of Redis for one recovery, ms.
    pub max_stop_ms: f64,
    /// Huge pages the agent promoted.
    pub promoted: u64,
    /// SET requests/s in P1.
    pub p1_set_per_s: f64,
    /// SET requests/s in P3 (of what was inserted).
    pub p3_set_per_s: f64,
    /// GET requests/s after P3 (random P1 keys left), when it completed.
    pub get_per_s: Option<f64>,
    /// Redis's memory in huge pages at the end, share of its RSS.
    pub huge_share_end: f64,
    /// Values read back after P3 and found as written.
    pub verified: u64,
    /// Values missing or wrong.
    pub lost: u64,
    /// Redis died after P3 completed, in this phase (`verify` or `GET`):
    /// killed, by the OOM killer when `oom_kills` says so.
    pub died_after_p3: Option<String>,
    /// CPU of the agent's thread, s.
    pub agent_cpu_s: f64,
    /// What the kernel did to huge pages during the run (`/proc/vmstat`
    /// differences; other processes' count too): [`VMSTAT`] in order.
    pub vmstat: Vec<(String, u64)>,
    /// The timeline (the first run's; later runs keep none).
    pub timeline: Vec<Sample>,
    /// Zero-filled pages inside each huge page before P3, by region start.
    #[serde(skip)]
    pub bloat_regions: std::collections::HashMap<u64, u64>,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// Settings.
    pub config: Config,
    /// One row per policy.
    pub rows: Vec<Row>,
    /// Ways this kernel cannot run, each with why.
    pub skipped: Vec<String>,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn p1_key(i: u64) -> Vec<u8> {
    format!("p1:{i:09}").into_bytes()
}

fn p3_key(i: u64) -> Vec<u8> {
    format!("p3:{i:09}").into_bytes()
}

/// P3's values differ from P1's.
const P3_SEED: u64 = 1 << 40;

/// The P1 keys P2 deletes: a seeded shuffle's first share.
fn deleted(cfg: &Config) -> Vec<bool> {
    let n = cfg.p1_keys as usize;
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = pagewise_mech::workload::Rng::new(0x2545_f491_4f6c_dd1d);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut gone = vec![false; n];
    for &k in &order[..(n as f64 * cfg.delete_share) as usize] {
        gone[k] = true;
    }
    gone
}

/// What the threads beside the load share.
struct Shared {
    phase: Mutex<String>,
    samples: Mutex<Vec<Sample>>,
    done: AtomicBool,
}

fn set_phase(s: &Shared, p: &str, progress: &mut dyn FnMut(&str), way: &str) {
    *s.phase.lock().expect("not poisoned") = p.into();
    progress(&format!("{way}: {p}"));
}

pub(crate) fn check(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted: every setting put back");
    }
    Ok(())
}

/// Runs `cmds` in batches of `batch`; the requests/s, or the error and how
/// many were acknowledged.
pub(crate) fn load(
    c: &mut Client,
    n: u64,
    batch: u64,
    cmd: &dyn Fn(u64) -> Vec<Vec<u8>>,
    stop: &AtomicBool,
) -> (u64, f64, Option<anyhow::Error>) {
    let t0 = Instant::now();
    let mut i = 0;
    while i < n {
        if let Err(e) = check(stop) {
            return (i, 0.0, Some(e));
        }
        let k = (n - i).min(batch);
        let owned: Vec<Vec<Vec<u8>>> = (i..i + k).map(cmd).collect();
        let cmds: Vec<Vec<&[u8]>> = owned
            .iter()
            .map(|c| c.iter().map(|a| a.as_slice()).collect())
            .collect();
        if let Err(e) = c.pipeline(&cmds) {
            return (i, i as f64 / t0.elapsed().as_secs_f64(), Some(e.into()));
        }
        i += k;
    }
    (n, n as f64 / t0.elapsed().as_secs_f64(), None)
}

/// Starts redis-server, inside `cg` where one is given, with THP allowed.
pub(crate) fn start_redis(cg: Option<&MemoryCgroup>, port: u16) -> Result<crate::redis::Server> {
    let mut c = Command::new("redis-server");
    c.args(redis_args(port))
        .args(["--disable-thp", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(cg) = cg {
        join_cgroup_at_exec(&mut c, cg)?;
    }
    let child = c.spawn().context("starting redis-server")?;
    let s = crate::redis::Server { child, port };
    wait_ready(port)?;
    Ok(s)
}

/// Makes the process `c` starts join `cg` before it runs (so that all its
/// memory is charged there).
pub(crate) fn join_cgroup_at_exec(c: &mut Command, cg: &MemoryCgroup) -> Result<()> {
    let procs =
        std::ffi::CString::new(cg.dir().join("cgroup.procs").as_os_str().as_encoded_bytes())?;
    // SAFETY: between fork and exec the child only opens, writes and
    // closes a file whose name was made before the fork (no allocation).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(c, move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            libc::close(fd);
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    };
    Ok(())
}

fn one(
    cfg: &Config,
    kind: Way,
    walk_ns: f64,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<Row> {
    let _thp = kind.set_up()?;
    let way = kind.name();
    let cg = MemoryCgroup::create(
        &format!("pagewise-thp-redis-{}-{way}", std::process::id()),
        cfg.limit_mib << 20,
    )?;
    let vm0 = pagewise_testkit::host::vmstat(&VMSTAT)?;
    let port = free_port()?;
    let mut server = start_redis(Some(&cg), port)?;
    let pid = server.child.id() as i32;
    let t0 = Instant::now();
    let shared = Arc::new(Shared {
        phase: Mutex::new("start".into()),
        samples: Mutex::new(Vec::new()),
        done: AtomicBool::new(false),
    });
    // The timeline, every 100 ms; the agent, where the policy has one.
    let sampler = spawn_sampler(&shared, cg.dir().to_path_buf(), pid, t0);
    let agent = spawn_agent(cfg, kind, walk_ns, pid, &shared, t0)?;
    let result = phases(cfg, way, port, pid, &cg, &shared, stop, progress);
    shared.done.store(true, Ordering::SeqCst);
    let agent = match agent {
        Some(h) => h.join().expect("agent thread"),
        None => Ok((Vec::new(), 0.0)),
    };
    sampler.join().expect("sampler thread");
    // A phase that lost its connection: say what became of the server.
    let result = result.map_err(|e| match server.child.try_wait() {
        Ok(Some(st)) => e.context(format!(
            "redis-server ended ({st}) during the {way} run; its cgroup's OOM kills: {}",
            cg.oom_kills()
        )),
        _ => e,
    });
    server.shutdown();
    let mut row = result?;
    let (log, agent_cpu_s) = agent.map_err(|e| anyhow::anyhow!("the {way} agent failed: {e}"))?;
    row.agent_cpu_s = agent_cpu_s;
    let vm1 = pagewise_testkit::host::vmstat(&VMSTAT)?;
    row.vmstat = VMSTAT
        .iter()
        .zip(vm0.iter().zip(vm1))
        .map(|(k, (a, b))| (k.to_string(), b.saturating_sub(*a)))
        .collect();
    row.timeline = std::mem::take(&mut *shared.samples.lock().expect("not poisoned"));
    row.oom_kills = cg.oom_kills();
    row.peak_mib = row
        .timeline
        .iter()
        .map(|s| s.cgroup_mib)
        .fold(0.0, f64::max);
    recovery::account(&mut row, &log, cfg, way);
    Ok(row)
}

/// What an agent thread returns: its decisions and its CPU time, s.
type AgentThread = std::thread::JoinHandle<pagewise::Result<(Vec<(f64, Action)>, f64)>>;

/// The timeline: every 100 ms, the group's memory and the server's
/// resident and huge memory, with the phase, until `shared.done`.
fn spawn_sampler(
    shared: &Arc<Shared>,
    dir: std::path::PathBuf,
    pid: i32,
    t0: Instant,
) -> std::thread::JoinHandle<()> {
    let shared = shared.clone();
    std::thread::spawn(move || {
        while !shared.done.load(Ordering::SeqCst) {
            let usage = pagewise_testkit::host::memory_use(&dir)
                .map(|u| u.usage)
                .unwrap_or(0);
            let r = pagewise_testkit::host::resident(pid).unwrap_or_default();
            let phase = shared.phase.lock().expect("not poisoned").clone();
            shared.samples.lock().expect("not poisoned").push(Sample {
                t_s: t0.elapsed().as_secs_f64(),
                phase,
                cgroup_mib: mib(usage),
                rss_mib: r.rss_kib as f64 / 1024.0,
                huge_mib: r.anon_huge_kib as f64 / 1024.0,
            });
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// The agent of `way` in a thread of its own (none for `linux`), stepping
/// every interval until `shared.done`; it returns its decisions (time
/// since `t0`, action) and its CPU time, s.
fn spawn_agent(
    cfg: &Config,
    way: Way,
    walk_ns: f64,
    pid: i32,
    shared: &Arc<Shared>,
    t0: Instant,
) -> Result<Option<AgentThread>> {
    Ok(match way.agent_options(cfg, walk_ns) {
        None => None,
        Some(opts) => {
            let mut a = Agent::new(&[pid], opts)?;
            let shared = shared.clone();
            let interval = Duration::from_millis(cfg.interval_ms);
            Some(std::thread::spawn(move || {
                let mut log: Vec<(f64, Action)> = Vec::new();
                let cpu0 = pagewise_sys::process::thread_cpu_ns();
                let cadence = Cadence::default().interval(interval);
                drive(&mut a, &cadence, &shared.done, None, |_, step| {
                    let t = t0.elapsed().as_secs_f64();
                    log.extend(step.actions.into_iter().map(|x| (t, x)));
                    Ok::<_, pagewise::Error>(ControlFlow::Continue(()))
                })?;
                let cpu = (pagewise_sys::process::thread_cpu_ns() - cpu0) as f64 / 1e9;
                // The agent is dropped here: max_ptes_none is put back.
                Ok((log, cpu))
            }))
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn phases(
    cfg: &Config,
    way: &str,
    port: u16,
    pid: i32,
    cg: &MemoryCgroup,
    shared: &Shared,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<Row> {
    let mut c = Client::connect(port)?;
    set_phase(shared, "P1 insert", progress, way);
    let (_, p1_set_per_s, err) = load(
        &mut c,
        cfg.p1_keys,
        256,
        &|i| vec![b"SET".to_vec(), p1_key(i), value(i, cfg.p1_bytes)],
        stop,
    );
    if let Some(e) = err {
        return Err(e.context("P1"));
    }
    set_phase(shared, "P2 delete", progress, way);
    let gone = deleted(cfg);
    let dels: Vec<u64> = (0..cfg.p1_keys).filter(|&i| gone[i as usize]).collect();
    let (_, _, err) = load(
        &mut c,
        dels.len() as u64,
        256,
        &|i| vec![b"DEL".to_vec(), p1_key(dels[i as usize])],
        stop,
    );
    if let Some(e) = err {
        return Err(e.context("P2"));
    }
    set_phase(shared, "P2 pause", progress, way);
    let t = Instant::now();
    let (mut last, mut since) = (u64::MAX, Instant::now());
    while t.elapsed() < Duration::from_secs(cfg.settle_max_s) {
        check(stop)?;
        let huge = pagewise_testkit::host::resident(pid)?.anon_huge_kib;
        if huge != last {
            (last, since) = (huge, Instant::now());
        }
        if t.elapsed() >= Duration::from_secs(cfg.settle_min_s)
            && since.elapsed() >= Duration::from_secs(3)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let after_p2 = cg.usage()?.usage;
    let seen = pagewise_inspect::inspect(
        &[pid],
        pagewise_inspect::Options::default().bloom_sample(true),
        &mut |_, _| {},
    )?;
    let bloat = seen.bloat_bytes;
    let bloat_regions = seen
        .regions
        .iter()
        .filter(|r| r.bloat_pages > 0)
        .map(|r| (r.start, r.bloat_pages))
        .collect();
    set_phase(shared, "P3 insert", progress, way);
    let (p3_inserted, p3_set_per_s, err) = load(
        &mut c,
        cfg.p3_keys,
        8,
        &|i| vec![b"SET".to_vec(), p3_key(i), value(P3_SEED + i, cfg.p3_bytes)],
        stop,
    );
    check(stop)?;
    let alive = !oom::ended(pid, cg, err.is_some());
    let end = cg.usage()?.usage;
    let p3_completed = err.is_none() && alive;
    if let (Some(e), true) = (&err, alive) {
        // Redis is alive and refused: not the experiment's outcome.
        bail!("P3 failed with Redis alive: {e:#}");
    }
    let mut row = Row {
        way: way.into(),
        repeat: 0,
        p3_completed,
        p3_inserted,
        oom_kills: 0,
        peak_mib: 0.0,
        after_p2_mib: mib(after_p2),
        end_mib: mib(end),
        bloat_before_p3_mib: mib(bloat),
        recovered_mib: 0.0,
        recovered_of_bloat_mib: 0.0,
        recovered_in_10s: None,
        t90_s: None,
        max_stop_ms: 0.0,
        promoted: 0,
        p1_set_per_s,
        p3_set_per_s,
        get_per_s: None,
        huge_share_end: 0.0,
        verified: 0,
        lost: 0,
        died_after_p3: None,
        agent_cpu_s: 0.0,
        vmstat: Vec::new(),
        timeline: Vec::new(),
        bloat_regions,
    };
    if !p3_completed {
        return Ok(row);
    }
    let r = pagewise_testkit::host::resident(pid)?;
    row.huge_share_end = r.anon_huge_kib as f64 / r.rss_kib.max(1) as f64;
    let mut phase = "verify";
    match after_p3(
        cfg, &mut c, &gone, &mut row, &mut phase, shared, progress, way, stop,
    ) {
        // Killed after P3 (the OOM killer, at a limit Redis's memory
        // reached): an outcome, not a failure of the benchmark.
        Err(_) if !pagewise_mech::procfs::is_alive(pid) => {
            row.died_after_p3 = Some(phase.to_string());
            Ok(row)
        }
        Err(e) => Err(e),
        Ok(()) => Ok(row),
    }
}

/// Reads every value back (phase `verify`), then measures GETs (`GET`);
/// `phase` says which was running.
#[allow(clippy::too_many_arguments)]
fn after_p3(
    cfg: &Config,
    c: &mut Client,
    gone: &[bool],
    row: &mut Row,
    phase: &mut &'static str,
    shared: &Shared,
    progress: &mut dyn FnMut(&str),
    way: &str,
    stop: &AtomicBool,
) -> Result<()> {
    // Every value back, as written.
    set_phase(shared, "verify", progress, way);
    let kept: Vec<u64> = (0..cfg.p1_keys).filter(|&i| !gone[i as usize]).collect();
    let mut check_all = |keys: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>| -> Result<()> {
        let all: Vec<(Vec<u8>, Vec<u8>)> = keys.collect();
        for chunk in all.chunks(64) {
            check(stop)?;
            let cmds: Vec<Vec<&[u8]>> = chunk
                .iter()
                .map(|(k, _)| vec![&b"GET"[..], k.as_slice()])
                .collect();
            for (got, (_, want)) in c.pipeline(&cmds)?.into_iter().zip(chunk) {
                if got.as_ref() == Some(want) {
                    row.verified += 1;
                } else {
                    row.lost += 1;
                }
            }
        }
        Ok(())
    };
    check_all(&mut kept.iter().map(|&i| (p1_key(i), value(i, cfg.p1_bytes))))?;
    check_all(&mut (0..cfg.p3_keys).map(|i| (p3_key(i), value(P3_SEED + i, cfg.p3_bytes))))?;
    // GET throughput over the small values left.
    *phase = "GET";
    set_phase(shared, "GET", progress, way);
    let t = Instant::now();
    let mut n = 0u64;
    let mut rng = pagewise_mech::workload::Rng::new(0x9e37_79b9_7f4a_7c15);
    while t.elapsed().as_secs_f64() < cfg.get_seconds {
        check(stop)?;
        let keys: Vec<Vec<u8>> = (0..64)
            .map(|_| p1_key(kept[rng.below(kept.len() as u64) as usize]))
            .collect();
        let cmds: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"GET"[..], k]).collect();
        c.pipeline(&cmds)?;
        n += 64;
    }
    row.get_per_s = Some(n as f64 / t.elapsed().as_secs_f64());
    Ok(())
}

/// Why the experiment cannot run here, or `None` when it can.
pub fn unavailable() -> Option<String> {
    let p = pagewise_mech::probe::get();
    if !p.madv_collapse || !p.process_madvise {
        return Some(format!(
            "{} / {}",
            p.why("madv_collapse"),
            p.why("process_madvise")
        ));
    }
    match pagewise_testkit::host::memory_cgroup_dir(None) {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Some(
                "no memory cgroup hierarchy (v1 memory or v2 with the memory controller)".into(),
            )
        }
        Err(e) => return Some(format!("reading this process's cgroup: {e}")),
    }
    let writable = std::fs::OpenOptions::new().write(true).open(THP).is_ok();
    (!writable).then(|| format!("{THP} is not writable here (root, and no lockdown of it)"))
}

/// Runs the experiment: the `ways` this kernel can run; `skipped` says
/// why each other one is not run ([`Way::chosen`]).
pub fn run(
    cfg: &Config,
    ways: &[Way],
    skipped: &[String],
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    if !which("redis-server") {
        bail!("redis-server is not installed (scripts/setup.sh installs it)");
    }
    let stop = pagewise_sys::signal::stop_flag()?;
    let _pages = SettingGuard::set(
        format!("{KHUGEPAGED}/pages_to_scan"),
        &cfg.khugepaged_pages.to_string(),
    )
    .context("setting khugepaged's pace")?;
    let _sleep = SettingGuard::set(
        format!("{KHUGEPAGED}/scan_sleep_millisecs"),
        &cfg.khugepaged_sleep_ms.to_string(),
    )?;
    progress("measuring a page walk's cost");
    let walk_ns = pagewise_thp::calibrate_walk_cost(64 << 20, 1 << 20)?
        .walk_ns
        .unwrap_or(30.0)
        .max(1.0);
    let mut rows = Vec::new();
    for repeat in 0..cfg.repeats.max(1) {
        for &way in ways {
            let mut row = one(cfg, way, walk_ns, &stop, &mut |m: &str| {
                progress(&format!("run {}: {m}", repeat + 1))
            })?;
            row.repeat = repeat;
            if repeat > 0 {
                row.timeline = Vec::new();
            }
            rows.push(row);
        }
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        rows,
        skipped: skipped.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P2 deletes exactly its share of the P1 keys, the same keys every
    /// run, spread over the whole key space.
    #[test]
    fn p2_deletes_its_share_the_same_keys_every_run() {
        let cfg = Config::quick();
        let gone = deleted(&cfg);
        assert_eq!(gone.len() as u64, cfg.p1_keys);
        let want = (cfg.p1_keys as f64 * cfg.delete_share) as usize;
        assert_eq!(gone.iter().filter(|&&g| g).count(), want);
        assert_eq!(gone, deleted(&cfg));
        // Each half of the key space loses its share, give or take 10 %.
        let half = gone.len() / 2;
        let first = gone[..half].iter().filter(|&&g| g).count() as f64;
        let share = first / half as f64;
        assert!(
            (share - cfg.delete_share).abs() < 0.1 * cfg.delete_share,
            "{share} of the first half deleted, against {}",
            cfg.delete_share
        );
    }
}
