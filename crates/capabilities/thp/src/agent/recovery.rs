//! Bloat recovery (see the module docs): the zero-filled base pages of huge
//! pages given back while memory is tight, by the process itself while it
//! is stopped, and khugepaged held to the same rule meanwhile.

use super::{Action, Agent, Seen, MAX_PTES_NONE};
use pagewise_mech::procfs;
use pagewise_mech::settings::SettingGuard;
use pagewise_mech::{Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::process;
use std::os::fd::AsRawFd;
use std::time::Instant;

impl Agent {
    /// When memory is tight for a process (or was, within the hold), gives
    /// back the zero-filled pages of its huge pages (`huge`: per target,
    /// its regions mapped by a huge page), holds khugepaged to the same
    /// rule, and leaves out of `per` the candidates a promotion would
    /// bring the given-back pages back with.
    pub(super) fn recover_bloat(
        &mut self,
        huge: &[(usize, Vec<Region>)],
        per: &mut [Seen],
        actions: &mut Vec<Action>,
    ) {
        let Some(rec) = self.opts.recovery.clone() else {
            return;
        };
        let mut tight_pids = Vec::new();
        for (i, regions) in huge {
            let pid = self.targets[*i].pid;
            let (tight, pressure) = match rec.when.holds(pid) {
                Ok(h) => h,
                Err(e) => {
                    actions.push(Action::NotRecovered {
                        pid,
                        why: format!("memory pressure unknown: {e}"),
                    });
                    continue;
                }
            };
            if !tight {
                continue;
            }
            tight_pids.push(pid);
            match recover(pid, regions, rec.zero_pages) {
                Ok((done, ms)) => {
                    for (start, n) in done {
                        self.counters.recovered_pages += n;
                        actions.push(Action::Recovered {
                            pid,
                            start,
                            zero_pages: n,
                            stopped_ms: ms,
                            pressure: pressure.clone(),
                        });
                    }
                }
                Err(e) => actions.push(Action::NotRecovered {
                    pid,
                    why: e.to_string(),
                }),
            }
        }
        if !tight_pids.is_empty() {
            self.last_tight = Some(Instant::now());
        }
        let held = self.last_tight.is_some_and(|t| t.elapsed() < rec.hold);
        if rec.tune_khugepaged {
            self.tune_khugepaged(!tight_pids.is_empty() || held, rec.zero_pages, actions);
        }
        // While memory is tight (or was, within the hold), a promotion
        // must not bring back what recovery gives back: a candidate needs
        // more than 512 - zero_pages resident pages.
        let least = 512 - rec.zero_pages.clamp(1, 512) + 1;
        for (i, cands, _) in per.iter_mut() {
            let pid = self.targets[*i].pid;
            if !held && !tight_pids.contains(&pid) {
                continue;
            }
            let before = cands.len();
            cands.retain(|c| c.1 >= least);
            if cands.len() < before {
                actions.push(Action::Skipped {
                    pid,
                    regions: (before - cands.len()) as u64,
                    why: format!("memory is tight: fewer than {least} of 512 pages resident"),
                });
            }
        }
    }

    /// Lowers `max_ptes_none` while memory is `tight` (or was, within the
    /// hold), puts it back when it is not.
    pub(super) fn tune_khugepaged(
        &mut self,
        tight: bool,
        zero_pages: u64,
        actions: &mut Vec<Action>,
    ) {
        let want = zero_pages.clamp(1, 512) - 1;
        match (&self.khugepaged, tight) {
            (None, true) => {
                let now: Option<u64> = procfs::read_trimmed(MAX_PTES_NONE)
                    .ok()
                    .and_then(|v| v.parse().ok());
                if now.is_some_and(|n| n > want) {
                    match SettingGuard::set(MAX_PTES_NONE, &want.to_string()) {
                        Ok(g) => {
                            actions.push(Action::Tuned {
                                knob: MAX_PTES_NONE.into(),
                                from: g.old().to_string(),
                                to: want.to_string(),
                            });
                            self.khugepaged = Some(g);
                        }
                        Err(e) => actions.push(Action::NotTuned {
                            knob: MAX_PTES_NONE.into(),
                            why: e.to_string(),
                        }),
                    }
                }
            }
            (Some(g), false) => {
                let to = g.old().to_string();
                self.khugepaged = None;
                actions.push(Action::PutBack {
                    knob: MAX_PTES_NONE.into(),
                    to,
                });
            }
            _ => {}
        }
    }
}

/// Zero-filled runs of pages in `buf` (at `start`): `(address, pages)`.
fn zero_runs(start: u64, buf: &[u8]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (k, p) in buf.chunks_exact(PAGE_SIZE).enumerate() {
        if p.iter().all(|&b| b == 0) {
            let a = start + (k * PAGE_SIZE) as u64;
            match runs.last_mut() {
                Some(r) if r.0 + r.1 * PAGE_SIZE as u64 == a => r.1 += 1,
                _ => runs.push((a, 1)),
            }
        }
    }
    runs
}

/// Gives back the zero-filled base pages of the huge `regions` of `pid`
/// that hold at least `threshold` of them (see the module): the regions
/// read first while it runs (to choose), then the pages found zero read
/// again while it is stopped, and only those still zero given back, by the
/// process itself, [`REGIONS_PER_STOP`] regions a stop. Returns the pages
/// given back per region and the longest time it was stopped.
pub(super) fn recover(
    pid: i32,
    regions: &[Region],
    threshold: u64,
) -> Result<(Vec<(u64, u64)>, f64)> {
    let mut buf = vec![0u8; HUGE_PAGE_SIZE];
    let mut chosen = Vec::new();
    for r in regions {
        pagewise_mech::remote::read(pid, r.start, &mut buf)?;
        let runs = zero_runs(r.start, &buf);
        if runs.iter().map(|z| z.1).sum::<u64>() >= threshold.max(1) {
            chosen.push((r.start, runs));
        }
    }
    if chosen.is_empty() {
        return Ok((Vec::new(), 0.0));
    }
    pagewise_mech::inject::check_target(pid, "bloat recovery", "the madvise call")?;
    // A few regions per stop: the process is never stopped for long.
    let mut done = Vec::new();
    let mut longest = 0.0f64;
    for part in chosen.chunks(REGIONS_PER_STOP) {
        let (d, ms) = give_back(pid, part)?;
        done.extend(d);
        longest = longest.max(ms);
    }
    Ok((done, longest))
}

/// Regions of one process given back in one stop.
pub(crate) const REGIONS_PER_STOP: usize = 32;

/// Stops `pid`, reads again the zero runs of `chosen` (region, runs found
/// zero while it ran), gives back those still zero, lets it run, and splits
/// the huge pages. The pages given back per region and the time stopped.
fn give_back(pid: i32, chosen: &[(u64, Vec<(u64, u64)>)]) -> Result<(Vec<(u64, u64)>, f64)> {
    // The buffer for the second read, written once before the stop, so
    // that taking its pages is not part of the time the process is stopped.
    let largest = chosen
        .iter()
        .map(|c| c.1.iter().map(|z| z.1).sum::<u64>())
        .max()
        .unwrap_or(0);
    let mut again = vec![1u8; largest as usize * PAGE_SIZE];
    let t = Instant::now();
    let stopped = pagewise_mech::stop::Stopped::new(pid)?;
    let remote = pagewise_mech::inject::Remote::new(&stopped)?;
    // Read again what was zero, now that nothing of the process runs: a
    // page written since the first read is not zero any more, and stays.
    let mut runs = Vec::new();
    let mut owner = Vec::new();
    for (i, (_, first)) in chosen.iter().enumerate() {
        {
            let mut parts = Vec::with_capacity(first.len());
            let mut rest = again.as_mut_slice();
            for &(a, n) in first {
                let (head, tail) = rest.split_at_mut(n as usize * PAGE_SIZE);
                parts.push((a, head));
                rest = tail;
            }
            pagewise_mech::remote::read_many(pid, &mut parts)?;
        }
        let mut off = 0;
        for &(a, n) in first {
            for (a, m) in zero_runs(a, &again[off..off + n as usize * PAGE_SIZE]) {
                runs.push((a, m * PAGE_SIZE as u64));
                owner.push(i);
            }
            off += n as usize * PAGE_SIZE;
        }
    }
    let given = remote.madvise_many(&runs, libc::MADV_DONTNEED)?;
    drop(stopped);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let mut done: Vec<(u64, u64)> = chosen.iter().map(|c| (c.0, 0)).collect();
    for (k, bytes) in given.iter().enumerate() {
        done[owner[k]].1 += bytes / PAGE_SIZE as u64;
    }
    // The pages given back leave their huge page mapped in part: the kernel
    // frees them (and uncharges them from the cgroup) only when it splits
    // the huge page, under memory reclaim. MADV_COLD on one page still
    // mapped splits it now; it only moves that page to the inactive list.
    let mut live = Vec::new();
    for (i, (start, _)) in chosen.iter().enumerate() {
        if done[i].1 == 0 {
            continue;
        }
        let mine: Vec<(u64, u64)> = (0..runs.len())
            .filter(|&k| owner[k] == i && given[k] > 0)
            .map(|k| runs[k])
            .collect();
        let page = (0..512u64)
            .map(|p| start + p * PAGE_SIZE as u64)
            .find(|&a| !mine.iter().any(|&(r, n)| a >= r && a < r + n));
        if let Some(a) = page {
            live.push((a, PAGE_SIZE));
        }
    }
    if !live.is_empty() {
        if let Ok(pidfd) = process::pidfd_open(pid) {
            for batch in live.chunks(1024) {
                // Best effort: a refusal leaves the pages to the kernel's
                // deferred split.
                let _ = process::process_madvise(pidfd.as_raw_fd(), batch, libc::MADV_COLD);
            }
        }
    }
    Ok((done, ms))
}
