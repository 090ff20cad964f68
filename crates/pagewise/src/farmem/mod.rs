//! Disaggregated-memory emulation (DiME) on a stock kernel: a local page
//! budget, a link model and replacement policies over userfaultfd.
//!
//! A [`FarMemory`] emulates far memory for page-aligned regions of the
//! calling process. At most `local_pages` of their pages are mapped (local);
//! the others are *remote*: the engine holds their contents and they are not
//! mapped. Every access to a remote page — the first touch of a fresh page
//! included, as in DiME — faults to the engine's handler thread, which:
//!
//! 1. charges the link (see [`link`]): twice the one-way latency plus the
//!    page's transmission time, queued behind the instance's other transfers;
//! 2. if the budget is full, asks the [`policy`] for a victim and evicts it:
//!    **write-protect, copy out, then drop** (`UFFDIO_WRITEPROTECT`, a copy
//!    into the engine's store when the contents changed — a *write-back* —,
//!    `MADV_DONTNEED`). A thread writing the victim meanwhile blocks on the
//!    write-protect fault; the engine wakes it once the page is gone, and its
//!    retry fetches the page back with the write still to come. No write is
//!    lost (tested with concurrent writers against a shadow copy);
//! 3. waits out the rest of the modelled delay and maps the page
//!    (`UFFDIO_COPY`, or the zero page for a page never written), which wakes
//!    the faulting thread.
//!
//! Faults taken inside system calls (a `read()` into a remote buffer) are
//! handled the same way: the kernel waits for the handler.
//!
//! # What the caller guarantees
//! The regions are private anonymous memory, mapped and writable, that the
//! program does not `munmap`, `mremap` or `madvise(MADV_DONTNEED)` while they
//! are emulated, and does not `fork` (both are planned). When the
//! [`FarMemory`] is stopped or dropped, every remote page is mapped back
//! with its contents.

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
    /// The part of a fault's cost the engine cannot see and subtracts, ns.
    pub floor_ns: u64,
    /// Write-protect faults of threads that wrote a page being evicted.
    pub blocked_writes: u64,
    /// Pages local now.
    pub local_pages_now: u64,
    /// Time the handler spent on faults, from reading the message to
    /// mapping the page, waits included, ns.
    pub handler_ns: u64,
    /// Injected delay per fault: counts in power-of-two buckets, bucket `i`
    /// holding delays in `[2^i, 2^(i+1))` ns (bucket 0 also holds 0).
    pub delay_histogram: Vec<u64>,
}

const HIST_BUCKETS: usize = 32;

#[derive(Default)]
struct Counters {
    faults: AtomicU64,
    fetches: AtomicU64,
    evictions: AtomicU64,
    writebacks: AtomicU64,
    injected: AtomicU64,
    modelled: AtomicU64,
    blocked: AtomicU64,
    local: AtomicU64,
    handled: AtomicU64,
    hist: [AtomicU64; HIST_BUCKETS],
}

struct Shared {
    config: Mutex<Config>,
    /// The configuration changed: fit the budget.
    changed: AtomicBool,
    /// Stop serving faults.
    stop: AtomicBool,
    /// Placements to apply.
    placements: Mutex<Vec<(Region, Placement)>>,
    counters: Counters,
    floor_ns: AtomicU64,
}

