//! Access coverage: which base pages of each 2 MiB region a process touches
//! over an interval (HawkEye's access map). The one place pagewise measures
//! it, by the best means the kernel and the process allow:
//!
//! - **idle page tracking** (`/sys/kernel/mm/page_idle/bitmap`, root): any
//!   process. Every present page is marked idle; after the window, a page
//!   whose idle bit the kernel cleared was accessed.
//! - **the far-memory sampler**: processes started under pagewise (members
//!   of a far-memory instance: [`crate::farmem::sampler`] drives it and
//!   hands back [`CoverageReport`]s; this module depends on no sampler). The engine inside the
//!   process evicts every local page when the window opens; the pages
//!   faulted back by its end are exactly those touched. It sees reads and
//!   writes, on any kernel with `UFFDIO_MOVE`, at a fault per distinct page
//!   touched, and it serves memory page by page (no huge pages).
//!
//! - **write tracking from outside** ([`WriteCoverage`]): any process
//!   pagewise may trace (no seccomp filter, no other tracer). A userfaultfd
//!   made inside the process (see [`crate::track`]) write-protects the
//!   regions asked for over the window; the pages written in it are those
//!   touched. It sees writes only (a region only read looks cold), and a
//!   write to a write-protected huge page splits it, so it is used on
//!   regions not mapped by a huge page: the candidates for promotion.
//!
//! - **regions written, from outside, without splitting huge pages**
//!   ([`RegionWrites`]): the same userfaultfd in synchronous mode. The first
//!   write to a protected region stops the writing thread until this side
//!   has noted the region and lifted its protection: one fault per region
//!   written in a window, whatever the page size, and a huge page stays
//!   huge. It tells whether a region was written, not how many of its
//!   pages (SmartMD's access bit per huge page, for writes).
//!
//! DAMON is not used: it samples one page per region and estimates, where
//! this asks for every page.

use crate::{procfs, Error, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::pagemap;
use serde::{Deserialize, Serialize};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What one process touched in a window.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
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
    wp: crate::track::UffdWp,
    armed: Vec<crate::Region>,
    since: Option<Instant>,
}

