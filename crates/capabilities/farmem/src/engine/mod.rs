//! The fault engine: the handler thread's state and its loop (see the
//! module docs of [`crate`] for what it does).

mod cell;
mod coverage;
mod evict;
mod fault;
mod held;
mod page_audit;
mod regions;

use super::*;
use crate::emulated;
use crate::{Error, Result};
pub(crate) use cell::{wait_for_steps, Cell, Served};
use link::{Injector, Link, LinkConfig};
use pagewise_mech::fault::{self as server, retry_after_events};
use pagewise_mech::workload::AnonMemory;
use pagewise_mech::{Region, PAGE_SIZE};
use pagewise_sys::{mem, uffd};
use policy::Policy;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Where a page's contents are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Where {
    /// Remote, never written (or dropped by the program): zeros.
    RemoteZero,
    /// Remote: the page itself sits in the staging mapping.
    Remote,
    /// Local: mapped in the region.
    Local,
    /// Local but parked in staging, so that its next access is seen (see
    /// [`policy`]); it counts against the budget.
    Parked,
}

/// Pages lent to one instruction beyond the budget. An instruction may need
/// several pages at once (a `movs` whose source and destination each cross
/// a page boundary needs four): under a budget smaller than that, each of
/// its faults would evict a page another of its faults fetched, and it
/// would fault for ever. On the inline path the engine knows the faulting
/// thread and instruction: a fault of the same thread at the same
/// instruction on a page fetched for it before (and evicted since) is a
/// repeat without progress; the pages fetched for that instruction are then
/// lent, kept local over the budget, until the thread faults elsewhere or
/// on a page new to the instruction (a `rep movs` moving on). The overshoot
/// is counted ([`super::Stats::lent_faults`], [`super::Stats::overshoot_pages`]).
#[derive(Debug, Default)]
struct Loan {
    /// The instruction: thread and address.
    site: Option<(i32, u64)>,
    /// Pages fetched for it, the last [`Loan::MAX`].
    fetched: Vec<usize>,
    /// Those lent now.
    lent: Vec<usize>,
}

/// The most pages lent to one instruction ([`Loan`]): a loop whose one
/// instruction writes more pages than this in turn is never lent any (the
/// fault-cost calibration's pattern).
pub(crate) const LOAN_MAX: usize = 16;

impl Loan {
    /// The most pages lent to one instruction.
    const MAX: usize = LOAN_MAX;

    /// Before serving a fault on page `g` at `site`: whether the fault is a
    /// repeat without progress (and the pages are lent from now on).
    fn before_fault(&mut self, site: Option<(i32, u64)>, g: usize) -> bool {
        if site.is_none() || site != self.site {
            self.site = site;
            self.fetched.clear();
            self.lent.clear();
            return false;
        }
        if self.fetched.contains(&g) {
            self.lent.clone_from(&self.fetched);
            return true;
        }
        // A page new to the instruction: it moved on.
        self.lent.clear();
        false
    }

    /// Page `g` was fetched for the instruction.
    fn fetched(&mut self, g: usize) {
        if self.site.is_none() {
            return;
        }
        if self.fetched.len() == Self::MAX {
            self.fetched.remove(0);
        }
        self.fetched.push(g);
    }

    fn is_lent(&self, g: usize) -> bool {
        self.lent.contains(&g)
    }
}

