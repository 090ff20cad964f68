//! `libpagewise_preload.so`: the LD_PRELOAD shim that runs pagewise inside an
//! unmodified program.
//!
//! Dirty tracking: when `PAGEWISE_TRACK_FD` names a socket inherited from
//! `pagewise track -- CMD`, the shim opens a `uffd-wp` tracker over the
//! program's writable anonymous memory and serves collections on a thread of
//! its own (see `pagewise::track::protocol`). It unsets the variable at once, so
//! programs that CMD starts in turn are not tracked. Without the variable the
//! shim does nothing.
//!
//! Far-memory emulation: when `PAGEWISE_FARMEM` names an instance (set by
//! `pagewise farmem run`), the shim starts far memory's in-process half
//! (`pagewise::farmem::in_process`), whose `SIGSYS` handler then serves the
//! calls its filter traps; the shim keeps only what a dispatcher of the
//! program's calls needs (`mask`, and `calls` on the inline path).
//!
//! Advice inside the program: when `PAGEWISE_ADVISE_FD` names a socket
//! inherited from pagewise (`pagewise dedup run -- CMD`), a thread of the
//! shim makes the `madvise` calls asked of it (see
//! `pagewise::shim::serve`), so that the program is never stopped for them.
//!
//! Pre-zeroed huge pages: when `PAGEWISE_PREZERO` is `AHEAD,RATE,FD` (set
//! by `pagewise thp prezero`), the shim starts the pre-zeroing thread
//! ([`pagewise::thp::prezero`]) for the program's life, and sends what it
//! did on socket FD as the program exits. The request is kept for the
//! program an `exec` puts in the same process, not for its children
//! (`PAGEWISE_PREZERO`).
//!
//! Resets inside the program: when `PAGEWISE_RESET` is set (by `pagewise
//! snapshot afl`), the shim serves AFL++'s fork server from inside the
//! program, each execution a reset to its first read of its input
//! (`pagewise::snap::process::inside`).
//!
//! The shim's own Rust code allocates from a heap of its own (`alloc`),
//! never from the program's `malloc`.

mod alloc;
#[cfg(target_arch = "x86_64")]
mod calls;
#[cfg(target_arch = "x86_64")]
mod mask;

#[global_allocator]
static ALLOC: alloc::ShimAlloc = alloc::ShimAlloc;

use pagewise::shim;
use pagewise::thp::prezero::PrezeroRequest;
use pagewise::track::{protocol, BackendKind, DirtyTracker};
use std::io::BufReader;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

/// The definition of `name` after the shim's (the C library's function an
/// interposed one forwards to), looked up once and kept in `cache`; 0 when
/// there is none.
fn forwarded(name: &std::ffi::CStr, cache: &std::sync::atomic::AtomicUsize) -> usize {
    use std::sync::atomic::Ordering;
    let mut f = cache.load(Ordering::Acquire);
    if f == 0 {
        f = pagewise_sys::dl::next_symbol(name).map_or(0, |p| p as usize);
        cache.store(f, Ordering::Release);
    }
    f
}

/// Tracking asked by `pagewise track -- CMD`: the tracker made and the
/// hello answered here, before the program's `main` (tracking covers the
/// program from its first write, and one that ends at once has been
/// tracked); collections are then served on a thread of the shim's.
fn track(sock: UnixStream, backend: BackendKind) {
    let tracker = DirtyTracker::for_self_anonymous(backend).map_err(|e| {
        eprintln!("pagewise shim: cannot track this process: {e}");
        e.errno()
    });
    let Ok(reader) = sock.try_clone() else { return };
    let mut writer = sock;
    // pagewise sends its hello as it starts the program: a bounded wait.
    let mut reader = BufReader::new(reader);
    let _ = writer.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    if !protocol::greet(&mut reader, &mut writer, &tracker, backend) {
        return;
    }
    let _ = writer.set_read_timeout(None);
    let served = SERVED.get_or_init(|| protocol::Served::new(tracker, Quiet(writer), backend));
    TRACK_PID.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
    // SAFETY: registers a function of no arguments that collects this
    // process's own memory and writes to a socket.
    unsafe { libc::atexit(last_collection) };
    let _ = pagewise_sys::signal::spawn_quiet("pagewise-track".into(), move || {
        if let Ok((start, len)) = pagewise_sys::mem::own_stack() {
            shim::note_own_memory(start, len as u64);
        }
        let _ = pagewise_sys::mem::name_own_stack(shim::OWN_THREAD_STACK);
        served.serve(&mut reader);
    });
}

/// The tracker served to `pagewise track`, shared with the exit handler.
static SERVED: std::sync::OnceLock<protocol::Served<Quiet>> = std::sync::OnceLock::new();

/// The shim's end of the tracking socket, written without SIGPIPE: a
/// pagewise that went away costs the program nothing.
struct Quiet(UnixStream);

