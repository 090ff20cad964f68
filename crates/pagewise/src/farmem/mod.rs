//! Disaggregated-memory emulation (DiME) on a stock kernel: a local page
//! budget, a link model and replacement policies over userfaultfd.
//!
//! A [`FarMemory`] emulates far memory for page-aligned regions of the
//! calling process. At most `local_pages` of their pages are mapped (local);
//! the others are *remote*: the page itself sits in a staging mapping of the
//! engine, and the region has a hole there. Every access to a remote page —
//! the first touch of a fresh page included, as in DiME — faults to the
//! engine's handler thread, which:
//!
//! 1. charges the link (see [`link`]): twice the one-way latency plus the
//!    page's transmission time, queued behind the instance's other transfers;
//! 2. if the budget is full, asks the [`policy`] for a victim and evicts it
//!    with one `UFFDIO_MOVE` into staging. The move is atomic under the page
//!    table lock: a write racing it lands before it (and moves with the
//!    page) or faults after it (and fetches the page back). No write is lost
//!    (tested with concurrent writers against a shadow copy). The victim's
//!    fingerprint against the one it was fetched with decides whether it
//!    counts as a dirty write-back;
//! 3. waits out the rest of the modelled delay and moves the page back into
//!    the region (or maps the zero page for a page never written), which
//!    wakes the faulting thread.
//!
//! Faults taken inside system calls (a `read()` into a remote buffer) are
//! handled the same way: the kernel waits for the handler. The program's
//! `MADV_DONTNEED` and `munmap` of emulated memory arrive as events: those
//! pages read as zeros afterwards, never as the engine's old copy. (The
//! staging mappings are registered with a second userfaultfd that asks for
//! no events, so that the engine's own drops there never wait on itself.)
//!
//! # When the engine fails
//! If the handler meets an error it cannot recover from (its books and the
//! memory disagree, a system call fails in a way it does not expect), it
//! prints the error and aborts the process: a program must never run on
//! with memory that may be silently wrong.
//!
//! # What the caller guarantees
//! The regions are private anonymous memory, mapped and writable. An
//! `mremap` of emulated memory is followed (the remote pages move with it).
//! Before a `fork`, call [`FarMemory::pause`] so that the child's copy of
//! memory is complete, and [`FarMemory::resume`] after it in the parent (the
//! preload shim does both); a page shared with a child (or merged by KSM)
//! is given its own copy before it is evicted. When the [`FarMemory`] is
//! stopped or dropped, every remote page is moved back.
//!
//! Unmodified programs: `pagewise farmem run` (see the preload shim), with
//! several processes in one [`instance`].
//!
//! # Access coverage
//! The engine doubles as an access sampler where the kernel has neither
//! idle page tracking nor DAMON: when an instance opens a coverage window
//! ([`instance::Instance::request_coverage`]), each member evicts every
//! local page, so that the first access to any page in the window is a
//! fault. When the window closes, the pages local again are exactly those
//! the program touched (read or written) in it; the member writes them per
//! 2 MiB region ([`crate::access::CoverageReport`]) and maps every page back.

pub mod instance;
pub mod link;
pub mod policy;

use crate::workload::AnonMemory;
use crate::{Error, Region, Result, PAGE_SIZE};
use link::{Injector, Link, LinkConfig};
use pagewise_sys::{mem, uffd};
use policy::Policy;
use serde::Serialize;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How an instance behaves; every field can change while it runs
/// ([`FarMemory::set`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Config {
    /// Pages that may be local at once (at least 1).
    pub local_pages: usize,
    /// The link to the remote memory.
    pub link: LinkConfig,
}

/// Where a range must live, whatever the policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Left to the budget and the policy.
    Normal,
    /// Always local: faults on it cost nothing and are not fetches, it is
    /// never evicted, and it does not count against the budget.
    PinnedLocal,
    /// Always remote: every fault on it is a fetch, and the page is evicted
    /// again at the engine's next fault (accesses in between are free: the
    /// engine only sees faults). It does not count against the budget.
    AlwaysRemote,
}

/// What one trace event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceKind {
    /// A remote page was fetched.
    Fetch,
    /// A local page was evicted (clean).
    Evict,
    /// A local page was evicted and written back (its contents changed).
    Writeback,
    /// A parked page was used again (a soft fault).
    Soft,
}

/// One event of the trace ([`FarMemory::trace`]).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TraceEvent {
    /// Time since the instance started, ns.
    pub t_ns: u64,
    /// The page's address.
    pub addr: u64,
    /// What happened.
    pub kind: TraceKind,
}

#[derive(Default)]
struct Trace {
    on: bool,
    capacity: usize,
    events: Vec<TraceEvent>,
    dropped: u64,
}

/// Counters of one instance.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Faults on remote pages (each one a fetch).
    pub page_fault_count: u64,
    /// Pages fetched from the remote memory.
    pub remote_fetches: u64,
    /// Local pages evicted.
    pub evictions: u64,
    /// Evicted pages whose contents had changed and were written back.
    pub writebacks: u64,
    /// Delay waited in total, ns.
    pub injected_delay_ns: u64,
    /// Modelled delay in total, ns (what the link model asked for).
    pub modelled_delay_ns: u64,
    /// What a fault costs at latency 0 here (the calibrated floor), ns.
    pub floor_ns: u64,
    /// The part of it the engine cannot see and takes off each delay, ns.
    pub unseen_ns: u64,
    /// Accesses to parked pages (policies learning which pages are used):
    /// mapped back at once, no delay, not fetches.
    pub soft_faults: u64,
    /// Pages parked.
    pub parks: u64,
    /// Pages local now.
    pub local_pages_now: u64,
    /// Time the handler spent on faults, from reading the message to
    /// mapping the page, waits included, ns.
    pub handler_ns: u64,
    /// Shared pages (after a `fork`, or merged by KSM) given a copy of
    /// their own so that they could be evicted.
    pub unshared_pages: u64,
    /// Injected delay per fault: counts in power-of-two buckets, bucket `i`
    /// holding delays in `[2^i, 2^(i+1))` ns (bucket 0 also holds 0).
    pub delay_histogram: Vec<u64>,
}

const HIST_BUCKETS: usize = 32;

/// The counters of one engine (also the layout of an instance slot).
#[derive(Default)]
#[repr(C)]
pub(crate) struct Counters {
    faults: AtomicU64,
    fetches: AtomicU64,
    evictions: AtomicU64,
    writebacks: AtomicU64,
    injected: AtomicU64,
    modelled: AtomicU64,
    local: AtomicU64,
    soft: AtomicU64,
    parks: AtomicU64,
    handled: AtomicU64,
    unshared: AtomicU64,
    hist: [AtomicU64; HIST_BUCKETS],
}

impl Counters {
    fn all(&self) -> impl Iterator<Item = &AtomicU64> {
        [
            &self.faults,
            &self.fetches,
            &self.evictions,
            &self.writebacks,
            &self.injected,
            &self.modelled,
            &self.local,
            &self.soft,
            &self.parks,
            &self.handled,
            &self.unshared,
        ]
        .into_iter()
        .chain(self.hist.iter())
    }

    pub(crate) fn clear(&self) {
        self.all().for_each(|a| a.store(0, Ordering::Relaxed));
    }

