//! Far-memory emulation of an unmodified program from inside it (`pagewise
//! farmem run`): the in-process half of the engine, which the preload shim
//! starts with [`init`] and whose `SIGSYS` handler the shim's filter
//! calls for each trapped call.
//!
//! At start-up the shim joins the instance named by `PAGEWISE_FARMEM`,
//! emulates the program's private anonymous writable memory mapped from
//! then on (the heap and anonymous mappings; not the shim's own heap;
//! thread stacks with `PAGEWISE_FARMEM_STACKS=1`; nothing mapped before the
//! shim starts: the loader's tables, the main stack, `.bss`) with an
//! engine whose handler thread lives in the process, and from then on
//! sees every `mmap`, `mprotect`, `brk` and `mremap` the C library makes
//! (a seccomp filter turns them into `SIGSYS`; the handler makes the call and
//! registers new anonymous writable memory before the program gets the
//! address back). The engine learns of these ranges from a lock-free ring.
//!
//! What stays in the shim is what a dispatcher of the program's calls
//! needs: the C library's functions it wraps (which make a call with its
//! memory held here, [`held_call`], on the inline path) and the signal-mask
//! functions, which leave the signals [`never_blocked`] names unblocked.
//!
//! Not seen: memory mapped by code that makes its own system calls rather
//! than through the C library (statically linked programs, Go).

mod start;

pub use start::{init, AroundFork};

use crate::instance::Instance;
use crate::link::LinkConfig;
use crate::{inline, syscalls};
use crate::{policy, Calibration, Config, FarMemory, FaultPath, Hooks};
use pagewise_mech::{Region, PAGE_SIZE};
use pagewise_sys::seccomp::{self, raw_syscall};
use pagewise_sys::signal::{self, KernelSigaction};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::FarmemRequest;

/// The top of a thread stack left alone with `--stacks` (see on_sigsys).
const STACK_TOP_KEPT: u64 = 64 << 10;

const RING: usize = 4096;
static RING_START: [AtomicU64; RING] = [const { AtomicU64::new(0) }; RING];
static RING_LEN: [AtomicU64; RING] = [const { AtomicU64::new(0) }; RING];
static HEAD: AtomicUsize = AtomicUsize::new(0);
static TAIL: AtomicUsize = AtomicUsize::new(0);
static UFFD: AtomicI32 = AtomicI32::new(-1);
static WAKE: AtomicI32 = AtomicI32::new(-1);
static STACKS: AtomicBool = AtomicBool::new(false);
/// The handler thread: its own mappings (staging) are never emulated. (In a
/// child after fork it is created under the filter.)
static HANDLER_TID: AtomicI32 = AtomicI32::new(0);

/// Private anonymous mappings made without write permission (reservations
/// such as the C library's thread arenas), which `mprotect` may open later.
const RESERVED: usize = 256;
static RES_START: [AtomicU64; RESERVED] = [const { AtomicU64::new(0) }; RESERVED];
static RES_END: [AtomicU64; RESERVED] = [const { AtomicU64::new(0) }; RESERVED];
static RES_NEXT: AtomicUsize = AtomicUsize::new(0);

struct Running {
    fm: FarMemory,
    inst: Arc<Instance>,
    slot: usize,
    trace: Option<String>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

fn page_up(x: u64) -> u64 {
    x.next_multiple_of(PAGE_SIZE as u64)
}

/// Whether a mapping is new: just made by the program's call, whose
/// address the program has not been given yet (see `give_root`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Made {
    Now,
    Before,
}

/// The running engine's userfaultfd, if one runs (-1 in a child after
/// fork). Signal-safe.
fn engine_uffd() -> Option<std::os::fd::BorrowedFd<'static>> {
    let raw = UFFD.load(Ordering::Relaxed);
    if raw < 0 {
        return None;
    }
    // SAFETY: UFFD holds the running engine's userfaultfd (set when the
    // engine starts, -1 in a child after fork); the engine keeps it open
    // for the life of the program.
    Some(unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) })
}

