//! Serving one fault: the page the books hold local, parked, pinned local
//! or remote, each a phase of its own; a fetch makes room, pays the link,
//! then maps the page.

use super::*;

impl Engine {
    /// Serves a fault at `addr` that arrived at `arrived` (on the handler
    /// thread, or inline in the faulting thread).
    pub(crate) fn fault(&mut self, sh: &Shared, addr: u64, arrived: Instant) -> Result<()> {
        let site = self.fault_site.take();
        if self.locate(addr).is_none() {
            self.discover_now()?;
        }
        let Some((_, g, _)) = self.locate(addr) else {
            return self.zero_unknown(addr);
        };
        if self.check_books > 0 {
            let w = self.pages[g];
            self.note(|| match site {
                Some((tid, ip)) => {
                    format!("fault {addr:#x} in thread {tid} at {ip:#x}: page {g} {w:?}")
                }
                None => format!("  page {g} {w:?}"),
            });
            self.check_fault(g)?;
        }
        match self.pages[g] {
            Where::Local => self.fault_on_local(g, addr),
            Where::Parked => self.soft_fault(sh, g),
            _ if self.class[g] == Placement::PinnedLocal => {
                // Local by placement: mapped at once, not a fetch.
                let was = self.pages[g];
                self.put(g, Where::Local);
                match self.map(was, g) {
                    Err(e) if unregistered(&e) => {
                        self.put(g, was);
                        self.pass(addr, e)
                    }
                    r => r,
                }
            }
            _ => self.fetch(sh, g, addr, arrived, site),
        }
    }

    /// A fault on memory registered but not (or no longer) emulated: fresh
    /// memory, zeros; a wake-up if mapped meanwhile.
    fn zero_unknown(&self, addr: u64) -> Result<()> {
        let page = addr & !(PAGE_SIZE as u64 - 1);
        // SAFETY: a page registered with the engine's userfaultfd: the engine's own pages (its regions, registered with its userfaultfd, and their staging slots): memory it emulates for the program as raw memory, which no Rust reference of the engine relies on.
        match unsafe { pagewise_mech::fault::zero(self.uffd.as_fd(), page, PAGE_SIZE as u64) } {
            Ok(_) => Ok(()),
            Err(e) if retry_after_events(&e) => Err(e.into()),
            // Unregistered meanwhile: whoever waits only needs waking.
            Err(_) => uffd::wake(self.uffd.as_fd(), page, PAGE_SIZE as u64)
                .map_err(|e| Error::os("UFFDIO_WAKE", e)),
        }
    }

    /// A fault on page `g`, held local: mapped already (two threads faulted
    /// on it), or dropped behind the engine's back: zeros then, and a
    /// wake-up either way.
    fn fault_on_local(&mut self, g: usize, addr: u64) -> Result<()> {
        let missing = self.check_books > 0 && !self.present(addr)?;
        let r = self.map(Where::RemoteZero, g);
        if missing && r.is_ok() {
            self.local_was_missing(g)?;
        }
        match r {
            Err(e) if unregistered(&e) => self.pass(addr, e),
            r => r,
        }
    }

