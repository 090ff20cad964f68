//! The shim's side on x86-64: the handler, the point and the reset.

use super::{decimal, stage, write_why, Board, ResetRequest, BOARD_BYTES};
use pagewise_sys::pagemap::{self, PageRegion, PmScanArg};
use pagewise_sys::seccomp::{self, raw_syscall};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};

mod point;
mod reset;
use point::{fp_size, point, read_control, tell};
use reset::reset;

const PAGE: u64 = 4096;

/// The alternate stack the handler runs on (the shim's own memory: a
/// reset rewrites the program's stack under the handler otherwise).
const ALT_STACK: usize = 256 << 10;

/// The calls trapped (from the C library's code), but `read`, trapped
/// only on the input descriptor.
const TRAPPED: &[libc::c_long] = &[
    libc::SYS_exit_group,
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_close,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_close_range,
    libc::SYS_set_robust_list,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
];

/// The process the point is of (0: not taken yet). A child the program
/// forks inherits the handler and the filter, and only passes its calls
/// through.
static POINT_PID: AtomicI32 = AtomicI32::new(0);
static STATE: AtomicPtr<Inside> = AtomicPtr::new(std::ptr::null_mut());

/// One private writable mapping of the point and its copy.
struct Copied {
    start: u64,
    end: u64,
    copy: *mut u8,
    /// Anonymous memory (not a file's private mapping).
    anon: bool,
}

/// Everything the handler keeps: the request, the point, and what the run
/// changed.
struct Inside {
    req: ResetRequest,
    board: &'static Board,
    alt: (u64, u64),
    // The point.
    gregs: [i64; 23],
    uc_flags: u64,
    sigmask: u64,
    fp: Vec<u8>,
    brk: u64,
    /// Every mapping of the point, sorted (for the overlap checks).
    mappings: Vec<(u64, u64)>,
    regions: Vec<Copied>,
    /// Of them, those a reset walks (one `PAGEMAP_SCAN` each: one over all
    /// of them would walk the page tables of every mapping between, the
    /// point's copy among them).
    walked: Vec<(u64, u64)>,
    /// The others, a few pages each: copied back whole at every reset and
    /// never protected.
    whole: Vec<(u64, u64)>,
    offsets: Vec<(i32, u64)>,
    /// Descriptors the point held, sorted.
    fds: Vec<i32>,
    /// The ranges of numbers the point left free, closed at each reset.
    gaps: Vec<(u32, u32)>,
    uffd: i32,
    pagemap: i32,
    /// `/proc/self/task`, read at the end of each run.
    tasks: i32,
    /// Its link count at the point, with one thread ([`task_links`]).
    one_thread_links: u64,
    scan: Vec<PageRegion>,
    runs: Vec<(u64, u64)>,
    /// The runs found written at the last reset (left unprotected).
    last: Vec<(u64, u64)>,
    /// Resets made.
    round: u64,
    // The run.
    /// Whether the run called `brk` (else the break is the point's).
    brk_called: bool,
    brk_low: u64,
    made: Vec<(u64, u64)>,
    made_overflow: bool,
    unfixable: Option<(&'static [u8], u64)>,
    /// The caught crash signals whose action the run changed.
    crash_changed: u32,
    run_started: u64,
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock and storage (the vDSO answers, no system call).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A system call from pagewise's own code (which the filter lets through).
fn sys(nr: libc::c_long, args: [u64; 6]) -> i64 {
    // SAFETY: each caller passes arguments valid for `nr` (its own buffers
    // or the program's call as it made it).
    unsafe { raw_syscall(nr, args) }
}

fn a1(x: u64) -> [u64; 6] {
    [x, 0, 0, 0, 0, 0]
}

fn a3(x: u64, y: u64, z: u64) -> [u64; 6] {
    [x, y, z, 0, 0, 0]
}

/// Ends the process now (the program's atexit handlers ran already, or
/// must not).
fn end_now() -> ! {
    sys(libc::SYS_exit_group, a1(0));
    unreachable!("exit_group returned");
}

/// Starts resets inside this program as `req` asks (the shim calls it
/// once, at start-up, before the program's `main`). On failure the board
/// says why and the process ends: pagewise resets it from outside.
pub fn init(req: ResetRequest) {
    let board = match map_board(req.board) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("pagewise shim: no resets inside the program: the board: {e}");
            end_now();
        }
    };
    if let Err(why) = start(req, board) {
        write_why(&board.refused_len, &board.refused, &[why.as_bytes()]);
        end_now();
    }
}

