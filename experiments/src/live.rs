//! Live checkpoints, experiment (c): a process of S bytes writing random
//! pages at a rate that is a given share of the copy rate, checkpointed live
//! (`snapshot --live`: pre-copy passes, then a short stop) against
//! stop-and-copy (stopped for the whole read). Downtime, total time and
//! passes; and every run's snapshot compared byte for byte with the
//! process's memory at the moment it was stopped (read from it then).
//!
//! Each point also migrates the process over loopback (`snapshot --live
//! --to`, to a receiver in this process): its downtime, the handover (from
//! the stop to the receiver holding the whole copy) and the bytes on the
//! wire, the receiver's snapshot compared the same way. At the first point,
//! the migration is repeated with each compression setting.
//!
//! The target is a forked child: it fills its memory, then writes one byte
//! into a random page at the asked rate until told to stop. The copy rate
//! is measured first, by a stop-and-copy of the same process.

use crate::{median, Machine};
use pagewise::{Error, Region, Result, PAGE_SIZE};
use pagewise_mech::hash::{page_hash, PageHash};
use pagewise_mech::workload::AnonMemory;
use pagewise_snap::live::{live_snapshot, Destination, LiveOptions, LiveReport, StoreSeries};
use pagewise_snap::wire::{Compression, Receiver, Sender, WireStats};
use pagewise_snap::DiskStore;
use pagewise_testkit::host as procfs;
use pagewise_testkit::host::Stopped;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Process sizes, MiB.
    pub sizes_mib: Vec<usize>,
    /// Dirty rates, % of the copy rate.
    pub percents: Vec<f64>,
    /// Downtime budget, ms.
    pub max_downtime_ms: f64,
}

impl Config {
    /// A short run (256 MiB; 5 and 50 %).
    pub fn quick() -> Self {
        Config {
            sizes_mib: vec![256],
            percents: vec![5.0, 50.0],
            max_downtime_ms: 50.0,
        }
    }
    /// The experiment (1 and 4 GiB; 1 to 50 %).
    pub fn full() -> Self {
        Config {
            sizes_mib: vec![1024, 4096],
            percents: vec![1.0, 5.0, 10.0, 25.0, 50.0],
            max_downtime_ms: 50.0,
        }
    }
}

/// One run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Process size, MiB.
    pub mib: usize,
    /// Dirty rate asked for, % of the copy rate.
    pub percent: f64,
    /// The dirty rate the target reached, pages per second.
    pub pages_per_s: f64,
    /// Live: time the process was stopped, ms.
    pub downtime_ms: f64,
    /// Live: from the start to the process running again, ms.
    pub total_ms: f64,
    /// Live: passes while it ran.
    pub passes: usize,
    /// Live: whether the rest fitted the budget within the passes.
    pub converged: bool,
    /// Stop-and-copy: time stopped (the whole read), ms.
    pub stop_and_copy_ms: f64,
    /// stop_and_copy_ms / downtime_ms.
    pub downtime_ratio: f64,
    /// Stored pages that differ from the memory at the stop (must be 0).
    pub wrong_pages: u64,
    /// The same process migrated over loopback.
    pub migration: Migration,
}

/// A live migration over loopback.
#[derive(Debug, Clone, Serialize)]
pub struct Migration {
    /// Compression on the wire.
    pub compression: Compression,
    /// Time the process was stopped, ms.
    pub downtime_ms: f64,
    /// From the stop to the receiver holding the whole copy, ms.
    pub handover_ms: f64,
    /// From the start to the process running again, ms.
    pub total_ms: f64,
    /// Passes while it ran.
    pub passes: usize,
    /// Whether it converged.
    pub converged: bool,
    /// Bytes of pages sent, MiB.
    pub page_mib: f64,
    /// Bytes on the wire, MiB.
    pub wire_mib: f64,
    /// Time compressing, ms.
    pub compress_ms: f64,
    /// Pages of the receiver's snapshot that differ from the memory at the
    /// stop (must be 0).
    pub wrong_pages: u64,
}

