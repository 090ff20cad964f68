//! Descriptors into and out of a stopped process: one taken out
//! ([`Remote::take_fd`]), and one of pagewise's lent to it for one call:
//! placed in its descriptor table, used by a call made inside it, and
//! closed there before it runs again.
//!
//! The kernel offers no call that puts a descriptor into another process
//! (`pidfd_getfd` only takes one out), so the descriptor travels as a
//! Unix socket carries descriptors (`SCM_RIGHTS`): a socket pair is made
//! inside the process, one end taken out (`pidfd_getfd`, then closed
//! there), the descriptor sent on it, and received inside with a
//! non-blocking `recvmsg` on the other end, which is then closed too. The
//! process never runs while it holds either end or the descriptor: what
//! it is lent cannot be kept, reused or passed on. Should pagewise die
//! between the send and the close, the process keeps the socket's end
//! (close-on-exec, known to none of its code) with the descriptor queued
//! in it until it ends.

use super::{failed, Remote};
use crate::{Error, Result};
use std::os::fd::{AsFd, BorrowedFd};

/// Where the parts of the `recvmsg` lie in the scratch page.
const MSG: u64 = 64;
const IOV: u64 = 128;
const BYTE: u64 = 192;
const CONTROL: u64 = 256;
/// `CMSG_SPACE(sizeof(int))` and `CMSG_LEN(sizeof(int))` on 64-bit Linux.
const CONTROL_SPACE: u64 = 24;
const CONTROL_LEN: u64 = 20;
/// The byte the descriptor travels with.
const CARRIER: u8 = b'P';

// The layouts written into the target are those of 64-bit Linux.
const _: () = assert!(std::mem::size_of::<libc::msghdr>() == 56);
const _: () = assert!(std::mem::size_of::<libc::iovec>() == 16);
const _: () = assert!(std::mem::size_of::<libc::cmsghdr>() == 16);

