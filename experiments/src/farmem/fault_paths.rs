//! What serving a fault costs on each path (experiment (f)): the handler
//! thread, the inline path (`UFFD_FEATURE_SIGBUS`), and the least any
//! user-space handler could cost here, beside a null system call.

use super::*;
use std::os::fd::AsFd;

/// The two ways a fault can reach the engine, measured raw (first touches
/// mapped with the zero page, no eviction, no delay).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FaultPaths {
    /// A first touch of plain memory, ns (the baseline).
    pub plain_ns: f64,
    /// Through the handler thread: the faulting thread sleeps until the
    /// handler maps the page, ns. Works for faults inside system calls.
    pub thread_ns: f64,
    /// In the faulting thread (`UFFD_FEATURE_SIGBUS`): a `SIGBUS` handler
    /// maps the page and the access is retried, ns. A fault inside a system
    /// call fails it with `EFAULT` instead.
    pub sigbus_ns: Option<f64>,
    /// The engine on the inline path (the same `SIGBUS`, with the engine's
    /// books and lock), ns.
    pub inline_ns: Option<f64>,
    /// One system call that does nothing (`getppid`), ns: the entry and
    /// exit every `ioctl` and the signal's return pay on this machine.
    pub syscall_ns: f64,
}

static SIGBUS_UFFD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn map_zero_on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as u64 & !(PAGE_SIZE as u64 - 1);
    // An ioctl is async-signal-safe; a failure leaves the fault to repeat.
    // SAFETY: a page of the measured mapping, registered with the
    // userfaultfd for this measure alone; nothing else reads it. The
    // userfaultfd is open while the handler is installed (the measure
    // closes it after putting the old handler back).
    let _ = unsafe {
        let fd = std::os::fd::BorrowedFd::borrow_raw(SIGBUS_UFFD.load(Ordering::Relaxed));
        uffd::zeropage(fd, addr, PAGE_SIZE as u64)
    };
}

/// Measures [`FaultPaths`] over `pages` first touches each.
pub fn measure_fault_paths(pages: usize) -> Result<FaultPaths> {
    let touch = |mem: &AnonMemory| {
        let t0 = Instant::now();
        for p in 0..mem.pages() {
            let _ = mem.read_byte(p * PAGE_SIZE);
        }
        t0.elapsed().as_nanos() as f64 / mem.pages() as f64
    };
    let plain_ns = touch(&AnonMemory::new(pages * PAGE_SIZE)?);
    let mem = AnonMemory::new(pages * PAGE_SIZE)?;
    let fm = pagewise_farmem::at_latency_zero(&mem, pages, FaultPath::Thread)?;
    let thread_ns = touch(&mem);
    fm.stop()?;
    let probe = pagewise_mech::probe::get();
    let (sigbus_ns, inline_ns) = if probe.uffd_has(uffd::feature::SIGBUS) {
        let raw = sigbus_path(pages, &touch)?;
        let mem = AnonMemory::new(pages * PAGE_SIZE)?;
        let fm = pagewise_farmem::at_latency_zero(&mem, pages, FaultPath::Inline)?;
        let inline = touch(&mem);
        fm.stop()?;
        (Some(raw), Some(inline))
    } else {
        (None, None)
    };
    Ok(FaultPaths {
        plain_ns,
        thread_ns,
        sigbus_ns,
        inline_ns,
        syscall_ns: null_syscall_ns(),
    })
}

/// The median over 5 runs of 100 000 `getppid` calls, ns per call.
fn null_syscall_ns() -> f64 {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..100_000 {
                // SAFETY: getppid takes no arguments and cannot fail.
                unsafe { libc::syscall(libc::SYS_getppid) };
            }
            t0.elapsed().as_nanos() as f64 / 100_000.0
        })
        .collect();
    crate::median(&mut runs)
}

/// What the least inline fault works on: the uffd, the two emulated
/// pages, their staging slots, which of the two is mapped, and how many
/// moves failed.
static LEAST_UFFD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static LEAST_MEM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LEAST_STAGE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LEAST_MAPPED: [std::sync::atomic::AtomicBool; 2] =
    [const { std::sync::atomic::AtomicBool::new(false) }; 2];
