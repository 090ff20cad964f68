//! `pagewise bench criu`: CRIU's dumps kept by pagewise's page server
//! against CRIU's own, in one run (issue 60, item 5, its first two
//! figures). A real `redis-server` on loopback holds `keys` values; it is
//! dumped `dumps` times with `criu dump --leave-running --page-server`,
//! each time into CRIU's own page server (`criu page-server -D DIR`, a
//! directory per dump) and into pagewise's twice (one store each): as
//! `page-server` runs by default (a page whose digest matches a stored
//! one is compared byte for byte) and trusting the digest (`--no-verify`).
//! Each of the three goes first once every three dumps. Between dumps a
//! client rewrites `percent` % of the keys with new values (bounded: a
//! fixed count of SETs).
//!
//! Measured: the bytes each keeps on disk for all the dumps (CRIU's
//! `pages-*.img` and `pagemap-*.img`; pagewise's store, the dumps'
//! records included), and the time of each `criu dump` through each
//! server (medians with their spread). Checked: every key answers its
//! value after the last dump, and every dump was closed whole.
//!
//! Then the original Redis is stopped and, `restores` times, the last
//! dump is restored afresh by `criu restore` (its images, with the pages
//! pagewise exports), against `criu restore` of the dump before it (one
//! round of rewrites apart) and the last put into it in place
//! (`snapshot restore --criu`): the time of
//! each, and every restored Redis checked key by key; the last one put
//! in place then serves a bounded `redis-benchmark`.
//!
//! Last, `lazy` rounds of `criu restore --lazy-pages` of the last dump,
//! its lazy pages fetched by `criu lazy-pages --page-server` from CRIU's
//! own page server (`criu page-server --lazy-pages -D`, the exported
//! images) and from pagewise's (`page-server --lazy`, the store), in
//! turn: the time to a first GET answered and until every page is in,
//! and every key checked. CRIU's server needs `fs.pipe-max-size` of
//! 4 MiB: set, journaled, for the lazy rounds and put back after.

use crate::median_min_max;
use crate::redis::{free_port, redis_args, which};
use anyhow::{bail, Context, Result};
use pagewise_snap::criu::PageServer;
use pagewise_snap::DiskStore;
use pagewise_testkit::criu::Restored;
use pagewise_testkit::servers::{fill, value, Kv};
use serde::Serialize;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[derive(clap::Args)]
/// The experiment's arguments.
pub struct Args {
    /// Keys of the data set (values of `--value-bytes`).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Bytes of each value.
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// Dumps.
    #[arg(long, default_value_t = 10)]
    dumps: usize,
    /// Keys rewritten between dumps, %.
    #[arg(long, default_value_t = 1.0)]
    percent: f64,
    /// Rounds of the restores: `criu restore` of the last dump against
    /// `criu restore` of the first and the last put in place.
    #[arg(long, default_value_t = 5)]
    restores: usize,
    /// Rounds of the lazy restores of the last dump, each served by
    /// CRIU's page server and by pagewise's.
    #[arg(long, default_value_t = 3)]
    lazy: usize,
    #[command(flatten)]
    output: crate::report::Output,
}

/// The experiment's size, as run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Keys.
    pub keys: u64,
    /// Bytes of each value.
    pub value_bytes: usize,
    /// Dumps.
    pub dumps: usize,
    /// Keys rewritten between dumps, %.
    pub percent: f64,
    /// Rounds of the restores.
    pub restores: usize,
    /// Rounds of the lazy restores.
    pub lazy: usize,
}

/// One lazy restore of the last dump (`criu restore --lazy-pages`, its
/// pages fetched by `criu lazy-pages --page-server` from a page server).
#[derive(Debug, Clone, Serialize)]
pub struct Lazy {
    /// Its round (1 on).
    pub n: usize,
    /// The page server: `criu` (`criu page-server --lazy-pages -D`, from
    /// the exported images) or `pagewise` (`page-server --lazy`, from the
    /// store).
    pub server: String,
    /// From the start of `criu restore` to the answer of a first GET sent
    /// as soon as it returns, ms.
    pub first_answer_ms: f64,
    /// From the start of `criu restore` until `criu lazy-pages` ends
    /// (every lazy page in), ms.
    pub full_ms: f64,
    /// Keys checked in the restored Redis (every key).
    pub keys_checked: u64,
}