impl Remote<'_> {
    /// A descriptor the target opened, duplicated into this process
    /// (`pidfd_getfd`) and then closed in the target.
    pub fn take_fd(&self, fd: i32) -> Result<std::os::fd::OwnedFd> {
        let pid = self.stopped.pid();
        let pidfd = pagewise_sys::process::pidfd_open(pid)
            .map_err(|e| Error::for_pid(pid, "pidfd_open", e))?;
        let mine = pagewise_sys::process::pidfd_getfd(pidfd.as_fd(), fd);
        let closed = self.close(fd);
        let mine =
            mine.map_err(|e| Error::for_pid(pid, format!("pidfd_getfd of its fd {fd}"), e))?;
        closed.map(|()| mine)
    }

    /// Runs `f` with descriptor `fd` of this process placed in the stopped
    /// target (`f` gets its number there, close-on-exec), then closes it
    /// there, whatever `f` answered (see the module).
    pub fn with_fd_inside<T>(
        &self,
        fd: BorrowedFd<'_>,
        f: impl FnOnce(i32) -> Result<T>,
    ) -> Result<T> {
        let page = self.scratch_page()?;
        let placed = self.place(page, fd);
        let unmapped = self.syscall(
            libc::SYS_munmap,
            [page, crate::PAGE_SIZE as u64, 0, 0, 0, 0],
        );
        let there = placed?;
        let answered = unmapped.and_then(|_| f(there));
        let closed = self.close(there);
        let answer = answered?;
        closed?;
        Ok(answer)
    }

    /// A page mapped inside the target for a call's arguments (the caller
    /// unmaps it before the target runs again).
    pub(super) fn scratch_page(&self) -> Result<u64> {
        let page = self.syscall(
            libc::SYS_mmap,
            [
                0,
                crate::PAGE_SIZE as u64,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        )?;
        if page < 0 {
            return Err(failed(
                self.stopped.pid(),
                "mmap of a scratch page made inside it",
                page,
            ));
        }
        Ok(page as u64)
    }

    /// Places `fd` in the target through a socket pair made there (see
    /// the module); its number there. Both ends are closed there before
    /// this returns, whatever happened.
    fn place(&self, page: u64, fd: BorrowedFd<'_>) -> Result<i32> {
        let pid = self.stopped.pid();
        let rc = self.syscall(
            libc::SYS_socketpair,
            [
                libc::AF_UNIX as u64,
                (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64,
                0,
                page,
                0,
                0,
            ],
        )?;
        if rc < 0 {
            return Err(failed(pid, "socketpair() made inside it", rc));
        }
        let mut sv = [0u8; 8];
        crate::remote::read_exact(pid, page, &mut sv)?;
        let ours = i32::from_ne_bytes(sv[..4].try_into().expect("4 bytes"));
        let theirs = i32::from_ne_bytes(sv[4..].try_into().expect("4 bytes"));
        let received = self.take_fd(ours).and_then(|mine| {
            pagewise_sys::socket::send_fd(mine.as_fd(), fd, CARRIER)
                .map_err(|e| Error::for_pid(pid, "sending it a descriptor", e))?;
            self.receive(page, theirs)
        });
        let closed = self.close(theirs);
        let there = received?;
        if let Err(e) = closed {
            let _ = self.close(there);
            return Err(e);
        }
        Ok(there)
    }

    /// Receives, inside the target, the descriptor queued on its socket
    /// `sock` (`recvmsg`, not waiting), the message's parts written to
    /// `page`; its number there, checked to be what was sent.
    fn receive(&self, page: u64, sock: i32) -> Result<i32> {
        let pid = self.stopped.pid();
        let word = |v: u64| v.to_ne_bytes();
        let mut parts = Vec::with_capacity(CONTROL as usize + CONTROL_SPACE as usize);
        parts.resize(MSG as usize, 0);
        // struct msghdr: no name, one iovec, the control buffer, no flags.
        for v in [0, 0, page + IOV, 1, page + CONTROL, CONTROL_SPACE, 0] {
            parts.extend_from_slice(&word(v));
        }
        parts.resize(IOV as usize, 0);
        // struct iovec: one byte.
        parts.extend_from_slice(&word(page + BYTE));
        parts.extend_from_slice(&word(1));
        parts.resize((CONTROL + CONTROL_SPACE) as usize, 0);
        crate::remote::write_exact(pid, page + MSG, &parts[MSG as usize..])?;
        let rc = self.syscall(
            libc::SYS_recvmsg,
            [
                sock as u64,
                page + MSG,
                (libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) as u64,
                0,
                0,
                0,
            ],
        )?;
        if rc < 0 {
            return Err(failed(pid, "recvmsg() made inside it", rc));
        }
        let mut back = vec![0u8; (CONTROL + CONTROL_SPACE) as usize];
        crate::remote::read_exact(pid, page, &mut back)?;
        let u64_at =
            |o: u64| u64::from_ne_bytes(back[o as usize..o as usize + 8].try_into().unwrap());
        let i32_at =
            |o: u64| i32::from_ne_bytes(back[o as usize..o as usize + 4].try_into().unwrap());
        let flags = i32_at(MSG + 48);
        let (len, level, kind) = (u64_at(CONTROL), i32_at(CONTROL + 8), i32_at(CONTROL + 12));
        let there = i32_at(CONTROL + 16);
        let whole = rc == 1
            && back[BYTE as usize] == CARRIER
            && flags & libc::MSG_CTRUNC == 0
            && len == CONTROL_LEN
            && level == libc::SOL_SOCKET
            && kind == libc::SCM_RIGHTS
            && there >= 0;
        if !whole {
            if len == CONTROL_LEN && level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
                let _ = self.close(there);
            }
            return Err(Error::for_pid(
                pid,
                "receiving a descriptor inside it",
                std::io::Error::other(format!(
                    "recvmsg answered {rc} with flags {flags:#x} and a control message of \
                     {len} bytes (level {level}, type {kind})"
                )),
            ));
        }
        Ok(there)
    }

    /// `close(fd)` inside the target.
    fn close(&self, fd: i32) -> Result<()> {
        match self.syscall(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0])? {
            0 => Ok(()),
            rc => Err(failed(
                self.stopped.pid(),
                format!("close({fd}) made inside it"),
                rc,
            )),
        }
    }
}
