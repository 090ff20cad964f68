//! Lazy restore of the caller's own regions from a durable store: the
//! regions are emptied and each page is brought back from the store when it
//! is first touched, through userfaultfd `MISSING` faults (the way a VMM
//! restores guest memory from a snapshot file). The program runs again at
//! once; a page it never touches costs nothing until the background fill
//! (or [`LazyRestore::finish`]) brings it in.
//!
//! A server thread reads the faults ([`pagewise_mech::fault`], the mechanism
//! far memory serves its faults with too) and answers each with
//! `UFFDIO_COPY` of the page read from the store (its checksum and digest
//! checked), or `UFFDIO_ZEROPAGE` for a zero page. When no fault is
//! waiting it fills the pages not touched yet, in address order, unless
//! asked not to.
//!
//! **Staging** (on by default): a second thread reads the store ahead of
//! the faults into a staging area of this process (the pages after the
//! last fault first, then the rest in address order), checksums and
//! digests checked there, and a fault on a staged page is answered by one
//! `UFFDIO_COPY` from its slot: no store read on the fault's path. Staging
//! holds a second copy of the pages brought in until the restore
//! completes, when it is given back at once: at most the snapshot's size
//! again.
//!
//! Why a copy from the slot and not a move of it: `UFFDIO_MOVE` would put
//! the staged page itself in place, copying nothing, but it must clear the
//! slot's page-table entry, which flushes it from the TLB of every CPU the
//! process ran on (an interrupt to each, costly in a VM); a copy only adds
//! an entry. On the 2-vCPU VM of the benchmarks (`pagewise-bench rollback
//! --only d`, 64 MiB, a build answering staged faults with a move against
//! this one, two runs each, alternated), a staged first touch took 5.0 to
//! 5.2 µs (median) moved and 3.8 to 3.9 µs copied, against a far-memory
//! floor of 2.3 µs; the store read a staged fault no longer makes was
//! 1.3 µs of the 5 µs an unstaged one took on one CPU.
//!
//! What the program may do meanwhile, each tested against a shadow copy:
//! read and write from any number of threads; drop pages
//! (`MADV_DONTNEED`: they read as zeros afterwards, as without pagewise);
//! unmap, shrink or move (`mremap`) parts of the regions (the pages not
//! brought in yet follow the move). A child it forks meanwhile sees zeros
//! where its parent had pages not brought in yet (as Firecracker's handler
//! does, no fork events are followed): finish first.
//!
//! Failure: a page the store cannot give back (damaged since it was
//! opened, or removed) leaves the program's memory wrong, and no thread
//! waiting on that page can go on: the process is aborted with the reason,
//! as far memory does.

use crate::disk::{check_same_shape, DiskSnapshot, DiskStore};
use crate::{Error, Result};
use pagewise_mech::fault::{self, retry_after_events, Filled};
use pagewise_mech::procfs;
use pagewise_mech::workload::AnonMemory;
use pagewise_mech::{Region, PAGE_SIZE};
use pagewise_sys::{mem, uffd};
use serde::Serialize;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How to run a lazy restore.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LazyOptions {
    /// Fill the pages not touched yet while no fault waits (default). Off,
    /// pages come in only when touched or at [`LazyRestore::finish`].
    pub background: bool,
    /// Read the store ahead of the faults into a staging area, on a thread
    /// of its own, so that a fault on a staged page is answered without a
    /// store read (default). Off, every page is read from the store when
    /// it is brought in, and no second copy is held meanwhile.
    pub stage: bool,
}

impl Default for LazyOptions {
    fn default() -> Self {
        LazyOptions {
            background: true,
            stage: true,
        }
    }
}

impl LazyOptions {
    /// With the background fill on or off.
    pub fn background(mut self, on: bool) -> Self {
        self.background = on;
        self
    }

    /// With staging on or off.
    pub fn stage(mut self, on: bool) -> Self {
        self.stage = on;
        self
    }
}

