//! The node agent's own metrics: that it is up, its steps and CPU time,
//! what it watches, and per process what KSM saves it (the kernel's
//! `ksm_stat`) and the huge pages it holds (both read every
//! [`SAMPLE_EVERY`] steps); per container the huge pages given under its
//! budget. Every gauge of memory is in bytes.

use super::select::{group_of, SelectedProcess};
use pagewise_mech::agent::{container_labels, process_labels, Metric};
use pagewise_mech::container::ContainerRef;
use pagewise_mech::procfs;
use std::time::Instant;

/// Steps between two reads of each process's `ksm_stat` and
/// `smaps_rollup` (the latter walks all its page tables): a scrape every
/// 30 s or so needs no fresher figures.
const SAMPLE_EVERY: u64 = 5;

/// A huge page's size, bytes (a budget is counted in them).
const HUGE: u64 = pagewise_mech::HUGE_PAGE_SIZE as u64;

/// A process's KSM figures (merging pages, profit) and its memory
/// mapped by huge pages, bytes.
type Figures = (Option<(u64, i64)>, Option<u64>);

/// Each watched process's [`Figures`], as last read, and the step they
/// were read at.
#[derive(Debug, Default)]
pub(super) struct FiguresCache {
    at: u64,
    per: std::collections::HashMap<i32, Figures>,
}

impl FiguresCache {
    /// Process `pid`'s figures: read again every [`SAMPLE_EVERY`] steps
    /// (and for a process not read yet).
    fn figures_of(&mut self, pid: i32, steps: u64) -> Figures {
        if steps >= self.at + SAMPLE_EVERY {
            self.at = steps;
            self.per.clear();
        }
        *self.per.entry(pid).or_insert_with(|| {
            (
                procfs::ksm_stat(pid).map(|s| (s.merging_pages, s.process_profit)),
                procfs::resident(pid).ok().map(|r| r.anon_huge_kib * 1024),
            )
        })
    }
}

/// The containers the processes are in, each once.
pub(super) fn containers(known: &[SelectedProcess]) -> Vec<&ContainerRef> {
    let mut out: Vec<&ContainerRef> = Vec::new();
    for c in known.iter().filter_map(|k| k.member.container.as_ref()) {
        if !out.iter().any(|o| o.id == c.id) {
            out.push(c);
        }
    }
    out
}

/// The node's metrics after `steps` steps of an agent started at `t0`:
/// `groups` are the huge-page groups (name, given, budget).
pub(super) fn node_metrics(
    known: &[SelectedProcess],
    (steps, t0): (u64, Instant),
    groups: &[(String, u64, u64)],
    sampled: &mut FiguresCache,
) -> Vec<Metric> {
    let cpu = procfs::cpu_time(std::process::id() as i32)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut m = vec![
        Metric::gauge("up", "The node agent is running.", 1.0),
        Metric::counter("steps_total", "Steps of both agents taken.", steps as f64),
        Metric::counter(
            "cpu_seconds_total",
            "CPU time of the node agent's process (user and system).",
            cpu,
        ),
        Metric::gauge(
            "uptime_seconds",
            "Time since the agent started.",
            t0.elapsed().as_secs_f64(),
        ),
        Metric::gauge(
            "processes",
            "Processes watched and still there.",
            known.len() as f64,
        ),
        Metric::gauge(
            "containers",
            "Containers those processes are in.",
            containers(known).len() as f64,
        ),
    ];
    let page = pagewise_sys::mem::page_size() as u64;
    for k in known {
        let mm = &k.member;
        let labels = || process_labels(mm.pid, mm.ns_pid, mm.container.as_ref());
        let (ksm, huge) = sampled.figures_of(mm.pid, steps);
        if let Some((merging, profit)) = ksm {
            m.push(Metric::labelled(
                "ksm_merging_bytes",
                "Memory of the process merged by KSM (ksm_stat's ksm_merging_pages), bytes.",
                labels(),
                (merging * page) as f64,
            ));
            m.push(Metric::labelled(
                "ksm_profit_bytes",
                "What KSM saves the process less its own cost (ksm_stat's ksm_process_profit), bytes.",
                labels(),
                profit as f64,
            ));
        }
        if let Some(h) = huge {
            m.push(Metric::labelled(
                "anon_huge_bytes",
                "Anonymous memory of the process mapped by 2 MiB pages (smaps_rollup's AnonHugePages), bytes.",
                labels(),
                h as f64,
            ));
        }
    }
    for c in containers(known) {
        let name = group_of(c);
        if let Some((_, given, budget)) = groups.iter().find(|(g, _, _)| *g == name) {
            let labels = container_labels(c);
            m.push(Metric::labelled(
                "container_huge_given_bytes",
                "Memory the agent gave the container's processes as 2 MiB pages, bytes.",
                labels.clone(),
                (*given * HUGE) as f64,
            ));
            m.push(Metric::labelled(
                "container_huge_budget_bytes",
                "Memory the container's processes may be given as 2 MiB pages in all, bytes.",
                labels,
                (*budget * HUGE) as f64,
            ));
        }
    }
    m
}