/// One round of the restores (the original Redis gone): the last dump
/// restored afresh by CRIU, against the one before it (one round of
/// rewrites apart) restored by CRIU and the last put into it in place by
/// pagewise.
#[derive(Debug, Clone, Serialize)]
pub struct Restore {
    /// Its number (1 on).
    pub n: usize,
    /// `criu restore -d` of the last dump (from pagewise's export), ms.
    pub fresh_ms: f64,
    /// `criu restore -d` of the dump before the last, ms (not timed
    /// against: the process the last dump goes into).
    pub base_ms: f64,
    /// `pagewise snapshot restore --criu` of the last dump into it, ms
    /// (until its refusal, where it was refused).
    pub in_place_ms: f64,
    /// Why the in-place restore was refused, if it was (the process is
    /// then left as `criu restore` of the base dump made it).
    pub refused: Option<String>,
    /// Pages it compared.
    pub pages_compared: u64,
    /// Pages it wrote.
    pub pages_written: u64,
    /// Keys checked in each restored Redis (both, every key).
    pub keys_checked: u64,
}

/// One dump through both servers.
#[derive(Debug, Clone, Serialize)]
pub struct Dump {
    /// Its number (1 on).
    pub n: usize,
    /// `criu dump` through CRIU's own page server, ms.
    pub criu_ms: f64,
    /// `criu dump` through pagewise's, ms (its default: a page whose
    /// digest matches a stored one is compared byte for byte).
    pub pagewise_ms: f64,
    /// `criu dump` through pagewise's trusting the 128-bit digest
    /// (`page-server --no-verify`), ms.
    pub pagewise_trusting_ms: f64,
    /// Pages CRIU sent (pagewise's count).
    pub pages: u64,
    /// Bytes CRIU's page server wrote for it.
    pub criu_bytes: u64,
    /// Bytes pagewise's store grew by.
    pub pagewise_bytes: u64,
}

/// What the experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: crate::Machine,
    /// The configuration.
    pub config: Config,
    /// `criu --version`.
    pub criu: String,
    /// `redis-server --version`.
    pub redis: String,
    /// The dumps.
    pub dumps: Vec<Dump>,
    /// Bytes CRIU's page server kept for all the dumps.
    pub criu_total_bytes: u64,
    /// Bytes pagewise's store holds for all of them.
    pub pagewise_total_bytes: u64,
    /// Keys checked after the last dump (all of them).
    pub keys_checked: u64,
    /// The restores.
    pub restores: Vec<Restore>,
    /// `redis-benchmark` (SET and GET, bounded) against the last Redis
    /// put in place: requests a second.
    pub benchmark_after: (f64, f64),
    /// Pages of the last dump CRIU marked lazy.
    pub lazy_pages: u64,
    /// The lazy restores, by round and server.
    pub lazy: Vec<Lazy>,
}

/// Bytes of the files under `dir` whose names `keep` accepts.
fn bytes_under(dir: &Path, keep: &dyn Fn(&str) -> bool) -> u64 {
    let mut n = 0;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            n += bytes_under(&p, keep);
        } else if keep(&e.file_name().to_string_lossy()) {
            n += m.len();
        }
    }
    n
}

/// `criu dump` of `pid` into the page server at `port`, leaving it
/// running; its time.
fn dump(criu: &Path, pid: u32, images: &Path, port: u16) -> Result<Duration> {
    pagewise_testkit::criu::dump_to_page_server(criu, pid, images, port, &["--leave-running"])
        .map_err(|why| anyhow::anyhow!("{why}"))
}

