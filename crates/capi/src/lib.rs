//! The C API of pagewise: `libpagewise.so` and `include/pagewise.h`.
//!
//! The header is generated from this file by cbindgen; the test
//! `tests/header.rs` fails when the committed header is stale, and
//! `PAGEWISE_BLESS=1 cargo test -p pagewise-capi --test header` rewrites it.
//!
//! Conventions, which the header repeats for C users:
//! - A function that can fail returns `int`: 0 on success, a negative errno
//!   value on failure, the library's `Error::errno`: `-EINVAL` bad argument,
//!   `-ENOENT` no such snapshot or consumer, `-EOPNOTSUPP` a kernel feature
//!   is missing, `-ESRCH` no such process (or it exited), `-EPERM` not
//!   allowed on a process, `-EACCES` not allowed on a store, `-EBUSY` a store
//!   another process writes, `-EFAULT` nothing mapped there, `-ENOSPC` a
//!   fixed limit reached, `-EBADMSG` a corrupt store, or the errno of the
//!   failed system call.
//! - `pw_last_error()` gives the message of the calling thread's last failure.
//! - A handle is used by one thread at a time; different handles are independent.
//! - Arrays a function returns (`const pw_range **`) belong to the handle and
//!   stay valid until the next call that returns an array on the same handle,
//!   or until it is freed.
//! - A Rust panic never crosses into C: it becomes `-EIO` with its message.

#![allow(non_camel_case_types)]

use pw::snap::{DiskStore, PageStore, SnapshotOptions, Snapshots};
use pw::track::{BackendKind, ConsumerId, DirtyTracker};
use pw::{PageRange, Region};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Let the dirty tracker choose the best mechanism this kernel offers.
pub const PW_BACKEND_AUTO: u32 = 0;
/// Asynchronous userfaultfd write-protect with `PAGEMAP_SCAN` (Linux 6.7+).
pub const PW_BACKEND_UFFD_WP: u32 = 1;
/// Soft-dirty bits (kernels built with `CONFIG_MEM_SOFT_DIRTY`).
pub const PW_BACKEND_SOFT_DIRTY: u32 = 2;
/// `mprotect` and a `SIGSEGV` handler (every kernel; the program must not own `SIGSEGV`).
pub const PW_BACKEND_MPROTECT: u32 = 3;
/// Content fingerprints compared at each collection (every kernel, no faults).
pub const PW_BACKEND_HASH: u32 = 4;

// The C values are the library's wire values (cbindgen needs the literals).
const _: () = {
    use pw::track::BackendKind as B;
    assert!(PW_BACKEND_AUTO == B::Auto as u32);
    assert!(PW_BACKEND_UFFD_WP == B::UffdWp as u32);
    assert!(PW_BACKEND_SOFT_DIRTY == B::SoftDirty as u32);
    assert!(PW_BACKEND_MPROTECT == B::Mprotect as u32);
    assert!(PW_BACKEND_HASH == B::Hash as u32);
};

/// The version of `pw_policy_ops` (far-memory policy plugins) this library speaks.
pub const PW_POLICY_ABI_VERSION: u32 = 1;
const _: () = assert!(PW_POLICY_ABI_VERSION == pw::farmem::policy::POLICY_ABI_VERSION);

/// A far-memory replacement policy written in C, loaded at run time from a
/// shared object that exports `const pw_policy_ops *pw_policy_plugin(void)`.
/// pagewise calls it from its handler thread only, one call at a time; pages
/// are indices into the emulated memory. Example: `examples/policy_lifo.c`.
#[repr(C)]
pub struct pw_policy_ops {
    /// Must be `PW_POLICY_ABI_VERSION`.
    pub abi_version: u32,
    /// The policy's name (a static string).
    pub name: *const c_char,
    /// Makes the policy's state from an argument string (may be empty); NULL on failure.
    pub create: Option<unsafe extern "C" fn(args: *const c_char) -> *mut c_void>,
    /// Frees the state.
    pub destroy: Option<unsafe extern "C" fn(state: *mut c_void)>,
    /// Page `page` became local.
    pub inserted: Option<unsafe extern "C" fn(state: *mut c_void, page: u64)>,
    /// Page `page` stopped being local without being chosen.
    pub removed: Option<unsafe extern "C" fn(state: *mut c_void, page: u64)>,
    /// Chooses a local page to evict into `*page` and forgets it; returns 0,
    /// or -1 when it tracks no page.
    pub victim: Option<unsafe extern "C" fn(state: *mut c_void, page: *mut u64) -> c_int>,
}

