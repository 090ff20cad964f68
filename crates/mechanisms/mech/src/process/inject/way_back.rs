//! The way back of a call made inside another process when pagewise dies
//! during it (killed, crashed, out of memory): the thread puts itself back.
//!
//! Before a call, a signal frame (the kernel's `struct rt_sigframe`)
//! holding the thread's registers, its extended state (`XSAVE` area) and
//! its signal mask as they were is written below its stack pointer, its
//! red zone and the bytes calls may use for their arguments. The call then runs at a `syscall; ret` of the target's own code
//! with its stack pointer at the frame, whose first word is the address of
//! the target's `rt_sigreturn` trampoline (`mov $15, %rax; syscall`:
//! glibc's and musl's `__restore_rt`).
//!
//! While pagewise lives the frame is never used: at the call's end (its
//! syscall-exit stop) the mask and the registers are put back under
//! ptrace, and then the bytes the frame covered. If pagewise dies with the
//! call set up, the kernel lets the thread go (no single-step is ever
//! used, so no trap is left pending); it makes the call, returns into the
//! trampoline, and `rt_sigreturn` puts back every register, the extended
//! state and the mask. A thread stopped inside an interrupted call has its
//! restart applied in the frame as the kernel would apply it; one that was
//! sleeping in a call restarted through `restart_syscall` (a relative
//! `nanosleep`, a `poll` or `futex` wait with a timeout) returns `EINTR`
//! from it instead, as after a signal handler: `rt_sigreturn` cancels such
//! a restart.
//!
//! Where the target has no such code (a program without glibc or musl),
//! or the frame cannot be written (a stack pointer at the very end of its
//! stack), the call is made as before, without a way back.

use crate::{procfs, remote};
use pagewise_sys::process::{self as p, Regs};
use std::collections::HashMap;
use std::sync::Mutex;

/// `syscall; ret`.
const SYSCALL_RET: [u8; 3] = [0x0f, 0x05, 0xc3];
/// `mov $15, %rax; syscall`: `rt_sigreturn`.
const RESTORER: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// Where a thread of one process finds its way back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trampoline {
    /// A `syscall; ret`.
    pub syscall_ret: u64,
    /// An `rt_sigreturn` trampoline.
    pub restorer: u64,
}

/// Trampolines found, per process (pid and start time): the code is
/// checked again at each use, not searched again.
static FOUND: Mutex<Option<Found>> = Mutex::new(None);

/// What a search found (or not), per pid and start time.
type Found = HashMap<(i32, u64), Option<Trampoline>>;

/// Most bytes of code read in one search.
const MOST_CODE: u64 = 64 << 20;

/// The trampoline of process `pid`, if its code has one: searched in its
/// C library and loader first, then in its other executable mappings.
pub(crate) fn find(pid: i32) -> Option<Trampoline> {
    let key = (pid, procfs::start_time(pid)?);
    let cached = FOUND
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
        .copied();
    if let Some(found) = cached {
        if found.is_none_or(|t| still_there(pid, t)) {
            return found;
        }
    }
    let found = search(pid);
    let mut all = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    let map = all.get_or_insert_with(HashMap::new);
    // Processes gone are forgotten now and then.
    if map.len() > 256 {
        map.retain(|&(p, _), _| procfs::is_alive(p));
    }
    map.insert(key, found);
    found
}

fn still_there(pid: i32, t: Trampoline) -> bool {
    let mut a = [0u8; 3];
    let mut b = [0u8; 9];
    p::process_vm_read(pid, t.syscall_ret, &mut a).is_ok_and(|n| n == 3 && a == SYSCALL_RET)
        && p::process_vm_read(pid, t.restorer, &mut b).is_ok_and(|n| n == 9 && b == RESTORER)
}

