//! What the agent does to a process: regions made mergeable (journaled
//! first, so that a killed agent's advice is taken back by the next
//! pagewise command), unmerged and collapsed again, and unmerged at the end.

use super::{Action, Agent, Process};
use pagewise_mech::agent::Watched;
use pagewise_mech::procfs;
use pagewise_mech::{Region, HUGE_PAGE_SIZE};

impl Agent {
    /// Makes regions `starts` of target `i` mergeable.
    pub(super) fn merge(&mut self, i: usize, starts: &[u64], actions: &mut Vec<Action>) {
        if starts.is_empty() {
            return;
        }
        let t = &mut self.targets[i];
        let (ranges, groups) = if t.state.whole {
            let (ranges, groups, left) = whole_mappings(t.pid, &t.state.regions, starts);
            // A region whose mapping is not all to be merged is kept, and
            // said as kept, not as merged.
            actions.retain(|a| {
                !matches!(a, Action::Merge { pid, start, .. } if *pid == t.pid && left.contains(start))
            });
            (ranges, groups)
        } else {
            let ranges: Vec<(u64, u64)> =
                starts.iter().map(|&s| (s, HUGE_PAGE_SIZE as u64)).collect();
            let groups = starts.iter().map(|&s| vec![s]).collect();
            (ranges, groups)
        };
        if ranges.is_empty() {
            return;
        }
        if let Err(e) = t.state.journal.record_advice(&ranges) {
            self.counters.failed += 1;
            actions.push(Action::Failed {
                pid: t.pid,
                what: "journaling madvise(MADV_MERGEABLE)".into(),
                why: e.to_string(),
            });
            return;
        }
        // Whole mappings are advised as the stopped process has them (one
        // grown since it was read would be split).
        let inside = &mut t.state.inside;
        let advised = if t.state.whole {
            inside.madvise_mappings(t.pid, &ranges, libc::MADV_MERGEABLE, "dedup")
        } else {
            inside.madvise(t.pid, &ranges, libc::MADV_MERGEABLE, "dedup")
        };
        match advised {
            Ok(done) => {
                for ((group, &range), &n) in groups.iter().zip(&ranges).zip(&done) {
                    if n == 0 {
                        continue;
                    }
                    if t.state.whole {
                        t.state.merged_whole.push(range);
                    }
                    for s in group {
                        if let Some(r) = t.state.regions.get_mut(s) {
                            r.mergeable = true;
                            self.counters.merged += 1;
                            self.counters.split += u64::from(r.huge);
                        }
                    }
                }
            }
            Err(e) => {
                self.counters.failed += 1;
                actions.push(Action::Failed {
                    pid: t.pid,
                    what: "madvise(MADV_MERGEABLE)".into(),
                    why: e.to_string(),
                })
            }
        }
    }

    /// Unmerges regions `starts` of target `i` and collapses them.
    pub(super) fn rebuild(&mut self, i: usize, starts: &[u64], actions: &mut Vec<Action>) {
        if starts.is_empty() {
            return;
        }
        let t = &mut self.targets[i];
        // A region of a mapping made mergeable whole is unmerged with its
        // whole mapping (unmerging the region alone would split it).
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for &s in starts {
            let r = t
                .state
                .whole_range_of(s)
                .unwrap_or((s, HUGE_PAGE_SIZE as u64));
            if !ranges.contains(&r) {
                ranges.push(r);
            }
        }
        if let Err(e) = t.state.unmerge(t.pid, &ranges) {
            self.counters.failed += 1;
            actions.push(Action::Failed {
                pid: t.pid,
                what: "madvise(MADV_UNMERGEABLE)".into(),
                why: e.to_string(),
            });
            return;
        }
        for &s in starts {
            // The kernel does not collapse a range holding a
            // write-protected page: the region leaves the write watch,
            // and is watched again (not yet measured) from the next step.
            if let Ok(w) = t.state.writes.as_mut() {
                w.release(Region {
                    start: s,
                    len: HUGE_PAGE_SIZE as u64,
                });
            }
            if let Some(st) = t.state.regions.get_mut(&s) {
                st.watched = false;
            }
            let r = t.collapse(s, HUGE_PAGE_SIZE);
            let Some(st) = t.state.regions.get_mut(&s) else {
                continue;
            };
            st.mergeable = false;
            st.huge = r.is_ok();
            self.counters.rebuilt += u64::from(r.is_ok());
            // A collapse the kernel refused is a request that failed (the
            // summary said "0 requests failed" after one was reported).
            self.counters.failed += u64::from(r.is_err());
            actions.push(Action::Rebuilt {
                pid: t.pid,
                start: s,
                freq: st.freq,
                huge: r.is_ok(),
                why: r
                    .err()
                    .map(|e| format!("process_madvise(MADV_COLLAPSE): {e}")),
            });
        }
    }

    /// Unmerges the regions the agent made mergeable in every process
    /// still there (their pages unshared), so that the processes are left
    /// as they were found (see [`Agent::end`](pagewise_mech::agent::Agent::end)).
    pub(super) fn unmerge_all(&mut self) -> Vec<Action> {
        self.targets.live_mut().filter_map(unmerge).collect()
    }

    /// Stops watching `pid`, its regions made mergeable unmerged first
    /// (what the agent does to every process at its end): for a process
    /// that is to be left alone from now on.
    pub fn release(&mut self, pid: i32) -> Vec<Action> {
        match self.targets.release(pid) {
            Some(mut t) if !t.gone => unmerge(&mut t).into_iter().collect(),
            _ => Vec::new(),
        }
    }

