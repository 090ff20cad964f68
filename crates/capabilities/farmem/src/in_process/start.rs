//! Starting emulation in the program (at start-up, and in a child after
//! fork), and the fork handlers that keep a child's memory whole.

use super::*;

/// The fault path asked for. Emulated thread stacks take the handler
/// thread: a fault on a thread's own stack cannot be served by a handler
/// that runs on that stack.
fn fault_path(req: &FarmemRequest) -> FaultPath {
    let asked = req.options.fault_path;
    if STACKS.load(Ordering::Relaxed) {
        FaultPath::Thread
    } else {
        asked
    }
}

/// What the shim does around a `fork` of the program, besides far
/// memory's own work: its heap's lock held across the fork (`before`) and
/// let go in the parent and in the child (`after`), so that the child's
/// heap is whole.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AroundFork {
    /// Called last before the fork.
    pub before: fn(),
    /// Called first after it, in the parent and in the child.
    pub after: fn(),
}

impl AroundFork {
    /// `before` called last before a fork, `after` first after it (in the
    /// parent and in the child).
    pub fn new(before: fn(), after: fn()) -> Self {
        AroundFork { before, after }
    }
}

static AROUND_FORK: std::sync::OnceLock<AroundFork> = std::sync::OnceLock::new();

/// Starts emulation in this process as `req` asks (the shim calls it once,
/// at start-up, having looked up every C library function it forwards to:
/// a lookup walks the loader's tables, and a thread serving faults that
/// looked one up later would wait on a fault only it can serve); on
/// failure the program runs without it, and says so.
pub fn init(req: FarmemRequest, around_fork: AroundFork) {
    let name = req.instance.clone();
    let _ = AROUND_FORK.set(around_fork);
    let req = REQUEST.get_or_init(|| req);
    if let Err(e) = start(req, false) {
        eprintln!("pagewise farmem: instance {name}: {e}; running without far-memory emulation");
        return;
    }
    // SAFETY: after_fork_child allocates only from the shim's own heap,
    // whose lock before_fork holds across the fork (so no other thread was
    // inside it), and takes RUNNING, which only the fork handlers and the
    // exit handler take; it touches none of the program's locks.
    let forks =
        unsafe { pagewise_sys::process::at_fork(before_fork, after_fork_parent, after_fork_child) };
    if let Err(e) = forks {
        eprintln!("pagewise farmem: instance {name}: pthread_atfork: {e}; a forked child would run without emulation");
    }
}

/// Before `fork`: every remote page comes back, so that the child's copy of
/// memory is complete (a remote page is not in the region, and the child
/// inherits no engine).
extern "C" fn before_fork() {
    if let Some(r) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        if let Err(e) = r.fm.pause() {
            eprintln!("pagewise farmem: before fork: {e}");
        }
    }
    if let Some(a) = AROUND_FORK.get() {
        (a.before)();
    }
}

extern "C" fn after_fork_parent() {
    if let Some(a) = AROUND_FORK.get() {
        (a.after)();
    }
    if let Some(r) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        if let Err(e) = r.fm.resume() {
            eprintln!("pagewise farmem: after fork: {e}");
        }
    }
}

/// In the child: the parent's engine is not here (its thread was not
/// copied) and its userfaultfd belongs to the parent. The child joins the
/// instance with an engine of its own; the memory it inherited stays shared
/// with the parent, what it maps from now on is emulated.
extern "C" fn after_fork_child() {
    if let Some(a) = AROUND_FORK.get() {
        (a.after)();
    }
    inline::after_fork_child();
    UFFD.store(-1, Ordering::Relaxed);
    if let Some(r) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).take() {
        // Its thread does not exist here: it must not be stopped or joined.
        std::mem::forget(r);
    }
    HEAD.store(0, Ordering::Relaxed);
    TAIL.store(0, Ordering::Relaxed);
    HANDLER_TID.store(0, Ordering::Relaxed);
    // Threads of the parent inside an mremap do not exist here.
    CHANGING.store(0, Ordering::Relaxed);
    let Some(req) = REQUEST.get() else {
        return;
    };
    let name = &req.instance;
    if let Err(e) = start(req, true) {
        eprintln!(
            "pagewise farmem: instance {name}, child {}: {e}; running without far-memory emulation",
            std::process::id()
        );
    }
}

