//! The shim's side on x86-64: the handler, the point and the reset.

use super::{decimal, stage, write_why, Board, ResetRequest, BOARD_BYTES};
use pagewise_sys::pagemap::{self, PageRegion, PmScanArg};
use pagewise_sys::seccomp::{self, raw_syscall};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};

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
    /// The regions, those that touch joined: one `PAGEMAP_SCAN` each (one
    /// over all of them would walk the page tables of every mapping
    /// between, the point's copy among them).
    spans: Vec<(u64, u64)>,
    offsets: Vec<(i32, u64)>,
    /// Descriptors the point held, sorted.
    fds: Vec<i32>,
    /// The ranges of numbers the point left free, closed at each reset.
    gaps: Vec<(u32, u32)>,
    uffd: i32,
    pagemap: i32,
    /// `/proc/self/task`, read at the end of each run.
    tasks: i32,
    scan: Vec<PageRegion>,
    runs: Vec<(u64, u64)>,
    /// The runs found written at the last reset (left unprotected).
    last: Vec<(u64, u64)>,
    /// Resets made.
    round: u64,
    // The run.
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
        spans: Vec::new(),
        offsets: Vec::new(),
        fds: Vec::new(),
        gaps: Vec::new(),
        uffd: -1,
        pagemap: -1,
        tasks: -1,
        scan: vec![PageRegion::default(); 512],
        runs: Vec::with_capacity(4096),
        last: Vec::with_capacity(4096),
        round: 0,
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

/// Reads a whole small file of /proc (the point is taken once).
fn proc_text(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))
}

/// Takes the point at the program's first read of its input (not made
/// yet), then serves the first run.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS; called once, before the point.
unsafe fn point(ctx: *mut libc::c_void, t: &seccomp::Trapped) {
    // SAFETY: one thread is checked first thing in `take`, before any
    // other use; nothing else holds the state before the point.
    let s = unsafe { state() };
    // SAFETY: as this function's.
    if let Err(why) = unsafe { take(s, ctx) } {
        write_why(&s.board.refused_len, &s.board.refused, &[why.as_bytes()]);
        end_now();
    }
    let pid = sys(libc::SYS_getpid, [0; 6]) as i32;
    s.board.pid.store(pid, Ordering::Relaxed);
    s.board.set_stage(stage::IDLE);
    POINT_PID.store(pid, Ordering::Release);
    if !s.req.control_read && !read_control(s) {
        s.board.set_stage(stage::GONE);
        end_now();
    }
    s.board.set_stage(stage::OWES_PID);
    tell(s, pid as u32);
    s.board.set_stage(stage::RUNNING);
    s.run_started = now_ns();
    pass(ctx, t);
}

/// Reads the next control word; false when AFL++ closed the pipe.
fn read_control(s: &Inside) -> bool {
    let mut w = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let r = sys(
            libc::SYS_read,
            a3(
                s.req.control as u64,
                w[got..].as_mut_ptr() as u64,
                (4 - got) as u64,
            ),
        );
        if r == -(libc::EINTR as i64) {
            continue;
        }
        if r <= 0 {
            return false;
        }
        got += r as usize;
    }
    true
}

/// Writes one word to AFL++'s status pipe; a fuzzer gone ends the program.
fn tell(s: &Inside, word: u32) {
    let b = word.to_ne_bytes();
    loop {
        let r = sys(
            libc::SYS_write,
            a3(s.req.status as u64, b.as_ptr() as u64, 4),
        );
        if r == -(libc::EINTR as i64) {
            continue;
        }
        if r != 4 {
            s.board.set_stage(stage::GONE);
            end_now();
        }
        return;
    }
}