    /// A soft fault on parked page `g`: the page is local, its policy learns
    /// it was used. Book-keeping first (the move wakes the faulting thread,
    /// which may look at the counters at once); undone if the move must
    /// wait for pending events, so the page is still parked when the fault
    /// is served again.
    fn soft_fault(&mut self, sh: &Shared, g: usize) -> Result<()> {
        let (_, _, addr, staged) = self.addr_of(g);
        self.put(g, Where::Local);
        sh.counters.soft.fetch_add(1, Ordering::Relaxed);
        match put_back(self.uffd.as_fd(), addr, staged, 0, false) {
            Ok(()) => {}
            // Moved all the same (see `moved_anyway`): only the wake-up is
            // left.
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST) && self.moved_anyway(addr, staged)? =>
            {
                uffd::wake(self.uffd.as_fd(), addr, PAGE_SIZE as u64)
                    .map_err(|e| Error::os("UFFDIO_WAKE", e))?;
            }
            Err(e) => {
                self.put(g, Where::Parked);
                sh.counters.soft.fetch_sub(1, Ordering::Relaxed);
                let (here, there) = (self.present(addr), self.present(staged));
                return Err(Error::os(
                    format!(
                        "UFFDIO_MOVE of {staged:#x} back to {addr:#x} (page {g} parked; \
                         the region page is {}, the staging page {})",
                        page_audit::presence(here.ok()),
                        page_audit::presence(there.ok())
                    ),
                    e,
                ));
            }
        }
        sh.record(addr, TraceKind::Soft, 0);
        self.policy.accessed(g);
        Ok(())
    }

    /// Fetches remote page `g` for the fault at `addr`: room made, the
    /// link paid, the page mapped (undone if it must wait for events).
    fn fetch(
        &mut self,
        sh: &Shared,
        g: usize,
        addr: u64,
        arrived: Instant,
        site: Option<(i32, u64)>,
    ) -> Result<()> {
        let cfg = *sh.config.lock().unwrap_or_else(|e| e.into_inner());
        let c = &sh.counters;
        let class = self.class[g];
        if self.loan.before_fault(site, g) {
            c.lent.fetch_add(1, Ordering::Relaxed);
        }
        let mut writeback_bytes = self.send_back_visited(sh)?;
        let (room, evicted) = self.make_room(sh, &cfg, class)?;
        writeback_bytes += evicted;
        // Counted once room is made: a fault that must wait for pending
        // events is served (and counted) again later.
        c.faults.fetch_add(1, Ordering::Relaxed);
        c.fetches.fetch_add(1, Ordering::Relaxed);
        let waited_ns = self.pay_link(sh, &cfg, arrived, writeback_bytes);
        // Book-keeping first: mapping the page wakes the faulting thread,
        // which may look at the counters at once.
        let was = self.pages[g];
        sh.record(self.addr_of(g).2, TraceKind::Fetch, waited_ns);
        self.put(g, Where::Local);
        if class == Placement::AlwaysRemote {
            self.visiting.push(g);
        } else {
            self.local += 1;
            c.local.store(self.local as u64, Ordering::Relaxed);
            self.policy.inserted(g);
        }
        if !self.inline {
            c.handled
                .fetch_add(arrived.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        // Published before the page is mapped: the woken thread may exit at
        // once, taking this thread with it.
        self.publish(sh);
        let r = self.map(was, g);
        if self.inline {
            // In the faulting thread the mapping's own cost (a move, a copy)
            // is seen too: what it added beyond the wait comes off the next
            // wait. (On the handler thread the mapping wakes the faulting
            // thread, whose wake-up is the unseen part.)
            self.injector.mapped(arrived);
            c.handled
                .fetch_add(arrived.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        if r.is_ok() {
            self.loan.fetched(g);
            // This page is one more against the budget (an always-remote
            // page is not counted).
            let local = room.0 + u64::from(class == Placement::Normal);
            c.overshoot
                .fetch_max(local.saturating_sub(room.1), Ordering::Relaxed);
        }
        if r.as_ref()
            .is_err_and(|e| retry_after_events(e) || unregistered(e))
        {
            // Not mapped: undone, to be served again after the events (or
            // not the engine's, see `pass`).
            self.put(g, was);
            if class == Placement::AlwaysRemote {
                self.visiting.retain(|&v| v != g);
            } else {
                self.local -= 1;
                c.local.store(self.local as u64, Ordering::Relaxed);
                self.policy.removed(g);
            }
        }
        match r {
            Err(e) if unregistered(&e) => self.pass(addr, e),
            r => r,
        }
    }

    /// Sends back the always-remote pages visited since the last fault
    /// (those not sent back stay listed, also when one must wait); returns
    /// the bytes written back.
    fn send_back_visited(&mut self, sh: &Shared) -> Result<u64> {
        let _counted = self.inline.then(crate::emulated::evicting);
        let mut writeback_bytes = 0;
        let mut visited = std::mem::take(&mut self.visiting).into_iter();
        while let Some(v) = visited.next() {
            if self.is_held(v) || self.is_busy(v) {
                self.visiting.push(v);
                continue;
            }
            match self.evict(sh, v, true) {
                Ok(dirty) => writeback_bytes += if dirty { PAGE_SIZE as u64 } else { 0 },
                // Passed over for now (see `Engine::evict`).
                Err(_) if self.is_busy(v) => self.visiting.push(v),
                Err(e) => {
                    self.visiting.push(v);
                    self.visiting.extend(visited);
                    return Err(e);
                }
            }
        }
        Ok(writeback_bytes)
    }

    /// Evicts until a page of placement `class` fits the budget (or no
    /// victim is left); returns the local pages and the budget as of the
    /// last eviction, and the bytes written back.
    fn make_room(
        &mut self,
        sh: &Shared,
        cfg: &Config,
        class: Placement,
    ) -> Result<((u64, u64), u64)> {
        let floor = self.floor();
        let mut writeback_bytes = 0;
        let (local, budget, _) = self.load(cfg);
        let mut room = (local, budget);
        while class == Placement::Normal
            && !sh.paused.load(Ordering::Relaxed)
            && room.0 >= room.1
            && self.local >= floor
        {
            match self.evict_victim(sh)? {
                None => break,
                Some(true) => writeback_bytes += PAGE_SIZE as u64,
                Some(false) => {}
            }
            let (local, budget, _) = self.load(cfg);
            room = (local, budget);
        }
        Ok((room, writeback_bytes))
    }

    /// Books the fetch (and its write-backs) on the modelled link and waits
    /// until it is due; counts the modelled and injected delay.
    /// Books the fetch on the link and waits for it; how long the fault
    /// has taken so far (room made, the link's wait), ns.
    fn pay_link(
        &mut self,
        sh: &Shared,
        cfg: &Config,
        arrived: Instant,
        writeback_bytes: u64,
    ) -> u64 {
        let c = &sh.counters;
        let due = self
            .link
            .book(&cfg.link, arrived, PAGE_SIZE as u64, writeback_bytes);
        c.modelled.fetch_add(
            due.duration_since(arrived).as_nanos() as u64,
            Ordering::Relaxed,
        );
        let waited = self.injector.wait(arrived, due);
        c.injected.fetch_add(waited, Ordering::Relaxed);
        let bucket = (64 - waited.leading_zeros() as usize).saturating_sub(1);
        c.hist[bucket.min(HIST_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        arrived.elapsed().as_nanos() as u64
    }

    /// Maps page `g`, whose contents were `was`, into its region (this wakes
    /// the faulting threads) and notes its fingerprint.
    pub(crate) fn map(&mut self, was: Where, g: usize) -> Result<()> {
        let (_, _, addr, staged) = self.addr_of(g);
        self.fetched[g] = match was {
            Where::Remote if self.fp_known[g] => self.fetched[g],
            Where::Remote => self.staged_hash(staged)?,
            _ => pagewise_mech::hash::zero_page_hash(),
        };
        // SAFETY: a page of a region and its staging slot: the engine's own pages (its regions, registered with its userfaultfd, and their staging slots): memory it emulates for the program as raw memory, which no Rust reference of the engine relies on.
        let r = unsafe {
            match was {
                Where::Remote => put_back(self.uffd.as_fd(), addr, staged, 0, true),
                _ if self.write_fault => {
                    uffd::copy(self.uffd.as_fd(), addr, self.zeros.addr(), PAGE_SIZE as u64)
                }
                _ => uffd::zeropage(self.uffd.as_fd(), addr, PAGE_SIZE as u64),
            }
        };
        match r {
            Ok(()) => Ok(()),
            // Mapped meanwhile: only waking is left.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                uffd::wake(self.uffd.as_fd(), addr, PAGE_SIZE as u64)
                    .map_err(|e| Error::os("UFFDIO_WAKE", e))
            }
            // No mapping registered with the engine there now: the program
            // unmapped the range since the fault (its event not read yet),
            // or mapped something the engine does not emulate where
            // emulated memory was (a file past its end raises SIGBUS too).
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL))
                    && !registered_here(addr) =>
            {
                Err(Error::os(
                    format!("mapping page {addr:#x}: no mapping registered with the engine there"),
                    std::io::Error::from_raw_os_error(libc::ENOENT),
                ))
            }
            Err(e) => Err(Error::os(format!("mapping page {addr:#x}"), e)),
        }
    }

    /// The fault at `addr` met [`unregistered`]: not the engine's to serve.
    /// On the handler thread the faulting thread is woken to fault again
    /// on whatever is there now; inline the error goes back to the signal
    /// handler, which hands the signal to the program.
    fn pass(&self, addr: u64, e: Error) -> Result<()> {
        if self.inline {
            return Err(e);
        }
        let page = addr & !(PAGE_SIZE as u64 - 1);
        uffd::wake(self.uffd.as_fd(), page, PAGE_SIZE as u64)
            .map_err(|e| Error::os("UFFDIO_WAKE", e))
    }
}