/// One emulated far memory over regions of the calling process.
pub struct FarMemory {
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
    /// the next access to each one is a fetch. `unseen_ns` is the part of a
    /// fault's cost the engine cannot measure ([`calibrate`] finds it; 0
    /// makes every fault slower than modelled by that much).
    pub fn new(
        regions: &[Region],
        config: Config,
        policy: Box<dyn Policy>,
        unseen_ns: u64,
    ) -> Result<Self> {
        if config.local_pages == 0 {
            return Err(Error::Invalid("local_pages must be at least 1".into()));
        }
        if regions.is_empty() {
            return Err(Error::Invalid("no region to emulate".into()));
        }
        let sorted = crate::region::sorted_disjoint(regions)?;
        crate::snap::check_mapped_writable(&sorted)?;
        let engine = Engine::new(&sorted, policy, unseen_ns)?;
        let shared = Arc::new(Shared {
            config: Mutex::new(config),
            changed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            placements: Mutex::new(Vec::new()),
            counters: Counters::default(),
            floor_ns: AtomicU64::new(unseen_ns),
        });
        let (wake_r, wake_w) =
            std::io::pipe().map_err(|e| Error::os("creating the engine's wake pipe", e))?;
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pagewise-farmem".into())
            .spawn(move || engine.run(&sh, wake_r))
            .map_err(|e| Error::os("starting the far-memory handler thread", e))?;
        Ok(FarMemory {
            shared,
            regions: sorted,
            wake: wake_w,
            thread: Some(thread),
        })
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
        self.shared.changed.store(true, Ordering::Release);
        self.wake
            .write_all(b"c")
            .map_err(|e| Error::os("waking the far-memory handler", e))
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
        self.shared.changed.store(true, Ordering::Release);
        self.wake
            .write_all(b"p")
            .map_err(|e| Error::os("waking the far-memory handler", e))
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut hist: Vec<u64> = c.hist.iter().map(get).collect();
        while hist.len() > 1 && hist.last() == Some(&0) {
            hist.pop();
        }
        Stats {
            page_fault_count: get(&c.faults),
            remote_fetches: get(&c.fetches),
            evictions: get(&c.evictions),
            writebacks: get(&c.writebacks),
            injected_delay_ns: get(&c.injected),
            modelled_delay_ns: get(&c.modelled),
            floor_ns: get(&self.shared.floor_ns),
            blocked_writes: get(&c.blocked),
            local_pages_now: get(&c.local),
            handler_ns: get(&c.handled),
            delay_histogram: hist,
        }
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
    /// Remote, never written: zeros.
    RemoteZero,
    /// Remote, in the store.
    Remote,
    /// Local; the store holds the contents it was fetched with (`stored`) or
    /// nothing (zeros).
    Local { stored: bool },
}

/// The handler thread's state.
struct Engine {
    uffd: OwnedFd,
    regions: Vec<Region>,
    /// First global page index of each region.
    first: Vec<usize>,
    /// The store: one mapping the size of each region.
    store: Vec<AnonMemory>,
    pages: Vec<Where>,
    /// Placement of each page.
    class: Vec<Placement>,
    /// Always-remote pages mapped since the last fault.
    visiting: Vec<usize>,
    /// Local pages that count against the budget.
    local: usize,
    policy: Box<dyn Policy>,
    link: Link,
    injector: Injector,
}

impl Engine {
    fn new(regions: &[Region], policy: Box<dyn Policy>, unseen_ns: u64) -> Result<Self> {
        // Non-blocking: poll may report a message another wake-up consumed.
        let (fd, _) =
            uffd::open(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(|e| Error::Unsupported {
                feature: "userfaultfd",
                why: e.to_string(),
            })?;
        uffd::api(fd.as_raw_fd(), 0).map_err(|e| Error::os("UFFDIO_API", e))?;
        let mut first = Vec::new();
        let mut store = Vec::new();
        let mut pages = Vec::new();
        for r in regions {
            first.push(pages.len());
            let s = AnonMemory::new(r.len as usize)?;
            // Populated pages become remote now: their contents go to the store.
            for i in 0..r.pages() as usize {
                let addr = r.start + (i * PAGE_SIZE) as u64;
                let page = page_at(addr);
                if page.iter().all(|&b| b == 0) {
                    pages.push(Where::RemoteZero);
                } else {
                    s.write_at(i * PAGE_SIZE, page);
                    pages.push(Where::Remote);
                }
            }
            // SAFETY: the region is private anonymous memory of this process
            // that the caller hands to the engine; its contents are in the store.
            unsafe { mem::madvise(r.start, r.len as usize, libc::MADV_DONTNEED) }.map_err(|e| {
                Error::os(format!("MADV_DONTNEED of {:#x}+{:#x}", r.start, r.len), e)
            })?;
            uffd::register(
                fd.as_raw_fd(),
                r.start,
                r.len,
                uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
            )
            .map_err(|e| Error::os(format!("UFFDIO_REGISTER of {:#x}+{:#x}", r.start, r.len), e))?;
            store.push(s);
        }
        Ok(Engine {
            uffd: fd,
            regions: regions.to_vec(),
            first,
            store,
            class: vec![Placement::Normal; pages.len()],
            visiting: Vec::new(),
            pages,
            local: 0,
            policy,
            link: Link::default(),
            injector: Injector::new(unseen_ns),
        })
    }

    /// Global page index and address of the page holding `addr`.
    fn locate(&self, addr: u64) -> Option<(usize, usize, u64)> {
        let ri = self.regions.partition_point(|r| r.end() <= addr);
        let r = self.regions.get(ri).filter(|r| r.contains(addr))?;
        let i = ((addr - r.start) / PAGE_SIZE as u64) as usize;
        Some((ri, self.first[ri] + i, r.start + (i * PAGE_SIZE) as u64))
    }

    fn addr_of(&self, g: usize) -> (usize, usize, u64) {
        let ri = self.first.partition_point(|&f| f <= g) - 1;
        let i = g - self.first[ri];
        (ri, i, self.regions[ri].start + (i * PAGE_SIZE) as u64)
    }

    fn run(mut self, sh: &Shared, mut wake: std::io::PipeReader) -> Result<()> {
        let fds: [RawFd; 2] = [self.uffd.as_raw_fd(), wake.as_raw_fd()];
        let result = loop {
            if sh.stop.load(Ordering::Acquire) {
                break Ok(());
            }
            if sh.changed.swap(false, Ordering::AcqRel) {
                if let Err(e) = self.fit_budget(sh) {
                    break Err(e);
                }
            }
            // Messages first; poll (one more system call) only when none is waiting.
            let msg = match uffd::read_msg(self.uffd.as_raw_fd()) {
                Ok(m) => m,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    match uffd::poll_readable(&fds, -1) {
                        Ok(ready) if ready & 2 != 0 => {
                            let mut b = [0u8; 16];
                            let _ = wake.read(&mut b);
                        }
                        Ok(_) => {}
                        Err(e) => break Err(Error::os("poll of the userfaultfd", e)),
                    }
                    continue;
                }
                Err(e) => break Err(Error::os("reading the userfaultfd", e)),
            };
            let arrived = Instant::now();
            if msg.event != uffd::event::PAGEFAULT {
                continue;
            }
            if let Err(e) = self.fault(sh, msg.pf_address(), msg.pf_flags(), arrived) {
                break Err(e);
            }
        };
        let back = self.bring_all_back();
        result.and(back)
    }