/// What a lazy restore did so far.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct LazyStats {
    /// Pages of the snapshot.
    pub pages: u64,
    /// Pages of them that are zero (never read from the store).
    pub zero_pages: u64,
    /// Faults served (first touches).
    pub faults: u64,
    /// Pages copied from the store, on a fault or in the background.
    pub copied: u64,
    /// Pages copied in the background, with no fault waiting.
    pub background: u64,
    /// Pages the program dropped or unmapped before they were brought in.
    pub dropped: u64,
    /// Faults that found their page brought in already (several threads
    /// touching one page).
    pub already: u64,
    /// Whether pages are staged ahead.
    pub staging: bool,
    /// Pages read from the store into staging so far.
    pub staged: u64,
    /// Pages of `copied` copied from staging (no store read on their way
    /// in).
    pub from_staging: u64,
    /// Faults of `faults` answered from staging.
    pub faults_staged: u64,
    /// Nanoseconds from reading a fault to its page mapped: median, 99th
    /// percentile and largest (the thread's own wait adds the kernel's
    /// fault entry and wake-up to it).
    pub service_p50_ns: u64,
    /// See `service_p50_ns`.
    pub service_p99_ns: u64,
    /// See `service_p50_ns`.
    pub service_max_ns: u64,
    /// Every page is in (or was dropped by the program).
    pub complete: bool,
    /// Nanoseconds from the start to completion, once complete.
    pub complete_ns: Option<u64>,
}

/// A lazy restore in progress; [`LazyRestore::finish`] (or drop) brings in
/// what is left and stops serving.
pub struct LazyRestore {
    shared: Arc<Shared>,
    wake: std::io::PipeWriter,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for LazyRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyRestore")
            .field("stats", &self.stats())
            .finish()
    }
}

struct Shared {
    finish: AtomicBool,
    /// Pages the stager read into staging.
    staged: AtomicU64,
    /// The counters, and every fault's service time in nanoseconds.
    stats: Mutex<(LazyStats, Vec<u32>)>,
}

/// Where each page is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the store only.
    Away,
    /// Mapped (brought in, or a zero page left to the kernel).
    In,
    /// Dropped or unmapped by the program before it was brought in.
    Dropped,
}

/// The server thread's books.
struct Server {
    disk: Arc<DiskStore>,
    snap: DiskSnapshot,
    /// The regions as given: (region, index of its first page in the
    /// snapshot's entries).
    regions: Vec<(Region, usize)>,
    state: Vec<State>,
    /// Pages still `Away`.
    away: u64,
    /// Moves the program made (`mremap`), oldest first: (from, to, len).
    moves: Vec<(u64, u64, u64)>,
    /// Faults met with `EAGAIN`, served again after the events.
    later: Vec<(u64, Instant)>,
    /// Where the background fill goes on from (a page index).
    cursor: usize,
    shared: Arc<Shared>,
    page: Box<[u8]>,
    background: bool,
    t0: Instant,
    /// The staging area and its stager, if staging.
    stage: Option<(Arc<Stage>, std::thread::JoinHandle<()>)>,
}

/// A snapshot page's place in staging ([`Stage::marks`]).
mod mark {
    /// Not read into staging (yet).
    pub const NONE: u8 = 0;
    /// The stager is reading it into its slot.
    pub const CLAIMED: u8 = 1;
    /// In its slot, to be copied in.
    pub const READY: u8 = 2;
    /// Taken by the server (copied in, read by the server itself, or no
    /// longer wanted): the stager leaves it alone.
    pub const DONE: u8 = 3;
}

/// The staging area: one slot per snapshot page, which the stager fills
/// and the server copies into the program. Who may
/// touch a slot is decided by its mark alone: the stager while `CLAIMED`,
/// the server once `READY`.
struct Stage {
    area: AnonMemory,
    marks: Box<[AtomicU8]>,
    /// The page after the last fault (`usize::MAX`: none yet), where the
    /// stager looks first.
    hint: AtomicUsize,
    stop: AtomicBool,
}