/// The handler thread's state.
///
/// Remote pages are *moved* (`UFFDIO_MOVE`, no copy) between the region and
/// a staging mapping of the same size. The region is registered with one
/// userfaultfd (missing faults, and the program's `MADV_DONTNEED` and
/// `munmap` as events); the staging mappings with a second one, which asks
/// for no events, so that dropping a staging page never waits on the handler.
pub(super) struct Engine {
    /// Shared with the serving loop, which polls it with the engine unlocked.
    pub(super) uffd: std::sync::Arc<OwnedFd>,
    stage_uffd: OwnedFd,
    /// The emulated regions, in the order they were added (their pages'
    /// global indices follow that order).
    regions: Vec<Region>,
    /// Indices into `regions`, sorted by address.
    order: Vec<usize>,
    /// First global page index of each region.
    first: Vec<usize>,
    /// The staging mappings, one the size of each region.
    staging: Vec<AnonMemory>,
    pages: Vec<Where>,
    /// Fingerprint of each local page when it was fetched (for write-backs);
    /// of a remote page, when it left, where `fp_known` says so (a remote
    /// page does not change: its fetch needs no new fingerprint).
    fetched: Vec<pagewise_mech::hash::PageHash>,
    fp_known: Vec<bool>,
    /// Placement of each page.
    class: Vec<Placement>,
    /// Always-remote pages mapped since the last fault.
    visiting: Vec<usize>,
    /// Local pages that count against the budget.
    local: usize,
    policy: Box<dyn Policy>,
    link: Link,
    injector: Injector,
    walker: pagewise_mech::walk::PageWalker,
    /// Pages with data (not `RemoteZero`).
    data: usize,
    pub(super) discover: Option<Discover>,
    pub(super) inst: Option<(Arc<instance::Instance>, usize)>,
    /// Ranges a remove event (`madvise`) named whose pages the kernel may
    /// not have dropped yet (see `removing_started`).
    pub(super) removing: Vec<(u64, u64)>,
    /// See [`super::Hooks::remapping`].
    pub(super) remapping: Option<&'static std::sync::atomic::AtomicUsize>,
    /// The instance generation applied.
    generation: u64,
    /// When this member last checked that it holds no more than its share.
    shares_checked: Instant,
    /// Work that met `EAGAIN` (the address space changing under an event
    /// not read yet), done once the events are read: staged pages to move
    /// to where the program moved their range, ranges to adopt, then faults.
    moves: Vec<(u64, u64)>,
    adopts: Vec<Region>,
    later: Vec<(u64, Instant)>,
    /// Pages never emulated: the handler thread's own thread-local
    /// bookkeeping, which the C library keeps in the program's heap.
    pub(super) excluded: Vec<pagewise_mech::region::PageRange>,
    /// The coverage request applied, one still to apply, and when the open
    /// window began.
    coverage: u64,
    coverage_todo: Option<u64>,
    window: Option<Instant>,
    /// Where a staged page is copied to be fingerprinted.
    page_buf: Vec<u8>,
    /// Faults are served in the faulting thread (see [`super::inline`]).
    pub(super) inline: bool,
    /// The fault being served is a write: a page never written gets a
    /// zeroed page of its own at once, not the shared zero page and a
    /// second fault to copy it.
    pub(super) write_fault: bool,
    /// Zeros to copy from (see `write_fault`).
    zeros: AnonMemory,
    /// The thread and instruction of the fault being served inline (on the
    /// handler thread neither is known).
    pub(super) fault_site: Option<(i32, u64)>,
    /// Pages lent to one instruction (see [`Loan`]).
    loan: Loan,
    /// Pages a move found held by another task (a reference the kernel
    /// took, as `process_vm_readv` pins pages while it copies), and until
    /// when eviction passes them over.
    busy: Vec<(usize, Instant)>,
    /// See [`super::Hooks::check_books`]; faults checked so far.
    pub(super) check_books: u64,
    checked_faults: u64,
    /// In the debug mode, the engine's last steps, for the report of a
    /// failure (see [`Engine::note`]).
    history: std::collections::VecDeque<String>,
    /// See [`super::Hooks::thread_floor`].
    pub(super) thread_floor: usize,
}

/// The handler met an error it cannot recover from: the process is
/// aborted ([`server::abort`]).
pub(super) fn fail(e: &dyn std::fmt::Display) -> ! {
    server::abort("farmem", e)
}