/// The migration of the first point with each compression setting.
#[derive(Debug, Clone, Serialize)]
pub struct CompressionRow {
    /// Size, MiB.
    pub mib: usize,
    /// Dirty rate, % of the copy rate.
    pub percent: f64,
    /// The runs.
    pub runs: Vec<Migration>,
}

/// What the experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// The configuration.
    pub config: Config,
    /// The copy rate measured by stop-and-copy, MiB/s, per size.
    pub copy_rate_mib_s: Vec<(usize, f64)>,
    /// The runs.
    pub rows: Vec<Row>,
    /// Compression settings compared.
    pub compression: Option<CompressionRow>,
}

/// The forked writer: writes one byte into a random page at `rate` pages
/// per second (shared control page: [0] stop, [1] writes done).
struct Target {
    pid: i32,
    ctl: AnonShared,
}

/// Counters shared with the child.
struct AnonShared(pagewise_sys::mem::SharedAtomics);

impl AnonShared {
    fn new() -> Result<Self> {
        pagewise_sys::mem::SharedAtomics::new(2)
            .map(AnonShared)
            .map_err(|e| Error::os("mapping a shared page", e))
    }
    fn at(&self, i: usize) -> &AtomicU64 {
        self.0.at(i)
    }
}

impl Target {
    fn spawn(mem: &AnonMemory, rate: f64) -> Result<Self> {
        let ctl = AnonShared::new()?;
        let pages = mem.pages();
        // SAFETY: the child only writes its memory, reads the clock and
        // sleeps: no allocation, no lock; the shared page it reads its
        // orders from outlives its loop.
        let pid = unsafe {
            pagewise_sys::process::fork_child(|| {
                let (stop, done) = (ctl.at(0), ctl.at(1));
                let t0 = Instant::now();
                let mut x = 0x2545_F491_4F6C_DD1Du64;
                let mut n = 0u64;
                while stop.load(Ordering::Relaxed) == 0 {
                    let due = (t0.elapsed().as_secs_f64() * rate) as u64;
                    while n < due {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let p = (x as usize >> 8) % pages;
                        mem.write_byte(p * PAGE_SIZE + (x as usize >> 40) % 4000, x as u8 | 1);
                        n += 1;
                    }
                    done.store(n, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(200));
                }
                0
            })
        }
        .map_err(|e| Error::os("fork of the target", e))?;
        Ok(Target { pid, ctl })
    }

    /// Writes done so far.
    fn writes(&self) -> u64 {
        self.ctl.at(1).load(Ordering::Relaxed)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.ctl.at(0).store(1, Ordering::Relaxed);
        let _ = pagewise_sys::process::kill(self.pid, libc::SIGKILL);
        let _ = pagewise_sys::process::wait_child(self.pid);
    }
}

/// Fingerprints of a process's pages, per writable mapping.
pub(crate) type Truth = Vec<(Region, Vec<PageHash>)>;

/// The fingerprint of every page of every writable mapping of `pid`
/// (stopped), read 64 MiB at a time: the ground truth, without a second
/// copy of the memory.
pub(crate) fn fingerprints(pid: i32) -> Result<Truth> {
    let mut out = Vec::new();
    let mut b = vec![0u8; 64 << 20];
    for m in procfs::writable(Some(pid))? {
        let r = Region::new(m.start, m.len())?;
        let mut h = Vec::with_capacity(r.pages() as usize);
        let mut off = 0;
        while off < r.len {
            let n = (r.len - off).min(b.len() as u64) as usize;
            pagewise_testkit::host::read(pid, r.start + off, &mut b[..n])?;
            h.extend(b[..n].chunks_exact(PAGE_SIZE).map(page_hash));
            off += n as u64;
        }
        out.push((r, h));
    }
    Ok(out)
}

