//! Reading and writing the process's pages for [`ProcessSnapshots`]: what
//! memory holds at a take, what a restore writes, and the write-protection
//! that tells which pages changed in between.

use super::{page_index, Known, ProcessSnapshots};
use crate::table::{self, Table};
use crate::Result;
use crate::{PageId, RestoreStats, TakeStats, CHUNK_PAGES};
use pagewise_mech::region::PageRange;
use pagewise_mech::remote;
use pagewise_mech::walk::PageWalker;
use pagewise_mech::wp::UffdWp;
use pagewise_mech::{Region, PAGE_SIZE};
use std::collections::BTreeMap;

impl ProcessSnapshots {
    /// The tables of `regions` as memory holds them now (the process
    /// stopped): pages of a watched mapping known from the last take or
    /// restore are reused unless written since; the rest are read. Every
    /// region is watched afterwards where it can be. Becomes `current`.
    pub(super) fn read_memory(
        &mut self,
        regions: &[Region],
        stats: &mut TakeStats,
    ) -> Result<Vec<(Region, Table)>> {
        let old = std::mem::take(&mut self.current);
        let mut old_by_start: BTreeMap<u64, Known> =
            old.into_iter().map(|k| (k.region.start, k)).collect();
        let mut out = Vec::with_capacity(regions.len());
        let mut now = Vec::with_capacity(regions.len());
        let mut held: Option<Held> = None;
        for &r in regions {
            let known = old_by_start
                .remove(&r.start)
                .filter(|k| k.region == r && k.watched);
            let dirty = match (&known, self.wp.as_mut()) {
                (Some(_), Some(wp)) => written(wp, r, !self.after_restore)?,
                _ => None,
            };
            let (table, watched) = match (known, dirty) {
                (Some(k), Some(dirty)) => {
                    let mut t = k.table;
                    self.read_runs(r, &mut t, &dirty, stats)?;
                    (t, true)
                }
                (k, _) => {
                    if let Some(k) = k {
                        table::release(&mut self.store, &mut self.spare, vec![k.table]);
                    }
                    // What memory holds, walked before the mapping is
                    // write-protected: protection marks every page of it,
                    // holes too, and the walk shows a mark as it shows a
                    // page swapped out. A page populated in between (by
                    // another writer than the stopped threads) is present
                    // afterwards, and read too.
                    let held = Held::of(&mut held, self.pid)?;
                    let mut runs = Vec::new();
                    let anonymous = held.runs(r, &mut runs)?;
                    let watched = self.watch(r, true)?;
                    if watched && anonymous {
                        let present = pagewise_sys::pagemap::category::PRESENT;
                        let mut after = Vec::new();
                        held.walker.categories(r, present, present, &mut after)?;
                        runs.extend(after.iter().map(|p| (p.start, p.end)));
                    }
                    (self.read_whole(r, runs, stats)?, watched)
                }
            };
            out.push((
                r,
                table::share(&mut self.spare, std::slice::from_ref(&table)).remove(0),
            ));
            now.push(Known {
                region: r,
                table,
                watched,
            });
        }
        for (_, k) in old_by_start {
            if let Some(wp) = &self.wp {
                let _ = wp.unregister(k.region);
            }
            table::release(&mut self.store, &mut self.spare, vec![k.table]);
        }
        self.current = now;
        Ok(out)
    }

