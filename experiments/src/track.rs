//! LDT's experiments, side by side for every available backend and no tracking:
//!
//! - (a) write-only passes over working sets of growing size, 1 byte or 4096
//!   bytes per page: time per pass and the ratio to no tracking;
//! - (b) 25 % reads / 75 % writes of 4 KiB over a region, throughput every
//!   100 ms with a collection every 100 ms on the other core (LDT's timeline);
//! - (c) time to collect after writing x % of a region, against the time to
//!   read the region once (this machine's single-core memory bandwidth).
//!
//! The `hash` backend collects continuously on the other core during (a), as
//! it would in use; the fault-based backends collect between passes.

use super::{median, Machine};
use pagewise::{Result, PAGE_SIZE};
use pagewise_agent::settings::SettingGuard;
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_track::{BackendKind, DirtyTracker};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// (a) working-set sizes in MiB.
    pub sizes_mib: Vec<usize>,
    /// (a) passes per measurement (the median is reported).
    pub passes: usize,
    /// (b) region size in MiB.
    pub timeline_mib: usize,
    /// (b) duration per backend in seconds.
    pub timeline_secs: f64,
    /// (c) region size in MiB.
    pub collect_mib: usize,
    /// (c) repetitions per point.
    pub collect_reps: usize,
}

impl Config {
    /// The full experiment (about 5 minutes here).
    pub fn full() -> Self {
        Config {
            sizes_mib: vec![64, 256, 1024, 4096],
            passes: 5,
            timeline_mib: 1024,
            timeline_secs: 10.0,
            collect_mib: 1024,
            collect_reps: 5,
        }
    }
    /// A short run for CI and `pagewise bench track` without `--full`.
    pub fn quick() -> Self {
        Config {
            sizes_mib: vec![64, 256],
            passes: 3,
            timeline_mib: 256,
            timeline_secs: 2.0,
            collect_mib: 256,
            collect_reps: 3,
        }
    }
}

/// One (a) measurement.
#[derive(Debug, Clone, Serialize)]
pub struct WriteRow {
    /// Backend name, or `none`.
    pub backend: String,
    /// Working set in MiB.
    pub size_mib: usize,
    /// Bytes written per page (1 or 4096).
    pub bytes_per_page: usize,
    /// Median time of one pass, ms.
    pub pass_ms: f64,
    /// `pass_ms` over the untracked pass.
    pub ratio_to_none: f64,
}

/// One (b) series.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// Backend name, or `none`.
    pub backend: String,
    /// Operations per second in each 100 ms bin.
    pub ops_per_s: Vec<f64>,
    /// Mean over the run.
    pub mean_ops_per_s: f64,
    /// Mean over the untracked mean.
    pub ratio_to_none: f64,
    /// Collections made.
    pub collections: u64,
    /// Mean collection time, ms.
    pub mean_collect_ms: f64,
}

/// One (c) measurement.
#[derive(Debug, Clone, Serialize)]
pub struct CollectRow {
    /// Backend name.
    pub backend: String,
    /// `seq` (the first x % of pages) or `random` (x % of pages at random).
    pub layout: String,
    /// Percentage of pages written.
    pub percent: u32,
    /// Median collection time, ms.
    pub collect_ms: f64,
    /// Ranges reported.
    pub ranges: u64,
    /// `collect_ms` over the time to read the region once.
    pub ratio_to_read_once: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where.
    pub machine: Machine,
    /// What.
    pub config: Config,
    /// Backends skipped here, with the reason.
    pub skipped: Vec<(String, String)>,
    /// (a).
    pub write_only: Vec<WriteRow>,
    /// (b).
    pub timeline: Vec<Timeline>,
    /// (c).
    pub collect: Vec<CollectRow>,
    /// (c) time to read the region once, ms (single core, sequential).
    pub read_once_ms: f64,
    /// Notes on settings changed for the run.
    pub notes: Vec<String>,
}

fn backends(skipped: &mut Vec<(String, String)>) -> Vec<BackendKind> {
    BackendKind::ALL
        .into_iter()
        .filter(|k| match k.available_in_process() {
            Ok(()) => true,
            Err(why) => {
                skipped.push((k.name().into(), why));
                false
            }
        })
        .collect()
}

fn name(k: Option<BackendKind>) -> String {
    k.map(|k| k.name().to_string())
        .unwrap_or_else(|| "none".into())
}