/// Reads every writable mapping of `pid` (stopped) once: the stop-and-copy.
fn read_all(pid: i32) -> Result<u64> {
    let mut bytes = 0;
    for m in procfs::writable(Some(pid))? {
        let mut b = vec![0u8; m.len() as usize];
        pagewise_testkit::host::read(pid, m.start, &mut b)?;
        bytes += b.len() as u64;
    }
    Ok(bytes)
}

/// Stored pages of snapshot `id` whose fingerprint differs from `truth`'s.
pub(crate) fn wrong_pages(disk: &DiskStore, id: u64, truth: &Truth) -> Result<u64> {
    let snap = disk.load(id)?;
    let mut page = vec![0u8; PAGE_SIZE];
    let mut i = 0usize;
    let mut wrong = 0;
    for r in &snap.regions {
        let t = truth.iter().find(|(a, _)| a == r).map(|(_, h)| h);
        for k in 0..r.pages() as usize {
            let e = snap.entries[i];
            if e == 0 {
                page.fill(0);
            } else {
                disk.read_page(e, &mut page)?;
            }
            if t.is_none_or(|t| page_hash(&page) != t[k]) {
                wrong += 1;
            }
            i += 1;
        }
    }
    Ok(wrong)
}

/// A live checkpoint of `pid` into `dest`; returns its report and the
/// fingerprints of the memory at the stop.
fn live(pid: i32, dest: &mut dyn Destination, budget_ms: f64) -> Result<(LiveReport, Truth)> {
    let mut truth = Vec::new();
    let mut failed = None;
    let opts = LiveOptions::default()
        .max_downtime_ms(budget_ms)
        .max_passes(30)
        .throttle(false);
    let r = live_snapshot(
        pid,
        dest,
        "",
        &opts,
        &mut |_| {},
        &mut || match fingerprints(pid) {
            Ok(t) => truth = t,
            Err(e) => failed = Some(e),
        },
    )?;
    match failed {
        Some(e) => Err(e),
        None => Ok((r, truth)),
    }
}

/// Migrates `pid` live to a receiver on loopback (a thread of this
/// process, saving into `dir`), and compares what it saved.
fn migrate(
    pid: i32,
    dir: &std::path::Path,
    compression: Compression,
    budget_ms: f64,
) -> Result<Migration> {
    let _ = std::fs::remove_dir_all(dir);
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::os("listening on loopback", e))?;
    let addr = l
        .local_addr()
        .map_err(|e| Error::os("listening on loopback", e))?
        .to_string();
    let rx = Receiver::new(DiskStore::create(dir, false)?);
    let server = std::thread::spawn(move || -> Result<Receiver> {
        let (s, _) = l.accept().map_err(|e| Error::os("accepting", e))?;
        let got = rx.serve(s, &mut |_| {})?;
        match got.broken {
            Some(why) => Err(crate::check_failed(format!("the migration broke: {why}"))),
            None => Ok(rx),
        }
    });
    let mut tx = Sender::connect(&addr, compression)?;
    let (r, truth) = live(pid, &mut tx, budget_ms)?;
    let w: WireStats = tx.stats();
    drop(tx);
    let rx = server
        .join()
        .map_err(|_| crate::check_failed("the receiver thread panicked"))??;
    let wrong = wrong_pages(&rx.store(), r.save.id, &truth)?;
    drop(rx);
    let _ = std::fs::remove_dir_all(dir);
    Ok(Migration {
        compression,
        downtime_ms: r.downtime_ms,
        handover_ms: r.handover_ms,
        total_ms: r.copy_ms,
        passes: r.passes.len(),
        converged: r.converged,
        page_mib: w.page_bytes as f64 / 1048576.0,
        wire_mib: w.wire_bytes as f64 / 1048576.0,
        compress_ms: w.compress_ms,
        wrong_pages: wrong,
    })
}

