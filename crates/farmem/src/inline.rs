//! Faults served in the faulting thread (`UFFD_FEATURE_SIGBUS`).
//!
//! On the *inline* path the regions are registered with a userfaultfd that
//! asks for `SIGBUS`: a user-mode access to a remote page raises `SIGBUS` in
//! the thread that made it, and this module's handler serves the fault
//! right there (evicts a victim, waits out the modelled delay, moves the
//! page in) and returns, so that the access runs again and succeeds. No
//! other thread is woken and nobody sleeps: what a fault costs is the
//! signal's delivery and return and the engine's own work.
//!
//! The engine's books are shared by every thread that faults and by the
//! event thread (which still reads the program's `munmap`, `MADV_DONTNEED`
//! and `mremap` as events) under one [`OwnedLock`], whose owner a handler
//! can recognise. The handler blocks every asynchronous signal while it
//! runs, so that a program's handler never interrupts a thread that holds
//! the lock.
//!
//! # Memory the kernel touches
//! A fault the kernel takes on the program's behalf (a `read()` into a
//! remote buffer) cannot raise a signal: on this path it fails with
//! `EFAULT`. Such memory is *held* before it is handed to the kernel
//! ([`hold`]): its pages are fetched now and are neither evicted nor parked
//! until the hold is released. The preload shim holds what every trapped
//! system call will touch (see [`super::syscalls`]); a library user holds
//! buffers with [`super::FarMemory::hold`].
//!
//! # The program's own `SIGBUS`
//! A `SIGBUS` that is not a fault on emulated memory (a file mapping read
//! past its end, a signal sent by `kill`) goes to the action the program
//! set ([`set_program_action`]; at first, the one found when the handler
//! was installed): its handler is called, or the default action is put back
//! and taken.
//!
//! **Why this module holds unsafe code.** It is the SIGBUS handler's frame
//! work, which cannot be a safe call: reading the kernel's `siginfo` and
//! `ucontext` (the faulting address and instruction), the engine's cell
//! reached lock-free from a signal handler, installing the handler, and
//! calling the program's own handler as the kernel would. Everything else
//! it needs is a safe `pagewise-sys` call.

use super::engine::Engine;
use super::Shared;
use pagewise_sys::futex::{gettid, OwnedLock};
use pagewise_sys::signal::{self, KernelSigaction};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};

/// Which thread serves a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FaultPath {
    /// The engine's handler thread; the faulting thread sleeps until the
    /// page is mapped. Faults inside system calls wait like any other.
    #[default]
    Thread,
    /// The faulting thread itself, in a `SIGBUS` handler. Memory handed to
    /// the kernel must be held first (see the module docs).
    Inline,
}

impl std::str::FromStr for FaultPath {
    type Err = pagewise_mech::Error;
    fn from_str(s: &str) -> pagewise_mech::Result<Self> {
        match s {
            "thread" => Ok(FaultPath::Thread),
            "inline" => Ok(FaultPath::Inline),
            _ => Err(pagewise_mech::Error::Invalid(format!(
                "unknown fault path {s:?} (thread or inline)"
            ))),
        }
    }
}

impl std::fmt::Display for FaultPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FaultPath::Thread => "thread",
            FaultPath::Inline => "inline",
        })
    }
}

/// One engine and the lock over it.
pub(super) struct Cell {
    lock: OwnedLock,
    engine: UnsafeCell<Option<Engine>>,
    pub(super) shared: Arc<Shared>,
}

// SAFETY: the engine is reached only through `Guard`, which holds the lock.
unsafe impl Sync for Cell {}
// SAFETY: as above; the engine itself moves between threads only whole.
unsafe impl Send for Cell {}

/// The engine, locked.
pub(super) struct Guard<'a> {
    cell: &'a Cell,
}

