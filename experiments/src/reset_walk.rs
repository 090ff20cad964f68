//! How a reset finds the pages written since the last one, three ways, on
//! this process's own memory (`MiB` populated, `k` scattered pages
//! written per input), µs per input:
//!
//! - **whole range:** one `PAGEMAP_SCAN` over the mapping, registered with
//!   asynchronous write-protect (what a reset session does);
//! - **written ranges only:** one `PAGEMAP_SCAN` per page written, each
//!   over that page alone: the floor of a walk that knew where to look;
//! - **synchronous write-protect:** the mapping registered without
//!   `WP_ASYNC`; each first write to a page waits for a handler thread that
//!   records it and lifts the protection: no walk, but the input pays a
//!   round trip per page. Its cost is the input's time over that of the
//!   same writes under asynchronous write-protect.
//!
//! - **huge pages:** the whole-range scan of the same memory collapsed
//!   into 2 MiB huge pages (`MADV_COLLAPSE`, which needs no change of the
//!   program's own advice): a protected huge page is one entry to the
//!   walk, and a write splits only the huge page it lands in (the
//!   asynchronous write-protect fault splits it, then protects per base
//!   page). With the same `k` pages written by every input (a fuzzing
//!   target's hot state), the walk visits the untouched huge pages and the
//!   split ones; with other pages every input, splits accumulate until the
//!   walk is the base pages' again. Both are measured, with the memory
//!   still in huge pages at the end (the kernel's count).
//!
//! Checked: the whole-range scans and the handler each find exactly the
//! pages written.

use crate::reset::Dist;
use anyhow::{bail, Context, Result};
use pagewise::Region;
use pagewise_mech::wp::UffdWp;
use pagewise_sys::uffd;
use serde::Serialize;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One size.
#[derive(Debug, Clone, Serialize)]
pub struct WalkRow {
    /// The mapping, MiB.
    pub mib: usize,
    /// Pages written per input.
    pub k: usize,
    /// Inputs measured.
    pub reps: usize,
    /// One scan of the whole mapping, µs.
    pub whole_range: Dist,
    /// One scan per page written, over that page, µs.
    pub written_only: Dist,
    /// The input under asynchronous write-protect, µs.
    pub input_async: Dist,
    /// The input under synchronous write-protect (a handler round trip per
    /// page), µs.
    pub input_sync: Dist,
    /// What synchronous write-protect adds to an input (medians), µs.
    pub sync_extra_us: f64,
    /// The whole-range scan with the memory in huge pages.
    pub huge: Option<HugeWalk>,
    /// Why it was not measured, if so.
    pub huge_skipped: Option<String>,
}

/// The whole-range scan of memory collapsed into huge pages.
#[derive(Debug, Clone, Serialize)]
pub struct HugeWalk {
    /// The same `k` pages written by every input, µs.
    pub hot: Dist,
    /// Other pages every input, µs.
    pub scattered: Dist,
    /// Memory still in huge pages after the inputs, MiB (the kernel's
    /// count): the same pages, other pages.
    pub huge_left_mib: (u64, u64),
}

fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Writes 8 bytes into each of `pages` of `base`.
fn write_pages(base: *mut u8, pages: &[usize], v: u8) {
    for &p in pages {
        // SAFETY: `p` is a page of the mapping at `base`, which lives for
        // the caller's whole measurement.
        unsafe { std::ptr::write_volatile(base.add(p * pagewise::PAGE_SIZE + 8), v) };
    }
}