// The header's struct is the library's `PolicyOps`, field for field.
const _: () = {
    use pw::farmem::policy::PolicyOps as L;
    use std::mem::{offset_of, size_of};
    type C = pw_policy_ops;
    assert!(size_of::<C>() == size_of::<L>());
    assert!(offset_of!(C, abi_version) == offset_of!(L, abi_version));
    assert!(offset_of!(C, name) == offset_of!(L, name));
    assert!(offset_of!(C, create) == offset_of!(L, create));
    assert!(offset_of!(C, destroy) == offset_of!(L, destroy));
    assert!(offset_of!(C, inserted) == offset_of!(L, inserted));
    assert!(offset_of!(C, removed) == offset_of!(L, removed));
    assert!(offset_of!(C, victim) == offset_of!(L, victim));
};

/// The default consumer of a tracker, which exists from `pw_tracker_new` on.
pub const PW_CONSUMER_DEFAULT: u32 = 0;

const BACKENDS: [(u32, BackendKind, &CStr); 5] = [
    (PW_BACKEND_AUTO, BackendKind::Auto, c"auto"),
    (PW_BACKEND_UFFD_WP, BackendKind::UffdWp, c"uffd-wp"),
    (PW_BACKEND_SOFT_DIRTY, BackendKind::SoftDirty, c"soft-dirty"),
    (PW_BACKEND_MPROTECT, BackendKind::Mprotect, c"mprotect"),
    (PW_BACKEND_HASH, BackendKind::Hash, c"hash"),
];

/// A range of memory: `len` bytes from `start`, both multiples of the page size.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct pw_region {
    /// Start address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// `pages` pages from `start`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct pw_range {
    /// First page's address.
    pub start: u64,
    /// Number of pages.
    pub pages: u64,
}

/// What one collection of dirty pages cost and found.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_collect_stats {
    /// Pages tracked.
    pub pages_scanned: u64,
    /// Pages reported written.
    pub pages_dirty: u64,
    /// Ranges reported.
    pub ranges: u64,
    /// Wall time, nanoseconds.
    pub elapsed_ns: u64,
    /// Write faults handled since the previous collection (`mprotect` only).
    pub faults: u64,
    /// Pages read to compute fingerprints (`hash` only).
    pub pages_hashed: u64,
}

/// What a page store holds.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_store_stats {
    /// Distinct non-zero pages stored.
    pub unique_pages: u64,
    /// References to stored pages.
    pub referenced_pages: u64,
    /// References to the zero page, which is never stored.
    pub zero_pages: u64,
    /// Bytes of page data kept.
    pub bytes_stored: u64,
    /// Bytes the references stand for, zero pages included.
    pub bytes_referenced: u64,
    /// `bytes_referenced - bytes_stored`.
    pub bytes_saved: u64,
    /// Digest matches whose contents differed (verify mode), kept apart.
    pub digest_collisions: u64,
}

/// One snapshot.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_snapshot_info {
    /// Its id.
    pub id: u64,
    /// Pages it covers.
    pub pages: u64,
    /// Zero pages among them.
    pub zero_pages: u64,
    /// Pages read and hashed to take it.
    pub pages_read: u64,
    /// Pages whose content was new to the store.
    pub pages_new: u64,
    /// Time to take it, nanoseconds.
    pub elapsed_ns: u64,
}

/// What one restore did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_restore_stats {
    /// Pages written since the last snapshot or restore.
    pub pages_dirty: u64,
    /// Pages written back.
    pub pages_written: u64,
    /// Pages another thread wrote during the restore (should be 0: see `pw_snapshots_new`).
    pub foreign_writes: u64,
    /// Wall time, nanoseconds.
    pub elapsed_ns: u64,
}

/// What saving one snapshot to a durable store wrote.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_save_stats {
    /// Id of the snapshot in the durable store.
    pub id: u64,
    /// Pages in it.
    pub pages: u64,
    /// Pages new to the store.
    pub pages_new: u64,
    /// Zero pages.
    pub zero_pages: u64,
    /// Bytes appended to the pack file.
    pub pack_bytes: u64,
    /// Bytes of the index file.
    pub index_bytes: u64,
}

