//! The wire format between `pagewise track` and the preload shim inside the
//! tracked program, over a `socketpair(AF_UNIX, SOCK_STREAM)` whose shim end is
//! passed as the fd number in [`TRACK_FD`](pagewise_mech::shim::env::TRACK_FD)
//! (see [`launch::start_tracked`](crate::start_tracked)).
//!
//! ```text
//! pagewise                         shim (in CMD)
//!    | -- hello:   'H'  ---------------> |
//!    | <- u32 magic "PGWS", u32 contract,|   a reader refuses any contract
//!    |    u32 backend (wire value),      |   but its own (mech::shim)
//!    |    u32 status                     |   0: tracking; else an errno, and
//!    |                                   |   the shim closes the socket
//!    | -- collect: 'C'  ---------------> |
//!    | <- u64 ranges, u64 pages_scanned, |
//!    |    u64 elapsed_ns, u64 status     |   status 0: ok; else an errno and
//!    |    ranges x (u64 start, u64 pages)|   no ranges follow
//!    | -- quit:    'Q'  (or close) ----> |   shim stops tracking
//! ```
//! All integers are little-endian; the backend is
//! its number on the wire (`BackendKind::wire`). The shim serves one
//! request at a time ([`serve`]), in two states:
//!
//! - *greeting* (from the start): `H` gets the hello and moves to *serving*,
//!   or, when the shim could not start tracking, the hello with that errno as
//!   status, and the shim closes. A `C` gets a collect reply with status
//!   `EPROTO` and the state stays.
//! - *serving*: `H` gets the hello again; `C` collects. A collection that
//!   fails answers its errno and the connection stays usable (the next
//!   collection reports what this one would have).
//!
//! In either state `Q`, the end of the stream, an unknown request byte or a
//! failed write ends the connection, and the shim stops tracking.
//!
//! At the program's `exit` the shim sends one last collection unasked
//! ([`Served::last`]): what the program wrote since the last collection
//! (all it wrote, for a program that ends before the first). Nothing is
//! written after it; the client reads it once it sees the program end
//! (or as the reply to a request the shim did not serve in time).

use super::{BackendKind, CollectStats, Collection, DirtyTracker};
use pagewise_mech::region::PageRange;
use std::io::{self, Read, Write};

/// `PGWS`.
pub const MAGIC: u32 = 0x5357_4750;
/// Protocol version: the shim's contract ([`pagewise_mech::shim::CONTRACT`];
/// since 2: backends as wire values, a status in the hello).
pub const VERSION: u32 = pagewise_mech::shim::CONTRACT;
/// Request: handshake.
pub(crate) const REQ_HELLO: u8 = b'H';
/// Request: collect.
pub(crate) const REQ_COLLECT: u8 = b'C';
/// Most ranges one reply may carry (a corrupt peer cannot make us allocate more).
pub const MAX_RANGES: u64 = 1 << 26;
/// Bytes of a hello reply.
pub const HELLO_LEN: usize = 16;

/// Writes the hello reply: the backend tracking, or the errno (non-zero)
/// that kept the shim from tracking.
pub(crate) fn write_hello(w: &mut impl Write, backend: BackendKind, status: i32) -> io::Result<()> {
    let mut b = Vec::with_capacity(HELLO_LEN);
    b.extend_from_slice(&pagewise_mech::shim::hello_header(MAGIC));
    for v in [backend.wire(), status as u32] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&b)
}

/// Reads the hello reply; returns the shim's backend, or the shim's errno
/// when it could not track.
pub fn read_hello(r: &mut impl Read) -> io::Result<BackendKind> {
    pagewise_mech::shim::check_hello(r, MAGIC)?;
    let mut b = [0u8; HELLO_LEN - 8];
    r.read_exact(&mut b)?;
    let f = |i: usize| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let (wire, status) = (f(0), f(1));
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status as i32));
    }
    BackendKind::from_wire(wire).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("shim reports unknown backend {wire}"),
        )
    })
}

/// The client's handshake: sends `H` and reads the hello.
pub fn hello(s: &mut (impl Read + Write)) -> io::Result<BackendKind> {
    s.write_all(&[REQ_HELLO])?;
    read_hello(s)
}