/// Runs the experiment; `scratch` holds the stores (removed after).
pub fn run(
    cfg: &Config,
    scratch: &std::path::Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
        return Err(pagewise::Error::from(pagewise::MechError::Unsupported {
            feature: "uffd-wp from outside",
            why,
        }));
    }
    let mut rows = Vec::new();
    let mut rates = Vec::new();
    let mut compression = None;
    for &mib in &cfg.sizes_mib {
        let mem = AnonMemory::new(mib << 20)?;
        mem.write_pass(1, 7);
        // The copy rate: stop-and-copy of an idle copy of the process.
        let copy_rate = {
            let t = Target::spawn(&mem, 0.0)?;
            let mut v = Vec::new();
            for _ in 0..3 {
                let t0 = Instant::now();
                let s = Stopped::new(t.pid)?;
                let bytes = read_all(t.pid)?;
                drop(s);
                v.push(bytes as f64 / t0.elapsed().as_secs_f64());
            }
            median(&mut v)
        };
        rates.push((mib, copy_rate / 1048576.0));
        for &percent in &cfg.percents {
            progress(&format!(
                "(c) {mib} MiB writing {percent} % of the copy rate"
            ));
            let rate = copy_rate * percent / 100.0 / PAGE_SIZE as f64;
            let target = Target::spawn(&mem, rate)?;
            std::thread::sleep(Duration::from_millis(300));
            let w0 = (target.writes(), Instant::now());
            // Stop-and-copy, the baseline.
            let t0 = Instant::now();
            let s = Stopped::new(target.pid)?;
            let _bytes = read_all(target.pid)?;
            drop(s);
            let stop_and_copy_ms = t0.elapsed().as_secs_f64() * 1e3;
            // Live, into a local store.
            let dir = scratch.join(format!("live-{mib}-{percent}"));
            let _ = std::fs::remove_dir_all(&dir);
            let mut disk = DiskStore::create(&dir, false)?;
            let pid = target.pid;
            let (r, truth) = live(pid, &mut StoreSeries::new(&mut disk), cfg.max_downtime_ms)?;
            let wrong = wrong_pages(&disk, r.save.id, &truth)?;
            drop((disk, truth));
            let _ = std::fs::remove_dir_all(&dir);
            // Live, migrated over loopback; at the first point with each
            // compression setting.
            let rx_dir = scratch.join(format!("recv-{mib}-{percent}"));
            let migration = migrate(pid, &rx_dir, Compression::Auto, cfg.max_downtime_ms)?;
            if compression.is_none() {
                let mut runs = vec![migration.clone()];
                for c in [Compression::None, Compression::Lz4] {
                    progress(&format!(
                        "(c) {mib} MiB at {percent} %: migration, compression {c:?}"
                    ));
                    runs.push(migrate(pid, &rx_dir, c, cfg.max_downtime_ms)?);
                }
                compression = Some(CompressionRow { mib, percent, runs });
            }
            let pages_per_s = (target.writes() - w0.0) as f64 / w0.1.elapsed().as_secs_f64();
            drop(target);
            rows.push(Row {
                mib,
                percent,
                pages_per_s,
                downtime_ms: r.downtime_ms,
                total_ms: r.copy_ms,
                passes: r.passes.len(),
                converged: r.converged,
                stop_and_copy_ms,
                downtime_ratio: stop_and_copy_ms / r.downtime_ms.max(1e-6),
                wrong_pages: wrong,
                migration,
            });
        }
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        copy_rate_mib_s: rates,
        rows,
        compression,
    })
}

