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
//! A [`Checkpointer`] keeps its tracker and its copy from one checkpoint to
//! the next: after the first, a checkpoint starts from the pages written
//! since the last one (periodic checkpoints of a running service). It copies
//! from a [`Source`]: another process ([`ProcessSource`]: uffd-wp from
//! outside, `process_vm_readv`, stopped with ptrace) or regions of the
//! calling process ([`OwnRegions`]: uffd-wp inside, the caller pausing its
//! own writers, as a VMM pauses its vCPUs).
//!
//! When the process writes faster than pages can be copied, the passes do
//! not converge: the loop says so (the dirty rate against the copy rate),
//! and either stops at `max_passes` and takes the downtime it must, or,
//! with `throttle`, slows the process down (it is stopped for a growing
//! share of each pass, as QEMU's auto-converge does) until they converge.

use super::disk::{DiskSnapshot, DiskStore, SaveStats};
use crate::{Error, Result};
use pagewise_mech::procfs;
use pagewise_mech::stop::Stopped;
use pagewise_mech::{PageRange, Region, PAGE_SIZE};
use pagewise_track::{BackendKind, DirtyTracker};
use serde::Serialize;
use std::borrow::BorrowMut;
use std::time::{Duration, Instant};

/// How a live checkpoint proceeds.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct LiveOptions {
    /// The longest the process may be stopped, ms.
    pub max_downtime_ms: f64,
    /// Passes before giving up on converging (then the process is stopped
    /// for whatever is left).
    pub max_passes: usize,
    /// Slow the process down when the passes do not converge.
    pub throttle: bool,
}

setters!(LiveOptions {
    max_downtime_ms: f64,
    max_passes: usize,
    throttle: bool,
});

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
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Pass {
    /// Pages copied in this pass.
    pub pages: u64,
    /// Its duration, ms.
    pub ms: f64,
    /// Share of the pass the process was held stopped (throttling), 0..1.
    pub throttle: f64,
}

/// What a live checkpoint did.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
    /// The pages of the copy read from the source, sorted and coalesced:
    /// the rest are zeros (holes of its memory, never read or touched
    /// here: a buffer comes zeroed from the allocator).
    held: Vec<PageRange>,
}

/// Where a live checkpoint goes: told after each pass what changed in the
/// copy, and given the whole copy once the process runs again.
pub trait Destination {
    /// After a pass: the copy's regions now, and the ranges of it that
    /// changed. A page of a region new since the last call that is not in
    /// them holds zeros (a hole of the source's memory).
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

/// A local store for a series of checkpoints: each snapshot after the first
/// takes the pages that did not change over from the previous one, unread
/// and unhashed. `S` is the store or a borrow of it.
pub struct StoreSeries<S: BorrowMut<DiskStore>> {
    /// The store.
    pub store: S,
    prev: Option<DiskSnapshot>,
    changed: Vec<PageRange>,
}

impl<S: BorrowMut<DiskStore>> StoreSeries<S> {
    /// A series saved into `store`.
    pub fn new(store: S) -> Self {
        StoreSeries {
            store,
            prev: None,
            changed: Vec::new(),
        }
    }
}

impl<S: BorrowMut<DiskStore>> Destination for StoreSeries<S> {
    fn pass(&mut self, _: &[(Region, Vec<u8>)], changed: &[PageRange]) -> Result<()> {
        self.changed.extend_from_slice(changed);
        Ok(())
    }

