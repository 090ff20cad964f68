//! Lazy restore of the caller's own regions from a durable store: the
//! regions are emptied and each page comes back from the store when first
//! touched (userfaultfd missing faults served by a thread of the library).

use super::*;

/// Start a lazy restore with no background fill: pages come in only when
/// touched, or at `pw_lazy_finish`.
pub const PW_LAZY_NO_BACKGROUND: u32 = 1;

/// Start a lazy restore with no staging: every page is read from the store
/// when it comes in, and no second copy is held meanwhile.
pub const PW_LAZY_NO_STAGING: u32 = 2;

/// A lazy restore in progress.
pub struct pw_lazy {
    inner: Option<pw::snap::LazyRestore>,
}

/// What a lazy restore did so far.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_lazy_stats {
    /// Pages of the snapshot.
    pub pages: u64,
    /// Zero pages among them (never read from the store).
    pub zero_pages: u64,
    /// First touches served.
    pub faults: u64,
    /// Pages copied from the store.
    pub copied: u64,
    /// Pages copied in the background.
    pub background: u64,
    /// Pages the program dropped or unmapped before they came in.
    pub dropped: u64,
    /// Nanoseconds from reading a fault to its page mapped: median.
    pub service_p50_ns: u64,
    /// Its 99th percentile.
    pub service_p99_ns: u64,
    /// 1 once every page is in (or was dropped), else 0.
    pub complete: u64,
    /// Nanoseconds from the start to completion (0 until complete).
    pub complete_ns: u64,
    /// Faults that found their page brought in already (several threads
    /// touching one page).
    pub already: u64,
    /// Nanoseconds from reading a fault to its page mapped: the largest.
    pub service_max_ns: u64,
    /// 1 if pages are staged ahead, else 0.
    pub staging: u64,
    /// Pages read from the store into staging so far.
    pub staged: u64,
    /// Pages of `copied` copied from staging (no store read on the way in).
    pub from_staging: u64,
    /// Faults answered from staging.
    pub faults_staged: u64,
}

fn stats_of(s: &pw::snap::LazyStats) -> pw_lazy_stats {
    pw_lazy_stats {
        pages: s.pages,
        zero_pages: s.zero_pages,
        faults: s.faults,
        copied: s.copied,
        background: s.background,
        dropped: s.dropped,
        service_p50_ns: s.service_p50_ns,
        service_p99_ns: s.service_p99_ns,
        complete: s.complete as u64,
        complete_ns: s.complete_ns.unwrap_or(0),
        already: s.already,
        service_max_ns: s.service_max_ns,
        staging: s.staging as u64,
        staged: s.staged,
        from_staging: s.from_staging,
        faults_staged: s.faults_staged,
    }
}

/// Empties `regions` (private anonymous and writable, each the size of
/// the snapshot's region at the same place of the list) and serves their
/// first touches from snapshot `id` of the store in directory `dir`.
/// `flags` is 0 or any of `PW_LAZY_NO_BACKGROUND` and `PW_LAZY_NO_STAGING`. No other thread may touch the
/// regions during this call; any may from its return on. -EINVAL for a
/// shape unlike the snapshot's, -ENOSYS where userfaultfd is missing.
///
/// # Safety
/// `dir` is a string; `regions` has `n` elements; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_lazy_start(
    dir: *const c_char,
    id: u64,
    regions: *const pw_region,
    n: usize,
    flags: u32,
    out: *mut *mut pw_lazy,
) -> c_int {
    call("pw_lazy_start", || {
        // SAFETY: the caller's contract.
        let dir = unsafe { str_of(dir, "dir") }?;
        // SAFETY: the caller's contract.
        let rs = unsafe { regions_of(regions, n) }?;
        if flags & !(PW_LAZY_NO_BACKGROUND | PW_LAZY_NO_STAGING) != 0 {
            return Err(invalid(format!("unknown flags {flags:#x}")));
        }
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let disk = DiskStore::open(OsStr::from_bytes(dir.to_bytes()))?;
        let opts = pw::snap::LazyOptions::default()
            .background(flags & PW_LAZY_NO_BACKGROUND == 0)
            .stage(flags & PW_LAZY_NO_STAGING == 0);
        let inner = pw::snap::LazyRestore::start(disk, id, &rs, opts)?;
        // SAFETY: the caller's contract.
        unsafe { give(out, pw_lazy { inner: Some(inner) }) }
    })
}

/// What the lazy restore did so far goes to `*stats`.
///
/// # Safety
/// `l` is a live handle; `stats` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_lazy_get_stats(l: *mut pw_lazy, stats: *mut pw_lazy_stats) -> c_int {
    call("pw_lazy_get_stats", || {
        // SAFETY: the caller's contract.
        let l = unsafe { obj(l, "lazy") }?;
        let Some(inner) = &l.inner else {
            return Err(invalid("the lazy restore is finished"));
        };
        // SAFETY: the caller's contract.
        unsafe { put(stats, stats_of(&inner.stats()), "stats") }
    })
}

/// Brings in every page not in yet, stops serving, writes what was done to
/// `*stats` (may be NULL) and frees the handle.
///
/// # Safety
/// `l` is a handle not freed yet; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_lazy_finish(l: *mut pw_lazy, stats: *mut pw_lazy_stats) -> c_int {
    call("pw_lazy_finish", || {
        if l.is_null() {
            return Err(invalid("lazy is NULL"));
        }
        // SAFETY: the caller's contract: a handle this library made, freed once.
        let mut h = unsafe { Box::from_raw(l) };
        let Some(inner) = h.inner.take() else {
            return Err(invalid("the lazy restore is finished"));
        };
        let st = inner.finish()?;
        if !stats.is_null() {
            // SAFETY: the caller's contract.
            unsafe { put(stats, stats_of(&st), "stats") }?;
        }
        Ok(())
    })
}