/// Rewrites `n` keys (spread over all of them) with values of round `r`.
fn rewrite(port: u16, keys: u64, n: u64, len: usize, r: u64) -> Result<()> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    let mut w = s.try_clone()?;
    let mut rd = BufReader::new(s);
    let step = (keys / n.max(1)).max(1);
    let mut sent = 0;
    let mut k = (r * 7) % step;
    while sent < n && k < keys {
        let v = value(k ^ (r << 40), len);
        let name = pagewise_testkit::servers::key(k);
        let cmd = [b"SET".as_slice(), name.as_bytes(), &v];
        let mut buf = Vec::new();
        buf.extend_from_slice(format!("*{}\r\n", cmd.len()).as_bytes());
        for part in cmd {
            pagewise_testkit::servers::bulk(&mut buf, part);
        }
        w.write_all(&buf)?;
        let mut line = String::new();
        rd.read_line(&mut line)?;
        if !line.starts_with("+OK") {
            bail!("SET of key {k}: {line:?}");
        }
        sent += 1;
        k += step;
    }
    Ok(())
}

/// Every key's value, after `rounds` rewrites: the last value written.
fn check_all(port: u16, cfg: &Config, rewritten: &[(u64, u64)]) -> Result<u64> {
    let mut latest = std::collections::HashMap::new();
    for &(k, r) in rewritten {
        latest.insert(k, r);
    }
    let s = TcpStream::connect(("127.0.0.1", port))?;
    let mut w = s.try_clone()?;
    let mut rd = BufReader::new(s);
    let mut checked = 0;
    for k in 0..cfg.keys {
        let mut buf = Vec::new();
        Kv::Redis.get(&mut buf, k);
        w.write_all(&buf)?;
        let got = Kv::Redis.got(&mut rd)?;
        let want = match latest.get(&k) {
            Some(&r) => value(k ^ (r << 40), cfg.value_bytes),
            None => value(k, cfg.value_bytes),
        };
        if got.as_deref() != Some(&want[..]) {
            bail!("key {k} does not hold its last value after the dumps");
        }
        checked += 1;
    }
    Ok(checked)
}

/// The keys `rewrite` writes in round `r`.
fn rewritten_keys(keys: u64, n: u64, r: u64) -> Vec<(u64, u64)> {
    let step = (keys / n.max(1)).max(1);
    let mut out = Vec::new();
    let mut k = (r * 7) % step;
    while (out.len() as u64) < n && k < keys {
        out.push((k, r));
        k += step;
    }
    out
}

fn version(prog: &Path, arg: &str) -> String {
    Command::new(prog)
        .arg(arg)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().replace('\n', " "))
        .unwrap_or_default()
}