/// Registers `[start, start+len)` and tells the engine; a mapping made
/// `Now` is given its reverse-map root too. Signal-safe.
fn emulate(start: u64, len: u64, made: Made) {
    let len = page_up(len);
    if len == 0 {
        return;
    }
    let Some(fd) = engine_uffd() else { return };
    if pagewise_sys::uffd::register(fd, start, len, pagewise_sys::uffd::REGISTER_MODE_MISSING)
        .is_err()
    {
        return;
    }
    // Held for the kernel like emulated memory from now on, before the
    // engine adopts it (a read into a buffer realloc just moved met EFAULT).
    if inline_path() {
        inline::mark_registered(start, len);
    }
    let i = HEAD.fetch_add(1, Ordering::AcqRel);
    // A full ring: wake the engine and wait for it to drain.
    while i - TAIL.load(Ordering::Acquire) >= RING {
        wake_engine();
        std::hint::spin_loop();
    }
    RING_START[i % RING].store(start, Ordering::Relaxed);
    RING_LEN[i % RING].store(len, Ordering::Release);
    if i - TAIL.load(Ordering::Acquire) >= RING / 2 {
        wake_engine();
    }
    if made == Made::Now {
        give_root(fd, start, len);
    }
}

/// Gives a mapping the program has just made, and which `emulate` has
/// just registered, its reverse-map root (`anon_vma`) now, before any
/// page of it is placed. Natively a read of untouched memory maps the zero
/// page and leaves a mapping without one; under emulation every first
/// touch is a userfaultfd fill, which gives one to whatever part of the
/// mapping it lands in. A mapping the program splits (`mprotect` of part
/// of it) then had its parts given different roots (each taken from
/// whichever neighbour was compatible at its first fill), and they never
/// merged again: the program's next `mremap` over the whole mapping met
/// `EFAULT` (it spans two mappings). One root for the whole mapping
/// before any split keeps its parts mergeable, as natively. A move of
/// its first page, a hole, onto its second, with holes allowed, moves
/// nothing and makes the kernel give the mapping its root
/// (`UFFDIO_MOVE` prepares both mappings first). A mapping of one page
/// cannot be split, and is left alone.
fn give_root(fd: std::os::fd::BorrowedFd<'_>, start: u64, len: u64) {
    if len < 2 * PAGE_SIZE as u64 {
        return;
    }
    // SAFETY: a mapping the program's call has just made and whose
    // address it has not been given yet: both pages are holes, so with
    // holes allowed nothing moves. A failure (an older kernel) leaves the
    // mapping as it was.
    let _ = unsafe {
        pagewise_sys::uffd::move_pages(
            fd,
            start + PAGE_SIZE as u64,
            start,
            PAGE_SIZE as u64,
            pagewise_sys::uffd::MOVE_MODE_ALLOW_SRC_HOLES | pagewise_sys::uffd::MOVE_MODE_DONTWAKE,
        )
    };
}

fn wake_engine() {
    let b = b"d";
    // SAFETY: a one-byte write to the engine's wake pipe.
    unsafe {
        raw_syscall(
            libc::SYS_write,
            [
                WAKE.load(Ordering::Relaxed) as u64,
                b.as_ptr() as u64,
                1,
                0,
                0,
                0,
            ],
        )
    };
}

/// The engine's side of the ring.
fn drain(out: &mut Vec<Region>) {
    loop {
        let t = TAIL.load(Ordering::Acquire);
        if t == HEAD.load(Ordering::Acquire) {
            return;
        }
        let len = RING_LEN[t % RING].swap(0, Ordering::Acquire);
        if len == 0 {
            // Claimed but not written yet: the writer is about to.
            std::hint::spin_loop();
            continue;
        }
        let start = RING_START[t % RING].load(Ordering::Relaxed);
        TAIL.store(t + 1, Ordering::Release);
        if let Ok(r) = Region::new(start, len) {
            out.push(r);
        }
    }
}

fn remember_reserved(start: u64, len: u64) {
    let i = RES_NEXT.fetch_add(1, Ordering::AcqRel) % RESERVED;
    RES_START[i].store(start, Ordering::Relaxed);
    RES_END[i].store(start + page_up(len), Ordering::Release);
}

/// A new mapping at `[start, start+len)`: a reservation it overlaps was
/// unmapped there (the table never hears of `munmap`), so the reservation
/// is cut back to the part that does not overlap (the larger one). Else a
/// later `mprotect` of, say, a thread stack placed where a reservation's
/// unused tail was would be taken for the reservation opening up.
fn forget_reserved(start: u64, len: u64) {
    let end = start + page_up(len);
    for i in 0..RESERVED {
        let s = RES_START[i].load(Ordering::Relaxed);
        let e = RES_END[i].load(Ordering::Acquire);
        if e <= s || e <= start || end <= s {
            continue;
        }
        let (below, above) = (start.saturating_sub(s), e.saturating_sub(end));
        let (ns, ne) = if below >= above {
            (s, start.max(s))
        } else {
            (end.min(e), e)
        };
        RES_END[i].store(ns, Ordering::Release);
        RES_START[i].store(ns, Ordering::Relaxed);
        if ne > ns {
            RES_START[i].store(ns, Ordering::Relaxed);
            RES_END[i].store(ne, Ordering::Release);
        }
    }
}

