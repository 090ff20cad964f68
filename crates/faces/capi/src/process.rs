//! Rollback of another running process: open a handle on it, take
//! snapshots, put any of them back in place, read them, drop them.

use super::*;

/// Opens a handle on process `pid` (which the caller may ptrace): its
/// private writable memory is tracked from outside from now on. What a
/// restore puts back: every page of every private writable mapping, the
/// layout (mappings and the program break) and every thread's registers,
/// signal mask and alternate signal stack. Not put back: file
/// descriptors, files, shared memory, pending signals.
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_process_open(pid: i32, out: *mut *mut pw_process) -> c_int {
    call("pw_process_open", || {
        let p = pw_process {
            inner: pw::snap::ProcessSnapshots::open(pid)?,
        };
        // SAFETY: the caller's contract.
        unsafe { give(out, p) }
    })
}

/// Frees the handle and its snapshots (NULL is ignored); nothing stays
/// registered in the process.
///
/// # Safety
/// `p` is NULL or a handle not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_process_free(p: *mut pw_process) {
    // SAFETY: the caller's contract: a handle this library made, freed once.
    unsafe { free_handle(p) }
}

/// Takes a snapshot of the process (stopped for the moment) and stores
/// its id in `*id`.
///
/// # Safety
/// `p` is a live handle; `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_process_take(p: *mut pw_process, id: *mut u64) -> c_int {
    call("pw_process_take", || {
        // SAFETY: the caller's contract.
        let p = unsafe { obj(p, "process") }?;
        if id.is_null() {
            return Err(invalid("id is NULL"));
        }
        let got = p.inner.take()?;
        // SAFETY: the caller's contract.
        unsafe { put(id, got, "id") }
    })
}

/// Puts snapshot `id` back into the process; `flags` is 0 or any of
/// `PW_RESTORE_MEMORY_ONLY`, `PW_RESTORE_KEEP_NEW_FDS` and
/// `PW_RESTORE_IGNORE_MISSING_FDS`. What it did goes to `*stats` (may be
/// NULL). Refused (-ESTALE) where threads were made or ended since the
/// snapshot, unless memory only, or where a descriptor the snapshot had is
/// gone for good, unless `PW_RESTORE_IGNORE_MISSING_FDS`; -EOPNOTSUPP where
/// nothing can be done inside the process and the restore is not memory
/// only.
///
/// # Safety
/// `p` is a live handle; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_process_restore(
    p: *mut pw_process,
    id: u64,
    flags: u32,
    stats: *mut pw_process_restore_stats,
) -> c_int {
    call("pw_process_restore", || {
        // SAFETY: the caller's contract.
        let p = unsafe { obj(p, "process") }?;
        let known =
            PW_RESTORE_MEMORY_ONLY | PW_RESTORE_KEEP_NEW_FDS | PW_RESTORE_IGNORE_MISSING_FDS;
        if flags & !known != 0 {
            return Err(invalid(format!("unknown flags {flags:#x}")));
        }
        let opts = pw::snap::RestoreOptions::default()
            .memory_only(flags & PW_RESTORE_MEMORY_ONLY != 0)
            .keep_new_fds(flags & PW_RESTORE_KEEP_NEW_FDS != 0)
            .ignore_missing_fds(flags & PW_RESTORE_IGNORE_MISSING_FDS != 0);
        let r = p.inner.restore(id, opts)?;
        // SAFETY: the caller's contract.
        unsafe {
            put_opt(
                stats,
                pw_process_restore_stats {
                    pages_dirty: r.stats.pages_dirty,
                    pages_written: r.stats.pages_written,
                    layout_calls: r.layout_calls,
                    threads: r.threads,
                    fd_changes: r.fd_changes.len() as u64,
                    elapsed_ns: r.stats.elapsed_ns,
                    foreign_writes: r.stats.foreign_writes,
                },
            )
        };
        Ok(())
    })
}

/// Reads `len` bytes at address `addr` of the process as snapshot `id`
/// holds them into `buf` (inside one mapping).
///
/// # Safety
/// `p` is a live handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn pw_process_read(
    p: *mut pw_process,
    id: u64,
    addr: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    call("pw_process_read", || {
        // SAFETY: the caller's contract.
        let p = unsafe { obj(p, "process") }?;
        if len == 0 {
            return Ok(());
        }
        if buf.is_null() {
            return Err(invalid("buf is NULL"));
        }
        // SAFETY: the caller's contract: `buf` is writable for `len` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
        p.inner.read(id, addr, out)?;
        Ok(())
    })
}

/// Drops snapshot `id`; pages no other snapshot uses are freed.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn pw_process_drop(p: *mut pw_process, id: u64) -> c_int {
    call("pw_process_drop", || {
        // SAFETY: the caller's contract.
        let p = unsafe { obj(p, "process") }?;
        p.inner.drop_snapshot(id)?;
        Ok(())
    })
}

/// Opens a reset session on process `pid` (which the caller may ptrace):
/// the process is held attached from now on and its point taken now.
/// Each `pw_rollback_reset` puts it back there: only the pages written
/// since, the registers of every thread, the offsets of its files; the
/// whole restore where its layout, descriptors or threads changed.
/// Signals sent to it between resets are handed over at the next reset or
/// `pw_rollback_pump`. -EOPNOTSUPP where nothing can be done inside the
/// process. The session must be used from the thread that opened it.
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_rollback_open(pid: i32, out: *mut *mut pw_rollback) -> c_int {
    call("pw_rollback_open", || {
        let r = pw_rollback {
            inner: pw::snap::ResetSession::open(pid)?,
        };
        // SAFETY: the caller's contract.
        unsafe { give(out, r) }
    })
}

/// Puts the process back at its point; what it did goes to `*stats` (may
/// be NULL). -ESTALE where threads were made or ended since the point.
///
/// # Safety
/// `r` is a live session; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_rollback_reset(
    r: *mut pw_rollback,
    stats: *mut pw_rollback_stats,
) -> c_int {
    call("pw_rollback_reset", || {
        // SAFETY: the caller's contract.
        let r = unsafe { obj(r, "rollback session") }?;
        let rep = r.inner.reset()?;
        // SAFETY: the caller's contract.
        unsafe {
            put_opt(
                stats,
                pw_rollback_stats {
                    pages_dirty: rep.pages_dirty,
                    pages_written: rep.pages_written,
                    full: rep.full.is_some() as u32,
                    elapsed_ns: rep.elapsed_ns,
                },
            )
        };
        Ok(())
    })
}

/// Hands over the signals sent to the process since it was let run;
/// returns how many (or -errno).
///
/// # Safety
/// `r` is a live session.
#[no_mangle]
pub unsafe extern "C" fn pw_rollback_pump(r: *mut pw_rollback) -> c_int {
    let mut n = 0;
    let rc = call("pw_rollback_pump", || {
        // SAFETY: the caller's contract.
        let r = unsafe { obj(r, "rollback session") }?;
        n = r.inner.hand_over_signals()?;
        Ok(())
    });
    if rc < 0 {
        rc
    } else {
        c_int::try_from(n).unwrap_or(c_int::MAX)
    }
}

/// Ends the session (NULL is ignored): the process is let go, running,
/// with nothing left registered.
///
/// # Safety
/// `r` is NULL or a session not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_rollback_free(r: *mut pw_rollback) {
    // SAFETY: the caller's contract: a session this library made, freed once.
    unsafe { free_handle(r) }
}