/// Pages the stager reads after a fault's page before going on with its
/// sweep.
const AHEAD: usize = 32;

impl Stage {
    fn slot(&self, i: usize) -> u64 {
        self.area.addr() + (i * PAGE_SIZE) as u64
    }

    /// Claims page `i` for the server: the address of its staged copy if it
    /// is staged (waiting out a read under way), or `None` if the server
    /// must read the store itself (the stager will not read it any more).
    fn take(&self, i: usize) -> Option<u64> {
        let mut spins = 0u32;
        loop {
            match self.marks[i].compare_exchange(
                mark::NONE,
                mark::DONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) | Err(mark::DONE) => return None,
                Err(mark::READY) => return Some(self.slot(i)),
                // A read under way takes a microsecond or two, unless the
                // stager lost its CPU (to this thread, on one CPU): then
                // give it back.
                Err(_) if spins < 64 => {
                    spins += 1;
                    std::hint::spin_loop()
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }

    /// Page `i`'s staged copy is no longer wanted (the program dropped the
    /// page): its slot is emptied if it holds one.
    fn discard(&self, i: usize) {
        if self.marks[i].swap(mark::DONE, Ordering::AcqRel) == mark::READY {
            // The slot held a page nothing else will read: give it back.
            let _ = self
                .area
                .madvise(i * PAGE_SIZE, PAGE_SIZE, libc::MADV_DONTNEED);
        }
    }

    /// The stager's loop: reads every page not taken yet into its slot,
    /// those after the last fault first.
    fn run(&self, disk: &DiskStore, entries: &[u64], shared: &Shared) {
        // Staging is work ahead of need: on a CPU the program wants, the
        // program goes first (a kernel that refuses leaves it at the
        // default priority).
        let _ = pagewise_sys::signal::lowest_priority();
        let n = entries.len();
        let mut page = vec![0u8; PAGE_SIZE];
        let (mut cursor, mut last_hint, mut near, mut ahead) = (0, usize::MAX, 0, 0);
        while !self.stop.load(Ordering::Acquire) {
            let h = self.hint.load(Ordering::Acquire);
            if h != last_hint {
                (last_hint, near, ahead) = (h, h, AHEAD);
            }
            let i = if ahead > 0 && near < n {
                ahead -= 1;
                near += 1;
                near - 1
            } else if cursor < n {
                cursor += 1;
                cursor - 1
            } else {
                break;
            };
            if entries[i] == 0
                || self.marks[i]
                    .compare_exchange(
                        mark::NONE,
                        mark::CLAIMED,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_err()
            {
                continue;
            }
            match disk.read_page(entries[i], &mut page) {
                Ok(()) => {
                    self.area.write_at(i * PAGE_SIZE, &page);
                    self.marks[i].store(mark::READY, Ordering::Release);
                    shared.staged.fetch_add(1, Ordering::Relaxed);
                }
                // The server reads it itself, and reports what is wrong.
                Err(_) => self.marks[i].store(mark::NONE, Ordering::Release),
            }
        }
    }
}

impl LazyRestore {
    /// Empties `regions` (private anonymous, writable, each the size of
    /// the snapshot's region in the same place of the list) and starts
    /// serving their first touches from snapshot `id` of `store`.
    ///
    /// No other thread may touch the regions while this call runs (as for
    /// [`crate::Snapshots::restore`]); from its return on, any may.
    pub fn start(store: DiskStore, id: u64, regions: &[Region], opts: LazyOptions) -> Result<Self> {
        let snap = store.load(id)?;
        check_same_shape(&snap, regions)?;
        procfs::check_mapped_writable(
            regions,
            "lazy restore",
            &[procfs::MemoryKind::PrivateAnonymous],
        )?;
        use uffd::feature as f;
        let staging = opts.stage;
        let uffd = fault::open(f::EVENT_REMOVE | f::EVENT_UNMAP | f::EVENT_REMAP)?;
        let mut first = 0usize;
        let mut placed = Vec::with_capacity(regions.len());
        let mut state = vec![State::Away; snap.entries.len()];
        for r in regions {
            placed.push((*r, first));
            first += r.pages() as usize;
        }
        let mut away = 0u64;
        let mut zero_pages = 0u64;
        for (s, &e) in state.iter_mut().zip(&snap.entries) {
            if e == 0 {
                // Left missing: once the userfaultfd is gone a missing
                // anonymous page reads as zeros; until then a touch maps
                // the zero page.
                *s = State::In;
                zero_pages += 1;
            } else {
                away += 1;
            }
        }
        for r in regions {
            // SAFETY: the caller's own region, private anonymous and
            // writable (checked above); dropping its pages is what a lazy
            // restore does, and no other thread touches it during `start`.
            unsafe { mem::madvise(r.start, r.len as usize, libc::MADV_DONTNEED) }.map_err(|e| {
                Error::os(format!("MADV_DONTNEED of {:#x}+{:#x}", r.start, r.len), e)
            })?;
            uffd::register(uffd.as_fd(), r.start, r.len, uffd::REGISTER_MODE_MISSING).map_err(
                |e| {
                    Error::os(
                        format!("registering {:#x}+{:#x} for missing faults", r.start, r.len),
                        e,
                    )
                },
            )?;
        }
        let stats = LazyStats {
            pages: snap.entries.len() as u64,
            zero_pages,
            complete: away == 0,
            complete_ns: (away == 0).then_some(0),
            staging,
            ..Default::default()
        };
        let shared = Arc::new(Shared {
            finish: AtomicBool::new(false),
            staged: AtomicU64::new(0),
            stats: Mutex::new((stats, Vec::new())),
        });
        let disk = Arc::new(store);
        let stage = if staging && away > 0 {
            let area = AnonMemory::reserve(snap.entries.len() * PAGE_SIZE)?;
            // Pages are staged one by one, and a huge page would cost
            // 2 MiB wherever the snapshot has a zero page or two.
            let _ = area.madvise(0, area.len(), libc::MADV_NOHUGEPAGE);
            let stage = Arc::new(Stage {
                area,
                marks: (0..snap.entries.len())
                    .map(|_| AtomicU8::new(mark::NONE))
                    .collect(),
                hint: AtomicUsize::new(usize::MAX),
                stop: AtomicBool::new(false),
            });
            let (st, d, sh) = (stage.clone(), disk.clone(), shared.clone());
            let entries: Vec<u64> = snap.entries.clone();
            let stager = pagewise_sys::signal::spawn_quiet("pagewise-stage".into(), move || {
                st.run(&d, &entries, &sh)
            })
            .map_err(|e| Error::os("starting the lazy-restore stager", e))?;
            Some((stage, stager))
        } else {
            None
        };
        let (rx, wake) = std::io::pipe().map_err(|e| Error::os("pipe", e))?;
        let server = Server {
            disk,
            snap,
            regions: placed,
            state,
            away,
            moves: Vec::new(),
            later: Vec::new(),
            cursor: 0,
            shared: shared.clone(),
            page: vec![0u8; PAGE_SIZE].into_boxed_slice(),
            background: opts.background,
            t0: Instant::now(),
            stage,
        };
        let thread =
            pagewise_sys::signal::spawn_quiet("pagewise-lazy".into(), move || server.run(uffd, rx))
                .map_err(|e| Error::os("starting the lazy-restore thread", e))?;
        Ok(LazyRestore {
            shared,
            wake,
            thread: Some(thread),
        })
    }

    /// What it did so far.
    pub fn stats(&self) -> LazyStats {
        let (mut st, mut ns) = {
            let g = self.shared.stats.lock().expect("stats lock");
            (g.0.clone(), g.1.clone())
        };
        st.staged = self.shared.staged.load(Ordering::Relaxed);
        ns.sort_unstable();
        let at = |q: usize| ns.get((ns.len() * q / 100).min(ns.len().saturating_sub(1)));
        st.service_p50_ns = at(50).map_or(0, |&v| v as u64);
        st.service_p99_ns = at(99).map_or(0, |&v| v as u64);
        st.service_max_ns = ns.last().map_or(0, |&v| v as u64);
        st
    }

    /// Brings in every page not in yet (serving faults meanwhile), stops
    /// serving and returns what it did.
    pub fn finish(mut self) -> Result<LazyStats> {
        self.stop();
        Ok(self.stats())
    }

    fn stop(&mut self) {
        let Some(t) = self.thread.take() else { return };
        self.shared.finish.store(true, Ordering::Release);
        let _ = self.wake.write_all(b"f");
        // The server aborts the process rather than return on an error, so
        // a join error is a panic in it, which is passed on.
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
}

impl Drop for LazyRestore {
    fn drop(&mut self) {
        self.stop();
    }
}

impl DiskStore {
    /// Restores snapshot `id` lazily into `regions`: see
    /// [`LazyRestore::start`].
    pub fn restore_lazy(
        self,
        id: u64,
        regions: &[Region],
        opts: LazyOptions,
    ) -> Result<LazyRestore> {
        LazyRestore::start(self, id, regions, opts)
    }
}

/// The page fill batch between two looks at the fault queue.
const BATCH: usize = 16;

/// How long the server looks for a next fault before it sleeps, µs. A
/// server that sleeps between faults is woken by each one, and where the
/// CPU it sleeps on halts at once (a VM without halt polling) that wake-up
/// costs more than serving the fault; the threads woken on its CPU run
/// first (it yields while it looks).
const LINGER_US: u64 = 50;

impl Server {
    fn run(mut self, uffd: OwnedFd, mut wake: std::io::PipeReader) {
        if let Err(e) = self.serve(uffd.as_fd(), &mut wake) {
            fault::abort("lazy restore", &e);
        }
        if let Some((stage, stager)) = self.stage.take() {
            stage.stop.store(true, Ordering::Release);
            if let Err(p) = stager.join() {
                std::panic::resume_unwind(p);
            }
        }
        // Every page is in or was dropped: closing the userfaultfd
        // unregisters the regions (the pages left missing are zero pages).
    }

    fn serve(&mut self, fd: BorrowedFd<'_>, wake: &mut std::io::PipeReader) -> Result<()> {
        loop {
            while let Some(msg) = fault::read(fd)? {
                self.message(fd, &msg)?;
            }
            self.retry_later(fd)?;
            let finishing = self.shared.finish.load(Ordering::Acquire);
            if self.away == 0 && self.later.is_empty() {
                if let Some((stage, _)) = &self.stage {
                    // Nothing is wanted from staging any more: its pages
                    // are given back at once (the stager has claimed every
                    // slot, and ends).
                    if !stage.stop.swap(true, Ordering::AcqRel) {
                        let _ = stage.area.madvise(0, stage.area.len(), libc::MADV_DONTNEED);
                    }
                }
                let ns = self.t0.elapsed().as_nanos() as u64;
                self.bump(|s| {
                    if !s.complete {
                        s.complete = true;
                        s.complete_ns = Some(ns);
                    }
                });
                if finishing {
                    return Ok(());
                }
            } else if !self.later.is_empty() {
                // Faults wait on an event that is not there yet.
                std::thread::yield_now();
                continue;
            } else if self.background || finishing {
                self.fill_some(fd)?;
                continue;
            }
            if !self.linger(fd)? {
                fault::wait(fd, wake, -1)?;
            }
        }
    }

    /// Looks for a next fault for a short while before sleeping.
    fn linger(&mut self, fd: BorrowedFd<'_>) -> Result<bool> {
        let until = Instant::now() + std::time::Duration::from_micros(LINGER_US);
        while Instant::now() < until {
            if let Some(msg) = fault::read(fd)? {
                self.message(fd, &msg)?;
                return Ok(true);
            }
            // A thread woken on this CPU (the one that faulted) runs first.
            std::thread::yield_now();
        }
        Ok(false)
    }

    fn message(&mut self, fd: BorrowedFd<'_>, msg: &uffd::UffdMsg) -> Result<()> {
        match msg.event {
            uffd::event::PAGEFAULT => {
                let arrived = Instant::now();
                let addr = msg.pf_address() & !(PAGE_SIZE as u64 - 1);
                match self.fault(fd, addr, arrived) {
                    Err(e) if retry_after_events(&e) => self.later.push((addr, arrived)),
                    r => r?,
                }
            }
            uffd::event::REMOVE | uffd::event::UNMAP => {
                let (start, end) = msg.range();
                self.dropped(start, end);
            }
            uffd::event::REMAP => {
                let (from, to, len) = msg.remap();
                self.moves.push((from, to, len));
            }
            _ => {}
        }
        Ok(())
    }

    fn retry_later(&mut self, fd: BorrowedFd<'_>) -> Result<()> {
        for (addr, arrived) in std::mem::take(&mut self.later) {
            match self.fault(fd, addr, arrived) {
                Err(e) if retry_after_events(&e) => self.later.push((addr, arrived)),
                r => r?,
            }
        }
        Ok(())
    }

    /// Serves a first touch at `addr` (where the page is now).
    fn fault(&mut self, fd: BorrowedFd<'_>, addr: u64, arrived: Instant) -> Result<()> {
        // Counted before the page is mapped (which wakes the thread), so
        // that a thread reading the counts after its touch sees its fault;
        // taken back if it must be served again after the events.
        self.bump(|s| s.faults += 1);
        let filled = match self.resolve(fd, addr) {
            Ok(f) => f,
            Err(e) => {
                self.bump(|s| s.faults -= 1);
                return Err(e);
            }
        };
        let ns = arrived.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        let mut g = self.shared.stats.lock().expect("stats lock");
        g.0.already += (filled == Filled::Already) as u64;
        g.1.push(ns);
        Ok(())
    }

    fn resolve(&mut self, fd: BorrowedFd<'_>, addr: u64) -> Result<Filled> {
        Ok(match self.origin(addr).and_then(|a| self.page_at(a)) {
            // Not a page of the snapshot (a region grown since), or one
            // the program dropped: zeros, as without pagewise.
            // SAFETY: a missing page of the regions this lazy restore serves, which its creator handed over as raw memory to be filled from the store.
            None => unsafe { fault::zero(fd, addr, PAGE_SIZE as u64) }?,
            Some(i) => match self.state[i] {
                State::Away => {
                    if let Some((stage, _)) = &self.stage {
                        stage.hint.store(i + 1, Ordering::Release);
                    }
                    let f = self.bring(fd, addr, i, true)?;
                    self.state[i] = State::In;
                    self.away -= 1;
                    f
                }
                // SAFETY: as above.
                State::In | State::Dropped => unsafe { fault::zero(fd, addr, PAGE_SIZE as u64) }?,
            },
        })
    }

    /// Brings snapshot page `i` to `addr`: moved in from staging, or
    /// copied from the store (counted first, as a fault is). `fault`: on a
    /// fault's behalf.
    fn bring(&mut self, fd: BorrowedFd<'_>, addr: u64, i: usize, fault: bool) -> Result<Filled> {
        if let Some(src) = self.stage.as_ref().and_then(|(s, _)| s.take(i)) {
            self.bump(|s| {
                s.copied += 1;
                s.from_staging += 1;
                s.faults_staged += fault as u64;
            });
            // SAFETY: a missing page of the regions this lazy restore
            // serves, which its creator handed over as raw memory to be
            // filled; the staging slot is the server's alone while it is
            // READY (nothing writes it).
            let filled = unsafe { fault::fill_from(fd, addr, src) };
            if filled.is_err() {
                // Still staged (still READY): tried again later.
                self.bump(|s| {
                    s.copied -= 1;
                    s.from_staging -= 1;
                    s.faults_staged -= fault as u64;
                });
            } else if let Some((stage, _)) = &self.stage {
                // Its copy stays in the slot until the restore completes.
                stage.marks[i].store(mark::DONE, Ordering::Release);
            }
            return Ok(filled?);
        }
        let offset = self.snap.entries[i];
        self.disk.read_page(offset, &mut self.page)?;
        self.bump(|s| s.copied += 1);
        // SAFETY: a missing page of the regions this lazy restore serves, which its creator handed over as raw memory to be filled from the store.
        let filled = unsafe { fault::fill(fd, addr, &self.page) };
        Ok(filled.inspect_err(|_| self.bump(|s| s.copied -= 1))?)
    }

    /// Brings in up to [`BATCH`] pages not touched yet, in address order.
    fn fill_some(&mut self, fd: BorrowedFd<'_>) -> Result<()> {
        let mut done = 0;
        while done < BATCH && self.away > 0 {
            let n = self.state.len();
            let i = self.cursor;
            self.cursor = (self.cursor + 1) % n;
            if self.state[i] != State::Away {
                continue;
            }
            let Some(addr) = self.now_at(i) else {
                self.forget(i);
                continue;
            };
            match self.bring(fd, addr, i, false) {
                Err(e) if retry_after_events(&e) => {
                    // An event is waiting: read it first.
                    self.cursor = i;
                    return Ok(());
                }
                Err(Error::Mech(pagewise_mech::Error::Os { source, .. }))
                    if source.raw_os_error() == Some(libc::ENOENT) =>
                {
                    // Unmapped under us; its event comes next.
                    self.cursor = i;
                    return Ok(());
                }
                r => {
                    r?;
                }
            }
            self.state[i] = State::In;
            self.away -= 1;
            self.bump(|s| s.background += 1);
            done += 1;
        }
        Ok(())
    }

    /// Snapshot page `i`, not brought in, is not to be any more: the
    /// program dropped or unmapped it.
    fn forget(&mut self, i: usize) {
        if let Some((stage, _)) = &self.stage {
            stage.discard(i);
        }
        self.state[i] = State::Dropped;
        self.away -= 1;
        self.bump(|s| s.dropped += 1);
    }

    /// The program dropped or unmapped `[start, end)` (where pages are
    /// now): what was not brought in is not brought in any more.
    fn dropped(&mut self, start: u64, end: u64) {
        for a in (start..end).step_by(PAGE_SIZE) {
            if let Some(i) = self.origin(a).and_then(|a| self.page_at(a)) {
                if self.state[i] == State::Away {
                    self.forget(i);
                }
            }
        }
    }

    /// Where the page now at `addr` was when the restore started; `None`
    /// where a move took away what was there.
    fn origin(&self, mut addr: u64) -> Option<u64> {
        for &(from, to, len) in self.moves.iter().rev() {
            if addr >= to && addr < to + len {
                addr = from + (addr - to);
            } else if addr >= from && addr < from + len {
                return None;
            }
        }
        Some(addr)
    }

    /// Where snapshot page `i` is now; `None` where a move put another
    /// mapping over it.
    fn now_at(&self, i: usize) -> Option<u64> {
        let (r, first) = self
            .regions
            .iter()
            .find(|(r, first)| *first <= i && i < first + r.pages() as usize)
            .copied()?;
        let mut addr = r.start + ((i - first) * PAGE_SIZE) as u64;
        for &(from, to, len) in &self.moves {
            if addr >= from && addr < from + len {
                addr = to + (addr - from);
            } else if addr >= to && addr < to + len {
                return None;
            }
        }
        Some(addr)
    }

    /// The snapshot page of the address `addr` had when the restore started.
    fn page_at(&self, addr: u64) -> Option<usize> {
        // A few regions, in the snapshot's order (not always by address).
        let (r, first) = self.regions.iter().find(|(r, _)| r.contains(addr))?;
        Some(first + (addr - r.start) as usize / PAGE_SIZE)
    }

    fn bump(&self, f: impl FnOnce(&mut LazyStats)) {
        f(&mut self.shared.stats.lock().expect("stats lock").0);
    }
}
