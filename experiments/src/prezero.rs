//! `pagewise bench prezero`: HawkEye's experiment (d), pre-zeroed huge
//! pages. An allocation-heavy loop grows through a fresh mapping 2 MiB at a
//! time: it writes the first word of the next 2 MiB (the *first touch*, the
//! latency measured), then fills the rest. Three ways, in one run, each on a
//! fresh mapping:
//!
//! - `no THP`: `MADV_NOHUGEPAGE`, base pages (512 faults per 2 MiB);
//! - `THP`: `MADV_HUGEPAGE` (as THP `always` does for every mapping): the
//!   first touch waits while the kernel zeroes 2 MiB;
//! - `THP + pre-zeroing`: the same, with [`pagewise_thp::prezero`]'s thread
//!   faulting huge pages in ahead of the loop;
//! - the kernel's own policies ([`crate::kernel::ThpPolicy`]): no advice on
//!   the mapping, the policy in force (`always` is `THP` for every
//!   mapping; `64K mTHP` faults 64 KiB at a time).
//!
//! Each run starts from one of two states of memory ([`REGIMES`]):
//! compacted just before, or just after the same size was used in base
//! pages (huge pages then wait on compaction). The ways run in turn within
//! each state, so no way inherits memory another left behind in a better
//! state; each repeat runs them in an order of its own, so no way follows
//! the same one in every run.
//!
//! After each 2 MiB is filled, the loop reads it `passes` times (the
//! program's work on what it allocated). Reported: the first-touch latency
//! (p50, p99, max) and the loop's run time. One run of each way is made and
//! dropped first: a process's first huge pages can wait on compaction,
//! which would otherwise weigh on whichever way runs first. Self-check: every 2 MiB is read back after the loop (its fill, and
//! nothing else changed).

use crate::kernel::ThpPolicy;
use crate::{median, Machine};
use pagewise::{Error, Result, HUGE_PAGE_SIZE};
use pagewise_mech::workload::AnonMemory;
use pagewise_thp::prezero::{PrezeroOptions, Prezeroer};
use serde::Serialize;
use std::time::Instant;

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Mapping grown through, MiB.
    pub mib: usize,
    /// Runs per way (medians reported).
    pub repeats: usize,
    /// Huge pages the pre-zeroing thread keeps ahead.
    pub ahead: u64,
    /// Read passes over each 2 MiB after filling it (the program's work on
    /// what it allocated).
    pub passes: usize,
    /// Most huge pages the thread pre-zeroes per second.
    pub rate: f64,
}

impl Config {
    /// A short run.
    pub fn quick() -> Self {
        Config {
            mib: 256,
            repeats: 2,
            ahead: 4,
            passes: 4,
            rate: 4000.0,
        }
    }
    /// The experiment.
    pub fn full() -> Self {
        Config {
            mib: 2048,
            repeats: 5,
            ahead: 4,
            passes: 4,
            rate: 4000.0,
        }
    }
}

/// One way of growing.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The state of memory the run started from (see [`REGIMES`]).
    pub regime: String,
    /// The way.
    pub way: String,
    /// Run number.
    pub repeat: usize,
    /// The way that ran just before it in its state (empty for the
    /// first).
    pub after: String,
    /// First-touch latency, µs: median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest.
    pub max_us: f64,
    /// The loop's run time, ms.
    pub run_ms: f64,
    /// Huge pages in the mapping after the loop.
    pub huge_pages: u64,
    /// 64 KiB huge pages faulted in on the machine during the loop.
    pub mthp_64k_faults: u64,
    /// Huge pages the thread faulted in ahead.
    pub prezeroed: u64,
    /// The thread's CPU time, ms.
    pub thread_cpu_ms: f64,
    /// The read-back found every byte as written.
    pub verified: bool,
}

