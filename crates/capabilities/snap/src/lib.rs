//! Same-page-merging snapshots (SimGrid): a content-addressed page store and
//! incremental snapshots built on [`pagewise_track`].
//!
//! [`Snapshots`] keeps any number of snapshots of one or more regions of the
//! calling process. Each distinct page content is stored once in a
//! [`PageStore`]; a snapshot is a table of page ids. The first snapshot reads
//! every populated page. Later ones read only the pages the dirty tracker
//! reports written since the last snapshot or restore, and reuse the ids of
//! the rest. A restore writes only the pages that differ from the target:
//! those written since the last snapshot or restore, and those whose id in
//! the target differs from what memory holds.
//!
//! Page tables are split into chunks of 32 ids shared between
//! snapshots (copy on write), so a snapshot that changes a few pages costs a
//! few chunks, not a table the size of the memory.
//!
//! # What the caller guarantees
//!
//! * No other thread writes the regions while [`Snapshots::take`] or
//!   [`Snapshots::restore`] runs (stop them, as a model checker or fuzzer does
//!   between steps). Writes at any other time are never missed. A restore
//!   checks afterwards that only the pages it wrote were written; pages that
//!   another thread wrote meanwhile are counted in
//!   [`RestoreStats::foreign_writes`] and treated as dirty.
//! * The regions stay mapped, writable and of the same size for the life of
//!   the `Snapshots` (checked at creation; the uffd-wp tracker also fails a
//!   collection when a region is unmapped).
//! * Memory handed to [`Snapshots`] is plain data: restoring overwrites it
//!   under any Rust references into it, exactly as the program's own writes would.

#[macro_use]
extern crate pagewise_mech;

pub mod criu;
pub mod disk;
pub mod extract;
#[doc(hidden)]
pub mod layout;
pub mod lazy;
pub mod live;
#[cfg(target_arch = "x86_64")]
pub mod process;
pub mod remote;
mod store;
mod table;
#[doc(hidden)]
#[cfg(target_arch = "x86_64")]
pub mod threads;
pub mod wire;
#[cfg(target_arch = "x86_64")]
pub use process::fds;

pub use disk::{DiskSnapshot, DiskStats, DiskStore, SaveStats, StoreError};
pub use lazy::{LazyOptions, LazyRestore, LazyStats};
#[cfg(target_arch = "x86_64")]
pub use process::{
    session::{ResetPhases, ResetReport, ResetSession},
    ProcessSnapshots, RestoreOptions, RestorePhases, RestoreReport, RollbackRefusal,
};
pub use store::{PageId, PageStore, StoreStats};
use table::{Chunk, Table};

use pagewise_mech::procfs;
use pagewise_mech::region::{push_coalesced, PageRange};
use pagewise_mech::walk::PageWalker;
mod error;
pub use error::{Error, Result};
use pagewise_mech::{Region, PAGE_SIZE};
use pagewise_track::{BackendKind, DirtyTracker};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The memory snapshots work on: private memory, anonymous or copied from a
/// file. Shared memory is refused (a restore would write into every other
/// process's view of it, and its writes by others are not tracked), and so
/// is hugetlb (pages of another size).
pub(crate) const SNAP_KINDS: [procfs::MemoryKind; 2] = [
    procfs::MemoryKind::PrivateAnonymous,
    procfs::MemoryKind::FilePrivate,
];

/// Page ids per shared chunk of a snapshot's table (128 KiB of memory).
pub(crate) const CHUNK_PAGES: usize = 32;

/// Identifies a snapshot within its [`Snapshots`].
pub type SnapId = u64;

/// How to build a [`Snapshots`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct SnapshotOptions {
    /// Compare page contents on every digest match (default true).
    pub verify: bool,
    /// Dirty-tracking backend (default: the best available).
    pub backend: BackendKind,
}

setters!(SnapshotOptions {
    verify: bool,
    backend: BackendKind,
});

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            verify: true,
            backend: BackendKind::Auto,
        }
    }
}

