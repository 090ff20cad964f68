//! A mutex for code that runs in signal handlers and under a seccomp trap:
//! built on `futex(2)` made with [`crate::seccomp::raw_syscall`] (never
//! trapped, never through the C library), and knowing its owner's thread
//! id, so that a handler can tell that its own thread holds it.
//!
//! The three-state lock of Drepper's "Futexes Are Tricky" (0 free, 1
//! taken, 2 taken with waiters).

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// The calling thread's id (`gettid(2)`), made without the C library.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no side effect.
    unsafe { raw(libc::SYS_gettid, [0; 6]) as i32 }
}

#[cfg(target_arch = "x86_64")]
unsafe fn raw(nr: libc::c_long, a: [u64; 6]) -> i64 {
    // SAFETY: the caller's arguments are valid for the call.
    unsafe { crate::seccomp::raw_syscall(nr, a) }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw(nr: libc::c_long, a: [u64; 6]) -> i64 {
    // SAFETY: the caller's arguments are valid for the call.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r < 0 {
        -(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL) as i64)
    } else {
        r
    }
}

/// Makes system call `nr` with `args` without the C library (x86-64: from
/// pagewise's own code, which a seccomp trap of the C library lets
/// through). Returns the kernel's raw answer (`-errno` on failure).
///
/// # Safety
/// As for the system call itself.
pub unsafe fn syscall(nr: libc::c_long, args: [u64; 6]) -> i64 {
    // SAFETY: the caller vouches for the arguments.
    unsafe { raw(nr, args) }
}

/// A futex mutex that knows its owner (see the module docs).
#[derive(Debug, Default)]
pub struct OwnedLock {
    state: AtomicU32,
    owner: AtomicI32,
}

impl OwnedLock {
    /// A free lock.
    pub const fn new() -> Self {
        OwnedLock {
            state: AtomicU32::new(0),
            owner: AtomicI32::new(0),
        }
    }

    /// Takes the lock for thread `tid` (the caller's [`gettid`]), waiting
    /// as long as it takes.
    pub fn lock(&self, tid: i32) {
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // A short spin first: most holds are a few microseconds.
            let mut got = false;
            for _ in 0..64 {
                std::hint::spin_loop();
                if self
                    .state
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    got = true;
                    break;
                }
            }
            if !got {
                while self.state.swap(2, Ordering::Acquire) != 0 {
                    // SAFETY: FUTEX_WAIT_PRIVATE on our own word, with the
                    // value we expect; a spurious return loops.
                    unsafe {
                        raw(
                            libc::SYS_futex,
                            [
                                self.state.as_ptr() as u64,
                                (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64,
                                2,
                                0,
                                0,
                                0,
                            ],
                        )
                    };
                }
            }
        }
        self.owner.store(tid, Ordering::Relaxed);
    }

    /// Whether thread `tid` holds the lock now.
    pub fn held_by(&self, tid: i32) -> bool {
        self.owner.load(Ordering::Relaxed) == tid && self.state.load(Ordering::Relaxed) != 0
    }

    /// Releases the lock (the caller holds it).
    pub fn unlock(&self) {
        self.owner.store(0, Ordering::Relaxed);
        if self.state.swap(0, Ordering::Release) == 2 {
            // SAFETY: FUTEX_WAKE_PRIVATE of one waiter on our own word.
            unsafe {
                raw(
                    libc::SYS_futex,
                    [
                        self.state.as_ptr() as u64,
                        (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64,
                        1,
                        0,
                        0,
                        0,
                    ],
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_and_knows_its_owner() {
        let l = Arc::new(OwnedLock::new());
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (l, count) = (l.clone(), count.clone());
                std::thread::spawn(move || {
                    let tid = gettid();
                    for _ in 0..20_000 {
                        l.lock(tid);
                        assert!(l.held_by(tid));
                        // A non-atomic read-modify-write under the lock.
                        let v = count.load(Ordering::Relaxed);
                        count.store(v + 1, Ordering::Relaxed);
                        l.unlock();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(count.load(Ordering::Relaxed), 80_000);
        assert!(!l.held_by(gettid()));
    }
}
