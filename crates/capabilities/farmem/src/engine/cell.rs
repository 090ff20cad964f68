//! The engine and the lock over it, shared by its handler thread and, on
//! the inline path, by every thread that faults (reached from a signal
//! handler through [`crate::inline`]'s registry).
//!
//! **Why this module holds unsafe code.** The engine sits in an
//! `UnsafeCell` reached only through a [`Guard`], which holds the lock:
//! the lock is a futex whose owner a signal handler can recognise, which a
//! `Mutex` cannot offer.

use super::Engine;
use crate::Shared;
use pagewise_sys::futex::{gettid, OwnedLock};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How many threads hold an engine's lock now, over every engine of the
/// process: each step of an engine (an event read and followed, a fault
/// served, work that waited for the events) runs under the lock and
/// checks first that no thread of the program is inside an `mremap`
/// (`Hooks::remapping`). A thread about to `mremap` counts itself in and
/// then waits here for the steps under way to end (see
/// [`wait_for_steps`]): a step that saw the count at zero must not still
/// be moving the program's pages when the kernel moves them (reclaiming a
/// range, it would take a page the kernel just moved there for one the
/// books know nothing of, and book it remote where the move's event then
/// books it local).
static HOLDING: AtomicUsize = AtomicUsize::new(0);

/// Waits until no thread holds an engine's lock (called by a thread of
/// the program that counted itself in as remapping, before its call).
/// Steps are short and never wait for the program's threads.
pub(crate) fn wait_for_steps() {
    let mut spins = 0u32;
    while HOLDING.load(Ordering::SeqCst) != 0 {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// One engine and the lock over it.
pub(crate) struct Cell {
    lock: OwnedLock,
    engine: UnsafeCell<Option<Engine>>,
    pub(crate) shared: Arc<Shared>,
}

// SAFETY: the engine is reached only through `Guard`, which holds the lock.
unsafe impl Sync for Cell {}
// SAFETY: as above; the engine itself moves between threads only whole.
unsafe impl Send for Cell {}

/// The engine, locked.
pub(crate) struct Guard<'a> {
    cell: &'a Cell,
}

impl Guard<'_> {
    /// The engine (`None` once it stopped).
    pub(crate) fn engine(&mut self) -> Option<&mut Engine> {
        // SAFETY: this guard holds the lock.
        unsafe { (*self.cell.engine.get()).as_mut() }
    }

    /// Takes the engine out (it stops).
    pub(crate) fn take(&mut self) -> Option<Engine> {
        // SAFETY: this guard holds the lock.
        unsafe { (*self.cell.engine.get()).take() }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        HOLDING.fetch_sub(1, Ordering::SeqCst);
        self.cell.lock.unlock();
    }
}

impl Cell {
    pub(crate) fn new(engine: Engine, shared: Arc<Shared>) -> Self {
        Cell {
            lock: OwnedLock::new(),
            engine: UnsafeCell::new(Some(engine)),
            shared,
        }
    }

    pub(crate) fn lock(&self) -> Guard<'_> {
        self.lock_as(gettid())
    }

    /// Whether thread `tid` holds the lock (it is inside the engine).
    pub(crate) fn held_by(&self, tid: i32) -> bool {
        self.lock.held_by(tid)
    }

    pub(crate) fn lock_as(&self, tid: i32) -> Guard<'_> {
        self.lock.lock(tid);
        // Counted before the step looks at `Hooks::remapping` (see
        // HOLDING): sequentially consistent on both sides.
        HOLDING.fetch_add(1, Ordering::SeqCst);
        Guard { cell: self }
    }
}

/// What serving a fault came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// The page is mapped.
    Done,
    /// Not now (the address space is changing under events not read yet):
    /// return and let the access fault again.
    Again,
    /// Not a page of this engine.
    NotMine,
}
