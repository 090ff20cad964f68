//! Advice made inside a program started under pagewise, by the preload
//! shim, without stopping it: the wire format between pagewise and the
//! shim's advice thread over a `socketpair(AF_UNIX, SOCK_STREAM)` whose shim
//! end is passed as the fd number in
//! [`ADVISE_FD`](crate::shim::env::ADVISE_FD) (see
//! [`start_advised`]).
//!
//! ```text
//! pagewise                               shim (in CMD)
//!    | <- hello: u32 magic "PGWA",        |   sent by the shim as it starts
//!    |    u32 contract, u32 pid,          |   a reader refuses any contract
//!    |    u32 m, m x (u64 start, u64 len) |   but its own (mech::shim); the
//!    |                                    |   m ranges are the shim's own
//!    |                                    |   memory (its heap, its thread's
//!    |                                    |   stack): never the program's
//!    | -- advise: u32 advice, u32 n,  --> |   n at most MAX_RANGES
//!    |    n x (u64 start, u64 len)        |
//!    | <- n x i64: bytes advised, or      |   each range its own madvise,
//!    |    -errno                          |   in the order given
//!    | -- close ------------------------> |   the thread ends
//! ```
//! All integers are little-endian. Only the advice of [`ALLOWED`] is
//! taken (advice that changes no byte of the program's memory); any
//! other is answered `-EPERM` for every range. A request that cannot be
//! read whole, or holds more than [`MAX_RANGES`], ends the connection.

use crate::shim::{env, parsed_fd, Request};
use crate::{Error, Result};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::time::Duration;

/// `PGWA`.
pub const MAGIC: u32 = 0x4157_4750;
/// Protocol version: the shim's contract ([`crate::shim::CONTRACT`]).
pub const VERSION: u32 = crate::shim::CONTRACT;
/// Most ranges of the shim's own memory a hello names.
pub use crate::procfs::MAX_OWN;

pub use crate::procfs::note_own_memory;
/// Most ranges in one request.
pub const MAX_RANGES: u32 = 1 << 16;
/// The advice the shim takes: `MADV_MERGEABLE`, `MADV_UNMERGEABLE`,
/// `MADV_HUGEPAGE`, `MADV_NOHUGEPAGE`, `MADV_COLLAPSE`.
pub const ALLOWED: [i32; 5] = [
    libc::MADV_MERGEABLE,
    libc::MADV_UNMERGEABLE,
    libc::MADV_HUGEPAGE,
    libc::MADV_NOHUGEPAGE,
    pagewise_sys::mem::MADV_COLLAPSE,
];

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

/// Appends one range `(u64 start, u64 len)` as the wire carries it.
fn put_range(out: &mut Vec<u8>, (start, len): (u64, u64)) {
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
}

/// The ranges `(start, len)` of a body of 16-byte records.
fn ranges(body: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    body.chunks_exact(16).map(|r| {
        (
            u64::from_le_bytes(r[..8].try_into().expect("8 bytes")),
            u64::from_le_bytes(r[8..].try_into().expect("8 bytes")),
        )
    })
}

/// The shim's side: says hello, then serves requests until the connection
/// ends.
pub fn serve(mut sock: UnixStream) {
    let own = crate::procfs::own_memory();
    let mut hello = Vec::with_capacity(16 + own.len() * 16);
    hello.extend_from_slice(&crate::shim::hello_header(MAGIC));
    for v in [std::process::id(), own.len() as u32] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    for r in own {
        put_range(&mut hello, r);
    }
    if sock.write_all(&hello).is_err() {
        return;
    }
    let mut head = [0u8; 8];
    while sock.read_exact(&mut head).is_ok() {
        let (advice, n) = (u32_at(&head, 0) as i32, u32_at(&head, 4));
        if n > MAX_RANGES {
            return;
        }
        let mut body = vec![0u8; n as usize * 16];
        if sock.read_exact(&mut body).is_err() {
            return;
        }
        let mut reply = Vec::with_capacity(n as usize * 8);
        for (start, len) in ranges(&body) {
            let rc: i64 = if !ALLOWED.contains(&advice) {
                -i64::from(libc::EPERM)
            } else {
                // The advice allowed changes no byte of the program's
                // memory; a bad range is the kernel's to refuse.
                match pagewise_sys::mem::advise(start, len as usize, advice) {
                    Ok(()) => len as i64,
                    Err(e) => -i64::from(e.raw_os_error().unwrap_or(libc::EIO)),
                }
            };
            reply.extend_from_slice(&rc.to_le_bytes());
        }
        if sock.write_all(&reply).is_err() {
            return;
        }
    }
}

