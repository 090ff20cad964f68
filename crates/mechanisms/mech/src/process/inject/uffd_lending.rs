//! Userfaultfds made inside a process, for it to keep: the process is
//! stopped, makes the call itself ([`super::Remote`], its seccomp filters
//! stepped around as for any call pagewise makes inside a process), and
//! the descriptor stays there.
//!
//! A program in a container cannot make one: the runtime's default seccomp
//! profile refuses the call, and the container drops the CAP_SYS_PTRACE a
//! userfaultfd that serves the kernel's faults too needs. Its preload
//! shim asks a privileged process outside (the host's `pagewise farmem
//! serve`) over a Unix socket the container mounts; the server learns who
//! asks from the connection itself, never from what the asker says:
//!
//! - the process that connected, as the kernel recorded it at the
//!   connect: a pidfd (`SO_PEERPIDFD`; before Linux 6.5, its pid and the
//!   start time read at once), its pid and its effective uid
//!   (`SO_PEERCRED`);
//! - the sender of every byte of the request (`SCM_CREDENTIALS`), which
//!   must be that process: a child it forked, holding the same socket, is
//!   not served in its name;
//! - after the process is stopped, that it is still that process (its
//!   pidfd names the pid stopped, so a pid freed and taken by another
//!   process is refused), that its real, effective, saved and file-system
//!   uids are still the uid it connected with (an `exec` of a setuid
//!   program since is refused), and that it is dumpable, as the kernel
//!   answers `prctl(PR_GET_DUMPABLE)` made inside it.
//!
//! A userfaultfd that serves the kernel's faults too (no
//! `UFFD_USER_MODE_ONLY`) needs CAP_SYS_PTRACE of the process itself: for
//! one that lacks it, pagewise opens `/dev/userfaultfd`, lends the
//! descriptor to the stopped process for one `USERFAULTFD_IOC_NEW` made
//! inside it, and closes it there before it runs on (see `give`).
//! `vm.unprivileged_userfaultfd` is never changed: it is the machine's.
//!
//! ```text
//! shim (in the container)                      server (on the host)
//!    | -- u32 magic "PGWU", u32 contract,  --> |  one request a connection
//!    |    u32 op, u32 flags                    |
//!    | <- i64 value, u32 n, n bytes of why --  |  n at most MAX_WHY
//! ```
//! Little-endian. `op` [`WHO`]: `value` is the asker's pid as the server
//! sees it (its host pid, which the instance lists). `op`
//! [`USERFAULTFD`]: `userfaultfd(flags)` made inside the asker; `value` is
//! the descriptor's number there, or `-errno` with the reason in `why`.
//! A request that is not read whole within [`TIMEOUT`] of the connection's
//! acceptance ends the connection.

use crate::inject::Remote;
use crate::{Error, Result};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `PGWU`.
pub const MAGIC: u32 = 0x5557_4750;
/// Op: who am I (the asker's pid as the server sees it).
pub const WHO: u32 = 1;
/// Op: make `userfaultfd(flags)` inside me.
pub const USERFAULTFD: u32 = 2;
/// Longest reason an answer carries.
pub const MAX_WHY: u32 = 1024;
/// How long a request may take to arrive whole, and how long the asker
/// waits for its answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a request.
const REQUEST: usize = 16;

/// Makes `userfaultfd(flags)` inside the stopped process `remote` acts in
/// and leaves the descriptor there; its number. A descriptor that serves
/// the kernel's faults too (no `UFFD_USER_MODE_ONLY`) needs CAP_SYS_PTRACE
/// of the process itself (a container's process lacks it): where the
/// call is refused `EPERM`, it is made through `/dev/userfaultfd`, opened
/// here and lent to the process for the one `ioctl` (see the module).
/// `feature` names who asks, for a refusal.
pub fn userfaultfd_inside(remote: &Remote<'_>, flags: u64, feature: &'static str) -> Result<i32> {
    let pid = remote.stopped.pid();
    let fd = remote.syscall(libc::SYS_userfaultfd, [flags, 0, 0, 0, 0, 0])?;
    let user_mode_only = flags & pagewise_sys::uffd::UFFD_USER_MODE_ONLY as u64 != 0;
    if fd == -(libc::EPERM as i64) && !user_mode_only {
        let refused = |why: String| Error::Unsupported {
            feature,
            why: format!(
                "process {pid} may not open a userfaultfd that handles faults the kernel \
                 takes: that needs CAP_SYS_PTRACE of the process itself, which it lacks (a \
                 container drops it), or /dev/userfaultfd (Linux 6.1), {why}; pagewise \
                 never sets vm.unprivileged_userfaultfd, which is the whole machine's"
            ),
        };
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/userfaultfd")
            .map_err(|e| refused(format!("which pagewise could not open: {e}")))?;
        let made = remote.with_fd_inside(dev.as_fd(), |d| {
            remote.syscall(
                libc::SYS_ioctl,
                [
                    d as u64,
                    pagewise_sys::uffd::USERFAULTFD_IOC_NEW,
                    flags,
                    0,
                    0,
                    0,
                ],
            )
        })?;
        if made < 0 {
            return Err(super::failed(
                pid,
                "ioctl(USERFAULTFD_IOC_NEW) made inside it",
                made,
            ));
        }
        return Ok(made as i32);
    }
    if fd < 0 {
        return Err(super::failed(pid, "userfaultfd() made inside it", fd));
    }
    Ok(fd as i32)
}