/// What a durable store holds.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_disk_stats {
    /// Snapshots.
    pub snapshots: u64,
    /// Distinct non-zero pages.
    pub unique_pages: u64,
    /// Zero-page entries over all snapshots.
    pub zero_pages: u64,
    /// Non-zero page entries over all snapshots.
    pub referenced_pages: u64,
    /// Bytes of every file of the store.
    pub bytes_on_disk: u64,
    /// Bytes the snapshots stand for.
    pub bytes_represented: u64,
    /// `bytes_represented / bytes_on_disk`.
    pub dedup_ratio: f64,
}

/// A dirty-page tracker over regions of the calling process.
pub struct pw_tracker {
    inner: DirtyTracker,
    /// C consumer number -> consumer; `None` once removed.
    consumers: Vec<Option<ConsumerId>>,
    last: Vec<pw_range>,
}

/// A content-addressed, reference-counted store of pages in memory.
pub struct pw_store {
    inner: PageStore,
}

/// Snapshots of regions of the calling process, sharing one page store.
pub struct pw_snapshots {
    inner: Snapshots,
    last: Vec<pw_range>,
}

/// A durable snapshot store: a directory.
pub struct pw_disk {
    inner: DiskStore,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure on its way to C: an errno value and a message.
struct Fail {
    errno: c_int,
    msg: String,
}

impl From<pw::Error> for Fail {
    fn from(e: pw::Error) -> Self {
        let errno = e.errno();
        Fail {
            errno,
            msg: e.to_string(),
        }
    }
}

fn not_found(msg: impl Into<String>) -> Fail {
    Fail {
        errno: libc::ENOENT,
        msg: msg.into(),
    }
}

fn invalid(msg: impl Into<String>) -> Fail {
    Fail {
        errno: libc::EINVAL,
        msg: msg.into(),
    }
}

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs the body of API function `name`: 0, or a negative errno with the
/// message kept for `pw_last_error`.
fn call(name: &str, f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(fail)) => {
            set_error(format!("{name}: {}", fail.msg));
            -fail.errno
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_error(format!("{name}: internal error: {what}"));
            -libc::EIO
        }
    }
}

/// The object behind a handle.
///
/// # Safety
/// `p` is null or a live handle of type `T` that no other thread uses now.
unsafe fn obj<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Fail> {
    // SAFETY: by the caller's contract, a non-null `p` is a live, unaliased `T`.
    unsafe { p.as_mut() }.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// Writes `v` through an output pointer that must not be null.
///
/// # Safety
/// `p` is null or valid for writing a `T`.
unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<(), Fail> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: `p` is non-null and, by the caller's contract, writable.
    unsafe { p.write(v) };
    Ok(())
}

/// Writes `v` through an optional output pointer (null: not wanted).
///
/// # Safety
/// `p` is null or valid for writing a `T`.
unsafe fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: `p` is non-null and, by the caller's contract, writable.
        unsafe { p.write(v) };
    }
}

/// Hands a new handle to C through `out`.
///
/// # Safety
/// `out` is null or valid for writing a pointer.
unsafe fn give<T>(out: *mut *mut T, v: T) -> Result<(), Fail> {
    if out.is_null() {
        return Err(invalid("out is NULL"));
    }
    // SAFETY: the caller's contract; `out` is not null, so the box is not leaked.
    unsafe { put(out, Box::into_raw(Box::new(v)), "out") }
}

/// Frees a handle made by [`give`] (null is ignored).
///
/// # Safety
/// `p` is null or a handle from [`give`] that is not used again.
unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: by the caller's contract `p` came from `Box::into_raw` and is freed once.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// An optional label (NULL: empty).
///
/// # Safety
/// `label` is null or a NUL-terminated string.
unsafe fn label_of(label: *const c_char) -> String {
    if label.is_null() {
        return String::new();
    }
    // SAFETY: non-null and, by the caller's contract, NUL-terminated.
    unsafe { CStr::from_ptr(label) }
        .to_string_lossy()
        .into_owned()
}

