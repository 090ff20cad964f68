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

use crate::median_min_max;
use crate::redis::{free_port, redis_args, which};
use anyhow::{bail, Context, Result};
use pagewise_snap::criu::PageServer;
use pagewise_snap::DiskStore;
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
    })
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
        s
    }
}