/// Asks the server at `path` for `op` with `flags` (see the module): the
/// answer's value, or the server's reason as the error. The server must
/// run as one of `servers` (uids, as `SO_PEERCRED` says it): a socket
/// someone else bound there is not asked.
pub fn ask(path: &Path, op: u32, flags: u32, servers: &[u32]) -> io::Result<i64> {
    let mut s = UnixStream::connect(path)?;
    let (_, uid) = pagewise_sys::process::peer_credentials(s.as_fd())?;
    if !servers.contains(&uid) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {uid}, not by root or the instance's owner: not asked",
                path.display()
            ),
        ));
    }
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    let mut req = Vec::with_capacity(REQUEST);
    req.extend_from_slice(&crate::shim::hello_header(MAGIC));
    req.extend_from_slice(&op.to_le_bytes());
    req.extend_from_slice(&flags.to_le_bytes());
    s.write_all(&req)?;
    let (value, why) = read_answer(&mut s)?;
    if value < 0 {
        let errno = i32::try_from(-value).unwrap_or(libc::EIO);
        let os = io::Error::from_raw_os_error(errno);
        return Err(io::Error::new(
            os.kind(),
            if why.is_empty() { os.to_string() } else { why },
        ));
    }
    Ok(value)
}

/// An answer: its value and reason, bounds-checked.
pub fn read_answer(r: &mut impl Read) -> io::Result<(i64, String)> {
    let mut b = [0u8; 12];
    r.read_exact(&mut b)?;
    let value = i64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let n = u32::from_le_bytes(b[8..].try_into().expect("4 bytes"));
    if n > MAX_WHY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("an answer's reason of {n} bytes (at most {MAX_WHY})"),
        ));
    }
    let mut why = vec![0u8; n as usize];
    r.read_exact(&mut why)?;
    Ok((value, String::from_utf8_lossy(&why).into_owned()))
}

/// A request: its op and flags, after its magic and contract were checked.
pub fn read_request(r: &mut impl Read) -> io::Result<(u32, u32)> {
    crate::shim::check_hello(r, MAGIC)?;
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok((
        u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
        u32::from_le_bytes(b[4..].try_into().expect("4 bytes")),
    ))
}

/// Writes an answer (the reason cut to [`MAX_WHY`] bytes).
pub fn write_answer(w: &mut impl Write, value: i64, why: &str) -> io::Result<()> {
    let mut why = why.as_bytes();
    why = &why[..why.len().min(MAX_WHY as usize)];
    let mut out = Vec::with_capacity(12 + why.len());
    out.extend_from_slice(&value.to_le_bytes());
    out.extend_from_slice(&(why.len() as u32).to_le_bytes());
    out.extend_from_slice(why);
    w.write_all(&out)
}

/// The process that connected, as the kernel recorded it at the connect.
#[derive(Debug)]
struct Asker {
    /// Its pid in this process's pid namespace.
    pid: i32,
    /// Its effective uid at the connect.
    uid: u32,
    /// It (`SO_PEERPIDFD`), where the kernel gives one.
    pidfd: Option<OwnedFd>,
    /// Its start time, read at the acceptance, where it does not.
    start: Option<u64>,
}

