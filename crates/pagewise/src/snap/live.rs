//! Live checkpoints with pre-copy (LDT's first use; QEMU's migration loop):
//! the memory of a running process is copied while it runs, then, pass
//! after pass, the pages it wrote meanwhile (a `uffd-wp` tracker from
//! outside reports them), until what is left fits the downtime budget at
//! the copy rate measured so far; then the process is stopped, the rest is
//! copied, and it runs on. The copy is then saved as one ordinary snapshot.
//!
//! The passes copy into memory of this process (as much as the target's
//! writable memory): the store is written after the process runs again, so
//! the downtime is the last pass alone.
//!
//! When the process writes faster than pages can be copied, the passes do
//! not converge: the loop says so (the dirty rate against the copy rate),
//! and either stops at `max_passes` and takes the downtime it must, or,
//! with `throttle`, slows the process down (it is stopped for a growing
//! share of each pass, as QEMU's auto-converge does) until they converge.

use super::disk::{DiskStore, SaveStats};
use crate::stop::Stopped;
use crate::track::{BackendKind, DirtyTracker};
use crate::walk::read_remote;
use crate::{procfs, PageRange, Region, Result, PAGE_SIZE};
use serde::Serialize;
use std::time::{Duration, Instant};

/// How a live checkpoint proceeds.
#[derive(Debug, Clone, Serialize)]
pub struct LiveOptions {
    /// The longest the process may be stopped, ms.
    pub max_downtime_ms: f64,
    /// Passes before giving up on converging (then the process is stopped
    /// for whatever is left).
    pub max_passes: usize,
    /// Slow the process down when the passes do not converge.
    pub throttle: bool,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            max_downtime_ms: 50.0,
            max_passes: 30,
            throttle: false,
        }
    }
}

/// One pass of the copy.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    /// Pages copied in this pass.
    pub pages: u64,
    /// Its duration, ms.
    pub ms: f64,
    /// Share of the pass the process was held stopped (throttling), 0..1.
    pub throttle: f64,
}

/// What a live checkpoint did.
#[derive(Debug, Clone, Serialize)]
pub struct LiveReport {
    /// The snapshot saved.
    pub save: SaveStats,
    /// The passes while the process ran, in order.
    pub passes: Vec<Pass>,
    /// Pages copied while the process was stopped.
    pub final_pages: u64,
    /// How long the process was stopped at the end, ms (without the time
    /// of the caller's `at_stop`).
    pub downtime_ms: f64,
    /// From the first pass to the process running again, ms.
    pub copy_ms: f64,
    /// The whole checkpoint, including saving the store, ms.
    pub total_ms: f64,
    /// Bytes copied in all.
    pub bytes_copied: u64,
    /// The copy rate measured, bytes per second.
    pub copy_rate_bps: f64,
    /// The process's dirty rate over the last pass, bytes per second.
    pub dirty_rate_bps: f64,
    /// Whether the rest fitted the downtime budget before the passes ran out.
    pub converged: bool,
    /// From the stop to the destination holding the whole copy, ms: the
    /// downtime a migration would have, had the process resumed there
    /// (for a local store, about the downtime).
    pub handover_ms: f64,
}

/// The process's writable memory, copied, with what changed in it since
/// the destination was last told.
pub struct Copy {
    regions: Vec<(Region, Vec<u8>)>,
    changed: Vec<PageRange>,
}

/// Where a live checkpoint goes: told after each pass what changed in the
/// copy, and given the whole copy once the process runs again.
pub trait Destination {
    /// After a pass: the copy's regions now, and the ranges of it that
    /// changed (every page of a region new since the last call is in them).
    fn pass(&mut self, regions: &[(Region, Vec<u8>)], changed: &[PageRange]) -> Result<()>;
    /// After the last pass: returns once the destination holds the whole
    /// copy (a receiver across a network has it all), before it is saved.
    fn complete(&mut self) -> Result<()> {
        Ok(())
    }
    /// The end: the copy as it was at the stop (regions sorted by address);
    /// the snapshot saved.
    fn finish(&mut self, regions: &[(Region, Vec<u8>)], pid: i32, label: &str)
        -> Result<SaveStats>;
}