    fn finish(
        &mut self,
        regions: &[(Region, Vec<u8>)],
        pid: i32,
        label: &str,
    ) -> Result<SaveStats> {
        pagewise_mech::region::normalize(&mut self.changed);
        let prev = self.prev.take();
        let store = self.store.borrow_mut();
        let s = store.save_changed(regions, pid_of(pid), label, prev.as_ref(), &self.changed)?;
        self.changed.clear();
        self.prev = Some(store.load(s.id)?);
        Ok(s)
    }
}

/// The pid a store records: none for the calling process (0).
fn pid_of(pid: i32) -> Option<i32> {
    (pid > 0).then_some(pid)
}

/// What a live checkpoint copies from.
pub trait Source {
    /// Its pid, or 0 for the calling process.
    fn pid(&self) -> i32;
    /// The regions to copy, now.
    fn regions(&mut self) -> Result<Vec<Region>>;
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<()>;
    /// Reads many ranges, each into its buffer.
    fn read_many(&mut self, parts: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (addr, buf) in parts.iter_mut() {
            self.read(*addr, buf)?;
        }
        Ok(())
    }
    /// The pages written since the last call (the first call: since the
    /// source was made); the tracking follows `regions`.
    fn dirty(&mut self) -> Result<Vec<PageRange>>;
    /// The regions the tracking watches (the rest is re-read at the stop).
    fn tracked(&self) -> Vec<Region>;
    /// Stops every writer; they run again when the guard is dropped.
    fn pause(&mut self) -> Result<Box<dyn std::any::Any>>;
    /// Replaces `out` with the runs of `r` (one of `regions`) that memory
    /// holds, ascending: the rest reads as zeros and is not read. By
    /// default all of it.
    fn held(&mut self, r: Region, out: &mut Vec<(u64, u64)>) -> Result<()> {
        out.clear();
        out.push((r.start, r.end()));
        Ok(())
    }
}

impl<T: Source + ?Sized> Source for Box<T> {
    fn pid(&self) -> i32 {
        (**self).pid()
    }
    fn regions(&mut self) -> Result<Vec<Region>> {
        (**self).regions()
    }
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read(addr, buf)
    }
    fn read_many(&mut self, parts: &mut [(u64, &mut [u8])]) -> Result<()> {
        (**self).read_many(parts)
    }
    fn dirty(&mut self) -> Result<Vec<PageRange>> {
        (**self).dirty()
    }
    fn tracked(&self) -> Vec<Region> {
        (**self).tracked()
    }
    fn pause(&mut self) -> Result<Box<dyn std::any::Any>> {
        (**self).pause()
    }
    fn held(&mut self, r: Region, out: &mut Vec<(u64, u64)>) -> Result<()> {
        (**self).held(r, out)
    }
}

/// Another process: its writable mappings, tracked with uffd-wp from
/// outside, read with `process_vm_readv`, stopped with ptrace.
pub struct ProcessSource {
    pid: i32,
    tracker: DirtyTracker,
    walker: pagewise_mech::walk::PageWalker,
}

impl ProcessSource {
    /// Starts tracking `pid` (refused where uffd-wp from outside cannot be
    /// had, with the reason).
    pub fn new(pid: i32) -> Result<Self> {
        procfs::check_target(pid)?;
        super::remote::may_register(pid)?;
        // Holes left unmarked (a sparse mapping costs what it holds): a
        // page given back is found at the stop, walking what memory holds.
        Ok(ProcessSource {
            pid,
            tracker: DirtyTracker::for_process_sparse(pid)?,
            walker: pagewise_mech::walk::PageWalker::new(Some(pid))?,
        })
    }
}

impl Source for ProcessSource {
    fn pid(&self) -> i32 {
        self.pid
    }
    fn regions(&mut self) -> Result<Vec<Region>> {
        Ok(procfs::writable(Some(self.pid))?
            .iter()
            .filter_map(|m| Region::new(m.start, m.len()).ok())
            .collect())
    }
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<()> {
        pagewise_mech::remote::read(self.pid, addr, buf)?;
        Ok(())
    }
    fn read_many(&mut self, parts: &mut [(u64, &mut [u8])]) -> Result<()> {
        Ok(pagewise_mech::remote::read_many(self.pid, parts)?)
    }
    fn dirty(&mut self) -> Result<Vec<PageRange>> {
        self.tracker.sync_process_mappings(Some(self.pid), false)?;
        Ok(self.tracker.collect()?.ranges)
    }
    fn tracked(&self) -> Vec<Region> {
        self.tracker.regions()
    }
    fn pause(&mut self) -> Result<Box<dyn std::any::Any>> {
        Ok(Box::new(Stopped::new(self.pid)?))
    }
    /// What memory holds of a tracked (anonymous) region; a file's
    /// mapping whole (a page not populated holds the file's contents).
    fn held(&mut self, r: Region, out: &mut Vec<(u64, u64)>) -> Result<()> {
        let tracked = self.tracker.regions();
        if tracked
            .iter()
            .any(|t| t.start <= r.start && r.end() <= t.end())
        {
            self.walker.populated(r, out)?;
        } else {
            out.clear();
            out.push((r.start, r.end()));
        }
        Ok(())
    }
}