/// What taking one snapshot did.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct TakeStats {
    /// Pages read and hashed.
    pub pages_read: u64,
    /// Pages whose content was new to the store.
    pub pages_new: u64,
    /// Pages of the snapshot.
    pub pages: u64,
    /// Wall time, nanoseconds.
    pub elapsed_ns: u64,
}

/// What one restore did.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct RestoreStats {
    /// Pages reported written since the last snapshot or restore (after
    /// a take that followed a restore, the pages that take read count
    /// too: they stay writable until this restore writes them back).
    pub pages_dirty: u64,
    /// Pages written back.
    pub pages_written: u64,
    /// Pages written during the restore by someone else (see the module docs).
    pub foreign_writes: u64,
    /// Pages read from memory and compared with the snapshot's (where
    /// writes are not tracked; a page of anonymous memory never populated
    /// is not read).
    #[serde(default)]
    pub pages_compared: u64,
    /// Wall time, nanoseconds.
    pub elapsed_ns: u64,
}

/// One snapshot, as [`Snapshots::list`] shows it.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// Its id.
    pub id: SnapId,
    /// Pages it covers.
    pub pages: u64,
    /// Zero pages among them.
    pub zero_pages: u64,
    /// What taking it cost.
    pub take: TakeStats,
}

struct Snap {
    tables: Vec<Table>,
    take: TakeStats,
}

/// Snapshots of regions of the calling process, with one shared page store.
pub struct Snapshots {
    regions: Vec<Region>,
    tracker: DirtyTracker,
    store: PageStore,
    snaps: BTreeMap<SnapId, Snap>,
    next_id: SnapId,
    /// What memory held at the last take or restore; `None` before the first.
    current: Option<Vec<Table>>,
    /// Dirty pages collected (for a diff against live memory) but not yet
    /// consumed by a take or restore.
    pending: Vec<PageRange>,
    walker: PageWalker,
    /// Scratch per-region bitmaps.
    marks: Vec<Vec<u64>>,
    /// Empty chunk lists to reuse.
    spare: Vec<Vec<Chunk>>,
    /// The last take or restore was a restore (see [`Snapshots::take`]).
    after_restore: bool,
}

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshots")
            .field("regions", &self.regions)
            .field("snapshots", &self.snaps.len())
            .field("tracker", &self.tracker)
            .field("store", &self.store)
            .finish()
    }
}

impl Snapshots {
    /// Snapshots of `regions` of the calling process, which must be mapped,
    /// writable, page-aligned and non-overlapping. Tracking starts now.
    pub fn new(regions: &[Region], opts: SnapshotOptions) -> Result<Self> {
        if regions.is_empty() {
            return Err(Error::NoRegion);
        }
        let mut sorted = regions.to_vec();
        sorted.sort();
        procfs::check_mapped_writable(&sorted, "snapshots", &SNAP_KINDS)?;
        let tracker = DirtyTracker::new(&sorted, opts.backend)?;
        let marks = sorted
            .iter()
            .map(|r| vec![0u64; (r.pages() as usize).div_ceil(64)])
            .collect();
        Ok(Snapshots {
            regions: sorted,
            tracker,
            store: PageStore::new(opts.verify),
            snaps: BTreeMap::new(),
            next_id: 1,
            current: None,
            pending: Vec::new(),
            walker: PageWalker::new(None)?,
            marks,
            spare: Vec::new(),
            after_restore: false,
        })
    }

    /// The dirty-tracking backend in use.
    pub fn backend(&self) -> BackendKind {
        self.tracker.backend()
    }

    /// The page store.
    pub fn store(&self) -> &PageStore {
        &self.store
    }

    /// Pages written since the last take or restore, kept until one consumes
    /// them. With `rearm`, tracking starts afresh for them; without, they
    /// stay unprotected where the backend allows it (the next collection
    /// reports them again), so that writing them does not fault.
    fn drain_dirty(&mut self, rearm: bool) -> Result<Vec<PageRange>> {
        let c = match rearm {
            true => self.tracker.collect()?,
            false => match self.tracker.peek()? {
                Some(c) => c,
                None => self.tracker.collect()?,
            },
        };
        Ok(pagewise_mech::region::union_sorted(
            &std::mem::take(&mut self.pending),
            &c.ranges,
        ))
    }