/// pagewise's side: the connection to one program's shim.
#[derive(Debug)]
pub struct ShimAdvice {
    sock: UnixStream,
    pid: i32,
    own: Vec<(u64, u64)>,
}

impl ShimAdvice {
    /// Waits up to `within` for the shim's hello on `sock`.
    pub fn hello(mut sock: UnixStream, within: Duration) -> io::Result<ShimAdvice> {
        sock.set_read_timeout(Some(within))?;
        crate::shim::check_hello(&mut sock, MAGIC)?;
        let mut b = [0u8; 4];
        sock.read_exact(&mut b)?;
        let pid = u32_at(&b, 0);
        let mut m = [0u8; 4];
        sock.read_exact(&mut m)?;
        let m = u32_at(&m, 0);
        if m > MAX_OWN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the shim names {m} ranges of its own memory, at most {MAX_OWN}"),
            ));
        }
        let mut body = vec![0u8; m as usize * 16];
        sock.read_exact(&mut body)?;
        let own: Vec<(u64, u64)> = ranges(&body).collect();
        if let Some(&(a, n)) = own.iter().find(|&&(a, n)| a.checked_add(n).is_none()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the shim names memory {a:#x}+{n:#x}, past the top of the address space"),
            ));
        }
        sock.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(ShimAdvice {
            sock,
            pid: pid as i32,
            own,
        })
    }

    /// The shim's own memory in the program's process, as its hello named
    /// it: `(start, len)`.
    pub fn own_memory(&self) -> &[(u64, u64)] {
        &self.own
    }

    /// The program's pid, as its shim said.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// `madvise(advice)` on each of `ranges` (address, bytes), made by the
    /// program's shim; the bytes advised per range (0 where the kernel
    /// refused it).
    pub fn madvise(&mut self, ranges: &[(u64, u64)], advice: i32) -> Result<Vec<u64>> {
        let mut done = Vec::with_capacity(ranges.len());
        for part in ranges.chunks(MAX_RANGES as usize) {
            let mut req = Vec::with_capacity(8 + part.len() * 16);
            req.extend_from_slice(&(advice as u32).to_le_bytes());
            req.extend_from_slice(&(part.len() as u32).to_le_bytes());
            for &r in part {
                put_range(&mut req, r);
            }
            let mut reply = vec![0u8; part.len() * 8];
            self.sock
                .write_all(&req)
                .and_then(|()| self.sock.read_exact(&mut reply))
                .map_err(|e| Error::for_pid(self.pid, "asking its shim for madvise", e))?;
            done.extend(
                reply
                    .chunks_exact(8)
                    .map(|r| i64::from_le_bytes(r.try_into().expect("8 bytes")).max(0) as u64),
            );
        }
        Ok(done)
    }
}

/// The shim is asked to make the `madvise` calls asked on the socket at
/// descriptor `fd` ([`env::ADVISE_FD`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdviseRequest {
    /// The shim's end of the socketpair.
    pub fd: i32,
}

impl Request for AdviseRequest {
    const KEY: &'static str = env::ADVISE_FD;
    const VARS: &'static [&'static str] = &[env::ADVISE_FD];
    const INHERITED: bool = false;
    fn encode(&self, set: &mut dyn FnMut(&'static str, String)) {
        set(env::ADVISE_FD, self.fd.to_string());
    }
    fn decode(
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> std::result::Result<Option<Self>, String> {
        Ok(parsed_fd(get, env::ADVISE_FD)?.map(|fd| AdviseRequest { fd }))
    }
}

/// Starts `cmd` under the shim, which takes requests for advice inside it
/// (this module), and waits (5 s at most) for
/// the shim's hello. Without one (a statically linked program, which loads
/// no shim, or one that ended at once) the child comes back alone, with
/// why: its advice must then be made under ptrace. `setup` sets the command
/// up further (its standard streams, say).
pub fn start_advised(
    cmd: &[String],
    setup: impl FnOnce(&mut std::process::Command),
) -> Result<(Child, std::result::Result<ShimAdvice, String>)> {
    let (child, sock) = crate::shim::spawn_with_socket(
        cmd,
        |c, fd| crate::shim::ask(c, &AdviseRequest { fd }),
        setup,
    )?;
    let shim = ShimAdvice::hello(sock, Duration::from_secs(5))
        .map_err(|e| format!("its shim did not answer ({e}): statically linked, or it ended"));
    Ok((child, shim))
}