/// The point: see the module.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS.
unsafe fn take(s: &mut Inside, ctx: *mut libc::c_void) -> Result<(), String> {
    let stat = proc_text("/proc/self/stat")?;
    let threads: u64 = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().nth(17))
        .and_then(|v| v.parse().ok())
        .ok_or("reading the thread count in /proc/self/stat")?;
    if threads != 1 {
        return Err(format!(
            "the program has {threads} threads at its first read (a reset inside it needs one)"
        ));
    }
    // SAFETY: a zeroed stack_t is valid storage.
    let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: reads the thread's alternate stack into `cur`.
    unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) };
    if cur.ss_sp as u64 != s.alt.0 {
        return Err("the program set an alternate signal stack of its own".into());
    }
    // Whatever calls the C library (which may allocate, and so move the
    // break and write its own data), made before memory is copied: the
    // copy, the break and the layout are then of one instant.
    own_descriptors(s)?;
    descriptors(s)?;
    let brk = sys(libc::SYS_brk, a1(0)) as u64;
    let (regions, total) = regions_of(s)?;
    if regions.is_empty() {
        return Err("the program has no private writable memory".into());
    }
    let copy = pagewise_sys::mem::mmap_anonymous(total as usize)
        .map_err(|e| format!("the point's copy ({total} bytes): {e}"))?;
    pagewise_mech::procfs::note_own_memory(copy as u64, total);
    let mut off = 0u64;
    for &(a, e) in &regions {
        // SAFETY: a readable mapping of this process (private writable),
        // into the shim's copy made for it.
        let dst = unsafe { copy.add(off as usize) };
        // SAFETY: see above: both ranges are mapped and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(a as *const u8, dst, (e - a) as usize) };
        s.regions.push(Copied {
            start: a,
            end: e,
            copy: dst,
        });
        off += e - a;
    }
    // SAFETY: the userfaultfd the shim holds for the life of the process.
    let uffd = unsafe { std::os::fd::BorrowedFd::borrow_raw(s.uffd) };
    for c in &s.regions {
        let len = c.end - c.start;
        pagewise_sys::uffd::register(uffd, c.start, len, pagewise_sys::uffd::REGISTER_MODE_WP)
            .and_then(|_| pagewise_sys::uffd::writeprotect(uffd, c.start, len, true))
            .map_err(|e| format!("write-protecting {:#x}..{:#x}: {e}", c.start, c.end))?;
    }
    for c in &s.regions {
        match s.spans.last_mut() {
            Some((_, e)) if *e == c.start => *e = c.end,
            _ => s.spans.push((c.start, c.end)),
        }
    }
    s.brk = sys(libc::SYS_brk, a1(0)) as u64;
    if s.brk != brk {
        return Err("the break moved while the point was taken".into());
    }
    s.brk_low = s.brk;
    // SAFETY: the frame of this SIGSYS: its registers, flags, mask and
    // XSAVE area (its size as the kernel says in the area).
    unsafe {
        let uc = ctx as *mut libc::ucontext_t;
        s.gregs = (*uc).uc_mcontext.gregs;
        s.uc_flags = (*uc).uc_flags;
        s.sigmask = std::ptr::read(&(*uc).uc_sigmask as *const _ as *const u64);
        let fp = (*uc).uc_mcontext.fpregs as *const u8;
        let n = fp_size(fp);
        s.fp = std::slice::from_raw_parts(fp, n).to_vec();
    }
    Ok(())
}

