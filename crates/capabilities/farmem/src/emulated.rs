//! Where emulated memory is, and what of it the kernel is about to touch:
//! the state the inline path shares, lock-free and signal-safe, between
//! the engine and every thread that faults or makes a system call.
//!
//! - **The map of emulated pages**: one bit per page of the 47-bit
//!   address space, set when an inline engine takes a region, cleared when
//!   the program unmaps it.
//! - **Holds for the kernel** ([`hold`], [`release`]): pages made local and
//!   kept so while a system call reads or writes them (see
//!   [`crate::inline`]).
//! - **Evictions in progress** ([`evicting`]), which a hold waits out.
//!
//! **Why this module holds unsafe code.** The map is a reservation read
//! as a slice of atomics from signal handlers, and a hold touches a page by
//! reading it at its address; neither can be a safe call.

use pagewise_sys::mem;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Where emulated memory is, one bit per page of the 47-bit address space
/// (4 GiB reserved, touched only where set): set when an inline engine
/// takes a region, cleared when the program unmaps it. Lock-free and
/// signal-safe to read; a hold touches only pages whose bit is set.
static PAGES: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
const ADDRESS_BITS: u32 = 47;
const PAGE_SHIFT: u32 = 12;
const PAGE_BITS: u64 = 1 << (ADDRESS_BITS - PAGE_SHIFT);

fn pages_map() -> Option<&'static [AtomicU64]> {
    let p = PAGES.load(Ordering::Acquire);
    // SAFETY: once set, PAGES points at PAGE_BITS/64 words mapped for the
    // life of the process.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, (PAGE_BITS / 64) as usize) })
}

/// First and last page number of a range inside the address space.
fn page_range(start: u64, len: u64) -> Option<(u64, u64)> {
    if len == 0 || start >= 1 << ADDRESS_BITS {
        return None;
    }
    let end = start.saturating_add(len).min(1 << ADDRESS_BITS);
    Some((start >> PAGE_SHIFT, (end - 1) >> PAGE_SHIFT))
}

fn set_pages(start: u64, len: u64, on: bool) {
    let (Some(m), Some((a, b))) = (pages_map(), page_range(start, len)) else {
        return;
    };
    for p in a..=b {
        let (w, bit) = ((p / 64) as usize, 1u64 << (p % 64));
        if on {
            m[w].fetch_or(bit, Ordering::AcqRel);
        } else {
            m[w].fetch_and(!bit, Ordering::AcqRel);
        }
    }
}

/// Marks `[start, start+len)` as emulated by an inline engine.
pub(crate) fn mark(start: u64, len: u64) {
    set_pages(start, len, true);
}

/// Marks `[start, start+len)`, just registered with the engine's
/// userfaultfd and queued for adoption (a new mapping, or one moved by
/// `mremap`), as possibly emulated at once: until the engine has adopted
/// it, a kernel access to one of its missing pages would fail with
/// `EFAULT` if it were not held (touched) first like any emulated page.
pub fn mark_registered(start: u64, len: u64) {
    mark(start, len);
}

/// Marks `[start, start+len)` as no longer emulated (unmapped).
pub(crate) fn unmark(start: u64, len: u64) {
    set_pages(start, len, false);
}

/// Whether any page of `[start, start+len)` is emulated by an inline engine
/// (lock-free, signal-safe).
pub(crate) fn may_be_emulated(start: u64, len: u64) -> bool {
    let (Some(m), Some((a, b))) = (pages_map(), page_range(start, len)) else {
        return false;
    };
    let mut p = a;
    while p <= b {
        let w = m[(p / 64) as usize].load(Ordering::Acquire);
        let lo = p % 64;
        let hi = (b - (p - lo)).min(63);
        let mask = (!0u64 << lo) & (!0u64 >> (63 - hi));
        if w & mask != 0 {
            return true;
        }
        p = (p | 63) + 1;
    }
    false
}