impl Guard<'_> {
    /// The engine (`None` once it stopped).
    pub(super) fn engine(&mut self) -> Option<&mut Engine> {
        // SAFETY: this guard holds the lock.
        unsafe { (*self.cell.engine.get()).as_mut() }
    }

    /// Takes the engine out (it stops).
    pub(super) fn take(&mut self) -> Option<Engine> {
        // SAFETY: this guard holds the lock.
        unsafe { (*self.cell.engine.get()).take() }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.cell.lock.unlock();
    }
}

impl Cell {
    pub(super) fn new(engine: Engine, shared: Arc<Shared>) -> Self {
        Cell {
            lock: OwnedLock::new(),
            engine: UnsafeCell::new(Some(engine)),
            shared,
        }
    }

    pub(super) fn lock(&self) -> Guard<'_> {
        self.lock.lock(current_tid());
        Guard { cell: self }
    }

    fn lock_as(&self, tid: i32) -> Guard<'_> {
        self.lock.lock(tid);
        Guard { cell: self }
    }
}

/// The engines serving faults inline in this process. A cell, once here,
/// is never freed (a handler may be about to look at it); a stopped one
/// holds no engine and leaves its slot.
const MAX_ENGINES: usize = 32;
static CELLS: [AtomicPtr<Cell>; MAX_ENGINES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_ENGINES];

/// Enters `cell` in the registry (installing the handler the first time).
pub(super) fn register(cell: &Arc<Cell>) -> pagewise_mech::Result<()> {
    install_handler()?;
    let p = Arc::into_raw(cell.clone()) as *mut Cell;
    for slot in &CELLS {
        if slot
            .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Ok(());
        }
    }
    // SAFETY: `p` came from Arc::into_raw just above and was not stored.
    drop(unsafe { Arc::from_raw(p) });
    Err(pagewise_mech::Error::Invalid(format!(
        "at most {MAX_ENGINES} far-memory engines may serve faults inline in one process"
    )))
}