/// The regions a caller passed.
///
/// # Safety
/// `regions` is valid for reading `n` elements (or `n` is 0).
unsafe fn regions_of(regions: *const pw_region, n: usize) -> Result<Vec<Region>, Fail> {
    if n == 0 {
        return Err(invalid("no regions given"));
    }
    if regions.is_null() {
        return Err(invalid("regions is NULL"));
    }
    // SAFETY: non-null and, by the caller's contract, `n` readable elements.
    let rs = unsafe { std::slice::from_raw_parts(regions, n) };
    rs.iter()
        .map(|r| Region::new(r.start, r.len).map_err(Fail::from))
        .collect()
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn str_of<'a>(s: *const c_char, what: &str) -> Result<&'a CStr, Fail> {
    if s.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null and, by the caller's contract, NUL-terminated.
    Ok(unsafe { CStr::from_ptr(s) })
}

fn backend_of(b: u32) -> Result<BackendKind, Fail> {
    BACKENDS
        .iter()
        .find(|x| x.0 == b)
        .map(|x| x.1)
        .ok_or_else(|| {
            invalid(format!(
                "unknown backend {b} (PW_BACKEND_AUTO is 0, PW_BACKEND_HASH is 4)"
            ))
        })
}

fn backend_number(k: BackendKind) -> u32 {
    BACKENDS.iter().find(|x| x.1 == k).map_or(0, |x| x.0)
}

/// Hands `ranges` to C through the handle's buffer.
///
/// # Safety
/// `out` and `n` are null or valid for writing.
unsafe fn give_ranges(
    buf: &mut Vec<pw_range>,
    ranges: &[PageRange],
    out: *mut *const pw_range,
    n: *mut usize,
) -> Result<(), Fail> {
    buf.clear();
    buf.extend(ranges.iter().map(|r| pw_range {
        start: r.start,
        pages: r.pages,
    }));
    // SAFETY: the caller's contract on `out` and `n`.
    unsafe {
        put(out, buf.as_ptr(), "ranges")?;
        put(n, buf.len(), "n")
    }
}

fn store_stats(s: &PageStore) -> pw_store_stats {
    let st = s.stats();
    pw_store_stats {
        unique_pages: st.unique_pages,
        referenced_pages: st.referenced_pages,
        zero_pages: st.zero_pages,
        bytes_stored: st.bytes_stored,
        bytes_referenced: st.bytes_referenced,
        bytes_saved: st.bytes_saved,
        digest_collisions: st.digest_collisions,
    }
}

fn save_stats(s: &pw::snap::SaveStats) -> pw_save_stats {
    pw_save_stats {
        id: s.id,
        pages: s.pages,
        pages_new: s.pages_new,
        zero_pages: s.zero_pages,
        pack_bytes: s.pack_bytes,
        index_bytes: s.index_bytes,
    }
}

// ---------------------------------------------------------------- general

/// The message of the calling thread's last failed call ("" if none). The
/// string stays valid until the thread's next failed call.
#[no_mangle]
pub extern "C" fn pw_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library's version, such as "0.1.0".
#[no_mangle]
pub extern "C" fn pw_version() -> *const c_char {
    static V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    V.as_ptr()
}

/// The size of a page, the unit of every region and range.
#[no_mangle]
pub extern "C" fn pw_page_size() -> usize {
    pw::PAGE_SIZE
}

/// The name of a `PW_BACKEND_*` value ("uffd-wp", ...), or NULL for an unknown one.
#[no_mangle]
pub extern "C" fn pw_backend_name(backend: u32) -> *const c_char {
    BACKENDS
        .iter()
        .find(|x| x.0 == backend)
        .map_or(std::ptr::null(), |x| x.2.as_ptr())
}

// ---------------------------------------------------------------- tracker

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

// ---------------------------------------------------------------- page store

/// A new, empty page store. With `verify` non-zero, every digest match is
/// confirmed by comparing contents (recommended).
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_store_new(verify: c_int, out: *mut *mut pw_store) -> c_int {
    call("pw_store_new", || {
        let s = pw_store {
            inner: PageStore::new(verify != 0),
        };
        // SAFETY: the caller's contract.
        unsafe { give(out, s) }
    })
}

/// Frees a store and every page in it (NULL is ignored).
///
/// # Safety
/// `s` is NULL or a store not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_store_free(s: *mut pw_store) {
    // SAFETY: the caller's contract: a handle this library made, freed once.
    unsafe { free_handle(s) }
}

