//! The shim's own heap: the shim's Rust code (the far-memory engine above
//! all) must never touch memory it emulates, or its handler thread would
//! wait on itself. So it does not use the program's `malloc`: it allocates
//! from one large reservation of its own, which the engine leaves alone.
//!
//! Power-of-two size classes, a free list per class, a spin lock (the shim
//! allocates from its own threads and at start-up, never in a signal
//! handler). Freed blocks of 64 KiB and more give their memory back.

use pagewise_sys::seccomp::raw_syscall;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const RESERVE: usize = 64 << 30;
const CLASSES: usize = 48;

/// The allocator (installed as the shim's global allocator).
pub struct ShimAlloc;

static LOCK: AtomicBool = AtomicBool::new(false);
static BASE: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static FREE: [AtomicUsize; CLASSES] = [const { AtomicUsize::new(0) }; CLASSES];

/// The reservation `(start, len)`, once made.
pub fn arena() -> Option<(u64, u64)> {
    let b = BASE.load(Ordering::Acquire);
    (b != 0).then_some((b as u64, RESERVE as u64))
}

struct Guard;
impl Guard {
    fn lock() -> Guard {
        while LOCK
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        Guard
    }
}
impl Drop for Guard {
    fn drop(&mut self) {
        LOCK.store(false, Ordering::Release);
    }
}

/// Takes the heap's lock across a `fork` (called last before it): no other
/// thread can then be inside the heap when the child is made, whose copy of
/// the lock would stay taken for ever.
pub fn hold_for_fork() {
    std::mem::forget(Guard::lock());
}

/// Gives back the lock [`hold_for_fork`] took (in the parent and the child).
pub fn release_after_fork() {
    LOCK.store(false, Ordering::Release);
}

fn class(l: Layout) -> usize {
    l.size()
        .max(l.align())
        .max(16)
        .next_power_of_two()
        .trailing_zeros() as usize
}

fn reserve() -> usize {
    // SAFETY: an anonymous private reservation; no existing memory is touched.
    let p = unsafe {
        raw_syscall(
            libc::SYS_mmap,
            [
                0,
                RESERVE as u64,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64,
                u64::MAX,
                0,
            ],
        )
    };
    if p < 0 {
        return 0;
    }
    // Named as pagewise's own, so that no agent takes it for the program's
    // (an error where the kernel names no mappings changes nothing). A raw
    // call, not `mem::name_anon`: this runs under the heap's lock, and the
    // C library's prctl could be trapped by the shim's seccomp filter,
    // whose handler must never wait on that lock.
    // SAFETY: PR_SET_VMA only labels the range; the kernel copies the name.
    unsafe {
        raw_syscall(
            libc::SYS_prctl,
            [
                pagewise_sys::mem::PR_SET_VMA as u64,
                pagewise_sys::mem::PR_SET_VMA_ANON_NAME,
                p as u64,
                RESERVE as u64,
                c"pagewise-shim-heap".as_ptr() as u64,
                0,
            ],
        )
    };
    p as usize
}

// SAFETY: blocks are disjoint pieces of the reservation, each at least as
// large and as aligned as asked (sizes are powers of two, the bump pointer is
// aligned to min(size, page) or the alignment asked, whichever is larger).
unsafe impl GlobalAlloc for ShimAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let c = class(l);
        if c >= CLASSES {
            return std::ptr::null_mut();
        }
        let _g = Guard::lock();
        let head = FREE[c].load(Ordering::Relaxed);
        if head != 0 {
            // SAFETY: a free block's first word holds the next free block.
            let next = unsafe { *(head as *const usize) };
            FREE[c].store(next, Ordering::Relaxed);
            return head as *mut u8;
        }
        if BASE.load(Ordering::Relaxed) == 0 {
            let b = reserve();
            if b == 0 {
                return std::ptr::null_mut();
            }
            NEXT.store(b, Ordering::Relaxed);
            BASE.store(b, Ordering::Release);
        }
        let size = 1usize << c;
        let align = size.min(4096).max(l.align());
        let p = NEXT.load(Ordering::Relaxed).next_multiple_of(align);
        if p + size > BASE.load(Ordering::Relaxed) + RESERVE {
            return std::ptr::null_mut();
        }
        NEXT.store(p + size, Ordering::Relaxed);
        p as *mut u8
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let c = class(l);
        if c >= 16 {
            // SAFETY: the block is ours and free; dropping its pages only
            // makes them read as zeros.
            unsafe {
                raw_syscall(
                    libc::SYS_madvise,
                    [p as u64, 1u64 << c, libc::MADV_DONTNEED as u64, 0, 0, 0],
                )
            };
        }
        let _g = Guard::lock();
        // SAFETY: the block is free and at least 16 bytes: its first word
        // links it into the list.
        unsafe { *(p as *mut usize) = FREE[c].load(Ordering::Relaxed) };
        FREE[c].store(p as usize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same alignment, non-zero size, as GlobalAlloc requires.
        let nl = unsafe { Layout::from_size_align_unchecked(new_size, l.align()) };
        if class(nl) == class(l) {
            return p;
        }
        // SAFETY: as for alloc.
        let q = unsafe { self.alloc(nl) };
        if !q.is_null() {
            // SAFETY: both blocks are valid for the smaller size and disjoint.
            unsafe {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                self.dealloc(p, l);
            }
        }
        q
    }
}