    /// Makes target `i` merge only whole mappings from now on (it was seen
    /// to move a mapping, `why`): the regions made mergeable one by one
    /// are unmerged, which makes their mappings whole again.
    pub(super) fn merge_whole_only(&mut self, i: usize, why: String, actions: &mut Vec<Action>) {
        let t = &mut self.targets[i];
        if t.state.whole {
            return;
        }
        t.state.whole = true;
        let ranges: Vec<(u64, u64)> = t
            .state
            .regions
            .iter()
            .filter(|r| r.1.mergeable)
            .map(|r| (*r.0, HUGE_PAGE_SIZE as u64))
            .collect();
        if !ranges.is_empty() {
            if let Err(e) = t.state.unmerge(t.pid, &ranges) {
                self.counters.failed += 1;
                actions.push(Action::Failed {
                    pid: t.pid,
                    what: "madvise(MADV_UNMERGEABLE) to make its mappings whole".into(),
                    why: e.to_string(),
                });
                return;
            }
        }
        actions.push(Action::WholeMappings {
            pid: t.pid,
            why,
            unmerged: ranges.len() as u64,
        });
    }
}

impl super::Process {
    /// The mapping made mergeable whole that region `s` is in, if any.
    fn whole_range_of(&self, s: u64) -> Option<(u64, u64)> {
        self.merged_whole
            .iter()
            .copied()
            .find(|&(a, n)| a <= s && s < a + n)
    }

    /// Unmerges `ranges` of process `pid` (`(start, length)`): the call,
    /// the journal, and every region in them no longer mergeable.
    fn unmerge(&mut self, pid: i32, ranges: &[(u64, u64)]) -> pagewise_mech::Result<()> {
        // A mapping made mergeable whole is unmerged as the stopped process
        // has it (one grown since would be split); a region made mergeable
        // alone, as it is.
        let (whole, alone): (Vec<_>, Vec<_>) = ranges
            .iter()
            .copied()
            .partition(|r| self.merged_whole.contains(r));
        let un = libc::MADV_UNMERGEABLE;
        if !whole.is_empty() {
            self.inside.madvise_mappings(pid, &whole, un, "dedup")?;
        }
        if !alone.is_empty() {
            self.inside.madvise(pid, &alone, un, "dedup")?;
        }
        let _ = self.journal.taken_back(ranges);
        self.merged_whole.retain(|r| !ranges.contains(r));
        for &(a, n) in ranges {
            for (_, r) in self.regions.range_mut(a..a + n) {
                r.mergeable = false;
            }
        }
        Ok(())
    }
}

/// The mappings to make mergeable whole (`(start, length)`), the regions
/// to merge in each, and the regions left out.
type Wholes = (Vec<(u64, u64)>, Vec<Vec<u64>>, Vec<u64>);

/// The mappings of process `pid` to make mergeable whole, for regions
/// `starts`: each mapping all of whose regions known (in `regions`) are
/// in `starts` or mergeable already, with the regions of `starts` in
/// each; and the regions of `starts` left out.
fn whole_mappings(
    pid: i32,
    regions: &std::collections::BTreeMap<u64, super::RegionState>,
    starts: &[u64],
) -> Wholes {
    let maps = procfs::maps(Some(pid)).unwrap_or_default();
    let (mut ranges, mut groups, mut left) = (Vec::new(), Vec::new(), Vec::new());
    let mut seen: Vec<(u64, u64)> = Vec::new();
    for &s in starts {
        let Some(m) = maps.iter().find(|m| m.start <= s && s < m.end) else {
            left.push(s);
            continue;
        };
        if seen.contains(&(m.start, m.end)) {
            continue;
        }
        seen.push((m.start, m.end));
        let mine: Vec<u64> = starts
            .iter()
            .copied()
            .filter(|&x| m.start <= x && x < m.end)
            .collect();
        let all = regions
            .range(m.start..m.end)
            .all(|(a, r)| r.mergeable || mine.contains(a));
        if all {
            ranges.push((m.start, m.end - m.start));
            groups.push(mine);
        } else {
            left.extend(mine);
        }
    }
    (ranges, groups, left)
}

/// Unmerges what the agent made mergeable in `t`, if anything and it is
/// alive: the action it took.
fn unmerge(t: &mut Watched<Process>) -> Option<Action> {
    let starts: Vec<u64> = t
        .state
        .regions
        .iter()
        .filter(|r| r.1.mergeable)
        .map(|r| *r.0)
        .collect();
    if starts.is_empty() || !procfs::is_alive(t.pid) {
        return None;
    }
    // A mapping made mergeable whole is unmerged whole.
    let mut ranges = t.state.merged_whole.clone();
    ranges.extend(
        starts
            .iter()
            .filter(|&&s| t.state.whole_range_of(s).is_none())
            .map(|&s| (s, HUGE_PAGE_SIZE as u64)),
    );
    Some(match t.state.unmerge(t.pid, &ranges) {
        Ok(()) => Action::Unmerged {
            pid: t.pid,
            regions: starts.len() as u64,
        },
        Err(e) => Action::Failed {
            pid: t.pid,
            what: "madvise(MADV_UNMERGEABLE) at the end".into(),
            why: e.to_string(),
        },
    })
}