impl WriteCoverage {
    /// Makes the userfaultfd inside process `pid` (it is stopped for a
    /// moment); refused with the reason where that cannot be done.
    pub fn new(pid: i32) -> Result<Self> {
        Ok(WriteCoverage {
            pid,
            wp: crate::track::UffdWp::open_in(pid)?,
            armed: Vec::new(),
            since: None,
        })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Arms `regions` (2 MiB regions, each inside one private anonymous
    /// writable mapping; see [`crate::thp`]): writes from now on are
    /// counted. A region that cannot be armed (unmapped meanwhile) is left
    /// out.
    pub fn start(&mut self, regions: &[crate::Region]) -> Result<()> {
        self.finish_quietly();
        self.wp.check_memory()?;
        for &r in regions {
            if self.wp.register(r, true).is_ok() {
                self.armed.push(r);
            }
        }
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
        for r in &armed {
            written.clear();
            if let Err(e) = self
                .wp
                .scan_written(r.start, r.end(), false, false, &mut written)
            {
                failed.get_or_insert(e);
            }
            let n: u64 = written.iter().map(|w| w.pages).sum();
            regions.push([r.start, r.pages(), r.pages(), n]);
        }
        for r in &armed {
            let _ = self.wp.unregister(*r);
        }
        if let Some(e) = failed {
            self.wp.check_memory()?;
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
        for r in std::mem::take(&mut self.armed) {
            let _ = self.wp.unregister(r);
        }
    }
}

impl Drop for WriteCoverage {
    fn drop(&mut self) {
        self.finish_quietly();
    }
}

/// Which 2 MiB regions of another process are written in a window, from
/// outside, without splitting a huge page (see the module):
/// [`start`](Self::start) protects them, [`serve`] notes each first write
/// and lets the writer go on at once, [`finish`](Self::finish) returns
/// the regions written and unregisters everything (waking any writer still
/// waiting). The process's threads wait on this side only while a window
/// is open; if this side goes away, closing the descriptor wakes them.
pub struct RegionWrites {
    pid: i32,
    wp: crate::track::UffdWp,
    /// Registered runs of regions.
    armed: Vec<crate::Region>,
    written: std::collections::BTreeSet<u64>,
}

impl RegionWrites {
    /// Makes the userfaultfd inside process `pid` (stopped for a moment);
    /// refused with the reason where that cannot be done (see
    /// [`crate::track::UffdWp::open_in_sync`]).
    pub fn new(pid: i32) -> Result<Self> {
        Ok(RegionWrites {
            pid,
            wp: crate::track::UffdWp::open_in_sync(pid)?,
            armed: Vec::new(),
            written: Default::default(),
        })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Protects `regions` (2 MiB-aligned, each inside one private
    /// anonymous writable mapping), registered in runs of adjacent
    /// regions: writes from now on are noted. A run that cannot be
    /// registered (unmapped meanwhile) is left out.
    pub fn start(&mut self, regions: &[crate::Region]) -> Result<()> {
        self.finish_quietly();
        self.wp.check_memory()?;
        let mut runs: Vec<crate::Region> = Vec::new();
        for &r in regions {
            match runs.last_mut() {
                Some(l) if l.end() == r.start => l.len += r.len,
                _ => runs.push(r),
            }
        }
        for r in runs {
            if self.wp.register(r, true).is_ok() {
                self.armed.push(r);
            }
        }
        Ok(())
    }

    /// Notes the writes waiting now and lets their threads go on.
    fn drain(&mut self) -> Result<()> {
        use pagewise_sys::uffd;
        let huge = HUGE_PAGE_SIZE as u64;
        loop {
            let m = match uffd::read_msg(self.wp.fd().as_raw_fd()) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Error::for_pid(self.pid, "reading its userfaultfd", e)),
            };
            if m.event != uffd::event::PAGEFAULT {
                continue;
            }
            let at = m.pf_address() & !(huge - 1);
            self.written.insert(at);
            let r = crate::Region {
                start: at,
                len: huge,
            };
            // Lifting the protection wakes the writer; a region unmapped
            // meanwhile has nothing to lift, and is woken all the same.
            let mut tries = 0;
            while let Err(e) = self.wp.unprotect(r) {
                let again = e.errno() == libc::EAGAIN;
                tries += 1;
                if !again || tries > 100 {
                    let _ = uffd::wake(self.wp.fd().as_raw_fd(), r.start, r.len);
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Ends the window: the regions written since [`start`](Self::start)
    /// (their starts), every run unregistered.
    pub fn finish(&mut self) -> Result<std::collections::BTreeSet<u64>> {
        let drained = self.drain();
        self.finish_quietly();
        drained?;
        Ok(std::mem::take(&mut self.written))
    }

    fn finish_quietly(&mut self) {
        for r in std::mem::take(&mut self.armed) {
            let _ = self.wp.unregister(r);
        }
    }
}

impl Drop for RegionWrites {
    fn drop(&mut self) {
        self.finish_quietly();
    }
}

/// Serves the writes of every window in `windows` until `until` (see
/// [`RegionWrites`]). A window whose process fails is returned with the
/// error and served no longer.
pub fn serve(windows: &mut [&mut RegionWrites], until: Instant) -> Vec<(i32, Error)> {
    let mut failed = Vec::new();
    let mut live: Vec<usize> = (0..windows.len()).collect();
    while !live.is_empty() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let fds: Vec<i32> = live
            .iter()
            .take(64)
            .map(|&i| windows[i].wp.fd().as_raw_fd())
            .collect();
        let ready = match pagewise_sys::uffd::poll_readable(
            &fds,
            left.as_millis().clamp(1, i32::MAX as u128) as i32,
        ) {
            Ok(r) => r,
            Err(e) => {
                for i in live.drain(..) {
                    let e =
                        std::io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EIO));
                    failed.push((windows[i].pid, Error::os("polling userfaultfds", e)));
                }
                break;
            }
        };
        let mut k = 0;
        live.retain(|&i| {
            let bit = k < 64 && ready & (1 << k) != 0;
            k += 1;
            if !bit {
                return true;
            }
            match windows[i].drain() {
                Ok(()) => true,
                Err(e) => {
                    failed.push((windows[i].pid, e));
                    false
                }
            }
        });
    }
    failed
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
                pagemap::read_entries(pm.as_raw_fd(), a, &mut buf[..n])
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
