//! The `mprotect` backend: dirty tracking with write faults, the baseline of
//! the LDT paper.
//!
//! Tracked pages are made read-only. A process-wide `SIGSEGV` handler finds the
//! faulting page in a fixed table of tracked regions, makes that page writable
//! again and *then* sets its bit; the collector swaps the bits to zero and
//! *then* re-protects the pages it found. With that order a write is reported
//! now or at the next collection, never lost (see the module tests).
//!
//! Each unprotected page splits a VMA; when the kernel refuses a further split
//! (`vm.max_map_count`), the handler unprotects the whole region and flags it
//! all-dirty, which stays correct at the price of over-reporting.
//!
//! Not for programs that change the protection of tracked memory themselves,
//! nor with another `SIGSEGV` user that is installed after pagewise; faults
//! outside tracked regions are passed to the handler that was there before.
//!
//! **Why this module holds unsafe code.** Like the far-memory SIGBUS
//! handler, its SIGSEGV handler works on the kernel's signal frame (the
//! faulting address in `siginfo`) and on a fixed table reached from the
//! handler without locks; installing it is unsafe by nature.

use super::{Backend, BackendKind, CollectStats};
use crate::{Error, Result};
use pagewise_mech::region::{push_coalesced, PageRange, Region};
use pagewise_mech::PAGE_SIZE;
use pagewise_sys::mem;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// How many regions all `mprotect` trackers of a process may watch at once.
const MAX_SLOTS: usize = 256;

struct Slot {
    start: AtomicU64,
    end: AtomicU64,
    bits: AtomicPtr<AtomicU64>,
    all_dirty: AtomicBool,
    faults: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    start: AtomicU64::new(0),
    end: AtomicU64::new(0),
    bits: AtomicPtr::new(std::ptr::null_mut()),
    all_dirty: AtomicBool::new(false),
    faults: AtomicU64::new(0),
};
static SLOTS: [Slot; MAX_SLOTS] = [EMPTY_SLOT; MAX_SLOTS];
/// `mprotect` of a range this backend tracks (or gives back).
fn protect(start: u64, len: usize, prot: libc::c_int) -> std::io::Result<()> {
    // SAFETY: the range is (part of) a tracked region: a write to it while
    // it is read-only faults into `on_segv`, which makes the page writable
    // again and lets the write go on; reads are never refused.
    unsafe { mem::mprotect(start, len, prot) }
}

static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Mutex<bool> = Mutex::new(false);
static mut OLD_ACTION: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as u64;
    let n = SLOTS_USED.load(Ordering::Acquire);
    for s in &SLOTS[..n] {
        let start = s.start.load(Ordering::Acquire);
        if addr >= start && addr < s.end.load(Ordering::Acquire) {
            let page = addr & !(PAGE_SIZE as u64 - 1);
            s.faults.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the page of a tracked region that faulted: giving write
            // back lets the faulting write go on.
            if unsafe { mem::mprotect_raw(page, PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE) }
                != 0
            {
                // Out of VMAs: unprotect the whole region and report it whole.
                let end = s.end.load(Ordering::Acquire);
                // SAFETY: the whole tracked region, made writable again.
                if unsafe {
                    mem::mprotect_raw(
                        start,
                        (end - start) as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                    )
                } != 0
                {
                    // The write cannot proceed (abort is async-signal-safe).
                    std::process::abort();
                }
                s.all_dirty.store(true, Ordering::Release);
                return;
            }
            let bits = s.bits.load(Ordering::Acquire);
            let idx = (page - start) / PAGE_SIZE as u64;
            // SAFETY: `bits` holds one bit per page of [start, end) and lives as
            // long as the slot is published; `idx` is inside it.
            unsafe { (*bits.add((idx / 64) as usize)).fetch_or(1 << (idx % 64), Ordering::AcqRel) };
            return;
        }
    }
    // Not ours: hand it to the previous handler, or die as the default would.
    // SAFETY: OLD_ACTION was written once, under INSTALL, before this handler
    // was installed, and is never written again.
    let old = unsafe { (*std::ptr::addr_of!(OLD_ACTION)).assume_init() };
    if old.sa_flags & libc::SA_SIGINFO != 0 && old.sa_sigaction > 1 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(old.sa_sigaction) };
        f(sig, info, ctx);
    } else if old.sa_sigaction > 1 {
        // SAFETY: a non-SA_SIGINFO handler takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(old.sa_sigaction) };
        f(sig);
    } else {
        // Returning re-executes the faulting instruction, which then
        // terminates the process as SIGSEGV.
        let _ = pagewise_sys::signal::reset_default(libc::SIGSEGV);
    }
}

fn install_handler() -> Result<()> {
    let mut done = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return Ok(());
    }
    // SAFETY: on_segv is async-signal-safe (atomics, mprotect, abort, and
    // the previous handler, itself a signal handler). OLD_ACTION is written
    // only here, once, under the INSTALL lock, by the kernel in the same
    // call that installs the handler that reads it.
    unsafe {
        pagewise_sys::signal::install_saving(
            libc::SIGSEGV,
            on_segv,
            (*std::ptr::addr_of_mut!(OLD_ACTION)).as_mut_ptr(),
        )
    }
    .map_err(|e| Error::os("installing the SIGSEGV handler", e))?;
    *done = true;
    Ok(())
}

