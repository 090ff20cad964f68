//! The report of `bench thp-redis`: per way, the memory, bloat and
//! recovery figures with their summary and plots (HawkEye's Figure 2 and
//! Table 3).

use super::*;

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("-".into(), f)
}

impl Report {
    /// The human summary.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "Redis bloat (HawkEye's P1 insert / P2 delete / P3 insert) on {}\n\
             P1 {} keys x {} B, P2 deletes {:.0} %, P3 {} keys x {} KiB; cgroup limit {} MiB, no swap;\n\
             khugepaged pages_to_scan {} every {} ms (default 4096 every 10000 ms)\n\n",
            self.machine,
            c.p1_keys,
            c.p1_bytes,
            c.delete_share * 100.0,
            c.p3_keys,
            c.p3_bytes >> 10,
            c.limit_mib,
            c.khugepaged_pages,
            c.khugepaged_sleep_ms,
        );
        s += "policy           P3              peak MiB  after P2  bloat MiB  recovered  in 10 s  t90 s  P1 SET/s  P3 SET/s  GET/s    huge  lost\n";
        for r in &self.rows {
            s += &format!(
                "{:<16} {:<15} {:>8.0}  {:>8.0}  {:>9.0}  {:>9}  {:>7}  {:>5}  {:>8.0}  {:>8.0}  {:>7}  {:>4.0}%  {}\n",
                r.way,
                if let Some(phase) = &r.died_after_p3 {
                    format!("died in {phase}")
                } else if r.p3_completed {
                    "completed".to_string()
                } else {
                    format!("OOM ({}/{})", r.p3_inserted, c.p3_keys)
                },
                r.peak_mib,
                r.after_p2_mib,
                r.bloat_before_p3_mib,
                if r.way == "pagewise" {
                    format!("{:.0}/{:.0}", r.recovered_of_bloat_mib, r.recovered_mib)
                } else {
                    "-".into()
                },
                opt(r.recovered_in_10s, |v| format!("{:.0}%", v * 100.0)),
                opt(r.t90_s, |v| format!("{v:.1}")),
                r.p1_set_per_s,
                r.p3_set_per_s,
                opt(r.get_per_s, |v| format!("{v:.0}")),
                r.huge_share_end * 100.0,
                if r.p3_completed { r.lost.to_string() } else { "-".into() },
            );
        }
        s += "\nrecovered: of the bloat before P3 / all zero pages given back (P3's new huge pages included); in 10 s: share of the bloat before P3 given back within 10 s of the cgroup first passing the pressure threshold; t90: time to 90 % of it\n";
        s += "\nkernel counters over each run (/proc/vmstat differences):\n";
        for r in &self.rows {
            let v: Vec<String> = r.vmstat.iter().map(|(k, n)| format!("{k} {n}")).collect();
            s += &format!("  {:<16} {}\n", r.way, v.join(", "));
        }
        for r in self
            .rows
            .iter()
            .filter(|r| r.way == "ingens" || r.way == "pagewise")
        {
            s += &format!(
                "\n{}: agent CPU {:.2} s, {} huge pages promoted, longest stop for recovery {:.1} ms",
                r.way, r.agent_cpu_s, r.promoted, r.max_stop_ms
            );
        }
        s += "\n";
        for why in &self.skipped {
            s += &format!("not run: {why}\n");
        }
        s
    }

    /// The cgroup's charge over time, per policy.
    pub fn charts(&self) -> Vec<(String, Chart)> {
        let mut series: Vec<Series> = self
            .rows
            .iter()
            .map(|r| Series {
                label: r.way.clone(),
                points: r.timeline.iter().map(|s| (s.t_s, s.cgroup_mib)).collect(),
            })
            .collect();
        let end = self
            .rows
            .iter()
            .filter_map(|r| r.timeline.last().map(|s| s.t_s))
            .fold(0.0, f64::max);
        series.push(Series {
            label: "limit".into(),
            points: vec![
                (0.0, self.config.limit_mib as f64),
                (end, self.config.limit_mib as f64),
            ],
        });
        vec![(
            "thp-redis.svg".into(),
            Chart {
                title: "Redis P1 insert / P2 delete / P3 insert: memory charged".into(),
                x_label: "time (s)".into(),
                y_label: "cgroup memory (MiB)".into(),
                log_x: false,
                log_y: false,
                series,
            },
        )]
    }
}