/// Ranges held for the kernel: `(start, end)`, `end` stored last (0: not
/// holding). An evictor counts itself in `EVICTING` before it reads the
/// holds, and a holder publishes its range before it waits for
/// `EVICTING` to be 0 and touches its pages (all sequentially consistent):
/// either the evictor sees the hold and passes the page over, or the
/// holder sees the evictor and touches the page after it is done,
/// fetching it again.
const HOLD_SLOTS: usize = 1024;
static HOLD_START: [AtomicU64; HOLD_SLOTS] = [const { AtomicU64::new(0) }; HOLD_SLOTS];
static HOLD_END: [AtomicU64; HOLD_SLOTS] = [const { AtomicU64::new(0) }; HOLD_SLOTS];
static HOLD_CLAIMED: [AtomicBool; HOLD_SLOTS] = [const { AtomicBool::new(false) }; HOLD_SLOTS];
/// One past the highest slot ever claimed.
static HOLD_HIGH: AtomicUsize = AtomicUsize::new(0);
/// Evictions (and parkings) in progress, in every inline engine.
static EVICTING: AtomicU32 = AtomicU32::new(0);

/// Ranges one [`Held`] can hold; more are merged (see [`hold`]).
pub(crate) const HELD_MAX: usize = 32;

/// Pages held for the kernel ([`hold`]); released by [`release`]. Fixed
/// size: holding never allocates (it runs in signal handlers).
#[derive(Debug, Default)]
pub struct Held {
    slots: [u16; HELD_MAX],
    n: usize,
}

impl Held {
    /// Adds `other`'s holds to these; what does not fit is let go (its
    /// pages were made local, but may be evicted again).
    pub fn merge(&mut self, other: Held) {
        for &s in &other.slots[..other.n] {
            if self.n < HELD_MAX {
                self.slots[self.n] = s;
                self.n += 1;
            } else {
                release_slot(s as usize);
            }
        }
    }

    /// Room for more ranges.
    pub fn room(&self) -> usize {
        HELD_MAX - self.n
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn slots(&self) -> &[u16] {
        &self.slots[..self.n]
    }
}

/// Merges `v` (sorted by start) until at most `max` ranges are left,
/// joining the closest neighbours first (a join covers the gap too, and
/// only its emulated pages are touched).
pub(crate) fn coalesce(v: &mut [(u64, u64)], mut n: usize, max: usize) -> usize {
    while n > max.max(1) {
        let mut best = 1;
        let mut gap = u64::MAX;
        for i in 1..n {
            let g = v[i].0.saturating_sub(v[i - 1].0 + v[i - 1].1);
            if g < gap {
                gap = g;
                best = i;
            }
        }
        let (s, e) = (
            v[best - 1].0,
            (v[best - 1].0 + v[best - 1].1).max(v[best].0 + v[best].1),
        );
        v[best - 1] = (s, e - s);
        v.copy_within(best + 1..n, best);
        n -= 1;
    }
    n
}

/// Makes the emulated pages of `ranges` (address, length) local and holds
/// them: they are neither evicted nor parked until [`release`], so that
/// the kernel can read and write them. Memory no inline engine emulates is
/// left alone. Lock-free where the pages are local already; a remote page
/// is fetched by touching it (a fault served in this thread). Never call
/// it holding an engine's lock. At most `HELD_MAX` ranges are held: pass
/// fewer (see `coalesce`).
pub fn hold(ranges: &[(u64, u64)]) -> Held {
    let mut held = Held::default();
    for &(start, len) in ranges {
        if !may_be_emulated(start, len) {
            continue;
        }
        let slot = if held.n < HELD_MAX {
            claim_slot()
        } else {
            None
        };
        let Some(slot) = slot else {
            // No slot: the pages are made local but not held.
            touch(start, len);
            continue;
        };
        HOLD_START[slot].store(start, Ordering::SeqCst);
        HOLD_END[slot].store(start + len, Ordering::SeqCst);
        held.slots[held.n] = slot as u16;
        held.n += 1;
    }
    if held.is_empty() {
        return held;
    }
    // Evictions that may not have seen these holds end first.
    while EVICTING.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    for &slot in held.slots() {
        let slot = slot as usize;
        let (s, e) = (
            HOLD_START[slot].load(Ordering::Relaxed),
            HOLD_END[slot].load(Ordering::Relaxed),
        );
        touch(s, e - s);
    }
    held
}

/// Holds `[start, start+len)` for the rest of the process's life (an
/// alternate signal stack, which the kernel writes when a signal comes).
pub fn hold_forever(start: u64, len: u64) {
    // Never released: the slots stay claimed.
    let _kept = hold(&[(start, len)]);
}

/// Releases what [`hold`] held.
pub fn release(held: Held) {
    for &slot in held.slots() {
        release_slot(slot as usize);
    }
}

fn release_slot(slot: usize) {
    HOLD_END[slot].store(0, Ordering::SeqCst);
    HOLD_START[slot].store(0, Ordering::Relaxed);
    HOLD_CLAIMED[slot].store(false, Ordering::Release);
}

fn claim_slot() -> Option<usize> {
    for (i, c) in HOLD_CLAIMED.iter().enumerate() {
        if c.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            HOLD_HIGH.fetch_max(i + 1, Ordering::AcqRel);
            return Some(i);
        }
    }
    None
}

