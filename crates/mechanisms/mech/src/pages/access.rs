//! Access coverage: which base pages of each 2 MiB region a process touches
//! over an interval (HawkEye's access map). The one place pagewise measures
//! it, by the best means the kernel and the process allow:
//!
//! - **idle page tracking** (`/sys/kernel/mm/page_idle/bitmap`, root): any
//!   process. Every present page is marked idle; after the window, a page
//!   whose idle bit the kernel cleared was accessed.
//! - **the far-memory sampler**: processes started under pagewise (members
//!   of a far-memory instance: `pagewise::farmem::sampler` drives it and
//!   hands back [`CoverageReport`]s; this module depends on no sampler). The engine inside the
//!   process evicts every local page when the window opens; the pages
//!   faulted back by its end are exactly those touched. It sees reads and
//!   writes, on any kernel with `UFFDIO_MOVE`, at a fault per distinct page
//!   touched, and it serves memory page by page (no huge pages).
//!
//! - **write tracking from outside** ([`WriteCoverage`]): any process
//!   pagewise may trace (no seccomp filter, no other tracer). A userfaultfd
//!   made inside the process (see `pagewise::track`) write-protects the
//!   regions asked for over the window; the pages written in it are those
//!   touched. It sees writes only (a region only read looks cold), and a
//!   write to a write-protected huge page splits it, so it is used on
//!   regions not mapped by a huge page: the candidates for promotion.
//!
//! - **regions written, from outside, without splitting huge pages**
//!   ([`RegionWrites`]): the same userfaultfd in synchronous mode, served
//!   by a thread of this side all the time. The first write to a
//!   protected region stops the writing thread until that thread has noted
//!   the region and lifted its protection: one fault per region written
//!   between two takes, whatever the page size, and a huge page stays
//!   huge. It tells whether a region was written, not how many of its
//!   pages (SmartMD's access bit per huge page, for writes); a region not
//!   written since it was last read is known unchanged.
//!
//! DAMON is not used: it samples one page per region and estimates, where
//! this asks for every page.

use crate::procfs;
use crate::{Error, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::pagemap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one process touched in a window.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct CoverageReport {
    /// The process.
    pub pid: i32,
    /// The sampler's request that closed the window (0 for idle pages).
    pub request: u64,
    /// How long the window was open, ns.
    pub window_ns: u64,
    /// Per 2 MiB region watched: `[start, pages watched, pages holding
    /// data, pages touched]`.
    pub regions: Vec<[u64; 4]>,
}

impl CoverageReport {
    /// The report of a window that ran `window_ns` for `request` in process
    /// `pid` (`regions` as [`CoverageReport::regions`] says; see [`tally`]).
    pub fn new(pid: i32, request: u64, window_ns: u64, regions: Vec<[u64; 4]>) -> Self {
        CoverageReport {
            pid,
            request,
            window_ns,
            regions,
        }
    }
}

/// Counts one watched page at `addr` into `regions` (in address order, see
/// [`CoverageReport::regions`]).
pub fn tally(regions: &mut Vec<[u64; 4]>, addr: u64, data: bool, touched: bool) {
    let chunk = addr & !(HUGE_PAGE_SIZE as u64 - 1);
    if regions.last().is_none_or(|c| c[0] != chunk) {
        regions.push([chunk, 0, 0, 0]);
    }
    let c = regions.last_mut().expect("pushed");
    c[1] += 1;
    c[2] += u64::from(data);
    c[3] += u64::from(touched);
}

/// How coverage was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Method {
    /// `/sys/kernel/mm/page_idle/bitmap`.
    IdlePage,
    /// The far-memory engine inside the process.
    Sampler,
    /// Write tracking from outside ([`WriteCoverage`]).
    Writes,
}

