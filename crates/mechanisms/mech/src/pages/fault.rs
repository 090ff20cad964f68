//! Serving page faults with userfaultfd: the parts every fault server needs,
//! so that far memory (`pagewise::farmem`) and lazy restore
//! (`pagewise::snap::lazy`) stand on one set.
//!
//! * [`open`]: a non-blocking userfaultfd with the features asked for, or
//!   [`Error::Unsupported`] naming what the kernel refused.
//! * [`read`] then [`wait`]: messages first, and a `poll` (one more system
//!   call) only when none is waiting; a wake-up pipe lets another thread
//!   interrupt the wait (to stop the server, or to hand it work).
//! * [`fill`] and [`zero`]: resolve a missing page by copying a page into
//!   it (`UFFDIO_COPY`) or by mapping the zero page (`UFFDIO_ZEROPAGE`).
//!   The two races a server meets are answered here once: a page already
//!   there (`EEXIST`: another fill won, or the program wrote it) wakes the
//!   threads waiting on it and counts as done; a mapping changing under an
//!   event not read yet (`EAGAIN`, see [`retry_after_events`]) is given back, for the
//!   server to read its events and try again. Both are `unsafe`: the
//!   kernel writes the page, which may be the caller's own memory.

use crate::{Error, Result, PAGE_SIZE};
use pagewise_sys::uffd;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Opens a non-blocking userfaultfd (close-on-exec) and enables `features`.
/// Non-blocking, because `poll` may report a message another wake-up
/// consumed.
pub fn open(features: u64) -> Result<OwnedFd> {
    let (fd, _) =
        uffd::open(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(|e| Error::Unsupported {
            feature: "userfaultfd",
            why: format!("{e}{}", refused_hint(&e)),
        })?;
    uffd::api(fd.as_fd(), features).map_err(|e| Error::Unsupported {
        feature: "userfaultfd features",
        why: format!("UFFDIO_API with features {features:#x}: {e}"),
    })?;
    Ok(fd)
}

/// Why a userfaultfd that serves the kernel's faults too was refused, where
/// it can be told: this process's seccomp filter (a container's profile
/// answers `userfaultfd` with `EPERM`), told apart by a user-mode-only
/// userfaultfd, which no privilege is needed for, being refused too; else
/// the machine's setting (a server of missing pages needs the kernel's
/// faults too, since a system call reading the memory faults in the
/// kernel, and unprivileged users get only user-mode faults when
/// `vm.unprivileged_userfaultfd` is 0).
fn refused_hint(e: &std::io::Error) -> String {
    if !matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) {
        return String::new();
    }
    let own = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let filters = crate::procfs::status_field(&own, "Seccomp_filters").unwrap_or(0);
    if filters > 0 {
        let user_mode = uffd::open(libc::O_CLOEXEC | uffd::UFFD_USER_MODE_ONLY);
        if user_mode.is_err() {
            return format!(
                " (this process runs under {filters} seccomp filter(s) that refuse the userfaultfd \
                 call, as a container runtime's default profile does: the profile must allow it, \
                 or, for far memory, a `pagewise farmem serve` on the host must make it in the \
                 program)"
            );
        }
    }
    match crate::procfs::read_trimmed("/proc/sys/vm/unprivileged_userfaultfd").as_deref() {
        Ok("0") if e.raw_os_error() == Some(libc::EPERM) => {
            " (vm.unprivileged_userfaultfd is 0: \
            serving faults the kernel takes too needs root or CAP_SYS_PTRACE, or that setting at 1)"
                .to_string()
        }
        _ => String::new(),
    }
}

/// Whether `e` is `EAGAIN`: the address space is changing under a
/// userfaultfd event not read yet; read events, then try again.
pub fn retry_after_events(e: &impl crate::Failure) -> bool {
    e.errno() == libc::EAGAIN
}

/// The next message of `fd` if one is waiting, without blocking.
pub fn read(fd: BorrowedFd<'_>) -> Result<Option<uffd::UffdMsg>> {
    match uffd::read_msg(fd) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) => Err(Error::os("reading the userfaultfd", e)),
    }
}

/// Waits until `fd` has a message, `wake` has bytes (drained here) or
/// `timeout_ms` passes (-1: no timeout). Returns whether `wake` was written.
pub fn wait(fd: BorrowedFd<'_>, wake: &mut std::io::PipeReader, timeout_ms: i32) -> Result<bool> {
    let fds = [fd, wake.as_fd()];
    let ready = uffd::poll_readable(&fds, timeout_ms)
        .map_err(|e| Error::os("poll of the userfaultfd", e))?;
    if ready & 2 != 0 {
        let mut b = [0u8; 64];
        // The pipe is only a doorbell: what was written does not matter,
        // and a short read leaves the rest for the next wait.
        let _ = wake.read(&mut b);
        return Ok(true);
    }
    Ok(false)
}

