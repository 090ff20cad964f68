//! The report of `bench dedup`: each scheme's runs summed up per level
//! (medians over the repeats, with their spread), its summary and plots.

use super::*;

/// A scheme's runs at one level, summed up: medians over the repeats.
#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    saved_mib: f64,
    usage_mib: f64,
    swap_mib: f64,
    ops_per_s: f64,
    ops_per_cpu_s: f64,
    ops_min: f64,
    ops_max: f64,
    huge_end: f64,
    ksmd_cpu_ms: f64,
    agent_cpu_ms: f64,
    split: f64,
    rebuilt: f64,
    oom_killed: u64,
    verified: bool,
}

impl Report {
    fn runs(&self, scheme: &str, level: f64) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| r.scheme == scheme && r.level == level)
            .collect()
    }

    fn summary_of(&self, scheme: &str, level: f64) -> Option<Summary> {
        let rs = self.runs(scheme, level);
        if rs.is_empty() {
            return None;
        }
        let med =
            |f: fn(&Row) -> f64| crate::median(&mut rs.iter().map(|r| f(r)).collect::<Vec<_>>());
        Some(Summary {
            saved_mib: med(|r| r.saved_mib),
            usage_mib: med(|r| r.usage_mib),
            swap_mib: med(|r| r.swap_mib),
            ops_per_s: med(|r| r.ops_per_s),
            ops_per_cpu_s: med(|r| r.ops_per_cpu_s),
            ops_min: rs.iter().map(|r| r.ops_min).fold(f64::INFINITY, f64::min),
            ops_max: rs.iter().map(|r| r.ops_max).fold(0.0, f64::max),
            huge_end: med(|r| r.huge_end as f64),
            ksmd_cpu_ms: med(|r| r.ksmd_cpu_ms),
            agent_cpu_ms: med(|r| r.agent_cpu_ms),
            split: med(|r| r.split as f64),
            rebuilt: med(|r| r.rebuilt as f64),
            oom_killed: rs.iter().map(|r| r.oom_killed).sum(),
            verified: rs.iter().all(|r| r.verified),
        })
    }

    /// The tables, one per level, and how the agent compares.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mib = ((c.regions * HUGE_PAGE_SIZE) >> 20) as u64;
        let mut s = format!(
            "pagewise bench dedup — {}\nSmartMD's trade-off: {} processes of {} MiB, {} MiB of it the same table in each (every eighth table region in base pages, the rest huge); hot: {} table + {} own regions of 2 MiB per process (reads, one op in {WRITE_EVERY} a write to every {WRITE_STRIDE}th page); a sweep reads {} pages per round; {} s per scheme, {} run(s) each (medians; ops/s spread: lowest and highest 1 s sample of the second halves; ops/CPU-s: per second of the processes' own CPU time); ksmd paced to one pass in {} ms\n",
            self.machine,
            c.processes,
            mib,
            c.table_regions() * 2,
            c.hot_table(),
            c.hot_own(),
            c.sweep_pages,
            c.seconds,
            c.repeats,
            c.full_scan_ms,
        );
        s += &format!(
            "ksm-advisor, ksm-advisor-tuned: KSM everywhere with ksmd paced by the kernel's advisor instead (advisor_mode scan-time, advisor_target_scan_time 200 s, its default, and {} s, the run's own pace) and smart scan on, as the kernel ships it; the other schemes keep smart scan off\n",
            (c.full_scan_ms / 1000).max(1)
        );
        for &level in &c.levels {
            s += &format!(
                "\novercommitment {level} (memory limited to {:.0} MiB of {:.0} MiB)\n{:>15} {:>9} {:>7} {:>8} {:>8} {:>12} {:>8} {:>23} {:>6} {:>12} {:>8} {:>8} {:>8} {:>6} {:>6} {:>7} {:>4} {:>8}\n",
                cfg_limit_mib(c, level),
                c.demand() as f64 / MIB,
                "scheme", "saved MiB", "of KSM", "held MiB", "swap MiB", "ops/s", "of no-spl", "spread", "huge", "ops/CPU-s", "of no-spl", "ksmd ms", "agent ms", "CPU %", "split", "rebuilt", "OOM", "verified"
            );
            let ksm = self
                .summary_of("ksm-everywhere", level)
                .map_or(0.0, |r| r.saved_mib);
            let (nosplit, nosplit_cpu) = self
                .summary_of("no-splitting", level)
                .map_or((0.0, 0.0), |r| (r.ops_per_s, r.ops_per_cpu_s));
            for scheme in SCHEMES {
                let Some(r) = self.summary_of(scheme, level) else {
                    continue;
                };
                s += &format!(
                    "{:>15} {:>9.1} {:>7} {:>8.0} {:>8.0} {:>12.0} {:>8} {:>11.0}-{:<11.0} {:>6.0} {:>12.0} {:>8} {:>8.0} {:>8.0} {:>6.1} {:>6.0} {:>7.0} {:>4} {:>8}\n",
                    scheme,
                    r.saved_mib,
                    crate::pct(r.saved_mib, ksm),
                    r.usage_mib,
                    r.swap_mib,
                    r.ops_per_s,
                    crate::pct(r.ops_per_s, nosplit),
                    r.ops_min,
                    r.ops_max,
                    r.huge_end,
                    r.ops_per_cpu_s,
                    crate::pct(r.ops_per_cpu_s, nosplit_cpu),
                    r.ksmd_cpu_ms,
                    r.agent_cpu_ms,
                    (r.ksmd_cpu_ms + r.agent_cpu_ms) / (c.seconds as f64 * 10.0),
                    r.split,
                    r.rebuilt,
                    r.oom_killed,
                    r.verified
                );
            }
            if let Some(best) = SCHEMES
                .iter()
                .filter_map(|&sc| Some((sc, self.summary_of(sc, level)?.ops_per_s)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
            {
                s += &format!("best throughput at {level}: {}\n", best.0);
            }
            // The goal against the kernel's own pacing: at least 90 % of
            // the advisor's saving for at most half its ksmd CPU time.
            for adv in ["ksm-advisor", "ksm-advisor-tuned"] {
                if let (Some(a), Some(m)) = (
                    self.summary_of(adv, level),
                    self.summary_of("smartmd", level),
                ) {
                    // A share of nothing says nothing.
                    if a.saved_mib < 1.0 {
                        s += &format!(
                            "smartmd against {adv} at {level}: it saved nothing in the median run ({:.1} MiB, ksmd {:.0} ms); smartmd {:.1} MiB (ksmd {:.0} ms, the agent's own {:.0} ms)\n",
                            a.saved_mib, a.ksmd_cpu_ms, m.saved_mib, m.ksmd_cpu_ms, m.agent_cpu_ms
                        );
                        continue;
                    }
                    s += &format!(
                        "smartmd against {adv} at {level}: {} of its saving ({:.1} against {:.1} MiB), ksmd CPU {} of its ({:.0} against {:.0} ms; the agent's own {:.0} ms)\n",
                        crate::pct(m.saved_mib, a.saved_mib),
                        m.saved_mib,
                        a.saved_mib,
                        crate::pct(m.ksmd_cpu_ms, a.ksmd_cpu_ms),
                        m.ksmd_cpu_ms,
                        a.ksmd_cpu_ms,
                        m.agent_cpu_ms
                    );
                }
            }
        }
        for why in &self.skipped {
            s += &format!("not run: {why}\n");
        }
        let filters: Vec<(f64, [u64; 3])> = self
            .rows
            .iter()
            .filter(|r| r.scheme == "smartmd")
            .filter_map(|r| r.filter)
            .collect();
        if let Some(&(_, [looked, labelled, exact])) = filters.first() {
            let fp: Vec<f64> = filters.iter().map(|f| f.0 * 100.0).collect();
            let (m, lo, hi) = crate::median_min_max(fp);
            s += &format!(
                "\nsmartmd's counting Bloom filter (last step of a run): {looked} pages looked up, {labelled} labelled duplicate, {exact} with a duplicate in fact; false positives {m:.3} % of those looked up (runs: {lo:.3} to {hi:.3} %)\n"
            );
        }
        s
    }

    /// SmartMD's trade-off (saving against throughput), throughput under
    /// overcommitment, and saving and throughput over time.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let c = &self.config;
        let present: Vec<&str> = SCHEMES
            .into_iter()
            .filter(|s| self.rows.iter().any(|r| r.scheme == *s))
            .collect();
        let first = c.levels.first().copied().unwrap_or(0.8);
        let over_time = |f: fn(&Sample) -> f64| -> Vec<crate::svg::Series> {
            present
                .iter()
                .filter_map(|&sc| {
                    let r = self.runs(sc, first).into_iter().next()?;
                    Some(crate::svg::Series {
                        label: sc.into(),
                        points: r.samples.iter().map(|s| (s.t_s, f(s))).collect(),
                    })
                })
                .collect()
        };
        let mut charts = vec![(
            "dedup-tradeoff.svg".into(),
            crate::svg::Chart {
                title: format!(
                    "memory saved against throughput, per scheme (overcommitment {first})"
                ),
                x_label: "memory saved (MiB)".into(),
                y_label: "operations per second (millions)".into(),
                log_x: false,
                log_y: false,
                series: present
                    .iter()
                    .filter_map(|&sc| {
                        let r = self.summary_of(sc, first)?;
                        Some(crate::svg::Series {
                            label: sc.into(),
                            points: vec![(r.saved_mib, r.ops_per_s / 1e6)],
                        })
                    })
                    .collect(),
            },
        )];
        if c.levels.len() > 1 {
            charts.push((
                "dedup-overcommit.svg".into(),
                crate::svg::Chart {
                    title: "throughput under overcommitment".into(),
                    x_label: "overcommitment (memory of the processes / limit)".into(),
                    y_label: "operations per second (millions)".into(),
                    log_x: false,
                    log_y: false,
                    series: present
                        .iter()
                        .map(|&sc| crate::svg::Series {
                            label: sc.into(),
                            points: c
                                .levels
                                .iter()
                                .filter_map(|&l| Some((l, self.summary_of(sc, l)?.ops_per_s / 1e6)))
                                .collect(),
                        })
                        .collect(),
                },
            ));
        }
        charts.push((
            "dedup-saved.svg".into(),
            crate::svg::Chart {
                title: format!("memory saved over time (overcommitment {first})"),
                x_label: "time (s)".into(),
                y_label: "memory saved (MiB)".into(),
                log_x: false,
                log_y: false,
                series: over_time(|s| s.saved_mib),
            },
        ));
        charts.push((
            "dedup-throughput.svg".into(),
            crate::svg::Chart {
                title: format!("throughput over time (overcommitment {first})"),
                x_label: "time (s)".into(),
                y_label: "operations per second (millions)".into(),
                log_x: false,
                log_y: false,
                series: over_time(|s| s.ops_per_s / 1e6),
            },
        ));
        charts
    }
}