/// Runs a collector on another thread until dropped (the `hash` mode of use).
struct BackgroundCollector {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl BackgroundCollector {
    fn start(
        t: Arc<Mutex<DirtyTracker>>,
        every: Option<Duration>,
        stats: Arc<(AtomicU64, AtomicU64)>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut next = Instant::now();
            while !s2.load(Ordering::Relaxed) {
                if let Some(e) = every {
                    next += e;
                    while Instant::now() < next {
                        if s2.load(Ordering::Relaxed) {
                            return;
                        }
                        std::thread::sleep(
                            Duration::from_millis(1)
                                .min(next.saturating_duration_since(Instant::now())),
                        );
                    }
                }
                let c = t.lock().expect("tracker lock").collect().expect("collect");
                stats.0.fetch_add(1, Ordering::Relaxed);
                stats.1.fetch_add(c.stats.elapsed_ns, Ordering::Relaxed);
            }
        });
        BackgroundCollector {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for BackgroundCollector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// (a): write-only passes.
pub fn write_only(
    cfg: &Config,
    kinds: &[BackendKind],
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<WriteRow>> {
    let mut rows = Vec::new();
    for &size in &cfg.sizes_mib {
        for bpp in [1usize, PAGE_SIZE] {
            let mut none_ms = f64::NAN;
            for k in std::iter::once(None).chain(kinds.iter().copied().map(Some)) {
                progress(&format!("write-only {size} MiB, {bpp} B/page, {}", name(k)));
                let mem = AnonMemory::new(size << 20)?;
                mem.write_pass(1, 1);
                let tracker = match k {
                    Some(k) => Some(Arc::new(Mutex::new(DirtyTracker::new(&[mem.region()], k)?))),
                    None => None,
                };
                let mut times = Vec::new();
                for pass in 0..cfg.passes {
                    let _bg = match (k, &tracker) {
                        (Some(BackendKind::Hash), Some(t)) => Some(BackgroundCollector::start(
                            Arc::clone(t),
                            None,
                            Arc::new((AtomicU64::new(0), AtomicU64::new(0))),
                        )),
                        _ => None,
                    };
                    let t0 = Instant::now();
                    mem.write_pass(bpp, (pass % 200) as u8 + 2);
                    times.push(t0.elapsed().as_secs_f64() * 1e3);
                    drop(_bg);
                    if let Some(t) = &tracker {
                        t.lock().expect("tracker lock").collect()?;
                    }
                }
                let ms = median(&mut times);
                if k.is_none() {
                    none_ms = ms;
                }
                rows.push(WriteRow {
                    backend: name(k),
                    size_mib: size,
                    bytes_per_page: bpp,
                    pass_ms: ms,
                    ratio_to_none: ms / none_ms,
                });
            }
        }
    }
    Ok(rows)
}

/// (b): the 25/75 read/write throughput timeline.
pub fn timeline(
    cfg: &Config,
    kinds: &[BackendKind],
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Timeline>> {
    let mut out: Vec<Timeline> = Vec::new();
    let mut none_mean = f64::NAN;
    for k in std::iter::once(None).chain(kinds.iter().copied().map(Some)) {
        progress(&format!("timeline {} MiB, {}", cfg.timeline_mib, name(k)));
        let mem = AnonMemory::new(cfg.timeline_mib << 20)?;
        mem.write_pass(PAGE_SIZE, 1);
        let stats = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let bg = match k {
            Some(k) => {
                let t = Arc::new(Mutex::new(DirtyTracker::new(&[mem.region()], k)?));
                Some(BackgroundCollector::start(
                    t,
                    Some(Duration::from_millis(100)),
                    Arc::clone(&stats),
                ))
            }
            None => None,
        };
        let mut rng = Rng::new(11);
        let pages = mem.pages() as u64;
        let mut page = [0u8; PAGE_SIZE];
        let mut bins = Vec::new();
        let t0 = Instant::now();
        let mut bin_start = t0;
        let mut ops = 0u64;
        let mut sink = 0u8;
        while t0.elapsed().as_secs_f64() < cfg.timeline_secs {
            for _ in 0..64 {
                let p = rng.below(pages) as usize;
                if rng.below(4) == 0 {
                    mem.read_page(p, &mut page);
                    sink ^= page[p % PAGE_SIZE];
                } else {
                    mem.fill_page(p, (ops % 251) as u8);
                }
                ops += 1;
            }
            let now = Instant::now();
            let dt = now - bin_start;
            if dt >= Duration::from_millis(100) {
                bins.push(ops as f64 / dt.as_secs_f64());
                ops = 0;
                bin_start = now;
            }
        }
        std::hint::black_box(sink);
        drop(bg);
        let mean = bins.iter().sum::<f64>() / bins.len().max(1) as f64;
        if k.is_none() {
            none_mean = mean;
        }
        let n = stats.0.load(Ordering::Relaxed);
        out.push(Timeline {
            backend: name(k),
            mean_ops_per_s: mean,
            ratio_to_none: mean / none_mean,
            ops_per_s: bins,
            collections: n,
            mean_collect_ms: if n > 0 {
                stats.1.load(Ordering::Relaxed) as f64 / n as f64 / 1e6
            } else {
                0.0
            },
        });
    }
    Ok(out)
}

/// (c): time to collect after writing x % of the region.
pub fn collect_time(
    cfg: &Config,
    kinds: &[BackendKind],
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<CollectRow>, f64)> {
    let mem = AnonMemory::new(cfg.collect_mib << 20)?;
    mem.write_pass(PAGE_SIZE, 1);
    let read_ms = crate::read_once_s(&mem, cfg.collect_reps) * 1e3;
    let pages = mem.pages();
    // A fixed random order of all pages: the first x % of it are "x % at random".
    let mut order: Vec<usize> = (0..pages).collect();
    let mut rng = Rng::new(5);
    for i in (1..pages).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut rows = Vec::new();
    for &k in kinds {
        let mut t = DirtyTracker::new(&[mem.region()], k)?;
        for layout in ["seq", "random"] {
            for pct in (10..=100).step_by(10) {
                progress(&format!(
                    "collect {} MiB, {layout} {pct}%, {k}",
                    cfg.collect_mib
                ));
                let n = pages * pct as usize / 100;
                let mut times = Vec::new();
                let mut ranges = 0;
                for rep in 0..cfg.collect_reps {
                    for (i, &o) in order.iter().enumerate().take(n) {
                        let p = if layout == "seq" { i } else { o };
                        mem.write_byte(p * PAGE_SIZE + 8, (rep % 200) as u8 + 2);
                    }
                    let c = t.collect()?;
                    times.push(c.stats.elapsed_ns as f64 / 1e6);
                    ranges = c.stats.ranges;
                }
                let ms = median(&mut times);
                rows.push(CollectRow {
                    backend: k.name().into(),
                    layout: layout.into(),
                    percent: pct,
                    collect_ms: ms,
                    ranges,
                    ratio_to_read_once: ms / read_ms,
                });
            }
        }
    }
    Ok((rows, read_ms))
}

/// Runs (a), (b) and (c).
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let mut skipped = Vec::new();
    let kinds = backends(&mut skipped);
    let mut notes = Vec::new();
    // Random write faults split VMAs; give the mprotect baseline room (restored on drop).
    let _maps = if kinds.contains(&BackendKind::Mprotect) {
        match SettingGuard::set("/proc/sys/vm/max_map_count", "4194304") {
            Ok(g) => {
                notes.push(format!("vm.max_map_count raised from {} to 4194304 for the mprotect baseline, restored afterwards", g.old()));
                Some(g)
            }
            Err(e) => {
                notes.push(format!("vm.max_map_count left as is ({e}): the mprotect baseline falls back to whole-region unprotect when VMAs run out"));
                None
            }
        }
    } else {
        None
    };
    let write_only = write_only(cfg, &kinds, progress)?;
    let timeline = timeline(cfg, &kinds, progress)?;
    let (collect, read_once_ms) = collect_time(cfg, &kinds, progress)?;
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        skipped,
        write_only,
        timeline,
        collect,
        read_once_ms,
        notes,
    })
}

impl Report {
    /// The plots of the LDT slides: (a) per bytes-per-page, (b), (c).
    pub fn charts(&self) -> Vec<(String, super::svg::Chart)> {
        use super::svg::{Chart, Series};
        let mut out = Vec::new();
        let backends: Vec<String> = {
            let mut v: Vec<String> = self.write_only.iter().map(|r| r.backend.clone()).collect();
            v.dedup();
            let mut seen = Vec::new();
            v.retain(|b| {
                if seen.contains(b) {
                    false
                } else {
                    seen.push(b.clone());
                    true
                }
            });
            v
        };
        for bpp in [1usize, PAGE_SIZE] {
            out.push((
                format!("write_only_{bpp}B.svg"),
                Chart {
                    title: format!("(a) write-only, {bpp} byte(s) per page: time per pass"),
                    x_label: "working set (MiB)".into(),
                    y_label: "ms per pass".into(),
                    log_x: true,
                    log_y: true,
                    series: backends
                        .iter()
                        .map(|b| Series {
                            label: b.clone(),
                            points: self
                                .write_only
                                .iter()
                                .filter(|r| &r.backend == b && r.bytes_per_page == bpp)
                                .map(|r| (r.size_mib as f64, r.pass_ms))
                                .collect(),
                        })
                        .collect(),
                },
            ));
        }
        out.push((
            "timeline.svg".into(),
            Chart {
                title: "(b) 25% read / 75% write, 4 KiB ops, collection every 100 ms".into(),
                x_label: "time (s)".into(),
                y_label: "ops/s".into(),
                log_x: false,
                log_y: false,
                series: self
                    .timeline
                    .iter()
                    .map(|t| Series {
                        label: t.backend.clone(),
                        points: t
                            .ops_per_s
                            .iter()
                            .enumerate()
                            .map(|(i, v)| ((i + 1) as f64 * 0.1, *v))
                            .collect(),
                    })
                    .collect(),
            },
        ));
        let mut series = Vec::new();
        for b in backends.iter().filter(|b| *b != "none") {
            for layout in ["seq", "random"] {
                series.push(Series {
                    label: format!("{b} ({layout})"),
                    points: self
                        .collect
                        .iter()
                        .filter(|r| &r.backend == b && r.layout == layout)
                        .map(|r| (r.percent as f64, r.collect_ms))
                        .collect(),
                });
            }
        }
        series.push(Series {
            label: "read region once".into(),
            points: vec![(10.0, self.read_once_ms), (100.0, self.read_once_ms)],
        });
        out.push((
            "collect_time.svg".into(),
            Chart {
                title: format!(
                    "(c) time to collect after writing x% of {} MiB",
                    self.config.collect_mib
                ),
                x_label: "% of pages written".into(),
                y_label: "ms".into(),
                log_x: false,
                log_y: true,
                series,
            },
        ));
        out
    }