impl std::io::Write for Quiet {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        pagewise_sys::process::send_all_nosignal(self.0.as_fd(), b)?;
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The process tracked: a child forked without `exec` inherits the exit
/// handler, and its exit is not the program's.
static TRACK_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// At the program's exit: its last collection, to pagewise.
extern "C" fn last_collection() {
    if TRACK_PID.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    if let Some(s) = SERVED.get() {
        s.last();
    }
}

/// The pre-zeroing thread of this program and the socket its report goes
/// to at exit.
static PREZERO: std::sync::OnceLock<(
    pagewise::thp::prezero::Prezeroer,
    std::sync::Mutex<Option<UnixStream>>,
)> = std::sync::OnceLock::new();

/// The process the report is of: a child forked without `exec` inherits
/// the exit handler, and its exit is not the program's.
static PREZERO_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn prezero(p: PrezeroRequest) {
    use pagewise::thp::prezero::{PrezeroOptions, Prezeroer};
    let mut opts = PrezeroOptions::default();
    if let Some(a) = p.ahead {
        opts.ahead = a;
    }
    if let Some(r) = p.rate {
        opts.rate = r;
    }
    let report = p.report.and_then(take_socket);
    match Prezeroer::start(opts) {
        // Runs for the life of the program.
        Ok(z) => {
            let with_report = report.is_some();
            if PREZERO.set((z, std::sync::Mutex::new(report))).is_ok() && with_report {
                PREZERO_PID.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
                // SAFETY: registers a function of no arguments that only
                // reads counters and writes to a socket.
                unsafe { libc::atexit(report_prezero) };
            }
        }
        Err(e) => eprintln!("pagewise shim: no pre-zeroing: {e}"),
    }
}

/// At the program's exit: what the pre-zeroing thread did, to pagewise.
/// A pagewise that went away costs the program nothing (no SIGPIPE).
extern "C" fn report_prezero() {
    use std::os::fd::AsFd;
    if PREZERO_PID.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    let Some((z, sock)) = PREZERO.get() else {
        return;
    };
    let Some(sock) = sock.lock().ok().and_then(|mut s| s.take()) else {
        return;
    };
    let _ = pagewise_sys::process::send_all_nosignal(sock.as_fd(), &z.stats().encode());
}

/// The socket pagewise passed as fd `fd`, taken (it is closed on exec, so
/// that programs CMD starts in turn do not inherit it).
fn take_socket(fd: i32) -> Option<UnixStream> {
    pagewise_sys::process::set_cloexec(fd).ok()?;
    // SAFETY: pagewise passed this fd for the shim alone (it is open:
    // FD_CLOEXEC was just set on it); we take ownership.
    Some(unsafe { UnixStream::from_raw_fd(fd) })
}

extern "C" fn pagewise_preload_init() {
    // What pagewise asked, read in one place (the contract's).
    match shim::contract_of_request() {
        Ok(true) => {}
        Ok(false) => return,
        Err(line) => {
            eprintln!("pagewise shim: {line}");
            // Nothing asked is done, and the program's children do not
            // inherit what was asked of it alone (its sockets, its
            // pre-zeroing): taking those parts removes their variables.
            let _ = shim::asked::<pagewise::track::TrackRequest>();
            let _ = shim::asked::<shim::AdviseRequest>();
            let _ = shim::asked::<PrezeroRequest>();
            return;
        }
    }
    // Each part as its owner types it; a part that cannot be read is not
    // done, and the shim says why.
    fn part<R: shim::Request>(what: &str) -> Option<R> {
        shim::asked::<R>().unwrap_or_else(|line| {
            eprintln!("pagewise shim: no {what}: {line}");
            None
        })
    }
    let farmem_req = part::<pagewise::farmem::FarmemRequest>("far-memory emulation");
    let prezero_req = part::<PrezeroRequest>("pre-zeroing");
    if let Some(p) = &prezero_req {
        p.keep_for_exec();
    }
    let advise_req = part::<shim::AdviseRequest>("advice");
    let track_req = part::<pagewise::track::TrackRequest>("tracking");
    let reset_req = part::<pagewise::snap::process::inside::ResetRequest>("resets");
    // The shim's heap (made by the first allocation, reading the request)
    // is its own, never the program's: no tracker or agent takes it for
    // the program's memory, even where mappings bear no names.
    if let Some((start, len)) = alloc::arena() {
        shim::note_own_memory(start, len);
    }
    // So is the shim's own zero-filled data (its .bss past the file's last
    // page, an anonymous mapping of its own right after the shim's last
    // writable page of its file): the tracker's and the agents' statics,
    // written as they work. Found from the shim's file, not from where one
    // static happens to lie: that one may sit in the file's last page.
    if let Ok(maps) = shim::maps(None) {
        let code = pagewise_preload_init as *const () as u64;
        let own = maps.iter().find(|m| m.start <= code && code < m.end);
        let data = own.and_then(|f| {
            maps.iter()
                .filter(|m| m.write && m.inode == f.inode && m.path == f.path)
                .max_by_key(|m| m.end)
        });
        if let Some(d) = data {
            for m in maps
                .iter()
                .filter(|m| m.start == d.end && m.write && m.is_anonymous())
            {
                shim::note_own_memory(m.start, m.len());
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = farmem_req {
        // Every C library function the shim forwards to is looked up now,
        // before any memory is served: a lookup walks the loader's tables,
        // and a thread serving faults that looked one up later would wait
        // on a fault only it can serve.
        calls::resolve_all();
        mask::resolve_all();
        let around_fork = pagewise::farmem::in_process::AroundFork::new(
            alloc::hold_for_fork,
            alloc::release_after_fork,
        );
        pagewise::farmem::in_process::init(f, around_fork);
    }
    if let Some(p) = prezero_req {
        prezero(p);
    }
    if let Some(sock) = advise_req.and_then(|a| take_socket(a.fd)) {
        // The advice thread's stack is named to the agent as the shim's
        // own (with its heap), never the program's.
        let _ = pagewise_sys::signal::spawn_quiet("pagewise-advise".into(), move || {
            if let Ok((start, len)) = pagewise_sys::mem::own_stack() {
                shim::note_own_memory(start, len as u64);
            }
            let _ = pagewise_sys::mem::name_own_stack(shim::OWN_THREAD_STACK);
            shim::serve(sock)
        });
    }
    if let Some(t) = track_req {
        if let Some(sock) = take_socket(t.fd) {
            track(sock, t.backend);
        }
    }
    // Last: resets take the point at the program's first read, after
    // everything else the shim set up.
    if let Some(r) = reset_req {
        pagewise::snap::process::inside::init(r);
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = pagewise_preload_init;
