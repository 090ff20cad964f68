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
//! anonymous memory (see [`farmem`]).
//!
//! The shim's own Rust code allocates from a heap of its own ([`alloc`]),
//! never from the program's `malloc`.

mod alloc;
mod farmem;

#[global_allocator]
static ALLOC: alloc::ShimAlloc = alloc::ShimAlloc;

use pagewise::track::{protocol, BackendKind, DirtyTracker};
use std::io::{BufReader, Read};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

fn serve(sock: UnixStream, backend: BackendKind) {
    let mut tracker = match DirtyTracker::for_self_anonymous(backend) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("pagewise shim: cannot track this process: {e}");
            None
        }
    };
    let mut reader = BufReader::new(sock.try_clone().expect("dup of the shim socket"));
    let mut writer = sock;
    let mut req = [0u8; 1];
    while reader.read_exact(&mut req).is_ok() {
        let ok = match req[0] {
            protocol::REQ_HELLO => match &tracker {
                Some(t) => protocol::write_hello(&mut writer, t.backend()).is_ok(),
                None => false,
            },
            protocol::REQ_COLLECT => {
                let Some(t) = tracker.as_mut() else { break };
                let r = t
                    .sync_process_mappings(None, false)
                    .and_then(|_| t.collect())
                    .map_err(|e| match e {
                        pagewise::Error::Os { source, .. } => {
                            source.raw_os_error().unwrap_or(libc::EIO)
                        }
                        _ => libc::EIO,
                    });
                protocol::write_collection(&mut writer, &r).is_ok()
            }
            _ => false,
        };
        if !ok {
            break;
        }
    }
    drop(tracker);
}

extern "C" fn pagewise_preload_init() {
    if let Ok(name) = std::env::var(farmem::ENV_INSTANCE) {
        farmem::init(name);
    }
    let Ok(fd) = std::env::var(protocol::ENV_FD) else {
        return;
    };
    let backend = std::env::var(protocol::ENV_BACKEND)
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(BackendKind::UffdWp);
    std::env::remove_var(protocol::ENV_FD);
    std::env::remove_var(protocol::ENV_BACKEND);
    let Ok(fd) = fd.parse::<i32>() else { return };
    // SAFETY: pagewise passed this fd for the shim alone; we take ownership and
    // mark it close-on-exec so that programs started by CMD do not inherit it.
    let sock = unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        UnixStream::from_raw_fd(fd)
    };
    let _ = std::thread::Builder::new()
        .name("pagewise-track".into())
        .spawn(move || serve(sock, backend));
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = pagewise_preload_init;