fn map_board(fd: i32) -> std::io::Result<&'static Board> {
    // SAFETY: pagewise passed this descriptor for the shim alone.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let p = pagewise_sys::mem::mmap_shared_file(fd, BOARD_BYTES, true)?;
    // SAFETY: a shared mapping of BOARD_BYTES, kept for the life of the
    // process.
    let b = unsafe { Board::at(p, false) };
    if !b.is_ready() {
        return Err(std::io::Error::from_raw_os_error(libc::EPROTO));
    }
    Ok(b)
}

/// Where the shim keeps its descriptors: out of the way of the program's
/// (which gets the lowest free number at each open, as without the shim).
const SHIM_FDS: i32 = 1000;

/// Descriptor `fd` moved to [`SHIM_FDS`] or above, close-on-exec (kept
/// where it is, close-on-exec, where the limit of descriptors is lower).
fn moved_high(fd: i32) -> i32 {
    // SAFETY: fcntl and close of a descriptor the shim owns.
    unsafe {
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, SHIM_FDS);
        if high >= 0 {
            libc::close(fd);
            return high;
        }
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    fd
}

fn start(mut req: ResetRequest, board: &'static Board) -> Result<(), String> {
    req.control = moved_high(req.control);
    req.status = moved_high(req.status);
    req.board = moved_high(req.board);
    let maps = pagewise_mech::procfs::maps(None).map_err(|e| e.to_string())?;
    // `mmap`: a function the shim does not wrap (its own `read` would
    // be found in the shim's code).
    let read = libc::mmap as *const () as u64;
    let libc_text = maps
        .iter()
        .find(|m| m.exec && m.start <= read && read < m.end)
        .map(|m| (m.start, m.end))
        .ok_or("cannot find the C library's code")?;
    let alt = pagewise_sys::mem::mmap_anonymous(ALT_STACK)
        .map_err(|e| format!("the handler's stack: {e}"))? as u64;
    pagewise_mech::procfs::note_own_memory(alt, ALT_STACK as u64);
    let ss = libc::stack_t {
        ss_sp: alt as *mut libc::c_void,
        ss_flags: 0,
        ss_size: ALT_STACK,
    };
    // SAFETY: a stack of the shim's own, kept for the life of the process.
    if unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) } != 0 {
        return Err(format!("sigaltstack: {}", std::io::Error::last_os_error()));
    }
    let inside = Box::new(Inside {
        req,
        board,
        alt: (alt, alt + ALT_STACK as u64),
        gregs: [0; 23],
        uc_flags: 0,
        sigmask: 0,
        fp: Vec::new(),
        brk: 0,
        mappings: Vec::new(),
        regions: Vec::new(),
        walked: Vec::new(),
        whole: Vec::new(),
        offsets: Vec::new(),
        fds: Vec::new(),
        gaps: Vec::new(),
        uffd: -1,
        pagemap: -1,
        tasks: -1,
        one_thread_links: 0,
        scan: vec![PageRegion::default(); 512],
        runs: Vec::with_capacity(4096),
        last: Vec::with_capacity(4096),
        round: 0,
        brk_called: false,
        brk_low: 0,
        made: Vec::with_capacity(256),
        made_overflow: false,
        unfixable: None,
        crash_changed: 0,
        run_started: 0,
    });
    STATE.store(Box::into_raw(inside), Ordering::Release);
    // SAFETY: a zeroed sigaction, then filled as a well-formed SA_SIGINFO
    // action: the handler makes the trapped call itself, or takes the
    // point, or resets, from its own stack with every signal blocked.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigfillset(&mut sa.sa_mask);
        libc::sigdelset(&mut sa.sa_mask, libc::SIGSYS);
        if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
            return Err(format!(
                "installing the SIGSYS handler: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    catch_crashes();
    let when = [(libc::SYS_read, 0usize, req.input as u32)];
    seccomp::trap_syscalls(libc_text.0, libc_text.1, TRAPPED, &[], &when)
        .map_err(|e| format!("installing the seccomp filter: {e}"))
}

/// The handler's state (set once at start-up, before the filter).
///
/// # Safety
/// One thread at a time: the point is taken and resets are made with the
/// program single-threaded (checked), and every signal blocked.
unsafe fn state() -> &'static mut Inside {
    // SAFETY: set at start-up and never freed; the caller vouches for
    // exclusive use.
    unsafe { &mut *STATE.load(Ordering::Acquire) }
}