/// Stores one page (`pw_page_size()` bytes at `page`) unless the store has
/// its content already, takes a reference on it and stores its id in `*id`.
/// The zero page is never stored: its id is 0.
///
/// # Safety
/// `s` is a live store; `page` is readable for one page; `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_store_intern(
    s: *mut pw_store,
    page: *const c_void,
    id: *mut u32,
) -> c_int {
    call("pw_store_intern", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "store") }?;
        if page.is_null() {
            return Err(invalid("page is NULL"));
        }
        // SAFETY: non-null and, by the caller's contract, one readable page.
        let bytes = unsafe { std::slice::from_raw_parts(page.cast::<u8>(), pw::PAGE_SIZE) };
        let got = s.inner.intern(bytes);
        // SAFETY: the caller's contract.
        unsafe { put(id, got.raw(), "id") }
    })
}

fn live(s: &pw_store, id: u32) -> Result<pw::snap::PageId, Fail> {
    s.inner
        .live_id(id)
        .ok_or_else(|| not_found(format!("page {id} is not in the store")))
}

/// The contents of page `id` in `*page` (`pw_page_size()` bytes, valid until
/// its last reference is dropped or the store is freed).
///
/// # Safety
/// `s` is a live store; `page` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_store_page(
    s: *mut pw_store,
    id: u32,
    page: *mut *const c_void,
) -> c_int {
    call("pw_store_page", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "store") }?;
        let p = live(s, id)?;
        let ptr = s.inner.page(p).as_ptr().cast::<c_void>();
        // SAFETY: the caller's contract.
        unsafe { put(page, ptr, "page") }
    })
}

/// The number of references held on page `id` in `*refs`.
///
/// # Safety
/// `s` is a live store; `refs` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_store_refs(s: *mut pw_store, id: u32, refs: *mut u64) -> c_int {
    call("pw_store_refs", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "store") }?;
        let p = live(s, id)?;
        let r = s.inner.refs(p);
        // SAFETY: the caller's contract.
        unsafe { put(refs, r, "refs") }
    })
}

/// Takes one more reference on page `id`.
///
/// # Safety
/// `s` is a live store.
#[no_mangle]
pub unsafe extern "C" fn pw_store_incref(s: *mut pw_store, id: u32) -> c_int {
    call("pw_store_incref", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "store") }?;
        let p = live(s, id)?;
        s.inner.incref(p);
        Ok(())
    })
}

/// Drops one reference on page `id`; the page is freed with its last one.
///
/// # Safety
/// `s` is a live store.
#[no_mangle]
pub unsafe extern "C" fn pw_store_decref(s: *mut pw_store, id: u32) -> c_int {
    call("pw_store_decref", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "store") }?;
        let p = live(s, id)?;
        if s.inner.refs(p) == 0 {
            return Err(invalid(format!("page {id} holds no reference")));
        }
        s.inner.decref(p);
        Ok(())
    })
}

/// What the store holds, in `*stats`.
///
/// # Safety
/// `s` is a live store; `stats` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_store_get_stats(s: *mut pw_store, stats: *mut pw_store_stats) -> c_int {
    call("pw_store_get_stats", || {
        // SAFETY: the caller's contract.
        let s = unsafe { obj(s, "store") }?;
        // SAFETY: the caller's contract.
        unsafe { put(stats, store_stats(&s.inner), "stats") }
    })
}

// ---------------------------------------------------------------- snapshots

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
        let opts = SnapshotOptions {
            verify: verify != 0,
            backend: backend_of(backend)?,
        };
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

// ---------------------------------------------------------------- durable store

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

// ---------------------------------------------------------------- live pre-copy

/// Compression on the wire to a receiver: LZ4 where it saves an eighth.
pub const PW_COMPRESS_AUTO: u32 = 0;
/// Raw pages on the wire (zero pages still sent as such).
pub const PW_COMPRESS_NONE: u32 = 1;
/// LZ4 for every chunk.
pub const PW_COMPRESS_LZ4: u32 = 2;

/// How live checkpoints proceed. All zero: the defaults (50 ms, 30 passes,
/// no throttling).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_live_options {
    /// The longest the writers may be stopped, ms (0: 50).
    pub max_downtime_ms: f64,
    /// Passes before the writers are stopped whatever is left (0: 30).
    pub max_passes: u32,
    /// Non-zero: slow the writers down when they write faster than pages
    /// are copied.
    pub throttle: c_int,
}