/// Takes `cell` out of the registry once its engine stopped (the cell
/// itself is never freed: a handler may still be looking at it).
pub(super) fn unregister(cell: &Cell) {
    for slot in &CELLS {
        let _ = slot.compare_exchange(
            cell as *const Cell as *mut Cell,
            std::ptr::null_mut(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

fn cells() -> impl Iterator<Item = &'static Cell> {
    CELLS.iter().filter_map(|s| {
        let p = s.load(Ordering::Acquire);
        // SAFETY: a registered cell is never freed (see CELLS).
        (!p.is_null()).then(|| unsafe { &*p })
    })
}

/// In the child of a `fork`: the parent's engines are not here (their
/// threads were not copied, and a lock one of them held would never be
/// released): forgets them, with every hold and eviction the parent's
/// threads had under way.
pub fn after_fork_child() {
    for s in &CELLS {
        s.store(std::ptr::null_mut(), Ordering::Release);
    }
    EVICTING.store(0, Ordering::Release);
    for i in 0..HOLD_SLOTS {
        HOLD_END[i].store(0, Ordering::Relaxed);
        HOLD_START[i].store(0, Ordering::Relaxed);
        HOLD_CLAIMED[i].store(false, Ordering::Release);
    }
}

/// This thread's id. A system call each time (0.2 µs here): a thread-local
/// copy would be read through the C library's thread-local tables, which
/// for a thread the program created sit in the program's heap, emulated
/// memory, so the fault handler would fault on them again.
pub fn current_tid() -> i32 {
    gettid()
}

/// Whether thread `tid` is inside an inline engine now (it holds one's
/// lock): its system calls are the engine's own, never the program's.
pub fn in_engine(tid: i32) -> bool {
    cells().any(|c| c.lock.held_by(tid))
}

/// What serving a fault came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Served {
    /// The page is mapped.
    Done,
    /// Not now (the address space is changing under events not read yet):
    /// return and let the access fault again.
    Again,
    /// Not a page of this engine.
    NotMine,
}

/// Serves a fault at `addr` taken by thread `tid`: first by the engine
/// whose books hold the page, then by one that learns of new regions (the
/// preload shim's, which registers what the program maps before it tells
/// the engine).
fn serve(addr: u64, tid: i32, (write, ip): (bool, u64)) -> Served {
    for pass in [false, true] {
        for c in cells() {
            if c.lock.held_by(tid) {
                super::engine::fail(&pagewise_mech::Error::Internal(format!(
                    "the far-memory engine faulted on emulated memory at {addr:#x} while serving a fault"
                )));
            }
            let mut g = c.lock_as(tid);
            let sh = c.shared.clone();
            let Some(e) = g.engine() else { continue };
            if !pass && !e.knows(addr) {
                continue;
            }
            e.write_fault = write;
            e.fault_site = Some((tid, ip));
            match e.serve_inline(&sh, addr, pass) {
                Served::NotMine => continue,
                s => return s,
            }
        }
    }
    Served::NotMine
}

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
pub(super) fn mark(start: u64, len: u64) {
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
pub(super) fn unmark(start: u64, len: u64) {
    set_pages(start, len, false);
}

/// Whether the page holding `addr` is emulated by an inline engine.
pub fn is_emulated(addr: u64) -> bool {
    let (Some(m), Some((p, _))) = (pages_map(), page_range(addr, 1)) else {
        return false;
    };
    m[(p / 64) as usize].load(Ordering::Acquire) & (1 << (p % 64)) != 0
}

/// Whether any page of `[start, start+len)` is emulated by an inline engine
/// (lock-free, signal-safe).
pub fn may_be_emulated(start: u64, len: u64) -> bool {
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
pub const HELD_MAX: usize = 32;

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
pub fn coalesce(v: &mut [(u64, u64)], mut n: usize, max: usize) -> usize {
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
/// it holding an engine's lock. At most [`HELD_MAX`] ranges are held: pass
/// fewer (see [`coalesce`]).
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
pub(super) fn is_held(addr: u64) -> bool {
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
pub(super) struct Evicting;

/// Counts an eviction in: take it before looking at [`is_held`].
pub(super) fn evicting() -> Evicting {
    EVICTING.fetch_add(1, Ordering::SeqCst);
    Evicting
}

impl Drop for Evicting {
    fn drop(&mut self) {
        EVICTING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The action the program set for `SIGBUS`, which faults that are not
/// ours go to.
static PROGRAM_ACTION: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn program_action() -> KernelSigaction {
    let g = |i: usize| PROGRAM_ACTION[i].load(Ordering::Acquire);
    KernelSigaction {
        handler: g(0) as usize,
        flags: g(1),
        restorer: g(2) as usize,
        mask: g(3),
    }
}

/// Sets the action faults that are not the engine's go to (the preload
/// shim calls this for the program's `sigaction(SIGBUS, ...)`); returns the
/// one it replaces. Without an inline engine, returns `None`: the caller
/// makes the program's call itself.
pub fn set_program_action(act: Option<&KernelSigaction>) -> Option<KernelSigaction> {
    if !INSTALLED.load(Ordering::Acquire) {
        return None;
    }
    let old = program_action();
    if let Some(a) = act {
        PROGRAM_ACTION[0].store(a.handler as u64, Ordering::Release);
        PROGRAM_ACTION[1].store(a.flags, Ordering::Release);
        PROGRAM_ACTION[2].store(a.restorer as u64, Ordering::Release);
        PROGRAM_ACTION[3].store(a.mask, Ordering::Release);
    }
    Some(old)
}

/// Signals blocked while the handler runs: every one but those raised by
/// faults (blocked, they would kill the process) and `SIGSYS` (which a
/// seccomp trap raises for the engine's own calls).
fn handler_mask() -> u64 {
    let keep = [
        libc::SIGBUS,
        libc::SIGSEGV,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGSYS,
    ];
    keep.iter().fold(!0u64, |m, &s| m & !signal::bit(s))
}

fn install_handler() -> pagewise_mech::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        if PAGES.load(Ordering::Acquire).is_null() {
            match pagewise_sys::mem::mmap_anonymous_flags(
                (PAGE_BITS / 8) as usize,
                libc::MAP_NORESERVE,
            ) {
                Ok(p) => {
                    let _ = pagewise_sys::mem::name_anon(
                        p as u64,
                        (PAGE_BITS / 8) as usize,
                        c"pagewise-farmem-pages",
                    );
                    PAGES.store(p as *mut AtomicU64, Ordering::Release)
                }
                Err(e) => {
                    result = Err(pagewise_mech::Error::os(
                        "reserving the map of emulated pages",
                        e,
                    ));
                    return;
                }
            }
        }
        // Through the C library first, which supplies the restorer; then
        // the kernel's own view, with the mask set.
        // SAFETY: on_sigbus is async-signal-safe in the sense the module
        // docs give: it takes only the engine lock, with async signals blocked.
        let old = match unsafe { signal::install(libc::SIGBUS, on_sigbus) } {
            Ok(o) => o,
            Err(e) => {
                result = Err(pagewise_mech::Error::os("installing the SIGBUS handler", e));
                return;
            }
        };
        let mut now = KernelSigaction::default();
        // SAFETY: reading the action only.
        unsafe { signal::raw_sigaction(libc::SIGBUS, None, Some(&mut now)) };
        now.mask = handler_mask();
        now.flags &= !(libc::SA_RESTART as u64);
        // SAFETY: the same handler and restorer, with a fuller mask.
        unsafe { signal::raw_sigaction(libc::SIGBUS, Some(&now), None) };
        let mut prev = KernelSigaction {
            handler: old.sa_sigaction,
            flags: old.sa_flags as u64,
            restorer: 0,
            mask: 0,
        };
        // The previous mask in the kernel's 64-bit form.
        for s in 1..=64 {
            if signal::sigset_contains(&old.sa_mask, s) {
                prev.mask |= signal::bit(s);
            }
        }
        INSTALLED.store(true, Ordering::Release);
        set_program_action(Some(&prev));
    });
    result?;
    if INSTALLED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(pagewise_mech::Error::Internal(
            "the SIGBUS handler is not installed".into(),
        ))
    }
}

/// Whether the fault the kernel saved in `ctx` was a write (x86-64: bit 1
/// of the page fault's error code), and the address of the instruction
/// that took it.
fn fault_site(ctx: *mut libc::c_void) -> (bool, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `ctx` is the ucontext_t the kernel passed the handler.
        let g = unsafe { &(*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs };
        (
            g[libc::REG_ERR as usize] & 2 != 0,
            g[libc::REG_RIP as usize] as u64,
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ctx;
        (false, 0)
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as u64) };
    if code == libc::BUS_ADRERR {
        match serve(addr, current_tid(), fault_site(ctx)) {
            Served::Done => return,
            Served::Again => {
                pagewise_sys::process::sched_yield();
                return;
            }
            Served::NotMine => {}
        }
    }
    let act = program_action();
    match act.handler {
        0 | 1 => {
            // The default action (or ignored, which a fault cannot be):
            // put it back and take it.
            let dfl = KernelSigaction::default();
            // SAFETY: SIG_DFL needs no handler code.
            unsafe { signal::raw_sigaction(libc::SIGBUS, Some(&dfl), None) };
            if code <= 0 {
                // Sent, not a fault: raise it again, now with the default.
                let _ = signal::raise_in_this_thread(sig);
            }
            // A fault: returning runs the access again, which faults again
            // and takes the default action.
        }
        h => {
            let siginfo = act.flags & libc::SA_SIGINFO as u64 != 0;
            // SAFETY: the program installed `h` as a handler of this kind
            // for SIGBUS, and this is SIGBUS's handler, called as the
            // kernel called it.
            unsafe { signal::call_handler(h, siginfo, sig, info, ctx) };
            if act.flags & libc::SA_RESETHAND as u64 != 0 {
                set_program_action(Some(&KernelSigaction::default()));
            }
        }
    }
}