    pub(crate) fn copy_from(&self, other: &Counters) {
        for (d, s) in self.all().zip(other.all()) {
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Adds `other`'s counts to these (not its local pages: a gauge).
    pub(crate) fn add_from(&self, other: &Counters) {
        for (d, s) in self.all().zip(other.all()) {
            if !std::ptr::eq(d, &self.local) {
                d.fetch_add(s.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// The counters as [`Stats`], with the calibration `(floor, unseen)`.
    pub(crate) fn snapshot(&self, (floor_ns, unseen_ns): (u64, u64)) -> Stats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut hist: Vec<u64> = self.hist.iter().map(get).collect();
        while hist.len() > 1 && hist.last() == Some(&0) {
            hist.pop();
        }
        Stats {
            page_fault_count: get(&self.faults),
            remote_fetches: get(&self.fetches),
            evictions: get(&self.evictions),
            writebacks: get(&self.writebacks),
            injected_delay_ns: get(&self.injected),
            modelled_delay_ns: get(&self.modelled),
            floor_ns,
            unseen_ns,
            soft_faults: get(&self.soft),
            parks: get(&self.parks),
            local_pages_now: get(&self.local),
            handler_ns: get(&self.handled),
            unshared_pages: get(&self.unshared),
            delay_histogram: hist,
        }
    }
}

impl Stats {
    /// The sum of several engines' counters (the calibration of the first).
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a Stats>) -> Stats {
        let mut t = Stats::default();
        for s in all {
            if t.floor_ns == 0 {
                t.floor_ns = s.floor_ns;
                t.unseen_ns = s.unseen_ns;
            }
            t.page_fault_count += s.page_fault_count;
            t.remote_fetches += s.remote_fetches;
            t.evictions += s.evictions;
            t.writebacks += s.writebacks;
            t.injected_delay_ns += s.injected_delay_ns;
            t.modelled_delay_ns += s.modelled_delay_ns;
            t.soft_faults += s.soft_faults;
            t.parks += s.parks;
            t.local_pages_now += s.local_pages_now;
            t.handler_ns += s.handler_ns;
            t.unshared_pages += s.unshared_pages;
            if t.delay_histogram.len() < s.delay_histogram.len() {
                t.delay_histogram.resize(s.delay_histogram.len(), 0);
            }
            for (d, v) in t.delay_histogram.iter_mut().zip(&s.delay_histogram) {
                *d += v;
            }
        }
        t
    }
}

/// New regions of the program found outside the engine (the preload shim
/// traps `mmap` and friends and registers what they map): called when a
/// fault lands outside every known region, and when woken; it appends the
/// ranges to emulate.
pub type Discover = Box<dyn FnMut(&mut Vec<Region>) + Send>;

/// Optional ways an engine is tied to the rest of the world.
#[derive(Default)]
pub struct Hooks {
    /// Finds regions the program mapped since (see [`Discover`]).
    pub discover: Option<Discover>,
    /// The instance this engine is a member of, and its slot there: the
    /// instance's settings and shared budget replace `Config`'s, and the
    /// counters are published to the slot.
    pub instance: Option<(Arc<instance::Instance>, usize)>,
    /// Called first thing on the handler thread (to note its thread id,
    /// say, so that a system-call trap can leave its calls alone).
    pub on_start: Option<Box<dyn FnOnce() + Send>>,
}

impl Shared {
    fn record(&self, addr: u64, kind: TraceKind) {
        if !self.tracing.load(Ordering::Relaxed) {
            return;
        }
        let t_ns = self.started.elapsed().as_nanos() as u64;
        let mut t = self.trace.lock().unwrap_or_else(|e| e.into_inner());
        if t.events.len() < t.capacity {
            t.events.push(TraceEvent { t_ns, addr, kind });
        } else {
            t.dropped += 1;
        }
    }
}

struct Shared {
    config: Mutex<Config>,
    /// The configuration changed: fit the budget.
    changed: AtomicBool,
    /// Stop serving faults.
    stop: AtomicBool,
    /// Placements to apply.
    placements: Mutex<Vec<(Region, Placement)>>,
    /// The trace, when recording.
    trace: Mutex<Trace>,
    tracing: AtomicBool,
    started: Instant,
    /// Regions to add, each with where to send the outcome.
    adds: Mutex<Vec<(Region, reply::Tx<Result<()>>)>>,
    /// Requests to pause, each with where to send the outcome.
    pauses: Mutex<Vec<reply::Tx<Result<()>>>>,
    /// Paused: no page is evicted (see [`FarMemory::pause`]).
    paused: AtomicBool,
    counters: Counters,
    floor_ns: AtomicU64,
    unseen_ns: u64,
}

/// One emulated far memory over regions of the calling process.
pub struct FarMemory {
    uffd_fd: RawFd,
    shared: Arc<Shared>,
    regions: Vec<Region>,
    /// Writing a byte wakes the handler to look at `changed` and `stop`.
    wake: std::io::PipeWriter,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for FarMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarMemory")
            .field("regions", &self.regions)
            .field("config", &self.config())
            .finish()
    }
}

impl FarMemory {
    /// Emulates far memory for `regions` (see the module docs for what the
    /// caller guarantees) with `policy`. Their pages become remote now:
    /// populated pages are moved into the engine's store (without delay), so
    /// the next access to each one is a fetch. `calibration` says what a
    /// fault costs here ([`calibrate`]): its unseen part is taken off every
    /// injected delay, and its floor is reported in the [`Stats`].
    /// [`Calibration::NONE`] injects the whole modelled delay on top of the
    /// engine's own cost.
    pub fn new(
        regions: &[Region],
        config: Config,
        policy: Box<dyn Policy>,
        calibration: Calibration,
    ) -> Result<Self> {
        Self::new_with(regions, config, policy, calibration, Hooks::default())
    }

    /// [`FarMemory::new`] with [`Hooks`].
    pub fn new_with(
        regions: &[Region],
        config: Config,
        policy: Box<dyn Policy>,
        calibration: Calibration,
        hooks: Hooks,
    ) -> Result<Self> {
        if config.local_pages == 0 {
            return Err(Error::Invalid("local_pages must be at least 1".into()));
        }
        if regions.is_empty() {
            return Err(Error::Invalid("no region to emulate".into()));
        }
        let sorted = crate::region::sorted_disjoint(regions)?;
        crate::procfs::check_mapped_writable(&sorted)?;
        let shared = Arc::new(Shared {
            config: Mutex::new(config),
            changed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            placements: Mutex::new(Vec::new()),
            adds: Mutex::new(Vec::new()),
            pauses: Mutex::new(Vec::new()),
            paused: AtomicBool::new(false),
            trace: Mutex::new(Trace::default()),
            tracing: AtomicBool::new(false),
            started: Instant::now(),
            counters: Counters::default(),
            floor_ns: AtomicU64::new(calibration.floor_ns),
            unseen_ns: calibration.unseen_ns,
        });
        let (wake_r, wake_w) =
            std::io::pipe().map_err(|e| Error::os("creating the engine's wake pipe", e))?;
        let sh = shared.clone();
        // The handler thread exists before any page becomes remote: starting
        // a thread may touch the program's memory (the C library's own
        // state), which only a running handler can serve.
        let (ready_tx, ready_rx) = reply::channel()?;
        let regions = sorted.clone();
        let unseen_ns = calibration.unseen_ns;
        let thread = std::thread::Builder::new()
            .name("pagewise-farmem".into())
            .spawn(move || {
                if let Some(f) = hooks.on_start {
                    f();
                }
                let mut engine = match Engine::new(&[], policy, unseen_ns) {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(());
                    }
                };
                engine.discover = hooks.discover;
                engine.inst = hooks.instance;
                // This thread's thread-local bookkeeping may sit in the very
                // heap it emulates: it must never fault there.
                if let Some((a, b)) = pagewise_sys::tls::dtv_range() {
                    let a = a & !(PAGE_SIZE as u64 - 1);
                    let pages = (b - a).div_ceil(PAGE_SIZE as u64);
                    engine
                        .excluded
                        .push(crate::region::PageRange { start: a, pages });
                }
                let pieces: Vec<Region> = regions.iter().flat_map(|r| engine.carve(*r)).collect();
                for r in pieces {
                    if let Err(e) = engine.add_region(r) {
                        let _ = ready_tx.send(Err(e));
                        return Ok(());
                    }
                }
                let _ = ready_tx.send(Ok(engine.uffd.as_raw_fd()));
                engine.run(&sh, wake_r);
                Ok(())
            })
            .map_err(|e| Error::os("starting the far-memory handler thread", e))?;
        let uffd_fd = match ready_rx.recv() {
            Ok(r) => r?,
            Err(_) => return Err(Error::Invalid("the far-memory handler thread died".into())),
        };
        Ok(FarMemory {
            uffd_fd,
            shared,
            regions: sorted,
            wake: wake_w,
            thread: Some(thread),
        })
    }

    /// Tells the handler that something changed (`changed`, then a byte on
    /// its wake pipe, which names the change in a trace of system calls).
    fn poke(&mut self, what: &[u8; 1]) -> Result<()> {
        self.shared.changed.store(true, Ordering::Release);
        self.wake
            .write_all(what)
            .map_err(|e| Error::os("waking the far-memory handler", e))
    }

    /// The emulated regions, sorted.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The configuration now.
    pub fn config(&self) -> Config {
        *self.shared.config.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the configuration at once: a smaller budget evicts down to it
    /// before the next fault is served.
    pub fn set(&mut self, config: Config) -> Result<()> {
        if config.local_pages == 0 {
            return Err(Error::Invalid("local_pages must be at least 1".into()));
        }
        *self.shared.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
        self.poke(b"c")
    }

    /// Emulates one more region (mapped, writable, private anonymous, not
    /// overlapping the others), also while other threads use it: its
    /// populated pages become remote. Returns once it is emulated.
    pub fn add(&mut self, region: Region) -> Result<()> {
        crate::procfs::check_mapped_writable(&[region])?;
        let (tx, rx) = reply::channel()?;
        self.shared
            .adds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((region, tx));
        self.poke(b"a")?;
        rx.recv()
            .map_err(|_| Error::Invalid("the far-memory handler stopped".into()))??;
        self.regions.push(region);
        self.regions.sort();
        Ok(())
    }

    /// Pauses eviction and maps every remote page back (faults are still
    /// served, without evicting): the regions then hold all their data, as
    /// a `fork` needs for the child to have correct memory. Returns once
    /// done; [`FarMemory::resume`] evicts down to the budget again.
    pub fn pause(&mut self) -> Result<()> {
        let (tx, rx) = reply::channel()?;
        self.shared
            .pauses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        self.poke(b"f")?;
        rx.recv()
            .map_err(|_| Error::Invalid("the far-memory handler stopped".into()))?
    }

    /// Ends a [`FarMemory::pause`]: evicts down to the budget.
    pub fn resume(&mut self) -> Result<()> {
        self.shared.paused.store(false, Ordering::Release);
        self.poke(b"r")
    }

    /// Places `range` (inside the emulated regions): see [`Placement`].
    /// Takes effect before the next fault is served.
    pub fn place(&mut self, range: Region, placement: Placement) -> Result<()> {
        if !self
            .regions
            .iter()
            .any(|r| r.start <= range.start && range.end() <= r.end())
        {
            return Err(Error::Invalid(format!(
                "{:#x}+{:#x} is not inside one emulated region",
                range.start, range.len
            )));
        }
        self.shared
            .placements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((range, placement));
        self.poke(b"p")
    }

    /// Starts recording a trace of (time, address, fetch/evict) events,
    /// keeping at most `capacity` of them until [`FarMemory::take_trace`].
    pub fn trace(&mut self, capacity: usize) {
        let mut t = self.shared.trace.lock().unwrap_or_else(|e| e.into_inner());
        t.on = true;
        t.capacity = capacity;
        self.shared.tracing.store(true, Ordering::Release);
    }

    /// The events recorded since the last call, and how many did not fit.
    pub fn take_trace(&mut self) -> (Vec<TraceEvent>, u64) {
        let mut t = self.shared.trace.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = std::mem::take(&mut t.dropped);
        (std::mem::take(&mut t.events), dropped)
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot((
            self.shared.floor_ns.load(Ordering::Relaxed),
            self.shared.unseen_ns,
        ))
    }

    /// The userfaultfd the regions are registered with: a [`Discover`]
    /// source registers the ranges it reports with it (missing mode) before
    /// the program can touch them.
    pub fn uffd(&self) -> RawFd {
        self.uffd_fd
    }

    /// Publishes the counters to slot `slot` of `inst` now (the handler
    /// publishes after every event; this is for a process about to exit).
    pub fn publish_to(&self, inst: &instance::Instance, slot: usize) {
        inst.publish(slot, &self.shared.counters, inst.published(slot).1);
    }

    /// A handle that wakes the engine (for a [`Discover`] source with news).
    pub fn waker(&self) -> Result<std::io::PipeWriter> {
        self.wake
            .try_clone()
            .map_err(|e| Error::os("duplicating the engine's wake pipe", e))
    }

    /// Stops emulating: every remote page is mapped back with its contents,
    /// and the regions are plain memory again. Returns the final counters.
    pub fn stop(mut self) -> Result<Stats> {
        self.shutdown()?;
        Ok(self.stats())
    }

    fn shutdown(&mut self) -> Result<()> {
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.wake.write_all(b"s");
        match t.join() {
            Ok(r) => r,
            Err(_) => Err(Error::Invalid(
                "the far-memory handler thread panicked".into(),
            )),
        }
    }
}

impl Drop for FarMemory {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("pagewise farmem: stopping: {e}");
        }
    }
}

/// Where a page's contents are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
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

/// The name of every staging mapping: `/proc/PID/maps` shows
/// `[anon:pagewise-farmem-staging]` where the kernel names mappings.
pub const STAGING_NAME: &std::ffi::CStr = c"pagewise-farmem-staging";

/// The handler thread's state.
///
/// Remote pages are *moved* (`UFFDIO_MOVE`, no copy) between the region and
/// a staging mapping of the same size. The region is registered with one
/// userfaultfd (missing faults, and the program's `MADV_DONTNEED` and
/// `munmap` as events); the staging mappings with a second one, which asks
/// for no events, so that dropping a staging page never waits on the handler.
struct Engine {
    uffd: OwnedFd,
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
    /// Fingerprint of each local page when it was fetched (for write-backs).
    fetched: Vec<crate::hash::PageHash>,
    /// Placement of each page.
    class: Vec<Placement>,
    /// Always-remote pages mapped since the last fault.
    visiting: Vec<usize>,
    /// Local pages that count against the budget.
    local: usize,
    policy: Box<dyn Policy>,
    link: Link,
    injector: Injector,
    walker: crate::walk::PageWalker,
    /// Pages with data (not `RemoteZero`).
    data: usize,
    discover: Option<Discover>,
    inst: Option<(Arc<instance::Instance>, usize)>,
    /// The instance generation applied.
    generation: u64,
    /// Work that met `EAGAIN` (the address space changing under an event
    /// not read yet), done once the events are read: staged pages to move
    /// to where the program moved their range, ranges to adopt, then faults.
    moves: Vec<(u64, u64)>,
    adopts: Vec<Region>,
    later: Vec<(u64, Instant)>,
    /// Pages never emulated: the handler thread's own thread-local
    /// bookkeeping, which the C library keeps in the program's heap.
    excluded: Vec<crate::region::PageRange>,
    /// The coverage request applied, one still to apply, and when the open
    /// window began.
    coverage: u64,
    coverage_todo: Option<u64>,
    window: Option<Instant>,
    /// Where a staged page is copied to be fingerprinted.
    page_buf: Vec<u8>,
}

/// The handler met an error it cannot recover from: its books no longer
/// match the memory. The program must neither run on with pages that may be
/// wrong nor wait forever on faults no one serves: the process is aborted,
/// while the userfaultfd is still open (closing it first would let the
/// waiting threads run on over holes that read as zeros).
fn fail(e: &Error) -> ! {
    let msg = format!(
        "pagewise farmem: the fault handler failed: {e}; aborting the process, \
         whose emulated memory can no longer be trusted\n"
    );
    // Straight to the file descriptor: a thread waiting on a fault may hold
    // the lock of the standard error stream.
    // SAFETY: write(2) of a valid buffer.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort();
}

/// The parts of `r` mapped now as private anonymous writable memory.
fn live_pieces(r: Region) -> Vec<Region> {
    let Ok(maps) = crate::procfs::maps(None) else {
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

/// Whether `e` is `EAGAIN`: the address space is changing under a
/// userfaultfd event not read yet; read events, then try again.
fn again(e: &Error) -> bool {
    matches!(e, Error::Os { source, .. } if source.raw_os_error() == Some(libc::EAGAIN))
}

fn open_uffd(features: u64) -> Result<OwnedFd> {
    // Non-blocking: poll may report a message another wake-up consumed.
    let (fd, _) =
        uffd::open(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(|e| Error::Unsupported {
            feature: "userfaultfd",
            why: e.to_string(),
        })?;
    uffd::api(fd.as_raw_fd(), features).map_err(|e| Error::Unsupported {
        feature: "userfaultfd move and events",
        why: format!("UFFDIO_API with features {features:#x}: {e}"),
    })?;
    Ok(fd)
}

impl Engine {
    fn new(regions: &[Region], policy: Box<dyn Policy>, unseen_ns: u64) -> Result<Self> {
        use uffd::feature as f;
        let mut e = Engine {
            uffd: open_uffd(f::MOVE | f::EVENT_REMOVE | f::EVENT_UNMAP | f::EVENT_REMAP)?,
            // SIGBUS: a read of a staging page that is not there fails at
            // once instead of waiting for a handler that is the reader.
            stage_uffd: open_uffd(
                f::MOVE
                    | if crate::probe::get().uffd_has(f::SIGBUS) {
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
            class: Vec::new(),
            visiting: Vec::new(),
            pages: Vec::new(),
            local: 0,
            policy,
            link: Link::default(),
            injector: Injector::new(unseen_ns),
            walker: crate::walk::PageWalker::new(None)?,
            data: 0,
            discover: None,
            inst: None,
            generation: 0,
            moves: Vec::new(),
            adopts: Vec::new(),
            later: Vec::new(),
            excluded: Vec::new(),
            coverage: 0,
            coverage_todo: None,
            window: None,
        };
        for r in regions {
            e.add_region(*r)?;
        }
        Ok(e)
    }

    /// Starts emulating `r` (mapped, writable, private anonymous, overlapping
    /// no emulated region), also while other threads use it: it is registered
    /// first, then its populated pages are moved to staging, each move atomic
    /// against a racing write. Its pages get the next global indices.
    fn add_region(&mut self, r: Region) -> Result<()> {
        self.check_disjoint(r)?;
        let reg = |fd: &OwnedFd, start: u64, len: u64| {
            uffd::register(fd.as_raw_fd(), start, len, uffd::REGISTER_MODE_MISSING)
                .map_err(|e| Error::os(format!("UFFDIO_REGISTER of {start:#x}+{len:#x}"), e))
        };
        reg(&self.uffd, r.start, r.len)?;
        let st = match self.new_staging(r) {
            Ok(st) => st,
            Err(e) => {
                let _ = uffd::unregister(self.uffd.as_raw_fd(), r.start, r.len);
                return Err(e);
            }
        };
        // A move stays inside one mapping, and the program may have split
        // the range into several (by madvise(MADV_HUGEPAGE), say): moves go
        // one mapping at a time.
        let pieces: Vec<(u64, u64)> = match crate::procfs::maps(None) {
            Ok(maps) => maps
                .iter()
                .filter(|m| m.start < r.end() && r.start < m.end)
                .map(|m| (m.start.max(r.start), m.end.min(r.end())))
                .collect(),
            Err(_) => vec![(r.start, r.end())],
        };
        // Every populated page becomes remote now: moved to staging.
        for &(a, b) in &pieces {
            if let Err(e) = uffd::move_pages(
                self.stage_uffd.as_raw_fd(),
                st.addr() + (a - r.start),
                a,
                b - a,
                uffd::MOVE_MODE_DONTWAKE | uffd::MOVE_MODE_ALLOW_SRC_HOLES,
            ) {
                // Whatever reached staging goes back before the region is let go.
                for &(a, b) in &pieces {
                    let _ = uffd::move_pages(
                        self.uffd.as_raw_fd(),
                        a,
                        st.addr() + (a - r.start),
                        b - a,
                        uffd::MOVE_MODE_ALLOW_SRC_HOLES,
                    );
                }
                let _ = uffd::unregister(self.stage_uffd.as_raw_fd(), st.addr(), r.len);
                let _ = uffd::unregister(self.uffd.as_raw_fd(), r.start, r.len);
                return Err(Error::os(
                    format!("UFFDIO_MOVE of {:#x}+{:#x} to staging", a, b - a),
                    e,
                ));
            }
        }
        let slot = self.push_region(r, st);
        // What is in staging now is what the region held.
        let st = self.staging[slot].region();
        let mut runs = Vec::new();
        self.walker.populated(st, &mut runs)?;
        for &(a, b) in &runs {
            let i0 = ((a - st.start) / PAGE_SIZE as u64) as usize;
            let i1 = ((b - st.start) / PAGE_SIZE as u64) as usize;
            for i in i0..i1 {
                self.put(self.first[slot] + i, Where::Remote);
            }
        }
        Ok(())
    }

    /// Fails when `r` overlaps an emulated region.
    fn check_disjoint(&self, r: Region) -> Result<()> {
        if self
            .regions
            .iter()
            .any(|e| e.start < r.end() && r.start < e.end())
        {
            return Err(Error::Invalid(format!(
                "{:#x}+{:#x} overlaps an emulated region",
                r.start, r.len
            )));
        }
        Ok(())
    }

    /// A staging mapping for region `r`, registered with the staging
    /// userfaultfd. It holds only the remote pages: reserved, not committed;
    /// named, so that an inspector can tell it from the program's memory.
    fn new_staging(&self, r: Region) -> Result<AnonMemory> {
        let st = AnonMemory::reserve(r.len as usize)?;
        let _ = mem::name_anon(st.addr(), st.len(), STAGING_NAME);
        uffd::register(
            self.stage_uffd.as_raw_fd(),
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
    fn push_region(&mut self, r: Region, st: AnonMemory) -> usize {
        let slot = self.regions.len();
        self.first.push(self.pages.len());
        self.pages
            .resize(self.pages.len() + r.pages() as usize, Where::RemoteZero);
        self.fetched.resize(self.pages.len(), 0);
        self.class.resize(self.pages.len(), Placement::Normal);
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
    fn cover(&mut self, start: u64, end: u64) -> Result<()> {
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

    /// Sets where page `g` is, keeping the count of pages with data.
    fn put(&mut self, g: usize, w: Where) {
        let before = self.pages[g] != Where::RemoteZero;
        let after = w != Where::RemoteZero;
        self.pages[g] = w;
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

    /// Serves faults and events until stopped; then maps every page back.
    /// Never returns on an error (see [`fail`]).
    fn run(mut self, sh: &Shared, mut wake: std::io::PipeReader) {
        let fds: [RawFd; 2] = [self.uffd.as_raw_fd(), wake.as_raw_fd()];
        // A member of an instance also looks at it while idle, so that a
        // smaller budget set from outside applies without a fault.
        let idle_ms = if self.inst.is_some() { 50 } else { -1 };
        let result = loop {
            if sh.stop.load(Ordering::Acquire) {
                break Ok(());
            }
            self.follow_instance(sh);
            if sh.changed.swap(false, Ordering::AcqRel) {
                if let Err(e) = self.fit_budget(sh) {
                    break Err(e);
                }
            }
            if let Err(e) = self.apply_coverage(sh) {
                break Err(e);
            }
            // Messages first; poll (one more system call) only when none is waiting.
            let msg = match uffd::read_msg(self.uffd.as_raw_fd()) {
                Ok(m) => m,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    if !(self.moves.is_empty() && self.adopts.is_empty() && self.later.is_empty()) {
                        match self.settle(sh) {
                            Ok(true) => {}
                            Ok(false) => std::thread::yield_now(),
                            Err(e) => break Err(e),
                        }
                        self.publish(sh);
                        continue;
                    }
                    match uffd::poll_readable(&fds, idle_ms) {
                        Ok(ready) if ready & 2 != 0 => {
                            let mut b = [0u8; 16];
                            let _ = wake.read(&mut b);
                            if let Err(e) = self.discover_now() {
                                break Err(e);
                            }
                        }
                        Ok(_) => {}
                        Err(e) => break Err(Error::os("poll of the userfaultfd", e)),
                    }
                    continue;
                }
                Err(e) => break Err(Error::os("reading the userfaultfd", e)),
            };
            let arrived = Instant::now();
            let r = match msg.event {
                uffd::event::PAGEFAULT => {
                    let addr = msg.pf_address();
                    if !(self.moves.is_empty() && self.adopts.is_empty()) {
                        self.later.push((addr, arrived));
                        Ok(())
                    } else {
                        match self.fault(sh, addr, arrived) {
                            Err(e) if again(&e) => {
                                self.later.push((addr, arrived));
                                Ok(())
                            }
                            r => r,
                        }
                    }
                }
                uffd::event::REMOVE | uffd::event::UNMAP => {
                    let (start, end) = msg.range();
                    self.dropped(sh, start, end)
                }
                uffd::event::REMAP => {
                    let (from, to, len) = msg.remap();
                    self.remapped(sh, from, to, len)
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                break Err(e);
            }
            self.publish(sh);
        };
        if let Err(e) = result.and_then(|()| self.bring_all_back()) {
            fail(&e);
        }
    }

    /// Does the work that met `EAGAIN`, in order (moves, then adoptions,
    /// then faults, each needing the one before). Returns whether anything
    /// got done.
    fn settle(&mut self, sh: &Shared) -> Result<bool> {
        let mut progress = false;
        for (src, dst) in std::mem::take(&mut self.moves) {
            match uffd::move_pages(
                self.uffd.as_raw_fd(),
                dst,
                src,
                PAGE_SIZE as u64,
                uffd::MOVE_MODE_DONTWAKE,
            ) {
                Ok(()) => progress = true,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => self.moves.push((src, dst)),
                // The destination went away or was filled meanwhile: the
                // program dropped that range.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::EEXIST | libc::EINVAL)
                    ) =>
                {
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
                Err(e) if again(&e) => self.adopts.push(r),
                Err(e) => return Err(e),
            }
        }
        if !self.adopts.is_empty() {
            return Ok(progress);
        }
        for (addr, arrived) in std::mem::take(&mut self.later) {
            match self.fault(sh, addr, arrived) {
                Ok(()) => progress = true,
                Err(e) if again(&e) => self.later.push((addr, arrived)),
                Err(e) => return Err(e),
            }
        }
        Ok(progress)
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

    /// Opens or closes a coverage window as the instance asks (see the
    /// module docs).
    fn apply_coverage(&mut self, sh: &Shared) -> Result<()> {
        let Some(req) = self.coverage_todo else {
            return Ok(());
        };
        if !(self.moves.is_empty() && self.adopts.is_empty() && self.later.is_empty()) {
            // Not while the address space is changing: after the events.
            return Ok(());
        }
        if req % 2 == 1 {
            // Open: every local page leaves, so its next access is seen.
            for g in 0..self.pages.len() {
                if self.pages[g] != Where::Local || self.class[g] != Placement::Normal {
                    continue;
                }
                self.policy.removed(g);
                match self.evict(sh, g) {
                    Ok(_) => {}
                    Err(e) if again(&e) => {
                        // Try the whole sweep again after the events.
                        self.policy.inserted(g);
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
            self.window = Some(Instant::now());
        } else if let Some(t0) = self.window.take() {
            let report = self.coverage_report(req, t0);
            // Everything local again, as the program had it, before the
            // report says the window is closed.
            self.bring_back(sh)?;
            if let Some((inst, _)) = &self.inst {
                let path = inst.coverage_path(report.pid);
                let tmp = path.with_extension("tmp");
                let body = serde_json::to_vec(&report)
                    .map_err(|e| Error::Invalid(format!("coverage report: {e}")))?;
                std::fs::write(&tmp, body)
                    .and_then(|_| std::fs::rename(&tmp, &path))
                    .map_err(|e| Error::os(format!("writing {}", path.display()), e))?;
            }
        }
        self.coverage = req;
        self.coverage_todo = None;
        Ok(())
    }

    /// Per 2 MiB region, the pages touched since the window opened.
    fn coverage_report(&self, request: u64, t0: Instant) -> crate::access::CoverageReport {
        let mut regions: Vec<[u64; 4]> = Vec::new();
        for &ri in &self.order {
            let r = self.regions[ri];
            for i in 0..r.pages() as usize {
                let w = self.pages[self.first[ri] + i];
                crate::access::tally(
                    &mut regions,
                    r.start + (i * PAGE_SIZE) as u64,
                    w != Where::RemoteZero,
                    w == Where::Local,
                );
            }
        }
        crate::access::CoverageReport {
            pid: std::process::id() as i32,
            request,
            window_ns: t0.elapsed().as_nanos() as u64,
            regions,
        }
    }

    /// Publishes the counters to the instance slot.
    fn publish(&self, sh: &Shared) {
        if let Some((inst, slot)) = &self.inst {
            inst.publish(*slot, &sh.counters, self.data as u64);
        }
    }

    /// Local pages counted against the budget now, and the budget.
    fn load(&self, cfg: &Config) -> (u64, u64) {
        let Some((inst, slot)) = &self.inst else {
            return (self.local as u64, cfg.local_pages as u64);
        };
        // The instance holds every member's published figures, ours as of
        // the last event: replace ours with the current ones.
        let (local, data) = inst.totals();
        let (pub_local, pub_data) = inst.published(*slot);
        let local = local - pub_local + self.local as u64;
        let data = data - pub_data + self.data as u64;
        (local, inst.budget(&inst.settings(), data))
    }

    /// Asks the [`Discover`] hook for new regions and emulates them.
    fn discover_now(&mut self) -> Result<()> {
        let Some(d) = self.discover.as_mut() else {
            return Ok(());
        };
        let mut found = Vec::new();
        d(&mut found);
        for r in found {
            self.adopt(r)?;
        }
        Ok(())
    }

    /// Emulates `r` (which the program just mapped or moved): the parts no
    /// region covers become new regions; in the parts one covers, pages
    /// that hold data the engine does not know of become remote.
    fn adopt(&mut self, r: Region) -> Result<()> {
        for piece in self.carve(r) {
            self.adopt_piece(piece)?;
        }
        Ok(())
    }

    /// [`Engine::adopt`] of a range holding none of the engine's own pages.
    fn adopt_piece(&mut self, r: Region) -> Result<()> {
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
    fn carve(&self, r: Region) -> Vec<Region> {
        let mut out_of_bounds: Vec<crate::region::PageRange> = self
            .staging
            .iter()
            .map(|st| st.mapping())
            .filter(|&(a, b)| a < r.end() && r.start < b)
            .map(|(a, b)| crate::region::PageRange {
                start: a,
                pages: (b - a) / PAGE_SIZE as u64,
            })
            .collect();
        if self.excluded.is_empty() && out_of_bounds.is_empty() {
            return vec![r];
        }
        out_of_bounds.extend(self.excluded.iter().copied());
        out_of_bounds.sort_by_key(|p| p.start);
        let whole = [crate::region::PageRange {
            start: r.start,
            pages: r.pages(),
        }];
        crate::region::subtract_sorted(&whole, &out_of_bounds)
            .into_iter()
            .filter_map(|p| Region::new(p.start, p.len()).ok())
            .collect()
    }

    /// Adds `[a, b)`, found by discovery; a range gone again meanwhile (its
    /// registration fails) is skipped.
    fn add_found(&mut self, a: u64, b: u64) {
        let Ok(whole) = Region::new(a, b - a) else {
            return;
        };
        for r in self.carve(whole) {
            match self.add_region(r) {
                Ok(()) => {}
                Err(e) if again(&e) => self.adopts.push(r),
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
    fn reclaim(&mut self, a: u64, b: u64) -> Result<()> {
        let Ok(r) = Region::new(a, b - a) else {
            return Ok(());
        };
        let mut runs = Vec::new();
        self.walker.populated(r, &mut runs)?;
        for (x, y) in runs {
            let mut addr = x;
            while addr < y {
                if let Some((_, g, _)) = self.locate(addr) {
                    if self.pages[g] == Where::RemoteZero {
                        let (_, _, _, staged) = self.addr_of(g);
                        // No holes allowed: a page gone since the walk
                        // (ENOENT) must not be taken for one in staging.
                        match uffd::move_pages(
                            self.stage_uffd.as_raw_fd(),
                            staged,
                            addr,
                            PAGE_SIZE as u64,
                            uffd::MOVE_MODE_DONTWAKE,
                        ) {
                            Ok(()) => self.put(g, Where::Remote),
                            // Shared with another process: left where it is;
                            // gone meanwhile: zeros, as the books say.
                            Err(e)
                                if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOENT)) => {
                            }
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

    /// The program moved `[from, from+len)` to `to` (`mremap`; the pages
    /// the kernel held moved with the mapping). The books follow at once,
    /// before the program can move the range again: local pages stay local
    /// at their new address, remote ones move from their staging slot to
    /// the new address's (staging is the engine's alone, so this never
    /// races the program). Then the new range is adopted like a new mapping,
    /// for pages of it the engine did not emulate before.
    fn remapped(&mut self, sh: &Shared, from: u64, to: u64, len: u64) -> Result<()> {
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
                    match self.class[d] {
                        Placement::Normal => {
                            self.local += 1;
                            self.policy.inserted(d);
                        }
                        Placement::AlwaysRemote => self.visiting.push(d),
                        Placement::PinnedLocal => {}
                    }
                }
                // Moved by the kernel; adopted below.
                (Where::Local, None) => {}
                (Where::Remote | Where::Parked, Some(d)) => {
                    let (_, _, _, to_staged) = self.addr_of(d);
                    uffd::move_pages(
                        self.stage_uffd.as_raw_fd(),
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
    fn dropped(&mut self, sh: &Shared, start: u64, end: u64) -> Result<()> {
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

    /// Adds new regions, applies new placements, then evicts until the
    /// budget holds.
    fn fit_budget(&mut self, sh: &Shared) -> Result<()> {
        let adds = std::mem::take(&mut *sh.adds.lock().unwrap_or_else(|e| e.into_inner()));
        for (region, reply) in adds {
            let _ = reply.send(self.add_region(region));
        }
        let pauses = std::mem::take(&mut *sh.pauses.lock().unwrap_or_else(|e| e.into_inner()));
        if !pauses.is_empty() {
            sh.paused.store(true, Ordering::Release);
            let r = self.bring_back(sh);
            for reply in pauses {
                let _ = reply.send(match &r {
                    Ok(()) => Ok(()),
                    Err(e) => Err(Error::Invalid(e.to_string())),
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
                            self.evict(sh, g)?;
                        }
                        Placement::PinnedLocal => {}
                    }
                }
            }
            sh.counters
                .local
                .store(self.local as u64, Ordering::Relaxed);
        }
        let cfg = *sh.config.lock().unwrap_or_else(|e| e.into_inner());
        let (total, budget) = self.load(&cfg);
        if total > budget {
            // Each member of an instance gives up its share of the excess
            // (alone, that is all of it).
            let local = self.local as u64;
            let target = local - ((total - budget) * local).div_ceil(total).min(local);
            while self.local as u64 > target {
                match self.evict_victim(sh) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) if again(&e) => {
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
    fn evict_victim(&mut self, sh: &Shared) -> Result<Option<bool>> {
        let Some(v) = self.policy.victim() else {
            return Ok(None);
        };
        let dirty = match self.evict(sh, v) {
            Ok(d) => d,
            Err(e) => {
                // Still local: back into the policy.
                self.policy.inserted(v);
                return Err(e);
            }
        };
        let mut park = Vec::new();
        self.policy.to_park(&mut park);
        for p in park {
            self.park(sh, p)?;
        }
        Ok(Some(dirty))
    }

    /// Whether one page sits at `dst` and none at `src`: a move between them
    /// happened. (Racing a write that breaks the zero page's copy-on-write,
    /// `UFFDIO_MOVE` has been seen to move the page and still answer
    /// `EEXIST`; the page tables are the truth.)
    fn moved_anyway(&mut self, dst: u64, src: u64) -> Result<bool> {
        Ok(self.present(dst)? && !self.present(src)?)
    }

    /// Whether a page is mapped at `addr` (never touching it).
    fn present(&mut self, addr: u64) -> Result<bool> {
        let one = Region::new(addr & !(PAGE_SIZE as u64 - 1), PAGE_SIZE as u64)?;
        let mut runs = Vec::new();
        self.walker.populated(one, &mut runs)?;
        Ok(!runs.is_empty())
    }

    /// Moves local page `g` to staging but keeps it local (see [`policy`]).
    fn park(&mut self, sh: &Shared, g: usize) -> Result<()> {
        if self.pages[g] != Where::Local {
            return Ok(());
        }
        let (_, _, addr, staged) = self.addr_of(g);
        match uffd::move_pages(
            self.stage_uffd.as_raw_fd(),
            staged,
            addr,
            PAGE_SIZE as u64,
            uffd::MOVE_MODE_DONTWAKE,
        ) {
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
                    Some(libc::ENOENT | libc::EBUSY | libc::EAGAIN)
                ) =>
            {
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

    fn fault(&mut self, sh: &Shared, addr: u64, arrived: Instant) -> Result<()> {
        let fd = self.uffd.as_raw_fd();
        if self.locate(addr).is_none() {
            self.discover_now()?;
        }
        let Some((_, g, _)) = self.locate(addr) else {
            // Registered but not (or no longer) emulated: fresh memory,
            // zeros; a wake-up if mapped meanwhile.
            let page = addr & !(PAGE_SIZE as u64 - 1);
            return match uffd::zeropage(fd, page, PAGE_SIZE as u64) {
                Ok(()) => Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    Err(Error::os("UFFDIO_ZEROPAGE", e))
                }
                Err(_) => {
                    uffd::wake(fd, page, PAGE_SIZE as u64).map_err(|e| Error::os("UFFDIO_WAKE", e))
                }
            };
        };
        if self.pages[g] == Where::Local {
            // Mapped already (two threads faulted on it), or dropped behind
            // our back: zeros then, and a wake-up either way.
            return self.map(Where::RemoteZero, g);
        }
        if self.pages[g] == Where::Parked {
            // A soft fault: the page is local, its policy learns it was used.
            // Book-keeping first (the move wakes the faulting thread, which
            // may look at the counters at once); undone if the move must
            // wait for pending events, so the page is still parked when the
            // fault is served again.
            let (_, _, addr, staged) = self.addr_of(g);
            self.put(g, Where::Local);
            sh.counters.soft.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = uffd::move_pages(fd, addr, staged, PAGE_SIZE as u64, 0) {
                self.put(g, Where::Parked);
                sh.counters.soft.fetch_sub(1, Ordering::Relaxed);
                return Err(Error::os(format!("UFFDIO_MOVE of {staged:#x} back"), e));
            }
            sh.record(addr, TraceKind::Soft);
            self.policy.accessed(g);
            return Ok(());
        }
        let cfg = *sh.config.lock().unwrap_or_else(|e| e.into_inner());
        let c = &sh.counters;
        let class = self.class[g];
        if class == Placement::PinnedLocal {
            // Local by placement: mapped at once, not a fetch.
            let was = self.pages[g];
            self.put(g, Where::Local);
            return self.map(was, g);
        }
        c.faults.fetch_add(1, Ordering::Relaxed);
        c.fetches.fetch_add(1, Ordering::Relaxed);
        let mut writeback_bytes = 0;
        // Always-remote pages visited since the last fault go back first.
        for v in std::mem::take(&mut self.visiting) {
            if self.evict(sh, v)? {
                writeback_bytes += PAGE_SIZE as u64;
            }
        }
        while class == Placement::Normal && !sh.paused.load(Ordering::Relaxed) && {
            let (local, budget) = self.load(&cfg);
            local >= budget
        } {
            match self.evict_victim(sh)? {
                None => break,
                Some(true) => writeback_bytes += PAGE_SIZE as u64,
                Some(false) => {}
            }
        }
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
        // Book-keeping first: mapping the page wakes the faulting thread,
        // which may look at the counters at once.
        let was = self.pages[g];
        sh.record(self.addr_of(g).2, TraceKind::Fetch);
        self.put(g, Where::Local);
        if class == Placement::AlwaysRemote {
            self.visiting.push(g);
        } else {
            self.local += 1;
            c.local.store(self.local as u64, Ordering::Relaxed);
            self.policy.inserted(g);
        }
        c.handled
            .fetch_add(arrived.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // Published before the page is mapped: the woken thread may exit at
        // once, taking this thread with it.
        self.publish(sh);
        let r = self.map(was, g);
        if r.as_ref().is_err_and(again) {
            // Not mapped: undone, to be served again after the events.
            self.put(g, was);
            if class == Placement::AlwaysRemote {
                self.visiting.retain(|&v| v != g);
            } else {
                self.local -= 1;
                c.local.store(self.local as u64, Ordering::Relaxed);
                self.policy.removed(g);
            }
        }
        r
    }

    /// Maps page `g`, whose contents were `was`, into its region (this wakes
    /// the faulting threads) and notes its fingerprint.
    fn map(&mut self, was: Where, g: usize) -> Result<()> {
        let fd = self.uffd.as_raw_fd();
        let (_, _, addr, staged) = self.addr_of(g);
        self.fetched[g] = match was {
            Where::Remote => self.staged_hash(staged)?,
            _ => crate::hash::zero_page_hash(),
        };
        let r = match was {
            Where::Remote => uffd::move_pages(fd, addr, staged, PAGE_SIZE as u64, 0),
            _ => uffd::zeropage(fd, addr, PAGE_SIZE as u64),
        };
        match r {
            Ok(()) => Ok(()),
            // Mapped meanwhile: only waking is left.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                uffd::wake(fd, addr, PAGE_SIZE as u64).map_err(|e| Error::os("UFFDIO_WAKE", e))
            }
            Err(e) => Err(Error::os(format!("mapping page {addr:#x}"), e)),
        }
    }

    /// Evicts local page `g`: one atomic move into staging, so a write
    /// racing it lands before (and moves with the page) or faults after.
    /// Returns whether its contents changed since the fetch (a write-back).
    fn evict(&mut self, sh: &Shared, g: usize) -> Result<bool> {
        let (_, _, addr, staged) = self.addr_of(g);
        let moved = match self.pages[g] {
            Where::Local => match uffd::move_pages(
                self.stage_uffd.as_raw_fd(),
                staged,
                addr,
                PAGE_SIZE as u64,
                uffd::MOVE_MODE_DONTWAKE,
            ) {
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
        let dirty = match moved {
            Ok(()) => {
                self.put(g, Where::Remote);
                crate::hash::page_hash(staged_page(staged)) != self.fetched[g]
            }
            // Not mapped (dropped between the event and the zap): zeros.
            // (ENOENT also means that staging is not mapped any more: the
            // page is still there then, and must not be taken for zeros.)
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                if self.present(addr)? {
                    return Err(Error::Invalid(format!(
                        "cannot evict {addr:#x}: its staging at {staged:#x} is not mapped"
                    )));
                }
                self.put(g, Where::RemoteZero);
                false
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                // Shared with another process (after a fork, or merged by
                // KSM): UFFDIO_MOVE moves only pages this process owns
                // alone. A write fault without a write (MADV_POPULATE_WRITE
                // on the mapped page) gives it its own copy; then move it.
                // SAFETY: one mapped page of an emulated region; populating
                // it changes no contents.
                unsafe { mem::madvise(addr, PAGE_SIZE, MADV_POPULATE_WRITE) }
                    .map_err(|e| Error::os(format!("MADV_POPULATE_WRITE of {addr:#x}"), e))?;
                sh.counters.unshared.fetch_add(1, Ordering::Relaxed);
                return self.evict(sh, g);
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
        );
        Ok(dirty)
    }

    /// Maps every remote page back, as local pages (over the budget).
    fn bring_back(&mut self, sh: &Shared) -> Result<()> {
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
    fn bring_all_back(&mut self) -> Result<()> {
        for g in 0..self.pages.len() {
            if matches!(self.pages[g], Where::Remote | Where::Parked) {
                self.map(Where::Remote, g)?;
                self.put(g, Where::Local);
            }
        }
        for (r, st) in self.regions.iter().zip(&self.staging) {
            // A range the program unmapped is not registered any more.
            let _ = uffd::unregister(self.uffd.as_raw_fd(), r.start, r.len);
            let _ = uffd::unregister(self.stage_uffd.as_raw_fd(), st.addr(), r.len);
        }
        Ok(())
    }
}

impl Engine {
    /// The fingerprint of the page staged at `staged`, read without ever
    /// touching a page that is not there: the handler must never fault on
    /// memory only it could serve. A missing page is an error (the books
    /// and staging disagree), never a wait.
    fn staged_hash(&mut self, staged: u64) -> Result<crate::hash::PageHash> {
        let missing = || {
            Error::Invalid(format!(
                "the staged page at {staged:#x} is missing: the engine's books are wrong"
            ))
        };
        if crate::probe::get().uffd_has(uffd::feature::SIGBUS) {
            // The staging userfaultfd has SIGBUS: the kernel's copy fails
            // with EFAULT on a missing page.
            match pagewise_sys::process::process_vm_read(
                std::process::id() as i32,
                staged,
                &mut self.page_buf,
            ) {
                Ok(n) if n == PAGE_SIZE => Ok(crate::hash::page_hash(&self.page_buf)),
                _ => Err(missing()),
            }
        } else {
            if !self.present(staged)? {
                return Err(missing());
            }
            Ok(crate::hash::page_hash(staged_page(staged)))
        }
    }
}

/// One page of staging, which the engine reads only while it is mapped there.
fn staged_page(addr: u64) -> &'static [u8] {
    // SAFETY: `addr` is a page of a staging mapping this engine owns, and the
    // caller reads it only while a page is mapped there (moved in, or a zero
    // page): reading it does not fault.
    unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) }
}

/// One answer from the handler thread to a waiting caller, over a pipe.
///
/// The caller may be any thread of the emulated program: it must wait
/// without anything the handler would have to touch in the program's heap
/// (a parked thread's wake-up state may sit there), so it blocks in
/// `read(2)` rather than parking.
mod reply {
    use crate::{Error, Result};
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};

    pub struct Tx<T> {
        slot: Arc<Mutex<Option<T>>>,
        pipe: std::io::PipeWriter,
    }
    pub struct Rx<T> {
        slot: Arc<Mutex<Option<T>>>,
        pipe: std::io::PipeReader,
    }

    pub fn channel<T>() -> Result<(Tx<T>, Rx<T>)> {
        let (r, w) = std::io::pipe().map_err(|e| Error::os("creating a reply pipe", e))?;
        let slot = Arc::new(Mutex::new(None));
        Ok((
            Tx {
                slot: slot.clone(),
                pipe: w,
            },
            Rx { slot, pipe: r },
        ))
    }

    impl<T> Tx<T> {
        /// Sends the answer; fails only when the caller is gone.
        pub fn send(mut self, v: T) -> std::result::Result<(), ()> {
            *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            self.pipe.write_all(b"r").map_err(|_| ())
        }
    }

    impl<T> Rx<T> {
        /// Waits for the answer; `Err` when the sender went away without one.
        pub fn recv(mut self) -> std::result::Result<T, ()> {
            let mut b = [0u8; 1];
            let _ = self.pipe.read(&mut b);
            self.slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .ok_or(())
        }
    }
}

/// `MADV_POPULATE_WRITE` (Linux 5.14), missing from the 6.1 headers' libc.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// What a fault costs this machine at latency 0, measured on a scratch region.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Calibration {
    /// Mean added time per fault seen by the faulting thread, ns: the floor.
    pub floor_ns: u64,
    /// The part of it the handler does not see (delivery, wake-up), ns: what
    /// [`FarMemory::new`] takes as `unseen_ns`.
    pub unseen_ns: u64,
    /// Faults measured.
    pub faults: u64,
}

impl Calibration {
    /// No calibration: nothing is taken off the modelled delays.
    pub const NONE: Calibration = Calibration {
        floor_ns: 0,
        unseen_ns: 0,
        faults: 0,
    };
}

/// Measures the floor: `pages` first touches of scratch regions with a
/// budget of one page and an unlimited link at latency 0, against the same
/// touches of plain memory (in five rounds; the medians).
pub fn calibrate(pages: usize) -> Result<Calibration> {
    // Five rounds, the median of each figure: one slow wake-up of a vCPU
    // must not set the floor for everything after.
    const ROUNDS: usize = 5;
    let per = (pages / ROUNDS).max(16);
    let mut floors = Vec::new();
    let mut unseen = Vec::new();
    let mut faults = 0;
    for _ in 0..ROUNDS {
        let (f, u, n) = calibrate_once(per)?;
        floors.push(f);
        unseen.push(u);
        faults += n;
    }
    floors.sort_unstable();
    unseen.sort_unstable();
    Ok(Calibration {
        floor_ns: floors[ROUNDS / 2],
        unseen_ns: unseen[ROUNDS / 2],
        faults,
    })
}

/// A scratch instance over `mem`: FIFO, an unlimited link at latency 0,
/// no calibration — what a fault costs the engine itself.
fn at_latency_zero(mem: &AnonMemory, local_pages: usize) -> Result<FarMemory> {
    let config = Config {
        local_pages,
        link: LinkConfig {
            latency_ns: 0,
            bandwidth_bps: 0,
        },
    };
    FarMemory::new(
        &[mem.region()],
        config,
        Box::new(policy::Fifo::default()),
        Calibration::NONE,
    )
}

/// One round of [`calibrate`]: (floor, unseen part, faults).
fn calibrate_once(pages: usize) -> Result<(u64, u64, u64)> {
    let touch = |mem: &AnonMemory| {
        let t0 = Instant::now();
        for p in 0..mem.pages() {
            mem.write_byte(p * PAGE_SIZE, 1);
        }
        t0.elapsed().as_nanos() as u64
    };
    let plain = AnonMemory::new(pages * PAGE_SIZE)?;
    let base = touch(&plain);
    let mem = AnonMemory::new(pages * PAGE_SIZE)?;
    let fm = at_latency_zero(&mem, 1)?;
    let t = touch(&mem);
    let st = fm.stop()?;
    let faults = st.page_fault_count.max(1);
    let floor_ns = t.saturating_sub(base) / faults;
    Ok((
        floor_ns,
        floor_ns.saturating_sub(st.handler_ns / faults),
        faults,
    ))
}

/// The two ways a fault can reach the engine, measured raw (first touches
/// mapped with the zero page, no eviction, no delay).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FaultPaths {
    /// A first touch of plain memory, ns (the baseline).
    pub plain_ns: f64,
    /// Through the handler thread: the faulting thread sleeps until the
    /// handler maps the page, ns. Works for faults inside system calls.
    pub thread_ns: f64,
    /// In the faulting thread (`UFFD_FEATURE_SIGBUS`): a `SIGBUS` handler
    /// maps the page and the access is retried, ns. A fault inside a system
    /// call fails it with `EFAULT` instead.
    pub sigbus_ns: Option<f64>,
}

static SIGBUS_UFFD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn map_zero_on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as u64 & !(PAGE_SIZE as u64 - 1);
    // An ioctl is async-signal-safe; a failure leaves the fault to repeat.
    let _ = uffd::zeropage(SIGBUS_UFFD.load(Ordering::Relaxed), addr, PAGE_SIZE as u64);
}

/// Measures [`FaultPaths`] over `pages` first touches each.
pub fn measure_fault_paths(pages: usize) -> Result<FaultPaths> {
    let touch = |mem: &AnonMemory| {
        let t0 = Instant::now();
        for p in 0..mem.pages() {
            let _ = mem.read_byte(p * PAGE_SIZE);
        }
        t0.elapsed().as_nanos() as f64 / mem.pages() as f64
    };
    let plain_ns = touch(&AnonMemory::new(pages * PAGE_SIZE)?);
    let mem = AnonMemory::new(pages * PAGE_SIZE)?;
    let fm = at_latency_zero(&mem, pages)?;
    let thread_ns = touch(&mem);
    fm.stop()?;
    let sigbus_ns = if crate::probe::get().uffd_has(uffd::feature::SIGBUS) {
        Some(sigbus_path(pages, &touch)?)
    } else {
        None
    };
    Ok(FaultPaths {
        plain_ns,
        thread_ns,
        sigbus_ns,
    })
}

fn sigbus_path(pages: usize, touch: &dyn Fn(&AnonMemory) -> f64) -> Result<f64> {
    let (fd, _) =
        uffd::open(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(|e| Error::Unsupported {
            feature: "userfaultfd",
            why: e.to_string(),
        })?;
    uffd::api(fd.as_raw_fd(), uffd::feature::SIGBUS)
        .map_err(|e| Error::os("UFFDIO_API(SIGBUS)", e))?;
    let mem = AnonMemory::new(pages * PAGE_SIZE)?;
    uffd::register(
        fd.as_raw_fd(),
        mem.addr(),
        mem.len() as u64,
        uffd::REGISTER_MODE_MISSING,
    )
    .map_err(|e| Error::os("UFFDIO_REGISTER", e))?;
    SIGBUS_UFFD.store(fd.as_raw_fd(), Ordering::Relaxed);
    // SAFETY: the handler only issues an ioctl, which is async-signal-safe.
    let old = unsafe { pagewise_sys::signal::install(libc::SIGBUS, map_zero_on_sigbus) }
        .map_err(|e| Error::os("installing a SIGBUS handler", e))?;
    let ns = touch(&mem);
    pagewise_sys::signal::restore(libc::SIGBUS, &old)
        .map_err(|e| Error::os("restoring the SIGBUS handler", e))?;
    SIGBUS_UFFD.store(-1, Ordering::Relaxed);
    uffd::unregister(fd.as_raw_fd(), mem.addr(), mem.len() as u64)
        .map_err(|e| Error::os("UFFDIO_UNREGISTER", e))?;
    Ok(ns)
}