    /// Takes a snapshot and returns its id.
    ///
    /// Right after a restore, the pages read stay unprotected (with
    /// `uffd-wp`): a restore that follows rewrites them without a fault each,
    /// and the next take or restore reads or writes them again. A take after
    /// a take re-protects, so pages are never left unprotected for longer
    /// than one interval.
    pub fn take(&mut self) -> Result<SnapId> {
        let t0 = Instant::now();
        let dirty = self.drain_dirty(!self.after_restore)?;
        self.after_restore = false;
        let mut stats = TakeStats::default();
        let tables = match self.current.take() {
            None => self.read_all(&mut stats)?,
            Some(mut tables) => {
                for r in &dirty {
                    self.read_range(&mut tables, *r, &mut stats);
                }
                tables
            }
        };
        let copy = table::share(&mut self.spare, &tables);
        let id = self.insert_snap(copy, stats, t0);
        self.current = Some(tables);
        Ok(id)
    }

    /// Records a new snapshot made of `tables`.
    fn insert_snap(&mut self, tables: Vec<Table>, mut take: TakeStats, t0: Instant) -> SnapId {
        take.pages = self.regions.iter().map(Region::pages).sum();
        take.elapsed_ns = t0.elapsed().as_nanos() as u64;
        let id = self.next_id;
        self.next_id += 1;
        self.snaps.insert(id, Snap { tables, take });
        id
    }

    /// First snapshot: every populated page is read; the rest are zero.
    fn read_all(&mut self, stats: &mut TakeStats) -> Result<Vec<Table>> {
        let mut tables = Vec::with_capacity(self.regions.len());
        let mut runs = Vec::new();
        for r in self.regions.clone() {
            let n = r.pages() as usize;
            let mut ids = vec![PageId::ZERO; n];
            self.walker.populated(r, &mut runs)?;
            let mut zeros = n as u64;
            for &(a, b) in &runs {
                let i0 = ((a - r.start) / PAGE_SIZE as u64) as usize;
                let i1 = ((b - r.start) / PAGE_SIZE as u64) as usize;
                zeros -= (i1 - i0) as u64;
                for (i, slot) in ids.iter_mut().enumerate().take(i1).skip(i0) {
                    let page = page_at(r.start + (i * PAGE_SIZE) as u64);
                    *slot = self.intern(page, stats);
                }
            }
            // The zero pages not read are references too.
            for _ in 0..zeros {
                self.store.incref(PageId::ZERO);
            }
            tables.push(Table::from_ids(&ids));
        }
        Ok(tables)
    }

    fn intern(&mut self, page: &[u8], stats: &mut TakeStats) -> PageId {
        let id = self.store.intern(page);
        stats.pages_read += 1;
        // A page already stored has at least two references now.
        if !id.is_zero() && self.store.refs(id) == 1 {
            stats.pages_new += 1;
        }
        id
    }

    /// Re-reads the pages of `r` into `tables`, copying shared chunks first.
    fn read_range(&mut self, tables: &mut [Table], r: PageRange, stats: &mut TakeStats) {
        let mut addr = r.start;
        while addr < r.end() {
            let Some(ri) = self.region_of(addr) else {
                addr += PAGE_SIZE as u64;
                continue;
            };
            let region = self.regions[ri];
            let end = r.end().min(region.end());
            while addr < end {
                let i = ((addr - region.start) / PAGE_SIZE as u64) as usize;
                let new = self.intern(page_at(addr), stats);
                let chunk = table::own_chunk(&mut self.store, &mut tables[ri], i / CHUNK_PAGES);
                let old = std::mem::replace(&mut chunk[i % CHUNK_PAGES], new);
                self.store.decref(old);
                addr += PAGE_SIZE as u64;
            }
        }
    }

    /// Sets `self.marks` to exactly the pages of `ranges`.
    fn mark(&mut self, ranges: &[PageRange]) {
        for (m, r) in self.marks.iter_mut().zip(&self.regions) {
            m.fill(0);
            table::mark(m, *r, ranges);
        }
    }