impl Asker {
    /// Who is at the other end of `s` (see the module).
    fn of(s: &UnixStream) -> Result<Asker> {
        let (pid, uid) = pagewise_sys::process::peer_credentials(s.as_fd())
            .map_err(|e| Error::os("reading the asker's credentials (SO_PEERCRED)", e))?;
        if pid <= 0 {
            return Err(Error::os(
                "reading the asker's credentials",
                io::Error::other("the asker has no pid in this process's pid namespace"),
            ));
        }
        let (pidfd, start) = match pagewise_sys::socket::peer_pidfd(s.as_fd()) {
            Ok(fd) => (Some(fd), None),
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
                (None, crate::procfs::start_time(pid))
            }
            // A peer that ended before the acceptance.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(Error::ProcessExited(pid))
            }
            Err(e) => return Err(Error::for_pid(pid, "SO_PEERPIDFD", e)),
        };
        Ok(Asker {
            pid,
            uid,
            pidfd,
            start,
        })
    }

    /// Whether pid [`Asker::pid`] is still the process that connected:
    /// the reason where it is not.
    fn still_there(&self) -> std::result::Result<(), String> {
        let pid = self.pid;
        let same = match &self.pidfd {
            Some(fd) => {
                pagewise_sys::socket::pidfd_alive(fd.as_fd())
                    && pagewise_sys::socket::pidfd_pid(fd.as_fd()).ok().flatten() == Some(pid)
            }
            None => self.start.is_some() && crate::procfs::start_time(pid) == self.start,
        };
        if same {
            Ok(())
        } else {
            Err(format!(
                "the process that connected as pid {pid} has ended (pid {pid} may be \
                 another's now): nothing is made for it"
            ))
        }
    }

    /// Checks the stopped process `remote` acts in: still the one that
    /// connected, all its uids the uid it connected with, and dumpable
    /// (see the module); the reason where not.
    fn vouch(&self, remote: &Remote<'_>) -> Result<std::result::Result<(), String>> {
        if let Err(why) = self.still_there() {
            return Ok(Err(why));
        }
        let pid = self.pid;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| Error::for_pid(pid, "reading its status", e))?;
        let uids = crate::procfs::status_ids(&status, "Uid");
        if uids.as_deref() != Some(&[self.uid; 4][..]) {
            return Ok(Err(format!(
                "process {pid} connected as uid {}, and its uids (real, effective, saved, \
                 file system) are now {uids:?}: a program that changed its user since (a \
                 setuid exec) is not served",
                self.uid
            )));
        }
        let dumpable = remote.syscall(
            libc::SYS_prctl,
            [libc::PR_GET_DUMPABLE as u64, 0, 0, 0, 0, 0],
        )?;
        if dumpable != 1 {
            return Ok(Err(format!(
                "process {pid} is not dumpable (PR_GET_DUMPABLE answers {dumpable}): the \
                 kernel protects it from its own user, as after a setuid exec, and so does \
                 pagewise"
            )));
        }
        Ok(Ok(()))
    }
}

/// One request answered: who asked (pid here), what, and the answer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Answered {
    /// The asker's pid as this process sees it.
    pub pid: i32,
    /// The op asked.
    pub op: u32,
    /// The value sent: a pid, a descriptor number, or `-errno`.
    pub value: i64,
    /// The reason sent with a refusal.
    pub why: String,
}

impl Answered {
    /// The op's name: `who`, `userfaultfd`, or `unknown`.
    pub fn op_name(&self) -> &'static str {
        match self.op {
            WHO => "who",
            USERFAULTFD => "userfaultfd",
            _ => "unknown",
        }
    }
}

/// Reads the request of `asker` from `s` by `deadline`, every byte of it
/// sent by the asker itself; given up, as timed out, once `stop` is set.
fn read_request_of(
    s: &mut UnixStream,
    asker: &Asker,
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<(u32, u32)> {
    pagewise_sys::socket::set_passcred(s.as_fd())?;
    let mut buf = [0u8; REQUEST];
    let mut got = 0;
    while got < REQUEST {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stop.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{got} of the request's {REQUEST} bytes within {TIMEOUT:?}"),
            ));
        }
        s.set_read_timeout(Some(left.min(Duration::from_millis(100))))?;
        match pagewise_sys::socket::recv_from_sender(s.as_fd(), &mut buf[got..]) {
            Ok((0, _)) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the connection closed after {got} of {REQUEST} bytes"),
                ))
            }
            Ok((n, sender)) if sender == Some(asker.pid) => got += n,
            Ok((_, sender)) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the request was sent by {}, not by process {} that connected: a \
                         process is served only in its own name",
                        sender.map_or("a process with no pid here".into(), |p| format!(
                            "process {p}"
                        )),
                        asker.pid
                    ),
                ))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    read_request(&mut &buf[..])
}

