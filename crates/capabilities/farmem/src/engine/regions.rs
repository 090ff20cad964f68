//! The engine's regions: adding them, adopting what the program maps,
//! following `mremap`, forgetting what it drops.

use super::*;

impl Engine {
    /// Starts emulating `r` (mapped, writable, private anonymous, overlapping
    /// no emulated region), also while other threads use it: it is registered
    /// first, then its populated pages are moved to staging, each move atomic
    /// against a racing write. Its pages get the next global indices.
    ///
    /// `found`: the program registered `r` itself (the preload shim does,
    /// before the program gets the address back). A failed add then leaves
    /// that registration as it was: `r` may by now be part of a larger
    /// mapping (grown in place by `mremap`, merged with a neighbour), and
    /// unregistering `r` alone would split that mapping, so that the
    /// program's next `mremap` of its whole buffer spans two mappings and
    /// fails with `EFAULT`. A fault there meanwhile is served as fresh memory
    /// (see `zero_unknown`): nothing of `r` reached staging.
    pub(crate) fn add_region(&mut self, r: Region, found: bool) -> Result<()> {
        self.check_disjoint(r)?;
        let reg = |fd: &OwnedFd, start: u64, len: u64| {
            uffd::register(fd.as_fd(), start, len, uffd::REGISTER_MODE_MISSING)
                .map_err(|e| Error::os(format!("UFFDIO_REGISTER of {start:#x}+{len:#x}"), e))
        };
        reg(&self.uffd, r.start, r.len)?;
        let st = match self.new_staging(r) {
            Ok(st) => st,
            Err(e) => {
                if !found {
                    let _ = uffd::unregister(self.uffd.as_fd(), r.start, r.len);
                }
                return Err(e);
            }
        };
        // A move stays inside one mapping, and the program may have split
        // the range into several (by madvise(MADV_HUGEPAGE), say): moves go
        // one mapping at a time.
        let pieces: Vec<(u64, u64)> = match pagewise_mech::procfs::maps(None) {
            Ok(maps) => maps
                .iter()
                .filter(|m| m.start < r.end() && r.start < m.end)
                .map(|m| (m.start.max(r.start), m.end.min(r.end())))
                .collect(),
            Err(_) => vec![(r.start, r.end())],
        };
        // Every populated page becomes remote now: moved to staging. (A
        // piece the program made read-only or locked cannot be moved, see
        // `put_back`: its pages stay local.)
        let mut failed = None;
        let mut unlike = Vec::new();
        for (k, &(a, b)) in pieces.iter().enumerate() {
            // SAFETY: a piece of a region the engine takes, and its staging: the engine's own pages (its regions, registered with its userfaultfd, and their staging slots): memory it emulates for the program as raw memory, which no Rust reference of the engine relies on.
            let moved = unsafe {
                uffd::move_pages(
                    self.stage_uffd.as_fd(),
                    st.addr() + (a - r.start),
                    a,
                    b - a,
                    uffd::MOVE_MODE_DONTWAKE | uffd::MOVE_MODE_ALLOW_SRC_HOLES,
                )
            };
            if let Err(e) = moved {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    unlike.push((a, b));
                    continue;
                }
                failed = Some((
                    k,
                    Error::os(
                        format!("UFFDIO_MOVE of {:#x}+{:#x} to staging", a, b - a),
                        e,
                    ),
                ));
                break;
            }
        }
        // What is in staging now is what the region held.
        let stage = st.region();
        let mut runs = Vec::new();
        self.walker.populated(stage, &mut runs)?;
        if let Some((k, err)) = failed {
            // A move can stop part-way (a page shared or held by another
            // task, the program changing its mappings meanwhile). Pages
            // that reached staging are never moved back: that move could
            // itself fail (under an event not read yet) and lose them.
            // They stay remote, in the books; the pieces not moved are
            // adopted again after the events, their pages reclaimed then.
            if runs.is_empty() && unlike.is_empty() {
                let _ = uffd::unregister(self.stage_uffd.as_fd(), st.addr(), r.len);
                if !found {
                    let _ = uffd::unregister(self.uffd.as_fd(), r.start, r.len);
                }
                return Err(err);
            }
            for &(a, b) in &pieces[k..] {
                self.adopts.push(Region::new(a, b - a)?);
            }
        }
        let slot = self.push_region(r, st);
        for &(a, b) in &runs {
            let i0 = ((a - stage.start) / PAGE_SIZE as u64) as usize;
            let i1 = ((b - stage.start) / PAGE_SIZE as u64) as usize;
            for i in i0..i1 {
                self.put(self.first[slot] + i, Where::Remote);
            }
        }
        for (a, b) in unlike {
            let mut here = Vec::new();
            self.walker.populated(Region::new(a, b - a)?, &mut here)?;
            for (x, y) in here {
                let i0 = ((x - r.start) / PAGE_SIZE as u64) as usize;
                let i1 = ((y - r.start) / PAGE_SIZE as u64) as usize;
                for i in i0..i1 {
                    self.keep_local(self.first[slot] + i);
                }
            }
        }
        Ok(())
    }

    /// Books page `g`, mapped in the program's memory and never fetched
    /// (its mapping, read-only or locked, would not let it move), as local;
    /// its first eviction writes it back.
    fn keep_local(&mut self, g: usize) {
        self.put(g, Where::Local);
        self.fetched[g] = 0;
        self.fp_known[g] = false;
        self.count_local(g);
    }

    /// Counts page `g`, just booked local, as its placement says: against
    /// the budget and in the policy, among the always-remote pages to send
    /// back, or not at all (pinned local).
    fn count_local(&mut self, g: usize) {
        match self.class[g] {
            Placement::Normal => {
                self.local += 1;
                self.policy.inserted(g);
            }
            Placement::AlwaysRemote => self.visiting.push(g),
            Placement::PinnedLocal => {}
        }
    }

    /// Fails when `r` overlaps an emulated region.
    pub(crate) fn check_disjoint(&self, r: Region) -> Result<()> {
        if self
            .regions
            .iter()
            .any(|e| e.start < r.end() && r.start < e.end())
        {
            return Err(Error::Overlaps {
                start: r.start,
                len: r.len,
            });
        }
        Ok(())
    }

    /// A staging mapping for region `r`, registered with the staging
    /// userfaultfd. It holds only the remote pages: reserved, not committed;
    /// named, so that an inspector can tell it from the program's memory.
    pub(crate) fn new_staging(&self, r: Region) -> Result<AnonMemory> {
        let st = AnonMemory::reserve(r.len as usize)?;
        let _ = mem::name_anon(st.addr(), st.len(), pagewise_mech::procfs::STAGING_NAME);
        uffd::register(
            self.stage_uffd.as_fd(),
            st.addr(),
            r.len,
            uffd::REGISTER_MODE_MISSING,
        )
        .map_err(|e| {
            Error::os(
                format!("UFFDIO_REGISTER of staging for {:#x}+{:#x}", r.start, r.len),
                e,
            )
        })?;
        Ok(st)
    }

    /// Enters region `r` with its staging into the books, every page
    /// remote and zero; returns its slot.
    pub(crate) fn push_region(&mut self, r: Region, st: AnonMemory) -> usize {
        let slot = self.regions.len();
        self.first.push(self.pages.len());
        self.pages
            .resize(self.pages.len() + r.pages() as usize, Where::RemoteZero);
        self.fetched.resize(self.pages.len(), 0);
        self.fp_known.resize(self.pages.len(), false);
        self.class.resize(self.pages.len(), Placement::Normal);
        if self.inline {
            crate::emulated::mark(r.start, r.len);
        }
        self.regions.push(r);
        self.staging.push(st);
        let at = self
            .order
            .partition_point(|&i| self.regions[i].start < r.start);
        self.order.insert(at, slot);
        slot
    }

    /// Makes sure every page of `[start, end)` has a place in the books:
    /// the parts no region covers become regions (already registered: the
    /// program's range is, where this is used), with empty staging.
    pub(crate) fn cover(&mut self, start: u64, end: u64) -> Result<()> {
        let known: Vec<(u64, u64)> = self
            .order
            .iter()
            .map(|&i| self.regions[i])
            .filter(|k| k.start < end && start < k.end())
            .map(|k| (k.start.max(start), k.end().min(end)))
            .collect();
        let mut cur = start;
        for (a, b) in known.into_iter().chain([(end, end)]) {
            if cur < a {
                for r in self.carve(Region::new(cur, a - cur)?) {
                    let st = self.new_staging(r)?;
                    self.push_region(r, st);
                }
            }
            cur = cur.max(b);
        }
        Ok(())
    }

    /// Asks the [`Discover`] hook for new regions and emulates them.
    pub(crate) fn discover_now(&mut self) -> Result<()> {
        let Some(d) = self.discover.as_mut() else {
            return Ok(());
        };
        let mut found = Vec::new();
        d(&mut found);
        if self.changing_now() {
            self.adopts.extend(found);
            return Ok(());
        }
        for r in found {
            self.note(|| format!("adopt {:#x}..{:#x}", r.start, r.end()));
            self.adopt(r)?;
        }
        Ok(())
    }

    /// Emulates `r` (which the program just mapped or moved): the parts no
    /// region covers become new regions; in the parts one covers, pages
    /// that hold data the engine does not know of become remote.
    pub(crate) fn adopt(&mut self, r: Region) -> Result<()> {
        for piece in self.carve(r) {
            self.adopt_piece(piece)?;
        }
        Ok(())
    }

    /// [`Engine::adopt`] of a range holding none of the engine's own pages.
    pub(crate) fn adopt_piece(&mut self, r: Region) -> Result<()> {
        let end = r.end();
        let known: Vec<(u64, u64)> = self
            .order
            .iter()
            .map(|&i| self.regions[i])
            .filter(|k| k.start < end && r.start < k.end())
            .map(|k| (k.start.max(r.start), k.end().min(end)))
            .collect();
        let mut cur = r.start;
        for (a, b) in known {
            if cur < a {
                self.add_found(cur, a);
            }
            self.reclaim(a, b)?;
            cur = b;
        }
        if cur < end {
            self.add_found(cur, end);
        }
        Ok(())
    }

    /// The parts of `r` outside the excluded pages and the engine's own
    /// staging mappings. (A range the program mapped and then moved or
    /// unmapped before the engine read of it may hold staging by then: the
    /// engine must never take its own pages for the program's.)
    pub(crate) fn carve(&self, r: Region) -> Vec<Region> {
        let mut out_of_bounds: Vec<pagewise_mech::region::PageRange> = self
            .staging
            .iter()
            .map(|st| st.mapping())
            .filter(|&(a, b)| a < r.end() && r.start < b)
            .map(|(a, b)| pagewise_mech::region::PageRange {
                start: a,
                pages: (b - a) / PAGE_SIZE as u64,
            })
            .collect();
        if self.excluded.is_empty() && out_of_bounds.is_empty() {
            return vec![r];
        }
        out_of_bounds.extend(self.excluded.iter().copied());
        out_of_bounds.sort_by_key(|p| p.start);
        let whole = [pagewise_mech::region::PageRange {
            start: r.start,
            pages: r.pages(),
        }];
        pagewise_mech::region::subtract_sorted(&whole, &out_of_bounds)
            .into_iter()
            .filter_map(|p| Region::new(p.start, p.len()).ok())
            .collect()
    }

    /// Adds `[a, b)`, found by discovery; a range gone again meanwhile (its
    /// registration fails) is skipped.
    pub(crate) fn add_found(&mut self, a: u64, b: u64) {
        let Ok(whole) = Region::new(a, b - a) else {
            return;
        };
        for r in self.carve(whole) {
            match self.add_region(r, true) {
                Ok(()) => {}
                Err(e) if retry_after_events(&e) => self.adopts.push(r),
                Err(e) => {
                    // Found late, the range may be gone in part or in whole
                    // (a heap the C library trimmed, a mapping unmapped
                    // since): what is still private anonymous writable
                    // memory is emulated, the rest was the program's to drop.
                    let live = live_pieces(r);
                    if live == [r] {
                        eprintln!(
                            "pagewise farmem: not emulating {:#x}..{:#x}: {e}",
                            r.start,
                            r.end()
                        );
                        continue;
                    }
                    for piece in live {
                        self.add_found(piece.start, piece.end());
                    }
                }
            }
        }
    }

    /// Pages of `[a, b)` (inside a region) that the engine holds as zeros
    /// but that are mapped (the range was mapped anew): moved to staging.
    pub(crate) fn reclaim(&mut self, a: u64, b: u64) -> Result<()> {
        let Ok(r) = Region::new(a, b - a) else {
            return Ok(());
        };
        self.forget_finished_removes()?;
        let mut runs = Vec::new();
        self.walker.populated(r, &mut runs)?;
        for (x, y) in runs {
            let mut addr = x;
            while addr < y {
                // A page the program is dropping (madvise) may still be
                // there: taken now it would outlive the drop.
                let dropping = self.removing.iter().any(|&(s, e)| addr >= s && addr < e);
                if dropping {
                    addr += PAGE_SIZE as u64;
                    continue;
                }
                if let Some((_, g, _)) = self.locate(addr) {
                    if self.pages[g] == Where::RemoteZero {
                        let (_, _, _, staged) = self.addr_of(g);
                        // No holes allowed: a page gone since the walk
                        // (ENOENT) must not be taken for one in staging.
                        match self.stage_page(addr, staged) {
                            Ok(()) => self.put(g, Where::Remote),
                            // Shared with another process: left where it is;
                            // gone meanwhile: zeros, as the books say.
                            Err(e)
                                if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOENT)) => {
                            }
                            // Read-only or locked (see `put_back`): local.
                            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.keep_local(g),
                            Err(e) => {
                                return Err(Error::os(
                                    format!("UFFDIO_MOVE of {addr:#x} to staging"),
                                    e,
                                ))
                            }
                        }
                    }
                }
                addr += PAGE_SIZE as u64;
            }
        }
        Ok(())
    }

    /// `madvise` sends its remove event before it drops the pages, and the
    /// program's thread drops them after the engine has read the event: a
    /// removed range stays in [`Engine::removing`] until none of its pages
    /// is there any more (the drop is done), or until 64 newer ones push it
    /// out. (A page the program writes again meanwhile is left where it is,
    /// outside the books: never lost, only not emulated.)
    pub(crate) fn removing_started(&mut self, start: u64, end: u64) {
        if self.removing.len() >= 64 {
            self.removing.remove(0);
        }
        self.removing.push((start, end));
    }

    fn forget_finished_removes(&mut self) -> Result<()> {
        let mut keep = Vec::new();
        for (s, e) in std::mem::take(&mut self.removing) {
            let Ok(r) = Region::new(s, e - s) else {
                continue;
            };
            let mut runs = Vec::new();
            // A range no longer mapped is done with.
            if self.walker.populated(r, &mut runs).is_ok() && !runs.is_empty() {
                keep.push((s, e));
            }
        }
        self.removing = keep;
        Ok(())
    }

    /// The program moved `[from, from+len)` to `to` (`mremap`; the pages
    /// the kernel held moved with the mapping). The books follow at once,
    /// before the program can move the range again: local pages stay local
    /// at their new address, remote ones move from their staging slot to
    /// the new address's (staging is the engine's alone, so this never
    /// races the program). Then the new range is adopted like a new mapping,
    /// for pages of it the engine did not emulate before.
    pub(crate) fn remapped(&mut self, sh: &Shared, from: u64, to: u64, len: u64) -> Result<()> {
        // Staged pages still on their way to a range that moves now go
        // where it goes.
        for m in self.moves.iter_mut() {
            if m.1 >= from && m.1 < from + len {
                m.1 = m.1 - from + to;
            }
        }
        self.cover(to, to + len)?;
        let mut off = 0;
        while off < len {
            let src = self.locate(from + off);
            let dst = self.locate(to + off).map(|(_, g, _)| g);
            let Some((_, g, _)) = src else {
                off += PAGE_SIZE as u64;
                continue;
            };
            let w = self.pages[g];
            if matches!(w, Where::Local | Where::Parked) {
                if self.class[g] == Placement::Normal {
                    self.policy.removed(g);
                    self.local -= 1;
                }
                self.visiting.retain(|&v| v != g);
            }
            let (_, _, _, staged) = self.addr_of(g);
            match (w, dst) {
                (Where::RemoteZero, _) => {}
                (Where::Local, Some(d)) => {
                    self.put(d, Where::Local);
                    self.fetched[d] = self.fetched[g];
                    self.count_local(d);
                }
                // Moved by the kernel; adopted below.
                (Where::Local, None) => {}
                (Where::Remote | Where::Parked, Some(d)) => {
                    let (_, _, _, to_staged) = self.addr_of(d);
                    move_patiently(
                        self.stage_uffd.as_fd(),
                        to_staged,
                        staged,
                        PAGE_SIZE as u64,
                        uffd::MOVE_MODE_DONTWAKE,
                    )
                    .map_err(|e| {
                        Error::os(
                            format!(
                                "UFFDIO_MOVE of the staged page of {:#x} to that of {:#x} after mremap",
                                from + off,
                                to + off
                            ),
                            e,
                        )
                    })?;
                    self.fetched[d] = self.fetched[g];
                    self.fp_known[d] = self.fp_known[g];
                    self.put(d, Where::Remote);
                }
                (Where::Remote | Where::Parked, None) => {
                    // An address the engine never emulates: the page goes
                    // back into the program's range once the events are read.
                    self.moves.push((staged, to + off));
                }
            }
            self.put(g, Where::RemoteZero);
            off += PAGE_SIZE as u64;
        }
        sh.counters
            .local
            .store(self.local as u64, Ordering::Relaxed);
        self.adopts.push(Region::new(to, len)?);
        Ok(())
    }

    /// The program dropped (`MADV_DONTNEED`) or unmapped `[start, end)`:
    /// its pages read as zeros from now on.
    pub(crate) fn dropped(&mut self, sh: &Shared, start: u64, end: u64) -> Result<()> {
        // A staged page still on its way to the dropped range must not
        // arrive after the drop: it is dropped with it.
        let mut gone = Vec::new();
        self.moves.retain(|&(src, dst)| {
            let hit = dst >= start && dst < end;
            if hit {
                gone.push(src);
            }
            !hit
        });
        for staged in gone {
            // SAFETY: a staging page of this engine, which no one else uses;
            // its userfaultfd asks for no events.
            unsafe { mem::madvise(staged, PAGE_SIZE, libc::MADV_DONTNEED) }
                .map_err(|e| Error::os(format!("MADV_DONTNEED of {staged:#x}"), e))?;
        }
        let mut addr = start & !(PAGE_SIZE as u64 - 1);
        while addr < end {
            let Some((_, g, _)) = self.locate(addr) else {
                addr += PAGE_SIZE as u64;
                continue;
            };
            if matches!(self.pages[g], Where::Local | Where::Parked) {
                if self.class[g] == Placement::Normal {
                    self.policy.removed(g);
                    self.local -= 1;
                }
                self.visiting.retain(|&v| v != g);
            }
            match self.pages[g] {
                Where::Local => {}
                Where::Remote | Where::Parked => {
                    let (_, _, _, staged) = self.addr_of(g);
                    // SAFETY: a staging page of this engine, which no one else
                    // uses; its userfaultfd asks for no events.
                    unsafe { mem::madvise(staged, PAGE_SIZE, libc::MADV_DONTNEED) }
                        .map_err(|e| Error::os(format!("MADV_DONTNEED of {staged:#x}"), e))?;
                }
                Where::RemoteZero => {}
            }
            self.put(g, Where::RemoteZero);
            addr += PAGE_SIZE as u64;
        }
        sh.counters
            .local
            .store(self.local as u64, Ordering::Relaxed);
        Ok(())
    }
}
