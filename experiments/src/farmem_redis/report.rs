//! The experiment's report: its summary, one line per point, and its
//! plots (DiME's Figures 5.2, 5.3 and 5.4).

use super::*;
use crate::svg::{Chart, Series};

impl Report {
    /// One line per point, each against the baseline, then what holds.
    pub(super) fn summary(&self, repeats: usize) -> Result<String> {
        let mut text = String::new();
        use std::fmt::Write as _;
        writeln!(
            text,
            "{} ({} keys x {} B, {} requests per point)",
            self.command, self.keys, self.value_bytes, self.requests
        )?;
        writeln!(
            text,
            "baseline (not emulated): {:.0} {}",
            self.baseline_get_rps,
            self.app.unit()
        )?;
        writeln!(
            text,
            "{:<15} {:>7} {:>9} {:>10} {:>8} {:>9} {:>9} {:>9}",
            "series",
            "local%",
            "lat_ns",
            self.app.unit(),
            "x base",
            "faults",
            "evicts",
            "verified"
        )?;
        for p in self
            .overhead
            .iter()
            .chain(&self.by_local)
            .chain(&self.by_latency)
            .chain(&self.isolation)
            .chain(&self.local_0)
            .chain(&self.system)
            .chain(&self.system_isolation)
        {
            writeln!(
                text,
                "{:<15} {:>7} {:>9} {:>10.0} {:>8.3} {:>9} {:>9} {:>9}",
                p.series,
                p.local_percent.map_or("-".into(), |v| v.to_string()),
                p.latency_ns.map_or("-".into(), |v| v.to_string()),
                p.get_rps,
                p.get_rps / self.baseline_get_rps,
                p.page_fault_count + p.major_faults,
                p.evictions,
                if p.oom_killed {
                    "OOM-KILLED".to_string()
                } else {
                    p.verified_keys.to_string()
                }
            )?;
        }
        writeln!(text, "(each point: the median of {} runs; faults: pagewise's, or the server's major faults (swap-ins) under the system-wide emulator)", repeats)?;
        if let Some(why) = &self.system_unavailable {
            writeln!(
                text,
                "system-wide emulator (zram swap in a memory cgroup): not run: {why}"
            )?;
        } else {
            writeln!(
                text,
                "system-wide emulator: a memory cgroup limited to local% of the data set ({:.0} MiB), swapping to zram; no delay injected (nothing on this kernel can delay a swap-in); compare with local-0",
                self.data_bytes as f64 / (1 << 20) as f64
            )?;
        }
        writeln!(
            text,
            "throughput falls as local memory shrinks: {}; as latency grows: {} (10 % noise allowed)",
            self.falls_with_less_local, self.falls_with_more_latency
        )?;
        Ok(text)
    }

    /// Throughput against local memory and against latency, and faults
    /// against local memory (`fp` % local and `fl` ns where fixed).
    pub(super) fn charts(&self, fp: u64, fl: u64) -> Vec<(String, Chart)> {
        let pts = |v: &[Point], x: fn(&Point) -> f64| {
            v.iter().map(|p| (x(p), p.get_rps)).collect::<Vec<_>>()
        };
        let by_local = Chart {
            title: format!(
                "(d) {} {} against local memory ({fl} ns latency)",
                self.app.name(),
                self.app.unit()
            ),
            x_label: "local memory (% of pages holding data)".into(),
            y_label: self.app.unit().into(),
            log_x: false,
            log_y: false,
            series: vec![
                Series {
                    label: "emulated".into(),
                    points: pts(&self.by_local, |p| p.local_percent.unwrap_or(0) as f64),
                },
                Series {
                    label: "emulated, latency 0".into(),
                    points: pts(&self.local_0, |p| p.local_percent.unwrap_or(0) as f64),
                },
                Series {
                    label: "system-wide (zram swap, cgroup)".into(),
                    points: pts(&self.system, |p| p.local_percent.unwrap_or(0) as f64),
                },
                Series {
                    label: "not emulated".into(),
                    points: vec![
                        (10.0, self.baseline_get_rps),
                        (100.0, self.baseline_get_rps),
                    ],
                },
            ],
        };
        let faults = |v: &[Point]| {
            v.iter()
                .map(|p| {
                    (
                        p.local_percent.unwrap_or(0) as f64,
                        (p.page_fault_count + p.major_faults) as f64,
                    )
                })
                .collect::<Vec<_>>()
        };
        let faults_chart = Chart {
            title: format!(
                "{} faults against local memory (DiME Fig. 5.4a/5.5a)",
                self.app.name()
            ),
            x_label: "local memory (% of the data set)".into(),
            y_label: "faults per run".into(),
            log_x: false,
            log_y: true,
            series: vec![
                Series {
                    label: format!("emulated, {fl} ns"),
                    points: faults(&self.by_local),
                },
                Series {
                    label: "emulated, latency 0".into(),
                    points: faults(&self.local_0),
                },
                Series {
                    label: "system-wide (major faults)".into(),
                    points: faults(&self.system),
                },
            ],
        };
        let by_latency = Chart {
            title: format!(
                "(d) {} {} against latency ({fp} % local)",
                self.app.name(),
                self.app.unit()
            ),
            x_label: "one-way latency (ns)".into(),
            y_label: self.app.unit().into(),
            log_x: false,
            log_y: false,
            series: vec![Series {
                label: "emulated".into(),
                points: pts(&self.by_latency, |p| p.latency_ns.unwrap_or(0) as f64),
            }],
        };
        vec![
            (format!("{}_local.svg", self.app.name()), by_local),
            (format!("{}_faults.svg", self.app.name()), faults_chart),
            (format!("{}_latency.svg", self.app.name()), by_latency),
        ]
    }
}
