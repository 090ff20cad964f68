//! Userfaultfds made inside a process, for it to keep: the process is
//! stopped, makes the `userfaultfd` call itself ([`super::Remote`], its
//! seccomp filters stepped around as for any call pagewise makes inside a
//! process), and the descriptor stays there.
//!
//! A program in a container cannot make one: the runtime's default seccomp
//! profile refuses the call, and the container drops the CAP_SYS_PTRACE a
//! userfaultfd that serves the kernel's faults too needs. Its preload
//! shim asks a privileged process outside (the host's `pagewise farmem
//! serve`) over a Unix socket in the far-memory instance's directory,
//! which the container mounts ([`socket_path`]); the server learns the
//! asker's pid as the host sees it from the connection itself
//! (`SO_PEERCRED`), so what the container says of itself is never
//! trusted for it.
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
//! A request that cannot be read whole within [`TIMEOUT`] ends the
//! connection.

use crate::inject::Remote;
use crate::{Error, Result};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `PGWU`.
pub const MAGIC: u32 = 0x5557_4750;
/// Op: who am I (the asker's pid as the server sees it).
pub const WHO: u32 = 1;
/// Op: make `userfaultfd(flags)` inside me.
pub const USERFAULTFD: u32 = 2;
/// Longest reason an answer carries.
pub const MAX_WHY: u32 = 1024;
/// How long either side waits for the other.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for another pagewise process that lends
/// `vm.unprivileged_userfaultfd` for a call of its own.
const LEND_WAIT: Duration = Duration::from_secs(3);

/// The socket that serves far-memory instance `name` whose files are in
/// `dir`: `.NAME.uffd` (a name starting with a dot, which no instance
/// has, so listings of the instances never meet it).
pub fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.uffd"))
}

/// Makes `userfaultfd(flags)` inside the stopped process `remote` acts in
/// and leaves the descriptor there; its number. A descriptor that serves
/// the kernel's faults too (no `UFFD_USER_MODE_ONLY`) needs CAP_SYS_PTRACE
/// of the process itself (a container's process lacks it) or
/// `vm.unprivileged_userfaultfd = 1`: where the call is refused `EPERM`,
/// the setting is set to 1 for this one call, journaled first (see
/// [`crate::settings`]), and put back at once; another pagewise process
/// lending it for its own call is waited for (3 s at most). `feature` names who asks,
/// for a refusal.
pub fn userfaultfd_inside(remote: &Remote<'_>, flags: u64, feature: &'static str) -> Result<i32> {
    const SETTING: &str = "/proc/sys/vm/unprivileged_userfaultfd";
    let pid = remote.stopped.pid();
    let call = [flags, 0, 0, 0, 0, 0];
    let mut fd = remote.syscall(libc::SYS_userfaultfd, call)?;
    let user_mode_only = flags & pagewise_sys::uffd::UFFD_USER_MODE_ONLY as u64 != 0;
    if fd == -(libc::EPERM as i64) && !user_mode_only {
        let refused = |why: String| Error::Unsupported {
            feature,
            why: format!(
                "process {pid} may not open a userfaultfd that handles faults the kernel \
                 takes: that needs CAP_SYS_PTRACE of the process itself, which it lacks (a \
                 container drops it), or {SETTING} = 1, {why}"
            ),
        };
        // Another pagewise process may be lending the setting for a call
        // of its own (a moment): wait for it, then try the call again (it
        // may have succeeded while the setting was lent).
        let deadline = std::time::Instant::now() + LEND_WAIT;
        loop {
            let guard = match crate::settings::SettingGuard::claim(SETTING) {
                Ok(g) => g,
                Err(Error::SettingHeld { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                    fd = remote.syscall(libc::SYS_userfaultfd, call)?;
                    if fd != -(libc::EPERM as i64) {
                        break;
                    }
                    continue;
                }
                Err(e) => {
                    return Err(refused(format!(
                        "which pagewise could not set for the call: {e}"
                    )))
                }
            };
            if guard.old().trim() != "0" {
                return Err(refused("and the call was refused all the same".into()));
            }
            guard
                .write("1")
                .map_err(|e| refused(format!("which pagewise could not set for the call: {e}")))?;
            fd = remote.syscall(libc::SYS_userfaultfd, call)?;
            drop(guard);
            break;
        }
    }
    if fd < 0 {
        return Err(super::failed(pid, "userfaultfd() made inside it", fd));
    }
    Ok(fd as i32)
}

/// Asks the server at `path` for `op` with `flags` (see the module): the
/// answer's value, or the server's reason as the error.
pub fn ask(path: &Path, op: u32, flags: u32) -> io::Result<i64> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    let mut req = Vec::with_capacity(16);
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

/// Who asked, as the kernel recorded the connection: (pid here, uid).
pub fn asker(s: &UnixStream) -> Result<(i32, u32)> {
    let (pid, uid) = pagewise_sys::process::peer_credentials(s.as_fd())
        .map_err(|e| Error::os("reading the asker's credentials (SO_PEERCRED)", e))?;
    if pid <= 0 {
        return Err(Error::os(
            "reading the asker's credentials",
            io::Error::other("the asker has no pid in this process's pid namespace"),
        ));
    }
    Ok((pid, uid))
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

/// Answers one connection: reads its request, lets `allow` refuse the
/// asker (its pid here, its uid and the op; an `Err` is sent as the
/// reason), and answers `WHO` with that pid, `USERFAULTFD` by making the
/// call inside the asker (stopped for the moment it takes). An error:
/// the request could not be read or the answer not sent.
pub fn answer(
    s: &mut UnixStream,
    feature: &'static str,
    allow: &dyn Fn(i32, u32, u32) -> std::result::Result<(), String>,
) -> Result<Answered> {
    s.set_read_timeout(Some(TIMEOUT))
        .and_then(|_| s.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| Error::os("setting the socket's timeouts", e))?;
    let (pid, uid) = asker(s)?;
    let (op, flags) = match read_request(s) {
        Ok(r) => r,
        Err(e) => {
            let _ = write_answer(s, -(libc::EPROTO as i64), &e.to_string());
            return Err(Error::for_pid(pid, "reading its request", e));
        }
    };
    let refuse = |errno: i32, why: String| (-(errno as i64), why);
    let allowed = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u32
        | pagewise_sys::uffd::UFFD_USER_MODE_ONLY as u32;
    let (value, why) = match (op, allow(pid, uid, op)) {
        (_, Err(why)) => refuse(libc::EPERM, why),
        (WHO, Ok(())) => (pid as i64, String::new()),
        (USERFAULTFD, Ok(())) if flags & !allowed != 0 => {
            refuse(libc::EINVAL, format!("userfaultfd flags {flags:#x}"))
        }
        (USERFAULTFD, Ok(())) => match make(pid, flags, feature) {
            Ok(fd) => (fd as i64, String::new()),
            Err(e) => refuse(crate::Failure::errno(&e), e.to_string()),
        },
        (_, Ok(())) => refuse(libc::EINVAL, format!("unknown op {op}")),
    };
    write_answer(s, value, &why).map_err(|e| Error::for_pid(pid, "answering its request", e))?;
    Ok(Answered {
        pid,
        op,
        value,
        why,
    })
}

/// `userfaultfd(flags)` made inside `pid`, stopped for the moment.
fn make(pid: i32, flags: u32, feature: &'static str) -> Result<i32> {
    super::check_target(pid, feature, "the userfaultfd call")?;
    let stopped = crate::stop::Stopped::new(pid)?;
    let remote = Remote::new(&stopped)?;
    userfaultfd_inside(&remote, flags as u64, feature)
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
