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
//! `pagewise farmem run`), the shim emulates far memory for the program's
//! anonymous memory (see `farmem`).
//!
//! Advice inside the program: when `PAGEWISE_ADVISE_FD` names a socket
//! inherited from pagewise (`pagewise dedup run -- CMD`), a thread of the
//! shim makes the `madvise` calls asked of it (see
//! `pagewise::mech::inject::shim`), so that the program is never stopped for them.
//!
//! Pre-zeroed huge pages: when `PAGEWISE_PREZERO` is `AHEAD,RATE` (set by
//! `pagewise thp prezero`), the shim starts the pre-zeroing thread
//! ([`pagewise::thp::prezero`]) for the program's life.
//!
//! The shim's own Rust code allocates from a heap of its own (`alloc`),
//! never from the program's `malloc`.

mod alloc;
#[cfg(target_arch = "x86_64")]
mod calls;
mod farmem;

#[global_allocator]
static ALLOC: alloc::ShimAlloc = alloc::ShimAlloc;

use pagewise::mech::shim::env;
use pagewise::track::{protocol, BackendKind, DirtyTracker};
use std::io::BufReader;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

fn serve(sock: UnixStream, backend: BackendKind) {
    let tracker = DirtyTracker::for_self_anonymous(backend).map_err(|e| {
        eprintln!("pagewise shim: cannot track this process: {e}");
        e.errno()
    });
    let Ok(reader) = sock.try_clone() else { return };
    let mut writer = sock;
    let tracker = protocol::serve(&mut BufReader::new(reader), &mut writer, tracker, backend);
    drop(tracker);
}

fn prezero(spec: &str) {
    use pagewise::thp::prezero::{PrezeroOptions, Prezeroer};
    let mut it = spec.split(',');
    let mut opts = PrezeroOptions::default();
    if let Some(a) = it.next().and_then(|a| a.parse().ok()) {
        opts.ahead = a;
    }
    if let Some(r) = it.next().and_then(|r| r.parse().ok()) {
        opts.rate = r;
    }
    match Prezeroer::start(opts) {
        // Runs for the life of the program.
        Ok(p) => std::mem::forget(p),
        Err(e) => eprintln!("pagewise shim: no pre-zeroing: {e}"),
    }
}

/// The socket pagewise passed in the variable `var`, taken (the variable is
/// removed, and programs that CMD starts in turn do not inherit it).
fn take_socket(var: &str) -> Option<UnixStream> {
    let fd = std::env::var(var).ok()?;
    std::env::remove_var(var);
    let fd = fd.parse::<i32>().ok()?;
    pagewise_sys::process::set_cloexec(fd).ok()?;
    // SAFETY: pagewise passed this fd for the shim alone (it is open:
    // FD_CLOEXEC was just set on it); we take ownership.
    Some(unsafe { UnixStream::from_raw_fd(fd) })
}

extern "C" fn pagewise_preload_init() {
    if let Ok(name) = std::env::var(env::FARMEM_INSTANCE) {
        farmem::init(name);
    }
    if let Ok(spec) = std::env::var(env::PREZERO) {
        std::env::remove_var(env::PREZERO);
        prezero(&spec);
    }
    if let Some(sock) = take_socket(env::ADVISE_FD) {
        // The shim's heap and the advice thread's stack are named to the
        // agent as the shim's own, never the program's.
        if let Some((start, len)) = alloc::arena() {
            pagewise::mech::inject::shim::note_own_memory(start, len);
        }
        let _ = std::thread::Builder::new()
            .name("pagewise-advise".into())
            .spawn(move || {
                if let Ok((start, len)) = pagewise_sys::mem::own_stack() {
                    pagewise::mech::inject::shim::note_own_memory(start, len as u64);
                }
                let _ = pagewise_sys::mem::name_own_stack(pagewise::mech::procfs::OWN_THREAD_STACK);
                pagewise::mech::inject::shim::serve(sock)
            });
    }
    let backend = std::env::var(env::TRACK_BACKEND)
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(BackendKind::UffdWp);
    std::env::remove_var(env::TRACK_BACKEND);
    if let Some(sock) = take_socket(env::TRACK_FD) {
        let _ = std::thread::Builder::new()
            .name("pagewise-track".into())
            .spawn(move || {
                let _ = pagewise_sys::mem::name_own_stack(pagewise::mech::procfs::OWN_THREAD_STACK);
                serve(sock, backend)
            });
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = pagewise_preload_init;