/// The client's collection: sends `C` and reads the reply.
pub fn collect(s: &mut (impl Read + Write)) -> io::Result<Collection> {
    s.write_all(&[REQ_COLLECT])?;
    read_collection(s)
}

/// The shim's side of the handshake, made before the program's `main`, so
/// that tracking covers the program from its first write and a program
/// that ends at once has been tracked: reads the client's `H` (within the
/// read timeout of `r`) and answers it. Whether to serve on ([`serve`]
/// with `greeted`).
pub fn greet(
    r: &mut impl Read,
    w: &mut impl Write,
    tracker: &Result<DirtyTracker, i32>,
    backend: BackendKind,
) -> bool {
    let mut req = [0u8; 1];
    if r.read_exact(&mut req).is_err() || req[0] != REQ_HELLO {
        return false;
    }
    match tracker {
        Ok(t) => write_hello(w, t.backend(), 0).is_ok(),
        Err(errno) => {
            let _ = write_hello(w, backend, *errno);
            false
        }
    }
}

/// The shim's side: serves requests from `r`, answering on `w`, until the
/// connection ends (see the module's states). `tracker` is the tracker, or
/// the errno that kept it from being made; `backend` is announced with that
/// errno; `greeted` says whether [`greet`] has answered the hello already.
/// Returns the tracker when the connection ends.
pub fn serve(
    r: &mut impl Read,
    w: &mut impl Write,
    tracker: Result<DirtyTracker, i32>,
    backend: BackendKind,
    greeted: bool,
) -> Option<DirtyTracker> {
    let mut tracker = tracker;
    let mut greeted = greeted;
    let mut req = [0u8; 1];
    while r.read_exact(&mut req).is_ok() {
        if !answer(req[0], &mut tracker, w, backend, &mut greeted) {
            break;
        }
    }
    tracker.ok()
}

/// The answer to request `req`; whether the connection goes on.
fn answer(
    req: u8,
    tracker: &mut Result<DirtyTracker, i32>,
    w: &mut impl Write,
    backend: BackendKind,
    greeted: &mut bool,
) -> bool {
    match (req, tracker) {
        (REQ_HELLO, Ok(t)) => {
            *greeted = true;
            write_hello(w, t.backend(), 0).is_ok()
        }
        (REQ_HELLO, Err(errno)) => {
            let _ = write_hello(w, backend, *errno);
            false
        }
        (REQ_COLLECT, _) if !*greeted => write_collection(w, &Err(libc::EPROTO)).is_ok(),
        (REQ_COLLECT, Ok(t)) => write_collection(w, &collect_now(t)).is_ok(),
        _ => false,
    }
}

/// A collection of the shim's own process (its mappings synced first).
fn collect_now(t: &mut DirtyTracker) -> Result<Collection, i32> {
    t.sync_process_mappings(None, false)
        .and_then(|_| t.collect())
        .map_err(|e| e.errno())
}

/// What the shim serves from, shared by the thread that answers requests
/// ([`Served::serve`]) and the program's exit ([`Served::last`]): the
/// tracker (or the errno that kept it from being made) and the reply side
/// of the connection, after [`greet`] has answered.
pub struct Served<W: Write> {
    state: std::sync::Mutex<(Result<DirtyTracker, i32>, W)>,
    backend: BackendKind,
}

impl<W: Write> Served<W> {
    /// Serves `tracker` on `w`, the hello answered.
    pub fn new(tracker: Result<DirtyTracker, i32>, w: W, backend: BackendKind) -> Self {
        Served {
            state: std::sync::Mutex::new((tracker, w)),
            backend,
        }
    }

    /// Serves requests from `r` until the connection ends, as [`serve`].
    pub fn serve(&self, r: &mut impl Read) {
        let mut greeted = true;
        let mut req = [0u8; 1];
        while r.read_exact(&mut req).is_ok() {
            let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let (tracker, w) = &mut *g;
            if !answer(req[0], tracker, w, self.backend, &mut greeted) {
                break;
            }
        }
    }

    /// At the program's exit: one last collection, sent unasked; nothing
    /// is written after it (the connection stays locked until the process
    /// is gone).
    pub fn last(&self) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tracker, w) = &mut *g;
        if let Ok(t) = tracker {
            let _ = write_collection(w, &collect_now(t));
            let _ = w.flush();
        }
        std::mem::forget(g);
    }
}