impl Report {
    /// The table.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "pagewise bench live — {}\n(c) live checkpoint (pre-copy, budget {} ms) against stop-and-copy\ncopy rate (stop-and-copy): {}\n\n{:>7} {:>6} {:>10} {:>11} {:>10} {:>7} {:>9} {:>13} {:>9} {:>6}\n",
            self.machine,
            self.config.max_downtime_ms,
            self.copy_rate_mib_s
                .iter()
                .map(|(m, r)| format!("{m} MiB: {r:.0} MiB/s"))
                .collect::<Vec<_>>()
                .join(", "),
            "MiB",
            "dirty%",
            "pages/s",
            "downtime ms",
            "total ms",
            "passes",
            "converged",
            "stop&copy ms",
            "ratio",
            "wrong"
        );
        for r in &self.rows {
            s += &format!(
                "{:>7} {:>6} {:>10.0} {:>11.2} {:>10.0} {:>7} {:>9} {:>13.0} {:>8.0}x {:>6}\n",
                r.mib,
                r.percent,
                r.pages_per_s,
                r.downtime_ms,
                r.total_ms,
                r.passes,
                r.converged,
                r.stop_and_copy_ms,
                r.downtime_ratio,
                r.wrong_pages
            );
        }
        s += &format!(
            "\nmigration over loopback (snapshot --live --to, compression auto): handover = from the stop to the receiver holding the whole copy\n\n{:>7} {:>6} {:>11} {:>11} {:>10} {:>7} {:>9} {:>9} {:>9} {:>6}\n",
            "MiB", "dirty%", "downtime ms", "handover ms", "total ms", "passes", "converged", "page MiB", "wire MiB", "wrong"
        );
        for r in &self.rows {
            let m = &r.migration;
            s += &format!(
                "{:>7} {:>6} {:>11.2} {:>11.1} {:>10.0} {:>7} {:>9} {:>9.0} {:>9.1} {:>6}\n",
                r.mib,
                r.percent,
                m.downtime_ms,
                m.handover_ms,
                m.total_ms,
                m.passes,
                m.converged,
                m.page_mib,
                m.wire_mib,
                m.wrong_pages
            );
        }
        if let Some(c) = &self.compression {
            s += &format!(
                "\ncompression on the wire ({} MiB at {} %):\n\n{:>11} {:>9} {:>9} {:>11} {:>11} {:>10} {:>6}\n",
                c.mib, c.percent, "compression", "page MiB", "wire MiB", "compress ms", "handover ms", "total ms", "wrong"
            );
            for m in &c.runs {
                s += &format!(
                    "{:>11} {:>9.0} {:>9.1} {:>11.0} {:>11.1} {:>10.0} {:>6}\n",
                    format!("{:?}", m.compression).to_lowercase(),
                    m.page_mib,
                    m.wire_mib,
                    m.compress_ms,
                    m.handover_ms,
                    m.total_ms,
                    m.wrong_pages
                );
            }
        }
        s += "\ngoal: 4 GiB at 5 %: downtime at most 50 ms and at least 20x shorter than stop-and-copy; no wrong page in any run.\n";
        s
    }

    /// Downtime against the dirty rate, per size, with stop-and-copy.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let mut series = Vec::new();
        for &mib in &self.config.sizes_mib {
            let of = |f: fn(&Row) -> f64| {
                self.rows
                    .iter()
                    .filter(|r| r.mib == mib)
                    .map(|r| (r.percent, f(r)))
                    .collect::<Vec<_>>()
            };
            series.push(crate::svg::Series {
                label: format!("live, {mib} MiB"),
                points: of(|r| r.downtime_ms),
            });
            series.push(crate::svg::Series {
                label: format!("migration handover, {mib} MiB"),
                points: of(|r| r.migration.handover_ms),
            });
            series.push(crate::svg::Series {
                label: format!("stop-and-copy, {mib} MiB"),
                points: of(|r| r.stop_and_copy_ms),
            });
        }
        vec![(
            "live.svg".into(),
            crate::svg::Chart {
                title: "(c) time the process is stopped".into(),
                x_label: "dirty rate (% of the copy rate)".into(),
                y_label: "ms stopped".into(),
                log_x: false,
                log_y: true,
                series,
            },
        )]
    }
}