/// The parts of `r` mapped now as private anonymous writable memory.
fn live_pieces(r: Region) -> Vec<Region> {
    let Ok(maps) = pagewise_mech::procfs::maps(None) else {
        return vec![r];
    };
    maps.iter()
        .filter(|m| m.start < r.end() && r.start < m.end)
        .filter(|m| m.is_anonymous() && m.write && !m.is_special())
        .filter_map(|m| {
            Region::new(
                m.start.max(r.start),
                m.end.min(r.end()) - m.start.max(r.start),
            )
            .ok()
        })
        .collect()
}

/// `UFFDIO_MOVE`, patient with a page another task holds for a moment: a
/// move refuses (`EBUSY`) a page whose reference count another task raised,
/// as `process_vm_readv` from an inspector does while it copies. Retries
/// for up to about 100 ms before giving the `EBUSY` back.
/// Called with pages of the engine only (its regions and staging).
fn move_patiently(
    fd: BorrowedFd<'_>,
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
) -> std::io::Result<()> {
    let mut wait_us = 1;
    let t0 = Instant::now();
    loop {
        // SAFETY: pages of the engine (every caller passes a region's page
        // and its staging slot), which it emulates as raw memory.
        match unsafe { uffd::move_pages(fd, dst, src, len, mode) } {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && t0.elapsed() < std::time::Duration::from_millis(100) =>
            {
                std::thread::sleep(std::time::Duration::from_micros(wait_us));
                wait_us = (wait_us * 2).min(2000);
            }
            r => return r,
        }
    }
}

/// Puts the staged page at `src` into the program's page `dst` (registered
/// with `fd`): one move (waiting for a page another task holds if
/// `patient`), or, where the program's mapping is unlike staging in its
/// protection or locking (made read-only or locked: `UFFDIO_MOVE` answers
/// `EINVAL`), a copy and the staged page dropped. `mode` is
/// `MOVE_MODE_DONTWAKE` or 0. Called with pages of the engine only (a region's page and its staging
/// slot).
fn put_back(
    fd: BorrowedFd<'_>,
    dst: u64,
    src: u64,
    mode: u64,
    patient: bool,
) -> std::io::Result<()> {
    let len = PAGE_SIZE as u64;
    let moved = if patient {
        move_patiently(fd, dst, src, len, mode)
    } else {
        // SAFETY: pages of the engine (every caller passes a region's page
        // and its staging slot), which it emulates as raw memory.
        unsafe { uffd::move_pages(fd, dst, src, len, mode) }
    };
    match moved {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let wake = if mode & uffd::MOVE_MODE_DONTWAKE != 0 {
                uffd::COPY_MODE_DONTWAKE
            } else {
                0
            };
            // SAFETY: as above.
            unsafe { uffd::copy_mode(fd, dst, src, len, wake) }?;
            // SAFETY: a staging page of this engine, which no one else uses;
            // its userfaultfd asks for no events.
            unsafe { mem::madvise(src, PAGE_SIZE, libc::MADV_DONTNEED) }
        }
        r => r,
    }
}

/// Whether `e` is [`Engine::map`]'s answer for an address where no mapping
/// is registered with the engine any more.
pub(super) fn unregistered(e: &Error) -> bool {
    matches!(e, Error::Mech(pagewise_mech::Error::Os { source, what })
        if source.raw_os_error() == Some(libc::ENOENT)
        && what.ends_with("no mapping registered with the engine there"))
}

/// Whether a mapping of this process whose missing faults a userfaultfd
/// serves covers `addr` (smaps; an error path only). Unknown is yes.
fn registered_here(addr: u64) -> bool {
    pagewise_mech::procfs::with_vm_flag(None, &["um"])
        .map_or(true, |m| m.iter().any(|&(a, b)| addr >= a && addr < b))
}