/// The program's `rt_sigprocmask(how, set, old)`, made on the mask the
/// return from the handler puts back (the frame's: a change made by a
/// call from the handler would be undone by that return), `SIGSYS` never
/// blocked. The kernel's answer: 0 or `-errno`.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS; `set` and `old` are the program's
/// (0 or valid for 8 bytes).
unsafe fn sigprocmask_in_frame(ctx: *mut libc::c_void, how: u64, set: u64, old: u64) -> i64 {
    // SAFETY: the frame's mask, the first 8 bytes of uc_sigmask.
    let mask =
        unsafe { &mut *(&mut (*(ctx as *mut libc::ucontext_t)).uc_sigmask as *mut _ as *mut u64) };
    let cur = *mask;
    let new = if set != 0 {
        // SAFETY: the program's set, as it passed it.
        let set = unsafe { std::ptr::read_unaligned(set as *const u64) };
        match how as i32 {
            libc::SIG_BLOCK => cur | set,
            libc::SIG_UNBLOCK => cur & !set,
            libc::SIG_SETMASK => set,
            _ => return -(libc::EINVAL as i64),
        }
    } else {
        cur
    };
    if old != 0 {
        // SAFETY: the program's storage for the old set.
        unsafe { std::ptr::write_unaligned(old as *mut u64, cur) };
    }
    let never =
        1u64 << (libc::SIGSYS - 1) | 1u64 << (libc::SIGKILL - 1) | 1u64 << (libc::SIGSTOP - 1);
    *mask = new & !never;
    0
}

/// Makes the trapped call as the program made it, and gives it the answer.
fn pass(ctx: *mut libc::c_void, t: &seccomp::Trapped) -> i64 {
    let r = sys(t.nr, t.args);
    // SAFETY: `ctx` is the frame of this SIGSYS.
    unsafe { seccomp::set_result(ctx, r) };
    r
}

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's arguments for a SIGSYS raised by seccomp.
    let t = unsafe { seccomp::trapped(info, ctx) };
    // Kept from the program: SIGSYS, its handler and its delivery.
    match t.nr {
        libc::SYS_rt_sigaction if t.args[0] == libc::SIGSYS as u64 && t.args[1] != 0 => {
            let r = sys(t.nr, [t.args[0], 0, t.args[2], t.args[3], 0, 0]);
            // SAFETY: as above.
            unsafe { seccomp::set_result(ctx, r) };
            return;
        }
        libc::SYS_rt_sigprocmask if t.args[3] == 8 => {
            // SAFETY: the frame of this SIGSYS; the program's sets as it
            // passed them.
            let r = unsafe { sigprocmask_in_frame(ctx, t.args[0], t.args[1], t.args[2]) };
            // SAFETY: as above.
            unsafe { seccomp::set_result(ctx, r) };
            return;
        }
        _ => {}
    }
    let pid = POINT_PID.load(Ordering::Acquire);
    if pid == 0 {
        if t.nr == libc::SYS_read && !STATE.load(Ordering::Acquire).is_null() {
            // SAFETY: before the point, the program's first read of its
            // input; one thread (checked first thing).
            unsafe { point(ctx, &t) };
            return;
        }
        pass(ctx, &t);
        return;
    }
    if sys(libc::SYS_getpid, [0; 6]) as i32 != pid {
        pass(ctx, &t);
        return;
    }
    // SAFETY: the process of the point; another thread of it only sets
    // the mark that ends it at the end of the run.
    let s = unsafe { state() };
    match t.nr {
        libc::SYS_exit_group => {
            // SAFETY: the frame of this SIGSYS.
            unsafe { end_of_run(s, ctx, ((t.args[0] as u32) & 0xff) << 8) }
        }
        libc::SYS_brk => {
            s.brk_called = true;
            let r = pass(ctx, &t);
            if r > 0 {
                s.brk_low = s.brk_low.min(r as u64);
            }
        }
        libc::SYS_mmap => {
            let fixed = t.args[3] & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) as u64 != 0;
            if fixed && s.overlaps(t.args[0], t.args[1]) {
                s.mark(b"a mapping was made over one of the point's", t.args[0]);
            }
            let r = pass(ctx, &t);
            if r >= 0 {
                s.made_one(r as u64, t.args[1]);
            }
        }
        libc::SYS_munmap | libc::SYS_mprotect => {
            if s.overlaps(t.args[0], t.args[1]) {
                let what: &'static [u8] = if t.nr == libc::SYS_munmap {
                    b"a mapping of the point was unmapped at"
                } else {
                    b"a mapping of the point was protected anew at"
                };
                s.mark(what, t.args[0]);
            }
            pass(ctx, &t);
        }
        libc::SYS_mremap => {
            if s.overlaps(t.args[0], t.args[1]) {
                s.mark(b"a mapping of the point was moved at", t.args[0]);
            }
            let r = pass(ctx, &t);
            if r >= 0 {
                s.made_one(r as u64, t.args[2]);
            }
        }
        libc::SYS_close | libc::SYS_dup2 | libc::SYS_dup3 => {
            let fd = if t.nr == libc::SYS_close {
                t.args[0]
            } else {
                t.args[1]
            } as i32;
            if s.fds.binary_search(&fd).is_ok() {
                s.mark(
                    b"a descriptor of the point was closed or replaced:",
                    fd as u64,
                );
            }
            pass(ctx, &t);
        }
        libc::SYS_close_range => {
            let (lo, hi) = (t.args[0] as u32, t.args[1] as u32);
            if let Some(&fd) = s.fds.iter().find(|&&f| lo <= f as u32 && f as u32 <= hi) {
                s.mark(b"a descriptor of the point was closed:", fd as u64);
            }
            pass(ctx, &t);
        }
        libc::SYS_set_robust_list => {
            if sys(libc::SYS_gettid, [0; 6]) as i32 != pid {
                s.mark(b"a thread was made", 0);
            }
            pass(ctx, &t);
        }
        libc::SYS_rt_sigaction => {
            if t.args[1] != 0 {
                if let Some(i) = CRASHES.iter().position(|&c| c as u64 == t.args[0]) {
                    if CAUGHT.load(Ordering::Relaxed) & (1 << i) != 0 {
                        s.crash_changed |= 1 << i;
                    }
                }
            }
            pass(ctx, &t);
        }
        libc::SYS_sigaltstack => {
            if t.args[0] != 0 {
                s.mark(b"the program set an alternate signal stack", 0);
            }
            pass(ctx, &t);
        }
        _ => {
            pass(ctx, &t);
        }
    }
}