/// A redis-server in a session of its own, its streams on a file (as
/// CRIU dumps a process without `--shell-job`), killed on drop.
struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the experiment.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    let criu = pagewise_testkit::criu::criu4().map_err(|why| anyhow::anyhow!("{why}"))?;
    if !which("redis-server") {
        bail!("redis-server is needed: run scripts/setup.sh");
    }
    let cfg = Config {
        keys: a.keys,
        value_bytes: a.value_bytes,
        dumps: a.dumps.max(1),
        percent: a.percent,
        restores: a.restores.max(1),
        lazy: a.lazy,
    };
    let work = std::env::temp_dir().join(format!("pagewise-bench-criu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let r = measure(&cfg, &criu, &work, quiet);
    let _ = std::fs::remove_dir_all(&work);
    let report = r?;
    a.output.emit(&report, report.summary(), Vec::new())
}

fn measure(cfg: &Config, criu: &Path, work: &Path, quiet: bool) -> Result<Report> {
    let port = free_port()?;
    let log = std::fs::File::create(work.join("redis.log"))?;
    let redis = Redis(
        Command::new("setsid")
            .arg("redis-server")
            .args(redis_args(port))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting redis-server")?,
    );
    crate::redis::wait_ready(port)?;
    fill(Kv::Redis, port, cfg.keys, cfg.value_bytes)?;
    // pagewise's page servers, one store each for every dump, on a
    // thread each: its default, and trusting the digest (--no-verify).
    let serve = |dir: PathBuf,
                 verify: bool|
     -> Result<(
        u16,
        std::thread::JoinHandle<Result<Vec<pagewise_snap::criu::Received>>>,
    )> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let mut server = PageServer::new(DiskStore::create(&dir, verify)?);
        let dumps = cfg.dumps;
        let h = std::thread::spawn(move || {
            let mut all = Vec::new();
            for _ in 0..dumps {
                let (s, _) = listener.accept()?;
                all.push(server.serve(s)?);
            }
            Ok(all)
        });
        Ok((port, h))
    };
    let store_dir = work.join("store");
    let (pw_port, pw) = serve(store_dir.clone(), true)?;
    let (trust_port, trust) = serve(work.join("store-trusting"), false)?;
    let per_round = ((cfg.keys as f64) * cfg.percent / 100.0).round() as u64;
    let mut rewritten = Vec::new();
    let mut rows = Vec::new();
    let pid = redis.0.id();
    for n in 1..=cfg.dumps {
        if n > 1 {
            rewrite(port, cfg.keys, per_round, cfg.value_bytes, n as u64)?;
            rewritten.extend(rewritten_keys(cfg.keys, per_round, n as u64));
        }
        let own = work.join(format!("criu-{n}"));
        std::fs::create_dir_all(&own)?;
        let their_port = free_port()?;
        let mut theirs = Command::new(criu)
            .args(["page-server", "--port", &their_port.to_string(), "-D"])
            .arg(&own)
            .stderr(Stdio::null())
            .spawn()?;
        pagewise_testkit::criu::wait_listening(their_port)
            .map_err(|why| anyhow::anyhow!("{why}"))?;
        // The three in turn, each first once every three dumps.
        let mut order = [(0, their_port), (1, pw_port), (2, trust_port)];
        order.rotate_left((n - 1) % 3);
        let mut took = [Duration::ZERO; 3];
        for (i, port) in order {
            took[i] = dump(criu, pid, &work.join(format!("img-{i}-{n}")), port)?;
        }
        let [criu_t, pw_t, trust_t] = took;
        if !theirs.wait()?.success() {
            bail!("criu page-server of dump {n} failed");
        }
        let criu_bytes = bytes_under(&own, &|f| f.ends_with(".img"));
        rows.push(Dump {
            n,
            criu_ms: criu_t.as_secs_f64() * 1e3,
            pagewise_ms: pw_t.as_secs_f64() * 1e3,
            pagewise_trusting_ms: trust_t.as_secs_f64() * 1e3,
            pages: 0,
            criu_bytes,
            pagewise_bytes: 0,
        });
        if !quiet {
            eprintln!(
                "dump {n} of {}: criu {:.0} ms, pagewise {:.0} ms",
                cfg.dumps,
                criu_t.as_secs_f64() * 1e3,
                pw_t.as_secs_f64() * 1e3
            );
        }
    }
    let got = pw
        .join()
        .map_err(|_| anyhow::anyhow!("the page server's thread panicked"))??;
    let trusted = trust
        .join()
        .map_err(|_| anyhow::anyhow!("the page server's thread panicked"))??;
    for g in &trusted {
        if g.broken.is_some() || !g.closed {
            bail!("a dump through pagewise --no-verify broke: {:?}", g.broken);
        }
    }
    for (row, g) in rows.iter_mut().zip(&got) {
        if let Some(why) = &g.broken {
            bail!("dump {} through pagewise broke: {why}", row.n);
        }
        if !g.closed {
            bail!("dump {} through pagewise was not closed", row.n);
        }
        row.pages = g.present_pages;
        row.pagewise_bytes = g.stored_bytes;
    }
    let keys_checked = check_all(port, cfg, &rewritten)?;
    let pid = redis.0.id();
    drop(redis);
    let (restores, benchmark_after) =
        restore_rounds(cfg, criu, work, &store_dir, pid, port, &rewritten, quiet)?;
    let lazy_pages = lazy_pages_of(&store_dir, cfg.dumps as u64)?;
    let lazy = lazy_rounds(cfg, criu, work, &store_dir, pid, port, &rewritten, quiet)?;
    let criu_total_bytes = rows.iter().map(|r| r.criu_bytes).sum();
    let pagewise_total_bytes = bytes_under(&store_dir, &|_| true);
    Ok(Report {
        machine: crate::Machine::this(),
        config: cfg.clone(),
        criu: version(criu, "--version"),
        redis: version(Path::new("/usr/bin/redis-server"), "--version"),
        dumps: rows,
        criu_total_bytes,
        pagewise_total_bytes,
        keys_checked,
        restores,
        benchmark_after,
        lazy_pages,
        lazy,
    })
}

