//! The page store: each distinct page kept once, reference-counted.

use super::*;

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
