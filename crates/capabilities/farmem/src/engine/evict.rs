//! Keeping the budget: evicting, parking, and mapping everything back.

use super::*;

impl Engine {
    /// Adds new regions, applies new placements, then evicts until the
    /// budget holds.
    pub(crate) fn fit_budget(&mut self, sh: &Shared) -> Result<()> {
        let adds = std::mem::take(&mut *sh.adds.lock().unwrap_or_else(|e| e.into_inner()));
        for (region, reply) in adds {
            let _ = reply.send(self.add_region(region, false));
        }
        let pauses = std::mem::take(&mut *sh.pauses.lock().unwrap_or_else(|e| e.into_inner()));
        if !pauses.is_empty() {
            sh.paused.store(true, Ordering::Release);
            let r = self.bring_back(sh);
            for reply in pauses {
                let _ = reply.send(match &r {
                    Ok(()) => Ok(()),
                    // The waiter gets the same errno, with the engine's message.
                    Err(e) => Err(Error::os(
                        format!("bringing every page back for a pause ({e})"),
                        std::io::Error::from_raw_os_error(e.errno()),
                    )),
                });
            }
            r?;
        }
        if sh.paused.load(Ordering::Acquire) {
            return Ok(());
        }
        let placed = std::mem::take(&mut *sh.placements.lock().unwrap_or_else(|e| e.into_inner()));
        for (range, placement) in placed {
            let Some((_, first, _)) = self.locate(range.start) else {
                continue;
            };
            for g in first..first + range.pages() as usize {
                let before = self.class[g];
                if before == placement {
                    continue;
                }
                let local = matches!(self.pages[g], Where::Local | Where::Parked);
                if before == Placement::AlwaysRemote {
                    self.visiting.retain(|&v| v != g);
                }
                if local && before == Placement::Normal {
                    // It leaves the budget and the policy.
                    self.policy.removed(g);
                    self.local -= 1;
                }
                self.class[g] = placement;
                if local {
                    match placement {
                        Placement::Normal => {
                            self.local += 1;
                            self.policy.inserted(g);
                        }
                        Placement::AlwaysRemote => {
                            self.evict(sh, g, true)?;
                        }
                        Placement::PinnedLocal => {}
                    }
                }
            }
            sh.counters
                .local
                .store(self.local as u64, Ordering::Relaxed);
        }
        if let Some(target) = self.keep(sh) {
            while self.local as u64 > target.max(self.floor() as u64) {
                match self.evict_victim(sh) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) if retry_after_events(&e) => {
                        // After the pending events: try again then.
                        sh.changed.store(true, Ordering::Release);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Evicts the policy's victim and parks the pages it asks for; returns
    /// whether the victim was written back, `None` when there is no victim.
    pub(crate) fn evict_victim(&mut self, sh: &Shared) -> Result<Option<bool>> {
        // A page held for the kernel is passed over (and goes back to the
        // policy as if just inserted).
        // So is a page another task holds (see `busy`): with no other
        // victim the fault is served over the budget, never waits for a
        // page the kernel pins while it waits for this very fault (a
        // process_vm_readv of the program's own memory).
        let _counted = self.inline.then(crate::emulated::evicting);
        let now = Instant::now();
        self.busy.retain(|&(_, until)| until > now);
        let mut passed = Vec::new();
        let found = loop {
            let v = loop {
                match self.policy.victim() {
                    Some(v) if self.passed_over(v) && passed.len() < self.local => passed.push(v),
                    Some(v) if self.passed_over(v) => {
                        passed.push(v);
                        break None;
                    }
                    v => break v,
                }
            };
            let Some(v) = v else {
                break Ok(None);
            };
            match self.evict(sh, v, false) {
                Ok(d) => break Ok(Some(d)),
                // Held by another task: passed over like a held page.
                Err(_) if self.is_busy(v) && passed.len() < self.local => passed.push(v),
                Err(e) => {
                    // Still local: back into the policy.
                    passed.push(v);
                    break Err(e);
                }
            }
        };
        for p in passed {
            self.policy.inserted(p);
        }
        let Some(dirty) = found? else {
            return Ok(None);
        };
        let mut park = Vec::new();
        self.policy.to_park(&mut park);
        for p in park {
            self.park(sh, p)?;
        }
        Ok(Some(dirty))
    }

    /// Whether eviction passes page `g` over for now: held for the kernel,
    /// lent to an instruction, or held by another task (see `busy`).
    fn passed_over(&self, g: usize) -> bool {
        self.is_held(g) || self.is_busy(g)
    }

    /// Whether a move found page `g` held by another task lately.
    pub(crate) fn is_busy(&self, g: usize) -> bool {
        self.busy.iter().any(|&(b, _)| b == g)
    }

    /// Whether one page sits at `dst` and none at `src`: a move between them
    /// happened. (Racing a write that breaks the zero page's copy-on-write,
    /// `UFFDIO_MOVE` has been seen to move the page and still answer
    /// `EEXIST`; the page tables are the truth.)
    pub(crate) fn moved_anyway(&mut self, dst: u64, src: u64) -> Result<bool> {
        Ok(self.present(dst)? && !self.present(src)?)
    }

    /// Whether a page is mapped at `addr` (never touching it).
    pub(crate) fn present(&mut self, addr: u64) -> Result<bool> {
        let one = Region::new(addr & !(PAGE_SIZE as u64 - 1), PAGE_SIZE as u64)?;
        let mut runs = Vec::new();
        self.walker.populated(one, &mut runs)?;
        Ok(!runs.is_empty())
    }

    /// Moves local page `g` to staging but keeps it local (see [`policy`]).
    pub(crate) fn park(&mut self, sh: &Shared, g: usize) -> Result<()> {
        let _counted = self.inline.then(crate::emulated::evicting);
        if self.pages[g] != Where::Local || self.is_held(g) {
            return Ok(());
        }
        let (_, _, addr, staged) = self.addr_of(g);
        match self.stage_page(addr, staged) {
            Ok(()) => {
                self.put(g, Where::Parked);
                sh.counters.parks.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // Dropped meanwhile (its event is on the way): leave it
            // mapped-or-not; shared with another process, or events
            // pending: leave it local, unparked.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::EBUSY | libc::EAGAIN | libc::EINVAL)
                ) =>
            {
                // (EINVAL: the program made the page's mapping read-only or
                // locked it; see `evict`.)
                Ok(())
            }
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST) && self.moved_anyway(staged, addr)? =>
            {
                self.put(g, Where::Parked);
                sh.counters.parks.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(Error::os(format!("UFFDIO_MOVE of {addr:#x} to staging"), e)),
        }
    }

    /// Evicts local page `g`: one atomic move into staging, so a write
    /// racing it lands before (and moves with the page) or faults after.
    /// Returns whether its contents changed since the fetch (a write-back).
    /// With `patient`, a page another task holds is waited for (up to about
    /// 100 ms, see `move_patiently`); without, it is left at once (and
    /// passed over as a victim for a while).
    pub(crate) fn evict(&mut self, sh: &Shared, g: usize, patient: bool) -> Result<bool> {
        let (_, _, addr, staged) = self.addr_of(g);
        let moved = match self.pages[g] {
            Where::Local => match self.stage_page(addr, staged) {
                Err(e)
                    if e.raw_os_error() == Some(libc::EEXIST)
                        && self.moved_anyway(staged, addr)? =>
                {
                    Ok(())
                }
                r => r,
            },
            // Already in staging.
            Where::Parked => Ok(()),
            _ => return Ok(false),
        };
        let moved = match moved {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                // Shared with another process (after a fork, or merged by
                // KSM): UFFDIO_MOVE moves only pages this process owns
                // alone. A write fault without a write (MADV_POPULATE_WRITE
                // on the mapped page) gives it its own copy; then it moves,
                // patiently: another task may also hold it for a moment (an
                // inspector copying it).
                mem::advise(addr, PAGE_SIZE, mem::MADV_POPULATE_WRITE)
                    .map_err(|e| Error::os(format!("MADV_POPULATE_WRITE of {addr:#x}"), e))?;
                sh.counters.unshared.fetch_add(1, Ordering::Relaxed);
                if patient {
                    move_patiently(
                        self.stage_uffd.as_fd(),
                        staged,
                        addr,
                        PAGE_SIZE as u64,
                        uffd::MOVE_MODE_DONTWAKE,
                    )
                } else {
                    self.stage_page(addr, staged)
                }
            }
            r => r,
        };
        let dirty = match moved {
            Ok(()) => {
                self.put(g, Where::Remote);
                let h = pagewise_mech::hash::page_hash(staged_page(staged));
                let dirty = h != self.fetched[g];
                self.fetched[g] = h;
                self.fp_known[g] = true;
                dirty
            }
            // Not mapped (dropped between the event and the zap): zeros.
            // (ENOENT also means that staging is not mapped any more: the
            // page is still there then, and must not be taken for zeros.)
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                if self.present(addr)? {
                    return Err(Error::Internal {
                        what: "a page to evict has no staging page mapped",
                        addr,
                    });
                }
                self.put(g, Where::RemoteZero);
                false
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                // Held by another task for longer than a moment: later,
                // after the events, as for any move that must wait; and
                // passed over as a victim meanwhile.
                self.busy
                    .push((g, Instant::now() + std::time::Duration::from_millis(50)));
                return Err(Error::os(
                    format!("evicting {addr:#x}, held by another task"),
                    std::io::Error::from_raw_os_error(libc::EAGAIN),
                ));
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && self.pages[g] == Where::Local => {
                // The program made the page's mapping read-only or locked it
                // (mprotect, mlock): a move goes only between mappings alike,
                // and the page stays local, passed over as a victim for a
                // while (the budget is exceeded meanwhile, as the summary
                // says).
                self.busy
                    .push((g, Instant::now() + std::time::Duration::from_secs(1)));
                return Err(Error::os(
                    format!("evicting {addr:#x}, whose mapping is read-only or locked"),
                    e,
                ));
            }
            Err(e) => return Err(Error::os(format!("UFFDIO_MOVE of {addr:#x} to staging"), e)),
        };
        if self.class[g] == Placement::Normal {
            self.local -= 1;
        }
        let c = &sh.counters;
        c.local.store(self.local as u64, Ordering::Relaxed);
        c.evictions.fetch_add(1, Ordering::Relaxed);
        if dirty {
            c.writebacks.fetch_add(1, Ordering::Relaxed);
        }
        sh.record(
            addr,
            if dirty {
                TraceKind::Writeback
            } else {
                TraceKind::Evict
            },
            0,
        );
        Ok(dirty)
    }

    /// Maps every remote page back, as local pages (over the budget).
    pub(crate) fn bring_back(&mut self, sh: &Shared) -> Result<()> {
        for g in 0..self.pages.len() {
            match self.pages[g] {
                Where::Remote => {
                    self.map(Where::Remote, g)?;
                    self.put(g, Where::Local);
                    if self.class[g] == Placement::Normal {
                        self.local += 1;
                        self.policy.inserted(g);
                    } else if self.class[g] == Placement::AlwaysRemote {
                        self.visiting.push(g);
                    }
                }
                Where::Parked => {
                    self.map(Where::Remote, g)?;
                    self.put(g, Where::Local);
                }
                _ => {}
            }
        }
        sh.counters
            .local
            .store(self.local as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Maps every remote page back and unregisters the regions.
    pub(crate) fn bring_all_back(&mut self) -> Result<()> {
        for g in 0..self.pages.len() {
            if matches!(self.pages[g], Where::Remote | Where::Parked) {
                self.map(Where::Remote, g)?;
                self.put(g, Where::Local);
            }
        }
        for (r, st) in self.regions.iter().zip(&self.staging) {
            // A range the program unmapped is not registered any more.
            let _ = uffd::unregister(self.uffd.as_fd(), r.start, r.len);
            let _ = uffd::unregister(self.stage_uffd.as_fd(), st.addr(), r.len);
        }
        Ok(())
    }
}