/// The socket of the host's server of the instance, for a program in a
/// container (see `crate::serve`).
static SERVER: std::sync::OnceLock<(std::path::PathBuf, u32)> = std::sync::OnceLock::new();

/// A userfaultfd the kernel refused this process (a container's seccomp
/// profile refuses the call), made inside it by the host's server.
fn userfaultfd_from_server(flags: libc::c_int) -> std::io::Result<std::os::fd::OwnedFd> {
    let (path, owner) = SERVER
        .get()
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EPERM))?;
    let fd = crate::serve::userfaultfd_from(path, *owner, flags)?;
    // SAFETY: the server made this descriptor inside this process for this
    // request alone (checked to be a userfaultfd); nothing here knows its
    // number but this call.
    unsafe { pagewise_sys::process::adopt_fd(fd) }
}

/// What pagewise asked of the shim for far memory, kept for a child after
/// fork (which joins the same instance).
static REQUEST: std::sync::OnceLock<FarmemRequest> = std::sync::OnceLock::new();

/// Joins the instance `req` names and starts this process's engine over the
/// memory it has (none inherited, in a child after fork), then traps the
/// C library's memory calls. On failure the slot is left.
fn start(req: &FarmemRequest, child: bool) -> Result<(), String> {
    let inst = Arc::new(
        Instance::open(&req.instance, crate::instance::Access::Join).map_err(|e| e.to_string())?,
    );
    let tag = req.tag;
    // In a container, by its host pid, and its userfaultfds made by the
    // host's server (see `crate::serve`).
    let owner = inst.owner_uid();
    let (pid, contained) = match crate::serve::served_as(&req.instance, owner) {
        None => (std::process::id() as i32, false),
        Some(Err(e)) => return Err(e.to_string()),
        Some(Ok((path, host_pid))) => {
            let _ = SERVER.set((path, owner));
            pagewise_sys::uffd::set_maker(userfaultfd_from_server);
            (host_pid, true)
        }
    };
    // After an exec the process is a member already under its old image,
    // which never left: that slot is done.
    inst.leave_pid(pid);
    let slot = if contained {
        inst.join_from_container(pid, tag)
    } else {
        inst.join(pid, tag)
    }
    .map_err(|e| e.to_string())?;
    let fail = |e: String| {
        inst.leave(slot);
        e
    };
    let policy = policy_of(req, pid).map_err(fail)?;
    STACKS.store(req.options.stacks, Ordering::Relaxed);
    let maps = pagewise_mech::procfs::maps(None).map_err(|e| fail(e.to_string()))?;
    let libc_text = maps
        .iter()
        .find(|m| {
            m.exec
                && m.start <= libc::mmap as *const () as u64
                && (libc::mmap as *const () as u64) < m.end
        })
        .map(|m| (m.start, m.end))
        .ok_or_else(|| fail("cannot find the C library's code".into()))?;
    // Only what the program maps from now on is emulated. What exists
    // already is the loader's and the C library's (link maps, scope lists,
    // thread control blocks: every symbol lookup and thread start reads
    // them, the handler thread's too, which must never wait on a fault
    // only it can serve); in a child after fork, the parent's memory
    // (and copies of its handler's stack and staging), shared with it.
    let regions = vec![own_page().map_err(fail)?];
    let mut fm = engine(req, &inst, slot, &regions, policy).map_err(fail)?;
    let trace = req.options.trace.as_ref().map(|t| t.display().to_string());
    if trace.is_some() {
        fm.trace(1 << 22);
    }
    let waker = fm.waker().map_err(|e| fail(e.to_string()))?;
    WAKE.store(
        std::os::fd::IntoRawFd::into_raw_fd(std::os::fd::OwnedFd::from(waker)),
        Ordering::Relaxed,
    );
    UFFD.store(fm.uffd(), Ordering::Relaxed);
    let inline_path = fm.fault_path() == FaultPath::Inline;
    INLINE.store(inline_path, Ordering::Release);
    // A child inherits the filter and the handler.
    if !child {
        trap(libc_text, inline_path).map_err(fail)?;
    }
    ACTIVE.store(true, Ordering::Release);
    *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running {
        fm,
        inst,
        slot,
        trace,
    });
    if !child {
        // A child inherits it.
        let _ = pagewise_sys::process::at_exit(at_exit);
    }
    Ok(())
}

