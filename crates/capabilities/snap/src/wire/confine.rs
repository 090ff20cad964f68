//! The calls a thread serving one migration connection needs
//! ([`Receiver::confine_thread`]): the connection's socket (read, write,
//! its options, shutdown), the store's files (open, write, sync, rename,
//! lock, read back), memory and the thread's own housekeeping (futexes,
//! signal masks, a progress thread of its own). Not among them: starting
//! a program, tracing or reading another process, making, connecting or
//! listening on a socket, changing who the process is or what it may
//! do. A peer that took such a thread over could write the store it
//! writes anyway, and nothing else.

use super::Receiver;

/// See the module: beyond [`pagewise_sys::seccomp::THREAD_CALLS`].
const OWN_CALLS: &[libc::c_long] = &[
    // The connection.
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getpeername,
    libc::SYS_getsockname,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    // The store.
    libc::SYS_openat,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_flock,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_rmdir,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_access,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
];

impl Receiver {
    /// Confines the calling thread, and the threads it starts from then
    /// on, to the calls serving a connection needs (see the module): any
    /// other is refused with `EPERM`. For the thread that calls
    /// [`serve`](Self::serve) with a peer's connection; the process's
    /// other threads are not under it. `Ok(false)`: left unconfined, on
    /// an architecture the filter is not written for (see
    /// `pagewise_sys::seccomp::confine_thread`).
    pub fn confine_thread() -> std::io::Result<bool> {
        pagewise_sys::seccomp::confine_thread(
            &[pagewise_sys::seccomp::THREAD_CALLS, OWN_CALLS].concat(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread under the filter cannot start a program, make a socket or
    /// read another process; it still writes, syncs and renames a file
    /// and starts a thread.
    #[test]
    fn a_confined_thread_is_refused_what_serving_does_not_need() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let dir = std::env::temp_dir().join(format!("pagewise-confine-{}", std::process::id()));
        let got = std::thread::spawn(move || {
            Receiver::confine_thread().unwrap();
            let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
            let socket = errno(std::net::TcpListener::bind("127.0.0.1:0").map(drop));
            let exec = errno(std::process::Command::new("/bin/true").status().map(drop));
            let mut b = [0u8; 8];
            let vm = errno(pagewise_sys::process::process_vm_read(1, 4096, &mut b).map(drop));
            std::fs::create_dir_all(&dir).unwrap();
            let f = dir.join("f");
            std::fs::write(&f, b"kept").unwrap();
            std::fs::File::open(&f).unwrap().sync_all().unwrap();
            std::fs::rename(&f, dir.join("g")).unwrap();
            let back = std::fs::read(dir.join("g")).unwrap();
            let child = std::thread::spawn(|| 7).join().unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            (socket, exec, vm, back, child)
        })
        .join()
        .unwrap();
        let eperm = Some(libc::EPERM);
        assert_eq!(
            (got.0, got.1, got.2),
            (eperm, eperm, eperm),
            "socket, execve, process_vm_readv"
        );
        assert_eq!(got.3, b"kept", "the store's calls pass");
        assert_eq!(got.4, 7, "a thread of its own starts");
        assert!(
            std::net::TcpListener::bind("127.0.0.1:0").is_ok(),
            "this thread is free"
        );
    }
}
