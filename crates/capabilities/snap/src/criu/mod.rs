//! A page server CRIU dumps into: `criu dump --page-server` sends the
//! pages of every task it dumps here, and each lands in a
//! [`DiskStore`], content-addressed, so that a page stored by an earlier
//! dump, another task or another container is stored once.
//!
//! A session is one dump. Each pagemap CRIU opens (a task's memory or a
//! shared-memory segment) becomes one snapshot of the store, whose regions
//! are the runs of present pages; the dump's own pagemap (every run with
//! its flags: present, lazy, in the parent dump) is kept beside the store
//! as `criu/dump-N.json`, with the snapshot each pagemap became. The
//! server answers as CRIU's own does: no parent dump (so CRIU sends every
//! page), and a zero status when the dump closes.
//!
//! Only root and the server's own user may dump into it (the owner of
//! the connecting socket, as the kernel lists it). The peer's bytes are
//! checked before use: page-aligned runs within the user address space,
//! a bounded number of pages and runs per dump, and a bounded wait for
//! each read. A peer that breaks the protocol ends its
//! session with [`Received::broken`] said; only the store's own failures
//! are errors.

mod core;
mod images;
mod lazy;
mod restore;
mod tls;
pub mod wire;

pub use images::{export, Exported, IMG_COMMON_MAGIC, PAGEMAP_MAGIC};
pub use restore::{restore_in_place, InPlace};
pub use tls::Tls;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pagewise_mech::{Region, PAGE_SIZE};
use serde::Serialize;

use crate::disk::{DiskStore, SnapshotWriter};
use crate::Result;
use wire::{Dialect, Header, Pagemap};

/// The highest user address a run may reach (x86-64 with five-level
/// page tables: 56 bits).
const USER_END: u64 = 1 << 56;

/// The folder of the store where the dumps' pagemaps are kept.
pub const DUMPS_DIR: &str = "criu";

/// A page server over one store.
#[derive(Debug)]
pub struct PageServer {
    store: DiskStore,
    /// How long a peer may send nothing before its session is ended.
    pub idle: Duration,
    /// Pages (present or not) one dump may name, over all its pagemaps.
    pub max_pages: u64,
    /// Runs one dump may name, over all its pagemaps.
    pub max_runs: usize,
    /// The dump whose lazy pages it serves, if it serves one (then it
    /// keeps no dump).
    lazy: Option<lazy::LazySource>,
}

/// One run of a dump's pagemap, as CRIU's `PagemapEntry` says it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[non_exhaustive]
pub struct Run {
    /// Its first address (in a shared-memory segment: its offset).
    pub vaddr: u64,
    /// Its pages.
    pub nr_pages: u64,
    /// CRIU's flags (`PE_PRESENT` 4, `PE_LAZY` 2, `PE_PARENT` 1).
    pub flags: u32,
}

/// One pagemap of a dump as received.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PagemapReceived {
    /// A task's or a shared-memory segment's.
    pub kind: Pagemap,
    /// CRIU's id of it (a task's pid in the dump's pid namespace).
    pub id: u64,
    /// The snapshot of the store its present pages became.
    pub snapshot: u64,
    /// Its runs, in the order CRIU sent them.
    pub runs: Vec<Run>,
    /// Pages whose bytes were sent.
    pub present_pages: u64,
}

/// What one session brought.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Received {
    /// The header the peer spoke (none if it sent nothing).
    pub dialect: Option<Dialect>,
    /// The dump's number in the store (`criu/dump-N.json`), if it sent
    /// any pagemap.
    pub dump: Option<u64>,
    /// Whether it ended with CRIU's `CLOSE` (a whole dump).
    pub closed: bool,
    /// Its pagemaps.
    pub pagemaps: Vec<PagemapReceived>,
    /// Pages whose bytes were sent.
    pub present_pages: u64,
    /// Bytes the store grew by (pages it did not hold yet, compressed).
    pub stored_bytes: u64,
    /// Why the session ended before CRIU closed it, if it did.
    pub broken: Option<String>,
    /// Lazy pages answered (a server serving a dump's lazy pages).
    pub served_pages: u64,
    /// Requests for them.
    pub requests: u64,
}

