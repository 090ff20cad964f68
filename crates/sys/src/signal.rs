//! Installing signal handlers: `sigaction(2)`.

use std::io;

/// A handler taking `siginfo_t` (`SA_SIGINFO`).
pub type InfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Installs `handler` for `sig` with `SA_SIGINFO | SA_NODEFER` (and
/// `SA_RESTART`); returns the action it replaced, for [`restore`].
///
/// # Safety
/// `handler` must be async-signal-safe for every way `sig` can arrive.
pub unsafe fn install(sig: libc::c_int, handler: InfoHandler) -> io::Result<libc::sigaction> {
    // SAFETY: a zeroed sigaction is a valid starting point; the fields set
    // below make it a well-formed SA_SIGINFO action.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
    // SAFETY: `sa.sa_mask` is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    // SAFETY: a zeroed sigaction is valid storage for the old action.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid; the caller vouches for the handler.
    if unsafe { libc::sigaction(sig, &sa, &mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

/// Puts back an action [`install`] returned.
pub fn restore(sig: libc::c_int, old: &libc::sigaction) -> io::Result<()> {
    // SAFETY: `old` came from the kernel through `install`.
    if unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Restores the default action of `SIGPIPE` (Rust programs start with it
/// ignored): a command whose output is piped into `head` then ends quietly
/// when the reader goes away, as other Unix tools do, instead of failing
/// on the write.
pub fn default_sigpipe() -> io::Result<()> {
    // SAFETY: SIG_DFL is a valid disposition for SIGPIPE.
    if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