fn is_reserved(start: u64, len: u64) -> bool {
    (0..RESERVED).any(|i| {
        let s = RES_START[i].load(Ordering::Relaxed);
        let e = RES_END[i].load(Ordering::Acquire);
        s <= start && start + len <= e && e > s
    })
}

/// Faults are served inline: calls that hand memory to the kernel are
/// trapped too, and their memory held first (see `kernel_call`).
static INLINE: AtomicBool = AtomicBool::new(false);

/// Whether faults are served inline in this process (its wrapped calls
/// then hold their memory).
pub fn inline_path() -> bool {
    INLINE.load(Ordering::Relaxed)
}

/// The calls trapped besides the memory ones on the inline path: every
/// call `crate::syscalls` knows, and the signal calls that must
/// leave `SIGBUS` to the engine.
fn inline_trapped() -> Vec<libc::c_long> {
    let mut v: Vec<libc::c_long> = seccomp::TRAPPED.to_vec();
    v.extend_from_slice(syscalls::KNOWN);
    v.extend_from_slice(&[
        libc::SYS_rt_sigaction,
        libc::SYS_rt_sigprocmask,
        libc::SYS_sigaltstack,
    ]);
    v
}

/// Signals no thread of the program may block while faults are served in
/// the faulting thread: `SIGBUS` (the faults) and `SIGSYS` (the trap); a
/// blocked one would kill the process when it comes.
const NEVER_BLOCKED: u64 = signal::bit(libc::SIGBUS) | signal::bit(libc::SIGSYS);

/// Makes the program's call `nr` with `a` (its own arguments, or a copy of
/// one it handed over) for it.
fn program_call(nr: libc::c_long, a: [u64; 6]) -> i64 {
    // SAFETY: the program made this very call with these arguments (or
    // with an argument whose copy this is); the kernel checks them.
    unsafe { raw_syscall(nr, a) }
}

/// Makes a trapped call that is not a memory call, on the inline path:
/// the memory it hands to the kernel is held local for its duration; the
/// program's `SIGBUS` action is kept aside for faults that are not the
/// engine's, and neither `SIGBUS` nor `SIGSYS` may be blocked; an
/// alternate signal stack in emulated memory stays local.
fn kernel_call(nr: libc::c_long, a: [u64; 6], ctx: *mut libc::ucontext_t) -> i64 {
    let tid = inline::current_tid();
    let engine = tid == HANDLER_TID.load(Ordering::Acquire) || inline::in_engine(tid);
    if engine && nr != libc::SYS_rt_sigprocmask && nr != libc::SYS_sigaltstack {
        return program_call(nr, a);
    }
    match nr {
        _ if syscalls::REFUSED_INLINE.contains(&nr) => {
            static SAID: AtomicBool = AtomicBool::new(false);
            say_once(&SAID, b"pagewise farmem: io_uring and Linux AIO are refused (ENOSYS) with --fault-path inline: the kernel would use their buffers where a remote page meets EFAULT; --fault-path thread serves them\n");
            -libc::ENOSYS as i64
        }
        libc::SYS_rt_sigaction if a[0] == libc::SIGBUS as u64 => {
            let held = inline::hold(&[(a[1], 32), (a[2], 32)]);
            // SAFETY: the program's struct sigaction, held local.
            let act = (a[1] != 0)
                .then(|| unsafe { std::ptr::read_unaligned(a[1] as *const KernelSigaction) });
            let r = match inline::set_program_action(act.as_ref()) {
                Some(old) => {
                    if a[2] != 0 {
                        // SAFETY: where the program asked for the old action.
                        unsafe { std::ptr::write_unaligned(a[2] as *mut KernelSigaction, old) };
                    }
                    0
                }
                None => program_call(nr, a),
            };
            inline::release(held);
            r
        }
        libc::SYS_rt_sigaction if a[1] != 0 => {
            // A handler's mask may not block SIGBUS or SIGSYS either.
            let held = inline::hold(&[(a[1], 32), (a[2], 32)]);
            // SAFETY: the program's struct sigaction, held local.
            let mut act = unsafe { std::ptr::read_unaligned(a[1] as *const KernelSigaction) };
            act.mask &= !NEVER_BLOCKED;
            let mut b = a;
            b[1] = &act as *const KernelSigaction as u64;
            let r = program_call(nr, b);
            inline::release(held);
            r
        }
        libc::SYS_rt_sigprocmask => {
            let held = inline::hold(&[(a[1], 8), (a[2], 8)]);
            let r = frame_sigmask(a, ctx, NEVER_BLOCKED);
            inline::release(held);
            r
        }
        libc::SYS_sigaltstack => {
            let held = inline::hold(&[(a[0], 24), (a[1], 24)]);
            if a[0] != 0 {
                // SAFETY: the program's stack_t (sp, flags, size), held local.
                let [sp, flags, size] =
                    unsafe { std::ptr::read_unaligned(a[0] as *const [u64; 3]) };
                if flags as i32 & libc::SS_DISABLE == 0 {
                    // The kernel writes signal frames there, where no fault
                    // can be served: local for good.
                    inline::hold_forever(sp, size);
                }
            }
            let r = program_call(nr, a);
            if r == 0 && a[0] != 0 {
                // The return from this handler restores the alternate stack
                // saved on the frame: the new one goes there.
                // SAFETY: `ctx` is this handler's ucontext; sigaltstack
                // writes the current stack_t into its uc_stack.
                unsafe {
                    raw_syscall(
                        libc::SYS_sigaltstack,
                        [
                            0,
                            std::ptr::addr_of_mut!((*ctx).uc_stack) as u64,
                            0,
                            0,
                            0,
                            0,
                        ],
                    )
                };
            }
            inline::release(held);
            r
        }
        _ => {
            let held = syscalls::hold_for(nr, &a);
            let r = program_call(nr, a);
            inline::release(held);
            r
        }
    }
}