/// A fault server met an error it cannot recover from: the memory it
/// serves may be wrong, and threads waiting on its faults would wait for
/// ever. The program must neither run on over pages that may be wrong nor
/// hang: the process is aborted with the reason, while the userfaultfd is
/// still open (closing it first would let the waiting threads run on over
/// holes that read as zeros). `who` names the server in the message.
pub fn abort(who: &str, e: &dyn std::fmt::Display) -> ! {
    let msg = format!(
        "pagewise {who}: the fault handler failed: {e}; aborting the process, \
         whose memory can no longer be trusted\n"
    );
    // Straight to the file descriptor: a thread waiting on a fault may hold
    // the lock of the standard error stream.
    let _ = pagewise_sys::process::write_fd(2, msg.as_bytes());
    std::process::abort();
}

/// How a missing page was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filled {
    /// Our page was mapped.
    Now,
    /// A page was there already (another fill, or the program wrote it
    /// after the zero page): nothing was changed, the waiters were woken.
    Already,
}

fn resolved(
    fd: BorrowedFd<'_>,
    dst: u64,
    len: u64,
    r: std::io::Result<()>,
    what: &str,
) -> Result<Filled> {
    match r {
        Ok(()) => Ok(Filled::Now),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            // The threads that faulted on it may not have been woken by
            // whoever mapped it (a fill with DONTWAKE, or none at all).
            match uffd::wake(fd, dst, len) {
                Ok(()) => Ok(Filled::Already),
                Err(e) => Err(Error::os(format!("UFFDIO_WAKE at {dst:#x}"), e)),
            }
        }
        Err(e) => Err(Error::os(format!("{what} at {dst:#x}"), e)),
    }
}

/// Maps a copy of `page` (one page, any alignment) at the missing page
/// `dst` of a range registered with `fd`, and wakes its waiters.
///
/// # Safety
/// The kernel writes the page at `dst` (only if it is missing) in the
/// process that registered `fd`: where that is the caller's own memory,
/// the range must be memory the caller serves (raw memory no Rust
/// reference relies on), as a server's regions are.
pub unsafe fn fill(fd: BorrowedFd<'_>, dst: u64, page: &[u8]) -> Result<Filled> {
    assert_eq!(page.len(), PAGE_SIZE, "fill copies one page");
    // SAFETY: the caller's guarantee; `page` is readable for a page.
    unsafe { fill_from(fd, dst, page.as_ptr() as u64) }
}

/// [`fill`] with the page at address `src` of this process (memory no Rust
/// reference covers, such as a staging area).
///
/// # Safety
/// As for [`fill`]; `src` is readable for a page, and no one writes it
/// meanwhile.
pub unsafe fn fill_from(fd: BorrowedFd<'_>, dst: u64, src: u64) -> Result<Filled> {
    // SAFETY: the caller's guarantee.
    let r = unsafe { uffd::copy(fd, dst, src, PAGE_SIZE as u64) };
    resolved(fd, dst, PAGE_SIZE as u64, r, "UFFDIO_COPY")
}

/// Maps the zero page at the missing pages of `[dst, dst+len)` and wakes
/// their waiters. A range where a page is already there is resolved page
/// by page, so that every missing page of it is mapped.
///
/// # Safety
/// As for [`fill`], for `[dst, dst+len)`.
pub unsafe fn zero(fd: BorrowedFd<'_>, dst: u64, len: u64) -> Result<Filled> {
    // SAFETY: the caller's guarantee.
    match unsafe { uffd::zeropage(fd, dst, len) } {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) && len > PAGE_SIZE as u64 => {
            let mut any_now = false;
            for a in (dst..dst + len).step_by(PAGE_SIZE) {
                // SAFETY: a page of the caller's range.
                if unsafe { zero(fd, a, PAGE_SIZE as u64) }? == Filled::Now {
                    any_now = true;
                }
            }
            Ok(if any_now {
                Filled::Now
            } else {
                Filled::Already
            })
        }
        r => resolved(fd, dst, len, r, "UFFDIO_ZEROPAGE"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eagain_asks_for_a_retry_after_events_and_others_do_not() {
        let e = Error::os("x", std::io::Error::from_raw_os_error(libc::EAGAIN));
        assert!(retry_after_events(&e));
        let e = Error::os("x", std::io::Error::from_raw_os_error(libc::EEXIST));
        assert!(!retry_after_events(&e));
        assert!(!retry_after_events(&Error::NoCommand));
    }
}