/// One page of staging, which the engine reads only while it is mapped there.
fn staged_page(addr: u64) -> &'static [u8] {
    // SAFETY: `addr` is a page of a staging mapping this engine owns, and the
    // caller reads it only while a page is mapped there (moved in, or a zero
    // page): reading it does not fault.
    unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) }
}

impl Engine {
    pub(super) fn new(
        regions: &[Region],
        policy: Box<dyn Policy>,
        unseen_ns: u64,
        inline: bool,
    ) -> Result<Self> {
        use uffd::feature as f;
        let events = f::MOVE | f::EVENT_REMOVE | f::EVENT_UNMAP | f::EVENT_REMAP;
        let mut e = Engine {
            uffd: std::sync::Arc::new(server::open(if inline {
                events | f::SIGBUS
            } else {
                events
            })?),
            // SIGBUS: a read of a staging page that is not there fails at
            // once instead of waiting for a handler that is the reader.
            stage_uffd: server::open(
                f::MOVE
                    | if pagewise_mech::probe::get().uffd_has(f::SIGBUS) {
                        f::SIGBUS
                    } else {
                        0
                    },
            )?,
            page_buf: vec![0u8; PAGE_SIZE],
            regions: Vec::new(),
            order: Vec::new(),
            first: Vec::new(),
            staging: Vec::new(),
            fetched: Vec::new(),
            fp_known: Vec::new(),
            class: Vec::new(),
            visiting: Vec::new(),
            pages: Vec::new(),
            local: 0,
            policy,
            link: Link::default(),
            injector: Injector::new(unseen_ns),
            walker: pagewise_mech::walk::PageWalker::new(None)?,
            data: 0,
            discover: None,
            remapping: None,
            removing: Vec::new(),
            inst: None,
            generation: 0,
            shares_checked: Instant::now(),
            moves: Vec::new(),
            adopts: Vec::new(),
            later: Vec::new(),
            excluded: Vec::new(),
            coverage: 0,
            coverage_todo: None,
            window: None,
            inline,
            write_fault: false,
            zeros: AnonMemory::new(PAGE_SIZE)?,
            check_books: 0,
            checked_faults: 0,
            history: std::collections::VecDeque::new(),
            thread_floor: 0,
            fault_site: None,
            loan: Loan::default(),
            busy: Vec::new(),
        };
        for r in regions {
            e.add_region(*r, false)?;
        }
        Ok(e)
    }

    /// Sets where page `g` is, keeping the count of pages with data.
    fn put(&mut self, g: usize, w: Where) {
        let before = self.pages[g] != Where::RemoteZero;
        let after = w != Where::RemoteZero;
        self.pages[g] = w;
        if !after {
            self.fp_known[g] = false;
        }
        match (before, after) {
            (false, true) => self.data += 1,
            (true, false) => self.data -= 1,
            _ => {}
        }
    }

    /// Global page index and address of the page holding `addr`.
    fn locate(&self, addr: u64) -> Option<(usize, usize, u64)> {
        let k = self
            .order
            .partition_point(|&i| self.regions[i].end() <= addr);
        let ri = *self.order.get(k)?;
        let r = self.regions[ri];
        if !r.contains(addr) {
            return None;
        }
        let i = ((addr - r.start) / PAGE_SIZE as u64) as usize;
        Some((ri, self.first[ri] + i, r.start + (i * PAGE_SIZE) as u64))
    }

    /// Region, page in it, address in the region and in staging of page `g`.
    fn addr_of(&self, g: usize) -> (usize, usize, u64, u64) {
        let ri = self.first.partition_point(|&f| f <= g) - 1;
        let i = g - self.first[ri];
        let off = (i * PAGE_SIZE) as u64;
        (
            ri,
            i,
            self.regions[ri].start + off,
            self.staging[ri].addr() + off,
        )
    }

    /// How often a member of an instance checks that it holds no more than
    /// its share (see [`Engine::keep`]); also its idle poll's timeout.
    const SHARE_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

