//! Unix sockets that say who is at the other end: the peer as a process
//! (`SO_PEERPIDFD`), the sender of each message (`SCM_CREDENTIALS`), and
//! descriptors passed (`SCM_RIGHTS`).
//!
//! # References
//! - `unix(7)`: `SO_PEERCRED`, `SO_PEERPIDFD` (Linux 6.5), `SO_PASSCRED`,
//!   `SCM_CREDENTIALS`, `SCM_RIGHTS`
//! - `pidfd_open(2)`, `proc_pid_fdinfo(5)`: a pidfd's `Pid:` line

use crate::cvt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `SO_PEERPIDFD` (Linux 6.5; not in the system's 6.1 headers).
pub const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the process at the other end of a connected Unix socket, as
/// the kernel recorded it when the connection was made (`SO_PEERPIDFD`):
/// it names that process and no other, whatever pid it had, even once a
/// process with the same pid replaced it. `ENOPROTOOPT` before Linux 6.5.
pub fn peer_pidfd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` and `len` are valid for writes and `len` says the size
    // of `fd`; `sock` is open for the call.
    cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    } as libc::c_long)?;
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: the kernel made this descriptor for us; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The pid, in this process's pid namespace, of the process `pidfd`
/// names: `None` once it has ended (fdinfo's `Pid: -1`, or no such
/// line), `Some(0)` where it has no pid here.
pub fn pidfd_pid(pidfd: BorrowedFd<'_>) -> io::Result<Option<libc::pid_t>> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<libc::pid_t>().ok())
        .filter(|&p| p >= 0))
}

/// Whether the process `pidfd` names is alive (not ended, not reaped):
/// `pidfd_send_signal(pidfd, 0)`.
pub fn pidfd_alive(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: integer arguments only; signal 0 sends nothing.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    r == 0
}

/// `SO_PASSCRED` on: each message read from `sock` says who sent it
/// ([`recv_from_sender`]).
pub fn set_passcred(sock: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is valid for reads of its size for the call.
    cvt(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } as libc::c_long)?;
    Ok(())
}

/// Room for one `SCM_CREDENTIALS` or one descriptor of `SCM_RIGHTS`, with
/// the alignment `cmsghdr` needs.
#[repr(C, align(8))]
struct Control([u8; 64]);

/// Reads up to `buf.len()` bytes from `sock` (with [`set_passcred`] on),
/// waiting as the socket's timeouts say: the bytes read and the pid (in
/// this pid namespace) of the process that sent them, as the kernel
/// recorded it at the send (`SCM_CREDENTIALS`; `None` where it did not
/// say). One read returns bytes of one sender only. Descriptors sent with
/// them are closed.
pub fn recv_from_sender(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Option<libc::pid_t>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut ctl = Control([0; 64]);
    // SAFETY: an all-zero msghdr is valid (no name, no iov, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.0.as_mut_ptr().cast();
    msg.msg_controllen = ctl.0.len();
    // SAFETY: `msg` points at `iov` (describing `buf`, writable) and `ctl`,
    // both valid for the call; MSG_CMSG_CLOEXEC keeps any descriptor sent
    // with the bytes out of programs we start before it is closed below.
    let n = cvt(
        unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) }
            as libc::c_long,
    )? as usize;
    let mut pid = None;
    // SAFETY: the kernel filled `msg_controllen` bytes of `ctl`; the CMSG
    // macros walk only within them.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred = std::ptr::read_unaligned(data.cast::<libc::ucred>());
                pid = Some(cred.pid);
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for k in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(k));
                    drop(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, pid))
}

/// Sends `byte` with descriptor `fd` (`SCM_RIGHTS`) on `sock`.
pub fn send_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>, byte: u8) -> io::Result<()> {
    let mut b = [byte];
    let mut iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut ctl = Control([0; 64]);
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.0.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: `ctl` holds CMSG_SPACE(4) bytes (64 >= 24), which the header
    // and the descriptor written through CMSG_FIRSTHDR/CMSG_DATA fill.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
    }
    // SAFETY: `msg` points at `iov` and `ctl`, valid for the call.
    let n =
        cvt(unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } as libc::c_long)?;
    if n != 1 {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "a descriptor not sent",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn each_read_says_its_sender_and_the_peer_is_a_pidfd_of_it() {
        let (a, mut b) = UnixStream::pair().unwrap();
        set_passcred(a.as_fd()).unwrap();
        b.write_all(b"hello").unwrap();
        let mut buf = [0u8; 16];
        let (n, pid) = recv_from_sender(a.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(pid, Some(std::process::id() as i32));
        match peer_pidfd(a.as_fd()) {
            Ok(p) => {
                assert_eq!(
                    pidfd_pid(p.as_fd()).unwrap(),
                    Some(std::process::id() as i32)
                );
                assert!(pidfd_alive(p.as_fd()));
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}"),
        }
    }

    #[test]
    fn a_descriptor_sent_arrives_and_one_not_asked_for_is_closed() {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = UnixStream::pair().unwrap();
        let (x, _y) = UnixStream::pair().unwrap();
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", x.as_raw_fd()))
            .unwrap()
            .ino();
        // Descriptors of this process open on socket `x` (other tests'
        // threads open and close others meanwhile).
        let on_x = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_str() == Some(&format!("socket:[{ino}]")))
                .count()
        };
        send_fd(a.as_fd(), x.as_fd(), b'U').unwrap();
        assert_eq!(on_x(), 1, "x alone: the one sent is in flight");
        let mut buf = [0u8; 4];
        let (n, _) = recv_from_sender(b.as_fd(), &mut buf).unwrap();
        assert_eq!((n, buf[0]), (1, b'U'));
        assert_eq!(on_x(), 1, "the descriptor that came with the byte closed");
    }
}