/// The eviction policy asked for: a built-in one, or a plugin (a path)
/// with its argument string.
fn policy_of(req: &FarmemRequest, pid: i32) -> Result<Box<dyn policy::Policy>, String> {
    let name = &req.options.policy;
    if name.contains('/') {
        let args = &req.options.policy_args;
        // SAFETY: the user named this plugin to be loaded into the program.
        let plugin = unsafe { policy::Plugin::load(name, args) }.map_err(|e| e.to_string())?;
        return Ok(Box::new(plugin));
    }
    policy::by_name(name, pid as u64).ok_or_else(|| {
        format!(
            "unknown policy {name:?} (built in: {})",
            policy::NAMES.join(", ")
        )
    })
}

/// A page of the engine's own to start from (an engine needs a region;
/// the program's memory joins it as the program maps it).
fn own_page() -> Result<Region, String> {
    let p = pagewise_sys::mem::mmap_anonymous(PAGE_SIZE).map_err(|e| e.to_string())?;
    Region::new(p as u64, PAGE_SIZE as u64).map_err(|e| e.to_string())
}

/// The engine over `regions` with the instance's budget, link and
/// calibration, tied to the shim (new regions from the ring, the member's
/// slot, the handler thread's id).
fn engine(
    req: &FarmemRequest,
    inst: &Arc<Instance>,
    slot: usize,
    regions: &[Region],
    policy: Box<dyn policy::Policy>,
) -> Result<FarMemory, String> {
    let s = inst.settings();
    let path = fault_path(req);
    let (floor_ns, unseen_ns) = inst.calibration(path);
    let config = Config::default()
        .local_pages(s.local_pages.max(1) as usize)
        .link(
            LinkConfig::default()
                .latency_ns(s.latency_ns)
                .bandwidth_bps(s.bandwidth_bps),
        );
    let hooks = Hooks::default()
        .discover(drain)
        .instance(inst.clone(), slot)
        .remapping(&CHANGING)
        .fault_path(path)
        .thread_floor(crate::instance::MIN_LOCAL_PAGES_THREAD as usize)
        .check_books(req.options.check)
        .on_start(|| {
            // SAFETY: gettid has no arguments and no side effect.
            let tid = unsafe { raw_syscall(libc::SYS_gettid, [0; 6]) };
            HANDLER_TID.store(tid as i32, Ordering::Release);
        });
    let calibration = Calibration::known(floor_ns, unseen_ns);
    FarMemory::new_with(regions, config, policy, calibration, hooks).map_err(|e| e.to_string())
}

/// Installs the SIGSYS handler and the seccomp filter that traps the C
/// library's memory calls (code in `libc_text`); on the inline path also
/// the calls whose memory it holds, and refuses those it cannot serve.
fn trap(libc_text: (u64, u64), inline_path: bool) -> Result<(), String> {
    // SAFETY: the handler makes the trapped call itself and registers
    // memory with ioctls: async-signal-safe, no allocation.
    unsafe { pagewise_sys::signal::install(libc::SIGSYS, on_sigsys) }
        .map_err(|e| format!("installing the SIGSYS handler: {e}"))?;
    let trapped = if inline_path {
        inline_trapped()
    } else {
        // The signal calls too: SIGSYS stays the shim's, unblocked.
        let mut v = seccomp::TRAPPED.to_vec();
        v.extend_from_slice(&[libc::SYS_rt_sigaction, libc::SYS_rt_sigprocmask]);
        v
    };
    let everywhere: &[libc::c_long] = if inline_path {
        syscalls::REFUSED_INLINE
    } else {
        &[]
    };
    // The program's own UFFDIO_REGISTER, to say once when the kernel
    // refuses it memory far memory holds (the inline path traps every
    // ioctl already).
    let register = [(
        libc::SYS_ioctl,
        1,
        pagewise_sys::uffd::UFFDIO_REGISTER as u32,
    )];
    let when: &[_] = if inline_path { &[] } else { &register };
    seccomp::trap_syscalls(libc_text.0, libc_text.1, &trapped, everywhere, when).map_err(|e| {
        format!(
            "installing the seccomp filter for {:#x}..{:#x}: {e}",
            libc_text.0, libc_text.1
        )
    })
}
