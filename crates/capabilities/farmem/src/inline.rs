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
//! and `mremap` as events) under one `OwnedLock` (`pagewise_sys::futex`), whose owner a handler
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

use crate::emulated;
use crate::engine::{Cell, Served};
use pagewise_sys::futex::gettid;
use pagewise_sys::signal::{self, KernelSigaction};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Once};

pub(crate) use crate::emulated::{coalesce, may_be_emulated};
pub use crate::emulated::{hold, hold_forever, mark_registered, release, Held};

/// Which thread serves a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, schemars::JsonSchema)]
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
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        match s {
            "thread" => Ok(FaultPath::Thread),
            "inline" => Ok(FaultPath::Inline),
            _ => Err(crate::Error::UnknownFaultPath {
                name: s.to_string(),
            }),
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

/// The engines serving faults inline in this process. A cell, once here,
/// is never freed (a handler may be about to look at it); a stopped one
/// holds no engine and leaves its slot.
const MAX_ENGINES: usize = 32;
static CELLS: [AtomicPtr<Cell>; MAX_ENGINES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_ENGINES];

/// Enters `cell` in the registry (installing the handler the first time).
pub(super) fn register(cell: &Arc<Cell>) -> crate::Result<()> {
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
    Err(crate::Error::TooManyInlineEngines { max: MAX_ENGINES })
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
    emulated::forget_holds();
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
    cells().any(|c| c.held_by(tid))
}

/// Serves a fault at `addr` taken by thread `tid`: first by the engine
/// whose books hold the page, then by one that learns of new regions (the
/// preload shim's, which registers what the program maps before it tells
/// the engine).
fn serve(addr: u64, tid: i32, (write, ip): (bool, u64)) -> Served {
    for pass in [false, true] {
        for c in cells() {
            if c.held_by(tid) {
                super::engine::fail(&crate::Error::Internal {
                    what: "the far-memory engine faulted on emulated memory while serving a fault",
                    addr,
                });
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

fn install_handler() -> crate::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        if let Err(e) = emulated::reserve() {
            result = Err(e);
            return;
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
        Err(crate::Error::Internal {
            what: "the SIGBUS handler is not installed",
            addr: 0,
        })
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