/// The program's own `SIGSYS` action, as it set it: kept aside, never
/// installed, while the filter needs the shim's handler (a child that
/// resets every handler before `exec`, as git's does, would otherwise die
/// of the next trapped call).
static PROGRAM_SIGSYS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// `rt_sigaction(SIGSYS, act, old)` of the program: `act` is kept aside,
/// `old` gets what it set last (the default at first).
fn program_sigsys_action(a: [u64; 6]) -> i64 {
    if a[3] != 8 {
        return -(libc::EINVAL as i64);
    }
    let g = |i: usize| PROGRAM_SIGSYS[i].load(Ordering::Acquire);
    let old = KernelSigaction {
        handler: g(0) as usize,
        flags: g(1),
        restorer: g(2) as usize,
        mask: g(3),
    };
    let held = inline::hold(&[(a[1], 32), (a[2], 32)]);
    if a[1] != 0 {
        // SAFETY: the program's struct sigaction, held local when emulated.
        let act = unsafe { std::ptr::read_unaligned(a[1] as *const KernelSigaction) };
        PROGRAM_SIGSYS[0].store(act.handler as u64, Ordering::Release);
        PROGRAM_SIGSYS[1].store(act.flags, Ordering::Release);
        PROGRAM_SIGSYS[2].store(act.restorer as u64, Ordering::Release);
        PROGRAM_SIGSYS[3].store(act.mask, Ordering::Release);
    }
    if a[2] != 0 {
        // SAFETY: where the program asked for the old action.
        unsafe { std::ptr::write_unaligned(a[2] as *mut KernelSigaction, old) };
    }
    inline::release(held);
    0
}

/// `rt_sigprocmask(how, set, old, 8)` of the program (`a`), made on the
/// signal frame `ctx` (the return from the handler restores the mask saved
/// there, so that is the mask to change), with `never` left unblocked: a
/// blocked `SIGSYS` (or, inline, `SIGBUS`) is forced to its default
/// action, which kills the process at the next trap. The program's memory
/// is read and written here: on the inline path the caller holds it.
fn frame_sigmask(a: [u64; 6], ctx: *mut libc::ucontext_t, never: u64) -> i64 {
    if a[3] != 8 || a[0] > 2 {
        return -(libc::EINVAL as i64);
    }
    // SAFETY: `ctx` is this handler's ucontext; the kernel's mask is the
    // first word of uc_sigmask.
    let saved = unsafe { &mut *(std::ptr::addr_of_mut!((*ctx).uc_sigmask) as *mut u64) };
    let cur = *saved;
    if a[1] != 0 {
        // SAFETY: the program's mask (held local on the inline path).
        let set = unsafe { std::ptr::read_unaligned(a[1] as *const u64) };
        let new = match a[0] as i32 {
            libc::SIG_BLOCK => cur | set,
            libc::SIG_UNBLOCK => cur & !set,
            _ => set,
        };
        *saved = new & !never;
    }
    if a[2] != 0 {
        // SAFETY: where the program asked for the old mask.
        unsafe { std::ptr::write_unaligned(a[2] as *mut u64, cur) };
    }
    0
}