/// Measures one size.
pub fn walk(mib: usize, k: usize, reps: usize) -> Result<WalkRow> {
    let ps = pagewise::PAGE_SIZE;
    let mem = pagewise_mech::workload::AnonMemory::new(mib << 20)?;
    let base = mem.as_ptr();
    let total = mem.len() / ps;
    // SAFETY: the mapping is this function's own, alive until it returns.
    unsafe { std::ptr::write_bytes(base, 1, mem.len()) };
    let r = Region::new(base as u64, mem.len() as u64)?;
    let pages_of = |rep: usize| -> Vec<usize> {
        let mut v: Vec<usize> =
            crate::rollback::target::pages_of(k, rep as u64 + 1, total.next_power_of_two())
                .filter(|&p| p < total)
                .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (mut whole, mut only, mut input_async) = (Vec::new(), Vec::new(), Vec::new());
    {
        let mut wp = UffdWp::open()?;
        wp.register(r, true)?;
        let mut out = Vec::new();
        for rep in 0..reps {
            let pages = pages_of(rep);
            let t = Instant::now();
            write_pages(base, &pages, rep as u8);
            input_async.push(us(t));
            out.clear();
            let t = Instant::now();
            wp.scan_written(r.start, r.end(), true, false, &mut out)?;
            whole.push(us(t));
            let found = out.iter().map(|p| p.pages).sum::<u64>() as usize;
            if found != pages.len() {
                bail!("the scan found {found} pages written, not {}", pages.len());
            }
            let t = Instant::now();
            for &p in &pages {
                let a = r.start + (p * ps) as u64;
                wp.scan_written(a, a + ps as u64, true, false, &mut out)?;
            }
            only.push(us(t));
            for &p in &pages {
                wp.protect(Region::new(r.start + (p * ps) as u64, ps as u64)?)?;
            }
        }
        wp.unregister(r)?;
    }
    let input_sync = sync_inputs(base, r, reps, &pages_of)?;
    drop(mem);
    let (huge, huge_skipped) = match huge_walk(mib, reps, &pages_of) {
        Ok(h) => (Some(h), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let (a, s) = (Dist::of(input_async), Dist::of(input_sync));
    Ok(WalkRow {
        mib,
        k,
        reps,
        whole_range: Dist::of(whole),
        written_only: Dist::of(only),
        input_async: a,
        sync_extra_us: s.median - a.median,
        input_sync: s,
        huge,
        huge_skipped,
    })
}

/// Memory of `r` in huge pages, MiB (`PAGEMAP_SCAN`'s own count).
fn huge_mib(r: Region) -> Result<u64> {
    let mut w = pagewise_mech::walk::PageWalker::new(None)?;
    let mut runs = Vec::new();
    let huge = pagewise_sys::pagemap::category::HUGE;
    w.categories(r, huge, huge, &mut runs)?;
    Ok(runs.iter().map(|x| x.end - x.start).sum::<u64>() >> 20)
}

/// The whole-range scan over `mib` MiB collapsed into huge pages, the
/// same pages written by every input, then other pages every input.
fn huge_walk(mib: usize, reps: usize, pages_of: &dyn Fn(usize) -> Vec<usize>) -> Result<HugeWalk> {
    let ps = pagewise::PAGE_SIZE;
    let mut times = Vec::new();
    let mut left = Vec::new();
    for scattered in [false, true] {
        let mem = pagewise_mech::workload::AnonMemory::new(mib << 20)?;
        let base = mem.as_ptr();
        // SAFETY: the mapping is this function's own, alive until the
        // end of this iteration.
        unsafe { std::ptr::write_bytes(base, 1, mem.len()) };
        let r = Region::new(base as u64, mem.len() as u64)?;
        pagewise_sys::mem::advise(r.start, mem.len(), pagewise_sys::mem::MADV_COLLAPSE)
            .context("MADV_COLLAPSE of the memory")?;
        let huge = huge_mib(r)?;
        if huge < mib as u64 {
            bail!("{huge} of {mib} MiB collapsed into huge pages");
        }
        let mut wp = UffdWp::open()?;
        wp.register(r, true)?;
        let mut out = Vec::new();
        let mut t_all = Vec::with_capacity(reps);
        for rep in 0..reps {
            let pages = pages_of(if scattered { rep } else { 0 });
            write_pages(base, &pages, rep as u8);
            out.clear();
            let t = Instant::now();
            wp.scan_written(r.start, r.end(), true, false, &mut out)?;
            t_all.push(us(t));
            let found = out.iter().map(|p| p.pages).sum::<u64>() as usize;
            if found != pages.len() {
                bail!(
                    "the scan of huge pages found {found} pages written, not {}",
                    pages.len()
                );
            }
            for &p in &pages {
                wp.protect(Region::new(r.start + (p * ps) as u64, ps as u64)?)?;
            }
        }
        left.push(huge_mib(r)?);
        wp.unregister(r)?;
        times.push(Dist::of(t_all));
    }
    let scattered = times.pop().expect("two");
    Ok(HugeWalk {
        hot: times.pop().expect("two"),
        scattered,
        huge_left_mib: (left[0], left[1]),
    })
}

/// The inputs' times under synchronous write-protect, a handler thread
/// recording each page and lifting its protection.
fn sync_inputs(
    base: *mut u8,
    r: Region,
    reps: usize,
    pages_of: &dyn Fn(usize) -> Vec<usize>,
) -> Result<Vec<f64>> {
    let ps = pagewise::PAGE_SIZE as u64;
    let fd = uffd::userfaultfd(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .context("a userfaultfd for synchronous write-protect")?;
    uffd::api(fd.as_fd(), 0)?;
    uffd::register(fd.as_fd(), r.start, r.len, uffd::REGISTER_MODE_WP)?;
    uffd::writeprotect(fd.as_fd(), r.start, r.len, true)?;
    let fd = Arc::new(fd);
    let seen = Arc::new(Mutex::new(Vec::<u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let handler = {
        let (fd, seen, stop) = (fd.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || -> std::io::Result<()> {
            while !stop.load(Ordering::Relaxed) {
                if uffd::poll_readable(&[fd.as_fd()], 50)? == 0 {
                    continue;
                }
                let msg = match uffd::read_msg(fd.as_fd()) {
                    Ok(m) => m,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                };
                let page = msg.pf_address() & !(ps - 1);
                seen.lock().unwrap_or_else(|e| e.into_inner()).push(page);
                uffd::writeprotect(fd.as_fd(), page, ps, false)?;
            }
            Ok(())
        })
    };
    let mut times = Vec::with_capacity(reps);
    let result = (|| -> Result<()> {
        for rep in 0..reps {
            let pages = pages_of(rep);
            let t = Instant::now();
            write_pages(base, &pages, rep as u8 ^ 0x5a);
            times.push(us(t));
            let mut got = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
            got.sort_unstable();
            let want: Vec<u64> = pages.iter().map(|&p| r.start + p as u64 * ps).collect();
            if got != want {
                bail!(
                    "the handler saw {} pages written, not {}",
                    got.len(),
                    want.len()
                );
            }
            for a in want {
                uffd::writeprotect(fd.as_fd(), a, ps, true)?;
            }
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let joined = handler.join();
    let _ = uffd::unregister(fd.as_fd(), r.start, r.len);
    result?;
    match joined {
        Ok(Ok(())) => Ok(times),
        Ok(Err(e)) => Err(e).context("the write-protect handler"),
        Err(_) => bail!("the write-protect handler panicked"),
    }
}
