//! Snapshots of the caller's regions over a page store: take, restore, read, diff, save.

use super::*;

/// Snapshots of `n` regions of the calling process, which must be mapped,
/// writable, page-aligned and must not overlap; `backend` (a `PW_BACKEND_*`
/// value) tracks what changes between snapshots, and `verify` non-zero
/// confirms digest matches by content. Tracking starts now.
///
/// The caller guarantees that no other thread writes the regions during
/// `pw_snapshots_take` and `pw_snapshots_restore` (a restore reports any such
/// write it sees in `foreign_writes`), and that nothing unmaps them while the
/// handle lives.
///
/// # Safety
/// `regions` points to `n` regions; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_new(
    regions: *const pw_region,
    n: usize,
    backend: u32,
    verify: c_int,
    out: *mut *mut pw_snapshots,
) -> c_int {
    call("pw_snapshots_new", || {
        // SAFETY: the caller's contract.
        let regions = unsafe { regions_of(regions, n) }?;
        let opts = SnapshotOptions::default()
            .verify(verify != 0)
            .backend(backend_of(backend)?);
        let s = pw_snapshots {
            inner: Snapshots::new(&regions, opts)?,
            last: Vec::new(),
        };
        // SAFETY: the caller's contract.
        unsafe { give(out, s) }
    })
}

/// Frees the snapshots and their pages (NULL is ignored).
///
/// # Safety
/// `s` is NULL or a handle not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_free(s: *mut pw_snapshots) {
    // SAFETY: the caller's contract: a handle this library made, freed once.
    unsafe { free_handle(s) }
}

/// The mechanism tracking changes (a `PW_BACKEND_*` value), or 0 for NULL.
///
/// # Safety
/// `s` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_backend(s: *const pw_snapshots) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { s.as_ref() }.map_or(0, |s| backend_number(s.inner.backend()))
}

/// Takes a snapshot and stores its id in `*id`. The first one reads every
/// populated page; later ones read only pages written since the last take or
/// restore.
///
/// # Safety
/// `s` is a live handle; `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_take(s: *mut pw_snapshots, id: *mut u64) -> c_int {
    call("pw_snapshots_take", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        if id.is_null() {
            return Err(invalid("id is NULL"));
        }
        let got = s.inner.take()?;
        // SAFETY: the caller's contract.
        unsafe { put(id, got, "id") }
    })
}

/// Puts the regions back, byte for byte, as snapshot `id` holds them, writing
/// only pages that differ. What it did goes to `*stats` (may be NULL).
///
/// # Safety
/// `s` is a live handle; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_restore(
    s: *mut pw_snapshots,
    id: u64,
    stats: *mut pw_restore_stats,
) -> c_int {
    call("pw_snapshots_restore", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        let r = s.inner.restore(id)?;
        // SAFETY: the caller's contract.
        unsafe {
            put_opt(
                stats,
                pw_restore_stats {
                    pages_dirty: r.pages_dirty,
                    pages_written: r.pages_written,
                    foreign_writes: r.foreign_writes,
                    elapsed_ns: r.elapsed_ns,
                },
            )
        };
        Ok(())
    })
}

/// Drops snapshot `id`; pages no other snapshot uses are freed.
///
/// # Safety
/// `s` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_drop(s: *mut pw_snapshots, id: u64) -> c_int {
    call("pw_snapshots_drop", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        s.inner.drop_snapshot(id)?;
        Ok(())
    })
}

fn info(i: &pw::snap::SnapshotInfo) -> pw_snapshot_info {
    pw_snapshot_info {
        id: i.id,
        pages: i.pages,
        zero_pages: i.zero_pages,
        pages_read: i.take.pages_read,
        pages_new: i.take.pages_new,
        elapsed_ns: i.take.elapsed_ns,
    }
}

/// Snapshot `id` in `*out`.
///
/// # Safety
/// `s` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_info(
    s: *mut pw_snapshots,
    id: u64,
    out: *mut pw_snapshot_info,
) -> c_int {
    call("pw_snapshots_info", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        let i = s.inner.info(id)?;
        // SAFETY: the caller's contract.
        unsafe { put(out, info(&i), "out") }
    })
}