/// Writes `m` on stderr unless `said` says it was already.
/// Async-signal-safe.
fn say_once(said: &AtomicBool, m: &[u8]) {
    if !said.swap(true, Ordering::AcqRel) {
        program_call(
            libc::SYS_write,
            [2, m.as_ptr() as u64, m.len() as u64, 0, 0, 0],
        );
    }
}

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the handler's own arguments, for a SIGSYS raised by our filter.
    let t = unsafe { seccomp::trapped(info, ctx) };
    let a = t.args;
    if t.nr == libc::SYS_rt_sigaction && a[0] == libc::SIGSYS as u64 {
        let r = program_sigsys_action(a);
        // SAFETY: as above.
        unsafe { seccomp::set_result(ctx, r) };
        return;
    }
    if !inline_path() {
        let r = match t.nr {
            libc::SYS_rt_sigaction if a[1] != 0 => {
                // A handler's mask may not block SIGSYS either (a call it
                // makes would meet a blocked trap).
                // SAFETY: the program's struct sigaction.
                let mut act = unsafe { std::ptr::read_unaligned(a[1] as *const KernelSigaction) };
                act.mask &= !signal::bit(libc::SIGSYS);
                let mut b = a;
                b[1] = &act as *const KernelSigaction as u64;
                Some(program_call(t.nr, b))
            }
            libc::SYS_rt_sigaction => Some(program_call(t.nr, a)),
            libc::SYS_rt_sigprocmask => Some(frame_sigmask(
                a,
                ctx as *mut libc::ucontext_t,
                signal::bit(libc::SIGSYS),
            )),
            _ => None,
        };
        if let Some(r) = r {
            // SAFETY: as above.
            unsafe { seccomp::set_result(ctx, r) };
            return;
        }
    }
    if !seccomp::TRAPPED.contains(&t.nr) {
        // Only the inline path traps other calls, and either the program's
        // own UFFDIO_REGISTER.
        let register =
            t.nr == libc::SYS_ioctl && a[1] as u32 == pagewise_sys::uffd::UFFDIO_REGISTER as u32;
        let r = if register && !inline_path() {
            program_call(t.nr, a)
        } else {
            kernel_call(t.nr, a, ctx as *mut libc::ucontext_t)
        };
        if register && r == -libc::EBUSY as i64 {
            static SAID: AtomicBool = AtomicBool::new(false);
            say_once(&SAID, b"pagewise farmem: the program registered memory with a userfaultfd of its own and the kernel refused it (UFFDIO_REGISTER: EBUSY): far memory (or another userfaultfd) holds that memory already, and one userfaultfd holds a mapping; said once\n");
        }
        // SAFETY: as above.
        unsafe { seccomp::set_result(ctx, r) };
        return;
    }
    let r = match t.nr {
        libc::SYS_brk => {
            // SAFETY: brk(0) only reads the break; then the program's call.
            let old = unsafe { raw_syscall(libc::SYS_brk, [0; 6]) };
            // SAFETY: the program's own call, made for it.
            let r = unsafe { raw_syscall(libc::SYS_brk, a) };
            if a[0] != 0 && r > old {
                let (s, e) = (page_up(old as u64), page_up(r as u64));
                if e > s {
                    emulate(s, e - s, Made::Before);
                }
            }
            r
        }
        _ => {
            let tid = inline::current_tid();
            // The engine's own calls (on its handler thread, or in a thread
            // serving a fault inline) map memory that is never emulated.
            let program = tid != HANDLER_TID.load(Ordering::Acquire) && !inline::in_engine(tid);
            // An mremap is counted from before the call until it is over
            // and the engine has been told of its new range (see
            // Hooks::remapping). (madvise cannot be trapped: a thread's
            // exit calls it with every signal blocked.)
            let changing = program && t.nr == libc::SYS_mremap;
            if changing {
                // Then no step of the engine is under way that saw none
                // changing (see engine::wait_for_steps).
                CHANGING.fetch_add(1, Ordering::SeqCst);
                crate::engine::wait_for_steps();
            }
            // SAFETY: the program's own call, made for it.
            let r = unsafe { raw_syscall(t.nr, a) };
            if r >= 0 && program {
                let anon_private = |flags: u64| {
                    flags & libc::MAP_ANONYMOUS as u64 != 0
                        && flags & libc::MAP_SHARED as u64 == 0
                        && flags & libc::MAP_SHARED_VALIDATE as u64
                            != libc::MAP_SHARED_VALIDATE as u64
                };
                let writable = |prot: u64| prot & libc::PROT_WRITE as u64 != 0;
                if t.nr == libc::SYS_mmap {
                    forget_reserved(r as u64, a[1]);
                }
                match t.nr {
                    libc::SYS_mmap if anon_private(a[3]) => {
                        let stack = a[3] & libc::MAP_STACK as u64 != 0;
                        let (start, len) = if stack {
                            // A thread stack holds the thread's control block
                            // and static TLS at its top; the kernel writes
                            // there as the thread exits (clearing its tid),
                            // when no fault can be served. Never emulated.
                            (r as u64, page_up(a[1]).saturating_sub(STACK_TOP_KEPT))
                        } else {
                            (r as u64, a[1])
                        };
                        if stack && !STACKS.load(Ordering::Relaxed) {
                            // Not emulated at all (its later mprotect neither).
                        } else if !writable(a[2]) {
                            remember_reserved(start, len);
                        } else {
                            emulate(start, len, Made::Now);
                        }
                    }
                    libc::SYS_mprotect if writable(a[2]) && is_reserved(a[0], a[1]) => {
                        // Not made now: a reservation opened again may
                        // hold data the program wrote when it was open.
                        emulate(a[0], a[1], Made::Before);
                    }
                    libc::SYS_mremap => emulate(r as u64, a[2], Made::Before),
                    _ => {}
                }
            }
            if changing {
                CHANGING.fetch_sub(1, Ordering::AcqRel);
            }
            r
        }
    };
    // SAFETY: as above.
    unsafe { seccomp::set_result(ctx, r) };
}