/// Regions of the calling process (a runtime's heap, a VMM's guest memory),
/// tracked with uffd-wp inside; `pause(true)` must stop every thread that
/// writes them and `pause(false)` let them run again.
pub struct OwnRegions {
    regions: Vec<Region>,
    tracker: DirtyTracker,
    pause: std::sync::Arc<std::sync::Mutex<dyn FnMut(bool) + Send>>,
}

impl OwnRegions {
    /// Starts tracking `regions` (mapped, private and writable for as long
    /// as this lives).
    pub fn new(regions: &[Region], pause: impl FnMut(bool) + Send + 'static) -> Result<Self> {
        procfs::check_mapped_writable(regions, "pre-copy", &super::SNAP_KINDS)?;
        Ok(OwnRegions {
            regions: regions.to_vec(),
            tracker: DirtyTracker::new(regions, BackendKind::UffdWp)?,
            pause: std::sync::Arc::new(std::sync::Mutex::new(pause)),
        })
    }
}

/// Resumes the caller's writers when dropped.
struct Resume(std::sync::Arc<std::sync::Mutex<dyn FnMut(bool) + Send>>);

impl Drop for Resume {
    fn drop(&mut self) {
        if let Ok(mut f) = self.0.lock() {
            f(false)
        }
    }
}

impl Source for OwnRegions {
    fn pid(&self) -> i32 {
        0
    }
    fn regions(&mut self) -> Result<Vec<Region>> {
        Ok(self.regions.clone())
    }
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<()> {
        if !self
            .regions
            .iter()
            .any(|r| r.start <= addr && addr + buf.len() as u64 <= r.end())
        {
            return Err(Error::Internal {
                what: "a read outside the regions",
            });
        }
        // SAFETY: the range lies inside one of the regions, which the caller
        // keeps mapped and readable while this lives (checked at creation);
        // the bytes are copied as plain data, racing writers only change
        // which version is copied (the tracker reports those pages again).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
    fn dirty(&mut self) -> Result<Vec<PageRange>> {
        Ok(self.tracker.collect()?.ranges)
    }
    fn tracked(&self) -> Vec<Region> {
        self.regions.clone()
    }
    fn pause(&mut self) -> Result<Box<dyn std::any::Any>> {
        (self.pause.lock().map_err(|_| Error::Internal {
            what: "the pause callback panicked",
        })?)(true);
        Ok(Box::new(Resume(self.pause.clone())))
    }
}

impl Copy {
    /// Brings the copy's regions in line with the source's: of new or
    /// reshaped ones, what the source holds is read (returns the pages
    /// read).
    fn follow(&mut self, src: &mut dyn Source) -> Result<u64> {
        let now = src.regions()?;
        let mut old = std::mem::take(&mut self.regions);
        let mut read = 0;
        let mut runs = Vec::new();
        let mut fresh = Vec::new();
        for r in now {
            if let Some(i) = old.iter().position(|(o, _)| *o == r) {
                self.regions.push(old.swap_remove(i));
                continue;
            }
            let mut buf = vec![0u8; r.len as usize];
            src.held(r, &mut runs)?;
            for &(a, b) in &runs {
                src.read(a, &mut buf[(a - r.start) as usize..(b - r.start) as usize])?;
                let part = PageRange {
                    start: a,
                    pages: (b - a) / PAGE_SIZE as u64,
                };
                read += part.pages;
                self.changed.push(part);
                fresh.push(part);
            }
            self.regions.push((r, buf));
        }
        if !old.is_empty() || !fresh.is_empty() {
            let mut kept: Vec<Region> = self.regions.iter().map(|(r, _)| *r).collect();
            kept.sort_by_key(|r| r.start);
            pagewise_mech::region::normalize(&mut fresh);
            self.held = pagewise_mech::region::clip_to(
                &pagewise_mech::region::union_sorted(&self.held, &fresh),
                &kept,
            );
        }
        Ok(read)
    }