    /// Applies new placements, then evicts until the budget holds.
    fn fit_budget(&mut self, sh: &Shared) -> Result<()> {
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
                let local = matches!(self.pages[g], Where::Local { .. });
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
        let budget = sh
            .config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .local_pages;
        while self.local > budget {
            let Some(v) = self.policy.victim() else { break };
            self.evict(sh, v)?;
        }
        Ok(())
    }

    fn fault(&mut self, sh: &Shared, addr: u64, flags: u64, arrived: Instant) -> Result<()> {
        let fd = self.uffd.as_raw_fd();
        let Some((_, g, page_addr)) = self.locate(addr) else {
            // Not ours (cannot happen: only our regions are registered).
            return uffd::wake(fd, addr & !(PAGE_SIZE as u64 - 1), PAGE_SIZE as u64)
                .map_err(|e| Error::os("UFFDIO_WAKE", e));
        };
        if flags & uffd::PAGEFAULT_FLAG_WP != 0 {
            // A write to a page that was being evicted: it is gone now (or
            // back and writable); the retry faults again if it must.
            sh.counters.blocked.fetch_add(1, Ordering::Relaxed);
            return uffd::wake(fd, page_addr, PAGE_SIZE as u64)
                .map_err(|e| Error::os("UFFDIO_WAKE", e));
        }
        if let Where::Local { .. } = self.pages[g] {
            // Resolved already (two threads faulted on it): wake the late one.
            return uffd::wake(fd, page_addr, PAGE_SIZE as u64)
                .map_err(|e| Error::os("UFFDIO_WAKE", e));
        }
        let cfg = *sh.config.lock().unwrap_or_else(|e| e.into_inner());
        let c = &sh.counters;
        let class = self.class[g];
        if class == Placement::PinnedLocal {
            // Local by placement: mapped at once, not a fetch.
            let was = self.pages[g];
            self.pages[g] = Where::Local {
                stored: was == Where::Remote,
            };
            return self.map(was, g, page_addr);
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
        while class == Placement::Normal && self.local >= cfg.local_pages {
            let Some(v) = self.policy.victim() else { break };
            if self.evict(sh, v)? {
                writeback_bytes += PAGE_SIZE as u64;
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
        self.pages[g] = Where::Local {
            stored: was == Where::Remote,
        };
        if class == Placement::AlwaysRemote {
            self.visiting.push(g);
        } else {
            self.local += 1;
            c.local.store(self.local as u64, Ordering::Relaxed);
            self.policy.inserted(g);
        }
        c.handled
            .fetch_add(arrived.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.map(was, g, page_addr)
    }

    /// Maps page `g` at `addr` with its contents, which were `was` (this
    /// wakes the faulting threads).
    fn map(&self, was: Where, g: usize, addr: u64) -> Result<()> {
        let fd = self.uffd.as_raw_fd();
        let (ri, i, _) = self.addr_of(g);
        let r = match was {
            Where::Remote => {
                let src = self.store[ri].as_ptr().wrapping_add(i * PAGE_SIZE);
                // SAFETY: `src` is page `i` of the store mapping, one page long.
                unsafe { uffd::copy(fd, addr, src, PAGE_SIZE as u64, 0) }
            }
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

    /// Evicts local page `g`: write-protect, copy out if changed, drop.
    /// Returns whether it was written back.
    fn evict(&mut self, sh: &Shared, g: usize) -> Result<bool> {
        let fd = self.uffd.as_raw_fd();
        let (ri, i, addr) = self.addr_of(g);
        let Where::Local { stored } = self.pages[g] else {
            return Ok(false);
        };
        uffd::writeprotect(fd, addr, PAGE_SIZE as u64, true)
            .map_err(|e| Error::os(format!("UFFDIO_WRITEPROTECT of {addr:#x}"), e))?;
        // No thread can change the page now; compare it with what the store has.
        let now = page_at(addr);
        let mut old = [0u8; PAGE_SIZE];
        if stored {
            self.store[ri].read_into(i * PAGE_SIZE, &mut old);
        }
        let dirty = now != old;
        if dirty {
            self.store[ri].write_at(i * PAGE_SIZE, now);
        }
        // SAFETY: the page belongs to an emulated region; its contents are in
        // the store and no thread can write it (write-protected).
        unsafe { mem::madvise(addr, PAGE_SIZE, libc::MADV_DONTNEED) }
            .map_err(|e| Error::os(format!("MADV_DONTNEED of {addr:#x}"), e))?;
        self.pages[g] = if dirty || stored {
            Where::Remote
        } else {
            Where::RemoteZero
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
        Ok(dirty)
    }

    /// Maps every remote page back and unregisters the regions.
    fn bring_all_back(&mut self) -> Result<()> {
        let fd = self.uffd.as_raw_fd();
        for g in 0..self.pages.len() {
            if self.pages[g] == Where::Remote {
                let (_, _, addr) = self.addr_of(g);
                self.map(Where::Remote, g, addr)?;
                self.pages[g] = Where::Local { stored: true };
            }
        }
        for r in &self.regions {
            uffd::unregister(fd, r.start, r.len).map_err(|e| {
                Error::os(
                    format!("UFFDIO_UNREGISTER of {:#x}+{:#x}", r.start, r.len),
                    e,
                )
            })?;
        }
        Ok(())
    }
}

/// One page of the calling process's memory.
fn page_at(addr: u64) -> &'static [u8] {
    // SAFETY: `addr` is a page of an emulated region, mapped for the life of
    // the engine (the caller's guarantee); the engine only reads it while no
    // thread can write it, or before emulation starts.
    unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) }
}

/// What a fault costs this machine at latency 0, measured on a scratch region.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Calibration {
    /// Mean added time per fault seen by the faulting thread, ns: the floor.
    pub floor_ns: u64,
    /// The part of it the handler does not see (delivery, wake-up), ns: what
    /// [`FarMemory::new`] takes as `unseen_ns`.
    pub unseen_ns: u64,
    /// Faults measured.
    pub faults: u64,
}

/// Measures the floor: `pages` first touches of a scratch region with a
/// budget of one page and an unlimited link at latency 0, against the same
/// touches of plain memory.
pub fn calibrate(pages: usize) -> Result<Calibration> {
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
    let fm = FarMemory::new(
        &[mem.region()],
        Config {
            local_pages: 1,
            link: LinkConfig {
                latency_ns: 0,
                bandwidth_bps: 0,
            },
        },
        Box::new(policy::Fifo::default()),
        0,
    )?;
    let t = touch(&mem);
    let st = fm.stop()?;
    let faults = st.page_fault_count.max(1);
    let floor_ns = t.saturating_sub(base) / faults;
    Ok(Calibration {
        floor_ns,
        unseen_ns: floor_ns.saturating_sub(st.handler_ns / faults),
        faults,
    })
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
    let fm = FarMemory::new(
        &[mem.region()],
        Config {
            local_pages: pages,
            link: LinkConfig {
                latency_ns: 0,
                bandwidth_bps: 0,
            },
        },
        Box::new(policy::Fifo::default()),
        0,
    )?;
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
