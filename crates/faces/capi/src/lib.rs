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

mod agent;
mod disk;
mod lazy;
mod live;
mod process;
mod snapshots;
mod store;
mod track;

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
    /// Bytes of the pack file (a part of `bytes_on_disk`).
    pub pack_bytes: u64,
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

/// What one rollback of another process did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_process_restore_stats {
    /// Pages written since the last take or restore.
    pub pages_dirty: u64,
    /// Pages written back.
    pub pages_written: u64,
    /// Calls made inside the process to put its mappings back.
    pub layout_calls: u64,
    /// Threads whose registers were put back (0 with `PW_RESTORE_MEMORY_ONLY`).
    pub threads: u64,
    /// Descriptors opened or closed since the snapshot (those opened since
    /// are closed inside the process unless `PW_RESTORE_KEEP_NEW_FDS`;
    /// files closed since opened again).
    pub fd_changes: u64,
    /// Wall time, nanoseconds.
    pub elapsed_ns: u64,
    /// Pages written during the restore by someone else.
    pub foreign_writes: u64,
}

/// Restore memory and layout only, not the threads' registers.
pub const PW_RESTORE_MEMORY_ONLY: u32 = 1;
/// Leave open the descriptors opened since the snapshot.
pub const PW_RESTORE_KEEP_NEW_FDS: u32 = 2;
/// Restore even where descriptors the snapshot had are gone for good
/// (they stay closed).
pub const PW_RESTORE_IGNORE_MISSING_FDS: u32 = 4;

/// Snapshots of another running process, put back in place.
pub struct pw_process {
    inner: pw::snap::ProcessSnapshots,
}

/// A reset session: a process held at one point, put back there at each
/// `pw_rollback_reset`.
pub struct pw_rollback {
    inner: pw::snap::ResetSession,
}

/// What one reset did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_rollback_stats {
    /// Pages written since the last reset.
    pub pages_dirty: u64,
    /// Pages written back.
    pub pages_written: u64,
    /// 1 where the whole path of a restore was taken (the layout, the
    /// descriptors or the threads changed), 0 for the quick path.
    pub full: u32,
    /// Wall time, nanoseconds.
    pub elapsed_ns: u64,
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

impl<E: pw::Failure> From<E> for Fail {
    fn from(e: E) -> Self {
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
