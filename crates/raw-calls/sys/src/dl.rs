//! Loading shared objects at run time: `dlopen(3)`, `dlsym(3)`.

use std::ffi::{CStr, CString};
use std::io;

/// An open shared object; closed on drop.
#[derive(Debug)]
pub struct Library {
    handle: *mut libc::c_void,
}

// SAFETY: a dlopen handle may be used and closed from any thread.
unsafe impl Send for Library {}

fn last_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Library {
    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`.
    ///
    /// # Safety
    /// Loading runs the object's initialisers, arbitrary code.
    pub unsafe fn open(path: &str) -> io::Result<Self> {
        let c = CString::new(path).map_err(|_| io::Error::other("path holds a NUL byte"))?;
        // SAFETY: `c` is a valid C string; the caller accepts running the
        // object's initialisers.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(io::Error::other(last_error()));
        }
        Ok(Library { handle })
    }

    /// The address of symbol `name`.
    pub fn symbol(&self, name: &str) -> io::Result<*mut libc::c_void> {
        let c = CString::new(name).map_err(|_| io::Error::other("name holds a NUL byte"))?;
        // SAFETY: `handle` is open; `c` is a valid C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            return Err(io::Error::other(last_error()));
        }
        Ok(p)
    }
}

/// The next definition of `name` after the calling object's
/// (`dlsym(RTLD_NEXT, name)`): what an interposing function forwards to.
pub fn next_symbol(name: &CStr) -> Option<*mut libc::c_void> {
    // SAFETY: `name` is a valid C string; RTLD_NEXT is a valid handle.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: `handle` came from dlopen and is closed once.
        unsafe { libc::dlclose(self.handle) };
    }
}
