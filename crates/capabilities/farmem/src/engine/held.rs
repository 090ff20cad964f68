//! The engine's side of the inline path (see [`crate::inline`]):
//! a fault served in the thread that took it, and pages held for the kernel.

use super::Served;
use super::*;

impl Engine {
    /// Whether `addr` is in this engine's books.
    pub(crate) fn knows(&self, addr: u64) -> bool {
        self.locate(addr).is_some()
    }

    /// Serves a user-mode fault at `addr` in the faulting thread; with
    /// `discover`, also a page of a region not in the books yet (an engine
    /// with a [`crate::Discover`] hook only: the kernel would let
    /// any engine of the process map a page registered with another).
    pub(crate) fn serve_inline(&mut self, sh: &Shared, addr: u64, discover: bool) -> Served {
        if !(self.moves.is_empty() && self.adopts.is_empty()) || self.changing_now() {
            return Served::Again;
        }
        // Changes asked for apply before the next fault is served, as on
        // the handler thread.
        match self.apply_changes(sh) {
            Ok(()) => {}
            Err(e) if retry_after_events(&e) => return Served::Again,
            Err(e) => self.fail(&e),
        }
        if self.locate(addr).is_none() {
            if !discover || self.discover.is_none() {
                return Served::NotMine;
            }
            if let Err(e) = self.discover_now() {
                self.fail(&e);
            }
        }
        if self.locate(addr).is_none() {
            // Registered but not (or no longer) emulated: fresh memory,
            // zeros. Not registered with this engine at all: not ours.
            let page = addr & !(PAGE_SIZE as u64 - 1);
            // SAFETY: a page registered with the engine's userfaultfd: the engine's own pages (its regions, registered with its userfaultfd, and their staging slots): memory it emulates for the program as raw memory, which no Rust reference of the engine relies on.
            let zeroed =
                unsafe { pagewise_mech::fault::zero(self.uffd.as_fd(), page, PAGE_SIZE as u64) };
            return match zeroed {
                Ok(_) => Served::Done,
                Err(e) if retry_after_events(&e) => Served::Again,
                Err(_) => Served::NotMine,
            };
        }
        // Counted first: a fetch publishes the counters before it maps the
        // page, and nothing else publishes them on this path.
        let c = &sh.counters;
        c.inline.fetch_add(1, Ordering::Relaxed);
        let fetches = c.fetches.load(Ordering::Relaxed);
        match self.fault(sh, addr, Instant::now()) {
            Ok(()) => {
                if c.fetches.load(Ordering::Relaxed) == fetches {
                    self.publish(sh);
                }
                Served::Done
            }
            Err(e) if retry_after_events(&e) => {
                c.inline.fetch_sub(1, Ordering::Relaxed);
                Served::Again
            }
            // A bus error of the program's own where emulated memory was
            // (see `Engine::pass`).
            Err(e) if super::unregistered(&e) => {
                c.inline.fetch_sub(1, Ordering::Relaxed);
                Served::NotMine
            }
            Err(e) => self.fail(&e),
        }
    }

    /// Whether page `g` is held for the kernel, or lent to the instruction
    /// being served (inline engines only; the caller counted itself in
    /// with [`crate::emulated::evicting`]).
    pub(crate) fn is_held(&self, g: usize) -> bool {
        self.inline && (self.loan.is_lent(g) || crate::emulated::is_held(self.addr_of(g).2))
    }
}
