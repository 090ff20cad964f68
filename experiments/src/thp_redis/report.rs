//! The report of `bench thp-redis`: per way, the memory, bloat and
//! recovery figures with their summary and plots (HawkEye's Figure 2 and
//! Table 3).

use super::*;

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("-".into(), f)
}

impl Row {
    /// P3 inserted every key and Redis lived through the checks after it.
    fn survived(&self) -> bool {
        self.p3_completed && self.died_after_p3.is_none()
    }
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
        s += "policy           run  P3              peak MiB  after P2  bloat MiB  recovered  in 10 s  t90 s  P1 SET/s  P3 SET/s  GET/s    huge  lost\n";
        for r in &self.rows {
            s += &format!(
                "{:<16} {:>3}  {:<15} {:>8.0}  {:>8.0}  {:>9.0}  {:>9}  {:>7}  {:>5}  {:>8.0}  {:>8.0}  {:>7}  {:>4.0}%  {}\n",
                r.way,
                r.repeat + 1,
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
        s += &self.medians();
        s += "\nkernel counters over each run (/proc/vmstat differences):\n";
        for r in &self.rows {
            let v: Vec<String> = r.vmstat.iter().map(|(k, n)| format!("{k} {n}")).collect();
            s += &format!("  {:<16} {:>3}  {}\n", r.way, r.repeat + 1, v.join(", "));
        }
        for r in self
            .rows
            .iter()
            .filter(|r| r.way == "ingens" || r.way == "pagewise")
        {
            s += &format!(
                "\n{} run {}: agent CPU {:.2} s, {} huge pages promoted, longest stop for recovery {:.1} ms",
                r.way,
                r.repeat + 1,
                r.agent_cpu_s,
                r.promoted,
                r.max_stop_ms
            );
        }
        s += "\n";
        s += &self.goal();
        for why in &self.skipped {
            s += &format!("not run: {why}\n");
        }
        s
    }

    /// Median (min, max) of `f` over the runs of `way` where it is there.
    pub fn stat(&self, way: &str, f: impl Fn(&Row) -> Option<f64>) -> Option<(f64, f64, f64)> {
        let v: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.way == way)
            .filter_map(f)
            .collect();
        (!v.is_empty()).then(|| crate::median_min_max(v))
    }

    /// Per way, medians (min–max) over its runs.
    fn medians(&self) -> String {
        let runs = self.config.repeats.max(1);
        let mut s = format!(
            "\nmedian (min–max) over {runs} run(s) per way; P3: runs it completed in; GET/s of the runs that completed\n"
        );
        let f0 = |v: f64| format!("{v:.0}");
        let pct = |v: f64| format!("{:.0}%", v * 100.0);
        let show = |x: Option<(f64, f64, f64)>, f: &dyn Fn(f64) -> String| {
            x.map_or("-".to_string(), |(m, lo, hi)| {
                format!("{} ({}–{})", f(m), f(lo), f(hi))
            })
        };
        for w in crate::in_order(self.rows.iter().map(|r| r.way.as_str())) {
            let of: Vec<&Row> = self.rows.iter().filter(|r| r.way == w).collect();
            let done = of.iter().filter(|r| r.survived()).count();
            s += &format!(
                "  {w:<16} P3 {done}/{}; peak {} MiB; bloat {} MiB; in 10 s {}; t90 {} s; P1 {} SET/s; P3 {} SET/s; {} GET/s\n",
                of.len(),
                show(self.stat(w, |r| Some(r.peak_mib)), &f0),
                show(self.stat(w, |r| Some(r.bloat_before_p3_mib)), &f0),
                show(self.stat(w, |r| r.recovered_in_10s), &pct),
                show(self.stat(w, |r| r.t90_s), &|v| format!("{v:.1}")),
                show(self.stat(w, |r| Some(r.p1_set_per_s)), &f0),
                show(self.stat(w, |r| Some(r.p3_set_per_s)), &f0),
                show(self.stat(w, |r| r.get_per_s), &f0),
            );
        }
        s
    }

    /// The bloat goal: in every run of pagewise, P3 completed with no OOM
    /// kill and 90 % of the bloat before P3 was given back within 10 s.
    fn goal(&self) -> String {
        let of: Vec<&Row> = self.rows.iter().filter(|r| r.way == "pagewise").collect();
        if of.is_empty() {
            return String::new();
        }
        let good = of
            .iter()
            .filter(|r| {
                r.survived() && r.oom_kills == 0 && r.recovered_in_10s.is_some_and(|v| v >= 0.9)
            })
            .count();
        format!(
            "\ngoal (90 % of the bloat given back within 10 s, no OOM kill): pagewise met it in {good} of {} runs: {}\n",
            of.len(),
            crate::met(good == of.len())
        )
    }

    /// The cgroup's charge over time, per policy (the first run of each).
    pub fn charts(&self) -> Vec<(String, Chart)> {
        let mut series: Vec<Series> = self
            .rows
            .iter()
            .filter(|r| r.repeat == 0)
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