    /// At the stop: the pages the copy holds that the source no longer
    /// does (given back since: `MADV_DONTNEED`, which a tracker of what
    /// memory holds does not report) are zeros now (returns how many).
    fn forget_given_back(&mut self, src: &mut dyn Source) -> Result<u64> {
        let mut runs = Vec::new();
        let mut gone = Vec::new();
        for (r, buf) in &mut self.regions {
            let before = pagewise_mech::region::clip_to(&self.held, &[*r]);
            if before.is_empty() {
                continue;
            }
            src.held(*r, &mut runs)?;
            let now: Vec<PageRange> = runs
                .iter()
                .map(|&(a, b)| PageRange {
                    start: a,
                    pages: (b - a) / PAGE_SIZE as u64,
                })
                .collect();
            for g in pagewise_mech::region::subtract_sorted(&before, &now) {
                let at = (g.start - r.start) as usize;
                buf[at..at + g.len() as usize].fill(0);
                self.changed.push(g);
                gone.push(g);
            }
        }
        if !gone.is_empty() {
            self.held = pagewise_mech::region::subtract_sorted(&self.held, &gone);
        }
        Ok(pagewise_mech::region::total_pages(&gone))
    }

    /// Re-reads the pages of `dirty` that the copy holds (returns how
    /// many), many ranges per read.
    fn update(&mut self, src: &mut dyn Source, dirty: &[PageRange]) -> Result<u64> {
        let mut sorted = dirty.to_vec();
        pagewise_mech::region::normalize(&mut sorted);
        let dirty = &sorted[..];
        let mut n = 0;
        let from = self.changed.len();
        for (r, buf) in &mut self.regions {
            let first = dirty.partition_point(|d| d.end() <= r.start);
            let mut parts: Vec<(u64, &mut [u8])> = Vec::new();
            let (mut rest, mut at) = (&mut buf[..], r.start);
            for d in &dirty[first..] {
                let (a, b) = (d.start.max(r.start), d.end().min(r.end()));
                if a >= r.end() {
                    break;
                }
                if a >= b {
                    continue;
                }
                let (_, tail) = std::mem::take(&mut rest).split_at_mut((a - at) as usize);
                let (part, tail) = tail.split_at_mut((b - a) as usize);
                parts.push((a, part));
                rest = tail;
                at = b;
                n += (b - a) / PAGE_SIZE as u64;
                self.changed.push(PageRange {
                    start: a,
                    pages: (b - a) / PAGE_SIZE as u64,
                });
            }
            src.read_many(&mut parts)?;
        }
        let mut read = self.changed[from..].to_vec();
        pagewise_mech::region::normalize(&mut read);
        self.held = pagewise_mech::region::union_sorted(&self.held, &read);
        Ok(n)
    }

    /// Pages the copy holds that the source does not track (file-backed
    /// writable mappings): re-read at the end.
    fn untracked(&self, tracked: &[Region]) -> Vec<PageRange> {
        let mut v = self
            .regions
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
            .collect::<Vec<_>>();
        pagewise_mech::region::normalize(&mut v);
        v
    }
}

/// Live checkpoints of one source, one after another, to one destination:
/// the first copies everything, each later one starts from the pages
/// written since the one before.
pub struct Checkpointer<S: Source> {
    src: S,
    copy: Copy,
    opts: LiveOptions,
    first: bool,
}

impl<S: Source> Checkpointer<S> {
    /// Checkpoints of `src` with `opts`.
    pub fn new(src: S, opts: LiveOptions) -> Self {
        Checkpointer {
            src,
            copy: Copy {
                regions: Vec::new(),
                changed: Vec::new(),
                held: Vec::new(),
            },
            opts,
            first: true,
        }
    }

    /// The next checkpoint copies everything again (for a new destination,
    /// which has none of the earlier ones).
    pub fn restart(&mut self) {
        self.copy.regions.clear();
        self.copy.changed.clear();
        self.copy.held.clear();
        self.first = true;
    }