/// What one live checkpoint did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_live_report {
    /// The snapshot saved (its id in the store or the receiver's store).
    pub save: pw_save_stats,
    /// Passes while the writers ran.
    pub passes: u32,
    /// Non-zero when the rest fitted the budget before the passes ran out.
    pub converged: c_int,
    /// Pages copied while the writers were stopped.
    pub final_pages: u64,
    /// Bytes copied in all.
    pub bytes_copied: u64,
    /// How long the writers were stopped, ms.
    pub downtime_ms: f64,
    /// From the stop to the destination holding the whole copy, ms.
    pub handover_ms: f64,
    /// From the start to the writers running again, ms.
    pub copy_ms: f64,
    /// The whole checkpoint, ms.
    pub total_ms: f64,
}

/// Called with `stop` non-zero to stop every thread that writes the
/// regions (return once they are stopped), and with 0 to let them run.
pub type pw_pause_fn = Option<unsafe extern "C" fn(user: *mut c_void, stop: c_int)>;

enum LiveDest {
    None,
    Store(Box<pw::snap::live::StoreSeries<DiskStore>>),
    Receiver(Box<pw::snap::wire::Sender>),
}

/// Live checkpoints (pre-copy) of another process or of regions of the
/// calling process, to a store or a receiver (`pagewise receive`).
pub struct pw_live {
    inner: pw::snap::live::Checkpointer<Box<dyn pw::snap::live::Source>>,
    dest: LiveDest,
}

impl pw_live {
    fn new(src: Box<dyn pw::snap::live::Source>, opts: *const pw_live_options) -> pw_live {
        pw_live {
            inner: pw::snap::live::Checkpointer::new(src, live_options(opts)),
            dest: LiveDest::None,
        }
    }
}

/// The caller's pause callback and its argument.
struct CPause {
    f: unsafe extern "C" fn(*mut c_void, c_int),
    user: *mut c_void,
}

// SAFETY: the callback is called only from the thread that calls
// `pw_live_checkpoint` on the handle (the handle's thread), as the header
// says; the pointer is the caller's to share.
unsafe impl Send for CPause {}

fn live_options(opts: *const pw_live_options) -> pw::snap::live::LiveOptions {
    // SAFETY: NULL or a readable options struct, by the caller's contract.
    let o = unsafe { opts.as_ref() }.copied().unwrap_or_default();
    let d = pw::snap::live::LiveOptions::default();
    pw::snap::live::LiveOptions {
        max_downtime_ms: if o.max_downtime_ms > 0.0 {
            o.max_downtime_ms
        } else {
            d.max_downtime_ms
        },
        max_passes: if o.max_passes > 0 {
            o.max_passes as usize
        } else {
            d.max_passes
        },
        throttle: o.throttle != 0,
    }
}

/// Live checkpoints of another process `pid` (its writable memory, tracked
/// with uffd-wp from outside, stopped with ptrace for the last pass).
/// `opts` may be NULL. Set a destination before the first checkpoint.
///
/// # Safety
/// `opts` is NULL or readable; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_live_process(
    pid: i32,
    opts: *const pw_live_options,
    out: *mut *mut pw_live,
) -> c_int {
    call("pw_live_process", || {
        let src = pw::snap::live::ProcessSource::new(pid)?;
        // SAFETY: the caller's contract.
        unsafe { give(out, pw_live::new(Box::new(src), opts)) }
    })
}

/// Live checkpoints of `n` regions of the calling process (private,
/// writable, mapped while the handle lives), tracked with uffd-wp inside.
/// `pause(user, 1)` must stop every thread that writes them and return once
/// they are stopped; `pause(user, 0)` lets them run. It is called from the
/// thread that calls `pw_live_checkpoint`. `opts` may be NULL.
///
/// # Safety
/// `regions` holds `n` regions; `pause` is valid code until the handle is
/// freed; `opts` is NULL or readable; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_live_regions(
    regions: *const pw_region,
    n: usize,
    pause: pw_pause_fn,
    user: *mut c_void,
    opts: *const pw_live_options,
    out: *mut *mut pw_live,
) -> c_int {
    call("pw_live_regions", || {
        // SAFETY: the caller's contract.
        let rs = unsafe { regions_of(regions, n) }?;
        let f = pause.ok_or_else(|| invalid("pause is NULL"))?;
        let cp = CPause { f, user };
        let src = pw::snap::live::OwnRegions::new(&rs, move |stop| {
            let cp = &cp;
            // SAFETY: the caller vouches for the callback and its argument.
            unsafe { (cp.f)(cp.user, c_int::from(stop)) }
        })?;
        // SAFETY: the caller's contract.
        unsafe { give(out, pw_live::new(Box::new(src), opts)) }
    })
}