    /// A plain-text summary with the ratios.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "machine: {}", self.machine);
        for (b, why) in &self.skipped {
            let _ = writeln!(s, "skipped {b}: {why}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let _ = writeln!(s, "\n(a) write-only: ms per pass (ratio to none)");
        let _ = writeln!(
            s,
            "{:>10} {:>6} {:>12} {:>10}",
            "size MiB", "B/page", "backend", "ms (x)"
        );
        for r in &self.write_only {
            let _ = writeln!(
                s,
                "{:>10} {:>6} {:>12} {:>9.2} ({:.2}x)",
                r.size_mib, r.bytes_per_page, r.backend, r.pass_ms, r.ratio_to_none
            );
        }
        let get = |b: &str, size: usize, bpp: usize| {
            self.write_only
                .iter()
                .find(|r| r.backend == b && r.size_mib == size && r.bytes_per_page == bpp)
                .map(|r| r.pass_ms)
        };
        for &size in &self.config.sizes_mib {
            if let (Some(u), Some(m)) = (get("uffd-wp", size, 1), get("mprotect", size, 1)) {
                let _ = writeln!(
                    s,
                    "    {size} MiB, 1 B/page: uffd-wp is {:.1}x faster than mprotect",
                    m / u
                );
            }
        }
        let _ = writeln!(s, "\n(b) 25/75 read/write timeline, mean ops/s (ratio to none), collections, mean collect ms");
        for t in &self.timeline {
            let _ = writeln!(
                s,
                "{:>12} {:>12.0} ({:.2}x) {:>5} {:>8.2}",
                t.backend, t.mean_ops_per_s, t.ratio_to_none, t.collections, t.mean_collect_ms
            );
        }
        let tput = |b: &str| {
            self.timeline
                .iter()
                .find(|t| t.backend == b)
                .map(|t| t.mean_ops_per_s)
        };
        if let (Some(u), Some(m)) = (tput("uffd-wp"), tput("mprotect")) {
            let _ = writeln!(s, "    uffd-wp throughput is {:.2}x mprotect's", u / m);
        }
        let _ = writeln!(
            s,
            "\n(c) collect ms after writing x% of {} MiB (read once: {:.2} ms)",
            self.config.collect_mib, self.read_once_ms
        );
        for r in &self.collect {
            let _ = writeln!(
                s,
                "{:>12} {:>6} {:>4}% {:>9.3} ms {:>7} ranges  ({:.2}x read-once)",
                r.backend, r.layout, r.percent, r.collect_ms, r.ranges, r.ratio_to_read_once
            );
        }
        s
    }
}
