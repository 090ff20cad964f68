//! A process's open descriptors: `/proc/PID/fd` and `fdinfo`.

use crate::{Error, Result};

/// What an open descriptor refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FdKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A socket.
    Socket,
    /// A pipe or a FIFO.
    Pipe,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// An anonymous inode: an epoll set, eventfd, signalfd, timerfd,
    /// userfaultfd, pidfd, io_uring, …
    AnonInode,
    /// Anything else.
    Other,
}

impl FdKind {
    /// Its number in a snapshot's record.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The kind of record code `c`.
    pub fn from_code(c: u32) -> Option<FdKind> {
        use FdKind::*;
        [
            File,
            Directory,
            Socket,
            Pipe,
            CharDevice,
            BlockDevice,
            AnonInode,
            Other,
        ]
        .get(c as usize)
        .copied()
    }
}

/// One open descriptor of a process, as `/proc/PID/fd` and `fdinfo` show
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Its number.
    pub fd: i32,
    /// What it refers to.
    pub kind: FdKind,
    /// The device and inode of what it refers to (with the number, which
    /// descriptor it is).
    pub dev: u64,
    /// See `dev`.
    pub ino: u64,
    /// Its open flags (`fdinfo`'s `flags`, `O_CLOEXEC` included).
    pub flags: u32,
    /// Its file offset (`fdinfo`'s `pos`).
    pub pos: u64,
    /// What the link `/proc/PID/fd/N` reads: a path, or a name such as
    /// `socket:[123]`.
    pub target: Vec<u8>,
}

impl Descriptor {
    /// Whether `other` is this same descriptor: the same number for the
    /// same object.
    pub fn same(&self, other: &Descriptor) -> bool {
        self.fd == other.fd && self.dev == other.dev && self.ino == other.ino
    }

    /// Its target as text (lossy), for messages and reports.
    pub fn target_text(&self) -> String {
        String::from_utf8_lossy(&self.target).into_owned()
    }
}

/// The kind of a descriptor whose link reads `target`, of file mode `mode`.
pub fn fd_kind(target: &[u8], mode: u32) -> FdKind {
    if target.starts_with(b"socket:[") {
        return FdKind::Socket;
    }
    if target.starts_with(b"pipe:[") {
        return FdKind::Pipe;
    }
    if target.starts_with(b"anon_inode:") {
        return FdKind::AnonInode;
    }
    match mode & libc::S_IFMT {
        libc::S_IFREG => FdKind::File,
        libc::S_IFDIR => FdKind::Directory,
        libc::S_IFSOCK => FdKind::Socket,
        libc::S_IFIFO => FdKind::Pipe,
        libc::S_IFCHR => FdKind::CharDevice,
        libc::S_IFBLK => FdKind::BlockDevice,
        _ => FdKind::Other,
    }
}

/// The `pos` and `flags` lines of an `fdinfo` file (flags in octal);
/// `None` where either is missing or malformed.
pub fn parse_fdinfo(text: &str) -> Option<(u64, u32)> {
    let mut pos = None;
    let mut flags = None;
    for l in text.lines() {
        if let Some(v) = l.strip_prefix("pos:") {
            pos = v.trim().parse().ok();
        } else if let Some(v) = l.strip_prefix("flags:") {
            flags = u32::from_str_radix(v.trim(), 8).ok();
        }
    }
    Some((pos?, flags?))
}

/// Every descriptor process `pid` has open, by number. A descriptor closed
/// while it is read is left out.
pub fn descriptors(pid: i32) -> Result<Vec<Descriptor>> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let dir = format!("/proc/{pid}/fd");
    let entries =
        std::fs::read_dir(&dir).map_err(|e| Error::for_pid(pid, "listing /proc/PID/fd", e))?;
    let mut out = Vec::new();
    for e in entries {
        let Ok(e) = e else { continue };
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let link = e.path();
        let (Ok(target), Ok(meta), Ok(info)) = (
            std::fs::read_link(&link),
            std::fs::metadata(&link),
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")),
        ) else {
            continue;
        };
        let Some((pos, flags)) = parse_fdinfo(&info) else {
            continue;
        };
        let target = target.as_os_str().as_bytes().to_vec();
        out.push(Descriptor {
            fd,
            kind: fd_kind(&target, meta.mode()),
            dev: meta.dev(),
            ino: meta.ino(),
            flags,
            pos,
            target,
        });
    }
    out.sort_unstable_by_key(|d| d.fd);
    Ok(out)
}