struct Tracked {
    region: Region,
    slot: usize,
    bits: Box<[AtomicU64]>,
}

pub(crate) struct MprotectBackend {
    tracked: Vec<Tracked>,
}

impl MprotectBackend {
    pub(crate) fn new() -> Self {
        MprotectBackend {
            tracked: Vec::new(),
        }
    }
}

fn claim_slot(region: Region, bits: *mut AtomicU64) -> Result<usize> {
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let used = SLOTS_USED.load(Ordering::Acquire);
    let free = (0..used).find(|&i| SLOTS[i].end.load(Ordering::Acquire) == 0);
    let i = match free {
        Some(i) => i,
        None if used < MAX_SLOTS => used,
        None => return Err(Error::TooManyRegions { max: MAX_SLOTS }),
    };
    let s = &SLOTS[i];
    s.bits.store(bits, Ordering::Release);
    s.all_dirty.store(false, Ordering::Release);
    s.faults.store(0, Ordering::Release);
    s.start.store(region.start, Ordering::Release);
    s.end.store(region.end(), Ordering::Release);
    if i == used {
        SLOTS_USED.store(used + 1, Ordering::Release);
    }
    Ok(i)
}

fn release_slot(i: usize) {
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let s = &SLOTS[i];
    s.end.store(0, Ordering::Release);
    s.start.store(0, Ordering::Release);
    s.bits.store(std::ptr::null_mut(), Ordering::Release);
}

impl Backend for MprotectBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Mprotect
    }

    fn scan(&mut self, out: &mut Vec<PageRange>, stats: &mut CollectStats) -> Result<()> {
        // This region's ranges apart from `out`: in `out` a range may merge
        // with the previous region's last one when the regions are adjacent,
        // and this region's part of it must still be re-protected.
        let mut found = Vec::new();
        for t in &self.tracked {
            let s = &SLOTS[t.slot];
            stats.faults += s.faults.swap(0, Ordering::AcqRel);
            found.clear();
            if s.all_dirty.swap(false, Ordering::AcqRel) {
                for w in t.bits.iter() {
                    w.store(0, Ordering::Release);
                }
                push_coalesced(&mut found, t.region.start, t.region.end());
            } else {
                for (wi, w) in t.bits.iter().enumerate() {
                    if w.load(Ordering::Relaxed) == 0 {
                        continue;
                    }
                    let mut v = w.swap(0, Ordering::AcqRel);
                    while v != 0 {
                        let b = v.trailing_zeros() as u64;
                        v &= v - 1;
                        let a = t.region.start + (wi as u64 * 64 + b) * PAGE_SIZE as u64;
                        push_coalesced(&mut found, a, a + PAGE_SIZE as u64);
                    }
                }
            }
            // Re-protect after the bits were taken (see the module docs).
            if found.len() > 64 {
                protect(t.region.start, t.region.len as usize, libc::PROT_READ)
                    .map_err(|e| Error::os("mprotect(PROT_READ) of a tracked region", e))?;
            } else {
                for r in &found {
                    protect(r.start, r.len() as usize, libc::PROT_READ).map_err(|e| {
                        Error::os(
                            format!("mprotect(PROT_READ) of {:#x}+{:#x}", r.start, r.len()),
                            e,
                        )
                    })?;
                }
            }
            for r in &found {
                push_coalesced(out, r.start, r.end());
            }
        }
        Ok(())
    }

    fn add_region(&mut self, region: Region, baseline: bool) -> Result<()> {
        install_handler()?;
        let words = region.pages().div_ceil(64) as usize;
        let bits: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let slot = claim_slot(region, bits.as_ptr() as *mut AtomicU64)?;
        if !baseline {
            SLOTS[slot].all_dirty.store(true, Ordering::Release);
        }
        if let Err(e) = protect(region.start, region.len as usize, libc::PROT_READ) {
            release_slot(slot);
            return Err(Error::os(
                format!(
                    "mprotect(PROT_READ) of {:#x}+{:#x}",
                    region.start, region.len
                ),
                e,
            ));
        }
        self.tracked.push(Tracked { region, slot, bits });
        self.tracked.sort_by_key(|t| t.region.start);
        Ok(())
    }

    fn remove_region(&mut self, region: Region) -> Result<()> {
        if let Some(i) = self.tracked.iter().position(|t| t.region == region) {
            let t = self.tracked.remove(i);
            let _ = protect(
                region.start,
                region.len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            );
            release_slot(t.slot);
        }
        Ok(())
    }

    fn regions(&self) -> Vec<Region> {
        self.tracked.iter().map(|t| t.region).collect()
    }
}

impl Drop for MprotectBackend {
    fn drop(&mut self) {
        for t in std::mem::take(&mut self.tracked) {
            let _ = protect(
                t.region.start,
                t.region.len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            );
            release_slot(t.slot);
        }
    }
}