/// The snapshots, oldest first: their number goes to `*n`, and the first
/// `min(*n, cap)` of them to `buf` (which may be NULL when `cap` is 0).
///
/// # Safety
/// `s` is a live handle; `buf` has room for `cap` entries; `n` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_list(
    s: *mut pw_snapshots,
    buf: *mut pw_snapshot_info,
    cap: usize,
    n: *mut usize,
) -> c_int {
    call("pw_snapshots_list", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        if cap > 0 && buf.is_null() {
            return Err(invalid("buf is NULL but cap is not 0"));
        }
        let all = s.inner.list();
        for (k, i) in all.iter().take(cap).enumerate() {
            // SAFETY: `k < cap` and `buf` has room for `cap` entries.
            unsafe { buf.add(k).write(info(i)) };
        }
        // SAFETY: the caller's contract.
        unsafe { put(n, all.len(), "n") }
    })
}

/// Reads `len` bytes at address `addr` as snapshot `id` holds them, across
/// page boundaries, into `buf`. The range must lie inside one region.
///
/// # Safety
/// `s` is a live handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_read(
    s: *mut pw_snapshots,
    id: u64,
    addr: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    call("pw_snapshots_read", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        if len == 0 {
            return Ok(());
        }
        if buf.is_null() {
            return Err(invalid("buf is NULL"));
        }
        // SAFETY: non-null and, by the caller's contract, `len` writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        s.inner.read(id, addr, out)?;
        Ok(())
    })
}

/// The ranges whose contents differ between snapshots `a` and `b`, in
/// `*ranges` (`*n` of them; the array belongs to the handle).
///
/// # Safety
/// `s` is a live handle; `ranges` and `n` are writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_diff(
    s: *mut pw_snapshots,
    a: u64,
    b: u64,
    ranges: *mut *const pw_range,
    n: *mut usize,
) -> c_int {
    call("pw_snapshots_diff", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        let d = s.inner.diff(a, b)?;
        // SAFETY: the caller's contract.
        unsafe { give_ranges(&mut s.last, &d, ranges, n) }
    })
}

/// The ranges whose live contents differ from snapshot `id`, like `pw_snapshots_diff`.
///
/// # Safety
/// `s` is a live handle; `ranges` and `n` are writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_diff_live(
    s: *mut pw_snapshots,
    id: u64,
    ranges: *mut *const pw_range,
    n: *mut usize,
) -> c_int {
    call("pw_snapshots_diff_live", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        let d = s.inner.diff_live(id)?;
        // SAFETY: the caller's contract.
        unsafe { give_ranges(&mut s.last, &d, ranges, n) }
    })
}

/// What the snapshots' shared page store holds, in `*stats`.
///
/// # Safety
/// `s` is a live handle; `stats` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_store_stats(
    s: *mut pw_snapshots,
    stats: *mut pw_store_stats,
) -> c_int {
    call("pw_snapshots_store_stats", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "snapshots") }?;
        // SAFETY: the caller's contract.
        unsafe { put(stats, store_stats(s.inner.store()), "stats") }
    })
}

/// Saves snapshot `id` into a durable store with a free-text `label` (may be
/// NULL); pages the store already has are not written again. What it wrote
/// goes to `*stats` (may be NULL); `stats->id` names it in the store.
///
/// # Safety
/// `s` and `d` are live handles; `label` is NULL or a string; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_save(
    s: *mut pw_snapshots,
    id: u64,
    d: *mut pw_disk,
    label: *const c_char,
    stats: *mut pw_save_stats,
) -> c_int {
    call("pw_snapshots_save", || {
        // SAFETY: the caller's contract.
        let (s, d) = unsafe { (obj(s, "snapshots")?, obj(d, "disk")?) };
        // SAFETY: the caller's contract.
        let label = unsafe { label_of(label) };
        let st = s.inner.save(id, &mut d.inner, &label)?;
        // SAFETY: the caller's contract.
        unsafe { put_opt(stats, save_stats(&st)) };
        Ok(())
    })
}

/// Loads snapshot `disk_id` of a durable store as a new snapshot (its id goes
/// to `*id`), to restore like any other. Its regions must have the sizes of
/// this handle's regions; their addresses may differ.
///
/// # Safety
/// `s` and `d` are live handles; `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_snapshots_load(
    s: *mut pw_snapshots,
    d: *mut pw_disk,
    disk_id: u64,
    id: *mut u64,
) -> c_int {
    call("pw_snapshots_load", || {
        // SAFETY: the caller's contract.
        let (s, d) = unsafe { (obj(s, "snapshots")?, obj(d, "disk")?) };
        if id.is_null() {
            return Err(invalid("id is NULL"));
        }
        let got = s.inner.load(&d.inner, disk_id)?;
        // SAFETY: the caller's contract.
        unsafe { put(id, got, "id") }
    })
}
