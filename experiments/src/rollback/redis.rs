//! (c) **Redis test resets.** A real `redis-server` loaded with `keys` keys
//! of 1 KiB values; a test case runs `ops` random SET/DEL from a client
//! that then disconnects, and the server is reset to the loaded state:
//!
//! - **rollback**: `ProcessSnapshots` held on the server, its snapshot
//!   taken once loaded with no client connected; a reset is one restore;
//! - **undo journal**: before the case, the keys it touches saved with
//!   `DUMP`; the reset puts them back with `RESTORE ... REPLACE` or `DEL`,
//!   pipelined;
//! - **DEBUG RELOAD**: `DEBUG RELOAD NOSAVE` reloads the RDB saved once
//!   loaded (the server started with `enable-debug-command yes`);
//! - **restart**: the server shut down and started again on its RDB, until
//!   it answers `PING` with `PONG` (not `LOADING`).
//!
//! Every server runs with the same settings (loopback, no save, no
//! append-only file, jemalloc's background thread off so that the thread
//! set stays the one of the snapshot). After every reset a random sample of
//! keys is read back and `DBSIZE` checked; after the last, every key.

use super::Ms;
use crate::redis::{free_port, redis_args, wait_ready_within, Client, Server};
use anyhow::{bail, ensure, Context, Result};
use pagewise_mech::workload::Rng;
use pagewise_snap::{ProcessSnapshots, RestoreOptions};
use serde::Serialize;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Sizes of (c).
#[derive(Debug, Clone, Serialize)]
pub struct RedisConfig {
    /// Keys loaded.
    pub keys: usize,
    /// Random SET/DEL per test case.
    pub ops: usize,
    /// Resets per method (rollback and undo journal).
    pub reps: usize,
    /// Resets per method (DEBUG RELOAD and restart, which take seconds).
    pub slow_reps: usize,
    /// Keys read back after every reset.
    pub sample: usize,
}

/// One method of (c).
#[derive(Debug, Clone, Serialize)]
pub struct RedisRow {
    /// `rollback`, `undo journal`, `DEBUG RELOAD` or `restart`.
    pub method: String,
    /// Keys loaded.
    pub keys: usize,
    /// Operations per case.
    pub ops: usize,
    /// Resets measured.
    pub reps: usize,
    /// One reset, ms.
    pub reset: Ms,
    /// What the method costs during a case besides the case itself (the
    /// journal's DUMP), ms.
    pub before_case: Ms,
    /// The test case itself (under rollback: with its write-protect
    /// faults), ms.
    pub case: Ms,
    /// The method's reset over rollback's (medians).
    pub x_rollback: f64,
    /// Keys read back and found equal to the loaded state.
    pub keys_checked: u64,
    /// Rollback: pages written back per reset (median).
    pub pages_written: Option<f64>,
    /// Rollback: median phases of a reset, µs.
    pub phases: Option<pagewise_snap::RestorePhases>,
    /// Rollback: `process_vm_writev` alone writing as many pages scattered
    /// over as much memory (the floor of the copy here), ms.
    pub writev_floor: Option<Ms>,
}

const VALUE: usize = 1024;

fn key(i: usize) -> Vec<u8> {
    format!("key:{i:08}").into_bytes()
}

/// The value of key `i` at version `v` (0: loaded).
fn value(i: usize, v: u64) -> Vec<u8> {
    let unit = format!("{i}:{v};");
    unit.bytes().cycle().take(VALUE).collect()
}

/// A server of its own, with its RDB in a directory of its own.
struct Redis {
    server: Server,
    dir: std::path::PathBuf,
    extra: Vec<String>,
}

impl Redis {
    fn start(dir: &std::path::Path, extra: &[&str]) -> Result<Redis> {
        let port = free_port()?;
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let server = spawn(port, dir, &extra)?;
        Ok(Redis {
            server,
            dir: dir.to_path_buf(),
            extra,
        })
    }

    fn port(&self) -> u16 {
        self.server.port
    }

    fn pid(&self) -> i32 {
        self.server.child.id() as i32
    }

    fn client(&self) -> Result<Client> {
        Ok(Client::connect(self.port())?)
    }

    /// Shuts the server down and starts it again on its RDB; the time
    /// until it answers.
    fn restart(&mut self) -> Result<f64> {
        let t0 = Instant::now();
        self.server.shutdown();
        self.server = spawn(self.server.port, &self.dir, &self.extra)?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    }
}