/// The shim's descriptors made: its userfaultfd and pagemap file and
/// `/proc/self/task`, out of the program's way (the program's next open
/// gets the number it would get without the shim).
fn own_descriptors(s: &mut Inside) -> Result<(), String> {
    let wp = pagewise_mech::wp::UffdWp::open().map_err(|e| e.to_string())?;
    // The shim's descriptors stay its own: the program's next open gets the
    // number it would get without the shim.
    // The threads, counted at the end of each run (1 µs).
    // SAFETY: a valid path and flags.
    s.tasks = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if s.tasks < 0 {
        return Err(format!(
            "opening /proc/self/task: {}",
            std::io::Error::last_os_error()
        ));
    }
    s.tasks = moved_high(s.tasks);
    {
        use std::os::fd::AsRawFd;
        let (u, p) = wp.descriptors();
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) of descriptors `wp` holds; the
        // duplicates outlive it (closed with the process).
        let dup = |fd: i32| unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, SHIM_FDS) };
        s.uffd = dup(u.as_raw_fd());
        s.pagemap = dup(p.as_raw_fd());
    }
    drop(wp);
    if s.uffd < 0 || s.pagemap < 0 {
        return Err(format!(
            "moving the userfaultfd out of the program's way: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The point's descriptors: their numbers (the shim's with them: a reset
/// closes any other), the ranges of numbers between them, and the offsets
/// of the regular files.
fn descriptors(s: &mut Inside) -> Result<(), String> {
    // The descriptors, the shim's with them (its userfaultfd, the pagemap,
    // AFL++'s pipes): a reset closes any other.
    let mut fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("listing /proc/self/fd: {e}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    // The directory's own descriptor, closed since.
    // SAFETY: fcntl(F_GETFD) reads a descriptor's flags.
    fds.retain(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0);
    let mut prev: i64 = -1;
    for &fd in &fds {
        if fd as i64 > prev + 1 {
            s.gaps.push(((prev + 1) as u32, (fd - 1) as u32));
        }
        prev = fd as i64;
    }
    s.gaps.push(((prev + 1) as u32, u32::MAX));
    for &fd in &fds {
        // The standard output and error may be a shell's file too: their
        // offsets are the shell's as well. The input's is afl-fuzz's: it
        // writes each input and sets the offset to its start (a program
        // started again after a run takes its point where that run left
        // the offset).
        if fd == 1 || fd == 2 || fd == s.req.input {
            continue;
        }
        // SAFETY: a zeroed stat is valid storage.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat into `st`.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            continue;
        }
        // SAFETY: lseek reads the offset.
        let pos = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
        if pos >= 0 {
            s.offsets.push((fd, pos as u64));
        }
    }
    s.fds = fds;
    Ok(())
}

/// The private writable memory of the program (start, end), and its size
/// in all; every mapping noted in `s.mappings`.
fn regions_of(s: &mut Inside) -> Result<(Vec<(u64, u64)>, u64), String> {
    let maps = pagewise_mech::procfs::maps(None).map_err(|e| e.to_string())?;
    let own = pagewise_mech::procfs::own_memory();
    // The shim's own file (this code's) and the zero-filled data after it:
    // its state, never the program's.
    let here = on_sigsys as *const () as u64;
    let shim = maps.iter().find(|m| m.start <= here && here < m.end);
    let shim_file = shim.map(|m| (m.inode, m.path.clone()));
    let shim_data_end = shim_file.as_ref().and_then(|f| {
        maps.iter()
            .filter(|m| m.write && (m.inode, m.path.clone()) == *f)
            .map(|m| m.end)
            .max()
    });
    let is_own = |m: &pagewise_mech::procfs::Mapping| {
        shim_file
            .as_ref()
            .is_some_and(|f| (m.inode, &m.path) == (f.0, &f.1))
            || (Some(m.start) == shim_data_end && m.is_anonymous())
            || m.is_pagewise()
    };
    let mut regions = Vec::new();
    let mut total = 0u64;
    for m in &maps {
        s.mappings.push((m.start, m.end));
        if !m.write || m.shared || m.path == "[vsyscall]" || is_own(m) {
            continue;
        }
        // The shim's own ranges taken out: the kernel merges a mapping of
        // the program with one of the shim's next to it (its heap, say)
        // into one line of the maps, and a mapping that met the shim's
        // was once left out whole (the program's 8 MiB beside the
        // shim's heap went untracked).
        for (a, e) in outside(m.start, m.end, &own) {
            regions.push((a, e));
            total += e - a;
        }
    }
    s.mappings.sort_unstable();
    Ok((regions, total))
}

/// The parts of `[start, end)` outside every range of `own` (address,
/// bytes).
fn outside(start: u64, end: u64, own: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut cut: Vec<(u64, u64)> = own
        .iter()
        .map(|&(a, n)| (a.max(start), (a + n).min(end)))
        .filter(|(a, e)| a < e)
        .collect();
    cut.sort_unstable();
    let mut out = Vec::new();
    let mut at = start;
    for (a, e) in cut {
        if a > at {
            out.push((at, a));
        }
        at = at.max(e);
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// The size of the `XSAVE` area at `fp` in a signal frame: the extended
/// size its software-reserved bytes give (`FP_XSTATE_MAGIC1`), else the
/// legacy 512.
///
/// # Safety
/// `fp` is a signal frame's FP state.
unsafe fn fp_size(fp: *const u8) -> usize {
    // struct _fpx_sw_bytes at offset 464: magic1, extended_size.
    // SAFETY: the legacy area is 512 bytes, these lie inside it.
    let (magic, size) = unsafe {
        (
            std::ptr::read_unaligned(fp.add(464) as *const u32),
            std::ptr::read_unaligned(fp.add(468) as *const u32),
        )
    };
    if magic == 0x4650_5853 && (512..=65536).contains(&size) {
        size as usize
    } else {
        512
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

/// The threads of this process (entries of `/proc/self/task` but `.` and
/// `..`), from the directory's descriptor `fd`; 0 where it cannot be read.
fn threads(fd: i32) -> usize {
    let mut buf = [0u64; 256];
    sys(libc::SYS_lseek, a3(fd as u64, 0, libc::SEEK_SET as u64));
    let mut count = 0usize;
    loop {
        let n = sys(
            libc::SYS_getdents64,
            a3(
                fd as u64,
                buf.as_mut_ptr() as u64,
                std::mem::size_of_val(&buf) as u64,
            ),
        );
        if n <= 0 {
            return if n < 0 { 0 } else { count.saturating_sub(2) };
        }
        let bytes = buf.as_ptr() as *const u8;
        let mut off = 0usize;
        while off < n as usize {
            // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2).
            // SAFETY: inside the `n` bytes the kernel wrote.
            let reclen = unsafe { std::ptr::read_unaligned(bytes.add(off + 16) as *const u16) };
            if reclen == 0 {
                return 0;
            }
            count += 1;
            off += reclen as usize;
        }
    }
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
    if sys(libc::SYS_gettid, [0; 6]) as i32 != pid || threads(s.tasks) != 1 {
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
    b.reset_ns.fetch_add(now_ns() - t0, Ordering::Relaxed);
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

/// Puts memory, the break, mappings, descriptors and registers back at
/// the point.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS; the program is single-threaded.
unsafe fn reset(s: &mut Inside, ctx: *mut libc::c_void) -> Result<(), &'static [u8]> {
    let b = s.board;
    let t0 = now_ns();
    // The break: back to the point's; pages given back since are mapped
    // again, registered, and filled from the point's copy below.
    let cur = sys(libc::SYS_brk, a1(0)) as u64;
    if cur != s.brk && sys(libc::SYS_brk, a1(s.brk)) as u64 != s.brk {
        return Err(b"the break could not be put back");
    }
    let heap_end = s.brk.next_multiple_of(PAGE);
    let low = s.brk_low.next_multiple_of(PAGE);
    s.runs.clear();
    if low < heap_end {
        let mut reg = pagewise_sys::uffd::UffdioRegister {
            range: pagewise_sys::uffd::UffdioRange {
                start: low,
                len: heap_end - low,
            },
            mode: pagewise_sys::uffd::REGISTER_MODE_WP,
            ioctls: 0,
        };
        let r = sys(
            libc::SYS_ioctl,
            a3(
                s.uffd as u64,
                pagewise_sys::uffd::UFFDIO_REGISTER,
                &mut reg as *mut _ as u64,
            ),
        );
        if r != 0 {
            return Err(b"the heap given back could not be registered again");
        }
    }
    let given_back = (low < heap_end).then_some((low, heap_end));
    s.brk_low = s.brk;
    for &(a, n) in &s.made {
        sys(libc::SYS_munmap, [a, n, 0, 0, 0, 0]);
    }
    s.made.clear();
    let t1 = now_ns();
    // The pages written since the point.
    for k in 0..s.spans.len() {
        let (mut from, end) = s.spans[k];
        loop {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                start: from,
                end,
                vec: s.scan.as_mut_ptr() as u64,
                vec_len: s.scan.len() as u64,
                // WRITTEN alone: adding WPALLOWED (a mapping's category)
                // makes the kernel's walk 2.3x slower (41 against 18 µs over
                // 64 MiB here); every span is registered.
                category_mask: pagemap::category::WRITTEN,
                return_mask: pagemap::category::WRITTEN,
                ..Default::default()
            };
            let n = sys(
                libc::SYS_ioctl,
                a3(
                    s.pagemap as u64,
                    pagemap::PAGEMAP_SCAN,
                    &mut arg as *mut PmScanArg as u64,
                ),
            );
            if n < 0 {
                return Err(b"PAGEMAP_SCAN failed");
            }
            let n = n as usize;
            for r in &s.scan[..n] {
                if s.runs.len() == s.runs.capacity() {
                    return Err(b"too many runs of written pages");
                }
                s.runs.push((r.start, r.end));
            }
            match pagemap::next_scan_start(from, &arg, &s.scan[..n]) {
                Some(next) if n == s.scan.len() => from = next,
                _ => break,
            }
        }
    }
    let t2 = now_ns();
    let mut pages = 0u64;
    // Protected again, but the pages found written at the last reset too
    // (a stack, a C library's data: written by every run, they would cost
    // a protection and a fault each time); all of them every HOT_ROUNDS
    // resets, so that a page no longer written cools down.
    s.round += 1;
    if s.round.is_multiple_of(HOT_ROUNDS) {
        s.last.clear();
    }
    let mut j = 0;
    for i in 0..s.runs.len() {
        let (a, e) = s.runs[i];
        pages += (e - a) / PAGE;
        copy_back(s, a, e);
        // The parts of [a, e) not written at the last reset.
        let mut at = a;
        while at < e {
            while j < s.last.len() && s.last[j].1 <= at {
                j += 1;
            }
            let (hot_a, hot_e) = s.last.get(j).copied().unwrap_or((u64::MAX, u64::MAX));
            if hot_a <= at {
                at = hot_e.min(e);
                continue;
            }
            let end = hot_a.min(e);
            protect(s.uffd, at, end);
            at = end;
        }
    }
    if let Some((a, e)) = given_back {
        copy_back(s, a, e);
        protect(s.uffd, a, e);
        pages += (e - a) / PAGE;
    }
    std::mem::swap(&mut s.last, &mut s.runs);
    if s.crash_changed != 0 {
        catch_again(s.crash_changed);
        s.crash_changed = 0;
    }
    // Descriptors opened since closed; offsets back.
    for &(lo, hi) in &s.gaps {
        sys(libc::SYS_close_range, a3(lo as u64, hi as u64, 0));
    }
    for &(fd, pos) in &s.offsets {
        sys(libc::SYS_lseek, a3(fd as u64, pos, libc::SEEK_SET as u64));
    }
    // SAFETY: the frame of this SIGSYS becomes the point's: registers,
    // flags, mask and XSAVE area (the same size: the same process).
    unsafe {
        let uc = ctx as *mut libc::ucontext_t;
        (*uc).uc_mcontext.gregs = s.gregs;
        (*uc).uc_flags = s.uc_flags as _;
        std::ptr::write(&mut (*uc).uc_sigmask as *mut _ as *mut u64, s.sigmask);
        let fp = (*uc).uc_mcontext.fpregs as *mut u8;
        if fp_size(fp) == s.fp.len() {
            std::ptr::copy_nonoverlapping(s.fp.as_ptr(), fp, s.fp.len());
        } else {
            return Err(b"the XSAVE area changed size");
        }
    }
    let t3 = now_ns();
    b.walk_ns.fetch_add(t2 - t1, Ordering::Relaxed);
    b.copy_ns
        .fetch_add((t3 - t2) + (t1 - t0), Ordering::Relaxed);
    b.pages_dirty.fetch_add(pages, Ordering::Relaxed);
    Ok(())
}

/// How often every page written is protected again (see `reset`).
const HOT_ROUNDS: u64 = 64;

/// Write-protects `[a, e)` again (registered).
fn protect(uffd: i32, a: u64, e: u64) {
    let mut wp = pagewise_sys::uffd::UffdioWriteprotect {
        range: pagewise_sys::uffd::UffdioRange {
            start: a,
            len: e - a,
        },
        mode: pagewise_sys::uffd::WRITEPROTECT_MODE_WP,
    };
    sys(
        libc::SYS_ioctl,
        a3(
            uffd as u64,
            pagewise_sys::uffd::UFFDIO_WRITEPROTECT,
            &mut wp as *mut _ as u64,
        ),
    );
}

/// Copies `[a, e)` back from the point's copy; what lies outside every
/// mapping of the point (a stack grown since) is given back as zeros.
fn copy_back(s: &Inside, a: u64, e: u64) {
    let mut at = a;
    let mut i = s.regions.partition_point(|c| c.end <= at);
    while at < e {
        match s.regions.get(i) {
            Some(c) if c.start <= at => {
                let end = e.min(c.end);
                // SAFETY: `[at, end)` lies in a mapping of the point (still
                // mapped: unmapping it ends the program instead) and in its
                // copy.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        c.copy.add((at - c.start) as usize),
                        at as *mut u8,
                        (end - at) as usize,
                    )
                };
                at = end;
                i += 1;
            }
            next => {
                let end = next.map_or(e, |c| c.start.min(e));
                sys(
                    libc::SYS_madvise,
                    a3(at, end - at, libc::MADV_DONTNEED as u64),
                );
                at = end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mapping_keeps_what_lies_outside_the_shims_ranges() {
        let own = [(0x5000, 0x2000), (0x1000, 0x1000), (0x9000, 0x4000)];
        assert_eq!(
            super::outside(0x0, 0xa000, &own),
            vec![(0x0, 0x1000), (0x2000, 0x5000), (0x7000, 0x9000)]
        );
        assert_eq!(super::outside(0x2000, 0x3000, &own), vec![(0x2000, 0x3000)]);
        assert!(super::outside(0x5000, 0x7000, &own).is_empty());
    }
}