/// Saves the checkpoints into the durable store in directory `dir` (created
/// if missing; each snapshot after the first takes unchanged pages over from
/// the one before). Replaces any destination set before; the next
/// checkpoint copies everything.
///
/// # Safety
/// `l` is a live handle; `dir` is a string.
#[no_mangle]
pub unsafe extern "C" fn pw_live_to_store(
    l: *mut pw_live,
    dir: *const c_char,
    verify: c_int,
) -> c_int {
    call("pw_live_to_store", || {
        // SAFETY: the caller's contract.
        let (l, dir) = unsafe { (obj(l, "live")?, str_of(dir, "dir")?) };
        let store = DiskStore::create(OsStr::from_bytes(dir.to_bytes()), verify != 0)?;
        l.dest = LiveDest::Store(Box::new(pw::snap::live::StoreSeries::new(store)));
        l.inner.restart();
        Ok(())
    })
}

/// Streams the checkpoints to `pagewise receive` listening at `host_port`
/// ("HOST:PORT"), with compression `PW_COMPRESS_*`. Replaces any
/// destination set before; the next checkpoint copies everything.
///
/// # Safety
/// `l` is a live handle; `host_port` is a string.
#[no_mangle]
pub unsafe extern "C" fn pw_live_to_receiver(
    l: *mut pw_live,
    host_port: *const c_char,
    compression: u32,
) -> c_int {
    call("pw_live_to_receiver", || {
        // SAFETY: the caller's contract.
        let (l, addr) = unsafe { (obj(l, "live")?, str_of(host_port, "host_port")?) };
        let c = match compression {
            PW_COMPRESS_AUTO => pw::snap::wire::Compression::Auto,
            PW_COMPRESS_NONE => pw::snap::wire::Compression::None,
            PW_COMPRESS_LZ4 => pw::snap::wire::Compression::Lz4,
            other => return Err(invalid(format!("compression {other}: PW_COMPRESS_*"))),
        };
        let addr = addr
            .to_str()
            .map_err(|_| invalid("host_port is not UTF-8"))?;
        l.dest = LiveDest::Receiver(Box::new(pw::snap::wire::Sender::connect(addr, c)?));
        l.inner.restart();
        Ok(())
    })
}

/// Takes the next live checkpoint to the destination, labelled `label` (may
/// be NULL); what it did goes to `*report` (may be NULL). After the first,
/// a checkpoint starts from the pages written since the one before.
///
/// # Safety
/// `l` is a live handle; `label` is NULL or a string; `report` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_live_checkpoint(
    l: *mut pw_live,
    label: *const c_char,
    report: *mut pw_live_report,
) -> c_int {
    call("pw_live_checkpoint", || {
        // SAFETY: the caller's contract.
        let l = unsafe { obj(l, "live") }?;
        // SAFETY: the caller's contract.
        let label = unsafe { label_of(label) };
        let dest: &mut dyn pw::snap::live::Destination = match &mut l.dest {
            LiveDest::None => {
                return Err(invalid(
                    "no destination: call pw_live_to_store or pw_live_to_receiver first",
                ))
            }
            LiveDest::Store(s) => &mut **s,
            LiveDest::Receiver(r) => &mut **r,
        };
        let r = l.inner.checkpoint(dest, &label, &mut |_| {}, &mut || {})?;
        let c = pw_live_report {
            save: save_stats(&r.save),
            passes: r.passes.len() as u32,
            converged: c_int::from(r.converged),
            final_pages: r.final_pages,
            bytes_copied: r.bytes_copied,
            downtime_ms: r.downtime_ms,
            handover_ms: r.handover_ms,
            copy_ms: r.copy_ms,
            total_ms: r.total_ms,
        };
        // SAFETY: the caller's contract.
        unsafe { put_opt(report, c) };
        Ok(())
    })
}

/// Stops tracking and frees the handle (NULL is ignored): nothing stays
/// registered in the process; a receiver's connection is closed (a snapshot
/// it had not finished is discarded there).
///
/// # Safety
/// `l` is NULL or a handle not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_live_free(l: *mut pw_live) {
    // SAFETY: the caller's contract: a handle this library made, freed once.
    unsafe { free_handle(l) }
}
