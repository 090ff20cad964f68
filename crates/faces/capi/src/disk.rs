//! The durable store: snapshots on disk, listed, and taken of another process.

use super::*;

/// Opens the durable store in directory `dir` for writing, creating it if it
/// does not exist. With `verify` non-zero, digest matches are confirmed by content.
///
/// # Safety
/// `dir` is a string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_disk_create(
    dir: *const c_char,
    verify: c_int,
    out: *mut *mut pw_disk,
) -> c_int {
    call("pw_disk_create", || {
        // SAFETY: the caller's contract.
        let dir = unsafe { str_of(dir, "dir") }?;
        let inner = DiskStore::create(OsStr::from_bytes(dir.to_bytes()), verify != 0)?;
        // SAFETY: the caller's contract.
        unsafe { give(out, pw_disk { inner }) }
    })
}

/// Opens an existing durable store read-only.
///
/// # Safety
/// `dir` is a string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_disk_open(dir: *const c_char, out: *mut *mut pw_disk) -> c_int {
    call("pw_disk_open", || {
        // SAFETY: the caller's contract.
        let dir = unsafe { str_of(dir, "dir") }?;
        let inner = DiskStore::open(OsStr::from_bytes(dir.to_bytes()))?;
        // SAFETY: the caller's contract.
        unsafe { give(out, pw_disk { inner }) }
    })
}

/// Closes a durable store (NULL is ignored). Every save was already synced.
///
/// # Safety
/// `d` is NULL or a store not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_disk_free(d: *mut pw_disk) {
    // SAFETY: the caller's contract: a handle this library made, freed once.
    unsafe { free_handle(d) }
}

/// The ids of the store's snapshots, oldest first: their number goes to `*n`
/// and the first `min(*n, cap)` to `ids` (which may be NULL when `cap` is 0).
///
/// # Safety
/// `d` is a live store; `ids` has room for `cap` entries; `n` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_disk_list(
    d: *mut pw_disk,
    ids: *mut u64,
    cap: usize,
    n: *mut usize,
) -> c_int {
    call("pw_disk_list", || {
        // SAFETY: the caller's contract.
        let d = unsafe { obj(d, "disk") }?;
        if cap > 0 && ids.is_null() {
            return Err(invalid("ids is NULL but cap is not 0"));
        }
        let all = d.inner.ids()?;
        for (k, &id) in all.iter().take(cap).enumerate() {
            // SAFETY: `k < cap` and `ids` has room for `cap` entries.
            unsafe { ids.add(k).write(id) };
        }
        // SAFETY: the caller's contract.
        unsafe { put(n, all.len(), "n") }
    })
}

/// What the durable store holds, in `*stats`.
///
/// # Safety
/// `d` is a live store; `stats` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_disk_get_stats(d: *mut pw_disk, stats: *mut pw_disk_stats) -> c_int {
    call("pw_disk_get_stats", || {
        // SAFETY: the caller's contract.
        let d = unsafe { obj(d, "disk") }?;
        let s = d.inner.stats()?;
        let c = pw_disk_stats {
            snapshots: s.snapshots,
            unique_pages: s.unique_pages,
            zero_pages: s.zero_pages,
            referenced_pages: s.referenced_pages,
            bytes_on_disk: s.bytes_on_disk,
            bytes_represented: s.bytes_represented,
            dedup_ratio: s.dedup_ratio,
            pack_bytes: s.pack_bytes,
        };
        // SAFETY: the caller's contract.
        unsafe { put(stats, c, "stats") }
    })
}

/// Snapshots the writable memory of another process `pid` into the durable
/// store, stopping it (ptrace) for the copy and resuming it. What was
/// written goes to `*stats` (may be NULL).
///
/// # Safety
/// `d` is a live store; `label` is NULL or a string; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshot_process(
    pid: i32,
    d: *mut pw_disk,
    label: *const c_char,
    stats: *mut pw_save_stats,
) -> c_int {
    call("pw_snapshot_process", || {
        // SAFETY: the caller's contract.
        let d = unsafe { obj(d, "disk") }?;
        // SAFETY: the caller's contract.
        let label = unsafe { label_of(label) };
        let p = pw::snap::remote::snapshot_process(pid, &mut d.inner, &label)?;
        // SAFETY: the caller's contract.
        unsafe { put_opt(stats, save_stats(&p.save)) };
        Ok(())
    })
}