/// A local store: saved whole at the end.
impl Destination for DiskStore {
    fn pass(&mut self, _: &[(Region, Vec<u8>)], _: &[PageRange]) -> Result<()> {
        Ok(())
    }

    fn finish(
        &mut self,
        regions: &[(Region, Vec<u8>)],
        pid: i32,
        label: &str,
    ) -> Result<SaveStats> {
        self.save(regions, Some(pid), label)
    }
}

impl Copy {
    /// Brings the copy's regions in line with the process's mappings: new or
    /// reshaped ones are read whole (returns the pages read).
    fn follow(&mut self, pid: i32) -> Result<u64> {
        let now: Vec<Region> = procfs::writable(Some(pid))?
            .iter()
            .filter_map(|m| Region::new(m.start, m.len()).ok())
            .collect();
        let mut old = std::mem::take(&mut self.regions);
        let mut read = 0;
        for r in now {
            if let Some(i) = old.iter().position(|(o, _)| *o == r) {
                self.regions.push(old.swap_remove(i));
                continue;
            }
            let mut buf = vec![0u8; r.len as usize];
            read_remote(pid, r.start, &mut buf)?;
            read += r.pages();
            self.changed.push(PageRange {
                start: r.start,
                pages: r.pages(),
            });
            self.regions.push((r, buf));
        }
        Ok(read)
    }

    /// Re-reads the pages of `dirty` that the copy holds (returns how many).
    fn update(&mut self, pid: i32, dirty: &[PageRange]) -> Result<u64> {
        let mut n = 0;
        for d in dirty {
            for (r, buf) in &mut self.regions {
                let (a, b) = (d.start.max(r.start), (d.start + d.len()).min(r.end()));
                if a >= b {
                    continue;
                }
                let off = (a - r.start) as usize;
                read_remote(pid, a, &mut buf[off..off + (b - a) as usize])?;
                n += (b - a) / PAGE_SIZE as u64;
                self.changed.push(PageRange {
                    start: a,
                    pages: (b - a) / PAGE_SIZE as u64,
                });
            }
        }
        Ok(n)
    }

    /// Pages the copy holds that a tracker does not watch (file-backed
    /// writable mappings): re-read at the end.
    fn untracked(&self, tracked: &[Region]) -> Vec<PageRange> {
        self.regions
            .iter()
            .filter(|(r, _)| {
                !tracked
                    .iter()
                    .any(|t| t.start <= r.start && r.end() <= t.end())
            })
            .map(|(r, _)| PageRange {
                start: r.start,
                pages: r.pages(),
            })
            .collect()
    }
}