/// Write coverage of another process's 2 MiB regions, measured from
/// outside (see the module): [`start`](Self::start) arms a set of regions,
/// [`finish`](Self::finish) counts the pages written since and disarms them,
/// so that nothing stays registered between windows (a registered range
/// may not be collapsed into a huge page).
pub struct WriteCoverage {
    pid: i32,
    /// The userfaultfd of the window under way: each window registers the
    /// mappings its regions are in whole (registering part of a mapping
    /// splits it, and the program's `mremap` of a buffer then spans two
    /// mappings and fails with `EFAULT`), protects only the regions, and
    /// ends by closing it, which unregisters those mappings whole as they
    /// are then, however the program moved or grew them meanwhile.
    wp: Option<crate::wp::UffdWp>,
    /// Userfaultfds made ahead, one per window to come.
    spare: Vec<crate::wp::UffdWp>,
    armed: Vec<crate::Region>,
    since: Option<Instant>,
}

/// Userfaultfds made at each stop of the process, one per window (each
/// holds two descriptors here, its own and the page map: kept few for a
/// node agent watching many processes).
const WINDOWS_PER_STOP: usize = 4;

impl WriteCoverage {
    /// Makes the userfaultfd inside process `pid` (it is stopped for a
    /// moment); refused with the reason where that cannot be done.
    pub fn new(pid: i32) -> Result<Self> {
        Ok(WriteCoverage {
            pid,
            wp: None,
            spare: crate::wp::UffdWp::open_many_in(pid, WINDOWS_PER_STOP)?,
            armed: Vec::new(),
            since: None,
        })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Arms `regions` (2 MiB regions, each inside one private anonymous
    /// writable mapping; see `pagewise::thp`): writes from now on are
    /// counted. A region that cannot be armed (unmapped meanwhile) is left
    /// out.
    pub fn start(&mut self, regions: &[crate::Region]) -> Result<()> {
        self.finish_quietly();
        if self.spare.is_empty() {
            self.spare = crate::wp::UffdWp::open_many_in(self.pid, WINDOWS_PER_STOP)?;
        }
        let wp = self.spare.pop().expect("made above");
        wp.check_memory()?;
        let armed = &mut self.armed;
        registering(self.pid, &wp, |maps| {
            let mut whole: Vec<crate::Region> = Vec::new();
            for &r in regions {
                let Some(m) = maps.iter().find(|m| m.start <= r.start && r.end() <= m.end) else {
                    continue;
                };
                let mapping = crate::Region {
                    start: m.start,
                    len: m.end - m.start,
                };
                if !whole.contains(&mapping) {
                    if wp.register(mapping, false).is_err() {
                        continue;
                    }
                    whole.push(mapping);
                }
                if wp.protect(r).is_ok() {
                    armed.push(r);
                }
            }
            whole
        })?;
        self.wp = Some(wp);
        self.since = Some(Instant::now());
        Ok(())
    }

    /// Counts the pages written in each armed region since
    /// [`start`](Self::start), disarms them, and returns the report
    /// (`[start, pages watched, pages watched, pages written]` per region).
    pub fn finish(&mut self) -> Result<CoverageReport> {
        let window_ns = self
            .since
            .take()
            .map_or(0, |t| t.elapsed().as_nanos() as u64);
        let mut regions = Vec::with_capacity(self.armed.len());
        let mut written = Vec::new();
        let armed = std::mem::take(&mut self.armed);
        let mut failed = None;
        // Closed as it goes out of scope: every mapping it registered is
        // then unregistered, whole.
        let mut wp = self.wp.take();
        if let Some(wp) = wp.as_mut() {
            for r in &armed {
                written.clear();
                if let Err(e) = wp.scan_written(r.start, r.end(), false, false, &mut written) {
                    failed.get_or_insert(e);
                }
                let n: u64 = written.iter().map(|w| w.pages).sum();
                regions.push([r.start, r.pages(), r.pages(), n]);
            }
        }
        if let Some(e) = failed {
            if let Some(w) = &wp {
                w.check_memory()?;
            }
            return Err(e);
        }
        Ok(CoverageReport {
            pid: self.pid,
            request: 0,
            window_ns,
            regions,
        })
    }

    fn finish_quietly(&mut self) {
        self.armed.clear();
        // Closing the window's userfaultfd unregisters its mappings whole.
        self.wp = None;
    }
}

/// Every thread of process `pid` stopped while its mappings are read and
/// registered (or unregistered) whole: a registration of a mapping's
/// extent as it was read, after the program grew it in place, would split
/// it, and a program whose `mremap` then spans the two pieces fails with
/// `EFAULT`. Stopped, the program can neither grow, shrink nor move a
/// mapping in between. `None` for a process that cannot be stopped now
/// (another tracer holds it, or it is gone): it is read and registered as
/// it runs, and a mapping it grew meanwhile is healed ([`heal`]).
fn hold_layout(pid: i32) -> Option<crate::stop::Stopped> {
    crate::stop::Stopped::new(pid).ok()
}

/// Runs `register` over process `pid`'s maps with its layout held
/// ([`hold_layout`]); the mappings it registered with `wp` (its answer)
/// are healed ([`heal`]) where the process could not be stopped.
fn registering(
    pid: i32,
    wp: &crate::wp::UffdWp,
    register: impl FnOnce(&[crate::procfs::Mapping]) -> Vec<crate::Region>,
) -> Result<()> {
    let held = hold_layout(pid);
    let maps = crate::procfs::maps(Some(pid))?;
    let whole = register(&maps);
    if held.is_none() {
        heal(wp, pid, &maps, &whole);
    }
    Ok(())
}

/// Registers the rest of a mapping the program grew in place between the
/// read of its maps (`before`) and its registration: the registration
/// covered the old extent and split it, leaving the grown part a mapping
/// of its own next to the registered one. That part is registered with
/// the same userfaultfd, and the kernel merges the two again. A mapping
/// next to a registered one that was there before is another's, left
/// alone; one that shrank or moved meanwhile needs nothing.
fn heal(
    wp: &crate::wp::UffdWp,
    pid: i32,
    before: &[crate::procfs::Mapping],
    registered: &[crate::Region],
) {
    let Ok(now) = crate::procfs::maps(Some(pid)) else {
        return;
    };
    for r in registered {
        let end = r.end();
        let Some(grown) = now.iter().find(|m| m.start == end) else {
            continue;
        };
        if before.iter().any(|m| m.start == end) {
            continue;
        }
        let _ = wp.register(
            crate::Region {
                start: grown.start,
                len: grown.end - grown.start,
            },
            false,
        );
    }
}

impl Drop for WriteCoverage {
    fn drop(&mut self) {
        self.finish_quietly();
    }
}

/// Which 2 MiB regions of another process are written, from outside,
/// continuously, without splitting a huge page (see the module). A thread
/// of this side serves the userfaultfd all the time: the first write to a
/// protected region stops the writer only until that thread has noted the
/// region and lifted its protection. [`take`](Self::take) returns the
/// regions written since the last take, and [`watch`](Self::watch)
/// protects them again (and registers regions new to it); a region not
/// written stays protected and costs nothing. `munmap`, `mremap` and
/// `MADV_DONTNEED` of a watched range are reported too (the content there
/// is no longer what was read). A first write to a page not yet populated
/// is not reported (the kernel has no entry there to protect, and
/// protecting empty entries would build page tables where a huge page
/// could go): the page map shows the new page. Dropping it unregisters everything and
/// wakes any writer still waiting; if this side dies, closing the
/// descriptor does the same.
pub struct RegionWrites {
    pid: i32,
    wp: crate::wp::UffdWp,
    /// Starts of the 2 MiB regions inside the mappings registered (each
    /// mapping is registered whole).
    registered: BTreeSet<u64>,
    /// The mappings registered, as last seen.
    mappings: Vec<crate::Region>,
    /// Mappings seen grown or shrunk in place since the last take.
    resized: u64,
    /// Starts of the regions protected by this side and not yet reported
    /// written (the serving thread lifts the protection of a region it
    /// reports).
    protected: BTreeSet<u64>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    /// Wakes the serving thread to stop (it sleeps until a fault or this).
    wake: std::io::PipeWriter,
    /// The serving thread's CPU time, ns (updated as it serves).
    cpu_ns: Arc<AtomicU64>,
    server: Option<std::thread::JoinHandle<()>>,
}

/// What the serving thread saw since the last take.
#[derive(Default)]
struct Seen {
    written: BTreeSet<u64>,
    forgotten: Vec<(u64, u64)>,
    unwatched: BTreeSet<u64>,
    /// `mremap` moves seen.
    moved: u64,
    /// Ranges unmapped (`munmap`, an `mremap` that shrank a mapping) or
    /// moved away from.
    unmapped: Vec<(u64, u64)>,
    failed: Option<(&'static str, std::io::Error)>,
}

/// What [`RegionWrites::take`] returns.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Taken {
    /// Starts of the regions written.
    pub written: BTreeSet<u64>,
    /// Ranges `[start, end)` unmapped, moved or dropped (`MADV_DONTNEED`).
    pub forgotten: Vec<(u64, u64)>,
    /// Starts of the regions whose watch was lifted by a
    /// [`release`](RegionWrites::release) of another region of their
    /// mapping: whether they were written since is not known.
    pub unwatched: BTreeSet<u64>,
    /// How many times the program was seen moving, growing or shrinking a
    /// watched mapping (`mremap`, or `munmap` of part of one): a program
    /// that does is one whose mappings are not to be split.
    pub resized: u64,
}

impl Taken {
    /// Whether the 2 MiB region at `start` overlaps a forgotten range.
    pub fn forgets(&self, start: u64) -> bool {
        let end = start + HUGE_PAGE_SIZE as u64;
        self.forgotten.iter().any(|&(s, e)| s < end && start < e)
    }
}

impl RegionWrites {
    /// Makes the userfaultfd inside process `pid` (stopped for a moment)
    /// and starts the thread serving it; refused with the reason where
    /// that cannot be done (see `UffdWp::open_in_sync`).
    pub fn new(pid: i32) -> Result<Self> {
        let wp = crate::wp::UffdWp::open_in_sync(pid)?;
        let fd = wp.try_clone_fd()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let cpu_ns = Arc::new(AtomicU64::new(0));
        let (woken, wake) =
            std::io::pipe().map_err(|e| Error::os("creating the server's wake pipe", e))?;
        let server = {
            let (seen, stop, cpu) = (seen.clone(), stop.clone(), cpu_ns.clone());
            pagewise_sys::signal::spawn_quiet(format!("pagewise-wp-{pid}"), move || {
                serve_writes(fd, woken, &seen, &stop, &cpu)
            })
            .map_err(|e| Error::os("starting the thread serving a userfaultfd", e))?
        };
        Ok(RegionWrites {
            pid,
            wp,
            registered: BTreeSet::new(),
            mappings: Vec::new(),
            resized: 0,
            protected: BTreeSet::new(),
            seen,
            stop,
            wake,
            cpu_ns,
            server: Some(server),
        })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// CPU time the thread serving the faults has taken so far.
    pub fn server_cpu(&self) -> Duration {
        Duration::from_nanos(self.cpu_ns.load(Ordering::Relaxed))
    }

    /// Watches `regions` (2 MiB-aligned, each inside one private anonymous
    /// writable mapping): registers the mapping of each region not yet
    /// registered, whole (registering part of a mapping splits it, and the
    /// program's `mremap` of a buffer then spans two mappings and fails
    /// with `EFAULT`), and protects the regions not protected, in runs of
    /// adjacent regions; those in `again` are protected again even where
    /// they should still be. A region whose mapping cannot be registered
    /// (unmapped meanwhile) is left out.
    pub fn watch(&mut self, regions: &[crate::Region], again: &BTreeSet<u64>) -> Result<()> {
        self.wp.check_memory()?;
        let huge = HUGE_PAGE_SIZE as u64;
        let new: Vec<u64> = regions
            .iter()
            .map(|r| r.start)
            .filter(|s| !self.registered.contains(s))
            .collect();
        if !new.is_empty() {
            let (mappings, registered, resized) =
                (&mut self.mappings, &mut self.registered, &mut self.resized);
            registering(self.pid, &self.wp, |maps| {
                // A mapping that now ends elsewhere was grown or shrunk in
                // place (a region new to this side is often its grown part).
                for k in mappings.iter_mut() {
                    if let Some(m) = maps.iter().find(|m| m.start == k.start && m.end != k.end()) {
                        *resized += 1;
                        k.len = m.end - m.start;
                    }
                }
                let mut whole: Vec<crate::Region> = Vec::new();
                for s in new {
                    let Some(m) = maps.iter().find(|m| m.start <= s && s + huge <= m.end) else {
                        continue;
                    };
                    let mapping = crate::Region {
                        start: m.start,
                        len: m.end - m.start,
                    };
                    if whole.contains(&mapping) || self.wp.register(mapping, false).is_err() {
                        continue;
                    }
                    whole.push(mapping);
                    registered.extend(regions_in(mapping));
                    match mappings.iter_mut().find(|k| k.start == mapping.start) {
                        Some(k) => *k = mapping,
                        None => mappings.push(mapping),
                    }
                }
                whole
            })?;
        }
        let protect = runs_of(
            regions
                .iter()
                .map(|r| r.start)
                .filter(|s| self.registered.contains(s))
                .filter(|s| !self.protected.contains(s) || again.contains(s)),
        );
        for r in protect {
            if self.wp.protect(r).is_ok() {
                self.protected
                    .extend((0..r.len / huge).map(|i| r.start + i * huge));
            }
        }
        Ok(())
    }

    /// The regions written and the ranges forgotten since the last take.
    /// A written region is no longer protected until the next
    /// [`watch`](Self::watch); a forgotten one is no longer registered.
    pub fn take(&mut self) -> Result<Taken> {
        let seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some((what, e)) = seen.failed {
            self.wp.check_memory()?;
            return Err(Error::for_pid(self.pid, what, e));
        }
        for s in &seen.written {
            self.protected.remove(s);
        }
        // Part of a mapping unmapped (from inside it, or its grown tail):
        // the program cut or shrank it.
        let cut = seen
            .unmapped
            .iter()
            .filter(|&&(from, _)| {
                self.mappings
                    .iter()
                    .any(|m| m.start < from && from <= m.end())
            })
            .count() as u64;
        let resized = seen.moved + cut + std::mem::take(&mut self.resized);
        // A mapping whose start was unmapped or moved away is gone.
        self.mappings.retain(|m| {
            !seen
                .unmapped
                .iter()
                .any(|&(from, to)| from <= m.start && m.start < to)
        });
        let huge = HUGE_PAGE_SIZE as u64;
        for &(from, to) in &seen.forgotten {
            let first = from & !(huge - 1);
            let gone: Vec<u64> = self.registered.range(first..to).copied().collect();
            for s in gone {
                self.registered.remove(&s);
                self.protected.remove(&s);
            }
        }
        Ok(Taken {
            written: seen.written,
            forgotten: seen.forgotten,
            unwatched: seen.unwatched,
            resized,
        })
    }

    /// Stops watching region `r` for a moment: for a region about to be
    /// collapsed, which the kernel refuses while a page of it is
    /// write-protected or, in a registered mapping, not populated. The
    /// whole mapping `r` is in is unregistered (waking any writer; part of
    /// it would split it), and every other region of it that was protected
    /// is reported by the next [`take`](Self::take) as
    /// [`unwatched`](Taken::unwatched): whether it was written since is
    /// not known. [`watch`](Self::watch) takes them back.
    pub fn release(&mut self, r: crate::Region) {
        let held = hold_layout(self.pid);
        let now = procfs::maps(Some(self.pid)).unwrap_or_default();
        let mapping = now
            .iter()
            .find(|m| m.start <= r.start && r.end() <= m.end)
            .map_or(r, |m| crate::Region {
                start: m.start,
                len: m.end - m.start,
            });
        let _ = self.wp.unregister(mapping);
        drop(held);
        let gone: Vec<u64> = regions_in(mapping)
            .chain(regions_in(r))
            .filter(|s| self.registered.contains(s))
            .collect();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for s in gone {
            self.registered.remove(&s);
            if self.protected.remove(&s) && s != r.start && !seen.written.contains(&s) {
                seen.unwatched.insert(s);
            }
        }
    }
}

/// The starts of the 2 MiB regions wholly inside `m`.
fn regions_in(m: crate::Region) -> impl Iterator<Item = u64> {
    let huge = HUGE_PAGE_SIZE as u64;
    let first = m.start.next_multiple_of(huge);
    (first..m.end().saturating_sub(huge - 1)).step_by(HUGE_PAGE_SIZE)
}

impl Drop for RegionWrites {
    fn drop(&mut self) {
        // The serving thread ends first; closing the userfaultfd (its last
        // descriptor is `wp`'s, dropped after this) then unregisters every
        // mapping whole, as it is now, lifts every protection and wakes
        // every writer. An `UFFDIO_UNREGISTER` of the ranges registered
        // could split a mapping the program has grown since.
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::io::Write::write_all(&mut self.wake, b"s");
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
    }
}

/// Ascending 2 MiB region starts as runs of adjacent regions.
fn runs_of(starts: impl Iterator<Item = u64>) -> Vec<crate::Region> {
    let huge = HUGE_PAGE_SIZE as u64;
    let mut runs: Vec<crate::Region> = Vec::new();
    for s in starts {
        match runs.last_mut() {
            Some(l) if l.end() == s => l.len += huge,
            _ => runs.push(crate::Region {
                start: s,
                len: huge,
            }),
        }
    }
    runs
}

/// The thread serving a [`RegionWrites`]: notes each write fault's region
/// and lifts its protection (under the lock, so that a take sees the
/// region written exactly when its protection is lifted), and notes the
/// ranges unmapped, moved or dropped (read and noted under the lock
/// too). Sleeps until a message comes or `woken` is written (then ends if
/// `stop` is set: no periodic wake-up, which costs a node agent watching
/// many processes), and publishes its CPU time in `cpu_ns` before each
/// sleep.
fn serve_writes(
    fd: std::os::fd::OwnedFd,
    woken: std::io::PipeReader,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
    cpu_ns: &AtomicU64,
) {
    use pagewise_sys::uffd;
    let huge = HUGE_PAGE_SIZE as u64;
    let raw = fd.as_fd();
    let fail = |what: &'static str, e: std::io::Error| {
        seen.lock().unwrap_or_else(|p| p.into_inner()).failed = Some((what, e));
    };
    while !stop.load(Ordering::SeqCst) {
        cpu_ns.store(pagewise_sys::process::thread_cpu_ns(), Ordering::Relaxed);
        match uffd::poll_readable(&[raw, woken.as_fd()], -1) {
            Ok(r) if r & 1 == 0 => continue,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return fail("polling its userfaultfd", e),
        }
        loop {
            // Read under the lock: an unmap (or a move, or a drop) returns
            // in the watched process once its message is read, and a take
            // made after that must find it noted.
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            let m = match uffd::read_msg(raw) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    drop(s);
                    return fail("reading its userfaultfd", e);
                }
            };
            match m.event {
                uffd::event::PAGEFAULT => {
                    let at = m.pf_address() & !(huge - 1);
                    s.written.insert(at);
                    // Lifting the protection wakes the writer; a region
                    // unmapped meanwhile has nothing to lift, and is woken
                    // all the same.
                    let mut tries = 0;
                    while let Err(e) = uffd::writeprotect(raw, at, huge, false) {
                        tries += 1;
                        if e.raw_os_error() != Some(libc::EAGAIN) || tries > 100 {
                            let _ = uffd::wake(raw, at, huge);
                            break;
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                uffd::event::UNMAP => {
                    s.forgotten.push(m.range());
                    s.unmapped.push(m.range());
                }
                uffd::event::REMOVE => s.forgotten.push(m.range()),
                uffd::event::REMAP => {
                    let (from, to, len) = m.remap();
                    s.forgotten.push((from, from + len));
                    s.forgotten.push((to, to + len));
                    s.unmapped.push((from, from + len));
                    s.moved += 1;
                }
                _ => {}
            }
        }
    }
}

/// Why idle page tracking cannot be used here, or `None` when it can.
pub fn idle_page_unavailable() -> Option<String> {
    let p = crate::probe::get();
    (!p.idle_page).then(|| p.why("idle_page_tracking"))
}

const IDLE_BITMAP: &str = "/sys/kernel/mm/page_idle/bitmap";

/// Coverage of the anonymous memory of `pids` over `window` by idle page
/// tracking (root; see [`idle_page_unavailable`]).
pub fn idle_pages(pids: &[i32], window: Duration) -> Result<Vec<CoverageReport>> {
    if let Some(why) = idle_page_unavailable() {
        return Err(Error::Unsupported {
            feature: "idle page tracking",
            why,
        });
    }
    let bitmap = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(IDLE_BITMAP)
        .map_err(|e| Error::os(format!("opening {IDLE_BITMAP}"), e))?;
    // Per process: every present page of its anonymous mappings, (address, pfn).
    let mut pages: Vec<(i32, Vec<(u64, u64)>)> = Vec::new();
    for &pid in pids {
        let pm = std::fs::File::open(procfs::proc_dir(Some(pid)).join("pagemap"))
            .map_err(|e| Error::at(Some(pid), "opening pagemap", e))?;
        let mut v = Vec::new();
        let mut buf = vec![0u64; 512];
        for m in procfs::maps(Some(pid))?
            .iter()
            .filter(|m| m.is_anonymous() && !m.is_special())
        {
            let mut a = m.start;
            while a < m.end {
                let n = (((m.end - a) / PAGE_SIZE as u64) as usize).min(buf.len());
                pagemap::read_entries(pm.as_fd(), a, &mut buf[..n])
                    .map_err(|e| Error::at(Some(pid), format!("reading pagemap at {a:#x}"), e))?;
                for (i, &e) in buf[..n].iter().enumerate() {
                    let pfn = e & pagemap::entry::PFN_MASK;
                    if e & pagemap::entry::PRESENT != 0 && pfn != 0 {
                        v.push((a + (i * PAGE_SIZE) as u64, pfn));
                    }
                }
                a += (n * PAGE_SIZE) as u64;
            }
        }
        pages.push((pid, v));
    }
    // Mark idle: the bitmap is read and written in 8-byte words of 64 pfns.
    let word = |pfn: u64| (pfn / 64) * 8;
    let mut words: Vec<u64> = pages
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| word(p.1)))
        .collect();
    words.sort_unstable();
    words.dedup();
    let rw = |off: u64, val: Option<u64>| -> Result<u64> {
        use std::os::unix::fs::FileExt;
        let mut b = val.unwrap_or(0).to_ne_bytes();
        match val {
            Some(_) => bitmap.write_all_at(&b, off),
            None => bitmap.read_exact_at(&mut b, off),
        }
        .map_err(|e| Error::os(format!("{IDLE_BITMAP} at {off}"), e))?;
        Ok(u64::from_ne_bytes(b))
    };
    for &w in &words {
        rw(w, Some(u64::MAX))?;
    }
    let t0 = Instant::now();
    std::thread::sleep(window);
    let mut idle = std::collections::HashMap::new();
    for &w in &words {
        idle.insert(w, rw(w, None)?);
    }
    let window_ns = t0.elapsed().as_nanos() as u64;
    Ok(pages
        .into_iter()
        .map(|(pid, v)| {
            let mut regions: Vec<[u64; 4]> = Vec::new();
            for (a, pfn) in v {
                let accessed = idle[&word(pfn)] & (1 << (pfn % 64)) == 0;
                tally(&mut regions, a, true, accessed);
            }
            CoverageReport {
                pid,
                request: 0,
                window_ns,
                regions,
            }
        })
        .collect())
}