    fn region_of(&self, addr: u64) -> Option<usize> {
        let i = self.regions.partition_point(|r| r.end() <= addr);
        (i < self.regions.len() && self.regions[i].contains(addr)).then_some(i)
    }

    fn snap(&self, id: SnapId) -> Result<&Snap> {
        self.snaps.get(&id).ok_or(Error::NoSnapshot { id })
    }

    /// Restores memory to snapshot `id`, byte-exact, writing only pages that differ.
    pub fn restore(&mut self, id: SnapId) -> Result<RestoreStats> {
        let t0 = Instant::now();
        self.snap(id)?;
        let target = table::share(&mut self.spare, &self.snaps[&id].tables);
        // Leave the dirty pages writable: the restore rewrites them, and the
        // collection after it re-protects them.
        let dirty = self.drain_dirty(false)?;
        self.after_restore = true;
        let mut stats = RestoreStats {
            pages_dirty: pagewise_mech::region::total_pages(&dirty),
            ..Default::default()
        };
        self.mark(&dirty);
        let current = self.current.take();
        let mut written: Vec<PageRange> = Vec::new();
        for (ri, region) in self.regions.iter().enumerate() {
            let tgt = &target[ri];
            let cur = current.as_ref().map(|c| &c[ri]);
            let store = &self.store;
            table::pages_to_write(cur, tgt, &self.marks[ri], |i, want| {
                let addr = region.start + (i * PAGE_SIZE) as u64;
                write_page(addr, store.page(want));
                push_coalesced(&mut written, addr, addr + PAGE_SIZE as u64);
                stats.pages_written += 1;
            });
        }
        // Our own writes are not the program's: clear them, and check that
        // nobody else wrote meanwhile.
        let after = self.tracker.collect()?;
        let foreign = pagewise_mech::region::subtract_sorted(&after.ranges, &written);
        stats.foreign_writes = pagewise_mech::region::total_pages(&foreign);
        self.pending = foreign;
        self.current = Some(target);
        if let Some(old) = current {
            table::release(&mut self.store, &mut self.spare, old);
        }
        stats.elapsed_ns = t0.elapsed().as_nanos() as u64;
        Ok(stats)
    }

    /// Drops snapshot `id`; pages no other snapshot uses are freed.
    pub fn drop_snapshot(&mut self, id: SnapId) -> Result<()> {
        let s = self.snaps.remove(&id).ok_or(Error::NoSnapshot { id })?;
        table::release(&mut self.store, &mut self.spare, s.tables);
        Ok(())
    }

    /// The snapshots, oldest first.
    pub fn list(&self) -> Vec<SnapshotInfo> {
        self.snaps
            .iter()
            .map(|(&id, s)| Self::info_of(id, s))
            .collect()
    }

    /// Snapshot `id`, as [`Snapshots::list`] shows it.
    pub fn info(&self, id: SnapId) -> Result<SnapshotInfo> {
        Ok(Self::info_of(id, self.snap(id)?))
    }

    fn info_of(id: SnapId, s: &Snap) -> SnapshotInfo {
        SnapshotInfo {
            id,
            pages: s.take.pages,
            zero_pages: s
                .tables
                .iter()
                .flat_map(|t| t.chunks.iter())
                .map(|c| c.iter().filter(|p| p.is_zero()).count() as u64)
                .sum(),
            take: s.take,
        }
    }

    /// Reads `buf.len()` bytes at `addr` as snapshot `id` holds them, across
    /// page boundaries (a software MMU). The range must lie inside one region.
    pub fn read(&self, id: SnapId, addr: u64, buf: &mut [u8]) -> Result<()> {
        let s = self.snap(id)?;
        let ri = self.region_of(addr).ok_or(Error::NotSnapshotted {
            addr,
            snapshot: None,
        })?;
        let region = self.regions[ri];
        if addr + buf.len() as u64 > region.end() {
            return Err(Error::PastRegion {
                addr,
                len: buf.len() as u64,
                start: region.start,
                end: region.end(),
            });
        }
        let mut done = 0;
        while done < buf.len() {
            let a = addr + done as u64;
            let off = (a - region.start) as usize;
            let (page, in_page) = (off / PAGE_SIZE, off % PAGE_SIZE);
            let n = (PAGE_SIZE - in_page).min(buf.len() - done);
            let bytes = self.store.page(s.tables[ri].get(page));
            buf[done..done + n].copy_from_slice(&bytes[in_page..in_page + n]);
            done += n;
        }
        Ok(())
    }