static LEAST_FAILED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Moves the other page out to staging (when mapped) and the faulting
/// page's data in: nothing but the two moves.
extern "C" fn evict_and_fetch_on_sigbus(
    _: libc::c_int,
    info: *mut libc::siginfo_t,
    _: *mut libc::c_void,
) {
    // SAFETY: the userfaultfd is open while the handler is installed (the
    // measure closes it after putting the old handler back).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(LEAST_UFFD.load(Ordering::Relaxed)) };
    let (mem, stage) = (
        LEAST_MEM.load(Ordering::Relaxed),
        LEAST_STAGE.load(Ordering::Relaxed),
    );
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as u64;
    let page = PAGE_SIZE as u64;
    let i = ((addr - mem) / page) as usize & 1;
    let v = i ^ 1;
    let off = |p: usize| p as u64 * page;
    // Only ioctls, which are async-signal-safe; a failure is counted (and
    // the fault repeats).
    if LEAST_MAPPED[v].load(Ordering::Relaxed) {
        // SAFETY: the measure's two pages and their staging, which only
        // this handler and the measuring loop touch.
        let moved = unsafe {
            uffd::move_pages(
                fd,
                stage + off(v),
                mem + off(v),
                page,
                uffd::MOVE_MODE_DONTWAKE,
            )
        };
        match moved {
            Ok(()) => LEAST_MAPPED[v].store(false, Ordering::Relaxed),
            Err(_) => {
                LEAST_FAILED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // SAFETY: as above.
    match unsafe { uffd::move_pages(fd, mem + off(i), stage + off(i), page, 0) } {
        Ok(()) => LEAST_MAPPED[i].store(true, Ordering::Relaxed),
        Err(_) => {
            LEAST_FAILED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Measures [`PathRun::least_ns`] on the floor's own pattern (see
/// `added_per_fault`): two pages with data, one local, written in turn, so
/// that every write faults, evicts the other page and fetches its own; ns
/// per fault beyond the same writes to plain memory.
pub(super) fn least_path(faults: usize) -> Result<f64> {
    let pages = 2;
    let touch = |mem: &AnonMemory| {
        let t0 = Instant::now();
        for i in 0..faults {
            mem.write_byte((i % 2) * PAGE_SIZE, i as u8);
        }
        t0.elapsed().as_nanos() as f64
    };
    let plain = AnonMemory::new(pages * PAGE_SIZE)?;
    let base = touch(&plain);
    let mem = AnonMemory::new(pages * PAGE_SIZE)?;
    let stage = AnonMemory::new(pages * PAGE_SIZE)?;
    for p in 0..pages {
        stage.fill_page(p, 1);
    }
    let fd = sigbus_uffd(uffd::feature::MOVE, &[&mem, &stage])?;
    LEAST_UFFD.store(fd.as_raw_fd(), Ordering::Relaxed);
    LEAST_MEM.store(mem.addr(), Ordering::Relaxed);
    LEAST_STAGE.store(stage.addr(), Ordering::Relaxed);
    for m in &LEAST_MAPPED {
        m.store(false, Ordering::Relaxed);
    }
    LEAST_FAILED.store(0, Ordering::Relaxed);
    // SAFETY: the handler only issues ioctls and touches atomics.
    let old = unsafe { pagewise_sys::signal::install(libc::SIGBUS, evict_and_fetch_on_sigbus) }
        .map_err(|e| Error::os("installing a SIGBUS handler", e))?;
    let t = touch(&mem);
    // The last write to each page, and the rest of it as staged.
    let last = |p: usize| (0..faults).rev().find(|i| i % 2 == p).map(|i| i as u8);
    let mut wrong = 0;
    for p in 0..pages {
        let mut page = [0u8; PAGE_SIZE];
        mem.read_page(p, &mut page);
        let want_first = last(p).unwrap_or(1);
        if page[0] != want_first || page[1..].iter().any(|&b| b != 1) {
            wrong += 1;
        }
    }
    // SAFETY: `old` is the action install returned.
    unsafe { pagewise_sys::signal::restore(libc::SIGBUS, &old) }
        .map_err(|e| Error::os("restoring the SIGBUS handler", e))?;
    LEAST_UFFD.store(-1, Ordering::Relaxed);
    for m in [&mem, &stage] {
        uffd::unregister(fd.as_fd(), m.addr(), m.len() as u64)
            .map_err(|e| Error::os("UFFDIO_UNREGISTER", e))?;
    }
    let failed = LEAST_FAILED.load(Ordering::Relaxed);
    if wrong > 0 || failed > 0 {
        return Err(crate::check_failed(format!(
            "the least inline fault: {wrong} pages read wrong, {failed} moves failed"
        )));
    }
    Ok((t - base) / faults as f64)
}

/// A userfaultfd raising `SIGBUS` (with `features` besides) on missing
/// pages of each of `mems`.
fn sigbus_uffd(features: u64, mems: &[&AnonMemory]) -> Result<std::os::fd::OwnedFd> {
    let (fd, _) = uffd::open(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(|e| {
        pagewise::Error::from(pagewise::MechError::Unsupported {
            feature: "userfaultfd",
            why: e.to_string(),
        })
    })?;
    uffd::api(fd.as_fd(), uffd::feature::SIGBUS | features)
        .map_err(|e| Error::os("UFFDIO_API(SIGBUS)", e))?;
    for m in mems {
        uffd::register(
            fd.as_fd(),
            m.addr(),
            m.len() as u64,
            uffd::REGISTER_MODE_MISSING,
        )
        .map_err(|e| Error::os("UFFDIO_REGISTER", e))?;
    }
    Ok(fd)
}

fn sigbus_path(pages: usize, touch: &dyn Fn(&AnonMemory) -> f64) -> Result<f64> {
    let mem = AnonMemory::new(pages * PAGE_SIZE)?;
    let fd = sigbus_uffd(0, &[&mem])?;
    SIGBUS_UFFD.store(fd.as_raw_fd(), Ordering::Relaxed);
    // SAFETY: the handler only issues an ioctl, which is async-signal-safe.
    let old = unsafe { pagewise_sys::signal::install(libc::SIGBUS, map_zero_on_sigbus) }
        .map_err(|e| Error::os("installing a SIGBUS handler", e))?;
    let ns = touch(&mem);
    // SAFETY: `old` is the action install returned.
    unsafe { pagewise_sys::signal::restore(libc::SIGBUS, &old) }
        .map_err(|e| Error::os("restoring the SIGBUS handler", e))?;
    SIGBUS_UFFD.store(-1, Ordering::Relaxed);
    uffd::unregister(fd.as_fd(), mem.addr(), mem.len() as u64)
        .map_err(|e| Error::os("UFFDIO_UNREGISTER", e))?;
    Ok(ns)
}
