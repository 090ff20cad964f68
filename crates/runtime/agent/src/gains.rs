//! What an agent's run gained: the watched processes' memory, huge pages
//! and KSM figures when each was first watched, under the settings the
//! machine had before the agent, and again at the end, with the agent's.
//!
//! A [`Ledger`] takes each process's figures the first time it is
//! [`watch`](Ledger::watch)ed and reads the settings named to it when it
//! is made, before the agent changes any; [`Ledger::refresh`] reads them
//! again after each step, and [`Ledger::gains`] once more at the end. A
//! process that ended before the agent did counts with its last reading.
//! The difference is the agent's where the program's own memory did not
//! change in between: a program that was still growing when it was first
//! watched (a command the agent started) gains its own growth too, which
//! the answer cannot tell apart.

use pagewise_mech::procfs;
use serde::Serialize;
use std::collections::BTreeMap;

/// The settings of transparent huge pages a THP agent is measured against.
pub const THP_SETTINGS: [&str; 4] = [
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/kernel/mm/transparent_hugepage/shrink_underused",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_none",
];

/// The KSM settings a dedup agent is measured against.
pub const KSM_SETTINGS: [&str; 4] = [
    "/sys/kernel/mm/ksm/run",
    "/sys/kernel/mm/ksm/pages_to_scan",
    "/sys/kernel/mm/ksm/advisor_mode",
    "/sys/kernel/mm/ksm/smart_scan",
];

/// What some processes hold, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Holdings {
    /// Processes counted.
    pub processes: u64,
    /// Resident memory, KiB (`Rss` of `smaps_rollup`).
    pub rss_kib: u64,
    /// Of it, in 2 MiB pages, KiB (`AnonHugePages`).
    pub anon_huge_kib: u64,
    /// Pages merged by KSM (`ksm_merging_pages` of `/proc/PID/ksm_stat`);
    /// `None` where the kernel has no `ksm_stat`.
    pub ksm_merging_pages: Option<u64>,
    /// What KSM saves them less its own cost, bytes (the kernel's
    /// `ksm_process_profit`); `None` where the kernel has no `ksm_stat`.
    pub ksm_profit_bytes: Option<i64>,
}

impl Holdings {
    /// One process's figures; `None` when it is gone.
    pub fn of(pid: i32) -> Option<Holdings> {
        let r = procfs::resident(pid).ok()?;
        let k = procfs::ksm_stat(pid);
        Some(Holdings {
            processes: 1,
            rss_kib: r.rss_kib,
            anon_huge_kib: r.anon_huge_kib,
            ksm_merging_pages: k.map(|k| k.merging_pages),
            ksm_profit_bytes: k.map(|k| k.process_profit),
        })
    }

    /// The sum of two (a KSM figure only where both have it).
    fn plus(self, o: Holdings) -> Holdings {
        Holdings {
            processes: self.processes.saturating_add(o.processes),
            rss_kib: self.rss_kib.saturating_add(o.rss_kib),
            anon_huge_kib: self.anon_huge_kib.saturating_add(o.anon_huge_kib),
            ksm_merging_pages: self
                .ksm_merging_pages
                .zip(o.ksm_merging_pages)
                .map(|(a, b)| a.saturating_add(b)),
            ksm_profit_bytes: self
                .ksm_profit_bytes
                .zip(o.ksm_profit_bytes)
                .map(|(a, b)| a.saturating_add(b)),
        }
    }

    fn sum(all: impl IntoIterator<Item = Holdings>) -> Holdings {
        let mut it = all.into_iter();
        match it.next() {
            Some(first) => it.fold(first, Holdings::plus),
            None => Holdings::default(),
        }
    }
}

/// A setting as the machine had it before the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Before {
    /// The file.
    pub file: String,
    /// Its value in force (`madvise` of `always [madvise] never`); `None`
    /// where this kernel has no such file.
    pub value: Option<String>,
}

/// The processes' figures when first watched and at the end, and the
/// settings the first ones were taken under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Gains {
    /// The settings as the machine had them before the agent.
    pub before: Vec<Before>,
    /// The processes, as each was when first watched.
    pub start: Holdings,
    /// The same processes at the end (one that ended before: at its last
    /// reading, after the agent's last step it lived through).
    pub end: Holdings,
    /// Of them, processes that ended before the agent did.
    pub ended: u64,
}

impl Gains {
    /// Resident memory the processes gained (negative: gave back), KiB.
    pub fn rss_kib(&self) -> i64 {
        diff(self.end.rss_kib, self.start.rss_kib)
    }

