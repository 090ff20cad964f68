//! The engine's books (where it holds each page: local, parked, remote)
//! audited against the page tables: a debug mode (see
//! [`crate::Hooks::check_books`]) for the randomized tests, which
//! finds a wrong place in the books at the fault it first matters to,
//! instead of as a wrong byte read much later.
//!
//! What must hold, for a page of an emulated region:
//!
//! | books        | region page        | staging page |
//! |--------------|--------------------|--------------|
//! | `Local`      | present or swapped | absent       |
//! | `Parked`     | absent             | present      |
//! | `Remote`     | absent             | present      |
//! | `RemoteZero` | absent             | absent       |
//!
//! (An address the program unmapped stays in the books as zeros; where the
//! engine later maps a staging mapping there, its pages are checked as
//! staging only.)
//!
//! At a fault only the faulting page is checked, and only what no other
//! thread can be changing: its staging page (the engine's alone) and, for
//! a page held local, that it is still mapped (a second thread faulting on
//! the same page finds it mapped) unless an event is pending (judged by
//! the kernel's refusing the zero page the engine maps there, see
//! `local_was_missing`). The whole table is checked only while
//! the program has a single thread, which is then waiting on this fault
//! (or serving it), and no work is waiting on events: nothing else changes
//! the page tables meanwhile. A page the program wrote again after it
//! dropped it (`MADV_DONTNEED`) is outside the books by design (see
//! `Engine::removing_started`): a zero page of a range being removed may
//! be mapped.

use super::*;

/// Steps kept in the debug mode's history.
const HISTORY: usize = 64;

impl Engine {
    /// In the debug mode, notes a step of the engine (a message read, a
    /// deferred fault served, a region adopted): the last [`HISTORY`] are
    /// reported if the engine fails. Otherwise nothing, not even `what`.
    pub(crate) fn note(&mut self, what: impl FnOnce() -> String) {
        if self.check_books == 0 {
            return;
        }
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(what());
    }

    /// Stops the process on `e` (see [`fail`]), after the debug mode's
    /// history of the engine's last steps, oldest first.
    pub(crate) fn fail(&self, e: &Error) -> ! {
        if !self.history.is_empty() {
            let mut s = String::from("pagewise farmem: the engine's last steps, oldest first:\n");
            for h in &self.history {
                s.push_str("  ");
                s.push_str(h);
                s.push('\n');
            }
            let _ = pagewise_sys::process::write_fd(2, s.as_bytes());
        }
        fail(e)
    }

    /// Checks the page `g` a fault is about to be served for; then, every
    /// `check_books` faults, every page.
    pub(crate) fn check_fault(&mut self, g: usize) -> Result<()> {
        let (_, _, addr, staged) = self.addr_of(g);
        let w = self.pages[g];
        let in_staging = self.present(staged)?;
        let want_staged = matches!(w, Where::Remote | Where::Parked);
        if in_staging != want_staged {
            return Err(self.disagree(g, addr, None, Some(in_staging)));
        }
        // (A page held local and found missing is judged once the fault is
        // served, see `local_was_missing`.)
        self.checked_faults += 1;
        if self.checked_faults.is_multiple_of(self.check_books) {
            self.check_all()?;
        }
        Ok(())
    }

    /// Page `g`, held local, was missing at its fault, and the zero page
    /// the engine mapped there went in: no event was pending (the kernel
    /// refuses every mapping call while one is: the books may be stale
    /// then, as when the program unmapped the range and another thread
    /// mapped something there before the engine read of it). Only the
    /// program's dropping the range (`MADV_DONTNEED`) explains that.
    pub(crate) fn local_was_missing(&self, g: usize) -> Result<()> {
        let (_, _, addr, _) = self.addr_of(g);
        if self.removing.iter().any(|&(s, e)| addr >= s && addr < e) {
            return Ok(());
        }
        Err(self.disagree(g, addr, Some(false), Some(false)))
    }