/// What the experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// Configuration.
    pub config: Config,
    /// Runs.
    pub rows: Vec<Row>,
    /// The kernel's policies this kernel cannot run, with why.
    pub kernel_skipped: Vec<String>,
    /// The THP knobs no policy changed, as the machine had them.
    pub thp_knobs: Vec<String>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The states of memory a run starts from: `compacted` (free memory
/// compacted just before, through `/proc/sys/vm/compact_memory`: huge pages
/// come at the cost of zeroing them) and `after base pages` (the same size
/// in base pages written and freed just before: huge pages may wait on
/// compaction).
pub const REGIMES: [&str; 2] = ["compacted", "after base pages"];

/// Brings memory to `regime` before a run.
fn prepare(regime: &str, mib: usize) -> Result<()> {
    if regime == "compacted" {
        std::fs::write("/proc/sys/vm/compact_memory", "1")
            .map_err(|e| Error::os("writing /proc/sys/vm/compact_memory (root)", e))?;
    } else {
        let m = AnonMemory::reserve(mib << 20)?;
        m.madvise(0, m.len(), libc::MADV_NOHUGEPAGE)
            .map_err(|e| Error::os("madvise", e))?;
        m.write_pass(1, 1);
    }
    Ok(())
}

fn one(cfg: &Config, regime: &str, way: &str, repeat: usize) -> Result<Row> {
    prepare(regime, cfg.mib)?;
    let len = cfg.mib << 20;
    let mem = AnonMemory::reserve(len)?;
    // The kernel's policies: no advice, the policy decides.
    let advice = match way {
        "no THP" => Some(libc::MADV_NOHUGEPAGE),
        "THP" | "THP + pre-zeroing" => Some(14), // MADV_HUGEPAGE
        _ => None,
    };
    if let Some(advice) = advice {
        mem.madvise(0, len, advice)
            .map_err(|e| Error::os("madvise of the mapping", e))?;
    }
    let faults = crate::kernel::mthp_64k_faults();
    let chunks = len / HUGE_PAGE_SIZE;
    let base = mem.addr() as usize;
    let mut lat = Vec::with_capacity(chunks);
    let pre = if way == "THP + pre-zeroing" {
        Some(Prezeroer::start(
            PrezeroOptions::default().ahead(cfg.ahead).rate(cfg.rate),
        )?)
    } else {
        None
    };
    let mut sum = 0u64;
    let t0 = Instant::now();
    for i in 0..chunks {
        let at = base + i * HUGE_PAGE_SIZE;
        let t = Instant::now();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(at as *mut u64, i as u64 | 1 << 63) };
        lat.push(t.elapsed().as_nanos() as f64 / 1e3);
        // SAFETY: the rest of this 2 MiB, inside the mapping.
        unsafe { std::ptr::write_bytes((at + 8) as *mut u8, (i % 251) as u8, HUGE_PAGE_SIZE - 8) };
        // The program's work on it: read passes.
        // SAFETY: this 2 MiB, written above.
        let words = unsafe { std::slice::from_raw_parts(at as *const u64, HUGE_PAGE_SIZE / 8) };
        for _ in 0..cfg.passes {
            sum = sum.wrapping_add(words.iter().fold(0u64, |a, &w| a.wrapping_add(w)));
        }
    }
    std::hint::black_box(sum);
    let run_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mthp_64k_faults = crate::kernel::mthp_64k_faults().saturating_sub(faults);
    let stats = pre.as_ref().map(|p| p.stats()).unwrap_or_default();
    drop(pre);
    let mut verified = true;
    for i in 0..chunks {
        let at = base + i * HUGE_PAGE_SIZE;
        // SAFETY: inside the mapping, written above.
        let (w, bytes) = unsafe {
            (
                std::ptr::read_volatile(at as *const u64),
                std::slice::from_raw_parts((at + 8) as *const u8, HUGE_PAGE_SIZE - 8),
            )
        };
        verified &= w == (i as u64 | 1 << 63) && bytes.iter().all(|&b| b == (i % 251) as u8);
    }
    let mut w = pagewise_mech::walk::PageWalker::new(None)?;
    let mut runs = Vec::new();
    let h = pagewise_sys::pagemap::category::HUGE;
    w.categories(mem.region(), h, h, &mut runs)?;
    let huge_pages = runs
        .iter()
        .map(|r| (r.end - r.start) / HUGE_PAGE_SIZE as u64)
        .sum();
    lat.sort_by(f64::total_cmp);
    Ok(Row {
        regime: regime.to_string(),
        way: way.to_string(),
        repeat,
        after: String::new(),
        p50_us: pct(&lat, 0.5),
        p99_us: pct(&lat, 0.99),
        max_us: *lat.last().unwrap_or(&0.0),
        run_ms,
        huge_pages,
        mthp_64k_faults,
        prezeroed: stats.populated,
        thread_cpu_ms: stats.cpu_ms,
        verified,
    })
}

