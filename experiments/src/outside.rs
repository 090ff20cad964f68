//! Tracking a running process from outside (issue: LDT's uses), experiment
//! (a): the time of one collection over a process's region with x % of its
//! pages written since the last one, for `uffd-wp` from outside (a
//! userfaultfd made inside the target), `hash` from outside, and `uffd-wp`
//! in-process over the same amount of memory, in the same run.
//!
//! The target is a forked child holding the region (every page populated);
//! before each collection it rewrites a fixed random x % of its pages and
//! says when it is done. Every collection must report at least those pages
//! (checked); the medians of the repeats and their spread are reported.

use crate::dump::Target;
use crate::svg::{Chart, Series};
use crate::{median, Machine};
use pagewise::{Result, PAGE_SIZE};
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_track::{BackendKind, DirtyTracker};
use serde::Serialize;
use std::time::Instant;

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The region, MiB.
    pub mib: usize,
    /// Percentages of pages written between collections.
    pub percents: Vec<f64>,
    /// Collections per point.
    pub reps: usize,
}

impl Config {
    /// A short run (256 MiB).
    pub fn quick() -> Self {
        Config {
            mib: 256,
            percents: vec![1.0, 10.0],
            reps: 5,
        }
    }
    /// The experiment (1 GiB, 1 %, 10 % and 50 %).
    pub fn full() -> Self {
        Config {
            mib: 1024,
            percents: vec![1.0, 10.0, 50.0],
            reps: 11,
        }
    }
}

/// One point.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `uffd-wp outside`, `hash outside` or `uffd-wp in-process`.
    pub how: String,
    /// Pages written between collections, %.
    pub percent: f64,
    /// Median time of one collection, ms.
    pub collect_ms: f64,
    /// Lowest and highest of the repeats, ms.
    pub min_ms: f64,
    /// Highest of the repeats, ms.
    pub max_ms: f64,
    /// Median pages reported (at least the pages written: checked).
    pub pages_reported: u64,
}

/// What the experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// The configuration.
    pub config: Config,
    /// The points.
    pub rows: Vec<Row>,
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    let lo = v.iter().cloned().fold(f64::MAX, f64::min);
    let hi = v.iter().cloned().fold(f64::MIN, f64::max);
    (median(&mut v), lo, hi)
}

/// Collections of `t` after each rewrite `rewrite` makes of `written` pages.
fn measure(
    how: &str,
    percent: f64,
    reps: usize,
    written: usize,
    t: &mut DirtyTracker,
    rewrite: &mut dyn FnMut(u8) -> Result<()>,
) -> Result<Row> {
    // One collection first: the baseline.
    t.collect()?;
    let mut ms = Vec::new();
    let mut pages = Vec::new();
    for i in 0..reps {
        rewrite(i as u8)?;
        let t0 = Instant::now();
        let c = t.collect()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if (c.stats.pages_dirty as usize) < written {
            return Err(crate::check_failed(format!(
                "{how}: {} pages reported for {written} written",
                c.stats.pages_dirty
            )));
        }
        pages.push(c.stats.pages_dirty as f64);
    }
    let (collect_ms, min_ms, max_ms) = stats(ms);
    Ok(Row {
        how: how.into(),
        percent,
        collect_ms,
        min_ms,
        max_ms,
        pages_reported: median(&mut pages) as u64,
    })
}

/// Runs the experiment.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if let Err(why) = BackendKind::UffdWp.available_for_pid() {
        return Err(pagewise::Error::from(pagewise::MechError::Unsupported {
            feature: "uffd-wp from outside",
            why,
        }));
    }
    let len = cfg.mib << 20;
    let mut rows = Vec::new();
    for &percent in &cfg.percents {
        let mem = AnonMemory::new(len)?;
        mem.write_pass(1, 1);
        let pages = mem.pages();
        let mut order: Vec<usize> = (0..pages).collect();
        let mut rng = Rng::new(17);
        for i in (1..pages).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let written = ((pages as f64) * percent / 100.0) as usize;
        let changes = &order[..written];
        {
            let mut target = Target::spawn(&mem, changes)?;
            for kind in [BackendKind::UffdWp, BackendKind::Hash] {
                let how = format!("{kind} outside");
                progress(&format!("(a) {how}, {percent} % of {} MiB", cfg.mib));
                let mut t = DirtyTracker::for_process(target.pid, kind)?;
                rows.push(measure(
                    &how,
                    percent,
                    cfg.reps,
                    written,
                    &mut t,
                    &mut |v| target.change(v),
                )?);
            }
        }
        progress(&format!(
            "(a) uffd-wp in-process, {percent} % of {} MiB",
            cfg.mib
        ));
        let mut t = DirtyTracker::new(&[mem.region()], BackendKind::UffdWp)?;
        rows.push(measure(
            "uffd-wp in-process",
            percent,
            cfg.reps,
            written,
            &mut t,
            &mut |v| {
                for &p in changes {
                    mem.write_byte(p * PAGE_SIZE + 17, v ^ 0x5a);
                }
                Ok(())
            },
        )?);
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        rows,
    })
}

impl Report {
    fn row(&self, how: &str, percent: f64) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.how == how && r.percent == percent)
    }

    /// The table, with the ratios the goals speak of.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "pagewise bench outside — {}\n(a) one collection over {} MiB with x % of its pages written since the last; median of {} (min–max)\n\n{:>6}  {:>26}  {:>26}  {:>26}  {:>12}  {:>12}\n",
            self.machine,
            self.config.mib,
            self.config.reps,
            "x %",
            "uffd-wp outside ms",
            "hash outside ms",
            "uffd-wp in-process ms",
            "hash/outside",
            "outside/in"
        );
        let cell = |r: Option<&Row>| {
            r.map_or("-".to_string(), |r| {
                format!("{:.2} ({:.2}–{:.2})", r.collect_ms, r.min_ms, r.max_ms)
            })
        };
        for &p in &self.config.percents {
            let (o, h, i) = (
                self.row("uffd-wp outside", p),
                self.row("hash outside", p),
                self.row("uffd-wp in-process", p),
            );
            let ratio = |a: Option<&Row>, b: Option<&Row>| match (a, b) {
                (Some(a), Some(b)) if b.collect_ms > 0.0 => {
                    format!("{:.1}x", a.collect_ms / b.collect_ms)
                }
                _ => "-".into(),
            };
            s += &format!(
                "{:>6}  {:>26}  {:>26}  {:>26}  {:>12}  {:>12}\n",
                p,
                cell(o),
                cell(h),
                cell(i),
                ratio(h, o),
                ratio(o, i)
            );
        }
        s += "\ngoals at 1 GiB, 10 %: uffd-wp outside at most 3 ms per collection, at least 10x faster than hash outside.\n";
        s
    }

    /// One plot: collection time against the share of pages written.
    pub fn charts(&self) -> Vec<(String, Chart)> {
        let series = ["uffd-wp outside", "hash outside", "uffd-wp in-process"]
            .iter()
            .map(|how| Series {
                label: how.to_string(),
                points: self
                    .rows
                    .iter()
                    .filter(|r| r.how == *how)
                    .map(|r| (r.percent, r.collect_ms))
                    .collect(),
            })
            .collect();
        vec![(
            "outside.svg".into(),
            Chart {
                title: format!(
                    "(a) one collection over {} MiB of another process",
                    self.config.mib
                ),
                x_label: "pages written since the last collection (%)".into(),
                y_label: "ms per collection".into(),
                log_x: false,
                log_y: true,
                series,
            },
        )]
    }
}