/// Writes a collect reply (`Err`: its errno).
pub(crate) fn write_collection(w: &mut impl Write, c: &Result<Collection, i32>) -> io::Result<()> {
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
    // Read as it arrives, in bounded pieces: a peer that announces many
    // ranges must send them before they take memory here.
    let mut ranges: Vec<PageRange> = Vec::new();
    let mut body = vec![0u8; 16 * 4096];
    let mut left = n as usize;
    while left > 0 {
        let k = left.min(4096);
        r.read_exact(&mut body[..k * 16])?;
        for c in body[..k * 16].chunks_exact(16) {
            let start = u64::from_le_bytes(c[0..8].try_into().expect("8 bytes"));
            let pages = u64::from_le_bytes(c[8..16].try_into().expect("8 bytes"));
            let range = PageRange::checked(start, pages)
                .filter(|p| ranges.last().is_none_or(|l: &PageRange| l.end() <= p.start))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "shim sent range {start:#x}+{pages} pages: unaligned, empty, \
                             past the top of memory or out of order"
                        ),
                    )
                })?;
            ranges.push(range);
        }
        left -= k;
    }
    let stats = CollectStats {
        pages_scanned: scanned,
        pages_dirty: pagewise_mech::region::total_pages(&ranges),
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
        write_hello(&mut buf, BackendKind::UffdWp, 0).unwrap();
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
        let mut bad = &[0u8; HELLO_LEN][..];
        assert!(read_hello(&mut bad).is_err());
        let mut refused = Vec::new();
        write_hello(&mut refused, BackendKind::UffdWp, libc::EPERM).unwrap();
        assert_eq!(
            read_hello(&mut &refused[..]).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        let mut huge = Vec::new();
        for v in [u64::MAX, 0, 0, 0] {
            huge.extend_from_slice(&v.to_le_bytes());
        }
        assert!(read_collection(&mut &huge[..]).is_err());
        let mut short = &buf[HELLO_LEN..HELLO_LEN + 18];
        assert!(read_collection(&mut short).is_err());
    }

    /// A shim that announces the most ranges and sends few takes no more
    /// memory than it sent; ranges that wrap, are empty, unaligned or out
    /// of order are refused.
    #[test]
    fn announced_ranges_are_read_as_they_come_and_checked() {
        let mut b = Vec::new();
        for v in [MAX_RANGES, 0, 0, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&0x1000u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        let e = read_collection(&mut &b[..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        for (start, pages) in [
            (u64::MAX - 0xfff, 2u64),
            (0x1000, 0),
            (0x1001, 1),
            (0x1000, u64::MAX / 2),
        ] {
            let mut b = Vec::new();
            for v in [1u64, 0, 0, 0, start, pages] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            let e = read_collection(&mut &b[..]).unwrap_err();
            assert_eq!(
                e.kind(),
                io::ErrorKind::InvalidData,
                "{start:#x}+{pages}: {e}"
            );
        }
        let mut b = Vec::new();
        for v in [2u64, 0, 0, 0, 0x3000, 1, 0x1000, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert!(read_collection(&mut &b[..]).is_err(), "out of order");
    }

    #[test]
    fn collect_before_hello_and_refused_tracking() {
        let t = DirtyTracker::for_self_anonymous(BackendKind::Hash).unwrap();
        let mut out = Vec::new();
        let left = serve(
            &mut &b"CHCQC"[..],
            &mut out,
            Ok(t),
            BackendKind::Hash,
            false,
        );
        assert!(left.is_some());
        let mut r = &out[..];
        assert_eq!(
            read_collection(&mut r).unwrap_err().raw_os_error(),
            Some(libc::EPROTO),
            "collect before hello"
        );
        assert_eq!(read_hello(&mut r).unwrap(), BackendKind::Hash);
        read_collection(&mut r).unwrap();
        assert!(r.is_empty(), "nothing answered after quit");

        let mut out = Vec::new();
        let left = serve(
            &mut &b"HC"[..],
            &mut out,
            Err(libc::EPERM),
            BackendKind::UffdWp,
            false,
        );
        assert!(left.is_none());
        let mut r = &out[..];
        assert_eq!(
            read_hello(&mut r).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        assert!(r.is_empty(), "the shim closes after a refused hello");
    }
}