const WAYS: [&str; 3] = ["no THP", "THP", "THP + pre-zeroing"];

/// One run of `way`, under its kernel policy where it is one.
fn run_way(
    cfg: &Config,
    regime: &str,
    way: (&str, Option<ThpPolicy>),
    repeat: usize,
) -> Result<Row> {
    let applied = way.1.map(ThpPolicy::apply).transpose()?;
    let row = one(cfg, regime, way.0, repeat);
    drop(applied);
    row
}

/// `0..n` in an order drawn from `seed` (Fisher–Yates over the
/// workload's generator).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut rng = pagewise_mech::workload::Rng::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for i in (1..n).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}

/// Runs the experiment.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let (ready, kernel_skipped) = ThpPolicy::available();
    let ways: Vec<(&str, Option<ThpPolicy>)> = WAYS
        .iter()
        .map(|&w| (w, None))
        .chain(ready.iter().map(|&p| (p.name(), Some(p))))
        .collect();
    let mut rows = Vec::new();
    for regime in REGIMES {
        for &way in &ways {
            progress(&format!("{regime}: {}, warm-up (dropped)", way.0));
            run_way(cfg, regime, way, 0)?;
        }
        // Each repeat runs the ways in an order of its own (shuffled,
        // the same on every run of the benchmark): how fast memory a way
        // has just freed faults in again depends on what freed it, and
        // no way is to follow the same one in every run. Each row says
        // which way ran before it.
        for repeat in 0..cfg.repeats {
            let order = shuffled(ways.len(), repeat as u64 + 1);
            for (k, &i) in order.iter().enumerate() {
                let way = ways[i];
                progress(&format!("{regime}: {}, run {}", way.0, repeat + 1));
                let mut row = run_way(cfg, regime, way, repeat)?;
                if k > 0 {
                    row.after = ways[order[k - 1]].0.to_string();
                }
                rows.push(row);
            }
        }
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        rows,
        kernel_skipped,
        thp_knobs: crate::kernel::thp_knobs(),
    })
}

impl Report {
    /// The kernel's policies the run made, in order.
    fn kernel_ways(&self) -> Vec<&str> {
        crate::in_order(
            self.rows
                .iter()
                .map(|r| r.way.as_str())
                .filter(|w| !WAYS.contains(w)),
        )
    }