/// Which of `fds`, descriptors of process `pid`, are open file
/// descriptions that a process other than `pid` and those of `besides`
/// also holds: inherited across a `fork` (a shell's output, a log its
/// parent writes), or passed over a socket. Moving such a description's
/// offset moves the other process's too.
///
/// Each process's descriptors are read by their links: one description
/// reads as one path in every process that holds it, and `kcmp`
/// (`KCMP_FILE`) confirms a match. A process whose descriptors cannot be
/// read (another user's, without the privilege) is not seen.
pub fn held_elsewhere(pid: i32, fds: &[&Descriptor], besides: &[i32]) -> Vec<i32> {
    use std::os::unix::ffi::OsStrExt;
    let mut found: Vec<i32> = Vec::new();
    if fds.is_empty() {
        return found;
    }
    for q in super::pids() {
        if q == pid || besides.contains(&q) {
            continue;
        }
        let Ok(theirs) = std::fs::read_dir(format!("/proc/{q}/fd")) else {
            continue;
        };
        for t in theirs.flatten() {
            let Some(qfd) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(link) = std::fs::read_link(t.path()) else {
                continue;
            };
            let link = link.as_os_str().as_bytes();
            for d in fds.iter().filter(|d| d.target == link) {
                if !found.contains(&d.fd)
                    && pagewise_sys::process::same_open_file(pid, d.fd, q, qfd).unwrap_or(false)
                {
                    found.push(d.fd);
                }
            }
            if found.len() == fds.len() {
                found.sort_unstable();
                return found;
            }
        }
    }
    found.sort_unstable();
    found
}

/// The user owning the TCP socket on this machine whose own address is
/// `from` and whose peer is `to` (`/proc/net/tcp`, `tcp6`): who is at the
/// other end of a loopback connection. `None` where no such socket is
/// listed (the peer is on another machine).
pub fn tcp_owner(from: std::net::SocketAddr, to: std::net::SocketAddr) -> Option<u32> {
    let hex = |a: std::net::SocketAddr| -> String {
        let ip = match a.ip() {
            std::net::IpAddr::V4(v) => format!("{:08X}", u32::from_ne_bytes(v.octets())),
            std::net::IpAddr::V6(v) => v
                .octets()
                .chunks_exact(4)
                .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
                .collect(),
        };
        format!("{ip}:{:04X}", a.port())
    };
    let (f, t) = (hex(from), hex(to));
    let table = if from.is_ipv4() { "tcp" } else { "tcp6" };
    let text = std::fs::read_to_string(format!("/proc/net/{table}")).ok()?;
    text.lines().skip(1).find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() > 7 && w[1] == f && w[2] == t)
            .then(|| w[7].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_and_kinds_are_read_as_the_kernel_writes_them() {
        let text = "pos:\t4096\nflags:\t02100002\nmnt_id:\t29\nino:\t1234\n";
        assert_eq!(parse_fdinfo(text), Some((4096, 0o2100002)));
        assert_eq!(parse_fdinfo("pos:\tx\nflags:\t02\n"), None);
        assert_eq!(parse_fdinfo("pos:\t1\n"), None);
        assert_eq!(fd_kind(b"socket:[77]", 0o140777), FdKind::Socket);
        assert_eq!(fd_kind(b"pipe:[5]", 0o10600), FdKind::Pipe);
        assert_eq!(fd_kind(b"anon_inode:[eventfd]", 0o600), FdKind::AnonInode);
        assert_eq!(fd_kind(b"/etc/passwd", 0o100644), FdKind::File);
        assert_eq!(fd_kind(b"/tmp", 0o40755), FdKind::Directory);
        assert_eq!(fd_kind(b"/dev/null", 0o20666), FdKind::CharDevice);
        for k in 0..8 {
            assert_eq!(FdKind::from_code(k).map(FdKind::code), Some(k));
        }
        assert_eq!(FdKind::from_code(8), None);
    }

    /// This process's own table: a file opened here is listed with its
    /// number, inode, flags and offset.
    #[test]
    fn a_file_opened_here_is_listed_as_it_is() {
        use std::io::{Seek, SeekFrom};
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let mut f = std::fs::File::open("/proc/self/exe").unwrap();
        f.seek(SeekFrom::Start(100)).unwrap();
        let m = f.metadata().unwrap();
        let all = descriptors(std::process::id() as i32).unwrap();
        let d = all.iter().find(|d| d.fd == f.as_raw_fd()).unwrap();
        assert_eq!(
            (d.kind, d.dev, d.ino, d.pos),
            (FdKind::File, m.dev(), m.ino(), 100)
        );
        assert_eq!(d.flags & libc::O_CLOEXEC as u32, libc::O_CLOEXEC as u32);
        assert!(all.windows(2).all(|w| w[0].fd < w[1].fd));
    }

    /// A child's output is this process's file (one description, given at
    /// spawn); a file the child opened itself is its alone.
    #[test]
    fn a_description_another_process_holds_is_found() {
        let path = std::env::temp_dir().join(format!("pw-held-{}", std::process::id()));
        let out = std::fs::File::create(&path).unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "exec 3</proc/self/exe; echo ready; exec sleep 30"])
            .stdout(out.try_clone().unwrap())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Its own file is open once it said so.
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(&path)
            .unwrap_or_default()
            .is_empty()
        {
            assert!(
                t0.elapsed().as_secs() < 10,
                "the child did not start in 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let all = descriptors(pid).unwrap();
        let picked: Vec<&Descriptor> = all.iter().filter(|d| d.fd == 1 || d.fd == 3).collect();
        assert_eq!(picked.len(), 2, "{all:?}");
        assert_eq!(held_elsewhere(pid, &picked, &[]), vec![1]);
        let me = std::process::id() as i32;
        assert_eq!(held_elsewhere(pid, &picked, &[me]), Vec::<i32>::new());
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