/// The largest pipe an unprivileged process may make.
const PIPE_MAX: &str = "/proc/sys/fs/pipe-max-size";

/// Pages dump `dump` of the store marked lazy (`PE_LAZY` with `PE_PRESENT`).
fn lazy_pages_of(store_dir: &Path, dump: u64) -> Result<u64> {
    let path = store_dir.join(format!("criu/dump-{dump}.json"));
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let mut n = 0;
    for pm in rec["pagemaps"].as_array().into_iter().flatten() {
        for r in pm["runs"].as_array().into_iter().flatten() {
            if r["flags"].as_u64().unwrap_or(0) & 6 == 6 {
                n += r["nr_pages"].as_u64().unwrap_or(0);
            }
        }
    }
    Ok(n)
}

/// The lazy restores (see [`Lazy`]): `cfg.lazy` rounds, each served by
/// CRIU's page server and by pagewise's, in turn.
#[allow(clippy::too_many_arguments)]
fn lazy_rounds(
    cfg: &Config,
    criu: &Path,
    work: &Path,
    store_dir: &Path,
    pid: u32,
    port: u16,
    rewritten: &[(u64, u64)],
    quiet: bool,
) -> Result<Vec<Lazy>> {
    let mut lazy = Vec::new();
    if cfg.lazy == 0 {
        return Ok(lazy);
    }
    // CRIU's lazy page server splices pages through pipes of 4 MiB
    // (journaled, put back when the guard drops).
    let _pipes = pagewise_agent::settings::SettingGuard::set(PIPE_MAX, "4194304")?;
    let last = work.join(format!("img-1-{}", cfg.dumps));
    for n in 1..=cfg.lazy {
        let mut servers = ["criu", "pagewise"];
        if n % 2 == 0 {
            servers.reverse();
        }
        for server in servers {
            let l = lazy_round(cfg, criu, &last, store_dir, pid, port, rewritten, server, n)?;
            if !quiet {
                eprintln!(
                    "lazy restore {n} of {} from {server}: first answer {:.1} ms, all pages in {:.0} ms",
                    cfg.lazy, l.first_answer_ms, l.full_ms
                );
            }
            lazy.push(l);
        }
    }
    Ok(lazy)
}

