//! The wire format between `pagewise track` and the preload shim inside the
//! tracked program, over a `socketpair(AF_UNIX, SOCK_STREAM)` whose shim end is
//! passed as the fd number in `PAGEWISE_TRACK_FD`.
//!
//! ```text
//! pagewise                         shim (in CMD)
//!    | -- hello:   'H'  ---------------> |
//!    | <- u32 magic "PGWS", u32 version  |   version rule: a reader refuses
//!    |    u32 backend (BackendKind idx)  |   any version but its own
//!    | -- collect: 'C'  ---------------> |
//!    | <- u64 ranges, u64 pages_scanned, |
//!    |    u64 elapsed_ns, u64 status     |   status 0: ok; else an errno and
//!    |    ranges x (u64 start, u64 pages)|   no ranges follow
//!    | -- quit:    'Q'  (or close) ----> |   shim stops tracking
//! ```
//! All integers are little-endian. The shim serves one request at a time.

use super::{BackendKind, CollectStats, Collection};
use crate::region::PageRange;
use std::io::{self, Read, Write};

/// `PGWS`.
pub const MAGIC: u32 = 0x5357_4750;
/// Protocol version.
pub const VERSION: u32 = 1;
/// Environment variable naming the shim's socket fd.
pub const ENV_FD: &str = "PAGEWISE_TRACK_FD";
/// Environment variable naming the backend the shim should use.
pub const ENV_BACKEND: &str = "PAGEWISE_TRACK_BACKEND";
/// Request: handshake.
pub const REQ_HELLO: u8 = b'H';
/// Request: collect.
pub const REQ_COLLECT: u8 = b'C';
/// Request: stop.
pub const REQ_QUIT: u8 = b'Q';
/// Most ranges one reply may carry (a corrupt peer cannot make us allocate more).
pub const MAX_RANGES: u64 = 1 << 26;

fn backend_index(k: BackendKind) -> u32 {
    BackendKind::ALL
        .iter()
        .position(|b| *b == k)
        .map(|i| i as u32)
        .unwrap_or(u32::MAX)
}

/// Writes the hello reply.
pub fn write_hello(w: &mut impl Write, backend: BackendKind) -> io::Result<()> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&backend_index(backend).to_le_bytes());
    w.write_all(&b)
}

/// Reads the hello reply; returns the shim's backend.
pub fn read_hello(r: &mut impl Read) -> io::Result<BackendKind> {
    let mut b = [0u8; 12];
    r.read_exact(&mut b)?;
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let version = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let idx = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if magic != MAGIC || version != VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "shim speaks magic {magic:#x} version {version}, want {MAGIC:#x} version {VERSION}"
            ),
        ));
    }
    BackendKind::ALL.get(idx as usize).copied().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("shim reports unknown backend {idx}"),
        )
    })
}

/// Writes a collect reply (`Err`: its errno).
pub fn write_collection(w: &mut impl Write, c: &Result<Collection, i32>) -> io::Result<()> {
    let mut b = Vec::new();
    match c {
        Ok(c) => {
            for v in [
                c.ranges.len() as u64,
                c.stats.pages_scanned,
                c.stats.elapsed_ns,
                0,
            ] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            for r in &c.ranges {
                b.extend_from_slice(&r.start.to_le_bytes());
                b.extend_from_slice(&r.pages.to_le_bytes());
            }
        }
        Err(errno) => {
            for v in [0, 0, 0, (*errno).max(1) as u64] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    w.write_all(&b)
}

/// Reads a collect reply.
pub fn read_collection(r: &mut impl Read) -> io::Result<Collection> {
    let mut h = [0u8; 32];
    r.read_exact(&mut h)?;
    let f = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let (n, scanned, elapsed, status) = (f(0), f(1), f(2), f(3));
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status as i32));
    }
    if n > MAX_RANGES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("shim announced {n} ranges"),
        ));
    }
    let mut body = vec![0u8; n as usize * 16];
    r.read_exact(&mut body)?;
    let ranges: Vec<PageRange> = body
        .chunks_exact(16)
        .map(|c| PageRange {
            start: u64::from_le_bytes(c[0..8].try_into().expect("8 bytes")),
            pages: u64::from_le_bytes(c[8..16].try_into().expect("8 bytes")),
        })
        .collect();
    let stats = CollectStats {
        pages_scanned: scanned,
        pages_dirty: crate::region::total_pages(&ranges),
        ranges: ranges.len() as u64,
        elapsed_ns: elapsed,
        ..Default::default()
    };
    Ok(Collection { ranges, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn round_trips_and_rejects_garbage() {
        let c = Collection {
            ranges: vec![
                PageRange {
                    start: 0x1000,
                    pages: 3,
                },
                PageRange {
                    start: 0x9000,
                    pages: 1,
                },
            ],
            stats: CollectStats {
                pages_scanned: 100,
                pages_dirty: 4,
                ranges: 2,
                elapsed_ns: 5,
                ..Default::default()
            },
        };
        let mut buf = Vec::new();
        write_hello(&mut buf, BackendKind::UffdWp).unwrap();
        write_collection(&mut buf, &Ok(c.clone())).unwrap();
        write_collection(&mut buf, &Err(libc::EPERM)).unwrap();
        let mut r = &buf[..];
        assert_eq!(read_hello(&mut r).unwrap(), BackendKind::UffdWp);
        let got = read_collection(&mut r).unwrap();
        assert_eq!(got.ranges, c.ranges);
        assert_eq!(got.stats.pages_scanned, 100);
        assert_eq!(
            read_collection(&mut r).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        let mut bad = &[0u8; 12][..];
        assert!(read_hello(&mut bad).is_err());
        let mut huge = Vec::new();
        for v in [u64::MAX, 0, 0, 0] {
            huge.extend_from_slice(&v.to_le_bytes());
        }
        assert!(read_collection(&mut &huge[..]).is_err());
        let mut short = &buf[12..30];
        assert!(read_collection(&mut short).is_err());
    }
}
