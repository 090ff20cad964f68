//! What the agent does to a process: regions made mergeable (journaled
//! first, so that a killed agent's advice is taken back by the next
//! pagewise command), unmerged and collapsed again, and unmerged at the end.

use super::{Action, Agent};
use pagewise_mech::procfs;
use pagewise_mech::{Region, HUGE_PAGE_SIZE};

impl Agent {
    /// Makes regions `starts` of target `i` mergeable.
    pub(super) fn merge(&mut self, i: usize, starts: &[u64], actions: &mut Vec<Action>) {
        if starts.is_empty() {
            return;
        }
        let t = &mut self.targets[i];
        let ranges: Vec<(u64, u64)> = starts.iter().map(|&s| (s, HUGE_PAGE_SIZE as u64)).collect();
        if let Err(e) = t.state.journal.given(&ranges) {
            self.counters.failed += 1;
            actions.push(Action::Failed {
                pid: t.pid,
                what: "journaling madvise(MADV_MERGEABLE)".into(),
                why: e.to_string(),
            });
            return;
        }
        match t
            .state
            .inside
            .madvise(t.pid, &ranges, libc::MADV_MERGEABLE, "dedup")
        {
            Ok(done) => {
                for (&s, &n) in starts.iter().zip(&done) {
                    if n == 0 {
                        continue;
                    }
                    if let Some(r) = t.state.regions.get_mut(&s) {
                        r.mergeable = true;
                        self.counters.merged += 1;
                        self.counters.split += u64::from(r.huge);
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
        let ranges: Vec<(u64, u64)> = starts.iter().map(|&s| (s, HUGE_PAGE_SIZE as u64)).collect();
        if let Err(e) = t
            .state
            .inside
            .madvise(t.pid, &ranges, libc::MADV_UNMERGEABLE, "dedup")
        {
            self.counters.failed += 1;
            actions.push(Action::Failed {
                pid: t.pid,
                what: "madvise(MADV_UNMERGEABLE)".into(),
                why: e.to_string(),
            });
            return;
        }
        let _ = t.state.journal.taken_back(&ranges);
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
        let mut actions = Vec::new();
        for t in self.targets.live_mut() {
            let starts: Vec<u64> = t
                .state
                .regions
                .iter()
                .filter(|r| r.1.mergeable)
                .map(|r| *r.0)
                .collect();
            if starts.is_empty() || !procfs::is_alive(t.pid) {
                continue;
            }
            let ranges: Vec<(u64, u64)> =
                starts.iter().map(|&s| (s, HUGE_PAGE_SIZE as u64)).collect();
            match t
                .state
                .inside
                .madvise(t.pid, &ranges, libc::MADV_UNMERGEABLE, "dedup")
            {
                Ok(_) => {
                    let _ = t.state.journal.taken_back(&ranges);
                    for s in &starts {
                        if let Some(r) = t.state.regions.get_mut(s) {
                            r.mergeable = false;
                        }
                    }
                    actions.push(Action::Unmerged {
                        pid: t.pid,
                        regions: starts.len() as u64,
                    })
                }
                Err(e) => actions.push(Action::Failed {
                    pid: t.pid,
                    what: "madvise(MADV_UNMERGEABLE) at the end".into(),
                    why: e.to_string(),
                }),
            }
        }
        actions
    }
}