/// One lazy restore of the dump in `images` served by `server` (see
/// [`Lazy`]); the restored Redis checked key by key, then stopped.
#[allow(clippy::too_many_arguments)]
fn lazy_round(
    cfg: &Config,
    criu: &Path,
    images: &Path,
    store_dir: &Path,
    pid: u32,
    port: u16,
    rewritten: &[(u64, u64)],
    server: &str,
    n: usize,
) -> Result<Lazy> {
    let ps_port = free_port()?;
    let sock = images.join("lazy-pages.socket");
    let _ = std::fs::remove_file(&sock);
    // The page server: CRIU's from the images, or pagewise's from the
    // store, on a thread of this process.
    let mut theirs = None;
    let mut ours = None;
    if server == "criu" {
        theirs = Some(Redis(
            Command::new(criu)
                .args([
                    "page-server",
                    "--lazy-pages",
                    "--port",
                    &ps_port.to_string(),
                ])
                .args(["-o", "ps.log", "-D"])
                .arg(images)
                .stderr(Stdio::null())
                .spawn()?,
        ));
        pagewise_testkit::criu::wait_listening(ps_port).map_err(|why| anyhow::anyhow!("{why}"))?;
    } else {
        let listener = TcpListener::bind(("127.0.0.1", ps_port))?;
        let mut ps = PageServer::new(DiskStore::open(store_dir)?);
        ps.serve_lazy(cfg.dumps as u64)?;
        ours = Some(std::thread::spawn(
            move || -> Result<pagewise_snap::criu::Received> {
                let (s, _) = listener.accept()?;
                Ok(ps.serve(s)?)
            },
        ));
    }
    let daemon = Redis(
        Command::new(criu)
            .args(["lazy-pages", "--page-server", "--address", "127.0.0.1"])
            .args(["--port", &ps_port.to_string(), "-o", "lazy.log", "-D"])
            .arg(images)
            .stderr(Stdio::null())
            .spawn()?,
    );
    let t0 = std::time::Instant::now();
    while !sock.exists() {
        if t0.elapsed() > Duration::from_secs(10) {
            bail!("criu lazy-pages made no {} in 10 s", sock.display());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let t0 = std::time::Instant::now();
    let (restored, _) = pagewise_testkit::criu::restore(criu, images, &["--lazy-pages"], pid)
        .map_err(|why| anyhow::anyhow!("from {server}: {why}"))?;
    // A first GET, as soon as the process runs.
    let first = {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        let mut w = s.try_clone()?;
        let mut rd = BufReader::new(s);
        let mut buf = Vec::new();
        Kv::Redis.get(&mut buf, 0);
        w.write_all(&buf)?;
        Kv::Redis.got(&mut rd)?;
        t0.elapsed()
    };
    let mut daemon = daemon;
    let full = loop {
        if let Some(st) = daemon.0.try_wait()? {
            if !st.success() {
                bail!("criu lazy-pages from {server}: {st}");
            }
            break t0.elapsed();
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("criu lazy-pages from {server} still running after 60 s");
        }
        std::thread::sleep(Duration::from_micros(500));
    };
    let keys_checked = check_all(port, cfg, rewritten)?;
    drop(restored);
    if let Some(h) = ours {
        let got = h
            .join()
            .map_err(|_| anyhow::anyhow!("the lazy page server's thread panicked"))??;
        if let Some(why) = got.broken {
            bail!("pagewise's lazy page server broke: {why}");
        }
    }
    drop(theirs);
    Ok(Lazy {
        n,
        server: server.to_string(),
        first_answer_ms: first.as_secs_f64() * 1e3,
        full_ms: full.as_secs_f64() * 1e3,
        keys_checked,
    })
}

/// `criu restore -d -D images` (see [`pagewise_testkit::criu::restore`]).
fn criu_restore(criu: &Path, images: &Path, pid: u32) -> Result<(Restored, Duration)> {
    pagewise_testkit::criu::restore(criu, images, &[], pid).map_err(|why| anyhow::anyhow!("{why}"))
}

/// The restores (see [`Restore`]), each Redis checked key by key; the
/// last one put in place then serves `redis-benchmark`.
#[allow(clippy::too_many_arguments)]
fn restore_rounds(
    cfg: &Config,
    criu: &Path,
    work: &Path,
    store_dir: &Path,
    pid: u32,
    port: u16,
    rewritten: &[(u64, u64)],
    quiet: bool,
) -> Result<(Vec<Restore>, (f64, f64))> {
    // The dumps' own images (of pagewise's first store, whose page
    // server they went through) with their pages exported beside them.
    let store = DiskStore::open(store_dir)?;
    // The base: the dump before the last (1 % of the keys rewritten
    // between them), as the report says.
    let base = cfg.dumps.saturating_sub(1).max(1);
    let (first, last) = (
        work.join(format!("img-1-{base}")),
        work.join(format!("img-1-{}", cfg.dumps)),
    );
    pagewise_snap::criu::export(&store, base as u64, &first)?;
    pagewise_snap::criu::export(&store, cfg.dumps as u64, &last)?;
    let mut out = Vec::new();
    let mut bench = (0.0, 0.0);
    for n in 1..=cfg.restores {
        let fresh = |out: &mut u64| -> Result<f64> {
            let (r, took) = criu_restore(criu, &last, pid)?;
            *out = check_all(port, cfg, rewritten)?;
            drop(r);
            Ok(took.as_secs_f64() * 1e3)
        };
        let mut keys = 0;
        // Each goes first every other round.
        let fresh_ms = if n % 2 == 1 { fresh(&mut keys)? } else { 0.0 };
        let (r, first_took) = criu_restore(criu, &first, pid)?;
        let t0 = std::time::Instant::now();
        let put = pagewise_snap::criu::restore_in_place(&last, pid as i32, None);
        let in_place = t0.elapsed();
        let (put, refused) = match put {
            Ok(p) => (p, None),
            Err(e @ pagewise_snap::Error::Rollback(_)) => (Default::default(), Some(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        // Refused, the process is the base dump's: its keys are not the
        // last dump's.
        let keys_in_place = match refused {
            None => Some(check_all(port, cfg, rewritten)?),
            Some(_) => None,
        };
        if n == cfg.restores {
            bench = crate::redis::load(port, 20_000)?;
        }
        drop(r);
        let fresh_ms = if n % 2 == 0 {
            fresh(&mut keys)?
        } else {
            fresh_ms
        };
        if keys_in_place.is_some_and(|k| k != keys) {
            bail!("round {n}: {keys} keys checked afresh, {keys_in_place:?} in place");
        }
        if !quiet {
            eprintln!(
                "restore {n} of {}: criu restore {fresh_ms:.0} ms, in place {:.1} ms ({} of {} pages written){}",
                cfg.restores,
                in_place.as_secs_f64() * 1e3,
                put.pages_written,
                put.pages_compared,
                refused.as_deref().map(|r| format!(", refused: {r}")).unwrap_or_default()
            );
        }
        out.push(Restore {
            n,
            fresh_ms,
            base_ms: first_took.as_secs_f64() * 1e3,
            in_place_ms: in_place.as_secs_f64() * 1e3,
            refused,
            pages_compared: put.pages_compared,
            pages_written: put.pages_written,
            keys_checked: keys,
        });
    }
    Ok((out, bench))
}

impl Report {
    /// The table and the two ratios the goals speak of.
    pub fn summary(&self) -> String {
        let mib = |b: u64| b as f64 / 1048576.0;
        let mut s = format!(
            "pagewise bench criu — {}\n{}; {}\nredis-server with {} keys of {} bytes, {} dumps (criu dump --leave-running --page-server), {} % of the keys rewritten between dumps\n\n{:>5}  {:>8}  {:>10}  {:>12}  {:>14}  {:>9}  {:>13}\n",
            self.machine,
            self.criu,
            self.redis,
            self.config.keys,
            self.config.value_bytes,
            self.config.dumps,
            self.config.percent,
            "dump",
            "pages",
            "criu ms",
            "pagewise ms",
            "--no-verify ms",
            "criu MiB",
            "pagewise MiB"
        );
        for d in &self.dumps {
            s += &format!(
                "{:>5}  {:>8}  {:>10.0}  {:>12.0}  {:>14.0}  {:>9.1}  {:>13.2}\n",
                d.n,
                d.pages,
                d.criu_ms,
                d.pagewise_ms,
                d.pagewise_trusting_ms,
                mib(d.criu_bytes),
                mib(d.pagewise_bytes)
            );
        }
        let (c, clo, chi) = median_min_max(self.dumps.iter().map(|d| d.criu_ms).collect());
        let (p, plo, phi) = median_min_max(self.dumps.iter().map(|d| d.pagewise_ms).collect());
        let ratio = self.pagewise_total_bytes as f64 / self.criu_total_bytes.max(1) as f64;
        s += &format!(
            "\nkept on disk for the {} dumps: CRIU's page server {:.1} MiB, pagewise's store {:.1} MiB: {:.3} of CRIU's (goal at most 0.25)\n",
            self.config.dumps,
            mib(self.criu_total_bytes),
            mib(self.pagewise_total_bytes),
            ratio
        );
        let (t, tlo, thi) =
            median_min_max(self.dumps.iter().map(|d| d.pagewise_trusting_ms).collect());
        s += &format!(
            "dump time, median (min–max): CRIU's page server {c:.0} ms ({clo:.0}–{chi:.0}), pagewise's {p:.0} ms ({plo:.0}–{phi:.0}): {:.2}x CRIU's (goal at most 1.1x); trusting the digest (--no-verify) {t:.0} ms ({tlo:.0}–{thi:.0}): {:.2}x\n",
            p / c.max(1e-9),
            t / c.max(1e-9)
        );
        s += &format!(
            "checked: every dump through pagewise closed whole; all {} keys answer their last value after the dumps\n",
            self.keys_checked
        );
        s += &format!(
            "\nrestores of dump {} (the original stopped), {} rounds: criu restore of it, against criu restore of dump {} ({} % of the keys rewritten since) and dump {} put in place\n{:>5}  {:>9}  {:>14}  {:>13}  {:>14}  {:>8}\n",
            self.config.dumps,
            self.restores.len(),
            self.config.dumps.saturating_sub(1).max(1),
            if self.config.dumps > 1 { self.config.percent } else { 0.0 },
            self.config.dumps,
            "round",
            "fresh ms",
            "base dump ms",
            "in place ms",
            "pages written",
            "keys"
        );
        for r in &self.restores {
            s += &format!(
                "{:>5}  {:>9.0}  {:>14.0}  {:>13.1}  {:>14}  {:>8}\n",
                r.n,
                r.fresh_ms,
                r.base_ms,
                r.in_place_ms,
                match r.refused {
                    None => format!("{}/{}", r.pages_written, r.pages_compared),
                    Some(_) => "refused".to_string(),
                },
                r.keys_checked
            );
        }
        let (f, flo, fhi) = median_min_max(self.restores.iter().map(|r| r.fresh_ms).collect());
        let done: Vec<f64> = self
            .restores
            .iter()
            .filter(|r| r.refused.is_none())
            .map(|r| r.in_place_ms)
            .collect();
        if let Some(why) = self.restores.iter().find_map(|r| r.refused.as_deref()) {
            s += &format!(
                "in place: refused in {} of {} rounds (nothing written): {why}\n",
                self.restores.len() - done.len(),
                self.restores.len()
            );
        }
        if !done.is_empty() {
            let (i, ilo, ihi) = median_min_max(done);
            s += &format!(
                "restore time, median (min–max): criu restore {f:.0} ms ({flo:.0}–{fhi:.0}), in place {i:.1} ms ({ilo:.1}–{ihi:.1}): {:.1}x faster (goal at least 10x)\n",
                f / i.max(1e-9)
            );
        } else {
            s += &format!(
                "restore time, median (min–max): criu restore {f:.0} ms ({flo:.0}–{fhi:.0}); in place: none done (goal at least 10x faster)\n"
            );
        }
        s += &format!(
            "checked: every Redis restored afresh, and every one put in place, answers all its keys with the last dump's values; the last Redis of the in-place side then served redis-benchmark: {:.0} SET/s, {:.0} GET/s\n",
            self.benchmark_after.0, self.benchmark_after.1
        );
        if self.lazy.is_empty() {
            return s;
        }
        s += &format!(
            "\nlazy restores of dump {} ({} of its pages marked lazy), {} rounds, each served by CRIU's page server (criu page-server --lazy-pages -D) and by pagewise's (page-server --lazy), in turn\n{:>5}  {:>9}  {:>16}  {:>12}  {:>8}\n",
            self.config.dumps,
            self.lazy_pages,
            self.config.lazy,
            "round",
            "server",
            "first answer ms",
            "all in ms",
            "keys"
        );
        for l in &self.lazy {
            s += &format!(
                "{:>5}  {:>9}  {:>16.1}  {:>12.0}  {:>8}\n",
                l.n, l.server, l.first_answer_ms, l.full_ms, l.keys_checked
            );
        }
        let of = |who: &str, f: fn(&Lazy) -> f64| {
            median_min_max(
                self.lazy
                    .iter()
                    .filter(|l| l.server == who)
                    .map(f)
                    .collect(),
            )
        };
        let (cf, cflo, cfhi) = of("criu", |l| l.first_answer_ms);
        let (pf, pflo, pfhi) = of("pagewise", |l| l.first_answer_ms);
        let (ca, calo, cahi) = of("criu", |l| l.full_ms);
        let (pa, palo, pahi) = of("pagewise", |l| l.full_ms);
        s += &format!(
            "first answer, median (min–max): CRIU's {cf:.1} ms ({cflo:.1}–{cfhi:.1}), pagewise's {pf:.1} ms ({pflo:.1}–{pfhi:.1}): {:.2}x (goal at most 1x)\nall pages in: CRIU's {ca:.0} ms ({calo:.0}–{cahi:.0}), pagewise's {pa:.0} ms ({palo:.0}–{pahi:.0}): {:.2}x (goal at most 1x)\nchecked: every lazily restored Redis answers all its keys with the last dump's values\n",
            pf / cf.max(1e-9),
            pa / ca.max(1e-9)
        );
        s
    }
}