    /// Memory in 2 MiB pages gained, KiB.
    pub fn anon_huge_kib(&self) -> i64 {
        diff(self.end.anon_huge_kib, self.start.anon_huge_kib)
    }

    /// One line for a person: the settings before, then each figure from
    /// start to end.
    pub fn text(&self) -> String {
        let before: Vec<String> = self
            .before
            .iter()
            .filter_map(|b| {
                let name = b.file.rsplit('/').next().unwrap_or(&b.file);
                Some(format!("{name}={}", b.value.as_ref()?))
            })
            .collect();
        let mib = |kib: u64| kib as f64 / 1024.0;
        let mut s = format!(
            "against the machine's settings before ({}), {} process(es) from when first watched to the end: resident {:.1} → {:.1} MiB ({:+.1}), in 2 MiB pages {:.1} → {:.1} MiB ({:+.1})",
            before.join(" "),
            self.end.processes,
            mib(self.start.rss_kib),
            mib(self.end.rss_kib),
            self.rss_kib() as f64 / 1024.0,
            mib(self.start.anon_huge_kib),
            mib(self.end.anon_huge_kib),
            self.anon_huge_kib() as f64 / 1024.0,
        );
        if let (Some(a), Some(b)) = (self.start.ksm_merging_pages, self.end.ksm_merging_pages) {
            s += &format!(", KSM-merged pages {a} → {b}");
        }
        if let (Some(a), Some(b)) = (self.start.ksm_profit_bytes, self.end.ksm_profit_bytes) {
            s += &format!(
                ", the kernel's KSM profit {:.1} → {:.1} MiB",
                a as f64 / 1048576.0,
                b as f64 / 1048576.0
            );
        }
        if self.ended > 0 {
            s += &format!(
                "; {} of them ended before the agent did, counted as last read",
                self.ended
            );
        }
        s
    }
}

fn diff(a: u64, b: u64) -> i64 {
    i64::try_from(a)
        .unwrap_or(i64::MAX)
        .saturating_sub(i64::try_from(b).unwrap_or(i64::MAX))
}

/// Each watched process's figures when first watched, and the settings
/// before the agent.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    before: Vec<Before>,
    /// Per process: its first reading and its last.
    seen: BTreeMap<i32, (Holdings, Holdings)>,
}

impl Ledger {
    /// Reads `settings` now: make it before the agent changes any.
    pub fn new(settings: &[&str]) -> Ledger {
        Ledger {
            before: settings
                .iter()
                .map(|f| Before {
                    file: f.to_string(),
                    value: pagewise_mech::settings::current(f).ok(),
                })
                .collect(),
            seen: BTreeMap::new(),
        }
    }

    /// Takes `pid`'s figures if it was not watched before (a process
    /// already gone is left out).
    pub fn watch(&mut self, pid: i32) {
        if self.seen.contains_key(&pid) {
            return;
        }
        if let Some(h) = Holdings::of(pid) {
            self.seen.insert(pid, (h, h));
        }
    }

    /// Reads every process again (after a step): the last reading of one
    /// that ends before the agent does.
    pub fn refresh(&mut self) {
        for (&pid, (_, last)) in self.seen.iter_mut() {
            if let Some(now) = Holdings::of(pid) {
                *last = now;
            }
        }
    }

    /// Every process's figures now (or at its last reading, when it
    /// ended), against its first ones.
    pub fn gains(&self) -> Gains {
        let mut pairs = Vec::new();
        let mut ended = 0;
        for (&pid, &(first, last)) in &self.seen {
            match Holdings::of(pid) {
                Some(now) => pairs.push((first, now)),
                None => {
                    ended += 1;
                    pairs.push((first, last));
                }
            }
        }
        Gains {
            before: self.before.clone(),
            start: Holdings::sum(pairs.iter().map(|p| p.0)),
            end: Holdings::sum(pairs.iter().map(|p| p.1)),
            ended,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_keep_ksm_figures_only_where_every_process_has_them() {
        let a = Holdings {
            processes: 1,
            rss_kib: 10,
            anon_huge_kib: 2048,
            ksm_merging_pages: Some(3),
            ksm_profit_bytes: Some(-5),
        };
        let b = Holdings {
            ksm_merging_pages: None,
            ksm_profit_bytes: None,
            ..a
        };
        assert_eq!(a.plus(a).ksm_merging_pages, Some(6));
        assert_eq!(a.plus(a).ksm_profit_bytes, Some(-10));
        assert_eq!(a.plus(b).ksm_merging_pages, None);
        assert_eq!(a.plus(b).rss_kib, 20);
        assert_eq!(Holdings::sum([]), Holdings::default());
    }
}