impl Inside {
    fn mark(&mut self, what: &'static [u8], arg: u64) {
        if self.unfixable.is_none() {
            self.unfixable = Some((what, arg));
        }
    }

    /// Whether `[start, start+len)` meets a mapping of the point.
    fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len.max(1));
        let i = self.mappings.partition_point(|&(_, e)| e <= start);
        self.mappings.get(i).is_some_and(|&(s, _)| s < end)
    }

    fn made_one(&mut self, start: u64, len: u64) {
        if self.made.len() < self.made.capacity() {
            self.made.push((start, len));
        } else {
            self.made_overflow = true;
        }
    }
}

/// The signals that end a program by default and that a crash raises:
/// caught where the program left them so, and told to AFL++ as the
/// program's end (a crash), the process reset as after an exit.
const CRASHES: [libc::c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGTRAP,
];

/// Catches each of [`CRASHES`] the program leaves to its default action
/// (at start-up); the kernel's action of each kept, to put back at a
/// reset after a run that changed it.
fn catch_crashes() {
    for (i, &sig) in CRASHES.iter().enumerate() {
        // SAFETY: zeroed sigactions, the new one filled as a well-formed
        // SA_SIGINFO action whose handler runs on the shim's own stack.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            if old.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_crash as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigfillset(&mut sa.sa_mask);
            libc::sigdelset(&mut sa.sa_mask, libc::SIGSYS);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                continue;
            }
            let mut k = pagewise_sys::signal::KernelSigaction::default();
            pagewise_sys::signal::raw_sigaction(sig, None, Some(&mut k));
            let (h, f, r, m) = &CAUGHT_ACTS[i];
            h.store(k.handler as u64, Ordering::Relaxed);
            f.store(k.flags, Ordering::Relaxed);
            r.store(k.restorer as u64, Ordering::Relaxed);
            m.store(k.mask, Ordering::Relaxed);
        }
        CAUGHT.fetch_or(1 << i, Ordering::Relaxed);
    }
}

/// Puts back the shim's action of each of [`CRASHES`] in `changed` (bit i
/// for `CRASHES[i]`). Signal-safe.
fn catch_again(changed: u32) {
    for (i, &sig) in CRASHES.iter().enumerate() {
        if changed & (1 << i) == 0 {
            continue;
        }
        let (h, f, r, m) = &CAUGHT_ACTS[i];
        let k = pagewise_sys::signal::KernelSigaction {
            handler: h.load(Ordering::Relaxed) as usize,
            flags: f.load(Ordering::Relaxed),
            restorer: r.load(Ordering::Relaxed) as usize,
            mask: m.load(Ordering::Relaxed),
        };
        // SAFETY: the action the kernel gave back at start-up, whose
        // handler is the shim's.
        unsafe { pagewise_sys::signal::raw_sigaction(sig, Some(&k), None) };
    }
}

