//! Installing signal handlers: `sigaction(2)`.

use std::io;

/// A handler taking `siginfo_t` (`SA_SIGINFO`).
pub type InfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Installs `handler` for `sig` with `SA_SIGINFO | SA_NODEFER` (and
/// `SA_RESTART`); returns the action it replaced, for [`restore`].
///
/// # Safety
/// `handler` must be async-signal-safe for every way `sig` can arrive.
pub unsafe fn install(sig: libc::c_int, handler: InfoHandler) -> io::Result<libc::sigaction> {
    // SAFETY: a zeroed sigaction is valid storage for the old action.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: the caller keeps our contract; `old` is valid storage.
    unsafe { install_saving(sig, handler, &mut old) }?;
    Ok(old)
}

/// Like [`install`], with the kernel writing the replaced action straight
/// into `old`, in the same system call: a handler that forwards to the
/// previous action can never see the new handler installed before it.
///
/// # Safety
/// As [`install`]; and `old` is valid for writes and not read by the
/// handler while this call runs except as the kernel leaves it.
pub unsafe fn install_saving(
    sig: libc::c_int,
    handler: InfoHandler,
    old: *mut libc::sigaction,
) -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting point; the fields set
    // below make it a well-formed SA_SIGINFO action.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
    // SAFETY: `sa.sa_mask` is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    // SAFETY: `sa` is valid; the caller vouches for `old` and the handler.
    if unsafe { libc::sigaction(sig, &sa, old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts back an action [`install`] returned.
///
/// # Safety
/// `old` is an action the kernel returned (from [`install`]), whose handler
/// is still valid code.
pub unsafe fn restore(sig: libc::c_int, old: &libc::sigaction) -> io::Result<()> {
    // SAFETY: the caller vouches for `old`.
    if unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Resets `sig` to its default action (`SIG_DFL`).
pub fn reset_default(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: a zeroed sigaction with SIG_DFL is a valid action; no handler
    // of ours is involved.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    // SAFETY: `dfl` is a valid action and the old-action pointer may be null.
    if unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Restores the default action of `SIGPIPE` (Rust programs start with it
/// ignored): a command whose output is piped into `head` then ends quietly
/// when the reader goes away, as other Unix tools do, instead of failing
/// on the write.
pub fn default_sigpipe() -> io::Result<()> {
    // SAFETY: SIG_DFL is a valid disposition for SIGPIPE.
    if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ignores `SIGPIPE`: a write to a pipe without a reader fails with `EPIPE`
/// instead of ending the process (what the Rust runtime sets up).
pub fn ignore_sigpipe() -> io::Result<()> {
    // SAFETY: SIG_IGN is a valid disposition for SIGPIPE.
    if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `sig` is in `set`.
pub fn sigset_contains(set: &libc::sigset_t, sig: libc::c_int) -> bool {
    // SAFETY: `set` is a valid, initialised sigset_t; sigismember only reads it.
    unsafe { libc::sigismember(set, sig) == 1 }
}

/// Whether `tid` is a thread of this process: `tgkill` with signal 0,
/// which sends nothing and fails (`ESRCH`) for a thread of another thread
/// group. One system call, where reading `/proc/TID/status` costs tens of
/// microseconds.
pub fn is_own_thread(tid: libc::pid_t) -> bool {
    // SAFETY: signal 0 sends nothing; no memory is passed.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            tid as libc::c_long,
            0 as libc::c_long,
        ) == 0
    }
}

/// Raises `sig` in the calling thread (`tgkill` of itself; async-signal-safe).
pub fn raise_in_this_thread(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: tgkill with this process's and this thread's ids; no memory
    // is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            libc::gettid(),
            sig as libc::c_long,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Calls a signal handler the program installed, as the kernel would:
/// `handler` is its address, taking three arguments when `siginfo`
/// (`SA_SIGINFO`), one otherwise.
///
/// # Safety
///
/// `handler` must be the address of a handler of that kind, and the call
/// made where the kernel would make it (in a signal handler for `sig`, with
/// the `info` and `ctx` it was given).
pub unsafe fn call_handler(
    handler: usize,
    siginfo: bool,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    type Three = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
    type One = extern "C" fn(libc::c_int);
    if siginfo {
        // SAFETY: the caller says `handler` is an SA_SIGINFO handler.
        let f: Three = unsafe { std::mem::transmute::<usize, Three>(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the caller says `handler` is a one-argument handler.
        let f: One = unsafe { std::mem::transmute::<usize, One>(handler) };
        f(sig);
    }
}

/// Removes `sig` from `set`.
pub fn sigset_remove(set: &mut libc::sigset_t, sig: libc::c_int) {
    // SAFETY: `set` is a valid, initialised sigset_t.
    unsafe { libc::sigdelset(set, sig) };
}

/// The process's SIGINT/SIGTERM flag: true once one came. Held by a part
/// of the program that polls it and ends normally; while one is held, a
/// signal only sets the flag (see [`on_stop_otherwise`]).
pub struct StopFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl std::ops::Deref for StopFlag {
    type Target = std::sync::atomic::AtomicBool;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl StopFlag {
    /// Sleeps for `d`, or less if a stop comes (woken by the signals'
    /// thread, not by polling); whether one came.
    pub fn sleep(&self, d: std::time::Duration) -> bool {
        use std::sync::atomic::Ordering;
        let end = std::time::Instant::now() + d;
        let (lock, woken) = &WAKE;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        // The flag is set before the signals' thread takes the lock to
        // wake sleepers: seen here, or the wake-up comes after the wait.
        while !self.0.load(Ordering::SeqCst) {
            let now = std::time::Instant::now();
            if now >= end {
                return false;
            }
            g = woken
                .wait_timeout(g, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// The signal that set the flag (SIGINT or SIGTERM), once one came.
    pub fn signal(&self) -> Option<libc::c_int> {
        match LAST.load(std::sync::atomic::Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

impl Drop for StopFlag {
    fn drop(&mut self) {
        HOLDERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

static FLAG: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>> =
    std::sync::OnceLock::new();
static HOLDERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The first SIGINT or SIGTERM that came (0: none yet).
static LAST: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// Where [`StopFlag::sleep`] waits for the signals' thread.
static WAKE: (std::sync::Mutex<()>, std::sync::Condvar) =
    (std::sync::Mutex::new(()), std::sync::Condvar::new());
/// What a signal does while no [`StopFlag`] is held.
type Action = Box<dyn Fn(libc::c_int) + Send + Sync>;
static OTHERWISE: std::sync::OnceLock<Action> = std::sync::OnceLock::new();
/// The write end of the pipe the handler tells the signals' thread through.
static PIPE_W: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// SIGINT/SIGTERM handler: passes the signal's number to the signals'
/// thread through a pipe (`write` is async-signal-safe).
extern "C" fn on_stop_signal(sig: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let fd = PIPE_W.load(std::sync::atomic::Ordering::Relaxed);
    if fd >= 0 {
        let b = [sig as u8];
        // SAFETY: a one-byte buffer on the stack; errno is saved around it.
        unsafe {
            let e = *libc::__errno_location();
            libc::write(fd, b.as_ptr().cast(), 1);
            *libc::__errno_location() = e;
        }
    }
}

/// Catches SIGINT and SIGTERM (once) with a handler that wakes the one
/// thread that acts on them. A handler, not a blocked mask: a program this
/// process starts inherits no blocked signal (the mask survives `exec`, a
/// caught signal's action does not), and keeps its own SIGINT and SIGTERM.
fn take_stop_signals() -> io::Result<&'static std::sync::Arc<std::sync::atomic::AtomicBool>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = INIT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = FLAG.get() {
        return Ok(f);
    }
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    PIPE_W.store(fds[1], Ordering::Relaxed);
    let flag = FLAG.get_or_init(|| std::sync::Arc::new(AtomicBool::new(false)));
    let read_end = fds[0];
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut b = [0u8; 1];
            // SAFETY: reads one byte into `b`.
            let n = unsafe { libc::read(read_end, b.as_mut_ptr().cast(), 1) };
            if n == 1 {
                let _ =
                    LAST.compare_exchange(0, i32::from(b[0]), Ordering::SeqCst, Ordering::SeqCst);
                flag.store(true, Ordering::SeqCst);
                {
                    let _g = WAKE.0.lock().unwrap_or_else(|e| e.into_inner());
                    WAKE.1.notify_all();
                }
                if HOLDERS.load(Ordering::SeqCst) == 0 {
                    if let Some(f) = OTHERWISE.get() {
                        f(libc::c_int::from(b[0]));
                    }
                }
            } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            } else {
                return;
            }
        })?;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only writes one byte to a pipe.
        unsafe { install(sig, on_stop_signal) }?;
    }
    Ok(flag)
}

/// The SIGINT/SIGTERM flag (the signals are caught from now on): it turns
/// true when one comes. A program that puts system settings back when it
/// ends polls the flag and ends normally.
pub fn stop_flag() -> io::Result<StopFlag> {
    let flag = take_stop_signals()?;
    HOLDERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(StopFlag(flag.clone()))
}

/// What SIGINT or SIGTERM does while no [`StopFlag`] is held: `f(signal)`
/// runs on the signals' thread (it should put back what the program
/// changed and end the process, with 128 + the signal by convention).
pub fn on_stop_otherwise(f: impl Fn(libc::c_int) + Send + Sync + 'static) -> io::Result<()> {
    if OTHERWISE.set(Box::new(f)).is_err() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "an action for SIGINT and SIGTERM is set already",
        ));
    }
    take_stop_signals().map(|_| ())
}

/// The kernel's `struct sigaction` on x86-64 (`rt_sigaction(2)` takes this,
/// not the C library's layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelSigaction {
    /// The handler, `SIG_DFL` (0) or `SIG_IGN` (1).
    pub handler: usize,
    /// `SA_*` flags.
    pub flags: u64,
    /// The restorer the C library installs (`SA_RESTORER`).
    pub restorer: usize,
    /// Signals blocked while the handler runs (bit `n - 1` for signal `n`).
    pub mask: u64,
}
const _: () = assert!(std::mem::size_of::<KernelSigaction>() == 32);

/// `rt_sigaction(2)` without the C library (see [`crate::futex::syscall`]):
/// for a signal handler that must put back an action, and for a seccomp
/// trap that makes the program's own call. Returns `-errno` on failure.
///
/// # Safety
/// `act`, when given, is a valid action whose handler is valid code.
pub unsafe fn raw_sigaction(
    sig: libc::c_int,
    act: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> i64 {
    let a = act.map_or(0, |a| a as *const KernelSigaction as u64);
    let o = old.map_or(0, |o| o as *mut KernelSigaction as u64);
    // SAFETY: the caller vouches for `act`; `old` is valid storage.
    unsafe { crate::futex::syscall(libc::SYS_rt_sigaction, [sig as u64, a, o, 8, 0, 0]) }
}

/// `rt_sigprocmask(2)` on the kernel's 64-bit mask, without the C library.
/// Returns the mask before the call.
pub fn raw_sigmask(how: libc::c_int, set: Option<u64>) -> u64 {
    let mut old = 0u64;
    let s = set.unwrap_or(0);
    let sp = if set.is_some() {
        &s as *const u64 as u64
    } else {
        0
    };
    // SAFETY: both pointers are to 8-byte locals (or null).
    unsafe {
        crate::futex::syscall(
            libc::SYS_rt_sigprocmask,
            [how as u64, sp, &mut old as *mut u64 as u64, 8, 0, 0],
        )
    };
    old
}

/// The kernel mask bit of `sig`.
pub const fn bit(sig: libc::c_int) -> u64 {
    1u64 << (sig - 1)
}

/// The signals a thread of pagewise's never blocks: those the kernel sends
/// a thread for what it did itself (a fault, a trap, a seccomp `SIGSYS`,
/// `abort`), which kill the process when blocked, and the C library's own
/// two (32, cancellation; 33, `setuid` in every thread, which waits for
/// each thread to take it).
pub const NEVER_QUIETED: u64 = bit(libc::SIGSEGV)
    | bit(libc::SIGBUS)
    | bit(libc::SIGILL)
    | bit(libc::SIGFPE)
    | bit(libc::SIGTRAP)
    | bit(libc::SIGSYS)
    | bit(libc::SIGABRT)
    | bit(32)
    | bit(33);

/// Starts a thread named `name` that takes none of its process's
/// asynchronous signals (all but [`NEVER_QUIETED`] blocked from its first
/// instruction: the calling thread's mask is narrowed around the start,
/// which the new thread inherits, then put back).
///
/// Every thread pagewise runs inside a program (the shim's) is started so:
/// a signal sent to the program must reach the program's own threads. A
/// shell's handler run on a foreign thread while the shell waits in
/// `vfork` drops the signal (dash's `onsig` returns early when `vforked`),
/// so a `kill` of the program was lost.
pub fn spawn_quiet<F, T>(name: String, f: F) -> io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let old = raw_sigmask(libc::SIG_BLOCK, Some(!NEVER_QUIETED));
    let r = std::thread::Builder::new().name(name).spawn(f);
    raw_sigmask(libc::SIG_SETMASK, Some(old));
    r
}

/// Gives the calling thread the lowest share of a CPU (nice 19, its own
/// alone: on Linux a nice value is a thread's): work ahead of need, such as
/// staging, which must not take a CPU from the program it serves.
pub fn lowest_priority() -> io::Result<()> {
    // SAFETY: no pointer; gettid cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: plain values; `tid` is the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod stop_tests {
    /// A program started after the stop signals are taken inherits no
    /// blocked signal: it keeps its own SIGINT and SIGTERM.
    #[test]
    fn children_keep_their_stop_signals() {
        let flag = super::stop_flag().unwrap();
        let out = std::process::Command::new("grep")
            .args(["SigBlk", "/proc/self/status"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mask = u64::from_str_radix(text.split_whitespace().nth(1).unwrap(), 16).unwrap();
        for sig in [libc::SIGINT, libc::SIGTERM] {
            assert_eq!(
                mask & (1 << (sig - 1)),
                0,
                "signal {sig} blocked in the child: {text}"
            );
        }
        // Sleeping with no signal lasts its whole time.
        let t0 = std::time::Instant::now();
        assert!(!flag.sleep(std::time::Duration::from_millis(50)));
        assert!(t0.elapsed() >= std::time::Duration::from_millis(50));
        // A sleeper is woken by the signal, long before its time is up.
        let sleeper = std::thread::spawn(|| {
            let flag = super::stop_flag().unwrap();
            let t0 = std::time::Instant::now();
            (
                flag.sleep(std::time::Duration::from_secs(120)),
                t0.elapsed(),
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        // The flag turns true when one comes.
        // SAFETY: raising a signal this process now catches.
        unsafe { libc::raise(libc::SIGTERM) };
        let (woken, slept) = sleeper.join().unwrap();
        assert!(woken, "the sleep says a stop came");
        assert!(
            slept < std::time::Duration::from_secs(100),
            "woken by the signal, not by the end of its time ({slept:?})"
        );
        println!("ok   a 120 s sleep woken by SIGTERM after {slept:?}");
        let t0 = std::time::Instant::now();
        while !flag.load(std::sync::atomic::Ordering::SeqCst)
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            flag.load(std::sync::atomic::Ordering::SeqCst),
            "SIGTERM set the flag"
        );
    }
}
