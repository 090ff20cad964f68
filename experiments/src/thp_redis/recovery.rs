//! How much of the bloat measured before P3 an agent gave back, and how
//! fast, from its decisions.

use super::*;

/// The recovery figures of `row` from the agent's decisions: from the
/// first sample above the pressure threshold, what counts is what was
/// given back of the bloat measured before P3 (each region's recovered
/// pages up to its bloat then), not the zero pages of huge pages P3 made
/// since.
pub(super) fn account(row: &mut Row, log: &[(f64, Action)], cfg: &Config, way: &str) {
    let page_mib = pagewise::PAGE_SIZE as f64 / (1u64 << 20) as f64;
    let mut left = row.bloat_regions.clone();
    let mut recovered: Vec<(f64, f64)> = Vec::new();
    let mut all = 0u64;
    for (t, a) in log {
        if let Action::Recovered {
            start, zero_pages, ..
        } = a
        {
            all += zero_pages;
            let old = left.get_mut(start).map_or(0, |b| {
                let n = (*b).min(*zero_pages);
                *b -= n;
                n
            });
            recovered.push((*t, old as f64 * page_mib));
        }
    }
    row.recovered_mib = all as f64 * page_mib;
    row.recovered_of_bloat_mib = recovered.iter().map(|r| r.1).fold(0.0, |a, b| a + b);
    row.max_stop_ms = log
        .iter()
        .filter_map(|(_, a)| match a {
            Action::Recovered { stopped_ms, .. } => Some(*stopped_ms),
            _ => None,
        })
        .fold(0.0, f64::max);
    row.promoted = log
        .iter()
        .filter(|(_, a)| matches!(a, Action::Promoted { .. }))
        .count() as u64;
    let tight = cfg.limit_mib as f64 * cfg.pressure_pct / 100.0;
    let onset = row
        .timeline
        .iter()
        .find(|s| s.cgroup_mib > tight)
        .map(|s| s.t_s);
    if let (Some(t), true, true) = (onset, way == "pagewise", row.bloat_before_p3_mib > 0.0) {
        let mut sum = 0.0;
        for (ta, m) in &recovered {
            sum += m;
            if row.t90_s.is_none() && sum >= 0.9 * row.bloat_before_p3_mib {
                row.t90_s = Some((ta - t).max(0.0));
            }
        }
        let in10: f64 = recovered
            .iter()
            .filter(|r| r.0 <= t + 10.0)
            .map(|r| r.1)
            .sum();
        row.recovered_in_10s = Some((in10 / row.bloat_before_p3_mib).min(1.0));
    }
}