    fn med(&self, regime: &str, way: &str, f: fn(&Row) -> f64) -> f64 {
        let mut v: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.regime == regime && r.way == way)
            .map(f)
            .collect();
        median(&mut v)
    }

    /// The table.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "pagewise bench prezero — {}\n(d) growing through {} MiB, 2 MiB at a time: first touch of each 2 MiB, then the rest filled and read {} times; pre-zeroing {} huge pages ahead, at most {} per second\n\n{:>26} {:>4} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>10} {:>11} {:>9}  {}\n",
            self.machine, self.config.mib, self.config.passes, self.config.ahead, self.config.rate,
            "way", "run", "p50 µs", "p99 µs", "max µs", "run ms", "huge", "64K", "prezeroed", "thread ms", "verified", "after"
        );
        for regime in REGIMES {
            s += &format!("{regime}:\n");
            for r in self.rows.iter().filter(|r| r.regime == regime) {
                s += &format!(
                    "{:>26} {:>4} {:>9.2} {:>9.2} {:>9.1} {:>9.1} {:>6} {:>6} {:>10} {:>11.1} {:>9}  {}\n",
                    r.way,
                    r.repeat + 1,
                    r.p50_us,
                    r.p99_us,
                    r.max_us,
                    r.run_ms,
                    r.huge_pages,
                    r.mthp_64k_faults,
                    r.prezeroed,
                    r.thread_cpu_ms,
                    r.verified,
                    r.after
                );
            }
            let m = |w: &str, f: fn(&Row) -> f64| self.med(regime, w, f);
            let (thp99, pre99) = (m("THP", |r| r.p99_us), m("THP + pre-zeroing", |r| r.p99_us));
            let (thp50, pre50) = (m("THP", |r| r.p50_us), m("THP + pre-zeroing", |r| r.p50_us));
            let (no_run, thp_run, pre_run) = (
                m("no THP", |r| r.run_ms),
                m("THP", |r| r.run_ms),
                m("THP + pre-zeroing", |r| r.run_ms),
            );
            s += &format!(
                "  medians: first touch p50 THP {thp50:.1} µs, with pre-zeroing {pre50:.2} µs; p99 THP {thp99:.1} µs, with pre-zeroing {pre99:.1} µs ({:.1} % of THP's); run time no THP {no_run:.1} ms, THP {thp_run:.1} ms, with pre-zeroing {pre_run:.1} ms ({:.2}x THP's)\n",
                pre99 / thp99 * 100.0,
                pre_run / thp_run
            );
            for w in self.kernel_ways() {
                s += &format!(
                    "  {w}: first touch p50 {:.2} µs, p99 {:.1} µs; run time {:.1} ms ({:.2}x THP's); {} huge pages\n",
                    m(w, |r| r.p50_us),
                    m(w, |r| r.p99_us),
                    m(w, |r| r.run_ms),
                    m(w, |r| r.run_ms) / thp_run,
                    m(w, |r| r.huge_pages as f64)
                );
            }
            s += "\n";
        }
        for why in &self.kernel_skipped {
            s += &format!("skipped: {why}\n");
        }
        s += &format!(
            "the kernel's policies: no advice on the mapping, the policy in force; the THP knobs no policy changes, as the machine has them: {}\n",
            self.thp_knobs.join(" ")
        );
        s += "goal: p99 first-touch latency of a new 2 MiB at most 10 % of plain THP's; run time no worse than plain THP's.\n";
        s
    }

    /// First-touch latency percentiles per way.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let mut series = Vec::new();
        let ways: Vec<&str> = WAYS.iter().copied().chain(self.kernel_ways()).collect();
        for regime in REGIMES {
            for &w in &ways {
                series.push(crate::svg::Series {
                    label: format!("{w} ({regime})"),
                    points: vec![
                        (50.0, self.med(regime, w, |r| r.p50_us).max(0.01)),
                        (99.0, self.med(regime, w, |r| r.p99_us).max(0.01)),
                        (100.0, self.med(regime, w, |r| r.max_us).max(0.01)),
                    ],
                });
            }
        }
        vec![(
            "prezero.svg".into(),
            crate::svg::Chart {
                title: "(d) first touch of a new 2 MiB".into(),
                x_label: "percentile".into(),
                y_label: "µs".into(),
                log_x: false,
                log_y: true,
                series,
            },
        )]
    }
}

#[cfg(test)]
mod tests {
    /// Every repeat's order holds every way once, and over five repeats
    /// no way follows the same one every time.
    #[test]
    fn each_order_is_a_permutation_and_predecessors_change() {
        let n = 8;
        let orders: Vec<Vec<usize>> = (1..=5).map(|s| super::shuffled(n, s)).collect();
        for o in &orders {
            let mut sorted = o.clone();
            sorted.sort();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "{o:?}");
        }
        for way in 0..n {
            let before: Vec<Option<usize>> = orders
                .iter()
                .map(|o| {
                    let k = o.iter().position(|&w| w == way).unwrap();
                    (k > 0).then(|| o[k - 1])
                })
                .collect();
            assert!(
                before.windows(2).any(|w| w[0] != w[1]),
                "way {way} follows {before:?} in every repeat"
            );
        }
    }
}