/// The program's threads inside an `mremap` now (see `Hooks::remapping`).
static CHANGING: AtomicUsize = AtomicUsize::new(0);

/// Set once emulation runs: from then on no thread may block `SIGSYS`.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The signals no thread of the program may block now, as a kernel mask:
/// none before emulation runs; from then on `SIGSYS` (a thread that blocked
/// it would be killed by its first trapped call: the kernel forces a
/// blocked `SIGSYS` to its default action), and on the inline path
/// `SIGBUS` (the faults) too. The shim's signal-mask functions take them
/// out of every set the program blocks.
pub fn never_blocked() -> u64 {
    if !ACTIVE.load(Ordering::Relaxed) {
        0
    } else if INLINE.load(Ordering::Relaxed) {
        NEVER_BLOCKED
    } else {
        signal::bit(libc::SIGSYS)
    }
}

/// Makes the program's call `nr` with `a`, with the memory it hands to
/// the kernel held local for its duration (the inline path: a remote page
/// there would fail the call with `EFAULT`); the kernel's result (a
/// negative errno on failure). The shim's wrappers of the C library's
/// busiest calls make their call here on the inline path.
///
/// # Safety
/// `nr` and `a` are a call the program itself made, with its own
/// arguments: the kernel checks them as it would the program's.
pub unsafe fn held_call(nr: libc::c_long, a: [u64; 6]) -> i64 {
    let held = syscalls::hold_for(nr, &a);
    let r = program_call(nr, a);
    inline::release(held);
    r
}

extern "C" fn at_exit() {
    let Ok(mut g) = RUNNING.lock() else { return };
    let Some(run) = g.as_mut() else { return };
    if let Some(path) = &run.trace {
        let (events, dropped) = run.fm.take_trace();
        let path = format!("{path}.{}", std::process::id());
        let written = std::fs::File::create(&path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            for e in &events {
                writeln!(w, "{}", serde_json::to_string(e).unwrap_or_default())?;
            }
            if dropped > 0 {
                writeln!(w, "{{\"dropped\":{dropped}}}")?;
            }
            w.flush()
        });
        if let Err(e) = written {
            eprintln!("pagewise farmem: writing the trace {path}: {e}");
        }
    }
    run.fm.publish_to(&run.inst, run.slot);
    run.inst.leave(run.slot);
}