    /// Serves faults and events until stopped; then maps every page back.
    /// Never returns on an error (see [`fail`]). The engine lives in `cell`
    /// and is locked while an event or fault is served (on the inline path,
    /// faulting threads lock it too).
    pub(super) fn run(cell: &Cell, mut wake: std::io::PipeReader) {
        let sh = &*cell.shared;
        let (uffd, idle_ms) = {
            let mut g = cell.lock();
            let Some(e) = g.engine() else { return };
            // A member of an instance also looks at it while idle, so that a
            // smaller budget set from outside applies without a fault.
            (
                std::sync::Arc::clone(&e.uffd),
                if e.inst.is_some() {
                    Self::SHARE_CHECK.as_millis() as i32
                } else {
                    -1
                },
            )
        };
        let fd = uffd.as_fd();
        let result = loop {
            let mut g = cell.lock();
            let Some(this) = g.engine() else {
                return;
            };
            if sh.stop.load(Ordering::Acquire) {
                break Ok(());
            }
            match this.apply_changes(sh) {
                Ok(()) => {}
                // After the pending events: the change is tried again then.
                Err(e) if retry_after_events(&e) => {}
                Err(e) => break Err(e),
            }
            if let Err(e) = this.apply_coverage(sh) {
                break Err(e);
            }
            // Messages first; poll (one more system call) only when none is waiting.
            let msg = match server::read(fd) {
                Ok(Some(m)) => m,
                Ok(None) => {
                    if !(this.moves.is_empty() && this.adopts.is_empty() && this.later.is_empty()) {
                        let r = this.settle(sh);
                        this.publish(sh);
                        if let Err(e) = &r {
                            this.fail(e);
                        }
                        drop(g);
                        if matches!(r, Ok(false)) {
                            std::thread::yield_now();
                        }
                        continue;
                    }
                    drop(g);
                    match server::wait(fd, &mut wake, idle_ms) {
                        Ok(true) => {
                            let mut g = cell.lock();
                            if let Some(this) = g.engine() {
                                if let Err(e) = this.discover_now() {
                                    this.fail(&e);
                                }
                            }
                        }
                        Ok(false) => {}
                        Err(e) => fail(&e),
                    }
                    continue;
                }
                Err(e) => break Err(e.into()),
            };
            let arrived = Instant::now();
            this.note(|| format!("read {}", page_audit::describe(&msg)));
            let r = match msg.event {
                uffd::event::PAGEFAULT => {
                    let addr = msg.pf_address();
                    this.write_fault = msg.pf_flags() & uffd::PAGEFAULT_FLAG_WRITE != 0;
                    if !(this.moves.is_empty() && this.adopts.is_empty()) || this.changing_now() {
                        this.note(|| "  deferred".into());
                        this.later.push((addr, arrived));
                        Ok(())
                    } else {
                        match this.fault(sh, addr, arrived) {
                            Err(e) if retry_after_events(&e) => {
                                this.later.push((addr, arrived));
                                Ok(())
                            }
                            r => r,
                        }
                    }
                }
                uffd::event::REMOVE => {
                    let (start, end) = msg.range();
                    this.removing_started(start, end);
                    this.dropped(sh, start, end)
                }
                uffd::event::UNMAP => {
                    let (start, end) = msg.range();
                    if this.inline {
                        emulated::unmark(start, end - start);
                    }
                    this.dropped(sh, start, end)
                }
                uffd::event::REMAP => {
                    let (from, to, len) = msg.remap();
                    if this.inline {
                        emulated::unmark(from, len);
                        emulated::mark(to, len);
                    }
                    this.remapped(sh, from, to, len)
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                break Err(e);
            }
            this.publish(sh);
        };
        let mut g = cell.lock();
        let Some(mut this) = g.take() else { return };
        if let Err(e) = result.and_then(|()| this.bring_all_back()) {
            this.fail(&e);
        }
    }

    /// Does the work that met `EAGAIN`, in order (moves, then adoptions,
    /// then faults, each needing the one before). Returns whether anything
    /// got done.
    fn settle(&mut self, sh: &Shared) -> Result<bool> {
        if self.changing_now() {
            return Ok(false);
        }
        let mut progress = false;
        for (src, dst) in std::mem::take(&mut self.moves) {
            match put_back(self.uffd.as_fd(), dst, src, uffd::MOVE_MODE_DONTWAKE, false) {
                Ok(()) => {
                    self.note(|| format!("moved {src:#x} to {dst:#x} after mremap"));
                    progress = true
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => self.moves.push((src, dst)),
                // The destination went away or was filled meanwhile: the
                // program dropped that range.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::EEXIST | libc::EINVAL)
                    ) =>
                {
                    self.note(|| format!("move of {src:#x} to {dst:#x} after mremap: {e}"));
                    progress = true
                }
                Err(e) => {
                    return Err(Error::os(
                        format!("UFFDIO_MOVE of {src:#x} after mremap"),
                        e,
                    ))
                }
            }
        }
        if !self.moves.is_empty() {
            return Ok(progress);
        }
        for r in std::mem::take(&mut self.adopts) {
            match self.adopt(r) {
                Ok(()) => progress = true,
                Err(e) if retry_after_events(&e) => self.adopts.push(r),
                Err(e) => return Err(e),
            }
        }
        if !self.adopts.is_empty() {
            return Ok(progress);
        }
        for (addr, arrived) in std::mem::take(&mut self.later) {
            self.note(|| format!("deferred fault {addr:#x}"));
            match self.fault(sh, addr, arrived) {
                Ok(()) => progress = true,
                Err(e) if retry_after_events(&e) => self.later.push((addr, arrived)),
                Err(e) => return Err(e),
            }
        }
        Ok(progress)
    }

    /// Whether a thread of the program is inside an `mremap` (see
    /// [`super::Hooks::remapping`]).
    fn changing_now(&self) -> bool {
        self.remapping.is_some_and(|n| n.load(Ordering::SeqCst) > 0)
    }

    /// Applies what changed since the last fault or event: the instance's
    /// settings, a share to give back, new regions, placements and budgets
    /// (see [`Engine::fit_budget`]). An error to retry after the pending
    /// events leaves the change pending.
    pub(crate) fn apply_changes(&mut self, sh: &Shared) -> Result<()> {
        self.follow_instance(sh);
        if self.inst.is_some() && self.shares_checked.elapsed() >= Self::SHARE_CHECK {
            // A member well above its share gives pages back even when it
            // faults too, or a newcomer would be held to what the others
            // left it.
            self.shares_checked = Instant::now();
            if self.keep(sh).is_some() {
                sh.changed.store(true, Ordering::Release);
            }
        }
        if !self.changing_now() && sh.changed.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.fit_budget(sh) {
                if retry_after_events(&e) {
                    sh.changed.store(true, Ordering::Release);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Applies the instance's settings when they changed.
    fn follow_instance(&mut self, sh: &Shared) {
        let Some((inst, _)) = &self.inst else {
            return;
        };
        let g = inst.generation();
        if g == self.generation {
            return;
        }
        self.generation = g;
        let c = inst.coverage_request();
        if c != self.coverage {
            self.coverage_todo = Some(c);
        }
        let st = inst.settings();
        sh.config.lock().unwrap_or_else(|e| e.into_inner()).link = LinkConfig {
            latency_ns: st.latency_ns,
            bandwidth_bps: st.bandwidth_bps,
        };
        sh.changed.store(true, Ordering::Release);
    }

    /// Publishes the counters to the instance slot.
    fn publish(&self, sh: &Shared) {
        if let Some((inst, slot)) = &self.inst {
            inst.publish(*slot, &sh.counters, self.data as u64);
        }
    }

    /// How many local pages this engine should keep now, when fewer than
    /// it has: alone, the budget. In an instance over its budget, each
    /// member gives up its share of the excess; in an instance at its
    /// budget, a member well above its share of the budget (by pages with
    /// data) comes down to it, so that a member faulting is not held to
    /// what idle members left it.
    pub(crate) fn keep(&self, sh: &Shared) -> Option<u64> {
        let cfg = *sh.config.lock().unwrap_or_else(|e| e.into_inner());
        let (total, budget, data) = self.load(&cfg);
        let local = self.local as u64;
        let mut target = local;
        if total > budget {
            target = local - ((total - budget) * local).div_ceil(total).min(local);
        }
        if self.inst.is_some() && total >= budget && data > 0 {
            let share = (budget as u128 * self.data as u128 / data as u128) as u64;
            if local > share + share / 16 + 4 {
                target = target.min(share);
            }
        }
        (target < local).then_some(target)
    }

    /// The fewest local pages this engine keeps, over the budget if need
    /// be (see [`super::Hooks::thread_floor`]); inline, none.
    pub(crate) fn floor(&self) -> usize {
        if self.inline {
            0
        } else {
            self.thread_floor
        }
    }

    /// Local pages counted against the budget now, the budget, and the
    /// pages with data it is a share of.
    fn load(&self, cfg: &Config) -> (u64, u64, u64) {
        let Some((inst, slot)) = &self.inst else {
            return (self.local as u64, cfg.local_pages as u64, self.data as u64);
        };
        // The instance holds every member's published figures, ours as of
        // the last event: replace ours with the current ones.
        let (local, data) = inst.totals();
        let (pub_local, pub_data) = inst.published(*slot);
        let local = local - pub_local + self.local as u64;
        let data = data - pub_data + self.data as u64;
        (local, inst.budget(&inst.settings(), data), data)
    }

    /// Moves the page at `addr` of a region to its staging slot `staged`
    /// (one atomic `UFFDIO_MOVE`, waking no one): how every page leaves the
    /// program's memory.
    fn stage_page(&self, addr: u64, staged: u64) -> std::io::Result<()> {
        // SAFETY: a page of a region and its staging slot: the engine's own pages (its regions, registered with its userfaultfd, and their staging slots): memory it emulates for the program as raw memory, which no Rust reference of the engine relies on.
        unsafe {
            uffd::move_pages(
                self.stage_uffd.as_fd(),
                staged,
                addr,
                PAGE_SIZE as u64,
                uffd::MOVE_MODE_DONTWAKE,
            )
        }
    }

    /// The fingerprint of the page staged at `staged`, read without ever
    /// touching a page that is not there: the handler must never fault on
    /// memory only it could serve. A missing page is an error (the books
    /// and staging disagree), never a wait.
    fn staged_hash(&mut self, staged: u64) -> Result<pagewise_mech::hash::PageHash> {
        let missing = || Error::Internal {
            what: "a staged page is missing: the engine's books are wrong",
            addr: staged,
        };
        if self.inline {
            // Read in place: a missing page raises SIGBUS in this thread,
            // whose handler finds it inside the engine and stops the
            // process (see `inline::serve`), never a wait.
            return Ok(pagewise_mech::hash::page_hash(staged_page(staged)));
        }
        if pagewise_mech::probe::get().uffd_has(uffd::feature::SIGBUS) {
            // The staging userfaultfd has SIGBUS: the kernel's copy fails
            // with EFAULT on a missing page.
            match pagewise_sys::process::process_vm_read(
                std::process::id() as i32,
                staged,
                &mut self.page_buf,
            ) {
                Ok(n) if n == PAGE_SIZE => Ok(pagewise_mech::hash::page_hash(&self.page_buf)),
                _ => Err(missing()),
            }
        } else {
            if !self.present(staged)? {
                return Err(missing());
            }
            Ok(pagewise_mech::hash::page_hash(staged_page(staged)))
        }
    }
}