/// Takes a live checkpoint of process `pid` into `disk` (see the module).
/// `progress` hears of each pass; `at_stop` runs while the process is
/// stopped, after the last pass (to save other state of the process at the
/// same instant; the tests read its memory there).
pub fn live_snapshot(
    pid: i32,
    disk: &mut dyn Destination,
    label: &str,
    opts: &LiveOptions,
    progress: &mut dyn FnMut(&Pass),
    at_stop: &mut dyn FnMut(),
) -> Result<LiveReport> {
    let t0 = Instant::now();
    procfs::check_target(pid)?;
    let mut tracker = DirtyTracker::for_process(pid, BackendKind::UffdWp)?;
    let mut copy = Copy {
        regions: Vec::new(),
        changed: Vec::new(),
    };
    let tell = |copy: &mut Copy, disk: &mut dyn Destination| -> Result<()> {
        let changed = std::mem::take(&mut copy.changed);
        disk.pass(&copy.regions, &changed)
    };
    let mut passes = Vec::new();
    let mut bytes = 0u64;
    let mut copy_secs = 0.0f64;
    let mut throttle = 0.0f64;
    // Pass 0: everything, while the process runs (the tracker is armed, so
    // what it writes meanwhile is in the next pass).
    let pass_start = Instant::now();
    let n = copy.follow(pid)?;
    tell(&mut copy, disk)?;
    let ms = pass_start.elapsed().as_secs_f64() * 1e3;
    bytes += n * PAGE_SIZE as u64;
    copy_secs += ms / 1e3;
    let p = Pass {
        pages: n,
        ms,
        throttle: 0.0,
    };
    progress(&p);
    passes.push(p);
    let mut dirty_rate;
    let converged = loop {
        let rate = bytes as f64 / copy_secs.max(1e-9);
        let pass_start = Instant::now();
        // Throttling: the process is held stopped for a share of the pass.
        if throttle > 0.0 {
            let hold =
                Duration::from_secs_f64((passes.last().map_or(0.0, |p| p.ms) / 1e3) * throttle);
            let _stopped = Stopped::new(pid)?;
            std::thread::sleep(hold.min(Duration::from_millis(500)));
        }
        tracker.sync_process_mappings(Some(pid), false)?;
        let dirty = tracker.collect()?;
        let pending = dirty.stats.pages_dirty * PAGE_SIZE as u64;
        let since = passes.last().map_or(1.0, |p| p.ms / 1e3).max(1e-3);
        dirty_rate = pending as f64 / since;
        // Fits the budget at the copy rate: stop and finish with what the
        // next collection finds (re-read now, before stopping).
        let fits = pending as f64 / rate * 1e3 <= opts.max_downtime_ms;
        let t = Instant::now();
        let n = copy.update(pid, &dirty.ranges)? + copy.follow(pid)?;
        tell(&mut copy, disk)?;
        let secs = t.elapsed().as_secs_f64();
        bytes += n * PAGE_SIZE as u64;
        copy_secs += secs;
        let p = Pass {
            pages: n,
            ms: pass_start.elapsed().as_secs_f64() * 1e3,
            throttle,
        };
        progress(&p);
        passes.push(p);
        if fits {
            break true;
        }
        if passes.len() >= opts.max_passes {
            break false;
        }
        // What was written during a pass did not fit the budget: with
        // throttling, hold the process for a larger share of the next one.
        if opts.throttle {
            throttle = (throttle + 0.2).min(0.9);
        }
    };
    // The last, small pass, with the process stopped.
    let down = Instant::now();
    let hook_ms;
    let final_pages = {
        let stopped = Stopped::new(pid)?;
        tracker.sync_process_mappings(Some(pid), false)?;
        let dirty = tracker.collect()?;
        let mut n = copy.update(pid, &dirty.ranges)?;
        n += copy.follow(pid)?;
        let untracked = copy.untracked(&tracker.regions());
        n += copy.update(pid, &untracked)?;
        let hook = Instant::now();
        at_stop();
        hook_ms = hook.elapsed().as_secs_f64() * 1e3;
        drop(stopped);
        n
    };
    // The hook's time is the caller's, not the checkpoint's.
    let downtime_ms = down.elapsed().as_secs_f64() * 1e3 - hook_ms;
    let copy_ms = t0.elapsed().as_secs_f64() * 1e3;
    bytes += final_pages * PAGE_SIZE as u64;
    drop(tracker);
    // The destination, after the process runs again: the last changes,
    // then the whole.
    let resumed = Instant::now();
    tell(&mut copy, disk)?;
    disk.complete()?;
    let handover_ms = downtime_ms + resumed.elapsed().as_secs_f64() * 1e3;
    let mut sorted = copy.regions;
    sorted.sort_by_key(|(r, _)| r.start);
    let save = disk.finish(&sorted, pid, label)?;
    Ok(LiveReport {
        save,
        passes,
        final_pages,
        downtime_ms,
        copy_ms,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
        bytes_copied: bytes,
        copy_rate_bps: bytes as f64 / copy_secs.max(1e-9),
        dirty_rate_bps: dirty_rate,
        converged,
        handover_ms,
    })
}
