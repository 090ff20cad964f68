//! The dirty tracker: watch regions, collect what was written, per consumer.

use super::*;

/// Tracks writes to `n` regions of the calling process with `backend` (a
/// `PW_BACKEND_*` value). The regions must be mapped, page-aligned and must
/// not overlap. Writes from now on are reported to every consumer.
///
/// # Safety
/// `regions` points to `n` regions; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_tracker_new(
    regions: *const pw_region,
    n: usize,
    backend: u32,
    out: *mut *mut pw_tracker,
) -> c_int {
    call("pw_tracker_new", || {
        // SAFETY: the caller's contract.
        let regions = unsafe { regions_of(regions, n) }?;
        let inner = DirtyTracker::new(&regions, backend_of(backend)?)?;
        let t = pw_tracker {
            inner,
            consumers: vec![Some(DirtyTracker::DEFAULT)],
            last: Vec::new(),
        };
        // SAFETY: the caller's contract.
        unsafe { give(out, t) }
    })
}

/// Frees a tracker and stops tracking (NULL is ignored).
///
/// # Safety
/// `t` is NULL or a tracker not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_tracker_free(t: *mut pw_tracker) {
    // SAFETY: the caller's contract: a handle this library made, freed once.
    unsafe { free_handle(t) }
}

/// The mechanism a tracker uses (a `PW_BACKEND_*` value other than AUTO), or
/// 0 for a NULL tracker.
///
/// # Safety
/// `t` is NULL or a live tracker.
#[no_mangle]
pub unsafe extern "C" fn pw_tracker_backend(t: *const pw_tracker) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { t.as_ref() }.map_or(0, |t| backend_number(t.inner.backend()))
}

/// Adds a consumer, which sees every write from now on, and stores its number in `*consumer`.
///
/// # Safety
/// `t` is a live tracker; `consumer` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_tracker_add_consumer(t: *mut pw_tracker, consumer: *mut u32) -> c_int {
    call("pw_tracker_add_consumer", || {
        // SAFETY: the caller's contract.
        let t = unsafe { obj(t, "tracker") }?;
        if consumer.is_null() {
            return Err(invalid("consumer is NULL"));
        }
        let id = t.inner.add_consumer();
        t.consumers.push(Some(id));
        // SAFETY: the caller's contract.
        unsafe { put(consumer, (t.consumers.len() - 1) as u32, "consumer") }
    })
}

/// Removes a consumer; what it had not collected is dropped.
///
/// # Safety
/// `t` is a live tracker.
#[no_mangle]
pub unsafe extern "C" fn pw_tracker_remove_consumer(t: *mut pw_tracker, consumer: u32) -> c_int {
    call("pw_tracker_remove_consumer", || {
        // SAFETY: the caller's contract.
        let t = unsafe { obj(t, "tracker") }?;
        let slot = t
            .consumers
            .get_mut(consumer as usize)
            .filter(|c| c.is_some())
            .ok_or_else(|| not_found(format!("consumer {consumer} does not exist")))?;
        let id = slot.take().expect("checked above");
        t.inner.remove_consumer(id);
        Ok(())
    })
}

/// Every page written since `consumer`'s previous collection, as sorted,
/// coalesced ranges in `*ranges` (`*n` of them; the array belongs to the
/// tracker), and what the collection cost in `*stats` (may be NULL).
///
/// # Safety
/// `t` is a live tracker; `ranges` and `n` are writable; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_tracker_collect(
    t: *mut pw_tracker,
    consumer: u32,
    ranges: *mut *const pw_range,
    n: *mut usize,
    stats: *mut pw_collect_stats,
) -> c_int {
    call("pw_tracker_collect", || {
        // SAFETY: the caller's contract.
        let t = unsafe { obj(t, "tracker") }?;
        if ranges.is_null() || n.is_null() {
            return Err(invalid("ranges and n must not be NULL"));
        }
        let id = t
            .consumers
            .get(consumer as usize)
            .copied()
            .flatten()
            .ok_or_else(|| not_found(format!("consumer {consumer} does not exist")))?;
        let c = t.inner.collect_for(id)?;
        let s = &c.stats;
        // SAFETY: the caller's contract.
        unsafe {
            put_opt(
                stats,
                pw_collect_stats {
                    pages_scanned: s.pages_scanned,
                    pages_dirty: s.pages_dirty,
                    ranges: s.ranges,
                    elapsed_ns: s.elapsed_ns,
                    faults: s.faults,
                    pages_hashed: s.pages_hashed,
                },
            );
            give_ranges(&mut t.last, &c.ranges, ranges, n)
        }
    })
}
