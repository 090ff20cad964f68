//! The C library's signal-mask functions, interposed: a set the program
//! blocks loses the signals far memory needs unblocked
//! (`pagewise::farmem::in_process::never_blocked`: none unless far memory
//! runs), and the change is forwarded to the C library's own function.

use pagewise::farmem::in_process::never_blocked;
use std::sync::atomic::AtomicUsize;

type SigmaskFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;

/// The C library's signal-mask functions the interposed ones forward to.
const NAMES: [&std::ffi::CStr; 2] = [c"pthread_sigmask", c"sigprocmask"];

/// The functions of [`NAMES`], looked up at start-up ([`resolve_all`]).
static REAL: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// Looks up both functions now, before any memory is served.
pub fn resolve_all() {
    for (name, cache) in NAMES.iter().zip(&REAL) {
        crate::forwarded(name, cache);
    }
}

/// Forwards a signal-mask change to function `i` of [`NAMES`] with the
/// signals far memory needs left unblocked.
unsafe fn forward(
    i: usize,
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    let f = crate::forwarded(NAMES[i], &REAL[i]);
    if f == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: the next definition of this very function, same signature.
    let real: SigmaskFn = unsafe { std::mem::transmute::<usize, SigmaskFn>(f) };
    let never = never_blocked();
    if set.is_null() || how == libc::SIG_UNBLOCK || never == 0 {
        // SAFETY: the caller's own arguments.
        return unsafe { real(how, set, old) };
    }
    // SAFETY: `set` is the caller's valid sigset; we change a copy.
    let mut copy = unsafe { *set };
    // Only the signals set in `never` (one or two) are visited.
    let mut left = never;
    while left != 0 {
        let sig = left.trailing_zeros() as libc::c_int + 1;
        debug_assert_eq!(pagewise_sys::signal::bit(sig), left & left.wrapping_neg());
        pagewise_sys::signal::sigset_remove(&mut copy, sig);
        left &= left - 1;
    }
    // SAFETY: the caller's arguments, with the copy.
    unsafe { real(how, &copy, old) }
}

/// `pthread_sigmask(3)`, interposed: see [`forward`].
///
/// # Safety
/// As for `pthread_sigmask`.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SAFETY: forwarded as received.
    unsafe { forward(0, how, set, old) }
}

/// `sigprocmask(2)`, interposed: see [`forward`].
///
/// # Safety
/// As for `sigprocmask`.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SAFETY: forwarded as received.
    unsafe { forward(1, how, set, old) }
}