/// Answers one connection by `deadline` (or as soon as `stop` is set):
/// reads its request, lets `allow` refuse the asker (its pid here, its
/// uid and the op; an `Err` is sent as the reason), and answers `WHO`
/// with that pid, `USERFAULTFD` by making the call inside the asker
/// (stopped for the moment it takes, and checked then: see the module).
/// An error: the request could not be read or the answer not sent.
pub fn answer(
    s: &mut UnixStream,
    feature: &'static str,
    allow: &dyn Fn(i32, u32, u32) -> std::result::Result<(), String>,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<Answered> {
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(|e| Error::os("setting the socket's timeouts", e))?;
    let asker = Asker::of(s)?;
    let pid = asker.pid;
    let (op, flags) = match read_request_of(s, &asker, deadline, stop) {
        Ok(r) => r,
        Err(e) => {
            let errno = if e.kind() == io::ErrorKind::PermissionDenied {
                libc::EPERM
            } else {
                libc::EPROTO
            };
            let _ = write_answer(s, -(errno as i64), &e.to_string());
            return Err(Error::os(
                format!("reading the request of process {pid}"),
                e,
            ));
        }
    };
    let refuse = |errno: i32, why: String| (-(errno as i64), why);
    let allowed = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u32
        | pagewise_sys::uffd::UFFD_USER_MODE_ONLY as u32;
    let (value, why) = match (op, allow(pid, asker.uid, op)) {
        (_, Err(why)) => refuse(libc::EPERM, why),
        (WHO, Ok(())) => match asker.still_there() {
            Ok(()) => (pid as i64, String::new()),
            Err(why) => refuse(libc::ESRCH, why),
        },
        (USERFAULTFD, Ok(())) if flags & !allowed != 0 => {
            refuse(libc::EINVAL, format!("userfaultfd flags {flags:#x}"))
        }
        (USERFAULTFD, Ok(())) => match make(&asker, flags, feature) {
            Ok(Ok(fd)) => (fd as i64, String::new()),
            Ok(Err(why)) => refuse(libc::EPERM, why),
            Err(e) => refuse(crate::Failure::errno(&e), e.to_string()),
        },
        (_, Ok(())) => refuse(libc::EINVAL, format!("unknown op {op}")),
    };
    let op_name = Answered {
        pid,
        op,
        value,
        why: String::new(),
    }
    .op_name();
    write_answer(s, value, &why).map_err(|e| {
        // What was done is said even where the asker cannot hear it.
        Error::os(
            format!(
                "process {pid} asked {op_name}, answered {value}{}{why}, but the answer could \
                 not be sent",
                if why.is_empty() { "" } else { ": " }
            ),
            e,
        )
    })?;
    Ok(Answered {
        pid,
        op,
        value,
        why,
    })
}

/// `userfaultfd(flags)` made inside the asker, stopped for the moment and
/// vouched for once stopped; the reason where it is refused then.
fn make(
    asker: &Asker,
    flags: u32,
    feature: &'static str,
) -> Result<std::result::Result<i32, String>> {
    let pid = asker.pid;
    if let Err(why) = asker.still_there() {
        return Ok(Err(why));
    }
    super::check_target(pid, feature, "the userfaultfd call")?;
    let stopped = crate::stop::Stopped::new(pid)?;
    let remote = Remote::new(&stopped)?;
    if let Err(why) = asker.vouch(&remote)? {
        return Ok(Err(why));
    }
    userfaultfd_inside(&remote, flags as u64, feature).map(Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_an_answer_go_through_unchanged() {
        let mut req = Vec::new();
        req.extend_from_slice(&crate::shim::hello_header(MAGIC));
        req.extend_from_slice(&USERFAULTFD.to_le_bytes());
        req.extend_from_slice(&0x80801u32.to_le_bytes());
        assert_eq!(read_request(&mut &req[..]).unwrap(), (USERFAULTFD, 0x80801));
        let mut out = Vec::new();
        write_answer(&mut out, -13, "no").unwrap();
        assert_eq!(read_answer(&mut &out[..]).unwrap(), (-13, "no".into()));
    }

    #[test]
    fn a_long_reason_is_refused_and_one_written_is_cut() {
        let mut out = Vec::new();
        out.extend_from_slice(&0i64.to_le_bytes());
        out.extend_from_slice(&(MAX_WHY + 1).to_le_bytes());
        out.extend(std::iter::repeat_n(b'x', MAX_WHY as usize + 1));
        assert!(read_answer(&mut &out[..]).is_err());
        let mut w = Vec::new();
        write_answer(&mut w, 1, &"y".repeat(5000)).unwrap();
        assert_eq!(read_answer(&mut &w[..]).unwrap().1.len(), MAX_WHY as usize);
    }

    #[test]
    fn another_magic_is_refused() {
        let mut req = Vec::new();
        req.extend_from_slice(&crate::shim::hello_header(0x1234));
        req.extend_from_slice(&[0; 8]);
        assert!(read_request(&mut &req[..]).is_err());
    }
}