fn search(pid: i32) -> Option<Trampoline> {
    let maps = procfs::maps(Some(pid)).ok()?;
    let name = |m: &procfs::Mapping| m.path.rsplit('/').next().unwrap_or("").to_string();
    let mut code: Vec<&procfs::Mapping> = maps.iter().filter(|m| m.exec && m.read).collect();
    // The C library and the loader first: both have the trampoline.
    code.sort_by_key(|m| {
        let n = name(m);
        !(n.starts_with("libc") || n.starts_with("ld-") || n.starts_with("ld-musl"))
    });
    let (mut syscall_ret, mut restorer) = (None, None);
    let mut read = 0u64;
    for m in code {
        let len = m.end.saturating_sub(m.start);
        if read.saturating_add(len) > MOST_CODE {
            break;
        }
        read += len;
        let mut text = vec![0u8; len as usize];
        let Ok(n) = p::process_vm_read(pid, m.start, &mut text) else {
            continue;
        };
        let text = &text[..n];
        if syscall_ret.is_none() {
            syscall_ret = position(text, &SYSCALL_RET).map(|i| m.start + i as u64);
        }
        if restorer.is_none() {
            restorer = position(text, &RESTORER).map(|i| m.start + i as u64);
        }
        if let (Some(syscall_ret), Some(restorer)) = (syscall_ret, restorer) {
            return Some(Trampoline {
                syscall_ret,
                restorer,
            });
        }
    }
    None
}

fn position(text: &[u8], what: &[u8]) -> Option<usize> {
    text.windows(what.len()).position(|w| w == what)
}

/// `FP_XSTATE_MAGIC1`, in the software bytes of an `XSAVE` area.
const MAGIC1: u32 = 0x4650_5853;
/// `FP_XSTATE_MAGIC2`, just past the area in a signal frame.
const MAGIC2: u32 = 0x4650_5845;
/// Where the software bytes (`struct _fpx_sw_bytes`: magic, sizes,
/// features; 48 bytes) are in the area.
const SW_BYTES: usize = 464;
/// `uc_flags`: `UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS`.
const UC_FLAGS: u64 = 0x1 | 0x2 | 0x4;
/// The red zone below the stack pointer, which the thread's code may use.
pub(crate) const RED_ZONE: u64 = 128;
/// Bytes below the red zone that calls may use for their arguments
/// ([`super::Remote::stack_scratch`]); the frame lies below them.
pub(crate) const SCRATCH: u64 = 256;
/// `pretcode` (8), `struct ucontext` (304), `siginfo_t` (128).
const HEAD: usize = 8 + 304 + 128;
/// Where the extended state starts in the frame (64-byte aligned).
const FP_AT: usize = HEAD.next_multiple_of(64);
const _: () = assert!(FP_AT == 448);
/// `struct sigcontext` is 256 bytes; `struct ucontext` 8 + 8 + 24 + 256 + 8.
const SIGCONTEXT: usize = 256;
const _: () = assert!(8 + 8 + 24 + SIGCONTEXT + 8 == 304);
/// `__NR_restart_syscall`.
const RESTART_SYSCALL: u64 = 219;

/// A frame written in a thread's stack, and the bytes it covered.
#[derive(Debug)]
pub(crate) struct Frame {
    /// Its address: the call's stack pointer.
    pub at: u64,
    covered: Vec<u8>,
}

