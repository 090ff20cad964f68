//! What an instance, or one run in it, did: the figures `farmem ls`,
//! `farmem run --stats-json` and the bindings report.

use super::instance::{Instance, Member};
use super::{FaultPath, Stats};
use serde::Serialize;

/// What `ls` and `--stats-json` report for an instance (or a run in it).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Report {
    /// The instance's name.
    pub instance_id: String,
    /// The user who owns it.
    pub owner_uid: u32,
    /// One-way latency, ns.
    pub latency_ns: u64,
    /// Link bandwidth, bytes per second (0: unlimited).
    pub bandwidth_bps: u64,
    /// The local budget in pages (0: by share).
    pub local_npages: u64,
    /// The local budget as a share of the pages holding data, %.
    pub local_percent: u64,
    /// Its live members.
    pub pids: Vec<i32>,
    #[serde(flatten)]
    /// The members' counters summed.
    pub stats: Stats,
    /// Pages holding data.
    pub data_pages: u64,
    /// Each member's own figures.
    pub members: Vec<Member>,
}

impl Instance {
    /// What the instance holds (`tag`: only the members of one run, and
    /// what that run's departed members left).
    pub fn report(&self, tag: Option<u32>) -> Report {
        report(self, tag)
    }
}

fn report(inst: &Instance, tag: Option<u32>) -> Report {
    let s = inst.settings();
    let members: Vec<Member> = inst
        .members()
        .into_iter()
        .filter(|m| tag.is_none_or(|t| m.tag == t))
        .collect();
    // Members whose slots were reused left their counts with the instance.
    let retired = inst.retired(tag);
    let mut stats = Stats::sum(members.iter().map(|m| &m.stats).chain([&retired]));
    let path = if stats.inline_faults > 0 {
        FaultPath::Inline
    } else {
        FaultPath::Thread
    };
    (stats.floor_ns, stats.unseen_ns) = inst.calibration(path);
    stats.local_pages_now = members
        .iter()
        .filter(|m| m.live)
        .map(|m| m.stats.local_pages_now)
        .sum();
    Report {
        instance_id: inst.name().to_string(),
        owner_uid: inst.owner_uid(),
        latency_ns: s.latency_ns,
        bandwidth_bps: s.bandwidth_bps,
        local_npages: s.local_pages,
        local_percent: s.local_percent,
        pids: members.iter().filter(|m| m.live).map(|m| m.pid).collect(),
        // A finished run's figures are those its members left.
        data_pages: members
            .iter()
            .filter(|m| m.live || tag.is_some())
            .map(|m| m.data_pages)
            .sum(),
        stats,
        members,
    }
}