type Acts = (AtomicU64, AtomicU64, AtomicU64, AtomicU64);
static CAUGHT_ACTS: [Acts; 6] = [const {
    (
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    )
}; 6];

/// Which of [`CRASHES`] the shim catches (bit i for `CRASHES[i]`).
static CAUGHT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn on_crash(sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let pid = POINT_PID.load(Ordering::Acquire);
    if pid == 0 || sys(libc::SYS_getpid, [0; 6]) as i32 != pid {
        // Not a run of the point: the default action, as without the
        // shim (the fault, made again, or abort's own raise, ends it).
        // SAFETY: a zeroed sigaction is SIG_DFL.
        unsafe {
            let dfl: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        // Raised again, delivered as the handler returns.
        let me = sys(libc::SYS_getpid, [0; 6]) as u64;
        let tid = sys(libc::SYS_gettid, [0; 6]) as u64;
        sys(libc::SYS_tgkill, a3(me, tid, sig as u64));
        return;
    }
    // SAFETY: the process of the point, its run ended by this signal.
    let s = unsafe { state() };
    s.board.crashes.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the frame of this signal.
    unsafe { end_of_run(s, ctx, (sig as u32) & 0x7f) }
}

/// The link count of `/proc/self/task` from its descriptor `fd`: the
/// kernel adds the process's threads to it (`proc_task_getattr`), so that
/// one `fstat` tells whether a thread was made since the point (which
/// keeps the count it had with one). 0 where it cannot be read.
fn task_links(fd: i32) -> u64 {
    // SAFETY: a zeroed stat is valid storage.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = sys(
        libc::SYS_fstat,
        a3(fd as u64, &mut st as *mut libc::stat as u64, 0),
    );
    if r != 0 {
        return 0;
    }
    st.st_nlink
}

/// The end of a run: tells AFL++ the status, waits for the next input,
/// resets and makes the point's read.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS (an `exit_group` of the program).
unsafe fn end_of_run(s: &mut Inside, ctx: *mut libc::c_void, status: u32) {
    let b = s.board;
    b.run_ns
        .fetch_add(now_ns().saturating_sub(s.run_started), Ordering::Relaxed);
    tell(s, status);
    b.runs.fetch_add(1, Ordering::Relaxed);
    b.set_stage(stage::IDLE);
    let pid = POINT_PID.load(Ordering::Relaxed);
    if sys(libc::SYS_gettid, [0; 6]) as i32 != pid || task_links(s.tasks) != s.one_thread_links {
        s.mark(b"a thread was made", 0);
    }
    if s.made_overflow {
        s.mark(
            b"more mappings were made than a reset keeps",
            s.made.len() as u64,
        );
    }
    if let Some((what, arg)) = s.unfixable {
        let mut n = [0u8; 20];
        let num = decimal(arg, &mut n);
        let parts: [&[u8]; 3] = if arg != 0 {
            [what, b" ", num]
        } else {
            [what, b"", b""]
        };
        write_why(&b.ended_len, &b.ended, &parts);
        end_now();
    }
    if !read_control(s) {
        b.set_stage(stage::GONE);
        end_now();
    }
    b.set_stage(stage::OWES_PID);
    let t0 = now_ns();
    // SAFETY: as this function's.
    if let Err(what) = unsafe { reset(s, ctx) } {
        write_why(&b.ended_len, &b.ended, &[what]);
        end_now();
    }
    let took = now_ns() - t0;
    b.reset_ns.fetch_add(took, Ordering::Relaxed);
    b.record_reset(took);
    b.resets.fetch_add(1, Ordering::Relaxed);
    tell(s, pid as u32);
    b.set_stage(stage::RUNNING);
    // The point's own call: the read of the input, as it was asked.
    let g = &s.gregs;
    let args = [
        g[libc::REG_RDI as usize] as u64,
        g[libc::REG_RSI as usize] as u64,
        g[libc::REG_RDX as usize] as u64,
        0,
        0,
        0,
    ];
    s.run_started = now_ns();
    let r = sys(libc::SYS_read, args);
    // SAFETY: the frame of this SIGSYS, the point's now.
    unsafe { seccomp::set_result(ctx, r) };
}