    /// Checks every page of every region, when the program has one thread
    /// and nothing waits on events (see the module docs); otherwise does
    /// nothing.
    pub(crate) fn check_all(&mut self) -> Result<()> {
        if !(self.moves.is_empty() && self.adopts.is_empty() && self.later.is_empty())
            || self.changing_now()
            || program_threads() != Some(1)
        {
            return Ok(());
        }
        // A range the program unmapped stays in the books (as zeros), and
        // the engine may map a staging mapping there later: those pages
        // are checked as staging, never as the program's.
        let stagings: Vec<(u64, u64)> = self.staging.iter().map(|st| st.mapping()).collect();
        let mut mapped = Vec::new();
        let mut staged_runs = Vec::new();
        for ri in 0..self.regions.len() {
            let r = self.regions[ri];
            let stage = self.staging[ri].region();
            // A range the program no longer maps has no page tables to
            // read: its pages must all be zeros in the books.
            let region_ok = self.walker.populated(r, &mut mapped).is_ok();
            self.walker.populated(stage, &mut staged_runs)?;
            let in_runs = |runs: &[(u64, u64)], a: u64| runs.iter().any(|&(x, y)| a >= x && a < y);
            for i in 0..r.pages() as usize {
                let g = self.first[ri] + i;
                let addr = r.start + (i * PAGE_SIZE) as u64;
                let w = self.pages[g];
                let staged = in_runs(&staged_runs, stage.start + (i * PAGE_SIZE) as u64);
                if in_runs(&stagings, addr) {
                    continue;
                }
                let here = region_ok && in_runs(&mapped, addr);
                let removing = self.removing.iter().any(|&(s, e)| addr >= s && addr < e);
                let ok = match w {
                    Where::Local => here && !staged,
                    Where::Parked | Where::Remote => !here && staged,
                    Where::RemoteZero => !staged && (!here || removing),
                };
                let ok = ok || (!region_ok && w == Where::RemoteZero && !staged);
                if !ok {
                    return Err(self.disagree(g, addr, region_ok.then_some(here), Some(staged)));
                }
            }
        }
        Ok(())
    }

    /// The error that stops the program: page `g` at `addr`, its place in
    /// the books, what the page tables say of it and of its staging page.
    fn disagree(&self, g: usize, addr: u64, here: Option<bool>, staged: Option<bool>) -> Error {
        let say = presence;
        Error::BooksWrong {
            addr,
            state: format!(
                "page {g}, {:?}, {:?}: the region page is {}, the staging page {}; fault {} of \
                 this engine",
                self.pages[g],
                self.class[g],
                say(here),
                say(staged),
                self.checked_faults
            ),
        }
    }
}

/// The program's threads (those of this process but the engine's own
/// handler thread), when `/proc/self/status` says.
fn program_threads() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    pagewise_mech::procfs::status_field(&status, "Threads").map(|n| n.saturating_sub(1))
}

/// One line for a message read from the userfaultfd.
pub(crate) fn describe(m: &uffd::UffdMsg) -> String {
    match m.event {
        uffd::event::PAGEFAULT => format!(
            "fault {:#x}{}",
            m.pf_address(),
            if m.pf_flags() & uffd::PAGEFAULT_FLAG_WRITE != 0 {
                " (write)"
            } else {
                ""
            }
        ),
        uffd::event::REMOVE => format!("remove {:#x}..{:#x}", m.arg[0], m.arg[1]),
        uffd::event::UNMAP => format!("unmap {:#x}..{:#x}", m.arg[0], m.arg[1]),
        uffd::event::REMAP => {
            let (from, to, len) = m.remap();
            format!("remap {from:#x} to {to:#x}, {len:#x} bytes")
        }
        e => format!("event {e:#x}"),
    }
}

/// What the page tables say of a page, for the report of a failure.
pub(crate) fn presence(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "present",
        Some(false) => "absent",
        None => "not read",
    }
}