/// Reads one byte of every emulated page of the range: a remote page
/// faults and is fetched here.
fn touch(start: u64, len: u64) {
    let (Some(m), Some((first, last))) = (pages_map(), page_range(start, len)) else {
        return;
    };
    // Word by word of the page map: spans of memory that is not emulated
    // (a call handed a length far beyond its buffer, or a huge mapping of
    // another kind) are passed 64 pages at a time.
    let mut p = first;
    while p <= last {
        let w = m[(p / 64) as usize].load(Ordering::Acquire);
        if w == 0 {
            p = (p | 63) + 1;
            continue;
        }
        if w & (1 << (p % 64)) != 0 {
            let page = p << PAGE_SHIFT;
            // SAFETY: the page belongs to an emulated region, which is
            // mapped readable and writable; reading it faults at most.
            unsafe { std::ptr::read_volatile(page.max(start) as *const u8) };
        }
        p += 1;
    }
}

/// Whether the page at `addr` is held for the kernel. The caller counted
/// itself in with [`evicting`] first.
pub(crate) fn is_held(addr: u64) -> bool {
    let high = HOLD_HIGH.load(Ordering::SeqCst);
    (0..high).any(|i| {
        let e = HOLD_END[i].load(Ordering::SeqCst);
        e != 0 && {
            let s = HOLD_START[i].load(Ordering::SeqCst);
            addr + pagewise_mech::PAGE_SIZE as u64 > s && addr < e
        }
    })
}

/// An eviction in progress, counted until dropped (see `HOLD_SLOTS`).
pub(crate) struct Evicting;

/// Counts an eviction in: take it before looking at [`is_held`].
pub(crate) fn evicting() -> Evicting {
    EVICTING.fetch_add(1, Ordering::SeqCst);
    Evicting
}

impl Drop for Evicting {
    fn drop(&mut self) {
        EVICTING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reserves the map of emulated pages (once; `MAP_NORESERVE`, touched only
/// where a bit is set).
pub(crate) fn reserve() -> pagewise_mech::Result<()> {
    if !PAGES.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    let p = mem::mmap_anonymous_flags((PAGE_BITS / 8) as usize, libc::MAP_NORESERVE)
        .map_err(|e| pagewise_mech::Error::os("reserving the map of emulated pages", e))?;
    let _ = mem::name_anon(p as u64, (PAGE_BITS / 8) as usize, c"pagewise-farmem-pages");
    PAGES.store(p as *mut AtomicU64, Ordering::Release);
    Ok(())
}

/// In the child of a `fork`: forgets every hold and eviction the parent's
/// threads had under way (those threads were not copied).
pub(crate) fn forget_holds() {
    EVICTING.store(0, Ordering::Release);
    for i in 0..HOLD_SLOTS {
        HOLD_END[i].store(0, Ordering::Relaxed);
        HOLD_START[i].store(0, Ordering::Relaxed);
        HOLD_CLAIMED[i].store(false, Ordering::Release);
    }
}