impl Frame {
    /// Writes below the stack pointer of thread `tid` of `pid` (stopped
    /// with registers `saved` and mask `mask`) the frame that puts it back
    /// through `t`; `None` where it cannot (its extended state unreadable,
    /// its stack not writable there).
    pub(crate) fn write(
        pid: i32,
        tid: i32,
        t: Trampoline,
        saved: &Regs,
        mask: u64,
    ) -> Option<Frame> {
        let mut xstate = vec![0u8; 16 << 10];
        let size = p::ptrace_getregset(tid, p::NT_X86_XSTATE, &mut xstate).ok()?;
        if size < 576 {
            return None;
        }
        // The regset holds the features enabled (XCR0) where a signal
        // frame has its software bytes: those are written here.
        let xcr0 = u64::from_ne_bytes(xstate.get(SW_BYTES..SW_BYTES + 8)?.try_into().ok()?);
        let mut sw = [0u8; 48];
        sw[0..4].copy_from_slice(&MAGIC1.to_ne_bytes());
        sw[4..8].copy_from_slice(&(size as u32 + 4).to_ne_bytes());
        sw[8..16].copy_from_slice(&xcr0.to_ne_bytes());
        sw[16..20].copy_from_slice(&(size as u32).to_ne_bytes());
        xstate[SW_BYTES..SW_BYTES + 48].copy_from_slice(&sw);
        let total = FP_AT + size + 4;
        let at = saved.rsp.checked_sub(RED_ZONE + SCRATCH + total as u64)? & !63;
        let mut frame = vec![0u8; total];
        frame[0..8].copy_from_slice(&t.restorer.to_ne_bytes());
        let uc = 8;
        frame[uc..uc + 8].copy_from_slice(&UC_FLAGS.to_ne_bytes());
        // uc_link 0; uc_stack all 0: a size below the minimum, which
        // rt_sigreturn's sigaltstack refuses, leaving the thread's own.
        let sc = uc + 8 + 8 + 24;
        let r = resumed(saved);
        let words = [
            r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx,
            r.rdx, r.rax, r.rcx, r.rsp, r.rip, r.eflags,
        ];
        for (k, w) in words.iter().enumerate() {
            frame[sc + 8 * k..sc + 8 * k + 8].copy_from_slice(&w.to_ne_bytes());
        }
        let segs = sc + 8 * words.len();
        for (k, s) in [r.cs, r.gs, r.fs, r.ss].iter().enumerate() {
            frame[segs + 2 * k..segs + 2 * k + 2].copy_from_slice(&(*s as u16).to_ne_bytes());
        }
        // err, trapno, oldmask, cr2 0; then fpstate.
        let fpstate = segs + 8 + 4 * 8;
        frame[fpstate..fpstate + 8].copy_from_slice(&(at + FP_AT as u64).to_ne_bytes());
        let sigmask = sc + SIGCONTEXT;
        frame[sigmask..sigmask + 8].copy_from_slice(&mask.to_ne_bytes());
        frame[FP_AT..FP_AT + size].copy_from_slice(&xstate[..size]);
        frame[FP_AT + size..].copy_from_slice(&MAGIC2.to_ne_bytes());
        let mut covered = vec![0u8; total];
        remote::read_exact(pid, at, &mut covered).ok()?;
        if remote::write_exact(pid, at, &frame).is_err() {
            let _ = remote::write(pid, at, &covered, "putting back under a frame");
            return None;
        }
        Some(Frame { at, covered })
    }

    /// Puts back the bytes the frame covered.
    pub(crate) fn put_back(self, pid: i32) -> crate::Result<()> {
        remote::write_exact(pid, self.at, &self.covered)
    }
}

/// The registers with which a thread stopped with `saved` goes on: an
/// interrupted call restarted as the kernel restarts it when no handler
/// runs (`rt_sigreturn` turns the kernel's own restart off).
fn resumed(saved: &Regs) -> Regs {
    let mut r = *saved;
    if (saved.orig_rax as i64) >= 0 {
        match saved.rax as i64 {
            // -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND
            -514..=-512 => {
                r.rax = saved.orig_rax;
                r.rip = saved.rip.wrapping_sub(2);
            }
            // -ERESTART_RESTARTBLOCK
            -516 => {
                r.rax = RESTART_SYSCALL;
                r.rip = saved.rip.wrapping_sub(2);
            }
            _ => {}
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> Regs {
        p::zeroed_regs()
    }

    #[test]
    fn an_interrupted_call_is_restarted_as_the_kernel_would() {
        let mut r = regs();
        r.rip = 0x1002;
        r.orig_rax = 7;
        for (rax, want_rax) in [
            (-512i64, 7u64),
            (-513, 7),
            (-514, 7),
            (-516, RESTART_SYSCALL),
        ] {
            r.rax = rax as u64;
            let s = resumed(&r);
            assert_eq!((s.rax, s.rip), (want_rax, 0x1000), "rax {rax}");
        }
        // A call that ended (or none): as it was.
        for (orig, rax) in [(7u64, -4i64), (7, 0), (u64::MAX, -512)] {
            r.orig_rax = orig;
            r.rax = rax as u64;
            let s = resumed(&r);
            assert_eq!((s.rax, s.rip), (rax as u64, 0x1002));
        }
    }

    #[test]
    fn code_is_found_where_it_is() {
        let mut text = vec![0x90u8; 100];
        text[40..43].copy_from_slice(&SYSCALL_RET);
        assert_eq!(position(&text, &SYSCALL_RET), Some(40));
        assert_eq!(position(&text, &RESTORER), None);
        assert_eq!(position(&[0x0f, 0x05], &SYSCALL_RET), None);
    }
}