fn spawn(port: u16, dir: &std::path::Path, extra: &[String]) -> Result<Server> {
    let mut args = redis_args(port);
    // The RDB in a directory of its own (redis_args points at /tmp).
    if let Some(i) = args.iter().position(|a| a == "--dir") {
        args[i + 1] = dir.display().to_string();
    }
    let child = Command::new("redis-server")
        .args(&args)
        .args(["--jemalloc-bg-thread", "no", "--dbfilename", "reset.rdb"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server")?;
    let server = Server { child, port };
    wait_ready_within(port, Duration::from_secs(60))?;
    // Listening is not loaded: PING answers LOADING until the RDB is in.
    let t0 = Instant::now();
    loop {
        let mut c = Client::connect(port)?;
        match c.pipeline(&[vec![&b"PING"[..]]]) {
            Ok(r) if r[0].as_deref() == Some(b"PONG") => break,
            _ if t0.elapsed() < Duration::from_secs(120) => {
                std::thread::sleep(Duration::from_millis(2))
            }
            r => bail!("redis did not answer PING after loading: {r:?}"),
        }
    }
    Ok(server)
}

fn load(r: &Redis, keys: usize) -> Result<()> {
    let mut c = r.client()?;
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
        let kv: Vec<(Vec<u8>, Vec<u8>)> = chunk.iter().map(|&i| (key(i), value(i, 0))).collect();
        let cmds: Vec<Vec<&[u8]>> = kv
            .iter()
            .map(|(k, v)| vec![&b"SET"[..], &k[..], &v[..]])
            .collect();
        c.pipeline(&cmds)?;
    }
    Ok(())
}

/// The operations of case `seed`: (key, new version or `None` for DEL).
fn case_ops(keys: usize, ops: usize, seed: u64) -> Vec<(usize, Option<u64>)> {
    let mut rng = Rng::new(seed);
    (0..ops)
        .map(|_| {
            let i = rng.below(keys as u64) as usize;
            let set = rng.below(2) == 0;
            (i, set.then(|| 1 + rng.below(1 << 30)))
        })
        .collect()
}

/// Runs a case from a client of its own, which then disconnects; ms.
fn run_case(r: &Redis, ops: &[(usize, Option<u64>)]) -> Result<f64> {
    let mut c = r.client()?;
    let t0 = Instant::now();
    for chunk in ops.chunks(100) {
        let kv: Vec<(Vec<u8>, Option<Vec<u8>>)> = chunk
            .iter()
            .map(|&(i, v)| (key(i), v.map(|v| value(i, v))))
            .collect();
        let cmds: Vec<Vec<&[u8]>> = kv
            .iter()
            .map(|(k, v)| match v {
                Some(v) => vec![&b"SET"[..], &k[..], &v[..]],
                None => vec![&b"DEL"[..], &k[..]],
            })
            .collect();
        c.pipeline(&cmds)?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

/// Reads back `which` keys (every key when `None`) and `DBSIZE`; the
/// number of keys checked.
fn check(r: &Redis, keys: usize, which: Option<Vec<usize>>, what: &str) -> Result<u64> {
    let mut c = r.client()?;
    let size = c.pipeline(&[vec![&b"DBSIZE"[..]]])?;
    let size: usize = String::from_utf8_lossy(size[0].as_deref().unwrap_or(b"?")).parse()?;
    ensure!(size == keys, "{what}: DBSIZE is {size}, not {keys}");
    let which = which.unwrap_or_else(|| (0..keys).collect());
    for chunk in which.chunks(1000) {
        let ks: Vec<Vec<u8>> = chunk.iter().map(|&i| key(i)).collect();
        let cmds: Vec<Vec<&[u8]>> = ks.iter().map(|k| vec![&b"GET"[..], &k[..]]).collect();
        for (&i, got) in chunk.iter().zip(c.pipeline(&cmds)?) {
            if got.as_deref() != Some(&value(i, 0)[..]) {
                bail!("{what}: key {i} is not its loaded value");
            }
        }
    }
    Ok(which.len() as u64)
}

fn sample(keys: usize, n: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    (0..n.min(keys))
        .map(|_| rng.below(keys as u64) as usize)
        .collect()
}

/// Waits until the server holds exactly the descriptors it held at the
/// snapshot (the case's client closed on its side too), up to 10 s.
fn wait_for_fds(pid: i32, want: &[i64]) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let now = pagewise_testkit::host::open_fds(pid);
        if now == want {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            bail!("redis still holds descriptors {now:?}, not {want:?}, 10 s after the case");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// (c): the four methods.
pub fn run(c: &RedisConfig, progress: &mut dyn FnMut(&str)) -> Result<Vec<RedisRow>> {
    let base = std::env::temp_dir().join(format!("pagewise-bench-redis-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let _cleanup = super::lazy::Cleanup(base.clone());
    let mut rows = vec![rollback(c, &base.join("rollback"), progress)?];
    rows.extend(native(c, &base.join("native"), progress)?);
    let roll = rows[0].reset.median;
    for r in &mut rows {
        r.x_rollback = r.reset.median / roll;
    }
    Ok(rows)
}

fn row(c: &RedisConfig, method: &str, reps: usize) -> RedisRow {
    RedisRow {
        method: method.into(),
        keys: c.keys,
        ops: c.ops,
        reps,
        reset: Ms::of(vec![f64::NAN]),
        before_case: Ms::of(vec![0.0]),
        case: Ms::of(vec![f64::NAN]),
        x_rollback: f64::NAN,
        keys_checked: 0,
        pages_written: None,
        phases: None,
        writev_floor: None,
    }
}

fn rollback(
    c: &RedisConfig,
    dir: &std::path::Path,
    progress: &mut dyn FnMut(&str),
) -> Result<RedisRow> {
    std::fs::create_dir_all(dir)?;
    let r = Redis::start(dir, &[])?;
    progress(&format!("(c) rollback: loading {} keys", c.keys));
    load(&r, c.keys)?;
    // The loader's connection closed on the server's side too.
    std::thread::sleep(Duration::from_secs(1));
    let fds = pagewise_testkit::host::open_fds(r.pid());
    let mut h = ProcessSnapshots::open(r.pid()).context("opening rollback on redis-server")?;
    let id = h.take()?;
    let mut out = row(c, "rollback", c.reps);
    let (mut reset, mut case, mut pages) = (Vec::new(), Vec::new(), Vec::new());
    let mut phases = Vec::new();
    for rep in 0..c.reps {
        progress(&format!("(c) rollback: case {}/{}", rep + 1, c.reps));
        case.push(run_case(&r, &case_ops(c.keys, c.ops, rep as u64))?);
        wait_for_fds(r.pid(), &fds)?;
        let t0 = Instant::now();
        let rep_ = h.restore(id, RestoreOptions::default())?;
        reset.push(t0.elapsed().as_secs_f64() * 1e3);
        ensure!(
            rep_.fd_changes.is_empty(),
            "the reset found descriptors changed: {:?}",
            rep_.fd_changes
        );
        pages.push(rep_.stats.pages_written as f64);
        phases.push(rep_.phases);
        let last = rep + 1 == c.reps;
        let which = (!last).then(|| sample(c.keys, c.sample, rep as u64));
        out.keys_checked += check(&r, c.keys, which, "after a rollback")?;
    }
    drop(h);
    let heap_mib = pagewise_testkit::host::maps(Some(r.pid()))?
        .iter()
        .filter(|m| m.write)
        .map(|m| (m.end - m.start) as usize)
        .max()
        .unwrap_or(0)
        >> 20;
    let median_pages = Ms::of(pages.clone()).median as usize;
    progress("(c) rollback: the floor of process_vm_writev");
    out.writev_floor = Some(super::floor::writev(heap_mib.max(16), median_pages)?);
    out.reset = Ms::of(reset);
    out.case = Ms::of(case);
    out.pages_written = Some(Ms::of(pages).median);
    out.phases = Some(super::median_phases(&phases));
    Ok(out)
}

fn native(
    c: &RedisConfig,
    dir: &std::path::Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<RedisRow>> {
    std::fs::create_dir_all(dir)?;
    let mut r = Redis::start(dir, &["--enable-debug-command", "yes"])?;
    progress(&format!("(c) native resets: loading {} keys", c.keys));
    load(&r, c.keys)?;
    r.client()?.pipeline(&[vec![&b"SAVE"[..]]])?;

    // Undo journal.
    let mut journal = row(c, "undo journal", c.reps);
    let (mut reset, mut case, mut before) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..c.reps {
        progress(&format!("(c) undo journal: case {}/{}", rep + 1, c.reps));
        let ops = case_ops(c.keys, c.ops, rep as u64);
        let mut touched: Vec<usize> = ops.iter().map(|o| o.0).collect();
        touched.sort_unstable();
        touched.dedup();
        let ks: Vec<Vec<u8>> = touched.iter().map(|&i| key(i)).collect();
        let t0 = Instant::now();
        let mut cl = r.client()?;
        let dumps = cl.pipeline(
            &ks.iter()
                .map(|k| vec![&b"DUMP"[..], &k[..]])
                .collect::<Vec<_>>(),
        )?;
        before.push(t0.elapsed().as_secs_f64() * 1e3);
        drop(cl);
        case.push(run_case(&r, &ops)?);
        let t0 = Instant::now();
        let mut cl = r.client()?;
        let cmds: Vec<Vec<&[u8]>> = ks
            .iter()
            .zip(&dumps)
            .map(|(k, d)| match d {
                Some(d) => vec![&b"RESTORE"[..], &k[..], b"0", &d[..], b"REPLACE"],
                None => vec![&b"DEL"[..], &k[..]],
            })
            .collect();
        cl.pipeline(&cmds)?;
        reset.push(t0.elapsed().as_secs_f64() * 1e3);
        let last = rep + 1 == c.reps;
        let which = (!last).then(|| sample(c.keys, c.sample, rep as u64));
        journal.keys_checked += check(&r, c.keys, which, "after the undo journal")?;
    }
    journal.reset = Ms::of(reset);
    journal.case = Ms::of(case);
    journal.before_case = Ms::of(before);

    // DEBUG RELOAD NOSAVE.
    let mut reload = row(c, "DEBUG RELOAD", c.slow_reps);
    let (mut reset, mut case) = (Vec::new(), Vec::new());
    for rep in 0..c.slow_reps {
        progress(&format!(
            "(c) DEBUG RELOAD: case {}/{}",
            rep + 1,
            c.slow_reps
        ));
        case.push(run_case(&r, &case_ops(c.keys, c.ops, 100 + rep as u64))?);
        let t0 = Instant::now();
        r.client()?
            .pipeline(&[vec![&b"DEBUG"[..], b"RELOAD", b"NOSAVE"]])?;
        reset.push(t0.elapsed().as_secs_f64() * 1e3);
        let last = rep + 1 == c.slow_reps;
        let which = (!last).then(|| sample(c.keys, c.sample, rep as u64));
        reload.keys_checked += check(&r, c.keys, which, "after DEBUG RELOAD")?;
    }
    reload.reset = Ms::of(reset);
    reload.case = Ms::of(case);

    // Restart from the RDB.
    let mut restart = row(c, "restart", c.slow_reps);
    let (mut reset, mut case) = (Vec::new(), Vec::new());
    for rep in 0..c.slow_reps {
        progress(&format!("(c) restart: case {}/{}", rep + 1, c.slow_reps));
        case.push(run_case(&r, &case_ops(c.keys, c.ops, 200 + rep as u64))?);
        reset.push(r.restart()?);
        let last = rep + 1 == c.slow_reps;
        let which = (!last).then(|| sample(c.keys, c.sample, rep as u64));
        restart.keys_checked += check(&r, c.keys, which, "after a restart")?;
    }
    restart.reset = Ms::of(reset);
    restart.case = Ms::of(case);
    Ok(vec![journal, reload, restart])
}

/// (c)'s table.
pub fn summary(s: &mut String, rows: &[RedisRow]) {
    use std::fmt::Write;
    let Some(first) = rows.first() else { return };
    let _ = writeln!(
        s,
        "\n(c) redis test resets: {} keys of 1 KiB, {} random SET/DEL per case; median [min..max] ms; \
         x = the method's reset over rollback's",
        first.keys, first.ops
    );
    let _ = writeln!(
        s,
        "{:<14} {:>5} {:>28} {:>26} {:>26} {:>9} {:>9} {:>8}",
        "method", "reps", "reset ms", "before case ms", "case ms", "x", "pages", "checked"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<14} {:>5} {:>28} {:>26} {:>26} {:>9.1} {:>9} {:>8}",
            r.method,
            r.reps,
            super::fmt_ms(&r.reset),
            super::fmt_ms(&r.before_case),
            super::fmt_ms(&r.case),
            r.x_rollback,
            r.pages_written.map_or("-".into(), |p| format!("{p:.0}")),
            r.keys_checked
        );
        if let Some(p) = &r.phases {
            let _ = writeln!(
                s,
                "{:<14} phases (median µs): stop {:.0}, layout {:.0}, threads {:.0}, walk {:.0}, \
                 copy {:.0}, resume {:.0}; process_vm_writev alone for as many pages: {} ms",
                "",
                p.stop_us,
                p.layout_us,
                p.threads_us,
                p.walk_us,
                p.copy_us,
                p.resume_us,
                r.writev_floor.as_ref().map_or("-".into(), super::fmt_ms)
            );
        }
    }
}