    /// Ranges whose contents differ between snapshots `a` and `b`.
    pub fn diff(&self, a: SnapId, b: SnapId) -> Result<Vec<PageRange>> {
        let (sa, sb) = (self.snap(a)?, self.snap(b)?);
        let mut out = Vec::new();
        for (ri, region) in self.regions.iter().enumerate() {
            for (c, (ca, cb)) in sa.tables[ri]
                .chunks
                .iter()
                .zip(&sb.tables[ri].chunks)
                .enumerate()
            {
                if Arc::ptr_eq(ca, cb) {
                    continue;
                }
                for (k, (x, y)) in ca.iter().zip(cb.iter()).enumerate() {
                    // Equal contents always get the same id, so ids decide.
                    if x != y {
                        let addr = region.start + ((c * CHUNK_PAGES + k) * PAGE_SIZE) as u64;
                        push_coalesced(&mut out, addr, addr + PAGE_SIZE as u64);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Ranges whose live contents differ from snapshot `id`.
    pub fn diff_live(&mut self, id: SnapId) -> Result<Vec<PageRange>> {
        self.snap(id)?;
        let c = self.tracker.collect()?;
        self.pending = pagewise_mech::region::union_sorted(&self.pending, &c.ranges);
        if self.current.is_none() {
            return Err(Error::NoneTaken);
        }
        let mut out = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        self.mark(&pending);
        self.pending = pending;
        let s = &self.snaps[&id];
        let cur = self.current.as_ref().expect("checked above");
        for (ri, region) in self.regions.iter().enumerate() {
            for i in 0..region.pages() as usize {
                let addr = region.start + (i * PAGE_SIZE) as u64;
                let want = s.tables[ri].get(i);
                let differs = if table::get_bit(&self.marks[ri], i) {
                    page_at(addr) != self.store.page(want)
                } else {
                    cur[ri].get(i) != want
                };
                if differs {
                    push_coalesced(&mut out, addr, addr + PAGE_SIZE as u64);
                }
            }
        }
        Ok(out)
    }

    /// Saves snapshot `id` into a durable store; pages the store already has
    /// are not written again.
    pub fn save(&self, id: SnapId, disk: &mut DiskStore, label: &str) -> Result<SaveStats> {
        let s = self.snap(id)?;
        let mut w = disk.writer(&self.regions, None, label)?;
        table::push_pages(&mut w, &self.store, &s.tables)?;
        w.finish()
    }

    /// Loads snapshot `disk_id` of a durable store as a new snapshot, to
    /// restore like any other. Its regions must have the sizes of these
    /// regions (their addresses may differ: a fresh process maps elsewhere).
    pub fn load(&mut self, disk: &DiskStore, disk_id: u64) -> Result<SnapId> {
        let t0 = Instant::now();
        let ds = disk.load(disk_id)?;
        disk::check_same_shape(&ds, &self.regions)?;
        let mut stats = TakeStats::default();
        let tables = table::from_disk(&mut self.store, disk, &ds, &mut stats)?;
        let id = self.insert_snap(tables, stats, t0);
        Ok(id)
    }
}

/// One page of the calling process's memory.
fn page_at(addr: u64) -> &'static [u8] {
    // SAFETY: `addr` is a page inside a region the caller of `Snapshots::new`
    // keeps mapped and readable (checked at creation). The bytes are only read,
    // as plain data; no other thread writes them during take/restore (the
    // documented contract), and the slice does not outlive the call using it.
    unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) }
}

/// Writes one page of the calling process's memory.
fn write_page(addr: u64, bytes: &[u8]) {
    debug_assert_eq!(bytes.len(), PAGE_SIZE);
    // SAFETY: `addr` is a page inside a snapshotted region, mapped and writable
    // (checked at creation); the source is a store page, never overlapping it.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, PAGE_SIZE) }
}