    /// Takes the next checkpoint into `dest` (the destination of every
    /// earlier one). `progress` hears of each pass; `at_stop` runs while
    /// the writers are stopped, after the last pass (to save other state at
    /// the same instant; the tests read the memory there).
    pub fn checkpoint(
        &mut self,
        dest: &mut dyn Destination,
        label: &str,
        progress: &mut dyn FnMut(&Pass),
        at_stop: &mut dyn FnMut(),
    ) -> Result<LiveReport> {
        let t0 = Instant::now();
        let opts = self.opts.clone();
        let (src, copy) = (&mut self.src as &mut dyn Source, &mut self.copy);
        let tell = |copy: &mut Copy, dest: &mut dyn Destination| -> Result<()> {
            let changed = std::mem::take(&mut copy.changed);
            dest.pass(&copy.regions, &changed)
        };
        let mut passes = Vec::new();
        let mut bytes = 0u64;
        let mut copy_secs = 0.0f64;
        let mut throttle = 0.0f64;
        // Pass 0: everything the first time, while the writers run (the
        // tracker is armed, so what they write meanwhile is in the next
        // pass); later, what was written since the last checkpoint.
        let pass_start = Instant::now();
        let n = if self.first {
            copy.follow(src)?
        } else {
            let dirty = src.dirty()?;
            copy.update(src, &dirty)? + copy.follow(src)?
        };
        tell(copy, dest)?;
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
            // Throttling: the writers are held stopped for a share of the pass.
            if throttle > 0.0 {
                let hold = Duration::from_secs_f64(
                    (passes.last().map_or(0.0, |p: &Pass| p.ms) / 1e3) * throttle,
                );
                let _paused = src.pause()?;
                std::thread::sleep(hold.min(Duration::from_millis(500)));
            }
            let dirty = src.dirty()?;
            let pending = pagewise_mech::region::total_pages(&dirty) * PAGE_SIZE as u64;
            let since = passes.last().map_or(1.0, |p| p.ms / 1e3).max(1e-3);
            dirty_rate = pending as f64 / since;
            // Fits the budget at the copy rate: stop and finish with what the
            // next collection finds (re-read now, before stopping).
            let fits = pending as f64 / rate.max(1.0) * 1e3 <= opts.max_downtime_ms;
            let t = Instant::now();
            let n = copy.update(src, &dirty)? + copy.follow(src)?;
            tell(copy, dest)?;
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
            // throttling, hold the writers for a larger share of the next one.
            if opts.throttle {
                throttle = (throttle + 0.2).min(0.9);
            }
        };
        // The last, small pass, with the writers stopped.
        let down = Instant::now();
        let hook_ms;
        let final_pages = {
            let paused = src.pause()?;
            let dirty = src.dirty()?;
            let mut n = copy.update(src, &dirty)?;
            n += copy.follow(src)?;
            let untracked = copy.untracked(&src.tracked());
            n += copy.update(src, &untracked)?;
            n += copy.forget_given_back(src)?;
            let hook = Instant::now();
            at_stop();
            hook_ms = hook.elapsed().as_secs_f64() * 1e3;
            drop(paused);
            n
        };
        self.first = false;
        // The hook's time is the caller's, not the checkpoint's.
        let downtime_ms = down.elapsed().as_secs_f64() * 1e3 - hook_ms;
        let copy_ms = t0.elapsed().as_secs_f64() * 1e3;
        bytes += final_pages * PAGE_SIZE as u64;
        // The destination, after the writers run again: the last changes,
        // then the whole.
        let resumed = Instant::now();
        tell(copy, dest)?;
        dest.complete()?;
        let handover_ms = downtime_ms + resumed.elapsed().as_secs_f64() * 1e3;
        copy.regions.sort_by_key(|(r, _)| r.start);
        let save = dest.finish(&copy.regions, src.pid(), label)?;
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
}

/// Takes one live checkpoint of process `pid` into `dest` (see the module
/// and [`Checkpointer::checkpoint`]).
pub fn live_snapshot(
    pid: i32,
    dest: &mut dyn Destination,
    label: &str,
    opts: &LiveOptions,
    progress: &mut dyn FnMut(&Pass),
    at_stop: &mut dyn FnMut(),
) -> Result<LiveReport> {
    Checkpointer::new(ProcessSource::new(pid)?, opts.clone())
        .checkpoint(dest, label, progress, at_stop)
}
