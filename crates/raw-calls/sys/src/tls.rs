//! Where the C library keeps a thread's thread-local bookkeeping.
//!
//! glibc gives each thread a dynamic thread vector (DTV): an array,
//! allocated with `calloc` when the thread starts, that every access to a
//! thread-local variable of a shared object goes through. It lives in the
//! program's heap. Code that must never fault on the program's heap (the
//! far-memory handler thread) needs to know where it is.

/// The calling thread's DTV allocation `(start, end)`, where the C library
/// is glibc on x86-64; `None` elsewhere or when there is none.
pub fn dtv_range() -> Option<(u64, u64)> {
    #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
    {
        let tcb: u64;
        // SAFETY: on x86-64 glibc, %fs:0 holds the thread control block's
        // own address (tcbhead_t.tcb); reading it has no side effect.
        unsafe { std::arch::asm!("mov {}, fs:0", out(reg) tcb, options(nostack, readonly)) };
        if tcb == 0 {
            return None;
        }
        // SAFETY: tcbhead_t is { tcb, dtv, self, ... }: `dtv` at offset 8
        // points one entry (16 bytes) into the calloc'd array, whose first
        // entry holds the number of entries after the two bookkeeping ones.
        unsafe {
            let dtv = *((tcb + 8) as *const u64);
            if dtv < 16 {
                return None;
            }
            let start = dtv - 16;
            let n = *(start as *const u64);
            if n == 0 || n > 1 << 20 {
                return None;
            }
            Some((start, start + (n + 2) * 16))
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_env = "gnu")))]
    {
        None
    }
}