    /// Registers `r` (and, with `protect`, protects it); whether it is
    /// watched (not where another userfaultfd holds it, where userfaultfd
    /// cannot register it — a droppable mapping (`MAP_DROPPABLE`, `dp` in
    /// its `VmFlags`) or another the kernel refuses —, or without tracking).
    /// A mapping not watched is compared page by page at each take and
    /// restore.
    fn watch(&self, r: Region, protect: bool) -> Result<bool> {
        let Some(wp) = &self.wp else { return Ok(false) };
        let _ = wp.unregister(r);
        match wp.register(r, protect) {
            Ok(()) => Ok(true),
            Err(pagewise_mech::Error::Os { source, .. })
                if matches!(source.raw_os_error(), Some(libc::EBUSY | libc::EINVAL)) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the pages of `ranges` (inside `r`) into `t`, up to `BATCH`
    /// pages in runs per system call.
    fn read_runs(
        &mut self,
        r: Region,
        t: &mut Table,
        ranges: &[PageRange],
        stats: &mut TakeStats,
    ) -> Result<()> {
        let cap = super::BATCH;
        let mut batch: Vec<(u64, usize)> = Vec::new();
        let mut pages = 0usize;
        let clipped = ranges.iter().filter_map(|d| {
            let (a, b) = (d.start.max(r.start), d.end().min(r.end()));
            (a < b).then_some((a, b))
        });
        for (mut a, b) in clipped {
            while a < b {
                let n = (((b - a) as usize) / PAGE_SIZE).min(cap - pages);
                batch.push((a, n));
                pages += n;
                a += (n * PAGE_SIZE) as u64;
                if pages == cap || batch.len() == 1024 {
                    self.read_batch(r, t, &batch, stats)?;
                    batch.clear();
                    pages = 0;
                }
            }
        }
        self.read_batch(r, t, &batch, stats)
    }

    /// Reads `runs` (address, pages) of `r` in one call straight into the
    /// store's slots, digested there (each page copied once), and puts
    /// their pages into `t`.
    fn read_batch(
        &mut self,
        r: Region,
        t: &mut Table,
        runs: &[(u64, usize)],
        stats: &mut TakeStats,
    ) -> Result<()> {
        let total: usize = runs.iter().map(|&(_, n)| n).sum();
        if total == 0 {
            return Ok(());
        }
        let ids = self.store.reserve(total);
        let read = {
            let mut slots = self.store.slots_mut(&ids).into_iter();
            let mut parts = Vec::with_capacity(total);
            for &(a, n) in runs {
                for k in 0..n {
                    let slot = slots.next().expect("a slot reserved per page");
                    parts.push((a + (k * PAGE_SIZE) as u64, slot));
                }
            }
            pagewise_mech::remote::read_many(self.pid, &mut parts)
        };
        if let Err(e) = read {
            self.store.unreserve(&ids);
            return Err(e.into());
        }
        let mut ids = ids.into_iter();
        for &(a, n) in runs {
            for k in 0..n {
                let i = page_index(r, a) + k;
                let new = self
                    .store
                    .intern_slot(ids.next().expect("a slot reserved per page"));
                stats.pages_read += 1;
                if !new.is_zero() && self.store.refs(new) == 1 {
                    stats.pages_new += 1;
                }
                let chunk = table::own_chunk(&mut self.store, t, i / CHUNK_PAGES);
                let old = std::mem::replace(&mut chunk[i % CHUNK_PAGES], new);
                self.store.decref(old);
            }
        }
        Ok(())
    }

    /// Reads the pages of `runs` (`[a, b)` in `r`, in any order, overlaps
    /// allowed); the others are zero pages.
    fn read_whole(
        &mut self,
        r: Region,
        runs: Vec<(u64, u64)>,
        stats: &mut TakeStats,
    ) -> Result<Table> {
        let n = r.pages() as usize;
        for _ in 0..n {
            self.store.incref(PageId::ZERO);
        }
        let mut t = Table::from_ids(&vec![PageId::ZERO; n]);
        let mut ranges: Vec<PageRange> = runs
            .iter()
            .filter_map(|&(a, b)| PageRange::checked(a, (b - a) / PAGE_SIZE as u64))
            .collect();
        pagewise_mech::region::normalize(&mut ranges);
        self.read_runs(r, &mut t, &ranges, stats)?;
        Ok(t)
    }

    /// Makes memory hold `target` (the process stopped, its layout the
    /// snapshot's): per mapping, the pages written since the last take or
    /// restore and those whose contents differ from what it held then; all
    /// of a mapping made afresh (`fresh`: its non-zero pages) or not known
    /// (compared by digest where nothing tracks it); the page at `force`.
    /// Becomes `current`. The nanoseconds spent finding written pages.
    pub(super) fn write_memory(
        &mut self,
        target: Vec<(Region, Table)>,
        fresh: &[(u64, u64)],
        force: Option<u64>,
        stats: &mut RestoreStats,
    ) -> Result<u64> {
        let mut walk_ns = 0u64;
        let old = std::mem::take(&mut self.current);
        let mut old_by_start: BTreeMap<u64, Known> =
            old.into_iter().map(|k| (k.region.start, k)).collect();
        let mut now = Vec::with_capacity(target.len());
        let mut held = None;
        for (r, tgt) in target {
            let made = fresh.iter().any(|&(a, b)| a < r.end() && b > r.start);
            let known = old_by_start
                .remove(&r.start)
                .filter(|k| k.region == r && k.watched && !made);
            let t_walk = std::time::Instant::now();
            let dirty = match (&known, self.wp.as_mut()) {
                (Some(_), Some(wp)) => written(wp, r, false)?,
                _ => None,
            };
            walk_ns += t_walk.elapsed().as_nanos() as u64;
            let mut pages: Vec<usize> = Vec::new();
            match (&known, &dirty) {
                (Some(k), Some(dirty)) => {
                    stats.pages_dirty += pagewise_mech::region::total_pages(dirty);
                    let mut marks = vec![0u64; (r.pages() as usize).div_ceil(64)];
                    table::mark(&mut marks, r, dirty);
                    if let Some(f) = force.filter(|&f| r.contains(f)) {
                        table::set_bit(&mut marks, page_index(r, f));
                    }
                    table::pages_to_write(Some(&k.table), &tgt, &marks, |i, _| pages.push(i));
                }
                _ if made => {
                    // Mapped afresh: zero already, but for a file's pages.
                    pages.extend((0..r.pages() as usize).filter(|&i| !tgt.get(i).is_zero()));
                }
                // Not known (no tracking, or a region the handle has not
                // seen as it is): compared, so that only pages that differ
                // are written (a zero page not populated stays so).
                _ => self.differing(&mut held, r, &tgt, &mut pages, &mut stats.pages_compared)?,
            }
            // A mapping not known is registered before it is written: its
            // pages then join the neighbours' (a mapping made afresh merges
            // with them as it was merged before).
            let fresh_watch = match (&known, &dirty) {
                (Some(_), Some(_)) => None,
                _ => Some(self.watch(r, false)?),
            };
            {
                let mut w = remote::Writer::new(self.pid)?;
                for &i in &pages {
                    w.push(
                        r.start + (i * PAGE_SIZE) as u64,
                        self.store.page(tgt.get(i)),
                    )?;
                }
                w.flush()?;
            }
            stats.pages_written += pages.len() as u64;
            let watched = match fresh_watch {
                None => {
                    // Protected again: only the pages written now.
                    if let Some(wp) = self.wp.as_mut() {
                        protect_again(wp, r, &pages)?;
                    }
                    true
                }
                Some(watched) => {
                    if let (true, Some(wp)) = (watched, &self.wp) {
                        wp.protect(r)?;
                    }
                    watched
                }
            };
            if let Some(k) = known {
                table::release(&mut self.store, &mut self.spare, vec![k.table]);
            }
            now.push(Known {
                region: r,
                table: tgt,
                watched,
            });
        }
        for (_, k) in old_by_start {
            table::release(&mut self.store, &mut self.spare, vec![k.table]);
        }
        self.current = now;
        Ok(walk_ns)
    }

    /// Puts back the snapshot `current` holds ([`ProcessSnapshots::current_is`]):
    /// per mapping, only the pages written since, found by one walk and
    /// written from the snapshot's table as it is (no table is copied or
    /// released), then protected again (but for the pages written at every
    /// reset lately, see [`Hot`]); a mapping not watched is compared. The
    /// layout must be the snapshot's. The nanoseconds spent finding written
    /// pages.
    pub(super) fn reset_written(&mut self, stats: &mut RestoreStats) -> Result<u64> {
        let mut walk_ns = 0u64;
        let current = std::mem::take(&mut self.current);
        let r = self.reset_each(&current, stats, &mut walk_ns);
        self.current = current;
        r.map(|()| walk_ns)
    }

    fn reset_each(
        &mut self,
        current: &[Known],
        stats: &mut RestoreStats,
        walk_ns: &mut u64,
    ) -> Result<()> {
        let mut dirty = Vec::new();
        let mut held = None;
        // Per mapping: its pages to write, and whether a walk found them
        // (they are protected again after).
        let mut todo: Vec<(usize, Vec<usize>, bool)> = Vec::new();
        for (n, k) in current.iter().enumerate() {
            let r = k.region;
            let mut pages = Vec::new();
            dirty.clear();
            let scanned = match (k.watched, self.wp.as_mut()) {
                (true, Some(wp)) => {
                    let t = std::time::Instant::now();
                    // An error (no longer registered) is a layout that
                    // changed under the caller, which checks it first.
                    wp.scan_written(r.start, r.end(), true, false, &mut dirty)?;
                    *walk_ns += t.elapsed().as_nanos() as u64;
                    true
                }
                _ => false,
            };
            if scanned {
                stats.pages_dirty += pagewise_mech::region::total_pages(&dirty);
                for d in &dirty {
                    let (a, b) = (d.start.max(r.start), d.end().min(r.end()));
                    let mut at = a;
                    while at < b {
                        pages.push(page_index(r, at));
                        at += PAGE_SIZE as u64;
                    }
                }
            } else {
                self.differing(
                    &mut held,
                    r,
                    &k.table,
                    &mut pages,
                    &mut stats.pages_compared,
                )?;
            }
            if !pages.is_empty() {
                todo.push((n, pages, scanned));
            }
        }
        let mut w = remote::Writer::new(self.pid)?;
        for (n, pages, _) in &todo {
            let k = &current[*n];
            for &i in pages {
                w.push(
                    k.region.start + (i * PAGE_SIZE) as u64,
                    self.store.page(k.table.get(i)),
                )?;
            }
            stats.pages_written += pages.len() as u64;
        }
        w.flush()?;
        // Protected again once written (a write through
        // `process_vm_writev` marks a page written), but for the pages
        // written at every reset lately.
        self.hot.next_reset();
        if let Some(wp) = self.wp.as_mut() {
            for (n, pages, _) in todo.iter_mut().filter(|t| t.2) {
                let r = current[*n].region;
                self.hot.keep_cold(r, pages);
                protect_again(wp, r, pages)?;
            }
        }
        Ok(())
    }

    /// The pages of `r` whose contents differ from `tgt`, ascending. Where
    /// memory holds a page (present or swapped), or the mapping is a
    /// file's (`anonymous` false: a page not populated holds the file's
    /// contents), it is read and compared. A page of anonymous memory
    /// never populated reads as zeros: it differs where the snapshot's is
    /// not zero, and is not read (reading would fault the zero page in at
    /// every address of a sparse mapping: 10 GiB read for 2 pages).
    /// `held`: see [`Held`], made at the first call of a restore.
    fn differing(
        &mut self,
        held: &mut Option<Held>,
        r: Region,
        tgt: &Table,
        pages: &mut Vec<usize>,
        compared: &mut u64,
    ) -> Result<()> {
        let mut runs = Vec::new();
        Held::of(held, self.pid)?.runs(r, &mut runs)?;
        let holes = |from: u64, to: u64, pages: &mut Vec<usize>| {
            let (a, b) = (page_index(r, from), page_index(r, to));
            pages.extend((a..b).filter(|&i| !tgt.get(i).is_zero()));
        };
        let mut cursor = r.start;
        for (a, b) in runs {
            holes(cursor, a, pages);
            let mut addr = a;
            while addr < b {
                let len = ((b - addr) as usize).min(self.buf.len());
                pagewise_mech::remote::read(self.pid, addr, &mut self.buf[..len])?;
                *compared += (len / PAGE_SIZE) as u64;
                for (k, page) in self.buf[..len].chunks_exact(PAGE_SIZE).enumerate() {
                    let i = page_index(r, addr) + k;
                    if page != self.store.page(tgt.get(i)) {
                        pages.push(i);
                    }
                }
                addr += len as u64;
            }
            cursor = b;
        }
        holes(cursor, r.end(), pages);
        Ok(())
    }
}

/// Where memory holds a process's pages, for one take or restore (the
/// process stopped): its anonymous mappings, `[start, end)` ascending and
/// coalesced, read when first asked, and a walker of its page tables.
struct Held {
    anon: Vec<(u64, u64)>,
    walker: PageWalker,
}

impl Held {
    /// The one `slot` holds, made for process `pid` at the first call.
    fn of(slot: &mut Option<Held>, pid: i32) -> Result<&mut Held> {
        if slot.is_none() {
            let mut anon: Vec<(u64, u64)> = Vec::new();
            for m in pagewise_mech::procfs::maps(Some(pid))? {
                if m.inode != 0 || m.shared {
                    continue;
                }
                match anon.last_mut() {
                    Some(last) if last.1 == m.start => last.1 = m.end,
                    _ => anon.push((m.start, m.end)),
                }
            }
            *slot = Some(Held {
                anon,
                walker: PageWalker::new(Some(pid))?,
            });
        }
        Ok(slot.as_mut().expect("made above"))
    }

    /// Replaces `out` with the runs of `r` to read: where memory holds a
    /// page (present or swapped) of anonymous memory, whose other pages
    /// read as zeros; all of a file's private mapping, whose pages not
    /// populated hold the file's contents. Whether `r` is anonymous.
    fn runs(&mut self, r: Region, out: &mut Vec<(u64, u64)>) -> Result<bool> {
        let i = self.anon.partition_point(|&(_, end)| end <= r.start);
        let anonymous = self
            .anon
            .get(i)
            .is_some_and(|&(a, b)| a <= r.start && r.end() <= b);
        if anonymous {
            self.walker.populated(r, out)?;
        } else {
            out.clear();
            out.push((r.start, r.end()));
        }
        Ok(anonymous)
    }
}

/// The pages of `r` written since it was last protected (with `rearm`,
/// protected again; without, a restore leaves them writable, since it
/// writes them and protects what it wrote); `None` where part of it is no
/// longer registered (mapped anew by the program): its contents are then
/// unknown.
fn written(wp: &mut UffdWp, r: Region, rearm: bool) -> Result<Option<Vec<PageRange>>> {
    let mut out = Vec::new();
    match wp.scan_written(r.start, r.end(), true, rearm, &mut out) {
        Ok(()) => Ok(Some(out)),
        Err(pagewise_mech::Error::Os { source, .. })
            if source.raw_os_error() == Some(libc::EPERM) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Pages that a run of resets found written every time (a program's
/// stack, its C library's data): left unprotected, they show as written
/// at every walk and are written back at every reset like any other, but
/// cost no protection after it nor a fault in the run. Every
/// [`Hot::FORGET`] resets all are protected again and learnt anew.
#[derive(Debug, Default)]
pub(super) struct Hot {
    /// Page address: the resets in a row that found it written, and the
    /// last of them.
    streak: std::collections::HashMap<u64, (u32, u64)>,
    resets: u64,
}

impl Hot {
    /// Resets in a row a page must be found written to be left unprotected.
    const AFTER: u32 = 4;
    /// Resets after which every page is protected again.
    const FORGET: u64 = 1024;

    /// Starts a reset's bookkeeping: a page the last reset did not find
    /// written has no streak any more.
    fn next_reset(&mut self) {
        self.resets += 1;
        if self.resets.is_multiple_of(Self::FORGET) {
            self.streak.clear();
        } else {
            let last = self.resets - 1;
            self.streak.retain(|_, &mut (_, at)| at == last);
        }
    }

    /// Counts `pages` of `r` (sorted indices) found written, and keeps in
    /// `pages` only those to protect again.
    fn keep_cold(&mut self, r: Region, pages: &mut Vec<usize>) {
        let now = self.resets;
        pages.retain(|&i| {
            let a = r.start + (i * PAGE_SIZE) as u64;
            let (n, at) = self.streak.entry(a).or_insert((0, now));
            *n = if *at + 1 == now {
                n.saturating_add(1)
            } else {
                1
            };
            *at = now;
            *n < Self::AFTER
        });
    }
}

/// Protects pages `pages` (sorted indices) of `r` again: one call per run,
/// or one walk over their span that protects what is written in it
/// (`PAGEMAP_SCAN`) where that is cheaper (a call costs about what a walk
/// of a thousand entries does).
fn protect_again(wp: &mut UffdWp, r: Region, pages: &[usize]) -> Result<()> {
    let (Some(&first), Some(&last)) = (pages.first(), pages.last()) else {
        return Ok(());
    };
    let runs = runs_of(r, pages);
    let span = (last - first + 1) as u64;
    if (runs.len() as u64) * 1000 < span {
        for run in runs {
            wp.protect(run)?;
        }
    } else {
        let start = r.start + (first * PAGE_SIZE) as u64;
        let end = r.start + ((last + 1) * PAGE_SIZE) as u64;
        wp.scan_written(start, end, true, true, &mut Vec::new())?;
    }
    Ok(())
}

/// Sorted page indices of `r` as runs.
fn runs_of(r: Region, pages: &[usize]) -> Vec<Region> {
    let mut out: Vec<Region> = Vec::new();
    for &i in pages {
        let a = r.start + (i * PAGE_SIZE) as u64;
        match out.last_mut() {
            Some(l) if l.end() == a => l.len += PAGE_SIZE as u64,
            _ => out.push(Region {
                start: a,
                len: PAGE_SIZE as u64,
            }),
        }
    }
    out
}