/// A dump's record beside the store (`criu/dump-N.json`).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct DumpRecord {
    dump: u64,
    closed: bool,
    pagemaps: Vec<PagemapRecord>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct PagemapRecord {
    shmem: bool,
    id: u64,
    snapshot: u64,
    runs: Vec<Run>,
}

/// A failure of the peer: the session ends, said.
struct Broken(String);

impl From<std::io::Error> for Broken {
    fn from(e: std::io::Error) -> Self {
        Broken(match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                "the peer sent nothing for too long".into()
            }
            std::io::ErrorKind::UnexpectedEof => "the peer closed the connection mid-dump".into(),
            _ => format!("the connection failed: {e}"),
        })
    }
}

/// A peer failure or one of ours.
enum Stop {
    Peer(Broken),
    Ours(crate::Error),
}

impl From<Broken> for Stop {
    fn from(b: Broken) -> Self {
        Stop::Peer(b)
    }
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Peer(e.into())
    }
}

impl From<crate::Error> for Stop {
    fn from(e: crate::Error) -> Self {
        Stop::Ours(e)
    }
}

/// The pagemap being received.
struct Open<'s> {
    dst_id: u64,
    kind: Pagemap,
    id: u64,
    writer: SnapshotWriter<'s>,
    runs: Vec<Run>,
    present: u64,
    /// The end of the last present run: runs come in address order.
    end: u64,
}

impl PageServer {
    /// A server that keeps what it is sent in `store`.
    pub fn new(store: DiskStore) -> PageServer {
        PageServer {
            store,
            idle: Duration::from_secs(60),
            // 64 GiB of pages, a million runs: more than a dump of this
            // machine's memory, and bounded.
            max_pages: 16 << 20,
            max_runs: 1 << 20,
            lazy: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &DiskStore {
        &self.store
    }

    /// Serves the lazy pages of dump `dump` of the store from now on, to
    /// `criu lazy-pages --page-server`, as `criu page-server
    /// --lazy-pages` serves them from images: a session is then a run of
    /// `GET`s, each answered with the pages asked of one run the dump
    /// marked lazy (see `lazy.rs`); the server keeps no dump.
    ///
    /// # Errors
    /// No such dump, or one CRIU did not close.
    pub fn serve_lazy(&mut self, dump: u64) -> Result<()> {
        self.lazy = Some(lazy::LazySource::load(&self.store, dump)?);
        Ok(())
    }

    /// Confines the calling thread to the calls serving a session needs:
    /// the connection's and the store's, as a migration's receiver
    /// ([`crate::wire::Receiver::confine_thread`], the same set). For the
    /// thread that calls [`serve`](Self::serve); `Ok(false)` where the
    /// filter is not written for the architecture.
    pub fn confine_thread() -> std::io::Result<bool> {
        crate::wire::Receiver::confine_thread()
    }

    /// Serves one session on `s`: a dump CRIU sends, to its end. Only
    /// root and the server's own user may connect (see `check_peer`).
    ///
    /// # Errors
    /// The store's own failures (a full disk); what the peer does wrong
    /// is said in [`Received::broken`].
    pub fn serve(&mut self, mut s: TcpStream) -> Result<Received> {
        self.prepare(&s);
        let mut got = Received::default();
        if let Err(b) = check_peer(&s) {
            return match ended(Err(b.into()), &mut got) {
                None => Ok(got),
                Some(e) => Err(e),
            };
        }
        self.serve_on(&mut s, got)
    }

    /// [`serve`](Self::serve) over CRIU's `--tls`: the session starts
    /// with a TLS handshake in which the peer shows a certificate signed
    /// by the authority of `tls`; it is then served whoever and wherever
    /// the peer is (see the `tls` module). A handshake that fails is
    /// the peer's fault, said in [`Received::broken`].
    ///
    /// # Errors
    /// As [`serve`](Self::serve).
    pub fn serve_tls(&mut self, s: TcpStream, tls: &Tls) -> Result<Received> {
        self.prepare(&s);
        let mut got = Received::default();
        let conn = rustls::ServerConnection::new(tls.0.clone()).map_err(|e| {
            crate::Error::from(pagewise_mech::Error::os(
                "starting a TLS session",
                std::io::Error::other(e),
            ))
        })?;
        let mut stream = rustls::StreamOwned::new(conn, s);
        while stream.conn.is_handshaking() {
            if let Err(e) = stream.conn.complete_io(&mut stream.sock) {
                got.broken = Some(format!("the TLS handshake failed: {e}"));
                return Ok(got);
            }
        }
        let r = self.serve_on(&mut stream, got);
        stream.conn.send_close_notify();
        let _ = stream.conn.complete_io(&mut stream.sock);
        r
    }

    /// A connection's bounds in time.
    fn prepare(&self, s: &TcpStream) {
        let _ = s.set_read_timeout(Some(self.idle));
        let _ = s.set_write_timeout(Some(self.idle));
        let _ = s.set_nodelay(true);
    }

    /// One session on `s`, whose peer may send it.
    fn serve_on<S: Read + Write>(&mut self, s: &mut S, mut got: Received) -> Result<Received> {
        if let Some(src) = &self.lazy {
            let end = lazy::serve_lazy_session(&self.store, src, s, &mut got);
            return match ended(end, &mut got) {
                None => Ok(got),
                Some(e) => Err(e),
            };
        }
        let dump = next_dump(self.store.dir());
        let end = serve_session(self, s, &mut got);
        let ours = ended(end, &mut got);
        if !got.pagemaps.is_empty() {
            got.dump = Some(dump);
            let pagemaps = got
                .pagemaps
                .iter()
                .map(|p| PagemapRecord {
                    shmem: p.kind == Pagemap::Shmem,
                    id: p.id,
                    snapshot: p.snapshot,
                    runs: p.runs.clone(),
                })
                .collect();
            let rec = DumpRecord {
                dump,
                closed: got.closed,
                pagemaps,
            };
            write_record(self.store.dir(), &rec)?;
        }
        match ours {
            Some(e) => Err(e),
            None => Ok(got),
        }
    }
}

/// Who may dump into the server: root, or the user it runs as (the
/// owner of the peer's socket as the kernel lists it, `/proc/net/tcp`).
/// CRIU's connections carry no credentials of their own.
fn check_peer(s: &TcpStream) -> std::result::Result<(), Broken> {
    let owner = match (s.local_addr(), s.peer_addr()) {
        (Ok(local), Ok(peer)) => pagewise_mech::procfs::tcp_owner(peer, local),
        _ => None,
    };
    let me = pagewise_sys::process::geteuid();
    match owner {
        Some(u) if u == 0 || u == me => Ok(()),
        Some(u) => Err(Broken(format!(
            "a connection of user {u}: only root and the server's own user (uid {me}) may dump into it"
        ))),
        None => Err(Broken(
            "a connection from no socket of this machine: the server takes loopback dumps only".into(),
        )),
    }
}

fn serve_session<S: Read + Write>(
    server: &mut PageServer,
    s: &mut S,
    got: &mut Received,
) -> std::result::Result<(), Stop> {
    // Pages arrive by the thousand: read through a buffer (a call per
    // megabyte, not per page); answers go straight to the connection.
    let mut s = std::io::BufReader::with_capacity(1 << 20, s);
    let answer = |s: &mut std::io::BufReader<&mut S>, b: &[u8]| -> std::io::Result<()> {
        s.get_mut().write_all(b)?;
        s.get_mut().flush()
    };
    let Some((dialect, mut head)) = first_header(&mut s)? else {
        return Ok(());
    };
    got.dialect = Some(dialect);
    let (max_pages, max_runs) = (server.max_pages, server.max_runs);
    let mut pages_named = 0u64;
    let mut runs_named = 0usize;
    let mut open: Option<Open<'_>> = None;
    let mut page = vec![0u8; PAGE_SIZE];
    loop {
        let h = Header::decode(dialect, &head);
        match h.op {
            wire::OP_OPEN | wire::OP_OPEN2 => {
                if let Some(o) = open.take() {
                    finish(o, got)?;
                }
                open = Some(begin(&mut server.store, h.dst_id, got.pagemaps.len())?);
                if h.op == wire::OP_OPEN2 {
                    // No parent dump: CRIU then sends every page.
                    answer(&mut s, &[0u8])?;
                }
            }
            wire::OP_PARENT => answer(&mut s, &0i32.to_ne_bytes())?,
            wire::OP_ADD | wire::OP_ADD_F | wire::OP_HOLE => {
                let flags = h.page_flags().unwrap_or(0);
                // A run without an open pagemap opens it, as CRIU's own
                // server does ("IO w/o open").
                if open.as_ref().is_none_or(|o| o.dst_id != h.dst_id) {
                    if let Some(o) = open.take() {
                        finish(o, got)?;
                    }
                    open = Some(begin(&mut server.store, h.dst_id, got.pagemaps.len())?);
                }
                let Some(o) = open.as_mut() else {
                    unreachable!("a pagemap was just opened")
                };
                pages_named = pages_named.saturating_add(h.nr_pages);
                runs_named += 1;
                if pages_named > max_pages || runs_named > max_runs {
                    return Err(Broken(format!(
                        "the dump names more than {max_pages} pages or {max_runs} runs"
                    ))
                    .into());
                }
                let run = check_run(&h, flags)?;
                if flags & wire::PE_PRESENT != 0 {
                    if run.vaddr < o.end {
                        return Err(Broken(format!(
                            "present pages at {:#x} after {:#x}: runs come in address order",
                            run.vaddr, o.end
                        ))
                        .into());
                    }
                    o.writer.add_region(Region {
                        start: run.vaddr,
                        len: run.nr_pages * PAGE_SIZE as u64,
                    });
                    for _ in 0..run.nr_pages {
                        s.read_exact(&mut page)?;
                        o.writer.push(&page)?;
                    }
                    o.present += run.nr_pages;
                    o.end = run.vaddr + run.nr_pages * PAGE_SIZE as u64;
                }
                o.runs.push(run);
            }
            wire::OP_CLOSE | wire::OP_FORCE_CLOSE => {
                if let Some(o) = open.take() {
                    finish(o, got)?;
                }
                got.closed = true;
                answer(&mut s, &0i32.to_ne_bytes())?;
                // CRIU closes its end next: wait for it (bounded), as its
                // own server does.
                let mut rest = [0u8; 1];
                let _ = s.read(&mut rest);
                return Ok(());
            }
            wire::OP_GET => return Err(Broken(
                "a lazy-pages request (GET): this server keeps dumps; it does not serve pages yet"
                    .into(),
            )
            .into()),
            op => return Err(Broken(format!("an unknown command {op:#x}")).into()),
        }
        if read_all(&mut s, &mut head)? < head.len() {
            return Err(Broken("the peer closed the connection before CLOSE".into()).into());
        }
    }
}

/// A session's first header and the dialect it is in (see
/// [`Dialect::of_first`]); `None` if the peer sent nothing.
fn first_header(r: &mut impl Read) -> std::result::Result<Option<(Dialect, Vec<u8>)>, Stop> {
    let mut first = [0u8; wire::HEADER_LEGACY];
    match read_all(r, &mut first)? {
        0 => return Ok(None),
        n if n < first.len() => return Err(Broken("the peer sent half a header".into()).into()),
        _ => {}
    }
    let dialect = Dialect::of_first(&first);
    let mut head = vec![0u8; dialect.header_len()];
    head[..first.len()].copy_from_slice(&first);
    r.read_exact(&mut head[first.len()..])?;
    Ok(Some((dialect, head)))
}

/// Checks a run's header: page-aligned, within the user address space,
/// a known flag set, at least one page.
fn check_run(h: &Header, flags: u32) -> std::result::Result<Run, Broken> {
    let known = wire::PE_PARENT | wire::PE_LAZY | wire::PE_PRESENT;
    let end = h
        .nr_pages
        .checked_mul(PAGE_SIZE as u64)
        .and_then(|len| h.vaddr.checked_add(len));
    match end {
        _ if h.nr_pages == 0 => Err(Broken(format!("a run of no page at {:#x}", h.vaddr))),
        _ if !h.vaddr.is_multiple_of(PAGE_SIZE as u64) => {
            Err(Broken(format!("a run at {:#x}, not page-aligned", h.vaddr)))
        }
        _ if flags & !known != 0 => Err(Broken(format!("unknown page flags {flags:#x}"))),
        Some(e) if e <= USER_END => Ok(Run {
            vaddr: h.vaddr,
            nr_pages: h.nr_pages,
            flags,
        }),
        _ => Err(Broken(format!(
            "a run of {} pages at {:#x} ends past the user address space",
            h.nr_pages, h.vaddr
        ))),
    }
}

fn begin(store: &mut DiskStore, dst_id: u64, n: usize) -> std::result::Result<Open<'_>, Stop> {
    let Some((kind, id)) = wire::decode_dst(dst_id) else {
        return Err(Broken(format!("an unknown pagemap type {}", dst_id & 0xff)).into());
    };
    let what = match kind {
        Pagemap::Task => "task",
        Pagemap::Shmem => "shmem",
    };
    let label = format!("criu {what} {id} (pagemap {n} of a dump)");
    let pid = match kind {
        Pagemap::Task => i32::try_from(id).ok(),
        Pagemap::Shmem => None,
    };
    let writer = store.writer(&[], pid, &label)?;
    Ok(Open {
        dst_id,
        kind,
        id,
        writer,
        runs: Vec::new(),
        present: 0,
        end: 0,
    })
}

fn finish(o: Open<'_>, got: &mut Received) -> std::result::Result<(), Stop> {
    let saved = o.writer.finish()?;
    got.present_pages += o.present;
    got.stored_bytes += saved.pack_bytes;
    got.pagemaps.push(PagemapReceived {
        kind: o.kind,
        id: o.id,
        snapshot: saved.id,
        runs: o.runs,
        present_pages: o.present,
    });
    Ok(())
}

/// How a session ended: a peer's failure is said in `got`; one of ours
/// is returned.
fn ended(end: std::result::Result<(), Stop>, got: &mut Received) -> Option<crate::Error> {
    match end {
        Ok(()) => None,
        Err(Stop::Peer(Broken(why))) => {
            got.broken = Some(why);
            None
        }
        Err(Stop::Ours(e)) => Some(e),
    }
}

/// Reads until `buf` is full or the peer closes; how much was read.
fn read_all(s: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn dumps_dir(store: &Path) -> PathBuf {
    store.join(DUMPS_DIR)
}

/// The number the next dump gets: one past the highest recorded.
fn next_dump(store: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dumps_dir(store)) else {
        return 1;
    };
    rd.filter_map(|e| {
        let name = e.ok()?.file_name().into_string().ok()?;
        name.strip_prefix("dump-")?
            .strip_suffix(".json")?
            .parse::<u64>()
            .ok()
    })
    .max()
    .map_or(1, |m| m + 1)
}

fn write_record(store: &Path, rec: &DumpRecord) -> Result<()> {
    let dir = dumps_dir(store);
    let io = |what: &str, e: std::io::Error| {
        crate::Error::from(pagewise_mech::Error::os(
            format!("{what} {}", dir.display()),
            e,
        ))
    };
    std::fs::create_dir_all(&dir).map_err(|e| io("making", e))?;
    let tmp = dir.join(format!(".dump-{}.json.tmp", rec.dump));
    let json = serde_json::to_vec_pretty(rec).map_err(|e| io("writing", e.into()))?;
    std::fs::write(&tmp, json).map_err(|e| io("writing in", e))?;
    std::fs::rename(&tmp, dir.join(format!("dump-{}.json", rec.dump)))
        .map_err(|e| io("naming in", e))
}
